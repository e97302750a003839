#!/usr/bin/env python3
"""check_real_gpu: gpulock against a real NVIDIA driver, checked from the outside.

Not part of the test suite (CI has no GPU): run it by hand on a machine with an NVIDIA GPU and
its driver, as a user who may run CUDA programs. What gpulock reports is compared with what
`nvidia-smi` and CUDA itself (tests/gpu/cuda_context.c, built here with the C compiler) report,
and real CUDA processes stand in for jobs, foreign users' processes and intruders.

    tests/gpu/check_real_gpu.py [--gpulock build/gpulock] [--cuda-context PATH] [--out DIR]
                                [--redis-server /usr/bin/redis-server]

It uses a scratch lock directory (GPULOCK_DIR) and no config file, so it leaves the machine's
leases alone. Each check prints PASS or FAIL with what it saw; the exit status is the number of
failures (0: all passed). With --out, every raw document it read is kept there.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
failures: list[str] = []


def report(ok: bool, name: str, detail: str = "") -> bool:
    print(f"{'PASS' if ok else 'FAIL'}  {name}" + (f": {detail}" if detail else ""), flush=True)
    if not ok:
        failures.append(name)
    return ok


class Checker:
    def __init__(self, gpulock: str, cuda_context: str, out: Path | None):
        self.gpulock = gpulock
        self.cuda_context = cuda_context
        self.out = out
        self.lock_dir = tempfile.mkdtemp(prefix="gpulock-real-gpu-")
        os.chmod(self.lock_dir, 0o1777)  # as gpulock wants a shared lock directory
        self.env = dict(os.environ)
        for name in (
            "GPULOCK_FAKE_GPUS",
            "GPULOCK_BACKEND",
            "GPULOCK_POOL",
            "CUDA_VISIBLE_DEVICES",
        ):
            self.env.pop(name, None)
        self.env["GPULOCK_DIR"] = self.lock_dir
        self.env["GPULOCK_CONFIG"] = os.path.join(self.lock_dir, "empty-config.toml")
        Path(self.env["GPULOCK_CONFIG"]).write_text("")
        self.env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        self.background: list[subprocess.Popen] = []

    def keep(self, name: str, text: str) -> None:
        if self.out:
            (self.out / name).write_text(text)

    def cli(
        self, *args: str, env: dict | None = None, timeout: float = 60
    ) -> subprocess.CompletedProcess:
        return subprocess.run(
            [self.gpulock, *args],
            env=env or self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def json_of(self, name: str, *args: str) -> dict:
        result = self.cli(*args, "--json")
        self.keep(name, result.stdout + result.stderr)
        if result.returncode != 0:
            raise RuntimeError(
                f"gpulock {' '.join(args)} --json exited {result.returncode}: {result.stderr}"
            )
        return json.loads(result.stdout)

    def start_cuda(
        self,
        ordinal: int,
        mib: int,
        seconds: int,
        prefix: list[str] | None = None,
        env: dict | None = None,
        required: bool = True,
    ) -> tuple[subprocess.Popen, int | None]:
        """A CUDA process holding MIB MiB, started behind `prefix` (e.g. `gpulock run ... --`);
        returns it and the pid of the CUDA process itself once it holds the memory. If it never
        does: an error if `required`, else None for the pid."""
        command = (prefix or []) + [self.cuda_context, str(ordinal), str(mib), str(seconds)]
        process = subprocess.Popen(
            command,
            env=env or self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self.background.append(process)
        for line in process.stdout:
            if line.startswith("ready "):
                return process, int(line.split()[1])
        if required:
            raise RuntimeError(f"{command} never became ready: {process.stderr.read()}")
        return process, None

    def stop(self, process: subprocess.Popen) -> None:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=30)

    def wait_for(self, predicate, seconds: float = 10.0):
        deadline = time.monotonic() + seconds
        while True:
            value = predicate()
            if value or time.monotonic() > deadline:
                return value
            time.sleep(0.2)

    def smi_gpus(self) -> list[dict]:
        if not shutil.which("nvidia-smi"):
            return []
        text = subprocess.run(
            [
                "nvidia-smi",
                "--query-gpu=index,uuid,pci.bus_id,memory.total,name",
                "--format=csv,noheader,nounits",
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        self.keep("nvidia-smi-gpus.csv", text)
        rows = []
        for line in text.strip().splitlines():
            index, uuid, bus, total, name = [field.strip() for field in line.split(",", 4)]
            rows.append(
                {
                    "index": int(index),
                    "uuid": uuid,
                    "pci_bus_id": bus,
                    "memory_total_mib": int(total),
                    "name": name,
                }
            )
        return rows

    def cuda_view(self, env: dict) -> list[str]:
        text = subprocess.run(
            [self.cuda_context], env=env, capture_output=True, text=True, check=True
        ).stdout
        return [line.split()[2] for line in text.splitlines() if line.startswith("device ")]

    # ---- the checks ----------------------------------------------------------------------

    def discovery(self) -> list[dict]:
        inventory = self.json_of("gpus.json", "gpus")
        gpus = [g for g in inventory["gpus"] if g.get("mig_index") is None]
        report(
            inventory.get("simulated") is False,
            "gpus: real devices, not simulated",
            inventory.get("device_source", ""),
        )
        smi = self.smi_gpus()
        if smi:
            report(
                [g["uuid"] for g in gpus] == [s["uuid"] for s in smi],
                "gpus: UUIDs in NVML index order equal nvidia-smi's",
                f"{[g['uuid'] for g in gpus]} vs {[s['uuid'] for s in smi]}",
            )
            for g, s in zip(gpus, smi):
                report(
                    g["pci_bus_id"].lower() == s["pci_bus_id"].lower(),
                    f"gpus: GPU {g['index']} bus id",
                    f"{g['pci_bus_id']} vs {s['pci_bus_id']}",
                )
                ours = (g["memory_total_bytes"] or 0) >> 20
                report(
                    abs(ours - s["memory_total_mib"]) <= 1,
                    f"gpus: GPU {g['index']} memory total",
                    f"{ours} MiB vs {s['memory_total_mib']} MiB",
                )
                report(
                    g["name"] == s["name"],
                    f"gpus: GPU {g['index']} name",
                    f"{g['name']!r} vs {s['name']!r}",
                )
        cuda = self.cuda_view(self.env)
        report(
            sorted(cuda) == sorted(g["uuid"] for g in gpus) and cuda == [g["uuid"] for g in gpus],
            "CUDA (PCI_BUS_ID order) sees the same GPUs in the same order",
            f"{cuda}",
        )
        return gpus

    def run_exports(self, gpus: list[dict]) -> None:
        for visible in ("index", "uuid"):
            result = self.cli(
                "run",
                "-n",
                "1",
                "--visible",
                visible,
                "--",
                "sh",
                "-c",
                'echo "$CUDA_VISIBLE_DEVICES|$GPULOCK_GPUS|$CUDA_DEVICE_ORDER"; '
                f"{self.cuda_context}; ls -l /proc/$$/fd",
            )
            self.keep(f"run-visible-{visible}.txt", result.stdout + result.stderr)
            if not report(
                result.returncode == 0, f"run --visible {visible}: exit 0", result.stderr.strip()
            ):
                continue
            lines = result.stdout.splitlines()
            visible_devices, leased, order = lines[0].split("|")
            seen = [line.split()[2] for line in lines if line.startswith("device ")]
            report(
                seen == [leased],
                f"run --visible {visible}: CUDA sees exactly the leased GPU",
                f"CUDA_VISIBLE_DEVICES={visible_devices} GPULOCK_GPUS={leased} CUDA saw {seen}",
            )
            if visible == "index":
                index = next((g["index"] for g in gpus if g["uuid"] == leased), None)
                report(
                    visible_devices == str(index) and order == "PCI_BUS_ID",
                    "run --visible index: the NVML index with CUDA_DEVICE_ORDER=PCI_BUS_ID",
                    f"{visible_devices} {order}",
                )
            leaked = [line for line in lines if "/dev/nvidia" in line]
            report(
                not leaked,
                f"run --visible {visible}: no /dev/nvidia* descriptor passed to the command",
                "; ".join(leaked),
            )

    def foreign_process(self, gpu: dict) -> None:
        env = dict(self.env, CUDA_VISIBLE_DEVICES=gpu["uuid"])
        process, pid = self.start_cuda(0, 1024, 120, env=env)
        try:

            def listed():
                gpus = self.json_of("gpus-with-foreign.json", "gpus")["gpus"]
                mine = next(g for g in gpus if g["uuid"] == gpu["uuid"])
                return [p for p in mine["processes"] if p["pid"] == pid]

            found = self.wait_for(listed)
            report(
                bool(found),
                "gpus: a CUDA process is listed on its GPU with its host pid",
                f"pid {pid}: {found or 'not listed'}",
            )
            if found:
                used = found[0]["used_memory_bytes"]
                report(
                    used is not None and used >= 1 << 30,
                    "gpus: its memory (>= 1 GiB allocated)",
                    f"{used}",
                )
            result = self.cli("run", "--gpus", str(gpu["index"]), "--no-wait", "--", "true")
            report(
                result.returncode == 75,
                "run --no-wait on a GPU with a foreign process: exit 75",
                f"{result.returncode} {result.stderr.strip()[:200]}",
            )
            result = self.cli(
                "run", "--gpus", str(gpu["index"]), "--no-wait", "--allow-foreign", "--", "true"
            )
            report(
                result.returncode == 0,
                "run --allow-foreign on it: exit 0",
                f"{result.returncode} {result.stderr.strip()[:200]}",
            )
            status = self.json_of("status-busy.json", "status")
            state = next(g for g in status["gpus"] if g["uuid"] == gpu["uuid"])
            report(state["state"] == "busy", "status: the GPU is busy", state["state"])
            procs = [p for p in state["processes"] if p["pid"] == pid]
            report(
                bool(procs) and procs[0].get("foreign") is True and procs[0].get("user"),
                "status: the process is foreign and has its user",
                f"{procs}",
            )
        finally:
            self.stop(process)

    def intruder_and_member(self, gpu: dict) -> None:
        holder, member = self.start_cuda(
            0,
            512,
            60,
            prefix=[self.gpulock, "run", "--gpus", str(gpu["index"]), "--"],
            required=False,
        )
        try:
            if not report(
                member is not None,
                "run: a CUDA command starts inside a lease",
                holder.stderr.read() if member is None else "",
            ):
                return

            def member_listed():
                status = self.json_of("status-member.json", "status")
                state = next(g for g in status["gpus"] if g["uuid"] == gpu["uuid"])
                procs = [p for p in state["processes"] if p["pid"] == member]
                return (status, state, procs) if procs else None

            status, state, procs = self.wait_for(member_listed) or (
                self.json_of("status-member.json", "status"),
                {"state": "?"},
                [],
            )
            report(
                state["state"] == "leased" and bool(procs) and procs[0].get("foreign") is False,
                "status: the lease's own CUDA process is not foreign",
                f"{state['state']} {procs}",
            )
            report(
                not status.get("intruders"),
                "status: no intruder while only the job uses the GPU",
                f"{status.get('intruders')}",
            )
            env = dict(self.env, CUDA_VISIBLE_DEVICES=gpu["uuid"])
            intruder, pid = self.start_cuda(0, 256, 60, env=env)
            try:

                def intruders():
                    listed = self.json_of("status-intruder.json", "status").get("intruders") or []
                    return [i for i in listed if i["pid"] == pid]

                found = self.wait_for(intruders)
                report(
                    bool(found),
                    "status: a CUDA process started outside the lease is an intruder",
                    f"pid {pid}: {found}",
                )
                text = self.cli("status").stdout
                self.keep("status-intruder.txt", text)
                report(
                    f"pid {pid}" in text and "intruder" in text, "status (text) names the intruder"
                )
                metrics = self.cli("metrics")
                self.keep("metrics.txt", metrics.stdout + metrics.stderr)
                report(
                    metrics.returncode == 0 and "gpulock_intruder" in metrics.stdout,
                    "metrics: exit 0 with intruder series",
                    f"{metrics.returncode}",
                )
            finally:
                self.stop(intruder)
        finally:
            self.stop(holder)

    def shared_leases(self, gpu: dict) -> None:
        jobs = []
        try:
            for mem, alloc in (("4G", 1024), ("1G", 2048)):
                run = [self.gpulock, "run", "--gpus", str(gpu["index"]), "--mem", mem, "--"]
                process, ready = self.start_cuda(0, alloc, 60, prefix=run, required=False)
                jobs.append(process)
                if not report(
                    ready is not None,
                    f"run --mem {mem}: a shared lease starts a CUDA job",
                    "" if ready else process.stderr.read(),
                ):
                    return

            def shared_now():
                status = self.json_of("status-shared.json", "status")
                state = next(g for g in status["gpus"] if g["uuid"] == gpu["uuid"])
                return state.get("shared") or {}

            def both_read():
                shared = shared_now()
                leases = shared.get("leases") or []
                both = len(leases) == 2 and all(l.get("memory_used_bytes") for l in leases)
                return shared if both else None

            shared = self.wait_for(both_read) or shared_now()
            leases = sorted(shared.get("leases") or [], key=lambda l: l["memory_bytes"])
            report(
                shared.get("jobs") == 2,
                "status: two shared leases on one GPU",
                f"{shared.get('jobs')}",
            )
            if len(leases) == 2:
                small, large = leases
                report(
                    small["over_reservation"] is True and large["over_reservation"] is False,
                    "status: the job using 2 GiB of a 1 GiB reservation is over it, the other not",
                    f"1G lease uses {small['memory_used_bytes']}, 4G lease uses {large['memory_used_bytes']}",
                )
        finally:
            for process in jobs:
                self.stop(process)

    def redis_pool(self, redis_server: str, gpus: list[dict]) -> None:
        """The same real GPUs leased through a Redis pool (a server of our own on loopback)."""
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        data = tempfile.mkdtemp(prefix="gpulock-real-gpu-redis-")
        server = subprocess.Popen(
            [
                redis_server,
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                data,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.background.append(server)
        env = dict(self.env, GPULOCK_BACKEND=f"redis://127.0.0.1:{port}/0", GPULOCK_POOL="real-gpu")
        try:
            self.wait_for(lambda: self.cli("doctor", env=env).returncode == 0, 10)
            result = self.cli(
                "run",
                "-n",
                "1",
                "--visible",
                "uuid",
                "--",
                "sh",
                "-c",
                f'echo "$GPULOCK_GPUS|$GPULOCK_FENCING_TOKEN"; {self.cuda_context}',
                env=env,
            )
            self.keep("redis-run.txt", result.stdout + result.stderr)
            if report(
                result.returncode == 0, "redis: run -n 1 exits 0", result.stderr.strip()[:300]
            ):
                lines = result.stdout.splitlines()
                leased, token = lines[0].split("|")
                seen = [line.split()[2] for line in lines if line.startswith("device ")]
                report(
                    seen == [leased] and token.isdigit(),
                    "redis: CUDA sees exactly the leased GPU, with a fencing token",
                    f"GPULOCK_GPUS={leased} token={token} CUDA saw {seen}",
                )
            status = self.cli("status", "--pool", "--json", env=env)
            self.keep("redis-status.json", status.stdout + status.stderr)
            if report(
                status.returncode == 0, "redis: status --pool exits 0", status.stderr.strip()[:300]
            ):
                listed = [g["uuid"] for g in json.loads(status.stdout)["gpus"]]
                report(
                    sorted(listed) == sorted(g["uuid"] for g in gpus),
                    "redis: the pool lists this host's real GPUs",
                    f"{listed}",
                )
        finally:
            server.terminate()
            server.wait(timeout=30)
            shutil.rmtree(data, ignore_errors=True)

    def timings(self) -> None:
        def median_ms(env: dict, runs: int = 21) -> float:
            samples = []
            for _ in range(runs):
                start = time.perf_counter()
                subprocess.run([self.gpulock, "run", "-n", "1", "--", "true"], env=env, check=True)
                samples.append((time.perf_counter() - start) * 1000)
            return sorted(samples)[runs // 2]

        real = median_ms(self.env)
        fake = median_ms(dict(self.env, GPULOCK_FAKE_GPUS=str(1)))
        start = time.perf_counter()
        subprocess.run(["flock", os.path.join(self.lock_dir, "floor"), "true"], check=True)
        print(
            f"INFO  gpulock run -n 1 -- true: {real:.2f} ms median with NVML, {fake:.2f} ms with "
            f"1 simulated GPU (flock(1) once: {(time.perf_counter() - start) * 1000:.2f} ms)",
            flush=True,
        )
        # Where those milliseconds go: each NVML query, through gpulock's own reader.
        nvml_cost = Path(self.gpulock).resolve().parent / "tests" / "nvml_cost"
        if nvml_cost.is_file():
            costs = subprocess.run([str(nvml_cost)], capture_output=True, text=True, timeout=60)
            self.keep("nvml-cost.txt", costs.stdout + costs.stderr)
            for line in (costs.stdout + costs.stderr).splitlines():
                print(f"INFO  {line}", flush=True)

    def close(self) -> None:
        for process in self.background:
            if process.poll() is None:
                try:
                    os.killpg(process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        shutil.rmtree(self.lock_dir, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--gpulock", default=str(HERE.parent.parent / "build" / "gpulock"))
    parser.add_argument(
        "--cuda-context",
        help="a built tests/gpu/cuda_context.c (default: the "
        "build's tests/cuda_context beside --gpulock, else built here with cc)",
    )
    parser.add_argument("--redis-server", help="also check a Redis pool, with this redis-server")
    parser.add_argument(
        "--skip",
        default="",
        help="checks to leave out, comma-separated: "
        "exports,foreign,intruder,shared,redis,timings",
    )
    parser.add_argument("--out", type=Path, help="keep the raw documents read here")
    args = parser.parse_args()
    cuda_context = args.cuda_context
    built = Path(args.gpulock).resolve().parent / "tests" / "cuda_context"
    if not cuda_context and built.is_file():
        cuda_context = str(built)  # the build's own (tests/CMakeLists.txt)
    if not cuda_context:
        cuda_context = os.path.join(tempfile.mkdtemp(), "cuda_context")
        subprocess.run(
            ["cc", "-O2", "-o", cuda_context, str(HERE / "cuda_context.c"), "-ldl"], check=True
        )
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
    checker = Checker(args.gpulock, cuda_context, args.out)
    try:
        gpus = checker.discovery()
        if not gpus:
            report(False, "at least one GPU")
            return len(failures)
        skip = set(filter(None, args.skip.split(",")))
        checks = [
            ("exports", lambda: checker.run_exports(gpus)),
            ("foreign", lambda: checker.foreign_process(gpus[0])),
            ("intruder", lambda: checker.intruder_and_member(gpus[0])),
            ("shared", lambda: checker.shared_leases(gpus[0])),
            ("redis", lambda: args.redis_server and checker.redis_pool(args.redis_server, gpus)),
            ("timings", checker.timings),
        ]
        for name, check in checks:
            if name in skip:
                continue
            try:
                check()
            except Exception as error:  # one check that cannot run does not stop the others
                report(False, f"{name}: ran to the end", f"{type(error).__name__}: {error}")
    except Exception as error:  # discovery could not even run
        report(False, "discovery: ran to the end", f"{type(error).__name__}: {error}")
    finally:
        checker.close()
    print(f"{len(failures)} failed" + (f": {', '.join(failures)}" if failures else ""))
    return min(len(failures), 100)


if __name__ == "__main__":
    sys.exit(main())
