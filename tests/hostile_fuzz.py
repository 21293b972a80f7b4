"""Hostile and mutated trace files, and what every reader must make of them (issue 34).

Cases are real files from ``tests/data`` (torch.profiler traces of a GPU job and of a DDP
Gloo job, Horovod 0.28.1 timelines, an hvdprof run), either with one of the inputs the
issue listed (a rank of 2000000000, a gzip bomb, a FIFO named like a trace ...) or
mutated by a seeded generator: bytes flipped, inserted, cut or repeated, and JSON values
replaced by hostile ones (2**62, -7, 1.7e308, "inf", an object, 100,000 levels of
nesting, a lone surrogate). The same seed gives the same cases.

For each case, :func:`check` loads the run, analyses it, diffs it with its unmutated
original both ways, and asks every dashboard route (in process, through Starlette's test
client): the answer must be a result or a listed problem, never an exception and never a
5xx. Run as a script it checks ``--cases`` mutated cases (plus every named one) and
writes a JSON report; ``tests/test_hostile_input.py`` runs it in a child process and
reads that process's peak memory from ``wait4``.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import os
import random
import shutil
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parent / "data"

#: a directory entry that is not file content
DIRECTORY, FIFO = "<directory>", "<fifo>"


@dataclass
class Link:
    """A symbolic link to ``target`` (relative to the run directory, or absolute)."""

    target: str


@dataclass
class Case:
    """One run directory: file name (bytes when not UTF-8) -> content."""

    name: str
    files: dict[str | bytes, bytes | str | Link]
    #: the unmutated run it came from (the diff's other side), under the seeds root
    base: str = ""
    #: the run directory's own name, when the case is about it (bytes: not UTF-8)
    dirname: str | bytes | None = None
    env: dict[str, str] = field(default_factory=dict)


# --- the real files ---------------------------------------------------------------------


def _read(path: Path) -> bytes:
    data = path.read_bytes()
    return gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data


def seed_runs() -> dict[str, dict[str, bytes]]:
    """The real runs the cases start from: name -> {file name: decompressed content}."""
    runs: dict[str, dict[str, bytes]] = {}
    for name, directory, pattern in (
        ("kineto-gpu", DATA / "kineto-hta", "*.json.gz"),
        ("kineto-ddp", DATA / "kineto-ddp-gloo", "*.pt.trace.json.gz"),
        ("hvdprof", DATA / "hvdprof-demo", "*.json*"),
    ):
        files = {}
        for p in sorted(directory.glob(pattern)):
            key = p.name[: -len(".gz")] if p.name.endswith(".gz") else p.name
            files[key] = _read(p)
        runs[name] = files
    runs["horovod"] = {
        "horovod-timeline.json": (DATA / "horovod" / "horovod-timeline.json").read_bytes()
    }
    return runs


def _trace_files(files: dict[str, bytes]) -> list[str]:
    return [n for n in files if not n.startswith("manifest.")]


# --- the inputs the issue lists ---------------------------------------------------------


def _kineto(rank: Any, *, extra: dict[str, Any] | None = None, **kw: Any) -> bytes:
    """A small Kineto trace: one ProfilerStep, a c10d::allreduce_ and its gloo range."""
    ts = kw.get("ts", 100.0)
    pid = kw.get("pid", 1)
    events: list[dict[str, Any]] = [
        {"ph": "X", "name": f"ProfilerStep#{kw.get('step', '2')}", "pid": pid, "tid": 1,
         "ts": ts, "dur": 50},
    ]  # fmt: skip
    if not kw.get("no_collectives"):
        events += [
            {"ph": "X", "name": "c10d::allreduce_", "pid": pid, "tid": 1, "ts": ts + 5,
             "dur": 10, "args": {"In msg nelems": kw.get("nelems", 100), "dtype": "Float"}},
            {"ph": "X", "name": "gloo:all_reduce", "pid": pid, "tid": 2, "ts": ts + 6, "dur": 8},
        ]  # fmt: skip
    trace: dict[str, Any] = {
        "schemaVersion": 1,
        "distributedInfo": {"backend": "gloo", "rank": rank, "world_size": 2},
        "traceEvents": events,
    }
    if not kw.get("no_base"):
        trace["baseTimeNanoseconds"] = kw.get("base", 1_700_000_000_000_000_000)
    trace.update(extra or {})
    return json.dumps(trace).encode()


def _pair(a: bytes, b: bytes) -> dict[str | bytes, bytes | str | Link]:
    return {"worker0.1.pt.trace.json": a, "worker1.2.pt.trace.json": b}


NEST = b"[" * 100_000 + b"]" * 100_000


def _bomb(head: bytes, mebibytes: int) -> bytes:
    """A gzip file of ``head`` then ``mebibytes`` MiB of spaces, about 1 KB per MiB (one
    member per MiB: what a compressor writes for repeated flushes, made in milliseconds)."""
    member = gzip.compress(b" " * (1 << 20), 9)
    return gzip.compress(head) + member * mebibytes


def named_cases(seeds: dict[str, dict[str, bytes]]) -> list[Case]:
    """Each input of issue 34, on small files made for it or on the real ones."""
    ok1 = _kineto(1)
    cases = [
        Case("rank-2000000000", _pair(_kineto(1), _kineto(2_000_000_000))),
        Case("rank-150000000", _pair(_kineto(0), _kineto(150_000_000))),
        Case("rank-2pow40", _pair(_kineto(0), _kineto(2**40))),
        Case("rank-minus-7", _pair(_kineto(0), _kineto(-7))),
        Case(
            "rank-5000-digits",
            _pair(_kineto(0), _kineto(1).replace(b'"rank": 1', b'"rank": ' + b"9" * 5000)),
        ),
        Case(
            "rank0-no-collectives-no-base",
            _pair(_kineto(0, no_collectives=True), _kineto(1, no_base=True)),
        ),
        Case("non-utf8-byte", _pair(_kineto(0).replace(b'"gloo"', b'"gl\xffo"'), ok1)),
        Case("pid-object", _pair(_kineto(0, pid={"a": 1}), _kineto(1, pid=[1]))),
        Case("nelems-2pow62", _pair(_kineto(0, nelems=2**62), ok1)),
        Case("step-inf", _pair(_kineto(0, step="inf"), ok1)),
        Case("step-1e30", _pair(_kineto(0, step="1e30"), ok1)),
        Case("step-2-and-2000000000", _pair(_kineto(0), _kineto(1, step="2000000000"))),
        Case(
            "nested-args",
            _pair(_kineto(0).replace(b'"dtype": "Float"', b'"dtype": "Float", "x": ' + NEST), ok1),
        ),
        Case(
            "nested-top",
            _pair(_kineto(0).replace(b'"schemaVersion": 1', b'"schemaVersion": ' + NEST), ok1),
        ),
        Case("ts-1.7e308", _pair(_kineto(0, ts=1.7e308), ok1)),
        Case("base-1e20", _pair(_kineto(0, base=99_999_999_998_299_996_160), ok1)),
        Case(
            "lone-surrogate-names",
            _pair(_kineto(0).replace(b"c10d::allreduce_", b"c10d::allreduce_\\udcff"), ok1),
        ),
        # 300 MB of spaces in 300 KB: past the ratio bound after 32 MiB
        Case(
            "gzip-bomb-kineto",
            {
                "worker0.1.pt.trace.json.gz": _bomb(b"", 300),
                "worker1.2.pt.trace.json": ok1,
            },
        ),
        Case(
            "gzip-bomb-hvdprof",
            {
                "rank.0.json.gz": _bomb(b"[\n", 300),
                "rank.1.json": seeds["hvdprof"]["rank.1.json"],
            },
        ),
        # the absolute bound, made small for the test
        Case(
            "gzip-absolute-bound",
            {
                "worker0.1.pt.trace.json.gz": gzip.compress(_kineto(0) + b" " * (8 << 20)),
                "worker1.2.pt.trace.json": ok1,
            },
            env={"HVDPROF_READ_MAX_INFLATED_BYTES": str(4 << 20)},
        ),
        Case(
            "directory-fifo-links",
            {
                "worker0.1.pt.trace.json": _kineto(0),
                "d.pt.trace.json": DIRECTORY,
                "f.pt.trace.json": FIFO,
                "ld.pt.trace.json": Link("d.pt.trace.json"),
                "loop.pt.trace.json": Link("loop.pt.trace.json"),
                "x.json": FIFO,  # opened to sniff its keys, were it not a FIFO
            },
        ),
        Case("only-a-fifo", {"f.pt.trace.json": FIFO, "rank.0.json": FIFO}),
        Case(
            "non-utf8-file-name",
            {b"worker0.\xff.pt.trace.json": _kineto(0), "worker1.2.pt.trace.json": ok1},
        ),
        Case(
            "escape-codes-in-names",
            {"worker0.\x1b[31m.pt.trace.json": _kineto(0), "worker1.2.pt.trace.json": ok1},
            dirname="esc-\x1b[2J\x1b[31mred",
        ),
        Case("non-utf8-directory", _pair(_kineto(0), ok1), dirname=b"dir-\xff\xfe"),
    ]
    hvd = seeds["hvdprof"]
    r0 = hvd["rank.0.json"]
    cases += [
        Case(
            "hvdprof-rank-in-file-name",
            {"rank.0.json": r0, "rank.2000000000.json": hvd["rank.1.json"]},
        ),
        Case(
            "hvdprof-ready-rank-2pow40",
            {
                **hvd,
                "rank.0.json": r0.replace(b'"ready_us":{"0"', b'"ready_us":{"1099511627776"', 1),
            },
        ),
        Case(
            "hvdprof-bytes-2pow70",
            {**hvd, "rank.0.json": _replace_first_int(r0, b'"bytes":', 2**70)},
        ),
        Case(
            "hvdprof-manifest-size",
            {
                **hvd,
                "manifest.rank.0.json": hvd["manifest.rank.0.json"].replace(
                    b'"size": 2', b'"size": 2000000000'
                ),
            },
        ),
        Case(
            "hvdprof-nested-line",
            {**hvd, "rank.0.json": r0.replace(b"\n", b"\n" + NEST + b",\n", 1)},
        ),
    ]
    hv = seeds["horovod"]["horovod-timeline.json"]
    cases += [
        Case("horovod-rank-mark-huge", {"horovod-timeline.json": hv.replace(b'"name": "1"', b'"name": "99999999999"', 3)}),
        Case("horovod-pid-object", {"horovod-timeline.json": hv.replace(b'"pid": 1,', b'"pid": {"x": 1},', 5)}),
        Case("horovod-ts-inf", {"horovod-timeline.json": hv.replace(b'"ts": ', b'"ts": 1e400, "_": ', 7)}),
    ]  # fmt: skip
    return cases


def _replace_first_int(data: bytes, key: bytes, value: int) -> bytes:
    at = data.find(key)
    if at < 0:
        return data
    start = at + len(key)
    end = start
    while end < len(data) and data[end : end + 1] in b"-0123456789":
        end += 1
    return data[:start] + str(value).encode() + data[end:]


# --- the seeded mutations ---------------------------------------------------------------

HOSTILE_VALUES: list[Any] = [
    2**62, 2**40, 2**70, -7, -1, 0, 2_000_000_000, 150_000_000, 1.7e308, -1.7e308, 1e-320,
    "inf", "-inf", "nan", "1e30", "", "\udcff", "\x1b[31m", {}, [], {"a": [1]}, [[1, 2]],
    None, True, False, "ProfilerStep#inf", "ProfilerStep#1e30", "ProfilerStep#-3",
]  # fmt: skip
HOSTILE_BYTES = [b"\xff", b"\x00", b"\xc3", b"\\ud800", b"]", b"}", b"{", b"[", b'"', b",", b"\n"]


def _walk(node: Any, path: list[Any], out: list[list[Any]], rng: random.Random) -> None:
    """Paths to (a sample of) the values in a decoded JSON document."""
    if isinstance(node, dict):
        items = list(node.items())
    elif isinstance(node, list):
        items = list(enumerate(node))
        if len(items) > 40:
            items = rng.sample(items, 40)
    else:
        return
    for key, value in items:
        out.append([*path, key])
        _walk(value, [*path, key], out, rng)


def _set(doc: Any, path: list[Any], value: Any) -> None:
    for key in path[:-1]:
        doc = doc[key]
    doc[path[-1]] = value


def _mutate_json(data: bytes, rng: random.Random) -> bytes | None:
    """A few values of the document replaced by hostile ones (None: not one JSON document)."""
    try:
        doc = json.loads(data)
    except ValueError:
        return None
    paths: list[list[Any]] = []
    _walk(doc, [], paths, rng)
    if not paths:
        return None
    for _ in range(rng.randint(1, 4)):
        path = rng.choice(paths)
        value = rng.choice(HOSTILE_VALUES)
        try:
            _set(doc, path, value)
        except (KeyError, IndexError, TypeError):
            continue
    text = json.dumps(doc, allow_nan=True)
    return text.encode("utf-8", "surrogatepass")


def _mutate_lines(data: bytes, rng: random.Random) -> bytes:
    """hvdprof's one-event-per-line files: one value replaced on a few lines."""
    lines = data.split(b"\n")
    for _ in range(rng.randint(1, 6)):
        i = rng.randrange(len(lines))
        line = lines[i].rstrip(b",")
        try:
            event = json.loads(line)
        except ValueError:
            continue
        paths: list[list[Any]] = []
        _walk(event, [], paths, rng)
        if not paths:
            continue
        _set(event, rng.choice(paths), rng.choice(HOSTILE_VALUES))
        tail = b"," if lines[i].endswith(b",") else b""
        lines[i] = json.dumps(event).encode("utf-8", "surrogatepass") + tail
    return b"\n".join(lines)


