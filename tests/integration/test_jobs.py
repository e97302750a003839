"""Jobs (`gpulock submit`, `jobs`, `logs`, `wait`, `cancel`, `resubmit`) with real processes: many jobs
over few GPUs checked by an independent audit, jobs outliving the session that submitted them,
a killed supervisor showing as lost with its GPU free at once, cancel and time limits, two real
users, and hostile entries in the shared store.

The audit is the jobs' own: each job's shell makes a directory named after its GPU (mkdir fails
if another job holds one there now) and logs its start and end, so a GPU given to two jobs at
once shows as a failed job and as two starts in a row, whatever gpulock says of itself."""

import json
import os
import signal
import subprocess
import time

import pytest

from conftest import HANG, sanitized_build, wait_until
pytest.register_assert_rewrite("conftest_redis")
from conftest_redis import RedisWorld  # noqa: E402,F401

pytest_plugins = ["conftest_redis"]

# The 150 tasks; 40 on a sanitizer build, whose every gpulock costs ~0.3 s of CPU to start.
JOBS = 40 if sanitized_build() else 150

AUDIT_SCRIPT = r'''
set -e
g=$CUDA_VISIBLE_DEVICES
mkdir "$AUDIT/gpu-$g"
echo "start $g $1" >> "$AUDIT/log"
sleep 0.2
echo "end $g $1" >> "$AUDIT/log"
rmdir "$AUDIT/gpu-$g"
echo "$1" >> "$AUDIT/done"
echo "index $1 on GPU $g"
'''


def submit(gl, *args, env=None, prefix=()):
    result = gl.run("submit", *args, env=env, prefix=prefix)
    assert result.returncode == 0, result.stderr
    return int(result.stdout.strip())


def jobs(gl, *args, env=None, prefix=()):
    result = gl.run("jobs", "--json", *args, env=env, prefix=prefix)
    assert result.returncode == 0, result.stderr
    return {j["id"]: j for j in json.loads(result.stdout)["jobs"]}


def state_of(gl, job, env=None):
    return jobs(gl, "--all", env=env)[job]["state"]


def wait_state(gl, job, wanted, env=None):
    wait_until(lambda: state_of(gl, job, env) == wanted, HANG,
               what="job %d to be %s" % (job, wanted))


def supervisor_of(job_dir):
    """The pid of the process whose command line names the job's directory (its supervisor),
    found in /proc: not from gpulock's own records."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if b"--job" in argv and str(job_dir).encode() in argv:
            return int(pid)
    return None


def processes_with_arg(arg):
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open("/proc/%s/cmdline" % pid, "rb") as f:
                    if arg.encode() in f.read().split(b"\0"):
                        found.append(int(pid))
            except OSError:
                pass
    return found


def test_150_jobs_on_4_gpus_each_run_once_never_two_on_a_gpu(gl, tmp_path):
    """The seed user's 150 tasks, one GPU each, on 4 GPUs."""
    audit = tmp_path / "audit"
    audit.mkdir()
    env = gl.env(AUDIT=audit)
    ids = [submit(gl, "-n", "1", "--name", "ct-%d" % i, "--", "sh", "-c", AUDIT_SCRIPT, "job",
                  str(i), env=env) for i in range(JOBS)]
    assert ids == list(range(ids[0], ids[0] + JOBS))
    result = gl.run("wait", *map(str, ids), env=env, timeout=600)
    assert result.returncode == 0, result.stderr
    # The audit: each index once, and on each GPU every start followed by its own end.
    assert sorted(int(x) for x in (audit / "done").read_text().split()) == list(range(JOBS))
    running = {}
    for line in (audit / "log").read_text().splitlines():
        what, gpu, index = line.split()
        if what == "start":
            assert gpu not in running, "job %s started on GPU %s while %s ran" % (
                index, gpu, running[gpu])
            running[gpu] = index
        else:
            assert running.pop(gpu) == index
    listed = jobs(gl, env=env)
    for i, job in enumerate(ids):
        entry = listed[job]
        assert entry["state"] == "done" and entry["exit_status"] == 0, entry
        assert entry["name"] == "ct-%d" % i
        assert len(entry["gpus"]) == 1
        log = gl.run("logs", str(job), env=env)
        assert log.stdout == "index %d on GPU %s\n" % (i, entry["gpus"][0]), log.stdout
    assert gl.run("jobs", "--clean", env=env).stdout == "removed %d ended jobs\n" % JOBS
    assert jobs(gl, env=env) == {}


