"""Progress while waiting: the on_wait callback's reports (position, queue length, what blocks
the request), a failing callback that does not end the wait (a RuntimeWarning says it failed),
the default report to the `gpulock` logger, and on_wait=None."""

import logging
import os
import threading
import warnings

import pytest

import gpulock
from conftest import HANG, sim_uuid, wait_until


def end_when_queued(gl, holder):
    """A thread that ends `holder` once this process waits in the queue."""
    me = os.getpid()
    problems = []

    def run():
        try:
            wait_until(lambda: gl.queue_entry(me), HANG, what="this process in the queue")
            holder.kill_group()
        except BaseException as e:
            problems.append(e)
    thread = threading.Thread(target=run)
    thread.start()
    return thread, problems


def test_on_wait_reports_progress(gl):
    holder, lease_id, _ = gl.hold("--gpus", "0", label="prep")
    reports = []

    def on_wait(progress):
        reports.append(progress)
        if len(reports) == 1:
            # Seen from outside while the callback runs: this process waits.
            entry = gl.queue_entry(os.getpid())
            reports.append({"entry": entry})
            holder.kill_group()

    with gpulock.lease(gpus=0, on_wait=on_wait, timeout=HANG) as lease:
        assert lease.indices == [0]
    first = reports[0]
    assert set(first) >= {"waited", "position", "queue_length", "standing", "blocked_by",
                          "blocking"}
    assert first["position"] == 1
    assert first["queue_length"] == 1
    assert isinstance(first["waited"], float) and first["waited"] >= 0
    assert first["standing"] in ("waiting", "next")
    assert isinstance(first["blocked_by"], str) and first["blocked_by"]
    assert lease_id in first["blocked_by"]  # names the lease in the way
    assert [(b["index"], b["uuid"]) for b in first["blocking"]] == [("0", sim_uuid(0))]
    assert all(isinstance(b["reason"], str) and b["reason"] for b in first["blocking"])
    entry = reports[1]["entry"]
    assert entry is not None and entry["pid"] == os.getpid()


def test_on_wait_not_called_when_served_at_once(gl):
    reports = []
    with gpulock.lease(on_wait=reports.append):
        pass
    assert reports == []


def test_on_wait_not_called_without_waiting(gl):
    gl.hold("--gpus", "0")
    reports = []
    with pytest.raises(gpulock.Unavailable):
        gpulock.lease(gpus=0, wait=False, on_wait=reports.append)
    assert reports == []


def test_failing_callback_does_not_end_the_wait(gl):
    holder, _, _ = gl.hold("--gpus", "1")
    calls = []

    def on_wait(progress):
        calls.append(progress)
        if len(calls) == 1:
            holder.kill_group()
        raise ValueError("callback broke")

    with pytest.warns(RuntimeWarning, match="callback broke"):
        lease = gpulock.lease(gpus=1, on_wait=on_wait, timeout=HANG)
    assert lease.active and lease.indices == [1]
    lease.release()
    assert calls


def test_default_on_wait_logs_to_gpulock_logger(gl, caplog):
    holder, _, _ = gl.hold("--gpus", "2")
    thread, problems = end_when_queued(gl, holder)
    with caplog.at_level(logging.INFO, logger="gpulock"):
        with gpulock.lease(gpus=2, timeout=HANG):
            pass
    thread.join(HANG)
    assert problems == []
    records = [r for r in caplog.records if r.name == "gpulock"]
    assert records, "nothing logged while waiting"
    assert records[0].levelno == logging.INFO
    assert "position 1 of 1" in records[0].getMessage()


def test_on_wait_none_reports_nothing(gl, caplog):
    holder, _, _ = gl.hold("--gpus", "3")
    thread, problems = end_when_queued(gl, holder)
    with caplog.at_level(logging.DEBUG, logger="gpulock"):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with gpulock.lease(gpus=3, timeout=HANG, on_wait=None):
                pass
    thread.join(HANG)
    assert problems == []
    assert [r for r in caplog.records if r.name == "gpulock"] == []


def test_callback_may_use_the_package(gl):
    """The callback runs inside the wait on the same pool: it can read the views and end
    another lease of this process, which then serves the wait."""
    first = gpulock.lease(gpus=0, set_env=False)
    seen = []

    def on_wait(progress):
        if not seen:
            seen.append([e.pid for e in gpulock.queue().waiting])
            seen.append(gpulock.status().gpus[0].lease_id)
            first.release()

    with gpulock.lease(gpus=0, on_wait=on_wait, timeout=HANG) as second:
        assert second.indices == [0]
    assert seen == [[os.getpid()], first.id]
