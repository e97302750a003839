"""Leases in shell scripts, in the shapes people write (issue: leases in shell scripts fail
closed and are never handed out twice): 150 tasks in background subshells on 4 GPUs with the
docs' recipes, `nohup` and a logout, `--for-pid` in its right and wrong forms, and `eval` and
`read` of a failed acquire under `set -e`. Every sweep is audited from outside gpulock
(tests/support/sweep_audit.py: an O_EXCL marker per GPU made by the tasks themselves): no GPU
is ever held by two tasks, no task runs without a GPU, and the script ends. Then the whole
session of a script is SIGKILLed mid-sweep, and the GPUs must come back by themselves."""

import os

import pytest

from conftest import EX_TEMPFAIL, EX_USAGE, HANG, sanitized_build, wait_until
from sweep_audit import Audit, describe_processes, kill_session, session_processes

pytest_plugins = ["conftest_redis"]  # the rw fixture: a real redis-server and a pool

# The seed's 150 tasks; 30 on a sanitizer build, whose every gpulock process takes about 0.25 s
# of CPU to start and a second to release under the load of the rest (the shapes are the same).
TASKS = 30 if sanitized_build() else 150
SWEEP_HANG = 300  # hang guard of one sweep: 150 tasks take about 12 s on 2 cores

# docs/cli.md, "Tasks in background subshells": the eval form, released when the task ends.
SWEEP_EVAL = r'''
task() {
  eval "$(gpulock acquire -n 1)"
  trap 'gpulock release "$GPULOCK_LEASE_ID"' EXIT
  work.sh "$CUDA_VISIBLE_DEVICES" "$1"
}
for i in $(seq "$N"); do task "$i" & done
wait
'''

# The same with the GPU id only, as GPU.py users write it.
SWEEP_PRINT_IDS = r'''
for i in $(seq "$N"); do
  (
    read -r GPUID < <(gpulock acquire -n 1 --print-ids) || exit
    work.sh "$GPUID" "$i"
    gpulock release --gpus "$GPUID"
  ) &
done
wait
'''

# A lease held for the task's own subshell: it ends with the task, with no release.
SWEEP_OWN_PID = r'''
for i in $(seq "$N"); do
  (
    me=$BASHPID
    read -r GPUID < <(gpulock acquire -n 1 --for-pid "$me" --print-ids) || exit
    work.sh "$GPUID" "$i"
  ) &
done
wait
'''

# $BASHPID inside <(…) is the substitution's own process, which becomes gpulock: refused.
SWEEP_SUBSTITUTION_PID = r'''
for i in $(seq "$N"); do
  (
    read -r GPUID < <(gpulock acquire -n 1 --for-pid $BASHPID --print-ids) || {
      echo "$i" >> "$AUDIT/refused"; exit; }
    work.sh "$GPUID" "$i"
  ) &
done
wait
'''

# Every lease held for the parent script ($$): the tasks beyond the first four wait on their
# own script. With --timeout they give up, and the failed eval stops each of them. The first four
# must be served within it: 3 s, 15 s on a sanitizer build, whose 30 starts take 8 s of CPU.
SWEEP_PARENT_PID = r'''
for i in $(seq "$N"); do
  {
    (
      eval "$(gpulock acquire -n 1 --for-pid $$ --timeout TIMEOUT)"
      work.sh "$CUDA_VISIBLE_DEVICES" "$i"
    ) 2>> "$AUDIT/stderr"
    echo "$?" >> "$AUDIT/statuses"
  } &
done
wait
'''


def bin_with_gpulock(gl, audit):
    link = audit.bin / "gpulock"
    if not link.exists():
        link.symlink_to(gl.binary)
    return audit


def start_sweep(gl, body, tasks=TASKS, work_seconds="0.01", env=None, name="sweep"):
    """Starts `body` as a bash script in a session of its own, with N=tasks. Returns the
    Background (its pid is the session's id) and the Audit."""
    audit = bin_with_gpulock(gl, Audit(gl.tmp / (name + "-audit")))
    script = gl.tmp / (name + ".sh")
    script.write_text(body)
    env = audit.env(env or gl.env(GPULOCK_JOURNAL_DIR="off"), work_seconds)
    env["N"] = str(tasks)
    return gl.spawn_argv(["/bin/bash", script], env=env), audit


def all_gpus_free(gl, env=None):
    """True if all four GPUs can be leased at once now (gpulock run --no-wait)."""
    return gl.run("run", "--gpus", "0,1,2,3", "--no-wait", "--", "true",
                  env=env).returncode == 0


