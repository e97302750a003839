"""Issue 41: what a new user and an administrator tripped over in a walkthrough. One test per
defect, named after it (defect N of the issue), each run as a user would meet it."""

import json
import os
import signal
import subprocess
import time

import pytest

from conftest import HANG, wait_until


def test_7_bare_gpulock_prints_the_short_help(gl):
    result = gl.run()
    assert result.returncode == 64
    assert result.stdout == ""
    assert "Usage: gpulock COMMAND" in result.stderr
    assert "gpulock run -n 1 -- CMD" in result.stderr and "gpulock --help" in result.stderr
    assert "A subcommand is required" not in result.stderr


def doctor_in_namespace(gl, setup):
    """`gpulock doctor` for a bash user, in a private mount namespace where `setup` (shell) has
    arranged /usr/share/bash-completion."""
    script = ('mkdir -p /usr/share/bash-completion 2>/dev/null; '
              'mount -t tmpfs tmpfs /usr/share/bash-completion || exit 99; %s; exec "$@"' % setup)
    result = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script,
                             "sh", gl.binary, "doctor"], env=gl.env(SHELL="/bin/bash"),
                            capture_output=True, text=True, timeout=HANG)
    if result.returncode == 99 or "unshare failed" in result.stderr:
        pytest.skip("cannot mount a tmpfs here: " + result.stderr)
    lines = [line for line in result.stdout.splitlines() if "shell completion" in line]
    assert len(lines) == 1, result.stdout
    return lines[0]


def test_8_doctor_says_when_bash_completion_is_missing(gl):
    missing = doctor_in_namespace(gl, "true")
    assert missing.startswith("warning") and "apt install bash-completion" in missing
    present = doctor_in_namespace(gl, "touch /usr/share/bash-completion/bash_completion")
    assert present.startswith("ok")
    # Not a bash user: nothing to say.
    other = gl.run("doctor", env=gl.env(SHELL="/usr/bin/zsh"))
    assert "shell completion" not in other.stdout


def test_10_simulated_gpus_are_said_once(gl):
    lease = gl.run("run", "--verbose", "-n", "2", "--", "true")
    assert lease.returncode == 0, lease.stderr
    line = [x for x in lease.stderr.splitlines() if "leased GPUs" in x][0]
    assert line.count("simulated") == 1 and line.endswith("(4 simulated GPUs)"), line
    for args in (["status"], ["gpus"], ["doctor"]):
        out = gl.run(*args).stdout.replace(str(gl.tmp), "TMP")
        first = [x for x in out.splitlines() if "simulated" in x][0]
        assert first.count("simulated") == 1, (args, first)


def test_6_a_full_shared_gpu_says_whether_memory_or_the_job_cap_stops_it(gl):
    env = gl.env(fake="1")
    gl.hold("--mem", "60G", env=env)
    memory = gl.run("run", "--mem", "30G", "--no-wait", "--", "true", env=env)
    assert memory.returncode == 75
    assert "not enough free memory: 20.0 GiB free for shared leases, 30.0 GiB wanted" in \
        memory.stderr, memory.stderr
    assert "as many jobs" not in memory.stderr and ", or " not in memory.stderr

    capped = gl.env(fake="1", lock_dir=gl.tmp / "capped")
    gl.hold("--slots", "4", env=capped)
    gl.hold("--slots", "4", env=capped)
    # --slots 2: room for half the GPU, and two shared leases on it already.
    cap = gl.run("run", "--slots", "2", "--no-wait", "--", "true", env=capped)
    assert cap.returncode == 75
    assert "as many shared leases as allowed (2" in cap.stderr, cap.stderr
    assert "not enough free memory" not in cap.stderr


