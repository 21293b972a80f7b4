"""The per-rank manifest is read once, typed (hvdprof/trace/manifest.py): older manifests
load with their missing fields' defaults, a wrong one is one problem naming the file, the
rank and the field, and no reader takes a field out of it by hand with ``.get``."""

from __future__ import annotations

import ast
import json
import shutil
from pathlib import Path

import msgspec
import pytest

from hvdprof.analysis import analyze, load_run
from hvdprof.trace.chrome_json import load_traces
from hvdprof.trace.manifest import Manifest, read_manifest

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "tests" / "data" / "hvdprof-demo"


def _copy_demo(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    for path in DEMO.iterdir():
        if path.name.startswith(("rank.", "manifest.")):
            shutil.copy(path, run / path.name)
    return run


def _edit(path: Path, change) -> None:
    manifest = json.loads(path.read_text())
    change(manifest)
    path.write_text(json.dumps(manifest))


def test_the_fixtures_manifest_reads_whole() -> None:
    m = read_manifest(str(DEMO / "manifest.rank.1.json"))
    raw = json.loads((DEMO / "manifest.rank.1.json").read_text())
    assert (m.rank, m.size, m.hostname, m.run_id) == (1, 2, raw["hostname"], raw["run_id"])
    assert m.clock.error_ns == raw["clock"]["error_ns"] and m.clock.samples > 0
    assert len(m.clock.history) == len(raw["clock"]["history"])
    assert m.config.fusion_threshold_bytes == raw["config"]["fusion_threshold_bytes"]
    assert m.events_written == raw["events_written"] and m.closed is True


def test_an_older_manifest_loads_with_its_missing_fields_defaults(tmp_path: Path) -> None:
    # the fixtures predate negotiates_on_wait; the first manifests had no history, no
    # renderer, no clamped lanes and no config at all
    def as_first_written(manifest: dict) -> None:
        for key in ("renderer_pid", "lanes_clamped", "items_dropped", "config", "backend"):
            del manifest[key]
        del manifest["clock"]["history"]

    run = _copy_demo(tmp_path)
    for rank in (0, 1):
        _edit(run / f"manifest.rank.{rank}.json", as_first_written)
    loaded = load_run(str(run), cache=False)
    assert not loaded.problems, loaded.problems
    assert sorted(loaded.manifests) == [0, 1]
    m = loaded.manifests[1]
    assert m.negotiates_on_wait is False and m.renderer_pid is None
    assert m.clock.history == [] and m.config.cycle_time_ms is None
    assert loaded.fusion_threshold_bytes() is None
    assert analyze(loaded).verdicts


def test_a_newer_writers_extra_fields_are_ignored(tmp_path: Path) -> None:
    run = _copy_demo(tmp_path)
    _edit(run / "manifest.rank.0.json", lambda m: m.update(gpu={"model": "H200"}, later=[1]))
    loaded = load_run(str(run), cache=False)
    assert not loaded.problems, loaded.problems
    assert loaded.manifests[0].rank == 0


@pytest.mark.parametrize(
    "change, words",
    [
        (lambda m: m["clock"].update(error_ns="big"), "its 'clock.error_ns' is not an integer"),
        (lambda m: m.update(size="2"), "its 'size' is not an integer or null"),
        (lambda m: m.update(format="someone-elses"), "not an hvdprof timeline manifest"),
        (lambda m: m.update(version=99), "manifest version 99, newer than this hvdprof reads"),
    ],
)
def test_a_wrong_manifest_is_one_problem_naming_the_file_rank_and_field(
    tmp_path: Path, change, words: str
) -> None:
    run = _copy_demo(tmp_path)
    path = run / "manifest.rank.1.json"
    _edit(path, change)
    loaded = load_run(str(run), cache=False)
    problems = [p for p in loaded.problems if "manifest" in p.reason]
    assert len(problems) == 1, loaded.problems
    assert words in problems[0].reason and "rank 1" in problems[0].reason
    assert str(path) in problems[0].reason
    assert sorted(loaded.manifests) == [0]  # the other rank's manifest still counts
    assert analyze(loaded).verdicts
    # the raw reader (merging) says the same
    traces = load_traces(str(run))
    assert any(words in p and "rank 1" in p for p in traces.problems), traces.problems
    assert traces.ranks[1].manifest is None and traces.ranks[0].manifest is not None


def test_the_manifest_schema_is_the_writers() -> None:
    # every field the writer (hvdprof/timeline/sink.py) puts in the manifest is typed
    written = set()
    sink = ast.parse((ROOT / "hvdprof" / "timeline" / "sink.py").read_text())
    for node in ast.walk(sink):
        if isinstance(node, ast.FunctionDef) and node.name == "manifest":
            ret = next(n for n in ast.walk(node) if isinstance(n, ast.Return))
            assert isinstance(ret.value, ast.Dict)
            written = {k.value for k in ret.value.keys if isinstance(k, ast.Constant)}
    assert len(written) > 20  # the writer's dict was found
    typed = set(Manifest.__struct_fields__)
    assert written == typed, (
        f"written, not typed: {written - typed}; typed, not written: {typed - written}"
    )
    assert msgspec.json.schema(Manifest)  # a schema can be published from it


def test_no_reader_takes_a_manifest_field_by_hand() -> None:
    # a field read with .get() is a second copy of the schema, guarded (or not) against a
    # string where an object belongs, differently in each module: read the typed Manifest
    fields = set(Manifest.__struct_fields__) | {"offset_ns", "error_ns", "samples"}
    found = []
    for sub in ("trace", "analysis", "dashboard"):
        for path in sorted((ROOT / "hvdprof" / sub).rglob("*.py")):
            text = path.read_text()
            for node in ast.walk(ast.parse(text)):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "get"
                    and node.args
                    and isinstance(node.args[0], ast.Constant)
                    and node.args[0].value in fields
                    and "manifest" in (ast.get_source_segment(text, node.func.value) or "")
                ):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not found, "read hvdprof.trace.manifest.Manifest's attributes:\n" + "\n".join(found)
