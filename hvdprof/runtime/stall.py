"""The stall inspector: names the ranks that stopped submitting, and which tensors.

A stall is the most common way a Horovod job hangs silently (a rank takes a different
code path and never submits a tensor). Rank 0 sees every rank's readiness, on the
coordinator path and, through the shared bit vectors, on the cached path.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

log = logging.getLogger("hvdprof")


class StallInspector:
    def __init__(self, size: int, check_s: float, shutdown_s: float) -> None:
        self.size = size
        self.check_s = check_s
        self.shutdown_s = shutdown_s
        self._last_warning = 0.0
        self.warnings: list[str] = []

    def inspect(
        self, now: float, waiting: Mapping[str, tuple[frozenset[int], float]]
    ) -> str | None:
        """``waiting``: name -> (ranks ready, since when). Returns an abort message or None."""
        if not waiting or self.check_s <= 0:
            return None
        stalled = {n: v for n, v in waiting.items() if now - v[1] >= self.check_s}
        if not stalled:
            return None
        oldest = now - min(since for _, since in stalled.values())
        message = self._describe(stalled, now)
        if self.shutdown_s > 0 and oldest >= self.shutdown_s:
            return (
                f"hvdprof stall: aborting after {oldest:.1f} s "
                f"(HVDPROF_STALL_SHUTDOWN_TIME_SECONDS={self.shutdown_s:g}). {message}"
            )
        if now - self._last_warning >= self.check_s:
            self._last_warning = now
            self.warnings.append(message)
            log.warning("%s", message)
        return None

    def _describe(self, stalled: Mapping[str, tuple[frozenset[int], float]], now: float) -> str:
        by_missing: dict[tuple[int, ...], list[tuple[str, float]]] = {}
        for name, (ready, since) in stalled.items():
            missing = tuple(r for r in range(self.size) if r not in ready)
            by_missing.setdefault(missing, []).append((name, now - since))
        parts = []
        for missing, items in sorted(by_missing.items()):
            items.sort(key=lambda x: -x[1])
            names = ", ".join(repr(n) for n, _ in items[:10])
            more = f" and {len(items) - 10} more" if len(items) > 10 else ""
            parts.append(
                f"rank(s) {list(missing)} have not submitted {names}{more} "
                f"(waiting up to {items[0][1]:.1f} s)"
            )
        return (
            "hvdprof stall: some ranks submitted tensors that others have not: "
            + "; ".join(parts)
            + ". Ranks must submit the same collectives (check for rank-dependent code paths)."
        )
