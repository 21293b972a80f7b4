"""Start, watch and stop the local ranks of a job: the core behind ``hvdprof run``.

``horovodrun -np N python train.py`` starts N copies of a training script, tells each
one who it is through environment variables, tags every output line with the rank that
wrote it, and tears the whole job down as soon as one rank fails, so that the others do
not hang forever in a collective waiting for a peer that is gone. This module does the
same for ranks on one host, with no MPI and no SSH:

its own session per rank (:mod:`~hvdprof.launch.processes`), one thread per output pipe
(:mod:`~hvdprof.launch.output`), and a main thread that only polls and escalates stop
signals (:mod:`~hvdprof.launch.signal_trap`), so the launcher can neither hang nor leave
orphans behind.

The argparse front end lives in :mod:`hvdprof.cli`; :func:`launch` is the Python API that
the CLI, the tests and the benchmarks share.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import BinaryIO, TextIO

from hvdprof.config import env_var, name_of
from hvdprof.errors import ConfigError
from hvdprof.launch.output import OutputSink
from hvdprof.launch.processes import (
    CONTROLLER_ADDR,
    EXIT_NOT_EXECUTABLE,
    EXIT_NOT_FOUND,
    EXIT_TIMEOUT,
    GRACE_SECONDS,
    POLL_SECONDS,
    RankProcess,
    check_command,
    describe_returncode,
    exit_code_of,
    find_free_port,
    spawn_rank,
)
from hvdprof.launch.signal_trap import STACKS_SIGNAL, SignalTrap
from hvdprof.runtime.threads import per_rank_threads, usable_cores, user_thread_setting

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

# --------------------------------------------------------------------------- helpers


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


def _escalation(first: signal.Signals) -> list[signal.Signals]:
    """The signals used to stop ranks, gentlest first; SIGKILL always ends the list."""
    steps = [first]
    for harsher in (signal.SIGTERM, signal.SIGKILL):
        if harsher not in steps and steps[-1] != signal.SIGKILL:
            steps.append(harsher)
    return steps


def _ranks_named(ranks: Sequence[RankProcess]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(str(r.rank) for r in ranks)


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


# ---------------------------------------------------------------------------- job


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
        self.ranks: list[RankProcess] = []
        self._exit_order: list[RankProcess] = []
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
        with SignalTrap(hold_stack_requests=True) as trap:
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

    def _spawn_all(self, trap: SignalTrap) -> int | None:
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

    def _spawn(self, rank: int, env: Mapping[str, str], trap: SignalTrap) -> RankProcess:
        tees = {stream: self._open_tee(rank, stream) for stream in ("stdout", "stderr")}
        try:
            with trap.spawning():
                return spawn_rank(self.command, env, rank, self.sink, tees)
        except OSError:
            for tee in tees.values():
                if tee is not None:
                    tee.close()
            raise

    def _open_tee(self, rank: int, stream: str) -> BinaryIO | None:
        """``DIR/rank.N/{stdout,stderr}`` for ``--output-filename``, like horovodrun."""
        if self.output_dir is None:
            return None
        return open(self.output_dir / f"rank.{rank}" / stream, "wb")  # the pump thread closes it

    # -- watching --------------------------------------------------------------

    def _watch(self, trap: SignalTrap, started: float) -> int:
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

        assert STACKS_SIGNAL is not None
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
                os.kill(r.proc.pid, STACKS_SIGNAL)

    def _first_failure(self) -> RankProcess | None:
        """The earliest-noticed rank that exited non-zero, if any."""
        for r in self.ranks:
            if r.returncode is not None and r not in self._exit_order:
                self._exit_order.append(r)
        return next((r for r in self._exit_order if r.returncode != 0), None)

    def _running(self) -> list[RankProcess]:
        return [r for r in self.ranks if r.returncode is None]

    def _on_rank_failure(self, failed: RankProcess, trap: SignalTrap) -> int:
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

    def _on_timeout(self, trap: SignalTrap) -> int:
        running = len(self._running())
        self.sink.message(
            f"timeout: the job ran longer than --timeout {self.timeout:g} s;"
            f" killing {_plural(running, 'running rank')}"
        )
        self._stop(signal.SIGTERM, trap)
        return EXIT_TIMEOUT

    def _on_launcher_signal(self, trap: SignalTrap) -> int:
        signum = trap.received[0]
        name = signal.Signals(signum).name
        running = len(self._running())
        self.sink.message(f"received {name}; stopping {_plural(running, 'running rank')}")
        self._stop(signal.Signals(signum), trap)
        return 128 + signum

    # -- stopping --------------------------------------------------------------

    def _stop(self, first: signal.Signals, trap: SignalTrap | None, quiet: bool = False) -> None:
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

    def _wait_ranks(self, deadline: float, trap: SignalTrap | None, seen: int) -> str:
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