def _mutate_bytes(data: bytes, rng: random.Random) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        if not out:
            break
        at = rng.randrange(len(out))
        kind = rng.randrange(5)
        if kind == 0:
            out[at] = rng.randrange(256)
        elif kind == 1:
            out[at:at] = rng.choice(HOSTILE_BYTES)
        elif kind == 2:
            del out[at : at + rng.randint(1, 200)]
        elif kind == 3:
            piece = out[at : at + rng.randint(1, 400)]
            out[at:at] = piece * rng.randint(1, 5)
        else:
            del out[at:]
    return bytes(out)


def mutated_cases(
    seeds: dict[str, dict[str, bytes]], n: int, seed: int, start: int = 0
) -> Iterator[Case]:
    """``n`` cases, each one real run with one of its files mutated (deterministic): the
    seed's cases ``start`` to ``start + n - 1`` (those before are made and dropped, so a
    seed's cases can be checked in chunks)."""
    rng = random.Random(seed)
    names = sorted(seeds)
    for i in range(start + n):
        run = rng.choice(names)
        files: dict[str | bytes, bytes | str | Link] = dict(seeds[run])
        target = rng.choice(_trace_files(seeds[run]))
        if run == "hvdprof" and rng.random() < 0.3:
            target = rng.choice([n for n in seeds[run] if n.startswith("manifest.")])
        data = seeds[run][target]
        how = rng.choice(("json", "bytes", "json+bytes", "lines" if run == "hvdprof" else "json"))
        mutated: bytes | None = None
        if how.startswith("json"):
            mutated = _mutate_json(data, rng)
        elif how == "lines":
            mutated = _mutate_lines(data, rng)
        if mutated is None:
            mutated = data
        if how.endswith("bytes"):
            mutated = _mutate_bytes(mutated, rng)
        name = target
        if target.endswith(".json") and not target.startswith("manifest.") and rng.random() < 0.3:
            del files[target]
            name = target + ".gz"
            mutated = gzip.compress(mutated, 1)
            if rng.random() < 0.2:  # a cut or corrupt stream
                mutated = _mutate_bytes(mutated, rng)
        files[name] = mutated
        if i >= start:
            yield Case(f"fuzz-{seed}-{i:05d}-{run}-{how}", files, base=run)


