"""Shared helpers for the tests of the Python package `gpulock` (python/gpulock and its
extension gpulock._native).

The package under test is the one the CMake build wrote to <build>/python (PYTHONPATH).
Every test runs in its own world: a fresh lock directory (GPULOCK_DIR), four simulated GPUs
(GPULOCK_FAKE_GPUS=4) unless it writes a simulated-GPU file, no GPULOCK_CONFIG, and none of
the variables a lease sets (CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER, GPULOCK_LEASE_ID,
GPULOCK_GPUS). gpulock._pool keys its cached pool on those variables, so each test gets a pool
of its own.

Behaviour between processes is checked with real processes: Python children (`gl.python`)
that report through marker files, the real `gpulock` binary (`gl.cli`, `gl.spawn_cli`,
`gl.hold`), and an independent view of the machine read with `gpulock status --json` and
`gpulock queue --json`. Nothing depends on wall-clock speed: every timeout is a hang guard.

Environment:
  PYTHONPATH              must lead to the package under test (<build>/python)
  GPULOCK_BINARY          the gpulock executable (default: <repo>/build/gpulock)
  GPULOCK_TEST_FAKE_CUDA  the stand-in CUDA driver built from fake_cuda.c (libcuda.so.1);
                          compiled here with `cc` when unset
"""

import json
import os
import pathlib
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap

import pytest

# What both pytest suites share: tests/support/gpulock_testing.py.
_SUPPORT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "support"))
if _SUPPORT not in sys.path:
    sys.path.insert(0, _SUPPORT)

import gpulock_testing  # noqa: E402
from gpulock_testing import HANG, REPO, SHORT_HANG  # noqa: E402
# Imported by the tests from here.
from gpulock_testing import (  # noqa: E402,F401
    EX_CONFIG, EX_TEMPFAIL, EX_UNAVAILABLE, EX_USAGE, sim_uuid)

PYTHON = sys.executable

TEST_HANG = 180  # a whole test, unless marked @pytest.mark.hang_guard(seconds)

# In the environment of every process a test starts: lets teardown find them all.
TAG_VARIABLE = "GPULOCK_PYTEST_TAG"

GIB = 1024 ** 3

# Variables the tests set themselves; every other GPULOCK_* variable is removed.
_KEPT = ("GPULOCK_BINARY", "GPULOCK_TEST_FAKE_CUDA")
_REMOVED = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")

# What a lease sets in os.environ (docs/cli.md).
LEASE_VARIABLES = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "GPULOCK_LEASE_ID", "GPULOCK_GPUS")


def wait_until(predicate, timeout=SHORT_HANG, interval=0.02, what="condition"):
    """gpulock_testing.wait_until, polling more often by default."""
    return gpulock_testing.wait_until(predicate, timeout, interval, what)


# -- the hang guard of in-process tests -------------------------------------------------------

class HangGuard(BaseException):
    """Raised by SIGALRM in the test process when a test runs past its hang guard. A
    BaseException, so that no `except Exception` (or `pytest.raises(gpulock.Error)`) in the
    test swallows it; gpulock's wait stops on it like on any exception a signal handler
    raises."""


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "hang_guard(seconds): the test fails if it runs longer (default %d)" % TEST_HANG)


@pytest.fixture(autouse=True)
def hang_guard(request):
    """Turns a hang of the test process itself (e.g. a lease that waits forever) into a
    failure: SIGALRM raises HangGuard after TEST_HANG seconds."""
    marker = request.node.get_closest_marker("hang_guard")
    seconds = marker.args[0] if marker else TEST_HANG

    def expired(signum, frame):
        raise HangGuard("test still running after its hang guard of %ss" % seconds)

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


# -- the world of one test --------------------------------------------------------------------

@pytest.fixture(scope="session")
def gpulock_bin():
    return gpulock_testing.require_binary()


@pytest.fixture(autouse=True)
def forget_safe_gpu_claims(isolated):
    """safe_gpu's claims last for the rest of the process, as the original's did, and this
    process runs every test: after each test, its claims are released and forgotten (before
    the test's environment is put back, which a release would otherwise change again)."""
    yield
    module = sys.modules.get("gpulock.compat.safe_gpu")
    if module is not None:
        for claim in list(module._claims):
            claim.release()
        module._claims.clear()
        module._values_set.clear()
        module.gpu_owner = None


