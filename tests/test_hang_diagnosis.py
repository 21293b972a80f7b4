"""Hang diagnosis with real ranks: where a late rank is, its stacks on demand, a clear end.

``workers/hang_worker.py`` holds rank 1 somewhere (asleep in ``load_batch``, spinning in
``crunch``, waiting in another collective) until the test creates a release file. Each
test streams the launcher's output and waits, with a generous deadline, for the line it
needs, then checks what the line says (never how fast it came: the machine may be busy).

The SIGUSR1 test is built not to depend on timing: every rank writes a ready file once
its handler is installed (after ``init()``), the signal goes to the launcher only after
both files exist, the test waits for each rank's ``end of stacks`` line, and each rank's
dump is read by its ``[RANK]<stderr>:`` prefix (the launcher writes whole lines, but
two ranks' lines may alternate).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import REPO, WORKERS, child_env, run_job
from launch_support import LAUNCHED, LiveProcess, child_env_mpi, mpi_or_skip, mpirun_prefix

from hvdprof.runtime import stacks
from hvdprof.runtime.stall import Stall, describe_stall

#: the launcher's --timeout for one job; the deadline of any one wait in a test
JOB_S = 150.0
WAIT_S = 120.0
CHECK_S = 2.0
WORKER = WORKERS / "hang_worker.py"


def worker_line(tag: str) -> int:
    """The line of ``hang_worker.py`` marked ``# LINE <tag>``."""
    for number, text in enumerate(WORKER.read_text().splitlines(), start=1):
        if text.rstrip().endswith(f"# LINE {tag}"):
            return number
    raise AssertionError(f"no '# LINE {tag}' in {WORKER}")


class LiveJob(LiveProcess):
    """``hvdprof run -np 2 -- hang_worker.py MODE DIR`` (or, with ``mpirun``, under
    mpirun through ``launched.py``), its output read as it comes."""

    def __init__(
        self,
        mode: str,
        directory: Path,
        env: dict[str, str],
        launcher_args: tuple[str, ...] = (),
        mpirun: bool = False,
    ) -> None:
        self.dir = directory
        if mpirun:
            command = [
                *mpirun_prefix(2), sys.executable, str(LAUNCHED), str(WORKER), mode,
                str(directory),
            ]  # fmt: skip
            full_env = child_env_mpi(env, JOB_S)
        else:
            command = [
                sys.executable, "-m", "hvdprof", "run", "-np", "2", "--timeout", str(JOB_S),
                *launcher_args, "--", sys.executable, str(WORKER), mode, str(directory),
            ]  # fmt: skip
            full_env = child_env(env, JOB_S)
        super().__init__(command, full_env, wait_s=WAIT_S)

    def wait_ready(self) -> None:
        deadline = time.monotonic() + WAIT_S
        while not all((self.dir / f"ready.{r}").exists() for r in (0, 1)):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the ranks never got ready; output:\n{self.output}")
            time.sleep(0.05)

    def release(self) -> None:
        (self.dir / "release").touch()

    def finish(self) -> int:
        """The launcher's exit code; it must end within its own --timeout."""
        return self.wait(JOB_S + 30)


@pytest.fixture
def live_job(tmp_path: Path) -> Iterator[Callable[..., LiveJob]]:
    jobs: list[LiveJob] = []

    def start(mode: str, env: dict[str, str] | None = None, **kw: object) -> LiveJob:
        job = LiveJob(mode, tmp_path, env or {}, **kw)  # type: ignore[arg-type]
        jobs.append(job)
        return job

    try:
        yield start
    finally:
        for job in jobs:
            job.kill()


STALL_ENV = {"HVDPROF_STALL_CHECK_TIME_SECONDS": str(CHECK_S)}
RANK1_LATE = r"^\[0\]<stderr>:hvdprof stall: .*rank 1 has not submitted 'grad\.0' for "


def waited(line: str, rank: int) -> float:
    match = re.search(rf"rank {rank} has not submitted '[^']*' for (\d+\.\d) s", line)
    assert match, line
    return float(match[1])


# ------------------------------------------------------------------ where the late rank is
@dataclass
class AsleepRun:
    line: str
    output: str
    returncode: int
    root: Path  # holds the timeline as root / "stall"


