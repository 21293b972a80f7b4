"""Cases the hostile-input fuzzer found (seed 4848), each reduced to the edit that broke a
reader: one line naming the problem, never a traceback."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

from hvdprof.analysis import analyze, load_run

DEMO = Path(__file__).parent / "data" / "hvdprof-demo"


def _copy_demo(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    for path in DEMO.iterdir():
        if path.name.startswith(("rank.", "manifest.")):
            shutil.copy(path, run / path.name)
    return run


def test_a_manifest_whose_config_is_not_an_object_is_a_problem_not_a_crash(tmp_path):
    # fuzz-4848-00396: the straggler analysis read manifest["config"].get(...) of a string
    run = _copy_demo(tmp_path)
    path = run / "manifest.rank.1.json"
    manifest = json.loads(path.read_text())
    manifest["config"] = "fused"
    path.write_text(json.dumps(manifest))
    loaded = load_run(str(run), cache=False)
    assert any("'config' is not an object" in p.reason for p in loaded.problems)
    assert analyze(loaded).verdicts


def test_a_readiness_mark_naming_no_rank_keeps_the_columns_aligned(tmp_path):
    # fuzz-4848-00976: a readiness key that is not a number once grew one column and not
    # the others ("column ts_us has 393 rows, expected 394")
    run = _copy_demo(tmp_path)
    path = run / "rank.1.json.gz"
    text = gzip.decompress(path.read_bytes()).decode()
    first = text.index('"ready_us":{"1":')
    text = text[:first] + '"ready_us":{"one":' + text[first + len('"ready_us":{"1":') :]
    path.write_bytes(gzip.compress(text.encode()))
    loaded = load_run(str(run), cache=False)
    assert len(loaded.marks) > 0
    assert analyze(loaded).verdicts


def _analyzed_with_huge_slice(tmp_path, slice_name):
    """The demo run with rank 1's first ``slice_name`` lasting 1.7e308 us, loaded and
    analyzed with numpy's RuntimeWarnings as errors."""
    import warnings

    run = _copy_demo(tmp_path)
    path = run / "rank.1.json.gz"
    text = gzip.decompress(path.read_bytes()).decode()
    at = text.index(f'"name":"{slice_name}"')
    dur = text.index('"dur":', at) + len('"dur":')
    end = text.index(",", dur)
    path.write_bytes(gzip.compress((text[:dur] + "1.7e308" + text[end:]).encode()))
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        loaded = load_run(str(run), cache=False)
        report = analyze(loaded)
    return loaded, report


def test_a_slice_lasting_1e308_us_makes_no_numpy_warning(tmp_path):
    # fuzz-4848-00016, re-run with numpy's warnings as errors: a QUEUE of "dur": 1.7e308
    # overflowed the breakdown's sort key ("RuntimeWarning: overflow encountered in add",
    # intervals.py) on stderr, on every analyze and diff
    loaded, report = _analyzed_with_huge_slice(tmp_path, "QUEUE")
    assert report.verdicts and loaded.ranks == [0, 1]


def test_an_op_slice_lasting_1e308_us_is_left_out_and_said(tmp_path):
    # fuzz-4848-00013, re-run with numpy's warnings as errors: an op slice of "dur":
    # 1.7e308 in hvdprof's own format overflowed the straggler statistics ("overflow
    # encountered in square"); the Horovod and Kineto readers already left such times out
    loaded, report = _analyzed_with_huge_slice(tmp_path, "ALLREDUCE")
    assert report.verdicts and loaded.ranks == [0, 1]
    assert any("1 slice(s) with a start or duration" in p.reason for p in loaded.problems)
    assert float(loaded.slices.dur_us.max()) < 1e17
