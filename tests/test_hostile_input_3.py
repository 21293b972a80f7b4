"""Hostile input, second pass, the smaller items (issue 48, item 7), and the rules of
items 1 and 4 for every command: real processes, a real dashboard server, a real Ray.

1. ``--autotune-from``: what is not a log says what it is; a damaged decision row is
   named with its problem; a binary file is one line.
2. A Horovod timeline in UTF-16 (with its byte-order mark), gzipped, or gzipped and cut
   is read (the cut said once), never "no timeline files".
3. A torch.profiler trace with a UTF-8 byte-order mark is read like a Horovod one.
4. ``/api/timeline``: a window edge of NaN or infinity, and a rank the run lacks, are
   422 with the reason.
5. The dashboard refuses a Host header that is more than a host and port, and a
   request with two Host headers.
6. Ray: a worker's ``os._exit(3)`` is said as such; a rank late to ``hvd.init()`` is
   the one named; what ``timeout_s`` bounds is documented.

And: no numpy warning from interval arithmetic on times like 1e308; every option that
writes a file follows :mod:`hvdprof.analysis.output_file`; any command's crash exits 4.
"""

from __future__ import annotations

import codecs
import gzip
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from dashboard_support import HOROVOD_TIMELINE, dashboard_server

# tests/test_ray.py's local 2-CPU Ray head, in its own session, always stopped (a module
# fixture: started once for the Ray tests here); importing it puts tests/workers on the path
from test_ray import ray_cluster  # noqa: F401

pytestmark = pytest.mark.timeout(300)

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data"
DEMO = DATA / "hvdprof-demo"
KINETO_DDP = DATA / "kineto-ddp-gloo"
#: the columns of an autotune log, in the tuner's order
LOG_HEADER = (
    "fusion_threshold_bytes,cycle_time_ms,cache_enabled,score_bytes_per_s,first_step,"
    "last_step,unix_time,is_best,phase,role,ratio_to_default"
)


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HVDPROF_")}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def hvdprof(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hvdprof", *args], capture_output=True, text=True,
        timeout=timeout, cwd=REPO, env=_env(), stdin=subprocess.DEVNULL,
    )  # fmt: skip


def error_line(result: subprocess.CompletedProcess[str]) -> str:
    """The one ``hvdprof: error:`` line, and nothing else on stderr."""
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("hvdprof: error: "), result.stderr[-3000:]
    return lines[0]


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ----------------------------------------------------------------------------- 1


@pytest.mark.parametrize("kind", ["directory", "fifo", "device"])
def test_autotune_from_what_is_no_file_says_what_it_is(tmp_path: Path, kind: str) -> None:
    path = {"directory": str(tmp_path), "fifo": str(tmp_path / "p"), "device": "/dev/zero"}[kind]
    if kind == "fifo":
        os.mkfifo(path)
    result = hvdprof("run", "-np", "1", "--autotune-from", path, "true", timeout=60)
    assert result.returncode == 2
    line = error_line(result)
    assert "no such file" not in line
    assert {"directory": "is a directory", "fifo": "is a FIFO", "device": "is a device"}[
        kind
    ] in line, line


def test_autotune_from_a_damaged_decision_row_names_the_row_and_the_problem(
    tmp_path: Path,
) -> None:
    """Before: "the job ended before a round of tuning did", of a job whose round ended."""
    log = tmp_path / "autotune.csv"
    log.write_text(
        LOG_HEADER + "\n"
        "4194304,5.0,1,812345.5,3,6,1700000000.0,0,tune,incumbent,\n"
        "8388608,fast,1,912345.5,9,9,1700000002.0,1,decision,recommended,1.12\n"
    )
    result = hvdprof("run", "-np", "1", "--autotune-from", str(log), "true", timeout=60)
    assert result.returncode == 2
    line = error_line(result)
    assert "line 3" in line and "decision row" in line and "'fast'" in line, line
    assert "ended before" not in line, line


