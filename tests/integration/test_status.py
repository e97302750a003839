"""`gpulock status`, `gpulock gpus`, version and help."""

import json
import os
import pwd
import re

import pytest

from conftest import EX_USAGE, sim_uuid


def test_status_json_of_idle_machine(gl):
    doc = gl.status()
    assert doc["schema_version"] == 1
    assert doc["simulated"] is True
    assert "simulated" in doc["device_source"]
    assert doc["lock_dir"] == str(gl.lock_dir)
    assert [g["display_index"] for g in doc["gpus"]] == ["0", "1", "2", "3"]
    for i, gpu in enumerate(doc["gpus"]):
        assert gpu["uuid"] == sim_uuid(i)
        assert gpu["state"] == "free"
        assert gpu["lease_id"] is None and gpu["holder"] is None
        assert gpu["processes"] == []


def test_status_shows_lease_as_the_command_sees_it(gl):
    holder, lease = gl.hold("-n", "2", label="sweep-7")
    doc = gl.status()
    leased = [g for g in doc["gpus"] if g["state"] == "leased"]
    assert sorted(g["uuid"] for g in leased) == sorted(holder.gpus)
    me = pwd.getpwuid(os.geteuid())
    for gpu in leased:
        assert gpu["lease_id"] == lease  # the GPULOCK_LEASE_ID the command saw
        h = gpu["holder"]
        assert h["lease_id"] == lease
        assert h["label"] == "sweep-7"
        assert h["kind"] == "run"
        assert h["user"] == me.pw_name and h["uid"] == me.pw_uid
        assert h["pid"] == holder.pid and h["pid_alive"] is True
        assert len(h["member_pids"]) == 1
        assert h["command"].startswith("sh -c ") and "exec sleep 1000" in h["command"]
        assert sorted(h["gpus"]) == sorted(holder.gpus)
        assert h["held_seconds"] >= 0
    for gpu in doc["gpus"]:
        if gpu["state"] != "leased":
            assert gpu["lease_id"] is None and gpu["holder"] is None

    text = gl.run("status")
    assert text.returncode == 0, text.stderr
    assert "simulated" in text.stdout
    assert lease in text.stdout and "sweep-7" in text.stdout
    assert str(gl.lock_dir) in text.stdout


def test_status_text_is_sanitized(gl):
    """Labels are shown to other users: no terminal escape sequences get through."""
    gl.hold("--gpus", "0", label="evil\x1b]0;pwned\x07\x1b[2J\rlabel")
    text = gl.run("status")
    assert text.returncode == 0
    assert "\x1b" not in text.stdout and "\x07" not in text.stdout
    doc = gl.status()
    assert "\x1b" not in doc["gpus"][0]["holder"]["label"]


def test_long_label_and_command_are_bounded(gl):
    _, lease = gl.hold("--gpus", "0", label="L" * 5000)
    gpu = gl.gpu_status(0)
    assert gpu["lease_id"] == lease
    assert 0 < len(gpu["holder"]["label"]) <= 256


def test_gpus_json(gl):
    result = gl.run("gpus", "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["schema_version"] == 1 and doc["simulated"] is True
    uuids = [g["uuid"] for g in doc["gpus"]]
    assert len(uuids) == 4 and len(set(uuids)) == 4
    assert [g["index"] for g in doc["gpus"]] == [0, 1, 2, 3]
    assert all(g["memory_total_bytes"] == 80 * 1024 ** 3 for g in doc["gpus"])


def test_gpus_text_mentions_simulated(gl):
    result = gl.run("gpus")
    assert result.returncode == 0, result.stderr
    assert "simulated" in result.stdout
    for i in range(4):
        assert sim_uuid(i) in result.stdout


def test_verbose_run_mentions_simulated(gl):
    result = gl.run("run", "-v", "--", "true")
    assert result.returncode == 0, result.stderr
    assert "simulated" in result.stderr


def test_status_with_no_gpus(gl):
    env = gl.env(fake="0")
    assert gl.status(env=env)["gpus"] == []
    assert gl.run("status", env=env).returncode == 0


def test_version(gl):
    result = gl.run("version")
    assert result.returncode == 0
    assert re.match(r"gpulock \d+\.\d+\.\d+", result.stdout)


@pytest.mark.parametrize("args", [["--help"], ["run", "--help"], ["acquire", "--help"],
                                  ["release", "--help"], ["status", "--help"],
                                  ["gpus", "--help"]])
def test_help(gl, args):
    result = gl.run(*args)
    assert result.returncode == 0, result.stderr
    assert "gpulock" in result.stdout or "Usage" in result.stdout


def test_run_help_documents_exit_status_and_variables(gl):
    result = gl.run("run", "--help")
    assert "CUDA_VISIBLE_DEVICES" in result.stdout and "--no-wait" in result.stdout


@pytest.mark.parametrize("args", [[], ["frobnicate"], ["--frobnicate"], ["status", "--frob"],
                                  ["gpus", "extra"]])
def test_unknown_subcommand_or_option(gl, args):
    result = gl.run(*args)
    assert result.returncode == EX_USAGE, result.stderr
    assert "--help" in result.stderr
