"""Every rank's timeline of a cluster job, gathered into one directory on the driver.

Each rank records into a directory on its own machine (the driver's may not be reachable
from it) and ships its files back when it ends; a rank that died on the driver's machine
has its files read from its directory. ``hvdprof analyze DIR`` and the dashboard then
read the job as one of ``hvdprof run``: ``rank.<r>.*`` files (their manifests name each
rank's host), plus a layout file that says where each rank ran in the engine's terms.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

from hvdprof.config import horovod_timeline_paths, name_of


def timeline_directory(option: str | None, environ: Mapping[str, str]) -> str | None:
    """Where the gathered timeline goes: the driver's option, else its ``HVDPROF_TIMELINE``,
    else the directory Horovod's ``HOROVOD_TIMELINE`` implies."""
    if option:
        return os.path.abspath(option)
    ours = environ.get(name_of("timeline_dir"), "").strip()
    if ours:
        return os.path.abspath(ours)
    horovod = environ.get("HOROVOD_TIMELINE", "")
    directory = horovod_timeline_paths(horovod)[0] if horovod else ""
    return os.path.abspath(directory) if directory else None


def recover_local(path: str) -> dict[str, bytes]:
    """What a rank that ran on the driver's machine left in its timeline directory before
    it died (a rank's trace stays readable up to its last written event); the directory
    is removed. A rank on another machine keeps its copy there: the driver cannot reach it."""
    root = Path(path)
    files = {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }
    shutil.rmtree(root, ignore_errors=True)
    return files


def write_gathered(
    directory: str,
    files_by_rank: Mapping[int, Mapping[str, bytes]],
    layout_file: str,
    layout_format: str,
    ranks: Sequence[Mapping[str, object]],
    missing: Mapping[int, str] | None = None,
    **extra: object,
) -> list[str]:
    """Write each rank's files under ``directory`` and the layout file (``ranks[r]`` says
    where rank ``r`` ran; ``missing`` names the ranks whose files could not be fetched,
    and why); returns the paths written."""
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
        "format": layout_format,
        **extra,
        "ranks": [{"rank": r, **where} for r, where in enumerate(ranks)],
        "missing": {str(r): why for r, why in sorted((missing or {}).items())},
    }
    (root / layout_file).write_text(json.dumps(layout, indent=1))
    written.append(str(root / layout_file))
    return written
