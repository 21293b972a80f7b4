"""The autotune card agrees with the tuner: its paired decisions, not single windows.

Since the paired tuner each ``AUTOTUNE_SAMPLE`` on the timeline carries what the tuner
decided by then (role, paired ratio to the default, incumbent, recommendation with its
lower bound, and the verdict once the round ended). ``autotune_report`` names that
recommendation and decision, never the highest single window; the surrogate is drawn over
the searched range and called flat when its predicted range is within the noise. The
controller test drives the real controller with a synthetic objective and checks what it
hands the timeline.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from synthetic_runs import SyntheticSpec, write_synthetic_run

from hvdprof.analysis import autotune_report, load_run
from hvdprof.analysis.surrogate import FLAT_NOISE_MULTIPLE, RANGE_PAD, autotune_surface

DEFAULT = {"fusion_threshold_bytes": 1 << 20, "cycle_time_ms": 1.0, "cache_enabled": True}


def rewrite_samples(directory: Path, extra: list[dict]) -> None:
    """Add ``extra[i]`` to the args of the i-th AUTOTUNE_SAMPLE of rank 0's trace."""
    trace = directory / "rank.0.json"
    lines = trace.read_text().splitlines()
    k = 0
    for i, line in enumerate(lines):
        if '"AUTOTUNE_SAMPLE"' not in line:
            continue
        body, comma = (line[:-1], ",") if line.endswith(",") else (line, "")
        event = json.loads(body)
        event["args"].update(extra[k])
        lines[i] = json.dumps(event) + comma
        k += 1
    assert k == len(extra)
    trace.write_text("\n".join(lines) + "\n")


def synth_tuned(tmp_path: Path, extra: list[dict], samples: int = 3) -> Path:
    d = tmp_path / "run"
    write_synthetic_run(str(d), SyntheticSpec(ranks=2, steps=12, autotune_samples=samples))
    rewrite_samples(d, extra)
    return d


def test_kept_default_is_said_even_when_a_single_window_scored_higher(tmp_path: Path) -> None:
    # the synthetic samples score 1, 2 then 4 MiB highest: a single-window reading would
    # call sample 2 the winner; the tuner kept the default
    rec = {**DEFAULT, "ratio_to_default": 1.0, "ratio_lower_bound": 1.0, "kept_default": True}
    decision = (
        "hvdprof autotune: kept the default — nothing to set: none of the 1 settings tried "
        "beat it with 95% confidence"
    )
    d = synth_tuned(
        tmp_path,
        [
            {"role": "incumbent", "recommendation": rec, "ratio_to_default": 1.0},
            {"role": "candidate", "recommendation": rec},
            {"role": "incumbent", "recommendation": rec, "decision": decision},
        ],
    )
    a = autotune_report(load_run(str(d), cache=False))
    assert a.paired and a.decision == decision and a.recommendation == rec
    assert a.best == 2  # still reported: the highest single window
    # the tuner's line, once, without its stderr prefix; no default values as a finding
    assert a.verdict == (
        "Autotune (3 samples): kept the default — nothing to set: none of the 1 settings "
        "tried beat it with 95% confidence."
    )
    assert "x the default" not in a.verdict
    assert a.recommended == 0  # the last window that ran the default (1 MiB)
    assert [s.role for s in a.samples] == ["incumbent", "candidate", "incumbent"]
    assert a.to_dict()["recommendation"] == rec


