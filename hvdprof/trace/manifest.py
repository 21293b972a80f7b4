"""The names of a timeline directory's files and the manifest as readers take it.

This is the schema both sides share: :mod:`hvdprof.timeline` writes ``rank.<r>.json`` and
``manifest.rank.<r>.json`` by these names, and the trace layer finds and reads them by the
same ones, so a renamed file or a new manifest field is changed here once. Writing (the
atomic replace) stays with the writer in :mod:`hvdprof.timeline.manifest`.
"""

from __future__ import annotations

import json
import re
from typing import Any

#: Bumped when the manifest's meaning changes incompatibly.
MANIFEST_VERSION = 1
MANIFEST_FORMAT = "hvdprof-timeline-manifest"

TRACE_RE = re.compile(r"^rank\.(\d+)\.json(\.gz)?$")
MANIFEST_RE = re.compile(r"^manifest\.rank\.(\d+)\.json$")
#: a rank in any other trace's file name (``worker1.pt.trace.json``, ``trace_Rank-2.json``):
#: ``rank`` or ``worker``, an optional ``.``/``_``/``-``, the number. Case-insensitive:
#: people and tools spell it ``Rank3``/``RANK_3`` as often as ``rank3``, and a name
#: that says a rank is taken at its word rather than read as rank 0.
RANK_IN_NAME = re.compile(r"(?:rank|worker)[._-]?(\d+)", re.IGNORECASE)

#: the manifest's fields that hold objects
_OBJECT_FIELDS = ("clock", "config")


def trace_filename(rank: int, gzip: bool = False) -> str:
    """``rank.<r>.json`` or ``rank.<r>.json.gz``."""
    return f"rank.{rank}.json" + (".gz" if gzip else "")


def manifest_filename(rank: int) -> str:
    """``manifest.rank.<r>.json``."""
    return f"manifest.rank.{rank}.json"


def read_manifest(path: str) -> dict[str, Any]:
    """Load a manifest; ``ValueError`` naming the file when it is not one."""
    with open(path, encoding="utf-8") as f:
        try:
            data = json.load(f)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict) or data.get("format") != MANIFEST_FORMAT:
        raise ValueError(f"{path}: not an hvdprof timeline manifest")
    for key in _OBJECT_FIELDS:  # every reader does manifest.get(key, {}).get(...)
        if key in data and not isinstance(data[key], dict):
            raise ValueError(f"{path}: its {key!r} is not an object")
    return data


def timeline_shift_ns(manifest: dict[str, Any]) -> int:
    """What to add to the rank's local clock (ns) to get timeline ns, per the manifest."""
    clock = manifest.get("clock", {})
    return int(clock.get("offset_ns", 0)) - int(clock.get("origin_ns", 0))


def kineto_shift_us(base_ns: int, manifest: dict[str, Any]) -> float:
    """Microseconds to add to a torch.profiler ``ts`` (relative to its
    ``baseTimeNanoseconds``, ``base_ns``) to put it on the run's timeline: the manifest
    pairs a wall-clock reading with the rank's own clock."""
    local_at_base = int(manifest["start_local_ns"]) + (base_ns - int(manifest["start_unix_ns"]))
    return (local_at_base + timeline_shift_ns(manifest)) / 1000.0
