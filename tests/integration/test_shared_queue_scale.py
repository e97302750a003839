"""Shared requests in the machine's queue at scale (issue 15 on the queue of issue 12): a
thousand waiting shared jobs of one user on one simulated 80 GiB GPU.

Shared requests wait in the same queue as whole-GPU ones, woken by the dispatchers and their
wake FIFOs, with no inotify instance of their own. These tests hold them to that:

  - every queued job is served exactly once, and never more than fit at once (an independent
    audit: each 10 GiB job takes one of 8 `mkdir` slots for as long as it runs, so a ninth job
    running beside eight others finds no slot and records an error);
  - waiting shared jobs use (next to) no CPU;
  - SIGKILL of random waiters and of the dispatchers during a drain: the queue heals.

Every timeout is only a hang guard; nothing asserts speed except the CPU bound, which is set to
catch polling, not to measure. GPULOCK_SCALE_N and GPULOCK_SCALE_BATCH as in
test_queue_scale.py.
"""

import random
import time

from conftest import HANG, wait_until
from test_queue_scale import (N, RANDOM_VICTIMS, REGISTER_HANG, Audit, assert_all_served,
                              assert_idle, assert_served_once, ensure_room_for,
                              jobs_behind_held_gpu, kill_while_draining, live_tickets, names_for,
                              queue_doc, queue_jobs, wait_survivors)

# 10 GiB jobs on an 80 GiB GPU: at most 8 at once.
AT_ONCE = 8

# The audited job: argv[1] the audit directory, argv[2] the job's number. It takes the first
# free slot directory of AT_ONCE (`mkdir` is atomic) while it runs; none free means more jobs
# run at once than their reservations allow (an error file). The log gets one line per job.
SLOT_JOB = ('d=$1; n=$2; k=0; got=; '
            'while [ $k -lt %d ]; do '
            'if mkdir "$d/slot-$k" 2>/dev/null; then got=$k; break; fi; k=$((k+1)); done; '
            'echo "$n" >> "$d/log"; '
            'if [ -z "$got" ]; then : > "$d/error-$n"; exit 3; fi; '
            'rmdir "$d/slot-$got"' % AT_ONCE)


class SlotAudit(Audit):
    def job(self, name):
        return ["--", "/bin/sh", "-c", SLOT_JOB, "job", str(self.root), name]


def queue_shared_jobs(harness, audit, names, env):
    """queue_jobs() for `gpulock run --mem 10G -- JOB`: each batch waits in the queue before the
    next is started. Returns {name: bg}."""
    return queue_jobs(harness, audit, names, env, request=("--mem", "10G"))


def test_drain_1000_shared_after_idling_at_no_cpu(gl):
    """One GPU held whole; N shared jobs of 10 GiB queue behind it. Over 10 s in which nothing
    happens, all the waiters together use (next to) no CPU. Then the holder ends: every job runs
    exactly once, never more than 8 at once, and nothing is left in the queue."""
    env, audit, holder, procs = jobs_behind_held_gpu(gl, N, SlotAudit, queue_shared_jobs)
    assert_idle(procs, "shared waiters")
    assert len(queue_doc(gl, env)["waiting"]) == N
    holder.kill_group()
    released = time.monotonic()
    assert_all_served(gl, env, audit, procs)
    print("%d shared jobs drained in %.1f s after the release" % (N, time.monotonic() - released))


def test_whole_gpu_request_behind_1000_shared_jobs_is_served(gl):
    """A whole-GPU request queued behind hundreds of shared jobs is served, and every shared
    job once, never more at once than fit and never beside the whole-GPU job (it takes no
    slot: any slot present while it runs is an overlap)."""
    count = min(N, 300)
    ensure_room_for(count)
    env = gl.env(fake="1")
    audit = SlotAudit(gl.tmp / "audit")
    holder, _ = gl.hold("-n", "1", env=env)
    procs = queue_shared_jobs(gl, audit, names_for(count), env)
    whole = gl.spawn("run", "--", "/bin/sh", "-c",
                     'ls -d "$1"/slot-* > "$1/beside-whole" 2>/dev/null; echo done > "$1/whole"',
                     "job", str(audit.root), env=env)
    whole.wait_for_stderr("waiting", timeout=HANG)
    holder.kill_group()
    assert whole.wait(timeout=REGISTER_HANG) == 0, whole.describe()
    assert_all_served(gl, env, audit, procs)
    assert (audit.root / "whole").exists()
    beside = (audit.root / "beside-whole").read_text().split()
    assert beside == [], "shared jobs ran beside the whole-GPU job: %s" % beside


def test_sigkill_of_shared_waiters_during_drain(gl):
    """As test_drain_1000_shared_after_idling_at_no_cpu, but while the queue drains, a tenth of the waiters are
    SIGKILLed at random, and again and again the oldest still waiting (the dispatchers). Every
    survivor is served exactly once, never more than fit at once, and no live ticket is left."""
    rng = random.Random(15)
    env, audit, holder, procs = jobs_behind_held_gpu(gl, N, SlotAudit, queue_shared_jobs)
    pending_random = rng.sample(list(procs), RANDOM_VICTIMS)
    victims, dispatchers_killed, released = kill_while_draining(gl, env, holder, procs, rng,
                                                                pending_random, 5)
    survivors = wait_survivors(gl, env, procs, victims)
    # A victim served just before its SIGKILL still runs its command: wait for those to end.
    wait_until(lambda: not any(p.name.startswith("slot-") for p in audit.root.iterdir()), HANG,
               what="the last victims' commands to end")
    assert audit.errors() == [], "more jobs at once than fit: %s" % audit.errors()[:20]
    assert_served_once(audit, survivors)
    _, live = live_tickets(gl)
    assert live == [], "tickets still locked after every waiter ended: %s" % live[:10]
    print("%d killed (%d dispatchers); %d survivors served in %.1f s"
          % (len(victims), dispatchers_killed, len(survivors), time.monotonic() - released))
