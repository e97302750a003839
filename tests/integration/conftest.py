"""Shared fixtures for gpulock's integration tests.

These tests drive the real `gpulock` binary with real processes, simulated GPUs
(GPULOCK_FAKE_GPUS) and a fresh lock directory per test (GPULOCK_DIR). Nothing here
depends on wall-clock speed: every timeout is only a hang guard.

Environment:
  GPULOCK_BINARY     the gpulock executable (default: <repo>/build/gpulock)
  GPULOCK_BUILD_DIR  the build directory (informational)
"""

import fcntl
import json
import os
import pathlib
import secrets
import select
import signal
import subprocess
import sys
import termios

import pytest

# What both pytest suites share: tests/support/gpulock_testing.py.
_SUPPORT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "support"))
if _SUPPORT not in sys.path:
    sys.path.insert(0, _SUPPORT)

import gpulock_testing  # noqa: E402
from gpulock_testing import HANG, SHORT_HANG, wait_until  # noqa: E402
# Imported by the tests from here.
from gpulock_testing import (  # noqa: E402,F401
    EX_SOFTWARE, EX_TEMPFAIL, EX_UNAVAILABLE, EX_USAGE, sanitized_build, sim_uuid, stops_a_shell)

PYTHON = "/usr/bin/python3"

# In the environment of every process a test starts: lets teardown find them all.
TAG_VARIABLE = "GPULOCK_ITEST_TAG"


def lock_file_name(uuid):
    return "gpu-%s.lock" % uuid


@pytest.fixture(scope="session")
def gpulock_bin():
    return gpulock_testing.require_binary()



def default_interrupt_signals():
    """preexec_fn: SIGINT and SIGQUIT as an interactive shell gives them. A background job of a
    non-interactive shell (`cmd &` in a script) starts with both ignored, and exec keeps them
    ignored: a test that stops a waiter with SIGINT would then wait for it for ever."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)

class Terminal:
    """A command run as the session leader of a new pseudo-terminal, as in an interactive shell.
    `text()` is everything it wrote so far; `write()` types into the terminal (b"\\x03" is ^C).
    Use as a context manager: on exit its process group is killed and the terminal closed."""

    def __init__(self, argv, env, cwd):
        self.master, slave = os.openpty()

        def become_terminal_session():
            # A shell cannot trap a signal ignored when it started (POSIX), and SIGINT is
            # ignored in background jobs of non-interactive shells, which may be how the suite
            # runs.
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.setsid()
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)

        self.proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env,
                                     cwd=cwd, preexec_fn=become_terminal_session)
        os.close(slave)
        self.output = bytearray()

    def drain(self):
        while select.select([self.master], [], [], 0)[0]:
            try:
                chunk = os.read(self.master, 4096)
            except OSError:
                return
            if not chunk:
                return
            self.output.extend(chunk)

    def text(self):
        self.drain()
        return self.output.decode(errors="replace")

    def write(self, data):
        os.write(self.master, data)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=HANG)
        os.close(self.master)


class Background(gpulock_testing.Background):
    """A background process of an integration test (gpulock_testing.Background)."""

    def wait_for_stderr(self, text, timeout=SHORT_HANG):
        """Waits until `text` appears on the process's stderr; fails if it exits first."""
        def seen():
            if text in self.stderr():
                return True
            if not self.alive() and text not in self.stderr():
                raise AssertionError("process exited (status %s) before writing %r\nstderr: %s"
                                     % (self.popen.returncode, text, self.stderr()))
            return False
        wait_until(seen, timeout, what="%r on stderr of %s" % (text, self.popen.args))


