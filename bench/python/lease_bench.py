#!/usr/bin/env python3
"""What a lease costs from Python: `python3 -c "import gpulock; ..."` and in-process loops.

Measures, on simulated GPUs in a fresh scratch lock directory (GPULOCK_DIR, GPULOCK_FAKE_GPUS,
GPULOCK_CONFIG an empty file, so /etc plays no part):

  whole process  `python3 -c CODE` from spawn to exit, for CODE = `pass`, `import gpulock`,
                 `import gpulock; gpulock.lease().release()`, the `with gpulock.lease(): pass`
                 form, the gpulock.compat drop-in for gpu_lock, and the same for models of two
                 older tools (seed_models.py). The commands run interleaved, in a shuffled order
                 each round, so that load changes do not favour one. A lease's cost is the
                 difference of the medians of the command and of its import alone, shown with a
                 95 % bootstrap interval.
  in process     acquire + release of 1 GPU in a loop (perf_counter_ns around each iteration),
                 after a warm-up, for the same APIs plus the extension's own acquire (the floor
                 under the Python layer); each variant runs in several blocks, rotated.
                 (The seed models, part c of the issue's list, are rows of both tables.)
  hand-off       this process holds the only GPU; a Python process waits for it in
                 `gpulock.lease()` (or with set_env=False, or the extension's acquire), asleep;
                 this process releases. Time from just before `release()` here to just after
                 the call returns there (CLOCK_MONOTONIC, which is system-wide). Two series:
                 "warm", the same waiter process again and again, released 1 ms after it fell
                 asleep (the code path; the C++ handoff_bench releases as soon as its waiter is
                 asleep), and "fresh", a
                 new waiter process each time, released after it slept --asleep-ms (what a job
                 sees that starts, waits and is served).
  idle           64 Python processes wait in `gpulock.lease()` behind a held GPU for 10 s:
                 their CPU time (/proc/PID/schedstat) and wake-ups (voluntary context switches).
  Ctrl-C         a Python process waits in `gpulock.lease()` behind a held GPU, asleep for a
                 random 0.1-0.7 s (so that the signal lands anywhere in the wait's sleeps); this
                 process sends it SIGINT. Time from the kill() to the KeyboardInterrupt in the
                 waiter, and to the waiter's exit (waitpid), 20 times.

Needs only the standard library and gpulock itself (PYTHONPATH=<build>/python, or installed):

    PYTHONPATH=build-release/python /usr/bin/python3 bench/python/lease_bench.py
    ... --quick                 a few iterations of everything (a smoke test, seconds)
    ... --json results.json     also write the figures as JSON (`--json -`: JSON on stdout,
                                the table on stderr)
    ... --cxx-bench build-release/bench/acquire_release_bench   C++ reference, same machine

The results are described in docs/benchmarks.md ("The Python package (issue 4)").
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))

# ---------------------------------------------------------------------------------------------
# Statistics


def quantile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    position = (len(ordered) - 1) * q
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def summary(values: Sequence[float]) -> Dict[str, float]:
    return {
        "n": len(values),
        "min": min(values),
        "p50": quantile(values, 0.5),
        "p90": quantile(values, 0.9),
        "p99": quantile(values, 0.99),
        "max": max(values),
        "mean": statistics.fmean(values),
    }


def median_difference(
    a: Sequence[float], b: Sequence[float], rng: random.Random, resamples: int = 2000
) -> Dict[str, float]:
    """median(a) - median(b), with a 95 % percentile-bootstrap interval."""
    diffs = []
    for _ in range(resamples):
        ra = [a[rng.randrange(len(a))] for _ in a]
        rb = [b[rng.randrange(len(b))] for _ in b]
        diffs.append(statistics.median(ra) - statistics.median(rb))
    return {
        "diff": statistics.median(a) - statistics.median(b),
        "ci_low": quantile(diffs, 0.025),
        "ci_high": quantile(diffs, 0.975),
    }


# ---------------------------------------------------------------------------------------------
# The scratch machine: lock directories, an empty config, the seed models on the path


class Scratch:
    def __init__(self, gpus: int) -> None:
        self.root = tempfile.mkdtemp(prefix="gpulock-pybench-")
        self.gpus = gpus
        self.lock_dir = self._dir("locks")
        self.handoff_lock_dir = self._dir("handoff-locks")
        self.gpu_lock_dir = self._dir("var-tmp-gpu_locks")  # seed 000's /var/tmp/gpu_locks
        self.pid_lock_dir = os.path.join(self.root, ".gpu_locks")  # seed 002's ./.gpu_locks
        self.pylib = self._dir("pylib")
        self.config = os.path.join(self.root, "config.toml")
        open(self.config, "w").close()
        # Children import the models from here, so that their bytecode cache lands here too.
        shutil.copy(os.path.join(HERE, "seed_models.py"), self.pylib)
        self.stderr_file = os.path.join(self.root, "stderr.txt")

    def _dir(self, name: str) -> str:
        path = os.path.join(self.root, name)
        os.mkdir(path)
        return path

    def environment(self, lock_dir: str, gpus: int) -> Dict[str, str]:
        env = dict(os.environ)
        for name in ("CUDA_VISIBLE_DEVICES", "GPULOCK_LEASE_ID", "GPULOCK_NVML_LIBRARY"):
            env.pop(name, None)  # an enclosing lease or GPU list would change what is measured
        env["GPULOCK_DIR"] = lock_dir
        env["GPULOCK_FAKE_GPUS"] = str(gpus)
        env["GPULOCK_CONFIG"] = self.config
        path = [self.pylib] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        env["PYTHONPATH"] = os.pathsep.join(path)
        return env

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# a) Whole process


def run_once(argv: List[str], env: Dict[str, str], stderr_file: str) -> int:
    """Wall time of one process, posix_spawn to waitpid, in ns; stdout to /dev/null."""
    actions = [
        (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
        (os.POSIX_SPAWN_OPEN, 2, stderr_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600),
    ]
    start = time.perf_counter_ns()
    pid = os.posix_spawn(argv[0], argv, env, file_actions=actions)
    _, status = os.waitpid(pid, 0)
    elapsed = time.perf_counter_ns() - start
    if os.waitstatus_to_exitcode(status) != 0:
        with open(stderr_file) as f:
            raise RuntimeError(f"{argv!r} failed (status {status}):\n{f.read()}")
    return elapsed


def whole_process_commands(scratch: Scratch) -> List[Dict[str, Any]]:
    """Each command: key, label, code, and the key of the baseline its lease cost is taken
    against (the same imports without the lease)."""
    n = scratch.gpus
    return [
        {"key": "pass", "label": "python3 -c pass", "code": "pass", "baseline": None},
        {"key": "import", "label": "import gpulock", "code": "import gpulock",
         "baseline": "pass"},
        {"key": "lease", "label": "gpulock.lease().release()",
         "code": "import gpulock; gpulock.lease().release()", "baseline": "import"},
        {"key": "with", "label": "with gpulock.lease(): pass",
         "code": "import gpulock\nwith gpulock.lease(): pass", "baseline": "import"},
        {"key": "compat_import", "label": "from gpulock.compat import lock_gpu",
         "code": "from gpulock.compat import lock_gpu", "baseline": "pass"},
        {"key": "compat", "label": "with lock_gpu(): pass  (gpulock.compat)",
         "code": "from gpulock.compat import lock_gpu\nwith lock_gpu(): pass",
         "baseline": "compat_import"},
        {"key": "models_import", "label": "import seed_models  (models)",
         "code": "import seed_models", "baseline": "pass"},
        {"key": "model_000", "label": "model of gpu_lock (seed 000)",
         "code": "import seed_models\nwith seed_models.gpu_lock_model("
                 f"lock_dir={scratch.gpu_lock_dir!r}, gpu_count={n}): pass",
         "baseline": "models_import"},
        {"key": "model_002", "label": "model of PID files (seed 002)",
         "code": "import seed_models\nseed_models.pid_file_model("
                 f"lock_dir={scratch.pid_lock_dir!r}, gpu_count={n})",
         "baseline": "models_import"},
    ]


def bench_whole_process(
    scratch: Scratch, python: str, runs: int, warmup: int, rng: random.Random
) -> Dict[str, Any]:
    env = scratch.environment(scratch.lock_dir, scratch.gpus)
    commands = whole_process_commands(scratch)
    samples: Dict[str, List[int]] = {c["key"]: [] for c in commands}
    for round_ in range(warmup + runs):
        order = list(commands)
        rng.shuffle(order)
        for command in order:
            elapsed = run_once([python, "-c", command["code"]], env, scratch.stderr_file)
            if round_ >= warmup:
                samples[command["key"]].append(elapsed)
    # Every model released what it took (seed 002's through atexit).
    leftovers = os.listdir(scratch.gpu_lock_dir) + (
        os.listdir(scratch.pid_lock_dir) if os.path.isdir(scratch.pid_lock_dir) else [])
    if leftovers:
        raise RuntimeError(f"a model left lock files behind: {leftovers}")
    results = []
    for command in commands:
        ms = [ns / 1e6 for ns in samples[command["key"]]]
        row = {"key": command["key"], "label": command["label"], "code": command["code"],
               "baseline": command["baseline"], "ms": summary(ms)}
        if command["baseline"]:
            base = [ns / 1e6 for ns in samples[command["baseline"]]]
            row["added_ms"] = median_difference(ms, base, rng)
        results.append(row)
    return {"runs": runs, "warmup_rounds": warmup, "commands": results}


# ---------------------------------------------------------------------------------------------
# b) In process


def in_process_variants(scratch: Scratch) -> List[Tuple[str, str, Callable[[], None]]]:
    import gpulock
    import seed_models
    from gpulock import _pool
    from gpulock.compat import lock_gpu

    def lease_release() -> None:
        gpulock.lease().release()

    def with_lease() -> None:
        with gpulock.lease():
            pass

    def lease_no_env() -> None:
        gpulock.lease(set_env=False, on_wait=None).release()

    def compat() -> None:
        with lock_gpu():
            pass

    def native() -> None:
        _pool.default_pool().acquire(count=1).release()

    def model_000() -> None:
        with seed_models.gpu_lock_model(lock_dir=scratch.gpu_lock_dir, gpu_count=scratch.gpus):
            pass

    def model_002() -> None:
        claim = seed_models.pid_file_model(lock_dir=scratch.pid_lock_dir, gpu_count=scratch.gpus)
        assert claim is not None
        claim.release()

    return [
        ("lease", "gpulock.lease().release()", lease_release),
        ("with", "with gpulock.lease(): pass", with_lease),
        ("lease_no_env", "gpulock.lease(set_env=False, on_wait=None).release()", lease_no_env),
        ("compat", "with lock_gpu(): pass  (gpulock.compat)", compat),
        ("native", "_native.Pool.acquire(count=1).release()  (the extension alone)", native),
        ("model_000", "model of gpu_lock (seed 000)", model_000),
        ("model_002", "model of PID files (seed 002)", model_002),
    ]


def bench_in_process(scratch: Scratch, iterations: int, warmup: int, blocks: int) -> Dict[str, Any]:
    variants = in_process_variants(scratch)
    clock = time.perf_counter_ns
    samples: Dict[str, List[int]] = {key: [] for key, _, _ in variants}
    for _, _, fn in variants:
        for _ in range(warmup):
            fn()
    per_block = max(1, iterations // blocks)
    for block in range(blocks):
        # Rotate the order so that no variant always runs first or last.
        for key, _, fn in variants[block % len(variants):] + variants[:block % len(variants)]:
            out = samples[key]
            for _ in range(per_block):
                start = clock()
                fn()
                out.append(clock() - start)
    results = []
    for key, label, _ in variants:
        results.append({"key": key, "label": label,
                        "us": summary([ns / 1e3 for ns in samples[key]])})
    return {"iterations": per_block * blocks, "warmup": warmup, "blocks": blocks,
            "variants": results}


def cxx_reference(binary: str, gpus: int) -> Optional[Dict[str, Any]]:
    """acquire_release_bench's median for 1 GPU of `gpus`, run now on the same machine."""
    if gpus not in (1, 4, 8):
        return None  # acquire_release_bench has pools of 1, 4 and 8 GPUs
    pattern = f"^BM_AcquireRelease1/pool:{gpus}/"
    out = subprocess.run(
        [binary, f"--benchmark_filter={pattern}", "--benchmark_format=json"],
        check=True, capture_output=True, text=True).stdout
    report = json.loads(out)
    for entry in report["benchmarks"]:
        if entry.get("aggregate_name") == "median":
            scale = {"ns": 1e-3, "us": 1.0, "ms": 1e3}[entry["time_unit"]]
            return {"benchmark": entry["run_name"], "median_us": entry["real_time"] * scale,
                    "binary": binary}
    raise RuntimeError(f"no median in {binary}'s output")


