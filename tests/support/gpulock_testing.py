"""Helpers shared by gpulock's two pytest suites that drive real processes.

  tests/integration/  the `gpulock` command line (conftest.py there)
  tests/python/       the Python package `gpulock` (conftest.py there)

Both suites run the real `gpulock` binary in processes of their own, put each test's
processes where teardown can kill them (a process group of their own, and a tag in their
environment), and run some tests as two unprivileged users. What they do the same way lives
here; each conftest.py imports it (after adding this directory to sys.path) and keeps the
fixtures and helpers that are its own.

A plain module: the standard library and pytest only, no fixtures, no state between tests.
Nothing here depends on wall-clock speed: every timeout is only a hang guard.
"""

import contextlib
import fcntl
import os
import pathlib
import pwd
import shutil
import signal
import struct
import subprocess
import tempfile
import time

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]

# Hang guards (seconds). Generous on purpose: the suites may run under ASan on a loaded machine.
HANG = 60
SHORT_HANG = 30

# Exit statuses (docs/cli.md), also the `exit_status` of the Python package's exceptions.
EX_USAGE = 64
EX_UNAVAILABLE = 69
EX_SOFTWARE = 70
EX_TEMPFAIL = 75
EX_CONFIG = 78


def sim_uuid(index):
    """UUID of simulated GPU `index` with GPULOCK_FAKE_GPUS=N (docs/simulated-gpus.md)."""
    return "GPU-5e1f0a7e-0000-4000-8000-%012x" % index


# -- the binary under test --------------------------------------------------------------------

def binary_path():
    """GPULOCK_BINARY, or <repo>/build/gpulock when it is unset (resolved)."""
    configured = os.environ.get("GPULOCK_BINARY")
    path = pathlib.Path(configured) if configured else REPO / "build" / "gpulock"
    return str(path.resolve())


def require_binary():
    """binary_path(), after failing the test if it is not an executable file."""
    path = binary_path()
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        pytest.fail("gpulock binary not found at %s: build it (ninja -C build) or set GPULOCK_BINARY"
                    % path)
    return path


def sanitized_build():
    """Whether the binary under test is a sanitizer build (its build directory's CMake cache):
    its every process starts several times slower, so tests of many processes use fewer."""
    build = os.environ.get("GPULOCK_BUILD_DIR")
    try:
        cache = (pathlib.Path(build) / "CMakeCache.txt").read_text() if build else ""
    except OSError:
        return False
    return "GPULOCK_SANITIZE:BOOL=ON" in cache or "GPULOCK_TSAN:BOOL=ON" in cache


def stops_a_shell(output, status):
    """True if `output` (what `gpulock acquire` printed for eval), run by a non-interactive
    POSIX shell, makes it exit with `status` before its next command."""
    ran = subprocess.run(["sh", "-c", output + "\necho reached"], stdout=subprocess.PIPE,
                         text=True, timeout=HANG)
    return ran.returncode == status and "reached" not in ran.stdout


# -- waiting ----------------------------------------------------------------------------------

def wait_until(predicate, timeout=SHORT_HANG, interval=0.05, what="condition"):
    """Polls predicate() until it returns a truthy value, and returns that value; fails after
    `timeout` (a hang guard)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("timed out (hang guard, %ss) waiting for %s" % (timeout, what))
        time.sleep(interval)


# -- processes --------------------------------------------------------------------------------

class Background:
    """A process started in its own session (so its whole group can be killed), with stdout
    and stderr going to files (so no pipe can block it or keep a reader waiting). Each suite
    extends it with what its tests wait for."""

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

    def describe(self):
        text = "args=%s rc=%s\nstdout: %s\nstderr: %s" % (
            self.popen.args, self.popen.returncode, _tail(self.stdout()), _tail(self.stderr()))
        return text + ("\n" + self.where() if self.alive() else "")

    def where(self):
        """Where a live process is stuck, from /proc: its signal masks and pending signals, and
        each thread's state, kernel wait channel and CPU time (for a hang guard's message)."""
        lines = []
        try:
            with open("/proc/%d/status" % self.pid) as f:
                lines += [line.strip() for line in f
                          if line.startswith(("State", "SigPnd", "ShdPnd", "SigBlk", "SigCgt"))]
            for tid in sorted(os.listdir("/proc/%d/task" % self.pid), key=int):
                base = "/proc/%d/task/%s/" % (self.pid, tid)
                with open(base + "stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                with open(base + "wchan") as f:
                    wchan = f.read().strip()
                lines.append("thread %s: state %s, wchan %s, utime %s stime %s ticks"
                             % (tid, fields[0], wchan or "-", fields[11], fields[12]))
        except OSError as e:
            lines.append("(/proc: %s)" % e)
        return "\n".join(lines)

    def wait(self, timeout=HANG):
        try:
            return self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError("process %d did not exit within %ss (hang guard)\n%s"
                                 % (self.pid, timeout, self.describe()))

    def kill_group(self, sig=signal.SIGKILL):
        try:
            os.killpg(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _tail(text, lines=30):
    """The last `lines` lines of a process's output, for an assertion message."""
    kept = text.splitlines()
    if len(kept) <= lines:
        return text
    return "(%d lines; the last %d)\n%s" % (len(kept), lines, "\n".join(kept[-lines:]))


def _proc_environ(pid):
    try:
        with open("/proc/%d/environ" % pid, "rb") as f:
            return f.read()
    except OSError:
        return b""


