"""Every key of a Redis pool damaged, one at a time, while leases are held and waited for
(issue 42): no damaged key may let two jobs share a GPU, each case ends in a clear message or a
recovery, and `gpulock doctor` reports the damage.

Each case is a pool of its own on one real redis-server: fake host node-a with 3 simulated
GPUs, a lease TTL of 3 s, and
  X    an exclusive holder of GPU 0,
  S1   and S2, two shared holders of GPU 1 (1 GiB each),
  W0   a waiter for GPU 0, and W1 an exclusive waiter for GPU 1, both queued,
  W2   (started after the damage) a waiter for GPU 2, where some cases plant an orphan.
Then the key is damaged, `doctor` runs, S2 ends (its release is what freed a GPU shared by S1
when the reservation keys were damaged), and after a while X and S1 end.

The audit is independent of gpulock: every command claims, for each GPU it was given, an O_EXCL
marker (exclusive leases) or a marker of its own beside which no exclusive one may exist
(shared leases), and writes down any clash. Nothing here depends on wall-clock speed: the
pauses only give a wrong grant time to happen, and every wait is a hang guard.
"""

import concurrent.futures
import os
import threading
import time
import traceback

import pytest

from conftest import EX_TEMPFAIL, EX_UNAVAILABLE, HANG, PYTHON, wait_until
pytest.register_assert_rewrite("conftest_redis")  # before its first import
from conftest_redis import RedisWorld, assert_no_crash, unique_pool  # noqa: E402

# The fixtures redis_server, redis_servers and rw.
pytest_plugins = ["conftest_redis"]

# Long enough that a holder on a loaded machine (a sanitizer build, six cases at once) renews in
# time: a holder whose renewals are late loses its lease by its own clock as the server expires
# it, and the audit would count the moment until its command has gone.
TTL = "3s"

# argv: audit dir, "excl" or "shared", the file whose appearance ends the hold ("-": a short
# hold), a name. Claims the markers, says it is ready (DIR/ready.NAME), holds, lets go.
AUDIT = r"""
import os, signal, sys, time
d, mode, until, name = sys.argv[1:5]
made = []
def clash(what):
    with open(os.path.join(d, "overlaps"), "a") as f:
        f.write("%s (%s, pid %d): %s\n" % (name, mode, os.getpid(), what))
def let_go(*_):
    for path in made:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
    os._exit(0)
signal.signal(signal.SIGTERM, let_go)
for uuid in os.environ["GPULOCK_GPUS"].split(","):
    if mode == "excl":
        path = os.path.join(d, uuid + ".excl")
        try:
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            made.append(path)
        except FileExistsError:
            clash("GPU %s held exclusively by another" % uuid)
        if any(f.startswith(uuid + ".shared.") for f in os.listdir(d)):
            clash("GPU %s held by a shared lease" % uuid)
    else:
        path = os.path.join(d, "%s.shared.%d" % (uuid, os.getpid()))
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        made.append(path)
        if os.path.exists(os.path.join(d, uuid + ".excl")):
            clash("GPU %s held exclusively by another" % uuid)
open(os.path.join(d, "ready." + name), "w").close()
if until == "-":
    time.sleep(0.2)
else:
    while not os.path.exists(until):
        time.sleep(0.02)
let_go()
"""


