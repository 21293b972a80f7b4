"""The dashboard's JSON API through FastAPI's test client, on a real 2-rank run.

Security (path traversal, symlinks out, the token), robustness (empty, truncated,
corrupt, growing files never answer 500) and that each endpoint returns the analysis
library's own result for the run.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
from dashboard_support import HOROVOD_TIMELINE, shared_real_run
from fastapi.testclient import TestClient

from hvdprof.dashboard.app import create_app
from hvdprof.dashboard.settings import DashboardSettings
from hvdprof.errors import ConfigError

#: TestClient must address the app by a loopback name (the DNS-rebinding guard)
LOOPBACK = "http://127.0.0.1"


@pytest.fixture(scope="module")
def real_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return shared_real_run(tmp_path_factory)


@pytest.fixture(scope="module")
def served(real_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A served directory with the real run, a Horovod timeline and a secret next door."""
    base = tmp_path_factory.mktemp("served")
    root = base / "root"
    root.mkdir()
    shutil.copytree(real_run, root / "demo")
    (root / "horovod").mkdir()
    shutil.copy(HOROVOD_TIMELINE, root / "horovod" / "timeline.json")
    (base / "secret.txt").write_text("not for the dashboard")
    (base / "outside").mkdir()
    shutil.copy(real_run / "rank.0.json", base / "outside" / "rank.0.json")
    os.symlink(base / "outside", root / "link-out")
    return root


@pytest.fixture(scope="module")
def client(served: Path):
    with TestClient(
        create_app(DashboardSettings(served)), raise_server_exceptions=False, base_url=LOOPBACK
    ) as c:
        yield c


def test_runs_lists_hvdprof_and_horovod_runs_but_not_links_out(client: TestClient) -> None:
    body = client.get("/api/runs").json()
    ids = {r["id"]: r["kind"] for r in body["runs"]}
    assert ids == {"demo": "directory", "horovod/timeline.json": "file"}


def test_run_info_of_the_real_run(client: TestClient, real_run: Path) -> None:
    from hvdprof.analysis import load_run

    info = client.get("/api/run", params={"run": "demo"}).json()
    expected = load_run(str(real_run), cache=False)
    assert info["ranks"] == [0, 1]
    assert info["format"] == "hvdprof"
    assert info["complete"] is True
    assert info["t0_us"] == pytest.approx(expected.t0_us)
    assert info["t1_us"] == pytest.approx(expected.t1_us)
    assert info["tensors"] == len(expected.tensors)


def test_horovod_timeline_opens(client: TestClient) -> None:
    info = client.get("/api/run", params={"run": "horovod/timeline.json"}).json()
    assert info["format"] == "horovod"
    assert info["ranks"] == [0, 1]


@pytest.mark.parametrize(
    "run",
    ["..", "../secret.txt", "demo/../../secret.txt", "/etc", "link-out", "link-out/rank.0.json"],
)
def test_paths_outside_the_root_are_refused(client: TestClient, run: str) -> None:
    response = client.get("/api/run", params={"run": run})
    assert response.status_code == 403, response.text
    assert "outside" in response.json()["detail"]


@pytest.mark.parametrize(
    "url",
    [
        "/api/run?run=%2e%2e%2fsecret.txt",
        "/api/run?run=..%2F..%2Fetc%2Fpasswd",
        "/api/timeline?run=%2E%2E",
        "/api/analysis/breakdown?run=..%2fsecret.txt",
        "/api/compare?a=demo&b=..%2fsecret.txt",
    ],
)
def test_percent_encoded_traversal_is_refused(client: TestClient, url: str) -> None:
    response = client.get(url)
    assert response.status_code == 403, response.text


@pytest.mark.parametrize(
    "path",
    ["/static/..%2f..%2fhvdprof%2fcli.py", "/static/%2e%2e/%2e%2e/README.md", "/static/../app.js"],
)
def test_static_files_stay_inside_web(client: TestClient, path: str) -> None:
    response = client.get(path)
    assert response.status_code in (403, 404), response.text
    assert b"import argparse" not in response.content and b"## Two commands" not in response.content


