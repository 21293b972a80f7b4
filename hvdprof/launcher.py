"""Start, watch and stop the local ranks of a job: the core behind ``hvdprof run``.

``horovodrun -np N python train.py`` starts N copies of a training script, tells each
one who it is through environment variables, tags every output line with the rank that
wrote it, and tears the whole job down as soon as one rank fails, so that the others do
not hang forever in a collective waiting for a peer that is gone. This module does the
same for ranks on one host, with no MPI and no SSH:

* each rank runs in its own session (``start_new_session=True``), so that stopping a
  rank signals its whole process group and takes down grandchildren such as data-loader
  workers too, and so that a Ctrl+C in the terminal reaches only the launcher, which then
  decides how to stop the ranks;
* one thread per child pipe reads whole lines (in binary, decoded with
  ``errors="replace"``) and writes each one, prefixed, under a single lock, so lines
  from different ranks never interleave mid-line;
* the main thread only polls: it notices a failed rank, a launcher signal or the
  ``timeout``, and escalates SIGINT/SIGTERM to SIGKILL after a grace period, so the
  launcher can neither hang nor leave orphans behind.

The argparse front end lives in :mod:`hvdprof.cli`; :func:`launch` is the Python API that
the CLI, the tests and the benchmarks share.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, BinaryIO, TextIO

from hvdprof import launch_signal
from hvdprof.config import env_var, name_of
from hvdprof.errors import ConfigError
from hvdprof.runtime.threads import per_rank_threads, usable_cores, user_thread_setting

#: Address of the rendezvous store; ranks are local, so it is always the loopback.
CONTROLLER_ADDR = "127.0.0.1"
#: Seconds a rank gets to exit after each stop signal before the next, harsher one.
GRACE_SECONDS = 3.0
#: How often the main thread checks the ranks, the clock and pending signals.
POLL_SECONDS = 0.05
#: Longest chunk handed to the output as one line; guards memory against endless lines.
MAX_LINE_BYTES = 1 << 20

#: Exit codes with a conventional meaning (those of ``timeout(1)`` and the shell).
EXIT_TIMEOUT = 124
EXIT_NOT_EXECUTABLE = 126
EXIT_NOT_FOUND = 127

#: Variables the launcher sets for every rank; inherited values are always overwritten,
#: so a job started from inside another job's rank gets its own topology.
TOPOLOGY_VARS = (
    name_of("rank"),
    name_of("size"),
    name_of("local_rank"),
    name_of("local_size"),
    name_of("cross_rank"),
    name_of("cross_size"),
    name_of("controller_addr"),
    name_of("controller_port"),
)

_LOG_PREFIX = "hvdprof run: "
_TRAPPED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
#: forwarded to every rank, which prints its Python stacks (``hvdprof/runtime/stacks.py``)
_STACKS_SIGNAL: signal.Signals | None = getattr(signal, "SIGUSR1", None)


# --------------------------------------------------------------------------- helpers


def find_free_port(host: str = CONTROLLER_ADDR) -> int:
    """A TCP port that is free right now, for rank 0's rendezvous store.

    The socket is closed before returning: rank 0 must be able to bind the port itself,
    so the launcher must not hold it while the ranks run. The window in which another
    program could grab it is tiny, and rank 0 reports a clear error if that happens.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def rank_environment(
    base: Mapping[str, str], rank: int, size: int, port: int, addr: str = CONTROLLER_ADDR
) -> dict[str, str]:
    """The environment of one local rank: ``base`` plus who the rank is and where to meet.

    All ranks run on this host, so local rank equals rank and there is a single "cross"
    group. ``PYTHONUNBUFFERED`` makes Python ranks stream output live instead of in
    block-sized bursts when their stdout is a pipe.
    """
    env = dict(base)
    env.update(
        HVDPROF_RANK=str(rank),
        HVDPROF_SIZE=str(size),
        HVDPROF_LOCAL_RANK=str(rank),
        HVDPROF_LOCAL_SIZE=str(size),
        HVDPROF_CROSS_RANK="0",
        HVDPROF_CROSS_SIZE="1",
        HVDPROF_CONTROLLER_ADDR=addr,
        HVDPROF_CONTROLLER_PORT=str(port),
        PYTHONUNBUFFERED="1",
    )
    return env


def exit_code_of(returncode: int) -> int:
    """Map a ``Popen.returncode`` to a shell-style exit code (signal N becomes 128+N)."""
    return 128 - returncode if returncode < 0 else returncode


