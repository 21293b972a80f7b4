"""HVDPROF_CHECK_DIVERGENCE: a rank whose weights differ is reported at the step it
happened, on every rank, by parameter name, on the timeline, and as analyze's first
verdict; a run whose ranks agree reports nothing.

Ground truth is injected: rank 1 adds 1e-6 to one element of ``2.bias`` just before
``step()`` number 7 (the check runs in every ``step()`` with N=1).
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from conftest import run_job
from launch_support import mpi_or_skip, run_mpi

from hvdprof.analysis import analyze, load_run
from hvdprof.torch.divergence import checksum

pytestmark = pytest.mark.timeout(240)

CHECK = {"HVDPROF_CHECK_DIVERGENCE": "1"}


def _reported(text: str) -> list[str]:
    return [line for line in text.splitlines() if "ranks diverged" in line]


@pytest.mark.parametrize("launcher", ["hvdprof run", "mpirun"])
def test_a_perturbed_rank_is_reported_at_its_step_with_the_parameter(tmp_path, launcher):
    timeline = tmp_path / "tl"
    if launcher == "mpirun":
        mpi_or_skip()
        result = run_mpi(
            "divergence_worker.py", 2, "7",
            env={**CHECK, "HVDPROF_TIMELINE": str(timeline)}, timeout=120,
        )  # fmt: skip
    else:
        result = run_job(
            "divergence_worker.py", 2, "7", env=CHECK, timeout=120,
            launcher_args=("--timeline", str(timeline)),
        )  # fmt: skip
    result.assert_done(2)
    for rank in (0, 1):
        lines = _reported(result.text(rank, "stderr"))
        assert len(lines) == 1, (rank, result.describe())
        assert "at step 7" in lines[0] and "'2.bias'" in lines[0], lines[0]
        assert "rank(s) 1 differ" in lines[0], lines[0]
        # the weights differ; the averaged gradients of that step were still equal
        assert "averaged gradients" not in lines[0], lines[0]

    run = load_run(str(timeline))
    report = analyze(run)
    assert report.divergence.step == 7
    assert report.divergence.ranks == [1]
    assert report.divergence.weights == ["2.bias"]
    assert report.divergence.seen_by == [0, 1]
    assert report.verdicts[0].startswith("The ranks diverged at step 7"), report.verdicts

    cli = subprocess.run(
        [sys.executable, "-m", "hvdprof", "analyze", str(timeline)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    text = " ".join(cli.stdout.split())  # rich wraps the verdicts to the terminal
    assert (
        "1. The ranks diverged at step 7: rank(s) 1 differ from rank 0 in the weights of '2.bias'"
        in text
    ), cli.stdout


def test_ranks_that_agree_report_nothing(tmp_path):
    timeline = tmp_path / "tl"
    result = run_job(
        "divergence_worker.py", 2, "0", env=CHECK, timeout=120,
        launcher_args=("--timeline", str(timeline)),
    )  # fmt: skip
    result.assert_done(2)
    for rank in (0, 1):
        assert _reported(result.text(rank, "stderr")) == [], result.describe()
    report = analyze(load_run(str(timeline)))
    assert report.divergence.step is None
    assert not any("diverged" in v for v in report.verdicts)


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.bool]
)
def test_checksum_sees_one_flipped_bit_and_swapped_words(dtype):
    base = (torch.arange(1001) % 7).to(dtype)
    raw = base.clone().view(torch.uint8)
    for i in (0, 5, raw.numel() - 1):  # first, middle and the odd tail byte
        flipped = raw.clone()
        flipped[i] ^= 1
        assert checksum(flipped.view(dtype)) != checksum(base), (dtype, i)
    assert checksum(base.clone()) == checksum(base)
    if dtype == torch.float32:
        swapped = base.clone()
        swapped[[0, 1]] = swapped[[1, 0]] + 0  # two different words, within one 8-byte pair
        assert swapped[0] != swapped[1]
        assert checksum(swapped) != checksum(base)
