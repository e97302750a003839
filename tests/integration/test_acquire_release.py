"""`gpulock acquire --for-pid` (detached holders for shells) and `gpulock release`."""

import re
import subprocess

import pytest

from conftest import (EX_TEMPFAIL, EX_UNAVAILABLE, EX_USAGE, HANG, sim_uuid, stops_a_shell,
                      wait_until)


def shell_session(gl, body):
    """A bash script that evals `gpulock acquire --for-pid $$`, reports what it got, then runs
    `body`. Returns (Background, path of its report)."""
    report = gl.tmp / "report"
    script = gl.tmp / "session.sh"
    script.write_text(
        'set -e\n'
        'eval "$("$GPULOCK" acquire -n 1 --label shell-session --for-pid $$)"\n'
        'echo "$CUDA_VISIBLE_DEVICES $GPULOCK_LEASE_ID $GPULOCK_GPUS $CUDA_DEVICE_ORDER" '
        '> "$REPORT.tmp"\n'
        'mv "$REPORT.tmp" "$REPORT"\n' + body)
    env = gl.env(GPULOCK=gl.binary, REPORT=report)
    bg = gl.spawn_argv(["/bin/bash", script], env=env)

    def reported():
        if report.exists():
            return True
        if not bg.alive():
            raise AssertionError("session ended early: " + bg.describe())
        return False
    wait_until(reported, what="the shell session to acquire a GPU")
    return bg, report.read_text().split()


def test_acquire_in_shell_lasts_while_shell_lives(gl):
    finish = gl.tmp / "finish"
    session, (cvd, lease, uuids, order) = shell_session(
        gl, 'while [ ! -e "%s" ]; do sleep 0.05; done\n' % finish)
    assert re.fullmatch(r"[0-9a-f]{16}", lease)
    assert cvd == "0" and uuids == sim_uuid(0) and order == "PCI_BUS_ID"
    status = gl.gpu_status(0)
    assert status["state"] == "leased"
    assert status["lease_id"] == lease
    assert status["holder"]["kind"] == "detached"
    assert status["holder"]["label"] == "shell-session"
    assert session.pid in status["holder"]["member_pids"]
    assert gl.run("run", "--gpus", "0", "--no-wait", "--", "true").returncode == EX_TEMPFAIL

    finish.touch()
    assert session.wait() == 0, session.describe()
    gl.wait_state(0, "free")


def test_release_ends_lease_early(gl):
    session, (cvd, lease, _, _) = shell_session(gl, "sleep 1000\n")
    assert gl.gpu_status(int(cvd))["lease_id"] == lease
    result = gl.run("release", lease)
    assert result.returncode == 0, result.stderr
    # release returns once the lease has ended.
    assert gl.gpu_status(int(cvd))["state"] == "free"
    assert session.alive()
    result = gl.run("run", "--gpus", cvd, "--no-wait", "--", "true")
    assert result.returncode == 0, result.stderr
    result = gl.run("release", lease)
    assert result.returncode == EX_UNAVAILABLE, result.stderr


