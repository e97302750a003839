"""The command line as users of flock(1), nvidia-smi and pueue expect it (issue 17): --version,
typos that name the unknown word and suggest the right one, shell completion (bash, zsh, fish)
of commands, options, lease ids and GPUs from the live state, and `status` grouping a
multi-GPU lease and fitting a terminal's width."""

import fcntl
import json
import os
import pathlib
import re
import select
import shutil
import struct
import subprocess
import termios

import pytest

from conftest import EX_USAGE, HANG, sim_uuid, wait_until

REPO = pathlib.Path(__file__).resolve().parents[2]
COMPLETION = REPO / "contrib" / "completion"


# -- version and usage errors -----------------------------------------------------------------

@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_version_flag(gl, flag):
    result = gl.run(flag)
    assert result.returncode == 0, result.stderr
    assert result.stdout == gl.run("version").stdout
    assert re.fullmatch(r"gpulock \d+\.\d+\.\d+\n", result.stdout)


@pytest.mark.parametrize("args, unknown, suggestion", [
    (["rn", "--", "true"], "unknown command 'rn'", "did you mean 'run'?"),
    (["stauts"], "unknown command 'stauts'", "did you mean 'status'?"),
    (["relase", "0123456789abcdef"], "unknown command 'relase'", "did you mean 'release'?"),
    (["status", "--jsno"], "unknown option '--jsno' for 'gpulock status'",
     "did you mean '--json'?"),
    (["run", "--no-wiat", "--", "true"], "unknown option '--no-wiat' for 'gpulock run'",
     "did you mean '--no-wait'?"),
    (["run", "--coutn=2", "--", "true"], "unknown option '--coutn' for 'gpulock run'",
     "did you mean '--count'?"),
    (["--verison"], "unknown option '--verison'", "did you mean '--version'?"),
])
def test_typo_names_the_word_and_suggests(gl, args, unknown, suggestion):
    result = gl.run(*args)
    assert result.returncode == EX_USAGE, result.stderr
    first = result.stderr.splitlines()[0]
    assert first == "gpulock: %s; %s" % (unknown, suggestion)
    assert "--help" in result.stderr


def test_unrelated_word_gets_no_suggestion(gl):
    result = gl.run("frobnicate")
    assert result.returncode == EX_USAGE
    assert result.stderr.splitlines()[0] == "gpulock: unknown command 'frobnicate'"


def test_typo_runs_nothing(gl, tmp_path):
    marker = tmp_path / "ran"
    result = gl.run("rn", "--", "touch", marker)
    assert result.returncode == EX_USAGE
    assert not marker.exists()


# -- the completion protocol ------------------------------------------------------------------

