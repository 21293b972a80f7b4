"""The analyses: each declared once, in its own module, and found here on first use.

Every analysis module ends with ``ANALYSIS = Analysis(...)``: its name, function, result
type, summary, place among the verdicts, verdict sentences, table printer (a function in
the same module) and the analyses whose answers it takes (``needs``). Everything that
lists the analyses is made from what is found here: ``analyze()`` and its ``Report``
(``analyze --json``), the order of the verdicts, the package's exports, the dashboard's
``/api/analysis/<name>`` routes (and the page's sections: one without a drawer of its own
in ``web/app.js`` is drawn from its typed result), and the terminal's numbered tables.

The built-in modules are :data:`BUILTIN_MODULES`, in the order of the report's keys and
the tables' numbers; plug-ins (:mod:`hvdprof.common.plugins`: entry points of the group
``hvdprof.analyses``, then the modules in ``HVDPROF_ANALYSES``) follow, then analyses
given to :func:`register` at run time. Adding an analysis is one new module. Nothing is
imported until the list is first asked for: ``import hvdprof.analysis`` must not load
numpy and every analysis, since ``hvdprof run`` registers the ``analyze`` command and
would pay for them at start-up.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
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
    #: the analyses whose answers this one takes, by name: ``analyze()`` computes them
    #: first and passes each to the function as the keyword argument of its name (the
    #: straggler answer defers to ``process_sets`` when every collective it could judge
    #: ran in a process set). The function must also answer without them: a route of its
    #: own calls it on the run alone
    needs: tuple[str, ...] = ()

    @property
    def in_report(self) -> bool:
        return self.verdict_order is not None

    def compute(self, run: Any, *args: Any, **needed: Any) -> Any:
        return resolve(self.function)(run, *args, **needed)

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


def module_of(ref: Ref) -> str:
    """The module that defines ``ref``, without importing it."""
    if isinstance(ref, str):
        return ref.partition(":")[0]
    return str(getattr(ref, "__module__", ""))


#: The built-in analyses' modules, each declaring ``ANALYSIS``: their order is the report's
#: keys and the tables' numbers (the first seven keep the numbers 1-7 they always had).
BUILTIN_MODULES: tuple[str, ...] = tuple(
    f"hvdprof.analysis.{name}"
    for name in (
        "breakdown", "stragglers", "fusion", "bandwidth", "overlap", "autotune", "device",
        # what someone whose job hung, or whose ranks diverged, wants to know first
        # (their verdict_order puts them there; their tables come after)
        "stalls", "divergence",
        "process_sets", "surrogate",
    )
)  # fmt: skip
#: The entry-point group of installed plug-ins (``[project.entry-points."hvdprof.analyses"]``).
PLUGIN_GROUP = "hvdprof.analyses"
#: The module attribute a built-in or plug-in module declares its analysis in.
DECLARED = "ANALYSIS"

_REGISTERED: dict[str, Analysis] = {}
_found = False


def _find() -> None:
    """Register the built-in modules' analyses, then the plug-ins', once, on first use."""
    global _found
    if _found:
        return
    _found = True  # first: a module that calls register() while imported comes here again
    for name in BUILTIN_MODULES:
        _add(_declared_in(name))
    from hvdprof.common import plugins

    found = plugins.load(PLUGIN_GROUP, "analysis_plugins", DECLARED)
    for where, analysis in found:
        if not isinstance(analysis, Analysis):
            raise plugins.PluginError(
                f"{where}: {DECLARED} is a {type(analysis).__name__}, not an "
                "hvdprof.analysis.registry.Analysis"
            )
        try:
            _add(analysis)
        except ValueError as exc:
            raise plugins.PluginError(f"{where}: {exc}") from None
    for where, analysis in found:  # once all are in: a plug-in may need a later one
        try:
            computing_order([analysis])
        except ValueError as exc:
            raise plugins.PluginError(f"{where}: {exc}") from None


def _declared_in(module: str) -> Analysis:
    analysis = getattr(importlib.import_module(module), DECLARED)
    assert isinstance(analysis, Analysis), module
    return analysis


def _add(analysis: Analysis) -> Analysis:
    if not analysis.name.isidentifier() or analysis.name in _RESERVED:
        raise ValueError(f"analysis name {analysis.name!r}: not an identifier, or reserved")
    if analysis.name in _REGISTERED:
        raise ValueError(f"an analysis named {analysis.name!r} is already registered")
    _REGISTERED[analysis.name] = analysis
    return analysis


def register(analysis: Analysis) -> Analysis:
    """Add ``analysis`` after the others (a test's, a program's own); a name already
    taken, or a need no analysis answers, is refused. A plug-in module declares
    ``ANALYSIS`` instead."""
    _find()
    _add(analysis)
    try:
        computing_order([analysis])
    except ValueError:
        del _REGISTERED[analysis.name]
        raise
    return analysis


def unregister(name: str) -> None:
    _find()
    _REGISTERED.pop(name, None)


def analyses() -> list[Analysis]:
    """Every analysis, in the registry's order (the JSON's keys, the tables' numbers)."""
    _find()
    return list(_REGISTERED.values())


def get(name: str) -> Analysis:
    _find()
    return _REGISTERED[name]


def in_report() -> list[Analysis]:
    return [a for a in analyses() if a.in_report]


def computing_order(chosen: list[Analysis]) -> list[Analysis]:
    """``chosen`` and every analysis they need, each after the ones it needs and otherwise
    in the order given: the order ``analyze()`` computes them in (the report's keys and
    the tables keep the registry's order)."""
    placed: dict[str, Analysis] = {}

    def place(analysis: Analysis, path: tuple[str, ...]) -> None:
        if analysis.name in placed:
            return
        if analysis.name in path:
            cycle = " -> ".join((*path[path.index(analysis.name) :], analysis.name))
            raise ValueError(f"analyses that need each other: {cycle}")
        for name in analysis.needs:
            need = _REGISTERED.get(name)
            if need is None:
                raise ValueError(
                    f"analysis {analysis.name!r} needs {name!r}, which no analysis is named"
                )
            place(need, (*path, analysis.name))
        placed[analysis.name] = analysis

    for analysis in chosen:
        place(analysis, ())
    return list(placed.values())


def exports() -> dict[str, str]:
    """Exported name -> module, for the built-in analyses' functions and result types
    (``hvdprof.analysis.time_breakdown``); a plug-in's stay in its own module."""
    out: dict[str, str] = {}
    for a in analyses():
        for ref in (a.function, a.result):
            if module_of(ref) in BUILTIN_MODULES:
                out[short_name(ref)] = module_of(ref)
    return out


def function_names() -> list[str]:
    """The analysis functions' names (what no front end may name: they loop over this)."""
    return [short_name(a.function) for a in analyses()]
