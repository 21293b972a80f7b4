"""Rank 0's autotuner as the runtime sees it: a cycle observer that proposes parameters.

Data flow (one way, as for every observer)::

    cycle thread --on_cycle(record)--> SampleWindow --queue--> worker thread
                                                                 score, log, tell, ask
    cycle thread <--poll_proposal()-- proposal slot <-----------------'

* ``on_cycle`` is O(1) and never blocks: it folds the record into per-step totals and,
  when a sample's steps are complete, hands them to the worker through a queue. Records
  whose ``params`` differ from the configuration being measured are ignored (the runtime
  has not applied the proposal yet, or is still running the previous one).
* The worker thread (a daemon) does everything slow: scoring, the CSV row and its fsync,
  the GP fit and the acquisition (tens to hundreds of ms), then posts the next proposal.
  That work happens while no sample is being measured, so it cannot bias one.
* ``poll_proposal`` (called by the cycle thread once per cycle) takes the posted
  proposal, if any; the runtime broadcasts it and every rank applies it at the same cycle
  boundary. Measuring restarts from there: the partial step in which it landed and
  ``settle_steps`` more are discarded, then ``HVDPROF_AUTOTUNE_STEPS_PER_SAMPLE`` steps are
  scored (see ``scoring``).

Lifecycle:

1. Warmup: the first ``HVDPROF_AUTOTUNE_WARMUP_SAMPLES`` windows' worth of steps run with
   the starting configuration and are discarded (the job is still warming up). Meanwhile,
   and through the first window, the controller is a ``detailed`` observer: it learns the
   job's structure (allreduced tensor sizes, bytes and time per step, the share of the
   step the cycle thread waits between cycles; ``seeds.JobStructure``), then stops paying
   for per-op records.
2. Tuning: the tuner is built when the first window is scored, its candidates seeded from
   that structure. Windows of at least ``HVDPROF_AUTOTUNE_STEPS_PER_SAMPLE`` steps (more
   when steps are short: a window lasts at least ``MIN_WINDOW_S``) alternate between the
   incumbent and a candidate, as the tuner asks, until the round decides or
   the round's step budget (``HVDPROF_AUTOTUNE_BAYES_OPT_MAX_SAMPLES`` windows of the
   configured size) is spent. Once the incumbent's own windows show the job's noise,
   windows grow until the steps left can resolve an 8% gain, and a job too noisy to
   resolve even 25% ends the round at once with the default (``_size_windows``). Every
   window starts right after a switch of parameters, so the step in which a switch lands
   (discarded) costs both sides alike. The round's one line (``summary.end_line``) is
   printed, put on the timeline and written to the log as a ``decision`` row, and the
   chosen configuration (the default unless something passed the sequential test) is
   proposed. The round's steps are counted from the steps' own numbers, so a round whose
   windows cost more than planned still ends within its budget (``out_of_budget``).
3. Watching (``HVDPROF_AUTOTUNE_CONTINUOUS``, the default): the choice keeps being scored
   and logged (``phase=watch``). When its throughput leaves the band ``baseline * (1 +-
   band)`` for ``HVDPROF_AUTOTUNE_DRIFT_SAMPLES`` consecutive samples (see ``drift``),
   tuning re-opens. The band is ``HVDPROF_AUTOTUNE_DRIFT_FRACTION`` or three window
   noises, whichever is wider: on a noisy tiny job a 20% band re-opened tuning again and
   again, and each re-opening explored, which cost that job 17%.

How tuning re-opens: a short round (half the windows) whose reference is the configuration
in force and whose only candidates are the previous round's runner-ups
(``REOPEN_REMEASURE`` of them): no exploration, so re-opening cannot cost the job much, and
it still never recommends something that did not beat what runs.

Without continuous mode the controller goes quiet after proposing its choice.
Only rank 0 constructs a controller; the other ranks just apply what rank 0 broadcasts.
"""

from __future__ import annotations

import logging
import math
import queue
import statistics
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

