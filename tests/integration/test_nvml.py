"""The real NVML code path through the CLI, without a GPU: the fake NVML library built in
tests/fake_nvml/ is loaded through GPULOCK_NVML_LIBRARY. Also: no NVML at all."""

import json
import os
import pathlib
import signal

import pytest

from conftest import EX_UNAVAILABLE, HANG
from gpulock_testing import wait_until


def fake_library(name):
    build = os.environ.get("GPULOCK_BUILD_DIR")
    candidates = [pathlib.Path(build) / "tests" / name] if build else []
    candidates.append(pathlib.Path(__file__).resolve().parents[2] / "build" / "tests" / name)
    for path in candidates:
        if path.is_file():
            return str(path)
    pytest.fail("fake NVML library %s not built (looked in %s)" % (name, candidates))


def nvml_env(gl, library, config_text=None):
    env = gl.env(fake=None, GPULOCK_NVML_LIBRARY=library)
    if config_text is not None:
        config = gl.tmp / "fake_nvml.conf"
        config.write_text(config_text)
        env["FAKE_NVML_CONFIG"] = str(config)
    return env


MACHINE = """\
system driver=550.54.15 nvml=12.550.54
gpu uuid=GPU-11111111-2222-3333-4444-000000000000 name="NVIDIA H100 80GB HBM3" bus=00000000:1B:00.0 total_mib=81920 used_mib=0 util=0 power_mw=70000 limit_mw=700000 switch=0
gpu uuid=GPU-11111111-2222-3333-4444-000000000001 name="NVIDIA H100 80GB HBM3" bus=00000000:2B:00.0 total_mib=81920 used_mib=0 util=0 power_mw=70000 limit_mw=700000 switch=1
gpu uuid=GPU-11111111-2222-3333-4444-000000000002 name="NVIDIA H100 80GB HBM3" bus=00000000:3B:00.0 total_mib=81920 used_mib=0 util=0 power_mw=70000 limit_mw=700000 switch=0
gpu uuid=GPU-11111111-2222-3333-4444-000000000003 name="NVIDIA H100 80GB HBM3" bus=00000000:4B:00.0 total_mib=81920 used_mib=20480 util=90 power_mw=400000 limit_mw=700000 switch=1
proc gpu=3 pid={foreign} used_mib=20480
"""


