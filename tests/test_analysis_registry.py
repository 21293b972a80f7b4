"""One registry of analyses (``hvdprof/analysis/registry.py``), which finds each module's
own ``ANALYSIS`` declaration (the one-file plug-ins, through ``HVDPROF_ANALYSES`` in real
processes, are ``tests/test_analysis_plugins.py``): an analysis registered alone is in ``analyze()``'s report and JSON, ``hvdprof analyze --json``, the dashboard's
API and its OpenAPI schema, the verdicts at its declared place, and the terminal's tables,
numbered by its place. The built-in entries name real functions and types, and every list
that used to be kept by hand (exports, routes, the docs' table) covers them. Its result
type is its schema: in ``/openapi.json`` and the published JSON schema
(``hvdprof.analysis.schema``, ``docs/analysis-schema.json``), with no hand-written
``to_dict()``."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from synthetic_runs import SyntheticSpec, write_synthetic_run

from hvdprof.analysis import analyze, load_run, registry, schema
from hvdprof.analysis.cli import print_report
from hvdprof.analysis.report import SCHEMA_VERSION
from hvdprof.analysis.result import Result

REPO = Path(__file__).resolve().parent.parent
#: TestClient must address the app by a loopback name (the DNS-rebinding guard)
LOOPBACK = "http://127.0.0.1"


class ToyCount(Result):
    """The toy analysis's answer: how many slices the run holds."""

    slices: int
    verdict: str


def toy_count(run: Any) -> ToyCount:
    n = len(run.slices)
    return ToyCount(n, f"Toy: {n} slices were read.")


def toy_table(console: Any, number: int, value: ToyCount, run: dict[str, Any]) -> None:
    console.print(f"{number}. Toy table: {value.slices} slices of {run['path']}", highlight=False)


@pytest.fixture
def toy() -> Iterator[registry.Analysis]:
    """The toy analysis, registered for one test and removed again."""
    entry = registry.register(
        registry.Analysis(
            name="toy",
            function=toy_count,
            result=ToyCount,
            summary="Toy: how many slices the run holds",
            verdict_order=-30,  # before the stalls: the very first verdict
            table=toy_table,
        )
    )
    try:
        yield entry
    finally:
        registry.unregister("toy")
    assert "toy" not in {a.name for a in registry.analyses()}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("served")
    write_synthetic_run(
        str(root / "run"), SyntheticSpec(ranks=2, steps=6, late_rank=1, late_us=3000.0)
    )
    return root / "run"


def test_a_registered_analysis_is_in_the_report_its_json_and_its_verdicts(
    toy: registry.Analysis, run_dir: Path
) -> None:
    run = load_run(str(run_dir), cache=False)
    report = analyze(run)
    expected = toy_count(run)
    assert expected.slices > 0
    assert report.toy == expected  # the attribute of its name
    data = json.loads(json.dumps(report.to_dict()))
    assert data["toy"] == expected.to_dict()
    assert data["verdicts"][0] == expected.verdict
    # the others are still there, in their places
    assert data["verdicts"][1:] == [v for v in data["verdicts"] if v != expected.verdict]
    assert report.stragglers.straggler == 1 and data["stragglers"]["straggler"] == 1