class Case:
    """One pool, its processes and its audit directory."""

    spawn_lock = threading.Lock()  # the harness numbers its output files unlocked

    def __init__(self, gl, server, audit_program):
        self.world = RedisWorld(gl, server, unique_pool("dmg"))
        self.gl = gl
        self.server = server
        self.audit_program = audit_program
        self.dir = gl.tmp / ("audit-" + self.world.pool)
        self.dir.mkdir()
        self.procs = {}
        self.conn = server.connect()  # one per case: a connection's replies are not threadsafe

    def cmd(self, *args):
        return self.conn.command(*args)

    def env(self):
        return self.world.env(host="node-a", gpus=3, ttl=TTL)

    def key(self, name):
        return self.world.key(name)

    def spawn(self, name, selection, mode, hold):
        until = str(self.dir / ("finish." + name)) if hold else "-"
        with Case.spawn_lock:
            bg = self.gl.spawn("run", *selection, "--", PYTHON, self.audit_program, self.dir,
                               mode, until, name, env=self.env())
        self.procs[name] = bg
        return bg

    def wait_ready(self, *names):
        def ready():
            for name in names:
                if not self.procs[name].alive() and not (self.dir / ("ready." + name)).exists():
                    raise AssertionError("%s ended early: %s" % (name, self.procs[name].describe()))
            return all((self.dir / ("ready." + n)).exists() for n in names)
        wait_until(ready, timeout=HANG, interval=0.02, what="%s to hold" % ", ".join(names))

    def finish(self, name):
        (self.dir / ("finish." + name)).touch()

    def overlaps(self):
        path = self.dir / "overlaps"
        return path.read_text() if path.exists() else ""


def lock(uuid):
    return "lock:" + uuid


# Each damage: (name, what it does given the case's facts, the key doctor must name, whether
# GPU 0 is unusable for good after it, and whether gpulock may repair it before doctor looks).
def damages():
    def replace(kind):
        # In one script: a gpulock script running between a DEL and the write would recreate
        # the key first.
        write = {"string": "redis.call('SET', KEYS[1], '\\255 garbage')",
                 "list": "redis.call('RPUSH', KEYS[1], 'garbage')",
                 "hash": "redis.call('HSET', KEYS[1], 'garbage', '1')"}[kind]

        def apply(c, key):
            c.cmd("EVAL", "redis.call('DEL', KEYS[1]) " + write, "1", key)
        return apply

    def persist(c, key):
        c.cmd("PERSIST", key)

    def planted(value, ttl=None):
        def apply(c, key):
            args = ["SET", key, value] + (["PX", str(ttl)] if ttl else [])
            c.cmd(*args)
        return apply

    def hset(field_of, value):
        def apply(c, key):
            c.cmd("HSET", key, field_of(c), value)
        return apply

    def zrem(member_of):
        def apply(c, key):
            c.cmd("ZREM", key, member_of(c))
        return apply

    def plant_ticket(c, key):
        # A queued ticket that nobody renews and that has no expiry, ahead of everyone.
        c.cmd("HSET", key, "body", "{}", "user", "nobody", "hosts", "")
        c.cmd("ZADD", c.key("queue"), "0", "00000000000000ff")

    s1 = lambda c: c.s1  # noqa: E731
    out = [
        # The exclusive holder's lock key: garbage makes the GPU unusable (never free).
        ("lock X wrong type", lambda c: lock(c.uuids[0]), replace("hash"), True, False,
         {"X": "not a lease", "W0": "not a lease"}),
        ("lock X garbage", lambda c: lock(c.uuids[0]), replace("string"), True, False,
         {"X": "not a lease", "W0": "not a lease"}),
        ("lock X no TTL", lambda c: lock(c.uuids[0]), persist, False, True),
        # A planted lock on the free GPU 2: an orphan without a TTL used to block it forever.
        ("orphan lock no TTL", lambda c: lock(c.uuids[2]), planted("0123456789abcdef"),
         False, True),
        ("orphan lock with TTL", lambda c: lock(c.uuids[2]), planted("0123456789abcdef", 1500),
         False, True),
        ("orphan shared mark", lambda c: lock(c.uuids[2]), planted("=shared"), False, True),
        # The shared GPU's reservations.
        # Its holder keeps it, and says that the keys are damaged.
        ("shares wrong type", lambda c: "shares:" + c.uuids[1], replace("string"), False, False,
         {"S1": "are damaged"}),
        ("share_units wrong type", lambda c: "share_units:" + c.uuids[1], replace("list"),
         False, False, {"S1": "are damaged"}),
        ("share_units garbage", lambda c: "share_units:" + c.uuids[1], hset(s1, "lots"),
         False, False, {"S1": "are damaged"}),
        ("shares member gone", lambda c: "shares:" + c.uuids[1], zrem(s1), False, False,
         {"S1": "are damaged"}),
        ("shares no TTL", lambda c: "shares:" + c.uuids[1], persist, False, True),
        ("shared mark no TTL", lambda c: lock(c.uuids[1]), persist, False, True),
        # Leases, tickets and the rest.
        ("lease X wrong type", lambda c: "lease:" + c.x, replace("string"), False, True),
        ("lease X garbage", lambda c: "lease:" + c.x, hset(lambda c: "record", "{bad"), False,
         True),
        ("lease X no TTL", lambda c: "lease:" + c.x, persist, False, True),
        ("ended X planted", lambda c: "ended:" + c.x, planted("1"), False, True),
        ("orphan ticket no TTL", lambda c: "ticket:00000000000000ff", plant_ticket, False,
         True),
        ("orphan lease no TTL", lambda c: "lease:00000000000000fe",
         hset(lambda c: "record", "{}"), False, True),
        ("ticket W0 wrong type", lambda c: "ticket:" + c.ticket, replace("string"), False, True),
        ("wake W0 wrong type", lambda c: "wake:" + c.ticket, replace("string"), False, True),
        ("hosts wrong type", lambda c: "hosts", replace("string"), False, True),
        ("host wrong type", lambda c: "host:node-a", replace("string"), False, True),
        ("gpus wrong type", lambda c: "gpus:node-a", replace("string"), False, True),
        ("gpu wrong type", lambda c: "gpu:" + c.uuids[0], replace("list"), False, True),
        ("queue wrong type", lambda c: "queue", replace("string"), False, True),
        ("queue_seq garbage", lambda c: "queue_seq", planted("x"), False, True),
        ("version wrong type", lambda c: "version", replace("list"), False, True),
        ("frees wrong type", lambda c: "frees", replace("list"), False, True),
        # Renewals put the token counter right (they raise it to their own token).
        ("token wrong type", lambda c: "token", replace("list"), False, True),
        ("token_copy garbage", lambda c: "token_copy", planted("x"), False, True),
        ("held wrong type", lambda c: "held:" + c.user, replace("string"), False, True),
        ("served wrong type", lambda c: "served:" + c.user, replace("list"), False, True),
        ("journal wrong type", lambda c: "journal", replace("string"), False, True),
    ]
    # (name, key, damage, GPU 0 lost, may heal[, {process: what its stderr says}])
    return [d if len(d) == 6 else d + ({},) for d in out]