@pytest.mark.parametrize("command", [["run", "--", "true"], ["acquire", "-n", "1"]])
def test_12_ctrl_c_while_waiting_says_nothing_is_held(gl, command):
    env = gl.env(fake="1")
    gl.hold("-n", "1", env=env)
    waiter = subprocess.Popen(gl.cmd(*command), env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    wait_until(lambda: json.loads(gl.run("queue", "--json", env=env).stdout)["waiting"], HANG,
               what="the request to queue")
    waiter.send_signal(signal.SIGINT)
    out, err = waiter.communicate(timeout=HANG)
    # Killed by SIGINT, as a shell expects of a command it interrupted ($? is 130).
    assert waiter.returncode == -signal.SIGINT, (waiter.returncode, err)
    assert "gave up waiting (Ctrl-C): nothing is held" in err
    assert json.loads(gl.run("queue", "--json", env=env).stdout)["waiting"] == []
    if command[0] == "acquire":
        # What eval runs stops the script: a lease that never came is never used.
        assert "GPULOCK_LEASE_ID" not in out
        script = subprocess.run(["sh", "-c", 'eval "$1"; echo went on', "sh", out],
                                capture_output=True, text=True, timeout=HANG)
        assert script.returncode != 0 and "went on" not in script.stdout, (out, script)


def test_13_the_first_lease_makes_the_journal_and_its_missing_parents(gl):
    journal = gl.tmp / "var" / "lib" / "gpulock" / "journal"
    env = gl.env(GPULOCK_JOURNAL_DIR=journal)
    ran = gl.run("run", "--label", "first", "--", "true", env=env)
    assert ran.returncode == 0 and "warning" not in ran.stderr, ran.stderr
    assert journal.is_dir() and oct(journal.stat().st_mode & 0o7777) == "0o1777"
    records = json.loads(gl.run("log", "--json", env=env).stdout)["records"]
    assert [r["event"] for r in records] == ["start", "end"]
    assert records[0]["label"] == "first"


def test_1_status_of_a_multi_gpu_lease_names_its_holder_on_every_gpu_row(gl):
    _, lease = gl.hold("-n", "2", label="pair")
    rows = {}
    for line in gl.run("status").stdout.splitlines():
        fields = line.split()
        if fields and fields[0] in ("0", "1"):
            rows[fields[0]] = line
            last = fields[0]
        elif line.startswith(" ") and fields and rows:
            rows[last] += "\n" + line  # a line without a GPU belongs to the row above
    assert lease in rows["0"] and "[pair]" in rows["0"] and "sleep" in rows["0"], rows
    assert lease in rows["1"] and "with GPU 0" in rows["1"], rows
    assert "sleep" not in rows["1"], rows


def read_until_closed(master):
    """Everything written to a pseudo-terminal until its last writer has closed it."""
    out = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: no writer left
            break
        if not chunk:
            break
        out += chunk
    return out


def run_on_terminal(gl, *args, columns=80):
    """gpulock ARGS with stdout on a pseudo-terminal `columns` wide: its lines."""
    import fcntl
    import pty
    import struct
    import termios
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    proc = subprocess.Popen(gl.cmd(*args), env=gl.env(), stdout=slave, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL)
    os.close(slave)
    out = read_until_closed(master)
    proc.wait(timeout=HANG)
    os.close(master)
    assert proc.returncode == 0, proc.stderr.read()
    return out.decode().replace("\r\n", "\n").splitlines()


def test_9_gpus_fits_80_columns_on_a_terminal_and_is_whole_when_piped(gl):
    gl.hold("--mem", "20G")
    narrow = run_on_terminal(gl, "gpus")
    assert len(narrow) == 6 and all(len(line) <= 80 for line in narrow), narrow
    assert "GPU-" not in "\n".join(narrow)  # the UUIDs need --wide
    assert "leased" in narrow[2] and "1 job" in narrow[2], narrow
    wide = run_on_terminal(gl, "gpus", "--wide")
    piped = gl.run("gpus").stdout.splitlines()
    for table in (wide, piped):
        assert any(len(line) > 80 for line in table)
        assert "GPU-" in table[2] and "reserved" in table[2], table


def test_4_release_after_kill_9_of_run_names_the_living_command(gl):
    bg, lease = gl.hold("-n", "1")
    holder = json.loads(gl.run("status", "--json").stdout)["gpus"][0]["holder"]
    run_pid, command_pid = holder["pid"], holder["member_pids"][0]
    os.kill(run_pid, signal.SIGKILL)
    wait_until(lambda: json.loads(gl.run("status", "--json").stdout)["gpus"][0]["holder"]
               ["pid_alive"] is False, HANG, what="run to be seen dead")
    result = gl.run("release", lease)
    assert result.returncode == 69, result.stderr  # not bad usage
    assert "(pid %d)" % command_pid in result.stderr and "kill %d" % command_pid in result.stderr
    assert "outlived its `gpulock run` (pid %d)" % run_pid in result.stderr
    # cancel ends it: the command gets SIGTERM, the GPU comes back.
    ended = gl.run("cancel", lease)
    assert ended.returncode == 0, ended.stderr
    gl.wait_state(0, "free")


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_5_hints_name_where_the_backend_came_from_and_rediss_says_tls(gl, tmp_path):
    url = "redis://127.0.0.1:%d/0" % free_port()  # nothing listens there
    flag = gl.run("status", "--backend", url)
    assert flag.returncode == 69 and "--backend names it" in flag.stderr, flag.stderr
    env = gl.run("status", env=gl.env(GPULOCK_BACKEND=url))
    assert "GPULOCK_BACKEND names it" in env.stderr, env.stderr
    config = tmp_path / "config.toml"
    config.write_text('backend = "%s"\n' % url)
    from_config = gl.run("status", env=gl.env(GPULOCK_CONFIG=config))
    assert "the config's `backend` names it" in from_config.stderr, from_config.stderr
    tls = gl.run("status", "--backend", "rediss://127.0.0.1:6380/0")
    assert tls.returncode == 64 and "TLS is not supported" in tls.stderr, tls.stderr
    assert "unknown backend" not in tls.stderr


def test_5_a_lease_of_root_says_only_root_once(mu):
    a, _ = mu.users
    assert mu.run("status", prefix=a.prefix()).returncode == 0  # the user makes the lock dir
    held = mu.run("acquire", "--for-pid", str(os.getpid()), "-n", "1")
    assert held.returncode == 0, held.stderr
    lease = [w for w in held.stdout.split() if w.startswith("GPULOCK_LEASE_ID=")][0]
    lease = lease.split("=", 1)[1].strip("'\"")
    refused = mu.run("release", lease, prefix=a.prefix())
    assert refused.returncode == 69
    assert "belongs to root; only root can release it" in refused.stderr, refused.stderr
    assert mu.run("release", lease).returncode == 0


def test_2_a_sigkilled_shared_lease_is_not_ended_by_a_shared_lease_beside_it(gl):
    env = gl.env(fake="1")
    doomed, doomed_id = gl.hold("--mem", "10G", env=env)
    time.sleep(1)
    _, beside_id = gl.hold("--mem", "10G", env=env)
    time.sleep(1)
    os.killpg(doomed.popen.pid, signal.SIGKILL)
    doomed.popen.wait(timeout=HANG)
    killed_at = time.time()
    wait_until(lambda: len(json.loads(gl.run("status", "--json", env=env).stdout)["gpus"][0]
                           ["shared"]["leases"]) == 1, HANG, what="the killed lease to go")
    records = json.loads(gl.run("log", "--json", env=env).stdout)["records"]
    starts = {r["lease_id"]: r for r in records if r["event"] == "start"}
    ends = {r["lease_id"]: r for r in records if r["event"] == "end"}
    assert starts[doomed_id]["memory_bytes"] == 10 << 30
    assert beside_id not in ends
    end = ends[doomed_id]
    assert end["how"] == "holder_died" and end["inferred"] is True
    # Not at the other lease's start (which came while it ran), but once it was found gone.
    assert end["time"] >= killed_at - 0.5, (end["time"], starts[beside_id]["time"], killed_at)


def test_init_with_the_redis_backend_still_makes_the_job_store(gl, tmp_path):
    store = tmp_path / "jobs"
    env = gl.env(GPULOCK_BACKEND="redis://127.0.0.1:%d/0" % free_port(), GPULOCK_JOBS_DIR=store)
    result = gl.run("init", env=env)
    assert result.returncode == 0, result.stderr
    assert "nothing to prepare for leases" in result.stdout
    assert "job store: %s" % store in result.stdout
    assert store.is_dir() and oct(store.stat().st_mode & 0o7777) == "0o1777"


def test_11_waiting_lines_one_per_waiter_in_a_log_none_with_quiet(gl):
    env = gl.env(fake="1")
    holder, _ = gl.hold("-n", "1", env=env)
    waiters = [gl.spawn("run", "--", "sleep", "0.2", env=env) for _ in range(4)]
    quiet = gl.spawn("run", "--quiet", "--", "true", env=env)
    wait_until(lambda: len(json.loads(gl.run("queue", "--json", env=env).stdout)["waiting"])
               == 5, HANG, what="five waiters")
    os.killpg(holder.popen.pid, signal.SIGTERM)
    for bg in waiters + [quiet]:
        assert bg.wait() == 0
    for bg in waiters:
        # Their places changed as the ones ahead left: still one line each.
        assert bg.stderr().count("gpulock: waiting") == 1, bg.stderr()
    assert "waiting" not in quiet.stderr()


BACKGROUND_ON_A_TERMINAL = r'''
set -m
"$G" run -- sh -c 'echo background-ran' &
sleep 1
"$G" run -- sh -c 'echo foreground-ran'
wait
'''


def test_11_a_background_job_draws_no_line_on_the_terminal(gl):
    """On a terminal with job control, a background waiter says nothing while the foreground
    one draws its live line."""
    import fcntl
    import pty
    import termios
    env = gl.env(fake="1", G=str(gl.binary))
    holder, _ = gl.hold("-n", "1", env=env)
    master, slave = pty.openpty()

    def controlling_terminal():
        os.setsid()
        fcntl.ioctl(slave, termios.TIOCSCTTY, 0)
    shell = subprocess.Popen(["bash", "--norc", "-c", BACKGROUND_ON_A_TERMINAL], env=env,
                             stdin=slave, stdout=slave, stderr=slave,
                             preexec_fn=controlling_terminal)
    os.close(slave)
    wait_until(lambda: len(json.loads(gl.run("queue", "--json", env=env).stdout)["waiting"])
               == 2, HANG, what="two waiters")
    time.sleep(1.5)  # a few redraws of the live line
    os.killpg(holder.popen.pid, signal.SIGTERM)
    out = read_until_closed(master)
    shell.wait(timeout=HANG)
    os.close(master)
    text = out.decode(errors="replace")
    assert "background-ran" in text and "foreground-ran" in text, text
    # Every waiting line is the foreground one's: it waits for 1 GPU at position 2 of 2.
    lines = [x for x in text.replace("\r", "\n").split("\n") if "waiting" in x]
    assert lines and all("position 2 of 2" in x or "position 1 of 1" in x for x in lines), lines


def test_14_usage_by_gpu_names_each_gpu_beside_its_uuid(gl):
    assert gl.run("run", "--gpus", "1,2", "--", "true").returncode == 0
    doc = json.loads(gl.run("usage", "--by", "gpu", "--json").stdout)
    groups = {g["key"]: g for g in doc["groups"]}
    for index in ("1", "2"):
        uuid = gl.gpu_status(int(index))["uuid"]
        assert groups[uuid]["gpu_index"] == index and groups[uuid]["gpu_name"], groups
    table = gl.run("usage", "--by", "gpu").stdout
    assert "GPU 1 " in table and "GPU 2 " in table, table
    csv = gl.run("usage", "--by", "gpu", "--csv").stdout.splitlines()
    assert csv[0].endswith(",gpu_index,gpu_name") and csv[1].split(",")[5] in ("1", "2")
