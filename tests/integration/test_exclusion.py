"""Mutual exclusion under contention, waiting, --timeout and --no-wait."""

import json
import os
import random

import pytest

from conftest import (EX_TEMPFAIL, EX_USAGE, HANG, PYTHON, sim_uuid, wait_until)

# The audited command: for each leased GPU it creates <audit>/<uuid> with O_EXCL (an
# independent marker: if it already exists, another command holds the same GPU right now),
# holds the GPUs a short random time, then removes its markers. It records what it saw.
AUDIT_CHILD = r"""
import json, os, random, sys, time
audit, request = sys.argv[1], sys.argv[2]
uuids = os.environ["GPULOCK_GPUS"].split(",")
made, overlaps = [], []
for uuid in uuids:
    try:
        os.close(os.open(os.path.join(audit, uuid), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
        made.append(uuid)
    except FileExistsError:
        overlaps.append(uuid)
entered = time.monotonic()
time.sleep(random.uniform(0, 0.05))
left = time.monotonic()
for uuid in made:
    os.unlink(os.path.join(audit, uuid))
record = {"request": request, "gpus": uuids, "overlaps": overlaps,
          "entered": entered, "left": left,
          "cvd": os.environ.get("CUDA_VISIBLE_DEVICES"),
          "order": os.environ.get("CUDA_DEVICE_ORDER"),
          "lease": os.environ.get("GPULOCK_LEASE_ID")}
with open(os.path.join(audit, "results", request + ".json"), "w") as f:
    json.dump(record, f)
if overlaps:
    os.close(os.open(os.path.join(audit, "overlaps", request), os.O_CREAT | os.O_WRONLY, 0o644))
    sys.stderr.write("OVERLAP on %s in request %s\n" % (overlaps, request))
    sys.exit(99)
"""

REQUESTS = 40


def test_mutual_exclusion_under_contention(gl):
    audit = gl.tmp / "audit"
    (audit / "results").mkdir(parents=True)
    (audit / "overlaps").mkdir()
    indices = {sim_uuid(i): i for i in range(4)}

    # Hold every GPU until all requests are waiting, so they really contend for them.
    holder, _ = gl.hold("-n", "4")
    rng = random.Random(20240521)
    selections = {}  # request -> (expected count, explicit UUIDs or None)
    procs = {}
    for i in range(REQUESTS):
        name = "req-%02d" % i
        kind = rng.choice(["n1", "n2", "n1", "n2", "explicit"])
        if kind == "explicit":  # a few explicit requests compete with the counted ones
            chosen = sorted(rng.sample(range(4), rng.choice([1, 2])))
            selection = ["--gpus", ",".join(map(str, chosen))]
            selections[name] = (len(chosen), {sim_uuid(c) for c in chosen})
        else:
            selection = ["-n", kind[1]]
            selections[name] = (int(kind[1]), None)
        procs[name] = gl.spawn("run", *selection, "--", PYTHON, "-S", "-c", AUDIT_CHILD,
                               audit, name)
    for name, bg in procs.items():
        bg.wait_for_stderr("waiting for", timeout=HANG)
    holder.kill_group()
    assert holder.wait() != 0

    failures = []
    for name, bg in procs.items():
        status = bg.wait(timeout=180)
        if status != 0:
            failures.append("%s exited %s: %s" % (name, status, bg.stderr()))
    overlaps = sorted(os.listdir(audit / "overlaps"))
    assert overlaps == [], "GPUs were held by two commands at once: %s" % overlaps
    assert failures == []

    results = {}
    for path in (audit / "results").iterdir():
        record = json.loads(path.read_text())
        results[record["request"]] = record
    assert set(results) == set(procs), "every request must be served exactly once"
    leases = [r["lease"] for r in results.values()]
    assert len(set(leases)) == len(leases)
    intervals = {uuid: [] for uuid in indices}
    for name, record in results.items():
        assert record["overlaps"] == []
        count, explicit = selections[name]
        assert len(record["gpus"]) == count == len(set(record["gpus"]))
        if explicit is not None:
            assert set(record["gpus"]) == explicit
        assert set(record["gpus"]) <= set(indices)
        assert record["order"] == "PCI_BUS_ID"
        assert record["cvd"] == ",".join(str(indices[u]) for u in record["gpus"])
        for uuid in record["gpus"]:
            intervals[uuid].append((record["entered"], record["left"], name))
    # A second, independent audit: the critical sections of one GPU never intersect.
    for uuid, spans in intervals.items():
        spans.sort()
        for (_, left_a, a), (entered_b, _, b) in zip(spans, spans[1:]):
            assert left_a <= entered_b, "%s and %s overlapped on %s" % (a, b, uuid)
    assert set(gl.states().values()) == {"free"}
    assert os.listdir(audit / "results") and not [p for p in os.listdir(audit)
                                                  if p.startswith("GPU-")]


