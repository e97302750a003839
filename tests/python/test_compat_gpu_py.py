"""`gpulock-gpu`, GPU.py (kulvait/GPUGET, seed 003) over gpulock leases: a GPU.py workflow
script runs unchanged except the command name, on the file backend and on Redis, with GPU.py's
lines on stdout and its exit statuses; `--get` waits like GPU.py's BRPOP; the lease is a real
gpulock lease (the CLI cannot take it, and `--get` cannot take the CLI's); and it ends with
`--release` or with the script that asked for it.

The command is the package's console entry point (pyproject.toml), put on PATH here as a small
wrapper around gpulock.compat.gpu_py:main, as pip would install it."""

import os
import stat
import subprocess

import pytest

from conftest import EX_TEMPFAIL, HANG, PYTHON, wait_until
from redis_server import RedisMissing, RedisServer, closed_port

# A GPU.py user's script, unchanged except `GPU.py` -> `gpulock-gpu`. $OPTS are GPU.py's
# connection options (empty on the file backend), $OUT collects what it printed.
WORKFLOW = r'''
gpulock-gpu $OPTS --redis-manage-all >> "$OUT/manage"
read GPUID < <(gpulock-gpu $OPTS --get)
echo "$GPUID" > "$OUT/gpuid.tmp" && mv "$OUT/gpuid.tmp" "$OUT/gpuid"
gpulock-gpu $OPTS --info > "$OUT/info"
gpulock-gpu $OPTS --idle > "$OUT/idle"
gpulock-gpu $OPTS --managed > "$OUT/managed"
gpulock-gpu $OPTS --active > "$OUT/active"
gpulock-gpu $OPTS --log > "$OUT/log"
echo "running on $GPUID" > "$OUT/ran.tmp" && mv "$OUT/ran.tmp" "$OUT/ran"
while [ ! -e "$OUT/finish" ]; do sleep 0.05; done
gpulock-gpu $OPTS --release $GPUID > "$OUT/release"
gpulock-gpu $OPTS --release $GPUID > "$OUT/release-again"
gpulock-gpu $OPTS --idle > "$OUT/idle-after"
'''


@pytest.fixture
def command(gl):
    """A bin directory with `gpulock-gpu` (the console entry point) first on PATH."""
    bindir = gl.tmp / "bin"
    bindir.mkdir()
    wrapper = bindir / "gpulock-gpu"
    wrapper.write_text("#!%s\nimport sys\nfrom gpulock.compat.gpu_py import main\n"
                       "sys.exit(main())\n" % PYTHON)
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    return bindir


def gpupy(gl, command, *args, env=None):
    env = env or gl.env()
    env["PATH"] = "%s%s%s" % (command, os.pathsep, os.environ["PATH"])
    return subprocess.run(["gpulock-gpu"] + [str(a) for a in args], env=env,
                          capture_output=True, text=True, timeout=HANG, cwd=gl.tmp)


def start_workflow(gl, command, name, opts="", env=None):
    out = gl.tmp / name
    out.mkdir()
    script = gl.tmp / (name + ".sh")
    script.write_text(WORKFLOW)
    env = dict(env or gl.env(), OUT=str(out), OPTS=opts)
    env["PATH"] = "%s%s%s" % (command, os.pathsep, os.environ["PATH"])
    return gl.spawn_argv(["/bin/bash", script], env=env), out


def wait_for(job, path):
    def there():
        if path.exists():
            return True
        if not job.alive():
            raise AssertionError("workflow ended early: " + job.describe())
        return False
    wait_until(there, HANG, what=str(path))
    return path.read_text()


@pytest.fixture
def redis():
    try:
        server = RedisServer()
    except RedisMissing as e:
        pytest.fail(str(e))  # CI installs redis-server: never skip
    try:
        yield server
    finally:
        server.close()


