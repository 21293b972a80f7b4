"""The page at 64 ranks (issue 41): charts that read, legends that stay short.

A synthetic 64-rank run (rank 37 late by 4 ms every step) served by ``hvdprof dashboard``
and drawn in Debian's Chromium (Playwright): no legend, tick label or title of a chart
sits on another, no legend lists more than 10 entries, the straggler is named in the
first view (the verdict, and its heatmap row labelled and boxed), the timeline opens on
the outliers' rows and takes a rank filter ("0-7,12") that asks ``/api/timeline`` for
those rows, and an 8-rank run whose ranks fused alike shows one legend entry for them.
Screenshots go to /tmp/many_ranks_*.png for a person to look at.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from dashboard_support import dashboard_server, launched_chromium
from dashboard_support import open_page as support_open_page

pytest.importorskip("fastapi")
playwright_api = pytest.importorskip("playwright.sync_api")

from synthetic_runs import SyntheticSpec, write_synthetic_run  # noqa: E402

from hvdprof.analysis import find_stragglers, fusion_report, load_run  # noqa: E402

LATE_RANK = 37
#: pixels two boxes may share before they count as overlapping (anti-aliased edges)
TOLERANCE_PX = 2.0
LEGEND_MAX = 10
SCREENSHOTS = Path("/tmp")

#: every label, legend and title Plotly drew in each chart on the page, with its box, and
#: the pairs of them that overlap (boxes of hidden charts are empty and left out)
OVERLAPS_JS = """(tol) => {
  const kinds = {
    legend: ".legend", tick: ".xtick text, .ytick text, .x2tick text, .y2tick text",
    title: ".gtitle", "axis title": ".g-xtitle text, .g-ytitle text, .g-x2title text, .g-y2title text",
  };
  const out = [];
  for (const plot of document.querySelectorAll(".js-plotly-plot")) {
    const boxes = [];
    for (const [kind, sel] of Object.entries(kinds)) {
      for (const el of plot.querySelectorAll(sel)) {
        const r = el.getBoundingClientRect();
        const words = (el.textContent || "").trim();
        if (r.width < 1 || r.height < 1 || (kind !== "legend" && !words)) continue;
        boxes.push({ kind: kind, words: words.slice(0, 40), r: r });
      }
    }
    for (let i = 0; i < boxes.length; i++) {
      for (let j = i + 1; j < boxes.length; j++) {
        const a = boxes[i].r, b = boxes[j].r;
        const w = Math.min(a.right, b.right) - Math.max(a.left, b.left);
        const h = Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top);
        if (w > tol && h > tol) {
          out.push(plot.id + ": " + boxes[i].kind + " '" + boxes[i].words + "' / " + boxes[j].kind + " '" + boxes[j].words + "'");
        }
      }
    }
  }
  return out;
}"""
#: legend entries per chart
LEGENDS_JS = """() => Object.fromEntries([...document.querySelectorAll(".js-plotly-plot")]
  .map((p) => [p.id, p.querySelectorAll(".legend .traces").length]))"""


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("many-ranks")
    spec = SyntheticSpec(ranks=64, steps=12, late_rank=LATE_RANK, late_us=4000.0)
    write_synthetic_run(str(root / "many"), spec)
    write_synthetic_run(str(root / "eight"), SyntheticSpec(ranks=8, steps=6))
    return root


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    with launched_chromium() as b:
        yield b


@pytest.fixture(scope="module")
def base(served: Path) -> Iterator[str]:
    with dashboard_server(served) as url:
        yield url


def open_page(browser: object, url: str):
    return support_open_page(browser, url, settle_ms=500)  # let Plotly finish its last draw


def lanes(page) -> list[str]:
    return page.evaluate("window.HVD_STATE.lanes")


def check_readable(page) -> None:
    assert page.evaluate(OVERLAPS_JS, TOLERANCE_PX) == []
    legends = page.evaluate(LEGENDS_JS)
    assert legends and all(n <= LEGEND_MAX for n in legends.values()), legends


def test_64_ranks_read(browser: object, base: str, served: Path) -> None:
    run = load_run(str(served / "many"), cache=False)
    assert len(run.ranks) == 64 and find_stragglers(run).straggler == LATE_RANK
    page, errors = open_page(browser, base + "?run=many")
    page.screenshot(path=str(SCREENSHOTS / "many_ranks_64.png"), full_page=True)
    page.screenshot(path=str(SCREENSHOTS / "many_ranks_64_top.png"), full_page=False)
    check_readable(page)

    # the straggler, named in the first view: the verdicts, and its heatmap row labelled
    # and boxed (the others' rows are dark: they waited for it)
    named = f"rank {LATE_RANK} is the straggler"
    assert named in page.text_content("#verdicts")
    assert named in page.text_content("#straggler-verdict")
    rows = page.evaluate("document.getElementById('stragglers').data[0].y")
    assert len(rows) == 64
    label = f"rank {LATE_RANK} \u25c0 straggler"
    assert label in page.locator("#stragglers .ytick text").all_text_contents()
    box = page.evaluate(
        "document.getElementById('stragglers').layout.shapes.filter((s) => s.type === 'rect')"
    )
    assert [(s["y0"], s["y1"]) for s in box] == [(LATE_RANK - 0.5, LATE_RANK + 0.5)]
    assert rows[LATE_RANK] == label

    # charts per rank become the spread across ranks, the outlier named under them
    breakdown = page.locator("#breakdown .legendtext").all_text_contents()
    assert breakdown == ["median rank", "p90", "the most"]
    assert f"rank {LATE_RANK}" in page.text_content("#breakdown-note")
    # every rank fused alike: one entry for all of them, with its fill
    fill = 100 * fusion_report(run).ranks[0].fill_mean
    legend = page.locator("#fusion .legendtext").all_text_contents()
    assert legend == [f"ranks 0-63 (fill {fill:.1f}%)"]
    assert page.locator("#fusion-fill .legendtext").all_text_contents() == ["ranks 0-63"]

    # the timeline opens on the outliers' rows (and one rank to compare them with)
    shown = lanes(page)
    assert f"rank {LATE_RANK} (synth)" in shown and len(shown) < 8, shown
    assert str(LATE_RANK) in page.input_value("#timeline-ranks")
    # a rank filter: these rows, asked of /api/timeline
    with page.expect_request(lambda r: "api/timeline" in r.url and "ranks=0%2C1" in r.url):
        page.fill("#timeline-ranks", "0-7,12")
        page.press("#timeline-ranks", "Enter")
    page.wait_for_function("window.HVD_STATE.lanes.length === 9")
    assert lanes(page) == [f"rank {r} (synth)" for r in [*range(8), 12]]
    page.click("#timeline-all")
    page.wait_for_function("window.HVD_STATE.lanes.length === 64")
    page.wait_for_timeout(500)
    page.screenshot(path=str(SCREENSHOTS / "many_ranks_64_all_rows.png"), full_page=True)
    check_readable(page)
    # the heatmap takes the same kind of filter, and "the outliers"
    page.fill("#stragglers-ranks", "30-40")
    page.press("#stragglers-ranks", "Enter")
    page.wait_for_function("document.getElementById('stragglers').data[0].y.length === 11")
    page.click("#stragglers-outliers")
    page.wait_for_function("document.getElementById('stragglers').data[0].y.length < 11")
    assert label in page.evaluate("document.getElementById('stragglers').data[0].y")
    # a list that names no rank of the run is refused, not read as "all"
    page.fill("#stragglers-ranks", "200-300")
    page.press("#stragglers-ranks", "Enter")
    assert "bad" in (page.get_attribute("#stragglers-ranks", "class") or "")
    check_readable(page)
    assert errors == []


def test_8_ranks_alike_one_legend_entry(browser: object, base: str, served: Path) -> None:
    run = load_run(str(served / "eight"), cache=False)
    fills = {round(100 * r.fill_mean, 1) for r in fusion_report(run).ranks}
    assert len(fills) == 1, "the 8 synthetic ranks fuse alike"
    page, errors = open_page(browser, base + "?run=eight")
    page.screenshot(path=str(SCREENSHOTS / "many_ranks_8.png"), full_page=True)
    legend = page.locator("#fusion .legendtext").all_text_contents()
    assert legend == [f"ranks 0-7 (fill {fills.pop():.1f}%)"]
    # the small-run page: bars per rank in the breakdown, every rank's row on the timeline
    assert len(page.evaluate("document.getElementById('breakdown').data[0].x")) == 8
    assert len(lanes(page)) == 8
    assert page.is_hidden("#timeline-ranks-box")
    check_readable(page)
    assert errors == []
