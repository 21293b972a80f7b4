"""The analysis library on runs with known answers (synthetic hvdprof runs written by
``tests/synthetic_runs.py``, real Horovod timelines) and on broken inputs."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from synthetic_runs import SyntheticSpec, write_synthetic_run

from hvdprof.analysis import (
    LoadError,
    analyze,
    autotune_report,
    bandwidth_report,
    diff_runs,
    find_stragglers,
    fusion_report,
    load_run,
    overlap_report,
    time_breakdown,
    timeline_window,
)
from hvdprof.analysis.breakdown import RankBreakdown
from hvdprof.analysis.stragglers import held_cut
from hvdprof.common import activities as act
from hvdprof.trace.loader import RunLoader
from hvdprof.trace.model import PHASE_NEGOTIATE, PHASE_OP

DATA = Path(__file__).resolve().parent / "data" / "horovod"
REPO = Path(__file__).resolve().parent.parent


def synth(tmp_path: Path, name: str = "run", **kw: object) -> tuple[Path, object]:
    directory = tmp_path / name
    truth = write_synthetic_run(str(directory), SyntheticSpec(**kw))  # type: ignore[arg-type]
    return directory, truth


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HVDPROF_")}
    return subprocess.run(
        [sys.executable, "-m", "hvdprof", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env=env,
    )


# --- Q2 stragglers --------------------------------------------------------------------------


def test_late_rank_named_with_its_cost(tmp_path: Path) -> None:
    d, _ = synth(tmp_path, ranks=4, steps=12, late_rank=3, late_us=5000.0, submit_gap_us=0.0)
    s = find_stragglers(load_run(d, cache=False))
    assert s.source == "source"  # each rank's own submission stamps
    assert s.straggler == 3 and s.onset_step == 1  # step 0 (warm-up) is not counted
    top = s.ranks[0]
    # last in all 11 steps counted (the warm-up step left out)
    assert top.rank == 3 and top.last_share == 1.0 and top.last_count == 11
    assert top.cost_per_step_ms == pytest.approx(5.0, abs=1e-3)
    assert top.wait_caused_ms == pytest.approx(11 * 5.0, abs=1e-2)
    assert s.verdict.startswith("rank 3 is the straggler: it held the job in 100% of 11 steps")
    assert "by 5.0 ms each time: 5.0 ms per step on average (95% interval 5.0-5.0" in s.verdict
    assert s.culprits == [3] and s.cost_ms == pytest.approx(5.0, abs=1e-3)
    # every gradient late by the same 5 ms: late before its first gradient
    assert s.phase == "before_first_gradient"
    assert s.late_at_first_ms == pytest.approx(5.0) and s.late_at_end_ms == pytest.approx(5.0)
    assert all(r.wait_caused_ms == 0 for r in s.ranks[1:])
    assert s.per_op["last_rank"] == [3] * 120


def test_late_rank_cost_counts_wall_time_not_ops(tmp_path: Path) -> None:
    # submissions 100 us apart, every one of rank 0's 3 ms late: the others are blocked
    # from their last submission to rank 0's last, 3 ms per step, not once per tensor
    d, _ = synth(
        tmp_path, ranks=3, steps=5, tensors=6, late_rank=0, late_us=3000.0, submit_gap_us=100.0
    )
    s = find_stragglers(load_run(d, cache=False))
    assert s.straggler == 0
    assert s.ranks[0].cost_per_step_ms == pytest.approx(3.0, abs=1e-3)
    assert s.cost_ms == pytest.approx(3.0, abs=1e-3)


@pytest.mark.parametrize("wakeup", [False, True])
def test_a_rank_that_wakes_late_is_not_blamed_for_its_code(tmp_path: Path, wakeup: bool) -> None:
    # Rank 2 submits every gradient 4 ms late. With the counter saying its training thread
    # got control back 4 ms late too (a busy machine's wake-up), its own work was no
    # longer than the others': no culprit, and the verdict says whose lateness it is. The
    # same counter with an on-time wake-up leaves the 4 ms in its own work: named.
    d, _ = synth(
        tmp_path, ranks=3, steps=12, late_rank=2, late_us=4000.0, waited=True, late_wakeup=wakeup
    )
    run = load_run(d, cache=False)
    assert len(run.counters[act.COUNTER_WAITED][0]) == 3 * 11
    s = find_stragglers(run)
    if wakeup:
        assert s.culprits == [] and s.verdict.startswith("No straggler"), s.verdict
        assert "hvdprof's runtime held rank 2 by" in s.verdict
        assert "held rank 2 by 4.00 ms per step" in s.verdict
    else:
        assert s.culprits == [2] and s.cost_ms == pytest.approx(4.0, abs=1e-3), s.verdict


def test_phase_means_per_step_leave_the_warm_up_step_out_as_the_step_time_does() -> None:
    # the first step holds the start-up broadcasts: 100 ms of negotiation there, 1 ms after
    warm = RankBreakdown(0, 104.0, {}, 5, {"negotiate": [100.0, 1.0, 1.0, 1.0, 1.0]})
    assert warm.mean_step_ms("negotiate") == 1.0
    # too few steps to tell a warm-up from the rest: all of them count
    short = RankBreakdown(0, 103.0, {}, 4, {"negotiate": [100.0, 1.0, 1.0, 1.0]})
    assert short.mean_step_ms("negotiate") == pytest.approx(103.0 / 4)


def test_a_loaded_intermittent_run_counts_only_the_slowed_steps_as_held() -> None:
    # A real 2-rank job beside two spin loops (tests/test_answers.py's intermittent-2,
    # loaded): rank 1 slept 40 ms in data loading in 43 of the 199 steps judged. In the
    # others it was late by its ordinary noise (median 3 ms, up to 24 ms), and the verdict
    # once said "held the job in 39% of 199 steps, by 24.7 ms each time".
    fixture = DATA.parent / "intermittent-2-loaded"
    truth = json.loads((fixture / "truth.json").read_text())
    s = find_stragglers(load_run(fixture, cache=False))
    judged = range(s.first_step, truth["steps"])
    share = float(np.mean([k in truth["slow_steps"] for k in judged]))
    assert s.culprits == [1], s.verdict
    assert abs(s.held_share - share) <= 0.05 and abs(s.ranks[0].held_share - share) <= 0.05
    assert 36.0 <= s.ranks[0].held_ms <= 50.0, s.verdict  # 40 ms slept, and a sleep overshoots
    assert s.phase == "before_first_gradient"


def test_the_held_cut_keeps_a_persistent_fault_and_drops_a_culprits_noise() -> None:
    rng = np.random.default_rng(7)
    noise = np.abs(rng.normal(0.0, 2.0, 150))  # a busy machine's ordinary lateness
    fault = 40.0 + np.abs(rng.normal(0.0, 3.0, 50))
    cut = held_cut(np.concatenate([noise, fault]), 1.0)
    assert noise.max() < cut < fault.min()
    persistent = 3.0 + rng.normal(0.0, 0.8, 200)  # a 3 ms fault on a short step
    assert (persistent >= held_cut(persistent, 0.5)).mean() > 0.97
    assert held_cut(np.zeros(10), 1.0) == 1.0  # nothing above the floor: the floor


def test_an_onset_needs_quiet_steps_before_it() -> None:
    from hvdprof.analysis.stragglers import _onset

    rng = np.random.default_rng(11)
    quiet = np.abs(rng.normal(0.0, 0.5, 7))  # no fault: the ordinary lateness
    faulty = 32.0 + rng.normal(0.0, 1.5, 17)
    assert _onset(np.concatenate([quiet, faulty])) == 7  # from its 8th step on
    noisy = quiet.copy()
    noisy[[1, 4]] = 12.0  # a busy machine's spikes before the onset: still an onset
    assert _onset(np.concatenate([noisy, faulty])) == 7
    # the CI case: a fault from the start, partly masked in its first three steps on a
    # busy machine (the other ranks slow too), is no onset: too few steps to tell
    masked = np.concatenate([10.0 + rng.normal(0.0, 1.0, 3), faulty[:16]])
    assert _onset(masked) == 0
    masked[:6] = 20.0 + rng.normal(0.0, 1.0, 6)  # held the job, if less: no onset
    assert _onset(masked) == 0
    assert _onset(32.0 + rng.normal(0.0, 1.5, 200)) == 0  # no step up at all
    # the second CI case: intermittent-2 (loaded) with its seed's slowed steps, 20% of
    # them before step 134 and 24% after, whose other steps' ordinary lateness rose from
    # ~1 to ~4 ms there (the machine got busier): the fault ran from the start
    truth = json.loads((DATA.parent / "intermittent-2-loaded" / "truth.json").read_text())
    hit = np.isin(np.arange(1, 200), truth["slow_steps"])
    ordinary = np.where(np.arange(1, 200) < 134, 1.0, 4.0) + np.abs(rng.normal(0.0, 0.5, 199))
    assert _onset(np.where(hit, 40.0 + rng.normal(0.0, 1.0, 199), ordinary)) == 0
    # the third (a local loaded run, the same seed): before step 113 the other rank was
    # the slower in ordinary steps (the culprit's ordinary hold ~0, its fault 36 ms in
    # 20% of the steps); after, the other sped up (ordinary ~16 ms, the fault 48 ms). The
    # fault ran from the start: nine in ten steps before are not quiet
    step = np.arange(1, 200)
    ordinary = np.where(step < 113, 0.0, 16.0) + np.abs(rng.normal(0.0, 0.5, 199))
    faulted = np.where(step < 113, 36.0, 48.0) + rng.normal(0.0, 1.0, 199)
    assert _onset(np.where(hit, faulted, ordinary)) == 0


def test_no_straggler_when_ranks_are_even(tmp_path: Path) -> None:
    d, _ = synth(tmp_path, ranks=3, steps=5)
    s = find_stragglers(load_run(d, cache=False))
    assert s.straggler is None
    assert s.verdict.startswith("No straggler")
    assert "finish each step within" in s.verdict
    assert all(r.wait_caused_ms == 0 for r in s.ranks)


def test_profiler_traces_of_some_ranks_compare_those_ranks() -> None:
    # torch.profiler GPU traces of 2 of a job's 128 ranks: the traced ranks are compared
    # (by their NCCL kernels' starts) and the verdict says so once, in words, never with a
    # list of "absent" ranks (tests/test_gpu_stragglers.py has the ground truth)
    s = find_stragglers(load_run(DATA.parent / "kineto-hta", cache=False))
    assert s.straggler is None and s.culprits == [] and s.ops_with_marks == 5
    assert s.verdict.startswith("2 of the job's 128 ranks were traced, so only they are")
    assert "3, 4" not in s.verdict


def test_a_missing_ranks_file_is_named_instead_of_a_straggler(tmp_path: Path) -> None:
    # Each rank marks only its own readiness, so with rank 3's file gone the arrivals
    # cannot be compared: the verdict says which rank is missing instead of guessing.
    d, _ = synth(tmp_path, ranks=4, steps=6, late_rank=3, late_us=5000.0)
    (d / "rank.3.json").unlink()
    s = find_stragglers(load_run(d, cache=False))
    assert s.straggler is None
    assert s.verdict.startswith("No readiness marks from rank 3"), s.verdict


def test_a_straggler_early_at_its_first_gradient_is_not_called_late_by_a_negative() -> None:
    from hvdprof.analysis.stragglers import _lateness

    assert _lateness(57.4) == "late by 57.4 ms"
    assert _lateness(-3.1) == "early by 3.1 ms"  # was "late by -3.1 ms"
    assert _lateness(0.01) == "on time"


# --- Q1 breakdown -----------------------------------------------------------------------------


def test_breakdown_per_step_matches_the_schedule(tmp_path: Path) -> None:
    spec = dict(
        ranks=2,
        steps=6,
        tensors=8,
        group_size=4,
        late_rank=1,
        late_us=3000.0,
        submit_gap_us=0.0,
        tensor_bytes=1 << 20,
        algbw_gbps=2.0,
        step_us=30000.0,
    )
    d, _ = synth(tmp_path, **spec)
    b = time_breakdown(load_run(d, cache=False))
    r0, r1 = b.ranks
    coll = 2 * (4 << 20) / 2e3 / 1000  # two groups of 4 MiB at 2 GB/s, in ms
    for r, neg in ((r0, 3.0 + 0.05), (r1, 0.05)):
        assert r.steps == 6
        assert r.mean_step_ms("negotiate") == pytest.approx(neg, abs=1e-6)
        assert r.mean_step_ms("collective") == pytest.approx(coll, rel=1e-6)
        assert r.mean_step_ms("memcpy_in") == pytest.approx(2 * 0.03, abs=1e-6)
        assert r.mean_step_ms("queue") == pytest.approx(2 * 0.01, abs=1e-6)
        # the phases and idle add up to the wall time
        assert sum(r.total_ms.values()) == pytest.approx(r.wall_ms, rel=1e-9)
    assert len(r0.per_step_ms["negotiate"]) == 6
    # steps are 30 ms apart: idle is what is left (the last step ends with its work)
    assert r0.per_step_ms["idle"][0] == pytest.approx(
        30.0 - sum(r0.per_step_ms[c][0] for c in b.categories if c != "idle"), abs=1e-6
    )


# --- Q3 fusion ---------------------------------------------------------------------------------


def test_fusion_pattern_counted_exactly(tmp_path: Path) -> None:
    d, truth = synth(tmp_path, ranks=2, steps=7, tensors=10, group_size=4, odd_dtype_tensor=True)
    assert truth.groups_per_step == [4, 4, 2, 1]
    f = fusion_report(load_run(d, cache=False))
    assert [r.rank for r in f.ranks] == [0, 1]
    for r in f.ranks:
        assert r.groups == 7 * 4
        assert r.fused == 7 * 3
        assert r.unfused == 7
        assert r.tensors == 7 * 11
        assert r.tensors_per_fused_op == pytest.approx(10 / 3)
        assert r.group_size_histogram == {"1": 7, "2": 7, "4": 14}
        assert r.unfused_reasons == {"dtype": 7}
        assert r.fill_mean == pytest.approx((4 + 4 + 2) / 3 / 64)
        # 4 MiB and 2 MiB groups against 64 MiB: every fused group under 10% full
        assert r.fill_histogram == {
            "<10%": 21, "10-25%": 0, "25-50%": 0, "50-75%": 0, "75-90%": 0, ">=90%": 0
        }  # fmt: skip


def test_fill_bands_against_a_smaller_threshold(tmp_path: Path) -> None:
    """8 MiB threshold: the 4 MiB groups fill half (50-75%), the 2 MiB ones a quarter
    (the band's lower edge belongs to it: 25-50%)."""
    d, _ = synth(tmp_path, ranks=2, steps=5, tensors=10, group_size=4, threshold_bytes=8 << 20)
    for r in fusion_report(load_run(d, cache=False)).ranks:
        assert r.fill_histogram["50-75%"] == 5 * 2 and r.fill_histogram["25-50%"] == 5
        assert sum(r.fill_histogram.values()) == r.fused == 5 * 3


def test_unfused_reasons_threshold_and_alone(tmp_path: Path) -> None:
    d, _ = synth(
        tmp_path, "thr", ranks=2, steps=3, tensors=3, group_size=1, threshold_bytes=3 << 19
    )
    r = fusion_report(load_run(d, cache=False)).ranks[0]
    assert r.fused == 0 and r.unfused_reasons == {"threshold": 9}
    d, _ = synth(tmp_path, "alone", ranks=2, steps=3, tensors=1, group_size=1)
    r = fusion_report(load_run(d, cache=False)).ranks[0]
    assert r.unfused_reasons == {"alone": 3}


# --- Q4 bandwidth ------------------------------------------------------------------------------


@pytest.mark.parametrize(("ranks", "gbps"), [(4, 2.0), (3, 5.0)])
def test_known_bandwidth_recovered(tmp_path: Path, ranks: int, gbps: float) -> None:
    d, _ = synth(
        tmp_path,
        ranks=ranks,
        steps=4,
        tensors=6,
        group_size=2,
        algbw_gbps=gbps,
        tensor_bytes=3 << 20,
    )
    bw = bandwidth_report(load_run(d, cache=False))
    assert bw.ranks == ranks
    assert bw.bins, bw.verdict
    for b in bw.bins:
        assert b.op == "ALLREDUCE"
        assert b.algbw_gbps == pytest.approx(gbps, rel=1e-3)
        assert b.busbw_gbps == pytest.approx(gbps * 2 * (ranks - 1) / ranks, rel=1e-3)
    # one call per group and rank, not one per tensor
    assert len(bw.calls["rank"]) == ranks * 4 * 3
    assert {b.min_bytes for b in bw.bins} == {4 << 20}


# --- Q5 overlap --------------------------------------------------------------------------------


@pytest.mark.parametrize("fraction", [0.0, 0.3, 0.85])
def test_known_overlap_recovered_from_kineto(tmp_path: Path, fraction: float) -> None:
    d, truth = synth(tmp_path, ranks=2, steps=5, kineto_overlap=fraction)
    o = overlap_report(load_run(d, cache=False), truth.kineto_paths)
    assert [r.rank for r in o.ranks] == [0, 1]
    for r in o.ranks:
        assert r.fraction == pytest.approx(fraction, abs=1e-3)
    assert not o.problems


def test_overlap_names_an_unusable_trace(tmp_path: Path) -> None:
    d, truth = synth(tmp_path, ranks=2, steps=2, kineto_overlap=0.5)
    nameless = tmp_path / "trace.json"
    data = json.loads(Path(truth.kineto_paths[0]).read_text())
    del data["distributedInfo"]
    nameless.write_text(json.dumps(data))
    o = overlap_report(load_run(d, cache=False), [str(nameless), f"1={nameless}"])
    assert [r.rank for r in o.ranks] == [1]
    assert any("cannot tell its rank" in p.reason for p in o.problems)


# --- Q6 autotune, Q7 diff ----------------------------------------------------------------------


def test_autotune_windows(tmp_path: Path) -> None:
    d, truth = synth(tmp_path, ranks=2, steps=12, autotune_samples=3)
    a = autotune_report(load_run(d, cache=False))
    got = [t for x in a.samples for t in (x.t0_us, x.t1_us)]
    assert got == pytest.approx([t for w in truth.sample_windows for t in w])
    assert [x.fusion_threshold_bytes for x in a.samples] == [1 << 20, 2 << 20, 4 << 20]
    assert a.best == 2 and a.params_changes == 3
    assert a.recommended is None  # no sample marked: only the highest window is named
    assert "highest-scoring window was sample 2" in a.verdict


def test_autotune_verdict_names_the_recommendation_not_the_highest_window(
    tmp_path: Path,
) -> None:
    """The tuner marks the samples of its recommendation (``is_best``); a higher single
    window (sample 2) is a noisy measurement. The verdict and ``recommended`` follow the
    last marked sample, and compare its windows with the starting configuration's."""
    d, _ = synth(tmp_path, ranks=2, steps=12, autotune_samples=3)
    trace = d / "rank.0.json"
    lines = trace.read_text().splitlines()
    samples = [i for i, line in enumerate(lines) if '"is_best":false' in line]
    assert len(samples) == 3
    for i in samples[:2]:  # samples 0 and 1 marked, as the tuner marks its incumbents
        lines[i] = lines[i].replace('"is_best":false', '"is_best":true')
    trace.write_text("\n".join(lines) + "\n")
    a = autotune_report(load_run(d, cache=False))
    assert (a.best, a.recommended) == (2, 1)
    assert "still tuning when the recording ended" in a.verdict
    assert "recommendation so far is fusion threshold 2 MiB" in a.verdict
    scores = [x.score_mb_per_s for x in a.samples]
    assert f"{scores[1]:.3g} MB/s against {scores[0]:.3g} MB/s" in a.verdict, a.verdict


def test_diff_splits_work_from_waiting(tmp_path: Path) -> None:
    # rank 3 submits 2 ms, then 8 ms after the others in a step of fixed length: the
    # others wait 6 ms more per step, and no rank's own work grew (the synthetic step does
    # not lengthen), so no victim is named as the cause
    a, _ = synth(tmp_path, "a", ranks=4, steps=5, late_rank=3, late_us=2000.0, submit_gap_us=0.0)
    b, _ = synth(tmp_path, "b", ranks=4, steps=5, late_rank=3, late_us=8000.0, submit_gap_us=0.0)
    d = diff_runs(load_run(a, cache=False), load_run(b, cache=False))
    kinds = [r.kind for r in d.rows]
    work, wait = kinds.count("work"), kinds.count("wait")
    assert kinds[:work] == ["work"] * work and kinds[work : work + wait] == ["wait"] * wait
    for part in (d.rows[:work], d.rows[work : work + wait], d.rows[work + wait :]):
        deltas = [r.delta_ms for r in part]
        assert deltas == sorted(deltas, reverse=True)
    waits = {r.key: r for r in d.rows if r.kind == "wait"}
    for rank in (0, 1, 2):
        assert waits[f"rank {rank}"].delta_ms == pytest.approx(6.0, abs=1e-6)
    assert waits["rank 3"].b_ms == 0.0
    neg = next(r for r in d.rows if r.kind == "phase" and r.key == "negotiate")
    assert neg.delta_ms == pytest.approx(6.0 * 3 / 4, abs=1e-6)
    assert d.cause is None and "No rank's own work grew" in d.verdict
    proc = cli("diff", str(a), str(b))
    assert proc.returncode == 0, proc.stderr
    assert "Consequences: each rank's waiting" in proc.stdout


def test_diff_leaves_a_once_only_tensor_out_of_the_per_step_rows(tmp_path: Path) -> None:
    """A tensor reduced in the first step only (a start-up broadcast) is not per-step work:
    no tensor row (it would read as a per-step cost), listed as one-time instead."""
    a, _ = synth(tmp_path, "a", ranks=2, steps=5, tensors=2, group_size=1)
    b, _ = synth(tmp_path, "b", ranks=2, steps=5, tensors=2, group_size=1, step_us=20_000.0)
    once = "allreduce.layer1.grad"
    for path in b.glob("rank.*.json"):  # layer1 only in step 0 (events before 21 ms)
        kept = []
        for line in path.read_text().splitlines():
            body = line.rstrip(",")
            event = json.loads(body) if body.startswith("{") else None
            if event and event.get("tid") == 17 and event.get("ts", 0) >= 1_021_000:
                continue
            kept.append(line)
        path.write_text("\n".join(kept) + "\n")
    run_b = load_run(b, cache=False)
    s = run_b.slices
    index = run_b.tensors.index(once)
    timed = ((s.phase == PHASE_NEGOTIATE) | (s.phase == PHASE_OP)) & (s.tensor == index)
    assert 0 < int((timed & (s.phase == PHASE_OP)).sum()) == 2  # one op per rank
    d = diff_runs(load_run(a, cache=False), run_b)
    assert d.one_time == [once]
    assert not any(r.kind == "tensor" and r.key == once for r in d.rows)
    assert once not in d.only_in_a + d.only_in_b
    assert any(r.kind == "tensor" for r in d.rows)  # the other tensor is compared


# --- timeline_window ---------------------------------------------------------------------------


def test_window_exact_and_aggregated(tmp_path: Path) -> None:
    d, _ = synth(tmp_path, ranks=3, steps=8)
    run = load_run(d, cache=False)
    s = run.slices
    t0, t1 = run.t0_us + 20000.0, run.t0_us + 60000.0
    overlapping = (s.start_us <= t1) & (s.start_us + s.dur_us >= t0) & ~np.isin(s.phase, (1, 7))
    w = timeline_window(run, t0, t1, max_items=100000)
    assert not w.aggregated and w.total == int(overlapping.sum())
    assert len(w.slices["start_us"]) == w.total
    assert [r["rank"] for r in w.rows] == [0, 1, 2]
    assert set(w.slices["phase"]) <= {"negotiate", "queue", "memcpy_in", "collective", "memcpy_out"}
    assert {"tensor", "op", "bytes", "group", "backend"} <= set(w.slices)
    agg = timeline_window(run, t0, t1, max_items=30)
    assert agg.aggregated and agg.total == w.total
    assert len(agg.buckets["row"]) <= 30
    # a slice counts in every bin it overlaps: each at least once
    assert sum(agg.buckets["count"]) >= w.total
    widths = agg.buckets["dur_us"]
    assert all(b <= d for b, d in zip(agg.buckets["busy_us"], widths, strict=True))
    lanes = timeline_window(run, run.t0_us, run.t1_us, expand_rank=1, max_items=10**6)
    assert {r["label"] for r in lanes.rows} == set(run.tensors)
    assert json.dumps(agg.to_dict()) and json.dumps(lanes.to_dict())


# --- the whole report, the CLI -----------------------------------------------------------------


def test_analyze_report_is_json_safe_and_verdict_first(tmp_path: Path) -> None:
    d, truth = synth(
        tmp_path,
        ranks=3,
        steps=6,
        late_rank=1,
        late_us=4000.0,
        kineto_overlap=0.5,
        autotune_samples=2,
        odd_dtype_tensor=True,
    )
    report = analyze(load_run(d, cache=False), kineto_paths=truth.kineto_paths)
    data = json.loads(json.dumps(report.to_dict(), allow_nan=False))
    assert data["verdicts"][0].startswith("rank 1 is the straggler")
    assert set(data) >= {
        "run",
        "breakdown",
        "stragglers",
        "fusion",
        "bandwidth",
        "overlap",
        "autotune",
        "problems",
    }
    assert data["overlap"]["ranks"][0]["fraction"] == pytest.approx(0.5, abs=1e-3)
    proc = cli("analyze", str(d), "--kineto", *truth.kineto_paths)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.index("Verdicts") < out.index("1. Where the time goes")
    for title in (
        "2. Who is late",
        "3. Fusion",
        "4. Bandwidth",
        "5. Communication overlapped",
        "6. Autotune",
    ):
        assert title in out
    proc = cli("analyze", "--json", str(d))
    assert proc.returncode == 0 and json.loads(proc.stdout)["stragglers"]["straggler"] == 1


# --- Horovod timelines --------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["horovod-timeline.json", "horovod-timeline-nocache.json"])
def test_horovod_timeline_straggler(name: str) -> None:
    run = load_run(DATA / name)
    assert run.format == "horovod" and run.ranks == [0, 1] and run.clean
    assert len(run.tensors) == 37
    s = find_stragglers(run)
    assert s.straggler == 1, s.verdict
    assert s.verdict.startswith("rank 1 is the straggler")
    report = analyze(run)
    assert report.verdicts[0] == s.verdict
    json.dumps(report.to_dict(), allow_nan=False)


def test_horovod_nocache_marks_and_ops() -> None:
    run = load_run(DATA / "horovod-timeline-nocache.json")
    assert len(run.marks) == 828  # 414 negotiations x 2 ranks
    s = find_stragglers(run)
    assert s.ranks[0].rank == 1 and s.ranks[0].last_share_by_op["ALLREDUCE"] > 0.9
    # rank 1 sleeps 20 ms per step
    assert 10.0 < s.ranks[0].cost_per_step_ms < 40.0
    bw = bandwidth_report(run)
    assert "ALLREDUCE" in bw.best_busbw_gbps
    f = fusion_report(run)
    assert f.threshold_bytes == 64 << 20 and f.ranks[0].fused > 0


def test_horovod_killed_file_reports_open_slices(tmp_path: Path) -> None:
    events = json.loads((DATA / "horovod-timeline-nocache.json").read_text())
    # cut just after a NEGOTIATE_ALLREDUCE began, as a SIGKILL would leave it
    cut = max(
        i
        for i, e in enumerate(events[: len(events) // 2])
        if e.get("name") == "NEGOTIATE_ALLREDUCE"
    )
    killed = tmp_path / "killed.json"
    killed.write_text(json.dumps(events[: cut + 1]))
    run = load_run(killed)
    assert run.format == "horovod" and not run.clean
    assert any(
        "never ended" in p.reason and "NEGOTIATE_ALLREDUCE" in p.reason for p in run.problems
    )
    assert find_stragglers(run).straggler == 1
    proc = cli("analyze", str(killed))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "never ended" in proc.stdout


# --- broken inputs -----------------------------------------------------------------------------


def test_truncated_rank_file(tmp_path: Path) -> None:
    d, _ = synth(tmp_path, ranks=3, steps=10, late_rank=2, late_us=3000.0)
    full = load_run(d, cache=False)
    path = d / "rank.1.json"
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * 0.6)])  # cut mid-line
    run = load_run(d, cache=False)
    assert not run.complete[1] and run.complete[0]
    assert any(p.file == str(path) and "incomplete last event" in p.reason for p in run.problems)
    n1 = int((run.slices.rank == 1).sum())
    assert 0 < n1 < int((full.slices.rank == 1).sum())
    assert int((run.slices.rank == 0).sum()) == int((full.slices.rank == 0).sum())
    assert find_stragglers(run).straggler == 2
    proc = cli("analyze", str(d))
    assert proc.returncode == 1
    assert "skipped" in proc.stdout or "could not be read" in proc.stdout


