"""The background cycle: drain the queue, negotiate, fuse, run, complete. Every cycle.

Each cycle every rank contributes one small vector to an exchange on the control channel:
a 10-byte header (slow-path message length and flags) followed by one byte per response
cache entry. Rank 0 gathers every vector and replies with their reduction
(``cycle_header``), so from that one exchange every rank knows, identically:
- which cached names are ready on every rank (the fast path: no coordinator);
- whether anyone has new names (then rank 0 gathers them and broadcasts responses);
- whether any rank asked to shut down, has joined, or wants the timeline switched;
- which rank is late, for the timeline's readiness marks (the reply then carries every
  rank's vector: only while some rank records them).
Rank 0, which holds every vector, also knows which rank is late for the stall inspector,
and whether every rank's user thread is blocked waiting on an op (a deadlock, when the
ops they wait on are ones other ranks have not submitted).
"""

from __future__ import annotations

import logging
import os
import pickle
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hvdprof.common import timebase
from hvdprof.common.activities import NVTX_NEGOTIATE, STALL
from hvdprof.common.records import (
    NO_TIME,
    CacheTable,
    CycleObserver,
    CycleRecord,
    OpBatch,
    TunableParams,
)
from hvdprof.common.wakeup import WakeFlag
from hvdprof.config import Config
from hvdprof.errors import HvdprofInternalError, StallAbortError, TensorMismatchError
from hvdprof.runtime import stacks
from hvdprof.runtime.control import ControlChannel
from hvdprof.runtime.cycle_header import (
    BLOCKED,
    HEADER,
    JOINED,
    QUIET_BUSY,
    QUIET_IDLE,
    QUIET_SLEEP,
    QUIET_WAIT,
    WORK,
    OwnHeader,
    Said,
    nothing_said,
    reduce,
)
from hvdprof.runtime.directives import (
    Abort,
    ClockSync,
    Directive,
    NewParams,
    ReportStacks,
    StallShutdown,
)
from hvdprof.runtime.executor import Executor
from hvdprof.runtime.handles import blocked_handle, notify_waiters, user_thread_blocked
from hvdprof.runtime.negotiation import (
    AgreedOp,
    Coordinator,
    CoordinatorReply,
    NegotiatedOp,
    RequestMeta,
    ResponseCache,
    merge_requests,
    read_merged,
)
from hvdprof.runtime.requests import Request
from hvdprof.runtime.stall import DeadlockDetector, Stall, StallInspector, describe_deadlock
from hvdprof.runtime.steps import StepCounter
from hvdprof.runtime.threads import limit_this_thread

log = logging.getLogger("hvdprof")

_RING = 1 << 16  # cycles of start times kept for readiness marks
_IDLE_SLEEP_MAX_S = 0.01  # idle back-off: a quiet job ticks every 10 ms
#: under MPI (where ranks cannot sleep on their links), idle that long on every rank, the
#: ranks tick every _IDLE_SLEEP_MAX_S instead of every cycle
_IDLE_BEFORE_BACKOFF_S = 0.02
_STALL_EVERY_S = 1.0
_BURST_WAIT_MAX_S = 0.02  # longest wait for a burst of submissions to finish
#: a rank whose training thread is blocked starts its cycles at least this often (see
#: ``_run``): at once when the last cycle waited for a peer, paced when it did not
_BLOCKED_PACE_S = 0.001
_PARTIAL_WATCH_EVERY_S = 0.25  # stalls are reported after many seconds; sample the bits
_SLEEP = "sleep"  # the reply said: every rank sleeps until one has work
_SLEEP_PACED = "sleep after work"  # ... after a WORK cycle (WORK_THEN_SLEEP)


@dataclass(slots=True)
class _Agreed:
    """What every rank agreed to run in one cycle: the ops and this rank's request for
    each (None where this rank has joined), the cached ones first."""

    ops: list[AgreedOp] = field(default_factory=list)
    reqs: list[Request | None] = field(default_factory=list)
    n_cached: int = 0
    reply: CoordinatorReply | None = None


