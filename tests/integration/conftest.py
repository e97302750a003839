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
import pwd
import secrets
import select
import shutil
import signal
import subprocess
import tempfile
import termios
import time

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
PYTHON = "/usr/bin/python3"

# Hang guards (seconds). Generous on purpose: the suite may run under ASan on a loaded machine.
HANG = 60
SHORT_HANG = 30

# Exit statuses (docs/cli.md).
EX_USAGE = 64
EX_UNAVAILABLE = 69
EX_SOFTWARE = 70
EX_TEMPFAIL = 75

TEST_USERS = ("gpulock-test-a", "gpulock-test-b")


def sim_uuid(index):
    """UUID of simulated GPU `index` with GPULOCK_FAKE_GPUS=N (docs/simulated-gpus.md)."""
    return "GPU-5e1f0a7e-0000-4000-8000-%012x" % index


def lock_file_name(uuid):
    return "gpu-%s.lock" % uuid


def binary_path():
    configured = os.environ.get("GPULOCK_BINARY")
    path = pathlib.Path(configured) if configured else REPO / "build" / "gpulock"
    return str(path.resolve())


@pytest.fixture(scope="session")
def gpulock_bin():
    path = binary_path()
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        pytest.fail("gpulock binary not found at %s: build it (ninja -C build) or set GPULOCK_BINARY"
                    % path)
    return path


def wait_until(predicate, timeout=SHORT_HANG, interval=0.05, what="condition"):
    """Polls predicate() until it returns a truthy value; fails after `timeout` (a hang guard)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("timed out (hang guard, %ss) waiting for %s" % (timeout, what))
        time.sleep(interval)


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


def _proc_environ(pid):
    try:
        with open("/proc/%d/environ" % pid, "rb") as f:
            return f.read()
    except OSError:
        return b""


class Background:
    """A process started in its own session (so its whole group can be killed), with stdout
    and stderr going to files (so no pipe can block it or keep a reader waiting)."""

    def __init__(self, popen, out_path, err_path):
        self.popen = popen
        self.pid = popen.pid
        self.out_path = out_path
        self.err_path = err_path

    def stdout(self):
        return pathlib.Path(self.out_path).read_text(errors="replace")

    def stderr(self):
        return pathlib.Path(self.err_path).read_text(errors="replace")

    def alive(self):
        return self.popen.poll() is None

    def wait(self, timeout=HANG):
        try:
            return self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError("process %d (%s) did not exit within %ss (hang guard)\n"
                                 "stdout: %s\nstderr: %s" % (self.pid, self.popen.args, timeout,
                                                             self.stdout(), self.stderr()))

    def kill_group(self, sig=signal.SIGKILL):
        try:
            os.killpg(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

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

    def describe(self):
        return "args=%s rc=%s\nstdout: %s\nstderr: %s" % (
            self.popen.args, self.popen.returncode, self.stdout(), self.stderr())


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
        env["GPULOCK_ITEST_TAG"] = self.tag  # lets teardown find every process of this test
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
                                     stderr=fe, cwd=cwd or self.tmp, start_new_session=True)
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
        for bg in self.background:
            bg.kill_group()
        # Detached holders (gpulock acquire) and re-parented commands left their session:
        # find them by this test's tag in their environment, and kill each by its pid.
        needle = ("GPULOCK_ITEST_TAG=" + self.tag).encode()
        me = os.getpid()
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == me:
                continue
            if needle in _proc_environ(int(entry)).split(b"\0"):
                try:
                    os.kill(int(entry), signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        for bg in self.background:
            try:
                bg.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass


@pytest.fixture
def gl(gpulock_bin, tmp_path):
    harness = Harness(gpulock_bin, tmp_path)
    try:
        yield harness
    finally:
        harness.cleanup()


# -- several users ----------------------------------------------------------------------------

class TestUser:
    def __init__(self, name):
        entry = pwd.getpwnam(name)
        self.name = name
        self.uid = entry.pw_uid
        self.gid = entry.pw_gid

    def prefix(self):
        return ["setpriv", "--reuid=%d" % self.uid, "--regid=%d" % self.gid, "--clear-groups"]


def _ensure_user(name):
    try:
        pwd.getpwnam(name)
        return
    except KeyError:
        pass
    last = None
    for _ in range(20):  # tolerate a concurrent run creating it, or /etc/passwd being locked
        result = subprocess.run(["useradd", "--system", "--no-create-home", "--shell",
                                 "/usr/sbin/nologin", name], capture_output=True, text=True,
                                timeout=SHORT_HANG)
        try:
            pwd.getpwnam(name)
            return
        except KeyError:
            last = result.stderr
            time.sleep(0.2)
    pytest.skip("cannot create test user %s: %s" % (name, last))


@pytest.fixture(scope="session")
def test_users():
    """Two unprivileged users, created if missing (and left in place: a concurrent run of the
    suite may be using them). Skips unless running as root."""
    if os.geteuid() != 0:
        pytest.skip("multi-user tests need root (to create users and switch to them)")
    if shutil.which("setpriv") is None or shutil.which("useradd") is None:
        pytest.skip("multi-user tests need setpriv and useradd")
    for name in TEST_USERS:
        _ensure_user(name)
    return tuple(TestUser(name) for name in TEST_USERS)


@pytest.fixture(scope="session")
def shared_binary(gpulock_bin):
    """A copy of gpulock that every user can execute (mode 755 in a 755 directory)."""
    directory = tempfile.mkdtemp(prefix="gpulock-itest-bin-", dir="/tmp")
    os.chmod(directory, 0o755)
    path = os.path.join(directory, "gpulock")
    shutil.copy2(gpulock_bin, path)
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def mu(shared_binary, test_users):
    """A harness for multi-user tests: the shared binary, and a lock directory (not yet created)
    inside a fresh directory under /tmp owned by the first test user (mode 755), so that user
    creates the lock directory and everyone else can traverse to it."""
    base = tempfile.mkdtemp(prefix="gpulock-itest-mu-", dir="/tmp")
    os.chmod(base, 0o755)
    work = os.path.join(base, "work")  # scratch files (markers), writable by everyone
    os.mkdir(work)
    os.chmod(work, 0o1777)
    owner = os.path.join(base, "home")
    os.mkdir(owner)
    os.chown(owner, test_users[0].uid, test_users[0].gid)
    os.chmod(owner, 0o755)
    harness = Harness(shared_binary, work)
    harness.lock_dir = pathlib.Path(owner) / "locks"
    harness.users = test_users
    try:
        yield harness
    finally:
        harness.cleanup()
        shutil.rmtree(base, ignore_errors=True)
