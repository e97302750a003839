"""gpulock.compat.gpu_scheduler against what gpu_scheduler's document describes (seed 004):
`with GPUScheduler(num_gpus=2, memory_free_threshold_gb=10) as gpu_ids:` yields a list of GPU
indices and leaves CUDA_VISIBLE_DEVICES alone; memory, power and utilisation thresholds select
healthy GPUs, debug_mode bypasses them, specific_gpus limits the choice, max_wait_time bounds
the wait; torch.cuda.set_device is called with the first GPU when PyTorch is loaded; and the
utility functions (get_gpu_info in MiB, find_free_gpus, ...) report the machine, excluding
GPUs that someone leases."""

import os
import sys
import types

import pytest

import gpulock
from gpulock.compat import GPUScheduler, gpu_scheduler
from gpulock.compat.gpu_scheduler import (find_free_gpus, get_gpu_info, get_gpu_memory_usage,
                                          get_gpu_names, get_gpu_power_usage,
                                          get_gpu_utilization, get_total_num_gpus)
from conftest import EX_TEMPFAIL, HANG

# GPU 0: only 5 GiB free; GPU 1: drawing 150 W; GPU 2: 40 % busy; GPU 3: healthy, 40 GiB.
MIXED = [
    {"name": "Sim A", "memory_total": "80G", "memory_used": "75G"},
    {"name": "Sim A", "power_draw": 150},
    {"name": "Sim B", "utilization": 40},
    {"name": "Sim B", "memory_total": "40G", "memory_used": "1G", "power_draw": 71.5,
     "power_limit": 400},
]


@pytest.fixture
def mixed(gl):
    gl.use_fake_gpus(MIXED)
    return gl


@pytest.fixture(autouse=True)
def no_bans(monkeypatch):
    monkeypatch.setattr(gpu_scheduler, "BANNED_GPUS", [])
    monkeypatch.setattr(gpu_scheduler, "BANNED_GPU_NAMES", [])


def test_context_manager_yields_indices_and_leaves_cuda_visible_devices(gl, monkeypatch):
    with GPUScheduler(num_gpus=2, memory_free_threshold_gb=10) as gpu_ids:
        assert gpu_ids == [0, 1]
        assert all(type(i) is int for i in gpu_ids)
        assert "CUDA_VISIBLE_DEVICES" not in os.environ
        assert os.environ["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
        doc = gl.status()
        assert [g["state"] for g in doc["gpus"]] == ["leased", "leased", "free", "free"]
        assert doc["gpus"][0]["holder"]["label"] == "gpu_scheduler"
        assert gl.no_wait_run("0") == EX_TEMPFAIL
    assert gl.no_wait_run("0,1") == 0
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    with GPUScheduler() as gpu_ids:
        assert gpu_ids == [0]  # cuda:0 here, which is GPU 3: test_compat_nesting.py
        assert gl.states()["3"] == "leased"
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "3"


def test_default_thresholds_accept_idle_simulated_gpus(gl):
    """Defaults: 20 GB free, at most 80 W and 1 % busy; idle simulated GPUs (80 GiB, 60 W,
    0 %) pass."""
    scheduler = GPUScheduler()
    with scheduler as gpu_ids:
        assert gpu_ids == [0]
        assert scheduler.gpu_ids == [0]


@pytest.mark.parametrize("kwargs, expected", [
    ({"memory_free_threshold_gb": 20, "power_threshold_w": 100,
      "utilization_threshold_percent": 1}, [3]),
    ({"memory_free_threshold_gb": 20, "power_threshold_w": None,
      "utilization_threshold_percent": 1}, [1]),  # no power limit
    ({"memory_free_threshold_gb": 4, "power_threshold_w": 100,
      "utilization_threshold_percent": 1}, [0]),
    ({"memory_free_threshold_gb": 20, "power_threshold_w": 100,
      "utilization_threshold_percent": 50}, [2]),
    ({"memory_free_threshold_gb": 50, "power_threshold_w": 200,
      "utilization_threshold_percent": 50}, [1]),  # GPU 3 has only 39 GiB free
])
def test_thresholds_select_healthy_gpus(mixed, kwargs, expected):
    with GPUScheduler(**kwargs) as gpu_ids:
        assert gpu_ids == expected


def test_debug_mode_bypasses_health_checks(mixed):
    with GPUScheduler(num_gpus=3, debug_mode=True) as gpu_ids:
        assert gpu_ids == [0, 1, 2]
    with GPUScheduler(specific_gpus=[2], debug_mode=True, memory_free_threshold_gb=1000) as ids:
        assert ids == [2]


def test_debug_mode_accepts_gpu_with_foreign_process(gl):
    sleeper = gl.spawn_argv(["sleep", "1000"])
    gl.use_fake_gpus([{"processes": [{"pid": sleeper.pid}]}])
    with pytest.raises(TimeoutError):
        with GPUScheduler(max_wait_time=0.2):
            pass
    with GPUScheduler(debug_mode=True) as gpu_ids:
        assert gpu_ids == [0]


def test_specific_gpus(gl):
    with GPUScheduler(specific_gpus=[2, 3], num_gpus=2) as gpu_ids:
        assert sorted(gpu_ids) == [2, 3]
    with GPUScheduler(specific_gpus=[1]) as gpu_ids:
        assert gpu_ids == [1]
    with pytest.raises(gpulock.Error):
        with GPUScheduler(specific_gpus=[7]):
            pass


def test_banned_gpus(gl, monkeypatch):
    monkeypatch.setattr(gpu_scheduler, "BANNED_GPUS", [0, 1])
    with GPUScheduler() as gpu_ids:
        assert gpu_ids == [2]
    assert find_free_gpus() == [2, 3]


def test_banned_gpu_names(mixed, monkeypatch):
    monkeypatch.setattr(gpu_scheduler, "BANNED_GPU_NAMES", ["Sim A"])
    with GPUScheduler(num_gpus=2, debug_mode=True) as gpu_ids:
        assert gpu_ids == [2, 3]


def test_max_wait_time_raises_timeout_error(gl):
    gl.hold("-n", "4")
    with pytest.raises(TimeoutError) as raised:
        with GPUScheduler(max_wait_time=0.3):
            pytest.fail("entered with every GPU held")
    assert isinstance(raised.value, gpulock.Timeout)
    assert gl.queue()["waiting"] == []


def test_unhealthy_within_max_wait_time_raises_timeout_error(mixed):
    with pytest.raises(TimeoutError):
        with GPUScheduler(specific_gpus=[0], max_wait_time=0.3):
            pass


def test_waits_for_a_gpu_to_be_free(gl):
    """The seed waits (polls) until a GPU is free; here it waits in gpulock's queue."""
    os.environ["GPULOCK_FAKE_GPUS"] = "1"
    holder, _, _ = gl.hold("--gpus", "0")
    child = gl.python(r'''
        from gpulock.compat import GPUScheduler
        with GPUScheduler(max_wait_time=600) as gpu_ids:
            report("scheduled", gpu_ids)
    ''')
    gl.wait_queued(child)
    assert not child.reported("scheduled")
    holder.kill_group()
    assert child.wait_json("scheduled") == [0]
    assert child.wait() == 0, child.describe()


def test_released_on_exception(gl):
    with pytest.raises(ZeroDivisionError):
        with GPUScheduler(num_gpus=4):
            1 / 0
    assert gl.no_wait_run("0,1,2,3") == 0


def test_sets_torch_default_device_when_pytorch_is_loaded(gl, monkeypatch):
    calls = []
    cuda = types.SimpleNamespace(is_available=lambda: True, is_initialized=lambda: False,
                                 set_device=calls.append)
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda))
    gl.hold("--gpus", "0")
    with GPUScheduler(num_gpus=2) as gpu_ids:
        assert gpu_ids == [1, 2]
        assert calls == [1]


