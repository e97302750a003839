"""gpulock.lease(mem=...): a shared lease from Python. Whether memory is held is checked
independently, with `gpulock run --mem ... --no-wait` (a real process)."""

import os
import sys

import pytest

import gpulock
from conftest import EX_TEMPFAIL

GIB = 1 << 30


def run_mem(gl, size):
    return gl.cli("run", "--gpus", "0", "--mem", size, "--no-wait", "--", "true").returncode


def test_shared_lease_holds_its_memory_and_sets_the_environment(gl):
    with gpulock.lease(mem="50G", gpus="0") as lease:
        assert lease.memory_bytes == 50 * GIB
        assert os.environ["GPULOCK_MEMORY_LIMIT_BYTES"] == str(50 * GIB)
        assert os.environ["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.625"
        assert os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
        assert os.environ["TF_FORCE_GPU_ALLOW_GROWTH"] == "true"
        assert run_mem(gl, "31G") == EX_TEMPFAIL  # 30 GiB are left
        assert run_mem(gl, "30G") == 0
        # The whole GPU is not free.
        assert gl.no_wait_run("0") == EX_TEMPFAIL
    assert "GPULOCK_MEMORY_LIMIT_BYTES" not in os.environ
    assert run_mem(gl, "80G") == 0


def test_exclusive_lease_has_no_memory_limit(gl):
    with gpulock.lease() as lease:
        assert lease.memory_bytes == 0
        assert "GPULOCK_MEMORY_LIMIT_BYTES" not in os.environ


def test_torch_gets_the_memory_fraction_when_imported(gl, torch_path):
    import torch
    with gpulock.lease(mem="20G"):
        pass
    assert ("set_per_process_memory_fraction", 0.25, 0) in torch.cuda.calls


def test_torch_is_not_imported_by_a_shared_lease(gl, torch_path):
    with gpulock.lease(mem="20G"):
        assert "torch" not in sys.modules


@pytest.mark.parametrize("bad", [{"mem": "lots"}, {"mem": 0}, {"slots": 0}, {"slots": True}])
def test_bad_shared_requests(gl, bad):
    with pytest.raises(gpulock.InvalidRequest):
        gpulock.lease(**bad)
