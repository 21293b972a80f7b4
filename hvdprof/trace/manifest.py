"""The names of a timeline directory's files and the manifest as readers take it.

This is the schema both sides share: :mod:`hvdprof.timeline` writes ``rank.<r>.json`` and
``manifest.rank.<r>.json`` by these names, and the trace layer finds and reads them by the
same ones, so a renamed file or a new manifest field is changed here once. Writing (the
atomic replace) stays with the writer in :mod:`hvdprof.timeline.manifest`.

A manifest is read once, into :class:`Manifest`: every field typed, with the default an
older manifest (written before the field existed) stands for, so that readers use
attributes instead of each guarding ``manifest.get(key, {}).get(...)`` against a string
where an object belongs (the fuzzer found such a crash). msgspec validates it, as it
decodes the trace files' events: a field of the wrong type is one error naming the file
and the field, and fields added later by a newer writer are ignored.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

import msgspec

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


def trace_filename(rank: int, gzip: bool = False) -> str:
    """``rank.<r>.json`` or ``rank.<r>.json.gz``."""
    return f"rank.{rank}.json" + (".gz" if gzip else "")


def manifest_filename(rank: int) -> str:
    """``manifest.rank.<r>.json``."""
    return f"manifest.rank.{rank}.json"


class ClockEstimate(msgspec.Struct, frozen=True):
    """One estimate of the offset to rank 0 (the manifest's ``clock.history``)."""

    local_ns: int
    offset_ns: int
    error_ns: int


class ManifestClock(msgspec.Struct, frozen=True, kw_only=True):
    """The rank's clock: ``t_timeline = t_local + offset_ns - origin_ns``, right to within
    ``error_ns`` (half the best round trip of ``samples`` ping-pongs; rank 0 takes none)."""

    origin_ns: int = 0
    offset_ns: int = 0
    error_ns: int = 0
    rtt_ns: int = 0
    samples: int = 0
    skew_us: float = 0.0
    history: list[ClockEstimate] = msgspec.field(default_factory=list)


class ManifestConfig(msgspec.Struct, frozen=True, kw_only=True):
    """The settings of the run's configuration that readers use (the manifest holds them
    all; the others are for people reading the file)."""

    cycle_time_ms: float | None = None
    fusion_threshold_bytes: int | None = None


class Manifest(msgspec.Struct, frozen=True, kw_only=True):
    """One rank's ``manifest.rank.<r>.json``, as :func:`read_manifest` returns it."""

    format: str = MANIFEST_FORMAT
    version: int = MANIFEST_VERSION
    #: the same on every rank of one run (files of two runs mixed are told apart by it)
    run_id: str | None = None
    rank: int | None = None
    size: int | None = None
    hostname: str | None = None
    #: how the job was started and which engine moved its tensors (mpi, gloo)
    launcher: str | None = None
    backend: str | None = None
    #: a wait on an op starts a cycle at once (older manifests: the cycle's pace)
    negotiates_on_wait: bool = False
    os_pid: int | None = None
    #: the process writing the trace file: until it exits, the file may still grow
    renderer_pid: int | None = None
    trace_file: str | None = None
    #: the start (and end) instant on the wall clock and on the rank's own clock
    start_unix_ns: int | None = None
    start_local_ns: int | None = None
    end_unix_ns: int | None = None
    end_local_ns: int | None = None
    clock: ManifestClock = msgspec.field(default_factory=ManifestClock)
    config: ManifestConfig = msgspec.field(default_factory=ManifestConfig)
    events_written: int = 0
    events_dropped: int = 0
    waited_for_renderer_s: float = 0.0
    items_dropped: int = 0
    lanes_clamped: int = 0
    #: the recording ended cleanly (False after a crash or kill)
    closed: bool = False


#: what a JSON type is called in an error (msgspec names them ``object``, ``int | null``...)
_JSON_WORDS = {"object": "an object", "array": "a list", "str": "a string", "int": "an integer"}


def _type_error(path: str, exc: msgspec.ValidationError) -> ValueError:
    """``"<path>: its 'config' is not an object (got str)"`` from msgspec's
    ``"Expected `object`, got `str` - at `$.config`"``."""
    text = str(exc)
    m = re.fullmatch(r"Expected `([^`]+)`, got `([^`]+)` - at `\$\.?(.*)`", text)
    if not m:
        return ValueError(f"{path}: not a valid manifest ({text})")
    expected, got, where = m.groups()
    return ValueError(
        f"{path}: its {where!r} is not "
        + " or ".join(_JSON_WORDS.get(t, t) for t in expected.split(" | "))
        + f" (got {got})"
    )


def parse_manifest(data: Any, path: str = "manifest") -> Manifest:
    """A manifest from its decoded JSON (``path`` names it in errors): ``ValueError``
    when it is not one, or one of its fields has the wrong type."""
    if not isinstance(data, dict) or data.get("format") != MANIFEST_FORMAT:
        raise ValueError(f"{path}: not an hvdprof timeline manifest")
    try:
        manifest = msgspec.convert(data, Manifest)
    except msgspec.ValidationError as exc:
        raise _type_error(path, exc) from None
    if manifest.version > MANIFEST_VERSION:
        raise ValueError(
            f"{path}: manifest version {manifest.version}, newer than this hvdprof reads "
            f"({MANIFEST_VERSION}); upgrade hvdprof to read it"
        )
    return manifest


def read_manifest(path: str) -> Manifest:
    """Load a manifest; ``ValueError`` naming the file when it is not one."""
    with open(path, "rb") as f:
        raw = f.read()
    try:
        data = msgspec.json.decode(raw)
    except msgspec.DecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from None
    return parse_manifest(data, path)


def as_manifest(manifest: Manifest | Mapping[str, Any]) -> Manifest:
    """A :class:`Manifest` from one, or from the dict a writer holds before writing it."""
    if isinstance(manifest, Manifest):
        return manifest
    return parse_manifest(dict(manifest))


def timeline_shift_ns(manifest: Manifest | Mapping[str, Any]) -> int:
    """What to add to the rank's local clock (ns) to get timeline ns, per the manifest."""
    clock = as_manifest(manifest).clock
    return clock.offset_ns - clock.origin_ns


def timeline_to_unix_s(manifest: Manifest | Mapping[str, Any]) -> Callable[[float], float] | None:
    """A function from timeline microseconds to Unix seconds, by the manifest's pairing
    of the rank's clock with the wall clock (None when it has no start instant)."""
    m = as_manifest(manifest)
    if m.start_local_ns is None or m.start_unix_ns is None:
        return None
    base_ns = m.start_unix_ns - m.start_local_ns - timeline_shift_ns(m)
    return lambda t_us: (t_us * 1000.0 + base_ns) / 1e9


def kineto_shift_us(base_ns: int, manifest: Manifest | Mapping[str, Any]) -> float:
    """Microseconds to add to a torch.profiler ``ts`` (relative to its
    ``baseTimeNanoseconds``, ``base_ns``) to put it on the run's timeline: the manifest
    pairs a wall-clock reading with the rank's own clock. ``ValueError`` when it has no
    start instant to pair them by."""
    m = as_manifest(manifest)
    if m.start_local_ns is None or m.start_unix_ns is None:
        raise ValueError(f"rank {m.rank}'s manifest has no start instant")
    local_at_base = m.start_local_ns + (base_ns - m.start_unix_ns)
    return (local_at_base + timeline_shift_ns(m)) / 1000.0
