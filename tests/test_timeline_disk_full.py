"""A full disk under the timeline: the job goes on, each rank says so in one line naming
the file and the error, no temporary manifest is left behind, and what was written
stays readable. Reproduced on a real 64 KiB tmpfs (mounting needs root)."""

from __future__ import annotations

import os
import subprocess

import pytest
from conftest import run_job

from hvdprof.analysis import load_run

pytestmark = pytest.mark.timeout(240)


@pytest.fixture
def tiny_disk(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    mount = tmp_path / "full"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True, timeout=30)


def test_a_full_disk_costs_the_trace_not_the_job(tiny_disk):
    timeline = tiny_disk / "tl"
    result = run_job(
        "divergence_worker.py", 2, "0", timeout=120, launcher_args=("--timeline", str(timeline))
    )
    result.assert_done(2)  # training went on
    said = {}
    for rank in (0, 1):
        err = result.text(rank, "stderr")
        assert "Traceback" not in err, err
        said[rank] = [line for line in err.splitlines() if "No space left on device" in line]
        assert len(said[rank]) <= 1, (rank, said[rank])  # once per rank, not per event
        assert all(str(timeline) in line for line in said[rank]), said[rank]
    assert any(said.values()), "nobody said the disk was full"
    assert [p.name for p in timeline.iterdir() if ".tmp" in p.name] == []
    run = load_run(str(timeline))  # what was written is readable
    assert len(run.slices) > 0
    assert sorted(run.manifests) == [0, 1]
    for rank, lines in said.items():
        if not lines:  # the disk filled after this rank had written everything
            assert run.complete[rank], (rank, run.problems)
