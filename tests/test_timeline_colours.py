"""The binned timeline's colours are the breakdown's numbers, counted in pixels.

A real Chromium draws the whole-run timeline of two real runs (the demo job, and a 2-rank
job whose rank 1 sleeps 15 ms a step) in the dashboard and in ``hvdprof report``'s
offline file, at 1,000, 1,400 and 3,800 px wide. From a screenshot of each rank's row the
test counts the pixels of each phase's colour: each colour's share of the row's coloured
pixels is the breakdown's share of that phase (within 3 points), and the blank share of
the row is its compute (idle) share. Plotly widens a bar narrower than 2 px to whole
pixels, so a bin's phases drawn as bars of their own gave a 1% copy phase half a row's
pixels (56% at 1,400 px on a demo run); web/app.js now draws binned rows pixel by pixel.
A zoomed window is checked against its own bins' time per phase.
"""

from __future__ import annotations

import io
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
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
Image = pytest.importorskip("PIL.Image")

#: web/app.js's PHASE_COLORS for the phases of a rank's row
COLOURS = {
    "collective": "#3a6ea5",
    "memcpy_in": "#2a9d8f",
    "memcpy_out": "#8ecae6",
    "queue": "#a3b1c6",
    "other": "#b8b8b8",
    "negotiate": "#f4a261",
}
#: Largest gap (share points) between a colour's share of the pixels and the time's.
TOLERANCE = 0.03
WIDTHS = (1000, 1400, 3800)


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    with launched_chromium() as b:
        yield b


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo run and a slow 2-rank run (both shared with the other page tests)."""
    root = tmp_path_factory.mktemp("timeline-colours")
    shutil.copytree(shared_real_run(tmp_path_factory), root / "demo")
    shutil.copytree(shared_slow_run(tmp_path_factory), root / "slow")
    return root


def rgb(colour: str) -> np.ndarray:
    return np.array([int(colour[i : i + 2], 16) for i in (1, 3, 5)], dtype=np.int16)


def row_bands(page: Any) -> dict[str, tuple[float, float, float, float]]:
    """Each lane's bar band on the page (left, top, right, bottom), from Plotly's axes."""
    return page.evaluate(
        """() => {
          const el = document.getElementById('timeline');
          const xa = el._fullLayout.xaxis, ya = el._fullLayout.yaxis;
          const box = el.getBoundingClientRect();
          const half = 0.5 * (1 - el._fullLayout.bargap) * Math.abs(ya._m);
          const out = {};
          for (const lane of window.HVD_STATE.lanes) {
            const y = box.top + window.scrollY + ya._offset + ya.l2p(ya.d2l(lane));
            out[lane] = [box.left + xa._offset, y - half, box.left + xa._offset + xa._length, y + half];
          }
          return out;
        }"""
    )


def pixel_shares(page: Any) -> dict[str, dict[str, float]]:
    """Per lane: each phase colour's share of its coloured pixels, and ``blank``: the
    share of the row's pixels in no phase colour (compute)."""
    png = page.screenshot(full_page=True)
    image = np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).astype(np.int16)
    out = {}
    for lane, (left, top, right, bottom) in row_bands(page).items():
        # whole pixels inside the band (its edge pixels may be partly covered)
        band = image[
            int(np.ceil(top)) + 1 : int(np.floor(bottom)) - 1, int(np.ceil(left)) : int(right)
        ]
        band = band.reshape(-1, 3)
        counts = {p: int((band == rgb(c)).all(axis=1).sum()) for p, c in COLOURS.items()}
        coloured = sum(counts.values())
        assert len(band) and coloured, (lane, "no coloured pixels in the row")
        shares = {p: n / coloured for p, n in counts.items()}
        shares["blank"] = 1.0 - coloured / len(band)
        out[lane] = shares
    return out


def breakdown_shares(run_dir: Path) -> dict[str, dict[str, float]]:
    """Per lane: each phase's share of the rank's collective time (what the breakdown
    beside the chart says), and ``blank``: the rest of the run's span (its compute, and
    before its first and after its last slice)."""
    from hvdprof.analysis import load_run, time_breakdown

    run = load_run(str(run_dir), cache=False)
    out = {}
    for r in time_breakdown(run).ranks:
        busy = sum(ms for c, ms in r.total_ms.items() if c != "idle")
        lane = f"rank {r.rank}" + (f" ({run.hosts[r.rank]})" if r.rank in run.hosts else "")
        out[lane] = {p: r.total_ms.get(p, 0.0) / busy for p in COLOURS}
        out[lane]["blank"] = 1.0 - busy * 1000.0 / (run.t1_us - run.t0_us)
    return out


def gaps(drawn: dict[str, dict[str, float]], truth: dict[str, dict[str, float]]) -> list[Any]:
    """(lane, phase, drawn share, time share) where they differ by more than TOLERANCE."""
    assert set(drawn) == set(truth)
    return [
        (lane, p, round(drawn[lane][p], 3), round(share, 3))
        for lane, shares in truth.items()
        for p, share in shares.items()
        if abs(drawn[lane][p] - share) > TOLERANCE
    ]


