"""Every example of README.md and docs/*.md marked runnable runs as written.

The convention (an HTML comment on the line before the fence, invisible when rendered):

* ``<!-- runnable -->``: a ``bash`` block runs as one bash script (``set -e``), a
  ``python`` block as ``python block.py``;
* ``<!-- runnable: file=NAME -->``: the block is written to ``NAME`` for the page's later
  blocks (``train.py``), not run;
* ``<!-- runnable: serves -->``: a ``bash`` block whose last line serves until Ctrl+C
  (``hvdprof dashboard``): the lines before it run, then it is started, must print its URL
  and answer there, and stops on SIGINT as from a terminal;
* ``<!-- runnable: ray -->``: a ``python`` block that connects to a running Ray cluster
  (``ray.init(address="auto")``): the test starts a local one first (``ray start --head``
  in a session of its own, stopped afterwards whatever happened), as the doc tells a user.

A page's blocks run in order, in one fresh directory per page that holds a link to the
clone's ``.venv`` (so ``source .venv/bin/activate`` works there as in the clone) and
nothing else; ``.venv/bin`` is first on ``PATH``, as after that line. ``BROWSER=true``
stands in for a desktop's browser (``hvdprof dashboard`` opens one). Each block has a
hard timeout.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
#: The most one block may take (a 2-rank job on a loaded 2-core machine, or Ray's start).
BLOCK_TIMEOUT_S = 300
MARK = re.compile(r"^<!--\s*runnable(?::\s*(?P<how>[^>]*?))?\s*-->\s*$")
FENCE = re.compile(r"^```(?P<lang>\w*)\s*$")


@dataclass(frozen=True)
class Example:
    page: Path
    line: int  # of the fence, 1-based
    lang: str
    how: str  # "", "file=NAME", "serves" or "ray"
    code: str

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"


def examples(page: Path) -> list[Example]:
    """The page's fenced blocks marked runnable, in order."""
    lines = page.read_text().splitlines()
    out = []
    for i, line in enumerate(lines):
        mark = MARK.match(line)
        if not mark:
            continue
        fence = FENCE.match(lines[i + 1]) if i + 1 < len(lines) else None
        assert fence, f"{page.name}:{i + 1}: a runnable mark must sit right before a fence"
        end = next(j for j in range(i + 2, len(lines)) if lines[j].startswith("```"))
        how = (mark.group("how") or "").strip()
        assert how in ("", "serves", "ray") or how.startswith("file="), (page.name, i + 1, how)
        code = "\n".join(lines[i + 2 : end]) + "\n"
        out.append(Example(page, i + 2, fence.group("lang"), how, code))
    return out


MARKED = {page: examples(page) for page in PAGES}


def environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HVDPROF_", "RAY_"))}
    env["PATH"] = f"{REPO / '.venv' / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONUNBUFFERED"] = "1"
    env["BROWSER"] = "true"  # a test machine has no desktop browser to open
    return env


def run_block(example: Example, cwd: Path, env: dict[str, str]) -> str:
    if example.lang == "python":
        script = cwd / f"example_{example.line}.py"
        script.write_text(example.code)
        command = [sys.executable, str(script)]
    else:
        assert example.lang == "bash", example.name
        command = ["bash", "-e", "-c", example.code]
    proc = subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S
    )
    assert proc.returncode == 0, (
        f"{example.name} failed ({proc.returncode}):\n{example.code}\n{proc.stdout}\n{proc.stderr}"
    )
    return proc.stdout + proc.stderr


