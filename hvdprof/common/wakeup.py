"""A sleep that a signal handler can cut short without taking a lock.

Both the launcher (``hvdprof run``'s watch loop) and ``hvdprof dashboard``'s wait for
Ctrl+C sleep in the main thread and are woken by their own signal handlers.
"""

from __future__ import annotations

import contextlib
import selectors
import socket


class Wakeup:
    """A sleep that a signal handler cuts short: :meth:`ring` sends one byte into a
    socket pair that :meth:`wait` watches.

    Not a ``threading.Event``: its ``set()`` takes the plain ``Lock`` of the Event's
    Condition, and a Python signal handler runs in the main thread between two bytecodes
    of whatever it interrupted, possibly inside that same Event's ``wait()`` or
    ``clear()`` while they hold the lock: ``set()`` then waited for its own thread
    forever. ``hvdprof run`` hung so, rarely, on one SIGUSR1 (its ``--timeout`` is
    watched by that thread too); a SIGUSR1 sent while the main thread was running, not
    asleep, hung it within 1 to 54 signals, py-spy showing it in ``Event.set`` from the
    handler, under ``Condition.wait``; and a burst of signals nested one blocked handler
    per signal until a RecursionError ended the launcher. ``send`` on a non-blocking
    socket takes no lock: a handler may ring at any point, even one that interrupted
    another handler (``tests/test_stacks_guard.py`` signals each bytecode of the wait).
    """

    def __init__(self) -> None:
        self._reader, self._writer = socket.socketpair()
        self._reader.setblocking(False)
        self._writer.setblocking(False)
        self._selector = selectors.DefaultSelector()  # (not select(): no FD_SETSIZE limit)
        self._selector.register(self._reader, selectors.EVENT_READ)

    def ring(self) -> None:
        """Wake :meth:`wait` now or, when nothing waits, cut its next call short. Safe
        in a signal handler."""
        with contextlib.suppress(OSError):  # full: a wake-up is pending; closed: none waits
            self._writer.send(b"\0")

    def wait(self, seconds: float) -> None:
        """Sleep ``seconds``, or until :meth:`ring` (a handler interrupting the wait
        rings, and the wait resumes to find the byte: PEP 475)."""
        if self._selector.select(seconds):
            with contextlib.suppress(OSError):  # BlockingIOError: drained
                while self._reader.recv(4096):
                    pass

    def close(self) -> None:
        self._selector.close()
        self._reader.close()
        self._writer.close()


class WakeFlag(Wakeup):
    """A flag that another thread sets and one thread sleeps on, and that a selector can
    watch beside sockets (:attr:`fileno`): the cycle thread sleeps on its peers' sockets
    and on its own rank's submissions at once (see ``ControlChannel.sleep``).

    ``set`` writes a byte only when the flag was clear, so a burst of submissions costs
    one ``send``; a ``set`` that races ``clear`` leaves either the flag or a byte behind,
    and :meth:`wait` honours both, so no wake-up is lost. Lock-free, like
    :class:`Wakeup`.
    """

    def __init__(self) -> None:
        super().__init__()
        self._flag = False

    def set(self) -> None:
        if not self._flag:
            self._flag = True
            self.ring()

    def is_set(self) -> bool:
        return self._flag

    def clear(self) -> None:
        self._flag = False
        with contextlib.suppress(OSError):  # BlockingIOError: drained; closed: stopping
            while self._reader.recv(4096):
                pass

    def wait(self, seconds: float) -> bool:  # type: ignore[override]
        """Sleep until set or ``seconds`` pass; True when set (the byte stays until
        :meth:`clear`, so a selector watching :meth:`fileno` sees it too)."""
        if self._flag:
            return True
        try:
            ready = bool(self._selector.select(seconds))
        except (OSError, ValueError):  # closed under us: the runtime is stopping
            return True
        return ready or self._flag

    def fileno(self) -> int:
        return self._reader.fileno()
