"""gpulock.compat.safe_gpu against what safe-gpu's document describes (seed 001):
`safe_gpu.GPUOwner(nb_gpus)` claims nb_gpus GPUs for as long as the object lives and sets
CUDA_VISIBLE_DEVICES to them; placeholder_fn is called once per device; not enough free GPUs
raises RuntimeError at once; claim_gpus claims for the rest of the process; and the seed's
gpu-acquisitor check (two claimants started in parallel) never gives a GPU to both."""

import contextlib
import gc
import logging
import os
import sys

import pytest

import gpulock
from gpulock.compat import GPUOwner, claim_gpus, safe_gpu
from conftest import EX_TEMPFAIL, HANG, STANDIN, wait_until


def test_importable_as_the_seed_module():
    assert safe_gpu.GPUOwner is GPUOwner
    assert safe_gpu.claim_gpus is claim_gpus
    assert callable(safe_gpu.pytorch_placeholder) and callable(safe_gpu.tensorflow_placeholder)


def test_gpu_owner_claims_and_sets_cuda_visible_devices(gl):
    owner = safe_gpu.GPUOwner(2)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert owner.gpu_ids == [0, 1]
    doc = gl.status()
    leased = {g["display_index"]: g for g in doc["gpus"] if g["state"] == "leased"}
    assert sorted(leased) == ["0", "1"]
    assert all(g["holder"]["label"] == "safe_gpu" and g["holder"]["pid"] == os.getpid()
               for g in leased.values())
    assert gl.no_wait_run("0") == EX_TEMPFAIL and gl.no_wait_run("1") == EX_TEMPFAIL
    # Held while the object lives, and after it goes, as the original's CUDA context was: for
    # the rest of the process, unless released.
    gc.collect()
    assert gl.no_wait_run("1") == EX_TEMPFAIL
    del owner
    gc.collect()
    assert gl.no_wait_run("0") == EX_TEMPFAIL and gl.no_wait_run("1") == EX_TEMPFAIL
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0,1"


def test_gpu_owner_default_is_one_gpu(gl):
    owner = safe_gpu.GPUOwner()
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0"
    assert owner.gpu_ids == [0]
    owner.release()
    assert gl.no_wait_run("0") == 0


def test_gpu_owner_skips_gpus_others_hold(gl):
    gl.hold("--gpus", "0,2")
    owner = safe_gpu.GPUOwner(2)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "1,3"
    owner.release()


def test_placeholder_fn_called_once_per_device(gl):
    calls = []

    def placeholder(device_no):
        calls.append((device_no, os.environ.get("CUDA_VISIBLE_DEVICES")))
        return "tensor-on-%d" % device_no

    gl.hold("--gpus", "0")
    owner = safe_gpu.GPUOwner(3, placeholder_fn=placeholder)
    assert owner.gpu_ids == [1, 2, 3]
    # Device numbers as CUDA sees them once CUDA_VISIBLE_DEVICES is set, which it is already.
    assert calls == [(0, "1,2,3"), (1, "1,2,3"), (2, "1,2,3")]
    assert owner.placeholders == ["tensor-on-0", "tensor-on-1", "tensor-on-2"]
    owner.release()


def test_no_placeholder_by_default(gl):
    owner = safe_gpu.GPUOwner(1)
    assert owner.placeholders == []
    owner.release()


def test_not_enough_free_gpus_raises_runtime_error_at_once(gl):
    holder, _, _ = gl.hold("--gpus", "0,1,2")
    with pytest.raises(RuntimeError) as raised:
        safe_gpu.GPUOwner(2)
    assert isinstance(raised.value, gpulock.Unavailable)
    assert not isinstance(raised.value, TimeoutError)
    assert gl.queue()["waiting"] == []
    assert "CUDA_VISIBLE_DEVICES" not in os.environ
    assert gl.no_wait_run("3") == 0  # nothing taken


