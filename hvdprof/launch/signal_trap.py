"""The launcher's own signals: recorded, so the watch loop stops the ranks in order.

The main thread only polls: it notices a failed rank, a launcher signal or the
``timeout``, and escalates SIGINT/SIGTERM to SIGKILL after a grace period, so the
launcher can neither hang nor leave orphans behind. A signal handler therefore only
records the signal and wakes the loop, and it takes no lock to do so (:class:`hvdprof.common.wakeup.Wakeup`).
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Iterator

from hvdprof.common.wakeup import Wakeup
from hvdprof.launch import stack_requests

_TRAPPED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
#: forwarded to every rank, which prints its Python stacks (``hvdprof/runtime/stacks.py``)
STACKS_SIGNAL: signal.Signals | None = getattr(signal, "SIGUSR1", None)


class SignalTrap:
    """Record SIGINT/SIGTERM/SIGHUP sent to the launcher instead of dying on them.

    The watch loop turns a recorded signal into an orderly stop of all ranks. Handlers
    can only be installed from the main thread; elsewhere the trap stays empty and the
    caller's thread keeps its default behaviour.

    SIGUSR1 (a request for the ranks' stacks) is counted by
    :mod:`hvdprof.launch.stack_requests`, which ``hvdprof run`` arms as its first
    statement, so a request that arrives before the ranks run is held, not fatal. With
    ``hold_stack_requests`` False (the elastic launcher, which does not forward) it is
    ignored instead. Either way a rank starts with SIGUSR1 ignored (:meth:`spawning`): an
    ignored signal stays ignored across exec, so a request that reaches a rank before
    hvdprof installed its handler is dropped instead of killing it (the default action).
    """

    def __init__(self, hold_stack_requests: bool = False) -> None:
        self.received: list[int] = []
        self._hold = hold_stack_requests
        self._wakeup: Wakeup | None = None
        self._previous: dict[int, object] = {}

    def take_stack_requests(self) -> int:
        """SIGUSR1s not yet forwarded, counted since ``hvdprof run`` started."""
        return stack_requests.take() if self._hold else 0

    def __enter__(self) -> SignalTrap:
        self._wakeup = wakeup = Wakeup()
        if threading.current_thread() is threading.main_thread():
            for signum in _TRAPPED_SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
            if STACKS_SIGNAL is not None:
                self._previous[STACKS_SIGNAL] = signal.getsignal(STACKS_SIGNAL)
                if self._hold:
                    stack_requests.hold()
                    stack_requests.wake_on_request(wakeup.ring)
                else:
                    signal.signal(STACKS_SIGNAL, signal.SIG_IGN)
        return self

    @contextlib.contextmanager
    def spawning(self) -> Iterator[None]:
        """SIGUSR1 ignored while a rank is forked and exec'd (it inherits that); a request
        in those few milliseconds is lost, never fatal."""
        if not self._hold or STACKS_SIGNAL not in self._previous:
            yield
            return
        signal.signal(STACKS_SIGNAL, signal.SIG_IGN)
        try:
            yield
        finally:
            signal.signal(STACKS_SIGNAL, stack_requests.handler())

    def __exit__(self, *exc: object) -> None:
        if self._hold:
            stack_requests.wake_on_request(None)
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)  # type: ignore[arg-type]
        wakeup, self._wakeup = self._wakeup, None
        if wakeup is not None:
            wakeup.close()  # (after the handlers that ring it are gone)

    def _handle(self, signum: int, _frame: object) -> None:
        self.received.append(signum)
        wakeup = self._wakeup
        if wakeup is not None:
            wakeup.ring()

    def sleep(self, seconds: float) -> None:
        """Sleep, but wake early when a signal arrives."""
        if self._wakeup is None:
            time.sleep(seconds)
        else:
            self._wakeup.wait(seconds)
