"""The machine as Python objects: gpulock.gpus(), gpulock.status() (states, holders, the
queue's length and policy, reservations, .free) and gpulock.queue() agree with the CLI's JSON;
gpulock.release() ends a detached lease taken with `gpulock acquire --for-pid` and refuses
unknown, malformed and non-detached leases with the right exceptions."""

import getpass
import json
import os
import re
import time

import pytest

import gpulock
from conftest import EX_TEMPFAIL, EX_UNAVAILABLE, EX_USAGE, GIB, sim_uuid, wait_until


def test_gpus(gl):
    gpus = gpulock.gpus()
    assert [g.index for g in gpus] == [0, 1, 2, 3]
    assert all(isinstance(g, gpulock.Gpu) for g in gpus)
    assert [g.uuid for g in gpus] == [sim_uuid(i) for i in range(4)]
    assert [g.display_index for g in gpus] == ["0", "1", "2", "3"]
    g = gpus[0]
    assert g.name == "Simulated GPU"
    assert g.memory_total_bytes == 80 * GIB and g.memory_free_bytes == 80 * GIB
    assert g.memory_used_bytes == 0
    assert g.utilization_percent == 0
    assert g.power_draw_watts == 60 and g.power_limit_watts == 700
    assert g.compute_mode == "default"
    assert g.mig_index is None and g.processes == []
    # The CLI sees the same devices.
    cli = gl.cli("gpus", "--json")
    assert cli.returncode == 0
    doc = json.loads(cli.stdout)
    assert [(d["uuid"], d["pci_bus_id"]) for d in doc["gpus"]] == [(g.uuid, g.pci_bus_id)
                                                                    for g in gpus]


def test_gpus_readings_from_file(gl):
    gl.use_fake_gpus([{"name": "Sim A100", "memory_total": "40G", "memory_used": "1G",
                       "utilization": 37, "power_draw": 71.5, "power_limit": 400}])
    (g,) = gpulock.gpus()
    assert (g.name, g.memory_total_bytes, g.memory_used_bytes, g.memory_free_bytes) == (
        "Sim A100", 40 * GIB, 1 * GIB, 39 * GIB)
    assert (g.utilization_percent, g.power_draw_watts, g.power_limit_watts) == (37, 71.5, 400)


def test_status_of_idle_machine(gl):
    status = gpulock.status()
    assert isinstance(status, gpulock.Status)
    assert status.simulated is True
    assert status.lock_dir == os.environ["GPULOCK_DIR"]
    assert status.host == os.uname().nodename
    assert [g.state for g in status.gpus] == ["free"] * 4
    assert all(g.holder is None and g.lease_id is None for g in status.gpus)
    assert [g.index for g in status.free] == [0, 1, 2, 3]
    assert status.queue_length == 0
    assert status.queue_policy == "fair-share"
    assert status.schema_version == 1


def test_status_holders(gl):
    holder, lease_id, _ = gl.hold("--gpus", "1", label="cli-job")
    with gpulock.lease(gpus=3, label="py-job", set_env=False) as lease:
        status = gpulock.status()
        states = [g.state for g in status.gpus]
        assert states == ["free", "leased", "free", "leased"]
        assert [g.index for g in status.free] == [0, 2]
        cli_gpu, py_gpu = status.gpus[1], status.gpus[3]
        assert isinstance(cli_gpu, gpulock.GpuStatus)
        assert isinstance(cli_gpu.holder, gpulock.Holder)
        assert cli_gpu.lease_id == lease_id == cli_gpu.holder.lease_id
        assert cli_gpu.holder.kind == "run"
        assert cli_gpu.holder.pid == holder.pid
        assert cli_gpu.holder.label == "cli-job"
        assert cli_gpu.holder.gpus == [sim_uuid(1)]
        assert py_gpu.lease_id == lease.id
        assert py_gpu.holder.kind == "process"
        assert py_gpu.holder.pid == os.getpid()
        assert py_gpu.holder.pid_alive is True
        assert py_gpu.holder.label == "py-job"
        assert py_gpu.holder.uid == os.getuid()
        assert py_gpu.holder.held_seconds >= 0
        # The CLI's view agrees.
        doc = gl.status()
        assert [g["state"] for g in doc["gpus"]] == states
        assert doc["gpus"][3]["holder"]["pid"] == os.getpid()


def test_status_and_queue_with_a_waiter(gl):
    gl.hold("--gpus", "0,1,2")
    waiter = gl.spawn_cli("run", "-n", "2", "--label", "big", "--", "true")
    gl.wait_queued(waiter)
    status = gpulock.status()
    assert status.queue_length == 1
    gpu3 = status.gpus[3]
    assert gpu3.state == "free"
    assert gpu3.reserved_for is not None and gpu3.reserved_for.pid == waiter.pid
    assert status.free == []  # GPU 3 is held back for the waiting request

    queue = gpulock.queue()
    assert isinstance(queue, gpulock.Queue)
    assert queue.policy == "fair-share" and queue.config is None
    (entry,) = queue.waiting
    assert isinstance(entry, gpulock.QueueEntry)
    assert entry.position == 1
    assert entry.pid == waiter.pid
    assert entry.gpus_requested == 2 and entry.gpus_named == []
    assert entry.label == "big"
    assert entry.uid == os.getuid()
    assert re.fullmatch(r"[0-9a-f]{16}", entry.ticket_id)
    assert entry.reserved_gpus == [sim_uuid(3)]
    assert entry.blocked_by
    cli = gl.queue()["waiting"][0]
    assert (cli["ticket_id"], cli["pid"]) == (entry.ticket_id, entry.pid)