# ---------------------------------------------------------------------------------------------
# d) Hand-off to a waiting Python process

# A waiter process: on "go" it waits for the GPU the bench holds, with the API its argument
# names, and reports the time its call returned. "W" (from the wait's progress callback, which
# runs when the wait starts and when what blocks it changes) tells the bench it is waiting.
WAITER = r"""
import os, sys, time, gpulock
from gpulock import _pool
variant = sys.argv[1]
def waiting(progress):
    os.write(1, b"W\n")
while sys.stdin.readline().strip() == "go":
    if variant == "native":
        lease = _pool.default_pool().acquire(count=1, on_progress=waiting)
    else:
        lease = gpulock.lease(on_wait=waiting, set_env=(variant == "lease"))
    acquired = time.monotonic_ns()
    lease.release()
    os.write(1, b"T %d\n" % acquired)
"""

HANDOFF_VARIANTS = [
    ("lease", "gpulock.lease()"),
    ("lease_no_env", "gpulock.lease(set_env=False)"),
    ("native", "_native.Pool.acquire()  (the extension alone)"),
]


class LineReader:
    def __init__(self, fd: int, timeout_s: float) -> None:
        self.fd = fd
        self.timeout_s = timeout_s
        self.buffer = b""

    def line(self) -> str:
        deadline = time.monotonic() + self.timeout_s
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.fd], [], [], left)[0]:
                raise RuntimeError("a waiter process did not answer in time")
            chunk = os.read(self.fd, 4096)
            if not chunk:
                raise RuntimeError("a waiter process ended")
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line.decode()