def wait_for_sweep(sweep, audit, timeout=SWEEP_HANG):
    """The sweep's exit status; on a hang, what every process of it (and each detached holder)
    is doing, and where the audit stands."""
    try:
        return sweep.wait(timeout=timeout)
    except AssertionError as hang:
        raise AssertionError("%s\n%s" % (hang, describe_processes(sweep.pid, audit))) from None


def finish(gl, sweep, audit):
    assert wait_for_sweep(sweep, audit) == 0, sweep.describe()
    assert audit.errors() == []
    wait_until(lambda: not session_processes(sweep.pid), what="the sweep's session to end")
    # Every lease ends with the sweep: all four GPUs can be taken at once.
    wait_until(lambda: all_gpus_free(gl), HANG, what="the GPUs to come back")


@pytest.mark.parametrize("body", [SWEEP_EVAL, SWEEP_PRINT_IDS, SWEEP_OWN_PID],
                         ids=["eval", "print-ids", "own-pid"])
def test_tasks_in_background_subshells_never_share_a_gpu(gl, body):
    sweep, audit = start_sweep(gl, body)
    finish(gl, sweep, audit)
    assert audit.done() == list(range(1, TASKS + 1))


def test_a_lease_for_the_substitutions_own_process_is_refused(gl):
    """`--for-pid $BASHPID` inside `<(…)` named the process that then ran gpulock: its lease
    ended at once and 145 of 150 tasks overlapped. It is refused, before any GPU is taken."""
    sweep, audit = start_sweep(gl, SWEEP_SUBSTITUTION_PID)
    finish(gl, sweep, audit)
    assert audit.done() == []
    assert sorted(int(t) for t in (audit.dir / "refused").read_text().split()) == \
        list(range(1, TASKS + 1))


def test_tasks_waiting_on_their_own_script_are_warned_and_stop(gl):
    """Leases held for the script itself ($$) free only when it exits: its other tasks wait on
    it. They are told so, and with --timeout the failed eval stops them: none runs without a
    GPU (before, they went on with CUDA_VISIBLE_DEVICES unset, seeing every GPU)."""
    timeout = "15s" if sanitized_build() else "3s"
    sweep, audit = start_sweep(gl, SWEEP_PARENT_PID.replace("TIMEOUT", timeout))
    finish(gl, sweep, audit)
    assert len(audit.done()) == 4  # one per GPU; the others timed out and stopped
    stderr = (audit.dir / "stderr").read_text()
    assert "this command's own ancestor" in stderr and "the script waits on itself" in stderr
    statuses = sorted(int(line) for line in (audit.dir / "statuses").read_text().split())
    assert statuses == [0] * 4 + [EX_TEMPFAIL] * (TASKS - 4)


def test_a_task_that_gives_up_before_its_wait_began_is_warned_too(gl):
    """On a loaded machine the deadline can pass while a task still queues for the acquire
    mutex, before its wait has said what holds it up: the failure still names the self-wait.
    (The mutex is held here by a classic POSIX lock, which conflicts with gpulock's OFD lock.)"""
    script = r'''
(eval "$(gpulock acquire --gpus 0,1,2,3 --for-pid $$)")
python3 -c 'import fcntl, sys, time
mutex = open(sys.argv[1], "r+")
fcntl.lockf(mutex, fcntl.LOCK_EX)
print("locked", flush=True)
time.sleep(600)' "$MUTEX" > "$MUTEX.ready" &
trap "kill $!" EXIT
until [ -s "$MUTEX.ready" ]; do sleep 0.05; done
eval "$(gpulock acquire -n 1 --for-pid $$ --timeout 1s)"
echo "ran without a GPU" >&2
'''
    assert gl.run("status").returncode == 0  # creates the lock directory
    mutex = gl.lock_dir / ".acquire.lock"
    mutex.touch()
    env = gl.env(GPULOCK_JOURNAL_DIR="off", MUTEX=str(mutex))
    env["PATH"] = "%s:%s" % (os.path.dirname(gl.binary), env["PATH"])
    proc = gl.spawn_argv(["/bin/bash", "-c", script], env=env)
    status = proc.wait(timeout=HANG)
    stderr = proc.stderr()
    assert status == EX_TEMPFAIL, proc.describe()
    assert "acquire lock" in stderr and "this command's own ancestor" in stderr, stderr
    assert "ran without a GPU" not in stderr


