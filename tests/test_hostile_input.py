"""Hostile and unusual input files (issue 34): a result or a listed problem, never a
traceback, a 5xx or gigabytes of memory.

The cases are in ``tests/hostile_fuzz.py``: every input the issue listed, and mutations of
real Kineto, Horovod and hvdprof files by a seeded generator. ``HOSTILE_FUZZ_CASES`` sets
how many mutated cases the fuzz test checks (default 20: about 30 s here; the note of
issue 34 reports a run of thousands) and ``HOSTILE_FUZZ_SEED`` their seed (default 34);
``HOSTILE_FUZZ_SURFACES`` how many cases on the gate, summary, ``--autotune-from`` and
environment surfaces it adds (issue 48; default 20, the same seed).
"""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from dashboard_support import child_env, dashboard_server
from hostile_fuzz import materialize, named_cases, seed_runs

pytestmark = pytest.mark.timeout(900)

REPO = Path(__file__).resolve().parents[1]
#: the bound on peak memory the issue asks for (files under 10 MB)
PEAK_BYTES = 1 << 30
CASES = int(os.environ.get("HOSTILE_FUZZ_CASES", "20"))
SEED = int(os.environ.get("HOSTILE_FUZZ_SEED", "34"))
SURFACES = int(os.environ.get("HOSTILE_FUZZ_SURFACES", "20"))


def _spawn_peak(argv: list[str], timeout: float, env: dict[str, str]) -> tuple[int, str, str, int]:
    """``(exit code, stdout, stderr, peak RSS in bytes)`` of a child process: its peak
    read from ``os.wait4`` of that very child (not the running maximum of all children)."""
    with open(os.devnull, "rb") as devnull:
        proc = subprocess.Popen(
            argv, stdin=devnull, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO, env=env
        )
    deadline = time.monotonic() + timeout
    chunks: dict[str, list[bytes]] = {"out": [], "err": []}
    import selectors

    sel = selectors.DefaultSelector()
    assert proc.stdout is not None and proc.stderr is not None
    sel.register(proc.stdout, selectors.EVENT_READ, "out")
    sel.register(proc.stderr, selectors.EVENT_READ, "err")
    open_streams = 2
    while open_streams:
        left = deadline - time.monotonic()
        if left <= 0:
            proc.kill()
            os.wait4(proc.pid, 0)
            pytest.fail(f"{argv[-4:]} did not finish in {timeout} s")
        for key, _ in sel.select(timeout=min(left, 1.0)):
            data = os.read(key.fileobj.fileno(), 1 << 16)  # type: ignore[union-attr]
            if data:
                chunks[key.data].append(data)
            else:
                sel.unregister(key.fileobj)
                open_streams -= 1
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    peak = usage.ru_maxrss * 1024  # kilobytes on Linux
    return (
        proc.returncode,
        b"".join(chunks["out"]).decode(errors="replace"),
        b"".join(chunks["err"]).decode(errors="replace"),
        peak,
    )


def test_fuzzed_real_files_give_results_or_problems_within_a_gigabyte(tmp_path: Path) -> None:
    """Every named input and CASES mutated real files: load, analyze, diff both ways and
    every dashboard route, in one child process whose peak memory stays under 1 GiB."""
    report = tmp_path / "report.json"
    code, out, err, peak = _spawn_peak(
        [sys.executable, str(REPO / "tests" / "hostile_fuzz.py"), "--cases", str(CASES),
         "--seed", str(SEED), "--surfaces", str(SURFACES), "--out", str(report)],
        timeout=840,
        env=child_env(),
    )  # fmt: skip
    assert report.exists(), f"rc {code}\n{out[-3000:]}\n{err[-5000:]}"
    result = json.loads(report.read_text())
    assert result["failures"] == [], "\n".join(result["failures"][:40])
    assert code == 0, err[-3000:]
    assert result["cases"]["mutated"] == CASES and result["cases"]["named"] >= 30
    assert result["cases"].get("surface", 0) == SURFACES
    assert peak < PEAK_BYTES, f"peak RSS {peak / 2**20:.0f} MiB"