def test_more_gpus_than_exist_raises_runtime_error(gl):
    with pytest.raises(RuntimeError) as raised:
        safe_gpu.GPUOwner(5)
    assert isinstance(raised.value, gpulock.Unsatisfiable)


@contextlib.contextmanager
def kept_messages(name):
    """A logger `name` whose messages are kept in a list while the block runs."""
    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    logger = logging.getLogger(name)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    handler = Keep()
    logger.addHandler(handler)
    try:
        yield logger, records
    finally:
        logger.removeHandler(handler)


def test_logger_messages(gl):
    with kept_messages("test-safe-gpu") as (logger, records):
        owner = safe_gpu.GPUOwner(2, logger=logger, debug_sleep=0.5)
        assert records == ["acquiring lock", "lock acquired", "Set CUDA_VISIBLE_DEVICES=0,1"]
        owner.release()
        assert records[-1] == "lock released"


def test_release_and_wait_options(gl):
    owner = safe_gpu.GPUOwner(4)
    owner.release()
    assert not owner.lease.active
    assert gl.no_wait_run("0,1,2,3") == 0
    gl.hold("-n", "4")
    with pytest.raises(TimeoutError):
        safe_gpu.GPUOwner(1, wait=True, timeout=0.2)


# -- between processes --------------------------------------------------------------------

ACQUISITOR = r'''
# The seed's gpu-acquisitor.py: claim nb GPUs, report them, hold them until told.
import logging
from gpulock.compat import safe_gpu
nb = int(sys.argv[2])
logging.basicConfig(level=logging.INFO, format="GPUOwner%(process)d [%(levelname)s] %(message)s")
wait_for("go")
try:
    owner = safe_gpu.GPUOwner(nb, logger=logging.getLogger("acquisitor"))
except RuntimeError as e:
    report("failed", str(e))
    sys.exit(3)
report("claimed", {"cvd": os.environ["CUDA_VISIBLE_DEVICES"], "ids": owner.gpu_ids,
                   "pid": os.getpid()})
wait_for("finish")
'''


def test_gpu_acquisitor_scenario(gl):
    """Seed 001's check: on a machine with 3 free GPUs, one claimant of 1 GPU and one of 2,
    started in parallel, get disjoint GPUs; a third claimant then fails at once."""
    os.environ["GPULOCK_FAKE_GPUS"] = "3"
    one = gl.python(ACQUISITOR, "1")
    two = gl.python(ACQUISITOR, "2")
    for claimant in (one, two):
        claimant.tell("go")
    got_one = one.wait_json("claimed")
    got_two = two.wait_json("claimed")
    assert len(got_one["cvd"].split(",")) == 1 and len(got_two["cvd"].split(",")) == 2
    assert sorted(got_one["ids"] + got_two["ids"]) == [0, 1, 2]
    assert got_one["cvd"] == ",".join(map(str, got_one["ids"]))
    # Independent audit: the machine says who holds what.
    holders = gl.holders()
    assert {i: pid for i, pid in holders.items()} == dict(
        [(str(i), one.pid) for i in got_one["ids"]] + [(str(i), two.pid) for i in got_two["ids"]])
    assert "Set CUDA_VISIBLE_DEVICES=" + got_two["cvd"] in two.stderr()

    third = gl.python(ACQUISITOR, "1")
    third.tell("go")
    assert third.wait() == 3, third.describe()
    assert third.wait_file("failed")
    for claimant in (one, two):
        claimant.tell("finish")
        assert claimant.wait() == 0, claimant.describe()
    assert gl.states() == {"0": "free", "1": "free", "2": "free"}


