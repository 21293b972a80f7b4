"""Shared helpers for the multi-process tests.

``run_job`` starts a worker script from ``tests/workers`` at N ranks through the real
launcher (``python -m hvdprof run -np N --timeout T -- python worker.py ...``) and
returns its exit code and every rank's output, parsed. Three limits make sure nothing
can hang CI: the launcher's ``--timeout``, a subprocess timeout on the launcher, and a
watchdog inside every worker (``HVDTEST_DEADLINE_S``, see ``workers/_common.py``).

Starting a rank costs a torch import (seconds on a loaded 2-core machine), so each
worker checks many things in one launch, in named sections, printing one
``SECTION <name> OK <n>`` / ``SECTION <name> FAIL ...`` line per section and ``DONE`` at
the end (see ``workers/_common.py``); ``JobResult.assert_section`` turns a section into
a test.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from spark_support import spark_context  # noqa: F401 (the Spark tests' Spark)

TESTS = Path(__file__).resolve().parent
WORKERS = TESTS / "workers"
REPO = TESTS.parent
RANK_LINE = re.compile(r"^\[(\d+)\]<(stdout|stderr)>:(.*)$")
#: Default launcher timeout for one job, in seconds.
JOB_TIMEOUT = 150.0


@dataclass
class JobResult:
    returncode: int
    output: str  # stdout + stderr of the launcher, for failure messages
    elapsed: float
    stdout: dict[int, list[str]] = field(default_factory=dict)
    stderr: dict[int, list[str]] = field(default_factory=dict)
    launcher: list[str] = field(default_factory=list)  # lines that are not a rank's

    def lines(self, rank: int, stream: str = "stdout") -> list[str]:
        return (self.stdout if stream == "stdout" else self.stderr).get(rank, [])

    def text(self, rank: int, stream: str = "stdout") -> str:
        return "\n".join(self.lines(rank, stream))

    def describe(self, limit: int = 12000) -> str:
        text = self.output
        if len(text) > limit:
            text = "...\n" + text[-limit:]
        return f"exit code {self.returncode} after {self.elapsed:.1f} s; output:\n{text}"

    def section(self, rank: int, name: str) -> str | None:
        """The status part of ``rank``'s ``SECTION <name> ...`` line (``OK 12``, ``FAIL ...``)."""
        prefix = f"SECTION {name} "
        found = [line[len(prefix) :] for line in self.lines(rank) if line.startswith(prefix)]
        return found[-1] if found else None

    def assert_section(self, name: str, num_proc: int) -> None:
        """Every rank ran section ``name`` and every check in it passed."""
        statuses = {rank: self.section(rank, name) for rank in range(num_proc)}
        bad = {r: s for r, s in statuses.items() if s is None or not s.startswith("OK ")}
        if bad:
            shown = "\n".join(
                f"  rank {r}: {'no SECTION line (crashed or hung before it)' if s is None else s}"
                for r, s in sorted(bad.items())
            )
            raise AssertionError(f"section {name!r} failed:\n{shown}\n\n{self.describe(6000)}")

    def assert_done(self, num_proc: int) -> None:
        """Exit code 0 and every rank got through every section (``DONE``)."""
        assert self.returncode == 0, self.describe()
        for rank in range(num_proc):
            assert "DONE" in self.lines(rank), f"rank {rank} did not finish; {self.describe()}"

    def values(self, rank: int, tag: str) -> list[str]:
        """The rest of every stdout line of ``rank`` that starts with ``tag + ' '``."""
        prefix = tag + " "
        return [line[len(prefix) :] for line in self.lines(rank) if line.startswith(prefix)]


def child_env(extra: dict[str, str] | None = None, deadline: float = JOB_TIMEOUT) -> dict[str, str]:
    """This environment without any HVDPROF_* variable, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HVDPROF_")}
    env["HVDTEST_DEADLINE_S"] = str(deadline + 10)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def parse_output(text: str, result: JobResult) -> None:
    for line in text.splitlines():
        match = RANK_LINE.match(line)
        if match is None:
            result.launcher.append(line)
            continue
        streams = result.stdout if match[2] == "stdout" else result.stderr
        streams.setdefault(int(match[1]), []).append(match[3])


def start_ranks(
    worker: str | Path, num_proc: int, args: list[str], env: dict[str, str], deadline: float
) -> list[subprocess.Popen]:
    """Ranks started directly, with no launcher: ``hvdprof run`` stops the other ranks
    when one dies, and these tests watch the survivors. Each in its own session, so a
    test can kill a rank's whole process group."""
    from hvdprof.launch.local_job import rank_environment
    from hvdprof.launch.processes import find_free_port

    port = find_free_port()
    procs = []
    for rank in range(num_proc):
        rank_env = rank_environment(child_env(env, deadline=deadline), rank, num_proc, port)
        procs.append(
            subprocess.Popen(
                [sys.executable, str(worker), *args],
                env=rank_env,
                cwd=REPO,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=True,
            )
        )
    return procs


def run_job(
    worker: str,
    num_proc: int,
    *args: str,
    env: dict[str, str] | None = None,
    timeout: float = JOB_TIMEOUT,
    launcher_args: tuple[str, ...] = (),
) -> JobResult:
    """Run ``tests/workers/<worker>`` at ``num_proc`` ranks through ``hvdprof run``.

    ``launcher_args`` go to ``hvdprof run`` before the ``--`` (e.g. ``--timeline DIR``).
    """
    command = [
        sys.executable,
        "-m",
        "hvdprof",
        "run",
        "-np",
        str(num_proc),
        "--timeout",
        str(timeout),
        *launcher_args,
        "--",
        sys.executable,
        str(WORKERS / worker),
        *args,
    ]
    started = time.monotonic()
    try:
        proc = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=timeout + 30,
            env=child_env(env, timeout),
            cwd=REPO,
        )
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        pytest.fail(f"the launcher outlived its own --timeout {timeout:g} s; output:\n{out}")
    result = JobResult(proc.returncode, proc.stdout + proc.stderr, time.monotonic() - started)
    parse_output(proc.stdout, result)
    parse_output(proc.stderr, result)
    return result


def run_in_group(
    argv: list[str], *, env: dict[str, str], cwd: Path, timeout: float
) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` in a session of its own, no stdin; past ``timeout`` kill the whole
    group (launchers leave ranks behind) and fail the test with what it printed."""
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        env=env,
        cwd=cwd,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate(timeout=30)
        pytest.fail(f"{argv[0]} still running after {timeout:g} s; output:\n{out}\n{err}")
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


@pytest.fixture
def hvd_job() -> Callable[..., JobResult]:
    """The ``run_job`` function: ``hvd_job("ops_worker.py", 2, "--flag", env={...})``."""
    return run_job