from hvdprof.autotune.drift import DriftDetector
from hvdprof.autotune.log import (
    PHASE_DECISION,
    PHASE_TUNE,
    PHASE_WATCH,
    ROLE_KEPT,
    ROLE_RECOMMENDED,
    ROLE_WATCH,
    AutotuneTrialLog,
    make_row,
    read_autotune_log,
)
from hvdprof.autotune.paired import RelativeEstimate
from hvdprof.autotune.scoring import (
    DEFAULT_SUBWINDOWS,
    SampleScore,
    SampleWindow,
    StepMarks,
    StepTotals,
    score_spans,
    score_steps,
)
from hvdprof.autotune.seeds import JobStructure
from hvdprof.autotune.sizing import (
    GIVE_UP_DIFFERENCES,
    MIN_NOISE_DIFFERENCES,
    WindowPlan,
    plan_windows,
)
from hvdprof.autotune.space import SearchSpace, space_from_config
from hvdprof.autotune.summary import end_line, stopped_line
from hvdprof.autotune.tuner import MIN_CONFIRM_ROUND, Decision, Observation, PairedTuner
from hvdprof.common.records import CycleRecord, OpBatch, TunableParams
from hvdprof.config import Config

_log = logging.getLogger("hvdprof.autotune")

#: the optimizer's seed: the same job tunes the same way twice
AUTOTUNE_SEED = 0
#: full steps discarded after the partial step in which new parameters landed: right after
#: a switch, cycle times under 1 ms ran slower than once settled (the grid's short blocks
#: put 0.2 ms at 0.95-1.06x the default where longer blocks put it at 1.30-1.38x), and the
#: tuner's windows, each right after a switch, saw the same transient
DEFAULT_SETTLE_STEPS = 1
#: runner-up configurations re-measured when tuning re-opens after drift
REOPEN_REMEASURE = 2
#: how long ``close`` waits for the worker to finish the sample in hand
_CLOSE_TIMEOUT_S = 30.0
#: a window lasts at least this long: three 4 ms steps are at the mercy of one GC pause (a
#: guess, not measured: long enough for a few steps, short enough for a round in ~300)
MIN_WINDOW_S = 0.025
#: ... but holds at most this many times HVDPROF_AUTOTUNE_STEPS_PER_SAMPLE steps; windows
#: sized to the job's noise (``sizing``) grow up to twice that
MAX_WINDOW_GROWTH = 4
NOISE_WINDOW_GROWTH = 8
#: the drift band is at least this many window noises wide
DRIFT_NOISES = 3.0
#: a watch window (after the round) lasts at least this long. Each window is scored, put
#: on the timeline and logged on the worker thread; at the tuning windows' size (3 steps
#: of a 4 ms job: ~80 a second) watching cost the cycle and tiny benchmark jobs 4-8% of
#: their throughput after the budget, on cores the training needed. Drift then shows
#: after ``HVDPROF_AUTOTUNE_DRIFT_SAMPLES`` windows of this length (2.5 s at the default).
WATCH_WINDOW_S = 0.5
#: distinct tensors remembered while learning the job's structure
_MAX_TENSORS = 100_000

#: controller phases
PHASE_DONE = "done"
PHASE_IDLE = "idle"  # nothing to tune: every knob was set explicitly


@dataclass(frozen=True, slots=True)
class _Sample:
    params: TunableParams
    phase: str
    steps: list[StepTotals]
    wait_ns: int = 0  # time between cycles in the window (the cycle thread's waits)
    tensors: dict[str, int] | None = None  # allreduced tensor sizes (structure only)
    #: a watch window's: ``steps`` are its sub-windows (``StepMarks.spans``), ending here
    last_step: int | None = None


_STOP = object()


