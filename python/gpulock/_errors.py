"""The exceptions gpulock raises.

Every failure is a ``gpulock.Error`` (itself a ``RuntimeError``, which is what the seed tools
raised), with ``code`` (e.g. ``"timed_out"``) and ``exit_status`` (what the CLI would exit with).
The subclasses also derive from the matching built-in exception where there is one, so
``except TimeoutError`` and ``except PermissionError`` work as expected.

Ctrl-C while waiting raises ``KeyboardInterrupt`` (or whatever the SIGINT handler raises).
"""

from __future__ import annotations


class Error(RuntimeError):
    """Any gpulock failure."""

    code: str = "internal"
    exit_status: int = 70


class InvalidRequest(Error, ValueError):
    """The request is malformed: a bad GPU list, a negative timeout, an unknown option value."""

    code = "invalid_argument"
    exit_status = 64


class Unsatisfiable(Error):
    """The request can never be served as asked: more GPUs than exist, an unknown GPU, or GPUs
    that only the lease this process already runs under holds."""

    code = "unsatisfiable"
    exit_status = 69


class Unavailable(Error):
    """The GPUs are not free now and the request did not wait (``wait=False``)."""

    code = "timed_out"
    exit_status = 75


class Timeout(Unavailable, TimeoutError):
    """The GPUs did not become free within ``timeout`` seconds."""

    code = "timed_out"
    exit_status = 75


class SetupError(Error):
    """The machine cannot serve leases: no GPU driver, an unusable lock directory."""

    code = "environment"
    exit_status = 69


class PermissionDenied(Error, PermissionError):
    """Not allowed, e.g. releasing another user's lease."""

    code = "permission_denied"
    exit_status = 69


class NotFound(Error, LookupError):
    """No such lease."""

    code = "not_found"
    exit_status = 69


class ConfigError(Error):
    """The administrator's config file (/etc/gpulock/config.toml or GPULOCK_CONFIG) is invalid
    or unreadable."""

    code = "config"
    exit_status = 78


class InternalError(Error):
    """A bug or an unexpected system failure."""

    code = "internal"
    exit_status = 70


class CudaAlreadyInitializedWarning(RuntimeWarning):
    """CUDA was initialised in this process before the lease set CUDA_VISIBLE_DEVICES, so the
    setting does not change which GPUs this process uses."""


# Shown as gpulock.Timeout, not gpulock._errors.Timeout, in tracebacks.
for _class in (Error, InvalidRequest, Unsatisfiable, Unavailable, Timeout, SetupError,
               PermissionDenied, NotFound, ConfigError, InternalError,
               CudaAlreadyInitializedWarning):
    _class.__module__ = "gpulock"
del _class
