"""The dashboard in a real browser: Playwright driving Debian's Chromium.

A real uvicorn server (``hvdprof dashboard``, or ``hvdprof run --dashboard``) on a free
loopback port serves a real 2-rank run; the tests load the page, read what it drew, zoom,
expand a rank, click an autotune sample, and watch it update while a job writes. Each
test saves screenshots under its temporary directory. Without chromium the tests skip
with the reason, except under CI=true, where .ci/setup installs it and they must run.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from dashboard_support import (
    HOROVOD_TIMELINE,
    REPO,
    WAIT_MS,
    child_env,
    chromium_or_skip,
    dashboard_server,
    free_port,
    launched_chromium,
    open_page,
    shared_real_run,
)

pytest.importorskip("fastapi")
playwright_api = pytest.importorskip("playwright.sync_api")


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    with launched_chromium() as b:
        yield b


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("browser-served")
    shutil.copytree(shared_real_run(tmp_path_factory), root / "demo")
    (root / "horovod").mkdir()
    shutil.copy(HOROVOD_TIMELINE, root / "horovod" / "timeline.json")
    return root


def lanes(page) -> list[str]:
    return page.evaluate("window.HVD_STATE.lanes")


def wait_for_timeline(page, predicate: str) -> None:
    page.wait_for_function(predicate)
    page.wait_for_timeout(300)  # let Plotly finish drawing before a screenshot


def axis_titles(page, plot: str) -> list[str]:
    """The axis titles Plotly drew in one chart (empty when a title was ignored)."""
    return [
        t.strip()
        for t in page.locator(
            f"#{plot} .g-xtitle text, #{plot} .g-ytitle text, #{plot} .g-y2title text"
        ).all_text_contents()
        if t.strip()
    ]


def test_page_timeline_zoom_expand_stragglers_autotune(
    browser: object, served: Path, tmp_path: Path
) -> None:
    from hvdprof.analysis import autotune_report, find_stragglers, load_run

    run = load_run(str(served / "demo"), cache=False)
    with dashboard_server(served) as base:
        page, errors = open_page(browser, base + "?run=demo")
        page.screenshot(path=str(tmp_path / "1-loaded.png"), full_page=True)
        # a finished run: connected for updates, but not called "live"
        page.wait_for_function("window.HVD_STATE.live === true")
        assert page.evaluate("window.HVD_STATE.info.complete") is True
        assert page.locator("#live-text").text_content() == "watching"

        # every chart says what its axes are, with units
        assert any("ms since the run started" in t for t in axis_titles(page, "timeline"))
        for plot, words in {
            "breakdown": ["ms"],
            "stragglers": ["step"],
            "fusion": ["tensors fused", "collectives"],
            "fusion-fill": ["buffer fill", "threshold", "fused collectives"],
            "bandwidth": ["message size (bytes)", "GB/s"],
            "autotune-score": ["sample", "MB/s"],
            "autotune-params": ["sample", "MiB", "ms"],
        }.items():
            titles = " | ".join(axis_titles(page, plot))
            assert all(w in titles for w in words), (plot, titles)

        # the fill chart holds every fused collective of each rank, by band
        from hvdprof.analysis import fusion_report

        fill = page.evaluate(
            "document.getElementById('fusion-fill').data.map(t => t.y.reduce((a, b) => a + b, 0))"
        )
        assert fill == [r.fused for r in fusion_report(run).ranks] and sum(fill) > 0

        # one row per rank, labelled, drawn by Plotly as y tick labels
        assert lanes(page) == [f"rank {r} ({run.hosts[r]})" for r in run.ranks]
        ticks = page.locator("#timeline .ytick text").all_text_contents()
        assert sorted(ticks) == sorted(lanes(page))
        status = page.locator("#timeline-status").text_content()
        assert "binned" in status  # the whole run is more than the screen shows

        # zoom by dragging across the plot, starting where rank 1 ran its middle
        # allreduce (where that is depends on how long start-up and broadcast took):
        # the page re-queries a narrower window
        slices = run.slices
        allreduce = np.array([name.startswith("allreduce.") for name in run.tensors] + [False])
        own = (slices.rank == 1) & allreduce[slices.tensor]  # -1 (no tensor) -> False
        assert own.any(), "the demo run allreduces its gradients"
        target_us = float(np.median(slices.start_us[own]))
        box = page.locator("#timeline .nsewdrag").first.bounding_box()
        x_range = page.evaluate("document.getElementById('timeline')._fullLayout.xaxis.range")
        t0_page = page.evaluate("window.HVD_STATE.info.t0_us")
        fraction = ((target_us - t0_page) / 1000 - x_range[0]) / (x_range[1] - x_range[0])
        assert 0.0 <= fraction <= 1.0, (fraction, x_range)
        y = box["y"] + box["height"] / 2
        x0 = box["x"] + box["width"] * min(fraction, 0.97)
        page.mouse.move(x0, y)
        page.mouse.down()
        page.mouse.move(x0 + box["width"] * 0.02, y, steps=5)
        page.mouse.up()
        wait_for_timeline(page, "window.HVD_STATE.view !== null")
        view = page.evaluate("window.HVD_STATE.view")
        assert run.t0_us < view[0] < view[1] < run.t1_us
        assert view[1] - view[0] < 0.05 * (run.t1_us - run.t0_us)
        page.wait_for_function(
            "!/binned/.test(document.getElementById('timeline-status').textContent)"
        )
        # hovering a backend call shows its arguments
        names = page.evaluate(
            "document.getElementById('timeline').data.filter(t => t.type === 'bar').map(t => t.name)"
        )
        assert "collective" in names, names
        # Move the mouse onto a bar as a user would. A bar that runs past the zoomed view is
        # clipped while its path's box is not, so only the part inside the plot counts, and a
        # point under another element reaches no hover. Bars of one rank overlap (one
        # tensor negotiates while another's collective runs; the lane overlays them), and
        # Plotly's hover then names the narrower one: CI once hovered a collective's middle
        # and got a NEGOTIATE_ALLREDUCE of another tensor. So: the parts of collective bars
        # inside the plot whose middle is the plot's own drag layer and lies in no narrower
        # bar of another phase, widest first, up to three of them.
        candidates = page.evaluate(
            """(index) => {
              const plot = document.querySelector('#timeline .nsewdrag').getBoundingClientRect();
              const traces = [...document.querySelectorAll('#timeline .barlayer .trace')];
              const boxes = (t) => [...t.querySelectorAll('.point path')]
                .map((p) => p.getBoundingClientRect()).filter((b) => b.width > 0 || b.height > 0);
              const others = traces.filter((_, i) => i !== index).flatMap(boxes);
              const out = [];
              for (const b of boxes(traces[index])) {
                const left = Math.max(b.left, plot.left), right = Math.min(b.right, plot.right);
                const top = Math.max(b.top, plot.top), bottom = Math.min(b.bottom, plot.bottom);
                const w = right - left, cx = (left + right) / 2, cy = (top + bottom) / 2;
                if (w <= 2 || bottom - top <= 2) continue;
                const e = document.elementFromPoint(cx, cy);
                if (!e || !e.closest('#timeline .draglayer')) continue;
                const under = others.some((o) => o.left <= cx && cx <= o.right
                  && o.top <= cy && cy <= o.bottom && o.width < w);
                if (!under) out.push([w, cx, cy]);
              }
              return out.sort((a, b) => b[0] - a[0]).slice(0, 3);
            }""",
            names.index("collective"),
        )
        assert candidates, "no collective bar inside the zoomed view clear of other bars"
        seen = []
        for _, cx, cy in candidates:
            page.mouse.move(1, 1)  # off the plot: the previous label goes away
            page.wait_for_selector("#timeline .hoverlayer .hovertext", state="detached")
            page.mouse.move(cx - 20, cy - 20)
            page.mouse.move(cx, cy, steps=5)
            try:
                page.wait_for_selector("#timeline .hoverlayer .hovertext", timeout=5000)
            except playwright_api.TimeoutError:
                seen.append(None)
                continue
            seen.append(page.locator("#timeline .hoverlayer .hovertext").first.text_content())
            if "backend:" in seen[-1]:
                break
        hover = seen[-1] or ""
        assert all(word in hover for word in ("tensor:", "bytes:", "backend:")), seen
        page.screenshot(path=str(tmp_path / "2-zoomed.png"), full_page=False)

        # expand rank 1 into its tensor lanes
        page.select_option("#expand-select", "1")
        wait_for_timeline(page, "window.HVD_STATE.lanes.length > 2")
        tensor_lanes = lanes(page)
        assert set(tensor_lanes) <= set(run.tensors) | {"(runtime)"}
        assert any(name.startswith("allreduce.") for name in tensor_lanes), (tensor_lanes, view)
        page.screenshot(path=str(tmp_path / "3-expanded.png"), full_page=False)

        # or into its phase lanes: one row per phase, each bar coloured by its own phase
        page.select_option("#expand-select", "1:phase")
        wait_for_timeline(page, "window.HVD_STATE.laneKinds === 'phase'")
        phase_lanes = lanes(page)
        from hvdprof.trace.model import PHASES

        assert phase_lanes == [p for p in PHASES if p in phase_lanes]
        assert {"negotiate", "collective"} <= set(phase_lanes), phase_lanes
        ticks = page.locator("#timeline .ytick text").all_text_contents()
        assert sorted(ticks) == sorted(phase_lanes)
        drawn = page.evaluate(
            "document.getElementById('timeline').data"
            ".filter(t => t.type === 'bar').map(t => [t.name, [...new Set(t.y)]])"
        )
        assert drawn and all(lane == [name] for name, lane in drawn), drawn
        assert "rank 1: phase lanes" in axis_titles(page, "timeline")
        page.screenshot(path=str(tmp_path / "3b-phase-lanes.png"), full_page=False)
        page.select_option("#expand-select", "1")
        wait_for_timeline(page, "window.HVD_STATE.laneKinds === 'tensor'")

        # the straggler verdict, word for word from the analysis library
        verdict = page.locator("#straggler-verdict").text_content()
        assert verdict == find_stragglers(run).verdict and verdict
        assert page.locator("#stragglers .heatmaplayer").count() == 1

        # autotune: one marker per sample; clicking one moves the timeline to its window
        samples = autotune_report(run).samples
        assert samples, "the demo run was made with --autotune"
        points = page.locator("#autotune-score .scatterlayer .trace").first.locator(".point")
        assert points.count() == len(samples)
        assert page.locator("#autotune-params .scatterlayer .trace").count() == 2
        # the ringed sample is the tuner's recommendation, the one the verdict names
        report = autotune_report(run)
        # (the ring is the last trace; no raw best-so-far line: the tuner's incumbent)
        names = page.evaluate("document.getElementById('autotune-score').data.map(t => t.name)")
        assert "best so far" not in names and (
            not report.paired or any("incumbent" in n for n in names)
        )
        assert page.locator("#autotune-summary").text_content() == report.verdict
        ringed = page.evaluate("document.getElementById('autotune-score').data.at(-1).x")
        assert report.recommended is not None, "the demo's tuner marks its recommendation"
        assert ringed == [samples[report.recommended].index]
        recommended = samples[report.recommended]
        if report.decision:  # the tuner ended a round: its own line, as it said it
            line = report.decision.removeprefix("hvdprof autotune: ").rstrip(".")
            assert report.verdict == f"Autotune ({len(samples)} samples): {line}."
        else:  # still tuning when the recording ended: the sample it would run now
            assert f"cycle time {recommended.cycle_time_ms:.3g} ms" in report.verdict
        assert (
            page.locator("#autotune-surface .contourlayer, #autotune-surface .empty").count() >= 1
        )
        page.select_option("#expand-select", "")
        target = samples[len(samples) // 2]
        points.nth(len(samples) // 2).click(force=True)
        page.wait_for_function(
            f"window.HVD_STATE.view && Math.abs(window.HVD_STATE.view[0] - {target.t0_us}) < 1"
        )
        page.wait_for_function(
            "document.getElementById('timeline-status').textContent"
            f".includes('autotune sample {target.index} ran in')"
        )
        page.screenshot(path=str(tmp_path / "4-autotune.png"), full_page=True)
        assert errors == []


def test_horovod_timeline_and_compare(browser: object, served: Path, tmp_path: Path) -> None:
    with dashboard_server(served) as base:
        page, errors = open_page(browser, base + "?run=horovod/timeline.json")
        assert lanes(page) == ["rank 0", "rank 1"] or all(
            re.match(r"rank \d", lane) for lane in lanes(page)
        )
        meta = page.locator("#run-meta").text_content()
        assert meta.startswith("horovod timeline")
        info = page.evaluate("window.HVD_STATE.info")
        # Horovod's timeline is written by rank 0: the other ranks keep a (named) empty row
        assert len(lanes(page)) == len(info["ranks"])
        status = page.locator("#timeline-status").text_content()
        ticks = page.locator("#timeline .ytick text").all_text_contents()
        assert sorted(ticks) == sorted(lanes(page))
        assert "nothing recorded in this window for: rank 1" in status, status
        assert "rank 1" in page.locator("#stragglers-note").text_content()
        page.select_option("#compare-a", "demo")
        page.select_option("#compare-b", "horovod/timeline.json")
        page.click("#compare-go")
        # the card's placeholder (".empty") is there before the answer: wait for the
        # comparison itself (a loaded full suite read the placeholder's empty legend)
        page.wait_for_function("document.getElementById('compare').dataset.drawn === '1'")
        page.wait_for_selector("#compare .legendtext, #compare .empty")
        page.screenshot(path=str(tmp_path / "compare.png"), full_page=True)
        legend = " ".join(page.locator("#compare .legendtext").all_text_contents())
        assert "demo" in legend and str(served) not in legend  # run ids, not long paths
        assert page.locator("#compare > .empty").count() == 0  # the prompt went away
        assert errors == []


def test_empty_broken_and_refused_runs_show_notices(
    browser: object, served: Path, tmp_path: Path
) -> None:
    """No run, an unreadable run, a run linked out: a notice each, no script error."""
    root = tmp_path / "root"
    (root / "empty").mkdir(parents=True)
    (root / "empty" / "rank.0.json").write_bytes(b"")
    (root / "empty" / "rank.1.json").write_bytes(b"[\n")
    (root / "linked").mkdir()
    (root / "linked" / "rank.0.json").symlink_to(served / "demo" / "rank.0.json")
    with dashboard_server(root) as base:
        page, errors = open_page(browser, base + "?run=empty")
        notices = page.locator("#notices").text_content()
        assert "still being written" in notices, notices
        assert not page.locator("#problems-card").is_hidden()
        assert "empty file" in page.locator("#problems").text_content()
        assert "no events recorded yet" in page.locator("#timeline .empty").text_content()
        assert "No readiness marks" in page.locator("#straggler-verdict").text_content()
        page.screenshot(path=str(tmp_path / "empty-run.png"), full_page=True)

        # switching to a run that is refused leaves nothing of the previous run on screen
        page.select_option("#run-select", "linked")
        page.wait_for_function(
            "document.getElementById('notices').textContent.includes('cannot be shown')"
        )
        notices = page.locator("#notices").text_content()
        assert "outside the served directory" in notices and "still being written" not in notices
        assert page.locator("#straggler-verdict").text_content() == ""
        assert "cannot be shown" in page.locator("#breakdown .empty").text_content()
        assert page.locator("#problems-card").is_hidden()
        page.screenshot(path=str(tmp_path / "linked-run.png"), full_page=False)
        page.close()
        assert errors == []

    nothing = tmp_path / "nothing"
    nothing.mkdir()
    with dashboard_server(nothing) as base:
        page, errors = open_page(browser, base)
        assert "no timeline here yet" in page.locator("#notices").text_content()
        assert "no runs under this directory yet" in page.locator("#timeline").text_content()
        assert "no run to show yet" in page.locator("#breakdown .empty").text_content()
        page.screenshot(path=str(tmp_path / "no-runs.png"), full_page=False)
        assert errors == []


def test_token_page_keeps_working(browser: object, served: Path, tmp_path: Path) -> None:
    with dashboard_server(served, "--token", "tok3n") as base:
        page, errors = open_page(browser, base + "?token=tok3n&run=demo")
        assert len(lanes(page)) == 2
        page.wait_for_function("window.HVD_STATE.live === true")  # SSE carries the token too
        page.screenshot(path=str(tmp_path / "token.png"))
        denied = browser.new_page()
        response = denied.goto(base + "api/runs")
        assert response.status == 401
        denied.close()

        # /docs renders the API from files this server holds: nothing from another host
        docs = browser.new_page(viewport={"width": 1400, "height": 950})
        docs.set_default_timeout(WAIT_MS)
        requests: list[str] = []
        docs.on("request", lambda r: requests.append(r.url))
        docs.goto(base + "docs?token=tok3n")
        docs.wait_for_selector(".swagger-ui .opblock")
        assert docs.locator(".swagger-ui .opblock").count() >= 10  # one per documented route
        assert "/api/timeline" in docs.locator(".swagger-ui").text_content()
        fetched = [url for url in requests if not url.startswith(("data:", "blob:"))]
        assert fetched and all(url.startswith(base) for url in fetched), fetched
        docs.screenshot(path=str(tmp_path / "docs.png"))
        docs.close()
        assert errors == []


@pytest.fixture(scope="module")
def slow_served(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real 2-rank job whose rank 1 sleeps 15 ms before each step (the straggler)."""
    from conftest import run_job

    root = tmp_path_factory.mktemp("browser-slow")
    job = run_job(
        "analysis_worker.py", 2, "--steps", "120", "--sleep-rank", "1", "--sleep-ms", "15",
        launcher_args=("--timeline", str(root / "slow")),
    )  # fmt: skip
    job.assert_done(2)
    return root


