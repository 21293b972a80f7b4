"""The columnar cache beside a trace and the parse in worker processes: reused while a file
is unchanged, continued from where it stopped when the file grew by appending, ignored
when the file was rewritten or the cache is damaged, and never hiding what could not be
read (truncated ends, corrupt lines)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from synthetic_runs import SyntheticSpec, write_synthetic_run

from hvdprof.analysis import find_stragglers, load_run
from hvdprof.trace import loader as loader_mod
from hvdprof.trace.loader import RunLoader
from hvdprof.trace.model import Run


def synth(tmp_path: Path, name: str = "run", **kw: Any) -> Path:
    directory = tmp_path / name
    spec = {"ranks": 2, "steps": 6, "late_rank": 1, "late_us": 3000.0, **kw}
    write_synthetic_run(str(directory), SyntheticSpec(**spec))
    return directory


def decoded(run: Run) -> dict[str, list[Any]]:
    """Every column with its strings spelled out (codes differ between loads)."""
    out: dict[str, list[Any]] = {}
    tables = {"tensor": run.tensors, "name": run.names, "backend": run.backends}
    tables["dtype"] = run.dtypes
    for col, values in run.slices.columns().items():
        table = tables.get(col)
        out["s_" + col] = (
            [table[c] if c >= 0 else None for c in values.tolist()] if table else values.tolist()
        )
    for col, values in run.marks.columns().items():
        out["m_" + col] = (
            [run.tensors[c] if c >= 0 else None for c in values.tolist()]
            if col == "tensor"
            else values.tolist()
        )
    return out


def assert_same(a: Run, b: Run) -> None:
    da, db = decoded(a), decoded(b)
    for col in da:
        assert da[col] == db[col], col
    assert a.events == b.events
    assert a.complete == b.complete
    assert sorted(map(str, a.problems)) == sorted(map(str, b.problems))
    assert [s.ts_us for s in a.autotune_samples] == [s.ts_us for s in b.autotune_samples]


def cut_mid_line(path: Path, fraction: float) -> bytes:
    """Leave ``path`` as a writer still in the middle of it would: half a last line."""
    data = path.read_bytes()
    at = data.rfind(b"\n", 0, int(len(data) * fraction)) + 1
    path.write_bytes(data[:at] + data[at : at + 25])
    return data


def verdicts(directory: Path) -> list[str | None]:
    return [s.load_cache() for s in RunLoader(str(directory)).sources]


def test_growing_file_continues_from_the_cache(tmp_path: Path) -> None:
    d = synth(tmp_path, autotune_samples=3)
    path = d / "rank.0.json"
    data = cut_mid_line(path, 0.4)
    first = load_run(d)
    assert not first.complete[0]
    assert any("incomplete last event" in p.reason for p in first.problems)
    assert verdicts(d) == ["current", "current"]  # a file still being written is cached too

    path.write_bytes(data[: int(len(data) * 0.7)])  # it grew (again cut mid-line)
    assert verdicts(d)[0] == "resume"
    resumed = load_run(d)
    assert_same(resumed, load_run(d, cache=False))

    path.write_bytes(data)  # finished
    assert verdicts(d)[0] == "resume"
    done = load_run(d)
    reference = load_run(d, cache=False)
    assert_same(done, reference)
    assert done.clean and find_stragglers(done).straggler == 1
    assert verdicts(d) == ["current", "current"]


def test_rewritten_file_is_read_again_not_continued(tmp_path: Path) -> None:
    d = synth(tmp_path)
    path = d / "rank.0.json"
    data = cut_mid_line(path, 0.5)
    load_run(d)
    # the same job restarted: a new file, longer, whose earlier bytes differ
    other = synth(tmp_path, "other", late_us=2500.0)
    path.write_bytes((other / "rank.0.json").read_bytes())
    assert len(path.read_bytes()) > len(data) // 2
    assert verdicts(d)[0] is None
    assert_same(load_run(d), load_run(d, cache=False))


def test_damaged_cache_is_ignored_and_replaced(tmp_path: Path) -> None:
    d = synth(tmp_path)
    reference = load_run(d, cache=False)
    load_run(d)
    cache = d / ".hvdprof-cache" / "rank.1.json.npz"
    cache.write_bytes(cache.read_bytes()[:1000])  # cut short
    assert verdicts(d) == ["current", None]
    assert_same(load_run(d), reference)
    assert verdicts(d) == ["current", "current"]  # written again


def test_cache_keeps_what_could_not_be_read(tmp_path: Path) -> None:
    d = synth(tmp_path)
    path = d / "rank.1.json"
    lines = path.read_bytes().split(b"\n")
    lines[40] = b'{"name":"QUEUE","ph":"X","ts":'  # a corrupt line in the middle
    path.write_bytes(b"\n".join(lines[:-3]))  # and no closing bracket
    first = load_run(d)
    cached = load_run(d)
    assert verdicts(d) == ["current", "current"]
    assert_same(cached, first)
    reasons = [(p.where, p.reason) for p in cached.problems]
    assert any(w == "line 41" and "invalid JSON" in r for w, r in reasons), reasons
    assert any(w.startswith("end") for w, _ in reasons), reasons
    assert not cached.clean


@pytest.mark.parametrize("cache", [True, False])
def test_worker_processes_then_refresh_reads_only_what_grew(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cache: bool
) -> None:
    d = synth(tmp_path, ranks=3)
    full = {p.name: p.read_bytes() for p in d.glob("rank.*.json")}
    for name, data in full.items():
        (d / name).write_bytes(data[: data.rfind(b"\n", 0, len(data) // 2) + 1])
    monkeypatch.setattr(loader_mod, "PARALLEL_MIN_BYTES", 0)
    loader = RunLoader(str(d), cache=cache, workers=2)
    run = loader.load()
    readers = [s.reader for s in loader.sources]  # hvdprof's: HvdprofFileReader
    assert all(r.parser is not None and r.offset > 0 for r in readers)
    offsets = [r.offset for r in readers]
    parser = readers[2].parser  # a full re-read would start a new one
    (d / "rank.2.json").write_bytes(full["rank.2.json"])
    assert run.refresh() is True
    # the grown file was continued from its offset; the others were not touched
    assert [r.offset for r in readers][:2] == offsets[:2]
    assert loader.sources[2].complete and readers[2].offset > offsets[2]
    assert readers[2].parser is parser
    for name in ("rank.0.json", "rank.1.json"):
        (d / name).write_bytes(full[name])
    assert run.refresh() is True
    assert_same(run, load_run(d, cache=False))
    if cache:  # finished while watched: the cache now describes the finished files
        assert verdicts(d) == ["current", "current", "current"]


def test_start_then_finish_equals_load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = synth(tmp_path, ranks=2)
    monkeypatch.setattr(loader_mod, "PARALLEL_MIN_BYTES", 0)
    loader = RunLoader(str(d), cache=False, workers=2)
    loader.start()  # the dashboard does this before importing its web stack
    run = loader.finish()
    assert_same(run, load_run(d, cache=False, workers=1))
    assert np.isfinite(run.t0_us) and run.t1_us > run.t0_us


def test_grown_files_continue_here_instead_of_in_workers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    d = synth(tmp_path, ranks=2)
    full = {p: cut_mid_line(p, 0.5) for p in d.glob("rank.*.json")}
    monkeypatch.setattr(loader_mod, "PARALLEL_MIN_BYTES", 0)
    RunLoader(str(d), workers=2).load()  # parsed in workers, which write the caches
    assert verdicts(d) == ["current", "current"]
    for path, data in full.items():
        path.write_bytes(data)
    loader = RunLoader(str(d), workers=2)
    loader.start()
    assert loader._pending is not None and not loader._pending[1]  # no file sent to a worker
    assert_same(loader.finish(), load_run(d, cache=False))