def test_autotune_from_an_earlier_whole_decision_is_not_used_for_a_damaged_last_one(
    tmp_path: Path,
) -> None:
    log = tmp_path / "autotune.csv"
    log.write_text(
        LOG_HEADER + "\n"
        "8388608,2.5,1,912345.5,9,9,1700000002.0,1,decision,recommended,1.12\n"
        "8388608,2.5,1,912345.5,19,19,1700000003.0,1,decision,recommended\n"
    )
    result = hvdprof("run", "-np", "1", "--autotune-from", str(log), "true", timeout=60)
    assert result.returncode == 2
    line = error_line(result)
    assert "line 3" in line and "earlier round's decision is not used" in line, line


@pytest.mark.parametrize("where", ["header", "body"])
def test_autotune_from_a_binary_file_is_one_line(tmp_path: Path, where: str) -> None:
    """Before: a warning per line of the file (8,127 of them)."""
    rng = np.random.default_rng(4848)
    log = tmp_path / "autotune.csv"
    head = b"" if where == "header" else (LOG_HEADER + "\n").encode()
    log.write_bytes(head + rng.bytes(300_000))
    result = hvdprof("run", "-np", "1", "--autotune-from", str(log), "true", timeout=60)
    assert result.returncode == 2
    error_line(result)


# ----------------------------------------------------------------------------- 2, 3


def _horovod_variants(root: Path) -> dict[str, Path]:
    """The Horovod fixture as an editor or a compressor could leave it."""
    data = HOROVOD_TIMELINE.read_bytes()
    packed = gzip.compress(data)
    made = {
        "utf16": ("horovod-timeline.json", codecs.BOM_UTF16_LE + data.decode().encode("utf-16-le")),
        "utf16be": ("horovod-timeline.json", codecs.BOM_UTF16_BE + data.decode().encode("utf-16-be")),
        "utf8bom": ("horovod-timeline.json", codecs.BOM_UTF8 + data),
        "gzip": ("horovod-timeline.json.gz", packed),
        "gzip-cut": ("horovod-timeline.json.gz", packed[: len(packed) * 2 // 3]),
    }  # fmt: skip
    out = {}
    for kind, (name, content) in made.items():
        (root / kind).mkdir()
        (root / kind / name).write_bytes(content)
        out[kind] = root / kind
    return out


def test_a_horovod_timeline_in_utf16_or_gzipped_is_read(tmp_path: Path) -> None:
    from hvdprof.analysis import load_run

    whole = load_run(str(HOROVOD_TIMELINE), cache=False)
    variants = _horovod_variants(tmp_path)
    for kind in ("utf16", "utf16be", "utf8bom", "gzip"):
        result = hvdprof("analyze", str(variants[kind]))
        assert result.returncode == 0, (kind, result.stderr[-2000:])
        said = " ".join(result.stdout.split())  # (wrapped to the terminal's width)
        assert "horovod timeline, 2 rank(s)" in said, (kind, said[:500])
        run = load_run(str(variants[kind]), cache=False)
        assert (run.format, run.events, run.problems) == ("horovod", whole.events, []), kind


def test_a_cut_gzipped_horovod_timeline_is_read_up_to_the_cut_said_once(tmp_path: Path) -> None:
    """Before: "no timeline files (rank.<r>.json or a Horovod timeline)"."""
    from hvdprof.analysis import load_run

    cut = _horovod_variants(tmp_path)["gzip-cut"]
    result = hvdprof("analyze", str(cut), "--json")
    assert result.returncode == 1, result.stderr[-2000:]
    assert "no timeline files" not in result.stderr
    problems = json.loads(result.stdout)["problems"]
    said = [p for p in problems if "cut" in p["reason"] and "gzip" in p["reason"]]
    assert len(said) == 1, problems
    assert not any("closing ']'" in p["reason"] for p in problems), problems
    run = load_run(str(cut), cache=False)
    whole = load_run(str(HOROVOD_TIMELINE), cache=False)
    assert 0 < run.events < whole.events and run.ranks == [0, 1]
    # cut before anything says what it held: refused, saying so
    stub = tmp_path / "stub"
    stub.mkdir()
    (stub / "horovod-timeline.json.gz").write_bytes(
        gzip.compress(HOROVOD_TIMELINE.read_bytes())[:60]
    )
    result = hvdprof("analyze", str(stub))
    assert result.returncode == 2
    line = error_line(result)
    assert "gzip stream is cut after 60 bytes" in line and "no timeline files" not in line, line


def test_a_kineto_trace_with_a_utf8_byte_order_mark_is_read(tmp_path: Path) -> None:
    """Before: "not a readable Kineto trace (JSON is malformed: invalid character (byte 0))"."""
    from hvdprof.analysis import load_run

    run_dir = tmp_path / "ddp"
    run_dir.mkdir()
    for path in sorted(KINETO_DDP.glob("*.pt.trace.json.gz")):
        text = gzip.decompress(path.read_bytes())
        (run_dir / path.name.removesuffix(".gz")).write_bytes(codecs.BOM_UTF8 + text)
    result = hvdprof("analyze", str(run_dir))
    assert result.returncode == 0, result.stderr[-2000:]
    plain = load_run(str(KINETO_DDP), cache=False)
    marked = load_run(str(run_dir), cache=False)
    assert (marked.format, marked.ranks, marked.events) == ("kineto", [0, 1], plain.events)
    assert marked.problems == []


# ----------------------------------------------------------------------------- 4, 5


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """A real ``hvdprof dashboard`` over the Horovod fixture: (base URL, run id)."""
    from dashboard_support import get

    root = tmp_path_factory.mktemp("served")
    shutil.copy(HOROVOD_TIMELINE, root / "horovod_timeline.json")
    with dashboard_server(root) as base:
        status, body = get(base + "api/runs")
        assert status == 200
        yield base, json.loads(body)["runs"][0]["id"]


def _port(base: str) -> int:
    return int(base.rstrip("/").rsplit(":", 1)[1])


def _raw(port: int, request: bytes) -> bytes:
    """The server's answer to ``request`` as sent, byte for byte (no client fixing it)."""
    with socket.create_connection(("127.0.0.1", port), timeout=20) as s:
        s.sendall(request)
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    return answer


def _api(base: str, query: str) -> tuple[int, dict[str, Any]]:
    from dashboard_support import get

    status, body = get(base + "api/timeline?" + query)
    return status, json.loads(body)


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "NaN", "Infinity"])
def test_a_window_edge_that_is_no_number_is_refused(served: tuple[str, str], value: str) -> None:
    """Before: 200 with a window of null."""
    from urllib.parse import quote

    base, run = served
    for edge in ("t0_us", "t1_us"):
        status, body = _api(base, f"run={quote(run)}&{edge}={value}")
        assert status == 422, (edge, value, body)
        assert edge in json.dumps(body) and "finite" in json.dumps(body), body


