"""A tiny rank for the launcher tests: reports itself, then misbehaves on request.

Kept free of torch (and of hvdprof) so that starting it costs only an interpreter.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def _write_pid(directory: Path, name: str, pid: int) -> None:
    """Atomically, so the test never reads a half-written file."""
    tmp = directory / f".{name}.tmp"
    tmp.write_text(str(pid))
    tmp.rename(directory / name)


def _wait_for_pid_files(directory: Path, count: int, limit: float = 10.0) -> None:
    """Fail only once every rank is up, so the test can check they were all stopped."""
    deadline = time.monotonic() + limit
    while len(list(directory.glob("*.pid"))) < count and time.monotonic() < deadline:
        time.sleep(0.02)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pid-dir", type=Path)
    parser.add_argument("--grandchild", action="store_true")
    parser.add_argument("--print-env", action="store_true")
    parser.add_argument("--ignore-signals", action="store_true", help="ignore SIGINT, SIGTERM")
    parser.add_argument("--exit-rank", type=int)
    parser.add_argument("--exit-code", type=int, default=3)
    parser.add_argument("--sigkill-rank", type=int)
    parser.add_argument("--lines", type=int, default=0)
    parser.add_argument("--sleep", type=float, default=0.0)
    args = parser.parse_args()

    rank = int(os.environ["HVDPROF_RANK"])
    size = int(os.environ["HVDPROF_SIZE"])
    if args.ignore_signals:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if args.print_env:
        keys = [*sorted(k for k in os.environ if k.startswith("HVDPROF_")), "PYTHONUNBUFFERED"]
        print(json.dumps({k: os.environ.get(k) for k in keys}))
    for i in range(args.lines):
        # Long lines, several pipe-buffer writes each, on both streams: any interleaving
        # inside a line would break the pattern the test checks.
        print(f"out {rank} {i} " + "x" * 3000)
        print(f"err {rank} {i} " + "y" * 3000, file=sys.stderr)
    if args.lines:
        sys.stdout.write(f"partial {rank}")
        sys.stdout.flush()
    expected = size
    if args.pid_dir is not None:
        if args.grandchild:
            sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
            grandchild = subprocess.Popen(sleeper)
            _write_pid(args.pid_dir, f"rank{rank}.child.pid", grandchild.pid)
            expected = 2 * size
        _write_pid(args.pid_dir, f"rank{rank}.pid", os.getpid())
    if rank == args.exit_rank:
        if args.pid_dir is not None:
            _wait_for_pid_files(args.pid_dir, expected)
        print(f"rank {rank} failing on purpose", file=sys.stderr)
        sys.exit(args.exit_code)
    if rank == args.sigkill_rank:
        if args.pid_dir is not None:
            _wait_for_pid_files(args.pid_dir, expected)
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(args.sleep)


if __name__ == "__main__":
    main()
