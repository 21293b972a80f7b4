"""The registry of trace formats: which files make a run, and how each file is read.

Every format is one module holding one class that follows
:class:`hvdprof.trace.files.TraceFormat`, registered here once. The loader
(:mod:`hvdprof.trace.loader`) and the dashboard's catalog (:mod:`hvdprof.dashboard.catalog`)
both ask this registry what a directory or a file holds, so a new format is a new entry
(:func:`register`), not edits in the loader, the catalog and the CLI. The order of
:data:`FORMATS` is the order of the questions: hvdprof's own timelines first (a directory
that has them is an hvdprof run whatever else it holds), then torch.profiler (Kineto)
traces, then Horovod's single timeline.

A format answers four things:

- ``detect_dir``: its files in a directory, with their ranks, and what it found but
  could not use (a :class:`Detection`);
- ``detect_file``: whether one file given by itself is of this format;
- ``read``: one whole file into a :class:`FileRead`, the same for every format (and,
  for a format whose files grow while they are read, ``open``: a reader that keeps its
  place, :class:`hvdprof.trace.files.FileReader`);
- ``finish_run``: the pass over the assembled run, which also says what the run can
  answer (:class:`hvdprof.trace.model.Capabilities`).

Every member is read the same way; none is special-cased after the registry.
"""

from __future__ import annotations

from pathlib import Path

from hvdprof.trace import byte_order
from hvdprof.trace.files import (
    TRACE_SUFFIXES,
    Detection,
    FileRead,
    FileReader,
    FoundFile,
    TraceFormat,
    open_reader,
)
from hvdprof.trace.horovod_format import HorovodFormat
from hvdprof.trace.hvdprof_reader import HvdprofFormat
from hvdprof.trace.kineto_format import KinetoFormat
from hvdprof.trace.model import Problem

#: Files that are never runs by themselves (beside a run's traces).
_NOT_RUNS = ("autotune", "manifest.", "report")
#: Files beside a run's traces that belong to it (the autotuner's log): a change to one
#: is a change to the run.
COMPANION_SUFFIXES = (".csv",)

# --- the registry ---------------------------------------------------------------------------

#: every format, in the order detection asks them (plug-ins are added on first use:
#: :func:`registered`)
FORMATS: list[TraceFormat] = [HvdprofFormat(), KinetoFormat(), HorovodFormat()]
#: The entry-point group of installed format plug-ins (:mod:`hvdprof.common.plugins`).
PLUGIN_GROUP = "hvdprof.formats"
#: The module attribute a plug-in module declares its format in (an instance).
DECLARED = "FORMAT"
_plugins_found = False


def registered() -> list[TraceFormat]:
    """Every format in detection order: the built-in ones, then the plug-ins (entry points
    of ``hvdprof.formats``, then the modules in ``HVDPROF_FORMATS``), found once, here, so
    that only reading a trace pays for importing them."""
    global _plugins_found
    if not _plugins_found:
        _plugins_found = True
        from hvdprof.common import plugins

        for where, fmt in plugins.load(PLUGIN_GROUP, "format_plugins", DECLARED):
            if not callable(getattr(fmt, "detect_dir", None)) or not isinstance(
                getattr(fmt, "name", None), str
            ):
                raise plugins.PluginError(f"{where}: {DECLARED} is not a trace format")
            _insert(fmt, None)
    return FORMATS


def register(fmt: TraceFormat, *, before: str | None = None) -> None:
    """Add a format (last, or before the one named ``before``); a format of the same
    name is replaced. A plug-in module declares ``FORMAT`` instead."""
    registered()
    _insert(fmt, before)


def _insert(fmt: TraceFormat, before: str | None) -> None:
    FORMATS[:] = [f for f in FORMATS if f.name != fmt.name]
    names = [f.name for f in FORMATS]
    FORMATS.insert(names.index(before) if before in names else len(FORMATS), fmt)


def unregister(name: str) -> None:
    registered()
    FORMATS[:] = [f for f in FORMATS if f.name != name]


def format_named(name: str) -> TraceFormat:
    for fmt in registered():
        if fmt.name == name:
            return fmt
    raise KeyError(f"no trace format named {name!r}")


def detect_directory(directory: str, names: list[str]) -> Detection:
    """The first format (in :data:`FORMATS` order) with files in ``directory``; its
    detection carries what every format asked before it found but would not read (and
    their manifests). No files at all: the detection of none, with those problems."""
    problems: list[Problem] = []
    manifests: dict[int, str] = {}
    for fmt in registered():
        found = fmt.detect_dir(directory, names)
        problems += found.problems
        manifests.update(found.manifests)
        if found.files:
            found.problems, found.manifests = problems, manifests
            return found
    return Detection("", [], manifests, problems)


def detect_file(path: str) -> Detection:
    """The format of one file given by itself; the last-resort format (hvdprof's) when no
    other claims it."""
    ordered = sorted(registered(), key=lambda f: f.last_resort)
    for fmt in ordered:
        found = fmt.detect_file(path)
        if found is not None:
            return found
    raise LookupError(f"{path}: no trace format claims it")


def run_format_of(directory: Path, entries: list[Path]) -> str | None:
    """The format of the run ``directory`` is (its sorted ``entries``), or None when it is
    no run of per-rank files (the dashboard's catalog asks)."""
    for fmt in registered():
        if fmt.holds_run(directory, entries):
            return fmt.name
    return None


def part_of_run(path: Path) -> bool:
    """Is ``path`` one of the files of the run directory it is in?"""
    return path.suffix in COMPANION_SUFFIXES or any(fmt.part_of_run(path) for fmt in registered())


def single_file_run(path: Path) -> bool:
    """Can ``path`` be a run by itself (a Horovod timeline, a merged trace)? Cheap: its
    name and its first 4 KiB."""
    if not path.name.endswith(TRACE_SUFFIXES):
        return False
    if any(path.name.startswith(prefix) for prefix in _NOT_RUNS):
        return False
    if path.name.endswith(".gz"):
        return True
    try:
        with path.open("rb") as f:
            head = f.read(4096)
    except OSError:
        return False
    head = byte_order.head_as_utf8(head).lstrip()
    return (head[:1] in (b"[", b"{") and b'"ph"' in head) or b"traceEvents" in head


__all__ = [
    "FORMATS",
    "Detection",
    "FileRead",
    "FileReader",
    "FoundFile",
    "TraceFormat",
    "detect_directory",
    "detect_file",
    "format_named",
    "open_reader",
    "part_of_run",
    "register",
    "registered",
    "run_format_of",
    "single_file_run",
    "unregister",
]
