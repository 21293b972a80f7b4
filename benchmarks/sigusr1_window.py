"""How long after exec ``hvdprof run`` still dies of a SIGUSR1: the window no Python code
of ours can cover (the interpreter's start-up, ``site``, the console script's ``import re``)
plus whatever runs before ``hvdprof/launch/stack_requests.py`` holds the signal.

    python benchmarks/sigusr1_window.py [--reps 30] [--quick] [--output FILE]

Starts, interleaved round by round, three processes and polls ``/proc/PID/status`` (every
0.3 ms, sleeping in between so the poller does not take the CPU from the process) until
SIGUSR1 shows a handler:

- ``bare``: ``python -c`` whose first statement sets a handler (the interpreter's own
  floor: nothing can be earlier);
- ``console``: the ``hvdprof`` console script, ``hvdprof run -np 1 -- true``;
- ``module``: ``python -m hvdprof run -np 1 -- true``.

Prints and writes medians, minima and maxima in ms (``benchmarks/results/sigusr1_window.json``
by default), and ``console - bare`` and ``module - bare``: what hvdprof adds to the floor.
Linux only. Nothing is signalled: the launcher's ``-- true`` ends at once.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import subprocess
import sys
import time

from hvdprof.runtime.stacks import stack_signal_disposition

ROOT = pathlib.Path(__file__).resolve().parents[1]
PY = sys.executable
CASES = {
    "bare": [
        PY,
        "-c",
        "import _signal, time; _signal.signal(_signal.SIGUSR1, print); time.sleep(1)",
    ],
    "console": [str(pathlib.Path(PY).parent / "hvdprof"), "run", "-np", "1", "--", "true"],
    "module": [PY, "-m", "hvdprof", "run", "-np", "1", "--", "true"],
}


def armed_after_ms(argv: list[str]) -> float | None:
    """Milliseconds from Popen's return (the exec done) until SIGUSR1 has a handler;
    None when the process ended first."""
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    started = time.monotonic()
    try:
        while proc.poll() is None:
            if stack_signal_disposition(proc.pid) == "caught":
                return (time.monotonic() - started) * 1000
            time.sleep(0.0003)
        return None
    finally:
        proc.wait(60)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--quick", action="store_true", help="3 rounds (a smoke run)")
    parser.add_argument("--output", default=str(ROOT / "benchmarks/results/sigusr1_window.json"))
    args = parser.parse_args()
    reps = 3 if args.quick else args.reps
    samples: dict[str, list[float]] = {name: [] for name in CASES}
    for _ in range(reps):
        for name, argv in CASES.items():
            ms = armed_after_ms(argv)
            if ms is not None:
                samples[name].append(ms)
    result: dict[str, object] = {"reps": reps, "variants": {}}
    for name, values in samples.items():
        stats = {
            "median_ms": statistics.median(values) if values else None,
            "min_ms": min(values, default=None),
            "max_ms": max(values, default=None),
            "n": len(values),
        }
        result["variants"][name] = stats  # type: ignore[index]
        print(f"{name:8s} {json.dumps(stats)}")
    medians = {n: statistics.median(v) for n, v in samples.items() if v}
    if "bare" in medians:
        result["ratios"] = {
            f"{n} - bare (ms)": round(medians[n] - medians["bare"], 1)
            for n in ("console", "module")
            if n in medians
        }
        print(json.dumps(result["ratios"]))
    out = pathlib.Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