def test_symlinks_out_of_web_are_refused(served: Path, tmp_path: Path) -> None:
    """A link planted in the page's directory cannot serve a file from outside it."""
    from hvdprof.dashboard.paths import web_directory

    web = tmp_path / "web"
    shutil.copytree(web_directory(), web)
    (tmp_path / "private.txt").write_text("private key material")
    os.symlink(tmp_path / "private.txt", web / "leak.js")
    os.symlink(tmp_path, web / "up")
    app = create_app(DashboardSettings(served, web_dir=web))
    with TestClient(app, raise_server_exceptions=False, base_url=LOOPBACK) as c:
        assert c.get("/static/app.js").status_code == 200
        for path in ("/static/leak.js", "/static/up/private.txt", "/static/up%2fprivate.txt"):
            response = c.get(path)
            assert response.status_code == 403, (path, response.status_code)
            assert b"private key" not in response.content


def test_run_with_a_rank_file_linked_out_is_refused(real_run: Path, tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "run").mkdir(parents=True)
    shutil.copy(real_run / "rank.0.json", root / "run" / "rank.0.json")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    shutil.copy(real_run / "rank.1.json", outside / "rank.1.json")
    os.symlink(outside / "rank.1.json", root / "run" / "rank.1.json")
    os.symlink(outside / "rank.1.json", root / "single.json")
    with TestClient(
        create_app(DashboardSettings(root)), raise_server_exceptions=False, base_url=LOOPBACK
    ) as c:
        assert "single.json" not in [r["id"] for r in c.get("/api/runs").json()["runs"]]
        for path in ("/api/run", "/api/timeline", "/api/analysis/breakdown"):
            for run in ("run", "single.json", "run/rank.1.json"):
                response = c.get(path, params={"run": run})
                assert response.status_code == 403, (path, run, response.text)
                assert "outside" in response.json()["detail"]


def test_page_and_plotly_are_served_locally(client: TestClient) -> None:
    page = client.get("/")
    assert page.status_code == 200 and "static/plotly.min.js" in page.text
    plotly = client.get("/static/plotly.min.js")
    assert plotly.status_code == 200 and len(plotly.content) > 1_000_000
    assert b"plotly" in plotly.content[:2000].lower()
    assert client.get("/static/app.js").status_code == 200


