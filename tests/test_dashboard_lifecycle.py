"""``hvdprof run --timeline DIR --dashboard`` outlives its job, and stops without a traceback.

A real 2-rank job with the dashboard beside it and a live-update stream open (as a page
keeps one): when the job ends the launcher says the dashboard still serves the finished
run, the API answers for it as a finished run, and Ctrl+C (SIGINT) stops it with the
job's exit code and no traceback (uvicorn used to cancel the open stream after its
graceful-shutdown timeout and log the ``CancelledError``). ``--dashboard-exit`` stops
the dashboard with the job instead.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
from conftest import WORKERS
from dashboard_support import REPO, child_env, free_port, get

#: Launcher timeout for the job, and how long each wait on its output may take.
JOB_TIMEOUT_S = 120
WAIT_S = 90


def start(timeline: Path, port: int, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "hvdprof", "run", "-np", "2", "--timeout", str(JOB_TIMEOUT_S),
         "--timeline", str(timeline), "--dashboard", "--dashboard-port", str(port), *extra,
         "--", sys.executable, str(WORKERS / "analysis_worker.py"), "--steps", "30"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=child_env(), cwd=REPO,
    )  # fmt: skip


class Output:
    """The launcher's output, read by a thread so that a wait can have a deadline."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._read, args=(proc,), daemon=True)
        self._thread.start()

    def _read(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            with self._changed:
                self.lines.append(line)
                self._changed.notify_all()

    def wait_for(self, pattern: str) -> re.Match[str]:
        deadline = time.monotonic() + WAIT_S
        with self._changed:
            while True:
                for line in self.lines:
                    match = re.search(pattern, line)
                    if match:
                        return match
                left = deadline - time.monotonic()
                if left <= 0:
                    pytest.fail(f"no line matching {pattern!r} in:\n{self.text}")
                self._changed.wait(left)

    @property
    def text(self) -> str:
        return "".join(self.lines)

    def join(self) -> None:
        self._thread.join(WAIT_S)


def open_stream(url: str) -> threading.Thread:
    """A live-update stream held open the way a page holds one, until the server ends it."""

    def read() -> None:
        try:
            with urllib.request.urlopen(url + "api/events", timeout=WAIT_S) as response:
                while response.readline():
                    pass
        except OSError:
            pass

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread


def stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait(30)


def test_dashboard_keeps_serving_the_finished_run_until_ctrl_c(tmp_path: Path) -> None:
    port = free_port()
    proc = start(tmp_path / "tl", port)
    try:
        out = Output(proc)
        url = out.wait_for(r"hvdprof dashboard: (http://\S+) \(live while the job runs\)")[1]
        stream = open_stream(url)
        out.wait_for(r"the job ended \(exit code 0\); still serving the finished run")
        assert proc.poll() is None, "the launcher exited with the job"
        status, body = get(url + "api/run?run=.", timeout=30)
        info = json.loads(body)
        assert status == 200 and info["complete"] is True and info["ranks"] == [0, 1]
        proc.send_signal(signal.SIGINT)  # Ctrl+C
        assert proc.wait(WAIT_S) == 0  # the job's exit code
        out.join()
        stream.join(WAIT_S)
        assert not stream.is_alive(), "the live stream was left open"
        assert "Traceback" not in out.text and "CancelledError" not in out.text, out.text
        assert "graceful shutdown" not in out.text, out.text
        assert "hvdprof dashboard: stopped" in out.text
    finally:
        stop(proc)


def test_dashboard_exit_stops_with_the_job(tmp_path: Path) -> None:
    port = free_port()
    proc = start(tmp_path / "tl", port, "--dashboard-exit")
    try:
        out = Output(proc)
        url = out.wait_for(r"hvdprof dashboard: (http://\S+) \(live while the job runs\)")[1]
        stream = open_stream(url)
        assert proc.wait(JOB_TIMEOUT_S + 30) == 0
        out.join()
        stream.join(WAIT_S)
        assert "still serving" not in out.text
        assert "Traceback" not in out.text and "graceful shutdown" not in out.text, out.text
    finally:
        stop(proc)