@pytest.fixture(autouse=True)
def isolated(monkeypatch, tmp_path):
    """A fresh lock directory and four simulated GPUs for this test, in os.environ (so for
    gpulock in this process and for every process the test starts)."""
    for name in list(os.environ):
        if (name.startswith("GPULOCK_") and name not in _KEPT) or name in _REMOVED:
            monkeypatch.delenv(name)
    monkeypatch.setenv("GPULOCK_DIR", str(tmp_path / "locks"))  # gpulock creates it
    monkeypatch.setenv("GPULOCK_FAKE_GPUS", "4")
    # status() keeps idle-GPU readings in the user's state directory: the test's.
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    # Lets teardown find every process this test started, wherever it went.
    monkeypatch.setenv(TAG_VARIABLE, "gpulock-pytest-" + secrets.token_hex(8))
    return tmp_path


def _default_sigint():
    # Python installs its KeyboardInterrupt handler only if SIGINT is not ignored at start,
    # and SIGINT is ignored in background jobs of non-interactive shells, which may be how the
    # suite runs: give each child the default, as an interactive shell would.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Background(gpulock_testing.Background):
    """A background process of a test (gpulock_testing.Background); for a Python child, with
    the directory where it and the test exchange marker files."""

    def __init__(self, popen, out_path, err_path, workdir=None):
        super().__init__(popen, out_path, err_path)
        self.dir = workdir  # Python children: where they and the test exchange marker files

    def kill(self, sig=signal.SIGKILL):
        try:
            os.kill(self.pid, sig)
        except ProcessLookupError:
            pass

    # -- marker files of Python children ------------------------------------------------
    def wait_file(self, name, timeout=HANG):
        """Waits until the child has reported `name` and returns what it wrote; fails if the
        child exits first."""
        path = self.dir / name

        def reported():
            if path.exists():
                return True
            if not self.alive() and not path.exists():
                raise AssertionError("child exited before reporting %r\n%s"
                                     % (name, self.describe()))
            return False
        try:
            wait_until(reported, timeout, what="%r from child %d" % (name, self.pid))
        except AssertionError as e:
            raise AssertionError("%s\n%s" % (e, self.describe())) from None
        return path.read_text()

    def wait_json(self, name, timeout=HANG):
        return json.loads(self.wait_file(name, timeout))

    def reported(self, name):
        return (self.dir / name).exists()

    def tell(self, name, text=""):
        """Creates marker file `name` for the child (atomically)."""
        tmp = self.dir / (".%s.tmp" % name)
        tmp.write_text(text)
        os.replace(tmp, self.dir / name)


# Prepended to every Python child's script. argv[1] is the child's own directory.
CHILD_PRELUDE = r'''
import json, os, pathlib, sys, time
import gpulock

HERE = pathlib.Path(sys.argv[1])

def report(name, value=""):
    """Tells the test something: an atomically written marker file."""
    text = value if isinstance(value, str) else json.dumps(value)
    tmp = HERE / (".%s.tmp" % name)
    tmp.write_text(text)
    os.replace(tmp, HERE / name)

def wait_for(name):
    """Waits until the test creates marker file `name`."""
    while not (HERE / name).exists():
        time.sleep(0.01)

def lease_info(lease):
    return {"id": lease.id, "indices": lease.indices, "gpus": lease.gpus,
            "cvd": os.environ.get("CUDA_VISIBLE_DEVICES"), "pid": os.getpid()}
'''


