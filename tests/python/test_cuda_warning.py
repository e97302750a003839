"""The warning when CUDA is already initialised in the process that takes a lease (so
CUDA_VISIBLE_DEVICES can no longer take effect there): detected through the CUDA driver
without loading or initialising it (a stand-in libcuda.so.1 built from fake_cuda.c, in a child
process), or through PyTorch's torch.cuda.is_initialized() (a stand-in torch module). Leases
that do not set the environment do not warn."""

import os
import sys
import types
import warnings

import pytest

import gpulock

DRIVER_SCENARIO = r'''
import ctypes, warnings
from gpulock.compat import GPUScheduler, lock_gpu, safe_gpu

def maps_have_libcuda():
    with open("/proc/self/maps") as f:
        return "libcuda" in f.read()

def warnings_of(take):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        held = take()
    release = getattr(held, "release", None)
    if release:
        release()
    return [{"category": w.category.__name__, "message": str(w.message),
             "filename": w.filename} for w in caught]

def lease(**kwargs):
    return warnings_of(lambda: gpulock.lease(**kwargs))

def count_status(lib):
    count = ctypes.c_int(-1)
    return lib.cuDeviceGetCount(ctypes.byref(count))

result = {"script": __file__}
# No driver loaded: nothing to detect, and checking does not load it.
result["absent"] = gpulock.cuda_initialized()
result["absent_lease"] = lease()
result["absent_loaded"] = maps_have_libcuda()

lib = ctypes.CDLL(sys.argv[2])
result["loaded"] = gpulock.cuda_initialized()
result["loaded_lease"] = lease()
# gpulock looked, but did not initialise the driver itself.
result["count_before_init"] = count_status(lib)

result["init"] = lib.cuInit(0)
result["count_after_init"] = count_status(lib)
result["initialized"] = gpulock.cuda_initialized()
result["initialized_lease"] = lease(gpus=2)
result["initialized_uuid_lease"] = lease(visible="uuid")
result["no_env_lease"] = lease(set_env=False)
result["safe_gpu"] = warnings_of(lambda: safe_gpu.GPUOwner(1))
def with_lock_gpu():
    with lock_gpu():
        pass
result["lock_gpu"] = warnings_of(with_lock_gpu)
def with_scheduler():
    with GPUScheduler():
        pass
result["gpu_scheduler"] = warnings_of(with_scheduler)
report("result", result)
'''


def run_driver_scenario(gl, fake_cuda):
    child = gl.python(DRIVER_SCENARIO, fake_cuda)
    result = child.wait_json("result")
    assert child.wait() == 0, child.describe()
    return result


def categories(caught):
    return [w["category"] for w in caught]


def test_driver_not_loaded_or_not_initialised_does_not_warn(gl, fake_cuda):
    result = run_driver_scenario(gl, fake_cuda)
    assert result["absent"] is False
    assert result["absent_lease"] == []
    assert result["absent_loaded"] is False
    assert result["loaded"] is False
    assert result["loaded_lease"] == []
    assert result["count_before_init"] == 3  # CUDA_ERROR_NOT_INITIALIZED: gpulock did not cuInit


def test_initialised_driver_warns(gl, fake_cuda):
    result = run_driver_scenario(gl, fake_cuda)
    assert (result["init"], result["count_after_init"]) == (0, 0)  # the stand-in works
    assert result["initialized"] is True
    (warning,) = result["initialized_lease"]
    assert warning["category"] == "CudaAlreadyInitializedWarning"
    message = warning["message"]
    assert "CUDA_VISIBLE_DEVICES=2" in message
    assert "before" in message  # says what to do: take the lease before CUDA starts
    # Attributed to the caller's line, not to gpulock's own files.
    assert warning["filename"] == result["script"]
    assert categories(result["initialized_uuid_lease"]) == ["CudaAlreadyInitializedWarning"]


def test_initialised_driver_no_warning_without_env(gl, fake_cuda):
    result = run_driver_scenario(gl, fake_cuda)
    assert result["no_env_lease"] == []
    # The compat APIs that leave CUDA_VISIBLE_DEVICES alone do not warn; safe_gpu sets it.
    assert result["lock_gpu"] == []
    assert result["gpu_scheduler"] == []
    assert categories(result["safe_gpu"]) == ["CudaAlreadyInitializedWarning"]


def fake_torch(is_initialized):
    cuda = types.SimpleNamespace(is_initialized=is_initialized, is_available=lambda: False)
    return types.SimpleNamespace(cuda=cuda)


def test_torch_cuda_initialised_warns(gl, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", fake_torch(lambda: True))
    assert gpulock.cuda_initialized() is True
    with pytest.warns(gpulock.CudaAlreadyInitializedWarning, match="CUDA_VISIBLE_DEVICES=0"):
        lease = gpulock.lease()
    assert lease.active
    lease.release()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with gpulock.lease(set_env=False):
            pass


def test_torch_cuda_not_initialised_does_not_warn(gl, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", fake_torch(lambda: False))
    assert gpulock.cuda_initialized() is False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with gpulock.lease() as lease:
            assert lease.active


def test_unusual_torch_does_not_break_lease(gl, monkeypatch):
    def broken():
        raise RuntimeError("no CUDA in this build")
    monkeypatch.setitem(sys.modules, "torch", fake_torch(broken))
    assert gpulock.cuda_initialized() is False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with gpulock.lease() as lease:
            assert lease.active
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace())  # no torch.cuda at all
    with gpulock.lease() as lease:
        assert lease.active


def test_warning_made_an_error_leaves_no_lease_behind(gl, monkeypatch):
    """With warnings as errors (python -W error), lease() raises the warning: then it must not
    hold the GPU, even while the exception is still referenced (as in an `except ... as e:`
    block that logs it, or a traceback kept for a report)."""
    monkeypatch.setitem(sys.modules, "torch", fake_torch(lambda: True))
    with warnings.catch_warnings():
        warnings.simplefilter("error", gpulock.CudaAlreadyInitializedWarning)
        with pytest.raises(gpulock.CudaAlreadyInitializedWarning) as raised:
            gpulock.lease(gpus=1)
    assert "CUDA_VISIBLE_DEVICES" not in os.environ
    assert raised.value.__traceback__ is not None
    assert gl.no_wait_run("1") == 0, "GPU 1 is still leased by the failed lease() call"
