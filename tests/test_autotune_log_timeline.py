"""The autotune log and the timeline list the same windows, and a round's decision once.

Two ways they parted; either gives what a fresh-clone CI run of tests/test_analysis_e2e.py
showed, 7 log rows where the timeline had 5 samples:

* A round that ended while the tuner asked for its next window (screening over with
  nothing better than the incumbent) wrote its decision row, then measured one more window
  as tuning and wrote a second decision row after it.
* The tuner scores and hands samples over on a worker thread, so at shutdown it can hold a
  window or two. The cycle closed the timeline's sink before the tuner, and those samples
  reached the log but not the timeline. The runtime now closes the tuner first.
"""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import run_job

from hvdprof.analysis import autotune_report, load_run
from hvdprof.autotune.controller import PHASE_WATCH, AutotuneController, _Sample
from hvdprof.autotune.log import PHASE_DECISION, PHASE_TUNE, read_autotune_log
from hvdprof.autotune.scoring import StepTotals
from hvdprof.common.records import TunableParams
from hvdprof.config import Config

STEP_NS = 10**8


@pytest.mark.parametrize(("seed", "max_samples"), [(0, 20), (2, 10)])
def test_a_round_ended_by_asking_decides_once(tmp_path: Path, seed: int, max_samples: int) -> None:
    """The default is 25% faster than anything else: screening finds nothing better, and
    the round ends as the tuner asks for its next window."""
    config = Config(
        autotune=True,
        autotune_log=str(tmp_path / "tune.csv"),
        autotune_warmup_samples=1,
        autotune_steps_per_sample=4,
        autotune_max_samples=max_samples,
        autotune_continuous=True,
    )
    initial = TunableParams(config.fusion_threshold_bytes, config.cycle_time_ms, True)
    out = io.StringIO()
    controller = AutotuneController(config, initial, 0, out=out)
    seen: list[tuple[int, int, str, dict[str, Any]]] = []
    controller.on_sample = lambda p, s, first, last, best, phase, **d: seen.append(
        (first, last, phase, d)
    )
    rng = np.random.default_rng(seed)
    params, phase, step = initial, PHASE_TUNE, 0
    # the round's windows (the worker's handling, called directly), then two to watch
    for _ in range(3 * max_samples):
        slower = 1.0 if params == initial else 1.25
        steps = []
        for _ in range(4):
            length = int(STEP_NS * slower * math.exp(rng.normal(0.0, 0.05)))
            steps.append(StepTotals(step, step * STEP_NS, step * STEP_NS + length, 10**6))
            step += 1
        controller._handle(_Sample(params, phase, steps))
        proposal, controller._proposal = controller._proposal, None
        if phase == PHASE_TUNE:  # (watch windows follow each other without a proposal)
            assert proposal is not None, "the tuner asked for no next window"
        if proposal is not None:
            params, phase = proposal
        if [s for s in seen if s[2] == PHASE_WATCH][1:]:
            break
    controller.close()
    rows = read_autotune_log(config.autotune_log)
    phases = [r.phase for r in rows]
    assert phases.count(PHASE_DECISION) == 1, phases
    ended = phases.index(PHASE_DECISION)
    assert set(phases[:ended]) == {PHASE_TUNE} and set(phases[ended + 1 :]) == {PHASE_WATCH}
    assert len(out.getvalue().splitlines()) == 1  # the round's line, said once
    # the listener (the timeline) saw every window the log has, the round's end on the
    # window that ended it
    windows = [r for r in rows if r.phase != PHASE_DECISION]
    assert [(f, last, p) for f, last, p, _ in seen] == [
        (r.first_step, r.last_step, r.phase) for r in windows
    ]
    assert "decision" in seen[ended - 1][3]
    assert all("decision" not in d for *_, d in seen[: ended - 1])


@pytest.mark.parametrize("opened", ["at_init", "by_the_job"])
def test_sample_in_hand_at_shutdown_reaches_the_timeline(opened: str, tmp_path: Path) -> None:
    """The worker holds its first sample until the runtime starts closing the tuner or the
    timeline, so the order is tested every run, not by chance."""
    tl, log = tmp_path / "tl", tmp_path / "autotune.csv"
    # at init the sink is the cycle's observer before the tuner; started by the job, after
    launcher_args = ["--autotune", "--autotune-log", str(log)]
    args: list[str] = []
    if opened == "at_init":
        launcher_args += ["--timeline", str(tl)]
    else:
        args += ["--start-timeline", str(tl)]
    job = run_job(
        "autotune_shutdown_worker.py",
        2,
        *args,
        env={"HVDPROF_AUTOTUNE_WARMUP_SAMPLES": "1", "HVDPROF_AUTOTUNE_STEPS_PER_SAMPLE": "3"},
        launcher_args=tuple(launcher_args),
    )
    job.assert_section("run", 2)
    job.assert_done(2)
    assert job.values(0, "INFO held") == ["1"], job.describe()
    rows = [r for r in read_autotune_log(log) if r.phase != PHASE_DECISION]
    samples = autotune_report(load_run(tl, cache=False)).samples
    assert rows, "the held sample was not logged"
    assert [(s.first_step, s.last_step, s.phase) for s in samples] == [
        (r.first_step, r.last_step, r.phase) for r in rows
    ], "the log's windows and the timeline's differ"