def test_many_parallel_claimants_never_share(gl):
    """Eight claimants of one GPU each race for four GPUs: four win distinct GPUs, four fail."""
    claimants = [gl.python(ACQUISITOR, "1") for _ in range(8)]
    for c in claimants:
        c.tell("go")

    def settled():
        results = []
        for c in claimants:
            if c.reported("claimed"):
                results.append("claimed")
            elif c.reported("failed"):
                results.append("failed")
            elif not c.alive():
                raise AssertionError(c.describe())
        return results if len(results) == len(claimants) else None
    results = wait_until(settled, HANG, what="every claimant to claim or fail")
    winners = [c for c, r in zip(claimants, results) if r == "claimed"]
    assert len(winners) == 4, results
    ids = sorted(c.wait_json("claimed")["ids"][0] for c in winners)
    assert ids == [0, 1, 2, 3]
    assert sorted(gl.holders().values()) == sorted(c.pid for c in winners)
    for c in winners:
        c.tell("finish")
        assert c.wait() == 0


def test_claim_gpus_holds_for_the_rest_of_the_process(gl):
    child = gl.python(r'''
        import gc
        from gpulock.compat import safe_gpu
        assert safe_gpu.claim_gpus(2) is None
        gc.collect()
        report("claimed", {"cvd": os.environ["CUDA_VISIBLE_DEVICES"]})
        wait_for("exit")
    ''')
    assert child.wait_json("claimed")["cvd"] == "0,1"
    doc = gl.status()
    assert [g["holder"]["label"] for g in doc["gpus"][:2]] == ["safe_gpu", "safe_gpu"]
    assert [g["holder"]["pid"] for g in doc["gpus"][:2]] == [child.pid, child.pid]
    assert gl.no_wait_run("0") == EX_TEMPFAIL
    child.tell("exit")
    assert child.wait() == 0, child.describe()
    assert gl.no_wait_run("0,1") == 0


# -- the whole public surface of safe-gpu 1.x and 2.0 (issue 14) ------------------------------



def test_public_names_of_every_release():
    for name in ("GPUOwner", "claim_gpus", "release_gpus", "gpu_owner", "PytorchPlaceholder",
                 "TensorflowPlaceholder", "PyCudaPlaceholder", "pytorch_placeholder",
                 "tensorflow_placeholder", "get_free_gpus", "NvidiasmiError", "LOCK_FILENAME",
                 "SafeLock", "SafeUmask", "get_nvidia_smi_value", "is_single_gpu_display_mode"):
        assert hasattr(safe_gpu, name), name
    assert issubclass(safe_gpu.NvidiasmiError, Exception)
    assert safe_gpu.is_single_gpu_display_mode() is False
    lines = ["Attached GPUs                  : 1", "    Display Mode   : Enabled"]
    assert safe_gpu.get_nvidia_smi_value(lines, "Display Mode") == "Enabled"
    with pytest.raises(KeyError):
        safe_gpu.get_nvidia_smi_value(lines, "Nope")
    before = os.umask(0o022)
    os.umask(before)
    with safe_gpu.SafeUmask(0o077):
        assert os.umask(0o077) == 0o077
    assert os.umask(before) == before