def test_a_rank_the_run_lacks_is_refused_naming_its_ranks(served: tuple[str, str]) -> None:
    """Before: 200 with empty rows and no notice."""
    from urllib.parse import quote

    base, run = served
    for lanes in ("tensor", "phase"):
        status, body = _api(base, f"run={quote(run)}&expand_rank=64&lanes={lanes}")
        assert status == 422, body
        assert "no rank 64" in body["detail"] and "0-1" in body["detail"], body
    status, body = _api(base, f"run={quote(run)}&expand_rank=1")
    assert status == 200 and body["data"] is not None


@pytest.mark.parametrize(
    "headers",
    [
        b"Host: localhost:{port}@evil.example\r\n",
        b"Host: 127.0.0.1:{port}@evil.example\r\n",
        b"Host: localhost:{port}\r\nHost: evil.example\r\n",
        b"Host: evil.example\r\nHost: localhost:{port}\r\n",
        b"Host: localhost:{port}\r\nOrigin: http://localhost:{port}\r\nOrigin: http://evil.example\r\n",
        b"Host: localhost:{port}/evil\r\n",
        b"Host: localhost :{port}\r\n",
    ],
)
def test_a_host_header_that_is_not_one_host_is_refused(
    served: tuple[str, str], headers: bytes
) -> None:
    base, _ = served
    port = _port(base)
    request = (
        b"GET /api/runs HTTP/1.1\r\n"
        + headers.replace(b"{port}", str(port).encode())
        + b"Connection: close\r\n\r\n"
    )
    answer = _raw(port, request)
    status = answer.split(b"\r\n", 1)[0]
    assert status.split()[1] in (b"400", b"403"), answer[:300]
    assert b"horovod_timeline" not in answer
    # the same request, well formed, is answered
    good = _raw(port, f"GET /api/runs HTTP/1.1\r\nHost: localhost:{port}\r\n"
                      "Connection: close\r\n\r\n".encode())  # fmt: skip
    assert good.startswith(b"HTTP/1.1 200"), good[:300]


