"""Where to search: candidate configurations seeded from the job's own structure.

A Gaussian process over the whole space needs more windows than a 300-step budget holds
before it leaves the neighbourhood of the default, and on these machines the best cycle
times measured (0.5 and 0.2 ms) and the best thresholds (just below the job's large
gradients) were not in that neighbourhood. The gains come from a few places that the first
steps of the job already reveal:

* **Thresholds at the job's tensor sizes.** A tensor at least as large as the threshold is
  reduced in place; a smaller one is copied into a fusion buffer. A threshold just above a
  class of large gradients (the default 4 MiB over 3 MiB weights) copies each of them for
  almost no saved backend call; one at their size reduces them in place. So each of the
  largest size classes is a candidate, as is a threshold that fuses the whole step, and
  the log-scale extremes (a sixteenth and sixteen times the default).
* **Cycle times on a log scale**, a fifth to five times the default, none longer than
  twice the measured step. A training thread that starts to wait starts the cycle at once
  (the cycle's ``urgent`` wake), so a cycle longer than the step no longer holds the step
  up; what it changes is how many timer-driven cycles run while the training thread
  computes. Where compute fills the cores, fewer cycles take less CPU from it: on a job of
  11 ms steps and one wait per step (2 ranks on 2 cores) a 10-15 ms cycle was 13-15%
  faster than the 5 ms default. (The cap was a quarter of the step before that wake
  existed, when a 50 ms cycle in a 4 ms step slowed a tiny job tenfold.)
* **The response cache** flipped, once; off only where the steady job's ops missed it.

Candidates the structure says cannot help are never run (each costs the job a window):

* a shorter cycle time saves at most the time the cycle thread waited between cycles, so
  one that could save under ``MIN_GAIN`` of the step is left out (a cycle busy all the
  time gains nothing from a shorter pause);
* a longer cycle time helps by fusing the tensors of several cycles into one and by
  running fewer cycles (each one's negotiation costs CPU the training needs, whether or
  not it completes anything), so with about one cycle per step, every cycle counted, it
  has nothing to fuse or save and can only add waits. (Counting only the cycles that
  reduced something hid the saving: a job of 11 ms steps with one such cycle a step kept
  its 5 ms default, 0.885 of a 15 ms cycle's throughput.)
* the response cache turned off when every op of a steady window went through it: a hit
  sends one bit where a miss negotiates the op by name, so off can only cost (the tiny
  job ran at 0.6 of its default in that candidate's windows);
* a threshold that behaves exactly as the default does: no tensor lies between the two
  (each is reduced in place, or copied, under both), and the step's bytes fit in either
  (no fusion buffer ever fills earlier).

Each candidate changes one knob of the default; the tuner adds the combination of the best
threshold and the best cycle time once both are measured. Pure functions.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from hvdprof.autotune.space import (
    CACHE_AXIS,
    CYCLE_AXIS,
    CYCLE_TIME_MAX_MS,
    CYCLE_TIME_MIN_MS,
    FUSION_AXIS,
    FUSION_THRESHOLD_MAX_BYTES,
    FUSION_THRESHOLD_MIN_BYTES,
    SearchSpace,
)
from hvdprof.common.records import TunableParams

KiB = 1024
#: gradients at least this large form a "size class" worth a threshold of its own
LARGE_TENSOR_BYTES = 256 * KiB
#: size classes (by bytes they carry per step) that get a threshold candidate
SIZE_CLASSES = 3
#: candidate thresholds nearer than this factor to one already listed are dropped
MIN_SPACING = 1.3
#: cycle times tried, as multiples of the default, in the order tried
CYCLE_FACTORS = (0.5, 2.0, 0.2, 5.0)
#: no candidate cycle time exceeds this multiple of the measured step
MAX_CYCLE_OF_STEP = 2.0
#: threshold extremes, as multiples of the default
THRESHOLD_FACTORS = (1 / 16, 16.0)
#: a candidate whose best possible gain (from the structure) is under this share of the
#: step is not worth its window
MIN_GAIN = 0.02
#: cycles per step at or under which a longer cycle has nothing to fuse
MIN_CYCLES_TO_FUSE = 1.5


@dataclass(frozen=True, slots=True)
class JobStructure:
    """What the first steps showed: step time, bytes per step, allreduced tensor sizes, and
    the share of the step the cycle thread spent waiting between cycles."""

    step_s: float
    bytes_per_step: int
    tensor_bytes: tuple[int, ...] = ()  # one entry per distinct allreduced tensor
    wait_fraction: float = 0.0
    cycles_per_step: float = 0.0  # 0: not known
    #: share of a steady window's ops negotiated through the response cache; None: not known
    cache_hit_fraction: float | None = None


def _far_from(value: float, others: Sequence[float]) -> bool:
    return all(max(value, o) / max(min(value, o), 1e-12) >= MIN_SPACING for o in others)


def threshold_candidates(default_bytes: int, structure: JobStructure | None) -> list[int]:
    """Thresholds worth a window, most promising first (see the module doc)."""
    out: list[int] = []

    def add(nbytes: float) -> None:
        value = int(min(max(nbytes, FUSION_THRESHOLD_MIN_BYTES), FUSION_THRESHOLD_MAX_BYTES))
        value = value // KiB * KiB  # at or below the size: the tensor is reduced in place
        if _far_from(value, [default_bytes, *out]):
            out.append(value)

    if structure is not None and structure.tensor_bytes:
        totals: dict[int, int] = {}
        for size in structure.tensor_bytes:
            if size >= LARGE_TENSOR_BYTES:
                totals[size] = totals.get(size, 0) + size
        for size in sorted(totals, key=lambda s: -totals[s])[:SIZE_CLASSES]:
            add(size)
        total = sum(structure.tensor_bytes)
        if total > 0:  # fuse the whole step
            add(2 ** math.ceil(math.log2(total)))
    for factor in THRESHOLD_FACTORS:
        add(default_bytes * factor)
    if structure is not None and structure.tensor_bytes:
        out = [t for t in out if not same_as_threshold(t, default_bytes, structure.tensor_bytes)]
    return out


def same_as_threshold(threshold: int, other: int, tensor_bytes: Sequence[int]) -> bool:
    """True when the two thresholds treat every tensor alike: none lies between them (a
    tensor at least as large as the threshold is reduced in place, a smaller one copied
    into a fusion buffer), and the tensors fused under either fit in the smaller buffer.

    >>> same_as_threshold(64 << 20, 4 << 20, [4096] * 10)  # 40 KB a step: both fuse it all
    True
    >>> same_as_threshold(1 << 20, 4 << 20, [3 << 20])  # in place at 1 MiB, copied at 4
    False
    """
    low, high = sorted((threshold, other))
    if any(low <= size < high for size in tensor_bytes):
        return False
    fused = sum(size for size in tensor_bytes if size < low)
    return fused <= low


def cycle_candidates(default_ms: float, structure: JobStructure | None) -> list[float]:
    """Cycle times worth a window, nearest the default first (half and twice it, then a
    fifth and five times), none beyond twice the measured step.

    Why nearest first, both ways: a round whose windows grew to the job's noise holds only
    a few candidate windows, and the early stop ends it once those measured no faster.
    Listed shortest first, the 11 ms-step job whose best cycle was 15 ms (its 5 ms default
    at 0.885 of it) spent its first windows on 1 and 2.5 ms and the cache and stopped
    before 10 ms was measured."""
    limit = CYCLE_TIME_MAX_MS
    if structure is not None and structure.step_s > 0:
        limit = max(default_ms, structure.step_s * 1000 * MAX_CYCLE_OF_STEP)
    out: list[float] = []
    for factor in CYCLE_FACTORS:
        value = min(max(default_ms * factor, CYCLE_TIME_MIN_MS), CYCLE_TIME_MAX_MS)
        helps = structure is None or cycle_can_help(value, default_ms, structure)
        if value <= limit and helps and _far_from(value, [default_ms, *out]):
            out.append(value)
    return out


def cycle_can_help(value_ms: float, default_ms: float, structure: JobStructure) -> bool:
    """Whether the structure leaves room for a cycle time of ``value_ms`` to gain (see the
    module doc); an unmeasured structure (no step time) leaves room for anything.

    >>> busy = JobStructure(0.01, 1 << 20, (1 << 20,), wait_fraction=0.01, cycles_per_step=1)
    >>> cycle_can_help(0.2, 1.0, busy), cycle_can_help(5.0, 1.0, busy)
    (False, False)
    """
    if structure.step_s <= 0:
        return True
    if value_ms < default_ms:
        return structure.wait_fraction * (1 - value_ms / default_ms) >= MIN_GAIN
    return not 0 < structure.cycles_per_step <= MIN_CYCLES_TO_FUSE


def cache_can_help(cache_enabled: bool, structure: JobStructure | None) -> bool:
    """Whether turning the response cache over may gain: turning it on always may; turning
    it off only where the steady job's ops missed it (every op then negotiates in full,
    names and all, where a hit sends one bit).

    >>> steady = JobStructure(0.002, 1 << 16, (1 << 14,), cache_hit_fraction=1.0)
    >>> cache_can_help(True, steady), cache_can_help(False, steady), cache_can_help(True, None)
    (False, True, True)
    """
    if not cache_enabled or structure is None or structure.cache_hit_fraction is None:
        return True
    return structure.cache_hit_fraction < 1.0


def seed_candidates(
    space: SearchSpace, default: TunableParams, structure: JobStructure | None
) -> list[TunableParams]:
    """One-knob variations of ``default`` over the searched axes, rounded as proposals are,
    each once; cycle times and thresholds taken in turn, each list's most promising first,
    then the cache.

    Why in turn: the job runs the default for every candidate's first window until one
    measures clearly better, so the knob that matters must be reached early whichever it
    is. Listed cycle times first, the fusion-bound job (its default 0.79 of its best, the
    gain in a threshold at its 3 MiB gradients) ran four cycle-time windows before its
    first threshold, and tuned at 0.80-0.84 of its best throughput."""
    axes = space.axes
    out: list[TunableParams] = []

    def add(p: TunableParams) -> None:
        if space.contains(p):
            p = space.canonical(p)
            if p != default and p not in out:
                out.append(p)

    cycles: list[TunableParams] = []
    thresholds: list[TunableParams] = []
    if CYCLE_AXIS in axes:
        cycles = [
            TunableParams(default.fusion_threshold_bytes, ms, default.cache_enabled)
            for ms in cycle_candidates(default.cycle_time_ms, structure)
        ]
    if FUSION_AXIS in axes:
        thresholds = [
            TunableParams(nbytes, default.cycle_time_ms, default.cache_enabled)
            for nbytes in threshold_candidates(default.fusion_threshold_bytes, structure)
        ]
    for pair in itertools.zip_longest(cycles, thresholds):
        for p in pair:
            if p is not None:
                add(p)
    if CACHE_AXIS in axes and cache_can_help(default.cache_enabled, structure):
        add(
            TunableParams(
                default.fusion_threshold_bytes, default.cycle_time_ms, not default.cache_enabled
            )
        )
    return out


def combine(default: TunableParams, a: TunableParams, b: TunableParams) -> TunableParams:
    """``a``'s changes to ``default`` together with ``b``'s (a's win where both changed)."""
    values = {}
    for axis in (FUSION_AXIS, CYCLE_AXIS, CACHE_AXIS):
        base = getattr(default, axis)
        va, vb = getattr(a, axis), getattr(b, axis)
        values[axis] = va if va != base else vb
    return TunableParams(
        int(values[FUSION_AXIS]), float(values[CYCLE_AXIS]), bool(values[CACHE_AXIS])
    )
