"""Waiting and signals: Ctrl-C (SIGINT sent to a waiting Python process) raises
KeyboardInterrupt and leaves nothing behind (no queue ticket, no GPU), whatever the SIGINT
handler raises is what the wait raises, a handler that does not raise lets the wait go on, and
the wait releases the GIL, so other threads of the process keep running."""

import os
import signal
import threading
import time

import gpulock
from conftest import EX_TEMPFAIL, HANG, wait_until

INTERRUPTIBLE = r'''
request = json.loads(sys.argv[2])
try:
    lease = gpulock.lease(**request)
    report("leased", lease_info(lease))
except KeyboardInterrupt:
    # Still alive: the test checks the queue and the locks while this process runs.
    me = os.getpid()
    report("interrupted", {
        "queued": [e.pid for e in gpulock.queue().waiting if e.pid == me],
        "holding": [g.display_index for g in gpulock.status().gpus
                    if g.holder is not None and g.holder.pid == me],
        "env": os.environ.get("CUDA_VISIBLE_DEVICES"),
    })
    wait_for("exit")
    sys.exit(42)
wait_for("exit")
'''


def test_sigint_while_waiting_raises_keyboard_interrupt_and_leaves_nothing(gl):
    holder, lease_id, _ = gl.hold("--gpus", "0")
    # GPU 1 is free and GPU 0 is not: all or nothing, the waiter must hold neither.
    child = gl.python(INTERRUPTIBLE, '{"gpus": "0,1", "label": "ctrl-c"}')
    entry = gl.wait_queued(child)
    assert entry["label"] == "ctrl-c"
    os.kill(child.pid, signal.SIGINT)
    seen = child.wait_json("interrupted")
    assert seen == {"queued": [], "holding": [], "env": None}
    # Seen from outside, while the interrupted process still runs.
    assert child.alive()
    assert gl.queue_entry(child.pid) is None
    assert gl.queue()["waiting"] == []
    assert gl.states() == {"0": "leased", "1": "free", "2": "free", "3": "free"}
    assert gl.gpu_status(0)["lease_id"] == lease_id
    assert gl.no_wait_run("1") == 0
    child.tell("exit")
    assert child.wait() == 42, child.describe()
    assert "KeyboardInterrupt" not in child.stderr()


# A child's SIGINT handler that raises an exception of its own (not a KeyboardInterrupt).
# Indented as the scripts it is put before, which gl.python() dedents.
STOP_ON_SIGINT = r'''
        import signal

        class Stop(Exception):
            pass

        def on_sigint(signum, frame):
            raise Stop("stopped by SIGINT")
'''


def test_sigint_handler_exception_is_what_the_wait_raises(gl):
    gl.hold("-n", "4")
    child = gl.python(STOP_ON_SIGINT + r'''

        signal.signal(signal.SIGINT, on_sigint)
        try:
            gpulock.lease(count=2)
        except Stop as e:
            report("stopped", {"message": str(e),
                               "queued": [q.pid for q in gpulock.queue().waiting]})
            sys.exit(5)
    ''')
    gl.wait_queued(child)
    os.kill(child.pid, signal.SIGINT)
    assert child.wait() == 5, child.describe()
    assert child.wait_json("stopped") == {"message": "stopped by SIGINT", "queued": []}


def test_sigint_during_the_progress_callback_still_ends_the_wait(gl):
    # The signal lands while the on_wait callback runs, so the handler runs inside it. Its
    # exception used to pass for a failing callback (a warning), and the wait went on for ever
    # with the signal spent.
    gl.hold("-n", "4")
    child = gl.python(STOP_ON_SIGINT + r'''

        def on_wait(progress):
            report("in-callback")
            time.sleep(1)

        signal.signal(signal.SIGINT, on_sigint)
        try:
            gpulock.lease(count=2, on_wait=on_wait)
        except Stop as e:
            report("stopped", {"message": str(e)})
            sys.exit(5)
    ''')
    child.wait_file("in-callback")
    os.kill(child.pid, signal.SIGINT)
    assert child.wait() == 5, child.describe()
    assert child.wait_json("stopped") == {"message": "stopped by SIGINT"}
    assert "on_wait callback failed" not in child.stderr()


