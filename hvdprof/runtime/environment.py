"""Which launcher started this process, and what it tells us: rank, size, rendezvous.

Users start jobs with the launchers they already have, so ``init()`` reads their
variables and needs no ``HVDPROF_*`` one:

- ``hvdprof run``: ``HVDPROF_RANK``/``HVDPROF_SIZE`` and the controller address;
- Open MPI's ``mpirun``: ``OMPI_COMM_WORLD_RANK``/``_SIZE``/``_LOCAL_RANK``/``_LOCAL_SIZE``;
- MPICH's Hydra ``mpiexec`` (and Intel MPI): ``PMI_RANK``/``PMI_SIZE``,
  ``MPI_LOCALRANKID``/``MPI_LOCALNRANKS``;
- ``torchrun``: ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``/``LOCAL_WORLD_SIZE`` and
  ``MASTER_ADDR``/``MASTER_PORT`` (the agent's store when ``TORCHELASTIC_USE_AGENT_STORE``);
- Slurm's ``srun``: ``SLURM_PROCID``/``SLURM_STEP_NUM_TASKS`` (else ``SLURM_NTASKS``)/
  ``SLURM_LOCALID``; the rendezvous is on the first node of ``SLURM_STEP_NODELIST``
  (else ``SLURM_NODELIST``), at ``HVDPROF_CONTROLLER_PORT`` or a port derived from the job
  and step ids (:func:`slurm_port`), the same on every rank with no message.

Host names decide the rest of the topology (``local_rank``, ``cross_rank``), whatever the
launcher said: ranks exchange them at start-up (:func:`host_topology`). ``HVDPROF_HOSTNAME``
overrides this rank's host name, so tests can run a two-"host" job on one machine.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hvdprof.config import name_of
from hvdprof.errors import ConfigError

if TYPE_CHECKING:
    from hvdprof.config import Config

#: what ``launcher`` is for each kind of start; ``MPI_LAUNCHERS`` are the ones that set up
#: an MPI world the MPI backend can join
HVDPROF, OPENMPI, MPICH, TORCHRUN, SLURM, NONE = (
    "hvdprof run",
    "Open MPI mpirun",
    "MPICH mpiexec",
    "torchrun",
    "Slurm srun",
    "none",
)
MPI_LAUNCHERS = frozenset({OPENMPI, MPICH})
#: the ports :func:`slurm_port` chooses from: below Linux's ephemeral range (32768-60999)
SLURM_PORT_BASE = 20000
SLURM_PORT_SPAN = 10000


@dataclass(frozen=True)
class Launch:
    """What the launcher's variables say about this process (None: it says nothing)."""

    launcher: str
    rank: int | None = None
    size: int | None = None
    local_rank: int | None = None
    local_size: int | None = None
    #: rendezvous address and port from the launcher (torchrun, Slurm)
    addr: str | None = None
    port: int | None = None
    #: torchrun's agent already serves a store at addr:port: every rank is its client
    agent_store: bool = False
    #: a namespace for our keys in a store that outlives one attempt (torchrun restarts)
    namespace: str = ""

    @property
    def is_mpi(self) -> bool:
        return self.launcher in MPI_LAUNCHERS


def _int(env: Mapping[str, str], name: str) -> int | None:
    value = env.get(name)
    if value in (None, ""):
        return None
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"{name}={value!r} is malformed: it accepts an integer") from None


