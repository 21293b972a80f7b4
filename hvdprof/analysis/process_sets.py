"""Process sets in a recorded run: which sets there were, and each one's straggler.

An op of a process set other than the global one is read as its own tensor
(``grad@set1``, see ``hvdprof_format.set_tensor``), so the job-wide analyses never mix it
with another set's op of the same name. Its waits mean something only among the set's
members: a rank outside a set never waits for it and is never its straggler. So each
set is judged on a run cut down to its members and its own ops, with the members
numbered from 0 as the set numbers them, and the answer is told in the job's ranks.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np

from hvdprof.analysis.registry import Analysis
from hvdprof.analysis.result import Result
from hvdprof.analysis.stragglers import Stragglers, find_stragglers
from hvdprof.trace.model import MarkTable, Run, SliceTable

_SET_SUFFIX = re.compile(r"@set(\d+)$")
_RANKS_TEXT = re.compile(r"\b([Rr]anks?) ((?:\d+(?:, | and ))*\d+)")


class SetStragglers(Result):
    """One process set's straggler answer, in the job's rank numbers."""

    process_set: int
    members: list[int]
    stragglers: Stragglers


def set_of_tensor(name: str) -> int:
    """The process set a tensor name belongs to (0: the global set)."""
    m = _SET_SUFFIX.search(name)
    return int(m.group(1)) if m else 0


def process_sets(run: Run) -> dict[int, list[int]]:
    """Each process set other than the global one seen in ``run``: id -> member ranks
    (the ranks whose timelines hold its ops)."""
    s = run.slices
    if not len(s):
        return {}
    ids = np.array([set_of_tensor(t) for t in run.tensors] or [0], dtype=np.int64)
    on_tensor = s.tensor >= 0
    set_of_row = np.zeros(len(s), dtype=np.int64)
    set_of_row[on_tensor] = ids[s.tensor[on_tensor]]
    out: dict[int, list[int]] = {}
    for set_id in np.unique(set_of_row[set_of_row > 0]).tolist():
        out[int(set_id)] = sorted(np.unique(s.rank[set_of_row == set_id]).tolist())
    return out


def set_run(run: Run, set_id: int, members: list[int]) -> Run:
    """``run`` cut to ``members`` and the set's own ops, members renumbered 0..k-1."""
    s, m = run.slices, run.marks
    in_set = np.array([set_of_tensor(t) == set_id for t in run.tensors] or [False])
    local = np.full(max(run.size, max(members) + 1, int(s.rank.max(initial=0)) + 1), -1)
    local[members] = np.arange(len(members))
    on_tensor = s.tensor >= 0
    keep = np.isin(s.rank, members) & on_tensor
    keep[on_tensor] &= in_set[s.tensor[on_tensor]]
    new_row = np.cumsum(keep) - 1
    slices = s.take(np.flatnonzero(keep))
    assert isinstance(slices, SliceTable)
    slices.rank = local[slices.rank].astype(slices.rank.dtype)
    mk = (m.slice >= 0) & np.isin(m.observer, members) & np.isin(m.ready_rank, members)
    mk[mk] &= keep[m.slice[mk]]
    marks = m.take(np.flatnonzero(mk))
    assert isinstance(marks, MarkTable)
    marks.slice = new_row[marks.slice]
    marks.observer = local[marks.observer].astype(marks.observer.dtype)
    marks.ready_rank = local[marks.ready_rank].astype(marks.ready_rank.dtype)

    def renumber(d: dict[int, object]) -> dict[int, object]:
        return {int(local[r]): v for r, v in d.items() if r in members}

    return dataclasses.replace(
        run,
        ranks=list(range(len(members))),
        hosts=renumber(run.hosts),  # type: ignore[arg-type]
        manifests=renumber(run.manifests),  # type: ignore[arg-type]
        complete=renumber(run.complete),  # type: ignore[arg-type]
        files=renumber(run.files),  # type: ignore[arg-type]
        size=len(members),
        slices=slices,
        marks=marks,
        counters={},
        gpu={},
        _loader=None,
    )


class ProcessSetReport(Result):
    """The run's process sets (other than the global one) and each one's straggler."""

    sets: list[SetStragglers]
    verdict: str = ""


def process_set_report(run: Run) -> ProcessSetReport:
    """What the page's process-set filter shows: each set's members and straggler."""
    sets = set_stragglers(run)
    verdict = " ".join(
        f"Process set {s.process_set} (ranks {', '.join(map(str, s.members))}): "
        f"{s.stragglers.verdict}"
        for s in sets
    )
    return ProcessSetReport(sets, verdict)


def set_stragglers(run: Run) -> list[SetStragglers]:
    """Each process set's straggler verdict, judged among its members alone."""
    out = []
    for set_id, members in process_sets(run).items():
        if len(members) < 2:
            continue
        found = find_stragglers(set_run(run, set_id, members))
        out.append(SetStragglers(set_id, members, _in_job_ranks(found, members)))
    return out


def _in_job_ranks(found: Stragglers, members: list[int]) -> Stragglers:
    """Tell a set's answer (its members numbered 0..k-1) in the job's rank numbers."""

    def job(r: int | None) -> int | None:
        return members[r] if r is not None and 0 <= r < len(members) else r

    for x in found.ranks:
        x.rank = members[x.rank]
    if found.straggler is not None:
        found.straggler = job(found.straggler)
    found.culprits = [members[r] for r in found.culprits]
    if found.most_often_last is not None:
        found.most_often_last = job(found.most_often_last)
    for table in (found.per_step, found.per_op):
        if table and "last_rank" in table:
            table["last_rank"] = [job(r) if r >= 0 else r for r in table["last_rank"]]

    def relabel(m: re.Match[str]) -> str:
        numbers = re.sub(r"\d+", lambda n: str(job(int(n.group(0)))), m.group(2))
        return f"{m.group(1)} {numbers}"

    found.verdict = _RANKS_TEXT.sub(relabel, found.verdict)
    return found


def _said(p: ProcessSetReport) -> list[str]:
    """One sentence per set, in the job's rank numbers."""
    return [
        f"Process set {s.process_set} (ranks {', '.join(str(r) for r in s.members)}): "
        f"{s.stragglers.verdict}"
        for s in p.sets
    ]


ANALYSIS = Analysis(
    "process_sets", process_set_report, ProcessSetReport,
    "Process sets: each one's members, and its straggler judged among them",
    verdict_order=20, verdicts=_said, report_attribute="sets",
)  # fmt: skip