def describe_returncode(returncode: int) -> str:
    """Human wording of a ``Popen.returncode``: ``code 3`` or ``signal SIGKILL (-9)``."""
    if returncode >= 0:
        return f"code {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = f"signal {-returncode}"
    return f"signal {name} ({returncode})"


def check_command(program: str, path: str | None) -> tuple[int, str] | None:
    """``(exit code, message)`` when ``program`` cannot be started, else ``None``.

    Checked once, before any rank starts, so a typo is reported once instead of N times,
    with the shell's exit codes (127: not found, 126: not executable).
    """
    if os.sep in program:
        if not os.path.exists(program):
            return EXIT_NOT_FOUND, f"command not found: {program}"
        if os.path.isdir(program) or not os.access(program, os.X_OK):
            return EXIT_NOT_EXECUTABLE, f"command is not executable: {program}"
        return None
    if shutil.which(program, path=path if path is not None else os.defpath) is None:
        return EXIT_NOT_FOUND, f"command not found: {program}"
    return None


def _escalation(first: signal.Signals) -> list[signal.Signals]:
    """The signals used to stop ranks, gentlest first; SIGKILL always ends the list."""
    steps = [first]
    for harsher in (signal.SIGTERM, signal.SIGKILL):
        if harsher not in steps and steps[-1] != signal.SIGKILL:
            steps.append(harsher)
    return steps


def _ranks_named(ranks: Sequence[_Rank]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(str(r.rank) for r in ranks)


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


# ------------------------------------------------------------------------- output


class OutputSink:
    """Where rank output lines go: one lock for all, so lines never interleave.

    A broken destination (say, the launcher's stdout piped into ``head``) stops being
    written to, but the pipes from the ranks keep being drained so no rank blocks.
    """

    def __init__(self, stdout: TextIO, stderr: TextIO, prefix: bool) -> None:
        self._streams = {"stdout": stdout, "stderr": stderr}
        self._prefix = prefix
        self._lock = threading.Lock()
        self._broken: set[int] = set()

    def emit(self, rank: int, stream: str, text: str) -> None:
        """Write one line of ``rank``'s ``stream``, adding the newline a partial line lacks."""
        if not text.endswith("\n"):
            text += "\n"
        if self._prefix:
            text = f"[{rank}]<{stream}>:{text}"
        self._write(self._streams[stream], text)

    def message(self, text: str) -> None:
        """A line from the launcher itself, to the stderr destination."""
        self._write(self._streams["stderr"], _LOG_PREFIX + text + "\n")

    def _write(self, dest: TextIO, text: str) -> None:
        with self._lock:
            if id(dest) in self._broken:
                return
            try:
                try:
                    dest.write(text)
                except UnicodeEncodeError:
                    encoding = getattr(dest, "encoding", None) or "ascii"
                    dest.write(text.encode(encoding, "replace").decode(encoding))
                dest.flush()
            except (OSError, ValueError):
                self._broken.add(id(dest))


def _pump(pipe: BinaryIO, rank: int, stream: str, sink: OutputSink, tee: BinaryIO | None) -> None:
    """Copy one child pipe line by line to the sink (and raw to ``tee``) until EOF.

    ``readline`` returns a final partial line at EOF, so output without a trailing
    newline is still shown when the rank ends.
    """
    with pipe:
        for chunk in iter(lambda: pipe.readline(MAX_LINE_BYTES), b""):
            if tee is not None:
                with contextlib.suppress(OSError, ValueError):
                    tee.write(chunk)
                    tee.flush()
            sink.emit(rank, stream, chunk.decode("utf-8", errors="replace"))
    if tee is not None:
        tee.close()


# ------------------------------------------------------------------------ signals


class _SignalTrap:
    """Record SIGINT/SIGTERM/SIGHUP sent to the launcher instead of dying on them.

    The watch loop turns a recorded signal into an orderly stop of all ranks. Handlers
    can only be installed from the main thread; elsewhere the trap stays empty and the
    caller's thread keeps its default behaviour.

    SIGUSR1 (a request for the ranks' stacks) is counted by ``hvdprof/launch_signal.py``,
    which ``hvdprof run`` arms as its first statement, so a request that arrives before
    the ranks run is held, not fatal. With ``hold_stack_requests`` False (the elastic
    launcher, which does not forward) it is ignored instead. Either way a rank starts
    with SIGUSR1 ignored (:meth:`spawning`): an ignored signal stays ignored across exec,
    so a request that reaches a rank before hvdprof installed its handler is dropped
    instead of killing it (the default action).
    """

    def __init__(self, hold_stack_requests: bool = False) -> None:
        self.received: list[int] = []
        self._hold = hold_stack_requests
        self._wake = threading.Event()
        self._previous: dict[int, object] = {}

    def take_stack_requests(self) -> int:
        """SIGUSR1s not yet forwarded, counted since ``hvdprof run`` started."""
        return launch_signal.take() if self._hold else 0

    def __enter__(self) -> _SignalTrap:
        if threading.current_thread() is threading.main_thread():
            for signum in _TRAPPED_SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
            if _STACKS_SIGNAL is not None:
                self._previous[_STACKS_SIGNAL] = signal.getsignal(_STACKS_SIGNAL)
                if self._hold:
                    launch_signal.hold()
                    launch_signal.wake_on_request(self._wake.set)
                else:
                    signal.signal(_STACKS_SIGNAL, signal.SIG_IGN)
        return self

    @contextlib.contextmanager
    def spawning(self) -> Iterator[None]:
        """SIGUSR1 ignored while a rank is forked and exec'd (it inherits that); a request
        in those few milliseconds is lost, never fatal."""
        if not self._hold or _STACKS_SIGNAL not in self._previous:
            yield
            return
        signal.signal(_STACKS_SIGNAL, signal.SIG_IGN)
        try:
            yield
        finally:
            signal.signal(_STACKS_SIGNAL, launch_signal.handler())

    def __exit__(self, *exc: object) -> None:
        if self._hold:
            launch_signal.wake_on_request(None)
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)  # type: ignore[arg-type]

    def _handle(self, signum: int, _frame: object) -> None:
        self.received.append(signum)
        self._wake.set()

    def sleep(self, seconds: float) -> None:
        """Sleep, but wake early when a signal arrives."""
        self._wake.wait(seconds)
        self._wake.clear()


