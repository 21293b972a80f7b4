"""``hvdprof report DIR -o report.html``: the dashboard's page as one offline HTML file.

The report is the same page (``web/``) with Plotly, the stylesheet and the script inlined,
plus the API responses it would have fetched, embedded as JSON under the keys the page's
``api()`` looks up. So the charts are the dashboard's charts, drawn by the same code from
the same analysis results, and the file opens with no server and no network. The timeline
is embedded for the whole run (aggregated as the server would) and per expanded rank, in
tensor and in phase lanes; zooming in the report magnifies that data instead of asking a
server for finer events.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hvdprof.analysis.output_file import OutputRefused, refusal, write_atomically
from hvdprof.analysis.registry import qualified
from hvdprof.dashboard.catalog import RunCatalog, RunLoadError, RunNotFoundError
from hvdprof.dashboard.paths import OutsideRootError, web_directory
from hvdprof.dashboard.routes.analyses import analysis_function, analysis_routes, listed_analyses
from hvdprof.dashboard.routes.page import plotly_js_path
from hvdprof.dashboard.service import run_info, section
from hvdprof.errors import HvdprofError

#: Timeline items embedded per view: enough detail to read, small enough to open fast.
REPORT_TIMELINE_ITEMS = 6000

_PLOTLY_TAG = '<script src="static/plotly.min.js"></script>'
_STYLE_TAG = '<link rel="stylesheet" href="static/style.css">'
_APP_TAG = '<script src="static/app.js"></script>'


def _script(text: str) -> str:
    # Inside <script>, only "</" can end the element early; JSON and JS survive "<\/".
    return "<script>" + text.replace("</", "<\\/") + "</script>"


def embedded_responses(catalog: RunCatalog, run_id: str) -> dict[str, Any]:
    """The API responses the page needs for ``run_id``, keyed as the page's ``api()`` asks."""
    from hvdprof.analysis import timeline_window
    from hvdprof.analysis.gpu_lanes import stream_extent

    entry = catalog.entry(run_id)
    info = run_info(catalog, run_id)
    out: dict[str, Any] = {
        "api/runs": {"root": str(catalog.root), "runs": [{"id": entry.id, "kind": entry.kind}],
                     "notices": []},
        f"api/run?run={run_id}": info.model_dump(),
        "api/analysis": [a.model_dump() for a in listed_analyses()],
    }  # fmt: skip
    for name, (function, _summary) in analysis_routes().items():
        compute = analysis_function(function)
        if compute is None:
            body = {"run": run_id, "version": 0, "data": None,
                    "notices": [f"this installation's analysis library has no {qualified(function)}()"]}  # fmt: skip
        else:
            body = section(catalog, run_id, name, compute).model_dump()
        out[f"api/analysis/{name}?run={run_id}"] = body
    views: list[tuple[int | None, str]] = [(None, "tensor")]
    views += [(rank, kind) for rank in info.ranks for kind in ("tensor", "phase")]
    gpu = (out.get(f"api/analysis/gpu?run={run_id}") or {}).get("data") or {}
    views += [(int(r["rank"]), "stream") for r in gpu.get("ranks") or []]

    def whole(r: Any, rank: int | None, lanes: str) -> Any:
        t0, t1 = stream_extent(r, rank) if lanes == "stream" else (r.t0_us, r.t1_us)  # type: ignore[arg-type]
        return timeline_window(
            r, t0, t1, expand_rank=rank, lanes=lanes, max_items=REPORT_TIMELINE_ITEMS
        )

    for expand, lanes in views:
        window = section(
            catalog, run_id, "timeline",
            lambda r, e=expand, k=lanes: whole(r, e, k),
            None, None, None, expand, lanes, REPORT_TIMELINE_ITEMS,
        ).model_dump()  # fmt: skip
        data = window.get("data") or {}
        window.update(t0_us=data.get("t0_us", info.t0_us), t1_us=data.get("t1_us", info.t1_us))
        # the page's embeddedKey(): query keys sorted, lanes sent only with expand_rank
        key = "api/timeline?" + (
            f"expand_rank={expand}&lanes={lanes}&" if expand is not None else ""
        )
        out[key + f"run={run_id}"] = window
    return out


def binned_views(responses: dict[str, Any]) -> list[str]:
    """One line per embedded timeline view that holds time bins instead of single slices."""
    out = []
    for key, body in responses.items():
        data = body.get("data") if key.startswith("api/timeline?") else None
        if not data or not data.get("aggregated"):
            continue
        width = (data.get("buckets") or {}).get("dur_us") or [0.0]
        lanes = data.get("lanes", "rank")
        view = (
            "one row per rank"
            if data.get("expand_rank") is None
            else (f"rank {data['expand_rank']}'s {lanes} lanes")
        )
        out.append(
            f"{view}: {data.get('total', 0)} slices binned into {width[0] / 1000.0:.3g} ms bins"
        )
    return out


def render_report(responses: dict[str, Any], web_dir: Path | None = None) -> str:
    """The page with every asset inlined and ``responses`` embedded."""
    web = web_dir or web_directory()
    html = (web / "index.html").read_text(encoding="utf-8")
    data = json.dumps(responses, separators=(",", ":"), allow_nan=False, default=str)
    parts = {
        _STYLE_TAG: "<style>" + (web / "style.css").read_text(encoding="utf-8") + "</style>",
        _PLOTLY_TAG: _script(plotly_js_path().read_text(encoding="utf-8")),
        _APP_TAG: _script("window.hvdprofEmbedded = " + data + ";")
        + _script((web / "app.js").read_text(encoding="utf-8")),
    }
    for tag, inline in parts.items():
        if tag not in html:
            raise HvdprofError(f"report: web/index.html no longer contains {tag}")
        html = html.replace(tag, inline)
    return html


@dataclass(frozen=True)
class ReportWritten:
    """Where a report went, and which of its timeline views are binned (zooming in the
    file magnifies those bins: it holds no finer events)."""

    path: Path
    binned: list[str]


def write_report(
    directory: str | os.PathLike[str], output: str | os.PathLike[str], run_id: str | None = None
) -> ReportWritten:
    """Write the report of one run under ``directory`` (the first found by default)."""
    root = Path(directory)
    if not root.is_dir():
        raise HvdprofError(f"report: {root} is not a directory")
    catalog = RunCatalog(root)
    if run_id is None:
        entries = catalog.entries()
        if not entries:
            raise HvdprofError(f"report: no timeline found under {root}")
        run_id = entries[0].id
    try:
        catalog.entry(run_id)  # the escaping-link check, for the default run too
        catalog.loaded(run_id)
    except (OutsideRootError, RunNotFoundError, RunLoadError) as exc:
        raise HvdprofError(f"report: {exc}") from None
    out = Path(output)
    problem = refusal(os.fspath(out), "report -o")  # before the work, said as the write would
    if problem is not None:
        raise OutputRefused(problem)
    responses = embedded_responses(catalog, run_id)
    html = render_report(responses)
    write_atomically(os.fspath(out), html.encode("utf-8"), "report -o")
    return ReportWritten(out, binned_views(responses))
