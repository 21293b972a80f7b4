"""The machine's *other* load while one run ran: what a neighbour took from the cores.

``hvdprof ab`` judges each block's two runs as a pair. A neighbour's job that starts or
stops between them (a CI runner's other jobs, a build on the same VM) changes the second
run's speed, and the pair's ratio then measures the neighbour, not the change; no interval
over the blocks can tell such a pair from a real slowdown. So each run notes the load that
was not its own, and a block whose two runs saw loads too far apart is set aside.

Other load, in cores: the CPU time the whole machine spent busy over the run
(``/proc/stat``; steal included, the time a VM's neighbours took), less the run's own (every
descendant it reaped: ``getrusage(RUSAGE_CHILDREN)``, read after the wait) and the gate's
own (``RUSAGE_SELF``), per second of wall time. Where ``/proc/stat`` cannot be read (not
Linux) there is no figure, and no block is set aside.
"""

from __future__ import annotations

import os
import resource
import time
from dataclasses import dataclass

#: Fields of /proc/stat's ``cpu`` line that are busy time: user, nice, system, irq,
#: softirq, steal (guest time is already inside user and nice; idle and iowait are not).
_BUSY_FIELDS = (0, 1, 2, 5, 6, 7)


@dataclass(frozen=True)
class CpuSnapshot:
    """The counters at one moment; two of them make one run's figure."""

    busy_s: float  # the whole machine's busy CPU time (every core)
    reaped_s: float  # CPU time of this process's reaped descendants
    self_s: float  # this process's own CPU time (every thread)
    wall_s: float  # time.monotonic()


def _machine_busy_s() -> float | None:
    try:
        with open("/proc/stat", "rb") as f:
            first = f.readline().split()
    except OSError:
        return None
    if not first or first[0] != b"cpu" or len(first) < 9:
        return None
    ticks = sum(int(first[1 + i]) for i in _BUSY_FIELDS)
    return ticks / os.sysconf("SC_CLK_TCK")


def _cpu_s(usage: resource.struct_rusage) -> float:
    return usage.ru_utime + usage.ru_stime


def snapshot() -> CpuSnapshot | None:
    """The counters now (None where the machine's busy time cannot be read)."""
    busy = _machine_busy_s()
    if busy is None:
        return None
    return CpuSnapshot(
        busy,
        _cpu_s(resource.getrusage(resource.RUSAGE_CHILDREN)),
        _cpu_s(resource.getrusage(resource.RUSAGE_SELF)),
        time.monotonic(),
    )


def other_load_cores(before: CpuSnapshot | None, after: CpuSnapshot | None) -> float | None:
    """Cores' worth of CPU that neither the run nor the gate used between the two
    snapshots (never below 0: the counters tick at different moments)."""
    if before is None or after is None or after.wall_s <= before.wall_s:
        return None
    busy = after.busy_s - before.busy_s
    own = (after.reaped_s - before.reaped_s) + (after.self_s - before.self_s)
    return max(0.0, (busy - own) / (after.wall_s - before.wall_s))
