"""``hvdprof stacks PID`` signals only an hvdprof job, and ``hvdprof run`` survives an
early SIGUSR1: real processes throughout.

SIGUSR1's default action ends a process, so ``stacks`` used to kill whatever it was
given (``stacks 0`` its own process group, ``stacks -1`` as root every process on the
machine), and a SIGUSR1 in ``hvdprof run``'s first ~100 ms killed the launcher.

* pids out of range, words, a dead pid: one line, exit code 2, nothing signalled (the
  ``0``/``-1`` cases run with ``os.kill`` wrapped so that a regression fails the test
  instead of signalling process groups);
* processes that are not hvdprof jobs (``sleep``, a Python program handling SIGUSR1), and
  an hvdprof rank still starting: refused with one line naming the pid, and alive;
* a rank started without ``hvdprof run`` (as mpirun or torchrun start one) after
  ``hvd.init()``, a launcher, and a rank by its own pid: accepted, and each prints;
* the launcher holds SIGUSR1 from its first statement, before any heavy import (checked
  through an import hook, so with no timing in it), and a SIGUSR1 at 10, 50 and 200 ms
  after the start is held and forwarded: the job ends with exit 0 and one dump per rank;
* a SIGUSR1 or SIGTERM at each bytecode of the launcher's wait between two polls is
  recorded once and hangs nothing (its handler once deadlocked on the wait's own lock).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import REPO, child_env
from launch_support import LiveProcess

from hvdprof.launch.stack_target import pid_max
from hvdprof.runtime import stacks

pytestmark = pytest.mark.timeout(300)

CONSOLE_SCRIPT = Path(sys.executable).parent / "hvdprof"
ERROR = re.compile(r"^hvdprof: error: stacks: .+$")


def stacks_cli(pid: str, *, wrap_kill: bool = False) -> subprocess.CompletedProcess[str]:
    """``hvdprof stacks PID`` in a process of its own session. ``wrap_kill``: os.kill of a
    process group (pid <= 0) exits 99 instead of signalling anything."""
    if wrap_kill:
        code = (
            "import os, sys\n"
            "real = os.kill\n"
            "os.kill = lambda p, s: sys.exit(99) if p <= 0 else real(p, s)\n"
            "from hvdprof.cli import main\n"
            f"sys.exit(main(['stacks', {pid!r}]))\n"
        )
        argv = [sys.executable, "-c", code]
    else:
        argv = [sys.executable, "-m", "hvdprof", "stacks", pid]
    return subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env=child_env(),
        start_new_session=True,
    )


def assert_refused(done: subprocess.CompletedProcess[str], *phrases: str) -> str:
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    assert done.stdout == "" and "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and ERROR.match(lines[0]), done.stderr
    for phrase in phrases:
        assert phrase in lines[0], lines[0]
    return lines[0]


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait(30)
    return proc.pid


def wait_handled(pid: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while stacks.stack_signal_disposition(pid) != "caught":
        assert time.monotonic() < deadline, f"process {pid} never handled SIGUSR1"
        time.sleep(0.01)


# ------------------------------------------------------------------ what a PID may be
@pytest.mark.parametrize("pid", ["0", "-1", "-7", str(2**31), "99999999999"])
def test_group_ids_and_numbers_out_of_range_are_refused(pid: str) -> None:
    line = assert_refused(stacks_cli(pid, wrap_kill=True), repr(pid), f"from 1 to {pid_max()}")
    if pid.startswith("-") or pid == "0":
        assert "process group" in line, line


@pytest.mark.parametrize("pid", ["abc", "", "1.5", "0x10", "12 34"])
def test_what_is_not_a_number_is_refused(pid: str) -> None:
    assert_refused(stacks_cli(pid, wrap_kill=True), repr(pid))


def test_a_real_process_refuses_zero_and_a_huge_pid() -> None:
    # (0 without the wrapper: a regression would end this process's own session only)
    assert_refused(stacks_cli("0"), "'0'")
    assert_refused(stacks_cli("99999999999"), "'99999999999'")


def test_a_pid_that_does_not_exist_is_one_line() -> None:
    pid = dead_pid()
    assert_refused(stacks_cli(str(pid)), f"no process {pid}")


# ------------------------------------------------------------ processes that are not jobs
def test_a_process_that_is_not_hvdprof_is_refused_and_lives() -> None:
    sleeper = LiveProcess(["sleep", "1000"])
    catcher = LiveProcess(
        [sys.executable, "-c", "import signal, time\n"
         "signal.signal(signal.SIGUSR1, lambda *a: print('GOT IT', flush=True))\n"
         "print('READY', flush=True)\ntime.sleep(1000)"]
    )  # fmt: skip
    try:
        catcher.next_line("READY")
        for started, shown in ((sleeper, "sleep 1000"), (catcher, "-c import signal")):
            line = assert_refused(
                stacks_cli(str(started.pid)), f"process {started.pid} ", "not an hvdprof job"
            )
            assert shown in line, line
        time.sleep(0.3)
        assert sleeper.alive() and catcher.alive()
        assert stacks.stack_signal_disposition(sleeper.pid) == "default"  # it would have died
    finally:
        sleeper.kill()
        catcher.kill()
    assert "GOT IT" not in "\n".join(catcher.lines)


@pytest.mark.parametrize("disposition", ["ignored", "default"])
def test_an_hvdprof_rank_that_is_still_starting_is_refused_and_lives(disposition: str) -> None:
    """A rank imports torch for seconds before hvdprof's handler is in: under `hvdprof
    run` it ignores SIGUSR1 meanwhile; started another way, SIGUSR1 would end it."""
    ignore = "signal.signal(signal.SIGUSR1, signal.SIG_IGN)\n" if disposition == "ignored" else ""
    rank = LiveProcess(
        [sys.executable, "-c", f"import signal, time\n{ignore}print('READY', flush=True)\n"
         "time.sleep(1000)"],
        env=child_env({"HVDPROF_RANK": "3", "HVDPROF_SIZE": "4"}),
    )  # fmt: skip
    try:
        rank.next_line("READY")
        assert stacks.stack_signal_disposition(rank.pid) == disposition
        assert_refused(
            stacks_cli(str(rank.pid)),
            f"process {rank.pid} is rank 3 of an hvdprof job that is still starting",
            "try again",
        )
        time.sleep(0.3)
        assert rank.alive()
    finally:
        rank.kill()


# ------------------------------------------------------------------------ hvdprof jobs
RANK_CODE = textwrap.dedent(
    """
    import os, sys, time
    import hvdprof.torch as hvd
    hvd.init()
    print(f"PID {os.getpid()} READY", flush=True)
    deadline = time.monotonic() + 120
    while not os.path.exists(sys.argv[1]) and time.monotonic() < deadline:
        time.sleep(0.05)
    hvd.shutdown()
    print("DONE", flush=True)
    """
)


def test_a_rank_started_without_hvdprof_run_is_accepted_after_init(tmp_path: Path) -> None:
    """As under mpirun, torchrun or srun: no HVDPROF_* variable in its environment; it is
    recognised by the marker hvd.init() leaves, and the marker goes at exit."""
    release = tmp_path / "release"
    rank = LiveProcess([sys.executable, "-c", RANK_CODE, str(release)])
    try:
        rank.next_line(r"^PID \d+ READY")
        marker = Path(stacks.marker_dir(os.getuid())) / str(rank.pid)
        assert marker.is_file()
        done = stacks_cli(str(rank.pid))
        assert done.returncode == 0, done.stderr
        assert f"asked process {rank.pid}" in done.stdout
        rank.next_line(rf"^hvdprof rank 0: {stacks.END_MARKER}$")
        release.touch()
        rank.next_line("^DONE$")
        assert rank.wait(60) == 0
    finally:
        rank.kill()
    assert not marker.exists(), "the marker outlived its process"


def test_the_launcher_and_a_rank_by_its_own_pid_are_accepted(tmp_path: Path) -> None:
    release = tmp_path / "release"
    job = LiveProcess(
        [str(CONSOLE_SCRIPT), "run", "-np", "1", "--timeout", "150", "--",
         sys.executable, "-c", RANK_CODE, str(release)]
    )  # fmt: skip
    try:
        rank_pid = int(job.next_line(r"PID \d+ READY").split("PID ")[1].split()[0])
        for pid in (job.pid, rank_pid):
            done = stacks_cli(str(pid))
            assert done.returncode == 0, done.stderr
            job.next_line(rf"^\[0\]<stderr>:hvdprof rank 0: {stacks.END_MARKER}$")
        release.touch()
        assert job.wait(150) == 0, job.output
    finally:
        job.kill()


# -------------------------------------------------------------- an early SIGUSR1 to run
SPY = textwrap.dedent(
    """
    import _signal, sys

    class Spy:
        '''Records SIGUSR1's handler when each heavy module is first imported.'''
        seen = {}
        def find_spec(self, name, path=None, target=None):
            if name in ("argparse", "hvdprof.config", "hvdprof.launch.local_job"):
                handler = _signal.getsignal(_signal.SIGUSR1)
                self.seen.setdefault(name, getattr(handler, "__module__", str(handler)))
            return None

    sys.meta_path.insert(0, Spy())
    """
)


@pytest.mark.parametrize("entry", ["console script", "python -m hvdprof"])
def test_run_holds_sigusr1_before_any_heavy_import(entry: str) -> None:
    if entry == "console script":
        start = (
            f"sys.argv = [{str(CONSOLE_SCRIPT)!r}, 'run', '--help']\n"
            f"import runpy\nrunpy.run_path({str(CONSOLE_SCRIPT)!r}, run_name='__main__')\n"
        )
    else:
        start = (
            "sys.argv = ['-m', 'run', '--help']\nimport runpy\n"
            "runpy.run_module('hvdprof', run_name='__main__', alter_sys=True)\n"
        )
    code = SPY + "try:\n" + textwrap.indent(start, "    ")
    code += "except SystemExit:\n    pass\nprint('SEEN', Spy.seen)\n"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO
    )
    assert done.returncode == 0, done.stderr
    seen = done.stdout.splitlines()[-1]
    for module in ("argparse", "hvdprof.config", "hvdprof.launch.local_job"):
        assert f"'{module}': 'hvdprof.launch.stack_requests'" in seen, seen


EARLY_RANK = (
    "import time, hvdprof.torch as hvd\nhvd.init()\ntime.sleep(1.5)\nhvd.shutdown()\n"
    "print('DONE', flush=True)"
)


@pytest.mark.parametrize("delay_ms", [10, 50, 200])
def test_an_early_sigusr1_is_held_and_forwarded(delay_ms: int) -> None:
    """The console script, SIGUSR1 at ``delay_ms`` after exec. Python cannot run a line
    of ours before the interpreter has started (plus site and the console script's own
    ``import re``: tens of ms on this loaded machine, see the README); a signal then still
    ends the launcher, so the test sends at ``delay_ms`` or, when the launcher does not
    handle SIGUSR1 yet, as soon as it does, and says which."""
    job = LiveProcess(
        [str(CONSOLE_SCRIPT), "run", "-np", "1", "--timeout", "150", "--",
         sys.executable, "-c", EARLY_RANK]
    )  # fmt: skip
    started = time.monotonic()
    try:
        time.sleep(delay_ms / 1000)
        early = stacks.stack_signal_disposition(job.pid)
        wait_handled(job.pid)
        sent_ms = (time.monotonic() - started) * 1000
        os.kill(job.pid, signal.SIGUSR1)
        job.next_line("^\\[0\\]<stdout>:DONE$", timeout=150)
        code = job.wait(150)
    finally:
        job.kill()
    out = "\n".join(job.lines)
    why = f"sent at {sent_ms:.0f} ms (handler {'already in' if early == 'caught' else early})"
    assert code == 0, f"{why}\n{out}"
    assert sum("received SIGUSR1" in x for x in job.lines) == 1, f"{why}\n{out}"
    dumps = [x for x in job.lines if x == f"[0]<stderr>:hvdprof rank 0: {stacks.END_MARKER}"]
    assert len(dumps) == 1, f"{why}\n{out}"


# A signal at every bytecode of the launcher's wait between two polls. The handler runs
# in the main thread between two bytecodes of whatever it interrupted; it used to wake
# the loop with threading.Event.set, which takes the lock the same Event's wait() and
# clear() hold for a few bytecodes: a signal there hung `hvdprof run` for good (rarely,
# in test_an_early_sigusr1_is_held_and_forwarded[200]). Tracing opcodes puts the signal
# on each of those bytecodes in turn, so that no timing is involved.
EVERY_BYTECODE = textwrap.dedent(
    """
    import faulthandler, signal, sys
    from hvdprof.launch.signal_trap import SignalTrap

    faulthandler.dump_traceback_later(30, exit=True)  # a hang shows its stacks and ends
    signum = getattr(signal, sys.argv[1])
    hold = signum == signal.SIGUSR1
    at = fired = 0

    def on_opcode(frame, event, arg):
        global at, fired
        frame.f_trace_opcodes = True
        if event == "opcode":
            if at == target and not fired:
                fired = 1
                signal.raise_signal(signum)  # (its handler runs before this returns)
            at += 1
        return on_opcode

    with SignalTrap(hold_stack_requests=hold) as trap:
        for target in range(10_000):
            at = fired = 0
            sys.settrace(on_opcode)
            got = trap.take_stack_requests()
            trap.sleep(0.001)
            sys.settrace(None)
            got += trap.take_stack_requests() if hold else len(trap.received)
            assert got == fired, (target, got, fired)
            trap.received.clear()
            if not fired:
                break
    print("BYTECODES", target)
    """
)


@pytest.mark.parametrize("signame", ["SIGUSR1", "SIGTERM"])
def test_a_signal_at_any_bytecode_of_the_launchers_wait_is_recorded_once(signame: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", EVERY_BYTECODE, signame],
        capture_output=True, text=True, timeout=120, cwd=REPO, env=child_env(),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert int(done.stdout.split("BYTECODES ")[1]) >= 10, done.stdout  # (the wait was traced)


def test_markers_of_processes_that_are_gone_are_pruned(tmp_path: Path) -> None:
    """A SIGKILLed rank leaves its marker; the next process that registers removes it."""
    markers = Path(stacks.marker_dir(os.getuid(), str(tmp_path)))
    markers.mkdir(parents=True)
    gone = dead_pid()
    (markers / str(gone)).write_text("12345")  # no process has that pid and start time
    (markers / str(os.getpid())).write_text("1")  # a live pid, another start time: reused
    done = subprocess.run(
        [sys.executable, "-c", "import os\nfrom hvdprof.runtime import stacks\n"
         "assert stacks.install(0)\nprint(sorted(os.listdir(stacks.marker_dir(os.getuid()))))\n"
         "print(os.getpid())"],
        capture_output=True, text=True, timeout=60, cwd=REPO,
        env=child_env({"TMPDIR": str(tmp_path)}),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    listed, pid = done.stdout.splitlines()
    assert listed == str([pid]), done.stdout  # only its own, while it ran
    assert sorted(p.name for p in markers.iterdir()) == []  # and none after it exited
