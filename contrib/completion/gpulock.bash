# bash completion for gpulock: commands, options, option values, lease ids, job ids and GPUs.
# Installed as /usr/share/bash-completion/completions/gpulock; or `source` it from ~/.bashrc.
# Works with and without the bash-completion package. The candidates come from
# `gpulock __complete -- WORD…` (src/cli/cmd_complete.cc), which reads the live state, so this
# file knows nothing of gpulock's options and cannot fall behind them.

_gpulock() {
    local line=${COMP_LINE:0:COMP_POINT}
    local -a words
    read -ra words <<<"$line"
    # A line ending in a blank starts a new, empty word.
    if [[ ${#words[@]} -eq 0 || $line == *[[:blank:]] ]]; then
        words+=("")
    fi
    local current=${words[${#words[@]} - 1]}
    # Readline replaces only the part after the last word-break character it knows (= and :
    # in "--gpus=0:1"); every candidate begins with the whole word, so that prefix is cut.
    local rest=$current
    [[ $COMP_WORDBREAKS == *=* ]] && rest=${rest##*=}
    [[ $COMP_WORDBREAKS == *:* ]] && rest=${rest##*:}
    local keep=$((${#current} - ${#rest}))

    # After `--` comes the command that `gpulock run` starts: its name, then its files.
    local i
    for ((i = 1; i < ${#words[@]} - 1; i++)); do
        if [[ ${words[i]} == -- ]]; then
            if ((i == ${#words[@]} - 2)); then
                mapfile -t COMPREPLY < <(compgen -c -- "$current")
            fi
            return 0
        fi
    done

    COMPREPLY=()
    local candidate
    while IFS= read -r candidate; do
        candidate=${candidate%%$'\t'*}
        COMPREPLY+=("${candidate:keep}")
    done < <("${words[0]}" __complete -- "${words[@]:1}" 2>/dev/null)
    return 0
}

complete -o default -F _gpulock gpulock
