"""Health filters and foreign processes, with simulated GPUs described by a JSON file."""

import json
import os
import pwd

import pytest

from conftest import EX_TEMPFAIL, EX_UNAVAILABLE, EX_USAGE, HANG, wait_until

U = ["GPU-11111111-0000-4000-8000-00000000000%d" % i for i in range(4)]
CVD = ("import os; print(os.environ['CUDA_VISIBLE_DEVICES'] + ' ' + os.environ['GPULOCK_GPUS'])")


def visible(gl, *selection, env):
    """Runs a command under a lease and returns (CUDA_VISIBLE_DEVICES, GPULOCK_GPUS)."""
    result = gl.run("run", *selection, "--", "/usr/bin/python3", "-S", "-c", CVD, env=env)
    assert result.returncode == 0, result.stderr
    return tuple(result.stdout.split())


def fake_env(gl, gpus):
    return gl.env(fake=gl.write_fake_gpus(gpus))


def test_foreign_process_makes_gpu_busy(gl):
    sleeper = gl.sleeper()
    env = fake_env(gl, [{"uuid": U[0], "processes": [{"pid": sleeper.pid, "used_memory": "2G"}]},
                        {"uuid": U[1]}])
    assert visible(gl, "-n", "1", env=env) == ("1", U[1])
    status = gl.status(env=env)
    gpu0, gpu1 = status["gpus"]
    assert gpu0["state"] == "busy" and gpu1["state"] == "free"
    assert [(p["pid"], p["foreign"], p["user"]) for p in gpu0["processes"]] == \
        [(sleeper.pid, True, pwd.getpwuid(os.getuid()).pw_name)]
    assert gpu0["memory_used_bytes"] == 2 * 1024 ** 3
    result = gl.run("run", "--gpus", "0", "--no-wait", "--", "true", env=env)
    assert result.returncode == EX_TEMPFAIL, result.stderr
    assert str(sleeper.pid) in result.stderr
    # --allow-foreign accepts it (and, lowest index first, picks it).
    assert visible(gl, "-n", "1", "--allow-foreign", env=env) == ("0", U[0])
    assert visible(gl, "--gpus", "0", "--allow-foreign", "--no-wait", env=env) == ("0", U[0])
    assert gl.run("run", "-n", "2", "--no-wait", "--", "true", env=env).returncode == EX_TEMPFAIL


def test_min_free_memory(gl):
    env = fake_env(gl, [{"uuid": U[0], "memory_total": "80G", "memory_used": "70G"},
                        {"uuid": U[1], "memory_total": "80G", "memory_used": "50G"},
                        {"uuid": U[2], "memory_total": "40G"}])
    assert visible(gl, "-n", "1", "--min-free-mem", "20G", env=env) == ("1", U[1])
    assert visible(gl, "-n", "1", "--min-free-mem", "35G", env=env) == ("2", U[2])
    assert visible(gl, "-n", "1", "--min-free-mem", "10G", env=env) == ("0", U[0])
    assert visible(gl, "-n", "1", "--min-free-mem", "10240M", env=env) == ("0", U[0])
    result = gl.run("run", "--gpus", "0", "--min-free-mem", "20G", "--no-wait", "--", "true",
                    env=env)
    assert result.returncode == EX_TEMPFAIL, result.stderr
    # 41G fits no GPU now; it could fit GPU 0 or 1 later: wait-able, not impossible.
    result = gl.run("run", "-n", "1", "--min-free-mem", "41G", "--no-wait", "--", "true",
                    env=env)
    assert result.returncode == EX_TEMPFAIL, result.stderr


def test_min_free_memory_above_total_can_never_be_served(gl):
    env = fake_env(gl, [{"uuid": U[0], "memory_total": "16G"}])
    # No --no-wait / --timeout: it must fail at once rather than wait forever.
    result = gl.run("run", "-n", "1", "--min-free-mem", "20G", "--", "true", env=env,
                    timeout=HANG)
    assert result.returncode == EX_UNAVAILABLE, result.stderr
    assert "16.0 GiB" in result.stderr
    result = gl.run("run", "--gpus", "0", "--min-free-mem", "20G", "--", "true", env=env)
    assert result.returncode == EX_UNAVAILABLE, result.stderr


