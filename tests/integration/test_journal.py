"""The usage journal, `gpulock usage` and `gpulock log` (issue 16), with real processes.

Every lease start and end is recorded: released leases by their holder, leases whose whole job
was SIGKILLed by the next reader (inferred "holder_died"), Redis leases that were lost ("lost").
Two users append at once without losing or mixing records; a journal that cannot be written
(read-only, a full file system) leaves the lease working with exactly one warning; damaged and
truncated lines are skipped with a warning each and nothing else is lost; files rotate.
`gpulock usage` is checked against what the test itself measured around each job it ran.
"""

import json
import os
import signal
import stat
import subprocess
import time
import zlib

import pytest

from conftest import HANG, wait_until
pytest.register_assert_rewrite("conftest_redis")
from conftest_redis import RedisWorld  # noqa: E402,F401

pytest_plugins = ["conftest_redis"]

WARNING = "usage journal"


def journal_dir(h):
    return h.lock_dir / "journal"


def log_doc(h, env=None, prefix=()):
    result = h.run("log", "--json", env=env, prefix=prefix)
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["schema_version"] == 1
    return doc, result.stderr


def by_lease(records):
    leases = {}
    for r in records:
        leases.setdefault(r["lease_id"], {}).setdefault(r["event"], []).append(r)
    return leases


def test_released_and_killed_leases_are_recorded(gl):
    ok = gl.run("run", "--gpus", "1,2", "--label", "sweep", "--", "sh", "-c",
                'echo $GPULOCK_LEASE_ID')
    assert ok.returncode == 0, ok.stderr
    released_id = ok.stdout.strip()

    holder, killed_id = gl.hold("--gpus", "0", label="doomed")
    # SIGKILL of the whole job: gpulock run and its command; nobody writes the end.
    os.killpg(holder.popen.pid, signal.SIGKILL)
    holder.popen.wait(timeout=HANG)
    gl.wait_state(0, "free")
    before_read = time.time()

    doc, err = log_doc(gl)
    after_read = time.time()
    assert doc["warnings"] == [] and "warning" not in err, err
    leases = by_lease(doc["records"])
    start = leases[released_id]["start"][0]
    assert start["label"] == "sweep"
    assert start["command"].startswith("sh -c")
    assert [(g["index"], g["uuid"]) for g in start["gpus"]] == [
        (1, gl.gpu_status(1)["uuid"]), (2, gl.gpu_status(2)["uuid"])]
    assert start["user"] == "root" or start["uid"] == os.geteuid()
    assert start["waited_seconds"] >= 0
    assert leases[released_id]["end"][0]["how"] == "released"
    assert leases[released_id]["end"][0]["inferred"] is False

    assert leases[killed_id]["start"][0]["label"] == "doomed"
    died = leases[killed_id]["end"]
    assert [e["how"] for e in died] == ["holder_died"] and died[0]["inferred"] is True
    # The end is inferred, and dated, by the reader that finds the holder gone: this `log`.
    assert leases[killed_id]["start"][0]["time"] <= died[0]["time"]
    assert before_read <= died[0]["time"] <= after_read

    # The inferred end was written down: a second reader finds it and infers nothing more.
    again = by_lease(log_doc(gl)[0]["records"])
    assert len(again[killed_id]["end"]) == 1

    # The plain-text log shows the same.
    text = gl.run("log").stdout
    assert released_id in text and "holder_died (inferred)" in text


def test_a_running_lease_is_not_ended_by_a_reader(gl):
    holder, lease = gl.hold("--gpus", "0")
    leases = by_lease(log_doc(gl)[0]["records"])
    assert "start" in leases[lease] and "end" not in leases[lease]
    assert holder.alive()


