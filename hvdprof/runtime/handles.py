"""Handles: how the user's thread waits for an op the cycle thread completes.

No per-handle Event: the cycle completes thousands of small ops per step, so a handle is
a flag plus one process-wide condition that the cycle notifies once per fusion group.
"""

from __future__ import annotations

import threading
from typing import Any

from hvdprof.common import timebase

_cond = threading.Condition(threading.Lock())

#: Whether ``Handle.wait`` notes when it returns (set while a timeline records): the
#: straggler analysis measures a rank's own work from the moment its training thread got
#: control back, not from when the op completed; on a busy machine the wake-up between
#: the two is milliseconds, and it is neither the user's code nor the collective.
note_waits = False
#: thread id -> [ns it spent blocked in ``wait`` since it last submitted, when its last
#: blocking ``wait`` returned]; the runtime takes the entry at the thread's next submission
waits_since_submit: dict[int, list[int]] = {}

#: thread id -> the handle that thread is blocked on in ``Handle.wait``. The cycle thread
#: reads it to tell the other ranks whether this rank's user thread is stuck (see
#: :func:`user_thread_blocked`): rank 0 tells a deadlock from a slow rank with it.
_blocked_on: dict[int, Handle] = {}
#: thread id -> every thread that has ever waited on a handle (the user's threads)
_waiters: dict[int, threading.Thread] = {}
#: called (on the user's thread) as it starts to block on an op that has not completed:
#: the runtime points it at the cycle thread's "negotiate now" event, since a thread that
#: waits submits nothing more until its wait ends, so pacing the cycle gains nothing
on_block: Any = None


def user_thread_blocked() -> bool:
    """Whether this rank's user threads are all blocked on ops that have not completed.

    Blocked: some thread waits on an op that has not completed, none waits on one that
    has (it is about to wake up and may submit more), and every other live thread that
    ever waited on an op is waiting too (one that is not may still submit: a helper
    thread, or one that is computing). A rank whose threads all compute has nobody here.
    Called on the cycle thread *before* it drains the submission queue: a thread submits
    before it waits, so what it waits on is then always in the queue being drained.
    """
    blocked = list(_blocked_on.items())
    if not blocked or any(handle.done_flag for _, handle in blocked):
        return False
    if len(_waiters) > len(blocked):
        waiting = {ident for ident, _ in blocked}
        for ident, thread in list(_waiters.items()):
            if ident in waiting:
                continue
            if thread.is_alive():
                return False
            _waiters.pop(ident, None)  # it has exited (its id may be reused later)
    return True


def blocked_handle(ident: int | None) -> Handle | None:
    """The unfinished op thread ``ident`` waits on in ``Handle.wait``, if any."""
    handle = _blocked_on.get(ident) if ident is not None else None
    return handle if handle is not None and not handle.done_flag else None


def notify_waiters() -> None:
    """Wake every thread blocked in ``Handle.wait``; called after a batch of completions."""
    with _cond:
        _cond.notify_all()


def _note_wait(t_blocked: int) -> None:
    """Add one blocking ``wait``'s time to the calling thread's entry, and when it ended."""
    now = timebase.now_ns()
    me = threading.get_ident()
    entry = waits_since_submit.get(me)
    blocked = now - t_blocked
    if entry is None:
        waits_since_submit[me] = [blocked, now]
    else:
        entry[0] += blocked
        entry[1] = now


class Handle:
    """Completion of one op. Set once, by the cycle thread, with a result or an error."""

    __slots__ = ("done_flag", "error", "name", "release", "result", "retire")

    def __init__(self, name: str) -> None:
        self.name = name
        self.result: Any = None
        self.error: BaseException | None = None
        self.done_flag = False
        #: called by ``wait`` once, on the user's thread (frees a generated name)
        self.release: Any = None
        #: ``retire(name)``, called on failure *before* waiters can see it (frees the name
        #: for reuse); on success the executor retires names in batches instead
        self.retire: Any = None

    def done(self) -> bool:
        return self.done_flag

    def complete(self, result: Any) -> None:
        """Mark done without waking waiters: the caller batches ``notify_waiters``.

        The caller has already retired the name (in a batch, before this).
        """
        self.result = result
        self.done_flag = True

    def fail(self, error: BaseException) -> None:
        if self.done_flag:
            return
        self.error = error
        if self.retire is not None:
            self.retire(self.name)
        self.done_flag = True
        notify_waiters()

    def wait(self) -> Any:
        if not self.done_flag:
            me = threading.get_ident()
            if _waiters.get(me) is not threading.current_thread():
                _waiters[me] = threading.current_thread()
            _blocked_on[me] = self
            if on_block is not None:
                on_block()
            t_blocked = timebase.now_ns() if note_waits else 0
            try:
                with _cond:
                    # the timeout lets a KeyboardInterrupt reach the user promptly
                    while not self.done_flag:
                        _cond.wait(0.5)
            finally:
                _blocked_on.pop(me, None)
            if t_blocked:  # an op already done costs nothing more (the thread never stopped)
                _note_wait(t_blocked)
        if self.release is not None:
            release, self.release = self.release, None
            release()
        if self.error is not None:
            raise self.error
        return self.result