DAMAGES = damages()


def run_case(gl, server, audit_program, damage):
    name, key_of, apply, gpu0_lost, may_heal, expected_words = damage
    c = Case(gl, server, audit_program)
    c.uuids = c.world.register("node-a", gpus=3)
    c.spawn("X", ("--gpus", "0", "--on-lease-loss", "kill"), "excl", hold=True)
    for s in ("S1", "S2"):
        c.spawn(s, ("--gpus", "1", "--mem", "1G", "--on-lease-loss", "kill"), "shared",
                hold=True)
    c.wait_ready("X", "S1", "S2")
    c.spawn("W0", ("--gpus", "0", "--timeout", "40s"), "excl", hold=False)
    c.spawn("W1", ("--gpus", "1", "--timeout", "40s"), "excl", hold=False)
    wait_until(lambda: c.cmd("ZCARD", c.key("queue")) == 2, timeout=HANG,
               interval=0.02, what="W0 and W1 to queue")
    c.x = c.cmd("GET", c.key(lock(c.uuids[0])))
    shared = c.cmd("ZRANGE", c.key("shares:" + c.uuids[1]), 0, -1)
    c.s1 = shared[0]
    c.ticket = c.cmd("ZRANGE", c.key("queue"), 0, 0)[0]
    c.user = c.cmd("HGET", c.key("lease:" + c.x), "user")

    key = c.key(key_of(c))
    apply(c, key)
    damaged_at_doctor = c.cmd("TYPE", key), c.cmd("PTTL", key)
    doctor = gl.run("doctor", env=c.env())
    assert_no_crash(doctor, name + ": doctor")
    said = doctor.stdout + doctor.stderr
    if key_of(c) not in said:
        # gpulock may have put it right before doctor looked (a renewal, a registration).
        assert may_heal, "%s: doctor did not report %s:\n%s" % (name, key, said)

    c.finish("S2")
    c.spawn("W2", ("--gpus", "2", "--timeout", "40s"), "excl", hold=False)
    time.sleep(1.5)  # time for a wrong grant on GPU 0 or 1 to happen, if one could
    c.finish("X")
    c.finish("S1")
    outcomes = {}
    for proc_name, bg in c.procs.items():
        rc = bg.wait(timeout=HANG)
        outcomes[proc_name] = rc
        result = type("R", (), {"returncode": rc, "stderr": bg.stderr()})
        assert_no_crash(result, "%s: %s" % (name, proc_name))
        if proc_name.startswith("W"):
            assert rc in (0, EX_UNAVAILABLE, EX_TEMPFAIL), "%s: %s exit %d\n%s" % (
                name, proc_name, rc, bg.describe())
            if rc != 0:
                assert "gpulock:" in bg.stderr(), "%s: %s failed silently" % (name, proc_name)
    for proc_name, words in expected_words.items():
        assert words in c.procs[proc_name].stderr(), "%s: %s does not say %r:\n%s" % (
            name, proc_name, words, c.procs[proc_name].describe())
        assert "held by another lease" not in c.procs[proc_name].stderr(), \
            c.procs[proc_name].describe()
    assert c.overlaps() == "", "%s: a GPU was held twice:\n%s\n%s" % (
        name, c.overlaps(), "\n".join(bg.describe() for bg in c.procs.values()))

    # Recovery: every GPU but one whose lock key is garbage is usable again.
    for index in (0, 1, 2):
        if index == 0 and gpu0_lost:
            result = gl.run("run", "--gpus", "0", "--no-wait", "--", "true", env=c.env())
            assert_no_crash(result, name + ": run on the unusable GPU")
            assert result.returncode == EX_UNAVAILABLE and "not a lease" in result.stderr, \
                "%s: %s" % (name, result.stderr)
            continue
        wait_until(lambda: gl.run("run", "--gpus", str(index), "--no-wait", "--", "true",
                                  env=c.env()).returncode == 0,
                   timeout=HANG, interval=0.2,
                   what="%s: GPU %d to be usable again" % (name, index))
    c.conn.close()
    return name, outcomes, damaged_at_doctor