@pytest.mark.parametrize("backend", ["file", "redis"])
def test_gpu_py_workflow_unchanged(gl, command, backend, request):
    opts, env = "", gl.env()
    if backend == "redis":
        server = request.getfixturevalue("redis")
        opts = "--redis-server 127.0.0.1 --redis-port %d --redis-prefix pytest" % server.port
        env = gl.env(GPULOCK_HOST="py-a")
    job, out = start_workflow(gl, command, "job", opts, env)
    assert wait_for(job, out / "ran") == "running on 0\n"
    assert (out / "manage").read_text() == "4\n"
    assert (out / "gpuid").read_text() == "0\n"
    assert (out / "info").read_text() == "GPU total:4 managed:4 idle:3\n"
    assert (out / "idle").read_text() == "There is 3 IDDLE GPUs, IDs: 1,2,3\n"
    assert (out / "managed").read_text() == "There is 4 MANAGED GPUs, IDs: 0,1,2,3\n"
    active = (out / "active").read_text().splitlines()
    assert active[0] == "There is 1 ACTIVE GPUs, IDs: 0"
    assert active[1].startswith("GPU 0 acquired by PID %d at " % job.pid)
    log = (out / "log").read_text().splitlines()
    assert len(log) == 1 and log[0].endswith(": GPU 0 acquired by PID %d." % job.pid)
    if backend == "file":
        # The lease is gpulock's: the CLI cannot take the GPU, and status names the script.
        assert gl.no_wait_run("0") == EX_TEMPFAIL
        holder = gl.gpu_status(0)["holder"]
        assert holder["kind"] == "detached" and holder["label"] == "GPU.py"
        assert holder["session"] == job.pid  # held for the script's session
    else:
        assert server.command("KEYS", "gpulock:{pytest}:lock:*")
        redis_env = gl.env(GPULOCK_BACKEND=server.url(), GPULOCK_POOL="pytest",
                           GPULOCK_HOST="py-a")
        assert gl.no_wait_run("0", env=redis_env) == EX_TEMPFAIL
        assert gl.no_wait_run("1", env=redis_env) == 0
    (out / "finish").touch()
    assert job.wait() == 0, job.describe()
    assert (out / "release").read_text() == "GPU 0 released.\n"
    assert (out / "release-again").read_text() == "GPU 0 is already idle.\n"
    assert (out / "idle-after").read_text() == "There is 4 IDDLE GPUs, IDs: 0,1,2,3\n"
    if backend == "file":
        assert gl.no_wait_run("0,1,2,3") == 0


def test_get_waits_like_brpop_and_takes_no_gpu_the_cli_holds(gl, command):
    """GPU.py's --get blocks until a GPU is idle. Here it waits in gpulock's queue: behind the
    CLI's lease, then behind the first script's, and gets the GPU when each ends."""
    os.environ["GPULOCK_FAKE_GPUS"] = "1"
    cli_holder, _, _ = gl.hold("--gpus", "0")
    first, out1 = start_workflow(gl, command, "first")
    gl.wait_queued(first_waiter(gl, first))
    assert not (out1 / "gpuid").exists()
    cli_holder.kill_group()
    assert wait_for(first, out1 / "ran") == "running on 0\n"
    second, out2 = start_workflow(gl, command, "second")
    waiter = first_waiter(gl, second)
    gl.wait_queued(waiter)
    assert gl.no_wait_run("0") == EX_TEMPFAIL
    (out1 / "finish").touch()  # the first script releases GPU 0 with --release
    assert first.wait() == 0, first.describe()
    assert (out1 / "release").read_text() == "GPU 0 released.\n"
    assert wait_for(second, out2 / "ran") == "running on 0\n"
    (out2 / "finish").touch()
    assert second.wait() == 0, second.describe()


class _Pid:
    """What gl.wait_queued needs of a process: its pid and whether it lives."""

    def __init__(self, pid, job):
        self.pid = pid
        self._job = job

    def alive(self):
        return os.path.exists("/proc/%d" % self.pid) and self._job.alive()

    def describe(self):
        return self._job.describe()


def first_waiter(gl, job):
    """The `gpulock acquire` process that the script's `--get` started: it is the one that
    waits in the queue."""
    def found():
        for entry in gl.queue()["waiting"]:
            return _Pid(entry["pid"], job)
        if not job.alive():
            raise AssertionError("workflow ended early: " + job.describe())
        return None
    return wait_until(found, HANG, what="the script's --get to wait in the queue")


def test_lease_ends_with_the_script_that_asked(gl, command):
    """GPU.py kept a GPU acquired by a script that died until someone ran --redis-purge; here
    the lease ends with the script (its shell), however it ends."""
    job, out = start_workflow(gl, command, "job")
    wait_for(job, out / "ran")
    assert gl.gpu_status(0)["state"] == "leased"
    job.kill_group()
    job.wait()
    gl.wait_state(0, "free")
    result = gpupy(gl, command, "--redis-purge")
    assert (result.returncode, result.stdout) == (0, "")


def test_release_of_a_gpu_not_taken_with_get(gl, command):
    holder, _, _ = gl.hold("--gpus", "1")
    result = gpupy(gl, command, "--release", "1")
    assert result.returncode == 1
    assert "not by --get" in result.stderr and "stop that process" in result.stderr
    assert gl.gpu_status(1)["state"] == "leased"
    result = gpupy(gl, command, "--release", "7")
    assert (result.returncode, result.stdout) == (0, "GPU 7 is not managed.\n")


def test_counts_and_no_active(gl, command):
    assert gpupy(gl, command, "--gpu-count").stdout == "4\n"
    assert gpupy(gl, command, "--managed-gpu-count").stdout == "4\n"
    assert gpupy(gl, command, "--active").stdout == "There are no active GPUs.\n"
    assert gpupy(gl, command, "--log").stdout == ""
    result = gpupy(gl, command)
    assert (result.returncode, result.stdout) == (0, "")


def test_managed_by_config_exclusions(gl, command):
    config = gl.write("config.toml", "exclude_gpus = [\"1\"]\n")
    env = gl.env(GPULOCK_CONFIG=config)
    assert gpupy(gl, command, "--managed", env=env).stdout == \
        "There is 3 MANAGED GPUs, IDs: 0,2,3\n"
    assert gpupy(gl, command, "--info", env=env).stdout == "GPU total:4 managed:3 idle:3\n"
    result = gpupy(gl, command, "--redis-manage", "0,1", env=env)
    assert result.returncode == 255 and "exclude_gpus" in result.stderr


