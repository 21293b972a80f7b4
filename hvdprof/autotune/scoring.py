"""Turning cycle records into one noise-robust throughput score per autotune sample.

A sample is a window of training steps run with one configuration. Its score is the
allreduce throughput the job achieved, in bytes per second: bytes reduced divided by the
wall time from the start of the window's first step to the start of the step after its
last. A step's time runs from its first cycle to the next step's first cycle, so the pause
after a step's last cycle counts: ending at the last cycle's end instead would drop one
cycle-time sleep per sub-window and favour long cycle times. Wall time, not time inside
collectives, because what we want to maximise is training speed: a cycle time that adds
latency between the backward pass and the reduction shows up here.

On a shared machine a single window's throughput can vary by 2x for one configuration
(see ANCHORS.md), and a stray slow step (a GC pause, a neighbour's burst) would otherwise
decide which configuration wins. So the window is split into sub-windows of whole steps
and the score is the median of their throughputs.

The first steps after a parameter change are discarded: the step in which the change
landed is partial, and the next one still drains work queued under the old settings.
``SampleWindow`` does that bookkeeping in O(1) per cycle (the cycle thread calls it);
``score_steps`` is the pure function that scores the finished window.
"""

from __future__ import annotations

import dataclasses
import itertools
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

#: sub-windows a sample is split into before taking the median
DEFAULT_SUBWINDOWS = 5


@dataclass(frozen=True, slots=True)
class StepTotals:
    """What the cycles of one training step added up to (``perf_counter_ns`` times)."""

    step: int
    t_start_ns: int  # start of the step's first cycle
    t_end_ns: int  # start of the next step's first cycle
    bytes_reduced: int


@dataclass(frozen=True, slots=True)
class SampleScore:
    """The score of one window: median sub-window throughput, and where it came from."""

    bytes_per_s: float
    first_step: int
    last_step: int
    subwindow_bytes_per_s: tuple[float, ...]


def split_evenly(count: int, parts: int) -> list[int]:
    """Sizes of ``parts`` contiguous chunks of ``count`` items, as equal as possible.

    >>> split_evenly(10, 4)
    [3, 3, 2, 2]
    """
    parts = max(1, min(parts, count))
    base, extra = divmod(count, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def throughput(steps: Sequence[StepTotals]) -> float:
    """Bytes per second over consecutive steps: bytes / (last end - first start)."""
    elapsed_ns = steps[-1].t_end_ns - steps[0].t_start_ns
    nbytes = sum(s.bytes_reduced for s in steps)
    if elapsed_ns <= 0:
        return 0.0
    return nbytes * 1e9 / elapsed_ns


def score_steps(steps: Sequence[StepTotals], subwindows: int = DEFAULT_SUBWINDOWS) -> SampleScore:
    """Median throughput of ``subwindows`` contiguous groups of ``steps`` (in step order).

    With fewer steps than sub-windows every step is its own sub-window.
    """
    if not steps:
        raise ValueError("cannot score an empty window")
    ordered = sorted(steps, key=lambda s: s.step)
    scores: list[float] = []
    start = 0
    for size in split_evenly(len(ordered), subwindows):
        scores.append(throughput(ordered[start : start + size]))
        start += size
    return SampleScore(
        bytes_per_s=float(statistics.median(scores)),
        first_step=ordered[0].step,
        last_step=ordered[-1].step,
        subwindow_bytes_per_s=tuple(scores),
    )


class SampleWindow:
    """Folds the cycles of one configuration into per-step totals, O(1) per cycle.

    The first ``discard_steps`` distinct steps seen are dropped (settling); the next
    ``measure_steps`` are kept. The window is complete when a cycle of a later step
    arrives, because only then is the last measured step known to be over.
    """

    __slots__ = (
        "_cur_bytes",
        "_cur_start",
        "_cur_step",
        "_discard_left",
        "_measure_steps",
        "complete",
        "steps",
    )

    def __init__(self, discard_steps: int, measure_steps: int) -> None:
        if measure_steps < 1:
            raise ValueError("measure_steps must be >= 1")
        self._discard_left = max(0, discard_steps)
        self._measure_steps = measure_steps
        self._cur_step: int | None = None
        self._cur_start = 0
        self._cur_bytes = 0
        self.steps: list[StepTotals] = []
        self.complete = False

    @property
    def started(self) -> bool:
        """Whether any cycle has been added."""
        return self._cur_step is not None

    def add(self, step: int, t_start_ns: int, t_end_ns: int, bytes_reduced: int) -> bool:
        """Add one cycle; True once the window is complete (later cycles are ignored).

        ``t_end_ns`` is accepted for symmetry with the record but not needed: a step ends
        where the next one starts.
        """
        if self.complete:
            return True
        if step != self._cur_step:
            if self._cur_step is not None and step < self._cur_step:
                return False  # out of order: steps only grow; drop rather than corrupt
            self._close_step(t_start_ns)
            if self.complete:
                return True
            self._cur_step = step
            self._cur_start = t_start_ns
            self._cur_bytes = 0
        self._cur_bytes += bytes_reduced
        return False

    def _close_step(self, next_start_ns: int) -> None:
        if self._cur_step is None:
            return
        if self._discard_left > 0:
            self._discard_left -= 1
            return
        self.steps.append(
            StepTotals(self._cur_step, self._cur_start, next_start_ns, self._cur_bytes)
        )
        if len(self.steps) >= self._measure_steps:
            self.complete = True


class StepMarks:
    """A watch window from a few step boundaries, not every step.

    A watching tuner needs a throughput per sub-window, not per step: it marks the
    boundary that opens each of ``parts`` sub-windows of ``every`` steps, and the one that
    closes the last. Between marks, a step costs the cycle thread one comparison
    (``next``): folding every step (a ``StepTotals`` each) cost the tiny job's rank 0 about
    10 us a step, on steps of 2 ms.
    """

    __slots__ = ("_settle", "every", "marks", "next", "parts")

    def __init__(self, every: int, parts: int, settle: int = 0) -> None:
        if every < 1 or parts < 1:
            raise ValueError("every and parts must be >= 1")
        self.every = every
        self.parts = parts
        self._settle = max(0, settle)
        #: (step, t_start_ns, bytes reduced before the step) at each mark
        self.marks: list[tuple[int, int, int]] = []
        #: the first step at which the next mark is wanted
        self.next = 0

    def add(self, step: int, t_start_ns: int, bytes_before: int) -> bool:
        """A step boundary at or after ``next``; True once the window is complete. The
        first call only starts the settling, when there is any."""
        if self._settle:
            self.next = step + self._settle
            self._settle = 0
            return False
        self.marks.append((step, t_start_ns, bytes_before))
        self.next = step + self.every
        return len(self.marks) > self.parts

    def spans(self) -> list[StepTotals]:
        """One ``StepTotals`` per sub-window (``step``: its first step)."""
        return [
            StepTotals(a[0], a[1], b[1], b[2] - a[2]) for a, b in itertools.pairwise(self.marks)
        ]


def score_spans(spans: Sequence[StepTotals], last_step: int) -> SampleScore:
    """``score_steps`` of sub-windows already summed (``StepMarks.spans``), each its own
    sub-window; ``last_step`` is the window's (a span's ``step`` is its first)."""
    return dataclasses.replace(score_steps(spans, len(spans)), last_step=last_step)