# ---------------------------------------------------------------------------- job


@dataclass(eq=False)
class _Rank:
    """One started rank: its process and the threads draining its output."""

    rank: int
    proc: subprocess.Popen[bytes]
    pumps: list[threading.Thread] = field(default_factory=list)

    @property
    def returncode(self) -> int | None:
        return self.proc.poll()

    def signal_group(self, signum: int) -> bool:
        """Signal the rank's whole process group; False when the group is already gone."""
        try:
            os.killpg(self.proc.pid, signum)
        except (ProcessLookupError, PermissionError):
            return False
        return True

    def group_alive(self) -> bool:
        """Whether any process (the rank or a grandchild) is left in the rank's group."""
        return self.signal_group(0)

    def join_output(self, deadline: float) -> None:
        for thread in self.pumps:
            thread.join(max(0.0, deadline - time.monotonic()))


class Job:
    """N local ranks of one command, from spawn to the last line of output.

    ``run()`` returns the job's exit code: 0 when every rank exits 0; the first failing
    rank's code (128+N for signal N); 124 on ``timeout``; 128+N when the launcher itself
    got signal N; 126/127 when the command cannot be started.
    """

    def __init__(
        self,
        command: Sequence[str],
        num_proc: int,
        env: Mapping[str, str],
        sink: OutputSink,
        *,
        timeout: float | None = None,
        output_dir: str | os.PathLike[str] | None = None,
        verbose: bool = False,
        grace: float = GRACE_SECONDS,
    ) -> None:
        self.command = list(command)
        self.num_proc = num_proc
        self.env = dict(env)
        self.sink = sink
        self.timeout = timeout
        self.output_dir = Path(output_dir) if output_dir is not None else None
        self.verbose = verbose
        self.grace = grace
        self.ranks: list[_Rank] = []
        self._exit_order: list[_Rank] = []
        #: ranks owed a forwarded SIGUSR1 (they did not handle it yet when it came)
        self._stacks_owed: set[int] = set()

    # -- lifecycle -------------------------------------------------------------

    def run(self) -> int:
        """Spawn all ranks, watch them, stop them; always leaves no process behind."""
        problem = check_command(self.command[0], self.env.get("PATH"))
        if problem is not None:
            self.sink.message(problem[1])
            return problem[0]
        started = time.monotonic()
        with _SignalTrap(hold_stack_requests=True) as trap:
            try:
                code = self._spawn_all(trap)
                if code is None:
                    code = self._watch(trap, started)
            finally:
                self._stop(signal.SIGKILL, trap, quiet=True)
                self._reap_groups()
        self._join_all_output(time.monotonic() + 2.0)
        if self.verbose:
            elapsed = time.monotonic() - started
            self.sink.message(f"job finished with exit code {code} after {elapsed:.1f} s")
        return code

    def _spawn_all(self, trap: _SignalTrap) -> int | None:
        """Start every rank; on a spawn error, report it and return its exit code."""
        port = find_free_port()
        if self.verbose:
            self.sink.message(
                f"starting {_plural(self.num_proc, 'rank')} of `{shlex.join(self.command)}`"
                f" (controller {CONTROLLER_ADDR}:{port})"
            )
        for rank in range(self.num_proc):
            env = rank_environment(self.env, rank, self.num_proc, port)
            try:
                self.ranks.append(self._spawn(rank, env, trap))
            except OSError as exc:
                self.sink.message(f"cannot start rank {rank}: {exc.strerror or exc}")
                self._stop(signal.SIGTERM, None)
                return EXIT_NOT_FOUND if isinstance(exc, FileNotFoundError) else EXIT_NOT_EXECUTABLE
            if self.verbose:
                self.sink.message(f"rank {rank} started, pid {self.ranks[-1].proc.pid}")
        return None

    def _spawn(self, rank: int, env: Mapping[str, str], trap: _SignalTrap) -> _Rank:
        tees = {stream: self._open_tee(rank, stream) for stream in ("stdout", "stderr")}
        try:
            with trap.spawning():
                proc = subprocess.Popen(
                    self.command,
                    env=dict(env),
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    start_new_session=True,
                )
        except OSError:
            for tee in tees.values():
                if tee is not None:
                    tee.close()
            raise
        started = _Rank(rank, proc)
        for stream, pipe in (("stdout", proc.stdout), ("stderr", proc.stderr)):
            assert pipe is not None
            thread = threading.Thread(
                target=_pump,
                args=(pipe, rank, stream, self.sink, tees[stream]),
                name=f"hvdprof-rank{rank}-{stream}",
                daemon=True,
            )
            thread.start()
            started.pumps.append(thread)
        return started

    def _open_tee(self, rank: int, stream: str) -> IO[bytes] | None:
        """``DIR/rank.N/{stdout,stderr}`` for ``--output-filename``, like horovodrun."""
        if self.output_dir is None:
            return None
        return open(self.output_dir / f"rank.{rank}" / stream, "wb")  # the pump thread closes it

    # -- watching --------------------------------------------------------------

    def _watch(self, trap: _SignalTrap, started: float) -> int:
        """Poll until every rank is done, one fails, a signal arrives or time runs out."""
        deadline = None if self.timeout is None else started + self.timeout
        while True:
            if trap.take_stack_requests():
                self._ask_for_stacks()
            if self._stacks_owed:
                self._deliver_stack_requests()
            if trap.received:
                return self._on_launcher_signal(trap)
            if deadline is not None and time.monotonic() >= deadline:
                return self._on_timeout(trap)
            failed = self._first_failure()
            if failed is not None:
                return self._on_rank_failure(failed, trap)
            if all(r.returncode is not None for r in self.ranks):
                return 0
            trap.sleep(POLL_SECONDS)

    def _ask_for_stacks(self) -> None:
        """Owe a SIGUSR1 to each running rank (requests that arrive together are one);
        :meth:`_deliver_stack_requests` sends it once the rank handles it."""
        running = self._running()
        self._stacks_owed.update(r.rank for r in running)
        self._deliver_stack_requests()
        waiting = [r for r in running if r.rank in self._stacks_owed]
        asked = [r for r in running if r.rank not in self._stacks_owed]
        said = f"received SIGUSR1; asking {_ranks_named(asked)} for their stacks" if asked else ""
        if waiting:
            said = (said + "; " if said else "received SIGUSR1; ") + (
                f"{_ranks_named(waiting)} still starting (no stack handler yet), "
                "asked as soon as each has one"
            )
        self.sink.message(said or "received SIGUSR1; no rank is running")

    def _deliver_stack_requests(self) -> None:
        """SIGUSR1 to each rank owed one whose process handles it now (not its group: a
        data-loader worker has no handler); each prints its Python stacks. A rank that
        still ignores it (importing, before hvdprof's handler) keeps its request."""
        from hvdprof.runtime import stacks  # (here: ~10-30 ms of imports no other command needs)

        assert _STACKS_SIGNAL is not None
        for r in self.ranks:
            if r.rank not in self._stacks_owed:
                continue
            if r.returncode is not None:
                self._stacks_owed.discard(r.rank)
                continue
            if stacks.handles_stack_signal(r.proc.pid) is False:
                continue
            self._stacks_owed.discard(r.rank)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(r.proc.pid, _STACKS_SIGNAL)

    def _first_failure(self) -> _Rank | None:
        """The earliest-noticed rank that exited non-zero, if any."""
        for r in self.ranks:
            if r.returncode is not None and r not in self._exit_order:
                self._exit_order.append(r)
        return next((r for r in self._exit_order if r.returncode != 0), None)

    def _running(self) -> list[_Rank]:
        return [r for r in self.ranks if r.returncode is None]

    def _on_rank_failure(self, failed: _Rank, trap: _SignalTrap) -> int:
        # Let the failing rank's last words (often a traceback) print before the summary.
        failed.join_output(time.monotonic() + 1.0)
        returncode = failed.proc.returncode
        others = len(self._running())
        summary = f"rank {failed.rank} exited with {describe_returncode(returncode)}"
        if others:
            summary += f"; stopping the other {_plural(others, 'rank')}"
        self.sink.message(summary)
        self._stop(signal.SIGTERM, trap)
        return exit_code_of(returncode)

    def _on_timeout(self, trap: _SignalTrap) -> int:
        running = len(self._running())
        self.sink.message(
            f"timeout: the job ran longer than --timeout {self.timeout:g} s;"
            f" killing {_plural(running, 'running rank')}"
        )
        self._stop(signal.SIGTERM, trap)
        return EXIT_TIMEOUT

    def _on_launcher_signal(self, trap: _SignalTrap) -> int:
        signum = trap.received[0]
        name = signal.Signals(signum).name
        running = len(self._running())
        self.sink.message(f"received {name}; stopping {_plural(running, 'running rank')}")
        self._stop(signal.Signals(signum), trap)
        return 128 + signum

    # -- stopping --------------------------------------------------------------

    def _stop(self, first: signal.Signals, trap: _SignalTrap | None, quiet: bool = False) -> None:
        """Signal every rank's group, escalating up to SIGKILL after ``grace`` per step.

        SIGINT gives Python ranks a KeyboardInterrupt to clean up on; SIGTERM is the
        polite stop; SIGKILL cannot be ignored. A further launcher signal (a second
        Ctrl+C) skips straight to SIGKILL. ``quiet`` is for the final safety net.
        """
        steps = _escalation(first)
        seen = len(trap.received) if trap is not None else 0
        index = 0
        while index < len(steps):
            signum = steps[index]
            running = self._running()
            if not running:
                return
            if not quiet and (self.verbose or signum == signal.SIGKILL):
                self.sink.message(f"sending {signum.name} to {_ranks_named(running)}")
            for r in running:
                r.signal_group(signum)
            outcome = self._wait_ranks(time.monotonic() + self.grace, trap, seen)
            if outcome == "stopped":
                return
            index = len(steps) - 1 if outcome == "signalled" else index + 1

    def _wait_ranks(self, deadline: float, trap: _SignalTrap | None, seen: int) -> str:
        """Wait for every rank to exit: ``stopped``, ``expired`` or ``signalled`` (again)."""
        while time.monotonic() < deadline:
            if not self._running():
                return "stopped"
            if trap is not None and len(trap.received) > seen:
                return "signalled"
            time.sleep(POLL_SECONDS / 2)
        return "expired" if self._running() else "stopped"

    def _reap_groups(self) -> None:
        """Stop grandchildren a rank left behind, so the job leaves no orphans.

        Runs after every rank process has exited. Leftovers get SIGTERM, a short wait,
        then SIGKILL. (Zombies count as alive to ``killpg``, so the wait is bounded.)
        """
        leftovers = [r for r in self.ranks if r.group_alive()]
        if not leftovers:
            return
        for r in leftovers:
            r.signal_group(signal.SIGTERM)
        deadline = time.monotonic() + min(self.grace, 0.5)
        while time.monotonic() < deadline and any(r.group_alive() for r in leftovers):
            time.sleep(POLL_SECONDS / 2)
        for r in leftovers:
            r.signal_group(signal.SIGKILL)

    def _join_all_output(self, deadline: float) -> None:
        """Print what is left in the pipes; bounded, in case a stray process holds one open."""
        for r in self.ranks:
            r.join_output(deadline)


