"""NVTX ranges around runtime phases, so Nsight Systems shows what the cycle thread does.

The cycle thread calls ``push(name)``/``pop()`` around its phases (names from
:mod:`hvdprof.common.activities`) in the ``hvdprof`` domain. Without the ``nvtx`` package,
with ``HVDPROF_DISABLE_NVTX=1``, or when no NVTX tool (e.g. ``nsys``) is attached, ``push``
and ``pop`` are bound to do-nothing functions: the cost is one Python call. Event
attributes are built once per phase name, since building them is the expensive part of an
NVTX push from Python.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from hvdprof.common.activities import NVTX_DOMAIN


def _noop_push(name: str) -> None:
    return None


def _noop_pop() -> None:
    return None


class PhaseRanges:
    """``push(name)`` / ``pop()`` of NVTX ranges, or no-ops (see :attr:`backend`).

    ``domain`` replaces the NVTX domain object (anything with ``get_event_attributes``,
    ``push_range`` and ``pop_range``), which lets tests exercise the active path without a
    profiler attached.
    """

    def __init__(
        self, disabled: bool = False, *, domain_name: str = NVTX_DOMAIN, domain: Any = None
    ) -> None:
        self.push = _noop_push
        self.pop = _noop_pop
        self.active = False
        if disabled:
            self.backend = "off (HVDPROF_DISABLE_NVTX)"
            return
        if domain is None:
            try:
                import nvtx
            except ImportError:
                self.backend = "off (the nvtx package is not installed)"
                return
            if not nvtx.enabled():
                self.backend = "nvtx, inactive (no NVTX tool such as nsys is attached)"
                return
            domain = nvtx.get_domain(domain_name)
        self.backend = f"nvtx (domain {domain_name!r})"
        self.active = True
        attributes: dict[str, Any] = {}
        push_range = domain.push_range
        make = domain.get_event_attributes

        def push(name: str) -> None:
            attrs = attributes.get(name)
            if attrs is None:
                attrs = attributes[name] = make(message=name)
            push_range(attrs)

        self.push = push
        self.pop = domain.pop_range

    @classmethod
    def from_config(cls, config: Any) -> PhaseRanges:
        """Ranges as ``config.disable_nvtx`` asks."""
        return cls(disabled=bool(getattr(config, "disable_nvtx", False)))

    @contextmanager
    def range(self, name: str) -> Iterator[None]:
        """``with ranges.range("NEGOTIATE"): ...`` for code that is not on the hot path."""
        self.push(name)
        try:
            yield
        finally:
            self.pop()
