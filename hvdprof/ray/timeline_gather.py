"""Every rank's timeline of a Ray job, gathered into one directory on the driver's machine.

Each actor records into a directory on its own node (``RayWorker.stage_timeline``) and
ships its files back when the executor shuts down (a dead actor's files are read from
its directory when it ran on the driver's node), so ``hvdprof analyze DIR`` and the
dashboard read a Ray job as they read one of ``hvdprof run``: ``rank.<r>.*`` files (their
manifests name each rank's host), plus ``ray.json``, where each rank ran in Ray's terms.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict

# shared with hvdprof.spark: hvdprof/cluster/timeline_gather.py
from hvdprof.cluster import timeline_gather as _shared
from hvdprof.cluster.timeline_gather import recover_local as recover_local
from hvdprof.cluster.timeline_gather import timeline_directory as timeline_directory
from hvdprof.ray.layout import WorkerPlace

#: the file that maps ranks to Ray nodes and actors
RAY_LAYOUT_FILE = "ray.json"


def write_gathered(
    directory: str,
    files_by_rank: Mapping[int, Mapping[str, bytes]],
    places: Sequence[WorkerPlace],
    missing: Mapping[int, str] | None = None,
) -> list[str]:
    """Write each rank's files under ``directory`` and ``ray.json``; returns the paths
    written. ``missing`` names the ranks whose files could not be fetched, and why."""
    return _shared.write_gathered(
        directory,
        files_by_rank,
        RAY_LAYOUT_FILE,
        "hvdprof-ray",
        [asdict(p) for p in places],
        missing,
    )
