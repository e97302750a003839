"""Jobs from Python: gpulock.submit() queues real jobs (the `gpulock` command's supervisors),
gpulock.jobs() lists them as `gpulock jobs --json` does, and bad requests raise the package's
exceptions. What ran is checked from the jobs' own output and the CLI's view."""

import json
import os

import pytest

import gpulock
from conftest import HANG


def cli_jobs(gl):
    listed = gl.cli("jobs", "--json")
    assert listed.returncode == 0, listed.stderr
    return {j["id"]: j for j in json.loads(listed.stdout)["jobs"]}


def test_submit_and_list_a_job_and_an_array(gl, tmp_path):
    job = gpulock.submit(["sh", "-c", 'echo "$GREETING on $CUDA_VISIBLE_DEVICES in $PWD"'],
                         gpus=[2], name="hello", time="1h", cwd=str(tmp_path),
                         env=dict(os.environ, GREETING="hi"))
    assert isinstance(job, int)
    ids = gpulock.submit(["sh", "-c", 'echo "$1"', "job", "{}"], array="1-3%2", count=1,
                         after=job)
    assert isinstance(ids, list) and len(ids) == 3 and ids[0] > job
    assert gl.cli("wait", str(job), *map(str, ids), timeout=HANG).returncode == 0

    listed = {j.id: j for j in gpulock.jobs()}
    assert sorted(listed) == sorted([job] + ids)
    first = listed[job]
    assert isinstance(first, gpulock.Job)
    assert first.state == "done" and first.ended_ok and first.exit_status == 0
    assert first.name == "hello" and first.gpus == ["2"]
    assert first.working_directory == str(tmp_path)
    assert "--time=1h" in first.lease_options
    assert first.output() == "hi on 2 in %s\n" % tmp_path
    assert [listed[i].output() for i in ids] == ["1\n", "2\n", "3\n"]
    assert listed[ids[0]].after == [job]
    # The same fields as the CLI's JSON.
    cli = cli_jobs(gl)
    for i, j in listed.items():
        assert j.state == cli[i]["state"] and j.command == cli[i]["command"]
        assert j.started == cli[i]["started"] and j.stdout == cli[i]["stdout"]
    assert [j.id for j in gpulock.jobs(state="done")] == sorted(listed)
    assert gpulock.jobs(state=["failed", "running"]) == []
    assert {j.id for j in gpulock.jobs(all_users=True)} >= set(listed)


def test_a_failing_job_and_bad_requests(gl):
    failing = gpulock.submit(["sh", "-c", "echo oops >&2; exit 3"])
    assert gl.cli("wait", str(failing), timeout=HANG).returncode == 3
    (job,) = gpulock.jobs()
    assert job.state == "failed" and job.exit_status == 3 and not job.ended_ok
    assert job.output(stderr=True) == "oops\n"

    with pytest.raises(gpulock.InvalidRequest, match="list of arguments"):
        gpulock.submit("python train.py")
    with pytest.raises(gpulock.InvalidRequest):
        gpulock.submit([])
    with pytest.raises(gpulock.InvalidRequest, match="--time"):
        gpulock.submit(["true"], time="soon")
    with pytest.raises(gpulock.NotFound, match="no job 9999"):
        gpulock.submit(["true"], after=[9999])
    assert [j.id for j in gpulock.jobs()] == [failing]  # nothing else was submitted


def test_unreadable_records_come_back_with_their_problem(gl):
    good = gpulock.submit(["true"])
    assert gl.cli("wait", str(good), timeout=HANG).returncode == 0
    store = gl.lock_dir / "jobs"
    (store / str(good + 1)).mkdir()
    (store / str(good + 1) / "job.json").write_text("{not json")
    listed = {j.id: j for j in gpulock.jobs()}
    assert listed[good].problem is None and listed[good].state == "done"
    assert "malformed" in listed[good + 1].problem
    assert gpulock.jobs(state="done") == [listed[good]]