def test_max_utilization(gl):
    env = fake_env(gl, [{"uuid": U[0], "utilization": 90}, {"uuid": U[1], "utilization": 40},
                        {"uuid": U[2], "utilization": 10}])
    assert visible(gl, "-n", "1", "--max-util", "50", env=env) == ("1", U[1])
    assert visible(gl, "-n", "1", "--max-util", "10%", env=env) == ("2", U[2])
    assert visible(gl, "-n", "1", "--max-util", "90", env=env) == ("0", U[0])
    result = gl.run("run", "-n", "1", "--max-util", "5", "--no-wait", "--", "true", env=env)
    assert result.returncode == EX_TEMPFAIL, result.stderr


def test_max_power(gl):
    env = fake_env(gl, [{"uuid": U[0], "power_draw": 500, "power_limit": 700},
                        {"uuid": U[1], "power_draw": 250.5},
                        {"uuid": U[2], "power_draw": 100}])
    assert visible(gl, "-n", "1", "--max-power", "300", env=env) == ("1", U[1])
    assert visible(gl, "-n", "1", "--max-power", "150W", env=env) == ("2", U[2])
    assert visible(gl, "-n", "2", "--max-power", "300", env=env) == ("1,2", U[1] + "," + U[2])
    result = gl.run("run", "--gpus", "0", "--max-power", "300", "--no-wait", "--", "true",
                    env=env)
    assert result.returncode == EX_TEMPFAIL, result.stderr


def test_all_filters_together(gl):
    sleeper = gl.sleeper()
    env = fake_env(gl, [
        {"uuid": U[0], "memory_used": "75G"},
        {"uuid": U[1], "utilization": 99},
        {"uuid": U[2], "power_draw": 690},
        {"uuid": U[3], "memory_used": "1G", "utilization": 3, "power_draw": 80},
        {"uuid": "GPU-11111111-0000-4000-8000-000000000099",
         "processes": [{"pid": sleeper.pid}]},
    ])
    assert visible(gl, "-n", "1", "--min-free-mem", "20G", "--max-util", "50",
                   "--max-power", "300", env=env) == ("3", U[3])


@pytest.mark.parametrize("flag,value", [("--min-free-mem", "20"), ("--min-free-mem", "-1G"),
                                        ("--max-util", "150"), ("--max-util", "-3"),
                                        ("--max-util", "5.5"), ("--max-power", "0"),
                                        ("--max-power", "fast")])
def test_malformed_filter_values(gl, flag, value):
    result = gl.run("run", flag, value, "--", "true")
    assert result.returncode == EX_USAGE, result.stderr


