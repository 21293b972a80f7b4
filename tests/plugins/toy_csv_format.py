"""A toy trace format in one file: ``rank,name,start_us,dur_us`` rows, one CSV per rank.

Named in ``HVDPROF_FORMATS=plugins.toy_csv_format`` (with ``tests`` on ``PYTHONPATH``),
its runs are found and read by ``hvdprof analyze`` and listed by the dashboard, with no
other file naming it; ``tests/test_format_registry.py`` registers the same class in
process.
"""

from __future__ import annotations

import csv
import os
from pathlib import Path

import numpy as np

from hvdprof.trace.columns import Columns, Tables
from hvdprof.trace.files import Detection, FileRead, FoundFile
from hvdprof.trace.model import SLICE_COLUMNS, Problem, Run, classify

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


FORMAT = ToyCsvFormat()
