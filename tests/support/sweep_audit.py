"""An audit of GPU sweeps run by real shell scripts, independent of gpulock's own view.

Each task of a sweep runs `work.sh GPU TASK` once it holds its GPU: the script creates the
marker file `gpu-GPU` with O_EXCL (bash's noclobber), works, removes the marker and records
the task as done. A task that finds the marker already there, or that was handed no valid GPU
id, records an error instead. So a GPU given to two tasks at once, or a task that runs without
a GPU, shows in the audit directory whatever gpulock believes.

Also: the processes of a session, read from /proc, to kill a whole script's session the way a
lost SSH connection or an administrator's `pkill -9 -s SID` does.
"""

import os
import pathlib
import signal
import stat
import time

WORK_SCRIPT = r'''#!/bin/bash
# One task's work on GPU $1 (task $2): an O_EXCL marker per GPU proves no other task is there.
audit=$AUDIT gpu=$1 task=$2
case "$gpu" in
  '' | *[!0-9]*) echo "task $task ran without a GPU (got '$gpu')" >> "$audit/errors"; exit 3 ;;
esac
if ! (set -o noclobber; echo "$task" > "$audit/gpu-$gpu") 2> /dev/null; then
  echo "task $task: GPU $gpu was in use by task $(cat "$audit/gpu-$gpu" 2> /dev/null)" \
    >> "$audit/errors"
  exit 4
fi
echo "$task" > "$audit/running-$task"
sleep "${WORK_SECONDS:-0.01}"
rm -f "$audit/gpu-$gpu" "$audit/running-$task"
echo "$task" >> "$audit/done"
'''


class Audit:
    """The audit directory of one sweep, and `work.sh` beside it (put its directory on PATH,
    and AUDIT in the environment: env())."""

    def __init__(self, directory):
        self.dir = pathlib.Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.bin = self.dir.parent / (self.dir.name + "-bin")
        self.bin.mkdir(exist_ok=True)
        work = self.bin / "work.sh"
        work.write_text(WORK_SCRIPT)
        work.chmod(work.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)

    def env(self, base, work_seconds="0.01"):
        env = dict(base, AUDIT=str(self.dir), WORK_SECONDS=work_seconds)
        env["PATH"] = "%s%s%s" % (self.bin, os.pathsep, env.get("PATH", os.environ["PATH"]))
        return env

    def errors(self):
        path = self.dir / "errors"
        return path.read_text().splitlines() if path.exists() else []

    def done(self):
        path = self.dir / "done"
        return sorted(int(t) for t in path.read_text().split()) if path.exists() else []

    def running(self):
        return sorted(p.name for p in self.dir.glob("running-*"))


def session_processes(session):
    """The pids of every process of `session` (zombies included), from /proc."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % entry, "rb") as f:
                text = f.read().decode("utf-8", "replace")
        except OSError:
            continue
        fields = text[text.rindex(")") + 2:].split()
        if int(fields[3]) == session and fields[0] not in ("Z", "X"):
            found.append(int(entry))
    return found


def kill_session(session, patience=120.0):
    """SIGKILL for every process of `session`, until none is left (a process may fork while
    its siblings are being killed, and a killed process stays in /proc until the kernel has
    torn it down: tens of milliseconds for a sanitizer build's large address space). Returns
    how many were killed."""
    killed = set()
    deadline = time.monotonic() + patience
    while True:
        alive = session_processes(session)
        if not alive:
            return len(killed)
        if time.monotonic() > deadline:
            raise AssertionError("session %d still has processes %s after %.0f s of SIGKILL"
                                 % (session, alive, patience))
        for pid in alive:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
            except ProcessLookupError:
                pass
        time.sleep(0.01)


def _process_line(pid):
    base = "/proc/%d/" % pid
    try:
        with open(base + "stat", "rb") as f:
            text = f.read().decode("utf-8", "replace")
        fields = text[text.rindex(")") + 2:].split()
        with open(base + "cmdline", "rb") as f:
            argv = f.read().split(b"\0")
        with open(base + "wchan") as f:
            wchan = f.read().strip() or "-"
        threads = len(os.listdir(base + "task"))
    except (OSError, ValueError):
        return None
    command = b" ".join(a for a in argv if a).decode("utf-8", "replace")[:160]
    return "pid %d ppid %s sid %s %s wchan %s threads %d: %s" % (
        pid, fields[1], fields[3], fields[0], wchan, threads, command)


def describe_processes(session, audit=None):
    """For a hang guard's message: every live process of `session` and every gpulock process
    elsewhere (the detached holders), with state, kernel wait channel and command line; and
    where the audit stands."""
    lines = []
    for entry in sorted((e for e in os.listdir("/proc") if e.isdigit()), key=int):
        line = _process_line(int(entry))
        if line and (" sid %d " % session in line or "gpulock" in line.split(": ", 1)[-1]):
            lines.append(line)
    if audit is not None:
        lines.append("audit: %d done, running %s, errors %s"
                     % (len(audit.done()), audit.running(), audit.errors()))
    return "\n".join(lines)
