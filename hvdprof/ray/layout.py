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

# shared with hvdprof.spark: hvdprof/cluster/layout.py
from hvdprof.cluster.layout import (
    FORWARDED_PREFIXES as FORWARDED_PREFIXES,
)
from hvdprof.cluster.layout import (
    forwarded_environment as forwarded_environment,
)
from hvdprof.cluster.layout import (
    order_by_host,
)
from hvdprof.cluster.layout import (
    rank_environment as rank_environment,
)


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


def rank_order(places: Sequence[WorkerPlace]) -> list[int]:
    """Worker indices in rank order: grouped by node, nodes in order of first appearance,
    workers of a node in their own order."""
    return order_by_host([p.node_id for p in places])


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
