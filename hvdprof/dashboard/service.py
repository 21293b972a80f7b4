"""The thin layer between routes and the analysis library.

Each function loads a run through the catalog, calls exactly one analysis function, and
wraps its ``to_dict()`` in a response envelope. A failure inside an analysis (a corrupt or
half-written file) becomes a notice beside ``data=None``, so the page shows every other
section and says what is missing instead of the server answering 500. Results are cached
per run version: a page re-asking for the same window costs a dictionary lookup.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import orjson

from hvdprof.dashboard.catalog import LoadedRun, RunCatalog, RunLoadError, shown
from hvdprof.dashboard.models import CompareResponse, Problem, RunInfo, Section

#: Cached results per run (oldest dropped first); a zoomed page asks for many windows.
MAX_CACHED_RESULTS = 64


def _cached(loaded: LoadedRun, key: tuple[Any, ...], compute: Callable[[], Any]) -> Any:
    # Requests run in a thread pool: every look at the shared dict holds its own lock
    # (iterating it while another request inserted raised "dictionary changed size
    # during iteration"); the computation holds the run's lock, not this one.
    cache: dict[tuple[Any, ...], Any] = loaded.__dict__.setdefault("results", {})
    cache_lock: threading.Lock = loaded.__dict__.setdefault("results_lock", threading.Lock())
    with cache_lock:
        full_key = (loaded.version, *key)
        if full_key in cache:
            return cache[full_key]
    with loaded.lock:
        value = compute()
    with cache_lock:
        if len(cache) >= MAX_CACHED_RESULTS or any(k[0] != loaded.version for k in cache):
            for stale in [k for k in cache if k[0] != loaded.version] or list(cache)[:8]:
                cache.pop(stale, None)
        cache[full_key] = value
    return value


def _failure(what: str, exc: BaseException) -> str:
    return f"{what} could not be computed: {type(exc).__name__}: {exc}"


def run_info(catalog: RunCatalog, run_id: str) -> RunInfo:
    """A run's summary; a run that cannot be read at all is described by its notice."""
    entry = catalog.entry(run_id)
    try:
        loaded = catalog.loaded(run_id)
    except RunLoadError as exc:
        return RunInfo(
            id=entry.shown_id, kind=entry.kind, format="unknown", ranks=[], hosts={},
            complete=False, t0_us=None, t1_us=None, tensors=0, problems=[], version=0,
            notices=[shown(str(exc))],
        )  # fmt: skip
    run = loaded.run
    problems = [
        Problem(file=shown(str(getattr(p, "file", ""))), where=shown(str(getattr(p, "where", ""))),
                reason=shown(str(getattr(p, "reason", p))),
                partial_tail=bool(getattr(p, "partial_tail", False)))
        for p in getattr(run, "problems", [])
    ]  # fmt: skip
    notices = []
    ranks = [int(r) for r in getattr(run, "ranks", [])]
    if not ranks:
        notices.append("no rank has written an event yet")
    complete = getattr(run, "complete", False)
    complete = (
        bool(complete) and all(complete.values()) if isinstance(complete, dict) else bool(complete)
    )
    # A file still being written ends in a half-written event on almost every read: that
    # is the state of a live run, said by its notice, not a problem to alarm anyone with.
    counted = len(problems)
    if not complete:
        tails = sum(1 for p in getattr(run, "problems", []) if getattr(p, "partial_tail", False))
        cut = f" ({tails} file(s) end in an event not yet written whole)" if tails else ""
        notices.append(
            f"the run is still being written (or was cut off): showing what is there{cut}"
        )
        counted -= tails
    if counted:
        notices.append(f"{counted} problem(s) reading the files: see the list below")
    hosts = getattr(run, "hosts", {}) or {}
    if not isinstance(hosts, dict):
        hosts = dict(zip(ranks, hosts, strict=False))
    tensors = getattr(run, "tensors", ()) or ()
    return RunInfo(
        id=entry.shown_id,
        kind=entry.kind,
        format=str(getattr(run, "format", "hvdprof")),
        ranks=ranks,
        hosts={shown(str(k)): shown(str(v)) for k, v in hosts.items()},
        complete=complete,
        t0_us=_finite(getattr(run, "t0_us", None)),
        t1_us=_finite(getattr(run, "t1_us", None)),
        tensors=len(tensors),
        problems=problems,
        version=loaded.version,
        notices=notices,
    )


def _finite(value: Any) -> float | None:
    try:
        f = float(value)
    except (TypeError, ValueError):
        return None
    return f if f == f and abs(f) != float("inf") else None


def section(
    catalog: RunCatalog, run_id: str, name: str, compute: Callable[[Any], Any], *key: Any
) -> Section:
    """``compute(run).to_dict()`` for one run, cached per version, failures as notices."""
    try:
        loaded = catalog.loaded(run_id)
    except RunLoadError as exc:
        return Section(run=run_id, version=0, data=None, notices=[shown(str(exc))])
    try:
        data = _cached(loaded, (name, *key), lambda: _to_dict(compute(loaded.run)))
    except Exception as exc:  # a half-written file must not cost the other sections
        return Section(
            run=run_id, version=loaded.version, data=None, notices=[shown(_failure(name, exc))]
        )
    return Section(run=run_id, version=loaded.version, data=data, notices=_notices_of(data))


def _to_dict(result: Any) -> dict[str, Any]:
    data = result.to_dict() if hasattr(result, "to_dict") else result
    if not isinstance(data, dict):
        data = {"value": data}
    return _json_safe(data)


def _json_safe(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` with every string JSON can carry. A trace's strings are data from
    elsewhere: a file name's undecodable bytes, or a ``"\\udcff"`` escape in a tensor
    name, are lone surrogates that failed the whole answer (503). One fast check
    (orjson, in C); the walk that rewrites such strings only runs when it fails."""
    try:
        orjson.dumps(data, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS)
        return data
    except (orjson.JSONEncodeError, TypeError):
        return _safe(data)


def _safe(value: Any) -> Any:
    # iterative over containers would be faster to write wrongly; analysis results are
    # a few levels deep (never the input's nesting)
    if isinstance(value, str):
        return shown(value)
    if isinstance(value, dict):
        return {(_safe(k) if isinstance(k, str) else k): _safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_safe(v) for v in value]
    return value


def _notices_of(data: dict[str, Any]) -> list[str]:
    notes = data.get("notices") or data.get("notes") or []
    return [str(n) for n in notes] if isinstance(notes, list) else [str(notes)]


def compare(catalog: RunCatalog, a: str, b: str) -> CompareResponse:
    """``diff_runs`` of two runs under the root, failures as notices."""
    from hvdprof.analysis import diff_runs

    try:
        run_a, run_b = catalog.loaded(a), catalog.loaded(b)
    except RunLoadError as exc:
        return CompareResponse(a=a, b=b, data=None, notices=[shown(str(exc))])
    try:
        with run_a.lock:
            data = _to_dict(diff_runs(run_a.run, run_b.run))
    except Exception as exc:
        return CompareResponse(
            a=a, b=b, data=None, notices=[shown(_failure("the comparison", exc))]
        )
    return CompareResponse(a=a, b=b, data=data, notices=_notices_of(data))