def process_state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def wait_until_asleep(pid: int, asleep_ms: float) -> None:
    """Until the process has been asleep (S) for asleep_ms: seen asleep twice, 1 ms apart
    (inside its wait, not on its way there), then left alone for the rest of the time."""
    seen = 0
    first_seen = 0.0
    while seen < 2:
        if process_state(pid) == "S":
            seen += 1
            first_seen = first_seen or time.monotonic()
        else:
            seen, first_seen = 0, 0.0
        time.sleep(0.001 if seen else 0.0001)
    left = first_seen + asleep_ms / 1e3 - time.monotonic()
    if left > 0:
        time.sleep(left)


class ScratchPool:
    """Points this process's default pool at another scratch lock directory for a while."""

    def __init__(self, lock_dir: str, gpus: int) -> None:
        self.values = {"GPULOCK_DIR": lock_dir, "GPULOCK_FAKE_GPUS": str(gpus)}

    def __enter__(self) -> "ScratchPool":
        self.saved = {name: os.environ.get(name) for name in self.values}
        os.environ.update(self.values)
        return self

    def __exit__(self, *exc_info: object) -> None:
        for name, value in self.saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def start_waiter(python: str, env: Dict[str, str], key: str) -> Tuple[subprocess.Popen, LineReader]:
    process = subprocess.Popen([python, "-c", WAITER, key], env=env, stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE)
    assert process.stdout is not None
    return process, LineReader(process.stdout.fileno(), timeout_s=30)