def test_usage_totals_match_what_the_test_ran(gl):
    """GPU-seconds per user and label, checked against the test's own stopwatch: each job's
    lease lies inside the wall time the test measured around `gpulock run`, and lasts at least
    the command's own sleep."""
    jobs = [(1, 0.3, "a"), (2, 0.2, "b"), (3, 0.1, "a"), (1, 0.4, "")]
    outer = {"a": 0.0, "b": 0.0, "": 0.0}
    inner = dict(outer)
    since = time.time() - 1
    for count, seconds, label in jobs:
        args = ["run", "-n", count] + (["--label", label] if label else []) + [
            "--", "sleep", seconds]
        t0 = time.time()
        result = gl.run(*args)
        t1 = time.time()
        assert result.returncode == 0, result.stderr
        outer[label] += count * (t1 - t0)
        inner[label] += count * seconds
    until = time.time() + 1

    result = gl.run("usage", "--since", "%.3f" % since, "--until", "%.3f" % until, "--by",
                    "label", "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    groups = {g["key"]: g for g in doc["groups"]}
    assert set(groups) == {"a", "b", ""}
    for label in groups:
        seconds = groups[label]["gpu_hours"] * 3600
        assert inner[label] <= seconds + 1e-6 <= outer[label] + 1e-3, (label, seconds)
    assert groups["a"]["leases"] == 2 and groups["b"]["leases"] == 1
    assert doc["total"]["leases"] == len(jobs)
    total = doc["total"]["gpu_hours"] * 3600
    assert sum(inner.values()) <= total + 1e-6 <= sum(outer.values()) + 1e-3

    # --by gpu: each GPU's hours add up to the total; --csv has one line per group.
    by_gpu = json.loads(gl.run("usage", "--since", "%.3f" % since, "--by", "gpu",
                               "--json").stdout)
    assert abs(sum(g["gpu_hours"] for g in by_gpu["groups"]) - doc["total"]["gpu_hours"]) < 1e-9
    csv = gl.run("usage", "--since", "%.3f" % since, "--csv").stdout.splitlines()
    assert csv[0].startswith("user,gpu_hours,leases")
    assert len(csv) == 2 and csv[1].split(",")[2] == str(len(jobs))
    # A window before any of it counts nothing.
    empty = json.loads(gl.run("usage", "--since", "%.3f" % (since - 100), "--until",
                              "%.3f" % (since - 50), "--json").stdout)
    assert empty["groups"] == [] and empty["total"]["gpu_hours"] == 0


def test_bad_time_bounds_are_usage_errors(gl):
    for args in (["--since", "yesterday"], ["--since", "7x"], ["--until", "2026-13-01"],
                 ["--since", "1d", "--until", "2d"], ["--by", "host"]):
        result = gl.run("usage", *args)
        assert result.returncode != 0 and result.returncode < 128, (args, result.stderr)
        assert result.stderr.strip() and "Traceback" not in result.stderr


def test_two_users_append_at_once(mu):
    a, b = mu.users
    # As the administrator sets it up: the journal directory root-owned (else its creator, who
    # owns it, could delete others' files from it; docs/operations.md).
    assert mu.run("init").returncode == 0
    st = os.stat(journal_dir(mu))
    assert st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o1777
    rounds = 15
    script = 'for i in $(seq %d); do "$0" run -n 1 --label "$1" -- true || exit 1; done' % rounds
    procs = [subprocess.Popen(user.prefix() + ["sh", "-c", script, mu.binary, user.name],
                              env=mu.env(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True) for user in (a, b)]
    try:
        for p in procs:
            _, err = p.communicate(timeout=HANG)
            assert p.returncode == 0, err
            assert WARNING not in err, err
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    doc, err = log_doc(mu)
    assert doc["warnings"] == [], doc["warnings"]
    for user in (a, b):
        mine = [r for r in doc["records"] if r["event"] == "start" and r["user"] == user.name]
        assert len(mine) == rounds and all(r["label"] == user.name for r in mine)
        ends = by_lease(doc["records"])
        assert all([e["how"] for e in ends[r["lease_id"]]["end"]] == ["released"] for r in mine)
        path = journal_dir(mu) / ("usage-%d.log" % user.uid)
        st = os.stat(path)
        assert st.st_uid == user.uid and stat.S_IMODE(st.st_mode) == 0o644
    # A well-formed end of A's lease in B's own file changes nothing: only a lease's own user
    # (or root) may end it in writing.
    def usage_of_a():
        doc = json.loads(mu.run("usage", "--since", "1d", "--json").stdout)
        return [g for g in doc["groups"] if g["key"] == a.name][0]["gpu_hours"]
    before = usage_of_a()
    first = [r for r in doc["records"] if r["event"] == "start" and r["user"] == a.name][0]
    forged = json.dumps({"v": 1, "event": "end", "lease_id": first["lease_id"],
                         "time": first["time"], "how": "released", "inferred": False},
                        separators=(",", ":"))
    line = "%08x %s\n" % (zlib.crc32(forged.encode()), forged)
    result = subprocess.run(b.prefix() + ["sh", "-c", 'printf %s "$1" >> "$0"',
                                          str(journal_dir(mu) / ("usage-%d.log" % b.uid)), line],
                            capture_output=True, timeout=HANG)
    assert result.returncode == 0, result.stderr
    assert usage_of_a() == before

    # Nobody may rewrite another user's records.
    other = journal_dir(mu) / ("usage-%d.log" % a.uid)
    result = subprocess.run(b.prefix() + ["sh", "-c", 'echo forged >> "$0"', str(other)],
                            capture_output=True, timeout=HANG)
    assert result.returncode != 0
    result = subprocess.run(b.prefix() + ["rm", "-f", str(other)], capture_output=True,
                            timeout=HANG)
    assert result.returncode != 0 and other.exists()


def test_unwritable_journal_warns_once_and_the_lease_works(mu):
    a, _ = mu.users
    # Made by root, read-only to the user: she cannot create her file there.
    closed = mu.tmp / "closed-journal"
    closed.mkdir(mode=0o755)
    os.chmod(mu.tmp, 0o755)
    env = mu.env(GPULOCK_JOURNAL_DIR=closed)
    result = mu.run("run", "-n", "2", "--", "sh", "-c", "echo $CUDA_VISIBLE_DEVICES",
                    env=env, prefix=a.prefix())
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "0,1"
    assert result.stderr.count("warning") == 1 and WARNING in result.stderr, result.stderr
    assert os.listdir(closed) == []


def test_full_journal_warns_once_and_the_lease_works(gl):
    full = gl.tmp / "full-journal"
    full.mkdir()
    # A tiny tmpfs of its own, filled to the last block, in a private mount namespace.
    script = ('mount -t tmpfs -o size=16k tmpfs "$1" || exit 99; '
              'mkdir -m 1777 "$1/j"; dd if=/dev/zero of="$1/fill" bs=1k count=64 2>/dev/null; '
              'shift; exec "$@"')
    argv = ["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh", str(full),
            gl.binary, "run", "--gpus", "3", "--", "sh", "-c", "echo $GPULOCK_LEASE_ID"]
    result = subprocess.run(argv, env=gl.env(GPULOCK_JOURNAL_DIR=full / "j"),
                            capture_output=True, text=True, timeout=HANG)
    if result.returncode == 99 or "unshare failed" in result.stderr:
        pytest.skip("cannot mount a tmpfs here: " + result.stderr)
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.strip()) == 16
    assert result.stderr.count("warning") == 1 and WARNING in result.stderr, result.stderr
    assert "No space left" in result.stderr
    gl.wait_state(3, "free")


def test_damaged_and_truncated_records_are_skipped_alone(gl):
    ids = []
    for _ in range(4):
        result = gl.run("run", "-n", "1", "--", "sh", "-c", "echo $GPULOCK_LEASE_ID")
        assert result.returncode == 0
        ids.append(result.stdout.strip())
    path = journal_dir(gl) / ("usage-%d.log" % os.geteuid())
    lines = path.read_bytes().split(b"\n")
    assert lines[-1] == b"" and len(lines) == 9
    # Flip one character of the third line's JSON (the second lease's start) ...
    damaged = bytearray(lines[2])
    damaged[30] ^= 0x01
    lines[2] = bytes(damaged)
    # ... and leave a record cut in the middle at the end, as a crash would.
    path.write_bytes(b"\n".join(lines[:-1]) + b"\n" + lines[4][:25])
    # A lease after the torn tail is recorded whole.
    result = gl.run("run", "-n", "1", "--", "sh", "-c", "echo $GPULOCK_LEASE_ID")
    assert result.returncode == 0
    ids.append(result.stdout.strip())

    doc, err = log_doc(gl)
    assert len(doc["warnings"]) == 2, doc["warnings"]
    assert all("damaged record skipped" in w for w in doc["warnings"])
    assert err.count("damaged record skipped") == 2
    leases = by_lease(doc["records"])
    assert len(doc["records"]) == 9
    for lease in ids:
        if lease == ids[1]:
            assert "start" not in leases[lease]  # its start was the damaged line
        else:
            assert len(leases[lease]["start"]) == 1 and len(leases[lease]["end"]) == 1
    # usage still counts what it can and reports the damage.
    usage = gl.run("usage", "--json")
    assert usage.returncode == 0
    assert json.loads(usage.stdout)["total"]["leases"] == 4


def test_journal_files_rotate_and_every_record_is_kept(gl):
    config = gl.tmp / "config.toml"
    config.write_text('journal_file_size = "4K"\n')
    env = gl.env(GPULOCK_CONFIG=config)
    runs = 24
    for _ in range(runs):
        result = gl.run("run", "-n", "1", "--label", "x" * 100, "--", "true", env=env)
        assert result.returncode == 0 and WARNING not in result.stderr, result.stderr
    names = sorted(os.listdir(journal_dir(gl)))
    rotated = [n for n in names if n.startswith("usage-%d-" % os.geteuid())]
    assert len(rotated) >= 2, names
    for name in rotated:
        assert os.path.getsize(journal_dir(gl) / name) < 4096 + 4000
    doc, _ = log_doc(gl, env=env)
    assert doc["warnings"] == []
    starts = [r for r in doc["records"] if r["event"] == "start"]
    ends = [r for r in doc["records"] if r["event"] == "end"]
    assert len(starts) == runs and len(ends) == runs
    assert len({r["lease_id"] for r in starts}) == runs


def test_journal_off(gl):
    env = gl.env(GPULOCK_JOURNAL_DIR="off")
    assert gl.run("run", "-n", "1", "--", "true", env=env).returncode == 0
    assert not journal_dir(gl).exists()
    result = gl.run("usage", env=env)
    assert result.returncode == 0 and "no usage journal" in result.stderr


# -- Redis ----------------------------------------------------------------------------------------

def test_redis_released_and_lost_leases_are_recorded(rw):
    rw.register("node-a", gpus=1, ttl="30s")
    # After register(): its processes then have node-a's one GPU, not the default 4.
    env = rw.env(ttl="30s")  # renewals every 10 s: time to take the holder's GPU first
    ok = rw.run("run", "-n", "1", "--label", "r", "--", "sh", "-c", "echo $GPULOCK_LEASE_ID",
                env=env)
    assert ok.returncode == 0, ok.stderr
    released = ok.stdout.strip()

    holder = rw.hold("-n", "1", env=env)
    rw.wait_for_command_in_record(holder)
    # Its lock key goes, and another lease takes the GPU: the holder finds its lease lost at
    # its next renewal (and never steals it back).
    rw.server.command("DEL", rw.lock_key(holder.gpus[0]))
    intruder = rw.hold("-n", "1", env=env)
    wait_until(lambda: "lost" in holder.bg.stderr(), timeout=HANG, what="the loss warning")
    holder.finish()
    intruder.finish()

    stream = rw.key("journal")
    assert rw.server.command("XLEN", stream) >= 4
    result = rw.run("log", "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["journal"].endswith(stream)
    leases = by_lease(doc["records"])
    assert leases[released]["start"][0]["label"] == "r"
    assert leases[released]["start"][0]["host"] == "node-a"
    assert [e["how"] for e in leases[released]["end"]] == ["released"]
    assert leases[released]["end"][0]["command_end"] == "exited"
    assert leases[released]["end"][0]["exit_status"] == 0
    assert [e["how"] for e in leases[holder.lease_id]["end"]] == ["lost"]
    assert [e["how"] for e in leases[intruder.lease_id]["end"]] == ["released"]
    usage = json.loads(rw.run("usage", "--json").stdout)
    assert usage["total"]["leases"] == 3


def test_redis_sigkilled_job_is_inferred_ended(rw):
    rw.register("node-a", gpus=1)
    holder = rw.hold("-n", "1")
    os.killpg(holder.bg.popen.pid, signal.SIGKILL)
    holder.bg.popen.wait(timeout=HANG)
    # Its keys expire with the TTL; then a reader infers the end.
    wait_until(lambda: rw.server.command("GET", rw.lock_key(holder.gpus[0])) is None,
               timeout=HANG, what="the lease to expire")
    leases = by_lease(json.loads(rw.run("log", "--json").stdout)["records"])
    assert [e["how"] for e in leases[holder.lease_id]["end"]] == ["holder_died"]


def test_detached_lease_end_is_written_by_its_holder(gl):
    """`gpulock acquire --for-pid`: the detached holder, not the acquiring process, writes the
    end, once, when the watched shell exits."""
    script = 'eval "$("$0" acquire -n 1 --for-pid $$)" && echo $GPULOCK_LEASE_ID'
    result = subprocess.run(["sh", "-c", script, gl.binary], env=gl.env(), capture_output=True,
                            text=True, timeout=HANG)
    assert result.returncode == 0, result.stderr
    lease = result.stdout.strip()

    def ended():
        return "end" in by_lease(log_doc(gl)[0]["records"]).get(lease, {})
    wait_until(ended, timeout=HANG, what="the detached lease's end record")
    ends = by_lease(log_doc(gl)[0]["records"])[lease]["end"]
    assert [(e["how"], e["inferred"]) for e in ends] == [("released", False)]