def test_jobs_outlive_the_session_that_submitted_them(gl, tmp_path):
    env = gl.env(fake="1")
    marker = tmp_path / "finished"
    script = ('%s submit -- sh -c "sleep 1; echo done > %s" > %s/id; sleep 1000'
              % (gl.binary, marker, tmp_path))
    shell = gl.spawn_argv(["sh", "-c", script], env=env)
    wait_until(lambda: (tmp_path / "id").exists() and (tmp_path / "id").read_text().strip(),
               HANG, what="the submission")
    job = int((tmp_path / "id").read_text())
    # The login session ends: SIGHUP, then SIGKILL, to the whole process group.
    os.killpg(shell.pid, signal.SIGHUP)
    os.killpg(shell.pid, signal.SIGKILL)
    result = gl.run("wait", str(job), env=env)
    assert result.returncode == 0, result.stderr
    assert marker.read_text() == "done\n"
    assert state_of(gl, job, env) == "done"


def test_sigkill_of_a_supervisor_shows_lost_and_frees_its_gpu_at_once(gl):
    env = gl.env(fake="1")
    job = submit(gl, "--", "sleep", "4321", env=env)
    wait_state(gl, job, "running", env)
    supervisor = supervisor_of(jobs(gl, env=env)[job]["directory"])
    assert supervisor is not None
    os.kill(supervisor, signal.SIGKILL)
    wait_until(lambda: supervisor_of(jobs(gl, env=env)[job]["directory"]) is None, HANG,
               what="the supervisor to end")
    assert state_of(gl, job, env) == "lost"
    # The command went with it, and the GPU is free now: no waiting.
    wait_until(lambda: not processes_with_arg("4321"), HANG, what="the command to end")
    assert gl.run("run", "--no-wait", "--", "true", env=env).returncode == 0
    result = gl.run("wait", str(job), env=env)
    assert result.returncode == 69 and "lost" in result.stderr


def test_cancel_a_waiting_and_a_running_job(gl):
    env = gl.env(fake="1")
    running = submit(gl, "--", "sleep", "1000", env=env)
    wait_state(gl, running, "running", env)
    waiting = submit(gl, "--", "sleep", "1000", env=env)
    wait_state(gl, waiting, "waiting", env)
    assert gl.run("cancel", str(waiting), env=env).returncode == 0
    wait_state(gl, waiting, "cancelled", env)
    queue = gl.run("queue", "--json", env=env)
    assert json.loads(queue.stdout)["waiting"] == [], queue.stdout
    assert gl.run("cancel", str(running), env=env).returncode == 0
    wait_state(gl, running, "cancelled", env)
    listed = jobs(gl, env=env)
    assert listed[running]["exit_status"] == 143 and listed[running]["gpus"] == ["0"]
    assert listed[waiting]["exit_status"] is None and listed[waiting]["gpus"] == []
    # An ended job cannot be cancelled again; `wait` reports how it ended.
    again = gl.run("cancel", str(running), env=env)
    assert again.returncode == 64 and "has ended (cancelled)" in again.stderr
    assert gl.run("wait", str(running), env=env).returncode == 143
    assert gl.run("run", "--no-wait", "--", "true", env=env).returncode == 0


def test_cancel_at_once_after_submit(gl):
    """Cancelled before its supervisor has even said who it is: it ends cancelled, whether it
    had started its command or not, and its GPU is free."""
    env = gl.env(fake="1")
    for _ in range(5):
        job = submit(gl, "--", "sleep", "1000", env=env)
        assert gl.run("cancel", str(job), env=env).returncode == 0
        assert gl.run("wait", str(job), env=env).returncode == 143
        assert state_of(gl, job, env) == "cancelled"
    assert gl.run("run", "--no-wait", "--", "true", env=env).returncode == 0


def test_time_limit_on_submit_and_on_run(gl):
    env = gl.env(fake="1")
    job = submit(gl, "--time", "1s", "--", "sleep", "1000", env=env)
    result = gl.run("wait", str(job), env=env)
    assert result.returncode == 143, result.stderr
    assert state_of(gl, job, env) == "timeout"
    ran = gl.run("run", "--time", "1s", "--", "sleep", "1000", env=env)
    assert ran.returncode == 143 and "--time 1s" in ran.stderr