def detect(environ: Mapping[str, str] | None = None) -> Launch:
    """The launcher that started this process, from its variables (first match wins:
    hvdprof run, Open MPI, MPICH/Hydra, torchrun, Slurm)."""
    env = os.environ if environ is None else environ
    if env.get(name_of("rank")) or env.get(name_of("elastic_store")):
        return Launch(HVDPROF)
    if "OMPI_COMM_WORLD_RANK" in env:
        return Launch(
            OPENMPI,
            _int(env, "OMPI_COMM_WORLD_RANK"),
            _int(env, "OMPI_COMM_WORLD_SIZE"),
            _int(env, "OMPI_COMM_WORLD_LOCAL_RANK"),
            _int(env, "OMPI_COMM_WORLD_LOCAL_SIZE"),
        )
    if "PMI_RANK" in env and "PMI_SIZE" in env:
        return Launch(
            MPICH,
            _int(env, "PMI_RANK"),
            _int(env, "PMI_SIZE"),
            _int(env, "MPI_LOCALRANKID"),
            _int(env, "MPI_LOCALNRANKS"),
        )
    if "RANK" in env and "WORLD_SIZE" in env:
        restarts = env.get("TORCHELASTIC_RESTART_COUNT", "")
        return Launch(
            TORCHRUN,
            _int(env, "RANK"),
            _int(env, "WORLD_SIZE"),
            _int(env, "LOCAL_RANK"),
            _int(env, "LOCAL_WORLD_SIZE"),
            addr=env.get("MASTER_ADDR") or None,
            port=_int(env, "MASTER_PORT"),
            agent_store=env.get("TORCHELASTIC_USE_AGENT_STORE") == "True",
            namespace=f"attempt{restarts}/" if restarts else "",
        )
    if "SLURM_PROCID" in env and ("SLURM_STEP_NUM_TASKS" in env or "SLURM_NTASKS" in env):
        size = _int(env, "SLURM_STEP_NUM_TASKS")
        nodes = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_NODELIST") or ""
        return Launch(
            SLURM,
            _int(env, "SLURM_PROCID"),
            size if size is not None else _int(env, "SLURM_NTASKS"),
            _int(env, "SLURM_LOCALID"),
            slurm_tasks_on_first_node(
                env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE") or ""
            ),
            addr=first_slurm_node(nodes) if nodes else None,
            port=slurm_port(env),
        )
    return Launch(NONE)


def first_slurm_node(nodelist: str) -> str:
    """The first host of a Slurm host list: ``node[03-05,9],gpu1`` -> ``node03``.

    Slurm's compressed form is a comma-separated list of names, each with optional
    bracketed ranges (zero padding kept); only the first name matters here.
    """
    text = nodelist.strip()
    match = re.match(r"([^,\[]*)(?:\[([^\]]*)\])?([^,]*)", text)
    if not text or match is None or not match[1]:
        raise ConfigError(f"SLURM_NODELIST={nodelist!r} is malformed: it names no host")
    prefix, ranges, suffix = match[1], match[2], match[3]
    if ranges is None:
        return prefix + suffix
    first = ranges.split(",")[0].split("-")[0].strip()
    if not first.isdigit():
        raise ConfigError(f"SLURM_NODELIST={nodelist!r} is malformed: bad range {ranges!r}")
    return prefix + first + suffix


def slurm_tasks_on_first_node(tasks_per_node: str) -> int | None:
    """``SLURM_TASKS_PER_NODE`` (``2(x3),1``) -> tasks on the first node (2)."""
    match = re.match(r"\s*(\d+)", tasks_per_node)
    return int(match[1]) if match else None


def slurm_port(environ: Mapping[str, str]) -> int:
    """The rendezvous port of a Slurm step: ``HVDPROF_CONTROLLER_PORT`` when set, else
    ``20000 + (16 * job id + step id) % 10000``, which every rank computes alike and which
    differs between the steps of a job and between jobs sharing a node (unless their ids
    are 625 jobs apart and they share the first node; set the port then)."""
    job = _int(environ, "SLURM_JOB_ID") or 0
    step = _int(environ, "SLURM_STEP_ID") or _int(environ, "SLURM_STEPID") or 0
    return SLURM_PORT_BASE + (16 * job + step) % SLURM_PORT_SPAN


