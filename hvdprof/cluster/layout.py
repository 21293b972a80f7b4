"""The variables that tell a rank placed by a cluster engine who it is and where to meet.

Pure functions: ranks are numbered host by host (the host whose first worker came first
gets the lowest ranks), so local ranks are contiguous, as Horovod's Ray and Spark drivers
arrange them; local and cross ranks then follow from the host names exactly as the
runtime derives them (``environment.host_topology``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from hvdprof.config import name_of
from hvdprof.runtime.environment import host_topology

#: the variables of the driver that reach every rank (hvdprof's and Horovod's own)
FORWARDED_PREFIXES = ("HVDPROF_", "HOROVOD_")


def forwarded_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The driver's ``HVDPROF_*`` and ``HOROVOD_*`` variables, for every rank."""
    return {k: v for k, v in environ.items() if k.startswith(FORWARDED_PREFIXES)}


def order_by_host(hosts: Sequence[str]) -> list[int]:
    """Worker indices in rank order: grouped by host (``hosts[i]`` is worker ``i``'s),
    hosts in order of first appearance, workers of a host in their own order."""
    first: dict[str, int] = {}
    for i, host in enumerate(hosts):
        first.setdefault(host, i)
    return sorted(range(len(hosts)), key=lambda i: (first[hosts[i]], i))


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