def test_a_nohup_sweep_outlives_the_logout_and_still_never_shares(gl):
    """`nohup ./sweep.sh &`, then the login shell exits: the leases are the session's, which
    lives on in the sweep."""
    audit = bin_with_gpulock(gl, Audit(gl.tmp / "audit"))
    sweep = gl.tmp / "sweep.sh"
    sweep.write_text(SWEEP_EVAL)
    env = audit.env(gl.env(GPULOCK_JOURNAL_DIR="off"))
    env["N"] = str(TASKS)
    login = gl.spawn_argv(["/bin/bash", "-c", 'nohup bash "$0" > "$0.log" 2>&1 & exit 0',
                           sweep], env=env)
    assert login.wait() == 0
    assert session_processes(login.pid), "the sweep should run on after the logout"
    wait_until(lambda: not session_processes(login.pid), SWEEP_HANG, what="the sweep to end")
    assert audit.errors() == []
    assert audit.done() == list(range(1, TASKS + 1))
    wait_until(lambda: all_gpus_free(gl), HANG, what="the GPUs to come back")


@pytest.mark.parametrize("body", [SWEEP_EVAL, SWEEP_PRINT_IDS], ids=["eval", "print-ids"])
def test_killing_the_whole_session_mid_sweep_gives_every_gpu_back(gl, body):
    """SIGKILL for every process of the script's session (a lost connection, `pkill -9 -s`),
    while four tasks work and the rest wait: no release ever runs, and the detached holders
    (in sessions of their own) let the GPUs go once the session has no process left."""
    sweep, audit = start_sweep(gl, body, work_seconds="1000")
    wait_until(lambda: len(audit.running()) == 4, SWEEP_HANG, what="four tasks at work")
    assert kill_session(sweep.pid) > 4
    sweep.wait()
    wait_until(lambda: all_gpus_free(gl), HANG, what="the GPUs to come back")
    assert audit.errors() == [] and audit.done() == []


FAIL_CLOSED = {
    "eval": 'set -e\neval "$(gpulock acquire -n 1 --timeout 1s)"\necho ran >> "$AUDIT/ran"\n',
    "eval-without-set-e": 'eval "$(gpulock acquire -n 1 --no-wait)"\necho ran >> "$AUDIT/ran"\n',
    "read": 'set -e\nread -r GPUID < <(gpulock acquire -n 1 --print-ids --timeout 1s)\n'
            'echo ran >> "$AUDIT/ran"\n',
    "assignment": 'set -e\nGPUID=$(gpulock acquire -n 1 --print-ids --no-wait)\n'
                  'echo ran >> "$AUDIT/ran"\n',
    "subshell": '(\n  eval "$(gpulock acquire -n 1 --no-wait)"\n  echo ran >> "$AUDIT/ran"\n)\n'
                'echo "subshell: $?" >> "$AUDIT/status"\n',
}


@pytest.mark.parametrize("shape", sorted(FAIL_CLOSED))
def test_a_failed_acquire_stops_the_script(gl, shape):
    gl.hold("-n", "4")
    sweep, audit = start_sweep(gl, FAIL_CLOSED[shape], tasks=1)
    status = sweep.wait(timeout=HANG)
    assert not (audit.dir / "ran").exists(), "the script went on without a GPU"
    if shape == "subshell":
        assert status == 0 and (audit.dir / "status").read_text() == "subshell: %d\n" % (
            EX_TEMPFAIL)
    elif shape == "read":
        assert status == 1  # read's own status at end of input: set -e stops the script
    else:
        assert status == EX_TEMPFAIL, sweep.describe()


def test_a_malformed_option_stops_an_eval_too(gl):
    sweep, audit = start_sweep(gl, 'eval "$(gpulock acquire -n 1 --timeout 5x)"\n'
                                   'echo ran >> "$AUDIT/ran"\n', tasks=1)
    assert sweep.wait(timeout=HANG) == EX_USAGE
    assert not (audit.dir / "ran").exists()


def test_on_a_redis_pool_the_session_holds_the_leases_and_its_end_frees_them_at_once(rw):
    """The same rule on the Redis backend: the holders renew the leases while the session
    lives, and let them go as soon as it has no process left, not a TTL later."""
    env = rw.env(ttl="1h", GPULOCK_JOURNAL_DIR="off")  # a TTL that cannot pass in the test
    sweep, audit = start_sweep(rw.gl, SWEEP_EVAL, tasks=40, env=env)
    assert wait_for_sweep(sweep, audit) == 0, sweep.describe()
    assert audit.errors() == [] and audit.done() == list(range(1, 41))
    sweep, audit = start_sweep(rw.gl, SWEEP_EVAL, tasks=20, work_seconds="1000", env=env,
                               name="killed")
    wait_until(lambda: len(audit.running()) == 4, SWEEP_HANG, what="four tasks at work")
    kill_session(sweep.pid)
    sweep.wait()
    # Long before the TTL could pass: the holders released the leases themselves. (The queue
    # entries of the waiters killed with them stay until their own TTL, as on any Redis pool.)
    wait_until(lambda: not rw.server.keys("gpulock:{%s}:lock:*" % rw.pool), HANG,
               what="the lock keys to go")
