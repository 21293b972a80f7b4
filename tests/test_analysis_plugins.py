"""A toy analysis and a toy trace format, each ONE new file (``tests/plugins/``), loaded as
a user's plug-ins are: named in ``HVDPROF_ANALYSES`` / ``HVDPROF_FORMATS``, in real
``hvdprof analyze`` and ``hvdprof dashboard`` processes. Nothing else in hvdprof names
them, yet the toy run is read, and the toy analysis is in the verdicts, the numbered
tables, ``--json``, the API, ``/openapi.json`` with its typed schema, and on the page
(drawn by Chromium from its result, with no drawer of its own in ``web/app.js``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from dashboard_support import (
    child_env,
    dashboard_server,
    get,
    launched_chromium,
    open_page,
)
from plugins.toy_csv_format import write_toy

REPO = Path(__file__).resolve().parent.parent
TESTS = REPO / "tests"
NAME = "toy_slice_count"
#: both plug-ins, as a user names them (``tests`` on the path, as a user's own folder)
PLUGINS = {
    "HVDPROF_ANALYSES": f"plugins.{NAME}",
    "HVDPROF_FORMATS": "plugins.toy_csv_format",
    "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]).rstrip(
        os.pathsep
    ),
    "COLUMNS": "200",
}
#: what the toy analysis answers on the toy run: 3 steps of 2 slices per rank, rank 1's
#: first slice of each step 500 us shorter
EXPECTED = {
    "slices": 12,
    "ranks": [
        {"rank": 0, "slices": 6, "busy_ms": 9.0},
        {"rank": 1, "slices": 6, "busy_ms": 7.5},
    ],
    "verdict": "Toy: 12 slices were read from 2 rank(s).",
}


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding one run in the toy format, named ``toy``."""
    base = tmp_path_factory.mktemp("plugins")
    write_toy(base / "toy", 0, steps=3)
    write_toy(base / "toy", 1, steps=3, late_us=500.0)
    return base


def hvdprof(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hvdprof", *args],
        capture_output=True, text=True, timeout=180, cwd=REPO, env=child_env(env),
    )  # fmt: skip


def test_analyze_prints_the_toy_verdict_and_its_numbered_table(root: Path) -> None:
    out = hvdprof("analyze", "--no-cache", str(root / "toy"), env=PLUGINS)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert ": toy-csv timeline, 2 rank(s)" in text  # read by the toy format
    assert EXPECTED["verdict"] in text
    # the tenth table: after the nine built-in analyses that have one
    assert "10. Toy: slices per rank" in text, text
    table = text[text.index("10. Toy: slices per rank") :]
    rows = [[cell for cell in line.split() if cell != "│"] for line in table.splitlines()]
    assert ["0", "6", "9.000"] in rows and ["1", "6", "7.500"] in rows, table


def test_analyze_json_holds_the_toy_result_after_the_built_in_ones(root: Path) -> None:
    out = hvdprof("analyze", "--json", "--no-cache", str(root / "toy"), env=PLUGINS)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["run"]["format"] == "toy-csv"
    assert data[NAME] == EXPECTED
    keys = list(data)
    assert keys.index(NAME) == keys.index("problems") - 1  # the last analysis
    assert data["verdicts"][-1] == EXPECTED["verdict"]  # verdict_order 90: the last said
    assert data["breakdown"]["ranks"]  # the built-in analyses answered the toy run too


def test_an_installed_package_s_entry_points_load_them_too(root: Path, tmp_path: Path) -> None:
    # what pip writes for a package declaring both entry points (its .dist-info on the
    # path is what importlib.metadata reads), and no variable at all
    dist = tmp_path / "site" / "toy_plugins-1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-plugins\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        f"[hvdprof.analyses]\ntoy = plugins.{NAME}\n\n"
        "[hvdprof.formats]\ntoy = plugins.toy_csv_format:FORMAT\n"
    )
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), PLUGINS["PYTHONPATH"]])}
    out = hvdprof("analyze", "--json", "--no-cache", str(root / "toy"), env=env)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["run"]["format"] == "toy-csv" and data[NAME] == EXPECTED