def test_waiter_served_after_holder_ends(gl):
    holder, lease = gl.hold("--gpus", "0")
    waiter = gl.spawn("run", "--gpus", "0", "--", "true")
    waiter.wait_for_stderr("waiting for")
    assert lease in waiter.stderr()  # it says who it waits for
    assert waiter.alive()
    holder.kill_group()
    assert waiter.wait(timeout=HANG) == 0, waiter.describe()


def test_count_request_takes_another_free_gpu(gl):
    gl.hold("--gpus", "0")
    result = gl.run("run", "-n", "1", "--no-wait", "--", "sh", "-c", "echo $CUDA_VISIBLE_DEVICES")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "1"


def test_timeout_while_held(gl):
    _, lease = gl.hold("--gpus", "0")
    result = gl.run("run", "--gpus", "0", "--timeout", "1s", "--", "true")
    assert result.returncode == EX_TEMPFAIL, result.stderr
    assert lease in result.stderr
    assert gl.gpu_status(0)["lease_id"] == lease


def test_no_wait_while_held(gl):
    _, lease = gl.hold("--gpus", "0")
    result = gl.run("run", "--gpus", "0", "--no-wait", "--", "true")
    assert result.returncode == EX_TEMPFAIL, result.stderr
    assert "GPU 0" in result.stderr
    assert gl.gpu_status(0)["lease_id"] == lease


def test_all_or_nothing(gl):
    """A request for more GPUs than are free takes none of them."""
    _, lease = gl.hold("--gpus", "1")
    result = gl.run("run", "-n", "4", "--no-wait", "--", "true")
    assert result.returncode == EX_TEMPFAIL, result.stderr
    result = gl.run("run", "--gpus", "0,1", "--timeout", "250ms", "--", "true")
    assert result.returncode == EX_TEMPFAIL, result.stderr
    assert gl.states() == {"0": "free", "1": "leased", "2": "free", "3": "free"}
    assert gl.gpu_status(1)["lease_id"] == lease


@pytest.mark.parametrize("value", ["5x", "abc", "-1s", " ", "1h30", "s", "1.2.3s", "1e3s"])
def test_nonsense_timeout_is_usage_error(gl, value):
    result = gl.run("run", "--timeout", value, "--", "true")
    assert result.returncode == EX_USAGE, result.stderr
    assert set(gl.states().values()) == {"free"}
    # (An empty --timeout '' is covered in test_bad_input.py: it is silently ignored.)


def test_very_long_timeout_still_waits(gl):
    holder, _ = gl.hold("--gpus", "0")
    waiter = gl.spawn("run", "--gpus", "0", "--timeout", "200000d", "--", "true")
    # Without the bug the waiter blocks (and says so); release the GPU either way.
    wait_until(lambda: "waiting for" in waiter.stderr() or not waiter.alive(),
               what="the waiter to wait or exit")
    holder.kill_group()
    assert waiter.wait(timeout=HANG) == 0, waiter.describe()