@pytest.fixture
def audit_program(gl):
    path = gl.tmp / "damage_audit.py"
    path.write_text(AUDIT)
    return str(path)


def test_no_damaged_key_lets_two_jobs_share_a_gpu_and_doctor_reports_it(gl, redis_server,
                                                                         audit_program):
    failures = []
    # Fewer at once on a sanitizer build, whose processes are several times slower.
    workers = 3 if "ASAN_OPTIONS" in os.environ else 6
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        futures = {pool.submit(run_case, gl, redis_server, audit_program, d): d[0]
                   for d in DAMAGES}
        for future in concurrent.futures.as_completed(futures):
            try:
                future.result()
            except Exception:  # noqa: BLE001 (every case's failure is reported)
                failures.append("%s: %s" % (futures[future], traceback.format_exc(limit=-3)))
    assert not failures, "\n\n".join(sorted(failures))


def test_doctor_finds_a_damaged_key_of_every_kind(rw):
    """doctor names each damaged key and says what it does, with nothing running."""
    uuids = rw.register("node-a", gpus=3)
    rw.server.command("SET", rw.lock_key(uuids[0]), "0123456789abcdef")  # orphan, no TTL
    rw.server.command("SET", rw.key("share_units:" + uuids[1]), "junk")
    rw.server.command("SET", rw.lock_key(uuids[1]), "=shared", "PX", "60000")
    rw.server.command("SET", rw.key("lease:0123456789abcdee"), "junk")
    rw.server.command("SET", rw.key("ended:0123456789abcdee"), "1")  # no TTL
    doctor = rw.run("doctor")
    assert_no_crash(doctor, "doctor")
    out = doctor.stdout
    assert "lock:%s names lease 0123456789abcdef, which has no record" % uuids[0] in out, out
    assert "it had no expiry" in out, out
    assert "share_units:%s holds a string" % uuids[1] in out, out
    assert "lease:0123456789abcdee holds a string, not a hash" in out, out
    assert "ended:0123456789abcdee has no expiry" in out, out
    # The orphan got an expiry from doctor's own look at the pool: GPU 0 frees after it.
    assert 0 < rw.server.command("PTTL", rw.lock_key(uuids[0])) <= 2000
    wait_until(lambda: rw.run_no_wait("--gpus", "0").returncode == 0, timeout=HANG,
               interval=0.2, what="GPU 0 to be free once its orphan lock expired")


