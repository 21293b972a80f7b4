"""The trace layer (``hvdprof/trace/``) reads every format one way.

- hvdprof's own format is a member of the registry like the others: its ``read`` gives
  what ``load_run`` gives, and the reader that continues a growing file ends where one
  whole read ends;
- what a run can answer is its :class:`Capabilities`, set by its format's reader;
- a rank in a file name is read by one rule (``RANK_IN_NAME``) by every reader and by
  ``hvdprof timeline merge``, in any case.
"""

from __future__ import annotations

import ast
import gzip
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from hvdprof.analysis import load_run
from hvdprof.analysis.overlap import overlap_report
from hvdprof.timeline.merge import kineto_rank
from hvdprof.trace import formats
from hvdprof.trace.chrome_json import Trace, TraceDirectory
from hvdprof.trace.columns import Tables
from hvdprof.trace.hvdprof_reader import HvdprofFileReader
from hvdprof.trace.kineto_format import sniff_rank
from hvdprof.trace.manifest import RANK_IN_NAME
from hvdprof.trace.model import SLICE_COLUMNS, Capabilities

DATA = Path(__file__).resolve().parent / "data"
ROOT = Path(__file__).resolve().parents[1]

#: one fixture of each built-in format: (path, format)
FIXTURES = [
    (DATA / "hvdprof-demo", "hvdprof"),
    (DATA / "kineto-hta", "kineto"),
    (DATA / "horovod" / "horovod-timeline.json", "horovod"),
]


@pytest.mark.parametrize(("path", "name"), FIXTURES, ids=[n for _, n in FIXTURES])
def test_every_format_reads_a_file_through_the_registry(path: Path, name: str) -> None:
    found = (
        formats.detect_directory(str(path), sorted(p.name for p in path.iterdir()))
        if path.is_dir()
        else formats.detect_file(str(path))
    )
    assert found.format == name
    fmt = formats.format_named(name)
    run = load_run(path, cache=False)
    assert run.source_format == name
    rows = 0
    for file in found.files:
        got = fmt.read(file.path, file.rank, Tables(), len(found.files))
        assert got.complete, got.problems
        assert got.events > 0 and got.columns.rows > 0
        rows += got.columns.rows
    # the run: these rows, and what the format's run-level pass adds (torch.profiler's
    # splits a collective's waiting from its transfer)
    assert rows == len(run.slices) or (name == "kineto" and 0 < rows < len(run.slices))


