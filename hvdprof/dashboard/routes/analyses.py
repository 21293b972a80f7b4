"""``/api/analysis/*``: one endpoint per question, each calling one analysis function.

The functions are looked up in :mod:`hvdprof.analysis` by name, so the table below is the
whole mapping from URL to library; nothing is computed here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends

from hvdprof.dashboard.catalog import RunCatalog
from hvdprof.dashboard.models import Section
from hvdprof.dashboard.routes.deps import get_catalog
from hvdprof.dashboard.routes.runs import RunId
from hvdprof.dashboard.service import section

router = APIRouter(prefix="/api/analysis", tags=["analyses"])

#: URL name -> (analysis function in hvdprof.analysis, what it answers).
ANALYSES: dict[str, tuple[str, str]] = {
    "report": ("analyze", "Every analysis at once, with the verdict sentences"),
    "breakdown": ("time_breakdown", "Time per phase per rank"),
    "stragglers": (
        "find_stragglers",
        "Who made the others wait: negotiation wait per rank and step",
    ),
    "fusion": ("fusion_report", "Tensors per fused op and buffer fill"),
    "bandwidth": ("bandwidth_report", "Bus bandwidth by message size"),
    "autotune": ("autotune_report", "Autotune samples: parameters, score, time window"),
    "surrogate": ("autotune_surface", "The autotuner's view over fusion threshold x cycle time"),
    "stalls": ("stall_report", "Stalls: which rank kept the job waiting, how long, and where"),
    "process_sets": (
        "process_set_report",
        "Process sets: each one's members, and its straggler judged among them",
    ),
    "gpu": (
        "device.gpu_report",
        "GPU per rank (torch.profiler traces): HTA's idle, compute, non-compute and overlap "
        "shares, the rank that stands out, kernel time per name, memcpy bandwidth",
    ),
}


def analysis_function(function: str) -> Callable[[Any], Any] | None:
    """``hvdprof.analysis.<function>`` (or from its ``surrogate`` module; ``module.name``:
    from that module of the library), None if absent."""
    import importlib

    import hvdprof.analysis as library

    if "." in function:
        module, name = function.rsplit(".", 1)
        try:
            return getattr(importlib.import_module(f"hvdprof.analysis.{module}"), name, None)
        except ImportError:
            return None
    found = getattr(library, function, None)
    if found is None:
        from hvdprof.analysis import surrogate

        found = getattr(surrogate, function, None)
    return found


def _endpoint(name: str, function: str) -> Callable[..., Section]:
    def analysis(run: RunId, catalog: Annotated[RunCatalog, Depends(get_catalog)]) -> Section:
        catalog.entry(run)  # 403 / 404 before anything else
        compute = analysis_function(function)
        if compute is None:
            return Section(
                run=run, version=0, data=None,
                notices=[f"this installation's analysis library has no {function}()"],
            )  # fmt: skip
        return section(catalog, run, name, compute)

    analysis.__name__ = f"analysis_{name}"
    return analysis


for _name, (_function, _summary) in ANALYSES.items():
    router.add_api_route(
        f"/{_name}",
        _endpoint(_name, _function),
        methods=["GET"],
        response_model=Section,
        summary=_summary,
        description=f"`hvdprof.analysis.{_function}(run).to_dict()` in `data`.",
    )