def hand_off(holder: Any, process: subprocess.Popen, reader: LineReader, asleep_ms: float,
             last: bool = False) -> float:
    """Lets the waiter wait, releases `holder` once it has slept asleep_ms, and returns the
    time until its call returned, in µs. With `last`, the waiter then ends."""
    assert process.stdin is not None
    process.stdin.write(b"go\n")
    if last:
        process.stdin.close()
    else:
        process.stdin.flush()
    while reader.line() != "W":
        pass
    wait_until_asleep(process.pid, asleep_ms)
    released = time.monotonic_ns()
    holder.release()
    line = reader.line()
    while not line.startswith("T "):
        line = reader.line()
    return (int(line[2:]) - released) / 1e3


def bench_handoff(
    scratch: Scratch, python: str, handoffs: int, asleep_ms: float
) -> Dict[str, Any]:
    """Two series, the variants taking turns in each, so that load changes affect all alike;
    only one process waits at a time.
      warm:  one waiter process per variant, served again and again, released 1 ms after it
             fell asleep: the code path.
      fresh: a new waiter process for every hand-off, released asleep_ms after it fell asleep:
             what a job sees that starts, waits for a GPU, and gets it."""
    import gpulock

    env = scratch.environment(scratch.handoff_lock_dir, 1)
    keys = [key for key, _ in HANDOFF_VARIANTS]
    warm: Dict[str, List[float]] = {key: [] for key in keys}
    fresh: Dict[str, List[float]] = {key: [] for key in keys}
    with ScratchPool(scratch.handoff_lock_dir, 1):
        waiters = {}
        try:
            for key in keys:
                waiters[key] = start_waiter(python, env, key)
            holder = gpulock.lease(set_env=False, on_wait=None)
            for round_ in range(handoffs + 1):  # the first round is a warm-up
                for key in keys:
                    latency = hand_off(holder, *waiters[key], asleep_ms=1)
                    if round_ > 0:
                        warm[key].append(latency)
                    holder = gpulock.lease(set_env=False, on_wait=None)  # the waiter released
        finally:
            for process, _ in waiters.values():
                if process.stdin is not None and not process.stdin.closed:
                    process.stdin.close()
                process.wait(timeout=30)
        for round_ in range(handoffs):
            for key in keys[round_ % len(keys):] + keys[:round_ % len(keys)]:
                process, reader = start_waiter(python, env, key)
                try:
                    fresh[key].append(hand_off(holder, process, reader, asleep_ms, last=True))
                finally:
                    process.wait(timeout=30)
                holder = gpulock.lease(set_env=False, on_wait=None)
        holder.release()
    labels = dict(HANDOFF_VARIANTS)

    def rows(samples: Dict[str, List[float]], series: str, ms: float) -> List[Dict[str, Any]]:
        return [{"key": key, "label": labels[key], "series": series, "asleep_ms": ms,
                 "us": summary(samples[key]),
                 "over_1ms": sum(1 for x in samples[key] if x > 1000)} for key in keys]

    return {"handoffs": handoffs,
            "variants": rows(warm, "warm", 1) + rows(fresh, "fresh", asleep_ms)}


