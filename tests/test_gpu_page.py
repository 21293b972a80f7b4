"""The GPU on the dashboard (issue 38): stream lanes, the GPU card, the straggler card.

On the real 2-rank NCCL torch.profiler traces in ``tests/data/kineto-hta`` (ranks 0 and 1
of a 128-rank job; HTA's numbers in the README beside them): the API answers stream lanes,
and in Chromium (Playwright) the page draws one lane per GPU stream with every GPU event
of the file (counted here from the gz files with json + gzip), shows HTA's shares per rank
in a GPU card, links a kernel to its launch on hover, lists no rank that is not in the
files, and draws no wait heatmap where arrivals cannot be compared. A 2-step synthetic
run checks that the heatmap's step axis ticks whole steps.
"""

from __future__ import annotations

import gzip
import json
import re
import shutil
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from dashboard_support import dashboard_server, launched_chromium, open_page

pytest.importorskip("fastapi")
playwright_api = pytest.importorskip("playwright.sync_api")

from fastapi.testclient import TestClient  # noqa: E402
from synthetic_runs import SyntheticSpec, write_synthetic_run  # noqa: E402

from hvdprof.dashboard.app import create_app  # noqa: E402
from hvdprof.dashboard.settings import DashboardSettings  # noqa: E402

HTA_DATA = Path(__file__).resolve().parent / "data" / "kineto-hta"
#: tests/data/kineto-hta/README.md: idle, compute, non-compute, overlap (percent)
HTA_SHARES = {
    0: ("53.56%", "17.71%", "28.74%", "11.81%"),
    1: ("54.72%", "22.57%", "22.72%", "20.05%"),
}
GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
LOOPBACK = "http://127.0.0.1"


def gpu_events_per_stream(rank: int) -> Counter[int]:
    """GPU events per stream, read straight from the rank's gz file."""
    with gzip.open(HTA_DATA / f"sampled_rank-{rank}.json.gz", "rt") as f:
        events = json.load(f)["traceEvents"]
    return Counter(
        int(e["args"]["stream"])
        for e in events
        if e.get("ph") == "X"
        and e.get("cat") in GPU_CATEGORIES
        and "stream" in (e.get("args") or {})
    )


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("gpu-served")
    shutil.copytree(HTA_DATA, root / "gpu")
    write_synthetic_run(
        str(root / "two-steps"), SyntheticSpec(ranks=2, steps=2, late_rank=1, late_us=4000.0)
    )
    (root / "gpu-one").mkdir()
    shutil.copy(HTA_DATA / "sampled_rank-1.json.gz", root / "gpu-one")
    return root


@pytest.fixture(scope="module")
def client(served: Path) -> Iterator[TestClient]:
    with TestClient(
        create_app(DashboardSettings(served)), raise_server_exceptions=False, base_url=LOOPBACK
    ) as c:
        yield c


# --- the API ---------------------------------------------------------------------------------


def test_api_stream_lanes(client: TestClient) -> None:
    body = client.get("/api/timeline", params={"run": "gpu", "expand_rank": 1, "lanes": "stream"})
    assert body.status_code == 200, body.text
    data = body.json()["data"]
    assert data["lanes"] == "stream" and data["expand_rank"] == 1
    rows = {r["row"]: r["stream"] for r in data["rows"]}
    drawn = Counter(rows[r] for r in data["slices"]["row"] if rows[r] is not None)
    assert drawn == gpu_events_per_stream(1)
    # without a rank, or for a rank without GPU activity: said, not a blank answer
    r = client.get("/api/timeline", params={"run": "gpu", "lanes": "stream"})
    assert r.status_code == 422 and "expand_rank" in r.text
    r = client.get("/api/timeline", params={"run": "gpu", "expand_rank": 5, "lanes": "stream"})
    assert r.status_code == 422 and "no GPU activity" in r.text
    r = client.get(
        "/api/timeline", params={"run": "two-steps", "expand_rank": 0, "lanes": "stream"}
    )
    assert r.status_code == 422
    # the GPU section: HTA's shares; no rank stands out (4.9 points apart: not material)
    gpu = client.get("/api/analysis/gpu", params={"run": "gpu"}).json()["data"]
    assert [r["rank"] for r in gpu["ranks"]] == [0, 1] and gpu["stands_out"] is None
    assert (
        client.get("/api/analysis/gpu", params={"run": "two-steps"}).json()["data"]["ranks"] == []
    )


# --- the page --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    with launched_chromium() as b:
        yield b


@pytest.fixture(scope="module")
def base(served: Path) -> Iterator[str]:
    with dashboard_server(served) as url:
        yield url


#: GPU events drawn per lane label: the bars of the stream lanes' traces
DRAWN_PER_LANE = """() => {
  const el = document.getElementById('timeline');
  const out = {};
  for (const t of el.data) {
    if (t.type !== 'bar') continue;
    for (const y of t.y) out[y] = (out[y] || 0) + 1;
  }
  return out;
}"""


