"""What every format's reader builds: the run's string tables and one file's columns.

Every reader (:mod:`hvdprof.trace.formats`) appends rows to a :class:`Columns` in the
layout of :data:`hvdprof.trace.model.SLICE_COLUMNS` and :data:`~hvdprof.trace.model.MARK_COLUMNS`,
with its strings coded through the :class:`Tables` the run's files share, so that the
loader assembles the files of any format alike.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hvdprof.trace.model import (
    MARK_COLUMNS,
    SLICE_COLUMNS,
    AutotuneSample,
    Notice,
    ParamsChange,
    StallRecord,
)


class Interner:
    """A string table: ``code(s)`` gives a stable small int for ``s``."""

    def __init__(self, items: list[str] | None = None) -> None:
        self.items: list[str] = []
        self.index: dict[str, int] = {}
        for item in items or ():
            self.code(item)

    def code(self, text: str) -> int:
        found = self.index.get(text)
        if found is None:
            found = self.index[text] = len(self.items)
            self.items.append(text)
        return found


class Tables:
    """The string tables shared by every file of a run (so codes agree across ranks)."""

    def __init__(self) -> None:
        self.tensors = Interner()
        self.names = Interner()
        self.backends = Interner()
        self.dtypes = Interner()


class Columns:
    """Rows parsed so far from one file, as numpy chunks plus the rows of the current block."""

    def __init__(self) -> None:
        self.slice_chunks: list[dict[str, np.ndarray]] = []
        self.mark_chunks: list[dict[str, np.ndarray]] = []
        self.rows = 0  # slice rows in the chunks
        self.samples: list[AutotuneSample] = []
        self.params: list[ParamsChange] = []
        self.notices: list[Notice] = []
        self.stalls: list[StallRecord] = []
        self.counters: dict[str, list[tuple[int, float, float]]] = {}

    def slices(self) -> dict[str, np.ndarray]:
        return _concat(self.slice_chunks, SLICE_COLUMNS)

    def marks(self) -> dict[str, np.ndarray]:
        return _concat(self.mark_chunks, MARK_COLUMNS)


def _concat(chunks: list[dict[str, np.ndarray]], spec: dict[str, Any]) -> dict[str, np.ndarray]:
    if not chunks:
        return {k: np.zeros(0, dt) for k, dt in spec.items()}
    if len(chunks) == 1:
        return dict(chunks[0])
    return {k: np.concatenate([c[k] for c in chunks]) for k in spec}