def test_recommendation_with_its_paired_ratio(tmp_path: Path) -> None:
    better = {"fusion_threshold_bytes": 2 << 20, "cycle_time_ms": 1.0, "cache_enabled": True}
    rec = {**better, "ratio_to_default": 1.084, "ratio_lower_bound": 1.021, "kept_default": False}
    d = synth_tuned(
        tmp_path,
        [
            {"role": "incumbent", "recommendation": {**DEFAULT, "kept_default": True}},
            {"role": "candidate", "recommendation": rec, "ratio_to_default": 1.084},
            {"role": "candidate", "recommendation": rec},  # no decision: still tuning
        ],
    )
    a = autotune_report(load_run(str(d), cache=False))
    assert a.recommended == 1  # the window that ran 2 MiB, not the highest (4 MiB)
    assert "still tuning" in a.verdict and "so far recommends fusion threshold 2 MiB" in a.verdict
    assert "1.084x the default's throughput in paired measurements (at least 1.021x)" in a.verdict
    assert a.samples[1].ratio_to_default == pytest.approx(1.084)


def test_surface_spans_the_searched_range_and_flat_is_said(tmp_path: Path) -> None:
    d = tmp_path / "run"
    write_synthetic_run(str(d), SyntheticSpec(ranks=2, steps=16, autotune_samples=8))
    run = load_run(str(d), cache=False)
    thresholds = [s.fusion_threshold_bytes for s in run.autotune_samples]
    cycles = [s.cycle_time_ms for s in run.autotune_samples]
    surface = autotune_surface(run, grid=12)
    assert surface.x[0] == pytest.approx(min(thresholds) / RANGE_PAD)
    assert surface.x[-1] == pytest.approx(max(thresholds) * RANGE_PAD)
    assert surface.y[0] >= min(cycles) / 1.5 and surface.y[-1] <= max(cycles) * 1.5
    # the synthetic scores rise 2x per threshold doubling: far beyond any noise
    assert not surface.flat and surface.range_log > FLAT_NOISE_MULTIPLE * surface.noise_log
    # the same samples all scoring alike, with the tuner's recorded noise: flat
    for s in run.autotune_samples:
        s.score_bytes_per_s = 1e7 * (1.0 + 0.001 * (s.fusion_threshold_bytes % 3))
        s.comparison_noise = 0.1
    flat = autotune_surface(run, grid=12)
    assert flat.flat and flat.noise_log == pytest.approx(0.1 / 2**0.5)
    assert flat.range_log < FLAT_NOISE_MULTIPLE * flat.noise_log
    assert flat.to_dict()["flat"] is True


def test_controller_hands_the_timeline_its_decisions() -> None:
    """The real controller, handed scored windows as its worker is, tells the timeline's
    listener the role, incumbent, recommendation and, when the round ends, its one line."""
    from hvdprof.autotune.controller import AutotuneController, _Sample
    from hvdprof.autotune.scoring import StepTotals
    from hvdprof.common.records import TunableParams
    from hvdprof.config import Config

    config = Config.from_env(
        {"HVDPROF_AUTOTUNE": "1", "HVDPROF_AUTOTUNE_BAYES_OPT_MAX_SAMPLES": "6"}
    )
    initial = TunableParams(config.fusion_threshold_bytes, config.cycle_time_ms, True)
    out = io.StringIO()
    controller = AutotuneController(config, initial, 0, out=out)
    seen: list[dict] = []
    controller.on_sample = lambda *args, **decisions: seen.append(decisions)
    # 3 steps of 0.1 s reducing 1 MB each: 1e7 bytes/s whatever runs (a flat objective)
    steps = [StepTotals(i, i * 10**8, (i + 1) * 10**8, 10**6) for i in range(3)]
    params = initial
    while not controller.converged:
        controller._handle(_Sample(params, "tune", steps))
        proposal = controller._proposal
        assert proposal is not None
        params = proposal[0]
    assert [d["role"] for d in seen][:2] == ["incumbent", "candidate"]
    assert all("incumbent" in d and "recommendation" in d for d in seen)
    assert seen[-1]["recommendation"]["kept_default"] is True
    assert seen[-1]["decision"].startswith("hvdprof autotune: kept the default — nothing to set")
    assert seen[-1]["decision"] == out.getvalue().strip()  # the line printed, once
    assert all("decision" not in d for d in seen[:-1])
