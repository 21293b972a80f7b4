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


def _user_frame(tb: object) -> str:
    """``file:line`` of the innermost frame outside hvdprof (where the user called us)."""
    import os
    import traceback

    package_dir = os.path.dirname(os.path.abspath(__file__))
    where = ""
    for frame in traceback.extract_tb(tb):  # type: ignore[arg-type]
        if not os.path.abspath(frame.filename).startswith(package_dir):
            where = f"{frame.filename}:{frame.lineno}"
    return where


def install_excepthook() -> None:
    """Print an uncaught hvdprof error as one clear line instead of a traceback.

    Our errors already name the problem, the rank and the fix; a traceback through the
    runtime's internals only buries that. HVDPROF_LOG_LEVEL=debug keeps the full traceback.
    Other exceptions go to the previous hook untouched.
    """
    import os
    import sys

    previous = sys.excepthook
    if getattr(previous, "_hvdprof", False):
        return

    def hook(exc_type: type[BaseException], exc: BaseException, tb: object) -> None:
        debug = os.environ.get("HVDPROF_LOG_LEVEL", "").strip().lower() == "debug"
        if not issubclass(exc_type, HvdprofError) or debug:
            previous(exc_type, exc, tb)  # type: ignore[arg-type]
            return
        where = _user_frame(tb)
        suffix = (
            f" (raised at {where}; HVDPROF_LOG_LEVEL=debug shows the traceback)" if where else ""
        )
        print(f"hvdprof: error: {exc}{suffix}", file=sys.stderr, flush=True)

    hook._hvdprof = True  # type: ignore[attr-defined]
    sys.excepthook = hook