def test_claim_gpus_sets_module_gpu_owner(gl, monkeypatch):
    """README (1.5+): claim_gpus() stores its GPUOwner in safe_gpu.gpu_owner; recipes print
    safe_gpu.gpu_owner.devices_taken."""
    monkeypatch.setattr(safe_gpu, "gpu_owner", None)
    gl.hold("--gpus", "0")
    assert safe_gpu.claim_gpus(2, debug_sleep=0.0) is None
    owner = safe_gpu.gpu_owner
    assert isinstance(owner, safe_gpu.GPUOwner)
    assert owner.devices_taken == [1, 2]
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "1,2"
    assert os.environ["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert gl.no_wait_run("1") == EX_TEMPFAIL
    safe_gpu.release_gpus()
    assert gl.no_wait_run("1,2") == 0
    assert "CUDA_VISIBLE_DEVICES" not in os.environ


def test_release_gpus_without_claim_is_a_clear_error(gl, monkeypatch):
    monkeypatch.setattr(safe_gpu, "gpu_owner", None)
    with pytest.raises(RuntimeError, match="claim_gpus"):
        safe_gpu.release_gpus()


def test_placeholder_classes_with_release(gl, torch_path):
    """2.0's placeholders: objects called with each device number, whose release() the owner
    calls from release_gpus(); PyTorch's made on cuda:0 .. n-1 after CUDA_VISIBLE_DEVICES."""
    import torch
    with kept_messages("test-safe-gpu-placeholders") as (logger, records):
        owner = safe_gpu.GPUOwner(2, placeholder_fn=safe_gpu.PytorchPlaceholder(logger),
                                  logger=logger)
        assert torch.cuda.calls == [("zeros", "cuda:0"), ("zeros", "cuda:1")]
        assert owner.placeholders == [("tensor", "cuda:0"), ("tensor", "cuda:1")]
        owner.release_gpus()
        assert "Releasing placeholder on CUDA device: 0" in records
        assert "Did nothing, PyTorch doesn't expose interface for releasing GPUs" in records
        assert records[-1] == "lock released"
        assert owner.placeholders == []
        safe_gpu.TensorflowPlaceholder(logger).release(None)
        assert records[-1] == "Did nothing, TensorFlow doesn't expose interface for releasing GPUs"
    assert gl.no_wait_run("0,1") == 0


def test_pycuda_placeholder_release_detaches(gl):
    detached = []

    class Context:
        def detach(self):
            detached.append(True)

    class FakePyCuda(safe_gpu.PyCudaPlaceholder):
        def __call__(self, device_no):
            return Context()

    owner = safe_gpu.GPUOwner(1, placeholder_fn=FakePyCuda())
    owner.release_gpus()
    assert detached == [True]


def test_1x_placeholder_functions(gl, torch_path):
    import torch
    owner = safe_gpu.GPUOwner(1, placeholder_fn=safe_gpu.pytorch_placeholder)
    assert torch.cuda.calls == [("zeros", "cuda:0")]
    owner.release_gpus()  # a plain function has no release(): only the lease ends
    assert gl.no_wait_run("0") == 0


def test_allocate_gpus_and_devices_taken(gl):
    owner = safe_gpu.GPUOwner(1)
    assert owner.devices_taken == [0]
    assert owner.placeholder_fn is None and owner.debug_sleep == 0.0
    owner.release_gpus()


def test_get_free_gpus(gl):
    gl.hold("--gpus", "1")
    assert safe_gpu.get_free_gpus() == ["0", "2", "3"]


def test_preset_visible_devices_limit_the_claim(gl, monkeypatch):
    """safe-gpu overwrote CUDA_VISIBLE_DEVICES and could claim GPUs the job was not given;
    here only the GPUs it shows may be claimed, and devices_taken are what it then sets."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    gl.hold("--gpus", "2")
    owner = safe_gpu.GPUOwner(1)
    assert owner.devices_taken == [3]
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "3"
    with pytest.raises(RuntimeError):
        safe_gpu.GPUOwner(1)
    owner.release_gpus()
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "2,3"


# The repository's own test script's steps (its gpu-acquisitor.py), written afresh: options
# --nb-gpus, --explicit-owner-object, a PyTorch placeholder with the script's logger, the
# allocated devices logged, a computation on cuda:0 .. n-1, then finished.
GPU_ACQUISITOR = r'''
import argparse, logging
from gpulock.compat import safe_gpu
parser = argparse.ArgumentParser()
parser.add_argument("--id", type=int, default=1)
parser.add_argument("--nb-gpus", type=int, default=1)
parser.add_argument("--sleep", type=float, default=0.0)
parser.add_argument("--explicit-owner-object", action="store_true")
args = parser.parse_args(sys.argv[2:])
logging.basicConfig(format="%(name)s %(asctime)s [%(levelname)s] %(message)s")
logger = logging.getLogger(f"GPUOwner{args.id}")
logger.setLevel(logging.INFO)
placeholder = safe_gpu.PytorchPlaceholder(logger)
if args.explicit_owner_object:
    owner = safe_gpu.GPUOwner(nb_gpus=args.nb_gpus, placeholder_fn=placeholder, logger=logger,
                              debug_sleep=args.sleep)
    taken = owner.devices_taken
else:
    safe_gpu.claim_gpus(nb_gpus=args.nb_gpus, placeholder_fn=placeholder, logger=logger,
                        debug_sleep=args.sleep)
    taken = safe_gpu.gpu_owner.devices_taken
logger.info(f"Allocated devices: {taken}")
import torch
results = [torch.zeros((2, 2), device=f"cuda:{n}") for n in range(args.nb_gpus)]
report("allocated", {"taken": taken, "cvd": os.environ["CUDA_VISIBLE_DEVICES"],
                     "calls": torch.cuda.calls})
wait_for("finish")
logger.info("Finished")
'''


@pytest.mark.parametrize("explicit", [False, True])
def test_repository_test_script_runs(gl, explicit):
    env = gl.env(PYTHONPATH=STANDIN + os.pathsep + os.environ["PYTHONPATH"])
    extra = ["--explicit-owner-object"] if explicit else []
    one = gl.python(GPU_ACQUISITOR, "--id", "1", "--nb-gpus", "1", *extra, env=env)
    got_one = one.wait_json("allocated")
    two = gl.python(GPU_ACQUISITOR, "--id", "2", "--nb-gpus", "2", *extra, env=env)
    got_two = two.wait_json("allocated")
    assert got_one["taken"] == [0] and got_one["cvd"] == "0"
    assert got_two["taken"] == [1, 2] and got_two["cvd"] == "1,2"
    assert got_two["calls"] == [["zeros", "cuda:0"], ["zeros", "cuda:1"],
                                ["zeros", "cuda:0"], ["zeros", "cuda:1"]]
    assert gl.holders() == {"0": one.pid, "1": two.pid, "2": two.pid}
    assert gl.no_wait_run("2") == EX_TEMPFAIL
    for child, name in ((one, "GPUOwner1"), (two, "GPUOwner2")):
        child.tell("finish")
        assert child.wait() == 0, child.describe()
        log = child.stderr()
        for line in ("[INFO] acquiring lock", "[INFO] lock acquired",
                     "[INFO] Allocated devices: ", "[INFO] Finished"):
            assert line in log, log
        assert log.startswith(name)
    assert "Set CUDA_VISIBLE_DEVICES=1,2" in two.stderr()
    assert gl.no_wait_run("0,1,2") == 0


# -- claims as the original made them: again, inside a lease, and without a variable ----------

SECOND_CLAIM_CHILD = r'''
from gpulock.compat import safe_gpu
first = safe_gpu.GPUOwner(1)
second = safe_gpu.GPUOwner(1)  # as the original: one more free GPU, CUDA_VISIBLE_DEVICES = it
result = {"first": first.devices_taken, "second": second.devices_taken,
          "cvd": os.environ["CUDA_VISIBLE_DEVICES"]}
safe_gpu.claim_gpus(1)
safe_gpu.claim_gpus(1)  # replaces safe_gpu.gpu_owner; the one it replaces keeps its GPU
result["claimed"] = safe_gpu.gpu_owner.devices_taken
report("claimed", result)
wait_for("release")
second.release_gpus()
report("released", {"cvd": os.environ["CUDA_VISIBLE_DEVICES"]})
wait_for("finish")
'''


def test_a_second_claim_in_one_process_claims_more_gpus_as_the_original(gl):
    child = gl.python(SECOND_CLAIM_CHILD)
    assert child.wait_json("claimed") == {"first": [0], "second": [1], "cvd": "1",
                                          "claimed": [3]}
    assert gl.holders() == {"0": child.pid, "1": child.pid, "2": child.pid, "3": child.pid}
    child.tell("release")
    assert child.wait_json("released") == {"cvd": "3"}  # claim_gpus's value is still set
    assert gl.states()["1"] == "free"
    child.tell("finish")
    assert child.wait() == 0, child.describe()
    assert set(gl.states().values()) == {"free"}  # the rest went with the process


UNBOUND_OWNER_CHILD = r'''
import gc
from gpulock.compat import safe_gpu
safe_gpu.GPUOwner(2)  # not kept in a variable: the original's context held the GPUs anyway
gc.collect()
report("claimed", {"cvd": os.environ["CUDA_VISIBLE_DEVICES"]})
wait_for("finish")
'''


def test_an_owner_not_kept_in_a_variable_keeps_its_gpus_to_the_end_of_the_process(gl):
    child = gl.python(UNBOUND_OWNER_CHILD)
    assert child.wait_json("claimed") == {"cvd": "0,1"}
    assert gl.holders() == {"0": child.pid, "1": child.pid}
    assert gl.no_wait_run("0") == EX_TEMPFAIL
    child.tell("finish")
    assert child.wait() == 0, child.describe()
    assert set(gl.states().values()) == {"free"}


INSIDE_A_LEASE_CHILD = r'''
from gpulock.compat import lock_gpu, safe_gpu
result = {"cvd": os.environ["CUDA_VISIBLE_DEVICES"]}
one = safe_gpu.GPUOwner(1)
result["one"] = [one.devices_taken, os.environ["CUDA_VISIBLE_DEVICES"]]
two = safe_gpu.GPUOwner(1)
result["two"] = [two.devices_taken, os.environ["CUDA_VISIBLE_DEVICES"]]
try:
    safe_gpu.GPUOwner(1)
    result["three"] = "claimed"
except RuntimeError as e:
    result["three"] = type(e).__name__
two.release_gpus()
one.release_gpus()
result["cvd_after"] = os.environ["CUDA_VISIBLE_DEVICES"]
report("done", result)
wait_for("finish")
'''

INSIDE_LOCK_GPU_CHILD = r'''
from gpulock.compat import lock_gpu, safe_gpu
with lock_gpu() as lock:  # 0.2.1: a GPU of its own, exported; a claim inside is lent it
    inner = safe_gpu.GPUOwner(1)
    result = [lock.uid, inner.devices_taken, os.environ["CUDA_VISIBLE_DEVICES"]]
    inner.release_gpus()
    result.append(os.environ["CUDA_VISIBLE_DEVICES"])
report("done", result)
wait_for("finish")
'''


def test_claims_inside_gpulock_run_and_lock_gpu_are_lent_their_gpus(gl):
    """safe_gpu raised Unsatisfiable inside `gpulock run -n 2` (the job's own GPUs were all it
    could see) and inside a lock_gpu() block; they are lent the enclosing lease's GPUs now, and
    fail as the original did (no free GPU) once all are lent."""
    gl.hold("--gpus", "0")
    child = gl.python(INSIDE_A_LEASE_CHILD, prefix=[gl.binary, "run", "-n", "2", "--"])
    assert child.wait_json("done") == {
        "cvd": "1,2", "one": [[1], "1"], "two": [[2], "2"], "three": "Unavailable",
        "cvd_after": "1,2"}
    holders = gl.holders()
    assert holders["1"] == holders["2"] == child.pid  # the run's lease only
    assert gl.no_wait_run("3") == 0
    child.tell("finish")
    assert child.wait() == 0, child.describe()
    child = gl.python(INSIDE_LOCK_GPU_CHILD)
    assert child.wait_json("done") == [1, [1], "1", "1"]  # GPU 0 is still held
    assert gl.states()["1"] == "free"  # the block has ended
    child.tell("finish")
    assert child.wait() == 0, child.describe()
