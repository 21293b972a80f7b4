"""``hvdprof run --min-np N --max-np M``: an elastic job of local workers.

Like ``horovodrun``'s elastic mode, for workers on this host: the job's membership is
:class:`~hvdprof.launch.elastic_driver.ElasticDriver`'s (the one ``ElasticRayExecutor``
uses too), its workers local processes, its slots this host's lines of
``--host-discovery-script`` (up to ``--max-np``). A worker that exits non-zero is a
failure; a Ctrl+C, SIGTERM or ``--timeout`` stops every worker.

The job ends when every worker has exited; it succeeds when those of the last
generation exited 0.
"""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hvdprof.config import name_of
from hvdprof.errors import ConfigError
from hvdprof.launch import processes
from hvdprof.launch.elastic_driver import (
    BelowMinimum,
    ElasticDriver,
    ElasticPolicy,
    ElasticWorker,
    Ending,
    SlotsUnknown,
    open_store,
)
from hvdprof.launch.local_job import TOPOLOGY_VARS
from hvdprof.launch.output import OutputSink
from hvdprof.launch.processes import RankProcess, describe_returncode, spawn_rank
from hvdprof.launch.signal_trap import SignalTrap

#: How often the discovery script runs, and how long one run may take.
DISCOVERY_INTERVAL_S = 1.0
DISCOVERY_TIMEOUT_S = 10.0
_LOCAL_HOSTS = {"localhost", "127.0.0.1", "::1", socket.gethostname()}

Worker = ElasticWorker[RankProcess]


def parse_discovery(text: str) -> int:
    """Local slots in a discovery script's output: ``HOST[:SLOTS]`` per line.

    Only this host can run workers; another host is a ConfigError naming it.
    """
    slots = 0
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        host, sep, count = line.partition(":")
        if host not in _LOCAL_HOSTS:
            raise ConfigError(
                f"host discovery reported {host!r}: `hvdprof run` starts workers on this host "
                f"only ({', '.join(sorted(_LOCAL_HOSTS))})"
            )
        if sep and not count.strip().isdigit():
            raise ConfigError(f"host discovery line {line!r} is malformed: it accepts HOST:SLOTS")
        slots += int(count) if sep else 1
    return slots


