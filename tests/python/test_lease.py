"""gpulock.lease() in one process: what it leases (count, gpus=, among=, CUDA_VISIBLE_DEVICES),
the environment it sets and restores, the Lease object (ids, indices, names, repr, release,
active), and every way a lease ends (with block, exception, release(), garbage collection).
Whether a GPU is held is always checked independently, with `gpulock run --no-wait`."""

import gc
import os
import sys
import time

import pytest

import gpulock
from conftest import EX_TEMPFAIL, LEASE_VARIABLES, SHORT_HANG, sim_uuid


def lease_env():
    return {name: os.environ.get(name) for name in LEASE_VARIABLES}


# -- the context manager and the environment ----------------------------------------------

def test_with_block_sets_environment_and_holds_gpu(gl):
    with gpulock.lease() as lease:
        assert isinstance(lease, gpulock.Lease)
        assert lease.active
        assert lease.indices == [0]  # index order: the first free GPU
        assert lease.gpus == [sim_uuid(0)]
        assert lease.display_indices == ["0"]
        assert lease.names == ["Simulated GPU"]
        assert len(lease.id) == 16 and int(lease.id, 16) >= 0
        assert lease_env() == {
            "CUDA_VISIBLE_DEVICES": "0",
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            "GPULOCK_LEASE_ID": lease.id,
            "GPULOCK_GPUS": sim_uuid(0),
        }
        assert lease.cuda_visible_devices == "0"
        assert lease.environment == {k: v for k, v in lease_env().items()}
        assert gl.no_wait_run("0") == EX_TEMPFAIL
        assert gl.no_wait_run("1") == 0
        assert gl.gpu_status(0)["lease_id"] == lease.id
    assert not lease.active
    assert lease_env() == dict.fromkeys(LEASE_VARIABLES)
    assert gl.no_wait_run("0") == 0


