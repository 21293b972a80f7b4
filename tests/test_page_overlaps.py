"""Plotly's tool bar (the modebar) covers no title, label, legend or tick of any chart.

The tool bar appears over a chart's top right when the mouse is on it; a centred title,
a colour bar's title at its top or a legend that wraps ran under it (the fusion chart's
caption, the wait heatmap's "waited (ms)", the autotune charts' titles). A real Chromium
opens the dashboard (a demo run with autotune, a slow 2-rank run, the GPU traces) and
``hvdprof report``'s offline file, at 1,000 and 1,400 px wide, and compares the bounding
box of every chart's tool bar with those of the chart's texts and legend. Screenshots with
the tool bars shown are saved under each test's temporary directory.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dashboard_support import (
    dashboard_server,
    launched_chromium,
    open_page,
    shared_real_run,
    shared_slow_run,
)

pytest.importorskip("fastapi")
pytest.importorskip("playwright.sync_api")

KINETO_HTA = Path(__file__).resolve().parent / "data" / "kineto-hta"
WIDTHS = (1000, 1400)

#: [chart id, the text covered, its element's class] for every chart on the page
COVERED = """() => {
  const hit = (a, b) => a.left < b.right - 0.5 && b.left < a.right - 0.5
    && a.top < b.bottom - 0.5 && b.top < a.bottom - 0.5;
  const out = [];
  let charts = 0;
  for (const plot of document.querySelectorAll('.js-plotly-plot')) {
    if (!plot.offsetParent) continue;  // in a hidden card
    const bar = plot.querySelector('.modebar');
    const m = bar && bar.getBoundingClientRect();
    if (!m || !m.width) continue;
    charts += 1;
    for (const t of plot.querySelectorAll('svg text')) {
      if (!t.textContent.trim() || t.closest('.hoverlayer')) continue;
      const r = t.getBoundingClientRect();
      if (r.width && hit(m, r)) out.push([plot.id, t.textContent.trim(), t.parentNode.getAttribute('class')]);
    }
    for (const legend of plot.querySelectorAll('.legend')) {
      const r = legend.getBoundingClientRect();
      if (r.width && hit(m, r)) out.push([plot.id, 'legend', 'legend']);
    }
  }
  return { charts, out };
}"""
#: shows every chart's tool bar at once (for the screenshots; Plotly shows one on hover;
#: the page's content security policy refuses a style tag, not a style set by script)
SHOW_TOOLBARS = """() => document.querySelectorAll('.js-plotly-plot .modebar-group')
  .forEach((m) => m.style.setProperty('opacity', '1', 'important'))"""


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    with launched_chromium() as b:
        yield b


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("page-overlaps")
    shutil.copytree(shared_real_run(tmp_path_factory), root / "demo")
    shutil.copytree(shared_slow_run(tmp_path_factory), root / "slow")
    shutil.copytree(KINETO_HTA, root / "gpu")
    return root


def covered(page: Any, tmp_path: Path, name: str) -> list[Any]:
    page.wait_for_timeout(500)  # Plotly's last charts
    found = page.evaluate(COVERED)
    assert found["charts"] >= 4, found  # the page drew its charts, each with its tool bar
    page.evaluate(SHOW_TOOLBARS)
    page.screenshot(path=str(tmp_path / f"{name}.png"), full_page=True)
    return found["out"]


@pytest.mark.parametrize("run", ["demo", "slow", "gpu"])
def test_the_dashboards_tool_bars_cover_nothing(
    browser: Any, served: Path, tmp_path: Path, run: str
) -> None:
    with dashboard_server(served) as base:
        for width in WIDTHS:
            page, errors = open_page(browser, base + f"?run={run}", width=width)
            if run == "gpu":
                page.wait_for_selector("#gpu-card:not([hidden]) #gpu-shares-table tbody tr")
            assert covered(page, tmp_path, f"{run}-{width}") == [], (run, width)
            assert errors == []
            page.close()


def test_the_reports_tool_bars_cover_nothing(browser: Any, served: Path, tmp_path: Path) -> None:
    from hvdprof.cli import main

    for run in ("demo", "slow"):
        out = tmp_path / f"{run}.html"
        assert main(["report", str(served), "--run", run, "-o", str(out)]) == 0
        for width in WIDTHS:
            page, errors = open_page(browser, out.as_uri(), width=width, offline=True)
            assert covered(page, tmp_path, f"report-{run}-{width}") == [], (run, width)
            assert errors == []
            page.context.close()