#: Largest gap between the share of a rank's time the overview colours in a phase and the
#: breakdown's share of that phase.
SHARE_TOLERANCE = 0.03


def overlapping_titles(page, plot: str) -> list[str]:
    """Axis titles of ``plot`` whose box overlaps one of that axis's tick labels."""
    return page.evaluate(
        """(plot) => {
          const el = document.getElementById(plot);
          const hit = (a, b) => a.left < b.right && b.left < a.right && a.top < b.bottom && b.top < a.bottom;
          const out = [];
          for (const [title, ticks] of [["g-xtitle", "xtick"], ["g-ytitle", "ytick"], ["g-y2title", "y2tick"]]) {
            for (const t of el.querySelectorAll("." + title + " text")) {
              if (!t.textContent.trim()) continue;
              const box = t.getBoundingClientRect();
              for (const tick of el.querySelectorAll("." + ticks + " text")) {
                if (tick.textContent.trim() && hit(box, tick.getBoundingClientRect())) {
                  out.push(t.textContent + " / " + tick.textContent);
                }
              }
            }
          }
          return out;
        }""",
        plot,
    )


def test_overview_conserves_time_marks_the_straggler_and_wheel_zooms(
    browser: object, slow_served: Path, tmp_path: Path
) -> None:
    from hvdprof.analysis import find_stragglers, load_run, time_breakdown

    run = load_run(str(slow_served / "slow"), cache=False)
    breakdown = time_breakdown(run)
    with dashboard_server(slow_served) as base:
        page, errors = open_page(browser, base + "?run=slow")
        page.wait_for_timeout(500)
        page.screenshot(path=str(tmp_path / "slow.png"), full_page=True)
        assert "binned" in page.locator("#timeline-status").text_content()
        # the length drawn in each phase's colour on a rank's row is that phase's time
        drawn = page.evaluate(
            """() => {
              const out = {};
              for (const t of document.getElementById('timeline').data) {
                if (t.type !== 'bar') continue;
                t.y.forEach((lane, i) => {
                  const key = lane + '|' + t.name;
                  out[key] = (out[key] || 0) + t.x[i];
                });
              }
              return out;
            }"""
        )
        for r in breakdown.ranks:
            lane = f"rank {r.rank} ({run.hosts[r.rank]})"
            for category in breakdown.categories:
                if category == "idle":
                    continue
                share = drawn.get(f"{lane}|{category}", 0.0) / r.wall_ms
                assert share == pytest.approx(r.share(category), abs=SHARE_TOLERANCE), (
                    lane, category, share, r.share(category),
                )  # fmt: skip
        # the heatmap says dark is waiting, and boxes the rank the analysis names
        assert "dark = this rank waited" in page.locator("#stragglers-card").text_content()
        culprit = find_stragglers(run).straggler
        assert culprit is not None, "rank 1 slept 15 ms a step: it should be named"
        ticks = page.locator("#stragglers .ytick text").all_text_contents()
        assert [t for t in ticks if "straggler" in t] == [f"rank {culprit} \u25c0 straggler"]
        # the bandwidth chart in the verdict's unit
        assert "GB/s" in page.locator("#bandwidth-verdict").text_content()
        assert any("GB/s" in t for t in axis_titles(page, "bandwidth"))
        # no axis title sits on its tick labels
        for plot in ("timeline", "breakdown", "stragglers", "fusion", "fusion-fill", "bandwidth"):
            assert overlapping_titles(page, plot) == [], plot
        # the mouse wheel zooms the time axis, and the page asks for the narrower window
        box = page.locator("#timeline .nsewdrag").first.bounding_box()
        page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
        for _ in range(6):
            page.mouse.wheel(0, -400)
            page.wait_for_timeout(100)
        wait_for_timeline(page, "window.HVD_STATE.view !== null")
        view = page.evaluate("window.HVD_STATE.view")
        assert run.t0_us < view[0] < view[1] < run.t1_us
        assert view[1] - view[0] < 0.8 * (run.t1_us - run.t0_us)
        page.wait_for_function(
            f"(() => {{ const d = document.getElementById('timeline')._fullLayout.xaxis.range;"
            f" return Math.abs(d[1] - d[0] - {(view[1] - view[0]) / 1000}) < 1e-6; }})()"
        )
        page.screenshot(path=str(tmp_path / "slow-wheel-zoomed.png"), full_page=False)
        assert errors == []