def test_environment_restores_previous_values(gl, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,2,3")
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "FASTEST_FIRST")
    monkeypatch.setenv("GPULOCK_GPUS", "previous")
    before = lease_env()
    with gpulock.lease(count=2) as lease:
        assert lease.indices == [1, 2]  # only GPUs CUDA_VISIBLE_DEVICES lists
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "1,2"
        assert os.environ["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
        assert os.environ["GPULOCK_GPUS"] == "%s,%s" % (sim_uuid(1), sim_uuid(2))
    assert lease_env() == before


def test_value_changed_by_user_during_lease_is_left_alone(gl):
    with gpulock.lease() as lease:
        os.environ["CUDA_VISIBLE_DEVICES"] = "mine"
        del os.environ["GPULOCK_GPUS"]
    assert not lease.active
    assert os.environ.get("CUDA_VISIBLE_DEVICES") == "mine"
    # The variables nobody touched are restored (here: removed).
    assert os.environ.get("GPULOCK_LEASE_ID") is None
    assert os.environ.get("CUDA_DEVICE_ORDER") is None
    assert os.environ.get("GPULOCK_GPUS") is None


def test_set_env_false_leaves_environment_alone(gl):
    with gpulock.lease(gpus=2, set_env=False) as lease:
        assert lease_env() == dict.fromkeys(LEASE_VARIABLES)
        assert lease.cuda_visible_devices == "2"
        assert lease.environment["CUDA_VISIBLE_DEVICES"] == "2"
        assert lease.environment["GPULOCK_LEASE_ID"] == lease.id
        assert gl.no_wait_run("2") == EX_TEMPFAIL
    assert lease_env() == dict.fromkeys(LEASE_VARIABLES)


def test_visible_uuid(gl):
    with gpulock.lease(count=2, visible="uuid") as lease:
        expected = "%s,%s" % (sim_uuid(0), sim_uuid(1))
        assert lease.cuda_visible_devices == expected
        assert os.environ["CUDA_VISIBLE_DEVICES"] == expected
        assert os.environ["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"


def test_environment_reaches_subprocess(gl):
    """lease.environment is what a program started with subprocess needs."""
    import subprocess
    with gpulock.lease(gpus=3, set_env=False) as lease:
        out = subprocess.run(["sh", "-c", 'echo "$CUDA_VISIBLE_DEVICES $GPULOCK_LEASE_ID"'],
                             env={**os.environ, **lease.environment}, capture_output=True,
                             text=True, check=True).stdout.split()
        assert out == ["3", lease.id]


# -- what is leased -----------------------------------------------------------------------

@pytest.mark.parametrize("gpus, indices", [
    (2, [2]),
    ("3", [3]),
    ("0,2", [0, 2]),
    ([1, 3], [1, 3]),
    (["3", 1], [3, 1]),
    ((i for i in (0, 1)), [0, 1]),
    (sim_uuid(2), [2]),
    ([sim_uuid(3), 0], [3, 0]),
])
def test_gpus_forms(gl, gpus, indices):
    with gpulock.lease(gpus=gpus) as lease:
        assert sorted(lease.indices) == sorted(indices)
        assert sorted(lease.gpus) == sorted(sim_uuid(i) for i in indices)
        for i in range(4):
            assert gl.no_wait_run(str(i)) == (EX_TEMPFAIL if i in indices else 0)


def test_gpus_by_unique_uuid_prefix(gl):
    gl.use_fake_gpus([{"uuid": "GPU-aaaa1111-0000-0000-0000-000000000000"},
                      {"uuid": "GPU-bbbb2222-0000-0000-0000-000000000000"}])
    with gpulock.lease(gpus="GPU-bbbb") as lease:
        assert lease.indices == [1]
        assert lease.gpus == ["GPU-bbbb2222-0000-0000-0000-000000000000"]
    with pytest.raises(gpulock.Error):
        gpulock.lease(gpus="GPU-", wait=False)  # matches both: ambiguous


def test_gpus_overrides_count(gl):
    with gpulock.lease(count=3, gpus=[1]) as lease:
        assert lease.indices == [1]


def test_count(gl):
    with gpulock.lease(count=3) as lease:
        assert lease.indices == [0, 1, 2]
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "0,1,2"
        assert gl.no_wait_run("3") == 0
        assert gl.no_wait_run("2") == EX_TEMPFAIL


def test_skips_held_gpus(gl):
    holder, _, _ = gl.hold("--gpus", "0,1")
    with gpulock.lease(count=2, wait=False) as lease:
        assert lease.indices == [2, 3]


def test_among_limits_candidates(gl):
    with gpulock.lease(count=2, among=[3, 1]) as lease:
        assert sorted(lease.indices) == [1, 3]
    with gpulock.lease(among="2") as lease:
        assert lease.indices == [2]
    with pytest.raises(gpulock.Unsatisfiable):
        gpulock.lease(count=2, among=[0])


def test_among_overrides_cuda_visible_devices(gl, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    with gpulock.lease(among=[3]) as lease:
        assert lease.indices == [3]


def test_respect_visible_devices(gl, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2")
    with gpulock.lease() as lease:
        assert lease.indices == [2]
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "2"
    with pytest.raises(gpulock.Unsatisfiable):
        gpulock.lease(count=2)
    with pytest.raises(gpulock.Unsatisfiable):
        gpulock.lease(gpus=0)
    with gpulock.lease(respect_visible_devices=False) as lease:
        assert lease.indices == [0]
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "2"


def test_cuda_visible_devices_by_uuid_limits_candidates(gl, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", sim_uuid(3))
    with gpulock.lease() as lease:
        assert lease.indices == [3]


def test_label_and_holder_in_status(gl):
    with gpulock.lease(gpus=1, label="sweep-7") as lease:
        gpu = gl.gpu_status(1)
        assert gpu["state"] == "leased"
        assert gpu["lease_id"] == lease.id
        holder = gpu["holder"]
        assert holder["kind"] == "process"
        assert holder["pid"] == os.getpid()
        assert holder["pid_alive"] is True
        assert holder["label"] == "sweep-7"
        assert holder["gpus"] == [sim_uuid(1)]
        assert holder["command"].startswith(os.path.basename(sys.executable))


def test_lock_dir_argument(gl, tmp_path):
    other = tmp_path / "other-locks"
    with gpulock.lease(gpus=0, lock_dir=str(other)) as lease:
        # Held in the other directory only.
        assert gl.no_wait_run("0") == 0
        env = gl.env(GPULOCK_DIR=other)
        assert gl.cli("run", "--no-wait", "--gpus", "0", "--", "true",
                      env=env).returncode == EX_TEMPFAIL
        assert lease.active


# -- the Lease object ---------------------------------------------------------------------

def test_release_twice_and_repr(gl):
    lease = gpulock.lease(count=2)
    text = repr(lease)
    assert lease.id in text and "0,1" in text and "active" in text
    assert gl.no_wait_run("0,1") == EX_TEMPFAIL
    lease.release()
    assert not lease.active
    assert "released" in repr(lease)
    assert lease_env() == dict.fromkeys(LEASE_VARIABLES)
    assert gl.no_wait_run("0,1") == 0
    lease.release()  # harmless
    assert not lease.active
    # Leaving a with block of a released lease is harmless too.
    with lease:
        pass


def test_started_at(gl):
    before = time.time()
    with gpulock.lease() as lease:
        after = time.time()
        assert before - 1 <= lease.started_at <= after + 1


def test_exception_in_with_block_releases(gl):
    class Boom(Exception):
        pass

    with pytest.raises(Boom):
        with gpulock.lease(gpus=1) as lease:
            assert gl.no_wait_run("1") == EX_TEMPFAIL
            raise Boom()
    assert not lease.active
    assert gl.no_wait_run("1") == 0
    assert lease_env() == dict.fromkeys(LEASE_VARIABLES)


def test_garbage_collection_releases(gl):
    lease = gpulock.lease(gpus=2, set_env=False)
    assert gl.no_wait_run("2") == EX_TEMPFAIL
    del lease
    gc.collect()
    assert gl.no_wait_run("2") == 0


def test_lease_in_reference_cycle_released_by_collector(gl):
    class Job:
        pass

    job = Job()
    job.me = job
    job.lease = gpulock.lease(gpus=3, set_env=False)
    assert gl.no_wait_run("3") == EX_TEMPFAIL
    del job
    gc.collect()
    assert gl.no_wait_run("3") == 0


def test_two_leases_in_one_process_without_env_are_independent(gl):
    first = gpulock.lease(set_env=False)
    second = gpulock.lease(set_env=False)
    assert first.indices == [0] and second.indices == [1]
    assert first.id != second.id
    first.release()
    assert second.active
    assert gl.no_wait_run("0") == 0
    assert gl.no_wait_run("1") == EX_TEMPFAIL
    second.release()


def test_nested_lease_in_same_process_is_unsatisfiable(gl):
    """The inner lease may only use the outer lease's GPUs (CUDA_VISIBLE_DEVICES), which the
    outer lease holds and cannot release while the inner one waits: a clear error, not a
    deadlock."""
    with gpulock.lease(gpus=1) as outer:
        with pytest.raises(gpulock.Unsatisfiable) as raised:
            gpulock.lease(timeout=SHORT_HANG)  # a deadlock would end in Timeout
        message = str(raised.value)
        assert outer.id in message and "GPULOCK_LEASE_ID" in message
        assert raised.value.exit_status == 69
        assert outer.active
        assert lease_env()["GPULOCK_LEASE_ID"] == outer.id
    assert gl.no_wait_run("1") == 0


def test_enclosing_gpulock_run_lease_is_unsatisfiable(gl):
    """Python run under `gpulock run` cannot lease the run's own GPU again: it fails at once."""
    script = ("import gpulock\n"
              "try:\n"
              "    gpulock.lease(timeout=%d)\n"  # a deadlock would end in Timeout
              "except gpulock.Unsatisfiable as e:\n"
              "    print('unsatisfiable:', e)\n"
              "    raise SystemExit(3)\n") % SHORT_HANG
    result = gl.cli("run", "--gpus", "2", "--", sys.executable, "-c", script)
    assert result.returncode == 3, result.stdout + result.stderr
    assert "GPULOCK_LEASE_ID" in result.stdout