#: named cases the CLI is run on, and the exit code it must give (1: read, with problems)
CLI_CASES = {
    "rank-2000000000": 1,
    "rank0-no-collectives-no-base": 0,
    "nested-args": 1,
    "gzip-bomb-kineto": 1,
    "directory-fifo-links": 1,
    "only-a-fifo": 2,
    "escape-codes-in-names": 0,
    "non-utf8-directory": 0,
    "hvdprof-ready-rank-2pow40": 1,
    "horovod-rank-mark-huge": 1,
}


@pytest.fixture(scope="module")
def named(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hostile")
    cases = {c.name: c for c in named_cases(seed_runs())}
    return {name: materialize(cases[name], root) for name in CLI_CASES}


def test_analyze_exit_codes_follow_its_help_and_names_are_escaped(named: dict[str, Path]) -> None:
    """0 only when everything was read, 1 when something was skipped (listed), 2 when
    nothing could be; no traceback, no terminal escape code from a file name, and no
    blocking on a FIFO named like a trace."""
    for name, expected in CLI_CASES.items():
        path = str(named[name])
        code, out, err, peak = _spawn_peak(
            [sys.executable, "-m", "hvdprof", "analyze", "--no-cache", path],
            timeout=120,
            env=child_env(),
        )
        assert "Traceback" not in err, f"{name}:\n{err[-3000:]}"
        assert code == expected, f"{name}: rc {code}\n{out[-2000:]}\n{err[-2000:]}"
        assert "\x1b" not in out + err, f"{name}: a raw escape code was printed"
        assert peak < PEAK_BYTES, f"{name}: peak RSS {peak / 2**20:.0f} MiB"
        if expected == 2:
            assert err.startswith("hvdprof: error:") and len(err.strip().splitlines()) == 1, err
            continue
        code_json, out_json, _, _ = _spawn_peak(
            [sys.executable, "-m", "hvdprof", "analyze", "--no-cache", "--json", path],
            timeout=120,
            env=child_env(),
        )
        problems = json.loads(out_json)["problems"]
        assert code_json == (1 if problems else 0), (name, code_json, problems)


def test_diff_of_hostile_runs_answers(named: dict[str, Path]) -> None:
    code, _, err, peak = _spawn_peak(
        [sys.executable, "-m", "hvdprof", "diff", "--no-cache",
         str(named["rank0-no-collectives-no-base"]), str(named["rank-2000000000"])],
        timeout=120,
        env=child_env(),
    )  # fmt: skip
    assert "Traceback" not in err and code == 1, (code, err[-3000:])
    assert peak < PEAK_BYTES


def test_the_dashboard_answers_hostile_runs_on_one_keep_alive_connection(tmp_path: Path) -> None:
    """A real server: every run of the served directory (a symlink loop, a FIFO, a
    non-UTF-8 directory name, rank 2000000000 ...) answers below 500 on one connection
    that is never reset."""
    root = tmp_path / "served"
    root.mkdir()
    cases = {c.name: c for c in named_cases(seed_runs())}
    for name in ("rank-2000000000", "directory-fifo-links", "non-utf8-directory",
                 "escape-codes-in-names", "pid-object", "lone-surrogate-names"):  # fmt: skip
        materialize(cases[name], root)
    os.symlink("loop.json", root / "loop.json")
    with dashboard_server(root) as base:
        host, port = base.split("//")[1].rstrip("/").split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=60)
        try:

            def ask(path: str) -> tuple[int, dict]:
                conn.request("GET", path)
                response = conn.getresponse()
                body = response.read()
                assert response.status < 500, (path, response.status, body[:500])
                return response.status, json.loads(body)

            status, runs = ask("/api/runs")
            assert status == 200
            sock = conn.sock
            ids = [r["id"] for r in runs["runs"]]
            assert len(ids) >= 6, ids
            from urllib.parse import quote

            for run_id in ids:
                for route in ("/api/run", "/api/analysis/report", "/api/timeline"):
                    status, body = ask(f"{route}?run={quote(run_id)}")
                    assert status == 200, (run_id, route, body)
                    assert conn.sock is sock, "the server closed the keep-alive connection"
        finally:
            conn.close()