def test_failed_job_and_missing_program(gl):
    env = gl.env(fake="2")
    failing = submit(gl, "--", "sh", "-c", "echo oops >&2; exit 3", env=env)
    missing = submit(gl, "--", "/no/such/program", env=env)
    assert gl.run("wait", str(failing), env=env).returncode == 3
    assert gl.run("wait", str(missing), env=env).returncode == 127
    listed = jobs(gl, env=env)
    assert listed[failing]["state"] == "failed" and listed[failing]["reason"] == "exited 3"
    assert gl.run("logs", str(failing), "--stderr", env=env).stdout.endswith("oops\n")
    assert listed[missing]["state"] == "failed"


def test_resubmit_runs_an_ended_job_again_as_it_was_submitted(gl, tmp_path):
    """The command, its name, options and directory come back; the environment is the caller's.
    The first run fails (no `go` file yet), the second, submitted from elsewhere, succeeds."""
    env = gl.env(fake="2")
    workdir = tmp_path / "work"
    workdir.mkdir()
    script = 'test -e go && echo "ran in $PWD on $CUDA_VISIBLE_DEVICES with $MARK"'
    first = gl.run("submit", "--name", "again", "--gpus", "1", "--", "sh", "-c", script,
                   env=dict(env, MARK="first"), cwd=workdir)
    assert first.returncode == 0, first.stderr
    first = int(first.stdout)
    assert gl.run("wait", str(first), env=env).returncode == 1
    (workdir / "go").touch()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    again = gl.run("resubmit", str(first), env=dict(env, MARK="second"), cwd=elsewhere)
    assert again.returncode == 0, again.stderr
    second = int(again.stdout)
    assert second > first
    assert gl.run("wait", str(second), env=env).returncode == 0
    assert gl.run("logs", str(second), env=env).stdout == \
        "ran in %s on 1 with second\n" % workdir
    listed = jobs(gl, env=env)
    assert listed[second]["name"] == "again" and listed[second]["resubmitted_from"] == first
    assert listed[second]["command"] == listed[first]["command"]
    assert listed[first]["state"] == "failed" and listed[first]["resubmitted_from"] is None

    # An array's job comes back alone, with its index.
    array = gl.run("submit", "--array", "7-8%1", "--", "sh", "-c",
                   'echo "$1 $GPULOCK_ARRAY_INDEX"', "job", "{}", env=env)
    assert array.returncode == 0, array.stderr
    seventh = int(array.stdout.split()[0])
    assert gl.run("wait", *array.stdout.split(), env=env).returncode == 0
    repeat = int(gl.run("resubmit", str(seventh), env=env).stdout)
    assert gl.run("wait", str(repeat), env=env).returncode == 0
    assert gl.run("logs", str(repeat), env=env).stdout == "7 7\n"

    # Refused, and nothing submitted: a job still running, an unknown id, a bad one.
    running = submit(gl, "--", "sleep", "1000", env=env)
    before = len(jobs(gl, env=env))
    refused = gl.run("resubmit", str(first), str(running), env=env)
    assert refused.returncode == 64 and "only an ended job" in refused.stderr
    assert gl.run("resubmit", "9999", env=env).returncode == 69
    assert gl.run("resubmit", "x", env=env).returncode == 64
    assert len(jobs(gl, env=env)) == before
    assert gl.run("cancel", str(running), env=env).returncode == 0


def test_cancel_ends_a_lease_of_gpulock_run_by_its_id(gl):
    """`release` refuses a lease of `gpulock run`; `cancel LEASE_ID` ends it: run passes SIGTERM
    on to its command and exits with it, and the GPU is free at once after."""
    env = gl.env(fake="1")
    run = gl.spawn("run", "-n", "1", "--", "sleep", "1000", env=env)
    gl.wait_state(0, "leased", env=env)
    lease = gl.gpu_status(0, env=env)["holder"]["lease_id"]
    refused = gl.run("release", lease, env=env)
    assert refused.returncode == 69 and "running `gpulock run`" in refused.stderr
    ended = gl.run("cancel", lease, env=env)
    assert ended.returncode == 0, ended.stderr
    assert ended.stdout == "ended lease %s\n" % lease
    assert run.wait(timeout=HANG) == 143
    assert gl.run("run", "--no-wait", "--", "true", env=env).returncode == 0
    assert gl.run("cancel", lease, env=env).returncode == 69  # no such lease now