class Harness:
    """One test's world: a fresh lock directory, an environment builder, helpers to run gpulock
    and to read its status, and a record of every process started, killed at teardown."""

    def __init__(self, binary, tmp):
        self.binary = binary
        self.tmp = pathlib.Path(tmp)
        self.lock_dir = self.tmp / "locks"  # not created: gpulock must create it
        self.tag = "gpulock-itest-" + secrets.token_hex(8)
        self.background = []
        self.fake_path = self.tmp / "gpus.json"
        self._counter = 0

    # -- environment ------------------------------------------------------------------------
    def env(self, fake="4", lock_dir=None, cuda_visible_devices=None, **extra):
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("GPULOCK_") and k not in ("CUDA_VISIBLE_DEVICES",
                                                             "CUDA_DEVICE_ORDER")}
        env["GPULOCK_DIR"] = str(lock_dir if lock_dir is not None else self.lock_dir)
        if fake is not None:
            env["GPULOCK_FAKE_GPUS"] = str(fake)
        if cuda_visible_devices is not None:
            env["CUDA_VISIBLE_DEVICES"] = cuda_visible_devices
        env[TAG_VARIABLE] = self.tag  # lets teardown find every process of this test
        # status and metrics keep idle-GPU readings in the user's state directory: the test's.
        env["XDG_STATE_HOME"] = str(self.tmp / "state")
        env.update({k: str(v) for k, v in extra.items()})
        return env

    def write_fake_gpus(self, gpus, path=None):
        """Writes a simulated-GPU file atomically (gpulock re-reads it on every query, so it
        must never see a half-written file) and returns its path."""
        path = pathlib.Path(path) if path else self.fake_path
        tmp = path.with_name(".%s.%d.tmp" % (path.name, os.getpid()))
        tmp.write_text(json.dumps({"gpus": gpus}, indent=1))
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
        return str(path)

    # -- running gpulock --------------------------------------------------------------------
    def cmd(self, *args):
        return [self.binary] + [str(a) for a in args]

    def run(self, *args, env=None, timeout=HANG, prefix=(), cwd=None, **kwargs):
        """Runs gpulock to completion (timeout = hang guard); returns CompletedProcess."""
        argv = list(prefix) + self.cmd(*args)
        try:
            return subprocess.run(argv, env=env if env is not None else self.env(),
                                  stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                  timeout=timeout, cwd=cwd or self.tmp, **kwargs)
        except subprocess.TimeoutExpired as e:
            raise AssertionError("gpulock %s hung (hang guard %ss)\nstdout: %s\nstderr: %s"
                                 % (args, timeout, e.stdout, e.stderr))

    def spawn_argv(self, argv, env=None, cwd=None):
        """Starts argv in the background in its own session; killed at teardown."""
        self._counter += 1
        out = self.tmp / ("bg-%d.out" % self._counter)
        err = self.tmp / ("bg-%d.err" % self._counter)
        with open(out, "wb") as fo, open(err, "wb") as fe:
            popen = subprocess.Popen([str(a) for a in argv], env=env if env is not None
                                     else self.env(), stdin=subprocess.DEVNULL, stdout=fo,
                                     stderr=fe, cwd=cwd or self.tmp, start_new_session=True,
                                     preexec_fn=default_interrupt_signals)
        bg = Background(popen, out, err)
        self.background.append(bg)
        return bg

    def spawn(self, *args, env=None, prefix=(), cwd=None):
        return self.spawn_argv(list(prefix) + self.cmd(*args), env=env, cwd=cwd)

    def hold(self, *selection, env=None, label=None, prefix=()):
        """Starts `gpulock run SELECTION -- sh -c 'echo $GPULOCK_LEASE_ID > F; sleep'` and waits
        until the command runs (so the lease is taken). Returns (Background, lease_id)."""
        self._counter += 1
        marker = self.tmp / ("held-%d" % self._counter)
        args = list(selection)
        if label is not None:
            args += ["--label", label]
        script = 'echo "$GPULOCK_LEASE_ID $GPULOCK_GPUS" > "$1.tmp" && mv "$1.tmp" "$1"; ' \
                 'exec sleep 1000'
        bg = self.spawn("run", *args, "--", "sh", "-c", script, "holder", marker, env=env,
                        prefix=prefix)

        def started():
            if marker.exists():
                return True
            if not bg.alive():
                raise AssertionError("holder exited early: " + bg.describe())
            return False
        wait_until(started, what="the holder's command to start")
        lease_id, gpus = marker.read_text().split()
        bg.lease_id = lease_id
        bg.gpus = gpus.split(",")
        return bg, lease_id

    def status(self, env=None, prefix=()):
        result = self.run("status", "--json", env=env, prefix=prefix)
        assert result.returncode == 0, "status failed: %s" % result.stderr
        doc = json.loads(result.stdout)
        assert doc["schema_version"] == 1
        return doc

    def gpu_status(self, index, env=None, doc=None):
        doc = doc or self.status(env=env)
        for gpu in doc["gpus"]:
            if gpu["display_index"] == str(index):
                return gpu
        raise AssertionError("no GPU %s in status: %s" % (index, doc))

    def states(self, env=None):
        return {g["display_index"]: g["state"] for g in self.status(env=env)["gpus"]}

    def wait_state(self, index, state, env=None, timeout=SHORT_HANG):
        return wait_until(lambda: self.gpu_status(index, env=env)["state"] == state, timeout,
                          interval=0.1, what="GPU %s to be %s" % (index, state))

    def sleeper(self):
        """A live process whose pid can be listed as a 'foreign' GPU process."""
        return self.spawn_argv(["sleep", "1000"])

    # -- teardown ---------------------------------------------------------------------------
    def cleanup(self):
        # Detached holders (gpulock acquire) and re-parented commands left their session:
        # they are found by this test's tag in their environment.
        gpulock_testing.end_processes(self.background, TAG_VARIABLE, self.tag)


@pytest.fixture
def gl(gpulock_bin, tmp_path):
    harness = Harness(gpulock_bin, tmp_path)
    try:
        yield harness
    finally:
        harness.cleanup()


# -- several users ----------------------------------------------------------------------------

@pytest.fixture(scope="session")
def test_users():
    """Two unprivileged users, created if missing (and left in place: a concurrent run of the
    suite may be using them). Skips unless running as root, or if they cannot be created."""
    return gpulock_testing.make_test_users(uncreatable=pytest.skip)


@pytest.fixture(scope="session")
def shared_binary(gpulock_bin):
    """A copy of gpulock that every user can execute (mode 755 in a 755 directory)."""
    with gpulock_testing.shared_binary_copy(gpulock_bin, "gpulock-itest-bin-") as (_, path):
        yield path


@pytest.fixture
def mu(shared_binary, test_users):
    """A harness for multi-user tests: the shared binary, and a lock directory (not yet created)
    inside a fresh directory under /tmp owned by the first test user (mode 755), so that user
    creates the lock directory and everyone else can traverse to it."""
    with gpulock_testing.multi_user_dirs("gpulock-itest-mu-", test_users[0]) as (work, owner):
        harness = Harness(shared_binary, work)  # work: scratch files (markers)
        harness.lock_dir = pathlib.Path(owner) / "locks"
        harness.users = test_users
        try:
            yield harness
        finally:
            harness.cleanup()