# --- writing and checking a case --------------------------------------------------------


def materialize(case: Case, root: Path) -> Path:
    """The case's run directory under ``root``."""
    dirname = case.dirname if case.dirname is not None else case.name
    path = os.path.join(os.fsencode(root), os.fsencode(dirname))
    os.mkdir(path)
    for name, content in case.files.items():
        full = os.path.join(path, os.fsencode(name))
        if content == DIRECTORY:
            os.mkdir(full)
        elif content == FIFO:
            os.mkfifo(full)
        elif isinstance(content, Link):
            os.symlink(os.fsencode(content.target), full)
        else:
            assert isinstance(content, bytes)
            with open(full, "wb") as f:
                f.write(content)
    return Path(os.fsdecode(path))


def write_seeds(seeds: dict[str, dict[str, bytes]], root: Path) -> dict[str, Path]:
    out = {}
    for name, files in seeds.items():
        out[name] = materialize(Case(name, dict(files)), root)
    return out


ROUTES = (
    "/api/run",
    "/api/analysis/report",
    "/api/analysis/breakdown",
    "/api/analysis/stragglers",
    "/api/analysis/fusion",
    "/api/analysis/bandwidth",
    "/api/analysis/autotune",
    "/api/analysis/stalls",
    "/api/timeline",
)


