"""``hvdprof run --min-np N --max-np M``: an elastic job of local workers.

Like ``horovodrun``'s elastic mode, for workers on this host: the launcher keeps the
job's membership in a ``torch.distributed.TCPStore`` it hosts (see
:mod:`hvdprof.runtime.elastic` for the keys) and publishes a new *generation* whenever
the set of workers changes:

* a worker exits non-zero (killed, crashed): the others re-form without it, as long as
  at least ``--min-np`` remain; below that the job fails, naming the ranks that are gone;
* a worker reports that a collective failed without anyone dying: the same workers
  re-form;
* ``--host-discovery-script`` reports more local slots than workers (up to
  ``--max-np``): new workers start, and once they are ready a generation including them
  is published; the running workers pick it up at their next ``commit()``. Fewer slots
  than workers stops the newest workers.

The job ends when every worker has exited; it succeeds when those of the last
generation exited 0.
"""

from __future__ import annotations

import datetime
import json
import os
import shlex
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hvdprof.config import name_of
from hvdprof.errors import ConfigError
from hvdprof.launcher import (
    CONTROLLER_ADDR,
    EXIT_TIMEOUT,
    GRACE_SECONDS,
    POLL_SECONDS,
    TOPOLOGY_VARS,
    OutputSink,
    _pump,
    _Rank,
    _SignalTrap,
    check_command,
    describe_returncode,
    exit_code_of,
)
from hvdprof.runtime import elastic as keys

#: How often the discovery script runs, and how long one run may take.
DISCOVERY_INTERVAL_S = 1.0
DISCOVERY_TIMEOUT_S = 10.0
#: A reset request with no dead worker behind it is answered after this long (a death
#: noticed meanwhile is answered at once, with a generation that leaves the dead out).
RESET_GRACE_S = 0.3
_LOCAL_HOSTS = {"localhost", "127.0.0.1", "::1", socket.gethostname()}


@dataclass(eq=False)
class _Worker:
    wid: str
    proc: _Rank
    ready: bool = False
    finished: bool = False


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


