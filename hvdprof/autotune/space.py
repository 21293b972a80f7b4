"""The autotuner's search space: which knobs it may move, over what range, on what scale.

Horovod searches the fusion threshold linearly over 0-64 MB and the cycle time linearly
over 1-100 ms, so a Gaussian process with one length scale per axis sees the interesting
region (a few MB, a few ms) squeezed into a corner. Both knobs act multiplicatively (twice
the buffer halves the number of backend calls), so we search them on a log scale:

* fusion threshold: 4 KiB .. 256 MiB (the default 4 MiB is inside, and the top is far
  above the largest gradient of common models, so "fuse everything" is reachable);
* cycle time: 0.2 .. 50 ms;
* response cache: on/off, a categorical axis of the same joint space.

Which knobs are searched depends on the backend (``space_from_config``): when allreduce goes
through shared memory (every rank on one host), fused groups fill the shared segment
(16 MiB, or the threshold if larger) and large tensors are reduced in place, so a threshold
below the segment changes nothing; the threshold is then held at its starting value and
the search is over the cycle time and the cache. Through Gloo the threshold decides how
many backend calls a step makes and what is copied into fusion buffers: it matters most.

A variable the user set explicitly (``Config.explicitly_set``) is fixed at its value and is
not an axis at all, so the optimizer never spends a sample on it.

Everything here is a pure function of its arguments: mapping a ``TunableParams`` to an
optimizer point and back, and rendering a configuration as the ``HVDPROF_*`` variables to set.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hvdprof.common.records import TunableParams
from hvdprof.config import Config, name_of

KiB = 1024
MiB = 1024 * KiB

#: search bounds (inclusive), in the units of ``TunableParams``
FUSION_THRESHOLD_MIN_BYTES = 4 * KiB
FUSION_THRESHOLD_MAX_BYTES = 256 * MiB
CYCLE_TIME_MIN_MS = 0.2
CYCLE_TIME_MAX_MS = 50.0

#: the ``HVDPROF_*`` variable behind each tunable knob
FUSION_THRESHOLD_VAR = name_of("fusion_threshold_bytes")
CYCLE_TIME_VAR = name_of("cycle_time_ms")
CACHE_CAPACITY_VAR = name_of("cache_capacity")

#: axis names, in the order they appear in an optimizer point
FUSION_AXIS = "fusion_threshold_bytes"
CYCLE_AXIS = "cycle_time_ms"
CACHE_AXIS = "cache_enabled"

_CACHE_ON = "on"
_CACHE_OFF = "off"

#: thresholds are rounded to whole KiB: finer steps change nothing measurable
_THRESHOLD_QUANTUM_BYTES = KiB


def round_threshold(nbytes: float) -> int:
    """A threshold rounded to whole KiB and clamped to the search range."""
    quantized = round(nbytes / _THRESHOLD_QUANTUM_BYTES) * _THRESHOLD_QUANTUM_BYTES
    return int(min(max(quantized, FUSION_THRESHOLD_MIN_BYTES), FUSION_THRESHOLD_MAX_BYTES))


def round_cycle_time(ms: float) -> float:
    """A cycle time rounded to 3 significant digits (so the printed value is readable)."""
    ms = min(max(float(ms), CYCLE_TIME_MIN_MS), CYCLE_TIME_MAX_MS)
    digits = 2 - math.floor(math.log10(ms))
    return min(max(round(ms, digits), CYCLE_TIME_MIN_MS), CYCLE_TIME_MAX_MS)


@dataclass(frozen=True)
class SearchSpace:
    """The axes being searched plus the values held fixed.

    ``fixed`` maps an axis name (``FUSION_AXIS``, ``CYCLE_AXIS``, ``CACHE_AXIS``) to the value
    used for it in every proposal; the other axes are searched.
    """

    fixed: tuple[tuple[str, Any], ...] = ()

    @property
    def fixed_values(self) -> dict[str, Any]:
        return dict(self.fixed)

    @property
    def axes(self) -> tuple[str, ...]:
        """Names of the searched axes, in point order."""
        held = self.fixed_values
        return tuple(a for a in (FUSION_AXIS, CYCLE_AXIS, CACHE_AXIS) if a not in held)

    @property
    def is_empty(self) -> bool:
        """True when the user fixed every knob: there is nothing to tune."""
        return not self.axes

    def dimensions(self) -> list[Any]:
        """The scikit-optimize dimensions of the searched axes (log scale for the numbers)."""
        from skopt.space import Categorical, Real

        dims: list[Any] = []
        for axis in self.axes:
            if axis == FUSION_AXIS:
                dims.append(
                    Real(
                        FUSION_THRESHOLD_MIN_BYTES,
                        FUSION_THRESHOLD_MAX_BYTES,
                        prior="log-uniform",
                        base=2,
                        name=FUSION_AXIS,
                    )
                )
            elif axis == CYCLE_AXIS:
                dims.append(
                    Real(
                        CYCLE_TIME_MIN_MS,
                        CYCLE_TIME_MAX_MS,
                        prior="log-uniform",
                        base=10,
                        name=CYCLE_AXIS,
                    )
                )
            else:
                dims.append(Categorical([_CACHE_ON, _CACHE_OFF], name=CACHE_AXIS))
        return dims

    def contains(self, params: TunableParams) -> bool:
        """Whether ``params`` lies in the searched range and agrees with every fixed value."""
        for axis, value in self.fixed:
            if axis == CYCLE_AXIS:
                if not math.isclose(params.cycle_time_ms, value, rel_tol=1e-6):
                    return False
            elif getattr(params, axis) != value:
                return False
        threshold_ok = FUSION_AXIS not in self.axes or (
            FUSION_THRESHOLD_MIN_BYTES
            <= params.fusion_threshold_bytes
            <= FUSION_THRESHOLD_MAX_BYTES
        )
        cycle_ok = CYCLE_AXIS not in self.axes or (
            CYCLE_TIME_MIN_MS <= params.cycle_time_ms <= CYCLE_TIME_MAX_MS
        )
        return threshold_ok and cycle_ok

    def to_point(self, params: TunableParams) -> list[Any]:
        """The optimizer point for ``params`` (searched axes only; numbers clamped to range)."""
        point: list[Any] = []
        for axis in self.axes:
            if axis == FUSION_AXIS:
                point.append(
                    float(
                        min(
                            max(params.fusion_threshold_bytes, FUSION_THRESHOLD_MIN_BYTES),
                            FUSION_THRESHOLD_MAX_BYTES,
                        )
                    )
                )
            elif axis == CYCLE_AXIS:
                point.append(min(max(params.cycle_time_ms, CYCLE_TIME_MIN_MS), CYCLE_TIME_MAX_MS))
            else:
                point.append(_CACHE_ON if params.cache_enabled else _CACHE_OFF)
        return point

    def from_point(self, point: Sequence[Any]) -> TunableParams:
        """The ``TunableParams`` for an optimizer point, rounded, with fixed values filled in."""
        values = self.fixed_values
        for axis, value in zip(self.axes, point, strict=True):
            if axis == FUSION_AXIS:
                values[axis] = round_threshold(float(value))
            elif axis == CYCLE_AXIS:
                values[axis] = round_cycle_time(float(value))
            else:
                values[axis] = value == _CACHE_ON
        return TunableParams(
            fusion_threshold_bytes=int(values[FUSION_AXIS]),
            cycle_time_ms=float(values[CYCLE_AXIS]),
            cache_enabled=bool(values[CACHE_AXIS]),
        )

    def canonical(self, params: TunableParams) -> TunableParams:
        """``params`` as a proposal would carry it: rounded like ``from_point`` does."""
        return self.from_point(self.to_point(params))

    def to_unit(self, params: TunableParams) -> list[float]:
        """``params`` as a point of the unit cube: log-scaled numbers, the cache as 0/1.

        The tuner's model and trust region work here, where one unit is the whole range
        of every axis.
        """
        unit: list[float] = []
        for axis, value in zip(self.axes, self.to_point(params), strict=True):
            if axis == FUSION_AXIS:
                unit.append(
                    _unit_log(value, FUSION_THRESHOLD_MIN_BYTES, FUSION_THRESHOLD_MAX_BYTES)
                )
            elif axis == CYCLE_AXIS:
                unit.append(_unit_log(value, CYCLE_TIME_MIN_MS, CYCLE_TIME_MAX_MS))
            else:
                unit.append(1.0 if value == _CACHE_ON else 0.0)
        return unit

    def from_unit(self, unit: Sequence[float]) -> TunableParams:
        """The configuration at a unit-cube point (clipped to the cube, then rounded)."""
        point: list[Any] = []
        for axis, u in zip(self.axes, unit, strict=True):
            u = min(max(float(u), 0.0), 1.0)
            if axis == FUSION_AXIS:
                point.append(
                    _from_unit_log(u, FUSION_THRESHOLD_MIN_BYTES, FUSION_THRESHOLD_MAX_BYTES)
                )
            elif axis == CYCLE_AXIS:
                point.append(_from_unit_log(u, CYCLE_TIME_MIN_MS, CYCLE_TIME_MAX_MS))
            else:
                point.append(_CACHE_ON if u >= 0.5 else _CACHE_OFF)
        return self.from_point(point)


def _unit_log(value: float, lo: float, hi: float) -> float:
    return (math.log(value) - math.log(lo)) / (math.log(hi) - math.log(lo))


def _from_unit_log(u: float, lo: float, hi: float) -> float:
    return math.exp(math.log(lo) + u * (math.log(hi) - math.log(lo)))


def space_from_config(
    config: Config, initial: TunableParams, shared_memory: bool = False
) -> SearchSpace:
    """The search space for this job: every knob the user did not set explicitly, less the
    fusion threshold when allreduce goes through shared memory (see the module doc).

    Fixed values come from ``initial`` (what the runtime is running with, itself derived
    from ``config``), so a proposal never changes a knob the user pinned.
    """
    fixed: list[tuple[str, Any]] = []
    if FUSION_THRESHOLD_VAR in config.explicitly_set or shared_memory:
        fixed.append((FUSION_AXIS, int(initial.fusion_threshold_bytes)))
    if CYCLE_TIME_VAR in config.explicitly_set:
        fixed.append((CYCLE_AXIS, float(initial.cycle_time_ms)))
    if CACHE_CAPACITY_VAR in config.explicitly_set:
        fixed.append((CACHE_AXIS, bool(initial.cache_enabled)))
    return SearchSpace(fixed=tuple(fixed))


def env_assignments(params: TunableParams, cache_capacity: int) -> dict[str, str]:
    """The ``HVDPROF_*`` variables that reproduce ``params`` in a later run.

    The cache is a capacity, not a switch: "off" is ``HVDPROF_CACHE_CAPACITY=0`` and "on"
    is the capacity this job ran with (``cache_capacity``, the default unless the user set it).
    """
    capacity = cache_capacity if cache_capacity > 0 else Config().cache_capacity
    return {
        FUSION_THRESHOLD_VAR: str(int(params.fusion_threshold_bytes)),
        CYCLE_TIME_VAR: f"{params.cycle_time_ms:g}",
        CACHE_CAPACITY_VAR: str(capacity if params.cache_enabled else 0),
    }