def test_a_parse_past_the_dashboards_memory_limit_is_a_notice_on_that_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The dashboard parses each run in a process limited by
    HVDPROF_DASHBOARD_PARSE_MEMORY (RLIMIT_AS): a parse that needs more is a notice on
    that run (200), the server goes on answering, and a later run within the limit is
    read."""
    from fastapi.testclient import TestClient

    from hvdprof.config import name_of
    from hvdprof.dashboard.app import create_app
    from hvdprof.dashboard.settings import DashboardSettings

    root = tmp_path / "served"
    root.mkdir()
    seeds = seed_runs()
    from hostile_fuzz import Case

    bomb = next(c for c in named_cases(seeds) if c.name == "gzip-bomb-kineto")
    materialize(Case("bomb", bomb.files), root)
    materialize(Case("ddp", dict(seeds["kineto-ddp"])), root)
    variable = name_of("dashboard_parse_memory")
    # the bomb inflates to 300 MiB once its ratio is allowed: more than 64 MiB beyond
    # what the parse process inherits
    monkeypatch.setenv(name_of("read_max_inflate_ratio"), "1000000")
    monkeypatch.setenv(variable, str(64 << 20))
    client = TestClient(create_app(DashboardSettings(root)), base_url="http://127.0.0.1")
    response = client.get("/api/run", params={"run": "bomb"})
    assert response.status_code == 200, response.text
    info = response.json()
    said = " ".join(info["notices"] + [p["reason"] for p in info["problems"]])
    assert variable in said or "MemoryError" in said, response.text
    assert client.get("/api/analysis/report", params={"run": "bomb"}).status_code == 200
    assert client.get("/api/health").status_code == 200
    monkeypatch.setenv(variable, str(1 << 30))
    response = client.get("/api/run", params={"run": "ddp"})
    assert response.status_code == 200 and response.json()["ranks"] == [0, 1], response.text


def test_a_fifo_given_as_kineto_trace_is_a_problem_not_a_hang(named: dict[str, Path]) -> None:
    fifo = named["only-a-fifo"] / "f.pt.trace.json"
    code, _, err, _ = _spawn_peak(
        [sys.executable, "-m", "hvdprof", "analyze", "--no-cache",
         str(REPO / "tests" / "data" / "hvdprof-demo"), "--kineto", str(fifo)],
        timeout=120,
        env=child_env(),
    )  # fmt: skip
    assert code == 1 and "Traceback" not in err, (code, err[-2000:])


def test_names_that_look_like_rich_markup_are_printed_as_they_are(tmp_path: Path) -> None:
    """A directory path holding ``[red]`` and ``[/red]`` (``x[red]y[`` / ``red]z``) is
    text: rich's markup would have dropped the tags from the name, and an unmatched
    closing tag (``a[`` / ``b]`` reads ``[/b]``) ended analyze and diff in a MarkupError
    traceback."""
    import shutil

    runs = [tmp_path / "x[red]y[" / "red]z", tmp_path / "a[" / "b]"]
    for run in runs:
        shutil.copytree(REPO / "tests" / "data" / "hvdprof-demo", run)
    for argv in (["analyze", str(runs[0])], ["analyze", str(runs[1])], ["diff", *map(str, runs)]):
        code, out, err, _ = _spawn_peak(
            [sys.executable, "-m", "hvdprof", *argv, "--no-cache"], timeout=120, env=child_env()
        )
        assert "Traceback" not in err and code == 0, (argv, code, err[-3000:])
        flat = " ".join(out.split())  # rich wraps long titles
        for run in runs if argv[0] == "diff" else [Path(argv[1])]:
            assert str(run) in flat, (argv, out[:2000])