def show_whole_run(page: Any, tmp_path: Path, name: str) -> dict[str, dict[str, float]]:
    assert page.get_attribute("#timeline", "data-binned") == "1", "the whole run is binned"
    page.wait_for_timeout(300)
    page.screenshot(path=str(tmp_path / f"{name}.png"), full_page=True)
    return pixel_shares(page)


@pytest.mark.parametrize("name", ["demo", "slow"])
def test_dashboard_colours_are_the_breakdown(
    browser: Any, runs: Path, tmp_path: Path, name: str
) -> None:
    truth = breakdown_shares(runs / name)
    with dashboard_server(runs) as base:
        for width in WIDTHS:
            page, errors = open_page(browser, base + f"?run={name}", width=width)
            drawn = show_whole_run(page, tmp_path, f"{name}-{width}")
            assert gaps(drawn, truth) == [], (width, drawn, truth)
            if width == WIDTHS[-1]:  # a narrower window draws the rows again, still true
                page.set_viewport_size({"width": WIDTHS[0], "height": 950})
                page.wait_for_function(
                    "(() => { const g = window.HVD_STATE.timelinePixels;"
                    " const xa = document.getElementById('timeline')._fullLayout.xaxis;"
                    f" return g && xa._length < {WIDTHS[0]}"
                    " && Math.abs(g.length - xa._length) < 0.01; })()"
                )
                drawn = show_whole_run(page, tmp_path, f"{name}-resized")
                assert gaps(drawn, truth) == [], ("resized", drawn, truth)
            assert errors == []
            page.close()


def test_report_colours_are_the_breakdown_at_every_width_and_zoom(
    browser: Any, runs: Path, tmp_path: Path
) -> None:
    from hvdprof.cli import main

    for name in ("demo", "slow"):
        truth = breakdown_shares(runs / name)
        out = tmp_path / f"{name}.html"
        assert main(["report", str(runs), "--run", name, "-o", str(out)]) == 0
        for width in WIDTHS:
            page, errors = open_page(browser, out.as_uri(), width=width, offline=True)
            drawn = show_whole_run(page, tmp_path, f"report-{name}-{width}")
            assert gaps(drawn, truth) == [], (name, width, drawn, truth)
            # zoomed to the middle third: the report magnifies its bins, and the colours
            # are still the time per phase of the bins in that window
            window = zoom_to_middle(page)
            drawn = pixel_shares(page)
            page.screenshot(path=str(tmp_path / f"report-{name}-{width}-zoomed.png"))
            assert gaps(drawn, bin_shares(page, window)) == [], (name, width, "zoomed")
            assert errors == []
            page.context.close()


def zoom_to_middle(page: Any) -> list[float]:
    """Zoom the time axis to the middle third; the window on the run's clock (µs)."""
    page.evaluate(
        """() => { const el = document.getElementById('timeline');
          const r = el._fullLayout.xaxis.range, d = (r[1] - r[0]) / 3;
          Plotly.relayout(el, { 'xaxis.range[0]': r[0] + d, 'xaxis.range[1]': r[1] - d }); }"""
    )
    page.wait_for_function(
        """(() => { const g = window.HVD_STATE.timelinePixels, v = window.HVD_STATE.view;
          return g && v && g.range[0] === v[0] && g.range[1] === v[1]; })()"""
    )
    page.wait_for_timeout(300)
    return page.evaluate("window.HVD_STATE.view")


def bin_shares(page: Any, window: list[float]) -> dict[str, dict[str, float]]:
    """Per lane, from the bins the page holds: each phase's share of the busy time in
    ``window`` and the blank share, with each bin's phases laid out from its start as the
    page lays them out."""
    return page.evaluate(
        """([t0, t1]) => {
          const data = window.HVD_STATE.lastTimeline, b = data.buckets;
          const labels = new Map(data.rows.map((r) => [r.row, r.label]));
          const per = {};
          b.row.forEach((row, i) => {
            const lane = labels.get(row);
            per[lane] = per[lane] || {};
            let at = b.start_us[i];
            for (const [p, us] of Object.entries(b.phase_us)) {
              const a = Math.max(at, t0), e = Math.min(at + us[i], t1);
              if (e > a) per[lane][p] = (per[lane][p] || 0) + (e - a);
              at += us[i];
            }
          });
          const out = {};
          for (const lane of window.HVD_STATE.lanes) {
            const t = per[lane] || {};
            const busy = Object.values(t).reduce((x, y) => x + y, 0);
            out[lane] = {};
            for (const p of ["collective", "memcpy_in", "memcpy_out", "queue", "other", "negotiate"])
              out[lane][p] = busy ? (t[p] || 0) / busy : 0;
            out[lane].blank = 1 - busy / (t1 - t0);
          }
          return out;
        }""",
        window,
    )