@pytest.fixture(scope="module")
def asleep_run(tmp_path_factory: pytest.TempPathFactory) -> AsleepRun:
    """Rank 1 asleep in ``load_batch`` until rank 0 has reported it, timeline on."""
    root = tmp_path_factory.mktemp("hang-timeline")
    job = LiveJob(
        "sleep",
        tmp_path_factory.mktemp("hang-sleep"),
        STALL_ENV,
        launcher_args=("--timeline", str(root / "stall")),
    )
    try:
        line = job.wait_line(RANK1_LATE)
        job.release()
        code = job.finish()
    finally:
        job.kill()
    return AsleepRun(line, job.output, code, root)


def test_a_rank_asleep_outside_any_collective_is_named_with_its_function_and_line(
    asleep_run: AsleepRun,
) -> None:
    line = asleep_run.line
    assert asleep_run.returncode == 0, asleep_run.output
    where = (
        f"it is in hold_until_released (hang_worker.py:{worker_line('sleep')}) "
        f"<- load_batch (hang_worker.py:{worker_line('load_batch')})"
    )
    assert where in line, line
    assert "not in a collective (slow: data loading, compute or I/O)" in line, line
    assert "rank 0 waits in allreduce 'grad.0' (sequence 2)" in line, line
    assert waited(line, 1) >= CHECK_S, line  # the time waited so far, not a limit
    assert "mismatch" not in line and "deadlock" not in asleep_run.output, asleep_run.output


def test_analyze_lists_the_stall_first(asleep_run: AsleepRun) -> None:
    from hvdprof.analysis import analyze, load_run

    run = load_run(str(asleep_run.root / "stall"), cache=False)
    assert run.stalls and all(s.rank == 0 and s.missing == [1] for s in run.stalls), run.stalls
    report = analyze(run)
    first = report.verdicts[0]
    assert re.fullmatch(
        rf"rank 1 kept the job waiting \d+\.\d s at step 1, in hold_until_released "
        rf"\(hang_worker\.py:{worker_line('sleep')}\)\.",
        first,
    ), report.verdicts
    (stall,) = report.stalls.stalls  # the reports of one stall make one
    assert stall.waited_s >= max(r.waited_s for r in run.stalls), stall
    assert stall.reports == len(run.stalls)
    assert report.to_dict()["stalls"][0]["sentence"] + "." == first
    cli = subprocess.run(
        [sys.executable, "-m", "hvdprof", "analyze", str(asleep_run.root / "stall")],
        capture_output=True,
        text=True,
        timeout=120,
        env=child_env(),
        cwd=REPO,
    )
    verdicts = cli.stdout.split("Verdicts", 1)[-1]
    assert " ".join(verdicts.split()).startswith("1. rank 1 kept the job waiting"), cli.stdout


def test_the_dashboard_marks_the_stall_on_the_timeline(asleep_run: AsleepRun) -> None:
    pytest.importorskip("fastapi")
    from dashboard_support import WAIT_MS, dashboard_server, launched_chromium

    with launched_chromium() as browser, dashboard_server(asleep_run.root) as base:
        page = browser.new_page(viewport={"width": 1400, "height": 950})
        try:
            page.set_default_timeout(WAIT_MS)
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(base + "?run=stall")
            page.wait_for_function("document.getElementById('timeline').dataset.stalls === '1'")
            hover = page.evaluate(
                "document.getElementById('timeline').data"
                ".filter(t => t.name === 'stall').map(t => t.hovertext).flat()"
            )
            lanes = page.evaluate(
                "document.getElementById('timeline').data"
                ".filter(t => t.name === 'stall').map(t => t.y).flat()"
            )
            shapes = page.evaluate(
                "document.getElementById('timeline').layout.shapes.map(s => s.line.color)"
            )
            verdicts = page.locator("#verdicts").inner_text()
        finally:
            page.close()
    assert len(hover) == 1 and "rank 1 kept the job waiting" in hover[0], hover
    assert "hold_until_released (hang_worker.py:" in hover[0], hover
    assert lanes and str(lanes[0]).startswith("rank 1"), lanes
    assert shapes == ["#dc2626"], shapes
    assert "rank 1 kept the job waiting" in verdicts, verdicts
    assert not errors, errors