def test_bad_arguments(gl):
    env = gl.env()
    assert gl.run("logs", "abc", env=env).returncode == 64
    assert gl.run("logs", "99", env=env).returncode == 69
    assert gl.run("wait", "0", env=env).returncode == 64
    assert gl.run("submit", "--no-wait", "--", "true", env=env).returncode == 64
    assert gl.run("submit", "--time", "soon", "--", "true", env=env).returncode == 64
    assert gl.run("cancel", env=env).returncode == 64
    assert gl.run("jobs", "--state", "asleep", env=env).returncode == 64


def test_hostile_entries_in_the_store_are_reported_and_harm_no_job(gl, tmp_path):
    env = gl.env(fake="1")
    good = submit(gl, "--", "true", env=env)
    assert gl.run("wait", str(good), env=env).returncode == 0
    store = gl.lock_dir / "jobs"
    (store / str(good + 1)).mkdir()
    (store / str(good + 1) / "job.json").write_text("{not json")
    (store / str(good + 1) / "state.json").write_text("{}")
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", store / str(good + 2))
    (store / "notes.txt").write_text("not a job")
    listed = jobs(gl, env=env)
    assert listed[good]["state"] == "done"
    assert "malformed" in listed[good + 1]["problem"]
    assert "symlink" in listed[good + 2]["problem"]
    table = gl.run("jobs", env=env)
    assert table.returncode == 0 and "malformed" in table.stdout
    # A new job's id comes after them all, and it runs.
    after = submit(gl, "--", "true", env=env)
    assert after == good + 3
    assert gl.run("wait", str(after), env=env).returncode == 0


def test_two_users_see_each_others_jobs_and_only_root_cancels_both(mu):
    a, b = mu.users
    env = mu.env(fake="2")
    job_a = submit(mu, "--", "sleep", "1000", env=env, prefix=a.prefix())
    job_b = submit(mu, "--", "sleep", "1000", env=env, prefix=b.prefix())
    for job in (job_a, job_b):
        wait_state(mu, job, "running", env)
    mine = jobs(mu, env=env, prefix=a.prefix())
    assert list(mine) == [job_a]
    every = jobs(mu, "--all", env=env, prefix=a.prefix())
    assert {every[job_a]["user"], every[job_b]["user"]} == {a.name, b.name}
    refused = mu.run("cancel", str(job_b), env=env, prefix=a.prefix())
    assert refused.returncode == 69 and "belongs to %s" % b.name in refused.stderr
    assert state_of(mu, job_b, env) == "running"
    # Submitted again by A, B's command would run as A.
    refused = mu.run("resubmit", str(job_b), env=env, prefix=a.prefix())
    assert refused.returncode == 69 and "only its owner" in refused.stderr
    # B's log is B's: A cannot read it.
    assert mu.run("logs", str(job_b), env=env, prefix=a.prefix()).returncode == 69
    assert mu.run("cancel", str(job_a), env=env, prefix=a.prefix()).returncode == 0
    assert mu.run("cancel", str(job_b), env=env).returncode == 0  # root
    for job in (job_a, job_b):
        wait_state(mu, job, "cancelled", env)


