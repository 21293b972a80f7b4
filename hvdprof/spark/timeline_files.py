"""A rank's timeline files as this job wrote them, whatever its process did before.

Spark reuses its Python workers, and hvdprof's runtime records the k-th ``init()`` of a
process into ``incarnation.<k>/`` (so repeated init()/shutdown() rounds do not overwrite
each other). A task's process may have run earlier jobs: its first ``init()`` of this job
is then, say, its third, and two ranks of one job would land in different folders. Each
task records into a directory of its own, so every incarnation found there belongs to
this job; they are renumbered as if the process were fresh (the first at the top, the
second in ``incarnation.2/`` ...), so every rank's files line up in one run.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

#: hvdprof.runtime.runtime.INCARNATION_DIR's folders ("incarnation.{}")
_INCARNATION = re.compile(r"^incarnation\.(\d+)/(.+)$")


def as_fresh_process(files: Mapping[str, bytes]) -> dict[str, bytes]:
    """``files`` (by path relative to the rank's directory) with its incarnations
    renumbered from the first; files outside any incarnation folder come first."""
    groups: dict[int, dict[str, bytes]] = {}
    for rel, data in files.items():
        found = _INCARNATION.match(rel.replace("\\", "/"))
        k, name = (int(found[1]), found[2]) if found else (0, rel)
        groups.setdefault(k, {})[name] = data
    renumbered: dict[str, bytes] = {}
    for position, k in enumerate(sorted(groups)):
        prefix = "" if position == 0 else f"incarnation.{position + 1}/"
        for name, data in groups[k].items():
            renumbered[prefix + name] = data
    return renumbered
