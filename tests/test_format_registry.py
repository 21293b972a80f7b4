"""A trace format is one entry in the registry (:mod:`hvdprof.trace.formats`): a toy
format registered here, and nowhere else, is found and read by ``load_run``, listed and
loaded by the dashboard's catalog, and answered by ``analyze``; unregistered, the same
directory is no run at all. The format is the one-file plug-in
``tests/plugins/toy_csv_format.py`` (loaded through ``HVDPROF_FORMATS`` in
``tests/test_analysis_plugins.py``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from plugins.toy_csv_format import ToyCsvFormat, write_toy

from hvdprof.analysis import LoadError, analyze, load_run
from hvdprof.dashboard.catalog import RunCatalog
from hvdprof.trace import formats
from hvdprof.trace.model import OPS, PHASE_OP


@pytest.fixture
def toy_format() -> Iterator[ToyCsvFormat]:
    fmt = ToyCsvFormat()
    formats.register(fmt)
    try:
        yield fmt
    finally:
        formats.unregister(fmt.name)


@pytest.fixture
def toy_run(tmp_path: Path) -> Path:
    run = tmp_path / "toy"
    write_toy(run, 0, steps=3)
    write_toy(run, 1, steps=3, late_us=500.0)
    return run


def test_without_the_format_the_directory_is_no_run(toy_run: Path) -> None:
    assert "toy-csv" not in [f.name for f in formats.FORMATS]
    with pytest.raises(LoadError, match="no timeline files"):
        load_run(toy_run, cache=False)
    assert [e.id for e in RunCatalog(toy_run.parent).entries()] == []


def test_load_run_reads_a_registered_format(toy_format: ToyCsvFormat, toy_run: Path) -> None:
    run = load_run(toy_run)
    assert run.format == "toy-csv"
    assert run.ranks == [0, 1] and run.size == 2
    assert len(run.slices) == 12 and run.events == 12
    ops = run.slices.phase == PHASE_OP
    assert set(run.slices.op[ops].tolist()) == {OPS.index("ALLREDUCE")}
    assert run.files == {0: str(toy_run / "toy.0.csv"), 1: str(toy_run / "toy.1.csv")}
    assert run.problems == []
    assert not (toy_run / ".hvdprof-cache").exists()  # read whole: never cached
    # a single file of it, given by itself
    alone = load_run(toy_run / "toy.1.csv", cache=False)
    assert alone.format == "toy-csv" and alone.ranks == [1] and len(alone.slices) == 6


def test_a_growing_file_of_the_format_is_refreshed(toy_format: ToyCsvFormat, toy_run: Path) -> None:
    run = load_run(toy_run, cache=False)
    assert not run.refresh()
    with open(toy_run / "toy.0.csv", "a") as f:
        f.write("0,ALLREDUCE,30000.0,2000.0\nnot,a,row,here\n")
    assert run.refresh()
    assert len(run.slices) == 13
    assert [(p.where, p.reason) for p in run.problems] == [("line 9", "not a toy row")]


def test_the_catalog_lists_and_loads_it(toy_format: ToyCsvFormat, toy_run: Path) -> None:
    catalog = RunCatalog(toy_run.parent)
    entries = catalog.entries()
    assert [(e.id, e.kind) for e in entries] == [("toy", "directory")]
    assert [p.name for p in entries[0].files()] == ["toy.0.csv", "toy.1.csv"]
    loaded = catalog.loaded("toy")
    assert loaded.run.format == "toy-csv" and loaded.run.ranks == [0, 1]
    assert len(loaded.run.slices) == 12


def test_analyze_answers_it(toy_format: ToyCsvFormat, toy_run: Path) -> None:
    report = analyze(load_run(toy_run, cache=False))
    assert report.run["format"] == "toy-csv"
    assert report.run["slices"] == 12
    walls = {r.rank: r.wall_ms for r in report.breakdown.ranks}
    # each rank's wall time: its first op's start to its last op's end
    assert walls[0] == pytest.approx((20_000.0 + 2000.0 - 0.0) / 1000.0)
    assert walls[1] == pytest.approx((20_000.0 + 2000.0 - 500.0) / 1000.0)
    assert not report.problems


def test_registration_order_is_detection_order(toy_format: ToyCsvFormat) -> None:
    names = [f.name for f in formats.FORMATS]
    assert names[:3] == ["hvdprof", "kineto", "horovod"] and names[-1] == "toy-csv"
    formats.register(ToyCsvFormat(), before="kineto")  # replaces it, earlier
    assert [f.name for f in formats.FORMATS] == ["hvdprof", "toy-csv", "kineto", "horovod"]
