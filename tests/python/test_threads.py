"""Threads of one process: several threads lease and wait at once through the process's one
pool and never hold a GPU together (audited with locks of their own, independent of gpulock),
and views can be taken while another thread waits."""

import os
import random
import threading

import gpulock
from conftest import HANG, wait_until


def test_threads_lease_concurrently_without_sharing(gl):
    os.environ["GPULOCK_FAKE_GPUS"] = "3"
    audit = {i: threading.Lock() for i in range(3)}  # one per GPU: never contended
    overlaps, problems, served = [], [], []

    def worker(seed):
        rng = random.Random(seed)
        try:
            for _ in range(8):
                with gpulock.lease(count=rng.choice([1, 2]), set_env=False, timeout=HANG,
                                   on_wait=None) as lease:
                    taken = []
                    for i in lease.indices:
                        if audit[i].acquire(blocking=False):
                            taken.append(i)
                        else:
                            overlaps.append(i)
                    served.append(tuple(lease.indices))
                    for i in taken:
                        audit[i].release()
        except BaseException as e:
            problems.append(e)

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(HANG * 3)
    assert not any(t.is_alive() for t in threads), "a worker thread hung"
    assert problems == []
    assert overlaps == [], "a GPU was leased to two threads at once"
    assert len(served) == 5 * 8
    assert gl.states() == {"0": "free", "1": "free", "2": "free"}
    assert gl.queue()["waiting"] == []


def test_views_while_another_thread_waits(gl):
    holder, lease_id, _ = gl.hold("--gpus", "0")
    result = {}

    def wait_for_gpu():
        try:
            with gpulock.lease(gpus=0, set_env=False, timeout=HANG, on_wait=None) as lease:
                result["indices"] = lease.indices
        except BaseException as e:
            result["error"] = e

    thread = threading.Thread(target=wait_for_gpu)
    thread.start()
    try:
        me = os.getpid()
        entry = wait_until(lambda: [e for e in gpulock.queue().waiting if e.pid == me], HANG,
                           what="the waiting thread in gpulock.queue()")
        assert entry[0].gpus_requested == 1
        status = gpulock.status()
        assert status.queue_length == 1
        assert status.gpus[0].lease_id == lease_id
        assert len(gpulock.gpus()) == 4
        holder.kill_group()
    finally:
        thread.join(HANG)
    assert not thread.is_alive()
    assert result == {"indices": [0]}