# ---------------------------------------------------------------------------- API


def launch(
    command: Sequence[str],
    num_proc: int,
    env: Mapping[str, str] | None = None,
    timeout: float | None = None,
    prefix_output: bool = True,
    stdout: TextIO | None = None,
    *,
    stderr: TextIO | None = None,
    output_dir: str | os.PathLike[str] | None = None,
    verbose: bool = False,
    grace: float = GRACE_SECONDS,
) -> int:
    """Run ``command`` as ``num_proc`` local ranks and return the job's exit code.

    ``env`` holds extra variables layered over ``os.environ`` (tests and benchmarks pass
    just the ``HVDPROF_*`` settings they vary); the topology variables are always set by
    the launcher. Rank stdout lines go to ``stdout`` (default ``sys.stdout``) and stderr
    lines to ``stderr`` (default: ``stdout`` when given, so a single buffer captures the
    whole job, else ``sys.stderr``); the launcher's own messages go with stderr lines.
    With ``prefix_output`` each line is tagged ``[RANK]<stdout>:`` as horovodrun does.
    ``timeout`` (seconds) kills the job and returns 124 when exceeded. ``output_dir``
    also saves each rank's raw output to ``DIR/rank.N/stdout`` and ``.../stderr``.

    Raises ConfigError for arguments that cannot describe a job (no command,
    ``num_proc < 1``, a non-positive timeout); every runtime failure is an exit code.
    """
    _validate(command, num_proc, timeout, grace)
    if output_dir is not None:
        _prepare_output_dir(Path(output_dir), num_proc)
    out = stdout if stdout is not None else sys.stdout
    err = stderr if stderr is not None else (stdout if stdout is not None else sys.stderr)
    sink = OutputSink(out, err, prefix_output)
    base = dict(os.environ)
    if env is not None:
        base.update(env)
    threads = default_threads(base, num_proc)
    if threads is not None:
        base["OMP_NUM_THREADS"] = str(threads)
        sink.message(
            f"OMP_NUM_THREADS is not set: each of the {num_proc} ranks gets OMP_NUM_THREADS="
            f"{threads} ({usable_cores()} cores / {num_proc} ranks, at least 1); set "
            "OMP_NUM_THREADS to choose, or HVDPROF_THREADS_DEFAULT=0 to leave it unset"
        )
    job = Job(
        command,
        num_proc,
        base,
        sink,
        timeout=timeout,
        output_dir=output_dir,
        verbose=verbose,
        grace=grace,
    )
    return job.run()


