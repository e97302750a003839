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


class Unsatisfiable(Error):
    """The request can never be served as asked: more GPUs than exist, an unknown GPU, or GPUs
    that only the lease this process already runs under holds."""


class Unavailable(Error):
    """The GPUs are not free now and the request did not wait (``wait=False``)."""


class Timeout(Unavailable, TimeoutError):
    """The GPUs did not become free within ``timeout`` seconds."""


class SetupError(Error):
    """The machine cannot serve leases: no GPU driver, an unusable lock directory."""


class PermissionDenied(Error, PermissionError):
    """Not allowed, e.g. releasing another user's lease."""


class NotFound(Error, LookupError):
    """No such lease."""


class ConfigError(Error):
    """The administrator's config file (/etc/gpulock/config.toml or GPULOCK_CONFIG) is invalid
    or unreadable."""


class InternalError(Error):
    """A bug or an unexpected system failure."""


class CudaAlreadyInitializedWarning(RuntimeWarning):
    """CUDA was initialised in this process before the lease set CUDA_VISIBLE_DEVICES, so the
    setting does not change which GPUs this process uses."""


# Shown as gpulock.Timeout, not gpulock._errors.Timeout, in tracebacks.
for _class in (Error, InvalidRequest, Unsatisfiable, Unavailable, Timeout, SetupError,
               PermissionDenied, NotFound, ConfigError, InternalError,
               CudaAlreadyInitializedWarning):
    _class.__module__ = "gpulock"
del _class
