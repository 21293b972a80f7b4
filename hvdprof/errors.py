"""The exceptions users see. Each names the problem and, where known, the rank."""

from __future__ import annotations


class HvdprofError(RuntimeError):
    """Base class of every error raised by hvdprof."""


class ConfigError(HvdprofError, ValueError):
    """A malformed ``HVDPROF_*`` variable or option; the message names it and what it accepts."""


class NotInitializedError(HvdprofError, ValueError):
    """An operation was called before ``init()`` (or after ``shutdown()``)."""


class TensorMismatchError(HvdprofError, ValueError):
    """Ranks submitted the same tensor name with different dtype, shape, op or parameters.

    Only the offending op fails, on every rank; the runtime keeps working.
    """


class HvdprofInternalError(HvdprofError):
    """The job can no longer communicate: a rank died, a collective timed out, or the
    runtime was shut down (on any rank). Mirrors ``horovod.common.exceptions.HorovodInternalError``.
    """


class StallAbortError(HvdprofInternalError):
    """Some ranks stopped submitting a tensor for longer than HVDPROF_STALL_SHUTDOWN_TIME_SECONDS."""
