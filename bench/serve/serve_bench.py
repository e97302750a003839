#!/usr/bin/env python3
"""Benchmark of `gpulock serve` under many dashboard clients (issue 16: 200 concurrent
dashboards, /api/status p99 <= 20 ms).

A real `gpulock serve` on a free loopback port, simulated GPUs with some leases held, and
asyncio clients that each open a connection per request as the dashboard does (the server
closes connections after one request). Three phases, in one run:

  baseline   one client, requests back to back: the latency of one request on an idle server
  dashboards N clients, each polling /api/status and /api/queue every 2 s (the page's rhythm),
             started at random offsets within the first period
  saturated  N clients requesting /api/status back to back with no pause (a stress bound)

Prints p50/p90/p99/max of /api/status per phase and each phase's p99 as a ratio of the
baseline's. The client is Python: its own overhead is inside every figure (the server's share
is smaller, never larger).

  /usr/bin/python3 bench/serve/serve_bench.py --binary build/gpulock [--clients 200]
      [--gpus 8] [--seconds 20] [--json]
"""

import argparse
import asyncio
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time


def percentile(values, p):
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, int(round(p / 100.0 * len(ordered) + 0.5)) - 1))
    return ordered[index]


async def fetch(port, path):
    """One request on a fresh connection; returns (seconds, HTTP status)."""
    started = time.perf_counter()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(("GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
                  % path).encode())
    await writer.drain()
    data = await reader.read()
    writer.close()
    elapsed = time.perf_counter() - started
    status = int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/1.1 ") else 0
    return elapsed, status


async def baseline(port, count):
    latencies = []
    for _ in range(count):
        elapsed, status = await fetch(port, "/api/status")
        assert status == 200, status
        latencies.append(elapsed)
    return latencies


async def dashboards(port, clients, seconds, period=2.0):
    latencies, failures = [], 0
    deadline = time.perf_counter() + seconds

    async def one_dashboard():
        nonlocal failures
        await asyncio.sleep(random.uniform(0, period))
        while time.perf_counter() < deadline:
            began = time.perf_counter()
            try:
                (elapsed, status), _ = await asyncio.gather(fetch(port, "/api/status"),
                                                            fetch(port, "/api/queue"))
                if status == 200:
                    latencies.append(elapsed)
                else:
                    failures += 1
            except OSError:
                failures += 1
            await asyncio.sleep(max(0.0, period - (time.perf_counter() - began)))

    await asyncio.gather(*(one_dashboard() for _ in range(clients)))
    return latencies, failures


async def saturated(port, clients, seconds):
    latencies, failures = [], 0
    deadline = time.perf_counter() + seconds

    async def one_client():
        nonlocal failures
        while time.perf_counter() < deadline:
            try:
                elapsed, status = await fetch(port, "/api/status")
                if status == 200:
                    latencies.append(elapsed)
                else:
                    failures += 1
            except OSError:
                failures += 1

    started = time.perf_counter()
    await asyncio.gather(*(one_client() for _ in range(clients)))
    return latencies, failures, time.perf_counter() - started


def summary(latencies):
    ms = [x * 1000 for x in latencies]
    return {"requests": len(ms), "p50_ms": round(statistics.median(ms), 3),
            "p90_ms": round(percentile(ms, 90), 3), "p99_ms": round(percentile(ms, 99), 3),
            "max_ms": round(max(ms), 3)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--binary", default="build/gpulock")
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    # Many sockets at once: make sure the client may open them.
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, 4 * args.clients + 64)), hard))

    work = tempfile.mkdtemp(prefix="gpulock-serve-bench-")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULOCK_")}
    env.update(GPULOCK_FAKE_GPUS=str(args.gpus), GPULOCK_DIR=os.path.join(work, "locks"),
               GPULOCK_CONFIG="", XDG_STATE_HOME=os.path.join(work, "state"))
    children = []
    try:
        # Half the GPUs leased (each by its own `gpulock run`), so status has holders to show.
        for i in range(args.gpus // 2):
            children.append(subprocess.Popen(
                [args.binary, "run", "--gpus", str(i), "--label", "bench-%d" % i, "--",
                 "sleep", "100000"], env=env, stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True))
        server_err = open(os.path.join(work, "serve.err"), "w+")
        server = subprocess.Popen([args.binary, "serve", "--listen", "127.0.0.1:0"], env=env,
                                  stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                  stderr=server_err, start_new_session=True)
        children.append(server)
        port = None
        for _ in range(600):
            server_err.seek(0)
            found = re.search(r"listening on http://[^ ]*:(\d+)/", server_err.read())
            if found:
                port = int(found.group(1))
                break
            time.sleep(0.05)
        if port is None:
            sys.exit("gpulock serve did not start")
        time.sleep(1.5)  # the leases' holders have started; the cache has read them

        cli = []
        for _ in range(20):
            started = time.perf_counter()
            subprocess.run([args.binary, "status", "--json"], env=env, check=True,
                           stdout=subprocess.DEVNULL)
            cli.append(time.perf_counter() - started)

        base = asyncio.run(baseline(port, 500))
        load, load_failures = asyncio.run(dashboards(port, args.clients, args.seconds))
        stress, stress_failures, stress_seconds = asyncio.run(
            saturated(port, args.clients, args.seconds / 2))
        result = {
            "clients": args.clients, "gpus": args.gpus, "seconds": args.seconds,
            "cli_status_json": summary(cli),
            "baseline_one_client": summary(base),
            "dashboards": dict(summary(load), failures=load_failures),
            "saturated": dict(summary(stress), failures=stress_failures,
                              requests_per_second=round(len(stress) / stress_seconds)),
        }
        b99 = result["baseline_one_client"]["p99_ms"]
        result["dashboards"]["p99_vs_baseline"] = round(result["dashboards"]["p99_ms"] / b99, 2)
        result["saturated"]["p99_vs_baseline"] = round(result["saturated"]["p99_ms"] / b99, 2)
        if args.json:
            print(json.dumps(result, indent=2))
        else:
            print("%-22s %9s %9s %9s %9s %9s  %s" % ("phase", "requests", "p50 ms", "p90 ms",
                                                      "p99 ms", "max ms", "notes"))
            for name in ("cli_status_json", "baseline_one_client", "dashboards", "saturated"):
                r = result[name]
                notes = []
                if "p99_vs_baseline" in r:
                    notes.append("p99 = %.2fx baseline" % r["p99_vs_baseline"])
                if r.get("failures"):
                    notes.append("%d failed" % r["failures"])
                if "requests_per_second" in r:
                    notes.append("%d req/s" % r["requests_per_second"])
                print("%-22s %9d %9.2f %9.2f %9.2f %9.2f  %s" % (
                    name, r["requests"], r["p50_ms"], r["p90_ms"], r["p99_ms"], r["max_ms"],
                    ", ".join(notes)))
    finally:
        for child in children:
            try:
                os.killpg(child.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for child in children:
            child.wait(timeout=30)


if __name__ == "__main__":
    main()