#: The page's words outside the charts, each text node apart (the charts' tick labels
#: would otherwise run into the words before them)
PAGE_WORDS = """() => {
  const out = [];
  const walk = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  while (walk.nextNode()) {
    const n = walk.currentNode;
    if (!n.parentElement.closest('svg, script, style')) out.push(n.textContent);
  }
  return out.join(' | ');
}"""


def show_streams(page, rank: int) -> None:
    page.select_option("#expand-select", f"{rank}:stream")
    page.wait_for_function(
        "(r) => { const el = document.getElementById('timeline');"
        " return el.dataset.laneKind === 'stream' && window.HVD_STATE.lanes[0].startsWith('rank ' + r + ' '); }",
        arg=rank,
    )


def test_gpu_page(browser: object, base: str, tmp_path: Path) -> None:
    page, errors = open_page(browser, base + "?run=gpu")
    # the GPU card: HTA's shares per rank; the widest gap (4.9 points) named, not as a
    # rank that stands out (10 points or more: device.STANDS_OUT_POINTS)
    page.wait_for_selector("#gpu-card:not([hidden]) #gpu-shares-table tbody tr")
    for rank, shares in HTA_SHARES.items():
        cells = page.locator(f"#gpu-shares-table tr[data-rank='{rank}'] td").all_text_contents()
        assert cells[1:5] == list(shares), (rank, cells)
    assert page.locator("#gpu-shares-table tr.stands-out").count() == 0
    verdict = page.text_content("#gpu-verdict")
    assert verdict.startswith("No rank stands out") and "4.9 points" in verdict, verdict
    shares_plot = page.evaluate("document.getElementById('gpu-shares').data.map((t) => t.name)")
    assert "idle" in shares_plot and "compute" in shares_plot
    # kernel time per name: short names shown, the full C++ name on hover (title)
    names = page.locator("#gpu-kernels td.kernel-name")
    assert names.count() == 10
    assert names.first.text_content().startswith("ncclKernel_SendRecv")
    titles = [names.nth(i).get_attribute("title") for i in range(names.count())]
    texts = names.all_text_contents()
    assert any(len(t) > 200 and len(s) <= 60 for t, s in zip(titles, texts, strict=True))
    # memcpy bandwidth per copy kind, both ranks
    kinds = page.evaluate("document.getElementById('gpu-memcpy').data.map((t) => t.x)")
    assert len(kinds) == 2 and all(sorted(k) == ["DtoD", "DtoH", "HtoD"] for k in kinds)
    # only the ranks in the files: the traces say world size 128, ranks 0 and 1 are there
    body = page.evaluate(PAGE_WORDS)
    named = {int(n) for n in re.findall(r"\branks? (\d+)\b", body)}
    assert named <= {0, 1}, named
    options = page.locator("#expand-select option").all_text_contents()
    assert {int(m) for o in options for m in re.findall(r"rank (\d+)", o)} == {0, 1}
    assert "rank 0: GPU streams" in options and "rank 1: GPU streams" in options
    # the straggler card: a heatmap of waits only where the analysis compared arrivals
    # (here by the NCCL kernels' starts), its step axis in whole steps
    compared = page.evaluate(
        "fetch('api/analysis/stragglers?run=gpu').then((r) => r.json()).then((b) => b.data.ops_with_marks)"
    )
    assert compared == 5  # the collectives whose kernels ended together on both ranks
    assert page.get_attribute("#stragglers", "data-heatmap") == "1"
    ticks = page.locator("#stragglers .xtick text").all_text_contents()
    assert sorted({int(t) for t in ticks}) == [0, 1] and all(re.fullmatch(r"\d+", t) for t in ticks)
    # the breakdown in the trace's own words: its record_function ranges per rank
    page.wait_for_selector("#breakdown-user-box:not([hidden]) #breakdown-user .plot-container")
    bars = page.evaluate("document.getElementById('breakdown-user').data")
    assert [b["name"] for b in bars] == ["rank 0", "rank 1"]
    assert {"data_load", "forward", "backward", "optimizer"} <= set(bars[0]["y"])
    assert "about the same time" in page.text_content("#breakdown-user-verdict")
    # stream lanes: each stream drawn with every GPU event the file holds on it
    for rank in (1, 0):
        show_streams(page, rank)
        lanes = page.evaluate("window.HVD_STATE.lanes")
        per_stream = gpu_events_per_stream(rank)
        assert lanes[0] == f"rank {rank} CPU: collectives"
        streams = {int(re.match(r"stream (\d+):", lane).group(1)): lane for lane in lanes[1:]}
        assert sorted(streams) == sorted(per_stream)
        drawn = page.evaluate(DRAWN_PER_LANE)
        assert {s: drawn.get(lane, 0) for s, lane in streams.items()} == dict(per_stream)
        assert page.get_attribute("#timeline", "data-binned") == "0"
    # hovering a kernel (the mouse on its bar) links it to its launch on the CPU lane, and
    # its hover says when and where it was launched
    where = page.evaluate(
        """() => {
      const el = document.getElementById('timeline');
      const c = el.data.findIndex((t) => t.name === 'communication kernel (NCCL)');
      const t = el.data[c], i = t.x.indexOf(Math.max(...t.x));
      const xa = el._fullLayout.xaxis, ya = el._fullLayout.yaxis, r = el.getBoundingClientRect();
      return { x: r.left + xa._offset + xa.l2p(t.base[i] + t.x[i] / 2),
               y: r.top + ya._offset + ya.l2p(ya.d2l(t.y[i])), text: t.hovertext[i] };
    }"""
    )
    assert "launched on the CPU at" in where["text"] and "from launch to start" in where["text"]
    page.mouse.move(where["x"], where["y"])
    page.wait_for_function("document.getElementById('timeline').dataset.launchLink === '1'")
    lines = page.evaluate(
        "(document.getElementById('timeline').layout.shapes || []).filter((s) => s.type === 'line').length"
    )
    assert lines == 1
    assert "from launch to start" in page.text_content("#timeline .hoverlayer")
    page.screenshot(path=str(tmp_path / "gpu_page.png"), full_page=True)
    # zoomed in on the first NCCL kernel's launch: fewer slices, still per stream
    page.evaluate(
        """() => { const el = document.getElementById('timeline');
      Plotly.relayout(el, { 'xaxis.range[0]': 0, 'xaxis.range[1]': 50 }); }"""
    )
    page.wait_for_function(
        "document.getElementById('timeline-status').textContent.includes('in 50.00 ms')"
    )
    assert errors == []
    page.close()