def test_after_after_any_and_begin(gl, tmp_path):
    env = gl.env(fake="4")
    order = tmp_path / "order"
    gate = tmp_path / "gate"
    # The parent runs until the test opens its gate, however slow the machine.
    first = submit(gl, "--", "sh", "-c",
                   "while [ ! -e %s ]; do sleep 0.05; done; echo first >> %s" % (gate, order),
                   env=env)
    second = submit(gl, "--after", str(first), "--", "sh", "-c", "echo second >> %s" % order,
                    env=env)
    # Four GPUs are free, but it waits for its parent.
    assert state_of(gl, second, env) == "held"
    failing = submit(gl, "--", "false", env=env)
    never = submit(gl, "--after", "%d,%d" % (first, failing), "--", "touch", tmp_path / "never",
                   env=env)
    anyway = submit(gl, "--after-any", str(failing), "--", "true", env=env)
    parent = submit(gl, "--", "sleep", "1000", env=env)
    orphan = submit(gl, "--after", str(parent), "--", "touch", tmp_path / "never", env=env)
    wait_state(gl, parent, "running", env)
    assert gl.run("cancel", str(parent), env=env).returncode == 0
    submitted_at = time.monotonic()
    later = submit(gl, "--begin", "2s", "--", "true", env=env)
    state = state_of(gl, later, env)
    # Held until its begin time; only a machine slower than 2 s per command sees it past that.
    assert state == "held" or time.monotonic() - submitted_at >= 2, state
    assert state_of(gl, second, env) == "held"
    gate.touch()
    result = gl.run("wait", str(second), str(anyway), str(later), env=env)
    assert result.returncode == 0, result.stderr
    assert order.read_text() == "first\nsecond\n"
    assert gl.run("wait", str(never), env=env).returncode == 69
    assert gl.run("wait", str(orphan), env=env).returncode == 69
    listed = jobs(gl, env=env)
    assert listed[never]["state"] == "dependency-failed"
    assert "job %d ended failed" % failing in listed[never]["reason"]
    assert listed[orphan]["state"] == "dependency-failed"
    assert "ended cancelled" in listed[orphan]["reason"]
    assert listed[later]["started"] >= listed[later]["submitted"] + 2
    assert listed[second]["after"] == [first]
    assert not (tmp_path / "never").exists()
    # A held job can be cancelled.
    held = submit(gl, "--begin", "1h", "--", "true", env=env)
    assert gl.run("cancel", str(held), env=env).returncode == 0
    wait_state(gl, held, "cancelled", env)
    assert gl.run("submit", "--after", "9999", "--", "true", env=env).returncode == 69
    assert gl.run("submit", "--begin", "someday", "--", "true", env=env).returncode == 64


ARRAY_SCRIPT = r'''
mkdir "$AUDIT/running-$GPULOCK_ARRAY_INDEX"
ls -d "$AUDIT"/running-* | wc -l >> "$AUDIT/counts"
sleep 0.3
rmdir "$AUDIT/running-$GPULOCK_ARRAY_INDEX"
echo "$1 $GPULOCK_ARRAY_INDEX $GPULOCK_JOB_ID" >> "$AUDIT/seen"
'''


def test_array_with_a_limit_runs_each_index_once_at_most_k_at_once(gl, tmp_path):
    audit = tmp_path / "audit"
    audit.mkdir()
    env = gl.env(fake="4", AUDIT=audit)
    result = gl.run("submit", "--array", "1-10,20%2", "--name", "sweep", "--", "sh", "-c",
                    ARRAY_SCRIPT, "job", "{}", env=env)
    assert result.returncode == 0, result.stderr
    ids = [int(line) for line in result.stdout.split()]
    assert len(ids) == 11
    waited = gl.run("wait", *map(str, ids), env=env)
    assert waited.returncode == 0, waited.stderr
    # Four GPUs free, but never more than two of the array ran at once (its own count).
    assert max(int(n) for n in (audit / "counts").read_text().split()) <= 2
    seen = sorted(tuple(map(int, line.split())) for line in (audit / "seen").read_text().splitlines())
    indices = list(range(1, 11)) + [20]
    assert [(a, b) for a, b, _ in seen] == [(i, i) for i in indices]
    assert sorted(job for _, _, job in seen) == ids
    listed = jobs(gl, env=env)
    assert [listed[j]["name"] for j in ids] == ["sweep[%d]" % i for i in indices]
    assert gl.run("submit", "--array", "5-1", "--", "true", env=env).returncode == 64
    assert gl.run("submit", "--array", "1-3%0", "--", "true", env=env).returncode == 64