def host_name(rank: int, override: str = "") -> str:
    """This rank's host name: ``HVDPROF_HOSTNAME`` when set, else the machine's.

    ``HVDPROF_HOSTNAME`` is for tests and for machines whose names are not unique; a
    comma-separated list is indexed by rank (``a,a,b,b``: ranks 0-1 on ``a``, 2-3 on
    ``b``), so one setting describes a whole multi-"host" job under any launcher.
    """
    override = override.strip()
    if not override:
        return socket.gethostname()
    names = [n.strip() for n in override.split(",")]
    if len(names) == 1:
        return names[0]
    if rank >= len(names) or not names[rank]:
        raise ConfigError(
            f"HVDPROF_HOSTNAME={override!r} is malformed: it names {len(names)} hosts, "
            f"none for rank {rank}"
        )
    return names[rank]


def host_topology(hosts: list[str], rank: int) -> tuple[int, int, int, int]:
    """(local_rank, local_size, cross_rank, cross_size) from every rank's host name.

    Hosts are numbered in the order of their lowest rank; a rank's local rank is its
    position among the ranks on its host, its cross rank is its host's number (Horovod's
    meaning when every host runs the same number of ranks).
    """
    order: dict[str, int] = {}
    for h in hosts:
        order.setdefault(h, len(order))
    mine = hosts[rank]
    local = [r for r, h in enumerate(hosts) if h == mine]
    return local.index(rank), len(local), order[mine], len(order)


def data_backend(requested: str, launch: Launch, mpi_installed: bool) -> str:
    """``mpi`` or ``gloo``: the engine for the collectives shared memory does not do.

    ``auto`` takes MPI when MPI started the job and mpi4py is installed, else Gloo;
    ``shm`` and ``gloo`` keep Gloo (``shm`` still needs every rank on one host).
    """
    if requested == "mpi":
        return "mpi"
    if requested == "auto" and launch.is_mpi and mpi_installed:
        return "mpi"
    return "gloo"


def missing_rendezvous_hint(launch: Launch) -> str:
    """What to do when a multi-rank job has no rendezvous address (the end of an error)."""
    if launch.is_mpi:
        return (
            f"under {launch.launcher}, install mpi4py (pip install 'hvdprof[mpi]') so the "
            "ranks meet over MPI, or set HVDPROF_CONTROLLER_ADDR and HVDPROF_CONTROLLER_PORT"
        )
    return "start it with `hvdprof run -np N`"


def check_mpi_launch(launch: Launch, size: int) -> None:
    """``HVDPROF_BACKEND=mpi`` under a launcher that did not start an MPI world."""
    if size > 1 and not launch.is_mpi:
        raise ConfigError(
            f"HVDPROF_BACKEND=mpi needs an MPI launcher, but this job was started by "
            f"{launch.launcher}: start it with `mpirun -np {size} ...` (or mpiexec, or srun "
            "--mpi=pmi2/pmix), or choose HVDPROF_BACKEND=gloo or auto"
        )


def mpi4py_installed() -> bool:
    """Whether mpi4py is installed, without importing it (the import initializes MPI)."""
    import importlib.util

    return importlib.util.find_spec("mpi4py") is not None


def with_launcher_rendezvous(config: Config, launch: Launch) -> Config:
    """``config`` with the rendezvous address and port the launcher gives (torchrun's
    ``MASTER_ADDR``/``MASTER_PORT``, Slurm's first node), unless ``HVDPROF_CONTROLLER_ADDR``/``_PORT``
    were set explicitly."""
    changes: dict[str, object] = {}
    if launch.addr and name_of("controller_addr") not in config.explicitly_set:
        changes["controller_addr"] = launch.addr
    if launch.port is not None and config.controller_port is None:
        changes["controller_port"] = launch.port
    return config.replace(**changes) if changes else config


def exchange_hosts(store: Any, rank: int, size: int, host: str) -> list[str]:
    """Every rank's host name, through the rendezvous store (ordered by rank)."""
    if size == 1:
        return [host]
    store.set(f"hvdprof/host/{rank}", host)
    return [store.get(f"hvdprof/host/{r}").decode() for r in range(size)]


def free_port(loopback: bool) -> int:
    """A port nobody listens on now, on loopback or on every interface."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1" if loopback else "", 0))
        return s.getsockname()[1]