def test_page_keeps_its_data_when_the_server_goes_away(
    browser: object, slow_served: Path, tmp_path: Path
) -> None:
    with dashboard_server(slow_served) as base:
        page, errors = open_page(browser, base + "?run=slow")
        page.wait_for_function("window.HVD_STATE.live === true")
        before = {
            "items": page.evaluate("document.getElementById('timeline').dataset.items"),
            "verdict": page.locator("#straggler-verdict").text_content(),
            "breakdown": page.evaluate("document.getElementById('breakdown').data.length"),
            "empty": page.locator("main .empty").count(),  # cards with nothing to show
        }
        assert int(before["items"]) > 0 and before["verdict"] and before["breakdown"] > 0
    # the server has stopped: the live indicator says so, and asking for more (whole run,
    # other lanes) keeps every chart as it was, with one notice
    page.wait_for_function("window.HVD_STATE.live === false")
    page.click("#reset-zoom")
    page.select_option("#expand-select", "1")
    page.wait_for_function("window.HVD_STATE.offline === true")
    page.wait_for_timeout(300)
    page.screenshot(path=str(tmp_path / "server-gone.png"), full_page=False)
    assert "server not answering" in page.locator("#live-text").text_content()
    notices = page.locator("#notices").text_content()
    assert notices.count("not answering") == 1 and "unavailable" not in notices, notices
    assert page.evaluate("document.getElementById('timeline').dataset.items") == before["items"]
    assert page.locator("#timeline .empty").count() == 0
    assert page.locator("#straggler-verdict").text_content() == before["verdict"]
    assert page.evaluate("document.getElementById('breakdown').data.length") == before["breakdown"]
    assert page.locator("main .empty").count() == before["empty"]  # no card blanked
    assert errors == []
    page.close()


