"""The machine's *other* load while one run ran: what a neighbour took from the cores.

``hvdprof ab`` judges each block's two runs as a pair. A neighbour's job that starts or
stops between them (a CI runner's other jobs, a build on the same VM) changes the second
run's speed, and the pair's ratio then measures the neighbour, not the change; no interval
over the blocks can tell such a pair from a real slowdown. So each run notes the load that
was not its own, and a block whose two runs saw loads too far apart is set aside.

Other load, in cores: the CPU time the whole machine spent busy (``/proc/stat``; steal
included, the time a VM's neighbours took), less the run's own and the gate's own
(``RUSAGE_SELF``), per second of wall time. Over the whole run the run's own is every
descendant it reaped (``getrusage(RUSAGE_CHILDREN)``, read after the wait). But a run is
judged by its steps alone, and on the demo job they were 0.7 s of a 9.8 s run (start-up
4.6 s): a neighbour that started during the imports changed the figure, not the steps.
So a :class:`LoadSampler` also reads the counters every ``interval`` seconds while the
run is alive, its process tree's CPU time from ``/proc/PID/stat`` (the run's first
process and every descendant: each one's own time and that of the children it reaped), and
:meth:`LoadSampler.other_load_cores` gives the figure over the samples around a window
(the steps'). Where ``/proc`` cannot be read (not Linux) there is no figure, and no block
is set aside.
"""

from __future__ import annotations

import bisect
import os
import resource
import threading
import time
from dataclasses import dataclass
from typing import NamedTuple

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


#: The shortest span the other load is read over (s): see LoadSampler.other_load_cores.
MIN_SPAN_S = 2.0


def _tree_cpu_s(root: int) -> float:
    """CPU time (s) of ``root`` and every live descendant, with the children each reaped
    (a child's time moves into its parent's when it is reaped, so the sum runs on). By
    parentage, not session: a launcher may start its ranks in sessions of their own."""
    parent: dict[int, int] = {}
    ticks: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                text = f.read()
        except OSError:  # it ended between the listing and the read
            continue
        # the command name, in parentheses, may hold spaces: the fields follow its last ")"
        fields = text[text.rfind(b")") + 2 :].split()
        if len(fields) > 14:
            pid = int(name)
            parent[pid] = int(fields[1])
            ticks[pid] = sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
    children: dict[int, list[int]] = {}
    for pid, ppid in parent.items():
        children.setdefault(ppid, []).append(pid)
    total, todo = 0, [root] if root in ticks else []
    while todo:
        pid = todo.pop()
        total += ticks[pid]
        todo.extend(children.get(pid, ()))
    return total / os.sysconf("SC_CLK_TCK")


class LoadReading(NamedTuple):
    """The other load over a stretch of a run, and how long that stretch was."""

    cores: float
    span_s: float


@dataclass(frozen=True)
class _Sample:
    unix_s: float
    busy_s: float  # the whole machine's
    tree_s: float  # the run's process tree's
    self_s: float  # the gate's


class LoadSampler:
    """Samples the machine's and one run's CPU time while the run is alive, so that the
    other load can be read over any window of it (the steps'), not only over the whole
    run. Its own reads are the gate's CPU time, which is taken off with the rest."""

    def __init__(self, interval_s: float = 0.25) -> None:
        self.interval_s = interval_s
        self.samples: list[_Sample] = []
        self._root: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, root: int) -> None:
        """Sample the process tree under ``root`` (the run's first process) until
        :meth:`stop`."""
        if _machine_busy_s() is None:
            return  # not Linux: no figure
        self._root = root
        self._sample()
        self._thread = threading.Thread(target=self._run, name="hvdprof-load", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop sampling (no last sample: once the run is reaped its tree's time has
        left ``/proc``, and a window that ends after the last sample has no figure)."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def _sample(self) -> None:
        assert self._root is not None
        busy = _machine_busy_s()
        if busy is None:
            return
        tree = _tree_cpu_s(self._root)
        own = _cpu_s(resource.getrusage(resource.RUSAGE_SELF))
        self.samples.append(_Sample(time.time(), busy, tree, own))

    def other_load_cores(
        self, start_unix_s: float, end_unix_s: float, min_span_s: float = MIN_SPAN_S
    ) -> LoadReading | None:
        """Cores' worth of CPU that neither the run nor the gate used between the last
        sample at or before ``start_unix_s`` and the first at or after ``end_unix_s``, with
        the seconds between those two samples (None when the samples do not enclose the
        window): the span is what the figure covers, wider than the window asked for. A
        window shorter than
        ``min_span_s`` is widened about its middle, within the samples: the counters
        tick 100 times a second per core, and a few ticks over a quarter second read as
        a quarter of a core (a quiet gate set a block aside so)."""
        times = [x.unix_s for x in self.samples]
        if times and end_unix_s - start_unix_s < min_span_s:
            middle = 0.5 * (start_unix_s + end_unix_s)
            start_unix_s = max(times[0], min(middle - 0.5 * min_span_s, times[-1] - min_span_s))
            end_unix_s = min(times[-1], start_unix_s + min_span_s)
        i = bisect.bisect_right(times, start_unix_s) - 1
        j = bisect.bisect_left(times, end_unix_s)
        if i < 0 or j >= len(times) or j <= i:
            return None
        a, b = self.samples[i], self.samples[j]
        other = (b.busy_s - a.busy_s) - (b.tree_s - a.tree_s) - (b.self_s - a.self_s)
        span = b.unix_s - a.unix_s
        return LoadReading(max(0.0, other / span), span)