def test_corrupt_line_named_and_the_rest_read(tmp_path: Path) -> None:
    d, truth = synth(tmp_path, ranks=2, steps=4)
    path = d / "rank.0.json"
    lines = path.read_bytes().split(b"\n")
    lines[40] = b'{"name":"QUEUE","ph":"X","ts":12 THIS IS NOT JSON'
    path.write_bytes(b"\n".join(lines))
    run = load_run(d, cache=False)
    bad = [p for p in run.problems if p.file == str(path)]
    assert len(bad) == 1 and bad[0].where == "line 41" and "invalid JSON" in bad[0].reason
    assert run.complete[0]
    assert run.events == truth.events - 1  # every other event was read
    proc = cli("analyze", "--json", str(d))
    assert proc.returncode == 1
    assert json.loads(proc.stdout)["problems"][0]["where"] == "line 41"


def test_empty_and_unreadable_inputs(tmp_path: Path) -> None:
    d, _ = synth(tmp_path, ranks=3, steps=3)
    (d / "rank.2.json").write_bytes(b"")
    run = load_run(d, cache=False)
    assert any("empty file" in p.reason for p in run.problems)
    assert not run.complete[2]
    assert 2 not in set(run.slices.rank.tolist()) and len(run.slices)
    assert cli("analyze", str(d)).returncode == 1
    empty_dir = tmp_path / "nothing"
    empty_dir.mkdir()
    with pytest.raises(LoadError):
        load_run(empty_dir)
    proc = cli("analyze", str(empty_dir))
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "no timeline files" in proc.stderr
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "rank.0.json").write_bytes(os.urandom(2000).replace(b"[", b"x"))
    proc = cli("analyze", str(junk))
    assert proc.returncode == 2 and "nothing readable" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_elastic_job_directory_names_its_generations(tmp_path: Path) -> None:
    """An elastic job's timeline directory holds one run per generation: analysing the
    directory itself says which subfolders to name, in numeric order."""
    root = tmp_path / "elastic"
    for g in (1, 2, 10):
        synth(root, f"generation.{g}", ranks=2, steps=2)
    (root / "elastic.json").write_text("{}")
    proc = cli("analyze", str(root))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "subfolders hold runs (generation.1, generation.2, generation.10)" in proc.stderr
    assert str(root / "generation.10") in proc.stderr and "Traceback" not in proc.stderr
    assert cli("analyze", str(root / "generation.2")).returncode == 0