# ---------------------------------------------------------------------------------------------
# e) Idle waiting Python processes


def scheduler_counters(pid: int) -> Tuple[int, int]:
    """(run time in ns, voluntary context switches) of a process so far."""
    with open(f"/proc/{pid}/schedstat") as f:
        run_ns = int(f.read().split()[0])
    with open(f"/proc/{pid}/status") as f:
        switches = next(int(line.split()[1]) for line in f
                        if line.startswith("voluntary_ctxt_switches"))
    return run_ns, switches


def bench_idle(scratch: Scratch, python: str, waiters: int, seconds: float) -> Dict[str, Any]:
    """`waiters` Python processes wait in gpulock.lease() behind a GPU this process holds;
    their CPU time and wake-ups over `seconds`, with nothing changing."""
    import gpulock

    lock_dir = os.path.join(scratch.root, "idle-locks")
    os.mkdir(lock_dir)
    env = scratch.environment(lock_dir, 1)
    code = ("import os, gpulock\n"
            "gpulock.lease(on_wait=lambda progress: os.write(1, b'W\\n')).release()")
    read_end, write_end = os.pipe()
    processes: List[subprocess.Popen] = []
    with ScratchPool(lock_dir, 1):
        holder = gpulock.lease(set_env=False, on_wait=None)
        try:
            for _ in range(waiters):
                processes.append(subprocess.Popen([python, "-c", code], env=env, stdout=write_end))
            reader = LineReader(read_end, timeout_s=60)
            for _ in range(waiters):
                while reader.line() != "W":
                    pass
            time.sleep(1.0)  # let the queue settle
            before = [scheduler_counters(p.pid) for p in processes]
            time.sleep(seconds)
            after = [scheduler_counters(p.pid) for p in processes]
        finally:
            holder.release()
            for process in processes:
                process.wait(timeout=60)
            os.close(read_end)
            os.close(write_end)
    run_s = [(a[0] - b[0]) / 1e9 for a, b in zip(after, before)]
    wakeups = [a[1] - b[1] for a, b in zip(after, before)]
    return {"waiters": waiters, "seconds": seconds, "cpu_s_total": sum(run_s),
            "cpu_ms_per_waiter": summary([x * 1e3 for x in run_s]),
            "wakeups_total": sum(wakeups), "wakeups_per_waiter": summary(wakeups)}


