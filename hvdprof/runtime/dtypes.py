"""The dtypes the runtime moves: one table, by the name that travels in signatures.

Plain data (no torch import), so the pure planners can size tensors without torch.
"""

from __future__ import annotations

#: ``str(torch dtype)`` -> bytes per element, for every dtype every backend supports.
#: Horovod's torch front end takes uint8, int8, int16, int32, int64, float16, float32 and
#: float64 in allgather, broadcast and alltoall, and int32, int64 and the three floats in
#: the reductions (``mpi_ops_v2.cc``); this table is a superset (every op takes every
#: dtype here, plus bfloat16). ``bool`` is refused, as Horovod's torch front end does.
ITEMSIZE: dict[str, int] = {
    "torch.float16": 2,
    "torch.bfloat16": 2,
    "torch.float32": 4,
    "torch.float64": 8,
    "torch.int8": 1,
    "torch.uint8": 1,
    "torch.int16": 2,
    "torch.int32": 4,
    "torch.int64": 8,
}


#: the dtypes Adasum combines (it needs dot products: floating point only)
ADASUM_DTYPES: frozenset[str] = frozenset(
    {"torch.float16", "torch.bfloat16", "torch.float32", "torch.float64"}
)


def torch_attr(name: str) -> str:
    """'torch.float32' -> 'float32' (the attribute of the torch module)."""
    return name.removeprefix("torch.")