class World:
    """One test's world: helpers to run gpulock and Python children against the test's lock
    directory, to read the machine's state independently, and a record of every process
    started, killed at teardown."""

    def __init__(self, binary, tmp):
        self.binary = binary
        self.tmp = pathlib.Path(tmp)
        self.lock_dir = pathlib.Path(os.environ["GPULOCK_DIR"])
        self.background = []
        self._counter = 0

    def _next(self, prefix):
        self._counter += 1
        return "%s-%d" % (prefix, self._counter)

    def env(self, **extra):
        """The environment for a process of this test: this process's (isolated) one, less
        what a lease taken in this process may have set there."""
        env = {k: v for k, v in os.environ.items() if k not in LEASE_VARIABLES}
        for name, value in extra.items():
            if value is None:
                env.pop(name, None)
            else:
                env[name] = str(value)
        return env

    def use_fake_gpus(self, gpus):
        """Describes the simulated GPUs in a file (docs/simulated-gpus.md), written atomically
        (gpulock re-reads it on every query), and points GPULOCK_FAKE_GPUS at it."""
        path = self.tmp / "gpus.json"
        tmp = path.with_name(".gpus.json.tmp")
        tmp.write_text(json.dumps({"gpus": gpus}, indent=1))
        os.replace(tmp, path)
        os.environ["GPULOCK_FAKE_GPUS"] = str(path)  # restored by monkeypatch's teardown
        return path

    def write(self, name, text):
        path = self.tmp / name
        path.write_text(text)
        return path

    # -- processes ----------------------------------------------------------------------
    def spawn_argv(self, argv, env=None, workdir=None, prefix=()):
        """Starts argv (after `prefix`, e.g. setpriv to run as another user) in the background
        in its own session; killed at teardown."""
        argv = list(prefix) + list(argv)
        name = self._next("bg")
        out = self.tmp / (name + ".out")
        err = self.tmp / (name + ".err")
        with open(out, "wb") as fo, open(err, "wb") as fe:
            popen = subprocess.Popen([str(a) for a in argv],
                                     env=env if env is not None else self.env(),
                                     stdin=subprocess.DEVNULL, stdout=fo, stderr=fe,
                                     cwd=self.tmp, start_new_session=True,
                                     preexec_fn=_default_sigint)
        bg = Background(popen, out, err, workdir)
        self.background.append(bg)
        return bg

    def python(self, script, *args, env=None, prefix=()):
        """Starts a Python child running CHILD_PRELUDE + `script` (dedented) with the package
        under test; returns its Background, whose `dir` is the child's marker directory."""
        name = self._next("child")
        workdir = self.tmp / name
        workdir.mkdir()
        os.chmod(workdir, 0o777)  # a child running as another user reports there too
        path = self.tmp / (name + ".py")
        path.write_text(CHILD_PRELUDE + textwrap.dedent(script))
        os.chmod(path, 0o644)
        return self.spawn_argv([PYTHON, path, workdir] + list(args), env=env, workdir=workdir,
                               prefix=prefix)

    def cli(self, *args, env=None, timeout=HANG, prefix=()):
        """Runs gpulock to completion; returns the CompletedProcess."""
        argv = list(prefix) + [self.binary] + [str(a) for a in args]
        try:
            return subprocess.run(argv, env=env if env is not None else self.env(),
                                  stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                  timeout=timeout, cwd=self.tmp)
        except subprocess.TimeoutExpired as e:
            raise AssertionError("gpulock %s hung (hang guard %ss)\nstdout: %s\nstderr: %s"
                                 % (args, timeout, e.stdout, e.stderr))

    def spawn_cli(self, *args, env=None, prefix=()):
        return self.spawn_argv([self.binary] + list(args), env=env, prefix=prefix)

    def hold(self, *selection, label=None, env=None):
        """`gpulock run SELECTION -- sh` whose command reports its lease and sleeps; returns
        (Background, lease id, [UUIDs]) once the command runs (the lease is taken)."""
        marker = self.tmp / self._next("held")
        args = list(selection) + (["--label", label] if label else [])
        script = 'echo "$GPULOCK_LEASE_ID $GPULOCK_GPUS" > "$1.tmp" && mv "$1.tmp" "$1"; ' \
                 'exec sleep 1000'
        bg = self.spawn_cli("run", *args, "--", "sh", "-c", script, "holder", marker, env=env)

        def started():
            if marker.exists():
                return True
            if not bg.alive():
                raise AssertionError("holder exited early: " + bg.describe())
            return False
        wait_until(started, what="the holder's command to start")
        lease_id, uuids = marker.read_text().split()
        return bg, lease_id, uuids.split(",")

    def no_wait_run(self, gpus, env=None):
        """The independent check of exclusion: `gpulock run --no-wait --gpus GPUS -- true`'s
        exit status (0: they were all free; 75: some are held)."""
        result = self.cli("run", "--no-wait", "--gpus", gpus, "--", "true", env=env)
        assert result.returncode in (0, EX_TEMPFAIL), result.stderr
        return result.returncode

    # -- the machine, seen by the CLI ---------------------------------------------------
    def status(self, env=None):
        result = self.cli("status", "--json", env=env)
        assert result.returncode == 0, "status failed: %s" % result.stderr
        return json.loads(result.stdout)

    def gpu_status(self, index, doc=None):
        doc = doc or self.status()
        for gpu in doc["gpus"]:
            if gpu["display_index"] == str(index):
                return gpu
        raise AssertionError("no GPU %s in status: %s" % (index, doc))

    def states(self):
        return {g["display_index"]: g["state"] for g in self.status()["gpus"]}

    def wait_state(self, index, state, timeout=SHORT_HANG):
        return wait_until(lambda: self.gpu_status(index)["state"] == state, timeout,
                          interval=0.05, what="GPU %s to be %s" % (index, state))

    def holders(self):
        """{display index: holder pid} of the leased GPUs."""
        return {g["display_index"]: g["holder"]["pid"] for g in self.status()["gpus"]
                if g["state"] == "leased" and g["holder"]}

    def queue(self, env=None):
        result = self.cli("queue", "--json", env=env)
        assert result.returncode == 0, "queue failed: %s" % result.stderr
        return json.loads(result.stdout)

    def queue_entry(self, pid, doc=None):
        doc = doc or self.queue()
        found = [e for e in doc["waiting"] if e["pid"] == pid]
        assert len(found) <= 1, doc
        return found[0] if found else None

    def wait_queued(self, bg, timeout=HANG):
        """Waits until `gpulock queue` lists process `bg` as waiting; returns its entry."""
        def queued():
            entry = self.queue_entry(bg.pid)
            if entry:
                return entry
            if not bg.alive():
                raise AssertionError("process exited instead of waiting: " + bg.describe())
            return None
        return wait_until(queued, timeout, interval=0.05,
                          what="process %d to be listed in the queue" % bg.pid)

    # -- teardown -----------------------------------------------------------------------
    def cleanup(self):
        # Detached holders (gpulock acquire) left their session: they are found by this
        # test's tag in their environment.
        gpulock_testing.end_processes(self.background, TAG_VARIABLE,
                                      os.environ.get(TAG_VARIABLE, "?"))


