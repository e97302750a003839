"""gpulock's exceptions: their hierarchy (and the built-in exceptions they also are), their
`code` and `exit_status` (the CLI's exit status for the same failure), and which one each
failure raises: busy with wait=False, a timeout, a request that can never be served, malformed
arguments, an invalid config file, a machine without GPUs or with an unusable lock directory."""

import pytest

import gpulock
from conftest import EX_CONFIG, EX_TEMPFAIL, EX_UNAVAILABLE, EX_USAGE


def test_hierarchy():
    assert issubclass(gpulock.Error, RuntimeError)
    for name in ("InvalidRequest", "Unsatisfiable", "Unavailable", "Timeout", "SetupError",
                 "PermissionDenied", "NotFound", "ConfigError", "InternalError"):
        assert issubclass(getattr(gpulock, name), gpulock.Error), name
    assert issubclass(gpulock.InvalidRequest, ValueError)
    assert issubclass(gpulock.Timeout, gpulock.Unavailable)
    assert issubclass(gpulock.Timeout, TimeoutError)
    assert not issubclass(gpulock.Unavailable, TimeoutError)
    assert issubclass(gpulock.PermissionDenied, PermissionError)
    assert issubclass(gpulock.NotFound, LookupError)
    assert issubclass(gpulock.CudaAlreadyInitializedWarning, RuntimeWarning)
    # Shown under the package's name in tracebacks.
    assert gpulock.Timeout.__module__ == "gpulock"
    assert gpulock.Error.__module__ == "gpulock"


def test_busy_without_waiting_is_unavailable_not_timeout(gl):
    holder, lease_id, _ = gl.hold("--gpus", "0")
    with pytest.raises(gpulock.Unavailable) as raised:
        gpulock.lease(gpus=0, wait=False)
    error = raised.value
    assert type(error) is gpulock.Unavailable
    assert not isinstance(error, TimeoutError)
    assert isinstance(error, RuntimeError)  # what the seed tools raised
    assert error.code == "timed_out"
    assert error.exit_status == EX_TEMPFAIL
    assert str(error)
    # Nothing left behind: no queue ticket, GPU 0 still the holder's.
    assert gl.queue()["waiting"] == []
    assert gl.gpu_status(0)["lease_id"] == lease_id


def test_timeout(gl):
    holder, lease_id, _ = gl.hold("--gpus", "0")
    with pytest.raises(gpulock.Timeout) as raised:
        gpulock.lease(gpus=0, timeout=0.2)
    error = raised.value
    assert isinstance(error, TimeoutError) and isinstance(error, gpulock.Unavailable)
    assert error.code == "timed_out"
    assert error.exit_status == EX_TEMPFAIL
    assert gl.queue()["waiting"] == []
    assert gl.gpu_status(0)["lease_id"] == lease_id


def test_timeout_zero_on_free_gpu_succeeds(gl):
    with gpulock.lease(timeout=0) as lease:
        assert lease.indices == [0]


def test_timeout_zero_on_busy_gpu(gl):
    gl.hold("-n", "4")
    with pytest.raises(gpulock.Timeout):
        gpulock.lease(timeout=0)


def test_more_gpus_than_exist_is_unsatisfiable(gl):
    with pytest.raises(gpulock.Unsatisfiable) as raised:
        gpulock.lease(count=99)
    assert raised.value.code == "unsatisfiable"
    assert raised.value.exit_status == EX_UNAVAILABLE
    assert "99" in str(raised.value)


def test_unknown_gpu_is_unsatisfiable(gl):
    with pytest.raises(gpulock.Unsatisfiable):
        gpulock.lease(gpus=7)
    with pytest.raises(gpulock.Unsatisfiable):
        gpulock.lease(gpus="GPU-ffffffff")


@pytest.mark.parametrize("kwargs", [
    {"count": 0},
    {"count": -1},
    {"count": True},
    {"count": 1.5},
    {"count": "2"},
    {"gpus": "x,,"},
    {"gpus": ""},
    {"gpus": []},
    {"gpus": [0, None]},
    {"gpus": True},
    {"gpus": [1.0]},
    {"among": []},
    {"min_free_mem": "lots"},
    {"min_free_mem": "20"},  # a unit is required, as for --min-free-mem
    {"min_free_mem": -1},
    {"min_free_mem": 1.5},
    {"max_util": 101},
    {"max_util": -1},
    {"max_util": 50.5},
    {"max_util": True},
    {"max_power": -5},
    {"max_power": float("nan")},
    {"max_power": "lots"},
    {"max_power": True},
    {"timeout": -1},
    {"timeout": float("nan")},
    {"timeout": float("inf")},
    {"timeout": "10"},
    {"timeout": True},
    {"priority": "urgent"},
    {"priority": None},
    {"label": 5},
    {"visible": "bus"},
], ids=lambda kwargs: ",".join("%s=%r" % item for item in kwargs.items()))
def test_bad_input_is_invalid_request(gl, kwargs):
    with pytest.raises(gpulock.InvalidRequest) as raised:
        gpulock.lease(wait=False, **kwargs)
    error = raised.value
    assert isinstance(error, ValueError)
    assert str(error)
    # Nothing was taken.
    assert gl.no_wait_run("0,1,2,3") == 0