def test_openapi_documents_typed_routes(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    for path in ("/api/runs", "/api/run", "/api/timeline", "/api/analysis/stragglers",
                 "/api/analysis/autotune", "/api/compare", "/api/events"):  # fmt: skip
        assert path in spec["paths"], path
    tags = {t for p in spec["paths"].values() for op in p.values() for t in op.get("tags", [])}
    assert {"runs", "timeline", "analyses", "compare", "live"} <= tags
    assert "RunInfo" in spec["components"]["schemas"]
    docs = client.get("/docs")
    assert docs.status_code == 200 and "/openapi.json" in docs.text
    # Swagger UI from the installed fastapi-offline package, not a CDN (offline clusters)
    assert "http://" not in docs.text and "https://" not in docs.text, docs.text
    for asset in ("swagger-ui-bundle.js", "swagger-ui.css", "favicon.png"):
        response = client.get(f"/docs-assets/{asset}")
        assert response.status_code == 200 and len(response.content) > 1000, asset
    assert client.get("/docs-assets/..%2fapp.py").status_code == 404


def test_unknown_run_is_404_not_500(client: TestClient) -> None:
    response = client.get("/api/run", params={"run": "nope"})
    assert response.status_code == 404
    assert "nope" in response.json()["detail"]


def test_bad_window_is_a_clear_422(client: TestClient) -> None:
    response = client.get("/api/timeline", params={"run": "demo", "t0_us": 5, "t1_us": 1})
    assert response.status_code == 422
    assert "t1_us" in response.text


def test_timeline_rank_and_tensor_and_phase_lanes(client: TestClient, served: Path) -> None:
    """Each lane kind is the library's ``timeline_window`` for that rank, unchanged."""
    from hvdprof.analysis import load_run, timeline_window
    from hvdprof.trace.model import PHASES

    run = load_run(str(served / "demo"), cache=False)
    whole = client.get("/api/timeline", params={"run": "demo"}).json()["data"]
    assert whole["lanes"] == "rank" and [r["rank"] for r in whole["rows"]] == [0, 1]

    def lanes(kind: str) -> dict:
        params = {"run": "demo", "expand_rank": 1, "lanes": kind, "max_items": 20000}
        response = client.get("/api/timeline", params=params)
        assert response.status_code == 200, response.text
        return response.json()["data"]

    tensor = lanes("tensor")
    assert tensor["lanes"] == "tensor" and not tensor["aggregated"]
    assert {r["label"] for r in tensor["rows"]} <= set(run.tensors) | {"(runtime)"}
    phase = lanes("phase")
    assert phase["lanes"] == "phase" and not phase["aggregated"]
    labels = [r["label"] for r in phase["rows"]]
    # one lane per phase rank 1 recorded, in the library's phase order, each slice in its own
    assert labels == [p for p in PHASES if p in labels]
    assert {"negotiate", "op", "collective"} <= set(labels)
    assert all(r["rank"] == 1 and r["phase"] == r["label"] for r in phase["rows"])
    sl = phase["slices"]
    assert sl["phase"] and all(
        labels[row] == ph for row, ph in zip(sl["row"], sl["phase"], strict=True)
    )
    assert phase["total"] == tensor["total"] == int((run.slices.rank == 1).sum())
    expected = timeline_window(
        run, run.t0_us, run.t1_us, expand_rank=1, lanes="phase", max_items=20000
    ).to_dict()
    assert phase == json.loads(json.dumps(expected))
    # aggregated when asked for fewer items: bins stay in the phase lanes
    small = client.get(
        "/api/timeline", params={"run": "demo", "expand_rank": 1, "lanes": "phase", "max_items": 60}
    ).json()["data"]
    assert small["aggregated"] and set(small["buckets"]["row"]) <= set(range(len(labels)))
    assert sum(small["buckets"]["count"]) >= phase["total"]


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"lanes": "phase"}, "needs expand_rank"),
        ({"lanes": "bogus", "expand_rank": 0}, "lanes"),
    ],
)
def test_bad_lanes_are_a_clear_422(client: TestClient, params: dict, message: str) -> None:
    response = client.get("/api/timeline", params={"run": "demo", **params})
    assert response.status_code == 422 and message in response.text


# ------------------------------------------------------------------------ token


def test_non_loopback_without_token_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"0\.0\.0\.0.*--token"):
        DashboardSettings(tmp_path, host="0.0.0.0")
    DashboardSettings(tmp_path, host="::1")  # loopback needs none
    DashboardSettings(tmp_path, host="0.0.0.0", token="s3cret")


def test_token_checked_on_every_request(served: Path) -> None:
    app = create_app(DashboardSettings(served, host="0.0.0.0", token="s3cret"))
    with TestClient(app, raise_server_exceptions=False, base_url=LOOPBACK) as c:
        for path in ("/", "/api/runs", "/static/plotly.min.js", "/openapi.json", "/api/events"):
            assert c.get(path).status_code == 401, path
        assert c.get("/api/runs", params={"token": "wrong"}).status_code == 401
        assert c.get("/api/runs", headers={"X-Hvdprof-Token": "s3cret"}).status_code == 200
        page = c.get("/", params={"token": "s3cret"})
        assert page.status_code == 200
        # the page opened with ?token= works further on: /docs fetches /openapi.json itself
        assert "hvdprof_token" in page.headers.get("set-cookie", "")
        assert c.get("/openapi.json").status_code == 200


def test_cli_refuses_public_bind_without_token(tmp_path: Path, capsys) -> None:
    from hvdprof.cli import main

    assert main(["dashboard", str(tmp_path), "--host", "0.0.0.0", "--no-browser"]) == 2
    err = capsys.readouterr().err
    assert "--token" in err and "Traceback" not in err


# ------------------------------------------------------------------ robustness