# ---------------------------------------------------------------------------------------------
# f) Ctrl-C: how soon a waiting Python process stops


SIGINT_WAITER = r"""
import os, time, gpulock
try:
    gpulock.lease(on_wait=lambda progress: os.write(1, b"W\n")).release()
except KeyboardInterrupt:
    os.write(1, b"K %d\n" % time.monotonic_ns())
    raise
os.write(1, b"served\n")
"""


def default_sigint() -> None:
    # A child inherits an ignored SIGINT (e.g. when this script runs in the background of a
    # shell), and Python then installs no KeyboardInterrupt handler: give it the default.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def bench_sigint(scratch: Scratch, python: str, count: int, rng: random.Random) -> Dict[str, Any]:
    """A Python process waits in gpulock.lease() behind the GPU this process holds; after it
    slept a random 0.1-0.7 s it gets SIGINT. Time to its KeyboardInterrupt and to its exit."""
    import gpulock

    lock_dir = os.path.join(scratch.root, "sigint-locks")
    os.mkdir(lock_dir)
    env = scratch.environment(lock_dir, 1)
    to_interrupt: List[float] = []
    to_exit: List[float] = []
    left_in_queue = 0
    with ScratchPool(lock_dir, 1):
        holder = gpulock.lease(set_env=False, on_wait=None)
        try:
            for _ in range(count):
                process = subprocess.Popen(
                    [python, "-c", SIGINT_WAITER], env=env, stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL, preexec_fn=default_sigint)
                try:
                    assert process.stdout is not None
                    reader = LineReader(process.stdout.fileno(), timeout_s=30)
                    while reader.line() != "W":
                        pass
                    wait_until_asleep(process.pid, rng.uniform(100, 700))
                    # Popen.wait() with a timeout polls, sleeping up to 50 ms at a time: wait
                    # without one (waitpid), and let a timer kill a waiter that ignores SIGINT.
                    timer = threading.Timer(30, process.kill)
                    timer.start()
                    sent = time.monotonic_ns()
                    os.kill(process.pid, signal.SIGINT)
                    process.wait()
                    exited = time.monotonic_ns()
                    timer.cancel()
                    if process.returncode != -signal.SIGINT:
                        raise RuntimeError(f"the waiter did not die of SIGINT (status "
                                           f"{process.returncode}; -9: killed after 30 s)")
                    line = reader.line()
                    if not line.startswith("K "):
                        raise RuntimeError(f"the waiter said {line!r}, not KeyboardInterrupt")
                    to_interrupt.append((int(line[2:]) - sent) / 1e6)
                    to_exit.append((exited - sent) / 1e6)
                    left_in_queue += len(gpulock.queue().waiting)
                finally:
                    if process.poll() is None:
                        process.kill()
                        process.wait()
                    if process.stdout is not None:
                        process.stdout.close()
        finally:
            holder.release()
    return {"count": count, "to_interrupt_ms": summary(to_interrupt),
            "to_exit_ms": summary(to_exit), "left_in_queue": left_in_queue}


# ---------------------------------------------------------------------------------------------
# Report


def machine() -> Dict[str, Any]:
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f
                        if line.startswith("model name")), "")
    except OSError:
        pass
    return {"cpu": cpu, "cpus": os.cpu_count(), "kernel": platform.release(),
            "python": sys.version.split()[0]}


