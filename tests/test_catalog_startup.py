"""The dashboard's start-up path: the first run starts parsing (in worker processes)
before the web stack is imported, and what it reads is exactly what a plain load reads,
including what could not be read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from synthetic_runs import SyntheticSpec, write_synthetic_run

from hvdprof.analysis import load_run
from hvdprof.trace import loader as loader_mod

pytest.importorskip("fastapi")

from dashboard_support import dashboard_server, get

from hvdprof.dashboard.catalog import RunCatalog, RunLoadError


def synth(directory: Path, ranks: int = 3) -> Path:
    write_synthetic_run(
        str(directory), SyntheticSpec(ranks=ranks, steps=4, late_rank=ranks - 1, late_us=800.0)
    )
    return directory


def test_start_reading_in_workers_equals_a_plain_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    d = synth(tmp_path / "run")
    path = d / "rank.1.json"
    path.write_bytes(path.read_bytes()[:-200])  # rank 1 cut mid-line, as a crash leaves it
    monkeypatch.setattr(loader_mod, "PARALLEL_MIN_BYTES", 0)  # parse in worker processes
    catalog = RunCatalog(tmp_path)
    run_id = catalog.start_reading()
    assert run_id == "run"
    loaded = catalog.loaded(run_id)
    reference = load_run(d, cache=False)
    run = loaded.run
    assert len(run.slices) == len(reference.slices) and run.events == reference.events
    assert run.complete == reference.complete == {0: True, 1: False, 2: True}
    assert sorted(map(str, run.problems)) == sorted(map(str, reference.problems))
    assert any("incomplete last event" in p.reason for p in run.problems)
    # the workers wrote the cache, the cut file's included (with where its parse stopped)
    assert sorted(p.name for p in (d / ".hvdprof-cache").iterdir()) == [
        "rank.0.json.npz",
        "rank.1.json.npz",
        "rank.2.json.npz",
    ]


def test_start_reading_an_unreadable_file_keeps_its_problem(tmp_path: Path) -> None:
    d = tmp_path / "run"
    d.mkdir()
    (d / "rank.0.json").write_bytes(b"not json at all\n")
    catalog = RunCatalog(tmp_path)
    assert catalog.start_reading() == "run"
    run = catalog.loaded("run").run
    assert run.events == 0 and len(run.slices) == 0
    where = [(Path(p.file).name, p.where) for p in run.problems]
    assert where[0] == ("rank.0.json", "line 1"), where
    assert "not a JSON array" in run.problems[0].reason


def test_start_reading_nothing_there_is_reported_on_request(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "manifest.rank.0.json").write_text("{}")  # a run with no trace yet
    catalog = RunCatalog(tmp_path)
    assert catalog.start_reading() is None  # nothing to start; the error comes on request
    with pytest.raises(RunLoadError, match="no timeline files"):
        catalog.loaded("run")


@pytest.mark.timeout(120)
def test_dashboard_command_answers_the_first_timeline_and_caches(tmp_path: Path) -> None:
    d = synth(tmp_path / "run", ranks=2)
    with dashboard_server(d) as base:
        status, body = get(base + "api/timeline?run=.", timeout=60)
        assert status == 200
        data = json.loads(body)["data"]
        assert [row["rank"] for row in data["rows"]] == [0, 1]
        assert data["total"] > 0
    assert sorted(p.name for p in (d / ".hvdprof-cache").iterdir()) == [
        "rank.0.json.npz",
        "rank.1.json.npz",
    ]
    with dashboard_server(d) as base:  # warm: from the cache, the same answer
        status, again = get(base + "api/timeline?run=.", timeout=60)
        assert status == 200 and json.loads(again)["data"] == data