def test_acquire_does_not_hang_output_capture(gl):
    """The detached holder must not keep the caller's stdout or stderr open."""
    watched = gl.sleeper()
    argv = gl.cmd("acquire", "-n", "2", "--visible", "uuid", "--for-pid", watched.pid)
    # capture_output waits for EOF on both pipes: a holder keeping either open hangs here.
    result = subprocess.run(argv, env=gl.env(), capture_output=True, text=True, timeout=HANG,
                            stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stderr
    exports = dict(re.findall(r"^export ([A-Z_]+)='([^']*)'$", result.stdout, re.M))
    assert set(exports) == {"CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "GPULOCK_LEASE_ID",
                            "GPULOCK_GPUS"}
    assert exports["CUDA_VISIBLE_DEVICES"] == exports["GPULOCK_GPUS"]
    assert exports["GPULOCK_GPUS"] == "%s,%s" % (sim_uuid(0), sim_uuid(1))
    assert gl.gpu_status(1)["lease_id"] == exports["GPULOCK_LEASE_ID"]
    watched.kill_group()
    gl.wait_state(0, "free")
    gl.wait_state(1, "free")


def test_label_with_quote_is_safe_to_eval(gl):
    watched = gl.sleeper()
    result = gl.run("acquire", "--for-pid", watched.pid, "--label", "it's $(touch pwned)")
    assert result.returncode == 0, result.stderr
    # Whatever the label, the output is only export lines safe for eval.
    check = subprocess.run(["/bin/bash", "-c", result.stdout + '\necho "$GPULOCK_LEASE_ID"'],
                           capture_output=True, text=True, timeout=HANG, cwd=gl.tmp)
    assert check.returncode == 0
    assert not (gl.tmp / "pwned").exists()
    assert check.stdout.strip() == gl.gpu_status(0)["lease_id"]


def test_release_of_run_lease_refused(gl):
    holder, lease = gl.hold("--gpus", "0")
    result = gl.run("release", lease)
    assert result.returncode != 0
    assert result.returncode in (EX_USAGE, EX_UNAVAILABLE), result.stderr
    assert lease in result.stderr and "stop" in result.stderr
    assert gl.gpu_status(0)["lease_id"] == lease
    assert holder.alive()


def test_release_unknown_lease(gl):
    result = gl.run("release", "0123456789abcdef")
    assert result.returncode == EX_UNAVAILABLE, result.stderr
    assert "0123456789abcdef" in result.stderr


@pytest.mark.parametrize("lease", ["zzz", "0123456789ABCDEF", "0123456789abcde", "",
                                   "../../etc/passwd", "0123456789abcdef0"])
def test_release_malformed_lease_id(gl, lease):
    result = gl.run("release", lease)
    assert result.returncode == EX_USAGE, result.stderr


def test_release_requires_lease_id(gl):
    assert gl.run("release").returncode == EX_USAGE


@pytest.mark.parametrize("pid", ["999999999", "-5", "0", "abc"])
def test_acquire_for_missing_pid(gl, pid):
    result = gl.run("acquire", "-n", "1", "--for-pid", pid)
    assert result.returncode == EX_USAGE, result.stderr
    assert stops_a_shell(result.stdout, EX_USAGE), result.stdout  # eval stops, fails closed
    assert set(gl.states().values()) == {"free"}


def test_acquire_for_exited_pid(gl):
    gone = subprocess.Popen(["true"])
    gone.wait()
    result = gl.run("acquire", "-n", "1", "--for-pid", gone.pid)
    assert result.returncode == EX_USAGE, result.stderr
    assert set(gl.states().values()) == {"free"}


def test_acquire_for_this_very_process_is_refused(gl):
    # `$BASHPID` inside `<(…)` names the process that then runs gpulock: the lease would end
    # as soon as acquire exits.
    result = gl.run("acquire", "-n", "1", "--print-ids", prefix=(
        "bash", "-c", 'exec "$0" "$@" --for-pid $BASHPID'))
    assert result.returncode == EX_USAGE, result.stderr
    assert "is this gpulock process itself" in result.stderr
    assert result.stdout == ""  # nothing that `read` would take for a GPU id
    assert set(gl.states().values()) == {"free"}


def test_acquire_no_wait_while_held(gl):
    gl.hold("--gpus", "0")
    watched = gl.sleeper()
    result = gl.run("acquire", "--gpus", "0", "--no-wait", "--for-pid", watched.pid)
    assert result.returncode == EX_TEMPFAIL, result.stderr
    assert stops_a_shell(result.stdout, EX_TEMPFAIL), result.stdout


def test_acquire_for_missing_pid_fails_before_waiting(gl):
    gl.hold("-n", "4")
    result = gl.run("acquire", "-n", "1", "--timeout", "1s", "--for-pid", "999999999")
    assert result.returncode == EX_USAGE, result.stderr


def test_release_by_gpus_names_them_as_a_request_does(gl):
    """`release --gpus` takes what --print-ids printed; a UUID prefix that several GPUs share
    is refused (it would have released whichever came first), and a lease of two GPUs named
    by both ends once."""
    watched = gl.sleeper()
    result = gl.run("acquire", "-n", "2", "--print-ids", "--for-pid", watched.pid)
    assert (result.returncode, result.stdout) == (0, "0,1\n"), result.stderr
    ambiguous = gl.run("release", "--gpus", sim_uuid(0)[:12])
    assert ambiguous.returncode == EX_USAGE and "matches several GPUs" in ambiguous.stderr
    assert gl.run("release", "--gpus", "2").returncode == EX_UNAVAILABLE  # not leased
    assert gl.states()["0"] == gl.states()["1"] == "leased"
    released = gl.run("release", "--gpus", "0,1")
    assert released.returncode == 0, released.stderr
    assert set(gl.states().values()) == {"free"}