def test_unreachable_redis_as_gpu_py_says(gl, command):
    for args in (["--get"], ["--idle"]):
        result = gpupy(gl, command, "--redis-port", closed_port(), *args)
        assert result.returncode == 255, result.stderr
        assert result.stdout == "Can not connect to Redis server, try to start server first.\n"


def test_unreachable_redis_named_by_the_config_as_gpu_py_says(gl, command):
    """Redis chosen by the config's `backend`, not GPULOCK_BACKEND: gpulock decides which backend
    serves, so the compat command reads that, not the environment."""
    config = gl.write("config.toml", 'backend = "redis://127.0.0.1:%s/0"\n' % closed_port())
    env = gl.env(GPULOCK_CONFIG=config)
    env.pop("GPULOCK_BACKEND", None)
    for args in (["--get"], ["--idle"]):
        result = gpupy(gl, command, *args, env=env)
        assert result.returncode == 255, result.stderr
        assert result.stdout == "Can not connect to Redis server, try to start server first.\n"


def test_get_killed_by_a_signal_exits_as_a_shell_says(gl, command):
    """`gpulock acquire` ended by SIGTERM: 143 (128+15), as a shell reports it, not 241."""
    fake = gl.tmp / "killed-gpulock"
    fake.write_text("#!/bin/sh\nkill -TERM $$\n")
    fake.chmod(0o755)
    result = gpupy(gl, command, "--get", env=gl.env(GPULOCK_BINARY=str(fake)))
    assert (result.returncode, result.stdout) == (143, "")


def test_bad_options_are_usage_errors(gl, command):
    result = gpupy(gl, command, "--release", "x")
    assert result.returncode == 2 and "invalid int value" in result.stderr
    result = gpupy(gl, command, "--redis-manage-all", "--redis-manage", "1")
    assert result.returncode == 2


def test_module_entry_point(gl):
    result = subprocess.run([PYTHON, "-m", "gpulock.compat.gpu_py", "--idle"], env=gl.env(),
                            capture_output=True, text=True, timeout=HANG)
    assert (result.returncode, result.stdout) == (0, "There is 4 IDDLE GPUs, IDs: 0,1,2,3\n")


def test_console_script_declared():
    from conftest import REPO
    text = (REPO / "pyproject.toml").read_text()
    assert 'gpulock-gpu = "gpulock.compat.gpu_py:main"' in text



def test_warns_once_a_day_of_gpu_py_keys_on_the_same_server(gl, command, redis):
    """GPU.py and gpulock-gpu do not see each other's GPUs: gpulock-gpu says so when the server
    still holds GPU.py's keys, once (a stamp under XDG_STATE_HOME), for the prefix in use."""
    opts = ["--redis-server", "127.0.0.1", "--redis-port", str(redis.port)]
    env = gl.env(GPULOCK_HOST="py-a", XDG_STATE_HOME=str(gl.tmp / "state"))
    quiet = gpupy(gl, command, *opts, "--idle", env=env)
    assert quiet.returncode == 0 and "GPU.py's keys" not in quiet.stderr
    redis.command("RPUSH", "GPU_IDLE", "0", "1")  # GPU.py --redis-manage-all, default prefix
    first = gpupy(gl, command, *opts, "--idle", env=env)
    assert first.returncode == 0, first.stderr
    assert "also holds GPU.py's keys (GPU_IDLE, GPU_MANAGED, GPU_INIT)" in first.stderr
    assert "do not see each other's GPUs" in first.stderr
    assert first.stdout == "There is 4 IDDLE GPUs, IDs: 0,1,2,3\n"  # gpulock's, not GPU.py's
    again = gpupy(gl, command, *opts, "--idle", env=env)
    assert "GPU.py's keys" not in again.stderr  # once a day
    # Another prefix is another set of GPU.py's keys: none there.
    other = gpupy(gl, command, *opts, "--redis-prefix", "lab", "--idle", env=env)
    assert "GPU.py's keys" not in other.stderr


def test_log_is_the_journal_as_gpu_py_lines(gl, command):
    """--log prints every acquisition and release the journal holds, ended leases included."""
    script = gl.write("twice.sh", 'for i in 1 2; do I=$(gpulock-gpu --get); '
                                  'gpulock-gpu --release "$I" > /dev/null; done\n')
    env = gl.env()
    env["PATH"] = "%s%s%s" % (command, os.pathsep, os.environ["PATH"])
    job = gl.spawn_argv(["/bin/bash", script], env=env)
    assert job.wait() == 0, job.describe()
    lines = gpupy(gl, command, "--log").stdout.splitlines()
    events = [line.split(": ", 1)[1] for line in lines]
    assert events == ["GPU 0 acquired by PID %d." % job.pid, "GPU 0 released by PID %d." % job.pid
                      ] * 2, lines