def test_sigint_handler_that_returns_lets_the_wait_go_on(gl):
    holder, _, _ = gl.hold("--gpus", "2")
    child = gl.python(r'''
        import signal

        def on_sigint(signum, frame):
            report("sigint")

        signal.signal(signal.SIGINT, on_sigint)
        lease = gpulock.lease(gpus=2)
        report("leased", lease_info(lease))
        wait_for("exit")
    ''')
    gl.wait_queued(child)
    os.kill(child.pid, signal.SIGINT)
    child.wait_file("sigint")
    # The handler ran (inside the wait) and did not raise: still waiting.
    assert gl.queue_entry(child.pid) is not None
    assert not child.reported("leased")
    holder.kill_group()
    assert child.wait_json("leased")["indices"] == [2]
    child.tell("exit")
    assert child.wait() == 0, child.describe()


def test_sigint_during_timed_wait(gl):
    """A wait with a timeout is as interruptible as one without."""
    gl.hold("--gpus", "3")
    child = gl.python(INTERRUPTIBLE, '{"gpus": 3, "timeout": 3600}')
    gl.wait_queued(child)
    os.kill(child.pid, signal.SIGINT)
    assert child.wait_json("interrupted")["queued"] == []
    child.tell("exit")
    assert child.wait() == 42, child.describe()


def test_default_sigint_without_handler_ends_process_and_ticket(gl):
    """Ctrl-C not caught: the process ends with KeyboardInterrupt's traceback, and its ticket
    goes with it."""
    gl.hold("--gpus", "0")
    child = gl.python('gpulock.lease(gpus=0)\nreport("leased")\n')
    gl.wait_queued(child)
    os.kill(child.pid, signal.SIGINT)
    status = child.wait()
    assert status != 0 and status != EX_TEMPFAIL
    assert "KeyboardInterrupt" in child.stderr()
    assert gl.queue()["waiting"] == []


def test_waiting_releases_the_gil(gl):
    """While this thread waits for a held GPU, other threads run: one counts, another sees the
    wait in the queue and only then ends the holder. Were the GIL held, neither could run and
    the wait would time out."""
    holder, _, _ = gl.hold("--gpus", "0")
    me = os.getpid()
    stop = threading.Event()
    counter = [0]
    seen = {}
    problems = []

    def count():
        while not stop.is_set():
            counter[0] += 1
            time.sleep(0.001)

    def end_holder_once_queued():
        try:
            wait_until(lambda: gl.queue_entry(me), HANG, what="this process in the queue")
            seen["queued"] = counter[0]
            wait_until(lambda: counter[0] >= seen["queued"] + 20, HANG,
                       what="the counter to advance during the wait")
            seen["later"] = counter[0]
            seen["still_waiting"] = gl.queue_entry(me) is not None
            holder.kill_group()
        except BaseException as e:  # reported by the main thread
            problems.append(e)

    threads = [threading.Thread(target=count), threading.Thread(target=end_holder_once_queued)]
    for t in threads:
        t.start()
    try:
        with gpulock.lease(gpus=0, timeout=HANG) as lease:
            assert lease.indices == [0]
    finally:
        stop.set()
        for t in threads:
            t.join(HANG)
    assert problems == []
    assert seen["still_waiting"], "the lease was granted before the holder ended"
    assert seen["later"] >= seen["queued"] + 20


def test_sigint_while_on_wait_callback_runs_still_interrupts(gl):
    """Ctrl-C may come while the progress callback runs (it runs inside the wait, with the
    GIL): the KeyboardInterrupt raised there must end the wait, not be taken for a failed
    callback. Once the child's handler has run, the holder ends: a wait that went on would
    now be served."""
    holder, _, _ = gl.hold("--gpus", "1")
    child = gl.python(r'''
        import signal

        def on_sigint(signum, frame):
            report("sigint")
            raise KeyboardInterrupt

        def slow_progress(progress):
            report("in-callback")
            time.sleep(1000)  # Ctrl-C arrives here

        signal.signal(signal.SIGINT, on_sigint)
        try:
            gpulock.lease(gpus=1, on_wait=slow_progress)
            report("leased")
        except KeyboardInterrupt:
            report("interrupted", {"queued": [e.pid for e in gpulock.queue().waiting]})
            sys.exit(42)
    ''')
    child.wait_file("in-callback")
    os.kill(child.pid, signal.SIGINT)
    child.wait_file("sigint")
    holder.kill_group()
    assert child.wait() == 42, child.describe()
    assert not child.reported("leased")
    assert child.wait_json("interrupted") == {"queued": []}
    assert gl.queue()["waiting"] == []