@pytest.fixture
def gl(gpulock_bin, isolated):
    world = World(gpulock_bin, isolated)
    try:
        yield world
    finally:
        world.cleanup()


# -- the stand-in CUDA driver -----------------------------------------------------------------

@pytest.fixture(scope="session")
def fake_cuda():
    """Path of a libcuda.so.1 whose cuDeviceGetCount fails with CUDA_ERROR_NOT_INITIALIZED
    until cuInit(0) is called (fake_cuda.c)."""
    built = os.environ.get("GPULOCK_TEST_FAKE_CUDA")
    if built:
        if not os.path.isfile(built):
            pytest.fail("GPULOCK_TEST_FAKE_CUDA=%s does not exist: build the tests" % built)
        yield built
        return
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.fail("no C compiler to build fake_cuda.c; set GPULOCK_TEST_FAKE_CUDA")
    directory = tempfile.mkdtemp(prefix="gpulock-fake-cuda-")
    path = os.path.join(directory, "libcuda.so.1")
    subprocess.run([compiler, "-shared", "-fPIC", "-fvisibility=hidden",
                    "-Wl,-soname,libcuda.so.1", "-o", path,
                    str(pathlib.Path(__file__).with_name("fake_cuda.c"))],
                   check=True, timeout=HANG)
    yield path
    shutil.rmtree(directory, ignore_errors=True)


def package_version_sources():
    """The version in pyproject.toml and in CMakeLists.txt's project(VERSION ...)."""
    pyproject = (REPO / "pyproject.toml").read_text()
    cmake = (REPO / "CMakeLists.txt").read_text()
    py_version = re.search(r'^version\s*=\s*"([^"]+)"', pyproject, re.M).group(1)
    cmake_version = re.search(r"project\(\s*gpulock\s+VERSION\s+([0-9.]+)", cmake).group(1)
    return py_version, cmake_version


# A stand-in PyTorch (tests/python/standin), for the compat tests: Debian's torch is not needed.
STANDIN = str(pathlib.Path(__file__).with_name("standin"))


@pytest.fixture
def torch_path(monkeypatch):
    """The stand-in torch importable, and not imported yet; forgotten again after the test."""
    monkeypatch.syspath_prepend(STANDIN)
    sys.modules.pop("torch", None)
    yield
    sys.modules.pop("torch", None)
