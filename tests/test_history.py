"""``hvdprof history``: lasting shifts in a series of nightly summaries, and their causes.

E-divisive means on known series (one shift, two shifts, none, one outlier), then 30
nightly summaries written by ``hvdprof analyze --summary`` from timelines with a known
truth: nightly noise of 2%, one night 30% slower on every rank (a noisy neighbour), and
from run 17 on rank 1's own work 2 ms (10% of the step) longer. ``hvdprof history`` must
name run 17 (+-1) and rank 1's compute, and not the outlier.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from schema_support import assert_valid_output
from synthetic_runs import SyntheticSpec, write_synthetic_run

from hvdprof.analysis import load_run
from hvdprof.analysis.history import e_divisive
from hvdprof.analysis.summary import summarize, write_summary

REPO = Path(__file__).resolve().parent.parent


def test_one_shift_is_found_where_it_is() -> None:
    rng = np.random.default_rng(5)
    x = np.r_[rng.normal(0.0, 0.02, 16), rng.normal(0.1, 0.02, 14)]
    points = e_divisive(x)
    assert [p.index for p in points] == [16] and points[0].p_value <= 0.05


def test_two_shifts_and_a_flat_series() -> None:
    rng = np.random.default_rng(6)
    x = np.r_[rng.normal(0, 0.02, 12), rng.normal(0.1, 0.02, 12), rng.normal(0.02, 0.02, 12)]
    assert [p.index for p in e_divisive(x)] == [12, 24]
    assert e_divisive(np.full(30, 0.5)) == []  # a flat series


def test_noise_alone_rarely_makes_a_shift() -> None:
    false = sum(
        bool(e_divisive(np.random.default_rng(200 + s).normal(0, 0.02, 30), permutations=99))
        for s in range(40)
    )
    assert false <= 4  # 5% per series, and a little room


def test_a_single_outlier_is_not_a_shift() -> None:
    rng = np.random.default_rng(7)
    x = rng.normal(0.0, 0.02, 30)
    x[8] += 0.3
    assert e_divisive(x) == []
    x[20:] += 0.1
    assert [p.index for p in e_divisive(x)] in ([20], [19], [21])


def _nightly(directory: Path, night: int, rng: np.random.Generator) -> Path:
    """Night ``night`` (1-based): 20 ms steps with 2% noise between nights; night 8 is
    30% slower on every rank; from night 17 rank 1's own work is 2 ms longer."""
    step = 20_000.0 * (1.0 + 0.02 * rng.standard_normal())
    late = {}
    if night == 8:
        step *= 1.3
    if night >= 17:
        step += 2_000.0
        late = {"late_rank": 1, "late_us": 2_000.0}
    run = directory / f"night-{night:02d}"
    write_synthetic_run(
        str(run), SyntheticSpec(ranks=2, steps=20, step_us=step, waited=True, **late)
    )
    out = directory / f"night-{night:02d}.summary.json"
    write_summary(summarize(load_run(str(run), cache=False)), str(out))
    return out


@pytest.fixture(scope="module")
def nightly(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    base = tmp_path_factory.mktemp("nightly")
    rng = np.random.default_rng(17)
    return [_nightly(base, night, rng) for night in range(1, 31)]


def history(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HVDPROF_")}
    return subprocess.run(
        [sys.executable, "-m", "hvdprof", "history", *args],
        capture_output=True, text=True, timeout=120, env=env, stdin=subprocess.DEVNULL,
    )  # fmt: skip


def test_thirty_nights_name_run_17_and_its_cause_not_the_outlier(nightly: list[Path]) -> None:
    done = history(*map(str, nightly), "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert_valid_output("history", data)
    assert len(data["runs"]) == 30
    shifts = data["shifts"]
    assert len(shifts) == 1, data["verdict"]
    s = shifts[0]
    assert 16 <= s["index"] + 1 <= 18 and s["name"].startswith("night-1")
    assert s["cause"] == "rank 1: compute" and s["change"] > 0.05
    text = history(*map(str, nightly))
    assert text.returncode == 0
    assert text.stdout.startswith(f"Run {s['index'] + 1} ({s['name']}) starts a shift")
    assert "Cause: rank 1: compute" in text.stdout and "night-08" not in text.stdout


def test_bad_input_is_one_line_and_exit_2(nightly: list[Path], tmp_path: Path) -> None:
    done = history(*map(str, nightly[:4]))
    assert done.returncode == 2 and "needs at least 6" in done.stderr
    broken = tmp_path / "broken.json"
    broken.write_bytes(nightly[0].read_bytes()[:200])
    done = history(*map(str, nightly[:8]), str(broken))
    assert done.returncode == 2 and "broken.json" in done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1
    done = history(*map(str, nightly[:8]), str(REPO / "README.md"))
    assert done.returncode == 2 and "README.md: not a summary" in done.stderr