@pytest.mark.parametrize("engine", ["gloo", "mpi"])
def test_the_late_rank_answers_over_every_control_channel(
    engine: str, live_job: Callable[..., LiveJob]
) -> None:
    """The asleep test above ran on the default engine (shared-memory allreduce, TCP
    control); here Gloo alone (TCP control), and MPI under mpirun (MPI control)."""
    if engine == "mpi":
        mpi_or_skip()
    job = live_job("sleep", {**STALL_ENV, "HVDPROF_BACKEND": engine}, mpirun=engine == "mpi")
    line = job.wait_line(RANK1_LATE)
    job.release()
    assert job.finish() == 0, job.output
    assert f"load_batch (hang_worker.py:{worker_line('load_batch')})" in line, line
    assert "not in a collective" in line, line


def test_a_rank_in_another_collective_is_a_mismatch_naming_both(
    live_job: Callable[..., LiveJob],
) -> None:
    job = live_job("mismatch", STALL_ENV)
    line = job.wait_line(RANK1_LATE)
    job.release()
    assert job.finish() == 0, job.output
    assert "it waits in allgather 'other' (sequence 2), called from " in line, line
    assert f"wait_other (hang_worker.py:{worker_line('wait_other')})" in line, line
    assert "a mismatch, it is in a different collective from allreduce 'grad.0'" in line, line
    # rank 0 polls its allreduce: not blocked, so this is no proven deadlock
    assert "rank 0 has not submitted 'other'" in line, line
    assert "with allreduce 'grad.0' submitted: a mismatch" in line, line
    assert "deadlock" not in job.output, job.output


def test_a_rank_spinning_in_python_still_answers_with_its_stack(
    live_job: Callable[..., LiveJob],
) -> None:
    job = live_job("busy", STALL_ENV)
    line = job.wait_line(RANK1_LATE)
    job.release()
    assert job.finish() == 0, job.output
    assert "crunch (hang_worker.py:" in line, line
    assert "not in a collective" in line, line


def test_stall_shutdown_ends_every_rank_with_the_stall_line(tmp_path: Path) -> None:
    env = {
        "HVDPROF_STALL_CHECK_TIME_SECONDS": "1",
        "HVDPROF_STALL_SHUTDOWN_TIME_SECONDS": "3",
    }
    result = run_job("hang_worker.py", 2, "sleep", str(tmp_path), env=env, timeout=JOB_S)
    assert result.returncode != 0, result.describe()
    for rank in (0, 1):
        lines = [x for x in result.lines(rank, "stderr") if "hvdprof stall: aborting after" in x]
        assert lines, f"rank {rank} did not print the stall line\n{result.describe()}"
        assert "(HVDPROF_STALL_SHUTDOWN_TIME_SECONDS=3)" in lines[0], lines[0]
        assert "load_batch (hang_worker.py:" in lines[0], lines[0]
    assert "DONE" not in result.output, result.describe()


# ------------------------------------------------------------------ stacks on demand
def test_sigusr1_to_the_launcher_prints_every_ranks_stacks_once(
    live_job: Callable[..., LiveJob],
) -> None:
    job = live_job("idle")
    job.wait_ready()  # both ranks have their handler (init() returned)
    os.kill(job.proc.pid, signal.SIGUSR1)
    for rank in (0, 1):
        job.wait_line(rf"^\[{rank}\]<stderr>:hvdprof rank {rank}: {stacks.END_MARKER}$")
    job.release()
    assert job.finish() == 0, job.output
    lines = job.output.splitlines()
    for rank in (0, 1):
        prefix = f"[{rank}]<stderr>:hvdprof rank {rank}: "
        dump = [x[len(prefix) :] for x in lines if x.startswith(prefix)]
        starts = [i for i, x in enumerate(dump) if x.startswith("Python stacks (SIGUSR1")]
        ends = [i for i, x in enumerate(dump) if x == stacks.END_MARKER]
        assert len(starts) == 1 and len(ends) == 1 and starts[0] < ends[0], "\n".join(dump)
        body = "\n".join(dump[starts[0] : ends[0]])
        assert "thread MainThread" in body and "thread hvdprof-cycle" in body, body
        assert f"line {worker_line('idle_wait')}, in idle_wait" in body, body
        assert f"line {worker_line('sleep')}, in hold_until_released" in body, body
        # the signal handler's own frames are not part of the dump
        for own in ("_on_signal", "format_dump", "extract_stack", "walk_stack"):
            assert own not in body, body
        # no other rank's text under this rank's prefix
        assert f"hvdprof rank {1 - rank}:" not in body, body
    assert sum("received SIGUSR1" in x for x in lines) == 1, job.output