class AutotuneController:
    """Implements ``CycleObserver`` plus ``poll_proposal``; see the module docstring.

    ``out`` receives the end-of-round line (stderr by default); ``settle_steps`` and
    ``subwindows`` are exposed for tests and experiments.
    """

    #: while watching (cycle thread): the window's step boundaries, the first step wanted
    _marks: StepMarks | None
    _next_mark: int

    def __init__(
        self,
        config: Config,
        initial: TunableParams,
        rank: int = 0,
        *,
        out: TextIO | None = None,
        settle_steps: int = DEFAULT_SETTLE_STEPS,
        subwindows: int = DEFAULT_SUBWINDOWS,
        seed: int = AUTOTUNE_SEED,
        shared_memory: bool = False,
    ) -> None:
        if rank != 0:
            raise ValueError("only rank 0 runs the autotuner; other ranks apply its broadcasts")
        self.config = config
        self.initial = initial
        self.space: SearchSpace = space_from_config(config, initial, shared_memory)
        self.steps_per_sample = config.autotune_steps_per_sample
        #: steps per watch window (``WATCH_WINDOW_S``), set when the round ends
        self.watch_steps = config.autotune_steps_per_sample
        self.settle_steps = max(0, settle_steps)
        self.subwindows = subwindows
        self.seed = seed
        self._out = out
        self.reopened = 0
        self.samples_scored = 0
        #: the round's budget in steps: HVDPROF_AUTOTUNE_BAYES_OPT_MAX_SAMPLES windows of
        #: the configured size, each with its discarded partial and settle steps. Windows
        #: that grow (short steps, or a noisy job: ``sizing``) leave fewer of them.
        self.window_overhead = 1 + self.settle_steps
        self.budget_steps = config.autotune_max_samples * (
            config.autotune_steps_per_sample + self.window_overhead
        )
        self.steps_used = 0
        self._measured_steps = 0  # of those, the windows' measured steps
        self._round_start_step: int | None = None  # first step of the round's windows
        #: the last window plan (None until the noise was measured)
        self.plan: WindowPlan | None = None
        #: how the window size changed: (windows scored, new steps per window, why)
        self.resizes: list[tuple[int, int, str]] = []
        #: what the first steps showed (None until the first window is scored)
        self.structure: JobStructure | None = None
        #: the lines said so far (the end of each round, and at exit if tuning was cut)
        self.lines: list[str] = []
        #: called on the worker thread for every scored sample:
        #: (params, bytes_per_s, first_step, last_step, is_best, phase, **decisions). The runtime points
        #: it at the timeline so samples appear next to the phases they tuned.
        self.on_sample: Callable[..., None] | None = None
        self.ignored_cycles = 0
        #: per-op records wanted (the cycle reads this every cycle): only while learning
        #: the job's structure
        self.detailed = False
        #: every cycle's record wanted (read every cycle): while tuning; watching needs
        #: only a few step boundaries (``on_step``)
        self.per_cycle = True

        # --- cycle-thread state (touched only by on_cycle / poll_proposal) ---
        self._target: TunableParams = initial
        self._phase = PHASE_TUNE
        self._window: SampleWindow | None = None
        self._closed = False
        self._last_end: int | None = None
        self._wait_ns = 0
        self._tensors: dict[str, int] | None = None
        self._cycles_seen = 0  # while learning the structure: cycles per step
        self._steps_seen = 0
        #: while learning the structure: per step, [ops, ops through the response cache]
        self._cache_by_step: dict[int, list[int]] = {}
        self._last_step_seen: int | None = None
        self._marks, self._next_mark = None, sys.maxsize  # (see the class attributes)

        # --- shared: the proposal slot and the work queue ---
        self._lock = threading.Lock()
        self._proposal: tuple[TunableParams, str] | None = None
        #: called once a proposal is posted (the runtime sets it to wake the cycle: an
        #: idle job's ranks sleep, and would otherwise take it only with the next op)
        self.on_proposal: Callable[[], None] | None = None
        self._queue: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._idle = threading.Condition(self._lock)
        self._submitted = 0
        self._processed = 0

        # --- worker-thread state ---
        self._tuner: PairedTuner | None = None
        self._tuner_failed = False
        self._best: Observation | None = None
        self._drift = DriftDetector(config.autotune_drift_fraction, config.autotune_drift_samples)
        self._trial_log: AutotuneTrialLog | None = None
        self._warm: list[TunableParams] = []
        self._round_over = False

        if self.space.is_empty:
            _log.warning(
                "HVDPROF_AUTOTUNE is on but fusion threshold, cycle time and cache capacity "
                "were all set explicitly: nothing to tune"
            )
            self._phase = PHASE_IDLE
            self.per_cycle = False
            self._thread: threading.Thread | None = None
            return

        # read the warm start before opening the log: they may name the same file
        self._warm = self._read_warm_start(config.autotune_warm_start)
        if config.autotune_log:
            try:
                self._trial_log = AutotuneTrialLog(config.autotune_log)
            except OSError as exc:
                _log.warning("cannot open HVDPROF_AUTOTUNE_LOG=%s: %s", config.autotune_log, exc)

        self._window = SampleWindow(
            discard_steps=1
            + self.settle_steps
            + config.autotune_warmup_samples * self.steps_per_sample,
            measure_steps=self.steps_per_sample,
        )
        self.detailed = True  # learn the tensor sizes until the first window is scored
        self._tensors = {}
        self._thread = threading.Thread(target=self._run, name="hvdprof-autotune", daemon=True)
        self._thread.start()

    # --- the cycle thread's side ------------------------------------------------------

    def on_cycle(self, record: CycleRecord) -> None:
        """Fold one cycle into the current sample. O(1) per cycle (per op while learning
        the structure); never blocks."""
        window = self._window
        if window is None or record.params != self._target:
            self.ignored_cycles += 1
            self._last_end = None
            return
        if self._tensors is not None:
            self._learn_tensors(record)
            # every cycle, those that only negotiated too: each costs CPU, and a longer
            # cycle time runs fewer of them (seeds.cycle_can_help)
            self._cycles_seen += 1
            if record.step != self._last_step_seen:
                self._steps_seen += 1
                self._last_step_seen = record.step
        if record.params_changed and window.started:
            # the runtime (re-)applied the parameters mid-window: settle from here
            window = self._new_window(self.settle_steps + 1)
        if self._last_end is not None and window.steps:
            self._wait_ns += max(0, record.t_start - self._last_end)
        self._last_end = record.t_end
        if not window.add(record.step, record.t_start, record.t_end, record.bytes_reduced):
            return
        with self._lock:
            self._submitted += 1
        tensors, self._tensors = self._tensors, None
        self.detailed = False
        self._queue.put(_Sample(self._target, self._phase, window.steps, self._wait_ns, tensors))
        self._wait_ns = 0
        self._window = None  # wait for the worker's next proposal

    def on_step(self, step: int, t_start: int, bytes_before: int, params: TunableParams) -> None:
        """A step boundary, while watching (``per_cycle`` is False): one comparison, and
        a mark of the window every few steps. Never blocks."""
        if step < self._next_mark:
            return
        marks = self._marks
        if marks is None:  # (not watching: _next_mark is sys.maxsize)
            return
        if params is not self._target and params != self._target:
            self.ignored_cycles += 1  # the switch to the watched parameters is under way
            marks = self._marks = self._new_marks()
        elif marks.add(step, t_start, bytes_before):
            with self._lock:
                self._submitted += 1
            self._queue.put(_Sample(self._target, self._phase, marks.spans(), last_step=step - 1))
            # nothing changes between watch samples: this boundary opens the next one
            marks = self._marks = self._new_marks(settle=0)
            marks.add(step, t_start, bytes_before)
        self._next_mark = marks.next

    def _new_marks(self, settle: int | None = None) -> StepMarks:
        parts = max(1, self.subwindows)
        return StepMarks(
            max(1, self.watch_steps // parts),
            parts,
            self.settle_steps if settle is None else settle,
        )

    def _learn_tensors(self, record: CycleRecord) -> None:
        ops = record.ops
        if ops:
            counts = self._cache_by_step.get(record.step)
            if counts is None:
                if len(self._cache_by_step) >= _MAX_TENSORS:
                    self._cache_by_step.clear()
                counts = self._cache_by_step[record.step] = [0, 0]
            counts[0] += len(ops)
            if isinstance(ops, OpBatch):
                counts[1] += len(ops) if ops.bits is not None else sum(ops.cached)
            else:
                counts[1] += sum(1 for op in ops if op.cached)
        tensors = self._tensors
        if tensors is None or len(tensors) >= _MAX_TENSORS:
            return
        if isinstance(ops, OpBatch):
            ops = ops.resolved()  # cached ops come named by cache bit
            for name, kind in zip(ops.names or (), ops.kinds or (), strict=False):
                if kind[0] == "ALLREDUCE":
                    tensors[name] = kind[3]
        else:
            for op in ops:
                if op.op == "ALLREDUCE":
                    tensors[op.name] = op.nbytes

    def poll_proposal(self) -> TunableParams | None:
        """The parameters every rank should switch to, once; None when nothing is new."""
        if self._proposal is None:  # fast path, no lock
            return None
        with self._lock:
            proposal, self._proposal = self._proposal, None
        if proposal is None or self._closed:
            return None
        params, phase = proposal
        self._target = params
        self._phase = phase
        self.per_cycle = phase == PHASE_TUNE
        # step boundaries: the step in which the change lands is never seen as this
        # configuration's (its first cycle ran the old one), so only the settle steps
        self._marks = self._new_marks() if phase == PHASE_WATCH else None
        self._next_mark = 0 if phase == PHASE_WATCH else sys.maxsize
        if phase == PHASE_TUNE:
            self._new_window(self.settle_steps + 1)
        else:
            self._window = None
        return params

    def _new_window(self, discard_steps: int) -> SampleWindow:
        self._window = SampleWindow(discard_steps, self.steps_per_sample)
        self._wait_ns = 0
        self._last_end = None
        return self._window

    # --- status -----------------------------------------------------------------------

    @property
    def phase(self) -> str:
        """``tune``, ``watch``, ``done`` (converged, not continuous) or ``idle``."""
        return self._phase

    @property
    def best(self) -> Observation | None:
        """The current recommendation (None before the first scored sample)."""
        return self._best

    @property
    def converged(self) -> bool:
        """True once the current tuning round has decided."""
        tuner = self._tuner
        return tuner is not None and tuner.converged

    def decision(self) -> Decision | None:
        """What the current round decided, or would were it to end now (None before the
        first window is scored)."""
        tuner = self._tuner
        return None if tuner is None else tuner.decision()

    def best_line(self) -> str | None:
        """The last line said (the end of the last round), if any."""
        return self.lines[-1] if self.lines else None

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until the worker has handled every sample handed to it (tests, shutdown)."""
        with self._idle:
            return self._idle.wait_for(lambda: self._processed >= self._submitted, timeout)

    def close(self) -> None:
        """Stop measuring, let the worker finish, say so if tuning was cut short, close the
        log. A round that ended has said its line already: it is not said again."""
        if self._closed:
            return
        self._closed = True
        self._window = None
        self._marks, self._next_mark = None, sys.maxsize
        if self._thread is not None:
            self._queue.put(_STOP)
            self._thread.join(_CLOSE_TIMEOUT_S)
            if self._thread.is_alive():
                _log.warning("autotune worker did not stop within %.0f s", _CLOSE_TIMEOUT_S)
        tuner = self._tuner
        if tuner is not None and not self._round_over:
            self._emit(
                stopped_line(
                    tuner.samples_told, self.config, self.structure, self.steps_used,
                    self.budget_steps,
                )
            )  # fmt: skip
        if self._trial_log is not None:
            self._trial_log.close()

    # --- the worker thread ------------------------------------------------------------

    def _read_warm_start(self, path: str) -> list[TunableParams]:
        """The earlier run's recommendation (its last row marked ``is_best``), to measure
        first; [] when there is none this job could run."""
        if not path:
            return []
        try:
            rows = read_autotune_log(path)
        except (OSError, ValueError) as exc:
            _log.warning("HVDPROF_AUTOTUNE_WARM_START=%s ignored: %s", path, exc)
            return []
        marked = [r.params for r in rows if r.is_best and self.space.contains(r.params)]
        if not marked:
            _log.info("warm start %s: no recommendation this job can run; ignored", path)
            return []
        return [marked[-1]]

    def _new_tuner(
        self,
        default: TunableParams,
        first_candidates: Sequence[TunableParams] = (),
        explore: bool = True,
        max_samples: int | None = None,
    ) -> PairedTuner:
        return PairedTuner(
            self.space,
            max_samples=max_samples or self._round_windows(),
            default=default,
            noise=self.config.autotune_gp_noise,
            seed=self.seed + self.reopened,
            first_candidates=first_candidates,
            structure=self.structure,
            explore=explore,
        )

    def _round_windows(self) -> int:
        """Windows the step budget holds at the current window size (the configured count
        when the windows did not grow, or the round is too short to confirm anyway)."""
        configured = self.config.autotune_max_samples
        if configured < MIN_CONFIRM_ROUND:
            return configured
        return max(
            MIN_CONFIRM_ROUND, self.budget_steps // (self.steps_per_sample + self.window_overhead)
        )

    def _job_exiting(self) -> bool:
        """True once the job is ending: closed, or the main thread has finished."""
        return self._closed or not threading.main_thread().is_alive()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            try:
                if isinstance(item, _Sample) and not self._tuner_failed:
                    self._handle(item)
            except Exception:
                if not self._job_exiting():
                    _log.exception("autotune: failed to process a sample; keeping parameters")
            finally:
                with self._idle:
                    self._processed += 1
                    self._idle.notify_all()

    def _learn_structure(self, sample: _Sample) -> None:
        """The job's structure from its first window (and the tensors seen until then);
        windows grow to ``MIN_WINDOW_S`` when steps are short."""
        steps = sample.steps
        durations = [s.t_end_ns - s.t_start_ns for s in steps]
        step_ns = statistics.median(durations) if durations else 0
        window_ns = sum(durations)
        tensors = tuple(sorted((sample.tensors or {}).values()))
        self.structure = JobStructure(
            step_s=step_ns / 1e9,
            bytes_per_step=int(statistics.median(s.bytes_reduced for s in steps)) if steps else 0,
            tensor_bytes=tensors,
            wait_fraction=min(1.0, sample.wait_ns / window_ns) if window_ns > 0 else 0.0,
            cycles_per_step=self._cycles_seen / self._steps_seen if self._steps_seen else 0.0,
            cache_hit_fraction=self._cache_hits(steps),
        )
        self._cache_by_step = {}
        if step_ns > 0:
            wanted = math.ceil(MIN_WINDOW_S * 1e9 / step_ns)
            limit = self.config.autotune_steps_per_sample * MAX_WINDOW_GROWTH
            grown = max(self.steps_per_sample, min(wanted, limit))
            if grown != self.steps_per_sample:
                self.resizes.append((0, grown, "short steps"))
            self.steps_per_sample = grown

    def _cache_hits(self, steps: Sequence[StepTotals]) -> float | None:
        """The share of the window's ops negotiated through the response cache (None when
        none was seen): the first steps of a job miss it by nature, a window after the
        warmup shows whether the steady job does."""
        ops = hits = 0
        for s in steps:
            counts = self._cache_by_step.get(s.step)
            if counts is not None:
                ops += counts[0]
                hits += counts[1]
        return hits / ops if ops else None

    def _overhead_seen(self, tuner: PairedTuner) -> int:
        """What a window has really cost beyond its measured steps: the switch's partial
        and settle steps, and those that ran while the worker decided."""
        told = max(1, tuner.samples_told)
        return max(self.window_overhead, round((self.steps_used - self._measured_steps) / told))

    def _size_windows(self, tuner: PairedTuner) -> None:
        """Windows sized to the job's noise (``sizing``): grow them when the steps left
        cannot resolve an 8% gain at the current size; end the round, keeping the default,
        when no size can resolve even a large one."""
        if tuner.confirming or tuner.converged or tuner.confirm == 0 or self.reopened:
            return
        # the windows the steps left really hold: the tuner shares them out between
        # screening and confirmation
        held = tuner.samples_told + (self.budget_steps - self.steps_used) // (
            self.steps_per_sample + self._overhead_seen(tuner)
        )
        if held < tuner.max_samples:
            tuner.resize(held, 1.0)
        noise, differences = tuner.measured_window_noise()
        if differences < MIN_NOISE_DIFFERENCES:
            return
        steps_left = self.budget_steps - self.steps_used
        longest = max(
            self.steps_per_sample, self.config.autotune_steps_per_sample * NOISE_WINDOW_GROWTH
        )
        overhead = self._overhead_seen(tuner)
        plan = plan_windows(noise, self.steps_per_sample, overhead, steps_left, longest)
        self.plan = plan
        # too noisy: hopeless even had the whole budget been left (late in a round every
        # plan looks hopeless; that is the budget ending, not the noise)
        whole = plan_windows(noise, self.steps_per_sample, overhead, self.budget_steps, longest)
        if plan.steps > self.steps_per_sample:
            scale = math.sqrt(self.steps_per_sample / plan.steps)
            self.steps_per_sample = plan.steps
            tuner.resize(tuner.samples_told + plan.windows, scale)
            self.resizes.append((tuner.samples_told, plan.steps, "noise"))
        elif whole.hopeless and differences >= GIVE_UP_DIFFERENCES:
            spread = math.expm1(2 * noise)
            tuner.give_up(
                "too noisy",
                f"one window of {self.steps_per_sample} steps varies by about "
                f"±{spread:.0%}; confirming even a 25% gain would take about "
                f"{2 * whole.needed_large * (whole.steps + overhead)} paired steps, more than "
                f"the budget's {self.budget_steps}",
            )

    def _handle(self, sample: _Sample) -> None:
        if self._tuner is None:
            self._learn_structure(sample)
            try:
                self._tuner = self._new_tuner(self.initial, first_candidates=self._warm)
            except Exception:
                self._tuner_failed = True
                if not self._job_exiting():
                    _log.exception("autotune disabled: the tuner could not start")
                return
        tuner = self._tuner
        if sample.last_step is not None:
            score = score_spans(sample.steps, sample.last_step)
        else:
            score = score_steps(sample.steps, self.subwindows)
        self.samples_scored += 1
        if sample.phase == PHASE_WATCH:
            self._write_row(sample.params, score, PHASE_WATCH, ROLE_WATCH)
            if self._drift.update(score.bytes_per_s):
                self._reopen(tuner)
            return
        role = tuner.next_role
        tuner.tell(sample.params, score.bytes_per_s)
        # the steps the round has taken, unmeasured ones included (a switch's partial and
        # settle steps, and any that ran while the worker decided)
        if self._round_start_step is None:
            self._round_start_step = score.first_step
        self.steps_used = score.last_step - self._round_start_step + 1
        self._measured_steps += len(sample.steps)
        self._size_windows(tuner)
        if (
            self.steps_used + self.steps_per_sample + self._overhead_seen(tuner) > self.budget_steps
            and not tuner.converged
            and tuner.confirm > 0
            and not self.reopened
        ):
            tuner.out_of_budget()
        self._best = tuner.best
        # the next window first: every step until it is posted goes unmeasured, and the
        # log row's fsync can wait. Asking can itself end the round (screening over and
        # nothing beat the incumbent, or a short round with nothing left to compare): the
        # round then ends here, not after one more window of the incumbent, which wrote
        # the round's decision row twice, the second after a window the timeline showed
        # as tuning.
        following = None if tuner.converged else tuner.ask()
        if following is None or tuner.converged:
            self._finish_round(tuner, score)
        else:
            self._post(following, PHASE_TUNE)
        self._write_row(sample.params, score, PHASE_TUNE, role)
        if tuner.converged:
            self._write_decision(tuner, score)

    def _finish_round(self, tuner: PairedTuner, score: SampleScore) -> None:
        best = tuner.best
        if best is None:  # nothing was told
            self._post(self.initial, PHASE_DONE)
            return
        self._best = best
        self._round_over = True
        self._emit(end_line(tuner.decision(), self.config, self.steps_per_sample, self.structure))
        window_std = tuner.sigma / math.sqrt(2.0)
        self._drift.fraction = max(
            self.config.autotune_drift_fraction, math.expm1(DRIFT_NOISES * window_std)
        )
        self._drift.reset()
        step_s = self.structure.step_s if self.structure is not None else 0.0
        self.watch_steps = max(
            self.steps_per_sample, math.ceil(WATCH_WINDOW_S / step_s) if step_s > 0 else 0
        )
        self._post(best.params, PHASE_WATCH if self.config.autotune_continuous else PHASE_DONE)

    def _reopen(self, old: PairedTuner) -> None:
        """Tune again, briefly: what runs is the reference, the old runner-ups the only
        candidates (no exploration)."""
        if old.decision().reason == "too noisy":
            # a job too noisy to tune drifts by noise alone: re-opening would explore at
            # its expense for nothing (the round said so)
            self._drift.reset()
            return
        incumbent = self._best.params if self._best is not None else self.initial
        # the old estimates describe the old regime: the best of them are re-measured
        runner_ups = [o.params for o in old.ranked() if o.params != incumbent]
        _log.warning(
            "autotune: throughput drifted by more than %.0f%% for %d samples; re-opening tuning",
            100 * self._drift.fraction,
            len(self._drift.drifted),
        )
        self._drift.reset()
        if not runner_ups:
            return
        self.reopened += 1
        self.steps_used = 0
        self._measured_steps = 0
        self._round_start_step = None
        tuner = self._new_tuner(
            incumbent,
            first_candidates=runner_ups[:REOPEN_REMEASURE],
            explore=False,
            max_samples=max(2, self.config.autotune_max_samples // 2),
        )
        self._tuner = tuner
        self._round_over = False
        self._post(tuner.ask(), PHASE_TUNE)

    def _canonical(self, params: TunableParams) -> TunableParams:
        return self.space.canonical(params) if self.space.contains(params) else params

    def _post(self, params: TunableParams, phase: str) -> None:
        with self._lock:
            self._proposal = (params, phase)
        if self.on_proposal is not None:
            self.on_proposal()

    def _write_decision(self, tuner: PairedTuner, score: SampleScore) -> None:
        """The round's choice as the log's ``decision`` row: what ``--autotune-from`` and a
        warm start read back."""
        if self._trial_log is None:
            return
        decision = tuner.decision()
        row = make_row(
            decision.params,
            tuner.observation(decision.params).mean_score,
            score.first_step,
            score.last_step,
            True,
            PHASE_DECISION,
            role=ROLE_KEPT if decision.kept_default else ROLE_RECOMMENDED,
            ratio_to_default=1.0 if decision.kept_default else math.exp(decision.log_ratio),
        )
        self._append(row)

    def _write_row(self, params: TunableParams, score: SampleScore, phase: str, role: str) -> None:
        best = self._best
        # both sides in the form a proposal carries: a recommendation whose parameters are
        # not on the space's grid (a warm start, a drift re-measure) must still mark the
        # windows that ran it, or the log and the timeline name different recommendations
        is_best = best is not None and self._canonical(best.params) == self._canonical(params)
        tuner = self._tuner
        estimate = tuner.estimate(params) if tuner is not None else None
        listener = self.on_sample
        if listener is not None:
            listener(
                params, score.bytes_per_s, score.first_step, score.last_step, is_best, phase,
                **self._decisions(tuner, role, estimate),
            )  # fmt: skip
        if self._trial_log is None:
            return
        row = make_row(
            params,
            score.bytes_per_s,
            score.first_step,
            score.last_step,
            is_best,
            phase,
            role=role,
            ratio_to_default=None if estimate is None else estimate.ratio,
            while_tuning_ratio=(
                tuner.while_tuning_ratio() if tuner is not None and phase == PHASE_TUNE else None
            ),
        )
        self._append(row)

    def _append(self, row: Any) -> None:
        if self._trial_log is None:
            return
        try:
            self._trial_log.write(row)
        except (OSError, ValueError) as exc:
            _log.warning("autotune log disabled after a write failed: %s", exc)
            self._trial_log = None

    def _decisions(
        self, tuner: PairedTuner | None, role: str, estimate: RelativeEstimate | None
    ) -> dict[str, Any]:
        """What the tuner decided by this sample, for the timeline: the window's role, its
        configuration's paired ratio to the default, the incumbent, the recommendation
        with its bounds, the noise of one comparison, and the round's one line once it
        ended. A reader (the dashboard) shows these instead of re-ranking noisy windows."""
        out: dict[str, Any] = {"role": role}
        if estimate is not None:
            out["ratio_to_default"] = estimate.ratio
        if tuner is None:
            return out
        out["incumbent"] = _params_dict(tuner.incumbent)
        out["comparison_noise"] = tuner.sigma
        out["comparisons"] = len(tuner.comparisons)
        out["window_steps"] = self.steps_per_sample
        # throughput while tuning, live: against the default, and against the best
        # configuration measured so far (what exploring costs)
        while_tuning = tuner.while_tuning_ratio()
        out["while_tuning_ratio"] = while_tuning
        out["while_tuning_of_best"] = while_tuning / tuner.best_ratio()
        best = self._best
        if best is not None:
            out["recommendation"] = {
                **_params_dict(best.params),
                "ratio_to_default": best.ratio_to_default,
                "ratio_lower_bound": best.ratio_lower_bound,
                "kept_default": tuner.kept_default,
            }
        if tuner.converged and self._round_over and self.lines:
            out["decision"] = self.lines[-1]
        return out

    def _emit(self, line: str) -> None:
        self.lines.append(line)
        out = self._out if self._out is not None else sys.stderr
        print(line, file=out, flush=True)


def _params_dict(params: TunableParams) -> dict[str, Any]:
    return {
        "fusion_threshold_bytes": int(params.fusion_threshold_bytes),
        "cycle_time_ms": float(params.cycle_time_ms),
        "cache_enabled": bool(params.cache_enabled),
    }