def kill_tagged(variable, tag):
    """SIGKILLs every process (but this one) whose environment holds `variable`=`tag`, each by
    its pid: the ones that left the session they were started in (detached holders of
    `gpulock acquire`, re-parented commands)."""
    needle = ("%s=%s" % (variable, tag)).encode()
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        if needle in _proc_environ(int(entry)).split(b"\0"):
            try:
                os.kill(int(entry), signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def end_processes(background, variable, tag):
    """A test's teardown: kills the process group of each Background in `background`, then
    every process tagged `variable`=`tag` (kill_tagged), and reaps the Backgrounds."""
    for bg in background:
        bg.kill_group()
    kill_tagged(variable, tag)
    for bg in background:
        try:
            bg.popen.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass


# -- several users ----------------------------------------------------------------------------

TEST_USERS = ("gpulock-test-a", "gpulock-test-b")


class TestUser:
    """An existing user, and the prefix that runs a command as that user (setpriv)."""

    __test__ = False  # not a test class, wherever it is imported

    def __init__(self, name):
        entry = pwd.getpwnam(name)
        self.name = name
        self.uid = entry.pw_uid
        self.gid = entry.pw_gid

    def prefix(self):
        return ["setpriv", "--reuid=%d" % self.uid, "--regid=%d" % self.gid, "--clear-groups"]


def _user_exists(name):
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


def ensure_user(name):
    """Creates system user `name` (no home, no login shell) unless it exists. Returns None once
    it exists, else what useradd said the last time it failed."""
    if _user_exists(name):
        return None
    last = None
    for _ in range(20):  # tolerate a concurrent run creating it, or /etc/passwd being locked
        result = subprocess.run(["useradd", "--system", "--no-create-home", "--shell",
                                 "/usr/sbin/nologin", name], capture_output=True, text=True,
                                timeout=SHORT_HANG)
        if _user_exists(name):
            return None
        last = result.stderr
        time.sleep(0.2)
    return last or "useradd did not create it"


def make_test_users(uncreatable):
    """The two unprivileged users of TEST_USERS as TestUsers, created if missing and left in
    place (a concurrent run of either suite may be using them). Skips unless running as root
    with setpriv and useradd; a user that cannot be created is reported by calling
    `uncreatable(message)` (pytest.skip or pytest.fail)."""
    if os.geteuid() != 0:
        pytest.skip("multi-user tests need root (to create users and switch to them)")
    if shutil.which("setpriv") is None or shutil.which("useradd") is None:
        pytest.skip("multi-user tests need setpriv and useradd")
    for name in TEST_USERS:
        problem = ensure_user(name)
        if problem is not None:
            uncreatable("cannot create test user %s: %s" % (name, problem))
    return tuple(TestUser(name) for name in TEST_USERS)


_FS_IOC_GETFLAGS = 0x80086601  # ioctl_iflags(2); the argument is an int
_FS_IOC_SETFLAGS = 0x40086602
_FS_APPEND_FL = 0x20


def unseal_tree(directory):
    """Clears the append-only flag (`chattr -a`) of every file under `directory`, as root, so
    that it can be removed: `gpulock init` as root seals the usage journal's files."""
    if os.geteuid() != 0:
        return
    for parent, _, names in os.walk(directory):
        for name in names:
            try:
                fd = os.open(os.path.join(parent, name),
                             os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
            except OSError:
                continue
            try:
                flags = struct.unpack("i", fcntl.ioctl(fd, _FS_IOC_GETFLAGS, b"\0" * 4))[0]
                if flags & _FS_APPEND_FL:
                    fcntl.ioctl(fd, _FS_IOC_SETFLAGS, struct.pack("i", flags & ~_FS_APPEND_FL))
            except OSError:
                pass
            finally:
                os.close(fd)


@contextlib.contextmanager
def _directory_for_all_users(prefix):
    """A fresh directory under /tmp named with `prefix`, mode 755; removed on exit (sealed
    journal files included)."""
    directory = tempfile.mkdtemp(prefix=prefix, dir="/tmp")
    try:
        os.chmod(directory, 0o755)
        yield directory
    finally:
        unseal_tree(directory)
        shutil.rmtree(directory, ignore_errors=True)


@contextlib.contextmanager
def shared_binary_copy(binary, prefix):
    """Copies `binary` where every user can execute it: as `gpulock`, mode 755, in a fresh
    directory under /tmp (mode 755) named with `prefix`, removed on exit. Yields
    (directory, path of the copy)."""
    with _directory_for_all_users(prefix) as directory:
        path = os.path.join(directory, "gpulock")
        shutil.copy2(binary, path)
        os.chmod(path, 0o755)
        yield directory, path


@contextlib.contextmanager
def multi_user_dirs(prefix, owner):
    """The directories of one multi-user test, in a fresh directory under /tmp (mode 755)
    named with `prefix`, removed on exit: `work`, for scratch files, writable by everyone
    (mode 1777), and `home`, owned by TestUser `owner` (mode 755), for a lock directory that
    user creates and everyone else can traverse to. Yields (work, home)."""
    with _directory_for_all_users(prefix) as base:
        work = os.path.join(base, "work")
        os.mkdir(work)
        os.chmod(work, 0o1777)
        home = os.path.join(base, "home")
        os.mkdir(home)
        os.chown(home, owner.uid, owner.gid)
        os.chmod(home, 0o755)
        yield work, home
