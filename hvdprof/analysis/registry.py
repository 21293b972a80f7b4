"""The analyses, each declared once: its name, function, result, summary, verdicts, table.

Everything that lists the analyses is made from this list: ``analyze()`` and its
``Report`` (``analyze --json``), the order of the verdicts, the package's exports,
the dashboard's ``/api/analysis/<name>`` routes and the terminal's numbered tables. Adding
an analysis is one entry here (and, for the page in ``web/``, its renderer).

Functions, result types and table printers are named ``"module:attribute"`` and imported
on first use: ``import hvdprof.analysis`` must not load numpy and every analysis, since
``hvdprof run`` registers the ``analyze`` command and would pay for them at start-up. An
analysis registered at run time (a plugin, a test) may give the objects themselves.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

#: A function, type or printer: ``"package.module:attribute"``, or the object itself.
Ref = str | Callable[..., Any]

#: Where the run's own notes (dropped events, unreadable input, no collectives, later
#: runtimes) go among the verdicts: analyses ordered below it come before them.
RUN_NOTES = 0

#: ``/api/analysis/report``: every analysis at once (the report, not an analysis itself).
REPORT_NAME = "report"
REPORT_FUNCTION = "hvdprof.analysis.report:analyze"
REPORT_SUMMARY = "Every analysis at once, with the verdict sentences"

#: Names a ``Report`` or its JSON already uses for something else.
_RESERVED = {REPORT_NAME, "run", "sections", "problems", "verdicts", "schema", "skipped"}


def said(result: Any) -> list[str]:
    """A result's verdict sentences: its ``verdicts`` list, else its ``verdict`` if any."""
    if result is None:
        return []
    many = getattr(result, "verdicts", None)
    if many is not None:
        return list(many)
    one = getattr(result, "verdict", None)
    return [one] if one else []


@dataclass(frozen=True)
class Analysis:
    """One question the library answers, and how each front end shows it."""

    #: the key in ``analyze --json``, the ``Report`` attribute and ``/api/analysis/<name>``
    name: str
    #: a plain function over a ``Run`` (``function(run, kineto_paths)`` with ``kineto``)
    function: Ref
    #: the type it returns: a :class:`hvdprof.analysis.result.Result` (a ``msgspec.Struct``:
    #: its fields are its JSON, its ``/openapi.json`` model and its part of the published
    #: schema); a plugin may return another class with ``to_dict()``
    result: Ref
    #: one line: the API's summary
    summary: str
    #: its place among the verdicts (below ``RUN_NOTES``: before the run's own notes;
    #: ties keep the registry's order); None: not in ``analyze``'s report
    verdict_order: int | None = None
    #: its verdict sentences, from its result
    verdicts: Callable[[Any], list[str]] = said
    #: ``printer(console, number, value, run_summary)``: its table(s) in ``analyze``, numbered
    #: by their place among the analyses with a table; None: no table
    table: Ref | None = None
    #: takes the torch.profiler traces given with ``analyze --kineto`` (None without them);
    #: such an analysis has no dashboard route, whose runs carry no such list
    kineto: bool = False
    #: an API route of its own under ``/api/analysis/``
    route: bool = True
    #: the report holds this attribute of the result instead of the result (process sets:
    #: the list of sets, as the report always held it)
    report_attribute: str = ""
    #: the report's JSON holds this key of ``to_dict()`` instead of all of it (stalls: the
    #: list, as ``analyze --json`` always wrote it); a field's name, for the schema
    report_key: str = ""

    @property
    def in_report(self) -> bool:
        return self.verdict_order is not None

    def compute(self, run: Any, *args: Any) -> Any:
        return resolve(self.function)(run, *args)

    def print_table(self, console: Any, number: int, value: Any, run: dict[str, Any]) -> None:
        if self.table is not None:
            resolve(self.table)(console, number, value, run)


def resolve(ref: Ref) -> Any:
    """The object ``ref`` names (its module imported now, on first use)."""
    if not isinstance(ref, str):
        return ref
    module, _, attribute = ref.partition(":")
    return getattr(importlib.import_module(module), attribute)


def qualified(ref: Ref) -> str:
    """``hvdprof.analysis.breakdown.time_breakdown``, without importing it."""
    if isinstance(ref, str):
        return ref.replace(":", ".")
    return f"{getattr(ref, '__module__', '?')}.{getattr(ref, '__qualname__', repr(ref))}"


def short_name(ref: Ref) -> str:
    """``time_breakdown``: the name the package exports it under."""
    if isinstance(ref, str):
        return ref.partition(":")[2]
    return str(getattr(ref, "__name__", ref))


_REGISTERED: dict[str, Analysis] = {}


def register(analysis: Analysis) -> Analysis:
    """Add ``analysis`` after the others; a name already taken is refused."""
    if not analysis.name.isidentifier() or analysis.name in _RESERVED:
        raise ValueError(f"analysis name {analysis.name!r}: not an identifier, or reserved")
    if analysis.name in _REGISTERED:
        raise ValueError(f"an analysis named {analysis.name!r} is already registered")
    _REGISTERED[analysis.name] = analysis
    return analysis


