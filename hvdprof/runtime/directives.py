"""Orders rank 0 gives every rank, applied by all of them at the end of the same cycle.

They travel in the coordinator's reply, so every rank applies them at one agreed point
(new parameters from the same cycle on, a stack report inside the same exchange). One
small class per order, rather than (string, value) pairs: the cycle dispatches on the
type, and a misspelt order is a name error where it is made, not a silent no-op where it
is applied.
"""

from __future__ import annotations

from dataclasses import dataclass

from hvdprof.common.records import TunableParams


@dataclass(frozen=True, slots=True)
class NewParams:
    """The autotuner's next parameters, from the next cycle on."""

    params: TunableParams


@dataclass(frozen=True, slots=True)
class Abort:
    """Fail every pending op on every rank with this message (a deadlock)."""

    message: str


@dataclass(frozen=True, slots=True)
class ReportStacks:
    """The ranks named (and rank 0) send rank 0 their main thread's stack (a stall)."""

    ranks: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class StallShutdown:
    """A stall outlasted HVDPROF_STALL_SHUTDOWN_TIME_SECONDS: every rank ends the job."""

    message: str


@dataclass(frozen=True, slots=True)
class ClockSync:
    """Every rank ping-pongs with rank 0 now, for the timeline's clock correction."""


Directive = NewParams | Abort | ReportStacks | StallShutdown | ClockSync
