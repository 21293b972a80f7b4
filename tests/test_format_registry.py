"""A trace format is one entry in the registry (:mod:`hvdprof.trace.formats`): a toy
format registered here, and nowhere else, is found and read by ``load_run``, listed and
loaded by the dashboard's catalog, and answered by ``analyze``; unregistered, the same
directory is no run at all."""

from __future__ import annotations

import csv
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from hvdprof.analysis import LoadError, analyze, load_run
from hvdprof.dashboard.catalog import RunCatalog
from hvdprof.trace import formats
from hvdprof.trace.columns import Columns, Tables
from hvdprof.trace.formats import Detection, FileRead, FoundFile
from hvdprof.trace.model import OPS, PHASE_OP, SLICE_COLUMNS, Problem, Run, classify

HEADER = "rank,name,start_us,dur_us"


class ToyCsvFormat:
    """``rank,name,start_us,dur_us`` rows, one file per rank (``*.csv``)."""

    name = "toy-csv"
    incremental = False
    last_resort = False

    @staticmethod
    def _is_toy(path: str) -> bool:
        if not path.endswith(".csv") or not os.path.isfile(path):
            return False
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.readline().strip() == HEADER

    def detect_dir(self, directory: str, names: list[str]) -> Detection:
        paths = [os.path.join(directory, n) for n in names]
        toys = [p for p in paths if self._is_toy(p)]
        return Detection(self.name, [FoundFile(p, i) for i, p in enumerate(toys)])

    def holds_run(self, directory: Path, entries: list[Path]) -> bool:
        return any(self._is_toy(str(p)) for p in entries)

    def part_of_run(self, path: Path) -> bool:
        return self._is_toy(str(path))

    def detect_file(self, path: str) -> Detection | None:
        return Detection(self.name, [FoundFile(path, 0)]) if self._is_toy(path) else None

    def read(self, path: str, rank: int, tables: Tables, files_in_run: int) -> FileRead:
        problems: list[Problem] = []
        rows = []
        with open(path, encoding="utf-8") as f:
            for line, row in enumerate(csv.DictReader(f), start=2):
                try:
                    rows.append((int(row["rank"]), row["name"], float(row["start_us"]),
                                 float(row["dur_us"])))  # fmt: skip
                except (TypeError, ValueError):
                    problems.append(Problem(path, f"line {line}", "not a toy row"))
        seen: dict[tuple[int, str], int] = {}
        occurrence = []
        for r, n, _, _ in rows:
            occurrence.append(seen.get((r, n), 0))
            seen[(r, n)] = occurrence[-1] + 1
        n = len(rows)
        chunk = {k: np.full(n, -1, dt) for k, dt in SLICE_COLUMNS.items()}
        chunk["group_tensors"][:] = 0
        chunk["rank"] = np.array([r for r, _, _, _ in rows], np.int32)
        chunk["name"] = np.array([tables.names.code(x) for _, x, _, _ in rows], np.int32)
        chunk["phase"] = np.array([classify(x)[0] for _, x, _, _ in rows], np.int8)
        chunk["op"] = np.array([classify(x)[1] for _, x, _, _ in rows], np.int8)
        chunk["start_us"] = np.array([s for _, _, s, _ in rows], np.float64)
        chunk["dur_us"] = np.array([d for _, _, _, d in rows], np.float64)
        chunk["occurrence"] = np.array(occurrence, np.int32)
        cols = Columns()
        cols.slice_chunks.append(chunk)
        cols.rows = n
        ranks = {r for r, _, _, _ in rows} or {rank}
        return FileRead(cols, problems, True, n, min(ranks), ranks)

    def finish_run(self, run: Run, reads: list[FileRead], tables: Tables) -> None:
        return None


def write_toy(directory: Path, rank: int, steps: int, late_us: float = 0.0) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"toy.{rank}.csv"
    lines = [HEADER]
    for step in range(steps):
        t = step * 10_000.0
        lines.append(f"{rank},ALLREDUCE,{t + late_us},{2000.0 - late_us}")
        lines.append(f"{rank},MPI_ALLREDUCE,{t + 1000.0},1000.0")
    path.write_text("\n".join(lines) + "\n")
    return path


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