def test_config_places_the_store_sets_log_readability_and_caps_each_log(gl, tmp_path):
    """jobs_dir, job_logs_readable and job_log_size from the config: the store is where it says,
    logs are readable by all unless --private-logs, and each log keeps its first job_log_size
    bytes and one line saying the rest was dropped, while the command, writing far past the cap,
    runs to its end (the relay reads and drops, never blocks it)."""
    store = tmp_path / "store"
    config = tmp_path / "config.toml"
    config.write_text('jobs_dir = "%s"\njob_logs_readable = true\njob_log_size = "8K"\n' % store)
    env = gl.env(fake="1", GPULOCK_CONFIG=config)
    # 1 MiB on stdout, 1 MiB on stderr, then a last word on each: past the cap, so dropped.
    script = ("head -c 1048576 /dev/zero | tr '\\0' o; head -c 1048576 /dev/zero | tr '\\0' e >&2;"
              " echo last; echo last >&2")
    loud = submit(gl, "--", "sh", "-c", script, env=env)
    quiet = submit(gl, "--private-logs", "--", "sh", "-c", "echo small", env=env)
    assert gl.run("wait", str(loud), str(quiet), env=env).returncode == 0
    listed = jobs(gl, env=env)
    assert {listed[loud]["directory"], listed[quiet]["directory"]} == {
        str(store / str(loud)), str(store / str(quiet))}
    for name, fill in (("stdout", b"o"), ("stderr", b"e")):
        data = (store / str(loud) / name).read_bytes()
        kept, _, note = data.partition(b"\ngpulock: ")
        assert kept == fill * 8192, (name, len(kept))
        assert b"cap of 8 KiB (job_log_size" in note and b"last" not in note
        assert (store / str(loud) / name).stat().st_mode & 0o004
    assert (store / str(quiet) / "stdout").read_text() == "small\n"
    assert not (store / str(quiet) / "stdout").stat().st_mode & 0o004
    assert listed[loud]["state"] == "done"
    # Not a cap: "off" keeps everything; a nonsense one is a config error, nothing submitted.
    config.write_text('jobs_dir = "%s"\njob_log_size = "off"\n' % store)
    whole = submit(gl, "--", "sh", "-c", "head -c 20000 /dev/zero", env=env)
    assert gl.run("wait", str(whole), env=env).returncode == 0
    assert (store / str(whole) / "stdout").stat().st_size == 20000
    config.write_text('job_log_size = "12"\n')
    bad = gl.run("submit", "--", "true", env=env)
    assert bad.returncode == 78 and "job_log_size" in bad.stderr, (bad.returncode, bad.stderr)


def test_status_queue_and_usage_name_the_job(gl):
    """A job's lease is labelled `job ID [NAME]`: status and queue show it, and usage --by job
    sums each job's GPU-hours apart from leases of no job."""
    env = gl.env(fake="1")
    since = time.time() - 1
    named = submit(gl, "--name", "slice", "--", "sleep", "1000", env=env)
    wait_state(gl, named, "running", env)
    plain = submit(gl, "--", "sleep", "1000", env=env)
    wait_state(gl, plain, "waiting", env)
    status = json.loads(gl.run("status", "--json", env=env).stdout)
    assert status["gpus"][0]["holder"]["label"] == "job %d slice" % named
    assert "[job %d slice]" % named in gl.run("status", env=env).stdout
    waiting = json.loads(gl.run("queue", "--json", env=env).stdout)["waiting"]
    assert [w["label"] for w in waiting] == ["job %d" % plain]
    assert gl.run("cancel", str(named), env=env).returncode == 0
    wait_state(gl, plain, "running", env)
    assert gl.run("cancel", str(plain), env=env).returncode == 0
    wait_state(gl, plain, "cancelled", env)
    assert gl.run("run", "--label", "not a job", "--", "true", env=env).returncode == 0
    result = gl.run("usage", "--since", "%.3f" % since, "--by", "job", "--json", env=env)
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["by"] == "job"
    groups = {g["key"]: g for g in doc["groups"]}
    assert sorted(groups) == sorted(["", str(named), str(plain)]), groups
    assert all(g["leases"] == 1 for g in groups.values())
    assert groups[str(named)]["gpu_hours"] > 0