def test_mig_instances_are_leased_parent_excluded(gl):
    env = fake_env(gl, [
        {"uuid": U[0], "mig": [{"uuid": "MIG-aaaa0000-0000-4000-8000-000000000000",
                                "memory_total": "40G"},
                               {"uuid": "MIG-aaaa0000-0000-4000-8000-000000000001",
                                "memory_total": "40G"}]},
        {"uuid": U[1]},
    ])
    mig0, mig1 = ("MIG-aaaa0000-0000-4000-8000-00000000000%d" % i for i in range(2))
    status = gl.status(env=env)
    by_index = {g["display_index"]: g for g in status["gpus"]}
    assert set(by_index) == {"0", "0:0", "0:1", "1"}
    assert by_index["0"]["state"] == "excluded" and by_index["0"]["note"]
    assert by_index["0:1"]["state"] == "free"
    assert by_index["0:1"]["parent_uuid"] == U[0]

    # Instances are leasable; CUDA_VISIBLE_DEVICES names them by MIG UUID, even with index.
    assert visible(gl, "--gpus", "0:1", env=env) == (mig1, mig1)
    assert visible(gl, "-n", "2", env=env) == (mig0 + "," + mig1, mig0 + "," + mig1)
    cvd, uuids = visible(gl, "-n", "3", env=env)
    assert cvd.split(",") == [mig0, mig1, "1"]
    assert uuids.split(",") == [mig0, mig1, U[1]]
    # The parent itself can never be leased.
    result = gl.run("run", "--gpus", "0", "--", "true", env=env)
    assert result.returncode == EX_UNAVAILABLE, result.stderr
    assert "MIG" in result.stderr
    result = gl.run("run", "-n", "4", "--", "true", env=env)
    assert result.returncode == EX_UNAVAILABLE, result.stderr

    # A held instance shows as leased while the parent stays excluded.
    holder, lease = gl.hold("--gpus", "0:0", env=env)
    assert holder.gpus == [mig0]
    status = gl.status(env=env)
    by_index = {g["display_index"]: g for g in status["gpus"]}
    assert by_index["0:0"]["state"] == "leased" and by_index["0:0"]["lease_id"] == lease
    assert by_index["0"]["state"] == "excluded"
    assert visible(gl, "-n", "1", env=env) == (mig1, mig1)


def test_waiter_blocked_by_foreign_process_served_when_it_goes(gl):
    sleeper = gl.sleeper()
    gpus = [{"uuid": U[0], "processes": [{"pid": sleeper.pid, "used_memory": "1G"}]}]
    env = fake_env(gl, gpus)
    waiter = gl.spawn("run", "-n", "1", "--", "true", env=env)
    waiter.wait_for_stderr("waiting for")
    assert str(sleeper.pid) in waiter.stderr()
    assert waiter.alive()
    gl.write_fake_gpus([{"uuid": U[0]}])  # the foreign process is gone
    # Health is re-read every 2 s while only health blocks: the guard is far above that.
    assert waiter.wait(timeout=HANG) == 0, waiter.describe()


def test_own_job_listed_on_gpu_is_not_foreign(gl):
    """A process of the lease's command running on its GPU is not foreign; others are."""
    ready = gl.tmp / "ready"
    finish = gl.tmp / "finish"
    sleeper = gl.sleeper()
    env = fake_env(gl, [{"uuid": U[0]}, {"uuid": U[1]}])
    # The command lists its own pid on its GPU (and the sleeper's on the same GPU).
    script = r"""
import json, os, sys, time
path, ready, finish, other = sys.argv[1:5]
doc = json.load(open(path))
for gpu in doc["gpus"]:
    if gpu["uuid"] == os.environ["GPULOCK_GPUS"]:
        gpu["processes"] = [{"pid": os.getpid(), "used_memory": "3G"}, {"pid": int(other)}]
tmp = path + ".w"
with open(tmp, "w") as f:
    json.dump(doc, f)
os.replace(tmp, path)
open(ready, "w").close()
while not os.path.exists(finish):
    time.sleep(0.05)
"""
    holder = gl.spawn("run", "--gpus", "1", "--", "/usr/bin/python3", "-S", "-c", script,
                      env["GPULOCK_FAKE_GPUS"], ready, finish, sleeper.pid, env=env)
    wait_until(lambda: ready.exists() or not holder.alive(), what="the job to start")
    assert holder.alive(), holder.describe()
    gpu1 = gl.gpu_status(1, env=env)
    assert gpu1["state"] == "leased"
    foreign = {p["pid"]: p["foreign"] for p in gpu1["processes"]}
    assert foreign[sleeper.pid] is True
    assert [f for pid, f in foreign.items() if pid != sleeper.pid] == [False]
    assert gpu1["note"]  # processes outside the lease use this GPU
    finish.touch()
    assert holder.wait() == 0, holder.describe()
    assert json.loads((gl.fake_path).read_text())  # the file is still valid