def test_a_registered_analysis_is_in_analyze_json(
    toy: registry.Analysis, run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from hvdprof.cli import main

    assert main(["analyze", "--json", "--no-cache", str(run_dir)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["toy"]["slices"] == toy_count(load_run(str(run_dir), cache=False)).slices
    assert data["verdicts"][0].startswith("Toy: ")


def test_a_registered_analysis_has_its_route_and_openapi_entry(
    toy: registry.Analysis, run_dir: Path
) -> None:
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from hvdprof.dashboard.app import create_app
    from hvdprof.dashboard.settings import DashboardSettings

    expected = toy_count(load_run(str(run_dir), cache=False)).to_dict()
    app = create_app(DashboardSettings(run_dir.parent))
    with TestClient(app, raise_server_exceptions=False, base_url=LOOPBACK) as c:
        body = c.get("/api/analysis/toy", params={"run": "run"}).json()
        assert body["data"] == expected, body
        report = c.get("/api/analysis/report", params={"run": "run"}).json()
        assert report["data"]["toy"] == expected
        openapi = c.get("/openapi.json").json()
        paths = openapi["paths"]
        assert paths["/api/analysis/toy"]["get"]["summary"] == toy.summary
        # its response model is typed by the result's own fields, in the report's too
        ok = paths["/api/analysis/toy"]["get"]["responses"]["200"]["content"]
        model = ok["application/json"]["schema"]["$ref"].rpartition("/")[2]
        components = openapi["components"]["schemas"]
        assert model == "ToySection"
        data = components[model]["properties"]["data"]["anyOf"][0]
        assert _toy_typed(data)
        report_model = components["ReportSection"]["properties"]["data"]["anyOf"][0]
        assert _toy_typed(report_model["properties"]["toy"]["anyOf"][0])
        listed = c.get("/api/analysis").json()  # what a page loops over
        assert listed[-1] == {
            "name": "toy", "path": "/api/analysis/toy", "summary": toy.summary, "in_report": True,
        }  # fmt: skip
        assert [a["name"] for a in listed][:2] == ["breakdown", "stragglers"]
    registry.unregister("toy")  # gone again: an app made now has no such route
    with TestClient(
        create_app(DashboardSettings(run_dir.parent)),
        raise_server_exceptions=False,
        base_url=LOOPBACK,
    ) as c:
        assert c.get("/api/analysis/toy", params={"run": "run"}).status_code == 404
        assert "/api/analysis/toy" not in c.get("/openapi.json").json()["paths"]


def _toy_typed(data: dict[str, Any]) -> bool:
    """``data`` is ToyCount's schema: its two fields, typed, always written, nothing else."""
    return (
        data["title"] == "ToyCount"
        and data["properties"] == {"slices": {"type": "integer"}, "verdict": {"type": "string"}}
        and sorted(data["required"]) == ["slices", "verdict"]
        and data["additionalProperties"] is False
    )


def test_a_registered_analysis_is_in_the_published_schema(
    toy: registry.Analysis, run_dir: Path
) -> None:
    published = schema.json_schema()
    data = analyze(load_run(str(run_dir), cache=False)).to_dict()
    assert published["version"] == SCHEMA_VERSION == data["schema"]
    defs = published["$defs"]
    assert published["x-analyses"]["toy"] == {"$ref": "#/$defs/ToyCount"}
    assert _toy_typed(defs["ToyCount"])
    report = defs["Report"]
    assert report["properties"]["toy"] == {
        "anyOf": [{"$ref": "#/$defs/ToyCount"}, {"type": "null"}]
    }  # fmt: skip
    assert "toy" in report["required"]
    # printed by the documented command, the toy included while it is registered
    from hvdprof.analysis.schema import main

    assert main([]) == 0


def test_the_published_schema_is_the_generated_one() -> None:
    # docs/analysis-schema.json is `python -m hvdprof.analysis.schema`: regenerate it with
    # that command when a result type changes
    out = subprocess.run(
        [sys.executable, "-m", "hvdprof.analysis.schema"],
        capture_output=True, text=True, cwd=REPO, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    published = (REPO / "docs" / "analysis-schema.json").read_text()
    assert json.loads(out.stdout) == json.loads(published), (
        "docs/analysis-schema.json is stale: python -m hvdprof.analysis.schema > "
        "docs/analysis-schema.json"
    )


def test_every_golden_report_is_valid_under_the_published_schema() -> None:
    # the JSON the golden files pin (every fixture in tests/data) against the schema: all
    # keys present, typed as declared, and none that the result types do not declare
    import jsonschema  # a dev dependency (pyproject.toml)

    validator = jsonschema.Draft202012Validator(schema.json_schema())
    goldens = sorted((REPO / "tests" / "data" / "golden").glob("*.json"))
    assert len(goldens) >= 5
    for path in goldens:
        report = json.loads(path.read_text())["json"]
        errors = [f"{list(e.path)}: {e.message}" for e in validator.iter_errors(report)]
        assert not errors, (path.name, errors[:5])
    # and the schema is strict: a key no result declares is refused
    report = json.loads((REPO / "tests" / "data" / "golden" / "hvdprof-demo.json").read_text())
    report = report["json"]
    assert validator.is_valid(report)
    report["breakdown"]["ranks"][0]["invented"] = 1
    assert not validator.is_valid(report)


def test_every_route_answers_what_its_openapi_model_declares(run_dir: Path) -> None:
    # /docs is right by construction: each route's data, from a real run, is valid under
    # the schema its response model declares (generated from the result type)
    pytest.importorskip("fastapi")
    import jsonschema  # a dev dependency (pyproject.toml)
    from fastapi.testclient import TestClient

    from hvdprof.dashboard.app import create_app
    from hvdprof.dashboard.settings import DashboardSettings

    app = create_app(DashboardSettings(run_dir.parent))
    with TestClient(app, raise_server_exceptions=False, base_url=LOOPBACK) as c:
        openapi = c.get("/openapi.json").json()
        components = openapi["components"]["schemas"]
        names = ["report", *(a["name"] for a in c.get("/api/analysis").json())]
        for name in names:
            ok = openapi["paths"][f"/api/analysis/{name}"]["get"]["responses"]["200"]
            model = ok["content"]["application/json"]["schema"]["$ref"].rpartition("/")[2]
            declared = components[model]["properties"]["data"]["anyOf"][0]
            assert declared["additionalProperties"] is False, name  # typed, not a dict
            body = c.get(f"/api/analysis/{name}", params={"run": "run"}).json()
            assert body["data"] is not None, (name, body["notices"])
            errors = list(jsonschema.Draft202012Validator(declared).iter_errors(body["data"]))
            assert not errors, (name, [e.message for e in errors[:3]])
        assert "stragglers" in names and "surrogate" in names
        # the comparison and the timeline window: their result types too
        for model, title in (
            ("CompareResponse", "RunDiff"),
            ("TimelineWindowResponse", "TimelineWindow"),
        ):
            declared = components[model]["properties"]["data"]["anyOf"][0]
            assert declared["title"] == title and declared["additionalProperties"] is False


def test_a_plugin_result_with_its_own_to_dict_is_reported_as_it_writes_it(
    run_dir: Path,
) -> None:
    # a plugin written before the typed results: a dataclass with a to_dict() of its own
    # keeps its JSON, and the schema declares only an object (its fields are not its keys)
    @dataclass
    class Legacy:
        slices: int

        def to_dict(self) -> dict[str, Any]:
            return {"n": self.slices}

    registry.register(
        registry.Analysis("legacy", lambda run: Legacy(len(run.slices)), Legacy, "Legacy",
                          verdict_order=90)
    )  # fmt: skip
    try:
        run = load_run(str(run_dir), cache=False)
        assert analyze(run).to_dict()["legacy"] == {"n": len(run.slices)}
        published = schema.json_schema()
        assert published["x-analyses"]["legacy"] == {"type": "object"}
        assert "Legacy" not in published["$defs"]
    finally:
        registry.unregister("legacy")


def test_a_registered_analysis_prints_its_table_numbered_by_its_place(
    toy: registry.Analysis,
    run_dir: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    run = load_run(str(run_dir), cache=False)
    print_report(analyze(run))
    out = capsys.readouterr().out
    number = [a.name for a in registry.in_report() if a.table is not None].index("toy") + 1
    assert number == 10  # after the built-in nine with a table
    assert f"{number}. Toy table: {len(run.slices)} slices of {run_dir}" in out
    assert " 1. Toy: " in out  # the first verdict
    assert out.index("1. Where the time goes") < out.index("2. Who is late") < out.index("10. Toy")


def test_stall_and_divergence_tables_when_they_have_something_to_say(
    run_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from hvdprof.analysis.divergence import DivergenceReport
    from hvdprof.analysis.stalls import Stall, StallReport

    monkeypatch.setenv("COLUMNS", "200")
    report = analyze(load_run(str(run_dir), cache=False))
    print_report(report)
    quiet = capsys.readouterr().out
    assert "Stalls:" not in quiet and "Divergence:" not in quiet  # nothing to say
    long = Stall(1.0, 2e7, [1], ["grad.a", "grad.b", "grad.c", "grad.d"], 20.1, 3, reports=4)
    long.where = {1: "load_batch (train.py:4) <- main (train.py:9)"}
    short = Stall(1.0, 5e6, [0, 1], ["grad.z"], 5.0, -1, shutdown=True)
    short.where, short.collective = {0: "gather (train.py:7)"}, {0: "allgather"}
    report.sections["stalls"] = StallReport([short, long])
    report.sections["divergence"] = DivergenceReport(
        step=7, ranks=[1], weights=["2.bias"], weights_total=1, seen_by=[0, 1]
    )
    print_report(report)
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert any("8. Stalls: who kept the job waiting" in line for line in lines), out
    assert out.index("load_batch (train.py:4)") < out.index("gather (train.py:7)")  # longest first
    assert "main (train.py:9)" not in out  # the first frame only
    assert "grad.a, grad.b, grad.c and 1 more" in out
    assert "waiting in allgather (a mismatch), called from gather (train.py:7)" in out
    assert "5.0 (job ended)" in out
    assert any("9. Divergence" in line for line in lines), out
    row = next(line for line in lines if "first step that differed" in line)
    assert "7" in row
    assert any("weights" in line and "2.bias" in line for line in lines)


def test_every_builtin_entry_names_a_function_returning_its_result_type(run_dir: Path) -> None:
    run = load_run(str(run_dir), cache=False)
    names = [a.name for a in registry.analyses()]
    assert names[:7] == [
        "breakdown",
        "stragglers",
        "fusion",
        "bandwidth",
        "overlap",
        "autotune",
        "gpu",
    ]  # fmt: skip  (their tables keep the numbers 1-7 they have always had)
    assert {"stalls", "divergence", "process_sets", "surrogate"} <= set(names)
    for a in registry.analyses():
        args = ([],) if a.kineto else ()
        result = a.compute(run, *args)
        assert isinstance(result, registry.resolve(a.result)), a.name
        assert isinstance(result.to_dict(), dict), a.name
        if a.table is not None:
            assert callable(registry.resolve(a.table)), a.name
    data = analyze(run).to_dict()
    assert [a.name for a in registry.in_report()] == [k for k in data if k in names]
    assert data["overlap"] is None  # no torch.profiler traces given
    assert isinstance(data["stalls"], list) and isinstance(data["process_sets"], list)
    assert "surrogate" not in data  # the API's alone


def test_each_builtin_module_declares_its_own_analysis() -> None:
    # one module per question owns its registration: the registry lists modules, not entries
    import importlib

    builtin = registry.analyses()[: len(registry.BUILTIN_MODULES)]
    for module, analysis in zip(registry.BUILTIN_MODULES, builtin, strict=True):
        assert importlib.import_module(module).ANALYSIS is analysis, module
        assert registry.module_of(analysis.function) == module
        assert registry.module_of(analysis.result) == module
    source = (REPO / "hvdprof" / "analysis" / "registry.py").read_text()
    assert "Analysis(" not in source.partition("class Analysis")[2]  # no entry kept there


def test_exports_and_type_checking_imports_cover_the_registry() -> None:
    import hvdprof.analysis as library

    exported = registry.exports()
    assert {"divergence_report", "gpu_report", "autotune_surface", "DivergenceReport"} <= set(
        exported
    )
    for name, module in exported.items():
        assert name in library.__all__, name
        assert getattr(library, name) is getattr(__import__(module, fromlist=[name]), name)
    tree = ast.parse((REPO / "hvdprof" / "analysis" / "__init__.py").read_text())
    typed = {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING"
        for sub in ast.walk(node)
        if isinstance(sub, ast.ImportFrom)
        for alias in sub.names
    }
    assert set(exported) <= typed, sorted(set(exported) - typed)


def test_api_routes_are_the_registry_s() -> None:
    pytest.importorskip("fastapi")
    from hvdprof.dashboard.routes.analyses import ANALYSES

    assert list(ANALYSES) == ["report", *(a.name for a in registry.analyses() if a.route)]
    # the paths the page has always asked for, and the new ones
    for name in ("report", "breakdown", "stragglers", "fusion", "bandwidth", "autotune",
                 "surrogate", "stalls", "process_sets", "gpu", "divergence"):  # fmt: skip
        assert name in ANALYSES, name


def test_docs_name_every_analysis_function() -> None:
    text = (REPO / "docs" / "analysis.md").read_text()
    missing = [name for name in registry.function_names() if name not in text]
    assert not missing, f"docs/analysis.md does not describe {missing}"


def test_importing_the_package_loads_no_analysis() -> None:
    # ``hvdprof run`` registers ``analyze``: the registry must not cost it numpy
    # nor look for the analyses: each module declares its own, found on first use
    code = (
        "import sys, hvdprof.analysis, hvdprof.analysis.registry as r;"
        "import hvdprof.analysis.cli;"
        "print(sorted(m for m in ['numpy', *r.BUILTIN_MODULES] if m in sys.modules), r._found)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[] False"


def test_a_name_already_taken_or_reserved_is_refused() -> None:
    entry = registry.get("breakdown")
    with pytest.raises(ValueError, match="already registered"):
        registry.register(entry)
    for name in ("report", "verdicts", "not a name"):
        with pytest.raises(ValueError, match="reserved"):
            registry.register(registry.Analysis(name, toy_count, ToyCount, "x"))


class ToyShare(Result):
    """An answer made from another analysis's: its count, halved."""

    half: float
    verdict: str


def toy_share(run: Any, *, toy: ToyCount | None = None) -> ToyShare:
    """Without ``toy`` (a route's call, on the run alone) it counts for itself."""
    n = toy.slices if toy is not None else len(run.slices)
    return ToyShare(n / 2, f"Toy share: half of {n}.")


def test_an_analysis_is_given_the_answers_it_needs_computed_first(run_dir: Path) -> None:
    # the need is not in the report (no verdict_order) yet is computed for the one needing it
    calls: list[str] = []

    def counted(run: Any) -> ToyCount:
        calls.append("toy")
        return ToyCount(7, "")

    registry.register(registry.Analysis("toy", counted, ToyCount, "Toy"))
    try:
        registry.register(
            registry.Analysis("share", toy_share, ToyShare, "Share", verdict_order=90,
                              needs=("toy",))
        )  # fmt: skip
        try:
            order = [a.name for a in registry.computing_order(registry.in_report())]
            assert order.index("toy") == order.index("share") - 1
            assert order.index("process_sets") < order.index("stragglers")  # a built-in need
            data = analyze(load_run(str(run_dir), cache=False)).to_dict()
            assert data["share"] == {"half": 3.5, "verdict": "Toy share: half of 7."}
            assert "toy" not in data and calls == ["toy"]
        finally:
            registry.unregister("share")
    finally:
        registry.unregister("toy")


def test_a_need_no_analysis_answers_or_a_cycle_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="needs 'nowhere', which no analysis is named"):
        registry.register(registry.Analysis("lost", toy_count, ToyCount, "x", needs=("nowhere",)))
    assert "lost" not in {a.name for a in registry.analyses()}  # refused, not half-added
    a = registry.Analysis("ping", toy_count, ToyCount, "x", needs=("pong",))
    b = registry.Analysis("pong", toy_count, ToyCount, "x", needs=("ping",))
    monkeypatch.setitem(registry._REGISTERED, "ping", a)
    monkeypatch.setitem(registry._REGISTERED, "pong", b)
    with pytest.raises(ValueError, match="need each other: ping -> pong -> ping"):
        registry.computing_order([a])


def test_the_straggler_answer_defers_to_the_process_sets_it_needs(tmp_path: Path) -> None:
    # every op ran in a process set ({0, 1} and {2, 3}): no job-wide op to judge, so the
    # straggler verdict says each set's is judged below; declared in stragglers.py (needs),
    # not patched by the report. Its route, on the run alone, keeps the plain answer.
    from hvdprof.analysis.stragglers import JUDGED_IN_SETS, find_stragglers

    assert registry.get("stragglers").needs == ("process_sets",)
    write_synthetic_run(
        str(tmp_path / "run"), SyntheticSpec(ranks=4, steps=6, late_rank=3, late_us=3000.0)
    )
    run = load_run(str(tmp_path / "run"), cache=False)
    n = len(run.tensors)
    run.tensors = [*run.tensors, *(f"{t}@set1" for t in run.tensors),
                   *(f"{t}@set2" for t in run.tensors)]  # fmt: skip
    on_tensor = run.slices.tensor >= 0
    run.slices.tensor[on_tensor & (run.slices.rank <= 1)] += n
    run.slices.tensor[on_tensor & (run.slices.rank >= 2)] += 2 * n
    alone = find_stragglers(run)
    assert alone.ops_with_marks == 0 and alone.verdict != JUDGED_IN_SETS
    report = analyze(run)
    assert report.stragglers.verdict == JUDGED_IN_SETS
    assert [s.process_set for s in report.process_sets] == [1, 2]
    first = report.verdicts.index(JUDGED_IN_SETS)
    assert report.verdicts[first + 2].startswith("Process set 2 (ranks 2, 3): rank 3 is")
    # a run without sets keeps its own verdict
    plain = analyze(load_run(str(tmp_path / "run"), cache=False))
    assert plain.stragglers.verdict != JUDGED_IN_SETS and plain.stragglers.straggler == 3
