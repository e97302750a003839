# fish completion for gpulock: commands, options, option values, lease ids, job ids and GPUs, with
# their descriptions. Installed as /usr/share/fish/vendor_completions.d/gpulock.fish. The candidates
# come from `gpulock __complete -- WORD…` (src/cli/cmd_complete.cc), which reads the live state,
# so this file cannot fall behind the CLI.

function __gpulock_after_dashes
    contains -- -- (commandline -opc)[2..-1]
end

function __gpulock_candidates
    set -l words (commandline -opc) (commandline -ct)
    $words[1] __complete -- $words[2..-1] 2>/dev/null
end

# After `--` comes the command that `gpulock run` starts: fish's own completion of files and
# commands applies.
complete -c gpulock -n 'not __gpulock_after_dashes' -f -a '(__gpulock_candidates)'
