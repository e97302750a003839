"""Device numbers handed back by the compat modules are valid in the caller's process, whatever
CUDA_VISIBLE_DEVICES already says and however the modules nest (issue 14): GPUScheduler and
lock_gpu / GPUOwner under a preset CUDA_VISIBLE_DEVICES, nested in each other, with PyTorch
imported before the block and first imported inside it. PyTorch is the stand-in in
tests/python/standin (Debian's CPU-only python3-torch has no CUDA devices to select): it
records set_device calls and counts the devices CUDA_VISIBLE_DEVICES shows at import."""

import os
import sys

import pytest

import gpulock
from gpulock.compat import GPUScheduler, gpu_scheduler, lock_gpu, safe_gpu
from conftest import EX_TEMPFAIL, STANDIN



@pytest.fixture(autouse=True)
def no_bans(monkeypatch):
    monkeypatch.setattr(gpu_scheduler, "BANNED_GPUS", [])
    monkeypatch.setattr(gpu_scheduler, "BANNED_GPU_NAMES", [])


def test_preset_visible_devices_numbers_ids_within_them(gl, torch_path, monkeypatch):
    """CUDA_VISIBLE_DEVICES=2,3 (Slurm, a container): gpu_scheduler leased physical GPU 0 and
    returned [0]; here the candidates are GPUs 2 and 3 and the ids are their CUDA numbers."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    import torch
    assert torch.cuda.device_count() == 2
    gl.hold("--gpus", "2")
    with GPUScheduler() as gpu_ids:
        assert gpu_ids == [1]  # cuda:1 is physical GPU 3
        assert gl.holders()["3"] == os.getpid()
        assert gl.states() == {"0": "free", "1": "free", "2": "leased", "3": "leased"}
        assert torch.cuda.calls == [("set_device", 1)]
        assert torch.cuda.current_device() == 1
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert gl.no_wait_run("3") == 0
    gl.hold("--gpus", "3")
    with pytest.raises(TimeoutError):  # GPUs 0 and 1 are free, but not this process's
        with GPUScheduler(max_wait_time=0.2):
            pass


def test_specific_gpus_and_utilities_use_the_callers_numbers(gl, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    assert [i["gpu_id"] for i in gpu_scheduler.get_gpu_info()] == [0, 1]
    assert [i["uuid"] for i in gpu_scheduler.get_gpu_info()] == [
        gl.gpu_status(3)["uuid"], gl.gpu_status(1)["uuid"]]
    assert gpu_scheduler.get_total_num_gpus() == 2
    with GPUScheduler(specific_gpus=[1]) as gpu_ids:
        assert gpu_ids == [1]
        assert gl.states()["1"] == "leased"
        assert gpu_scheduler.find_free_gpus() == [0]


def test_set_device_when_torch_is_first_imported_inside_the_block(gl, torch_path):
    gl.hold("--gpus", "0")
    with GPUScheduler() as gpu_ids:
        assert gpu_ids == [1]
        assert "torch" not in sys.modules
        import torch
        assert torch.cuda.calls == [("set_device", 1)]
        assert torch.cuda.order_at_import == "PCI_BUS_ID"
    assert not any(type(f).__name__ == "_SetDeviceOnImport" for f in sys.meta_path)
    assert "CUDA_DEVICE_ORDER" not in os.environ


def test_previous_device_made_current_again(gl, torch_path):
    import torch
    torch.cuda.set_device(3)
    with GPUScheduler() as gpu_ids:
        assert gpu_ids == [0]
        assert torch.cuda.current_device() == 0
    assert torch.cuda.current_device() == 3
    assert torch.cuda.calls == [("set_device", 3), ("set_device", 0), ("set_device", 3)]


def test_no_import_inside_the_block_leaves_no_hook(gl, torch_path):
    with GPUScheduler():
        pass
    import torch
    assert torch.cuda.calls == []


def test_environment_restored_after_each_block(gl, monkeypatch):
    before = {k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")}
    with GPUScheduler():
        assert os.environ["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    with lock_gpu(n=2):
        pass
    with lock_gpu(uid=1):
        pass
    assert {k: os.environ.get(k) for k in before} == before
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "FASTEST_FIRST")
    with GPUScheduler():
        assert os.environ["CUDA_DEVICE_ORDER"] == "FASTEST_FIRST"
    assert os.environ["CUDA_DEVICE_ORDER"] == "FASTEST_FIRST"


def test_scheduler_inside_gpu_owner_uses_the_owners_gpus(gl, torch_path):
    """safe_gpu.GPUOwner(2) took GPUs 1 and 2 (GPU 0 is someone else's) and set
    CUDA_VISIBLE_DEVICES=1,2: gpu_scheduler then returned [2], a device that does not exist in
    the process. Here the scheduler gets the owner's GPUs, numbered 0 and 1."""
    gl.hold("--gpus", "0")
    owner = safe_gpu.GPUOwner(2)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "1,2"
    import torch  # after the owner, as safe_gpu asks
    with GPUScheduler() as first:
        assert first == [0]
        assert torch.cuda.calls[-1] == ("set_device", 0)
        with GPUScheduler() as second:
            assert second == [1]
            # Both GPUs are already this process's: no block waits for itself.
            with pytest.raises(RuntimeError) as raised:
                with GPUScheduler():
                    pass
            assert isinstance(raised.value, gpulock.Unavailable)
        with lock_gpu(uid=1) as gpu:  # 0.0.1: cuda:1, free again
            assert gpu == 1
        # Still the owner's, not leased again: the holder is the owner's lease.
        holders = gl.holders()
        assert holders["1"] == holders["2"] == os.getpid()
        assert gl.gpu_status(1)["holder"]["label"] == "safe_gpu"
    owner.release()
    assert gl.no_wait_run("1,2") == 0
    assert "CUDA_VISIBLE_DEVICES" not in os.environ


def test_lock_gpu_021_inside_gpu_owner_is_lent_the_owners_gpu(gl):
    """docs/migration.md: a lock_gpu() inside a GPUOwner gets one of the owner's GPUs. The
    owner's lease is the one GPULOCK_LEASE_ID names, so 0.2.1's lock is lent a GPU of it, like
    under `gpulock run`, instead of raising Unsatisfiable against its own process."""
    gl.hold("--gpus", "0")
    owner = safe_gpu.GPUOwner(2)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "1,2"
    with lock_gpu() as lock:
        assert lock.uid == 1 and os.environ["CUDA_VISIBLE_DEVICES"] == "1"
        with lock_gpu() as inner:  # 0.2.1 inside 0.2.1: the owner's other GPU
            assert inner.uid == 2 and os.environ["CUDA_VISIBLE_DEVICES"] == "1,2"
            with pytest.raises(RuntimeError):
                lock_gpu()
        holders = gl.holders()
        assert holders["1"] == holders["2"] == os.getpid()
        assert gl.gpu_status(1)["holder"]["label"] == "safe_gpu"
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "1,2"
    owner.release()
    assert "CUDA_VISIBLE_DEVICES" not in os.environ
    assert gl.no_wait_run("1,2") == 0


def test_scheduler_inside_lock_gpu_021(gl, torch_path):
    with lock_gpu(n=2) as lock:
        assert lock.uid == [0, 1] and os.environ["CUDA_VISIBLE_DEVICES"] == "0,1"
        with GPUScheduler(num_gpus=2) as gpu_ids:
            assert gpu_ids == [0, 1]
            import torch
            assert torch.cuda.calls == [("set_device", 0)]
            assert torch.cuda.visible_at_import == "0,1"
        assert gl.states() == {"0": "leased", "1": "leased", "2": "free", "3": "free"}
    assert gl.no_wait_run("0,1") == 0


def test_lock_gpu_inside_scheduler_under_preset_devices(gl, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,2")
    with GPUScheduler() as gpu_ids:
        assert gpu_ids == [1]  # physical 2 (gpulock prefers the lowest index)
        with lock_gpu() as lock:  # 0.2.1: the other visible GPU, exported for the block
            assert lock.uid == 3
            assert os.environ["CUDA_VISIBLE_DEVICES"] == "3"
            assert gl.states() == {"0": "free", "1": "free", "2": "leased", "3": "leased"}
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "3,2"
        with pytest.raises(RuntimeError):
            with lock_gpu(uid=1):  # cuda:1 is the scheduler's GPU 2, not lent
                pass
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "3,2"
    assert gl.no_wait_run("2,3") == 0


def test_gpu_owner_inside_scheduler(gl, monkeypatch):
    with GPUScheduler() as gpu_ids:
        assert gpu_ids == [0]
        owner = safe_gpu.GPUOwner(1)
        assert owner.devices_taken == [1] and os.environ["CUDA_VISIBLE_DEVICES"] == "1"
        owner.release_gpus()
        assert "CUDA_VISIBLE_DEVICES" not in os.environ
    assert gl.no_wait_run("0,1") == 0


SCHEDULED_CHILD = r'''
from gpulock.compat import GPUScheduler
with GPUScheduler(max_wait_time=600) as gpu_ids:
    import torch  # first imported inside the block
    report("scheduled", {"ids": gpu_ids, "calls": torch.cuda.calls,
                         "count": torch.cuda.device_count()})
    wait_for("finish")
report("after", {"order": os.environ.get("CUDA_DEVICE_ORDER"),
                 "cvd": os.environ.get("CUDA_VISIBLE_DEVICES")})
'''


def test_real_process_with_preset_devices_and_late_torch(gl):
    """A job started with CUDA_VISIBLE_DEVICES=1,3 while GPU 1 is held: it gets cuda:1
    (physical 3), PyTorch imported in the block defaults to it, the CLI cannot take GPU 3
    while the job holds it, and the job's environment is as before afterwards."""
    gl.hold("--gpus", "1")
    env = gl.env(CUDA_VISIBLE_DEVICES="1,3",
                 PYTHONPATH=STANDIN + os.pathsep + os.environ["PYTHONPATH"])
    child = gl.python(SCHEDULED_CHILD, env=env)
    got = child.wait_json("scheduled")
    assert got == {"ids": [1], "calls": [["set_device", 1]], "count": 2}
    assert gl.holders()["3"] == child.pid
    assert gl.no_wait_run("3") == EX_TEMPFAIL
    child.tell("finish")
    assert child.wait_json("after") == {"order": None, "cvd": "1,3"}
    assert child.wait() == 0, child.describe()
    assert gl.no_wait_run("3") == 0


UNDER_RUN_CHILD = r'''
from gpulock.compat import GPUScheduler, lock_gpu
result = {"cvd": os.environ["CUDA_VISIBLE_DEVICES"]}
with GPUScheduler() as first:
    with GPUScheduler() as second:
        result["ids"] = [first, second]
        try:
            with GPUScheduler():
                result["third"] = "entered"
        except RuntimeError as e:
            result["third"] = type(e).__name__
    with lock_gpu(uid=1) as gpu:  # cuda:1, the job's GPU 2
        result["uid1"] = int(gpu)
    with lock_gpu() as lock:  # 0.2.1: the job's GPU that `first` does not use, exported
        result["lock"] = [lock.uid, os.environ["CUDA_VISIBLE_DEVICES"]]
result["cvd_after"] = os.environ["CUDA_VISIBLE_DEVICES"]
report("done", result)
wait_for("finish")
'''


def test_blocks_inside_gpulock_run_use_the_jobs_gpus(gl):
    """A program started by `gpulock run -n 2` (CUDA_VISIBLE_DEVICES=1,2 while GPU 0 is held)
    that uses GPUScheduler or lock_gpu gets the job's own GPUs, numbered as CUDA numbers them
    there, without waiting for its own lease."""
    gl.hold("--gpus", "0")
    child = gl.python(UNDER_RUN_CHILD, prefix=[gl.binary, "run", "-n", "2", "--"])
    assert child.wait_json("done") == {
        "cvd": "1,2", "ids": [[0], [1]], "third": "Unavailable", "uid1": 1,
        "lock": [2, "2"], "cvd_after": "1,2"}
    holders = gl.holders()
    assert holders["1"] == holders["2"] == child.pid  # the run's lease only
    assert gl.no_wait_run("3") == 0
    child.tell("finish")
    assert child.wait() == 0, child.describe()
