"""Health filters of gpulock.lease() on simulated GPUs described in a file
(docs/simulated-gpus.md): min_free_mem, max_util and max_power choose the GPUs that qualify,
a request waits while only health blocks it and is served when the readings change, and GPUs
running processes of people not using gpulock are skipped unless allow_foreign."""

import os

import pytest

import gpulock
from conftest import GIB, HANG

# Each of GPUs 0-2 fails exactly one filter; GPU 3 passes all.
UNHEALTHY = [
    {"memory_used": "75G"},   # 5 GiB free of 80
    {"power_draw": 300},      # watts
    {"utilization": 50},      # percent
    {},
]


@pytest.fixture
def unhealthy(gl):
    gl.use_fake_gpus(UNHEALTHY)
    return gl


@pytest.mark.parametrize("kwargs, indices", [
    ({"count": 3, "min_free_mem": "20G"}, [1, 2, 3]),
    ({"count": 3, "min_free_mem": 20 * GIB}, [1, 2, 3]),
    ({"count": 3, "min_free_mem": "5G"}, [0, 1, 2]),  # exactly 5 GiB free is enough
    ({"count": 3, "max_power": 100}, [0, 2, 3]),
    ({"count": 3, "max_power": 100.5}, [0, 2, 3]),
    ({"count": 3, "max_util": 10}, [0, 1, 3]),
    ({"count": 3, "max_util": 50}, [0, 1, 2]),
    ({"min_free_mem": "20G", "max_util": 10, "max_power": 100}, [3]),
    ({"count": 4}, [0, 1, 2, 3]),  # no filter: health does not matter
])
def test_filters_choose_the_gpus_that_qualify(unhealthy, kwargs, indices):
    with gpulock.lease(wait=False, **kwargs) as lease:
        assert lease.indices == indices


def test_too_few_healthy_gpus_now_is_unavailable(unhealthy):
    with pytest.raises(gpulock.Unavailable) as raised:
        gpulock.lease(count=2, min_free_mem="20G", max_util=10, max_power=100, wait=False)
    message = str(raised.value)
    assert "GPU 0" in message and "GPU 1" in message and "GPU 2" in message
    with pytest.raises(gpulock.Timeout):
        gpulock.lease(gpus=2, max_util=10, timeout=0.3)


def test_named_gpu_must_pass_filters(unhealthy):
    with pytest.raises(gpulock.Unavailable):
        gpulock.lease(gpus=0, min_free_mem="20G", wait=False)
    with gpulock.lease(gpus=0, min_free_mem="4G", wait=False) as lease:
        assert lease.indices == [0]


def test_waits_until_readings_qualify(unhealthy):
    """Only health blocks the request: it is served once GPU 2's utilisation drops."""
    rewritten = []

    def on_wait(progress):
        if not rewritten:
            gpus = [dict(g) for g in UNHEALTHY]
            gpus[2] = {"utilization": 3}
            unhealthy.use_fake_gpus(gpus)
            rewritten.append(progress)

    with gpulock.lease(gpus=2, max_util=10, timeout=HANG, on_wait=on_wait) as lease:
        assert lease.indices == [2]
    assert rewritten and "50%" in rewritten[0]["blocked_by"]


def test_foreign_process_makes_gpu_busy_unless_allow_foreign(gl):
    sleeper = gl.spawn_argv(["sleep", "1000"])
    gl.use_fake_gpus([{"processes": [{"pid": sleeper.pid, "used_memory": "1G"}]}, {}])
    status = gpulock.status()
    assert [g.state for g in status.gpus] == ["busy", "free"]
    assert status.gpus[0].processes[0].pid == sleeper.pid
    assert status.gpus[0].processes[0].foreign is True
    with gpulock.lease(wait=False) as lease:
        assert lease.indices == [1]  # GPU 0 runs someone else's process
    with pytest.raises(gpulock.Unavailable):
        gpulock.lease(gpus=0, wait=False)
    with gpulock.lease(gpus=0, wait=False, allow_foreign=True) as lease:
        assert lease.indices == [0]


def test_own_process_on_leased_gpu_is_not_foreign(gl):
    """This process, holding the lease, runs on the GPU: not a foreign process."""
    gl.use_fake_gpus([{"processes": [{"pid": os.getpid()}]}])
    with gpulock.lease(gpus=0, allow_foreign=True) as lease:
        gpu = gpulock.status().gpus[0]
        assert gpu.state == "leased" and gpu.lease_id == lease.id
        assert gpu.processes[0].foreign is False