# -- utility functions ----------------------------------------------------------------------

MIB_PER_GIB = 1024


def test_get_gpu_info(mixed):
    info = get_gpu_info()
    assert [i["gpu_id"] for i in info] == [0, 1, 2, 3]
    for entry in info:
        assert {"gpu_id", "name", "memory_free", "memory_used", "memory_total", "power_draw",
                "power_limit", "utilization"} <= set(entry)
    assert info[0]["name"] == "Sim A"
    assert (info[0]["memory_total"], info[0]["memory_used"], info[0]["memory_free"]) == (
        80 * MIB_PER_GIB, 75 * MIB_PER_GIB, 5 * MIB_PER_GIB)
    assert (info[3]["memory_total"], info[3]["memory_used"], info[3]["memory_free"]) == (
        40 * MIB_PER_GIB, 1 * MIB_PER_GIB, 39 * MIB_PER_GIB)
    assert info[1]["power_draw"] == 150
    assert (info[3]["power_draw"], info[3]["power_limit"]) == (71.5, 400)
    assert [i["utilization"] for i in info] == [0, 0, 40, 0]


def test_other_utilities(mixed):
    assert get_total_num_gpus() == 4
    assert get_gpu_names() == ["Sim A", "Sim A", "Sim B", "Sim B"]
    assert get_gpu_power_usage() == [60, 150, 60, 71.5]
    assert get_gpu_utilization() == [0, 0, 40, 0]
    usage = get_gpu_memory_usage()
    assert usage[3] == {"gpu_id": 3, "memory_used": 1024, "memory_free": 39 * 1024,
                        "memory_total": 40 * 1024}


def test_find_free_gpus_applies_thresholds(mixed):
    assert find_free_gpus(memory_free_threshold_gb=20, power_threshold_w=100,
                          utilization_threshold_percent=1) == [3]
    assert find_free_gpus(memory_free_threshold_gb=1, power_threshold_w=200,
                          utilization_threshold_percent=50) == [0, 1, 2, 3]
    assert find_free_gpus(debug_mode=True) == [0, 1, 2, 3]
    assert find_free_gpus(specific_gpus=[0, 3], debug_mode=True) == [0, 3]


def test_find_free_gpus_excludes_leased_gpus(gl):
    assert find_free_gpus() == [0, 1, 2, 3]
    gl.hold("--gpus", "1")
    with gpulock.lease(gpus=3, set_env=False):
        assert find_free_gpus() == [0, 2]
        assert find_free_gpus(debug_mode=True) == [0, 2]
        with GPUScheduler() as gpu_ids:
            assert gpu_ids == [0]
            assert find_free_gpus() == [2]
    assert find_free_gpus() == [0, 2, 3]


def test_find_free_gpus_excludes_gpus_reserved_for_a_waiter(gl):
    gl.hold("--gpus", "0,1,2")
    waiter = gl.spawn_cli("run", "-n", "2", "--", "true")
    gl.wait_queued(waiter, timeout=HANG)
    assert find_free_gpus(debug_mode=True) == []  # GPU 3 is held back for the waiter
