"""Horovod's ``horovod.ray.runner`` names, so code written against it imports ours.

``from horovod.ray.runner import BaseHorovodWorker, Coordinator, MiniSettings,
NodeColocator, RayExecutor`` becomes ``from hvdprof.ray.runner import ...``. The executor
and the worker actor are hvdprof's own (:mod:`.executor`, :mod:`.worker`); this module adds
the two pieces Horovod's runner shows besides them, built on hvdprof's rank layout:

* :class:`Coordinator`: the driver's record of which host each rank runs on, and the
  topology (local and cross ranks) that follows from it, numbered as
  ``environment.host_topology`` numbers any hvdprof job, so the variables it hands out
  are the ones ``hvdprof run`` would give the same ranks on the same hosts.
* ``NodeColocator``: a Ray actor that holds one node's share of a job's resources (sized
  by the caller, ``NodeColocator.options(num_cpus=4).remote(...)``) and starts that
  node's workers beside itself, pinned to its node and taking no CPU or GPU of their own,
  so the node's resources are counted once, by the colocator, and every worker of the
  node is placed or none is. ``RayExecutor`` reserves with a placement group instead;
  the colocator is for code that builds its job from Horovod's parts.

``NodeColocator`` becomes a Ray actor class on first use (``ray.remote`` of
:class:`ColocatedNode`), so importing this module does not import Ray.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hvdprof.ray.executor import RayExecutor
from hvdprof.ray.layout import rank_environment, visible_devices
from hvdprof.ray.settings import RaySettings
from hvdprof.ray.worker import BaseHorovodWorker, RayWorker
from hvdprof.runtime.environment import host_topology

#: bound on the colocator's own waits for its workers
_CONTROL_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class MiniSettings(RaySettings):
    """Horovod's settings object for a Ray job: hvdprof's :class:`RaySettings` (what
    ``RayExecutor.create_settings`` returns) plus Horovod's SSH, NIC and key fields, which
    are accepted and unused (Ray already reaches every node)."""

    nics: object = None
    key: str | None = None
    ssh_port: int | None = None
    ssh_identity_file: str | None = None


class Coordinator:
    """Which host each rank runs on; the local and cross ranks that follow.

    ``register(hostname, world_rank)`` once per rank, in any order, then
    ``finalize_registration()`` for Horovod's per-rank variables, or
    ``rank_environment(addr, port)`` for the ``HVDPROF_*`` variables a worker needs
    before ``hvd.init()``.
    """

    def __init__(self, settings: RaySettings | None = None) -> None:
        self.settings = settings if settings is not None else MiniSettings()
        #: each host's ranks, hosts in the order they first registered
        self.ranks_by_host: dict[str, list[int]] = {}

    @property
    def world_size(self) -> int:
        return sum(len(ranks) for ranks in self.ranks_by_host.values())

    @property
    def hoststring(self) -> str:
        """``a:4,b:4,c:4``: each host and its number of ranks, as ``-H`` takes them."""
        return ",".join(f"{host}:{len(ranks)}" for host, ranks in self.ranks_by_host.items())

    def register(self, hostname: str, world_rank: int) -> None:
        if world_rank < 0 or any(world_rank in r for r in self.ranks_by_host.values()):
            raise ValueError(f"rank {world_rank} is negative or already registered")
        self.ranks_by_host.setdefault(hostname, []).append(world_rank)

    def hosts(self) -> list[str]:
        """The host of each rank, by rank: ValueError unless the registered ranks are
        exactly ``0 .. world_size - 1`` (a job with a gap in its ranks never meets)."""
        by_rank = {r: host for host, ranks in self.ranks_by_host.items() for r in ranks}
        missing = sorted(set(range(len(by_rank))) - set(by_rank))
        if missing:
            raise ValueError(
                f"ranks {missing} of {len(by_rank)} were never registered "
                f"(registered: {sorted(by_rank)})"
            )
        return [by_rank[r] for r in range(len(by_rank))]

    def finalize_registration(self) -> dict[int, dict[str, int]]:
        """Horovod's ``HOROVOD_CROSS_RANK/CROSS_SIZE/LOCAL_RANK/LOCAL_SIZE`` (ints) of each
        rank. A host's ranks get local ranks in rank order; hosts are numbered in the order
        of their lowest rank (the same numbers whenever the hosts run equal counts)."""
        hosts = self.hosts()
        info: dict[int, dict[str, int]] = {}
        for rank in range(len(hosts)):
            local_rank, local_size, cross_rank, cross_size = host_topology(hosts, rank)
            info[rank] = {
                "HOROVOD_CROSS_RANK": cross_rank,
                "HOROVOD_CROSS_SIZE": cross_size,
                "HOROVOD_LOCAL_RANK": local_rank,
                "HOROVOD_LOCAL_SIZE": local_size,
            }
        return info

    def rank_environment(
        self, controller_addr: str, controller_port: int
    ) -> dict[int, dict[str, str]]:
        """Each rank's ``HVDPROF_*`` rank, size, local, cross and rendezvous variables
        (rank 0's store at ``controller_addr:controller_port``), for ``update_env_vars``."""
        hosts = self.hosts()
        return {
            rank: rank_environment(hosts, rank, controller_addr, controller_port)
            for rank in range(len(hosts))
        }


class ColocatedNode:
    """The class behind the ``NodeColocator`` actor (plain, so it can be subclassed).

    ``node_rank``: this node's number in the job; ``num_slots``: its workers;
    ``world_size``: the job's workers on every node (Horovod's meanings). Its workers are
    ranks ``node_rank * num_slots`` onwards (:meth:`world_ranks`); with ``use_gpu`` each
    sees every GPU Ray gave the colocator in ``CUDA_VISIBLE_DEVICES`` (local rank ``r``
    uses device ``r``), as :class:`RayExecutor` shares a node's GPUs.
    """

    def __init__(self, *, node_rank: int, num_slots: int, world_size: int, use_gpu: bool) -> None:
        if node_rank < 0 or num_slots < 1 or world_size < 1:
            raise ValueError(
                f"node_rank={node_rank} must be >= 0, num_slots={num_slots} and "
                f"world_size={world_size} >= 1"
            )
        self.node_rank = node_rank
        self.num_slots = num_slots
        self.world_size = world_size
        self.use_gpu = use_gpu
        self.workers: list[Any] = []

    def world_ranks(self) -> list[int]:
        start = self.node_rank * self.num_slots
        return list(range(start, start + self.num_slots))

    def create_workers(self) -> str:
        """Start the workers on this actor's node (none twice); returns the node's Ray id,
        so a caller can check that its colocators landed on distinct nodes."""
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        node_id = str(ray.get_runtime_context().get_node_id())
        if self.workers:
            return node_id
        env: dict[str, str] = {}
        if self.use_gpu:
            gpu_ids = ray.get_gpu_ids()
            if not gpu_ids:
                raise ValueError(
                    "NodeColocator(use_gpu=True) was given no GPU: create it with "
                    ".options(num_gpus=...) for the node's workers"
                )
            env["CUDA_VISIBLE_DEVICES"] = visible_devices(gpu_ids)
        pinned = ray.remote(RayWorker).options(
            num_cpus=0,
            num_gpus=0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False),
        )
        self.workers = [pinned.remote() for _ in range(self.num_slots)]
        if env:
            ray.get(
                [w.update_env_vars.remote(env) for w in self.workers], timeout=_CONTROL_TIMEOUT_S
            )
        return node_id

    def get_workers(self) -> list[Any]:
        """The workers' actor handles, local rank order (empty before ``create_workers``)."""
        return list(self.workers)

    def execute(self, fn: Callable[[Any], Any]) -> Any:
        return fn(self)


def _node_colocator() -> Any:
    import ray

    return ray.remote(ColocatedNode)


def __getattr__(name: str) -> Any:
    # NodeColocator is made on first use: ``ray.remote`` needs Ray, which the rest of
    # this module (Coordinator, MiniSettings) does not
    if name == "NodeColocator":
        actor_cls = _node_colocator()
        globals()[name] = actor_cls
        return actor_cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "BaseHorovodWorker",
    "ColocatedNode",
    "Coordinator",
    "MiniSettings",
    "NodeColocator",  # noqa: F822 (made by __getattr__, on first use)
    "RayExecutor",
]