def print_report(r: Dict[str, Any], out: Any) -> None:
    def p(text: str = "") -> None:
        print(text, file=out)

    m = r["machine"]
    p(f"gpulock {r['gpulock_version']} from {r['gpulock_path']}")
    p(f"python {m['python']} ({r['python']}), {m['cpus']} CPUs ({m['cpu']}), Linux {m['kernel']}")
    p(f"simulated GPUs: {r['gpus']}, lock directory under {r['scratch_parent']}; "
      f"load average {r['load_before'][0]:.2f} before, {r['load_after'][0]:.2f} after")

    if "whole_process" in r:
        w = r["whole_process"]
        p()
        p(f"a) Whole process: python3 -c CODE, spawn to exit, {w['runs']} runs each "
          f"(after {w['warmup_rounds']} warm-up rounds), interleaved")
        p(f"{'CODE':<42} {'p50 ms':>8} {'p90 ms':>8} {'min ms':>8}   "
          f"{'added (Δ p50) ms':>16} {'95% interval':>16}  over")
        for c in w["commands"]:
            s = c["ms"]
            line = f"{c['label']:<42} {s['p50']:8.2f} {s['p90']:8.2f} {s['min']:8.2f}"
            if "added_ms" in c:
                a = c["added_ms"]
                line += (f"   {a['diff']:16.2f} {a['ci_low']:7.2f} … {a['ci_high']:6.2f}"
                         f"  {c['baseline']}")
            p(line)

    if "in_process" in r:
        b = r["in_process"]
        p()
        p(f"b) In process: acquire + release of 1 GPU, {b['iterations']} iterations each "
          f"(after {b['warmup']}), in {b['blocks']} blocks")
        p(f"{'API':<64} {'p50 µs':>8} {'p90 µs':>8} {'p99 µs':>8} {'max µs':>9}")
        for v in b["variants"]:
            s = v["us"]
            p(f"{v['label']:<64} {s['p50']:8.1f} {s['p90']:8.1f} {s['p99']:8.1f} {s['max']:9.0f}")
        if r.get("cxx"):
            c = r["cxx"]
            p(f"{'C++ ' + c['benchmark'] + ' (median of 10 repetitions)':<64} "
              f"{c['median_us']:8.1f}")

    if "handoff" in r:
        h = r["handoff"]
        p()
        p(f"d) Hand-off: this process releases the only GPU; a Python process asleep in the call "
          f"below returns ({h['handoffs']} hand-offs each, interleaved)")
        p("   warm: the same waiter process each time, released 1 ms after it fell asleep;")
        p("   fresh: a new waiter process each time, released after it slept the time shown")
        p(f"{'waiting call':<48} {'series':>12} {'p50 µs':>8} {'p90 µs':>8} {'p99 µs':>8} "
          f"{'max µs':>9}  > 1 ms")
        for v in h["variants"]:
            s = v["us"]
            series = v["series"] if v["series"] == "warm" else f"fresh, {v['asleep_ms']:g} ms"
            p(f"{v['label']:<48} {series:>12} {s['p50']:8.0f} {s['p90']:8.0f} "
              f"{s['p99']:8.0f} {s['max']:9.0f}  {v['over_1ms']}")

    if "idle" in r:
        i = r["idle"]
        c = i["cpu_ms_per_waiter"]
        w = i["wakeups_per_waiter"]
        p()
        p(f"e) Idle: {i['waiters']} Python processes waiting in gpulock.lease() for "
          f"{i['seconds']:g} s, nothing changing")
        p(f"   CPU (scheduler run time) {i['cpu_s_total']:.3f} s in total; per process "
          f"p50 {c['p50']:.2f} ms, max {c['max']:.2f} ms")
        p(f"   wake-ups (voluntary context switches) {i['wakeups_total']} in total; per process "
          f"p50 {w['p50']:.0f}, max {w['max']:.0f}")


    if "sigint" in r:
        k = r["sigint"]
        p()
        p(f"f) Ctrl-C: SIGINT to a Python process asleep in gpulock.lease() "
          f"({k['count']} times)")
        p(f"{'from kill() to':<48} {'p50 ms':>8} {'p90 ms':>8} {'max ms':>8}")
        for key, label in (("to_interrupt_ms", "KeyboardInterrupt in the waiter"),
                           ("to_exit_ms", "the waiter's exit (waitpid)")):
            s = k[key]
            p(f"{label:<48} {s['p50']:8.2f} {s['p90']:8.2f} {s['max']:8.2f}")
        p(f"   tickets left in the queue afterwards: {k['left_in_queue']}")


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="a few iterations of everything: checks that the script runs")
    parser.add_argument("--runs", type=int, help="whole-process runs per command (default 50)")
    parser.add_argument("--iterations", type=int,
                        help="in-process iterations per variant (default 2000)")
    parser.add_argument("--handoffs", type=int,
                        help="hand-offs per waiting call and series (default 100)")
    parser.add_argument("--asleep-ms", type=float, default=100,
                        help="how long a fresh waiter sleeps before the release (default 100)")
    parser.add_argument("--idle-waiters", type=int, help="idle waiting processes (default 64)")
    parser.add_argument("--idle-seconds", type=float, help="idle measurement (default 10)")
    parser.add_argument("--sigints", type=int, help="Ctrl-C measurements (default 20)")
    parser.add_argument("--gpus", type=int, default=4, help="simulated GPUs (default 4)")
    parser.add_argument("--only", choices=["process", "loop", "handoff", "idle", "sigint"],
                        action="append",
                        help="run only these parts (repeatable)")
    parser.add_argument("--python", default=sys.executable,
                        help="interpreter for the child processes (default: this one)")
    parser.add_argument("--cxx-bench", metavar="PATH",
                        help="also run this acquire_release_bench for the C++ figure")
    parser.add_argument("--seed", type=int, default=1, help="seed for orders and the bootstrap")
    parser.add_argument("--json", metavar="PATH",
                        help="write the results as JSON to PATH ('-': stdout, table to stderr)")
    args = parser.parse_args(argv)

    runs = args.runs or (3 if args.quick else 50)
    iterations = args.iterations or (70 if args.quick else 2000)
    handoffs = args.handoffs or (3 if args.quick else 100)
    idle_waiters = args.idle_waiters or (4 if args.quick else 64)
    idle_seconds = args.idle_seconds or (1.0 if args.quick else 10.0)
    sigints = args.sigints or (3 if args.quick else 20)
    parts = set(args.only or ["process", "loop", "handoff", "idle", "sigint"])
    rng = random.Random(args.seed)

    scratch = Scratch(args.gpus)
    # This process leases too (in-process loops, the hand-off's holder): same scratch machine.
    os.environ.update({k: v for k, v in scratch.environment(scratch.lock_dir, args.gpus).items()
                       if k.startswith("GPULOCK_")})
    for name in ("CUDA_VISIBLE_DEVICES", "GPULOCK_LEASE_ID", "GPULOCK_NVML_LIBRARY"):
        os.environ.pop(name, None)
    sys.path.insert(0, scratch.pylib)
    try:
        import gpulock
    except ImportError as error:
        sys.exit(f"lease_bench: cannot import gpulock ({error}); set PYTHONPATH to a build's "
                 "python/ directory (e.g. build-release/python) or install the package")

    report: Dict[str, Any] = {
        "gpulock_version": gpulock.__version__,
        "gpulock_path": os.path.dirname(gpulock.__file__),
        "python": args.python,
        "machine": machine(),
        "gpus": args.gpus,
        "scratch_parent": os.path.dirname(scratch.root),
        "quick": args.quick,
        "load_before": list(os.getloadavg()),
    }
    try:
        if "process" in parts:
            report["whole_process"] = bench_whole_process(
                scratch, args.python, runs, 1 if args.quick else 3, rng)
        if "loop" in parts:
            report["in_process"] = bench_in_process(
                scratch, iterations, 10 if args.quick else 200, 7 if args.quick else 10)
            if args.cxx_bench:
                report["cxx"] = cxx_reference(args.cxx_bench, args.gpus)
        if "handoff" in parts:
            report["handoff"] = bench_handoff(scratch, args.python, handoffs, args.asleep_ms)
        if "idle" in parts:
            report["idle"] = bench_idle(scratch, args.python, idle_waiters, idle_seconds)
        if "sigint" in parts:
            report["sigint"] = bench_sigint(scratch, args.python, sigints, rng)
    finally:
        scratch.remove()
    report["load_after"] = list(os.getloadavg())

    print_report(report, sys.stderr if args.json == "-" else sys.stdout)
    if args.json:
        text = json.dumps(report, indent=2)
        if args.json == "-":
            print(text)
        else:
            with open(args.json, "w") as f:
                f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