# ----------------------------------------------------------------------------- 6 (Ray)


def _ray_executor(**settings: Any) -> Any:
    from hvdprof.ray import RayExecutor

    return RayExecutor(RayExecutor.create_settings(**settings), num_workers=2)


@pytest.mark.timeout(240)
@pytest.mark.usefixtures("ray_cluster")
def test_a_ray_worker_that_calls_os_exit_is_said_to_have_exited(
    capfd: pytest.CaptureFixture[str],
) -> None:
    """Before: "died: its process (pid N) ended (SYSTEM_ERROR: Worker unexpectedly exits
    with a connection error code 2. End of file)"."""
    import ray_exits

    from hvdprof.ray import WorkerFailedError

    job = _ray_executor(timeout_s=30, failure_grace_s=5)
    try:
        job.start()
        with pytest.raises(WorkerFailedError) as raised:
            job.run(ray_exits.exit_on, kwargs={"rank": 1, "code": 3})
        err = raised.value
        assert err.rank == 1 and err.died, str(err)
        assert f"its process (pid {job.places[1].pid}) exited with os._exit(3)" in str(err)
        assert "connection error" not in str(err)
    finally:
        job.shutdown()
    assert "exited with os._exit(3)" in capfd.readouterr().err


@pytest.mark.timeout(240)
@pytest.mark.usefixtures("ray_cluster")
def test_a_rank_late_to_init_is_the_one_named(capfd: pytest.CaptureFixture[str]) -> None:
    """Before: rank 0 was named, whose rendezvous timed out waiting for rank 1."""
    import ray_exits

    from hvdprof.ray import WorkerFailedError

    job = _ray_executor(timeout_s=4, failure_grace_s=3)
    try:
        job.start()
        with pytest.raises(WorkerFailedError) as raised:
            job.run(ray_exits.init_late, kwargs={"rank": 1, "late_s": 60})
        err = raised.value
        assert err.rank == 1 and not err.died, str(err)
        assert "late to hvd.init()" in str(err) and "rank 0" in str(err), str(err)
    finally:
        job.shutdown()
    assert "hvdprof ray: rank 1 (" in capfd.readouterr().err


def test_the_docs_say_what_timeout_s_bounds() -> None:
    text = (REPO / "docs" / "running.md").read_text()
    assert "`timeout_s` bounds two waits only" in text
    assert "It does not bound the user's function" in text


# ----------------------------------------------------------------------------- numpy


