"""The placement group that reserves a Ray job's workers before any starts.

Reserving first means a job that cannot fit fails at ``start()`` with ``TimeoutError``
instead of leaving some ranks started and the others pending forever (they would then
wait at the rendezvous until its timeout). ``num_workers`` workers are packed onto as few
nodes as possible; ``num_hosts`` x ``num_workers_per_host`` puts that many on each of
``num_hosts`` distinct nodes (one bundle per node, Horovod's ``num_hosts``/``num_slots``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class PlacementPlan:
    """Bundles to reserve and, for each worker, the bundle it goes into."""

    bundles: list[dict[str, float]]
    strategy: str
    bundle_of_worker: list[int]
    cpus_per_worker: float
    gpus_per_worker: float

    @property
    def num_workers(self) -> int:
        return len(self.bundle_of_worker)


def plan_placement(
    num_workers: int | None,
    num_hosts: int | None,
    num_workers_per_host: int | None,
    cpus_per_worker: float,
    gpus_per_worker: float,
) -> PlacementPlan:
    """The bundles for either form of the request; ValueError for one that describes no job."""
    if not cpus_per_worker >= 0 or not gpus_per_worker >= 0:
        raise ValueError("cpus_per_worker and gpus_per_worker must be >= 0")
    if num_hosts is not None:
        per_host = num_workers_per_host or 1
        if num_hosts < 1 or per_host < 1:
            raise ValueError(
                f"num_hosts={num_hosts} and num_workers_per_host={per_host} must be >= 1"
            )
        if num_workers is not None and num_workers != num_hosts * per_host:
            raise ValueError(
                f"num_workers={num_workers} differs from num_hosts x num_workers_per_host "
                f"= {num_hosts * per_host}: give one or the other"
            )
        bundle = _resources(cpus_per_worker * per_host, gpus_per_worker * per_host)
        return PlacementPlan(
            [dict(bundle) for _ in range(num_hosts)],
            "STRICT_SPREAD",
            [w // per_host for w in range(num_hosts * per_host)],
            cpus_per_worker,
            gpus_per_worker,
        )
    if num_workers is None or num_workers < 1:
        raise ValueError(f"num_workers must be an integer >= 1, got {num_workers!r}")
    bundle = _resources(cpus_per_worker, gpus_per_worker)
    return PlacementPlan(
        [dict(bundle) for _ in range(num_workers)],
        "PACK",
        list(range(num_workers)),
        cpus_per_worker,
        gpus_per_worker,
    )


def _resources(cpus: float, gpus: float) -> dict[str, float]:
    out = {"CPU": float(cpus)}
    if gpus:
        out["GPU"] = float(gpus)
    return out


def reserve(plan: PlacementPlan, timeout_s: float) -> Any:
    """Create the placement group and wait until Ray has placed it: ``TimeoutError``
    (with the group removed again) when it cannot within ``timeout_s``."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    group = placement_group(plan.bundles, strategy=plan.strategy)
    try:
        ray.get(group.ready(), timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        remove_placement_group(group)
        raise TimeoutError(
            f"hvdprof ray: Ray could not place {plan.num_workers} worker(s) "
            f"({len(plan.bundles)} x {plan.bundles[0]}, {plan.strategy}) within "
            f"placement_group_timeout_s={timeout_s:g}; the cluster has "
            f"{ray.available_resources()} available"
        ) from None
    return group


def scheduling(group: Any, bundle: int) -> Any:
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    return PlacementGroupSchedulingStrategy(
        placement_group=group,
        placement_group_bundle_index=bundle,
        placement_group_capture_child_tasks=True,
    )