def default_threads(environ: Mapping[str, str], num_proc: int) -> int | None:
    """The ``OMP_NUM_THREADS`` every rank gets when the user chose none, else None.

    As ``torchrun`` does: a rank's torch otherwise starts one thread per core, so N ranks
    oversubscribe the host N times (see :mod:`hvdprof.runtime.threads`). A user's
    ``OMP_NUM_THREADS`` or ``MKL_NUM_THREADS`` is left alone, and so is a single rank;
    ``HVDPROF_THREADS_DEFAULT=0`` turns the default off.
    """
    raw = environ.get(name_of("threads_default"))
    if raw is not None:
        var = env_var(name_of("threads_default"))
        try:
            enabled = var.parse(raw)
        except ValueError as exc:
            raise ConfigError(
                f"HVDPROF_THREADS_DEFAULT={raw!r} is malformed: it accepts {exc}"
            ) from None
        if not enabled:
            return None
    if num_proc < 2 or user_thread_setting(environ) is not None:
        return None
    return per_rank_threads(num_proc)


def _validate(command: Sequence[str], num_proc: int, timeout: float | None, grace: float) -> None:
    if isinstance(command, str):
        raise ConfigError("command must be a sequence of arguments, not a single string")
    if not command or not command[0]:
        raise ConfigError("no command to run: give the program and its arguments")
    if isinstance(num_proc, bool) or not isinstance(num_proc, int) or num_proc < 1:
        raise ConfigError(f"the number of processes must be an integer >= 1, got {num_proc!r}")
    if timeout is not None and not timeout > 0:
        raise ConfigError(f"timeout must be a number of seconds > 0, got {timeout!r}")
    if not grace >= 0:
        raise ConfigError(f"grace must be a number of seconds >= 0, got {grace!r}")


def _prepare_output_dir(directory: Path, num_proc: int) -> None:
    """Create ``DIR/rank.N`` up front, so an unusable directory fails before any rank starts."""
    try:
        for rank in range(num_proc):
            (directory / f"rank.{rank}").mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(
            f"cannot create output directory {directory}: {exc.strerror or exc}"
        ) from None