def _check_never_500(c: TestClient, run: str) -> list[str]:
    notices = []
    for path in ("/api/run", "/api/timeline", "/api/analysis/report", "/api/analysis/breakdown",
                 "/api/analysis/stragglers", "/api/analysis/autotune"):  # fmt: skip
        response = c.get(path, params={"run": run})
        assert response.status_code < 500, (path, response.status_code, response.text)
        notices += response.json().get("notices", []) if response.status_code == 200 else []
    return notices


def test_empty_directory(tmp_path: Path) -> None:
    with TestClient(
        create_app(DashboardSettings(tmp_path)), raise_server_exceptions=False, base_url=LOOPBACK
    ) as c:
        body = c.get("/api/runs").json()
        assert body["runs"] == [] and "no timeline" in body["notices"][0]
        assert c.get("/").status_code == 200


def test_truncated_corrupt_and_missing_rank(tmp_path: Path, real_run: Path) -> None:
    run = tmp_path / "broken"
    run.mkdir()
    data = (real_run / "rank.0.json").read_bytes()
    (run / "rank.0.json").write_bytes(data[: len(data) // 2])  # cut mid-event
    (run / "manifest.rank.0.json").write_bytes((real_run / "manifest.rank.0.json").read_bytes())
    (run / "manifest.rank.1.json").write_bytes((real_run / "manifest.rank.1.json").read_bytes())
    # rank 1's trace is missing; a third file is garbage
    (tmp_path / "garbage.json").write_bytes(b'[{"ph": "X", \x00\xff garbage')
    # empty rank files, a compressed trace that is not gzip, a trace with no events
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "rank.0.json").write_bytes(b"")
    (tmp_path / "empty" / "rank.1.json").write_bytes(b"[\n")
    (tmp_path / "bad.json.gz").write_bytes(b"not gzip at all")
    (tmp_path / "noevents.json").write_text('{"traceEvents": []}')
    with TestClient(
        create_app(DashboardSettings(tmp_path)), raise_server_exceptions=False, base_url=LOOPBACK
    ) as c:
        ids = [r["id"] for r in c.get("/api/runs").json()["runs"]]
        assert {"broken", "empty", "bad.json.gz"} <= set(ids)
        info = c.get("/api/run", params={"run": "broken"}).json()
        assert info["complete"] is False
        assert any("still being written" in n or "cut off" in n for n in info["notices"])
        # the cut last event is what a file being written looks like: said in that
        # notice, listed among the problems, but not counted as a problem to alarm anyone
        assert any("1 file(s) end in an event not yet written whole" in n for n in info["notices"])
        assert any("incomplete last event" in p["reason"] for p in info["problems"])
        tails = [p for p in info["problems"] if "incomplete last event" in p["reason"]]
        others = len(info["problems"]) - len(tails)
        counted = [n for n in info["notices"] if "problem(s) reading" in n]
        assert counted == (
            [f"{others} problem(s) reading the files: see the list below"] if others else []
        )
        _check_never_500(c, "broken")
        for run_id in ids:
            _check_never_500(c, run_id)
            # ... and the page is told what went wrong (a notice or a clear 4xx)
            info = c.get("/api/run", params={"run": run_id})
            assert info.status_code < 500
            if run_id in ("empty", "bad.json.gz"):
                body = info.json()
                assert body.get("notices") or body.get("problems") or body.get("detail"), body


def test_growing_file_refreshes(tmp_path: Path, real_run: Path) -> None:
    """A run read while half written grows on refresh (what the live watcher relies on)."""
    run = tmp_path / "live"
    run.mkdir()
    full = (real_run / "rank.0.json").read_bytes()
    cut = full.index(b"\n", len(full) // 3) + 1
    (run / "rank.0.json").write_bytes(full[:cut])
    app = create_app(DashboardSettings(tmp_path))
    with TestClient(app, raise_server_exceptions=False, base_url=LOOPBACK) as c:
        urls = ("/api/run", "/api/timeline", "/api/analysis/breakdown")
        before = {u: c.get(u, params={"run": "live"}).json() for u in urls}
        # asked again, each answer is the same (served from the per-version cache)
        assert {u: c.get(u, params={"run": "live"}).json() for u in urls} == before
        with (run / "rank.0.json").open("ab") as f:
            f.write(full[cut:])
        catalog = app.state.catalog
        loaded = catalog.loaded("live")
        assert catalog.refresh(loaded) is True
        after = {u: c.get(u, params={"run": "live"}).json() for u in urls}
        for u in urls:  # a cached answer of the old version is never served again
            assert after[u]["version"] == before[u]["version"] + 1, u
        assert after["/api/run"]["t1_us"] > before["/api/run"]["t1_us"]
        assert after["/api/timeline"]["t1_us"] > before["/api/timeline"]["t1_us"]
        assert after["/api/analysis/breakdown"]["data"] != before["/api/analysis/breakdown"]["data"]


def test_sections_carry_the_library_results(client: TestClient, served: Path) -> None:
    import hvdprof.analysis as library
    from hvdprof.dashboard.routes.analyses import ANALYSES, analysis_function

    run = library.load_run(str(served / "demo"), cache=False)
    checked = []
    for name, (function, _) in ANALYSES.items():
        compute = analysis_function(function)
        if compute is None:
            continue
        body = client.get(f"/api/analysis/{name}", params={"run": "demo"}).json()
        expected = json.loads(json.dumps(compute(run).to_dict()))
        assert body["data"] == expected, name
        checked.append(name)
    assert {"breakdown", "stragglers", "autotune", "surrogate"} <= set(checked)


def test_rank_appearing_later_is_picked_up(tmp_path: Path, real_run: Path) -> None:
    """A rank whose file appears after the first read is in the run after the next change."""
    run = tmp_path / "late"
    run.mkdir()
    shutil.copy(real_run / "rank.0.json", run / "rank.0.json")
    app = create_app(DashboardSettings(tmp_path))
    with TestClient(app, raise_server_exceptions=False, base_url=LOOPBACK) as c:
        assert c.get("/api/run", params={"run": "late"}).json()["ranks"] == [0]
        shutil.copy(real_run / "rank.1.json", run / "rank.1.json")
        catalog = app.state.catalog
        assert catalog.refresh(catalog.loaded("late")) is True
        assert c.get("/api/run", params={"run": "late"}).json()["ranks"] == [0, 1]
        window = c.get("/api/timeline", params={"run": "late"}).json()["data"]
        assert [row["rank"] for row in window["rows"]] == [0, 1]


def test_cli_errors_are_one_line(tmp_path: Path, capsys) -> None:
    from hvdprof.cli import main

    assert main(["report", str(tmp_path), "-o", str(tmp_path / "r.html")]) == 2
    assert "no timeline found" in capsys.readouterr().err
    assert main(["report", str(tmp_path), "--run", "../x", "-o", str(tmp_path / "r.html")]) == 2
    assert "outside" in capsys.readouterr().err
    code = main(["run", "-np", "1", "--dashboard", "--", sys.executable, "-c", "pass"])
    err = capsys.readouterr().err
    assert code == 2 and "--dashboard needs --timeline" in err and "Traceback" not in err


def test_surrogate_surface_follows_the_samples(tmp_path: Path) -> None:
    """Scores rising with the threshold: the surface's best lies among the large ones."""
    from synthetic_runs import SyntheticSpec, write_synthetic_run

    from hvdprof.analysis import load_run
    from hvdprof.analysis.surrogate import autotune_surface

    write_synthetic_run(str(tmp_path / "r"), SyntheticSpec(ranks=2, steps=16, autotune_samples=8))
    run = load_run(str(tmp_path / "r"), cache=False)
    surface = autotune_surface(run, grid=20)
    assert surface.reason is None and len(surface.z) == 20 and len(surface.z[0]) == 20
    thresholds = sorted(s["fusion_threshold_bytes"] for s in surface.samples)
    assert len(thresholds) == 8
    assert surface.best["fusion_threshold_bytes"] >= thresholds[len(thresholds) // 2]
    run.autotune_samples = run.autotune_samples[:2]
    assert "at least" in autotune_surface(run).reason