@dataclass
class _ProcessPool:
    """The driver's workers as local processes of one command, each in its own session."""

    command: list[str]
    env: dict[str, str]
    sink: OutputSink
    discovery_script: str | None
    verbose: bool

    def start(self, wid: str) -> RankProcess:
        env = dict(self.env)
        env.update({name_of("elastic_worker"): wid, "PYTHONUNBUFFERED": "1"})
        proc = spawn_rank(self.command, env, int(wid), self.sink)
        if self.verbose:
            self.sink.message(f"worker {wid} started, pid {proc.proc.pid}")
        return proc

    def ending(self, worker: Worker) -> Ending | None:
        rc = worker.handle.returncode
        if rc is None:
            return None
        if rc != 0:
            worker.handle.join_output(time.monotonic() + 0.2)
        return Ending(rc == 0, f"exited with {describe_returncode(rc)}")

    def running(self, worker: Worker) -> bool:
        return worker.handle.returncode is None

    def where(self, worker: Worker) -> str:
        return ""

    def slots(self) -> int | None:
        if not self.discovery_script:
            return None
        try:
            return self.discover()
        except ConfigError as exc:
            raise SlotsUnknown(str(exc)) from None

    def retire(self, worker: Worker, slots: int) -> None:
        self.sink.message(f"host discovery: {slots} slots; stopping worker {worker.wid}")
        worker.handle.signal_group(signal.SIGKILL)

    def say(self, text: str) -> None:
        self.sink.message(text)

    def discover(self) -> int:
        """Slots the discovery script reports now; a ConfigError naming how it failed."""
        assert self.discovery_script is not None
        try:
            out = subprocess.run(
                [self.discovery_script],
                capture_output=True,
                text=True,
                timeout=DISCOVERY_TIMEOUT_S,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ConfigError(
                f"host discovery script {self.discovery_script!r} failed: {exc}"
            ) from None
        if out.returncode != 0:
            raise ConfigError(
                f"host discovery script {self.discovery_script!r} exited with "
                f"{describe_returncode(out.returncode)}: {out.stderr.strip()[:200]}"
            )
        return parse_discovery(out.stdout)


class ElasticJob:
    """Workers of one command that may die, be replaced or be added while it runs: an
    :class:`~hvdprof.launch.elastic_driver.ElasticDriver` of local processes, stopped in
    order on a signal or ``--timeout``."""

    def __init__(
        self,
        command: Sequence[str],
        num_proc: int,
        min_np: int,
        max_np: int,
        env: Mapping[str, str],
        sink: OutputSink,
        *,
        discovery_script: str | None = None,
        timeout: float | None = None,
        verbose: bool = False,
        grace: float = processes.GRACE_SECONDS,
    ) -> None:
        self.command = list(command)
        self.num_proc = num_proc
        self.min_np = min_np
        self.max_np = max_np
        self.env = {k: v for k, v in env.items() if k not in TOPOLOGY_VARS}
        self.sink = sink
        self.discovery_script = discovery_script
        self.timeout = timeout
        self.verbose = verbose
        self.grace = grace
        self.driver: ElasticDriver[RankProcess] | None = None

    # -- life cycle ---------------------------------------------------------------
    def run(self) -> int:
        problem = processes.check_command(self.command[0], self.env.get("PATH"))
        if problem is not None:
            self.sink.message(problem[1])
            return problem[0]
        store, address = open_store(processes.CONTROLLER_ADDR)
        self.env[name_of("elastic_store")] = address
        policy = ElasticPolicy(
            self.min_np,
            self.max_np,
            discovery_interval_s=DISCOVERY_INTERVAL_S,
            history_dir=self.env.get(name_of("timeline_dir")) or None,
        )
        pool = _ProcessPool(self.command, self.env, self.sink, self.discovery_script, self.verbose)
        driver = self.driver = ElasticDriver(pool, store, policy)
        started = time.monotonic()
        with SignalTrap() as trap:
            try:
                initial = self.num_proc
                if self.discovery_script:
                    initial = min(self.max_np, pool.discover())
                if initial < self.min_np:
                    self.sink.message(
                        f"only {initial} slots available, fewer than --min-np {self.min_np}"
                    )
                    return 1
                driver.start(initial)
                code = self._watch(driver, trap, started)
            finally:
                self._stop_all(signal.SIGKILL, quiet=True)
        deadline = time.monotonic() + 2.0
        for w in driver.workers:
            w.handle.join_output(deadline)
        return code

    def _watch(self, driver: ElasticDriver[RankProcess], trap: SignalTrap, started: float) -> int:
        deadline = None if self.timeout is None else started + self.timeout
        while True:
            if trap.received:
                signum = trap.received[0]
                self.sink.message(f"received {signal.Signals(signum).name}; stopping the workers")
                self._stop_all(signal.Signals(signum))
                return 128 + signum
            if deadline is not None and time.monotonic() >= deadline:
                self.sink.message(
                    f"timeout: the job ran longer than --timeout {self.timeout:g} s; stopping it"
                )
                self._stop_all(signal.SIGTERM)
                return processes.EXIT_TIMEOUT
            try:
                members = driver.step()
            except BelowMinimum as failed:
                self.sink.message(failed.line)
                self._stop_all(signal.SIGTERM)
                return processes.exit_code_of(failed.worker.handle.proc.returncode) or 1
            if members is not None:
                # the training is over; a worker started too late to join it stops here
                # (it would otherwise wait for a generation that never comes)
                self._stop_all(signal.SIGTERM, quiet=True)
                return 0 if any(w.handle.proc.returncode == 0 for w in members) else 1
            trap.sleep(processes.POLL_SECONDS)

    # -- stopping -----------------------------------------------------------------
    def _stop_all(self, first: signal.Signals, quiet: bool = False) -> None:
        if self.driver is None:
            return
        order = [first] + [s for s in (signal.SIGTERM, signal.SIGKILL) if s != first]
        for signum in order:
            alive = self.driver.alive()
            if not alive:
                return
            if not quiet and self.verbose:
                self.sink.message(f"sending {signum.name} to {len(alive)} worker(s)")
            for w in alive:
                w.handle.signal_group(signum)
            end = time.monotonic() + self.grace
            while time.monotonic() < end and self.driver.alive():
                time.sleep(processes.POLL_SECONDS / 2)
            if signum == signal.SIGKILL:
                return


def launch_elastic(
    command: Sequence[str],
    num_proc: int | None,
    min_np: int,
    max_np: int,
    env: Mapping[str, str] | None = None,
    *,
    discovery_script: str | None = None,
    timeout: float | None = None,
    prefix_output: bool = True,
    stdout: object = None,
    stderr: object = None,
    verbose: bool = False,
) -> int:
    """Run ``command`` as an elastic job of local workers; returns the job's exit code.

    ``num_proc`` workers start (default: ``max_np``, or the slots the discovery script
    reports); the job keeps running while at least ``min_np`` remain.
    """
    import sys

    if min_np < 1 or max_np < min_np:
        raise ConfigError(
            f"--min-np {min_np} and --max-np {max_np}: need 1 <= --min-np <= --max-np"
        )
    start = num_proc if num_proc is not None else max_np
    if not min_np <= start <= max_np:
        raise ConfigError(f"-np {start} must lie between --min-np {min_np} and --max-np {max_np}")
    if discovery_script is not None and not os.access(discovery_script, os.X_OK):
        raise ConfigError(f"--host-discovery-script {discovery_script!r} is not an executable file")
    out = stdout if stdout is not None else sys.stdout
    err = stderr if stderr is not None else (stdout if stdout is not None else sys.stderr)
    sink = OutputSink(out, err, prefix_output)  # type: ignore[arg-type]
    base = dict(os.environ)
    if env is not None:
        base.update(env)
    if "OMP_NUM_THREADS" not in base and max_np > 1:
        from hvdprof.runtime.threads import per_rank_threads

        base["OMP_NUM_THREADS"] = str(per_rank_threads(max_np))
    if verbose:
        sink.message(f"elastic job of `{shlex.join(command)}`: {min_np}..{max_np} ranks")
    job = ElasticJob(
        command,
        start,
        min_np,
        max_np,
        base,
        sink,
        discovery_script=discovery_script,
        timeout=timeout,
        verbose=verbose,
    )
    return job.run()


# ------------------------------------------------------------------------- the CLI
def elastic_requested(args: object) -> bool:
    return any(
        getattr(args, name, None) is not None
        for name in ("min_np", "max_np", "host_discovery_script")
    )


def run_elastic(args: object, command: list[str], overrides: Mapping[str, str]) -> int:
    """``hvdprof run`` in elastic mode (called by :mod:`hvdprof.cli`)."""
    a = args
    num_proc = getattr(a, "num_proc", None)
    min_np = getattr(a, "min_np", None) or num_proc or 1
    max_np = getattr(a, "max_np", None) or max(num_proc or 1, min_np)
    script = getattr(a, "host_discovery_script", None)
    if script is not None:
        script = os.path.abspath(script)
    return launch_elastic(
        command,
        num_proc,
        min_np,
        max_np,
        env=dict(overrides),
        discovery_script=script,
        timeout=getattr(a, "timeout", None),
        verbose=bool(getattr(a, "verbose", False)),
    )
