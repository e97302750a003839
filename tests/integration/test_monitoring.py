"""Idle leased GPUs, intruders and `gpulock metrics`, on simulated GPUs whose JSON file gives
utilisation and processes (docs/simulated-gpus.md). The test knows which processes it started
and when it changed readings: that is what the reports are checked against.

Metrics are parsed with prometheus_client's own text parser (python3-prometheus-client)."""

import json
import os
import pathlib
import pwd
import re
import shutil
import subprocess
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import EX_USAGE, sim_uuid
from gpulock_testing import SHORT_HANG, wait_until

ME = pwd.getpwuid(os.getuid()).pw_name


def fake_gpus(count=2, per_gpu=None):
    """`count` simulated GPUs; per_gpu maps an index to extra fields of that GPU."""
    per_gpu = per_gpu or {}
    return [dict({"memory_total": "40G"}, **per_gpu.get(i, {})) for i in range(count)]


def config(gl, text):
    path = gl.tmp / "config.toml"
    path.write_text(text)
    return str(path)


def metrics(gl, env):
    result = gl.run("metrics", env=env)
    assert result.returncode == 0, result.stderr
    return result.stdout


def samples(text):
    """{(name, frozenset(labels)): value} and {family name: type} via prometheus_client."""
    values, types = {}, {}
    for family in text_string_to_metric_families(text):
        types[family.name] = family.type
        for sample in family.samples:
            values[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return values, types


def find(values, name, **labels):
    """The samples of `name` whose labels include `labels`."""
    wanted = set(labels.items())
    return {k: v for k, v in values.items() if k[0] == name and wanted <= k[1]}


# -- idle ------------------------------------------------------------------------------------

def test_leased_gpu_at_zero_percent_becomes_idle_after_idle_after(gl):
    path = gl.write_fake_gpus(fake_gpus(2, {0: {"utilization": 0}, 1: {"utilization": 0}}))
    env = gl.env(fake=path, GPULOCK_CONFIG=config(gl, 'idle_after = "2s"\n'))
    holder, lease_id = gl.hold("--gpus", "0", env=env)
    first = gl.gpu_status(0, env=env)
    assert first["state"] == "leased"
    assert first["idle_since"] is not None and first["idle"] is False
    # Readings go on at 0 %: once 2 s have passed since the first, the GPU is idle.
    doc = wait_until(lambda: (lambda d: d if d["gpus"][0]["idle"] else None)(gl.status(env=env)),
                     what="GPU 0 to be reported idle")
    gpu = doc["gpus"][0]
    assert gpu["idle_since"] == pytest.approx(first["idle_since"])
    assert gpu["idle_seconds"] >= 2
    assert doc["idle_after_seconds"] == 2
    assert doc["gpus"][1]["idle"] is False and doc["gpus"][1]["idle_since"] is None  # not leased
    text = gl.run("status", env=env).stdout
    assert re.search(r"^idle: GPU 0 leased by %s \(lease %s\) at 0%% for " % (ME, lease_id),
                     text, re.M), text

    # A busy reading ends the run; the next 0 % reading starts a new one.
    gl.write_fake_gpus(fake_gpus(2, {0: {"utilization": 35}}))
    busy = gl.gpu_status(0, env=env)
    assert busy["idle"] is False and busy["idle_since"] is None
    assert "idle:" not in gl.run("status", env=env).stdout
    changed_back = time.time()
    gl.write_fake_gpus(fake_gpus(2))
    again = gl.gpu_status(0, env=env)
    assert again["idle"] is False and again["idle_since"] >= changed_back - 0.5


def test_a_simulated_gpus_idle_since_is_taken_at_its_word(gl):
    path = gl.write_fake_gpus(fake_gpus(2))
    env = gl.env(fake=path, GPULOCK_CONFIG=config(gl, 'idle_after = "30m"\n'))
    holder, lease_id = gl.hold("--gpus", "1", env=env)
    started = gl.gpu_status(1, env=env)["holder"]["started_at"]
    # Idle since a moment after the lease began: reported as such (not the first reading).
    gl.write_fake_gpus(fake_gpus(2, {1: {"idle_since": started + 0.25}}))
    gpu = gl.gpu_status(1, env=env)
    assert gpu["idle_since"] == pytest.approx(started + 0.25)
    assert gpu["idle"] is False  # 30 min have not passed
    # Utilisation above 0 with idle_since is a contradiction the file must not make.
    gl.write_fake_gpus(fake_gpus(2, {1: {"idle_since": started, "utilization": 5}}))
    result = gl.run("status", "--json", env=env)
    assert result.returncode == EX_USAGE
    assert "idle_since" in result.stderr


def test_idle_after_must_be_a_sensible_duration(gl):
    env = gl.env(GPULOCK_CONFIG=config(gl, 'idle_after = "soon"\n'))
    result = gl.run("status", env=env)
    assert result.returncode == 78
    assert "idle_after" in result.stderr


def test_a_bad_readings_file_never_stops_status(gl):
    """The per-user readings file (XDG_STATE_HOME/gpulock/idle-readings.txt) is a convenience:
    whatever sits at its place, or when no place can be named or written, `status` and
    `metrics` still answer at once. A FIFO (or a symlink to one) would block a reader that opened
    it blindly for ever; the hang guard turns that into a failure."""
    path = gl.write_fake_gpus(fake_gpus(2, {0: {"utilization": 0}}))
    env = gl.env(fake=path, GPULOCK_CONFIG=config(gl, 'idle_after = "1h"\n'))
    gl.hold("--gpus", "0", env=env)
    state = gl.tmp / "state"
    record = state / "gpulock" / "idle-readings.txt"
    elsewhere = gl.tmp / "elsewhere"
    elsewhere.mkdir()
    fifo = elsewhere / "fifo"
    os.mkfifo(fifo)

    def answers(env=env):
        for command in (["status", "--json"], ["metrics"]):
            result = gl.run(*command, env=env, timeout=SHORT_HANG)
            assert result.returncode == 0, (command, result.stderr)
        assert json.loads(gl.run("status", "--json", env=env).stdout)["gpus"][0]["state"] \
            == "leased"

    def replace_record(make):
        record.parent.mkdir(parents=True, exist_ok=True)
        if record.is_symlink() or record.exists():
            record.unlink()
        make()

    replace_record(lambda: os.mkfifo(record))
    answers()
    replace_record(lambda: os.symlink(fifo, record))
    answers()
    header = b"gpulock idle readings 1\n"
    for text in (b"[]", b'{"gpus": {"x": {"lease_id": 5}}}', b"\xff\xfe\x00", header + b"\xff\xfe\x00",
                 header + b"node/GPU-1 a 1e308 -1e308\n", header + b"node/GPU-1 a inf nan\n",
                 header + b"a b c\n" + b"x" * 100000 + b" y 1 2\n", header * 3):
        replace_record(lambda: record.write_bytes(text))
        answers()
    # A file where the state directory should be: nothing can be kept, the status still shows.
    shutil.rmtree(state)
    state.write_text("not a directory")
    answers()
    # No XDG_STATE_HOME and no HOME: memory only.
    bare = {k: v for k, v in env.items() if k not in ("XDG_STATE_HOME", "HOME")}
    answers(bare)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: a state directory of another user")
def test_root_keeps_no_readings_in_another_users_directory(gl):
    """Under sudo, HOME (or XDG_STATE_HOME) may still name the invoking user's directory: root
    must neither create root-owned directories there nor follow that user's symlinks."""
    path = gl.write_fake_gpus(fake_gpus(2, {0: {"utilization": 0}, 1: {"utilization": 0}}))
    theirs = gl.tmp / "theirs"
    theirs.mkdir()
    os.chown(theirs, 65534, 65534)
    for gpu, variables in enumerate(({"XDG_STATE_HOME": str(theirs)}, {"HOME": str(theirs)})):
        env = {k: v for k, v in gl.env(fake=path).items() if k not in ("XDG_STATE_HOME", "HOME")}
        env.update(variables)
        gl.hold("--gpus", str(gpu), env=env)
        result = gl.run("status", "--json", env=env)
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["gpus"][gpu]["idle_since"] is not None  # still tracked
        assert os.listdir(theirs) == [], variables


# -- intruders -------------------------------------------------------------------------------

def test_a_process_outside_the_lease_on_a_leased_gpu_is_an_intruder(gl):
    path = gl.write_fake_gpus(fake_gpus(2))
    env = gl.env(fake=path)
    holder, lease_id = gl.hold("--gpus", "0", env=env, label="train")
    intruder = gl.sleeper()
    bystander = gl.sleeper()  # on a free GPU: busy, but intruding on nobody's lease
    # The lease's own holder process and the intruder on GPU 0; the bystander on GPU 1.
    gl.write_fake_gpus(fake_gpus(2, {
        0: {"processes": [{"pid": holder.popen.pid, "used_memory": "2G"},
                          {"pid": intruder.popen.pid, "used_memory": "1G"}]},
        1: {"processes": [{"pid": bystander.popen.pid}]}}))
    doc = gl.status(env=env)
    assert doc["intruders"] == [{
        "pid": intruder.popen.pid, "user": ME, "used_memory_bytes": 1 << 30,
        "host": doc["host"], "gpu": "0", "uuid": sim_uuid(0), "lease_id": lease_id,
        "holder_user": ME}]
    assert doc["gpus"][1]["state"] == "busy"
    text = gl.run("status", env=env).stdout
    assert "intruder: pid %d (%s) on GPU 0 leased by %s (lease %s)" % (
        intruder.popen.pid, ME, ME, lease_id) in text
    assert "intruder: pid %d" % holder.popen.pid not in text
    assert "intruder: pid %d" % bystander.popen.pid not in text
    # Report only: nothing was stopped.
    assert intruder.alive() and holder.alive()


# -- metrics ---------------------------------------------------------------------------------

def test_metrics_parse_and_match_what_the_test_set_up(gl):
    path = gl.write_fake_gpus(fake_gpus(3, {0: {"utilization": 0, "memory_used": "3G"},
                                              1: {"utilization": 64}}))
    env = gl.env(fake=path, GPULOCK_CONFIG=config(gl, 'idle_after = "1s"\n'))
    # A label with characters the format must escape.
    holder, lease_id = gl.hold("--gpus", "0", env=env, label='say "hi" \\ bye')
    intruder = gl.sleeper()
    gl.write_fake_gpus(fake_gpus(3, {
        0: {"utilization": 0, "memory_used": "3G",
            "processes": [{"pid": intruder.popen.pid, "used_memory": "1G"}]},
        1: {"utilization": 64}}))
    # A request that must wait: every GPU it may use (GPU 0) is held.
    waiter = gl.spawn("run", "--gpus", "0", "--", "true", env=env)
    wait_until(lambda: len(json.loads(gl.run("queue", "--json", env=env).stdout)["waiting"]) == 1,
               what="the request to wait")
    # Two readings at 0 % at least 1 s apart make GPU 0 idle.
    def idle_reported():
        values, types = samples(metrics(gl, env))
        idle = find(values, "gpulock_gpu_idle", gpu="0", user=ME)
        return (values, types) if list(idle.values()) == [1] else None
    values, types = wait_until(idle_reported, what="gpulock_gpu_idle to be 1 for GPU 0")

    assert all(name.startswith("gpulock_") for name in types)
    # Gauges, but for the journal's lease counters (tests/integration/test_lease_counters.py).
    counters = {"gpulock_leases_started", "gpulock_leases_ended"}
    assert all(t == ("counter" if name in counters else "gauge") for name, t in types.items())
    state = find(values, "gpulock_gpu_state", gpu="0")
    assert {dict(k[1])["state"]: v for k, v in state.items()} == {
        "free": 0, "leased": 1, "busy": 0, "excluded": 0, "reserved": 0}
    assert find(values, "gpulock_gpu_state", gpu="1", state="free").popitem()[1] == 1
    lease = find(values, "gpulock_gpu_lease_info", gpu="0")
    assert len(lease) == 1
    labels = dict(next(iter(lease))[1])
    assert labels["user"] == ME and labels["lease_id"] == lease_id
    assert labels["label"] == 'say "hi" \\ bye'
    assert find(values, "gpulock_gpu_utilization_ratio", gpu="1").popitem()[1] == 0.64
    assert find(values, "gpulock_gpu_memory_used_bytes", gpu="0").popitem()[1] == 3 * 2**30
    assert find(values, "gpulock_gpu_memory_total_bytes", gpu="2").popitem()[1] == 40 * 2**30
    assert find(values, "gpulock_gpu_intruder_processes", gpu="0").popitem()[1] == 1
    assert set(find(values, "gpulock_intruder_info").keys()) == {(
        "gpulock_intruder_info", frozenset({
            "host": labels["host"], "gpu": "0", "uuid": sim_uuid(0),
            "pid": str(intruder.popen.pid), "user": ME, "holder_user": ME,
            "lease_id": lease_id}.items()))}
    assert find(values, "gpulock_user_gpus_held", user=ME).popitem()[1] == 1
    assert find(values, "gpulock_queue_length").popitem()[1] == 1
    assert find(values, "gpulock_queue_waiting_requests", user=ME).popitem()[1] == 1
    assert find(values, "gpulock_queue_requested_gpus", user=ME).popitem()[1] == 1
    assert find(values, "gpulock_queue_longest_wait_seconds", user=ME).popitem()[1] >= 0
    assert find(values, "gpulock_idle_after_seconds").popitem()[1] == 1
    # Only the leased GPU has idle and held-time samples.
    assert set(dict(k[1])["gpu"] for k in find(values, "gpulock_gpu_idle")) == {"0"}
    assert waiter.alive()


def test_metrics_output_file_is_replaced_whole(gl):
    target = gl.tmp / "textfile" / "gpulock.prom"
    target.parent.mkdir()
    result = gl.run("metrics", "--output", target)
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""
    values, _ = samples(target.read_text())
    assert len(find(values, "gpulock_gpu_info")) == 4
    assert oct(target.stat().st_mode & 0o777) == "0o644"
    assert sorted(os.listdir(target.parent)) == ["gpulock.prom"]  # no temporary left behind
    # Replaced by a rename, never rewritten in place: a collector that has the old file open
    # reads it whole, and the new one appears whole (a new inode each time).
    with open(target) as old:
        before = os.fstat(old.fileno()).st_ino
        old_text = target.read_text()
        assert gl.run("metrics", "--output", target).returncode == 0
        assert old.read() == old_text
    assert target.stat().st_ino != before
    assert len(find(samples(target.read_text())[0], "gpulock_gpu_info")) == 4
    missing = gl.run("metrics", "--output", gl.tmp / "no-such-dir" / "x.prom")
    assert missing.returncode == 69
    assert "cannot write" in missing.stderr


def test_metrics_pass_promtool_check(gl):
    """Prometheus's own linter (`promtool check metrics`, Debian's prometheus package) finds
    nothing wrong with the metrics of a machine in use: an exclusive lease with a label that
    needs escaping, a shared lease, a waiting request, the journal's lease counters, an idle
    GPU and an intruder."""
    # scripts/install-deps unpacks it from Debian's prometheus package into .cache/test-tools
    # (installing the package would also enable and start a Prometheus server).
    unpacked = pathlib.Path(__file__).resolve().parents[2] / ".cache/test-tools/bin/promtool"
    promtool = shutil.which("promtool") or (str(unpacked) if unpacked.exists() else None)
    if promtool is None:
        pytest.skip("promtool is missing: scripts/install-deps unpacks it into " + str(unpacked))
    gpus = fake_gpus(3, {0: {"utilization": 0, "memory_used": "3G"}})
    path = gl.write_fake_gpus(gpus)
    env = gl.env(fake=path, GPULOCK_CONFIG=config(gl, 'idle_after = "1s"\n'))
    finished = gl.run("run", "-n", "1", "--", "true", env=env)
    assert finished.returncode == 0, finished.stderr
    holder, _ = gl.hold("--gpus", "0", env=env, label='say "hi" \\ bye\n')
    shared = gl.spawn("run", "--gpus", "1", "--mem", "4G", "--", "sleep", "600", env=env)
    # The shared lease first: no shared lease starts while a whole-GPU request waits.
    wait_until(lambda: json.loads(gl.run("status", "--json", env=env).stdout)["gpus"][1]["shared"],
               what="the shared lease")
    intruder = gl.sleeper()
    gpus[0]["processes"] = [{"pid": intruder.popen.pid, "used_memory": "1G"}]
    gl.write_fake_gpus(gpus)
    waiter = gl.spawn("run", "--gpus", "0", "--", "true", env=env)
    wait_until(lambda: len(json.loads(gl.run("queue", "--json", env=env).stdout)["waiting"]) == 1,
               what="the request to wait")

    def idle_reported():
        text = metrics(gl, env)
        return text if re.search(r'^gpulock_gpu_idle\{[^}]*gpu="0"[^}]*\} 1$', text, re.M) else None
    text = wait_until(idle_reported, what="GPU 0 reported idle")
    for family in ("gpulock_leases_started_total", "gpulock_gpu_shared_jobs",
                   "gpulock_intruder_info", "gpulock_queue_length"):
        assert family in text, family
    checked = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                             text=True, timeout=SHORT_HANG)
    assert (checked.returncode, checked.stdout + checked.stderr) == (0, ""), text
    assert holder.alive() and shared.alive() and waiter.alive()
