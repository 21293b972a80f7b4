"""Where a timed phase's machine time went, term by term, with nothing left unnamed.

With 64 ranks on 2 cores a step is the machine's time shared out, not one rank's path:
the ranks' cycle threads (by stage) counted only 68% of the 64-rank step once spread
over the cores, and the rest was a residue "not counted by any thread's clock". This
accounts for the whole machine over the timed phase (every step, hit and miss, and the
barriers between them), from two independent sources read at its start and end:

* the kernel's per-process CPU (``/proc/<pid>/stat``: utime + stime) of every process,
  the job's ranks (named by pid) apart from everything else on the machine;
* the machine's own counters (``/proc/stat``): idle, iowait, steal (the hypervisor's),
  and interrupts (time charged to no process).

Capacity (cores x wall) minus those terms is the residue: time neither source accounts
for (a process that started and ended within the phase, counter granularity). Within the
ranks, the threads' own clocks split it: the cycle thread's by stage, the training
thread's (the steps and the harness's barriers between them), and the rest (Gloo's and
torch's threads).

Linux only (``/proc``); elsewhere the accounting is left out.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

_TICK_MS = 1000.0 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 10.0
#: /proc/stat's columns after "cpu"
_STAT = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def available() -> bool:
    return Path("/proc/stat").exists()


def machine() -> dict[str, float]:
    """The machine's CPU time so far (ms, every core) by /proc/stat's kind."""
    line = Path("/proc/stat").read_text().splitlines()[0].split()
    return {k: int(v) * _TICK_MS for k, v in zip(_STAT, line[1:], strict=False)}


def processes() -> dict[int, tuple[str, float]]:
    """pid -> (command, CPU ms so far: user + system) of every process now in /proc."""
    out: dict[int, tuple[str, float]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            text = Path(entry.path, "stat").read_text()
        except OSError:  # it exited meanwhile
            continue
        comm = text[text.index("(") + 1 : text.rindex(")")]
        fields = text[text.rindex(")") + 2 :].split()
        out[int(entry.name)] = (comm, (int(fields[11]) + int(fields[12])) * _TICK_MS)
    return out


def snapshot(cycle: Any, whole_machine: bool) -> dict[str, Any]:
    """This rank at one instant: its pid, wall clock, its cycle thread's CPU by stage; on
    the rank that accounts (``whole_machine``), the machine and every process too."""
    snap: dict[str, Any] = {
        "pid": os.getpid(),
        "wall_ms": time.monotonic() * 1000,
        "cycle_ms": {k: v / 1e6 for k, v in cycle.cpu_ns.items()},
        # (called on the training thread: its submissions, waits, and the barriers)
        "main_ms": time.thread_time_ns() / 1e6,
    }
    if whole_machine and available():
        snap["machine"] = machine()
        snap["processes"] = processes()
    return snap


def account(
    start: list[dict[str, Any]], end: list[dict[str, Any]], cores: int, steps: int
) -> dict[str, Any]:
    """The phase's machine time (ms) by term, per timed step, and each term's share of
    the capacity; ``start``/``end``: every rank's snapshot (rank 0's has the machine)."""
    s0, e0 = start[0], end[0]
    if "machine" not in s0 or "machine" not in e0:
        return {}
    wall = e0["wall_ms"] - s0["wall_ms"]
    mach = {k: e0["machine"][k] - s0["machine"].get(k, 0.0) for k in e0["machine"]}
    pids = {s["pid"] for s in start}
    before, after = s0["processes"], e0["processes"]
    ranks_ms = others_ms = 0.0
    by_command: dict[str, float] = {}
    for pid, (comm, ms) in after.items():
        spent = ms - before[pid][1] if pid in before else ms
        if pid in pids:
            ranks_ms += spent
        else:
            others_ms += spent
            by_command[comm] = by_command.get(comm, 0.0) + spent
    stages: dict[str, float] = {}
    main_ms = 0.0
    for s, e in zip(start, end, strict=True):
        for k, v in e["cycle_ms"].items():
            stages[k] = stages.get(k, 0.0) + v - s["cycle_ms"].get(k, 0.0)
        main_ms += e.get("main_ms", 0.0) - s.get("main_ms", 0.0)
    cycle_ms = sum(stages.values())
    terms = {f"ranks_cycle_{k}": v for k, v in stages.items()}
    terms["ranks_training_threads"] = main_ms  # the steps' submissions, waits, barriers
    terms["ranks_other_threads"] = ranks_ms - cycle_ms - main_ms  # Gloo's, torch's
    terms["other_processes"] = others_ms
    terms["interrupts"] = mach.get("irq", 0.0) + mach.get("softirq", 0.0)
    terms["idle"] = mach.get("idle", 0.0) + mach.get("iowait", 0.0)
    terms["steal"] = mach.get("steal", 0.0)
    capacity = cores * wall
    residue = capacity - sum(terms.values())
    per_step = max(steps, 1)
    top = sorted(by_command.items(), key=lambda kv: -kv[1])[:4]
    return {
        "wall_ms": round(wall, 1),
        "steps": steps,
        "cores": cores,
        "capacity_ms": round(capacity, 1),
        "per_step_ms": {k: round(v / per_step, 3) for k, v in terms.items()},
        "share": {k: round(v / capacity, 4) for k, v in terms.items()} if capacity else {},
        "residue_ms_per_step": round(residue / per_step, 3),
        "residue_share": round(residue / capacity, 4) if capacity else None,
        "others_by_command_ms": {k: round(v, 1) for k, v in top},
        "kernel_busy_ms": round(
            sum(mach.get(k, 0.0) for k in ("user", "nice", "system", "irq", "softirq")), 1
        ),
    }
