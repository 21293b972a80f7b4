"""Helpers for the dashboard tests: a real 2-rank run, and a real server process.

The run is made once per test session by the real launcher (2 ranks, timeline and
autotune on, the demo job), so the API and browser tests read what hvdprof writes.
The server is ``python -m hvdprof dashboard`` on a free loopback port, started and
stopped with hard timeouts, so a broken server fails a test instead of hanging it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
#: Launcher timeout for the demo job the tests read (it takes ~20 s on a loaded 2-core VM).
RUN_TIMEOUT_S = 200
#: How long a server gets to answer /api/health after starting.
SERVER_START_TIMEOUT_S = 30
HOROVOD_TIMELINE = Path(__file__).resolve().parent / "data" / "horovod-timeline.json"


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HVDPROF_")}
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def make_real_run(directory: Path, *, epochs: int = 2, autotune: bool = True) -> Path:
    """A real 2-rank training (the demo job) with its timeline in ``directory``."""
    command = [
        sys.executable, "-m", "hvdprof", "run", "-np", "2", "--timeout", str(RUN_TIMEOUT_S),
        "--timeline", str(directory),
        *(["--autotune", "--autotune-log", str(directory / "autotune.csv")] if autotune else []),
        "--", sys.executable, "-m", "hvdprof.demo", "--epochs", str(epochs),
    ]  # fmt: skip
    # one allreduce per gradient (HVDPROF_BUCKET_BYTES=0, as Horovod records): the page
    # tests need a run with enough events that the whole-run view is binned
    env = child_env(
        {
            "HVDPROF_AUTOTUNE_WARMUP_SAMPLES": "1",
            "HVDPROF_AUTOTUNE_STEPS_PER_SAMPLE": "3",
            "HVDPROF_BUCKET_BYTES": "0",
        }
    )
    proc = subprocess.run(
        command, capture_output=True, text=True, timeout=RUN_TIMEOUT_S + 30, env=env, cwd=REPO
    )
    assert proc.returncode == 0, (
        f"demo run failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    )
    return directory


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str, timeout: float = 10.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


@contextlib.contextmanager
def dashboard_server(
    directory: Path, *extra: str, env: dict[str, str] | None = None
) -> Iterator[str]:
    """``hvdprof dashboard DIR`` on a free port (with ``env`` added to its environment);
    yields its base URL, stops it after."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "hvdprof", "dashboard", str(directory), "--port", str(port),
         "--no-browser", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=child_env(env), cwd=REPO,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + SERVER_START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                out = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
                pytest.fail(f"dashboard exited with {proc.returncode}:\n{out}")
            with contextlib.suppress(OSError):
                token = [a for a in extra if a != "--token"]
                query = f"?token={token[-1]}" if "--token" in extra else ""
                if get(base + "api/health" + query, timeout=2)[0] == 200:
                    break
            if time.monotonic() > deadline:
                pytest.fail(f"dashboard did not answer within {SERVER_START_TIMEOUT_S} s")
            time.sleep(0.1)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


#: Debian's chromium as the browser tests drive it (never a downloaded browser)
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]
#: Playwright's own limit on any one wait (ms): a broken page fails instead of hanging.
WAIT_MS = 60_000


@contextlib.contextmanager
def launched_chromium() -> Iterator[object]:
    """Debian's chromium under Playwright (skips as :func:`chromium_or_skip` does)."""
    executable = chromium_or_skip()
    playwright_api = pytest.importorskip("playwright.sync_api")
    with playwright_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS, timeout=WAIT_MS)
        try:
            yield browser
        finally:
            browser.close()


def open_page(
    browser: Any,
    url: str,
    settle_ms: int = 0,
    width: int = 1400,
    *,
    offline: bool = False,
    requests: list[str] | None = None,
) -> tuple[Any, list[str]]:
    """A new page at ``url``, ``width`` px wide, once the dashboard says it is ready, with
    the page errors it collects (a test asserts there are none); ``settle_ms`` lets Plotly
    finish drawing. ``offline``: no network at all (``hvdprof report``'s file must need
    none); ``requests`` collects every URL the page asked for."""
    page = browser.new_page(offline=offline, viewport={"width": width, "height": 950})
    page.set_default_timeout(WAIT_MS)
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    if requests is not None:
        page.on("request", lambda r: requests.append(r.url))
    page.goto(url)
    page.wait_for_selector("body[data-ready='1']")
    if settle_ms:
        page.wait_for_timeout(settle_ms)
    return page, errors


def chromium_or_skip() -> str:
    """Debian's chromium; skip (or fail under CI=true, which installs it) when missing."""
    path = shutil.which("chromium")
    if path is None:
        if os.environ.get("CI") == "true":
            pytest.fail("chromium is missing but CI=true: .ci/setup should have installed it")
        pytest.skip("chromium is not installed (apt-get install chromium)")
    return path


def shared_real_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One real run per test session, shared by every dashboard test module."""
    base = tmp_path_factory.getbasetemp() / "dashboard-real-run"
    done = base / ".made"
    if not done.exists():
        shutil.rmtree(base, ignore_errors=True)
        (base / "run").mkdir(parents=True)
        make_real_run(base / "run")
        done.touch()
    return base / "run"


def shared_slow_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One real 2-rank job per test session whose rank 1 sleeps 15 ms before each step
    (the straggler), shared by the page tests that need a slow run."""
    from conftest import run_job

    base = tmp_path_factory.getbasetemp() / "dashboard-slow-run"
    done = base / ".made"
    if not done.exists():
        shutil.rmtree(base, ignore_errors=True)
        base.mkdir(parents=True)
        job = run_job(
            "analysis_worker.py", 2, "--steps", "120", "--sleep-rank", "1", "--sleep-ms", "15",
            launcher_args=("--timeline", str(base / "slow")),
        )  # fmt: skip
        job.assert_done(2)
        done.touch()
    return base / "slow"
