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


def test_lock_gpu_uid_leaves_cuda_visible_devices_alone(gl, monkeypatch):
    with lock_gpu(uid=1):
        assert "CUDA_VISIBLE_DEVICES" not in os.environ
        assert "GPULOCK_LEASE_ID" not in os.environ
    assert "CUDA_VISIBLE_DEVICES" not in os.environ


def test_lock_gpu_uid_is_a_cuda_number_of_this_process(gl, monkeypatch):
    """With CUDA_VISIBLE_DEVICES=3,1 already set (Slurm, a container), cuda:0 is GPU 3 and
    cuda:1 is GPU 1: uid means what `.to(f"cuda:{uid}")` will use."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    with lock_gpu(uid=0) as gpu:
        assert gpu == 0 and gpu.uid == 0
        assert gl.states() == {"0": "free", "1": "free", "2": "free", "3": "leased"}
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "3,1"
    with lock_gpu(uid=1):
        assert gl.states()["1"] == "leased"
    with pytest.raises(RuntimeError) as raised:
        with lock_gpu(uid=2):
            pytest.fail("locked a GPU this process cannot see")
    assert "CUDA_VISIBLE_DEVICES=3,1" in str(raised.value)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "3,1"


def test_lock_gpu_uid_sets_pci_device_order_for_the_block_only(gl, monkeypatch):
    with lock_gpu(uid=0):
        assert os.environ["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert "CUDA_DEVICE_ORDER" not in os.environ
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "FASTEST_FIRST")
    with lock_gpu(uid=0):
        assert os.environ["CUDA_DEVICE_ORDER"] == "FASTEST_FIRST"
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


# -- gpu_lock 0.2.1, what `pip install git+…/gpu_lock.git` installs ---------------------------

def test_module_names_of_both_releases():
    assert gpu_lock.version == "0.2.1"
    assert gpu_lock.LOCKDIR == "/var/tmp/gpu_lock"
    assert gpu_lock.N_GPUS == 8
    assert gpu_lock.logger.name == "gpu_locking"
    namespace = {}
    exec("from gpulock.compat.gpu_lock import *", namespace)
    assert {"lock_gpu", "LOCKDIR", "N_GPUS", "version"} <= set(namespace)


def test_021_readme_one_gpu_lock_uid(gl):
    """0.2.1's README: `with lock_gpu() as lock: print(f"Locked GPUS {lock.uid}")`; the lock
    sets CUDA_VISIBLE_DEVICES to the GPU (and CUDA_DEVICE_ORDER) for the block."""
    with lock_gpu() as lock:
        assert f"Locked GPUS {lock.uid}" == "Locked GPUS 0"
        assert lock.pid == os.getpid() and lock.user
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "0"
        assert os.environ["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
        assert gl.gpu_status(0)["holder"]["label"] == "gpu_lock"
        assert gl.no_wait_run("0") == EX_TEMPFAIL
    assert "CUDA_VISIBLE_DEVICES" not in os.environ  # 0.2.1 left "" behind
    assert "CUDA_DEVICE_ORDER" not in os.environ
    assert gl.no_wait_run("0") == 0


def test_021_readme_three_gpus(gl):
    with lock_gpu(n=3) as lock:
        assert lock.uid == [0, 1, 2]
        assert [l.uid for l in lock.locks] == [0, 1, 2]
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "0,1,2"
        assert gl.states() == {"0": "leased", "1": "leased", "2": "leased", "3": "free"}
    assert gl.no_wait_run("0,1,2") == 0
    assert "CUDA_VISIBLE_DEVICES" not in os.environ


def test_021_positional_argument_is_a_count(gl):
    """`lock_gpu(2)` is two GPUs in 0.2.1 (the released version wins over 0.0.1's GPU 2)."""
    with lock_gpu(2) as lock:
        assert lock.uid == [0, 1]
        assert gl.states() == {"0": "leased", "1": "leased", "2": "free", "3": "free"}


def test_021_leases_when_called_and_fails_at_once(gl):
    """0.2.1 checks (here: takes) the locks when lock_gpu() is called, raising RuntimeError
    there, before any `with`; the lock is known (`.uid`) before the block starts."""
    gl.hold("--gpus", "0,1,2")
    lock = lock_gpu()
    assert lock.uid == 3
    assert gl.gpu_status(3)["holder"]["pid"] == os.getpid()
    with pytest.raises(RuntimeError) as raised:
        lock_gpu()
    assert isinstance(raised.value, gpulock.Unavailable)
    with pytest.raises(RuntimeError):
        lock_gpu(n=2)
    assert gl.queue()["waiting"] == []
    with lock:
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "3"
    assert gl.no_wait_run("3") == 0


def test_021_n_system_gpus_limits_the_gpus_tried(gl):
    gl.hold("--gpus", "0,1")
    with pytest.raises(RuntimeError):
        lock_gpu(n_system_gpus=2)
    with lock_gpu(n_system_gpus=3) as lock:
        assert lock.uid == 2


def test_021_bad_arguments_are_value_errors(gl):
    for kwargs in ({"n": 0}, {"n": "2"}, {"n_system_gpus": 0}, {"uid": -1}, {"uid": True}):
        with pytest.raises(ValueError):
            lock_gpu(**kwargs)
    assert gl.states() == {"0": "free", "1": "free", "2": "free", "3": "free"}


def test_021_chooses_within_a_preset_cuda_visible_devices(gl, monkeypatch):
    """With CUDA_VISIBLE_DEVICES=2,3 set by a parent, only GPUs 2 and 3 may be locked; the
    block narrows the variable to the locked GPU and puts it back after."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    with lock_gpu() as lock:
        assert lock.uid == 2
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "2"
        assert gl.states() == {"0": "free", "1": "free", "2": "leased", "3": "free"}
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "2,3"
    with lock_gpu(n=2) as lock:
        assert lock.uid == [2, 3]
    with pytest.raises(RuntimeError):
        lock_gpu(n=3)


def test_021_nested_locks_join_cuda_visible_devices(gl):
    """As in 0.2.1, a lock taken inside another's block adds its GPU to CUDA_VISIBLE_DEVICES,
    and each block's end takes its own back out."""
    with lock_gpu() as outer:
        with lock_gpu() as inner:
            assert (outer.uid, inner.uid) == (0, 1)
            assert os.environ["CUDA_VISIBLE_DEVICES"] == "0,1"
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "0"
        assert gl.no_wait_run("1") == 0
    assert "CUDA_VISIBLE_DEVICES" not in os.environ


LOCKER_021 = r'''
from gpulock.compat.gpu_lock import lock_gpu
try:
    with lock_gpu(n=int(sys.argv[2])) as lock:
        report("locked", {"uid": lock.uid, "cvd": os.environ.get("CUDA_VISIBLE_DEVICES")})
        wait_for("release")
except RuntimeError as e:
    report("failed", str(e))
    sys.exit(3)
'''


def test_021_between_processes_and_with_the_cli(gl):
    """Two 0.2.1-style processes get disjoint GPUs; the CLI cannot take theirs, and they
    cannot take the CLI's."""
    cli_holder, _, _ = gl.hold("--gpus", "1")
    first = gl.python(LOCKER_021, "2")
    assert first.wait_json("locked") == {"uid": [0, 2], "cvd": "0,2"}
    second = gl.python(LOCKER_021, "2")
    assert second.wait() == 3, second.describe()
    third = gl.python(LOCKER_021, "1")
    assert third.wait_json("locked") == {"uid": 3, "cvd": "3"}
    assert gl.no_wait_run("0") == EX_TEMPFAIL and gl.no_wait_run("3") == EX_TEMPFAIL
    holders = gl.holders()
    assert {k: holders[k] for k in ("0", "2", "3")} == {"0": first.pid, "2": first.pid,
                                                       "3": third.pid}
    assert holders["1"] not in (first.pid, third.pid)
    for child in (first, third):
        child.tell("release")
        assert child.wait() == 0, child.describe()
    assert gl.no_wait_run("0,2,3") == 0


def test_021_block_whose_cuda_visible_devices_the_caller_changed_leaves_no_trace(gl, monkeypatch):
    """Code inside a 0.2.1 block may set CUDA_VISIBLE_DEVICES itself; the block's record of
    what it set must still end with it, or a later lock_gpu() misreads the caller's value
    (here: CUDA_VISIBLE_DEVICES=0 set by the caller afterwards was taken for the old block's,
    so lock_gpu(n=2) locked GPUs 0 and 3, though the caller shows only GPU 0)."""
    with lock_gpu():
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "0"
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2")
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "2"  # the caller's change is left alone
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    gl.hold("--gpus", "1,2")
    with pytest.raises(gpulock.Unsatisfiable):  # the caller shows one GPU, not two
        lock_gpu(n=2)
    with lock_gpu() as lock:
        assert lock.uid == 0 and os.environ["CUDA_VISIBLE_DEVICES"] == "0"
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0"