def test_queue_policy_from_config(gl, monkeypatch):
    config = gl.write("config.toml", 'policy = "fifo"\n')
    monkeypatch.setenv("GPULOCK_CONFIG", str(config))
    queue = gpulock.queue()
    assert queue.policy == "fifo" and queue.config == str(config)
    assert gpulock.status().queue_policy == "fifo"


def test_views_of_another_lock_dir(gl, tmp_path):
    other = tmp_path / "other"
    with gpulock.lease(gpus=2, lock_dir=str(other), set_env=False):
        assert gpulock.status(lock_dir=str(other)).gpus[2].state == "leased"
        assert gpulock.status(lock_dir=str(other)).lock_dir == str(other)
        assert gpulock.status().gpus[2].state == "free"


# -- release -----------------------------------------------------------------------------

def acquire_detached(gl, gpus):
    sleeper = gl.spawn_argv(["sleep", "1000"])
    result = gl.cli("acquire", "--gpus", gpus, "--for-pid", sleeper.pid)
    assert result.returncode == 0, result.stderr
    exports = dict(re.findall(r"^export (\w+)='([^']*)'$", result.stdout, re.M))
    return exports["GPULOCK_LEASE_ID"], sleeper


def test_release_of_detached_lease(gl):
    lease_id, sleeper = acquire_detached(gl, "2")
    gpu = gpulock.status().gpus[2]
    assert gpu.state == "leased" and gpu.holder.kind == "detached"
    assert gl.no_wait_run("2") == EX_TEMPFAIL
    assert gpulock.release(lease_id) is None
    assert gl.no_wait_run("2") == 0
    assert gpulock.status().gpus[2].state == "free"
    assert sleeper.alive()  # the process it was for is not touched
    with pytest.raises(gpulock.NotFound):
        gpulock.release(lease_id)  # not twice


def test_release_unknown_lease_is_not_found(gl):
    with pytest.raises(gpulock.NotFound) as raised:
        gpulock.release("0123456789abcdef")
    error = raised.value
    assert isinstance(error, LookupError)
    assert (error.code, error.exit_status) == ("not_found", EX_UNAVAILABLE)
    assert "0123456789abcdef" in str(error)


def test_release_malformed_lease_id_is_invalid_request(gl):
    with pytest.raises(gpulock.InvalidRequest) as raised:
        gpulock.release("not-a-lease")
    assert raised.value.exit_status == EX_USAGE


def test_release_refuses_leases_of_running_processes(gl):
    holder, lease_id, _ = gl.hold("--gpus", "0")
    with pytest.raises(gpulock.Unsatisfiable) as raised:
        gpulock.release(lease_id)
    assert str(holder.pid) in str(raised.value)
    assert holder.alive() and gl.gpu_status(0)["lease_id"] == lease_id
    with gpulock.lease(gpus=1, set_env=False) as lease:
        with pytest.raises(gpulock.Unsatisfiable) as raised:
            gpulock.release(lease.id)
        assert str(os.getpid()) in str(raised.value)
        assert lease.active
        assert gl.no_wait_run("1") == EX_TEMPFAIL


def test_status_shows_idle_gpus_and_intruders(gl, monkeypatch):
    """The idle and intruder fields of `gpulock status --json` (issue 16) reach Python: on
    simulated GPUs whose file says since when GPU 0 has been at 0 % and which processes run on
    it, one of them outside the lease."""
    me = getpass.getuser()
    monkeypatch.setenv("GPULOCK_CONFIG", str(gl.write("config.toml", 'idle_after = "1s"\n')))
    gl.use_fake_gpus([{}, {}])
    holder, lease_id, (uuid,) = gl.hold("--gpus", "0")
    intruder = gl.spawn_argv(["sleep", "1000"])
    long_ago = time.time() - 3600  # idle from before the lease: counted from its start
    gl.use_fake_gpus([
        {"utilization": 0, "idle_since": long_ago,
         "processes": [{"pid": holder.pid, "used_memory": "2G"},
                       {"pid": intruder.pid, "used_memory": "1G"}]},
        {"utilization": 0, "idle_since": long_ago},  # at 0 %, but nobody leases it
    ])

    wait_until(lambda: gpulock.status().gpus[0].idle, what="GPU 0 to be reported idle")
    status = gpulock.status()
    leased, free = status.gpus
    assert leased.state == "leased" and leased.lease_id == lease_id
    assert leased.idle is True
    assert leased.idle_since == pytest.approx(leased.holder.started_at, abs=0.01)
    assert leased.idle_seconds >= 1
    assert free.idle is False and free.idle_since is None and free.idle_seconds is None
    assert [g.index for g in status.idle] == [0]
    assert status.idle_after_seconds == 1
    assert status.intruders == [gpulock.Intruder(
        pid=intruder.pid, user=me, used_memory_bytes=GIB, host=os.uname().nodename, gpu="0",
        uuid=uuid, lease_id=lease_id, holder_user=me)]

    # The CLI reports the same.
    doc = json.loads(gl.cli("status", "--json").stdout)
    assert [i["pid"] for i in doc["intruders"]] == [intruder.pid]
    assert [g["idle"] for g in doc["gpus"]] == [True, False]
    assert holder.alive() and intruder.alive()  # reported, never killed
