"""`gpulock run`: the command's environment, exit status, signals, CUDA_VISIBLE_DEVICES."""

import json
import os
import re
import signal
import subprocess

import pytest

from conftest import EX_UNAVAILABLE, EX_USAGE, HANG, Terminal, sim_uuid, wait_until

ENV_DUMP = ("import json, os; print(json.dumps({k: os.environ.get(k) for k in "
            "('CUDA_VISIBLE_DEVICES', 'CUDA_DEVICE_ORDER', 'GPULOCK_LEASE_ID', 'GPULOCK_GPUS')}))")


def run_env_dump(gl, *selection, env=None):
    result = gl.run("run", *selection, "--", "/usr/bin/python3", "-S", "-c", ENV_DUMP, env=env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def index_of_uuid(gl, env=None):
    result = gl.run("gpus", "--json", env=env)
    assert result.returncode == 0, result.stderr
    return {g["uuid"]: g["index"] for g in json.loads(result.stdout)["gpus"]}


def test_command_environment(gl):
    seen = run_env_dump(gl, "-n", "2")
    assert seen["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert re.fullmatch(r"[0-9a-f]{16}", seen["GPULOCK_LEASE_ID"])
    uuids = seen["GPULOCK_GPUS"].split(",")
    assert len(uuids) == 2 and len(set(uuids)) == 2
    indices = index_of_uuid(gl)
    assert seen["CUDA_VISIBLE_DEVICES"] == ",".join(str(indices[u]) for u in uuids)
    # Idle simulated GPUs with no topology: the lowest indices are preferred.
    assert seen["CUDA_VISIBLE_DEVICES"] == "0,1"


def test_explicit_gpus_and_lease_released_after(gl):
    seen = run_env_dump(gl, "--gpus", "3,1")
    assert set(seen["GPULOCK_GPUS"].split(",")) == {sim_uuid(1), sim_uuid(3)}
    assert sorted(seen["CUDA_VISIBLE_DEVICES"].split(",")) == ["1", "3"]
    assert set(gl.states().values()) == {"free"}


def test_explicit_gpu_by_uuid_and_prefix(gl):
    seen = run_env_dump(gl, "--gpus", sim_uuid(2))
    assert seen["CUDA_VISIBLE_DEVICES"] == "2"
    # A prefix shared by every simulated GPU is ambiguous: refused, never a silent pick.
    result = gl.run("run", "--gpus", sim_uuid(3)[:-2], "--", "true")
    assert result.returncode == EX_USAGE, result.stderr
    env = gl.env(fake=gl.write_fake_gpus([
        {"uuid": "GPU-aaaa1111-0000-0000-0000-000000000000"},
        {"uuid": "GPU-bbbb2222-0000-0000-0000-000000000000"}]))
    seen = run_env_dump(gl, "--gpus", "GPU-bbbb", env=env)
    assert seen["GPULOCK_GPUS"] == "GPU-bbbb2222-0000-0000-0000-000000000000"
    assert seen["CUDA_VISIBLE_DEVICES"] == "1"


def test_visible_uuid(gl):
    seen = run_env_dump(gl, "-n", "2", "--visible", "uuid")
    assert seen["CUDA_VISIBLE_DEVICES"] == seen["GPULOCK_GPUS"]
    assert all(u.startswith("GPU-") for u in seen["CUDA_VISIBLE_DEVICES"].split(","))


@pytest.mark.parametrize("status", [0, 3, 42, 255])
def test_exit_status_passed_through(gl, status):
    result = gl.run("run", "--", "sh", "-c", "exit %d" % status)
    assert result.returncode == status, result.stderr


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_command_killed_by_signal(gl, sig):
    result = gl.run("run", "--", "sh", "-c", "kill -%d $$" % sig)
    assert result.returncode == 128 + sig, result.stderr
    assert set(gl.states().values()) == {"free"}


def test_sigterm_forwarded_to_command(gl):
    started = gl.tmp / "started"
    got = gl.tmp / "got-term"
    script = ('trap \'echo term > "$2"; exit 0\' TERM; echo up > "$1"; '
              'while :; do sleep 0.05; done')
    bg = gl.spawn("run", "--gpus", "0", "--", "sh", "-c", script, "cmd", started, got)
    wait_until(lambda: started.exists() or not bg.alive(), what="the command to start")
    assert bg.alive(), bg.describe()
    os.kill(bg.pid, signal.SIGTERM)  # gpulock itself only, not its group
    assert bg.wait() == 0, bg.describe()
    assert got.read_text().strip() == "term"
    gl.wait_state(0, "free")


def test_command_not_found(gl):
    result = gl.run("run", "--gpus", "0", "--", "no-such-command-gpulock-itest")
    assert result.returncode == 127
    assert "no-such-command-gpulock-itest" in result.stderr
    assert gl.gpu_status(0)["state"] == "free"


def test_command_not_executable(gl):
    script = gl.tmp / "not-executable.sh"
    script.write_text("#!/bin/sh\nexit 0\n")
    os.chmod(script, 0o644)
    result = gl.run("run", "--", str(script))
    assert result.returncode == 126, result.stderr
    assert set(gl.states().values()) == {"free"}


def test_script_without_interpreter_line_runs_with_sh(gl):
    # As a shell (and execvp) does: a program the kernel cannot execute is run by /bin/sh.
    script = gl.tmp / "no-interpreter-line"
    script.write_text('printf "%s|" "$@"; exit 5\n')
    os.chmod(script, 0o755)
    result = gl.run("run", "--", str(script), "one", "two words")
    assert result.returncode == 5, result.stderr
    assert result.stdout == "one|two words|"
    assert set(gl.states().values()) == {"free"}


def signal_mask(status_text, field):
    return int(re.search(r"^%s:\s*([0-9a-f]+)$" % field, status_text, re.M).group(1), 16)


def test_command_starts_with_default_signal_dispositions(gl):
    # Nothing gpulock itself ignores, blocks or handles reaches the command (the CLI ignores
    # SIGPIPE; glibc's spawn would leave its internal signals 32 and 33 ignored), while what
    # the caller ignored stays ignored, as across any exec.
    result = gl.run("run", "--", "cat", "/proc/self/status")
    assert result.returncode == 0, result.stderr
    assert signal_mask(result.stdout, "SigIgn") == 0
    assert signal_mask(result.stdout, "SigBlk") == 0
    ignoring_int = gl.run("run", "--", "cat", "/proc/self/status",
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    assert signal_mask(ignoring_int.stdout, "SigIgn") == 1 << (signal.SIGINT - 1)


# -- CUDA_VISIBLE_DEVICES in the caller's environment limits the candidates -------------------

def test_cuda_visible_devices_limits_count_request(gl):
    env = gl.env(cuda_visible_devices="2,3")
    seen = run_env_dump(gl, "-n", "2", env=env)
    assert sorted(seen["CUDA_VISIBLE_DEVICES"].split(",")) == ["2", "3"]
    assert set(seen["GPULOCK_GPUS"].split(",")) == {sim_uuid(2), sim_uuid(3)}
    seen = run_env_dump(gl, "-n", "1", env=env)
    assert seen["CUDA_VISIBLE_DEVICES"] == "2"


def test_cuda_visible_devices_never_widened(gl):
    env = gl.env(cuda_visible_devices="2,3")
    result = gl.run("run", "--gpus", "0", "--", "true", env=env)
    assert result.returncode == EX_UNAVAILABLE, result.stderr
    assert "CUDA_VISIBLE_DEVICES" in result.stderr
    result = gl.run("run", "-n", "3", "--", "true", env=env)
    assert result.returncode == EX_UNAVAILABLE, result.stderr


def test_cuda_visible_devices_waits_within_its_gpus(gl):
    """With GPUs 2 and 3 visible and GPU 2 held, -n 1 gets 3 (not a free GPU outside)."""
    gl.hold("--gpus", "2")
    seen = run_env_dump(gl, "-n", "1", env=gl.env(cuda_visible_devices="2,3"))
    assert seen["CUDA_VISIBLE_DEVICES"] == "3"


def test_cuda_visible_devices_by_uuid(gl):
    env = gl.env(cuda_visible_devices=sim_uuid(1))
    seen = run_env_dump(gl, "-n", "1", env=env)
    assert seen["GPULOCK_GPUS"] == sim_uuid(1)
    assert seen["CUDA_VISIBLE_DEVICES"] == "1"
    result = gl.run("run", "-n", "2", "--", "true", env=env)
    assert result.returncode == EX_UNAVAILABLE, result.stderr
    seen = run_env_dump(gl, "-n", "1", "--visible", "uuid", env=env)
    assert seen["CUDA_VISIBLE_DEVICES"] == sim_uuid(1)


def test_cuda_visible_devices_empty_means_none(gl):
    # CUDA treats an empty CUDA_VISIBLE_DEVICES as "no devices".
    result = gl.run("run", "-n", "1", "--", "true", env=gl.env(cuda_visible_devices=""))
    assert result.returncode == EX_UNAVAILABLE, result.stderr


def test_command_inherits_only_its_lock_descriptors(gl):
    result = gl.run("run", "-n", "2", "--", "sh", "-c",
                    'for f in /proc/$$/fd/*; do readlink "$f"; done')
    assert result.returncode == 0, result.stderr
    targets = result.stdout.split()
    lock_files = sorted(str(gl.lock_dir / ("gpu-%s.lock" % sim_uuid(i))) for i in (0, 1))
    # Exactly the lease's lock files: no lock directory, inotify, signalfd or mutex descriptor.
    assert [t for t in targets if t not in ("/dev/null",) and "pipe:" not in t] == lock_files


def test_topology_preferred_for_multi_gpu_requests(gl):
    env = gl.env(fake=gl.write_fake_gpus([{"switch": 0}, {"switch": 1}, {"switch": 0},
                                          {"switch": 1}]))
    seen = run_env_dump(gl, "-n", "2", env=env)
    assert seen["CUDA_VISIBLE_DEVICES"] == "0,2"
    gl.hold("--gpus", "0", env=env)
    seen = run_env_dump(gl, "-n", "2", env=env)
    assert seen["CUDA_VISIBLE_DEVICES"] == "1,3"


def test_terminal_interrupt_reaches_command_once(gl):
    """^C on a terminal signals the whole foreground group: the command must get SIGINT once,
    not once from the terminal and again forwarded by gpulock. A later SIGUSR1 sent to gpulock
    alone (forwarded, and delivered after any forwarded SIGINT) ends the command."""
    log = gl.tmp / "signals.log"
    ready = gl.tmp / "ready"
    script = ('trap \'echo int >> "$1"\' INT; trap \'echo usr1 >> "$1"; exit 0\' USR1; '
              'echo up > "$2"; while :; do sleep 0.05; done')
    with Terminal(gl.cmd("run", "--", "sh", "-c", script, "cmd", log, ready), gl.env(),
                  gl.tmp) as terminal:
        proc = terminal.proc
        wait_until(lambda: (terminal.drain(), ready.exists() or proc.poll() is not None)[1],
                   what="the command to start")
        assert proc.poll() is None, bytes(terminal.output)
        terminal.write(b"\x03")  # ^C: the terminal sends SIGINT to the foreground group
        wait_until(lambda: (terminal.drain(), log.exists() and "int" in log.read_text())[1],
                   what="the command to see SIGINT")
        os.kill(proc.pid, signal.SIGUSR1)
        assert proc.wait(timeout=HANG) == 0, bytes(terminal.output)
        assert log.read_text().split() == ["int", "usr1"], bytes(terminal.output)
