"""The per-rank run manifest and the file names of a timeline directory.

A trace file alone cannot say which run it belongs to, how its clock relates to wall time,
or whether events were dropped. ``manifest.rank.<r>.json`` records that next to
``rank.<r>.json``: topology, host, the start instant on both the wall clock and the rank's
own clock (what merging a torch.profiler trace needs), the clock offset to rank 0 with its
error bound, the configuration, and the event counts. It is replaced atomically
(write to a temporary file, then ``os.replace``), so a reader never sees half of one, even
after a crash.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from typing import Any

# the file names and the manifest's schema, which the trace layer reads by
from hvdprof.trace.manifest import (  # noqa: F401 (re-exported for the writer's users)
    MANIFEST_FORMAT,
    MANIFEST_RE,
    MANIFEST_VERSION,
    TRACE_RE,
    manifest_filename,
    read_manifest,
    timeline_shift_ns,
    trace_filename,
)

#: A reader that shows a run as it records (the dashboard) touches this file in the run's
#: directory; the ranks' renderers render while it was touched within
#: :data:`LIVE_WINDOW_S`, and otherwise leave the recording in its spool until the ranks
#: close their timelines (rendering beside training took cores the training needed).
LIVE_MARK = ".live"
LIVE_WINDOW_S = 10.0


def request_live(directory: str) -> None:
    """Ask the renderers of the run in ``directory`` to keep its trace files current."""
    path = os.path.join(directory, LIVE_MARK)
    with contextlib.suppress(OSError):
        try:
            os.utime(path)
        except FileNotFoundError:
            with open(path, "a"):
                pass


def live_requested(directory: str) -> bool:
    """Whether a reader asked for the run in ``directory`` live within the window."""
    try:
        touched = os.stat(os.path.join(directory, LIVE_MARK)).st_mtime
    except OSError:
        return False
    return time.time() - touched <= LIVE_WINDOW_S


def write_manifest(path: str, manifest: dict[str, Any]) -> None:
    """Replace ``path`` with ``manifest`` atomically (temporary file + ``os.replace``)."""
    tmp = f"{path}.tmp.{os.getpid()}"
    text = json.dumps(manifest, indent=1, sort_keys=True, default=str, allow_nan=False)
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text + "\n")
        os.replace(tmp, path)
    except OSError:
        # a full disk: the previous manifest stays as it was, and no temporary file is
        # left beside it
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