def test_4_the_exhausted_counter_is_named(rw):
    """With only token_copy at 2^64 - 1, the CLI and doctor name token_copy, not token."""
    rw.register("node-a", gpus=1)
    rw.server.command("SET", rw.key("token_copy"), str(2 ** 64 - 1))
    result = rw.run_no_wait("-n", "1")
    assert result.returncode == EX_UNAVAILABLE, result.stderr
    assert rw.key("token_copy") in result.stderr, result.stderr
    doctor = rw.run("doctor")
    assert "%s is %d, the largest 64-bit token" % (rw.key("token_copy"), 2 ** 64 - 1) in \
        doctor.stdout, doctor.stdout


def test_a_user_refused_publish_writes_nothing_when_registering(rw, redis_servers):
    """An ACL that forbids PUBLISH on the pool's channel: register fails before it writes."""
    server = redis_servers(extra_users=[("limited", "pw", ["~*", "&*", "+@all", "-publish"])])
    world = RedisWorld(rw.gl, server, rw.pool)
    result = world.run("status", env=world.env(url=server.url(user="limited", password="pw")))
    assert_no_crash(result, "status")
    assert result.returncode == EX_UNAVAILABLE, result.stderr
    assert server.keys("gpulock:*") == [], server.keys("gpulock:*")


def test_a_waiter_under_maxmemory_warns_once(rw):
    """A server at maxmemory refuses writes while answering everything else (a PING too): a
    waiter whose acquire is refused says so once, not "still waiting" / "answers again" every
    second, and once the server accepts writes again it is served."""
    rw.register("node-a", gpus=1)
    holder = rw.hold("-n", "1")
    waiter = rw.spawn("run", "-n", "1", "--timeout", "60s", "--", "true")
    wait_until(lambda: rw.server.command("ZCARD", rw.key("queue")) == 1, timeout=HANG,
               what="the waiter to queue")
    rw.server.command("CONFIG", "SET", "maxmemory-policy", "noeviction")
    rw.server.command("CONFIG", "SET", "maxmemory", "1")
    try:
        holder.finish()  # its release is refused too: the lock key expires with its TTL
        wait_until(lambda: "still waiting" in waiter.stderr(), timeout=HANG,
                   what="the waiter to meet the refusal")
        time.sleep(4)  # several retries
        assert waiter.stderr().count("still waiting") == 1, waiter.describe()
        assert "again" not in waiter.stderr(), waiter.describe()
    finally:
        rw.server.command("CONFIG", "SET", "maxmemory", "0")
    assert waiter.wait() == 0, waiter.describe()
    assert waiter.stderr().count("still waiting") == 1, waiter.describe()
    assert waiter.stderr().count("again") <= 1, waiter.describe()
