"""Unit tests of hvdprof.timeline: writer, sink, reader, merge, clock math, NVTX.

No runtime and no ranks: synthetic CycleRecords go straight into sinks, and the files are
checked for what Horovod's timeline got wrong (crash safety, escaping, nesting, readiness
marks on the cached path, bounded size and lanes, clock alignment).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import itertools
import json
import logging
import os
import pickle
import random
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hvdprof.common import activities as act
from hvdprof.common.records import CycleRecord, GroupRecord, OpBatch, OpRecord, TunableParams
from hvdprof.config import Config
from hvdprof.errors import HvdprofError
from hvdprof.timeline import (
    ClockCorrection,
    ClockOffset,
    PhaseRanges,
    TimelineSink,
    TimelineWriter,
    apply_skew,
    estimate_offset,
    load_trace,
    load_traces,
    merge_directory,
    skewed_clock,
    transport,
    wire,
)
from hvdprof.timeline.manifest import request_live
from hvdprof.timeline.render import (
    ITEM_COLUMNS,
    ITEM_COUNTER,
    ITEM_CYCLE,
    ITEM_INSTANT,
    CycleRenderer,
    cycle_columns,
)
from hvdprof.timeline.render_process import set_autogroup_nice
from hvdprof.trace.chrome_json import parse_trace_text

REPO = Path(__file__).resolve().parents[1]
SIZE = 3
WEIRD_NAME = 'grad/"quoted"\\back\nslash \u00fcnic\u00f8de \u2713 \U0001f680'
PARAMS = TunableParams(fusion_threshold_bytes=64 * 1024 * 1024, cycle_time_ms=1.0)

# --- synthetic records -------------------------------------------------------------------


def make_cycle(
    cycle: int,
    *,
    base_ns: int = 10_000_000_000,
    skew_ns: int = 0,
    cached: bool = False,
    step: int | None = None,
    params: TunableParams = PARAMS,
    params_changed: bool = False,
    weird: bool = True,
) -> CycleRecord:
    """One cycle with a fused group of two allreduces and an unfused one, 3 ranks ready.

    Times are laid out on a 10 ms grid per cycle; ``skew_ns`` shifts every local time, as
    HVDPROF_CLOCK_SKEW_US does.
    """
    t0 = base_ns + cycle * 10_000_000 + skew_ns
    fused = GroupRecord(
        group_id=cycle * 10,
        op="ALLREDUCE",
        backend="GLOO",
        num_tensors=2,
        nbytes=4096 + 64,
        buffer_bytes=8192,
        dtype="float32",
        t_pack_start=t0 + 500_000,
        t_pack_end=t0 + 600_000,
        t_collective_start=t0 + 650_000,
        t_collective_end=t0 + 900_000,
        t_unpack_start=t0 + 950_000,
        t_unpack_end=t0 + 1_000_000,
    )
    single = GroupRecord(
        group_id=cycle * 10 + 1,
        op="ALLREDUCE",
        backend="MPI",
        num_tensors=1,
        nbytes=400,
        buffer_bytes=0,
        dtype="float16",
        t_collective_start=t0 + 700_000,
        t_collective_end=t0 + 1_200_000,
    )
    ready = {0: t0 + 100_000, 1: t0 + 250_000, 2: t0 + 380_000}
    names = ["grad/layer1.weight", "grad/layer1.bias", WEIRD_NAME if weird else "grad/head"]
    ops = [
        OpRecord(names[0], "ALLREDUCE", "float32", (32, 32), 4096, t0, t0 + 400_000,
                 dict(ready), cached, fused.group_id, t_done=t0 + 1_050_000),
        OpRecord(names[1], "ALLREDUCE", "float32", (16,), 64, t0 + 50_000, t0 + 400_000,
                 dict(ready), cached, fused.group_id, t_done=t0 + 1_020_000),
        OpRecord(names[2], "ALLREDUCE", "float16", (10, 20), 400, t0 + 20_000, t0 + 400_000,
                 dict(ready), cached, single.group_id, t_done=t0 + 1_300_000),
    ]  # fmt: skip
    return CycleRecord(
        cycle=cycle,
        step=cycle if step is None else step,
        t_start=t0 + 300_000,
        t_negotiated=t0 + 400_000,
        t_end=t0 + 1_400_000,
        params=params,
        bytes_reduced=4096 + 64 + 400,
        ops=ops,
        groups=[fused, single],
        params_changed=params_changed,
    )


def config_for(tmp: Path, **changes: Any) -> Config:
    return Config(timeline_dir=str(tmp), **changes)


def record_run(tmp: Path, cycles: int = 6, rank: int = 0, **config: Any) -> TimelineSink:
    sink = TimelineSink(config_for(tmp, **config), rank, SIZE, "host-a")
    for c in range(cycles):
        sink.on_cycle(make_cycle(c, cached=bool(c % 2)))
    sink.close()
    return sink


# --- checks -------------------------------------------------------------------------------

EPS = 1e-6


def x_events(events: list[dict[str, Any]]) -> dict[tuple[int, int], list[dict[str, Any]]]:
    lanes: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        if e["ph"] == "X":
            lanes[(e["pid"], e["tid"])].append(e)
    return lanes


def assert_nested(events: list[dict[str, Any]]) -> None:
    """Within every lane, two slices are either disjoint or one contains the other."""
    for lane, spans in x_events(events).items():
        spans = sorted(spans, key=lambda e: (e["ts"], -e["dur"]))
        stack: list[dict[str, Any]] = []
        for e in spans:
            assert e["dur"] >= 0, e
            while stack and stack[-1]["ts"] + stack[-1]["dur"] <= e["ts"] + EPS:
                stack.pop()
            if stack:
                parent = stack[-1]
                assert e["ts"] + e["dur"] <= parent["ts"] + parent["dur"] + EPS, (
                    f"lane {lane}: {e['name']} overlaps {parent['name']} partially"
                )
            stack.append(e)


def op_phases(events: list[dict[str, Any]]) -> list[dict[str, dict[str, Any]]]:
    """For every ALLREDUCE slice, its negotiate slice and children by name."""
    out = []
    for spans in x_events(events).values():
        for op in (e for e in spans if e["name"] == "ALLREDUCE"):
            end = op["ts"] + op["dur"]
            phases = {"op": op}
            for e in spans:
                if e is op:
                    continue
                if (
                    e["name"].startswith(act.NEGOTIATE_PREFIX)
                    and abs(e["ts"] + e["dur"] - op["ts"]) < EPS
                ):
                    phases["negotiate"] = e
                elif op["ts"] - EPS <= e["ts"] and e["ts"] + e["dur"] <= end + EPS:
                    phases[e["name"]] = e
            out.append(phases)
    return out


# --- writer -------------------------------------------------------------------------------


def test_writer_strict_json_after_close(tmp_path: Path) -> None:
    path = tmp_path / "w.json"
    with TimelineWriter(str(path)) as w:
        for i in range(100):
            w.put_event({"name": f"e{i}", "ph": "i", "ts": i, "pid": 0, "tid": 0})
    text = path.read_text()
    assert text.startswith("[\n") and text.endswith("\n]\n")
    events = json.loads(text)
    assert [e["name"] for e in events[:-1]] == [f"e{i}" for i in range(100)]
    assert events[-1]["name"] == act.TRACE_END
    assert events[-1]["args"]["events_written"] == 100
    # one complete event per line, as the crash-safety argument needs
    assert all(line.endswith(",") for line in text.splitlines()[1:-2])


def test_writer_escapes_and_sanitises(tmp_path: Path) -> None:
    path = tmp_path / "w.json"
    with TimelineWriter(str(path)) as w:
        w.put_event({"name": WEIRD_NAME, "ph": "i", "ts": 1, "pid": 0, "tid": 0,
                     "args": {"nan": float("nan"), "obj": object(), "lone": "\ud800"}})  # fmt: skip
    events = json.loads(path.read_text())
    assert events[0]["name"] == WEIRD_NAME
    assert events[0]["args"]["nan"] == "nan"
    assert events[0]["args"]["lone"] == "\ud800"


def test_queue_overflow_drops_and_counts_without_blocking(tmp_path: Path) -> None:
    gate = threading.Event()

    def slow_render(item: Any) -> list[str]:
        gate.wait(10)
        return [json.dumps(item)]

    path = tmp_path / "w.json"
    w = TimelineWriter(str(path), queue_size=10, render=slow_render, flush_interval_s=0.01)
    t0 = time.perf_counter()
    accepted = [w.put_event({"name": f"e{i}", "ph": "i", "ts": i, "pid": 0}) for i in range(1000)]
    elapsed = time.perf_counter() - t0
    assert elapsed < 0.5, "put must never wait for the writer"
    n_ok = sum(accepted)
    assert 10 <= n_ok <= 11  # the queue, plus at most the item being rendered
    assert w.events_dropped == 1000 - n_ok
    gate.set()
    w.close()
    events = json.loads(path.read_text())
    assert len(events) == n_ok + 1
    assert events[-1]["args"]["events_dropped"] == 1000 - n_ok
    assert not w.put_event({"ph": "i"}), "a put after close is refused"
    assert w.events_dropped == 1000 - n_ok + 1


def test_oversized_item_fits_an_empty_queue_and_render_errors_are_counted(tmp_path: Path) -> None:
    def render(item: Any) -> list[str]:
        if item == "boom":
            raise RuntimeError("cannot render")
        return [json.dumps({"name": item, "ph": "i", "ts": 0, "pid": 0})]

    path = tmp_path / "w.json"
    w = TimelineWriter(str(path), queue_size=10, render=render, flush_interval_s=0.01)
    assert w.put("big", weight=50), "a cycle larger than the queue is taken when it is empty"
    w.close()
    w2 = TimelineWriter(str(tmp_path / "w2.json"), render=render)
    w2.put("boom", 3)
    w2.put("fine")
    w2.close()
    assert w2.events_dropped == 3 and w2.events_written == 1
    assert [e["name"] for e in json.loads((tmp_path / "w2.json").read_text())] == [
        "fine",
        act.TRACE_END,
    ]


def test_concurrent_put_and_close_is_safe(tmp_path: Path) -> None:
    path = tmp_path / "w.json"
    w = TimelineWriter(str(path), flush_interval_s=0.001)
    stop = threading.Event()
    sent = [0, 0]

    def producer() -> None:
        while not stop.is_set():
            ok = w.put_event({"name": "e", "ph": "i", "ts": 0, "pid": 0})
            sent[0 if ok else 1] += 1

    threads = [threading.Thread(target=producer) for _ in range(2)]
    for t in threads:
        t.start()
    time.sleep(0.05)
    w.close()
    w.close()  # idempotent
    stop.set()
    for t in threads:
        t.join()
    events = json.loads(path.read_text())
    assert len(events) - 1 == w.events_written
    assert w.events_written + w.events_dropped == sent[0] + sent[1]


def test_unwritable_path_names_the_path(tmp_path: Path) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    bad = blocker / "rank.0.json"
    with pytest.raises(HvdprofError, match=r"a_file/rank\.0\.json"):
        TimelineWriter(str(bad))
    with pytest.raises(HvdprofError, match="a_file/sub"):
        TimelineSink(config_for(blocker / "sub"), 0, 1, "h")


# --- sink: structure ---------------------------------------------------------------------


def test_sink_file_parses_nests_and_orders_phases(tmp_path: Path) -> None:
    sink = record_run(tmp_path, timeline_mark_cycles=True)
    with open(sink.path) as f:
        events = json.load(f)  # strict JSON after close
    assert events[-1]["name"] == act.TRACE_END
    assert_nested(events)

    meta = {(e["name"], e["tid"]): e["args"] for e in events if e["ph"] == "M"}
    assert meta[("process_name", 0)] == {"name": "rank 0 (host-a)"}
    assert meta[("process_sort_index", 0)] == {"sort_index": 0}
    lane_names = {e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert {"grad/layer1.weight", "grad/layer1.bias", WEIRD_NAME, "cycles"} <= lane_names

    phases = op_phases(events)
    assert len(phases) == 6 * 3
    for p in phases:
        neg = p["negotiate"]
        neg_end = neg["ts"] + neg["dur"]
        coll = p.get("GLOO_ALLREDUCE") or p["MPI_ALLREDUCE"]
        if "MEMCPY_IN_FUSION_BUFFER" in p:
            mem_in, mem_out = p["MEMCPY_IN_FUSION_BUFFER"], p["MEMCPY_OUT_FUSION_BUFFER"]
            assert neg_end <= mem_in["ts"] + EPS
            assert mem_in["ts"] + mem_in["dur"] <= coll["ts"] + EPS
            assert coll["ts"] + coll["dur"] <= mem_out["ts"] + EPS
        else:
            assert coll["name"] == "MPI_ALLREDUCE"
        assert neg_end <= coll["ts"] + EPS
        assert "QUEUE" in p
        args = p["op"]["args"]
        assert args["dtype"] in ("float32", "float16")
        assert args["group_tensors"] in (1, 2) and args["backend"] in ("GLOO", "MPI")
        assert {"shape", "bytes", "group", "group_buffer_bytes", "cached"} <= set(args)

    cycles = [e for e in events if e["name"].startswith(act.CYCLE_PREFIX)]
    assert [e["name"] for e in cycles] == [f"CYCLE {c}" for c in range(6)]
    assert {e["tid"] for e in cycles} == {act.LANE_CYCLES}
    counters = {e["name"] for e in events if e["ph"] == "C"}
    assert {
        act.COUNTER_FUSION_THRESHOLD,
        act.COUNTER_CYCLE_TIME,
        act.COUNTER_BYTES_REDUCED,
    } <= counters


def test_readiness_marks_on_cached_and_uncached_paths(tmp_path: Path) -> None:
    sink = record_run(tmp_path)
    events = load_trace(sink.path).events
    negotiates = [e for e in events if e["name"] == "NEGOTIATE_ALLREDUCE"]
    assert {e["args"]["cached"] for e in negotiates} == {True, False}
    by_lane = defaultdict(list)
    for e in events:
        if e["ph"] == "i" and e["name"].startswith(act.READY_PREFIX):
            by_lane[e["tid"]].append(e)
    for neg in negotiates:
        marks = [
            m
            for m in by_lane[neg["tid"]]
            if neg["ts"] - EPS <= m["ts"] <= neg["ts"] + neg["dur"] + EPS
        ]
        # the recording rank's own mark only, and the last rank named
        assert [m["name"] for m in marks] == [act.ready_name(sink.rank)], neg
        assert neg["args"]["last_ready_rank"] == 2
        assert set(neg["args"]["ready_us"]) == {str(sink.rank)}
        assert neg["args"]["last_ready_us"] >= neg["args"]["ready_us"][str(sink.rank)]


def test_escaped_tensor_names_round_trip(tmp_path: Path) -> None:
    sink = record_run(tmp_path, cycles=2)
    events = load_trace(sink.path).events
    assert any(e.get("args", {}).get("tensor") == WEIRD_NAME for e in events)
    assert any(e["name"] == "thread_name" and e["args"]["name"] == WEIRD_NAME for e in events)
    assert Path(sink.path).read_bytes().isascii()


def test_error_op_autotune_and_instants(tmp_path: Path) -> None:
    sink = TimelineSink(config_for(tmp_path), 1, SIZE, "host-b")
    sink.on_cycle(make_cycle(0))
    failed = make_cycle(1)
    failed.ops[0].error = 'shape mismatch: "x" [3] vs [4]'
    failed.ops[0].group_id = -1
    sink.on_cycle(failed)
    new = TunableParams(
        fusion_threshold_bytes=8 * 1024 * 1024, cycle_time_ms=2.5, cache_enabled=False
    )
    sink.on_cycle(make_cycle(2, params=new, params_changed=True))
    assert sink.add_autotune_sample(new, 123.5, sample=7)
    assert sink.add_instant("custom", {"k": [1, 2]})
    sink.close()
    events = json.loads(Path(sink.path).read_text())
    assert_nested(events)
    errs = [e for e in events if e["name"] == "ALLREDUCE" and "error" in e.get("args", {})]
    assert errs and errs[0]["args"]["error"] == 'shape mismatch: "x" [3] vs [4]'
    tune = [e for e in events if e["name"] == act.AUTOTUNE_PARAMS]
    assert len(tune) == 1 and tune[0]["args"]["cycle_time_ms"] == 2.5 and tune[0]["s"] == "p"
    sample = next(e for e in events if e["name"] == act.AUTOTUNE_SAMPLE)
    assert sample["args"]["score"] == 123.5 and sample["tid"] == act.LANE_AUTOTUNE
    assert any(e["name"] == act.COUNTER_AUTOTUNE_SCORE for e in events)
    assert any(e["name"] == "custom" and e["args"] == {"k": [1, 2]} for e in events)
    threshold = [e["args"]["value"] for e in events if e["name"] == act.COUNTER_FUSION_THRESHOLD]
    assert threshold == [64, 8]


def test_step_window_and_sampling(tmp_path: Path) -> None:
    sink = TimelineSink(
        config_for(tmp_path, timeline_steps=(2, 7), timeline_sample_every=2, timeline_mark_cycles=True),
        0, SIZE, "h",
    )  # fmt: skip
    for c in range(12):
        sink.on_cycle(make_cycle(c, step=c))
    sink.close()
    events = load_trace(sink.path).events
    steps = sorted(e["args"]["step"] for e in events if e["name"].startswith(act.CYCLE_PREFIX))
    assert steps == [2, 4, 6]
    assert len([e for e in events if e["name"] == "ALLREDUCE"]) == 9


def test_idle_cycles_write_nothing(tmp_path: Path) -> None:
    sink = TimelineSink(config_for(tmp_path), 0, SIZE, "h")
    sink.on_cycle(make_cycle(0))
    idle = [CycleRecord(c, c, c, c, c, PARAMS, bytes_reduced=0) for c in range(1, 1000)]
    for record in idle:
        sink.on_cycle(record)
    sink.close()
    events = load_trace(sink.path).events
    bytes_counter = [e["args"]["value"] for e in events if e["name"] == act.COUNTER_BYTES_REDUCED]
    assert bytes_counter == [4560, 0]  # one drop to zero, not one event per idle cycle


def test_lanes_are_bounded_and_still_nest() -> None:
    renderer = CycleRenderer(0, "h", max_named_lanes=2, max_shared_lanes=3)
    lines: list[str] = []
    for c in range(50):
        record = make_cycle(c // 5, weird=False)  # five cycles share one time slot: overlap
        for i, op in enumerate(record.ops):
            op.name = f"t{c}_{i}"
        lines += renderer.render_cycle(record, 0)
    events = json.loads("[" + ",\n".join(lines) + "]")  # a text may hold several events
    tids = {e["tid"] for e in events if e["ph"] == "X"}
    assert len(tids) <= 2 + 3
    assert renderer.lanes_clamped > 0
    assert_nested(events)
    # a shared lane carries many tensors: each op's args name its own tensor (an op's
    # slice follows its negotiation in the file)
    pairs = [
        (a["args"]["tensor"], b["args"]["tensor"])
        for a, b in itertools.pairwise(events)
        if a["name"] == "NEGOTIATE_ALLREDUCE"
    ]
    assert len(pairs) == 150
    assert all(a == b for a, b in pairs), [p for p in pairs if p[0] != p[1]][:3]


# --- manifest and run -----------------------------------------------------------------------


def test_manifest_written_atomically_and_updated(tmp_path: Path) -> None:
    sink = TimelineSink(config_for(tmp_path), 2, SIZE, "host-c", run_id="run-1")
    early = json.loads(Path(sink.manifest_path).read_text())
    assert early["closed"] is False and early["rank"] == 2 and early["size"] == SIZE
    assert early["hostname"] == "host-c" and early["run_id"] == "run-1"
    assert {"start_unix_ns", "start_local_ns", "clock", "config"} <= set(early)
    sink.clock.update(ClockOffset(offset_ns=-5_000, error_ns=40, rtt_ns=80, samples=8))
    sink.on_cycle(make_cycle(0))
    sink.close()
    final = json.loads(Path(sink.manifest_path).read_text())
    assert final["closed"] is True
    assert final["events_written"] == len(load_trace(sink.path).events) - 1
    assert final["events_dropped"] == 0
    assert final["clock"]["offset_ns"] == -5_000 and final["clock"]["error_ns"] == 40
    assert final["config"]["timeline_dir"] == str(tmp_path)
    assert not [p for p in os.listdir(tmp_path) if ".tmp." in p]


def test_load_traces_reports_problems(tmp_path: Path) -> None:
    record_run(tmp_path, rank=0, cycles=2)
    record_run(tmp_path, rank=1, cycles=2)
    os.remove(tmp_path / "manifest.rank.1.json")
    run = load_traces(str(tmp_path))
    assert sorted(run.ranks) == [0, 1]
    assert run.manifests[0] is not None and run.manifests[1] is None
    assert any("rank 1: no manifest" in p for p in run.problems)
    assert any("3 ranks but 2 timelines" in p for p in run.problems)


# --- reader: truncation and gzip --------------------------------------------------------


def _expected_after_cut(text: str, cut: int) -> tuple[int, bool]:
    """(events fully present, whether a partial event remains) for our one-per-line format."""
    head = text[:cut]
    full_lines = head.split("\n")
    partial = full_lines.pop()
    complete_events = sum(1 for line in full_lines if line.startswith("{"))
    partial = partial.rstrip(",")
    if partial.startswith("{"):
        try:
            json.loads(partial)
            return complete_events + 1, False
        except json.JSONDecodeError:
            return complete_events, True
    return complete_events, False


def test_truncated_file_loads_at_every_cut_point(tmp_path: Path) -> None:
    sink = record_run(tmp_path, cycles=3)
    text = Path(sink.path).read_text()
    full = load_trace(sink.path)
    assert full.complete and not full.skipped
    cuts = sorted(
        {0, 1, 2, 3, len(text) - 1, len(text) - 2, len(text) - 3, *range(0, len(text), 97)}
    )
    cut_file = tmp_path / "cut.json"
    for cut in cuts:
        cut_file.write_text(text[:cut])
        trace = load_trace(str(cut_file))
        n_events, partial = _expected_after_cut(text, cut)
        assert len(trace.events) == n_events, cut
        assert trace.events == full.events[:n_events]
        expected_skips = 1 if partial or cut == 0 else 0  # an empty file is reported too
        assert len(trace.skipped) == expected_skips, (cut, trace.skipped)
        if partial:
            assert "incomplete event" in trace.skipped[0].reason and trace.skipped[0].line > 0
        assert trace.complete is (cut >= len(text) - 1)
    only_bracket = parse_trace_text("[")
    assert only_bracket.events == [] and not only_bracket.complete
    assert parse_trace_text("").skipped[0].reason.startswith("empty file")


def test_reader_reports_corruption_in_the_middle() -> None:
    text = '[\n{"ph":"i","name":"a"},\n{"ph":"i","na\n{"ph":"i","name":"c"},\n42,\n'
    trace = parse_trace_text(text)
    assert [e["name"] for e in trace.events] == ["a", "c"]
    reasons = [s.reason for s in trace.skipped]
    assert any("invalid JSON" in r for r in reasons) and any(
        "not a JSON object" in r for r in reasons
    )
    obj = parse_trace_text(
        '{"baseTimeNanoseconds": 5, "traceEvents": [{"ph":"X","ts":1},{"ph":"X","t'
    )
    assert len(obj.events) == 1 and obj.skipped and not obj.complete


def test_gzip_round_trip_and_truncation(tmp_path: Path) -> None:
    plain = record_run(tmp_path / "plain", cycles=4)
    zipped = record_run(tmp_path / "gz", cycles=4, timeline_gzip=True)
    assert zipped.path.endswith("rank.0.json.gz")
    with gzip.open(zipped.path, "rt") as f:
        strict = json.load(f)
    full = load_trace(zipped.path)
    assert full.complete and not full.skipped and full.events == strict

    def strip_clock(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [e for e in events if e["name"] != act.TRACE_END]

    assert strip_clock(full.events) == strip_clock(load_trace(plain.path).events)
    raw = Path(zipped.path).read_bytes()
    cut_file = tmp_path / "cut.json.gz"
    for cut in [0, 5, 11, 20, *range(30, len(raw), max(1, len(raw) // 40)), len(raw) - 4]:
        cut_file.write_bytes(raw[:cut])
        trace = load_trace(str(cut_file))  # never raises
        assert trace.events == full.events[: len(trace.events)]
    assert any("truncated" in n for n in trace.notes)


# --- clock ------------------------------------------------------------------------------------


def test_estimate_offset_recovers_a_known_offset() -> None:
    rng = random.Random(7)
    true_offset = 123_456_789
    samples = []
    for k in range(50):
        t_send = 1_000_000 * k
        out_delay, back_delay = rng.randint(5_000, 500_000), rng.randint(5_000, 500_000)
        samples.append((t_send, t_send + out_delay + true_offset, t_send + out_delay + back_delay))
    est = estimate_offset(samples)
    best = min(samples, key=lambda s: s[2] - s[0])
    assert est.rtt_ns == best[2] - best[0] and est.samples == 50
    assert est.error_ns == (est.rtt_ns + 1) // 2
    assert abs(est.offset_ns - true_offset) <= est.error_ns
    symmetric = estimate_offset([(0, 1_000 + 500, 1_000)])
    assert symmetric.offset_ns == 1_000 and symmetric.error_ns == 500
    with pytest.raises(ValueError):
        estimate_offset([(10, 0, 5)])


def test_skew_helpers() -> None:
    assert skewed_clock(0.0) is time.perf_counter_ns
    clock = skewed_clock(2500.0, base=lambda: 1_000)
    assert clock() == 1_000 + 2_500_000 == apply_skew(1_000, 2500.0)
    corr = ClockCorrection(origin_ns=100, now_ns=clock)
    corr.update(ClockOffset(-2_500_000, 10))
    assert corr.to_timeline_ns(clock()) == 1_000 - 100
    assert corr.version == 1 and len(corr.history()) == 2


def _ping_pong(local: Any, remote: Any, n: int = 20) -> list[tuple[int, int, int]]:
    samples = []
    for _ in range(n):
        t0 = local()
        tr = remote()
        samples.append((t0, tr, local()))
    return samples


def test_skewed_rank_is_corrected_on_the_timeline(tmp_path: Path) -> None:
    skew_us = 250_000.0  # 0.25 s: far more than any real gap between the two "ranks"
    skew_ns = round(skew_us * 1000)
    sinks = []
    for rank, skew in ((0, 0.0), (1, skew_us)):
        clock = ClockCorrection(now_ns=skewed_clock(skew))
        if rank:
            clock.update(estimate_offset(_ping_pong(clock.now_ns, time.perf_counter_ns)))
        sink = TimelineSink(config_for(tmp_path, clock_skew_us=skew), rank, 2, "h", clock)
        sink.on_cycle(make_cycle(0, skew_ns=skew_ns if rank else 0))
        sink.close()
        sinks.append(sink)
    error_us = sinks[1].clock.error_ns / 1000
    negotiate = {
        rank: [e["ts"] for e in load_trace(s.path).events if e["name"] == "NEGOTIATE_ALLREDUCE"]
        for rank, s in enumerate(sinks)
    }
    for t0, t1 in zip(negotiate[0], negotiate[1], strict=True):
        assert abs(t0 - t1) <= error_us + 1.0, "skew must be removed to within the error bound"


# --- crash safety -----------------------------------------------------------------------------

_KILL_SCRIPT = textwrap.dedent(
    """
    import sys, time
    from hvdprof.timeline.writer import TimelineWriter
    w = TimelineWriter(sys.argv[1], flush_interval_s=0.005, queue_size=100000)
    i = 0
    while True:
        w.put_event({"name": "e%d" % i, "ph": "X", "ts": i, "dur": 1, "pid": 0, "tid": 0,
                     "args": {"pad": "x" * 64}})
        i += 1
        if i % 50 == 0:
            time.sleep(0.0005)
    """
)


@pytest.mark.parametrize("suffix", [".json", ".json.gz"])
def test_sigkilled_writer_leaves_a_readable_file(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / ("killed" + suffix)
    proc = subprocess.Popen([sys.executable, "-c", _KILL_SCRIPT, str(path)], cwd=REPO)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if path.exists() and path.stat().st_size > 20_000:
                break
            time.sleep(0.02)
        else:
            pytest.fail("the writer subprocess produced no data")
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    trace = load_trace(str(path))
    assert len(trace.events) >= 1 and not trace.complete
    assert [e["name"] for e in trace.events] == [f"e{i}" for i in range(len(trace.events))]
    if suffix == ".json":
        # Batches are whole lines written by one os.write, but Linux may cut a multi-page
        # write at a page boundary when SIGKILL arrives: at most the last event is torn,
        # and the reader says so instead of failing or dropping silently.
        text = path.read_text()
        complete_part = text[: text.rfind(",\n") + 2]
        assert complete_part.startswith("[\n") and complete_part.endswith(",\n")
        assert len(trace.skipped) <= 1
        if not text.endswith(",\n"):
            assert len(trace.skipped) == 1


_CTRL_C_SCRIPT = textwrap.dedent(
    """
    import sys
    from hvdprof.config import Config
    from hvdprof.timeline import TimelineSink
    from hvdprof.common.records import CycleRecord, TunableParams
    sink = TimelineSink(Config(timeline_dir=sys.argv[1]), 0, 1, "h")
    p = TunableParams(1 << 20, 1.0)
    for c in range(5):
        sink.on_cycle(CycleRecord(c, c, c * 1000, c * 1000, c * 1000 + 500, p, bytes_reduced=c))
    raise KeyboardInterrupt  # as if the user pressed Ctrl+C; nobody calls close()
    """
)


def test_ctrl_c_without_close_still_leaves_strict_json(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", _CTRL_C_SCRIPT, str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        timeout=60,
    )
    assert b"KeyboardInterrupt" in proc.stderr
    events = json.loads((tmp_path / "rank.0.json").read_text())
    assert events[-1]["name"] == act.TRACE_END
    manifest = json.loads((tmp_path / "manifest.rank.0.json").read_text())
    assert manifest["closed"] is True


# --- merge ---------------------------------------------------------------------------------


def _profile_to(path: Path) -> tuple[int, int]:
    """Run a tiny model under torch.profiler on CPU; return perf_counter_ns around it."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    model = torch.nn.Linear(32, 32)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t_a = time.perf_counter_ns()
        for _ in range(3):
            model(torch.randn(4, 32)).sum().backward()
        t_b = time.perf_counter_ns()
    prof.export_chrome_trace(str(path))
    return t_a, t_b


