"""Timelines recorded by real ranks: real processes through ``hvdprof run``, real Gloo.

Few launches, each checked for many things (a launch costs a torch import per rank):

* ``main`` (2 ranks, HVDPROF_TIMELINE at init, cycle markers, rank 1's clock skewed by
  +50 ms): strict JSON and manifests, phase order and nesting, readiness marks on the
  cached and uncached paths with a straggler, fusion-group args across ranks, an escaped
  tensor name, cycle markers, the clock-offset correction, a merge with real
  torch.profiler traces, then start/stop windows at 2 ranks;
* ``windows`` (3 ranks): start/stop windows, restart gzipped, the runtime after stop;
* ``steps`` (2 ranks): HVDPROF_TIMELINE_GZIP, _STEPS and _SAMPLE_EVERY together;
* ``kill`` (2 ranks): rank 1 SIGKILLed mid-run with the timeline on;
* two launches whose timeline path cannot be written.

The workload is ``workers/timeline_worker.py``. Every launch has a hard time limit.
"""

from __future__ import annotations

import gzip
import json
import os
import statistics
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, JobResult, child_env, run_job
from test_timeline_kill import wait_gone

from hvdprof.common import activities as act
from hvdprof.config import Config
from hvdprof.timeline import load_trace, load_traces
from hvdprof.timeline.manifest import timeline_shift_ns
from hvdprof.timeline.merge import KINETO_PID_BASE, KINETO_PIDS_PER_RANK

pytestmark = pytest.mark.timeout(240)

WORKER = "timeline_worker.py"
WEIRD_NAME = 'grad/"quoted"\\back\nslash \u00fcnic\u00f8de \u2713 \U0001f680'
GRAD_NAMES = [f"grad.{i}" for i in range(6)]  # the worker's gradients, one fusion group
SKEW_US = 50_000.0
STRAGGLER = 1
MAIN_STEPS = 6
STRAGGLE_STEPS = (0, 3)  # step 0: uncached path; step 3: cached path
STRAGGLE_S = 0.3
REPEATS = 50  # back-to-back blocking allreduces of one name
PHASE_ORDER = ("QUEUE", act.MEMCPY_IN_FUSION_BUFFER, "<collective>", act.MEMCPY_OUT_FUSION_BUFFER)
#: the worker's window sequence: phase -> steps (win1 and win2 are recorded, the rest not)
WINDOW_PHASES = {"pre": 2, "win1": 3, "mid": 2, "win2": 3, "post": 2}


# ------------------------------------------------------------------------- launching


def launch(
    num_proc: int,
    *worker_args: str,
    launcher_args: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
    timeout: float = 90.0,
) -> JobResult:
    """``hvdprof run -np N [launcher_args] -- python timeline_worker.py ARGS`` (hard limits)."""
    return run_job(
        WORKER, num_proc, *worker_args, env=env, timeout=timeout, launcher_args=launcher_args
    )


def info(result: JobResult, rank: int, key: str) -> list[Any]:
    """The JSON values of ``rank``'s ``INFO <key> <json>`` lines."""
    return [json.loads(v) for v in result.values(rank, f"INFO {key}")]


def windows_of(result: JobResult, rank: int) -> dict[str, tuple[int, int | None]]:
    return {name: (t0, t1) for name, t0, t1 in info(result, rank, "window")}


# --------------------------------------------------------------------------- reading


def load_strict(path: Path) -> list[dict[str, Any]]:
    """``json.load`` of a (possibly gzipped) trace: raises unless it is strictly valid JSON."""
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        data = json.load(f)
    assert isinstance(data, list), f"{path}: a trace is a JSON array"
    return data


def ns(us: float) -> int:
    """Trace microseconds (three decimals) as integer nanoseconds, exactly."""
    return round(us * 1000)


def span(event: dict[str, Any]) -> tuple[int, int]:
    start = ns(event["ts"])
    return start, start + ns(event["dur"])


def slices(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e.get("ph") == "X"]


def tensor_names(events: list[dict[str, Any]]) -> Counter[str]:
    """How many ops of each tensor name the trace holds (one NEGOTIATE slice per op)."""
    return Counter(
        e["args"]["tensor"]
        for e in events
        if e.get("ph") == "X" and e["name"].startswith(act.NEGOTIATE_PREFIX)
    )


def markers(events: list[dict[str, Any]]) -> set[str]:
    return {name for name in tensor_names(events) if name.startswith("mark.")}


def cycles(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in slices(events) if e["name"].startswith(act.CYCLE_PREFIX)]


def cycle_number(event: dict[str, Any]) -> int:
    return int(event["name"][len(act.CYCLE_PREFIX) :])


