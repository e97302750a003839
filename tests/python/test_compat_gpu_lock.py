"""gpulock.compat.lock_gpu against what gpu_lock's document describes (seed 000): `with
lock_gpu(uid=0):` locks GPU 0 and `with lock_gpu():` any free GPU, raising RuntimeError at once
when it is taken; CUDA_VISIBLE_DEVICES is left alone. And where gpulock means to differ: the
lock is a real exclusion seen by every gpulock user, not taken over by another process of the
same user, and it cannot go stale (SIGKILL of its holder frees it). The seed's "4 GPUs, 6
workers" scenario (seed 002) is reproduced with real worker processes."""

import os
import signal

import pytest

import gpulock
from gpulock.compat import gpu_lock, lock_gpu
from conftest import EX_TEMPFAIL, HANG, sim_uuid, wait_until


def test_importable_as_the_seed_module():
    assert gpu_lock.lock_gpu is lock_gpu
    from gpulock.compat.gpu_lock import lock_gpu as same
    assert same is lock_gpu


def test_lock_gpu_uid_locks_that_gpu(gl):
    with lock_gpu(uid=2) as gpu:
        assert gpu == 2
        status = gl.gpu_status(2)
        assert status["state"] == "leased"
        assert status["holder"]["kind"] == "process"
        assert status["holder"]["pid"] == os.getpid()
        assert status["holder"]["label"] == "gpu_lock"
        assert gl.no_wait_run("2") == EX_TEMPFAIL
        assert gl.states() == {"0": "free", "1": "free", "2": "leased", "3": "free"}
    assert gl.no_wait_run("2") == 0


def test_lock_gpu_any_takes_free_gpus_then_fails_at_once(gl):
    os.environ["GPULOCK_FAKE_GPUS"] = "2"
    with lock_gpu() as first:
        with lock_gpu() as second:
            assert {first, second} == {0, 1}
            with pytest.raises(RuntimeError) as raised:
                with lock_gpu():
                    pass
            assert isinstance(raised.value, gpulock.Unavailable)
            assert not isinstance(raised.value, TimeoutError)  # it did not wait
            assert gl.queue()["waiting"] == []
        with lock_gpu() as third:
            assert third == second
    assert gl.no_wait_run("0,1") == 0


def test_lock_gpu_uid_taken_raises_runtime_error(gl):
    holder, lease_id, _ = gl.hold("--gpus", "1")
    with pytest.raises(RuntimeError):
        with lock_gpu(uid=1):
            pytest.fail("entered the block of a GPU that another process holds")
    assert gl.gpu_status(1)["lease_id"] == lease_id
    assert gl.queue()["waiting"] == []


def test_lock_gpu_unknown_uid(gl):
    with pytest.raises(RuntimeError):
        with lock_gpu(uid=9):
            pass


def test_lock_gpu_leaves_cuda_visible_devices_alone(gl, monkeypatch):
    with lock_gpu(uid=1):
        assert "CUDA_VISIBLE_DEVICES" not in os.environ
        assert "GPULOCK_LEASE_ID" not in os.environ
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    # An index given explicitly is what gpu_lock means: not limited by CUDA_VISIBLE_DEVICES.
    with lock_gpu(uid=0) as gpu:
        assert gpu == 0
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "3"
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "3"