def test_merge_two_ranks_and_a_real_kineto_trace(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    skew_us = 40_000.0
    clocks = {0: ClockCorrection(), 1: ClockCorrection(now_ns=skewed_clock(skew_us))}
    clocks[1].update(estimate_offset(_ping_pong(clocks[1].now_ns, time.perf_counter_ns)))
    sinks = {
        r: TimelineSink(
            config_for(run_dir, clock_skew_us=skew_us if r else 0.0), r, 2, f"host{r}", clocks[r]
        )
        for r in (0, 1)
    }
    kineto0 = tmp_path / "trace_rank0.json"
    t_a, t_b = _profile_to(kineto0)
    kineto1 = tmp_path / "worker.rank1.pt.trace.json"
    kineto1.write_bytes(kineto0.read_bytes())  # same process: rank 1's view of the same wall time
    for r, sink in sinks.items():
        # a cycle spanning the profiled region, stamped with each rank's own (skewed) clock
        record = make_cycle(0, base_ns=0, weird=False)
        skew = round(skew_us * 1000) if r else 0
        record.t_start, record.t_end = t_a + skew, t_b + skew
        sink.on_cycle(record)
        sink.close()
    raw = json.loads(kineto0.read_text())
    assert "baseTimeNanoseconds" in raw, "torch.profiler's export format changed"

    out = tmp_path / "merged.json"
    result = merge_directory(str(run_dir), str(out), [str(kineto0), str(kineto1)])
    with open(out) as f:
        merged = json.load(f)
    events = merged["traceEvents"]
    assert result.ranks == [0, 1]
    assert result.kineto == {str(kineto0): (0, result.kineto[str(kineto0)][1]),
                             str(kineto1): (1, result.kineto[str(kineto1)][1])}  # fmt: skip
    assert result.events == len(events)
    text = str(result)
    assert "2 rank timeline(s)" in text and "torch.profiler" in text and "skipped: 0" in text

    names = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    assert names[0] == "rank 0 (host0)" and names[1] == "rank 1 (host1)"
    kineto_pids = {pid for pid, name in names.items() if name.startswith("rank 0 torch.profiler")}
    assert kineto_pids and all(pid >= 1_000_000 for pid in kineto_pids)

    tol_us = 1_000.0 + result.max_clock_error_us
    lo, hi = t_a / 1000 - tol_us, t_b / 1000 + tol_us
    for rank in (0, 1):
        pids = {
            pid for pid, name in names.items() if name.startswith(f"rank {rank} torch.profiler")
        }
        ops = [e for e in events if e["pid"] in pids and e.get("cat") == "cpu_op"]
        assert ops, f"no torch.profiler ops for rank {rank}"
        # the model's forward/backward ran between t_a and t_b: mapped, they must fall there
        inside = [e for e in ops if lo <= e["ts"] and e["ts"] + e.get("dur", 0) <= hi]
        assert inside == ops, (rank, lo, hi, sorted(e["ts"] for e in ops)[:3])
    cycles = [e for e in events if e["name"] == act.COUNTER_CYCLE_DURATION]
    assert all(abs(e["ts"] - t_a / 1000) <= tol_us for e in cycles)


def test_merge_reports_unmatched_kineto_and_truncated_rank(tmp_path: Path) -> None:
    record_run(tmp_path / "run", rank=0, cycles=2)
    sink1 = record_run(tmp_path / "run", rank=1, cycles=2)
    text = Path(sink1.path).read_text()
    Path(sink1.path).write_text(text[: len(text) // 2])
    stray = tmp_path / "profile.json"
    stray.write_text(
        json.dumps(
            {"traceEvents": [{"ph": "X", "ts": 1, "dur": 1, "pid": 9, "tid": 9, "name": "k"}]}
        )
    )
    out = tmp_path / "merged.json.gz"
    result = merge_directory(str(tmp_path / "run"), str(out), [str(stray)])
    with gzip.open(out, "rt") as f:
        merged = json.load(f)
    assert result.events == len(merged["traceEvents"])
    assert any("cannot tell its rank" in p for p in result.problems)
    assert len(result.skipped) == 1 and "incomplete event" in result.skipped[0][2]
    explicit = merge_directory(str(tmp_path / "run"), str(tmp_path / "m2.json"), [f"1={stray}"])
    assert explicit.kineto[str(stray)][0] == 1


# --- NVTX -----------------------------------------------------------------------------------


def test_nvtx_disabled_is_a_no_op() -> None:
    ranges = PhaseRanges(disabled=True)
    assert not ranges.active and "off" in ranges.backend
    ranges.push(act.NVTX_NEGOTIATE)
    ranges.pop()
    with ranges.range(act.NVTX_CYCLE):
        pass
    assert PhaseRanges.from_config(Config(disable_nvtx=True)).backend == ranges.backend


def test_nvtx_package_push_pop_without_cuda() -> None:
    pytest.importorskip("nvtx")
    ranges = PhaseRanges()
    assert "nvtx" in ranges.backend
    for _ in range(3):
        ranges.push(act.NVTX_COLLECTIVE)
        ranges.pop()


def test_nvtx_active_path_caches_attributes() -> None:
    calls: list[Any] = []

    class FakeDomain:
        def get_event_attributes(self, message: str) -> str:
            calls.append(("attrs", message))
            return f"attrs:{message}"

        def push_range(self, attributes: str) -> None:
            calls.append(("push", attributes))

        def pop_range(self) -> None:
            calls.append(("pop",))

    ranges = PhaseRanges(domain=FakeDomain())
    assert ranges.active
    for _ in range(2):
        with ranges.range(act.NVTX_NEGOTIATE):
            pass
    assert calls == [("attrs", "NEGOTIATE"), ("push", "attrs:NEGOTIATE"), ("pop",),
                     ("push", "attrs:NEGOTIATE"), ("pop",)]  # fmt: skip


# --- renderer process and its transport ---------------------------------------------------


def many_ops_cycle(cycle: int, n: int) -> CycleRecord:
    """``make_cycle`` with ``n`` ops (several frames), varied shapes, readiness and an error."""
    record = make_cycle(cycle)
    base = record.ops[0]
    ops = []
    for i in range(n):
        ready = {r: base.t_submit + 1000 * r + i for r in reversed(range(SIZE))}
        name = f"grad/{i}" if i % 7 else f"{WEIRD_NAME}{i}"
        ops.append(dataclasses.replace(base, name=name, shape=(i % 5 + 1, 3),
                                       ready_times=ready, t_done=base.t_done + i))  # fmt: skip
    if n > 3:
        ops[3].error, ops[3].group_id = 'boom "x"', -1
    record.ops = ops
    return record


def decode_stream(data: bytes, tmp: Path, chunk: int = 997) -> tuple[list[Any], Any, Any]:
    path = tmp / "stream.bin"
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    try:
        reader = transport.FrameReader(fd, chunk=chunk)  # small reads: frames arrive in pieces
        decoder = transport.Decoder()
        items = []
        while True:
            payload = reader.next_frame()
            if payload is None:
                if not reader.fill():
                    break
                continue
            items += decoder.decode_all(pickle.loads(payload))
    finally:
        os.close(fd)
    return items, reader, decoder


def frames_of(payloads: list[bytes]) -> bytes:
    return b"".join(transport.FRAME_HEADER.pack(len(p)) + p for p in payloads)


def plain(record: CycleRecord) -> tuple[Any, ...]:
    """A cycle in the renderer's plain form (what the child decodes), to compare."""
    return cycle_columns(record)


def test_transport_round_trips_cycle_records(tmp_path: Path) -> None:
    k = transport.OPS_PER_FRAME
    records = [many_ops_cycle(c, n) for c, n in enumerate((0, 3, k, 2 * k + 5))]
    records[0].groups = []
    payloads = [p for r in records for p in transport.encode_item((ITEM_CYCLE, r, 77), 9)]
    assert len(payloads) == 1 + 1 + 1 + 3  # the big cycle takes three frames
    items, reader, decoder = decode_stream(frames_of(payloads), tmp_path)
    assert [item[1:4] for item, _ in items] == [plain(r) for r in records]  # field by field
    assert all(item[0] == ITEM_COLUMNS and item[4] == 77 and w == 9 for item, w in items)
    assert reader.leftover == 0 and decoder.lost_items == 0

    # a stream cut inside a frame (the rank died mid-write): the complete frames survive
    data = frames_of(payloads)
    items, reader, _ = decode_stream(data[: len(data) - 10], tmp_path)
    assert [item[1:4] for item, _ in items] == [plain(r) for r in records[:3]]
    assert reader.leftover > 0

    # a cycle whose first frames went out but not its last is dropped, not merged
    stale = list(transport.encode_item((ITEM_CYCLE, records[3], 0), 9))[:-1]
    items, _, decoder = decode_stream(frames_of(stale + payloads[1:2]), tmp_path)
    assert [item[1:4] for item, _ in items] == [plain(records[1])] and decoder.lost_items == 0
    odd = pickle.loads(payloads[-1])
    bad = pickle.dumps((odd[0], odd[1], odd[2], odd[3], odd[4] + 1, *odd[5:]))
    items, _, decoder = decode_stream(frames_of([*payloads[-3:-1], bad]), tmp_path)
    assert items == [] and decoder.lost_items == 1 and decoder.lost_events == 9


def test_small_cycles_travel_in_one_batch_and_a_damaged_one_is_lost_alone(
    tmp_path: Path,
) -> None:
    records = [many_ops_cycle(c, n) for c, n in enumerate((1, 3, 6))]
    counter = (ITEM_COUNTER, "waited", 5_000, 7, {"value": 1.5})
    messages = [transport.small_message((ITEM_CYCLE, r, 77), 9) for r in records]
    messages.append(transport.small_message(counter, 1))
    batch = pickle.dumps((transport.MSG_BATCH, messages))
    items, _, decoder = decode_stream(frames_of([batch]), tmp_path)
    assert [item[1:4] for item, _ in items[:3]] == [plain(r) for r in records]
    assert items[3] == (counter, 1) and decoder.lost_items == 0
    # one bad cycle in the batch (its op count disagrees with its columns): only it is lost
    bad = list(messages[1])
    bad[4] += 1
    damaged = pickle.dumps((transport.MSG_BATCH, [messages[0], tuple(bad), messages[2]]))
    items, _, decoder = decode_stream(frames_of([damaged]), tmp_path)
    assert [item[1:4] for item, _ in items] == [plain(records[0]), plain(records[2])]
    assert decoder.lost_items == 1 and decoder.lost_events == 9
    # a message that is not one at all: lost alone, counted as one event
    odd = pickle.dumps((transport.MSG_BATCH, [messages[0], ("nonsense",), messages[2]]))
    items, _, decoder = decode_stream(frames_of([odd]), tmp_path)
    assert len(items) == 2 and decoder.lost_items == 1 and decoder.lost_events == 1
    # a cycle too large for one frame is not batched
    big = many_ops_cycle(9, transport.OPS_PER_FRAME + 1)
    assert transport.small_message((ITEM_CYCLE, big, 0), 1) is None


def test_a_cycle_every_rank_showed_at_once_travels_without_its_matrix(tmp_path: Path) -> None:
    """The common cycle leaves the readiness matrix to the renderer (``ready_fill``); its
    ops shared one group and one completion time, which travel as one int each. What the
    renderer gets is what the full matrix and the per-op columns would have given."""
    n, t_cycle, me = 5, 40_000, 1
    t_submit = [41_000 + 10 * i for i in range(n)]
    common = dict(names=[f"g/{i}" for i in range(n)], kinds=[("ALLREDUCE", "float32", (3,), 12)] * n,
                  t_submit=t_submit, t_negotiated=[45_000] * n, cached=b"\x01" * n,
                  group_ids=[2] * n, t_done=[50_000] * n, errors={})  # fmt: skip
    filled = OpBatch(ready=None, ready_fill=(t_cycle, me, SIZE), **common)
    matrix = np.full((n, SIZE), t_cycle, dtype=np.int64)
    matrix[:, me] = t_submit
    explicit = OpBatch(ready=matrix, **common)
    np.testing.assert_array_equal(filled.ready_rows(), matrix)
    cycles = [
        dataclasses.replace(make_cycle(c), ops=ops) for c, ops in enumerate((filled, explicit))
    ]
    wire = [transport.small_message((ITEM_CYCLE, r, 77), 9) for r in cycles]
    columns = [msg[3] for msg in wire]
    assert columns[0][4] == (t_cycle, me) and type(columns[1][4]) is bytes
    assert columns[0][7] == 2 and columns[0][8] == 50_000  # shared: one int each
    batch = pickle.dumps((transport.MSG_BATCH, wire))
    items, _, decoder = decode_stream(frames_of([batch]), tmp_path)
    assert decoder.lost_items == 0
    assert items[0][0][3] == items[1][0][3] == plain(cycles[1])[2]
    assert [r.ready_times for r in filled.to_records()] == [r.ready_times for r in explicit]


def test_portable_items_carry_no_objects_and_render_the_same() -> None:
    class Thing:
        def __str__(self) -> str:
            return "thing"

    args = {"obj": Thing(), "nan": float("nan"), 3: (1, 2), "flag": True, "nested": {"t": Thing()}}
    item = (ITEM_INSTANT, "mark", 5_000, 7, args, act.LANE_RUNTIME, "p")
    portable = transport.portable_item(item)
    data = pickle.dumps(portable)
    assert b"Thing" not in data and b"test_timeline_unit" not in data
    ours = CycleRenderer(0, "h", yield_gil=False).render(pickle.loads(data))
    assert ours == CycleRenderer(0, "h").render(item)
    assert json.loads(ours[0])["args"] == {"obj": "thing", "nan": "nan", "3": [1, 2],
                                           "flag": True, "nested": {"t": "thing"}}  # fmt: skip


def test_renderer_process_writes_what_the_thread_writes(tmp_path: Path) -> None:
    texts, manifests = {}, {}
    for use_process in (True, False):
        sink = TimelineSink(
            config_for(tmp_path / str(use_process), timeline_mark_cycles=True),
            1, SIZE, "host-a", use_process=use_process,
        )  # fmt: skip
        assert sink.renders_in_process is not use_process
        for c in range(4):
            sink.on_cycle(make_cycle(c, cached=bool(c % 2)))
        sink.on_cycle(many_ops_cycle(4, 600))
        sink.add_instant("custom", {"k": [1, 2]}, t_ns=123_000)
        sink.add_counter("ctr", {"a": 1.5}, t_ns=456_000)
        sink.close()
        texts[use_process] = Path(sink.path).read_text()
        manifests[use_process] = json.loads(Path(sink.manifest_path).read_text())
        if use_process:
            assert sink.writer.returncode == 0, "close() waits for the child and reaps it"
            assert sink.writer.sent_events > 0
            assert not os.path.exists(sink.writer.spool), "the spool goes once rendered"
    assert texts[True] == texts[False], "byte-identical output"
    events = json.loads(texts[True])
    for key in ("events_written", "events_dropped", "items_dropped", "lanes_clamped", "closed"):
        assert manifests[True][key] == manifests[False][key], key
    assert manifests[True]["events_written"] == len(events) - 1
    assert manifests[True]["closed"] is True and manifests[True]["os_pid"] == os.getpid()


def test_renderer_process_gzip(tmp_path: Path) -> None:
    sink = record_run(tmp_path, cycles=3, timeline_gzip=True)
    assert not sink.renders_in_process
    with gzip.open(sink.path, "rt") as f:
        events = json.load(f)
    assert len(events) - 1 == sink.events_written > 0


def test_a_stopped_renderer_costs_the_rank_nothing_and_loses_nothing(tmp_path: Path) -> None:
    # A stopped renderer reads nothing: the rank appends to its spool all the same, never
    # waits and drops nothing; continued, the renderer writes every cycle, in order.
    sink = TimelineSink(config_for(tmp_path), 0, SIZE, "h")
    os.kill(sink.writer.pid, signal.SIGSTOP)
    cycles = 20_000  # 540,000 events: more than any in-memory queue held
    try:
        record = make_cycle(0, weird=False)
        for c in range(cycles):
            assert sink.on_cycle(dataclasses.replace(record, cycle=c, bytes_reduced=c)) is None
        assert sink.events_dropped == 0
        assert os.path.getsize(sink.writer.spool) == sink.writer.spool_bytes > 0
    finally:
        os.kill(sink.writer.pid, signal.SIGCONT)
    sink.close()
    events = json.loads(Path(sink.path).read_text())
    manifest = json.loads(Path(sink.manifest_path).read_text())
    kept = [e["args"]["value"] for e in events if e["name"] == act.COUNTER_BYTES_REDUCED]
    assert kept == list(range(cycles))
    assert manifest["events_dropped"] == 0 and manifest["closed"] is True
    assert manifest["events_written"] == sink.events_written == len(events) - 1
    assert not os.path.exists(sink.writer.spool)


def _switches(native_id: int) -> int:
    """How many times a thread of this process gave up its core (each wake-up is one)."""
    status = Path(f"/proc/self/task/{native_id}/status").read_text()
    return int(re.search(r"voluntary_ctxt_switches:\s+(\d+)", status).group(1))  # type: ignore[union-attr]


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux's /proc")
def test_an_idle_ranks_flusher_sleeps_until_the_next_record(tmp_path: Path) -> None:
    """A timed wake-up costs ~56 µs of CPU on a 2-core VM, and an idle rank's flusher woke
    twenty times a second: after an interval with no record it waits untimed; the next
    record wakes it and is in the spool (what a SIGKILLed rank keeps) as promptly as
    before, and in the file at the close."""
    sink = TimelineSink(config_for(tmp_path), 0, SIZE, "h")
    try:
        sink.on_cycle(make_cycle(0))
        writer = sink.writer
        deadline = time.monotonic() + 30
        while not writer._parked:  # type: ignore[union-attr]
            assert time.monotonic() < deadline, "the flusher never went to sleep"
            time.sleep(0.01)
        tid = writer._flusher.native_id  # type: ignore[union-attr]
        before = _switches(tid)
        time.sleep(1.0)  # twenty of its old intervals
        assert _switches(tid) == before, "the idle flusher woke up"
        size = os.path.getsize(writer.spool)  # type: ignore[union-attr]
        sink.on_cycle(make_cycle(1))
        while os.path.getsize(writer.spool) == size:  # type: ignore[union-attr]
            assert time.monotonic() < deadline + 30, "a record put while it slept never came"
            time.sleep(0.01)
    finally:
        sink.close()
    assert len([e for e in load_trace(sink.path).events if e["name"] == "ALLREDUCE"]) == 6


def test_a_large_cycle_is_encoded_as_it_is_handed_over_and_a_small_one_waits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cycle of many ops is encoded on the thread that hands it over, while its columns
    are in that core's caches (with what waited before it, in order); small ones wait for
    the flusher's batch. The file has every op, in cycle order."""
    monkeypatch.setattr(transport, "FLUSH_INTERVAL_S", 60.0)  # the flusher keeps out of it
    sink = TimelineSink(config_for(tmp_path), 0, SIZE, "h")
    writer = sink.writer
    try:
        sink.on_cycle(many_ops_cycle(0, 3))
        assert len(writer._batch) == 1  # type: ignore[union-attr]
        sink.on_cycle(many_ops_cycle(1, transport.ENCODE_NOW_OPS))
        assert writer._batch == []  # type: ignore[union-attr]
        assert len(writer._pending) > transport.ENCODE_NOW_OPS  # type: ignore[union-attr]
    finally:
        sink.close()
    events = load_trace(sink.path).events
    ops = [e for e in events if e.get("ph") == "X" and e["name"] == "ALLREDUCE"]
    assert len(ops) == 3 + transport.ENCODE_NOW_OPS
    # in the order they were handed over: the small cycle (10 ms earlier) first
    assert max(e["ts"] for e in ops[:3]) < min(e["ts"] for e in ops[3:])


def test_the_renderer_waits_for_the_end_unless_a_reader_watches_live(tmp_path: Path) -> None:
    # Rendering beside the training cost it (the renderer's caches and memory bandwidth on
    # cores the ranks share): unwatched, the recording stays in the spool until the close.
    sink = TimelineSink(config_for(tmp_path / "quiet"), 0, SIZE, "h")
    for c in range(50):
        sink.on_cycle(make_cycle(c))
    time.sleep(2.5)  # two of the renderer's intervals, and the rank's flush
    assert os.path.getsize(sink.writer.spool) > 0
    assert os.path.getsize(sink.path) < 100, "rendered although nobody watched"
    sink.close()
    assert len([e for e in load_trace(sink.path).events if e["name"] == "ALLREDUCE"]) == 150

    (tmp_path / "live").mkdir()
    request_live(str(tmp_path / "live"))
    sink = TimelineSink(config_for(tmp_path / "live"), 0, SIZE, "h")
    _let_the_renderer_run(sink.writer.pid)
    for c in range(50):
        sink.on_cycle(make_cycle(c))
    _wait_for_size(sink.path, 10_000)  # watched: rendered while the rank still records
    assert not sink.writer.closed
    sink.close()


def test_the_spool_gives_back_what_the_renderer_read(tmp_path: Path) -> None:
    path = tmp_path / ".rank.0.spool"
    payload = b"x" * 1000
    one = transport.FRAME_HEADER.pack(len(payload)) + payload
    path.write_bytes(one * 20_000)  # 20 MB of frames
    before = os.stat(path).st_blocks
    fd = os.open(path, os.O_RDWR)  # as the renderer opens it: punching a hole needs writing
    try:
        reader = transport.FrameReader(fd)  # no doorbell: read to the end
        frames = 0
        while True:
            if reader.next_frame() is None:
                if not reader.fill():
                    break
                continue
            frames += 1
    finally:
        os.close(fd)
    assert frames == 20_000 and reader.eof
    assert os.path.getsize(path) == len(one) * 20_000, "offsets are kept"
    probe = os.open(tmp_path / "probe", os.O_RDWR | os.O_CREAT)
    try:
        os.write(probe, b"y" * 8192)
        if not wire.punch_hole(probe, 0, 4096):
            pytest.skip("this file system cannot punch holes")
    finally:
        os.close(probe)
    assert os.stat(path).st_blocks < before / 4, "the read part went back to the disk"


_KILLED_RANK_SCRIPT = textwrap.dedent(
    """
    import os, signal, sys, time
    from hvdprof.config import Config
    from hvdprof.common.records import CycleRecord, TunableParams
    from hvdprof.timeline import TimelineSink, transport
    transport.TERMINATE_ON_PRODUCER_LOSS = sys.argv[2] == "terminate"
    sink = TimelineSink(Config(timeline_dir=sys.argv[1]), 0, 1, "h")
    p = TunableParams(1 << 20, 1.0)
    for c in range(200):
        sink.on_cycle(CycleRecord(c, c, c * 1000, c * 1000, c * 1000 + 500, p, bytes_reduced=c))
    want = 200 * 6 + len(sink._renderer.header())  # the cycles and the header lines
    deadline = time.monotonic() + 30
    while sink.writer.sent_events < want and time.monotonic() < deadline:
        time.sleep(0.01)
    print(sink.writer.pid, sink.writer.sent_events - want, flush=True)
    time.sleep(0.3)  # the renderer may be asleep between reads: killed mid-interval
    os.kill(os.getpid(), signal.SIGKILL)  # the rank dies; the renderer must finish alone
    """
)


def _wait_gone(pid: int, timeout_s: float = 60.0) -> None:
    """Wait for a process we are not the parent of (an orphan is reaped by init)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return
        except FileNotFoundError:
            return
        time.sleep(0.02)
    pytest.fail(f"the renderer process {pid} outlived its rank by {timeout_s} s")


@pytest.mark.parametrize("mode", ["leave-open", "terminate"])
def test_sigkilled_rank_keeps_every_event_it_handed_over(tmp_path: Path, mode: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", _KILLED_RANK_SCRIPT, str(tmp_path), mode],
        cwd=REPO, capture_output=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()
    pid, unsent = (int(x) for x in proc.stdout.split())
    assert unsent == 0
    _wait_gone(pid)
    path = tmp_path / "rank.0.json"
    trace = load_trace(str(path))
    counters = [e["args"]["value"] for e in trace.events if e["name"] == act.COUNTER_BYTES_REDUCED]
    assert counters == list(range(200)), "everything handed to the child is in the file"
    assert trace.skipped == []
    manifest = json.loads((tmp_path / "manifest.rank.0.json").read_text())
    assert manifest["closed"] is False
    if mode == "terminate":
        events = json.loads(path.read_text())  # strict JSON
        assert events[-1]["name"] == act.TRACE_END and events[-1]["args"]["producer_lost"]
        assert manifest["events_written"] == len(events) - 1
    else:
        assert not trace.complete and path.read_text().endswith(",\n")
        assert manifest["events_written"] == len(trace.events)
    assert any("closing ']'" in p for p in load_traces(str(tmp_path)).problems) is (
        mode == "leave-open"
    )


def _let_the_renderer_run(pid: int) -> None:
    """Give a renderer a fair share of the CPU once it has lowered itself.

    It takes only CPU nobody else wants, and a loaded machine (a neighbour on a CI runner,
    this suite's loaded runs) may have none for minutes; where autogroups do not apply
    (a process in a non-root cgroup) nothing but privilege lifts it. The tests that wait
    for live rendering are about what it renders, signals and kills, not its priority.
    """
    set_autogroup_nice(pid, 0)
    deadline = time.monotonic() + 60
    with contextlib.suppress(OSError):
        while os.sched_getscheduler(pid) != os.SCHED_IDLE and time.monotonic() < deadline:
            time.sleep(0.005)
    try:
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:  # gone: the test's own checks say what happened
        tids = []
    for tid in tids:
        with contextlib.suppress(OSError):
            os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))
            os.setpriority(os.PRIO_PROCESS, tid, 0)


def _wait_for_size(path: str, size: int, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if os.path.exists(path) and os.path.getsize(path) > size:
            return
        time.sleep(0.02)
    pytest.fail(f"{path} never grew past {size} bytes")


def test_renderer_ignores_sigint_and_a_killed_renderer_does_not_hang_close(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    for folder in ("int", "kill"):  # watched live: the renderers render as the rank records
        (tmp_path / folder).mkdir()
        request_live(str(tmp_path / folder))
    sink = TimelineSink(config_for(tmp_path / "int"), 0, SIZE, "h")
    _let_the_renderer_run(sink.writer.pid)
    sink.on_cycle(make_cycle(0))
    _wait_for_size(sink.path, 1000)  # the child is up and rendering
    os.kill(sink.writer.pid, signal.SIGINT)  # as a Ctrl+C to its process group would
    time.sleep(0.2)
    sink.on_cycle(make_cycle(1))
    sink.close()
    assert sink.writer.returncode == 0
    events = json.loads(Path(sink.path).read_text())
    assert len([e for e in events if e["name"] == "ALLREDUCE"]) == 6

    sink = TimelineSink(config_for(tmp_path / "kill"), 0, SIZE, "h")
    _let_the_renderer_run(sink.writer.pid)
    sink.on_cycle(make_cycle(0))
    _wait_for_size(sink.path, 1000)
    os.kill(sink.writer.pid, signal.SIGKILL)
    sink.writer._proc.wait(60)  # gone (SCHED_IDLE: may take a while)
    for c in range(1, 5):
        sink.on_cycle(make_cycle(c))
    t0 = time.monotonic()
    with caplog.at_level(logging.ERROR, logger="hvdprof.timeline"):
        sink.close()
    assert time.monotonic() - t0 < 30
    assert sink.writer.returncode == -signal.SIGKILL
    assert "renderer" in caplog.text and sink.writer.spool in caplog.text
    trace = load_trace(sink.path)
    assert not trace.complete and len([e for e in trace.events if e["name"] == "ALLREDUCE"]) == 3
    manifest = json.loads(Path(sink.manifest_path).read_text())
    assert manifest["closed"] is False
    assert manifest["events_written"] == len(trace.events)
    # nothing is lost: what the renderer never wrote is still in the spool
    data, payloads = Path(sink.writer.spool).read_bytes(), []
    while data:
        (n,) = transport.FRAME_HEADER.unpack_from(data)
        payloads.append(data[transport.FRAME_HEADER.size : transport.FRAME_HEADER.size + n])
        data = data[transport.FRAME_HEADER.size + n :]
    messages = []
    for m in map(pickle.loads, payloads):  # small cycles travel in batches
        messages += m[1] if m[0] == transport.MSG_BATCH else [m]
    cycles = [m[1][0] for m in messages if m[0] == transport.MSG_CYCLE]
    assert cycles[-4:] == [1, 2, 3, 4]


def test_sink_falls_back_to_a_writer_thread_without_a_python(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(sys, "executable", str(tmp_path / "no-such-python"))
    with caplog.at_level(logging.WARNING, logger="hvdprof.timeline"):
        sink = record_run(tmp_path, cycles=2)
    assert sink.renders_in_process and isinstance(sink.writer, TimelineWriter)
    assert "cannot start the timeline renderer process" in caplog.text
    events = json.loads(Path(sink.path).read_text())
    assert len([e for e in events if e["name"] == "ALLREDUCE"]) == 6
    assert json.loads(Path(sink.manifest_path).read_text())["closed"] is True


def test_forked_copy_of_a_rank_does_not_hold_the_renderer_doorbell(tmp_path: Path) -> None:
    sink = TimelineSink(config_for(tmp_path), 0, SIZE, "h")
    fd = sink.writer._doorbell
    pid = os.fork()
    if pid == 0:  # a data-loader worker, say: the renderer must still see EOF without it
        try:
            os.fstat(fd)
            code = 1
        except OSError:
            code = 0
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    sink.on_cycle(make_cycle(0))
    sink.close()
    assert json.loads(Path(sink.path).read_text())[-1]["name"] == act.TRACE_END


def test_renderer_notices_its_rank_is_gone_by_its_parent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hvdprof.timeline import render_process, wire
    from hvdprof.timeline.render_process import RenderChild

    boosts: list[tuple[str, int]] = []  # this test process's priority stays as it is
    monkeypatch.setattr(
        render_process, "set_autogroup_nice", lambda pid, n: boosts.append(("group", n))
    )
    monkeypatch.setattr(
        os, "sched_setscheduler", lambda pid, policy, p: boosts.append(("policy", policy))
    )

    def child(parent: int) -> RenderChild:
        fd = os.open(tmp_path / f"p{parent}.json", os.O_WRONLY | os.O_CREAT, 0o644)
        return RenderChild(
            str(tmp_path / f"p{parent}.json"), fd,
            {"protocol": wire.PROTOCOL, "rank": 0, "parent_pid": parent},
        )  # fmt: skip

    alive = child(os.getppid())  # the process that started us is our parent: alive
    alive.check_rank()
    assert not alive.rank_gone and boosts == []
    orphan = child(os.getppid() + 1_000_000)  # not our parent: the rank died, we were reparented
    orphan.check_rank()
    assert orphan.rank_gone
    assert boosts == [("group", 0), ("policy", os.SCHED_OTHER)], "back to a normal priority"
    orphan.finish()
    assert len(boosts) == 2, "once"
    alive.writer.abandon()  # closes its file


def test_write_keeping_gil_behaves_like_os_write() -> None:
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    try:
        assert transport.write_keeping_gil(write_end, b"abc") == 3
        assert os.read(read_end, 10) == b"abc"
        written = 0
        with pytest.raises(BlockingIOError):  # a full pipe: nothing written, never blocks
            while True:
                written += transport.write_keeping_gil(write_end, b"x" * 4096)
        assert 0 < written == len(os.read(read_end, written + 1))
    finally:
        os.close(read_end)
    with pytest.raises(BrokenPipeError):  # the reader is gone
        transport.write_keeping_gil(write_end, b"a")
    os.close(write_end)


def test_offline_benchmark_measures_both_sides(tmp_path: Path) -> None:
    out = tmp_path / "offline.json"
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "timeline_overhead.py"), "--offline",
         "--quick", "--output", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = json.loads(out.read_text())["offline"]
    assert result["rank_encode_us_per_op"] > 0 and result["renderer_us_per_op"] > 0
    assert 6 <= result["events_per_op"] <= 10 and result["bytes_per_op"] > 500
    assert 0 < result["bytes_on_wire_per_op"] < result["bytes_per_op"]


def test_an_ops_events_and_bytes_do_not_grow_with_the_ranks(tmp_path: Path) -> None:
    # Every rank used to write a READY instant for every rank on every op: at 64 ranks
    # 91% of a file's events. Now a rank writes its own mark and names the last rank.
    per_op: dict[int, tuple[float, float]] = {}
    for size in (2, 64):
        sink = TimelineSink(config_for(tmp_path / str(size)), 1, size, "host-a")
        for c in range(20):
            record = make_cycle(c, cached=bool(c % 2))
            ops = []
            for op in record.ops:
                ready = {r: op.t_submit + 1_000 * r for r in range(size)}
                ready[1] = op.t_submit  # this rank's own readiness: its submission
                ops.append(dataclasses.replace(op, ready_times=ready))
            sink.on_cycle(dataclasses.replace(record, ops=ops))
        sink.close()
        events = load_trace(sink.path).events
        negotiates = [e for e in events if e["name"] == "NEGOTIATE_ALLREDUCE"]
        assert len(negotiates) == 60
        assert all(e["args"]["last_ready_rank"] == size - 1 for e in negotiates)
        marks = [e for e in events if e["ph"] == "i" and e["name"].startswith(act.READY_PREFIX)]
        assert {e["name"] for e in marks} == {act.ready_name(1)} and len(marks) == 60
        per_op[size] = (len(events) / 60, Path(sink.path).stat().st_size / 60)
    assert per_op[64][0] == per_op[2][0], per_op
    assert per_op[64][1] <= 1.1 * per_op[2][1], per_op
