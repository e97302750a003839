"""gpulock.compat.safe_gpu against what safe-gpu's document describes (seed 001):
`safe_gpu.GPUOwner(nb_gpus)` claims nb_gpus GPUs for as long as the object lives and sets
CUDA_VISIBLE_DEVICES to them; placeholder_fn is called once per device; not enough free GPUs
raises RuntimeError at once; claim_gpus claims for the rest of the process; and the seed's
gpu-acquisitor check (two claimants started in parallel) never gives a GPU to both."""

import gc
import logging
import os

import pytest

import gpulock
from gpulock.compat import GPUOwner, claim_gpus, safe_gpu
from conftest import EX_TEMPFAIL, HANG, wait_until


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
    # Held while the object lives ...
    gc.collect()
    assert gl.no_wait_run("1") == EX_TEMPFAIL
    # ... and given back when it goes.
    del owner
    gc.collect()
    assert gl.no_wait_run("0,1") == 0


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


def test_logger_messages(gl):
    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    logger = logging.getLogger("test-safe-gpu")
    logger.setLevel(logging.INFO)
    logger.propagate = False
    handler = Keep()
    logger.addHandler(handler)
    try:
        owner = safe_gpu.GPUOwner(2, logger=logger, debug_sleep=0.5)
        assert records == ["acquiring lock", "lock acquired", "Set CUDA_VISIBLE_DEVICES=0,1"]
        owner.release()
        assert records[-1] == "lock released"
    finally:
        logger.removeHandler(handler)


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