def test_lock_gpu_sets_pci_device_order_only_when_unset(gl, monkeypatch):
    with lock_gpu():
        assert os.environ["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "FASTEST_FIRST")
    with lock_gpu():
        assert os.environ["CUDA_DEVICE_ORDER"] == "FASTEST_FIRST"


def test_lock_released_on_exception(gl):
    with pytest.raises(KeyError):
        with lock_gpu(uid=3):
            raise KeyError("boom")
    assert gl.no_wait_run("3") == 0


def test_lock_gpu_wait_option(gl):
    holder, _, _ = gl.hold("--gpus", "0")
    with pytest.raises(TimeoutError):
        with lock_gpu(uid=0, wait=True, timeout=0.2):
            pass


# -- between processes --------------------------------------------------------------------

LOCKER = r'''
from gpulock.compat import lock_gpu
uid = None if sys.argv[2] == "any" else int(sys.argv[2])
try:
    with lock_gpu(uid=uid) as gpu:
        report("locked", {"gpu": gpu, "pid": os.getpid(),
                          "cvd": os.environ.get("CUDA_VISIBLE_DEVICES")})
        wait_for("release")
except RuntimeError as e:
    report("failed", str(e))
    sys.exit(3)
'''


def test_another_process_of_same_user_cannot_take_the_lock(gl):
    """The seed let a process take over a lock of the same user; here the lock holds."""
    first = gl.python(LOCKER, "0")
    assert first.wait_json("locked")["gpu"] == 0
    second = gl.python(LOCKER, "0")
    assert second.wait() == 3, second.describe()
    assert second.wait_file("failed")
    assert gl.holders() == {"0": first.pid}
    first.tell("release")
    assert first.wait() == 0


def test_lock_does_not_survive_sigkill(gl):
    """No stale lock: the lock ends with its process, however it ends."""
    victim = gl.python(LOCKER, "0")
    victim.wait_json("locked")
    assert gl.gpu_status(0)["state"] == "leased"
    victim.kill(signal.SIGKILL)
    assert victim.wait() == -signal.SIGKILL
    assert gl.gpu_status(0)["state"] == "free"
    with lock_gpu(uid=0) as gpu:
        assert gpu == 0


def test_four_gpus_six_workers(gl):
    """Seed 002: with 4 GPUs, workers 1-4 each get a GPU of their own (in index order) and
    workers 5 and 6 exit at once, while the first four still hold theirs."""
    workers = []
    for n in range(4):
        worker = gl.python(LOCKER, "any")
        info = worker.wait_json("locked")
        assert info["gpu"] == n
        assert info["cvd"] is None
        workers.append(worker)
    for _ in range(2):
        late = gl.python(LOCKER, "any")
        assert late.wait() == 3, late.describe()
        assert late.wait_file("failed")
    # Audit: each GPU is held by its own worker, and nobody waits.
    assert gl.holders() == {str(n): w.pid for n, w in enumerate(workers)}
    assert gl.queue()["waiting"] == []
    for worker in workers:
        worker.tell("release")
        assert worker.wait() == 0
    assert gl.states() == {"0": "free", "1": "free", "2": "free", "3": "free"}


def test_six_workers_started_together_never_share(gl):
    """The same, started all at once: exactly four distinct GPUs are locked and two workers
    fail, without waiting for the others to finish."""
    workers = [gl.python(LOCKER, "any") for _ in range(6)]

    def outcome(worker):
        def known():
            for result in ("locked", "failed"):
                if worker.reported(result):
                    return result
            if not worker.alive():
                raise AssertionError("worker exited without a result: " + worker.describe())
            return None
        return wait_until(known, HANG, what="worker %d to lock or fail" % worker.pid)

    outcomes = [outcome(w) for w in workers]
    assert outcomes.count("locked") == 4 and outcomes.count("failed") == 2, outcomes
    locked = [w for w, o in zip(workers, outcomes) if o == "locked"]
    gpus = sorted(w.wait_json("locked")["gpu"] for w in locked)
    assert gpus == [0, 1, 2, 3]
    for w, o in zip(workers, outcomes):
        if o == "failed":
            assert w.wait() == 3
    holders = gl.holders()
    assert sorted(holders.values()) == sorted(w.pid for w in locked)
    for w in locked:
        w.tell("release")
        assert w.wait() == 0


def test_seen_by_gpulock_status_as_a_uuid(gl):
    with lock_gpu(uid=1):
        status = gl.gpu_status(1)
        assert status["holder"]["gpus"] == [sim_uuid(1)]