def test_hvdprof_format_read_equals_the_reader_that_continues(tmp_path: Path) -> None:
    # the registry's read and the loader's growing-file reader are one reader: a file
    # read in two goes (cut at a line, then grown) gives the columns of one whole read
    with gzip.open(DATA / "hvdprof-demo" / "rank.1.json.gz", "rb") as f:
        data = f.read()
    path = tmp_path / "rank.1.json"
    cut = data.rfind(b"\n", 0, len(data) // 2) + 1
    path.write_bytes(data[:cut])
    tables = Tables()
    reader = HvdprofFileReader(str(path), 1, tables)
    reader.read(cut, None)
    assert not reader.got.complete and reader.offset == cut
    path.write_bytes(data)
    assert reader.continues(len(data))
    reader.read(len(data), None)
    assert reader.got.complete and reader.offset == len(data)
    whole_tables = Tables()
    whole = formats.format_named("hvdprof").read(str(path), 1, whole_tables, 1)
    assert whole.events == reader.got.events and whole.problems == reader.got.problems
    a, b = reader.got.columns.slices(), whole.columns.slices()
    assert set(a) == set(SLICE_COLUMNS)
    for key in SLICE_COLUMNS:
        assert np.array_equal(a[key], b[key]), key
    assert tables.names.items == whole_tables.names.items


def test_each_registered_format_has_a_fixture_read_above() -> None:
    # (a registry with an escape hatch, hvdprof's read raising NotImplementedError while
    # the loader read it its own way, is what the trace layer replaced)
    assert sorted(f.name for f in formats.FORMATS) == sorted(n for _, n in FIXTURES)


@pytest.mark.parametrize(
    ("path", "capabilities"),
    [
        (DATA / "hvdprof-demo", Capabilities()),
        (
            DATA / "kineto-hta",
            Capabilities(
                readiness_matched_across_files=True,
                ranks_may_be_a_subset=True,
                steps_sampled=True,
            ),
        ),
        (
            DATA / "horovod" / "horovod-timeline.json",
            Capabilities(default_fusion_threshold_bytes=64 << 20),
        ),
    ],
    ids=["hvdprof", "kineto", "horovod"],
)
def test_the_reader_says_what_the_run_can_answer(path: Path, capabilities: Capabilities) -> None:
    assert load_run(path, cache=False).capabilities == capabilities


@pytest.mark.parametrize(
    ("name", "rank"),
    [
        ("rank3.json", 3),
        ("trace.Rank-12.json", 12),
        ("RANK_7.pt.trace.json", 7),
        ("worker1.pt.trace.json.gz", 1),
        ("Worker.4.json", 4),
        ("sampled_rank-0.json.gz", 0),
        ("host_1234.pt.trace.json", None),
        ("ranking.json", None),
    ],
)
def test_a_rank_in_a_file_name_is_read_in_any_case(name: str, rank: int | None) -> None:
    m = RANK_IN_NAME.search(name)
    assert (int(m.group(1)) if m else None) == rank


def test_the_rank_rule_is_defined_once() -> None:
    # a second copy drifted before: one was case-sensitive, one not, one knew "worker"
    spelt = []
    for path in sorted((ROOT / "hvdprof").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and "rank" in node.value
                and "[._-]" in node.value
            ):
                spelt.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert len(spelt) == 1 and spelt[0].startswith("hvdprof/trace/manifest.py:"), spelt


def test_every_reader_takes_a_rank_from_a_name_alike(tmp_path: Path) -> None:
    # the same nameless torch.profiler trace (no distributedInfo) given to the run's
    # Kineto reader, to merge and to the overlap question is the same rank everywhere
    src = DATA / "hvdprof-demo"
    run_dir = tmp_path / "run"
    shutil.copytree(src, run_dir)
    with gzip.open(DATA / "kineto-ddp-gloo" / "worker1.2.pt.trace.json.gz", "rb") as f:
        trace = json.loads(f.read())
    trace.pop("distributedInfo", None)
    path = tmp_path / "Trace_Worker-1.pt.trace.json"
    path.write_text(json.dumps(trace))
    assert sniff_rank(str(path), 2) == 1
    directory = TraceDirectory(str(run_dir), {0: None, 1: None})  # type: ignore[dict-item]
    assert kineto_rank(str(path), Trace(str(path), []), directory) == 1
    report = overlap_report(load_run(run_dir, cache=False), [str(path)])
    assert [r.rank for r in report.ranks] == [1]


def test_a_new_format_says_its_capabilities_and_the_analyses_follow(tmp_path: Path) -> None:
    # a format declares what its runs can answer in its own module (here: a threshold
    # its tool uses by default); the fusion analysis follows without naming the format
    from test_format_registry import ToyCsvFormat, write_toy

    from hvdprof.analysis.fusion import fusion_report

    class ToyWithDefaults(ToyCsvFormat):
        name = "toy-with-defaults"

        def finish_run(self, run, reads, tables):  # type: ignore[no-untyped-def]
            run.capabilities = Capabilities(default_fusion_threshold_bytes=3 << 20)

    write_toy(tmp_path / "toy", 0, steps=2)
    formats.register(ToyCsvFormat())
    try:
        assert fusion_report(load_run(tmp_path / "toy", cache=False)).threshold_bytes is None
    finally:
        formats.unregister("toy-csv")
    formats.register(ToyWithDefaults())
    try:
        run = load_run(tmp_path / "toy", cache=False)
        assert run.source_format == "toy-with-defaults"
        assert fusion_report(run).threshold_bytes == 3 << 20
    finally:
        formats.unregister("toy-with-defaults")