def test_gzip_and_truncated_gzip(tmp_path: Path) -> None:
    d, _ = synth(tmp_path, ranks=2, steps=4)
    plain = load_run(d, cache=False)
    for r in (0, 1):
        src = d / f"rank.{r}.json"
        with gzip.open(d / f"rank.{r}.json.gz", "wb") as f:
            f.write(src.read_bytes())
        src.unlink()
    gz = load_run(d, cache=False)
    assert gz.clean and len(gz.slices) == len(plain.slices)
    path = d / "rank.1.json.gz"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    cut = load_run(d, cache=False)
    assert any(p.file == str(path) and p.where.startswith("byte") for p in cut.problems)
    assert 0 < int((cut.slices.rank == 1).sum()) < int((plain.slices.rank == 1).sum())


# --- live files and the cache -------------------------------------------------------------------


def test_refresh_reads_only_what_grew(tmp_path: Path) -> None:
    d, _ = synth(tmp_path, ranks=2, steps=6, late_rank=1, late_us=3000.0)
    full = load_run(d, cache=False)
    path = d / "rank.0.json"
    data = path.read_bytes()
    half = data.rfind(b"\n", 0, len(data) // 2) + 1
    path.write_bytes(data[:half] + b'{"name":"QUEUE","ph":"X","ts":1')  # a line being written
    run = load_run(d, cache=False)
    assert not run.complete[0]
    partial = len(run.slices)
    assert partial < len(full.slices)
    with open(path, "ab") as f:
        f.write(b"")  # nothing new yet
    assert run.refresh() is False
    path.write_bytes(data)
    assert run.refresh() is True
    assert run.complete == {0: True, 1: True} and run.clean
    assert len(run.slices) == len(full.slices)
    for col in ("start_us", "dur_us", "occurrence", "group", "bytes"):
        a = np.sort(getattr(run.slices, col))
        b = np.sort(getattr(full.slices, col))
        assert np.array_equal(a, b), col
    assert len(run.marks) == len(full.marks)
    assert find_stragglers(run).straggler == 1
    assert run.refresh() is False


def test_cache_written_reused_and_optional(tmp_path: Path) -> None:
    d, _ = synth(tmp_path, ranks=2, steps=4, odd_dtype_tensor=True)
    first = load_run(d)
    assert (d / ".hvdprof-cache" / "rank.0.json.npz").exists()
    loader = RunLoader(str(d))
    assert all(s.load_cache() for s in loader.sources)
    again = loader.load()
    assert again.tensors and len(again.slices) == len(first.slices)
    assert fusion_report(again).ranks[0].unfused_reasons == {"dtype": 4}
    # a changed file is not served from a stale cache
    path = d / "rank.0.json"
    os.utime(path, ns=(1, 1))
    assert not RunLoader(str(d)).sources[0].load_cache()
    # a directory where the cache cannot be created: no cache, no error
    other = tmp_path / "nocache"
    shutil.copytree(d, other, ignore=shutil.ignore_patterns(".hvdprof-cache"))
    (other / ".hvdprof-cache").write_text("a file, not a directory")
    run = load_run(other)
    assert len(run.slices) == len(first.slices) and run.clean


def test_merged_trace_is_refused_with_a_reason(tmp_path: Path) -> None:
    d, _ = synth(tmp_path, ranks=2, steps=2)
    merged = tmp_path / "merged.json"
    proc = cli("timeline", "merge", str(d), "-o", str(merged))
    assert proc.returncode == 0, proc.stderr
    proc = cli("analyze", str(merged))
    assert proc.returncode == 2
    assert "analyse the timeline directory instead" in proc.stderr


def test_benchmark_quick_run(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "analysis_bench.py"),
            "--quick",
            "--output",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=280,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert [v["events"] for v in result["variants"]] == sorted(
        v["events"] for v in result["variants"]
    )
    for v in result["variants"]:
        for variant in ("cold", "write", "cached"):
            assert v[variant]["wall_s"] > 0 and v[variant]["peak_rss_mb"] > 0
    assert result["window_query"]["slices"] > 0


def test_refresh_picks_up_a_rank_that_starts_late(tmp_path: Path) -> None:
    d, _ = synth(tmp_path, ranks=3, steps=3)
    moved = tmp_path / "rank.2.json"
    (d / "rank.2.json").rename(moved)
    run = load_run(d, cache=False)
    assert 2 not in set(run.slices.rank.tolist())
    moved.rename(d / "rank.2.json")
    assert run.refresh() is True
    assert 2 in set(run.slices.rank.tolist()) and run.complete == {0: True, 1: True, 2: True}


def test_output_cut_short_by_the_reader_keeps_the_exit_code(tmp_path: Path) -> None:
    d, _ = synth(tmp_path, ranks=2, steps=3)
    env = {k: v for k, v in os.environ.items() if not k.startswith("HVDPROF_")}
    for extra in ((), ("--json",)):
        proc = subprocess.Popen(
            [sys.executable, "-m", "hvdprof", "analyze", str(d), *extra],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=REPO,
            env=env,
        )
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()  # the reader is gone before the first line (`| head -0`)
        assert proc.wait(timeout=60) == 0
        assert b"Traceback" not in proc.stderr.read()


@pytest.mark.parametrize("seed", [1, 2])
def test_refresh_in_tiny_pieces_equals_one_read(tmp_path: Path, seed: int) -> None:
    import random

    d, _ = synth(tmp_path, ranks=2, steps=3, tensors=5, group_size=2, late_rank=1, late_us=500.0)
    live = tmp_path / "live"
    live.mkdir()
    data = {f.name: f.read_bytes() for f in d.glob("rank.*.json")}
    for f in d.glob("manifest.*"):
        (live / f.name).write_bytes(f.read_bytes())
    for name in data:
        (live / name).write_bytes(b"")
    run = load_run(live, cache=False)
    rng = random.Random(seed)
    done = dict.fromkeys(data, 0)
    while any(done[n] < len(b) for n, b in data.items()):
        for name, whole in data.items():
            new = min(len(whole), done[name] + rng.randrange(1, 400))
            with open(live / name, "ab") as f:
                f.write(whole[done[name] : new])
            done[name] = new
        run.refresh()
    full = load_run(d, cache=False)
    assert run.clean and len(run.slices) == len(full.slices)
    for col in ("start_us", "occurrence", "group", "bytes", "op"):
        a = np.sort(getattr(run.slices, col))
        b = np.sort(getattr(full.slices, col))
        assert np.array_equal(a, b), col
    # tensor codes depend on reading order: compare (tensor name, start) pairs
    pairs = sorted(zip(np.array(run.tensors)[run.slices.tensor], run.slices.start_us, strict=True))
    assert pairs == sorted(
        zip(np.array(full.tensors)[full.slices.tensor], full.slices.start_us, strict=True)
    )
    assert np.array_equal(np.sort(run.marks.ts_us), np.sort(full.marks.ts_us))
    assert find_stragglers(run).ranks[0].cost_per_step_ms == pytest.approx(
        find_stragglers(full).ranks[0].cost_per_step_ms
    )


def test_the_breakdown_does_not_blame_the_rank_that_waited_least() -> None:
    # The demo's 2-rank run, balanced (no straggler: rank 0 last in 54% of steps): rank 1
    # waited 65% of the time in negotiation and rank 0, the coordinator, 41%. The
    # breakdown used to add "the others wait for it" of rank 0, against the straggler
    # verdict; blame is that verdict's alone.
    from hvdprof.analysis.breakdown import Breakdown, RankBreakdown, _verdict
    from hvdprof.analysis.phases import CATEGORIES

    def rank(r: int, negotiate: float) -> RankBreakdown:
        totals = dict.fromkeys(CATEGORIES, 0.0)
        totals.update(negotiate=negotiate, collective=9.0, idle=91.0 - negotiate)
        return RankBreakdown(r, 100.0, totals, 10, {})

    verdict = _verdict(Breakdown(ranks=[rank(0, 41.0), rank(1, 65.0)])) or ""
    assert "Rank 1 waits longest in negotiation (65%), rank 0 least (41%)" in verdict
    assert "wait for it" not in verdict, verdict
    assert "straggler verdict" in verdict
