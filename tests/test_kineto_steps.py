"""Steps and phases from the trace's own marks: ``ProfilerStep#N`` and ``record_function``.

The expected values are read from the trace files here with json and gzip, independently
of the reader: the step spans the profiler wrote, and the outermost user ranges on the
thread that ran the steps.
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import numpy as np
import pytest
from test_kineto import cli

from hvdprof.analysis import analyze, load_run
from hvdprof.analysis.steps import step_starts, typical_step_ms
from hvdprof.analysis.user_phases import OUTSIDE, display_name, user_phases

DATA = Path(__file__).resolve().parent / "data"
HTA = DATA / "kineto-hta"
GLOO = DATA / "kineto-ddp-gloo"


def events(path: Path) -> list[dict]:
    with gzip.open(path, "rt") as f:
        return json.load(f)["traceEvents"]


def profiler_steps(path: Path) -> list[tuple[float, float]]:
    """(start, dur) of each ProfilerStep#N, in step order."""
    found = sorted(
        (int(e["name"].split("#")[1]), e["ts"], e["dur"])
        for e in events(path)
        if e.get("ph") == "X" and e.get("name", "").startswith("ProfilerStep#")
    )
    return [(ts, dur) for _, ts, dur in found]


def test_steps_are_the_profilers_own() -> None:
    run = load_run(HTA, cache=False)
    files = {0: HTA / "sampled_rank-0.json.gz", 1: HTA / "sampled_rank-1.json.gz"}
    starts = step_starts(run)
    for rank, path in files.items():
        truth = profiler_steps(path)
        assert len(starts[rank]) == len(truth) == 2
        # the same spans (the reader moved each rank onto one clock: compare differences)
        assert np.diff(starts[rank]) == pytest.approx(np.diff([t for t, _ in truth]))
        spans = run.trace_steps[rank].end_us - run.trace_steps[rank].start_us
        assert spans.tolist() == pytest.approx([d for _, d in truth])
    # the step analyze quotes: start to start of the profiler's steps
    gaps = [np.diff([t for t, _ in profiler_steps(p)])[0] / 1000.0 for p in files.values()]
    assert typical_step_ms(run) == pytest.approx(float(np.median(gaps)))


def outermost_ranges(path: Path) -> dict[str, list[float]]:
    """Per name, the durations (ms) of the outermost user_annotation ranges on the thread
    of the ProfilerStep ranges (collective ranges are not phases)."""
    evs = [e for e in events(path) if e.get("ph") == "X"]
    step_tid = next(e["tid"] for e in evs if e["name"].startswith("ProfilerStep#"))
    mine = sorted(
        (e["ts"], -e["dur"], e["name"])
        for e in evs
        if e.get("cat") == "user_annotation"
        and e["tid"] == step_tid
        and not e["name"].startswith(("nccl:", "gloo:", "ProfilerStep#"))
    )
    out: dict[str, list[float]] = {}
    reach = -np.inf
    for ts, neg, name in mine:
        if ts >= reach:
            out.setdefault(display_name(name), []).append(-neg / 1000.0)
        reach = max(reach, ts - neg)
    return out


def test_user_ranges_are_the_phases_of_a_gpu_trace() -> None:
    run = load_run(HTA, cache=False)
    p = user_phases(run)
    truth = outermost_ranges(HTA / "sampled_rank-0.json.gz")
    assert {"data_load", "forward", "backward", "optimizer"} <= set(truth)
    assert set(p.names) == set(truth)
    rank0 = next(r for r in p.ranks if r.rank == 0)
    for name, durations in truth.items():  # one range of each name per step here
        assert rank0.per_step_ms[name] == pytest.approx(durations, abs=1e-3), name
    # the ranges and the rest add up to each step
    for r in p.ranks:
        total = np.sum([r.per_step_ms[n] for n in [*p.names, OUTSIDE]], axis=0)
        assert total == pytest.approx(r.step_ms, abs=1e-3)
    # no rank differs by 5% of its step in any range: nothing named
    assert p.outlier is None and "about the same time" in (p.verdict or "")


def test_a_range_only_the_slow_rank_has_is_named() -> None:
    # rank 1 of the real Gloo DDP job did 20 ms of extra work in a range of that name
    report = analyze(load_run(GLOO, cache=False))
    p = report.breakdown.user
    assert p.outlier is not None
    rank, name, ms, others = p.outlier
    assert (rank, name) == (1, "slow_rank_extra_work")
    assert 19.0 <= ms <= 22.0 and others == 0.0
    assert any("'slow_rank_extra_work'" in v and "no such range" in v for v in report.verdicts)
    data = report.to_dict()["breakdown"]["user_phases"]
    assert data["outlier"]["rank"] == 1 and "DistributedDataParallel.forward" in data["names"]


def test_cli_prints_the_ranges_table() -> None:
    proc = cli("analyze", str(GLOO))
    assert proc.returncode == 0, proc.stderr
    text = re.sub(r"\s+", " ", proc.stdout)
    assert "trace's own ranges" in text
    row = re.search(r"slow_rank_extra_work\s*│\s*([\d.]+)\s*│\s*([\d.]+)", proc.stdout)
    assert row is not None, proc.stdout
    assert float(row.group(1)) == 0.0 and 19.0 <= float(row.group(2)) <= 22.0