def test_without_the_plugins_neither_exists(root: Path) -> None:
    out = hvdprof("analyze", "--json", "--no-cache", str(root / "toy"))
    assert out.returncode != 0 and "no timeline files" in out.stderr, out.stderr


def test_a_plugin_that_cannot_load_is_one_line_naming_it(root: Path) -> None:
    for variable, module, said in (
        ("HVDPROF_ANALYSES", "plugins.no_such_analysis", "ModuleNotFoundError"),
        ("HVDPROF_ANALYSES", "plugins", "declares no ANALYSIS"),
        ("HVDPROF_FORMATS", "plugins.toy_slice_count", "declares no FORMAT"),
        ("HVDPROF_ANALYSES", "not a module", "is not a module name"),
    ):
        out = hvdprof("analyze", "--no-cache", str(root / "toy"), env={**PLUGINS, variable: module})
        assert out.returncode not in (0, 1), (variable, module, out.stdout)
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and variable in lines[0] and said in lines[0], out.stderr
        assert "Traceback" not in out.stderr


def _typed(schema: dict[str, Any], components: dict[str, Any]) -> dict[str, Any]:
    if "$ref" in schema:
        return components[schema["$ref"].rpartition("/")[2]]
    return schema


def test_the_api_openapi_and_the_page_show_it(root: Path) -> None:
    with dashboard_server(root, env=PLUGINS) as base:
        status, body = get(base + f"api/analysis/{NAME}?run=toy")
        assert status == 200, body
        assert json.loads(body)["data"] == EXPECTED
        report = json.loads(get(base + "api/analysis/report?run=toy")[1])["data"]
        assert report[NAME] == EXPECTED and report["run"]["format"] == "toy-csv"
        listed = json.loads(get(base + "api/analysis")[1])
        assert listed[-1]["name"] == NAME and listed[-1]["in_report"] is True
        openapi = json.loads(get(base + "openapi.json")[1])
        route = openapi["paths"][f"/api/analysis/{NAME}"]["get"]
        assert route["summary"] == "Toy: how many slices each rank's timeline holds"
        ok = route["responses"]["200"]["content"]["application/json"]["schema"]
        components = openapi["components"]["schemas"]
        section = components[ok["$ref"].rpartition("/")[2]]
        data = _typed(section["properties"]["data"]["anyOf"][0], components)
        assert data["title"] == "SliceCount" and data["additionalProperties"] is False
        assert data["properties"]["slices"] == {"type": "integer"}
        rank = _typed(data["properties"]["ranks"]["items"], components)
        assert rank["properties"]["busy_ms"] == {"type": "number"}
        with launched_chromium() as browser:
            page, errors = open_page(browser, base)  # type: ignore[arg-type]
            _the_page_draws_it(page, errors)


def test_the_offline_report_draws_it_too(root: Path, tmp_path: Path) -> None:
    # ``hvdprof report``: the same page, its API answers embedded, the list of analyses too
    out = tmp_path / "report.html"
    done = hvdprof("report", str(root), "--run", "toy", "-o", str(out), env=PLUGINS)
    assert done.returncode == 0, done.stderr
    with launched_chromium() as browser:
        page, errors = open_page(browser, out.as_uri(), offline=True)
        _the_page_draws_it(page, errors)


def _the_page_draws_it(page: Any, errors: list[str]) -> None:
    """The toy's card, drawn from its result by the page's generic section."""
    card = page.locator(f"section[data-analysis='{NAME}']")
    card.wait_for()
    assert card.locator("h2").inner_text() == "Toy slice count"
    assert card.locator(".verdict").all_inner_texts() == [EXPECTED["verdict"]]
    tables = card.locator("table")
    assert tables.count() == 2
    singles = [r.split("\t") for r in tables.nth(0).inner_text().splitlines()]
    assert ["slices", "12"] in singles, singles
    ranks = [r.split("\t") for r in tables.nth(1).inner_text().splitlines()]
    assert ranks == [["rank", "slices", "busy_ms"], ["0", "6", "9"], ["1", "6", "7.5"]]
    # among the run's verdicts too, the last
    verdicts = page.locator("#verdicts li").all_inner_texts()
    assert verdicts[-1] == EXPECTED["verdict"]
    assert not errors, errors
