"""``hvdprof run`` holds a SIGUSR1 from its first Python statement on.

SIGUSR1 asks a job for its ranks' Python stacks (``hvdprof stacks``), and its default
action ends a process: a request that reached the launcher before its handler was set
killed it (exit 138), and ``hvdprof run`` used to set the handler only after ~100 ms of
imports (argparse, the config registry, the launcher, the dashboard's and analysis'
parsers). The console script and ``python -m hvdprof`` therefore call :func:`hold_for`
before importing anything else; from then on a SIGUSR1 is only counted here, and the
launcher forwards the count to its ranks once they handle the signal
(:mod:`hvdprof.launch.signal_trap`).

What remains unguarded is the time before Python runs any code of ours: the
interpreter's start, ``site`` and the console script's own ``import re`` (measured in
the README's "Stacks on demand": about 20 ms on an idle machine). Nothing written in
Python can close it; a SIGUSR1 there still ends the launcher.

This module imports only the C half of ``signal`` (``_signal``): ``signal`` itself
imports ``enum``, which costs milliseconds inside that window.
"""

from __future__ import annotations

import _signal

TYPE_CHECKING = False  # (not typing's: importing typing costs milliseconds in the window)
if TYPE_CHECKING:
    from collections.abc import Callable
    from types import FrameType

#: SIGUSR1 where the platform has it (not on Windows)
SIGNUM: int | None = getattr(_signal, "SIGUSR1", None)

_requests = 0
_on_request: Callable[[], None] | None = None


def _count(_signum: int, _frame: FrameType | None) -> None:
    global _requests
    _requests += 1
    wake = _on_request
    if wake is not None:
        wake()


def handler() -> Callable[[int, FrameType | None], None]:
    """The function installed as SIGUSR1's handler (the launcher reinstalls it)."""
    return _count


def hold() -> bool:
    """Count SIGUSR1 from now on instead of dying of it; False where that cannot be done
    (no SIGUSR1, or not the main thread)."""
    if SIGNUM is None:
        return False
    try:
        if _signal.getsignal(SIGNUM) is not _count:
            _signal.signal(SIGNUM, _count)
    except ValueError:  # not the main thread: only it may set handlers
        return False
    return True


def hold_for(command: str | None) -> None:
    """``hold()`` when ``command`` is ``run``: only the launcher forwards SIGUSR1."""
    if command == "run":
        hold()


_taken = 0


def take() -> int:
    """SIGUSR1s received since the last call (since :func:`hold` the first time), so a
    second job in the same process does not inherit the first one's requests."""
    global _taken
    current = _requests  # (a signal between these lines is left for the next call)
    new, _taken = current - _taken, current
    return new


def wake_on_request(callback: Callable[[], None] | None) -> None:
    """Call ``callback`` (in the main thread, from the handler) on every SIGUSR1. It
    runs between two bytecodes of whatever the main thread was doing, so it must take
    no lock: ``threading.Event.set`` deadlocked there
    (:class:`hvdprof.common.wakeup.Wakeup` says how)."""
    global _on_request
    _on_request = callback
