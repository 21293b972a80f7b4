"""``hvdprof run`` and the ``hvdprof`` command, with real processes.

Every rank is ``tests/workers/launcher_worker.py`` (no torch, so each starts in tens of
milliseconds), and every process the tests start has a hard time limit, so a launcher
bug fails a test instead of hanging CI. Ranks write their PIDs (and those of their own
children) to a directory, so the tests can prove that nothing outlives the job.
"""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import time
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from hvdprof import cli
from hvdprof.errors import ConfigError
from hvdprof.launch.local_job import launch, rank_environment
from hvdprof.launch.processes import describe_returncode, exit_code_of, find_free_port

pytestmark = pytest.mark.timeout(60)

WORKER = str(Path(__file__).parent / "workers" / "launcher_worker.py")
REPO = Path(__file__).resolve().parent.parent
HARD_LIMIT = 30.0
LINE = re.compile(r"^\[(\d+)\]<(stdout|stderr)>:(.*)$")


# ------------------------------------------------------------------------ helpers


def worker(*args: str) -> list[str]:
    return [sys.executable, WORKER, *args]


def hvdprof(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``python -m hvdprof ARGS`` to completion, within the hard limit."""
    return subprocess.run(
        [sys.executable, "-m", "hvdprof", *args],
        capture_output=True,
        text=True,
        timeout=HARD_LIMIT,
        env=_child_env(env),
        cwd=REPO,
    )


def _child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HVDPROF_")}
    env.update(extra or {})
    return env


def parse_lines(text: str) -> list[tuple[int, str, str]]:
    """``(rank, stream, text)`` of every rank line; launcher messages are skipped."""
    parsed = []
    for line in text.splitlines():
        match = LINE.match(line)
        if match:
            parsed.append((int(match[1]), match[2], match[3]))
    return parsed


def alive(pid: int) -> bool:
    """Whether ``pid`` runs; a zombie waiting for a reaper is as good as dead."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def wait_for_files(directory: Path, pattern: str, count: int, limit: float = 15.0) -> None:
    deadline = time.monotonic() + limit
    while len(list(directory.glob(pattern))) < count:
        assert time.monotonic() < deadline, f"only {list(directory.iterdir())} appeared"
        time.sleep(0.02)


def assert_all_gone(pids: list[int], limit: float = 2.0) -> None:
    """Every PID is gone (with a moment's slack for the kernel to finish the kill)."""
    deadline = time.monotonic() + limit
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert [p for p in pids if alive(p)] == []


@pytest.fixture
def pid_dir(tmp_path: Path) -> Iterator[Path]:
    """A directory for the ranks' PID files; anything still alive at the end is killed."""
    directory = tmp_path / "pids"
    directory.mkdir()
    yield directory
    for pid in read_pids(directory):
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


def read_pids(directory: Path) -> list[int]:
    return [int(p.read_text()) for p in directory.glob("*.pid")]


# ------------------------------------------------------------------- environment


def test_three_ranks_get_their_topology_and_the_parent_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HVDPROF_RANK", "7")  # inherited from an outer job: must be replaced
    monkeypatch.setenv("LAUNCHER_TEST_INHERITED", "yes")
    out = io.StringIO()
    code = launch(
        worker("--print-env"),
        3,
        env={"HVDPROF_TIMELINE": "/tmp/tl"},
        timeout=HARD_LIMIT,
        stdout=out,
    )
    assert code == 0
    seen = {}
    for rank, stream, text in parse_lines(out.getvalue()):
        assert stream == "stdout"
        seen[rank] = json.loads(text)
    assert sorted(seen) == [0, 1, 2]
    ports = {env["HVDPROF_CONTROLLER_PORT"] for env in seen.values()}
    assert len(ports) == 1 and int(ports.pop()) > 0
    for rank, env in seen.items():
        assert env["HVDPROF_RANK"] == str(rank)
        assert env["HVDPROF_LOCAL_RANK"] == str(rank)
        assert env["HVDPROF_SIZE"] == env["HVDPROF_LOCAL_SIZE"] == "3"
        assert env["HVDPROF_CROSS_RANK"] == "0"
        assert env["HVDPROF_CROSS_SIZE"] == "1"
        assert env["HVDPROF_CONTROLLER_ADDR"] == "127.0.0.1"
        assert env["HVDPROF_TIMELINE"] == "/tmp/tl"
        assert env["PYTHONUNBUFFERED"] == "1"


def test_rank_environment_overrides_inherited_topology() -> None:
    env = rank_environment({"HVDPROF_SIZE": "9", "PATH": "/bin"}, 1, 2, 1234)
    assert env["HVDPROF_SIZE"] == "2" and env["HVDPROF_RANK"] == "1"
    assert env["HVDPROF_CONTROLLER_PORT"] == "1234" and env["PATH"] == "/bin"


def test_free_port_can_be_bound_again() -> None:
    import socket

    port = find_free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_cli_options_reach_the_ranks_and_override_the_environment(tmp_path: Path) -> None:
    result = hvdprof(
        "run",
        "-np",
        "2",
        "--timeline",
        str(tmp_path / "tl"),
        "--autotune",
        "--autotune-log",
        str(tmp_path / "at.csv"),
        "--cycle-time-ms",
        "2.5",
        "--fusion-threshold-mb",
        "1",
        "--start-timeout",
        "5",
        "--",
        *worker("--print-env"),
        env={"HVDPROF_TIMELINE": "/somewhere/else", "HVDPROF_CYCLE_TIME": "9"},
    )
    assert result.returncode == 0, result.stderr
    envs = [json.loads(text) for _, _, text in parse_lines(result.stdout)]
    assert len(envs) == 2
    for env in envs:
        assert env["HVDPROF_TIMELINE"] == str(tmp_path / "tl")
        assert env["HVDPROF_AUTOTUNE"] == "1"
        assert env["HVDPROF_AUTOTUNE_LOG"] == str(tmp_path / "at.csv")
        assert env["HVDPROF_CYCLE_TIME"] == "2.5"
        assert env["HVDPROF_FUSION_THRESHOLD"] == str(1024 * 1024)
        assert env["HVDPROF_START_TIMEOUT_SECONDS"] == "5"


# ------------------------------------------------------------------------ output


def test_output_is_prefixed_per_rank_and_lines_stay_whole() -> None:
    out, err = io.StringIO(), io.StringIO()
    lines = 150
    code = launch(worker("--lines", str(lines)), 3, timeout=HARD_LIMIT, stdout=out, stderr=err)
    assert code == 0
    pattern = {
        "stdout": re.compile(r"^out (\d) (\d+) x{3000}$"),
        "stderr": re.compile(r"^err (\d) (\d+) y{3000}$"),
    }
    for stream, text in (("stdout", out.getvalue()), ("stderr", err.getvalue())):
        counts = dict.fromkeys(range(3), 0)
        partial = set()
        for rank, tagged, body in parse_lines(text):
            assert tagged == stream
            if body.startswith("partial"):
                assert body == f"partial {rank}"  # printed although it had no newline
                partial.add(rank)
                continue
            match = pattern[stream].match(body)
            assert match, body[:80]
            assert int(match[1]) == rank
            assert int(match[2]) == counts[rank]  # each rank's lines in order
            counts[rank] += 1
        assert counts == dict.fromkeys(range(3), lines)
        assert partial == ({0, 1, 2} if stream == "stdout" else set())
    # Every physical line is a rank line: nothing torn, nothing untagged.
    assert all(LINE.match(line) for line in out.getvalue().splitlines())


def test_output_without_prefix_and_copied_to_output_dir(tmp_path: Path) -> None:
    out = io.StringIO()
    code = launch(
        worker("--lines", "2"),
        2,
        timeout=HARD_LIMIT,
        prefix_output=False,
        stdout=out,
        output_dir=tmp_path / "logs",
    )
    assert code == 0
    assert not any(LINE.match(line) for line in out.getvalue().splitlines())
    for rank in range(2):
        saved = (tmp_path / "logs" / f"rank.{rank}" / "stdout").read_text()
        assert saved.startswith(f"out {rank} 0 ") and saved.endswith(f"partial {rank}")
        assert (tmp_path / "logs" / f"rank.{rank}" / "stderr").read_text().startswith("err")


# ---------------------------------------------------------------------- failures


def test_failing_rank_stops_the_others_and_sets_the_exit_code(pid_dir: Path) -> None:
    start = time.monotonic()
    result = hvdprof(
        "run",
        "-np",
        "3",
        *worker("--pid-dir", str(pid_dir), "--exit-rank", "1", "--exit-code", "3", "--sleep", "60"),
    )
    assert result.returncode == 3
    assert time.monotonic() - start < 10
    assert "hvdprof run: rank 1 exited with code 3; stopping the other 2 ranks" in result.stderr
    # The failing rank's own last words come before the launcher's summary.
    assert result.stderr.index("failing on purpose") < result.stderr.index("exited with code 3")
    assert "Traceback" not in result.stderr
    assert len(read_pids(pid_dir)) == 3
    assert_all_gone(read_pids(pid_dir))


def test_rank_killed_by_a_signal_fails_the_job(pid_dir: Path) -> None:
    result = hvdprof(
        "run",
        "-np",
        "3",
        *worker("--pid-dir", str(pid_dir), "--sigkill-rank", "2", "--sleep", "60"),
    )
    assert result.returncode == 128 + signal.SIGKILL
    assert "rank 2 exited with signal SIGKILL (-9); stopping the other 2 ranks" in result.stderr
    assert_all_gone(read_pids(pid_dir))


def test_rank_ignoring_sigterm_is_killed_after_the_grace(pid_dir: Path) -> None:
    err = io.StringIO()
    start = time.monotonic()
    code = launch(
        worker("--pid-dir", str(pid_dir), "--ignore-signals", "--exit-rank", "0", "--sleep", "60"),
        2,
        timeout=HARD_LIMIT,
        stdout=io.StringIO(),
        stderr=err,
        grace=0.5,
    )
    assert code == 3
    assert time.monotonic() - start < 5
    assert "rank 0 exited with code 3" in err.getvalue()
    assert_all_gone(read_pids(pid_dir))


def start_launcher(*args: str) -> subprocess.Popen[str]:
    """``python -m hvdprof ARGS`` in its own session, so the test can signal it alone."""
    return subprocess.Popen(
        [sys.executable, "-m", "hvdprof", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env=_child_env(),
        cwd=REPO,
    )


def finish(launcher: subprocess.Popen[str]) -> str:
    """The launcher's stderr once it exits; killed (group and all) if it overstays."""
    try:
        _, stderr = launcher.communicate(timeout=HARD_LIMIT)
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait(timeout=5)
    return stderr


@pytest.mark.parametrize(("signum", "expected"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_to_launcher_stops_ranks_and_grandchildren(
    pid_dir: Path, signum: signal.Signals, expected: int
) -> None:
    launcher = start_launcher(
        "run", "-np", "2", *worker("--pid-dir", str(pid_dir), "--grandchild", "--sleep", "60")
    )
    try:
        wait_for_files(pid_dir, "*.pid", 4)
        launcher.send_signal(signum)
    finally:
        stderr = finish(launcher)
    assert launcher.returncode == expected
    assert f"received {signal.Signals(signum).name}; stopping 2 running ranks" in stderr
    pids = read_pids(pid_dir)
    assert len(pids) == 4  # two ranks and one child of each
    assert_all_gone(pids)


def test_second_ctrl_c_kills_stubborn_ranks_at_once(pid_dir: Path) -> None:
    launcher = start_launcher(
        "run", "-np", "2", *worker("--pid-dir", str(pid_dir), "--ignore-signals", "--sleep", "60")
    )
    try:
        wait_for_files(pid_dir, "*.pid", 2)
        start = time.monotonic()
        launcher.send_signal(signal.SIGINT)
        time.sleep(0.3)
        launcher.send_signal(signal.SIGINT)
    finally:
        stderr = finish(launcher)
    assert launcher.returncode == 130
    assert time.monotonic() - start < 2.5  # well inside the 3 s grace SIGINT would get
    assert "sending SIGKILL to ranks 0, 1" in stderr
    assert_all_gone(read_pids(pid_dir))


def test_timeout_kills_a_hanging_job(pid_dir: Path) -> None:
    start = time.monotonic()
    result = hvdprof(
        "run",
        "-np",
        "2",
        "--timeout",
        "1",
        *worker("--pid-dir", str(pid_dir), "--grandchild", "--sleep", "60"),
    )
    assert result.returncode == 124
    assert time.monotonic() - start < 10
    assert "timeout" in result.stderr and "--timeout 1 s" in result.stderr
    assert_all_gone(read_pids(pid_dir))


# --------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["run", "-np", "0", "true"], "-np"),
        (["run", "-np", "two", "true"], "-np"),
        (["run", "true"], "-np"),
        (["run", "-np", "2"], "no command"),
        (["run", "-np", "2", "--"], "no command"),
        (["run", "-np", "2", "--cycle-time-ms", "fast", "true"], "--cycle-time-ms"),
        (["run", "-np", "2", "--timeout", "-1", "true"], "--timeout"),
        (["run", "-np", "2", "--fusion-threshold-mb", "x", "true"], "--fusion-threshold-mb"),
        (["bogus"], "invalid choice"),
    ],
)
def test_bad_input_is_a_clear_error(args: list[str], needle: str) -> None:
    result = hvdprof(*args)
    assert result.returncode == 2
    assert needle in result.stderr
    assert "error" in result.stderr
    assert "Traceback" not in result.stderr


def test_nonexistent_command_is_reported_once() -> None:
    result = hvdprof("run", "-np", "3", "no-such-program-hvdprof")
    assert result.returncode == 127
    assert result.stderr.count("command not found: no-such-program-hvdprof") == 1
    assert "Traceback" not in result.stderr


def test_malformed_environment_fails_before_any_rank_starts() -> None:
    result = hvdprof("run", "-np", "2", "true", env={"HVDPROF_FUSION_THRESHOLD": "lots"})
    assert result.returncode == 2
    assert "hvdprof: error: HVDPROF_FUSION_THRESHOLD='lots' is malformed" in result.stderr
    assert "Traceback" not in result.stderr


def test_launch_rejects_arguments_that_cannot_describe_a_job() -> None:
    with pytest.raises(ConfigError):
        launch([], 2)
    with pytest.raises(ConfigError):
        launch(["true"], 0)
    with pytest.raises(ConfigError):
        launch("true", 1)  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        launch(["true"], 1, timeout=0)


def test_exit_code_helpers() -> None:
    assert exit_code_of(3) == 3 and exit_code_of(-9) == 137
    assert describe_returncode(3) == "code 3"
    assert describe_returncode(-15) == "signal SIGTERM (-15)"


# --------------------------------------------------------------- other commands


def test_env_prints_the_variable_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["env"]) == 0
    table = capsys.readouterr().out
    assert table.startswith("| Variable | Default | Meaning |")
    assert "`HVDPROF_FUSION_THRESHOLD`" in table


def test_python_dash_m_version() -> None:
    result = hvdprof("--version")
    assert result.returncode == 0
    assert result.stdout.strip().startswith("hvdprof ")


def test_timeline_merge_calls_merge_directory(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls = []

    def merge_directory(directory: str, output: str, kineto_traces: list[str]) -> str:
        calls.append((directory, output, kineto_traces))
        return "merged 2 ranks, 10 events"

    fake = types.ModuleType("hvdprof.timeline.merge")
    fake.merge_directory = merge_directory  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "hvdprof.timeline.merge", fake)
    code = cli.main(["timeline", "merge", "tl", "-o", "out.json", "--kineto", "a.json", "b.json"])
    assert code == 0
    assert calls == [("tl", "out.json", ["a.json", "b.json"])]
    assert capsys.readouterr().out.strip() == "merged 2 ranks, 10 events"


def test_timeline_merge_errors_are_reported_without_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def merge_directory(directory: str, output: str, kineto_traces: list[str]) -> str:
        raise FileNotFoundError(2, "No such file or directory", directory)

    fake = types.ModuleType("hvdprof.timeline.merge")
    fake.merge_directory = merge_directory  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "hvdprof.timeline.merge", fake)
    assert cli.main(["timeline", "merge", "missing", "-o", "out.json"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == "hvdprof: error: No such file or directory: missing"
