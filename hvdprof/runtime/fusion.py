"""Tensor fusion planning: which ready allreduces share one fusion buffer.

A pure function, so the plan is testable without processes and provably identical on
every rank: it depends only on the ordered response list, which all ranks share.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, field
from itertools import accumulate
from typing import NamedTuple

from hvdprof.runtime.dtypes import ITEMSIZE
from hvdprof.runtime.requests import Signature


class FusionKey(NamedTuple):
    """Allreduces can share a buffer only when one backend call can reduce them all."""

    dtype: str
    reduce_op: int
    prescale: float
    postscale: float
    device: str
    process_set: int  # only the tensors of one process set share a buffer


def fusion_key(sig: Signature) -> FusionKey:
    return FusionKey(
        sig.dtype, sig.reduce_op, sig.prescale, sig.postscale, sig.device, sig.process_set
    )


def signature_nbytes(sig: Signature) -> int:
    n = ITEMSIZE.get(sig.dtype, 0)
    for d in sig.shape:
        n *= d
    return n


@dataclass(slots=True)
class FusionGroup:
    key: FusionKey
    indices: list[int] = field(default_factory=list)  # positions in the response list
    nbytes: int = 0

    @property
    def fused(self) -> bool:
        """More than one tensor: packed into a buffer. One tensor is reduced in place."""
        return len(self.indices) > 1


def plan_fusion(items: list[tuple[FusionKey, int]], threshold_bytes: int) -> list[FusionGroup]:
    """Group ``(key, nbytes)`` items into buffers of at most ``threshold_bytes``.

    Items keep their relative order inside a group, and groups are ordered by their first
    item, so the plan is deterministic. A tensor at least as large as the threshold gets a
    group of its own (reduced in place, no copy). ``threshold_bytes == 0`` disables fusion.
    """
    return plan_fusion_columns([k for k, _ in items], [n for _, n in items], threshold_bytes)


def plan_fusion_columns(
    keys: list[FusionKey], sizes: list[int], threshold_bytes: int
) -> list[FusionGroup]:
    """:func:`plan_fusion` on two parallel lists (the cycle's form: no tuple per op)."""
    n = len(keys)
    if not n:
        return []
    first = keys[0]
    if threshold_bytes > 0 and keys.count(first) == n and max(sizes) < threshold_bytes:
        return _plan_one_key(first, sizes, threshold_bytes)
    groups: list[FusionGroup] = []
    open_group: dict[FusionKey, FusionGroup] = {}
    last_key: FusionKey | None = None
    group: FusionGroup | None = None
    for index in range(n):
        key, nbytes = keys[index], sizes[index]
        if threshold_bytes <= 0 or nbytes >= threshold_bytes:
            groups.append(FusionGroup(key, [index], nbytes))
            continue
        if key is not last_key:  # consecutive items usually share a key: skip the lookup
            group = open_group.get(key)
            last_key = key
        if group is None or group.nbytes + nbytes > threshold_bytes:
            group = FusionGroup(key)
            groups.append(group)
            open_group[key] = group
        group.indices.append(index)
        group.nbytes += nbytes
    return groups


def _plan_one_key(key: FusionKey, sizes: list[int], threshold_bytes: int) -> list[FusionGroup]:
    """The common case, one key and every item below the threshold, at C speed.

    The same greedy packing as the general loop: a group takes items in order while
    its total stays within the threshold; it finds each cut by bisecting running sums.
    """
    cumulative = list(accumulate(sizes))
    n = len(sizes)
    groups = []
    start, base = 0, 0
    while start < n:
        end = bisect_right(cumulative, base + threshold_bytes, lo=start)
        total = cumulative[end - 1]
        groups.append(FusionGroup(key, list(range(start, end)), total - base))
        start, base = end, total
    return groups
