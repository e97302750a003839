"""`gpulock acquire --print-ids`: the one-line form for shell habits such as GPU.py's
`read GPUID < <(GPU.py --get)`. It prints only the leased GPUs, as CUDA_VISIBLE_DEVICES would
name them, on one line; the lease is held as with the export lines, until the process named
by --for-pid exits or `gpulock release`."""

import subprocess

from conftest import EX_TEMPFAIL, HANG, sim_uuid, wait_until


def test_read_gpuid_from_process_substitution(gl):
    """A bash script reads the id with `read GPUID < <(…)`, uses it, and its lease lasts
    until the script exits."""
    report = gl.tmp / "report"
    finish = gl.tmp / "finish"
    script = gl.tmp / "job.sh"
    script.write_text(
        'set -e\n'
        'read GPUID < <("$GPULOCK" acquire -n 1 --for-pid $$ --print-ids)\n'
        'echo "$GPUID" > "$REPORT.tmp" && mv "$REPORT.tmp" "$REPORT"\n'
        'while [ ! -e "$FINISH" ]; do sleep 0.05; done\n')
    job = gl.spawn_argv(["/bin/bash", script],
                        env=gl.env(GPULOCK=gl.binary, REPORT=report, FINISH=finish))

    def reported():
        if report.exists():
            return True
        if not job.alive():
            raise AssertionError("job ended early: " + job.describe())
        return False
    wait_until(reported, what="the job to read its GPU id")
    assert report.read_text() == "0\n"
    status = gl.gpu_status(0)
    assert status["state"] == "leased" and status["holder"]["kind"] == "detached"
    assert job.pid in status["holder"]["member_pids"]
    assert gl.run("run", "--gpus", "0", "--no-wait", "--", "true").returncode == EX_TEMPFAIL
    # The next script gets the next GPU.
    watched = gl.sleeper()
    second = gl.run("acquire", "--for-pid", watched.pid, "--print-ids")
    assert second.returncode == 0, second.stderr
    assert second.stdout == "1\n"
    finish.touch()
    assert job.wait() == 0, job.describe()
    gl.wait_state(0, "free")
    assert gl.gpu_status(1)["state"] == "leased"


def test_several_gpus_and_uuids(gl):
    watched = gl.sleeper()
    argv = gl.cmd("acquire", "-n", "2", "--for-pid", watched.pid, "--print-ids")
    result = subprocess.run(argv, env=gl.env(), capture_output=True, text=True, timeout=HANG,
                            stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "0,1\n"
    lease = gl.gpu_status(0)["lease_id"]
    assert lease and gl.gpu_status(1)["lease_id"] == lease
    result = gl.run("acquire", "--for-pid", watched.pid, "--print-ids", "--visible", "uuid")
    assert result.returncode == 0, result.stderr
    assert result.stdout == sim_uuid(2) + "\n"
    assert gl.run("release", lease).returncode == 0
    assert gl.gpu_status(0)["state"] == "free"


def test_no_wait_while_held_prints_nothing(gl):
    holder, _ = gl.hold("-n", "4")
    watched = gl.sleeper()
    result = gl.run("acquire", "--no-wait", "--for-pid", watched.pid, "--print-ids")
    assert result.returncode == EX_TEMPFAIL
    assert result.stdout == ""