def test_the_journal_records_how_each_command_ended(gl):
    """The end record of each lease that ran a command says how the command ended: its exit
    status or signal, and whether gpulock stopped it (a time limit, a cancel)."""
    env = gl.env(fake="2")
    ran = {}
    for name, args in [("ok", ["true"]), ("three", ["sh", "-c", "exit 3"]),
                       ("killed", ["sh", "-c", "kill -KILL $$"]),
                       ("missing", ["/no/such/program"]),
                       ("limit", ["--time", "1s", "--", "sleep", "1000"])]:
        argv = args if args[0] == "--time" else ["--"] + args
        result = gl.run("run", "--label", name, *argv, env=env)
        ran[name] = result.returncode
    assert ran == {"ok": 0, "three": 3, "killed": 137, "missing": 127, "limit": 143}
    cancelled = submit(gl, "--name", "cancelled", "--", "sleep", "1000", env=env)
    wait_state(gl, cancelled, "running", env)
    assert gl.run("cancel", str(cancelled), env=env).returncode == 0
    timed = submit(gl, "--name", "timed", "--time", "1s", "--", "sleep", "1000", env=env)
    done = submit(gl, "--name", "done", "--", "true", env=env)
    for job in (cancelled, timed, done):
        gl.run("wait", str(job), env=env)
    held = gl.run("acquire", "--for-pid", str(os.getpid()), "-n", "1", env=env)
    assert held.returncode == 0, held.stderr
    lease = [line.split("=", 1)[1] for line in held.stdout.replace("export ", "").split()
             if line.startswith("GPULOCK_LEASE_ID=")][0].strip("'\";")
    assert gl.run("release", lease, env=env).returncode == 0

    result = gl.run("log", "--json", env=env)
    assert result.returncode == 0, result.stderr
    records = json.loads(result.stdout)["records"]
    labels = {r["lease_id"]: r["label"] for r in records if r["event"] == "start"}
    ends = {labels[r["lease_id"]]: r for r in records if r["event"] == "end"}
    got = {label: (e.get("command_end"), e.get("exit_status"), e.get("signal"))
           for label, e in ends.items()}
    assert got == {
        "ok": ("exited", 0, 0),
        "three": ("exited", 3, 0),
        "killed": ("signal", 137, 9),
        "missing": ("exited", 127, 0),
        "limit": ("timeout", 143, 15),
        "job %d cancelled" % cancelled: ("cancelled", 143, 15),
        "job %d timed" % timed: ("timeout", 143, 15),
        "job %d done" % done: ("exited", 0, 0),
        "": (None, None, None),  # acquire ran no command
    }, got
    assert all(e["how"] == "released" for e in ends.values())
    text = gl.run("log", env=env).stdout
    assert "released  signal 9 (SIGKILL)" in text and "timeout, signal 15 (SIGTERM)" in text


FULL_DISK_SCRIPT = r'''
mount -t tmpfs -o size=64k tmpfs "$MNT" || exit 99
export GPULOCK_JOBS_DIR="$MNT/store"
mkdir -m 1777 "$GPULOCK_JOBS_DIR"
other=$("$G" submit --name other -- sleep 1) || exit 98
big=$("$G" submit --name big -- sh -c 'head -c 1000000 /dev/zero | tr "\0" x; exit 3') || exit 98
"$G" wait "$big"; echo "big $?"
"$G" submit --name refused -- true; echo "refused $?"
"$G" wait "$other"; echo "other $?"
echo "entries $(ls -A "$GPULOCK_JOBS_DIR" | grep -cv '^\.last-id')"
echo "stdout $(wc -c < "$GPULOCK_JOBS_DIR/$big/stdout")"
"$G" jobs --json
'''


def test_a_full_disk_cuts_a_log_and_loses_no_job(gl, tmp_path):
    """A job whose output fills the store's file system: its log is cut, but it runs on and its
    end is recorded (the state file never needs a new block), another job finishes as well,
    and a submit into the full store is refused with the reason, leaving nothing behind."""
    mount = tmp_path / "small"
    mount.mkdir()
    env = gl.env(fake="2", MNT=str(mount), G=str(gl.binary))
    result = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                             FULL_DISK_SCRIPT], env=env, capture_output=True, text=True,
                            timeout=HANG)
    if result.returncode == 99 or "unshare failed" in result.stderr:
        pytest.skip("cannot mount a tmpfs here: " + result.stderr)
    assert result.returncode == 0, result.stderr
    lines, doc = result.stdout.split("{", 1)
    said = dict(line.split(" ", 1) for line in lines.strip().splitlines())
    assert said["big"] == "3" and said["other"] == "0" and said["refused"] == "69", result
    assert "No space left on device" in result.stderr and "cannot make a job" in result.stderr
    assert said["entries"] == "2"  # the refused job left no directory
    assert 0 < int(said["stdout"]) < 1000000
    listed = {j["name"]: j for j in json.loads("{" + doc)["jobs"]}
    assert listed["big"]["state"] == "failed" and listed["big"]["exit_status"] == 3
    assert listed["other"]["state"] == "done"


