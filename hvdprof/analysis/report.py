"""``analyze``: every question over one run, with the verdicts in plain words first."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from hvdprof.analysis import registry
from hvdprof.analysis.result import Result, to_builtins
from hvdprof.trace.manifest import TRACE_RE
from hvdprof.trace.model import Problem, Run

#: version of the ``to_dict`` layout (``hvdprof analyze --json``; the published schema,
#: ``python -m hvdprof.analysis.schema``, carries the same number)
SCHEMA_VERSION = 1


@dataclass
class Report:
    """Every analysis of one run. Each analysis's answer is the attribute of its name
    (``report.breakdown``, ``report.stragglers``, ...: the registry's names), held in
    ``sections`` in the registry's order."""

    run: dict[str, Any]
    #: analysis name -> its answer as the report holds it (None: it could not look, as
    #: overlap without torch.profiler traces)
    sections: dict[str, Any] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)
    verdicts: list[str] = field(default_factory=list)

    def __getattr__(self, name: str) -> Any:
        sections = self.__dict__.get("sections")  # absent while unpickling
        if sections is not None and name in sections:
            return sections[name]
        raise AttributeError(f"'Report' object has no attribute {name!r}")

    @property
    def skipped(self) -> bool:
        """True when something could not be read (the CLI's exit code 1)."""
        return bool(self.problems)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "schema": SCHEMA_VERSION,
            "run": self.run,
            "verdicts": list(self.verdicts),
        }
        for analysis in registry.in_report():
            if analysis.name in self.sections:
                out[analysis.name] = _json(analysis, self.sections[analysis.name])
        out["problems"] = to_builtins(self.problems)
        return out


def _json(analysis: registry.Analysis, value: Any) -> Any:
    """An analysis's answer as the report's JSON holds it (its shape is
    :func:`hvdprof.analysis.schema.report_struct`'s field of that name)."""
    if value is None:
        return None
    if isinstance(value, list):
        return [_builtins(v) for v in value]
    data = _builtins(value)
    return data[analysis.report_key] if analysis.report_key else data


def _builtins(value: Any) -> Any:
    if not isinstance(value, Result) and hasattr(value, "to_dict"):
        return value.to_dict()  # a plugin's answer that is not a Struct
    return to_builtins(value)


def _incarnations_inside(path: str) -> list[str]:
    """Subfolders ``incarnation.<k>`` holding timelines: the later ``init()``s of the
    processes that wrote ``path`` (each incarnation records into its own)."""
    try:
        names = os.listdir(path)
    except OSError:
        return []
    found = []
    for name in names:
        m = re.fullmatch(r"incarnation\.(\d+)", name)
        sub = os.path.join(path, name)
        if m and any(TRACE_RE.match(f) for f in _listdir(sub)):
            found.append((int(m.group(1)), name))
    return [name for _, name in sorted(found)]


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def analyze(run: Run, *, kineto_paths: Sequence[str] = ()) -> Report:
    """All the analyses of ``run`` (and those over Kineto traces when they are given)."""
    entries = registry.in_report()
    results: dict[str, Any] = {}
    # each after the analyses it needs, which it is given by name
    for analysis in registry.computing_order(entries):
        needed = {name: results[name] for name in analysis.needs}
        if not analysis.kineto:
            results[analysis.name] = analysis.compute(run, **needed)
        elif kineto_paths:
            results[analysis.name] = analysis.compute(run, list(kineto_paths), **needed)
        else:
            results[analysis.name] = None
    problems = list(run.problems)
    for a in entries:  # what an analysis read itself (overlap's traces)
        problems += getattr(results[a.name], "problems", None) or []
    report = Report(
        run=run.summary(),
        sections={a.name: _held(a, results[a.name]) for a in entries},
        problems=problems,
    )
    # ordered by each analysis's verdict_order (sorted is stable: ties keep the registry's)
    said = sorted(
        ((a.verdict_order or 0, a.verdicts(results[a.name])) for a in entries),
        key=lambda item: item[0],
    )
    verdicts = [text for order, texts in said if order < registry.RUN_NOTES for text in texts]
    verdicts += _run_notes(run, report.problems)
    verdicts += [text for order, texts in said if order >= registry.RUN_NOTES for text in texts]
    report.verdicts = verdicts
    return report


def _held(analysis: registry.Analysis, result: Any) -> Any:
    if result is None or not analysis.report_attribute:
        return result
    return getattr(result, analysis.report_attribute)


def _run_notes(run: Run, problems: list[Problem]) -> list[str]:
    """What the run itself says: dropped events, unreadable input, its notes, no
    collectives, later runtimes recorded into subfolders."""
    verdicts: list[str] = []
    dropped = run.dropped_events
    if dropped:
        total = sum(dropped.values())
        written = sum(m.events_written for m in run.manifests.values())
        who = ", ".join(f"rank {r}: {n:,}" for r, n in sorted(dropped.items()))
        verdicts.append(
            f"The timeline is incomplete: {total:,} events were dropped while recording "
            f"({100.0 * total / max(1, total + written):.1f}% of them; {who}), so times "
            "and counts below undercount. Record again with the default "
            "HVDPROF_TIMELINE_WHEN_FULL=wait, or a larger HVDPROF_TIMELINE_QUEUE_SIZE."
        )
    if problems:
        verdicts.append(
            f"Some input could not be read ({len(problems)} problem(s)); the report "
            f"covers what was read: {problems[0]}"
            + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else "")
        )
    verdicts += run.notes
    if not len(run.slices):
        verdicts.append("No collective operations were found in this timeline.")
    later = _incarnations_inside(run.path) if os.path.isdir(run.path) else []
    if later:
        shown = ", ".join(later[:4]) + (f" ... {later[-1]}" if len(later) > 4 else "")
        verdicts.append(
            f"This is the first of {len(later) + 1} runtimes these processes started "
            f"(init() after shutdown()): the other {len(later)} recorded into subfolders "
            f"({shown}); analyze each by its path."
        )
    return verdicts
