"""Every rank's timeline of a Ray job, gathered into one directory on the driver's machine.

Each actor records into a directory on its own node (``RayWorker.stage_timeline``) and
ships its files back when the executor shuts down (a dead actor's files are read from
its directory when it ran on the driver's node), so ``hvdprof analyze DIR`` and the
dashboard read a Ray job as they read one of ``hvdprof run``: ``rank.<r>.*`` files (their
manifests name each rank's host), plus ``ray.json``, where each rank ran in Ray's terms.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path

from hvdprof.config import horovod_timeline_paths, name_of
from hvdprof.ray.layout import WorkerPlace

#: the file that maps ranks to Ray nodes and actors
RAY_LAYOUT_FILE = "ray.json"


def timeline_directory(option: str | None, environ: Mapping[str, str]) -> str | None:
    """Where the gathered timeline goes: the executor's option, else the driver's
    ``HVDPROF_TIMELINE``, else the directory Horovod's ``HOROVOD_TIMELINE`` implies."""
    if option:
        return os.path.abspath(option)
    ours = environ.get(name_of("timeline_dir"), "").strip()
    if ours:
        return os.path.abspath(ours)
    horovod = environ.get("HOROVOD_TIMELINE", "")
    directory = horovod_timeline_paths(horovod)[0] if horovod else ""
    return os.path.abspath(directory) if directory else None


def recover_local(path: str) -> dict[str, bytes]:
    """What a worker that ran on the driver's node left in its timeline directory before
    it died (a rank's trace stays readable up to its last written event); the directory
    is removed. A worker on another node keeps its copy there: the driver cannot reach it."""
    root = Path(path)
    files = {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }
    shutil.rmtree(root, ignore_errors=True)
    return files


def write_gathered(
    directory: str,
    files_by_rank: Mapping[int, Mapping[str, bytes]],
    places: Sequence[WorkerPlace],
    missing: Mapping[int, str] | None = None,
) -> list[str]:
    """Write each rank's files under ``directory`` and ``ray.json``; returns the paths
    written. ``missing`` names the ranks whose files could not be fetched, and why."""
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    written: list[str] = []
    for rank in sorted(files_by_rank):
        for rel, data in files_by_rank[rank].items():
            target = (root / rel).resolve()
            if root.resolve() not in target.parents:
                continue  # a name that leaves the directory: not ours to write
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            written.append(str(target))
    layout = {
        "format": "hvdprof-ray",
        "ranks": [{"rank": r, **asdict(p)} for r, p in enumerate(places)],
        "missing": {str(r): why for r, why in sorted((missing or {}).items())},
    }
    (root / RAY_LAYOUT_FILE).write_text(json.dumps(layout, indent=1))
    written.append(str(root / RAY_LAYOUT_FILE))
    return written