def test_live_updates_while_a_job_writes(browser: object, tmp_path: Path) -> None:
    """``hvdprof run --timeline DIR --dashboard``: the printed URL shows the job as it runs."""
    chromium_or_skip()
    timeline = tmp_path / "live"
    port = free_port()
    job = subprocess.Popen(
        [sys.executable, "-m", "hvdprof", "run", "-np", "2", "--timeout", "200",
         "--timeline", str(timeline), "--autotune", "--dashboard", "--dashboard-port", str(port),
         "--", sys.executable, "-m", "hvdprof.demo", "--epochs", "60"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=child_env(), cwd=REPO,
    )  # fmt: skip
    try:
        url = None
        deadline = time.monotonic() + 60
        while url is None and time.monotonic() < deadline:
            line = job.stdout.readline()
            if not line:
                break
            match = re.search(r"hvdprof dashboard: (http://\S+)", line)
            url = match.group(1) if match else None
        assert url == f"http://127.0.0.1:{port}/", f"no dashboard URL printed (got {url!r})"
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        page.set_default_timeout(WAIT_MS)
        page.goto(url)
        # the run appears by itself once the ranks start writing, then keeps growing
        page.wait_for_function(
            "window.HVD_STATE.run !== null && window.HVD_STATE.lanes.length === 2"
        )
        first = page.evaluate("window.HVD_STATE.version")
        # grown while the ranks were still writing (the files not closed yet)
        page.wait_for_function(
            f"window.HVD_STATE.updates >= 2 && window.HVD_STATE.version > {first}"
            " && window.HVD_STATE.info && window.HVD_STATE.info.complete === false"
            " && document.getElementById('live-text').textContent === 'live'"
        )
        assert job.poll() is None, "the job ended before the page saw it grow"
        page.wait_for_timeout(1500)  # the sections refresh a second after a change
        meta = page.locator("#run-meta").text_content()
        page.screenshot(path=str(tmp_path / "live.png"), full_page=False)
        assert "v" in meta and page.evaluate("window.HVD_STATE.live") is True
        page.close()
    finally:
        job.terminate()
        try:
            job.wait(30)
        except subprocess.TimeoutExpired:
            job.kill()
            job.wait(10)


def test_report_opens_offline(browser: object, served: Path, tmp_path: Path, capsys) -> None:
    """``hvdprof report``: one file, no network, the same charts."""
    from hvdprof.analysis import find_stragglers, load_run
    from hvdprof.cli import main

    out = tmp_path / "report.html"
    assert main(["report", str(served), "--run", "demo", "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    requests: list[str] = []
    page, errors = open_page(browser, out.as_uri(), offline=True, requests=requests)
    page.wait_for_timeout(500)
    page.screenshot(path=str(tmp_path / "report.png"), full_page=True)
    assert requests == [out.as_uri()]  # nothing fetched: everything is inside the file
    # a binned view says so, on the page and when the report is written
    status = page.locator("#timeline-status").text_content()
    binned = "binned" in status
    assert ("timeline views held as time bins" in printed) == binned, (printed, status)
    assert not binned or "this offline report holds the bins only" in status
    assert lanes(page) == ["rank 0 (vm)", "rank 1 (vm)"] or len(lanes(page)) == 2
    verdict = page.locator("#straggler-verdict").text_content()
    assert verdict == find_stragglers(load_run(str(served / "demo"), cache=False)).verdict
    page.select_option("#expand-select", "0")  # expanded lanes are embedded too
    page.wait_for_function("window.HVD_STATE.lanes.length > 2")
    page.select_option("#expand-select", "0:phase")
    page.wait_for_function("window.HVD_STATE.laneKinds === 'phase'")
    assert "negotiate" in lanes(page)
    assert page.locator("#autotune-score .scatterlayer .point").count() > 0
    assert errors == []
    page.context.close()


def test_process_sets_filter(browser: object, tmp_path: Path) -> None:
    """A real 4-rank job in sets {0, 1} and {2, 3}, rank 3 slowed: the page offers the
    sets, and choosing set 2 narrows the timeline and the straggler card to ranks 2 and 3,
    with rank 3 named there; set 1 names nobody."""
    from test_process_sets import record_two_set_job

    root = tmp_path / "served"
    result = record_two_set_job(root / "sets")
    assert result.returncode == 0, result.describe()
    with dashboard_server(root) as base:
        page, errors = open_page(browser, base + "?run=sets")
        page.wait_for_selector("#set-filter:not([hidden])")
        options = page.locator("#set-select option").all_text_contents()
        assert options == ["all ranks", "set 1: ranks 0, 1", "set 2: ranks 2, 3"], options
        ranks_shown = "window.HVD_STATE.lanes.map((l) => l.split(' (')[0]).join()"
        assert page.evaluate(ranks_shown) == "rank 0,rank 1,rank 2,rank 3"
        for value, lanes_shown, said, rows_drawn in (
            ("2", "rank 2,rank 3", "(ranks 2, 3): rank 3 is the straggler",
             ["rank 2", "rank 3 \u25c0 straggler"]),
            ("1", "rank 0,rank 1", "(ranks 0, 1): No straggler", ["rank 0", "rank 1"]),
        ):  # fmt: skip
            page.select_option("#set-select", value)
            wait_for_timeline(page, f"{ranks_shown} === '{lanes_shown}'")
            verdict = page.locator("#straggler-verdict").text_content()
            assert verdict.startswith(f"Process set {value} {said}"), verdict
            rows = page.locator("#stragglers .ytick text").all_text_contents()
            assert sorted(rows) == rows_drawn, rows
            page.screenshot(path=str(tmp_path / f"process-set-{value}.png"), full_page=True)
        page.select_option("#set-select", "")
        wait_for_timeline(page, "window.HVD_STATE.lanes.length === 4")
        assert errors == []