def test_hvdprof_stacks_puts_each_ranks_dump_on_its_timeline(
    live_job: Callable[..., LiveJob], tmp_path_factory: pytest.TempPathFactory
) -> None:
    timeline = tmp_path_factory.mktemp("stacks-timeline")
    job = live_job("idle", launcher_args=("--timeline", str(timeline)))
    job.wait_ready()
    # A SIGUSR1 that reaches the launcher before it has armed forwarding (while it still
    # spawns) is ignored by design, so a user who sees nothing asks again: so does this
    # test, up to three times, and then checks every dump it got.
    markers = [rf"^\[{rank}\]<stderr>:hvdprof rank {rank}: {stacks.END_MARKER}$" for rank in (0, 1)]
    sent = 0
    while sent < 3:
        sent += 1
        cli = subprocess.run(
            [sys.executable, "-m", "hvdprof", "stacks", str(job.proc.pid)],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=REPO,
        )
        assert cli.returncode == 0, cli.stderr
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not all(
            any(re.search(m, line) for line in job.output.splitlines()) for m in markers
        ):
            time.sleep(0.1)
        if all(any(re.search(m, line) for line in job.output.splitlines()) for m in markers):
            break
    for marker in markers:
        job.wait_line(marker)
    job.release()
    assert job.finish() == 0, job.output
    for rank in (0, 1):
        events = [
            json.loads(line.rstrip(",\n"))
            for line in (timeline / f"rank.{rank}.json").read_text().splitlines()
            if '"name":"STACKS"' in line
        ]
        assert 1 <= len(events) <= sent, events
        text = events[0]["args"]["stacks"]
        assert f"hvdprof rank {rank}: {stacks.END_MARKER}" in text, text
        assert "in idle_wait" in text and events[0]["args"]["reason"] == "SIGUSR1", text


# ------------------------------------------------------------------ the line, no processes
def test_stall_line_for_several_late_ranks() -> None:
    stall = Stall(
        names={"g": (frozenset({0}), 0.0)},
        kinds={"g": "ALLREDUCE"},
        now=7.25,
        waited_s=7.25,
        shutdown=False,
    )
    states = {
        0: {"frames": [("step", "/u/t.py", 9)], "collective": None, "pending": []},
        1: {"frames": [("load", "/u/t.py", 4), ("<module>", "/u/t.py", 20)], "collective": None},
    }
    text = describe_stall(3, stall, states)
    assert "rank 1 has not submitted 'g' for 7.2 s; it is in load (t.py:4) <- <module>" in text
    assert "rank 2 has not submitted 'g' for 7.2 s; its stack did not arrive" in text
    assert "rank 0 submitted allreduce 'g' and is in step (t.py:9)" in text
    assert "deadlock" not in text and "mismatch" not in text


def test_where_skips_the_library_frames_of_a_wait() -> None:
    torch_file = os.path.join(os.path.dirname(os.__file__), "threading.py")
    frames = [
        ("wait", torch_file, 300),
        ("allreduce", stacks.__file__, 10),
        ("train", "/home/u/train.py", 7),
        ("<module>", "/home/u/train.py", 30),
    ]
    assert stacks.where(frames) == "train (train.py:7) <- <module> (train.py:30)"
    assert stacks.where(frames[:2]).startswith("wait (threading.py:300)")


def test_hvdprof_stacks_sends_sigusr1_to_the_pid() -> None:
    # a rank of an hvdprof job (its environment says so) that handles SIGUSR1; any
    # other process is refused (tests/test_stacks_guard.py)
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import signal, sys, time\n"
            "signal.signal(signal.SIGUSR1, lambda *a: sys.exit(7))\n"
            "print('ready', flush=True)\n"
            "time.sleep(120)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
        env=child_env({"HVDPROF_RANK": "0", "HVDPROF_SIZE": "1"}),
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        cli = subprocess.run(
            [sys.executable, "-m", "hvdprof", "stacks", str(child.pid)],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=REPO,
        )
        assert cli.returncode == 0, cli.stderr
        assert child.wait(60) == 7
    finally:
        child.kill()
        child.wait(30)
    gone = subprocess.run(
        [sys.executable, "-m", "hvdprof", "stacks", str(child.pid)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert gone.returncode == 2 and f"no process {child.pid}" in gone.stderr, gone.stderr