def run_serving_block(example: Example, cwd: Path, env: dict[str, str]) -> str:
    """All lines but the last, then the last as a server: its URL answers, SIGINT stops it."""
    lines = [x for x in example.code.splitlines() if x.strip()]
    before = Example(example.page, example.line, "bash", "", "\n".join(lines[:-1]) + "\n")
    said = run_block(before, cwd, env) if lines[:-1] else ""
    server = subprocess.Popen(
        ["bash", "-e", "-c", f"exec {lines[-1]}"], cwd=cwd, env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        url, seen = None, []
        deadline = time.monotonic() + 60
        while url is None and time.monotonic() < deadline:
            line = server.stdout.readline() if server.stdout else ""
            if not line and server.poll() is not None:
                break
            seen.append(line)
            found = re.search(r"http://[\w.:/-]+", line)
            url = found.group(0) if found else None
        assert url, f"{example.name}: the server printed no URL:\n{''.join(seen)}"
        with urllib.request.urlopen(url, timeout=30) as response:
            assert response.status == 200, (example.name, url, response.status)
        server.send_signal(signal.SIGINT)  # Ctrl+C
        out, _ = server.communicate(timeout=30)
        assert server.returncode in (0, 130, -signal.SIGINT), (example.name, server.returncode)
        return said + "".join(seen) + out
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(10)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def local_ray_cluster(env: dict[str, str], cpus: int) -> Iterator[str]:
    """``ray start --head`` (``cpus`` logical CPUs) in a session of its own; yields its
    address; stops the whole session afterwards (SIGTERM, then SIGKILL of what is left)."""
    pytest.importorskip("ray", reason="ray is not installed (pip install 'hvdprof[ray]')")
    temp = tempfile.mkdtemp(prefix="hd", dir="/tmp")  # short: Ray's socket paths
    port = _free_port()
    # token auth off on both ends, explicitly (an earlier local ray.init() leaves a token
    # file that would turn it on for the head alone; see tests/test_ray.py)
    head_env = {**env, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
    log = Path(temp) / "head.log"
    command = [
        str(REPO / ".venv" / "bin" / "ray"), "start", "--head", "--block", "--num-cpus",
        str(cpus), "--include-dashboard", "false", "--disable-usage-stats", "--temp-dir", temp,
        "--port", str(port), "--node-ip-address", "127.0.0.1",
    ]  # fmt: skip
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=head_env, start_new_session=True,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while b"block forever" not in log.read_bytes():
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"ray start failed:\n{log.read_text(errors='replace')[-4000:]}")
            time.sleep(0.3)
        yield f"127.0.0.1:{port}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)
        subprocess.run(["rm", "-rf", temp], check=False, timeout=60)


def test_the_runnable_marks_are_where_the_docs_need_them() -> None:
    marked = {page.relative_to(REPO).as_posix(): [e.how for e in ex] for page, ex in MARKED.items()}
    assert marked["README.md"] == ["file=train.py", "serves", ""]
    assert marked["docs/running.md"] == ["ray"]


@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    "page", [p for p in PAGES if MARKED[p]], ids=lambda p: p.relative_to(REPO).as_posix()
)
def test_runnable_examples_run_as_written(page: Path, tmp_path: Path) -> None:
    cwd = tmp_path / "fresh"
    cwd.mkdir()
    (cwd / ".venv").symlink_to(REPO / ".venv")
    env = environment()
    for example in MARKED[page]:
        if example.how.startswith("file="):
            (cwd / example.how.removeprefix("file=")).write_text(example.code)
        elif example.how == "serves":
            said = run_serving_block(example, cwd, env)
            check_output(example, said, cwd)
        elif example.how == "ray":
            workers = int(re.search(r"num_workers=(\d+)", example.code).group(1))
            with local_ray_cluster(env, cpus=workers) as address:
                said = run_block(example, cwd, {**env, "RAY_ADDRESS": address})
            check_output(example, said, cwd)
        else:
            check_output(example, run_block(example, cwd, env), cwd)


def check_output(example: Example, said: str, cwd: Path) -> None:
    """What each example promises besides exiting 0."""
    if example.how == "serves":  # the README's first commands: a run, its analysis, the page
        assert (cwd / "tl").is_dir() and "hvdprof dashboard: serving" in said, said
        assert "straggler" in said.lower(), said
    elif example.how == "ray":  # one result per rank, and the timeline gathered
        assert "[0, 1, 2, 3]" in said, said
        assert (cwd / "tl" / "ray.json").is_file(), sorted(p.name for p in cwd.rglob("*"))
    elif "hvd.rank()" in example.code:
        assert "rank 0 of 2" in said and "rank 1 of 2" in said, said