def complete(gl, *words, env=None):
    """`gpulock __complete -- WORDS`: the candidate words (descriptions dropped)."""
    result = gl.run("__complete", "--", *words, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    return [line.split("\t")[0] for line in result.stdout.splitlines()]


def help_options(gl, *command):
    """The option names `gpulock [COMMAND] --help` lists."""
    text = gl.run(*command, "--help").stdout
    options = text.split("Options:", 1)[1].split("Subcommands:", 1)[0]
    return set(re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", options))


def test_hidden_command_is_not_in_help(gl):
    assert "__complete" not in gl.run("--help").stdout


def test_completes_commands(gl):
    commands = set(complete(gl, ""))
    assert commands == {"run", "submit", "jobs", "logs", "wait", "cancel", "resubmit",
                        "acquire",
                        "release", "status", "queue", "gpus", "init", "doctor", "metrics",
                        "serve", "usage", "log", "journal", "version"}
    assert complete(gl, "st") == ["status"]


def test_completes_the_commands_of_a_command(gl):
    assert complete(gl, "journal", "") == ["seal"]
    assert complete(gl, "journal", "seal", "-") == ["--help", "-h"]
    assert complete(gl, "journal", "bogus", "") == []


@pytest.mark.parametrize("command", ["run", "acquire", "release", "status", "queue", "gpus",
                                     "doctor", "init", "usage", "log"])
def test_completes_exactly_the_options_help_lists(gl, command):
    assert set(complete(gl, command, "-")) == help_options(gl, command)


def test_completes_top_level_options(gl):
    assert set(complete(gl, "-")) == help_options(gl) == {"-h", "--help", "-V", "--version"}


def test_completes_option_values(gl):
    assert complete(gl, "run", "--priority", "") == ["normal", "low"]
    assert complete(gl, "run", "--on-lease-loss", "k") == ["kill"]
    assert complete(gl, "acquire", "--visible=u") == ["--visible=uuid"]
    assert complete(gl, "run", "--count", "") == []  # a number: nothing to offer


def test_completes_gpus_from_live_state(gl):
    words = complete(gl, "run", "--gpus", "")
    for i in range(4):
        assert str(i) in words and sim_uuid(i) in words
    assert complete(gl, "run", "--gpus", "0,") == ["0,%s" % w for w in words]
    assert complete(gl, "run", "--gpus=GPU-5e1f0a7e-0000-4000-8000-000000000003") == [
        "--gpus=" + sim_uuid(3)]
    assert complete(gl, "run", "--gpus", "", env=gl.env(fake="2")) == [
        "0", sim_uuid(0), "1", sim_uuid(1)]


def test_completes_lease_ids_from_live_state(gl):
    assert complete(gl, "release", "") == []
    _, first = gl.hold("-n", "2", label="sweep")
    _, second = gl.hold("-n", "1")
    assert sorted(complete(gl, "release", "")) == sorted([first, second])  # each lease once
    assert complete(gl, "release", first[:6]) in ([first], sorted([first, second]))
    result = gl.run("__complete", "--", "release", first)
    assert result.stdout.startswith(first + "\t")
    assert "[sweep]" in result.stdout  # the description names the label


def test_completes_job_ids_of_the_callers_jobs(gl):
    assert complete(gl, "logs", "") == []
    ended = gl.run("submit", "--name", "first", "--", "true")
    running = gl.run("submit", "--", "sleep", "1000")
    assert ended.returncode == 0 and running.returncode == 0, ended.stderr + running.stderr
    ended, running = ended.stdout.strip(), running.stdout.strip()
    assert gl.run("wait", ended).returncode == 0
    assert complete(gl, "logs", "") == [ended, running]
    assert complete(gl, "cancel", "") == [running]  # only jobs that have not ended
    assert complete(gl, "resubmit", "") == [ended]  # only jobs that have
    assert complete(gl, "submit", "--after", ended + ",") == [ended + "," + ended,
                                                             ended + "," + running]
    result = gl.run("__complete", "--", "wait", ended)
    assert result.stdout.startswith(ended + "\tdone [first] true")
    assert gl.run("cancel", running).returncode == 0


def test_completes_nothing_after_dashes(gl):
    assert complete(gl, "run", "-n", "1", "--", "") == []
    assert complete(gl, "run", "--", "--") == []


def test_completion_is_quiet_without_live_state(gl, tmp_path):
    env = gl.env(fake=str(tmp_path / "missing.json"))
    assert complete(gl, "release", "", env=env) == []
    assert complete(gl, "run", "--gpus", "", env=env) == []


# -- the shell scripts ------------------------------------------------------------------------

def shell_env(gl):
    """The harness's environment with the binary under test first on PATH as `gpulock`."""
    env = gl.env()
    env["PATH"] = "%s:%s" % (os.path.dirname(gl.binary), env.get("PATH", "/usr/bin:/bin"))
    assert os.path.basename(gl.binary) == "gpulock"
    return env


def bash_complete(gl, line):
    """Completes `line` (the cursor at its end) as bash would: finds the function that
    `complete -p gpulock` names, calls it with COMP_LINE/COMP_POINT/COMP_WORDS/COMP_CWORD set,
    and returns COMPREPLY."""
    script = r'''
set -u
source "$1"
spec=$(complete -p gpulock) || exit 3
[[ $spec =~ -F\ ([^ ]+) ]] || exit 4
COMP_LINE=$2
COMP_POINT=${#COMP_LINE}
read -ra COMP_WORDS <<<"$COMP_LINE"
[[ $COMP_LINE == *" " ]] && COMP_WORDS+=("")
COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
COMPREPLY=()
"${BASH_REMATCH[1]}" gpulock "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD-1]}"
printf '%s\n' "${COMPREPLY[@]}"
'''
    result = subprocess.run(["bash", "--norc", "--noprofile", "-c", script, "bash",
                             str(COMPLETION / "gpulock.bash"), line],
                            env=shell_env(gl), capture_output=True, text=True, timeout=HANG)
    assert result.returncode == 0, result.stderr
    return [w for w in result.stdout.splitlines() if w]


def test_bash_registers_the_completion(gl):
    result = subprocess.run(["bash", "--norc", "-c", 'source "$1" && complete -p gpulock', "bash",
                             str(COMPLETION / "gpulock.bash")], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert re.fullmatch(r"complete -o default -F _gpulock gpulock\n", result.stdout)


def test_bash_completes_commands_options_and_values(gl):
    assert bash_complete(gl, "gpulock sta") == ["status"]
    assert bash_complete(gl, "gpulock rel") == ["release"]
    assert set(bash_complete(gl, "gpulock status --")) == {"--json", "--pool", "--backend",
                                                           "--help"}
    assert bash_complete(gl, "gpulock run --priority l") == ["low"]
    assert bash_complete(gl, "gpulock run --gpus 0,") == [
        "0,%s" % w for w in ["0", sim_uuid(0), "1", sim_uuid(1), "2", sim_uuid(2), "3",
                             sim_uuid(3)]]


def test_bash_completes_after_word_breaks(gl):
    # Readline replaces only what follows the last '=' (or ':'), so that is what comes back.
    assert bash_complete(gl, "gpulock run --visible=u") == ["uuid"]
    assert bash_complete(gl, "gpulock run --gpus=GPU-5e1f0a7e-0000-4000-8000-00000000000") == [
        sim_uuid(i) for i in range(4)]


def test_bash_completes_lease_ids(gl):
    _, lease = gl.hold("-n", "2")
    assert bash_complete(gl, "gpulock release ") == [lease]
    assert bash_complete(gl, "gpulock release %s" % lease[:4]) == [lease]


def test_bash_completes_commands_after_dashes(gl):
    words = bash_complete(gl, "gpulock run -n 1 -- bas")
    assert "bash" in words and all(w.startswith("bas") for w in words)


@pytest.mark.skipif(shutil.which("zsh") is None, reason="zsh is not installed")
def test_zsh_completion(gl):
    """zsh parses the file, and its function offers what `gpulock __complete` says (compadd
    stubbed: a completion widget needs an interactive zsh)."""
    path = COMPLETION / "_gpulock"
    assert subprocess.run(["zsh", "-n", str(path)], capture_output=True).returncode == 0
    assert path.read_text().startswith("#compdef gpulock\n")
    _, lease = gl.hold("-n", "1")
    script = r'''
compadd() { local name=${@[-1]}; print -rl -- ${(P)name}; }
_files() { print -r -- FILES; }
_normal() { print -r -- "NORMAL ${words[1]} $CURRENT"; }
source "$1"      # defines _gpulock, then calls it once with empty words: no output expected
for line in "gpulock sta" "gpulock release " "gpulock run --gpus 1" "gpulock run -- ls"; do
  words=(${(z)line}); [[ $line == *" " ]] && words+=("")
  CURRENT=${#words}
  print -r -- "== $line"
  _gpulock
done
'''
    result = subprocess.run(["zsh", "-f", "-c", script, "zsh", str(path)], env=shell_env(gl),
                            capture_output=True, text=True, timeout=HANG)
    assert result.returncode == 0, result.stderr
    blocks = {}
    for chunk in result.stdout.split("== ")[1:]:
        head, *rest = chunk.splitlines()
        blocks[head] = rest
    assert blocks["gpulock sta"] == ["status"]
    assert blocks["gpulock release "] == [lease]
    assert blocks["gpulock run --gpus 1"] == ["1"]
    assert blocks["gpulock run -- ls"] == ["NORMAL ls 1"]


@pytest.mark.skipif(shutil.which("fish") is None, reason="fish is not installed")
def test_fish_completion(gl):
    """fish's own completion engine (`complete -C`) with the script loaded."""
    path = COMPLETION / "gpulock.fish"
    assert subprocess.run(["fish", "--no-execute", str(path)],
                          capture_output=True).returncode == 0
    _, lease = gl.hold("-n", "1", label="fishy")

    def fish_complete(line):
        result = subprocess.run(["fish", "--no-config", "-c", 'source $argv[1]; complete -C $argv[2]',
                                 str(path), line], env=shell_env(gl), capture_output=True,
                                text=True, timeout=HANG)
        assert result.returncode == 0, result.stderr
        return result.stdout.splitlines()

    assert [c.split("\t")[0] for c in fish_complete("gpulock sta")] == ["status"]
    releases = fish_complete("gpulock release ")
    assert len(releases) == 1 and releases[0].startswith(lease + "\t")
    assert "[fishy]" in releases[0]
    assert [c.split("\t")[0] for c in fish_complete("gpulock run --priority ")] == [
        "low", "normal"] or [c.split("\t")[0] for c in fish_complete(
            "gpulock run --priority ")] == ["normal", "low"]


# -- status: a multi-GPU lease once, cut to the terminal ---------------------------------------

LONG_TAIL = "--data=/datasets/" + "x" * 150 + "/END"


def hold_long_command(gl, count):
    marker = gl.tmp / ("long-%d" % count)
    script = 'echo "$GPULOCK_LEASE_ID" > "$1.tmp" && mv "$1.tmp" "$1"; exec sleep 1000'
    bg = gl.spawn("run", "-n", count, "--label", "long", "--", "sh", "-c", script, "holder",
                  marker, LONG_TAIL)
    wait_until(lambda: marker.exists() or not bg.alive(), what="the long command to start")
    assert marker.exists(), bg.describe()
    return marker.read_text().strip()


def status_on_terminal(gl, columns):
    """`gpulock status` with its stdout on a pseudo-terminal `columns` wide."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    env = gl.env()
    env.pop("COLUMNS", None)
    proc = subprocess.Popen(gl.cmd("status"), stdin=subprocess.DEVNULL, stdout=slave,
                            stderr=subprocess.PIPE, env=env)
    os.close(slave)
    output = bytearray()
    while True:
        ready, _, _ = select.select([master], [], [], HANG)
        assert ready, "gpulock status hung"
        try:
            chunk = os.read(master, 4096)
        except OSError:  # EIO: the terminal's last writer closed it
            break
        if not chunk:
            break
        output.extend(chunk)
    os.close(master)
    assert proc.wait(timeout=HANG) == 0, proc.stderr.read()
    return output.decode().replace("\r\n", "\n")


def lease_rows(text, lease):
    """The status lines, and where the lease's first row is: the one with its holder in full
    (the lease's other GPUs say only whose they are, "with GPU N")."""
    lines = text.splitlines()
    first = [i for i, line in enumerate(lines) if lease in line and "(with GPU" not in line]
    assert len(first) == 1, "lease %s shown %d times:\n%s" % (lease, len(first), text)
    return lines, first[0]


def test_status_shows_a_multi_gpu_lease_once_at_80_columns(gl):
    lease = hold_long_command(gl, 3)
    text = status_on_terminal(gl, 80)
    lines, at = lease_rows(text, lease)
    for line in lines:
        assert len(line) <= 80, "wider than 80 columns: %r" % line
    gpus = [g["display_index"] for g in gl.status()["gpus"] if g["lease_id"] == lease]
    assert len(gpus) == 3
    # The lease's rows are together: its first GPU, the command under it, then its other GPUs,
    # each naming the lease.
    rows = [lines[at]] + lines[at + 2:at + 4]
    assert [row.split()[0] for row in rows] == gpus
    assert all(row.split()[1] == "leased" for row in rows)
    assert "[long]" in rows[0]
    command = lines[at + 1]
    assert command.startswith(" ") and command.endswith("…") and "sh -c" in command
    assert all(lease in row and "(with GPU %s)" % gpus[0] in row for row in rows[1:])
    assert text.count("sh -c") == 1  # the command once, not on every GPU's row


def test_status_cuts_to_a_wide_terminal_and_keeps_the_whole_command_elsewhere(gl):
    lease = hold_long_command(gl, 1)
    wide = status_on_terminal(gl, 120)
    assert all(len(line) <= 120 for line in wide.splitlines())
    assert "…" in wide and "/END" not in wide
    # A single-GPU lease: its command on a line of its own below the GPU's row.
    lines, at = lease_rows(wide, lease)
    assert lines[at + 1].lstrip().startswith("sh -c")

    piped = gl.run("status")
    assert piped.returncode == 0
    assert LONG_TAIL in piped.stdout and "…" not in piped.stdout

    doc = json.loads(gl.run("status", "--json").stdout)
    held = [g for g in doc["gpus"] if g["lease_id"] == lease]
    assert held[0]["holder"]["command"].endswith(LONG_TAIL)