@pytest.mark.parametrize("kwargs", [
    {"count": 0},           # checked by the Python layer
    {"timeout": -1},
    {"max_util": 101},
    {"gpus": []},
    {"gpus": "x,,"},        # checked by the extension
    {"min_free_mem": "lots"},
    {"priority": "urgent"},
], ids=lambda kwargs: ",".join("%s=%r" % item for item in kwargs.items()))
def test_invalid_request_has_the_cli_code_and_exit_status(gl, kwargs):
    """Every InvalidRequest carries the CLI's code and exit status for bad usage, wherever in
    the package it is raised."""
    with pytest.raises(gpulock.InvalidRequest) as raised:
        gpulock.lease(wait=False, **kwargs)
    assert (raised.value.code, raised.value.exit_status) == ("invalid_argument", EX_USAGE)


def test_error_classes_carry_their_code_and_exit_status():
    """An exception made by Python code (the package's own checks, compat modules, users'
    code) says the same as one raised by the extension."""
    expected = {
        gpulock.InvalidRequest: ("invalid_argument", EX_USAGE),
        gpulock.Unsatisfiable: ("unsatisfiable", EX_UNAVAILABLE),
        gpulock.Unavailable: ("timed_out", EX_TEMPFAIL),
        gpulock.Timeout: ("timed_out", EX_TEMPFAIL),
        gpulock.SetupError: ("environment", EX_UNAVAILABLE),
        gpulock.PermissionDenied: ("permission_denied", EX_UNAVAILABLE),
        gpulock.NotFound: ("not_found", EX_UNAVAILABLE),
        gpulock.ConfigError: ("config", EX_CONFIG),
        gpulock.InternalError: ("internal", 70),
    }
    wrong = {cls.__name__: (cls("x").code, cls("x").exit_status)
             for cls, pair in expected.items() if (cls("x").code, cls("x").exit_status) != pair}
    assert wrong == {}


def test_invalid_config_file_is_config_error(gl, monkeypatch):
    config = gl.write("config.toml", 'policy = "fifo"\nthis is not toml\n')
    monkeypatch.setenv("GPULOCK_CONFIG", str(config))
    with pytest.raises(gpulock.ConfigError) as raised:
        gpulock.lease()
    error = raised.value
    assert error.code == "config"
    assert error.exit_status == EX_CONFIG
    assert str(config) in str(error)
    # Status views read it too (as `gpulock status` and `gpulock queue` do).
    with pytest.raises(gpulock.ConfigError):
        gpulock.status()
    with pytest.raises(gpulock.ConfigError):
        gpulock.queue()
    # The CLI agrees on the exit status.
    assert gl.cli("run", "--", "true").returncode == EX_CONFIG


def test_missing_config_file_is_config_error(gl, monkeypatch):
    monkeypatch.setenv("GPULOCK_CONFIG", str(gl.tmp / "no-such-config.toml"))
    with pytest.raises(gpulock.ConfigError) as raised:
        gpulock.lease()
    assert raised.value.exit_status == EX_CONFIG


def test_config_fixed_after_error_takes_effect(gl, monkeypatch):
    """The pool is opened again when GPULOCK_CONFIG changes: a failed open is not cached."""
    bad = gl.write("bad.toml", "[[[\n")
    good = gl.write("good.toml", 'policy = "fifo"\n')
    monkeypatch.setenv("GPULOCK_CONFIG", str(bad))
    with pytest.raises(gpulock.ConfigError):
        gpulock.lease()
    monkeypatch.setenv("GPULOCK_CONFIG", str(good))
    with gpulock.lease() as lease:
        assert lease.active
    assert gpulock.queue().policy == "fifo"


def test_no_gpus_is_setup_error(gl, monkeypatch):
    monkeypatch.delenv("GPULOCK_FAKE_GPUS")
    monkeypatch.setenv("GPULOCK_NVML_LIBRARY", str(gl.tmp / "no-such-libnvidia-ml.so.1"))
    with pytest.raises(gpulock.SetupError) as raised:
        gpulock.lease()
    assert raised.value.code == "environment"
    assert raised.value.exit_status == EX_UNAVAILABLE


def test_unusable_lock_directory_is_setup_error(gl, monkeypatch):
    not_a_dir = gl.write("file", "")
    monkeypatch.setenv("GPULOCK_DIR", str(not_a_dir))
    with pytest.raises(gpulock.SetupError) as raised:
        gpulock.lease()
    assert raised.value.exit_status == EX_UNAVAILABLE


def test_malformed_simulated_gpu_file_is_invalid_request(gl):
    gl.use_fake_gpus([{"memory_total": "40G", "colour": "red"}])
    with pytest.raises(gpulock.InvalidRequest) as raised:
        gpulock.lease()
    assert "colour" in str(raised.value)
    assert raised.value.exit_status == EX_USAGE
