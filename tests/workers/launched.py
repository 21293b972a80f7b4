"""Runs a worker script under a launcher other than ``hvdprof run``, as ``hvdprof run`` would.

Usage: launched.py WORKER [ARGS...]. mpirun, torchrun and srun print the ranks' output
without ``hvdprof run``'s ``[rank]<stream>:`` prefix that the tests parse, so this wrapper
adds it: it reads this process's rank from the launcher's own variables (independently of
hvdprof's detection, which the tests check against it), exports it as ``HVDTEST_RANK`` and
``HVDTEST_SIZE`` for the worker's checks, and runs the worker as ``__main__`` with every
line of its stdout and stderr prefixed.
"""

from __future__ import annotations

import io
import os
import runpy
import sys
from pathlib import Path

_RANK_NAMES = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "RANK", "SLURM_PROCID")
_SIZE_NAMES = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "WORLD_SIZE", "SLURM_NTASKS")


def _first(names: tuple[str, ...]) -> str:
    for name in names:
        if os.environ.get(name):
            return os.environ[name]
    raise SystemExit(f"launched.py: none of {names} is set: not started by a launcher")


class Prefixed(io.TextIOBase):
    """Writes whole lines, each as one write with the ``[rank]<stream>:`` prefix."""

    def __init__(self, raw: io.TextIOBase, prefix: str) -> None:
        self.raw = raw
        self.prefix = prefix
        self.pending = ""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self.pending += text
        if "\n" in self.pending:
            *lines, self.pending = self.pending.split("\n")
            self.raw.write("".join(f"{self.prefix}{line}\n" for line in lines))
            self.raw.flush()
        return len(text)

    def flush(self) -> None:
        if self.pending:
            self.raw.write(f"{self.prefix}{self.pending}\n")
            self.pending = ""
        self.raw.flush()

    def fileno(self) -> int:
        return self.raw.fileno()


def main() -> None:
    rank, size = _first(_RANK_NAMES), _first(_SIZE_NAMES)
    os.environ["HVDTEST_RANK"], os.environ["HVDTEST_SIZE"] = rank, size
    worker = Path(sys.argv[1]).resolve()
    sys.argv = [str(worker), *sys.argv[2:]]
    sys.path[0] = str(worker.parent)
    sys.stdout = Prefixed(sys.stdout, f"[{rank}]<stdout>:")
    sys.stderr = Prefixed(sys.stderr, f"[{rank}]<stderr>:")
    try:
        runpy.run_path(str(worker), run_name="__main__")
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


if __name__ == "__main__":
    main()