class CycleLoop:
    """Owns all negotiation state; only its own thread touches it after ``start``."""

    def __init__(
        self,
        config: Config,
        rank: int,
        size: int,
        control: ControlChannel,
        executor: Executor,
        params: TunableParams,
    ) -> None:
        self.config = config
        self.rank = rank
        self.size = size
        self.control = control
        self.executor = executor
        self.params = params
        #: receives this rank's clock ping-pong samples (the timeline's clock correction)
        self.on_clock_samples: Callable[[list[tuple[int, int, int]]], None] | None = None
        self.nvtx: Any = None  # PhaseRanges: push(name)/pop(), no-ops when NVTX is off
        #: ``on_instant(name, args)``: an instant for this rank's timeline (a stall on rank
        #: 0, a stack dump), called on the cycle thread
        self.on_instant: Callable[[str, dict[str, Any]], None] | None = None
        #: called on the cycle thread when it dies of an error (under MPI: abort the job,
        #: since the other ranks wait inside blocking MPI calls that nothing else ends)
        self.on_fatal: Callable[[BaseException], None] | None = None
        #: a stall that ends the job (HVDPROF_STALL_SHUTDOWN_TIME_SECONDS) ends this process
        #: with this exit code, after the timeline is closed (``hvdprof run``: the
        #: launcher then stops the job); None: the user's threads get StallAbortError
        self.stall_exit_code: int | None = None
        self._exit_code: int | None = None
        self._last_clock_sync = time.monotonic()

        # fed by the user's threads
        self.queue: deque[Request] = deque()
        self.commands: deque[Callable[[], None]] = deque()
        #: set by each submission (and by shutdown, join, commands, rank 0's orders): a
        #: flag a selector can watch beside the control sockets, for the idle sleep
        self.wake = WakeFlag()
        #: set when a user thread starts to wait on an unfinished op: the cycle's pacing
        #: sleep ends at once (that thread submits nothing more until the wait ends)
        self.urgent = threading.Event()
        self.shutdown_requested = False
        self.join_handle: Any = None

        # owned by the cycle thread
        self.cache = ResponseCache(config.cache_capacity if params.cache_enabled else 0)
        #: the job's process sets (set by the runtime; None: every op is global)
        self.sets: Any = None
        self.coordinator = Coordinator(size) if rank == 0 else None
        check_s = config.stall_check_time_s
        self.stall = StallInspector(size, check_s, config.stall_shutdown_time_s)
        # A deadlock is reported well within the stall check time: confirmed over half of
        # it (at most 2 s), inspected every quarter of it (at most every second).
        self.deadlock = DeadlockDetector(size, confirm_s=min(2.0, check_s / 2))
        self._stall_every_s = min(_STALL_EVERY_S, max(check_s / 4, 0.05))
        self._deadlock_reported = False
        self._stall_pending: Stall | None = None  # rank 0: asked the late ranks for stacks
        self._cached_waiting: dict[int, Request] = {}
        self._outbox: list[Request] = []
        self._sent: dict[str, Request] = {}
        self._bits = np.zeros(0, dtype=np.uint8)
        self._init_readiness(size)
        #: bumped whenever the response cache may have changed (a reply, a clear), and
        #: the cache's names as of a version, built when a record first needs them
        self._table_version = 0
        self._table: CacheTable | None = None
        self._t_cycle = 0  # this cycle's start (timebase.now_ns())
        #: asleep with nothing pending anywhere, where ``holds_ops`` (the runtime's
        #: ``HVDPROF_WAKE_ON_SUBMIT_BYTES``): a new CPU op may wait (``Runtime.submit``),
        #: which sets ``held``; the next drain stamps the ops it takes (``t_offered``)
        self.asleep_idle = self.holds_ops = self.held = False
        self._offered_open = 0  # ops stamped and not yet recorded in an OpBatch
        self._last_matrix = np.zeros((size, 0), dtype=np.uint8)
        self._last_ran_nothing = False
        #: this cycle's reply said every rank sleeps until one has work: None (it did
        #: not), _SLEEP (a quiet cycle) or _SLEEP_PACED (after a WORK cycle: ops that
        #: came in while the work ran keep the cycle's pace, so a burst fuses)
        self._sleep_said: str | None = None
        self._partial_since: dict[int, float] = {}
        self._was_detailed = False
        self._step_fed = 0  # the step of the last cycle (``_advance``)
        self._last_partial_watch = 0.0
        self._params_just_changed = False
        self._join_cycle: dict[int, int] = {}
        self._prev_joined: frozenset[int] = frozenset()
        self._cycle_start = np.zeros(_RING, dtype=np.int64)
        self._last_stall_check = 0.0
        self._directives: list[Directive] = []  # rank 0's, for the next slow path
        self._taken: list[Any] = []  # the last reply's responses this rank ran
        self._running: list[Request | None] = []  # requests inside the executor right now

        self.observers: list[CycleObserver] = []
        self.proposer: Any = None  # rank 0's autotuner: poll_proposal() -> TunableParams | None
        self.cycle = 0
        self.steps = StepCounter()
        self.param_history: list[tuple[int, TunableParams]] = [(0, params)]
        self.counters = {
            "cycles": 0,
            "slow_path_cycles": 0,
            "cache_hits": 0,
            "coordinator_responses": 0,
            "bytes_reduced": 0,
            "ops_completed": 0,
        }
        #: the cycle thread's own CPU by stage (thread time, ns): negotiate (drain, header,
        #: allgather, coordinator), perform (the executor), account (completion, record)
        self.cpu_ns = {"negotiate": 0, "perform": 0, "account": 0}
        self.failure: BaseException | None = None
        #: the cycle thread's cap on its own intra-op threads (its share of the host's
        #: cores: see hvdprof/runtime/threads.py), and what it ended up using
        self.thread_share = 1
        self.intra_op_threads = 0
        self.thread = threading.Thread(target=self._run, name="hvdprof-cycle", daemon=True)

    def _init_readiness(self, size: int) -> None:
        """What the timeline's readiness records start from (see :meth:`_op_batch`)."""
        #: (ranks, cache bits): the start of the cycle in which each rank's bit first
        #: showed, on this rank's clock (NO_TIME: not seen since the op last ran). Times,
        #: not cycle indices: the op's record then takes them as they are.
        self._first_ready = np.full((size, 0), NO_TIME, dtype=np.int64)
        #: some entry of _first_ready holds a time (only cycles whose reply carried the
        #: matrix set any: see cycle_header.reduce); while none does, a ready bit's ranks
        #: all showed it in the cycle that runs it, and nothing need be gathered
        self._any_tracked = False
        self._ready_bits = np.zeros(0, dtype=np.int64)  # this cycle's fast-path bits
        #: (ranks, len(_ready_bits)): their first-ready times, when a sink records them
        #: and some were seen before this cycle; else None
        self._ready_first: np.ndarray | None = None
        #: this cycle's start when a sink records readiness: the first-ready time of every
        #: rank for the ready bits _ready_first does not cover
        self._ready_at: int | None = None
        self._ready_bits_bytes = b""  # _ready_bits as bytes, when a sink records them

    # ---------------------------------------------------------------- thread control
    def start(self) -> None:
        self.thread.start()

    def add_directive(self, directive: Directive) -> None:
        """Rank 0 only: an order every rank applies at the end of the same cycle."""
        self._directives.append(directive)
        self.wake.set()  # (from another thread: asleep, the ranks would not see it)

    def _run(self) -> None:
        idle_since = 0.0
        try:
            self.intra_op_threads = limit_this_thread(self.thread_share)
        except Exception:  # never worth failing the job over: reductions just run wider
            log.debug("hvdprof: could not limit the cycle thread's threads", exc_info=True)
        try:
            while True:
                t0 = time.monotonic()
                busy = self._one_cycle()
                if busy is None:
                    break
                cycle_s = self.params.cycle_time_ms / 1000.0
                if self._sleep_said is not None:
                    # Every rank sleeps on its sockets and its own submissions; the first
                    # rank with news wakes the others (a rank with news already only
                    # takes part in the wake-up). Nothing ticks on the training's cores.
                    # With ops pending anywhere (``busy``: QUIET_WAIT, or this rank's own
                    # ops, cached or new names the coordinator holds, waiting on a peer)
                    # the sleep ends at least every stall watch interval, so a stall is
                    # still seen and reported. Such a rank once slept for 0 s, and a job
                    # waiting on a name no peer had submitted yet spun on every rank.
                    paced = self._sleep_said == _SLEEP_PACED
                    self._sleep_said = None
                    # (set before the last look at the queue, cleared after the sleep: a
                    # submission is either seen here or sees the flag and wakes no one)
                    self.asleep_idle = self.holds_ops and not busy
                    if self._news_here():
                        if paced:
                            # ops came while the work ran: keep the cycle's pace for them
                            # (so a burst fuses), then wake the others, who slept meanwhile
                            self._pace(cycle_s, t0)
                        timeout = 0.0
                    elif busy:
                        timeout = _PARTIAL_WATCH_EVERY_S
                    else:
                        timeout = self.config.idle_sleep_max_s
                    try:
                        self.control.sleep(self.wake, timeout)
                    finally:
                        self.asleep_idle = False
                elif busy:
                    idle_since = 0.0
                    self._pace(cycle_s, t0)
                else:
                    # Idle on every rank (the allgather showed nothing pending anywhere).
                    # Keep the cycle's pace for a moment, then slow down: nothing can
                    # complete until some rank submits again, a submission wakes its own
                    # rank at once, and the others join when they submit too. Ticking
                    # every cycle through a forward pass would only take CPU from it.
                    if not idle_since:
                        idle_since = t0
                    wait = max(cycle_s, 0.0005)
                    if t0 - idle_since > _IDLE_BEFORE_BACKOFF_S:
                        wait = max(wait, _IDLE_SLEEP_MAX_S)
                    self.wake.wait(wait)
                self.wake.clear()
                self._let_burst_finish(cycle_s)
        except BaseException as exc:  # a dead peer, a timeout: fail everything, loudly
            self._fail(self._internal_error(exc))
            if self.on_fatal is not None and self.failure is not None:
                self.on_fatal(self.failure)
        finally:
            # in list order: one that feeds another from a thread of its own (the
            # autotuner feeds the timeline sink) is ahead of it, so it drains first
            for observer in self.observers:
                try:
                    observer.close()
                except Exception:  # a sink failing must not hide the real error
                    log.exception("hvdprof: closing %r failed", observer)
            self.wake.close()  # (a later set() from the user's thread finds it closed: no-op)
            if self._exit_code is not None:
                os._exit(self._exit_code)

    def _pace(self, cycle_s: float, t0: float) -> None:
        """Wait out the rest of the cycle time begun at ``t0``, or less (``urgent``)."""
        elapsed = time.monotonic() - t0
        delay = cycle_s - elapsed
        if delay > 0 and user_thread_blocked():
            # This rank's training thread waits on an op another rank has not
            # submitted yet: nothing more will come from here, and what it
            # waits for is that rank's next cycle. Go and wait for it in the
            # exchange (which blocks until that rank arrives, on no CPU):
            # pacing here made the last rank's cycle, started the moment its
            # own thread blocked, wait for this rank's sleep (a cycle time a
            # step, now and then: windows of a 25 ms cycle at a third of the
            # speed). A cycle that found every rank there already waited for
            # no one (a stall: all blocked, none able to help) keeps a pace.
            delay = min(delay, _BLOCKED_PACE_S - elapsed)
        if delay > 0 and not self.urgent.is_set():
            self.urgent.wait(delay)

    def _let_burst_finish(self, cycle_s: float) -> None:
        """While the user's thread is still submitting a burst of ops, wait for it.

        One cycle then negotiates and fuses the whole burst, instead of taking its head
        while racing the submitting thread for the GIL. Waits only while the queue keeps
        growing (a quarter cycle without growth ends it), and never beyond a bound. A user
        thread that has started to wait (``urgent``) submits nothing more: no wait then.
        """
        urgent = self.urgent
        if urgent.is_set():
            urgent.clear()
            return
        queue = self.queue
        n = len(queue)
        if not n:
            return
        pause = max(cycle_s / 4, 0.0002)
        deadline = time.monotonic() + _BURST_WAIT_MAX_S
        while time.monotonic() < deadline:
            if urgent.wait(pause):  # the submitting thread now waits: the burst is over
                urgent.clear()
                return
            m = len(queue)
            if m == n:
                return
            n = m

    def _internal_error(self, exc: BaseException) -> BaseException:
        if isinstance(exc, HvdprofInternalError):
            return exc
        text = str(exc).strip().splitlines()
        detail = text[0] if text else type(exc).__name__
        if not isinstance(exc, RuntimeError):  # our bug, not the network's: say so
            log.error(
                "hvdprof rank %d: internal error in the cycle thread", self.rank, exc_info=exc
            )
            return HvdprofInternalError(
                f"hvdprof rank {self.rank}: internal error in the cycle thread "
                f"({type(exc).__name__}: {detail}); please report it"
            )
        return HvdprofInternalError(
            f"hvdprof rank {self.rank}: communication with the other ranks failed "
            f"({type(exc).__name__}: {detail}). A peer rank has probably exited or been "
            "killed; the job cannot continue."
        )

    def _fail(self, error: BaseException) -> None:
        if self.failure is None:
            self.failure = error
        for req in self._all_requests():
            req.fail(error)
        if self.join_handle is not None:
            self.join_handle.fail(error)

    def _all_requests(self) -> list[Request]:
        out = list(self._cached_waiting.values()) + self._outbox + list(self._sent.values())
        out += [req for req in self._running if req is not None and not req.done_flag]
        while self.queue:
            out.append(self.queue.popleft())
        return out

    # ---------------------------------------------------------------- one cycle
    def _one_cycle(self) -> bool | None:
        """One cycle: negotiate, perform, account. True: work is pending somewhere;
        False: idle; None: stop."""
        cycle = self.cycle
        t_start = timebase.now_ns()
        self._cycle_start[cycle % _RING] = t_start
        self._t_cycle = t_start
        cpu0 = time.thread_time_ns()
        # Before draining: a thread submits, then waits, so what a blocked thread waits on
        # is always in this cycle's messages (rank 0 never sees the flag before the name).
        blocked = user_thread_blocked()
        detailed = any(o.detailed for o in self.observers)
        if detailed and not self._was_detailed:
            self._first_ready.fill(NO_TIME)  # forget readiness seen while nobody recorded it
            self._any_tracked = False
            self._offered_open = 0
        self._was_detailed = detailed
        self._drain_queue(detailed)
        payload = self._outbox_payload()
        said = self._exchange(payload, blocked, detailed)
        self._sleep_said = _SLEEP if said.kind in (QUIET_SLEEP, QUIET_WAIT) else None
        if said.kind != WORK:
            self._spent("negotiate", cpu0)
            busy = said.kind in (QUIET_BUSY, QUIET_WAIT)
            return self._quiet_cycle(
                cycle, t_start, busy=busy, matrix=said.matrix if busy else None
            )
        if said.shutdown_ranks.size:
            self._peer_shut_down(said.shutdown_ranks)
            return None
        agreed = self._negotiate(said, payload, cycle, detailed)
        t_negotiated = timebase.now_ns()
        if self.nvtx is not None:
            self.nvtx.pop()
        self._take_reply(agreed)
        cpu1 = self._spent("negotiate", cpu0)
        reduced, groups = self._perform(agreed, detailed)
        t_end = timebase.now_ns()
        cpu2 = self._spent("perform", cpu1)
        busy = self._account(said, agreed, cycle, t_start, t_negotiated, t_end, reduced, groups)
        self._spent("account", cpu2)
        if said.sleep_after and busy is not None:
            # Nothing is left anywhere that every rank saw (WORK_THEN_SLEEP): sleep now.
            # Busy only with what this rank alone holds (names the coordinator keeps for
            # a peer's submission): its sleep then still ends at the stall watch's pace.
            self._sleep_said = _SLEEP_PACED
            busy = self._pending_here()
        return busy

    def _pending_here(self) -> bool:
        """Whether this rank holds work the last exchange did not finish: ops sent and
        not yet agreed, cached names waiting on a peer, names not yet sent, commands."""
        return bool(self._sent or self._cached_waiting or self._outbox or self.commands)

    def _news_here(self) -> bool:
        """Whether this rank has something to say that the last exchange did not carry
        (a submission, a command, a shutdown): it must not sleep on it."""
        return bool(self.queue or self.commands or self._outbox or self.shutdown_requested)

    def _spent(self, stage: str, since_ns: int) -> int:
        """Add this thread's CPU since ``since_ns`` to the stage's counter: the runtime's
        own cost per cycle, by stage, for benchmarks and the metrics (two clock reads)."""
        now = time.thread_time_ns()
        self.cpu_ns[stage] += now - since_ns
        return now

    def _outbox_payload(self) -> bytes:
        """This rank's new names for the coordinator (empty when every name is cached)."""
        if not self._outbox:
            return b""
        return pickle.dumps(
            [RequestMeta(r.name, r.signature, r.splits) for r in self._outbox],
            protocol=pickle.HIGHEST_PROTOCOL,
        )

    def _exchange(self, payload: bytes, blocked: bool, detailed: bool) -> Said:
        """Write this rank's header and bits, exchange them for rank 0's reduced reply:
        the cycle's one message when nothing is new."""
        header = OwnHeader(
            payload_len=len(payload),
            shutdown=self.shutdown_requested,
            joined=self.join_handle is not None,
            command=bool(self.commands),
            blocked=blocked,
            detailed=detailed,
        )
        if self.rank == 0:
            self._queue_own_directives(detailed)
            header.directive = bool(self._directives)
        send = self.control.send_buffer(HEADER + self._bits.shape[0])
        header.write(send[:HEADER])
        send[HEADER:] = self._bits
        if self.nvtx is not None:
            self.nvtx.push(NVTX_NEGOTIATE)
        reply, matrix = self.control.exchange(self._reduce)
        return Said.read(reply, self.size, matrix)

    def _reduce(self, matrix: np.ndarray) -> np.ndarray:
        """Rank 0 (under MPI every rank, identically): the reply to this cycle's matrix."""
        quiet = self._quiet_kind(matrix)
        if quiet is None:
            self._last_matrix = matrix.copy()
            return reduce(matrix, WORK, self.control.can_sleep and not self._prev_joined)
        if quiet:
            # some rank waits for another's submission and nothing changed: where ranks
            # can sleep on their links, they do until that submission (or other news)
            # wakes them, instead of ticking a cycle every cycle time on every rank, the
            # late rank's included, whose training is what everyone waits for
            return reduce(matrix, QUIET_WAIT if self.control.can_sleep else QUIET_BUSY)
        # nobody said anything: every rank sleeps until one has work, at once. Ticking
        # on for a while first (20 ms of 5 ms cycles, as it once did) cost as much CPU per
        # tick as the wake-up costs once (a timed wait and an exchange: about 0.3 ms on
        # each rank on a 2-core VM), twice a step between a model's reductions. Only
        # where rank 0 alone decides (the socket channel): under MPI every rank reduces
        # the matrix itself, and ticks (backing off after _IDLE_BEFORE_BACKOFF_S).
        return reduce(matrix, QUIET_SLEEP if self.control.can_sleep else QUIET_IDLE)

    def _queue_own_directives(self, detailed: bool) -> None:
        """Rank 0: a clock sync when one is due, the autotuner's next parameters."""
        interval = self.config.clock_sync_interval_s
        if detailed and interval > 0 and time.monotonic() - self._last_clock_sync >= interval:
            self._last_clock_sync = time.monotonic()
            self._directives.append(ClockSync())
        if self.proposer is not None:
            proposal = self.proposer.poll_proposal()
            if proposal is not None:
                self._directives.append(NewParams(proposal))

    def _quiet_kind(self, matrix: np.ndarray) -> bool | None:
        """None when this cycle has work to look at; else the quiet cycle's ``busy``:
        False when nobody said anything, True when some rank waits on a peer and nothing
        changed since a cycle that ran nothing (nothing can be ready that was not then)."""
        if self._prev_joined or not nothing_said(matrix):
            return None
        if not matrix[:, HEADER:].any():
            return False
        if (
            self._last_ran_nothing
            and matrix.shape == self._last_matrix.shape
            and np.array_equal(matrix, self._last_matrix)
        ):
            return True
        return None

    def _peer_shut_down(self, ranks: np.ndarray) -> None:
        if self.nvtx is not None:
            self.nvtx.pop()
        who = ", ".join(str(r) for r in ranks)
        self._fail(
            HvdprofInternalError(
                f"hvdprof was shut down (by rank {who}) while this rank (rank {self.rank}) "
                "still had operations pending. Every rank must finish the same collectives "
                "before calling shutdown() or exiting."
            )
        )

    def _negotiate(self, said: Said, payload: bytes, cycle: int, detailed: bool) -> _Agreed:
        """What every rank agreed to run this cycle: the cached names ready on every rank
        that has not joined (the fast path), then the coordinator's answer when anyone has
        news (the slow path)."""
        for r in said.joined:
            self._join_cycle.setdefault(r, cycle)
        matrix = said.matrix
        if detailed and said.full and said.ready.shape[0] and matrix is not None:
            self._track_readiness(matrix[:, HEADER:], self._t_cycle)
        agreed = _Agreed()
        self._ready_first = None
        self._ready_at = None
        if said.ready.shape[0] and said.any_active:
            ready_bits = np.flatnonzero(said.ready)
            if ready_bits.size:
                self._bits[ready_bits] = 0
                entries = self.cache.entries()
                waiting = self._cached_waiting
                bit_list = ready_bits.tolist()
                self._ready_bits = ready_bits
                if detailed and bit_list[-1] < self._first_ready.shape[1]:
                    self._ready_bits_bytes = ready_bits.tobytes()
                    self._ready_at = self._t_cycle
                    if self._any_tracked:
                        self._gather_readiness(ready_bits)
                agreed.ops = [entries[bit] for bit in bit_list]
                agreed.reqs = [waiting.pop(bit, None) for bit in bit_list]
                self.counters["cache_hits"] += ready_bits.size
        agreed.n_cached = len(agreed.ops)
        if self.rank == 0 and self.config.stall_check_time_s > 0 and matrix is not None:
            now = time.monotonic()
            if now - self._last_partial_watch >= _PARTIAL_WATCH_EVERY_S:
                self._last_partial_watch = now
                self._watch_partial_bits(matrix[:, HEADER:], ~matrix[:, JOINED].astype(bool))
        if said.news.size or said.directive or said.joined != self._prev_joined:
            lengths = said.lengths(self.size)
            agreed.reply = self._coordinate(payload, lengths, said.joined, cycle)
            self.counters["slow_path_cycles"] += 1
        self._prev_joined = said.joined
        return agreed

    def _take_reply(self, agreed: _Agreed) -> None:
        """The coordinator's answer: cache changes, then its responses after the cached
        ops (another process set's responses go to that set's members)."""
        reply = agreed.reply
        if reply is not None:
            self._table_version += 1
            self.cache.apply(reply, self.params.cache_enabled)
            for name in reply.evicted:
                self._reroute_evicted(name)
            sets, me = self.sets, self.rank
            taken = self._taken = []
            for response in reply.responses:
                set_id = response.signature.process_set
                if set_id and not (sets is not None and sets.includes(set_id, me)):
                    # another set's op (or one of a set removed meanwhile): its members
                    # run it; a request of ours fails with the coordinator's word
                    req = self._sent.get(response.name)
                    if req is not None and req.signature.process_set == set_id:
                        del self._sent[response.name]
                        req.fail(TensorMismatchError(response.error or "process set removed"))
                    continue
                agreed.reqs.append(self._sent.pop(response.name, None))
                agreed.ops.append(NegotiatedOp(response))
                taken.append(response)
            self.counters["coordinator_responses"] += len(reply.responses)
        self._grow_bits()

    def _perform(self, agreed: _Agreed, detailed: bool) -> tuple[int, list[Any]]:
        """Run the agreed ops: bytes reduced, and the groups as the timeline records them."""
        if not agreed.ops:
            return 0, []
        # held here while they run: should the cycle thread die inside the executor (an
        # exception on this rank alone), _fail must still reach their waiters
        self._running = agreed.reqs
        done = self.executor.run(
            agreed.ops,
            agreed.reqs,
            self.params.fusion_threshold_bytes,
            self.config.max_inflight,
            detailed,
        )
        self._running = []
        return done

    def _account(
        self,
        said: Said,
        agreed: _Agreed,
        cycle: int,
        t_start: int,
        t_negotiated: int,
        t_end: int,
        reduced: int,
        groups: list[Any],
    ) -> bool | None:
        """Complete the cycle: ops and joins done, commands and orders applied, the
        record to the observers. Returns what ``_one_cycle`` does."""
        detailed = self._was_detailed
        ops, reqs, reply = agreed.ops, agreed.reqs, agreed.reply
        op_batch = self._complete(ops, reqs, agreed.n_cached, reply, detailed, t_negotiated, t_end)
        joined = said.joined
        if joined and not said.any_active:  # the join returns the last to join
            last = max(joined, key=lambda r: (self._join_cycle[r], r))
            self._join_cycle.clear()
            if self.join_handle is not None:
                handle, self.join_handle = self.join_handle, None
                handle.complete(last)
                notify_waiters()
        # This cycle ran with these parameters; new ones apply from the next cycle, whose
        # record is the first to carry them (and says so).
        params_ran = self.params
        params_changed, self._params_just_changed = self._params_just_changed, False
        if said.every_rank_commands:
            self.commands.popleft()()
        if reply is not None:
            self._params_just_changed = self._apply_directives(reply.directives)
        self.counters["bytes_reduced"] += reduced
        if not self._advance(
            cycle=cycle,
            t_start=t_start,
            t_negotiated=t_negotiated,
            t_end=t_end,
            params=params_ran,
            bytes_reduced=reduced,
            ops=op_batch if op_batch is not None else [],
            groups=groups,
            params_changed=params_changed,
        ):
            return None
        self._last_ran_nothing = not ops and reply is None
        return bool(self._pending_here() or said.news.size or said.any_bit or joined or self.queue)

    def _quiet_cycle(
        self, cycle: int, t_start: int, busy: bool, matrix: np.ndarray | None = None
    ) -> bool | None:
        """The rest of a cycle in which nothing can happen: the same outcome as the full
        cycle, without its dozens of small numpy calls.

        Two cases: no rank had anything to say (between steps), or nothing changed since
        a cycle that ran nothing (``busy``: some rank waits for another's submission).
        A job ticks every cycle on the training's cores, so these must be cheap.
        """
        t_end = timebase.now_ns()
        if self.nvtx is not None:
            self.nvtx.pop()
        if not busy:
            self._partial_since.clear()
        elif matrix is not None and self.rank == 0 and self.config.stall_check_time_s > 0:
            now = time.monotonic()  # the stall inspector's view of who is waiting
            if now - self._last_partial_watch >= _PARTIAL_WATCH_EVERY_S:
                self._last_partial_watch = now
                self._watch_partial_bits(matrix[:, HEADER:], np.ones(self.size, dtype=bool))
        params_changed, self._params_just_changed = self._params_just_changed, False
        if not self._advance(
            cycle=cycle,
            t_start=t_start,
            t_negotiated=t_end,
            t_end=t_end,
            params=self.params,
            bytes_reduced=0,
            params_changed=params_changed,
        ):
            return None
        return busy or self._pending_here() or bool(self.queue)

    def _advance(self, **record: Any) -> bool:
        """End a cycle: its record to the observers, rank 0's stall check, the next index.

        False when the cycle thread must stop (something failed).
        """
        self.counters["cycles"] += 1
        step = self.steps.step
        if self.observers:
            cycle_record = None
            for observer in self.observers:
                if observer.per_cycle:
                    if cycle_record is None:
                        cycle_record = CycleRecord(step=step, **record)
                    observer.on_cycle(cycle_record)
                elif step != self._step_fed:  # this cycle is the step's first
                    observer.on_step(
                        step,
                        record["t_start"],
                        self.counters["bytes_reduced"] - record["bytes_reduced"],
                        record["params"],
                    )
        self._step_fed = step
        if stacks.pending_instants:  # stack dumps the signal handler took
            while stacks.pending_instants:
                name, args = stacks.pending_instants.popleft()
                if self.on_instant is not None:
                    self.on_instant(name, args)
        if self.rank == 0:
            self._inspect_stalls()
        self.cycle += 1
        return self.failure is None

    # ---------------------------------------------------------------- pieces
    def _drain_queue(self, detailed: bool) -> None:
        queue = self.queue
        # (Exactly the ops queued now: the user's thread may append more meanwhile, and
        # wakes the cycle for them.)
        popleft = queue.popleft
        reqs = [popleft() for _ in range(len(queue))]
        if self.held:
            self._stamp_offered(reqs, detailed)
        if not (self.params.cache_enabled and self.cache.capacity > 0):
            self._outbox += reqs
            return
        outbox = self._outbox
        bit_of = self.cache.bit_of
        entries = self.cache.entries()
        waiting = self._cached_waiting
        # ResponseCache.lookup, inlined and by list: a burst is thousands of ops, and one
        # comprehension per stage costs about half of one loop doing every stage per op.
        bits = [bit_of.get(req.name) for req in reqs]
        if None not in bits and [entries[bit].signature for bit in bits] == [
            req.signature for req in reqs
        ]:  # every op cached, with its signature unchanged: a step's burst (the lists
            # compare in C, each pair by identity first: the front end shares Signatures)
            waiting.update(zip(bits, reqs, strict=True))
            if bits:
                self._bits[bits] = 1
            return
        new_bits: list[int] = []
        for req, bit in zip(reqs, bits, strict=True):
            if bit is not None:
                cached = entries[bit].signature
                # the front end shares one Signature per (dtype, shape, ...): usually `is`
                if cached is req.signature or cached == req.signature:
                    waiting[bit] = req
                    new_bits.append(bit)
                    continue
            outbox.append(req)
        if new_bits:
            self._bits[new_bits] = 1

    def _stamp_offered(self, reqs: list[Request], detailed: bool) -> None:
        """Ops held for their rank's wait begin negotiating now, not at their submission:
        the time between was the rank computing, not waiting for its peers, and a
        timeline that drew it as ``NEGOTIATE`` called a backward pass negotiation wait.
        (Stamped only while a sink records them.)"""
        self.held = False
        if not detailed:
            return
        t = self._t_cycle
        for req in reqs:
            if not req.t_offered:
                req.t_offered = t
                self._offered_open += 1

    def _negotiation_starts(
        self, reqs: list[Request] | list[Request | None], t_submit: list[int]
    ) -> list[int] | None:
        """Where each op's ``NEGOTIATE`` slice begins when some were held
        (:meth:`_stamp_offered`), else None (their submissions)."""
        if not self._offered_open:
            return None
        offered = [0 if req is None else req.t_offered for req in reqs]
        held = len(offered) - offered.count(0)
        if not held:
            return None
        self._offered_open = max(0, self._offered_open - held)
        return [max(o, s) for o, s in zip(offered, t_submit, strict=True)]

    def _coordinate(
        self, payload: bytes, lengths: list[int], joined: frozenset[int], cycle: int
    ) -> CoordinatorReply:
        merged = gathered = None
        if self.control.is_tree:  # relaying ranks merge their subtree's requests
            merged = self.control.gather_merged(payload, lengths, merge_requests)
        else:
            gathered = self.control.gather_bytes(payload, lengths)
        for req in self._outbox:
            self._sent[req.name] = req
        self._outbox = []
        blob = None
        if self.rank == 0:
            assert self.coordinator is not None
            state = (joined, self.cache, self.params.cache_enabled, time.monotonic())
            if merged is not None:
                reply = self.coordinator.handle_merged(cycle, read_merged(merged), *state)
            else:
                assert gathered is not None
                messages = [(r, pickle.loads(b)) for r, b in enumerate(gathered) if b]
                reply = self.coordinator.handle(cycle, messages, *state)
            reply.directives, self._directives = self._directives, []
            blob = pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL)
        data = self.control.broadcast_bytes(blob)
        return pickle.loads(data)

    def _reroute_evicted(self, name: str) -> None:
        """A cached entry went stale: requests waiting on its bit take the slow path."""
        for bit, req in list(self._cached_waiting.items()):
            if req.name == name:
                del self._cached_waiting[bit]
                self._bits[bit] = 0
                self._outbox.append(req)

    def _grow_bits(self) -> None:
        width = self.cache.width
        if width > self._bits.shape[0]:
            grown = np.zeros(width, dtype=np.uint8)
            grown[: self._bits.shape[0]] = self._bits
            self._bits = grown
            first = np.full((self.size, width), NO_TIME, dtype=np.int64)
            first[:, : self._first_ready.shape[1]] = self._first_ready
            self._first_ready = first

    def _track_readiness(self, bits: np.ndarray, t_cycle: int) -> None:
        first = self._first_ready[:, : bits.shape[1]]
        newly = (bits == 1) & (first == NO_TIME)
        first[newly] = t_cycle
        self._any_tracked = True

    def _gather_readiness(self, ready_bits: np.ndarray) -> None:
        """The ready bits' first-ready times seen in earlier cycles (this cycle's start
        for the rest), then forgotten. Taken in the negotiation, beside the numpy calls
        that found the bits: the same gather in the accounting, after the reduction,
        costs several times as much (its code and data no longer in the core's caches)."""
        first = self._first_ready
        gathered = first[:, ready_bits]
        gathered[gathered == NO_TIME] = self._t_cycle
        self._ready_first = gathered
        first[:, ready_bits] = NO_TIME
        self._any_tracked = bool((first != NO_TIME).any())

    def _watch_partial_bits(self, bits: np.ndarray, active: np.ndarray) -> None:
        if not bits.shape[1]:
            self._partial_since.clear()
            return
        rows = bits[active] if active.any() else bits
        partial = np.flatnonzero(rows.max(axis=0) & ~rows.min(axis=0).astype(bool))
        now = time.monotonic()
        current = {int(b) for b in partial}
        for b in list(self._partial_since):
            if b not in current:
                del self._partial_since[b]
        for b in current:
            self._partial_since.setdefault(b, now)

    def _inspect_stalls(self) -> None:
        now = time.monotonic()
        check_s = self.config.stall_check_time_s
        if check_s <= 0 or now - self._last_stall_check < self._stall_every_s:
            return
        self._last_stall_check = now
        assert self.coordinator is not None
        waiting = self.coordinator.pending()
        kinds = self.coordinator.pending_kinds()
        if self._partial_since:
            matrix_bits = self._last_bits_snapshot()
            for bit, since in self._partial_since.items():
                entries = self.cache.entries()
                if bit >= len(entries) or entries[bit] is None:
                    continue
                name = entries[bit].name
                ready = frozenset(int(r) for r in np.flatnonzero(matrix_bits[:, bit]))
                waiting[name] = (ready, since)
                kinds[name] = entries[bit].signature.op.name
        self._inspect_deadlock(now, waiting, kinds)
        if self._stall_pending is not None:
            return  # the late ranks' stacks are on their way
        matrix = self.control.last_matrix
        joined: frozenset[int] = frozenset()
        if matrix.shape[1] > JOINED:
            joined = frozenset(int(r) for r in np.flatnonzero(matrix[:, JOINED]))
        if joined:  # a rank in join() is not late: the others go on without it
            waiting = {n: (ready | joined, since) for n, (ready, since) in waiting.items()}
        stall = self.stall.inspect(now, waiting, kinds, self.coordinator.pending_outsiders())
        if stall is not None:
            # Ask the late ranks where they are: every rank applies the order at the end
            # of the same cycle (``_exchange_stacks``), so the user's threads go on.
            self._stall_pending = stall
            self._directives.append(ReportStacks(tuple(stall.missing(self.size))))

    # ---------------------------------------------------------------- stacks
    def _exchange_stacks(self, ranks: tuple[int, ...]) -> None:
        """Every rank: the ranks asked (and rank 0) send rank 0 their main thread's stack
        and the op it waits on, if any; rank 0 then reports the stall."""
        asked = [1 if r == 0 or r in ranks else 0 for r in range(self.size)]
        payload = (
            pickle.dumps(self._where_am_i(), protocol=pickle.HIGHEST_PROTOCOL)
            if asked[self.rank]
            else b""
        )
        gathered = self.control.gather_bytes(payload, asked)
        if self.rank != 0 or gathered is None:
            return
        states = {r: pickle.loads(b) for r, b in enumerate(gathered) if asked[r] and b}
        stall, self._stall_pending = self._stall_pending, None
        if stall is None:
            return
        message = self.stall.report(stall, states)
        if self.on_instant is not None:
            self.on_instant(STALL, self._stall_args(stall, states, message))
        if stall.shutdown:
            self._directives.append(StallShutdown(message))

    def _where_am_i(self) -> dict[str, Any]:
        """This rank's main thread: its stack (read without stopping it) and the op of
        ours it is blocked on, if any."""
        ident = threading.main_thread().ident
        frame = sys._current_frames().get(ident) if ident is not None else None
        try:
            frames = stacks.frames_of(frame)
        finally:
            del frame
        handle = blocked_handle(ident)
        collective = None
        if handle is not None:
            signature = getattr(handle, "signature", None)
            collective = {
                "kind": signature.op.name if signature is not None else "op",
                "name": handle.name,
                "sequence": self._sequence_of(handle),
            }
        pending = list(self._cached_waiting.values()) + self._outbox + list(self._sent.values())
        pending.sort(key=lambda req: req.t_submit)
        return {
            "rank": self.rank,
            "frames": frames,
            "collective": collective,
            # submitted, not completed (a thread may poll them instead of waiting)
            "pending": [(req.signature.op.name, req.name) for req in pending[:5]],
        }

    def _sequence_of(self, handle: Any) -> int:
        """The op's place among this rank's ops, from 1: those completed, then those
        pending that were submitted before it."""
        t = getattr(handle, "t_submit", None)
        pending = list(self._cached_waiting.values()) + self._outbox + list(self._sent.values())
        before = 0 if t is None else sum(1 for req in pending if req.t_submit < t)
        return self.counters["ops_completed"] + before + 1

    def _stall_args(
        self, stall: Stall, states: dict[int, dict[str, Any]], message: str
    ) -> dict[str, Any]:
        return {
            "line": message,
            "missing": stall.missing(self.size),
            "names": sorted(stall.names),
            "waited_s": round(stall.waited_s, 3),
            "step": self.steps.step,
            "shutdown": stall.shutdown,
            "ranks": {
                str(r): {
                    "where": stacks.where(state["frames"]),
                    "collective": state.get("collective"),
                    "frames": [list(f) for f in state["frames"]],
                }
                for r, state in states.items()
                if r in stall.missing(self.size)
            },
        }

    def _stall_shutdown(self, message: str) -> None:
        """Every rank: the stall lasted HVDPROF_STALL_SHUTDOWN_TIME_SECONDS."""
        stacks.write_all(2, f"{message} (rank {self.rank})\n".encode(errors="replace"))
        error = StallAbortError(f"{message} (rank {self.rank})")
        if self.stall_exit_code is None:
            self._fail(error)
            return
        # Under the launcher the rank exits once the cycle thread has closed its observers
        # (the timeline kept): its waits are not failed first, or a user thread could run
        # on, past the stall, in the moment before the exit.
        self.failure = error
        self._exit_code = self.stall_exit_code

    def _inspect_deadlock(
        self, now: float, waiting: dict[str, tuple[frozenset[int], float]], kinds: dict[str, str]
    ) -> None:
        """Rank 0: every rank blocked on names another blocked rank lacks is an error on
        every rank (through the ``abort`` directive), where a slow rank only warns."""
        matrix = self.control.last_matrix
        if self._deadlock_reported or matrix.shape[1] < HEADER:
            return
        blocked = matrix[:, BLOCKED].astype(bool).tolist()
        joined = frozenset(int(r) for r in np.flatnonzero(matrix[:, JOINED]))
        if self.deadlock.observe(now, blocked, joined, waiting, self.counters["ops_completed"]):
            self._deadlock_reported = True
            message = describe_deadlock(
                self.size, joined, waiting, kinds, self.config.stall_check_time_s
            )
            log.error("%s", message)
            self._directives.append(Abort(message))

    def _last_bits_snapshot(self) -> np.ndarray:
        return self.control.last_matrix[:, HEADER:]

    def _complete(
        self,
        ready_ops: list[AgreedOp],
        ready_reqs: list[Request | None],
        n_cached: int,
        reply: CoordinatorReply | None,
        detailed: bool,
        t_negotiated: int,
        t_end: int,
    ) -> OpBatch | None:
        self.counters["ops_completed"] += len(ready_ops)
        self.steps.completed_ops(ready_ops)
        if not detailed or not ready_ops:
            return None
        return self._op_batch(ready_ops, ready_reqs, n_cached, reply, t_negotiated, t_end)

    def _op_batch(
        self,
        ready_ops: list[AgreedOp],
        ready_reqs: list[Request | None],
        n_cached: int,
        reply: CoordinatorReply | None,
        t_negotiated: int,
        t_end: int,
    ) -> OpBatch:
        """The timeline's view of this cycle's ops (only built when a sink is attached).

        Column by column, with no per-op object: the first ``n_cached`` ops came through
        the response cache, in the order of ``self._ready_bits``.
        """
        n = len(ready_ops)
        op_group, op_done = self.executor.op_group, self.executor.op_done
        if len(op_group) != n:  # nothing ran (every op failed before running)
            op_group, op_done = [-1] * n, [0] * n
        # Readiness on the cached path, gathered by _negotiate: when each rank's bit first
        # showed. A numpy call here costs several µs (its code has left the core's caches
        # during the reduction), so the common cycle, every op cached, makes none but the
        # one that writes this rank's own column.
        first = self._ready_first if n_cached else None
        ready_at = self._ready_at if n_cached else None
        if ready_at is not None and n_cached == n and reply is None and None not in ready_reqs:
            t_submit = [req.t_submit for req in ready_reqs]
            starts = self._negotiation_starts(ready_reqs, t_submit)
            ready_fill = None
            if first is None and starts is None:  # every rank showed them this cycle:
                ready, ready_fill = None, (ready_at, self.rank, self.size)  # reader fills
            else:
                ready = (
                    first.T
                    if first is not None
                    else np.full((n, self.size), ready_at, dtype=np.int64)
                )
                ready[:, self.rank] = t_submit
            return OpBatch(
                names=None,  # the cache's bits name them: no list per op
                kinds=None,
                t_submit=starts or t_submit,
                t_negotiated=[t_negotiated] * n,
                ready=ready,
                cached=b"\x01" * n,
                group_ids=op_group,
                t_done=[d or t_end for d in op_done] if 0 in op_done else op_done,
                errors=self._op_errors(op_group, ready_reqs),
                bits=self._ready_bits_bytes,
                table=self._cache_table(),
                ready_fill=ready_fill,
            )
        ready = np.full((n, self.size), NO_TIME, dtype=np.int64)
        cached = b"\x01" * n_cached + bytes(n - n_cached)
        if first is not None:
            ready[:n_cached] = first.T
        elif ready_at is not None:
            ready[:n_cached] = ready_at
        if reply is not None:  # the coordinator's path: readiness by cycle, per op
            for i, response in enumerate(self._taken, start=n_cached):
                row = ready[i]
                for r, c in response.ready_cycles.items():
                    row[r] = self._time_of(c)
        if None in ready_reqs:  # this rank has joined: it records only its own ops
            mine = [i for i, req in enumerate(ready_reqs) if req is not None]
            ready_ops = [ready_ops[i] for i in mine]
            ready_reqs = [ready_reqs[i] for i in mine]
            op_group = [op_group[i] for i in mine]
            op_done = [op_done[i] for i in mine]
            ready, cached = ready[mine], bytes(cached[i] for i in mine)
        t_submit = [req.t_submit for req in ready_reqs]
        ready[:, self.rank] = t_submit
        errors = self._op_errors(op_group, ready_reqs)
        return OpBatch(
            names=[op.name for op in ready_ops],
            kinds=[op.description for op in ready_ops],
            t_submit=self._negotiation_starts(ready_reqs, t_submit) or t_submit,
            t_negotiated=[t_negotiated] * len(ready_ops),
            ready=ready,
            cached=cached,
            group_ids=op_group,
            t_done=[d or t_end for d in op_done] if 0 in op_done else op_done,
            errors=errors,
        )

    def _cache_table(self) -> CacheTable:
        table = self._table
        if table is None or table.version != self._table_version:
            entries = self.cache.entries()
            table = self._table = CacheTable(
                self._table_version,
                [None if e is None else e.name for e in entries],
                [None if e is None else e.description for e in entries],
            )
        return table

    def _op_errors(self, op_group: list[int], reqs: list[Request]) -> dict[int, str]:
        if -1 in op_group or self.executor.failed:  # only a failed op can carry an error
            return {i: str(req.error) for i, req in enumerate(reqs) if req.error}
        return {}

    def _time_of(self, cycle: int) -> int:
        if self.cycle - cycle >= _RING:
            cycle = self.cycle - _RING + 1
        return int(self._cycle_start[cycle % _RING])

    def _apply_directives(self, directives: list[Directive]) -> bool:
        """Rank 0's orders, in order; True when the parameters changed."""
        changed = False
        for directive in directives:
            match directive:
                case NewParams(params):
                    changed = self._apply_params(params) or changed
                case Abort(message):
                    self._fail(StallAbortError(f"{message} (rank {self.rank})"))
                case ReportStacks(ranks):
                    self._exchange_stacks(ranks)
                case StallShutdown(message):
                    self._stall_shutdown(message)
                case ClockSync():
                    samples = self.control.clock_samples(timebase.now_ns)
                    if self.on_clock_samples is not None:
                        self.on_clock_samples(samples)
        return changed

    def _apply_params(self, params: TunableParams) -> bool:
        if params == self.params:
            return False
        if params.cache_enabled != self.params.cache_enabled:
            self._table_version += 1
            for name in self.cache.clear():
                self._reroute_evicted(name)
            self.cache.capacity = self.config.cache_capacity if params.cache_enabled else 0
        self.params = params
        self.param_history.append((self.cycle + 1, params))
        return True