class ElasticJob:
    """Workers of one command that may die, be replaced or be added while it runs."""

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
        grace: float = GRACE_SECONDS,
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
        self.workers: list[_Worker] = []
        self.generation = 0
        self.plan: list[str] = []
        self.gone: list[str] = []  # "rank R (worker W): how it ended", every failure
        self._next_id = 0
        self._store = None
        self._reset_seen: float | None = None
        self._last_discovery = 0.0
        self._finishing = False
        self.history: list[dict[str, object]] = []

    # -- life cycle ---------------------------------------------------------------
    def run(self) -> int:
        problem = check_command(self.command[0], self.env.get("PATH"))
        if problem is not None:
            self.sink.message(problem[1])
            return problem[0]
        import torch.distributed as dist

        self._store = dist.TCPStore(
            CONTROLLER_ADDR,
            0,
            is_master=True,
            wait_for_workers=False,
            timeout=datetime.timedelta(seconds=30),
        )
        self.env[name_of("elastic_store")] = f"{CONTROLLER_ADDR}:{self._store.port}"
        started = time.monotonic()
        with _SignalTrap() as trap:
            try:
                initial = self.num_proc
                if self.discovery_script:
                    initial = min(self.max_np, self._discover())
                if initial < self.min_np:
                    self.sink.message(
                        f"only {initial} slots available, fewer than --min-np {self.min_np}"
                    )
                    return 1
                for _ in range(initial):
                    self._spawn()
                self._publish([w.wid for w in self.workers], "start")
                code = self._watch(trap, started)
            finally:
                self._stop_all(signal.SIGKILL, quiet=True)
        deadline = time.monotonic() + 2.0
        for w in self.workers:
            w.proc.join_output(deadline)
        return code

    def _spawn(self) -> _Worker:
        wid = str(self._next_id)
        self._next_id += 1
        env = dict(self.env)
        env.update(HVDPROF_ELASTIC_WORKER=wid, PYTHONUNBUFFERED="1")
        proc = subprocess.Popen(
            self.command,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        rank = _Rank(int(wid), proc)
        for stream, pipe in (("stdout", proc.stdout), ("stderr", proc.stderr)):
            thread = threading.Thread(
                target=_pump, args=(pipe, int(wid), stream, self.sink, None), daemon=True
            )
            thread.start()
            rank.pumps.append(thread)
        worker = _Worker(wid, rank)
        self.workers.append(worker)
        if self.verbose:
            self.sink.message(f"worker {wid} started, pid {proc.pid}")
        return worker

    def _publish(self, members: list[str], reason: str) -> None:
        old = len(self.plan)
        self.generation += 1
        self.plan = list(members)
        assert self._store is not None
        body = {"workers": self.plan, "reason": reason, "old_size": old}
        self._store.set(keys.plan_key(self.generation), json.dumps(body))
        self._store.set(keys.GEN_KEY, str(self.generation))
        self._reset_seen = None
        self._record_history(body)
        if self.generation > 1:
            self.sink.message(
                f"elastic generation {self.generation}: {old} -> {len(members)} ranks ({reason})"
            )

    def _record_history(self, body: dict[str, object]) -> None:
        """``TIMELINE/elastic.json``: every generation of the job, when a timeline is on."""
        directory = self.env.get(name_of("timeline_dir"))
        if not directory:
            return
        self.history.append(
            {
                "generation": self.generation,
                "workers": body["workers"],
                "old_size": body["old_size"],
                "new_size": len(self.plan),
                "reason": body["reason"],
                "unix_time": time.time(),
                "timeline_dir": f"generation.{self.generation}",
            }
        )
        try:
            os.makedirs(directory, exist_ok=True)
            tmp = os.path.join(directory, ".elastic.json.tmp")
            with open(tmp, "w") as f:
                json.dump({"format": "hvdprof-elastic", "generations": self.history}, f, indent=1)
            os.replace(tmp, os.path.join(directory, "elastic.json"))
        except OSError as exc:
            self.sink.message(f"cannot write {directory}/elastic.json: {exc.strerror or exc}")

    # -- watching -----------------------------------------------------------------
    def _alive(self) -> list[_Worker]:
        return [w for w in self.workers if w.proc.returncode is None]

    def _watch(self, trap: _SignalTrap, started: float) -> int:
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
                return EXIT_TIMEOUT
            code = self._reap()
            if code is not None:
                return code
            members = [w for w in self.workers if w.wid in self.plan]
            if all(w.proc.returncode is not None for w in members):
                # the training is over; a worker started too late to join it stops here
                # (it would otherwise wait for a generation that never comes)
                self._stop_all(signal.SIGTERM, quiet=True)
                return 0 if any(w.proc.returncode == 0 for w in members) else 1
            if not self._finishing:
                self._answer_reset_requests()
                self._admit_ready_workers()
                if self.discovery_script:
                    self._rediscover()
            trap.sleep(POLL_SECONDS)

    def _reap(self) -> int | None:
        """Notice workers that ended; re-form without the failed ones, or give up."""
        failed: list[_Worker] = []
        for w in self.workers:
            rc = w.proc.returncode
            if rc is None or w.finished:
                continue
            w.finished = True
            if rc != 0:
                failed.append(w)
            elif w.wid in self.plan:
                self._finishing = True  # the training is over: add no more workers
        if not failed:
            return None
        for w in failed:
            w.proc.join_output(time.monotonic() + 0.2)
            where = (
                f"rank {self.plan.index(w.wid)} (worker {w.wid})"
                if w.wid in self.plan
                else f"worker {w.wid} (not yet admitted)"
            )
            self.gone.append(f"{where} exited with {describe_returncode(w.proc.returncode)}")
        in_plan = [w for w in failed if w.wid in self.plan]
        if not in_plan:
            return None
        survivors = [wid for wid in self.plan if wid not in {w.wid for w in failed}]
        survivors = [
            wid
            for wid in survivors
            if next(x for x in self.workers if x.wid == wid).proc.returncode is None
        ]
        if len(survivors) < self.min_np:
            self.sink.message(
                f"elastic job failed: {len(survivors)} rank(s) left, fewer than --min-np "
                f"{self.min_np}; gone: {'; '.join(self.gone)}"
            )
            self._stop_all(signal.SIGTERM)
            return exit_code_of(in_plan[0].proc.returncode) or 1
        if not survivors:
            return None
        self._publish(survivors, "; ".join(self.gone[-len(failed) :]))
        return None

    def _answer_reset_requests(self) -> None:
        assert self._store is not None
        if not self._store.check([keys.reset_key(self.generation)]):
            return
        now = time.monotonic()
        if self._reset_seen is None:
            self._reset_seen = now
        elif now - self._reset_seen >= RESET_GRACE_S:
            alive = {w.wid for w in self._alive()}
            self._publish([wid for wid in self.plan if wid in alive], "a collective failed")

    def _admit_ready_workers(self) -> None:
        """New workers that announced themselves join in the next generation."""
        assert self._store is not None
        waiting = [w for w in self._alive() if w.wid not in self.plan and not w.ready]
        for w in waiting:
            if self._store.check([keys.ready_key(w.wid)]):
                w.ready = True
        joining = [w.wid for w in self._alive() if w.ready and w.wid not in self.plan]
        if joining and all(w.ready for w in waiting):
            alive = {w.wid for w in self._alive()}
            members = [wid for wid in self.plan if wid in alive] + joining
            self._publish(members, f"worker(s) {', '.join(joining)} added")

    def _discover(self) -> int:
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

    def _rediscover(self) -> None:
        now = time.monotonic()
        if now - self._last_discovery < DISCOVERY_INTERVAL_S:
            return
        self._last_discovery = now
        try:
            slots = min(self.max_np, self._discover())
        except ConfigError as exc:
            self.sink.message(str(exc))
            return
        alive = self._alive()
        if slots > len(alive):
            for _ in range(slots - len(alive)):
                self._spawn()
        elif slots < len(alive) and slots >= self.min_np:
            # fewer slots: stop the newest workers; the others re-form without them
            for w in sorted(alive, key=lambda w: int(w.wid))[slots:]:
                self.sink.message(f"host discovery: {slots} slots; stopping worker {w.wid}")
                w.proc.signal_group(signal.SIGKILL)

    # -- stopping -----------------------------------------------------------------
    def _stop_all(self, first: signal.Signals, quiet: bool = False) -> None:
        order = [first] + [s for s in (signal.SIGTERM, signal.SIGKILL) if s != first]
        for signum in order:
            alive = self._alive()
            if not alive:
                return
            if not quiet and self.verbose:
                self.sink.message(f"sending {signum.name} to {len(alive)} worker(s)")
            for w in alive:
                w.proc.signal_group(signum)
            end = time.monotonic() + self.grace
            while time.monotonic() < end and self._alive():
                time.sleep(POLL_SECONDS / 2)
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
