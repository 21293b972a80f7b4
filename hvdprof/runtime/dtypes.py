"""The dtypes the runtime moves: one table, by the name that travels in signatures.

Plain data (no torch import), so the pure planners can size tensors without torch.
"""

from __future__ import annotations

#: ``str(torch dtype)`` -> bytes per element, for every dtype every backend supports
ITEMSIZE: dict[str, int] = {
    "torch.float16": 2,
    "torch.bfloat16": 2,
    "torch.float32": 4,
    "torch.float64": 8,
    "torch.int8": 1,
    "torch.uint8": 1,
    "torch.int32": 4,
    "torch.int64": 8,
}


def torch_attr(name: str) -> str:
    """'torch.float32' -> 'float32' (the attribute of the torch module)."""
    return name.removeprefix("torch.")
