"""Python leases among several users (run as root, switching to two test users, as the
integration tests do): a Python waiter of one user takes its fair turn in the queue against
another user's CLI requests, and gpulock.release() of another user's lease raises
PermissionDenied while root may release it."""

import os
import re
import shutil
import subprocess

import pytest

import gpulock
from conftest import EX_UNAVAILABLE, HANG, SHORT_HANG, World, wait_until
from gpulock_testing import make_test_users, multi_user_dirs, shared_binary_copy


@pytest.fixture(scope="session")
def test_users():
    """Two unprivileged users, created if missing and left in place (a concurrent run of the
    suite, or of the integration tests, may be using them). Skips unless running as root;
    fails if they cannot be created."""
    return make_test_users(uncreatable=pytest.fail)


@pytest.fixture(scope="session")
def shared_install(gpulock_bin):
    """The binary and the package under test, copied where every user can read them."""
    with shared_binary_copy(gpulock_bin, "gpulock-pytest-shared-") as (directory, binary):
        package = os.path.dirname(gpulock.__file__)
        shutil.copytree(package, os.path.join(directory, "python", "gpulock"),
                        ignore=shutil.ignore_patterns("__pycache__"))
        subprocess.run(["chmod", "-R", "a+rX", directory], check=True, timeout=SHORT_HANG)
        yield binary, os.path.join(directory, "python")


@pytest.fixture
def mu(test_users, shared_install, monkeypatch):
    """A world shared by root and the two test users: the shared binary and package, scratch
    files in a world-writable directory, and a lock directory (not yet made) in a directory
    owned by the first user."""
    binary, python_path = shared_install
    with multi_user_dirs("gpulock-pytest-mu-", test_users[0]) as (work, home):
        monkeypatch.setenv("GPULOCK_DIR", os.path.join(home, "locks"))
        monkeypatch.setenv("PYTHONPATH", python_path)
        monkeypatch.setenv("PYTHONNOUSERSITE", "1")
        world = World(binary, work)
        world.users = test_users
        try:
            yield world
        finally:
            world.cleanup()


JOB = ('echo "$1 start" >> "$2"; while [ ! -e "$3/release-$1" ]; do sleep 0.01; done')

PY_JOB = r'''
name, log, where = sys.argv[2], sys.argv[3], pathlib.Path(sys.argv[4])
with gpulock.lease() as lease:
    with open(log, "a") as f:
        f.write("%s start\n" % name)
    while not (where / ("release-" + name)).exists():
        time.sleep(0.01)
'''


def test_python_waiter_gets_its_fair_turn_against_another_users_sweep(mu):
    a, b = mu.users
    os.environ["GPULOCK_FAKE_GPUS"] = "1"
    jobs = mu.tmp / "jobs"
    jobs.mkdir()
    os.chmod(jobs, 0o777)
    log = jobs / "log"
    log.write_text("")
    os.chmod(log, 0o666)

    def starts():
        return [line.split()[0] for line in log.read_text().splitlines()]

    def cli_job(name):
        return mu.spawn_cli("run", "-n", "1", "--", "sh", "-c", JOB, "job", name, log, jobs,
                            prefix=a.prefix())

    procs = {"hold": cli_job("hold")}
    wait_until(lambda: "hold" in starts(), HANG, what="A's first job to start")
    for i in range(3):
        procs["a%d" % i] = cli_job("a%d" % i)
        mu.wait_queued(procs["a%d" % i])
    procs["b"] = mu.python(PY_JOB, "b", log, jobs, prefix=b.prefix())
    entry = mu.wait_queued(procs["b"])
    assert entry["user"] == b.name and entry["uid"] == b.uid
    order = [e["pid"] for e in sorted(mu.queue()["waiting"], key=lambda e: e["position"])]
    assert order[0] == procs["b"].pid, "B's Python request is not first in the fair share"

    (jobs / "release-hold").touch()
    assert procs["hold"].wait() == 0
    wait_until(lambda: len(starts()) == 2, HANG, what="the next job to be served")
    assert starts() == ["hold", "b"]
    gpu = mu.gpu_status(0)
    assert gpu["holder"]["kind"] == "process" and gpu["holder"]["uid"] == b.uid
    (jobs / "release-b").touch()
    assert procs["b"].wait() == 0, procs["b"].describe()
    wait_until(lambda: len(starts()) == 3, HANG, what="A's next job")
    assert starts()[2] == "a0"
    for i in range(3):
        (jobs / ("release-a%d" % i)).touch()
    for i in range(3):
        assert procs["a%d" % i].wait() == 0


def test_release_of_another_users_lease_is_permission_denied(mu):
    a, b = mu.users
    sleeper = mu.spawn_argv(["sleep", "1000"], prefix=a.prefix())
    result = mu.cli("acquire", "--gpus", "1", "--for-pid", sleeper.pid, prefix=a.prefix())
    assert result.returncode == 0, result.stderr
    lease_id = re.search(r"GPULOCK_LEASE_ID='([0-9a-f]{16})'", result.stdout).group(1)

    child = mu.python(r'''
        try:
            gpulock.release(sys.argv[2])
        except gpulock.PermissionDenied as e:
            report("denied", {"permission_error": isinstance(e, PermissionError),
                              "code": e.code, "exit_status": e.exit_status, "message": str(e)})
            sys.exit(3)
    ''', lease_id, prefix=b.prefix())
    assert child.wait() == 3, child.describe()
    denied = child.wait_json("denied")
    assert denied["permission_error"] is True
    assert (denied["code"], denied["exit_status"]) == ("permission_denied", EX_UNAVAILABLE)
    assert a.name in denied["message"]
    assert mu.gpu_status(1)["lease_id"] == lease_id

    gpulock.release(lease_id)  # root may release anyone's lease
    assert mu.gpu_status(1)["state"] == "free"
    assert sleeper.alive()