def test_straggler_heatmap_ticks_whole_steps(browser: object, base: str) -> None:
    page, errors = open_page(browser, base + "?run=two-steps")
    assert page.locator("#gpu-card").is_hidden()  # no GPU activity: no card, not an empty box
    page.wait_for_selector("#stragglers .heatmaplayer")
    assert page.get_attribute("#stragglers", "data-heatmap") == "1"
    ticks = page.locator("#stragglers .xtick text").all_text_contents()
    assert ticks and all(re.fullmatch(r"\d+", t) for t in ticks), ticks
    assert sorted({int(t) for t in ticks}) == [0, 1]
    options = page.locator("#expand-select option").all_text_contents()
    assert not any("GPU streams" in o for o in options)
    assert errors == []
    page.close()


def test_no_wait_heatmap_where_arrivals_cannot_be_compared(browser: object, base: str) -> None:
    """One rank's trace of a 128-rank job: nobody to compare it with. The card says so
    (the analysis' verdict) instead of drawing a heatmap of waits as if it could."""
    page, errors = open_page(browser, base + "?run=gpu-one")
    stragglers = page.evaluate(
        "fetch('api/analysis/stragglers?run=gpu-one').then((r) => r.json()).then((b) => b.data)"
    )
    assert stragglers["ops_with_marks"] == 0 and stragglers["straggler"] is None
    assert page.get_attribute("#stragglers", "data-heatmap") == "0"
    assert page.locator("#stragglers .heatmaplayer").count() == 0
    assert "cannot be compared" in page.text_content("#stragglers")
    # its GPU: the card with the one rank, and its stream lanes on offer
    page.wait_for_selector("#gpu-card:not([hidden]) #gpu-shares-table tbody tr")
    cells = page.locator("#gpu-shares-table tr[data-rank='1'] td").all_text_contents()
    assert cells[0] == "1" and cells[1].endswith("%")
    assert page.locator("#expand-select option[value='1:stream']").count() == 1
    assert errors == []
    page.close()


def test_offline_report_has_the_gpu_card(browser: object, served: Path, tmp_path: Path) -> None:
    """``hvdprof report`` embeds the page's script in the file: the GPU card is there
    offline, and the stream lanes are offered only where the report holds them."""
    from hvdprof.cli import main

    out = tmp_path / "report.html"
    assert main(["report", str(served), "--run", "gpu", "-o", str(out)]) == 0
    page, errors = open_page(browser, out.as_uri(), offline=True)
    cells = page.locator("#gpu-shares-table tr[data-rank='0'] td").all_text_contents()
    assert cells[1:5] == list(HTA_SHARES[0])
    embedded = page.evaluate(
        "Object.keys(window.hvdprofEmbedded).some((k) => k.includes('lanes=stream'))"
    )
    offered = page.locator("#expand-select option[value$=':stream']").count()
    assert offered == (2 if embedded else 0)
    assert errors == []
    page.context.close()
