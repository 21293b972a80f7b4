"""A window's time bins as the page draws them, from each row's busy time per class.

Shared by the rank, tensor and phase rows (:mod:`hvdprof.analysis.window`) and the GPU
stream rows (:mod:`hvdprof.analysis.gpu_lanes`), so a bin means the same on both: its
busy time (at most its width), its dominant class (idle included), how many slices
overlap it, and the time of each class present. The page draws a bin from that time per
class, to the pixel (web/app.js ``binnedBars``), so the share of a row drawn in a colour is
that class's share of its time; the dominant class is a summary for API clients.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def bucket_table(
    busy: np.ndarray, counts: np.ndarray, width: float, t0_us: float, names: list[str]
) -> dict[str, Any]:
    """``busy``: (rows, classes, bins) time per class; ``counts``: (rows, bins) slices
    overlapping each bin; ``names``: one per class, then the idle class's. Only bins that
    some slice overlaps are listed."""
    classes = busy.shape[1]
    total = np.minimum(busy.sum(axis=1), width)  # row, bin
    idle = np.maximum(width - total, 0.0)
    dominant = np.concatenate([busy, idle[:, None, :]], axis=1).argmax(axis=1)  # row, bin
    used_r, used_b = np.nonzero(counts > 0)
    present = [c for c in range(classes) if busy[used_r, c, used_b].any()] if len(used_r) else []
    return {
        "row": used_r.tolist(),
        "start_us": (t0_us + used_b * width).tolist(),
        "dur_us": [width] * len(used_r),
        "phase": [names[c] for c in dominant[used_r, used_b].tolist()],
        "count": counts[used_r, used_b].tolist(),
        "busy_us": (np.floor(total[used_r, used_b] * 1000.0) / 1000.0).tolist(),
        "phase_us": {names[c]: busy[used_r, c, used_b].round(3).tolist() for c in present},
    }
