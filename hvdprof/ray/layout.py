"""Where each rank of a Ray job runs, and the variables that tell it who it is.

Pure functions over what the actors report about themselves, so the rank layout is
tested without a cluster. Ranks on one node are numbered together (the node whose
first worker came first gets the lowest ranks), so local ranks are contiguous, as
Horovod's Ray coordinator arranges them; local and cross ranks then follow from the
host names exactly as the runtime derives them (``environment.host_topology``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from hvdprof.config import name_of
from hvdprof.runtime.environment import host_topology

#: the variables of the driver that reach every worker (hvdprof's and Horovod's own)
FORWARDED_PREFIXES = ("HVDPROF_", "HOROVOD_")


@dataclass(frozen=True)
class WorkerPlace:
    """What an actor reports about where it runs."""

    hostname: str
    node_id: str
    node_ip: str
    pid: int
    actor_id: str = ""
    gpu_ids: tuple[str, ...] = field(default_factory=tuple)

    def describe(self) -> str:
        """``actor 1a2b3c4d on node 10.0.0.5 (host-a)``: how failures name the actor."""
        return f"actor {self.actor_id[:8] or '?'} on node {self.node_ip} ({self.hostname})"


def forwarded_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The driver's ``HVDPROF_*`` and ``HOROVOD_*`` variables, for every worker."""
    return {k: v for k, v in environ.items() if k.startswith(FORWARDED_PREFIXES)}


def rank_order(places: Sequence[WorkerPlace]) -> list[int]:
    """Worker indices in rank order: grouped by node, nodes in order of first appearance,
    workers of a node in their own order."""
    first: dict[str, int] = {}
    for i, p in enumerate(places):
        first.setdefault(p.node_id, i)
    return sorted(range(len(places)), key=lambda i: (first[places[i].node_id], i))


def rank_environment(
    hosts: Sequence[str], rank: int, controller_addr: str, controller_port: int
) -> dict[str, str]:
    """The topology variables of ``rank`` in a job whose ranks run on ``hosts`` (by rank)."""
    local_rank, local_size, cross_rank, cross_size = host_topology(list(hosts), rank)
    return {
        name_of("rank"): str(rank),
        name_of("size"): str(len(hosts)),
        name_of("local_rank"): str(local_rank),
        name_of("local_size"): str(local_size),
        name_of("cross_rank"): str(cross_rank),
        name_of("cross_size"): str(cross_size),
        name_of("controller_addr"): controller_addr,
        name_of("controller_port"): str(controller_port),
    }


def shared_visible_devices(places: Sequence[WorkerPlace]) -> list[str]:
    """``CUDA_VISIBLE_DEVICES`` of each worker: every GPU Ray gave the workers of its node,
    so local rank ``r`` can use device ``r`` (Horovod's Ray executor does the same)."""
    per_node: dict[str, set[str]] = {}
    for p in places:
        per_node.setdefault(p.node_id, set()).update(p.gpu_ids)
    return [visible_devices(per_node[p.node_id]) for p in places]


def visible_devices(gpu_ids: Iterable[object]) -> str:
    """``CUDA_VISIBLE_DEVICES`` naming ``gpu_ids``, in device order (``"1,3,10"``)."""
    return ",".join(sorted({str(g) for g in gpu_ids}, key=_device_key))


def _device_key(device: str) -> tuple[int, str]:
    return (int(device), "") if device.isdigit() else (1 << 30, device)


def cluster_slots(
    nodes: Iterable[Mapping[str, object]], cpus_per_slot: float, gpus_per_slot: float = 0.0
) -> dict[str, int]:
    """``{node address: slots}`` from ``ray.nodes()``: the workers each alive node can hold
    (its CPUs over ``cpus_per_slot``, and its GPUs over ``gpus_per_slot`` when > 0)."""
    slots: dict[str, int] = {}
    for node in nodes:
        if not node.get("Alive"):
            continue
        resources = node.get("Resources") or {}
        assert isinstance(resources, Mapping)
        count = int(float(resources.get("CPU", 0)) // cpus_per_slot) if cpus_per_slot > 0 else 0
        if gpus_per_slot > 0:
            count = min(count, int(float(resources.get("GPU", 0)) // gpus_per_slot))
        if count > 0:
            address = str(node.get("NodeManagerAddress", ""))
            slots[address] = slots.get(address, 0) + count
    return slots