#: the unmutated runs, read once
_BASES: dict[Path, Any] = {}


def gate_both_ways(base: Any, run: Any) -> None:
    """The run's summary written and read back, and every kind of --fail-on rule."""
    from hvdprof.analysis import check_gate, parse_rule, read_summary, summarize, write_summary

    with tempfile.TemporaryDirectory() as tmp:  # not beside the run: the page lists it
        path = os.path.join(tmp, "summary.json")
        write_summary(summarize(run), path)
        back = read_summary(path)
    from hvdprof.analysis.gate import RuleError

    sb = summarize(base)
    for rule in ("5%", "negotiate:10%", "rank:5%", "rank1:1ms"):
        for a, b in ((sb, back), (back, sb)):
            try:
                check_gate(a, b, parse_rule(rule)).to_dict()
            except RuleError as exc:  # rank1 of a run without it: a usage error, said
                assert "is not in run" in str(exc), exc


def check(case: Case, run_dir: Path, base_dir: Path | None, served: Path) -> list[str]:
    """What went wrong with one case: exceptions and 5xx answers (empty: all well)."""
    from fastapi.testclient import TestClient

    from hvdprof.analysis import LoadError, analyze, diff_runs, load_run
    from hvdprof.dashboard.app import create_app
    from hvdprof.dashboard.catalog import shown
    from hvdprof.dashboard.settings import DashboardSettings

    failures: list[str] = []
    saved = {k: os.environ.get(k) for k in case.env}
    os.environ.update(case.env)

    def attempt(what: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except LoadError:
            return None
        except Exception as exc:
            tb = traceback.extract_tb(exc.__traceback__)[-1]
            failures.append(
                f"{case.name}: {what}: {type(exc).__name__}: {str(exc)[:200]} "
                f"({tb.filename}:{tb.lineno})"
            )
            return None

    try:
        run = attempt("load_run", lambda: load_run(run_dir, cache=False, workers=1))
        if run is not None:
            attempt("analyze", lambda: json.dumps(_plain(analyze(run).to_dict())))
            if base_dir is not None:
                base = _BASES.get(base_dir) or _BASES.setdefault(
                    base_dir, load_run(base_dir, cache=False, workers=1)
                )
                attempt("diff a-b", lambda: diff_runs(base, run).to_dict())
                attempt("diff b-a", lambda: diff_runs(run, base).to_dict())
                attempt("gate", lambda: gate_both_ways(base, run))
        client = TestClient(create_app(DashboardSettings(served)), base_url="http://127.0.0.1")
        listed = attempt("/api/runs", lambda: client.get("/api/runs").json()["runs"]) or []
        prefix = shown(os.fsdecode(os.path.relpath(os.fsencode(run_dir), os.fsencode(served))))
        # the run itself, or (a Horovod timeline) the file in it
        ids = [r["id"] for r in listed if r["id"] == prefix or r["id"].startswith(prefix + "/")]
        ids = ids or [prefix]
        base_ids = [
            r["id"] for r in listed if base_dir is not None and r["id"].startswith(base_dir.name)
        ]
        urls = [(route, {"run": run_id}) for run_id in ids for route in ROUTES]
        urls.append(("/api/timeline", {"run": ids[0], "expand_rank": 0}))
        if base_ids:
            urls.append(("/api/compare", {"a": base_ids[0], "b": ids[0]}))
        for route, params in urls:
            response = attempt(
                route, lambda route=route, params=params: client.get(route, params=params)
            )
            if response is not None and response.status_code >= 500:
                failures.append(
                    f"{case.name}: {route}: {response.status_code} {response.text[:300]}"
                )
            elif response is not None:
                attempt(f"{route} JSON", response.json)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return failures


# --- the gate, summary, --autotune-from and environment surfaces (issue 48) -------------

#: rule texts as a careless user or an attacker writes them
HOSTILE_RULES = [
    "5%", "2ms", "0%", "0ms", "negotiate:10%", "rank:5%", "rank1:1ms", "rank0:5%", "rank99:5%",
    "rank18446744073709551616:5%", "9" * 400 + "%", "1e400%", "5", "%", "-5%", "nan%",
    "inf%", "rank-1:5%", "idle:0.0000001%", "rank\u0663:5%", "\u0665%", "queue:", ":5%",
    "collective:5%%", "5 %", " RANK1 : 3MS ", "x" * 5000,
]  # fmt: skip
#: values any HVDPROF_* variable may be given
HOSTILE_SETTINGS = [
    "1e308", "-1e308", "1e-300", "-1e18", "1e300", "nan", "inf", "-inf", "", " ", "0", "-1",
    "1", str(2**31), str(2**63), str(10**30), "0x10", "1_000", "\u0663", "1.5", "abc",
    "\udcff", "9" * 400, "60000", "60000.001", "30000", "0.0005", "0-99999999999999999999999",
]  # fmt: skip
#: an autotune log as the tuner writes it: a window, then the round's decision
AUTOTUNE_LOG = (
    b"fusion_threshold_bytes,cycle_time_ms,cache_enabled,score_bytes_per_s,first_step,"
    b"last_step,unix_time,is_best,phase,role,ratio_to_default\n"
    b"4194304,5.0,1,812345.5,3,6,1700000000.0,0,tune,incumbent,\n"
    b"8388608,2.5,1,912345.5,6,9,1700000001.0,1,tune,candidate,\n"
    b"8388608,2.5,1,912345.5,9,9,1700000002.0,1,decision,recommended,1.12\n"
)


@dataclass
class Surface:
    """One case on a surface that is no trace: a summary, a rule, a log, a setting."""

    name: str
    kind: str  # "summary" | "rule" | "autotune" | "environment"
    data: bytes = b""
    text: str = ""
    base: str = ""  # the real summary it came from
    extra: dict[str, str] = field(default_factory=dict)


def surface_cases(
    summaries: dict[str, bytes], n: int, seed: int, start: int = 0
) -> Iterator[Surface]:
    """``n`` cases over the gate, summary, ``--autotune-from`` and environment surfaces,
    from real summaries and a real log, mutated as the trace cases are (deterministic;
    ``start``: as for :func:`mutated_cases`)."""
    from hvdprof.config import ENV_VARS

    rng = random.Random(seed * 7919 + 48)
    names = sorted(summaries)
    for i in range(start + n):
        case = _surface_case(summaries, names, rng, seed, i, ENV_VARS)
        if i >= start:
            yield case


def _surface_case(
    summaries: dict[str, bytes],
    names: list[str],
    rng: random.Random,
    seed: int,
    i: int,
    env_vars: Any,
) -> Surface:
    """Case ``i`` of a seed's surface cases."""
    kind = rng.choice(("summary", "summary", "rule", "autotune", "environment"))
    tag = f"surface-{seed}-{i:05d}-{kind}"
    if kind == "summary":
        base = rng.choice(names)
        how = rng.choice(("json", "json", "bytes", "pad", "deep", "wide"))
        data = summaries[base]
        if how == "json":
            data = _mutate_json(data, rng) or data
        elif how == "bytes":
            data = _mutate_bytes(data, rng)
        elif how == "pad":
            data = rng.choice([b"\n", b" ", b"\r\n", b"\t"]) * rng.randint(1, 70_000) + data
        elif how == "deep":
            depth = rng.choice((1000, 100_000))
            data = data.replace(b'"problems":[', b'"problems":' + b"[" * depth, 1)
            data = data.replace(b"]", b"]" * depth, 1) if rng.random() < 0.5 else data
        else:  # many steps or ranks: the gate's memory
            steps, ranks = rng.choice(((20_000, 2), (150, 256), (500, 64), (3, 1)))
            doc = json.loads(summaries[base])
            row = [round(rng.uniform(0, 20), 3) for _ in range(ranks)]
            doc["ranks"] = list(range(ranks))
            doc["series"]["step"] = [row] * steps
            data = json.dumps(doc).encode()
        return Surface(f"{tag}-{base}-{how}", kind, data, rng.choice(HOSTILE_RULES), base)
    elif kind == "rule":
        text = rng.choice(HOSTILE_RULES)
        if rng.random() < 0.5:
            text = _mutate_bytes(text.encode(), rng).decode("utf-8", "replace")
        return Surface(tag, kind, text=text, base=rng.choice(names))
    elif kind == "autotune":
        how = rng.choice(("lines", "bytes", "binary", "value"))
        data = AUTOTUNE_LOG
        if how == "bytes":
            data = _mutate_bytes(data, rng)
        elif how == "binary":
            data = data.split(b"\n", 1)[0] + b"\n" + rng.randbytes(rng.randint(1, 50_000))
        elif how == "value":
            rows = data.split(b"\n")
            fields = rows[3].split(b",")
            fields[rng.randrange(len(fields))] = rng.choice(HOSTILE_SETTINGS).encode(
                "utf-8", "surrogatepass"
            )
            rows[3] = b",".join(fields)
            data = b"\n".join(rows)
        else:
            rows = data.split(b"\n")
            del rows[rng.randrange(1, len(rows))]
            data = b"\n".join(rows)
        return Surface(f"{tag}-{how}", kind, data)
    env = {}
    for _ in range(rng.randint(1, 3)):
        var = rng.choice(env_vars)
        env[var.name] = rng.choice(HOSTILE_SETTINGS)
    return Surface(tag, kind, extra=env)


def _consume(config: Any) -> None:
    """What a rank does first with the numbers it was given (a timer, a sleep, a size)."""
    import datetime
    import threading

    for seconds in (
        config.collective_timeout_s, config.start_timeout_s, config.elastic_timeout_s,
        config.stall_check_time_s, config.stall_shutdown_time_s, config.clock_sync_interval_s,
        config.timeline_stuck_s, config.cycle_time_ms / 1000.0,
    ):  # fmt: skip
        datetime.timedelta(seconds=seconds)
        assert 0 <= seconds <= threading.TIMEOUT_MAX, seconds
    # a timeout a rank hands to gloo in whole milliseconds: none may round to 0
    assert datetime.timedelta(seconds=config.collective_timeout_s) >= datetime.timedelta(
        milliseconds=1
    )
    for size in (config.fusion_threshold_bytes, config.small_allreduce_bytes):
        assert 0 <= size < 2**63, size
    assert 1 <= config.max_inflight < 2**31
    assert abs(int(config.clock_skew_us)) < 2**62


def check_surface(case: Surface, summaries: dict[str, Any], root: Path) -> list[str]:
    """What went wrong on one surface case: any exception but hvdprof's own clear errors."""
    import contextlib
    import io

    from hvdprof.errors import HvdprofError

    failures: list[str] = []
    path = root / "case"

    def attempt(what: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except HvdprofError:
            return None
        except Exception as exc:
            tb = traceback.extract_tb(exc.__traceback__)[-1]
            failures.append(
                f"{case.name}: {what}: {type(exc).__name__}: {str(exc)[:200]} "
                f"({tb.filename}:{tb.lineno})"
            )
            return None

    if case.kind == "summary":
        from hvdprof.analysis import check_gate, parse_rule, read_summary
        from hvdprof.analysis.diff import diff_summaries

        path.write_bytes(case.data)
        got = attempt("read_summary", lambda: read_summary(str(path)))
        if got is not None:
            base = summaries[case.base]
            attempt("diff a-b", lambda: json.dumps(_plain(diff_summaries(base, got).to_dict())))
            attempt("diff b-a", lambda: json.dumps(_plain(diff_summaries(got, base).to_dict())))
            for text in ("5%", "rank:5%", "negotiate:10%", "2ms", case.text):
                rule = attempt("parse_rule", lambda text=text: parse_rule(text))
                if rule is not None:
                    for a, b in ((base, got), (got, base)):
                        attempt(
                            f"gate {text!r}",
                            lambda a=a, b=b, rule=rule: json.dumps(
                                _plain(check_gate(a, b, rule).to_dict())
                            ),
                        )
    elif case.kind == "rule":
        from hvdprof.analysis import check_gate, parse_rule

        rule = attempt("parse_rule", lambda: parse_rule(case.text))
        if rule is not None:
            base = summaries[case.base]
            attempt("gate", lambda: json.dumps(_plain(check_gate(base, base, rule).to_dict())))
    elif case.kind == "autotune":
        from hvdprof import cli
        from hvdprof.config import Config

        path.write_bytes(case.data)
        with contextlib.redirect_stderr(io.StringIO()) as err:
            found = attempt("--autotune-from", lambda: cli._autotune_from(str(path), {}))
        if len(err.getvalue().splitlines()) > 3:
            failures.append(
                f"{case.name}: --autotune-from: {len(err.getvalue().splitlines())} lines"
            )
        if found:
            config = attempt("Config", lambda: Config.from_env(found))
            if config is not None:
                attempt("consume", lambda: _consume(config))
    else:
        from hvdprof.config import Config

        config = attempt("Config", lambda: Config.from_env(case.extra))
        if config is not None:
            attempt("consume", lambda: _consume(config))
    with contextlib.suppress(OSError):
        path.unlink()
    return failures


def real_summaries(bases: dict[str, Path]) -> tuple[dict[str, bytes], dict[str, Any]]:
    """The seed runs' summaries: as files' bytes (to mutate) and as read (the other side)."""
    import msgspec

    from hvdprof.analysis import load_run, summarize

    encoded, decoded = {}, {}
    for name, directory in sorted(bases.items()):
        summary = summarize(load_run(directory, cache=False, workers=1))
        encoded[name] = msgspec.json.encode(summary)
        decoded[name] = summary
    return encoded, decoded


def _plain(data: Any) -> Any:
    """numpy scalars as Python numbers, for json.dumps."""
    import numpy as np

    if isinstance(data, dict):
        return {str(k): _plain(v) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [_plain(v) for v in data]
    if isinstance(data, np.generic):
        return data.item()
    if isinstance(data, np.ndarray):
        return data.tolist()
    if isinstance(data, str):
        return data.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    return data


@contextlib.contextmanager
def _runtime_warnings(name: str, out: list[str]) -> Iterator[None]:
    """Each RuntimeWarning raised while checking case ``name``, as one line in ``out``."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RuntimeWarning)
        yield
    out += [
        f"{name}: {w.category.__name__}: {w.message} ({Path(w.filename).name}:{w.lineno})"
        for w in caught
        if issubclass(w.category, RuntimeWarning)
    ]


def run_cases(
    n: int,
    seed: int,
    named: bool = True,
    progress: Callable[[dict[str, Any]], None] | None = None,
    surfaces: int = 0,
    start: int = 0,
) -> dict[str, Any]:
    """Check the named cases, ``n`` mutated ones and ``surfaces`` cases on the gate,
    summary, ``--autotune-from`` and environment surfaces; the report as plain data
    (``progress``: given the report so far every 50 cases; ``start``: the seed's first
    mutated and surface case checked, for a seed checked in chunks)."""
    seeds = seed_runs()
    failures: list[str] = []
    warned: list[str] = []
    counts = {"named": 0, "mutated": 0}
    slowest: list[tuple[float, str]] = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="hostile-") as tmp:
        root = Path(tmp)
        (root / "seeds").mkdir()
        bases = write_seeds(seeds, root / "seeds")
        served = root / "served"
        served.mkdir()
        cases: Iterator[Case] = iter(named_cases(seeds) if named else [])
        for kind, source in (("named", cases), ("mutated", mutated_cases(seeds, n, seed, start))):
            for case in source:
                run_dir = materialize(case, served)
                base = bases.get(case.base) if case.base else None
                # the diff's other side must be under the served root too (compare route)
                if base is not None and not (served / case.base).exists():
                    shutil.copytree(base, served / case.base)
                began = time.monotonic()
                with _runtime_warnings(case.name, warned):
                    failures += check(case, run_dir, served / case.base if base else None, served)
                slowest.append((round(time.monotonic() - began, 2), case.name))
                shutil.rmtree(os.fsencode(run_dir))
                counts[kind] += 1
                if progress is not None and sum(counts.values()) % 50 == 0:
                    progress({"cases": dict(counts), "seed": seed, "failures": list(failures),
                              "finished": False})  # fmt: skip
        if surfaces:
            encoded, decoded = real_summaries(bases)
            counts["surface"] = 0
            for case in surface_cases(encoded, surfaces, seed, start):
                began = time.monotonic()
                with _runtime_warnings(case.name, warned):
                    failures += check_surface(case, decoded, root)
                slowest.append((round(time.monotonic() - began, 2), case.name))
                counts["surface"] += 1
                if progress is not None and sum(counts.values()) % 50 == 0:
                    progress({"cases": dict(counts), "seed": seed, "failures": list(failures),
                              "finished": False})  # fmt: skip
    return {
        "finished": True,
        "cases": counts,
        "seed": seed,
        "start": start,
        "failures": failures,
        # numpy's RuntimeWarnings (overflow, invalid value): printed on a user's stderr,
        # listed apart (a warning is not a failure of the reader)
        "runtime_warnings": warned,
        "seconds": round(time.monotonic() - started, 1),
        "slowest": sorted(slowest, reverse=True)[:8],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=100, help="mutated cases (default 100)")
    parser.add_argument("--seed", type=int, default=34)
    parser.add_argument("--no-named", action="store_true", help="only the mutated cases")
    parser.add_argument(
        "--surfaces",
        type=int,
        default=0,
        help="cases on the gate, summary, --autotune-from and environment surfaces (default 0)",
    )
    parser.add_argument(
        "--start",
        type=int,
        default=0,
        help="the seed's first mutated and surface case to check (default 0): a seed's "
        "cases in chunks, e.g. --start 0 --cases 500, then --start 500 --cases 500",
    )
    parser.add_argument("--out", help="write the report here (JSON) as well as to stdout")
    args = parser.parse_args(argv)

    def partial(report: dict[str, Any]) -> None:
        if args.out:
            Path(args.out).write_text(json.dumps(report, indent=1))

    report = run_cases(
        args.cases,
        args.seed,
        named=not args.no_named,
        progress=partial,
        surfaces=args.surfaces,
        start=args.start,
    )
    text = json.dumps(report, indent=1)
    if args.out:
        Path(args.out).write_text(text)
    print(text)
    return 1 if report["failures"] else 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    sys.exit(main())