def test_interval_arithmetic_on_times_like_1e308_warns_nothing() -> None:
    """Before: "RuntimeWarning: overflow encountered in add" (intervals.py, the sort key)
    and "invalid value encountered in subtract", from a trace whose times were 1.7e308
    or infinite (a ``ProfilerStep#inf`` case of the fuzzer)."""
    from hvdprof.analysis.intervals import exclusive_segments, intersection_length, merge

    start = np.array([0.0, 10.0, -1.7e308, 1e308, np.inf, 20.0])
    end = np.array([5.0, 12.0, 1.7e308, 1.7e308, np.inf, np.nan])
    lane = np.array([0, 1, 0, 1, 2, 1])
    prio = np.array([0, 1, 0, 1, 0, 0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        g, s, length, _ = exclusive_segments(lane, start, end, prio)
        starts, ends = merge(start, end)
        both = intersection_length(start, end, start, end)
    assert list(g) == [0, 1] and list(s) == [0.0, 10.0] and list(length) == [5.0, 2.0]
    assert list(starts) == [0.0, 10.0] and list(ends) == [5.0, 12.0] and both == 7.0


# ----------------------------------------------------------------------------- output files


def test_report_output_is_not_written_over_a_fifo_a_link_or_a_trace(tmp_path: Path) -> None:
    """Before: a FIFO or a link replaced by the HTML, a rank's trace overwritten."""
    run = tmp_path / "run"
    shutil.copytree(DEMO, run)
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    elsewhere = tmp_path / "elsewhere.html"
    elsewhere.write_text("keep")
    link = tmp_path / "link.html"
    link.symlink_to(elsewhere)
    trace = run / "rank.0.json.gz"
    before = _digest(trace)
    for target, says in ((fifo, "a FIFO"), (link, "a symbolic link"), (trace, "a trace")):
        result = hvdprof("report", str(run), "-o", str(target))
        assert result.returncode == 2, result.stderr[-2000:]
        assert says in error_line(result)
    assert fifo.is_fifo() and link.is_symlink() and elsewhere.read_text() == "keep"
    assert _digest(trace) == before
    assert not [p for p in tmp_path.iterdir() if ".tmp" in p.name]
    result = hvdprof("report", str(run), "-o", str(tmp_path / "new.html"))
    assert result.returncode == 0, result.stderr[-2000:]
    assert (tmp_path / "new.html").read_text().lstrip().startswith("<!")


def test_timeline_merge_is_not_written_over_a_file_of_the_run(tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(DEMO, run)
    trace = run / "rank.1.json.gz"
    before = _digest(trace)
    result = hvdprof("timeline", "merge", str(run), "-o", str(trace))
    assert result.returncode == 2
    assert "a file of a run" in error_line(result)
    assert _digest(trace) == before
    merged = tmp_path / "merged.json"
    for _ in range(2):  # an older merged trace is renewed
        result = hvdprof("timeline", "merge", str(run), "-o", str(merged))
        assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(merged.read_text())


def test_ab_json_is_not_written_over_a_fifo(tmp_path: Path) -> None:
    """``ab --json`` writes as every output does (before: tmp then os.replace over it)."""
    from hvdprof.analysis.ab_cli import _write_json
    from hvdprof.analysis.output_file import OutputRefused

    fifo = tmp_path / "result.json"
    os.mkfifo(fifo)
    with pytest.raises(OutputRefused, match="a FIFO"):
        _write_json(str(fifo), {"verdict": "pass"})
    assert fifo.is_fifo() and os.listdir(tmp_path) == ["result.json"]
    _write_json(str(tmp_path / "new.json"), {"verdict": "pass"})
    assert json.loads((tmp_path / "new.json").read_text()) == {"verdict": "pass"}


# ----------------------------------------------------------------------------- exit 4

#: runs the real ``hvdprof`` command with one of its functions made to raise a bug
_CRASHING = textwrap.dedent(
    """
    import importlib, sys
    module, name = sys.argv[1].rsplit(".", 1)
    def boom(*args, **kwargs):
        raise ZeroDivisionError("planted")
    setattr(importlib.import_module(module), name, boom)
    from hvdprof.cli import main
    sys.exit(main(sys.argv[2:]))
    """
)


@pytest.mark.parametrize(
    ("planted", "argv"),
    [
        ("hvdprof.cli.markdown_table", ["env"]),
        ("hvdprof.dashboard.report.render_report", ["report", "{tmp}/run", "-o", "{tmp}/r.html"]),
        ("hvdprof.launch.stack_target.parse_pid", ["stacks", "1"]),
    ],
)
def test_a_crash_of_any_command_exits_4(tmp_path: Path, planted: str, argv: list[str]) -> None:
    """Before: Python's exit 1 (for ``env``, ``report``, ``stacks``): what ``analyze``
    and ``diff`` document as "something was skipped"."""
    shutil.copytree(DEMO, tmp_path / "run")  # (its reading writes a cache beside it)
    args = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    result = subprocess.run(
        [sys.executable, "-c", _CRASHING, planted, *args], capture_output=True, text=True,
        timeout=120, cwd=REPO, env=_env(), stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert result.returncode == 4, (result.returncode, result.stderr[-2000:])
    assert "ZeroDivisionError: planted" in result.stderr  # the traceback, for the report
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"hvdprof: internal error in {args[0]} (ZeroDivisionError)"), last