def test_gpus_and_run_through_nvml(gl):
    sleeper = gl.sleeper()
    env = nvml_env(gl, fake_library("libfake_nvml_full.so"), MACHINE.format(foreign=sleeper.pid))
    result = gl.run("gpus", "--json", env=env)
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["simulated"] is False
    assert "driver 550.54.15" in doc["device_source"]
    assert [g["uuid"][-1] for g in doc["gpus"]] == ["0", "1", "2", "3"]
    assert doc["gpus"][1]["pci_bus_id"] == "00000000:2B:00.0"
    assert doc["gpus"][3]["utilization_percent"] == 90
    assert doc["gpus"][3]["power_draw_watts"] == 400.0
    assert [p["pid"] for p in doc["gpus"][3]["processes"]] == [sleeper.pid]

    # Two GPUs: 0 and 2 share a switch (topology), GPU 3 runs a foreign process.
    result = gl.run("run", "-n", "2", "--", "sh", "-c",
                    'echo "$CUDA_VISIBLE_DEVICES $CUDA_DEVICE_ORDER"', env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["0,2", "PCI_BUS_ID"]
    status = json.loads(gl.run("status", "--json", env=env).stdout)
    assert status["gpus"][3]["state"] == "busy"


def test_old_driver_without_versioned_symbols(gl):
    env = nvml_env(gl, fake_library("libfake_nvml_old.so"))
    result = gl.run("run", "-n", "1", "--visible", "uuid", "--", "sh", "-c",
                    'echo "$CUDA_VISIBLE_DEVICES"', env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().startswith("GPU-")


def test_no_nvml_is_a_clear_error(gl):
    for command in (("status",), ("gpus",), ("run", "--", "true")):
        env = gl.env(fake=None, GPULOCK_NVML_LIBRARY=str(gl.tmp / "no-such-libnvidia-ml.so.1"))
        result = gl.run(*command, env=env)
        assert result.returncode == EX_UNAVAILABLE, result.stderr
        assert "NVML" in result.stderr and "GPULOCK_FAKE_GPUS" in result.stderr
        assert "internal error" not in result.stderr


def test_driver_that_fails_to_initialise(gl):
    env = nvml_env(gl, fake_library("libfake_nvml_full.so"))
    env["FAKE_NVML_INIT_FAIL"] = "9"  # NVML_ERROR_DRIVER_NOT_LOADED
    result = gl.run("gpus", env=env)
    assert result.returncode == EX_UNAVAILABLE, result.stderr
    assert "GPULOCK_FAKE_GPUS" in result.stderr


def test_idle_gpus_are_followed_across_status_runs_through_nvml(gl):
    # NVML gives one utilisation reading per query: "at 0 % for idle_after" comes from the
    # readings that successive `gpulock status` runs keep in the user's state directory.
    config = gl.tmp / "config.toml"
    config.write_text('idle_after = "1s"\n')
    env = nvml_env(gl, fake_library("libfake_nvml_full.so"))
    env["GPULOCK_CONFIG"] = str(config)
    holder, lease_id = gl.hold("--gpus", "0", env=env)
    first = gl.gpu_status(0, env=env)
    assert first["utilization_percent"] == 0 and first["idle"] is False
    idle = wait_until(lambda: (lambda g: g if g["idle"] else None)(gl.gpu_status(0, env=env)),
                      what="GPU 0 to be idle")
    assert idle["idle_since"] == pytest.approx(first["idle_since"])
    assert (gl.tmp / "state" / "gpulock" / "idle-readings.txt").is_file()


# The real driver (580, on an H100) starts threads in nvmlInit that keep the signal mask they
# were started with. `gpulock run` blocks SIGCHLD and the signals it forwards to read them from a
# signalfd; before every NVML call was made with all signals blocked, the kernel could hand them
# to a driver thread instead: a finished command stayed a zombie and gpulock never exited, and a
# SIGTERM ended gpulock at once without reaching the command. The fake's `quirk thread=1` starts
# such a thread.
DRIVER_WITH_THREADS = """\
system driver=580.159.04 nvml=13.580.159.04
gpu uuid=GPU-11111111-2222-3333-4444-000000000000 name="NVIDIA H100 80GB HBM3" bus=00000000:06:00.0 total_mib=81920
quirk thread=1
"""


def test_run_sees_its_command_end_beside_the_drivers_threads(gl):
    env = nvml_env(gl, fake_library("libfake_nvml_full.so"), DRIVER_WITH_THREADS)
    # The signal went astray in about half of the runs before the fix: ten runs catch it.
    for _ in range(10):
        result = gl.run("run", "-n", "1", "--", "sh", "-c", "exit 3", env=env, timeout=HANG)
        assert result.returncode == 3, result.stderr


def test_run_forwards_sigterm_beside_the_drivers_threads(gl):
    env = nvml_env(gl, fake_library("libfake_nvml_full.so"), DRIVER_WITH_THREADS)
    marker = gl.tmp / "got-term"
    started = gl.tmp / "started"
    run = gl.spawn("run", "-n", "1", "--", "sh", "-c",
                   'trap "echo term > %s; exit 5" TERM; touch %s; '
                   'while :; do sleep 0.05; done' % (marker, started), env=env)
    wait_until(started.exists, what="the command to start")
    os.kill(run.pid, signal.SIGTERM)
    assert run.wait() == 5, run.describe()  # the command's own status: it got the signal
    assert marker.read_text().strip() == "term"