def op_units(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every op of a rank's trace: its NEGOTIATE slice, READY marks, op slice and phases.

    The renderer writes one op's events together in the op's lane: its NEGOTIATE slice
    and READY marks (in either order), then the op slice, then the phases inside it. So in
    file order, a lane's NEGOTIATE slice and marks belong to the next op slice, and every
    other slice to the op slice before it.
    """
    units: list[dict[str, Any]] = []
    current: dict[int, dict[str, Any]] = {}
    pending: dict[int, dict[str, Any]] = defaultdict(lambda: {"negotiate": [], "ready": []})
    for e in events:
        tid = e.get("tid", 0)
        if tid < act.FIRST_TENSOR_LANE or e.get("ph") not in ("X", "i"):
            continue
        if e["ph"] == "i":
            assert e["name"].startswith(act.READY_PREFIX), f"unexpected instant in lane {tid}: {e}"
            pending[tid]["ready"].append(e)
        elif e["name"].startswith(act.NEGOTIATE_PREFIX):
            pending[tid]["negotiate"].append(e)
        elif e["name"] in act.OPS:
            before = pending.pop(tid, {"negotiate": [], "ready": []})
            assert len(before["negotiate"]) == 1, f"op slice {e} after {before['negotiate']}"
            neg = before["negotiate"][0]
            assert neg["args"]["tensor"] == e["args"]["tensor"], (neg, e)
            unit = {"negotiate": neg, "ready": before["ready"], "op": e, "children": [], "tid": tid}
            current[tid] = unit
            units.append(unit)
        else:
            assert tid in current, f"phase slice before any op slice in lane {tid}: {e}"
            current[tid]["children"].append(e)
    leftovers = {tid: p for tid, p in pending.items() if p["negotiate"] or p["ready"]}
    assert not leftovers, f"NEGOTIATE slices or READY marks without an op slice: {leftovers}"
    return units


def nesting_problems(events: list[dict[str, Any]]) -> list[str]:
    """Partial overlaps between slices of one lane (children must lie inside parents)."""
    problems = []
    by_lane: dict[tuple[Any, Any], list[tuple[int, int, str]]] = defaultdict(list)
    for e in slices(events):
        start, end = span(e)
        by_lane[(e["pid"], e.get("tid"))].append((start, end, e["name"]))
    for lane, items in by_lane.items():
        items.sort(key=lambda s: (s[0], -s[1]))
        stack: list[tuple[int, int, str]] = []
        for start, end, name in items:
            while stack and stack[-1][1] <= start:
                stack.pop()
            if stack and end > stack[-1][1]:
                problems.append(f"lane {lane}: {name} [{start}, {end}] overlaps {stack[-1]}")
            stack.append((start, end, name))
    return problems


def check_trace_shape(events: list[dict[str, Any]], where: str) -> None:
    """No unterminated slices: only complete X slices (dur >= 0) or balanced B/E pairs."""
    assert events, f"{where}: no events"
    open_slices: Counter[tuple[Any, Any]] = Counter()
    for e in events:
        ph = e["ph"]
        if ph == "X":
            assert isinstance(e.get("dur"), (int, float)) and e["dur"] >= 0, (where, e)
            assert isinstance(e.get("ts"), (int, float)), (where, e)
        elif ph == "B":
            open_slices[(e["pid"], e.get("tid"))] += 1
        elif ph == "E":
            open_slices[(e["pid"], e.get("tid"))] -= 1
            assert open_slices[(e["pid"], e.get("tid"))] >= 0, f"{where}: E without B: {e}"
    unterminated = {lane: n for lane, n in open_slices.items() if n}
    assert not unterminated, f"{where}: unterminated B slices {unterminated}"
    problems = nesting_problems(events)
    assert not problems, f"{where}: slices overlap partially:\n" + "\n".join(problems[:10])


def check_phase_order(unit: dict[str, Any], where: str) -> None:
    """NEGOTIATE <= [QUEUE] <= MEMCPY_IN <= <BACKEND>_<OP> <= MEMCPY_OUT, all inside the op."""
    neg, op = unit["negotiate"], unit["op"]
    what = f"{where}: {neg['args']['tensor']!r} in lane {unit['tid']}"
    assert op is not None, f"{what}: NEGOTIATE slice without an op slice"
    op_name = neg["name"][len(act.NEGOTIATE_PREFIX) :]
    assert op["name"] == op_name, what
    args = op["args"]
    backend_call = act.collective_name(args["backend"], op_name)
    n_start, n_end = span(neg)
    o_start, o_end = span(op)
    assert n_start <= n_end <= o_start, f"{what}: negotiation ends after the op starts"
    order = [c["name"] if c["name"] != backend_call else "<collective>" for c in unit["children"]]
    assert order == [p for p in PHASE_ORDER if p in order], f"{what}: phases {order}"
    assert "<collective>" in order, f"{what}: no {backend_call} slice"
    if op_name == "ALLREDUCE" and args["group_tensors"] > 1 and args["group_buffer_bytes"]:
        assert act.MEMCPY_IN_FUSION_BUFFER in order, f"{what}: fused, no MEMCPY_IN"
        assert act.MEMCPY_OUT_FUSION_BUFFER in order, f"{what}: fused, no MEMCPY_OUT"
    cursor = n_end
    for child in unit["children"]:
        c_start, c_end = span(child)
        assert cursor <= c_start, f"{what}: {child['name']} starts before the previous phase ends"
        assert o_start <= c_start and c_end <= o_end, f"{what}: {child['name']} outside the op"
        cursor = c_end


def collective_spans(events: list[dict[str, Any]]) -> dict[int, tuple[int, int]]:
    """group id -> the backend call's [start, end] in ns (from any op of the group)."""
    out = {}
    for unit in op_units(events):
        op = unit["op"]
        call = act.collective_name(op["args"]["backend"], op["name"])
        for child in unit["children"]:
            if child["name"] == call:
                out[op["args"]["group"]] = span(child)
    return out


def check_window(
    directory: Path, name: str, result: JobResult, num_proc: int, gz: bool
) -> dict[int, list[dict[str, Any]]]:
    """One start_timeline/stop_timeline window, on every rank. Returns the events."""
    traces = {}
    firsts, lasts = set(), set()
    for rank in range(num_proc):
        path = directory / (f"rank.{rank}.json" + (".gz" if gz else ""))
        assert path.exists(), f"{name}: no {path.name} ({os.listdir(directory)})"
        events = load_strict(path)
        traces[rank] = events
        where = f"{name} rank {rank}"
        check_trace_shape(events, where)
        manifest = json.loads((directory / f"manifest.rank.{rank}.json").read_text())
        assert manifest["closed"] is True and manifest["events_dropped"] == 0, where
        assert manifest["config"]["timeline_gzip"] is gz, where

        # exactly this window's steps: its markers, each gradient once per step
        assert markers(events) == {f"mark.{name}.{k}" for k in range(WINDOW_PHASES[name])}, (
            f"{where}: markers {sorted(markers(events))}"
        )
        counts = tensor_names(events)
        assert all(counts[g] == WINDOW_PHASES[name] for g in GRAD_NAMES), f"{where}: {counts}"

        # nothing outside the window, on this rank's timeline clock
        t0, t1 = windows_of(result, rank)[name]
        if t1 is None:  # left open until shutdown: its end is in the manifest
            t1 = manifest["end_local_ns"]
        shift = timeline_shift_ns(manifest)
        lo, hi = t0 + shift, t1 + shift
        numbers = [cycle_number(e) for e in cycles(events)]
        assert numbers, f"{where}: no cycle markers (start_timeline(mark_cycles=True))"
        # The cycle that switched the timeline on may have begun just before the call
        # (it picks up the command when it builds its message), so it and the counters
        # stamped at its start may precede t0, but that cycle must end after t0. Ops
        # (tensor lanes) are all submitted after start_timeline returned.
        first_start, first_end = span(min(cycles(events), key=cycle_number))
        assert first_end >= lo, f"{where}: the first cycle ended before start_timeline"
        for e in events:
            if "ts" in e:
                start = ns(e["ts"])
                end = start + ns(e.get("dur", 0))
                floor = lo if e.get("tid", 0) >= act.FIRST_TENSOR_LANE else min(lo, first_start)
                assert floor <= start and end <= hi, f"{where}: {e} outside [{floor}, {hi}] ns"

        assert numbers == list(range(numbers[0], numbers[-1] + 1)), f"{where}: cycle gaps"
        firsts.add(numbers[0])
        lasts.add(numbers[-1])
    # the switch happened at the same cycle on every rank, both ways
    assert len(firsts) == 1 and len(lasts) == 1, f"{name}: first {firsts}, last {lasts} cycles"
    return traces


# --------------------------------------------------------------------------- the jobs


@pytest.fixture(scope="module")
def main_job(tmp_path_factory: pytest.TempPathFactory) -> tuple[JobResult, Path]:
    out = tmp_path_factory.mktemp("timeline-main")
    env = {"HVDPROF_TIMELINE": str(out / "init"), "HVDPROF_TIMELINE_MARK_CYCLES": "1"}
    result = run_job(
        WORKER, 2, "main", str(out), "--skew-rank1-us", str(SKEW_US), env=env, timeout=120
    )
    return result, out


@pytest.fixture(scope="module")
def main_traces(main_job: tuple[JobResult, Path]) -> dict[int, list[dict[str, Any]]]:
    """The recording started at init (HVDPROF_TIMELINE), parsed strictly, per rank."""
    result, out = main_job
    assert result.returncode == 0, result.describe()
    return {r: load_strict(out / "init" / f"rank.{r}.json") for r in range(2)}


@pytest.fixture(scope="module")
def windows_job(tmp_path_factory: pytest.TempPathFactory) -> tuple[JobResult, Path]:
    out = tmp_path_factory.mktemp("timeline-windows3")
    return run_job(WORKER, 3, "windows", str(out), timeout=120), out


# ------------------------------------------------------------------------------ main


def test_main_job_completes(main_job: tuple[JobResult, Path]) -> None:
    result, _ = main_job
    for section in ("record", "profile", "stop_init", "window_pre", "window_win1", "window_mid"):
        result.assert_section(section, 2)
    result.assert_section("window_win2", 2)
    result.assert_done(2)


def test_files_are_strict_json_with_manifests(
    main_job: tuple[JobResult, Path], main_traces: dict[int, list[dict[str, Any]]]
) -> None:
    _, out = main_job
    run = load_traces(str(out / "init"))
    assert run.problems == [], run.problems
    run_ids = set()
    for rank, events in main_traces.items():
        manifest = json.loads((out / "init" / f"manifest.rank.{rank}.json").read_text())
        for key in ("rank", "size", "hostname", "start_unix_ns", "start_local_ns", "config"):
            assert key in manifest, f"manifest of rank {rank} lacks {key}"
        assert (manifest["rank"], manifest["size"]) == (rank, 2)
        assert manifest["hostname"] and isinstance(manifest["hostname"], str)
        assert abs(manifest["start_unix_ns"] / 1e9 - time.time()) < 3600
        assert manifest["config"]["timeline_dir"] == str(out / "init")
        assert manifest["config"]["timeline_mark_cycles"] is True
        assert {"offset_ns", "error_ns"} <= set(manifest["clock"])
        assert manifest["clock"]["error_ns"] >= 0
        assert manifest["closed"] is True
        assert manifest["events_dropped"] == 0
        # every event on disk is counted; the closing metadata event carries the counts
        assert manifest["events_written"] == len(events) - 1
        last = events[-1]
        assert last["name"] == act.TRACE_END and last["ph"] == "M"
        assert last["args"]["events_written"] == manifest["events_written"]
        assert last["args"]["events_dropped"] == 0
        run_ids.add(manifest["run_id"])
        assert load_trace(str(out / "init" / f"rank.{rank}.json")).complete
    assert len(run_ids) == 1


def test_phases_ordered_and_lanes_nest(main_traces: dict[int, list[dict[str, Any]]]) -> None:
    for rank, events in main_traces.items():
        where = f"rank {rank}"
        check_trace_shape(events, where)
        units = op_units(events)
        for unit in units:
            check_phase_order(unit, where)
        kinds = Counter(u["op"]["name"] for u in units)
        assert kinds["ALLREDUCE"] >= len(GRAD_NAMES) * MAIN_STEPS, kinds
        assert kinds["BROADCAST"] >= 1 and kinds["ALLGATHER"] >= 1, kinds
        fused = [u for u in units if u["op"]["args"].get("group_tensors", 0) > 1]
        assert fused, f"{where}: no fused allreduce at all"
        phases = Counter(c["name"] for u in fused for c in u["children"])
        assert phases[act.MEMCPY_IN_FUSION_BUFFER] == len(fused), phases
        # the collective is named for the backend that ran it: shared memory (both ranks
        # are on this host), or the control channel's sockets (TCP) for buffers up to
        # HVDPROF_SMALL_ALLREDUCE_BYTES
        for u in fused:
            backend = u["op"]["args"]["backend"]
            assert backend in ("SHM", "TCP"), backend
            names = [c["name"] for c in u["children"]]
            assert f"{backend}_ALLREDUCE" in names, names
            small = u["op"]["args"]["group_bytes"] <= Config().small_allreduce_bytes
            assert (backend == "TCP") == small, u["op"]["args"]
        assert phases["SHM_ALLREDUCE"] + phases["TCP_ALLREDUCE"] == len(fused), phases


def test_readiness_marks_and_the_straggler(main_traces: dict[int, list[dict[str, Any]]]) -> None:
    """Each rank marks its own readiness on both paths and names the last rank; the
    straggler's lateness shows in the punctual rank's file."""
    for rank, events in main_traces.items():
        units = op_units(events)
        seen = {True: 0, False: 0}
        for unit in units:
            neg = unit["negotiate"]
            args = neg["args"]
            what = f"rank {rank}: {args['tensor']!r}"
            # its own mark only: an op's events do not grow with the number of ranks
            assert set(args["ready_us"]) == {str(rank)}, what
            assert args["last_ready_rank"] in (0, 1), what
            assert args["last_ready_us"] >= args["ready_us"][str(rank)], what
            marks = {e["name"] for e in unit["ready"]}
            assert marks == {act.ready_name(rank)}, f"{what}: {marks}"
            # at its submission, which begins the slice; an op held for its rank's wait
            # (HVDPROF_WAKE_ON_SUBMIT_BYTES) begins negotiating later, when the cycle took it
            n_start, n_end = span(neg)
            own = ns(args["ready_us"][str(rank)])
            assert all(ns(e["ts"]) == own for e in unit["ready"]), what
            assert own <= n_start <= n_end, what
            seen[args["cached"]] += 1
        assert seen[True] and seen[False], f"rank {rank}: paths seen {seen}"

        by_name: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for unit in units:
            by_name[unit["negotiate"]["args"]["tensor"]].append(unit["negotiate"])
        for name in GRAD_NAMES:
            negs = by_name[name]
            assert len(negs) == MAIN_STEPS, (rank, name, len(negs))
            # first time: negotiated by the coordinator; from the second step on: cached
            assert [n["args"]["cached"] for n in negs] == [False] + [True] * (MAIN_STEPS - 1)
            for k in STRAGGLE_STEPS:
                args = negs[k]["args"]
                what = f"rank {rank}, {name}, step {k} (cached={args['cached']})"
                assert args["last_ready_rank"] == STRAGGLER, f"{what}: {args}"
                if rank != STRAGGLER:
                    late_us = args["last_ready_us"] - args["ready_us"][str(rank)]
                    assert late_us >= STRAGGLE_S * 1e6 * 0.6, (
                        f"{what}: straggler late by {late_us} us"
                    )
            if rank != STRAGGLER:  # the punctual rank waited in negotiation for the straggler
                assert negs[3]["dur"] >= STRAGGLE_S * 1e6 * 0.6, (name, negs[3])


def test_fusion_group_args_agree_across_ranks(
    main_traces: dict[int, list[dict[str, Any]]],
) -> None:
    """Same op (name, occurrence) -> same group id, tensor count and buffer bytes on every
    rank; and each group's args describe the ops that carry its id."""
    keys = ("group", "group_tensors", "group_bytes", "group_buffer_bytes", "backend")
    per_rank = []
    for rank, events in main_traces.items():
        seen: dict[tuple[str, int], tuple[Any, ...]] = {}
        occurrence: Counter[str] = Counter()
        members: dict[int, list[dict[str, Any]]] = defaultdict(list)
        for unit in op_units(events):
            args = unit["op"]["args"]
            key = (args["tensor"], occurrence[args["tensor"]])
            occurrence[args["tensor"]] += 1
            seen[key] = tuple(args[k] for k in keys)
            members[args["group"]].append(args)
        for group, ops in members.items():
            what = f"rank {rank}, group {group}"
            assert len({tuple(a[k] for k in keys) for a in ops}) == 1, f"{what}: {ops}"
            first = ops[0]
            assert first["group_tensors"] == len(ops), f"{what}: {len(ops)} ops carry its id"
            assert first["group_bytes"] == sum(a["bytes"] for a in ops), what
            fused = first["group_tensors"] > 1
            assert first["group_buffer_bytes"] == (first["group_bytes"] if fused else 0), what
        per_rank.append(seen)
    assert per_rank[0].keys() == per_rank[1].keys()
    differing = {k: (per_rank[0][k], per_rank[1][k]) for k in per_rank[0] if per_rank[0][k] != per_rank[1][k]}  # fmt: skip
    assert not differing, differing
    grads = {v for (name, _), v in per_rank[0].items() if name in GRAD_NAMES}
    assert any(v[1] == len(GRAD_NAMES) for v in grads), f"the gradients were never fused: {grads}"


def test_escaped_name_round_trips(main_traces: dict[int, list[dict[str, Any]]]) -> None:
    """Quotes, backslash, newline and non-BMP unicode in a tensor name, read back intact."""
    for events in main_traces.values():
        lanes = [
            e for e in events if e["name"] == "thread_name" and e["args"]["name"] == WEIRD_NAME
        ]
        assert len(lanes) == 1
        ops = [e for e in slices(events) if e.get("args", {}).get("tensor") == WEIRD_NAME]
        assert len(ops) == 2 * 2  # two ops: NEGOTIATE_ALLREDUCE + ALLREDUCE each


def test_repeated_name_stays_in_its_lane(main_traces: dict[int, list[dict[str, Any]]]) -> None:
    """An op's slice ends no later than the user could submit the same name again.

    The worker runs 50 blocking allreduces of one name back to back: each is submitted
    after the previous one returned, so they cannot overlap and all belong in the name's
    own lane. If an op's recorded end is later than its real completion, the next op
    overlaps it and is pushed to a "shared lane" track, splitting the tensor's history.
    """
    problems = []
    for rank, events in main_traces.items():
        lane_name = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"}
        lane_of = {name: tid for tid, name in lane_name.items()}
        negs = [
            e
            for e in slices(events)
            if e["name"] == "NEGOTIATE_ALLREDUCE" and e["args"]["tensor"] == "repeat.x"
        ]
        assert len(negs) == REPEATS, len(negs)
        moved = [e for e in negs if e["tid"] != lane_of["repeat.x"]]
        if moved:
            problems.append(
                f"rank {rank}: {len(moved)} of {REPEATS} back-to-back ops of 'repeat.x' drawn "
                f"on other lanes ({sorted({lane_name[e['tid']] for e in moved})})"
            )
    assert not problems, "\n".join(problems)


def test_cycle_markers(main_traces: dict[int, list[dict[str, Any]]]) -> None:
    """HVDPROF_TIMELINE_MARK_CYCLES=1: one slice per cycle, same cycles and steps everywhere."""
    per_rank = {}
    for rank, events in main_traces.items():
        marks = cycles(events)
        assert marks and all(e["tid"] == act.LANE_CYCLES for e in marks)
        numbers = [cycle_number(e) for e in marks]
        assert numbers == list(range(numbers[0], numbers[-1] + 1)), f"rank {rank}: gaps"
        steps = [e["args"]["step"] for e in marks]
        assert steps == sorted(steps) and steps[-1] >= MAIN_STEPS - 1
        per_rank[rank] = {cycle_number(e): e["args"]["step"] for e in marks}
    assert per_rank[0] == per_rank[1]


def test_clock_skew_is_corrected(
    main_job: tuple[JobResult, Path], main_traces: dict[int, list[dict[str, Any]]]
) -> None:
    """Rank 1 runs 50 ms ahead (HVDPROF_CLOCK_SKEW_US); the manifest's offset cancels it."""
    _, out = main_job
    clocks = {
        r: json.loads((out / "init" / f"manifest.rank.{r}.json").read_text())["clock"]
        for r in (0, 1)
    }
    assert clocks[0]["offset_ns"] == 0 and clocks[0]["skew_us"] == 0
    assert clocks[1]["skew_us"] == SKEW_US and clocks[1]["samples"] > 0
    err_ns = clocks[1]["error_ns"]
    assert abs(clocks[1]["offset_ns"] + SKEW_US * 1000) <= err_ns + 3_000_000, clocks[1]

    spans = {r: collective_spans(events) for r, events in main_traces.items()}
    common = sorted(set(spans[0]) & set(spans[1]))
    assert len(common) >= 10, common
    tol = err_ns + 1_000_000
    raw_shift = -clocks[1]["offset_ns"]  # undoes the correction: rank 1's own clock
    corrected, uncorrected, causal, raw_causal = [], [], 0, 0
    for g in common:
        (s0, e0), (s1, e1) = spans[0][g], spans[1][g]
        # a collective cannot end on one rank before it started on the other
        causal += e0 >= s1 - tol and e1 >= s0 - tol
        raw_causal += e0 >= s1 + raw_shift - tol and e1 + raw_shift >= s0 - tol
        corrected.append(abs(s0 - s1))
        uncorrected.append(abs(s0 - (s1 + raw_shift)))
    assert causal == len(common), f"only {causal}/{len(common)} collectives overlap across ranks"
    assert statistics.median(corrected) <= 5_000_000, sorted(corrected)
    assert statistics.median(uncorrected) >= 40_000_000, sorted(uncorrected)
    assert raw_causal < len(common) / 2, "uncorrected, the skew should have shown"


def test_merge_with_torch_profiler(main_job: tuple[JobResult, Path], tmp_path: Path) -> None:
    """``hvdprof timeline merge`` with each rank's torch.profiler trace of the same run."""
    result, out = main_job
    assert result.returncode == 0, result.describe()
    kineto = [info(result, r, "kineto")[0] for r in (0, 1)]
    merged_path = tmp_path / "merged.json"
    proc = subprocess.run(
        [sys.executable, "-m", "hvdprof", "timeline", "merge", str(out / "init"),
         "-o", str(merged_path), "--kineto", *kineto],
        capture_output=True, text=True, timeout=60, env=child_env(), cwd=REPO,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 torch.profiler trace(s)" in proc.stdout and "skipped: 0" in proc.stdout
    with open(merged_path, encoding="utf-8") as f:
        merged = json.load(f)  # strict JSON
    events = merged["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    rank_pids = {pid for pid in names if pid < KINETO_PID_BASE}
    assert rank_pids == {0, 1}, names
    assert all(names[r].startswith(f"rank {r} (") for r in (0, 1)), names
    weird = [e for e in events if e.get("args", {}).get("tensor") == WEIRD_NAME]
    assert len(weird) == 2 * 2 * 2  # survived the merge's re-serialisation too

    for rank in (0, 1):
        lo_pid = KINETO_PID_BASE + rank * KINETO_PIDS_PER_RANK
        prof = [e for e in events if lo_pid <= e["pid"] < lo_pid + KINETO_PIDS_PER_RANK]
        assert any(n.startswith(act.profiler_process_name(rank)) for p, n in names.items() if lo_pid <= p), names  # fmt: skip
        prof_x = [e for e in prof if e["ph"] == "X"]
        assert len(prof_x) > 100, len(prof_x)
        submits = sorted(  # (an op held for its rank's wait negotiates later: its mark)
            (ns(e["args"]["ready_us"][str(rank)]), e["args"]["tensor"])
            for e in events
            if e["pid"] == rank
            and e["name"] == "NEGOTIATE_ALLREDUCE"
            and e["args"]["tensor"].startswith("allreduce.")
        )
        reduces = [
            span(e)
            for e in events
            if e["pid"] == rank
            and e["name"] in ("GLOO_ALLREDUCE", "TCP_ALLREDUCE", "SHM_ALLREDUCE", "MPI_ALLREDUCE")
        ]
        p_lo = min(ns(e["ts"]) for e in prof_x)
        p_hi = max(span(e)[1] for e in prof_x)
        assert any(s < p_hi and e > p_lo for s, e in reduces), "no allreduce during profiling"
        # in every profiled step, gradients are submitted while backward still runs
        steps = sorted((e for e in prof_x if e["name"].startswith("train_step_")), key=span)
        assert len(steps) == 3, [e["name"] for e in steps]
        for step in steps:
            s_lo, s_hi = span(step)
            backward = [
                span(e)
                for e in prof_x
                if e["name"].startswith("autograd::engine::evaluate_function")
                and s_lo <= ns(e["ts"]) <= s_hi
            ]
            assert backward, f"rank {rank} {step['name']}: no backward ops"
            b_lo, b_hi = min(b[0] for b in backward), max(b[1] for b in backward)
            inside = [t for t, _ in submits if b_lo < t < b_hi]
            assert inside, (
                f"rank {rank} {step['name']}: no allreduce submitted during backward "
                f"[{b_lo}, {b_hi}] ns; submissions near it: "
                f"{[t - b_lo for t, _ in submits if abs(t - b_lo) < 1e9]}"
            )
            # and backward kept going after the first gradient was handed over
            assert any(b[0] > inside[0] for b in backward), f"rank {rank} {step['name']}"


# --------------------------------------------------------------------------- windows


@pytest.mark.parametrize("which", ["2 ranks", "3 ranks"])
def test_start_stop_windows(
    which: str, main_job: tuple[JobResult, Path], windows_job: tuple[JobResult, Path]
) -> None:
    """start_timeline/stop_timeline mid-run: only the window's events, switched on every
    rank at the same cycle; the runtime works after stop; a restart records again."""
    num_proc = 2 if which == "2 ranks" else 3
    result, out = main_job if num_proc == 2 else windows_job
    sections = ["window_pre", "window_win1", "window_mid", "window_win2"]
    if num_proc == 3:
        sections.append("window_post")  # steps after the second stop
    for section in sections:
        result.assert_section(section, num_proc)
    result.assert_done(num_proc)
    win1 = check_window(out / "win1", "win1", result, num_proc, gz=False)
    win2 = check_window(out / "win2", "win2", result, num_proc, gz=True)
    for rank in range(num_proc):
        assert max(cycle_number(e) for e in cycles(win1[rank])) < min(
            cycle_number(e) for e in cycles(win2[rank])
        )
    if num_proc == 2:  # the recording from init stopped before the first window
        init = load_strict(out / "init" / "rank.0.json")
        assert not {m for m in markers(init) if not m.startswith("mark.main.")}
        assert max(map(cycle_number, cycles(init))) < min(map(cycle_number, cycles(win1[0])))
    else:
        assert not (out / "init").exists()


# ------------------------------------------------------------------ gzip, steps, sampling


def test_gzip_step_window_and_sampling(tmp_path: Path) -> None:
    """GZIP=1 writes .json.gz; STEPS=2-7 with SAMPLE_EVERY=2 keeps steps 2, 4 and 6 only."""
    directory = tmp_path / "steps"
    env = {
        "HVDPROF_TIMELINE": str(directory),
        "HVDPROF_TIMELINE_GZIP": "1",
        "HVDPROF_TIMELINE_STEPS": "2-7",
        "HVDPROF_TIMELINE_SAMPLE_EVERY": "2",
    }
    result = run_job(WORKER, 2, "steps", str(tmp_path), env=env, timeout=90)
    result.assert_section("steps", 2)
    result.assert_done(2)
    assert sorted(os.listdir(directory)) == sorted(
        [f"rank.{r}.json.gz" for r in (0, 1)] + [f"manifest.rank.{r}.json" for r in (0, 1)]
    )
    run = load_traces(str(directory))
    assert run.problems == [], run.problems
    for rank in (0, 1):
        path = directory / f"rank.{rank}.json.gz"
        events = load_strict(path)
        trace = load_trace(str(path))
        assert trace.complete and not trace.skipped and len(trace.events) == len(events)
        check_trace_shape(events, f"rank {rank}")
        assert markers(events) == {"mark.steps.2", "mark.steps.4", "mark.steps.6"}
        counts = tensor_names(events)
        assert all(counts[g] == 3 for g in GRAD_NAMES), counts
        assert not cycles(events), "cycle markers without HVDPROF_TIMELINE_MARK_CYCLES"
        # the whole configuration is in the file, for people (the typed manifest keeps
        # what readers use)
        manifest_path = run.ranks[rank].manifest_path
        assert manifest_path is not None
        config = json.loads(Path(manifest_path).read_text())["config"]
        assert config["timeline_steps"] == [2, 7] and config["timeline_sample_every"] == 2


# ------------------------------------------------------------------------------ SIGKILL


def test_sigkilled_rank_leaves_a_readable_trace(tmp_path: Path) -> None:
    directory = tmp_path / "kill"
    result = run_job(
        WORKER, 2, "kill", str(tmp_path), env={"HVDPROF_TIMELINE": str(directory)}, timeout=90
    )
    assert result.returncode != 0, result.describe()
    assert result.returncode == 128 + 9, result.describe()  # the killed rank's code
    assert "SIGKILL" in "\n".join(result.launcher), result.describe()
    killed = info(result, 1, "killing")
    assert killed, f"rank 1 never got to kill itself; {result.describe()}"

    # the killed rank's renderer outlives it to write what it was handed: wait for it
    renderer = json.loads((directory / "manifest.rank.1.json").read_text())["renderer_pid"]
    wait_gone(renderer)
    path = directory / "rank.1.json"
    raw = path.read_text(encoding="utf-8")
    with pytest.raises(json.JSONDecodeError):
        json.loads(raw)  # no closing bracket: the process had no chance to finish it
    trace = load_trace(str(path))
    assert not trace.complete
    # every complete line is an event; nothing complete is lost, nothing partial is taken
    whole = 0
    for line in raw.split("\n")[1:]:
        try:
            json.loads(line.rstrip(","))
            whole += 1
        except json.JSONDecodeError:
            pass
    assert len(trace.events) == whole > 20, (len(trace.events), whole)
    assert len(trace.skipped) <= 1, trace.skipped
    assert markers(trace.events) >= {"mark.kill.0"}, markers(trace.events)
    manifest = json.loads((directory / "manifest.rank.1.json").read_text())
    assert manifest["closed"] is False
    problems = " | ".join(load_traces(str(directory)).problems)
    assert "rank 1" in problems and "closing ']'" in problems, problems

    # cut in the middle of the last event: read up to the one before, and say so
    cut = raw.rstrip().rstrip(",")
    cut_path = tmp_path / "rank.1.cut.json"
    cut_path.write_text(cut[: len(cut) - 10], encoding="utf-8")
    short = load_trace(str(cut_path))
    assert len(short.events) == len(trace.events) - 1 and not short.complete
    assert len(short.skipped) == 1 and "incomplete event" in short.skipped[0].reason

    # the surviving rank was stopped by the launcher; its file is readable too
    survivor = load_trace(str(directory / "rank.0.json"))
    assert len(survivor.events) > 20 and len(survivor.skipped) <= 1


# ------------------------------------------------------------------- unwritable path


@pytest.mark.parametrize("where", ["under /proc", "parent is a file"])
def test_unwritable_timeline_path_is_a_clear_error(where: str, tmp_path: Path) -> None:
    if where == "under /proc":
        bad = "/proc/hvdprof"
        result = launch(2, "init", str(tmp_path), launcher_args=("--timeline", bad), timeout=60)
    else:
        blocker = tmp_path / "a_file"
        blocker.write_text("not a directory")
        bad = str(blocker / "timeline")
        result = launch(1, "init", str(tmp_path), env={"HVDPROF_TIMELINE": bad}, timeout=60)
    assert result.returncode != 0, result.describe()
    assert "INIT SUCCEEDED" not in result.output
    assert bad in result.output, result.describe()
    assert "timeline" in result.output.lower(), result.describe()
    assert "Traceback" not in result.output, (
        "an unwritable timeline path should be one clear error, not a traceback per rank:\n"
        + result.describe()
    )