def unregister(name: str) -> None:
    _REGISTERED.pop(name, None)


def analyses() -> list[Analysis]:
    """Every analysis, in the registry's order (the JSON's keys, the tables' numbers)."""
    return list(_REGISTERED.values())


def get(name: str) -> Analysis:
    return _REGISTERED[name]


def in_report() -> list[Analysis]:
    return [a for a in _REGISTERED.values() if a.in_report]


def exports() -> dict[str, str]:
    """Exported name -> module, for every function and result type named by path."""
    out: dict[str, str] = {}
    for a in _REGISTERED.values():
        for ref in (a.function, a.result):
            if isinstance(ref, str):
                out[short_name(ref)] = ref.partition(":")[0]
    return out


def function_names() -> list[str]:
    """The analysis functions' names (what no front end may name: they loop over this)."""
    return [short_name(a.function) for a in _REGISTERED.values()]


def _breakdown_said(b: Any) -> list[str]:
    return [text for text in (b.verdict, b.user.verdict) if text]


def _process_sets_said(p: Any) -> list[str]:
    """One sentence per set, in the job's rank numbers."""
    return [
        f"Process set {s.process_set} (ranks {', '.join(str(r) for r in s.members)}): "
        f"{s.stragglers.verdict}"
        for s in p.sets
    ]


def _builtin() -> Iterator[Analysis]:
    m = "hvdprof.analysis"
    yield Analysis(
        "breakdown", f"{m}.breakdown:time_breakdown", f"{m}.breakdown:Breakdown",
        "Time per phase per rank",
        verdict_order=30, verdicts=_breakdown_said, table=f"{m}.tables:breakdown_table",
    )  # fmt: skip
    yield Analysis(
        "stragglers", f"{m}.stragglers:find_stragglers", f"{m}.stragglers:Stragglers",
        "Who made the others wait: negotiation wait per rank and step",
        verdict_order=10, table=f"{m}.tables:straggler_table",
    )  # fmt: skip
    yield Analysis(
        "fusion", f"{m}.fusion:fusion_report", f"{m}.fusion:FusionReport",
        "Tensors per fused op and buffer fill",
        verdict_order=40, table=f"{m}.tables:fusion_table",
    )  # fmt: skip
    yield Analysis(
        "bandwidth", f"{m}.bandwidth:bandwidth_report", f"{m}.bandwidth:BandwidthReport",
        "Bus bandwidth by message size",
        verdict_order=50, table=f"{m}.tables:bandwidth_table",
    )  # fmt: skip
    yield Analysis(
        "overlap", f"{m}.overlap:overlap_report", f"{m}.overlap:OverlapReport",
        "Communication overlapped by backward compute (given torch.profiler traces)",
        verdict_order=60, table=f"{m}.tables:overlap_table", kineto=True, route=False,
    )  # fmt: skip
    yield Analysis(
        "autotune", f"{m}.autotune:autotune_report", f"{m}.autotune:AutotuneReport",
        "Autotune samples: parameters, score, time window",
        verdict_order=70, table=f"{m}.tables:autotune_table",
    )  # fmt: skip
    yield Analysis(
        "gpu", f"{m}.device:gpu_report", f"{m}.device:GpuReport",
        "GPU per rank (torch.profiler traces): HTA's idle, compute, non-compute and overlap "
        "shares, the rank that stands out, kernel time per name, memcpy bandwidth",
        verdict_order=80, table=f"{m}.tables:gpu_tables",
    )  # fmt: skip
    # what someone whose job hung, or whose ranks diverged, wants to know first
    yield Analysis(
        "stalls", f"{m}.stalls:stall_report", f"{m}.stalls:StallReport",
        "Stalls: which rank kept the job waiting, how long, and where",
        verdict_order=-20, table=f"{m}.tables:stall_table", report_key="stalls",
    )  # fmt: skip
    yield Analysis(
        "divergence", f"{m}.divergence:divergence_report", f"{m}.divergence:DivergenceReport",
        "Divergence: the first step at which the ranks' weights or gradients differed",
        verdict_order=-10, table=f"{m}.tables:divergence_table",
    )  # fmt: skip
    yield Analysis(
        "process_sets", f"{m}.process_sets:process_set_report",
        f"{m}.process_sets:ProcessSetReport",
        "Process sets: each one's members, and its straggler judged among them",
        verdict_order=20, verdicts=_process_sets_said, report_attribute="sets",
    )  # fmt: skip
    yield Analysis(
        "surrogate", f"{m}.surrogate:autotune_surface", f"{m}.surrogate:SurrogateSurface",
        "The autotuner's view over fusion threshold x cycle time",
    )  # fmt: skip


for _analysis in _builtin():
    register(_analysis)