def test_redis_jobs_wait_in_the_pools_queue_and_run_on_their_host(rw):
    """On the Redis backend a job queues in the pool (other hosts' waiters see it), runs on the
    host it was submitted from with the pool's fencing token, runs --after its parent, and a
    SIGKILLed supervisor leaves it lost, its GPU free once the lease's TTL has run out."""
    rw.register("node-a", gpus=1)
    env = rw.env(host="node-a")
    holder = rw.hold("-n", "1", host="node-a")
    report = 'echo "host=$GPULOCK_LEASE_HOST token=$GPULOCK_FENCING_TOKEN gpus=$GPULOCK_GPUS"'
    first = submit(rw, "--name", "first", "--", "sh", "-c", report, env=env)
    wait_state(rw, first, "waiting", env)
    second = submit(rw, "--after", str(first), "--", "sh", "-c", report, env=env)
    wait_state(rw, second, "held", env)
    # The pool's queue, as another host sees it, holds the job.
    queue = rw.run("queue", "--json", host="node-b", env=rw.env(host="node-b", gpus=1))
    assert queue.returncode == 0, queue.stderr
    waiting = json.loads(queue.stdout)["waiting"]
    assert [w["label"] for w in waiting] == ["job %d first" % first], waiting
    holder.finish()
    for job in (first, second):
        result = rw.run("wait", str(job), env=env)
        assert result.returncode == 0, result.stderr
    tokens = []
    for job in (first, second):
        out = rw.run("logs", str(job), env=env).stdout.split()
        said = dict(word.split("=", 1) for word in out)
        assert said["host"] == "node-a" and said["gpus"].startswith("GPU-"), out
        tokens.append(int(said["token"]))
    assert 0 < holder.token < tokens[0] < tokens[1], (holder.token, tokens)

    # A killed supervisor: lost at once; the GPU comes back when its lease expires.
    doomed = submit(rw, "--", "sleep", "5432", env=env)
    wait_state(rw, doomed, "running", env)
    supervisor = supervisor_of(jobs(rw, env=env)[doomed]["directory"])
    assert supervisor is not None
    os.kill(supervisor, signal.SIGKILL)
    wait_state(rw, doomed, "lost", env)
    wait_until(lambda: not processes_with_arg("5432"), HANG, what="the command to end")
    wait_until(lambda: rw.run_no_wait("-n", "1", env=env).returncode == 0, HANG,
               what="the GPU to come back after the TTL")


def context_switches(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("voluntary_ctxt_switches:"):
                return int(line.split()[1])
    raise AssertionError("no context switch count for %d" % pid)


def test_held_jobs_sleep_until_woken_and_cancel_ends_them_before_it_returns(gl):
    """A job held by --begin or --after sleeps without waking (its supervisor's voluntary
    context switches stay put over 3 s), and `cancel` returns only once a held job has ended,
    each time: a SIGTERM that lands just before the supervisor sleeps in the kernel's lock queue
    is sent again."""
    env = gl.env(fake="1")
    parent = submit(gl, "--", "sleep", "1000", env=env)
    wait_state(gl, parent, "running", env)
    begin = submit(gl, "--begin", "1h", "--", "true", env=env)
    after = submit(gl, "--after", str(parent), "--", "true", env=env)
    supervisors = {}
    for job in (begin, after):
        wait_state(gl, job, "held", env)
        supervisors[job] = supervisor_of(jobs(gl, env=env)[job]["directory"])
    time.sleep(0.5)  # settled into their sleep
    before = {job: context_switches(pid) for job, pid in supervisors.items()}
    time.sleep(3)
    after_sleep = {job: context_switches(pid) for job, pid in supervisors.items()}
    assert after_sleep == before, (before, after_sleep)
    for job in (begin, after):
        assert gl.run("cancel", str(job), env=env).returncode == 0
        assert state_of(gl, job, env) == "cancelled"
    # Many at once after submit, whichever step of its wait each supervisor has reached.
    for i in range(10):
        job = submit(gl, *(["--after", str(parent)] if i % 2 else ["--begin", "1h"]), "--",
                     "true", env=env)
        assert gl.run("cancel", str(job), env=env).returncode == 0
        assert state_of(gl, job, env) == "cancelled", i
    assert gl.run("cancel", str(parent), env=env).returncode == 0
