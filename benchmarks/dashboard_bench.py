"""The dashboard on a synthetic 1M-event, 4-rank run: start-up, zoom, live update, memory.

The run is written by the tests' generator (``tests/synthetic_runs.py``);
for the live part its files are then left open (no closing ``]``) like a job still
writing. Then, against a real
``hvdprof dashboard`` process on a free loopback port:

* start-up: from starting the server process to the first answer of ``/api/timeline``
  for the whole run: a finished run cold (a fresh trace: no analysis cache yet) and warm
  (second start, cache read), a run whose files are still open (cold), and a restart on
  that open run after it grew (its cache continued from where the last start stopped);
  each with the CPU time the server and its parse workers had used by then, which a
  loaded machine does not inflate the way it inflates the wall time;
* zoom: ``/api/timeline`` for windows of 1% of the run at different places (each a cache
  miss on the server), median and worst;
* live update: an event appended to rank 0's file until a client on ``/api/events``
  receives the ``changed`` event, and until the re-queried window includes it (what the
  page does on that event);
* memory: the server's resident set (VmRSS) and peak (VmHWM) after all of the above.

Goals (issue 10): start-up <= 1.5 s, zoom <= 150 ms, live <= 2 s, RSS <= 1 GB. Prints a
table and writes ``benchmarks/results/dashboard_bench.json`` (``--quick``: a 50k-event
smoke run, ``dashboard_bench.quick.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # the tests' synthetic runs

from synthetic_runs import SyntheticSpec, write_synthetic_run  # noqa: E402

NAME = "dashboard_bench"
RESULTS = Path(__file__).resolve().parent / "results"
#: startup_s is checked against the slower of cold (a fresh trace, no cache yet) and warm
#: (the cache written by an earlier start or ``hvdprof analyze``)
GOALS = {"startup_s": 1.5, "zoom_ms": 150.0, "live_s": 2.0, "rss_mb": 1024.0}
TENSORS = 100
RUN_ID = "."


def spec_for(events: int, ranks: int) -> SyntheticSpec:
    """About ``events`` events over ``ranks`` ranks (READY marks + 6 slices per op)."""
    per_op = ranks + 6
    steps = max(2, round(events / (ranks * TENSORS * per_op)))
    return SyntheticSpec(
        ranks=ranks, steps=steps, tensors=TENSORS, group_size=8, tensor_bytes=256 << 10,
        step_us=60_000.0, submit_gap_us=5.0, late_rank=ranks - 1, late_us=3000.0,
        autotune_samples=8,
    )  # fmt: skip


def leave_open(directory: Path) -> None:
    """Drop each trace's closing ``]``: the files look like a job still writing them."""
    for path in directory.glob("rank.*.json"):
        text = path.read_bytes().rstrip()
        if text.endswith(b"]"):
            path.write_bytes(text[:-1].rstrip() + b",\n")  # as the writer leaves each event


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url: str, timeout: float = 60.0) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read())


def tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) used so far by ``pid``, the children it reaped, and
    its children still alive or not yet reaped (the dashboard's parse workers)."""
    tick = os.sysconf("SC_CLK_TCK")

    def stat(p: int) -> list[str]:
        with open(f"/proc/{p}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()

    try:
        fields = stat(pid)
        total = sum(int(x) for x in fields[11:15])
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            children = [int(x) for x in f.read().split()]
    except (OSError, ValueError):
        return 0.0
    for child in children:
        try:
            total += sum(int(x) for x in stat(child)[11:15])
        except (OSError, ValueError):
            continue
    return total / tick


def rss_mb(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of ``pid`` in MB."""
    fields = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                fields[key] = int(value.split()[0]) / 1024
    return fields.get("VmRSS", 0.0), fields.get("VmHWM", 0.0)


class Server:
    """``python -m hvdprof dashboard DIR`` on a free port, timed from its start."""

    def __init__(self, directory: Path) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}/"
        self.started = time.perf_counter()
        self.first_cpu_s = 0.0
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "hvdprof", "dashboard", str(directory), "--port",
             str(self.port), "--no-browser"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT,
        )  # fmt: skip

    def first_timeline_s(self, deadline_s: float = 120.0) -> float:
        url = self.base + f"api/timeline?run={RUN_ID}"
        while time.perf_counter() - self.started < deadline_s:
            if self.proc.poll() is not None:
                raise SystemExit(f"dashboard exited with {self.proc.returncode}")
            try:
                body = get_json(url)
            except (urllib.error.URLError, ConnectionError, OSError):
                time.sleep(0.01)
                continue
            if body.get("data") is None:
                raise SystemExit(f"first timeline response has no data: {body.get('notices')}")
            wall = time.perf_counter() - self.started
            self.first_cpu_s = tree_cpu_s(self.proc.pid)
            return wall
        raise SystemExit("no timeline response within the deadline")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


class EventListener(threading.Thread):
    """Reads ``/api/events`` and records when each ``changed`` event arrives."""

    def __init__(self, base: str) -> None:
        super().__init__(daemon=True)
        self.base = base
        self.changed: list[float] = []
        self.ready = threading.Event()
        self.arrived = threading.Event()

    def run(self) -> None:
        with urllib.request.urlopen(self.base + "api/events", timeout=120) as stream:
            event = None
            for raw in stream:
                line = raw.decode().rstrip("\r\n")
                if line.startswith("event:"):
                    event = line.split(":", 1)[1].strip()
                elif line.startswith("data:") and event == "hello":
                    self.ready.set()
                elif line.startswith("data:") and event == "changed":
                    self.changed.append(time.perf_counter())
                    self.arrived.set()


def append_event(directory: Path, after_us: float) -> float:
    """Append one QUEUE slice to rank 0 beyond the run's end; returns its start (us)."""
    path = directory / "rank.0.json"
    with path.open("rb") as f:
        f.seek(max(0, path.stat().st_size - (1 << 20)))
        tail = f.read().decode()
    template = re.findall(
        r'\{"name":"QUEUE","ph":"X","ts":[0-9.]+,"dur":[0-9.]+,"pid":0,"tid":\d+\}', tail
    )[-1]
    ts = after_us + 1000.0
    event = re.sub(r'"ts":[0-9.]+', f'"ts":{ts:.3f}', template)
    with path.open("ab") as f:
        f.write((event + ",\n").encode())
        f.flush()
        os.fsync(f.fileno())
    return ts


def measure(events: int, ranks: int, zooms: int, live_rounds: int) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="hvdprof-dashboard-bench-"))
    try:
        t = time.perf_counter()
        truth = write_synthetic_run(str(work / "run"), spec_for(events, ranks))
        print(
            f"wrote {truth.events:,} events over {ranks} ranks in {time.perf_counter() - t:.1f} s"
        )
        directory = work / "run"
        result: dict[str, Any] = {"events": truth.events, "ranks": ranks}

        # a finished run: the first start parses (and caches), the second reads the cache
        for label in ("cold", "warm"):
            server = Server(directory)
            try:
                result[f"startup_{label}_s"] = server.first_timeline_s()
                result[f"startup_{label}_cpu_s"] = server.first_cpu_s
            finally:
                if label == "cold":
                    server.stop()
        info = get_json(server.base + f"api/run?run={RUN_ID}")
        t0, t1 = info["t0_us"], info["t1_us"]
        span = t1 - t0
        zoom_ms = []
        for i in range(zooms):
            a = t0 + span * (0.05 + 0.9 * i / max(zooms - 1, 1))
            url = (
                server.base
                + f"api/timeline?run={RUN_ID}&t0_us={a:.3f}&t1_us={a + span / 100:.3f}&max_items=5600"
            )
            t = time.perf_counter()
            body = get_json(url)
            zoom_ms.append((time.perf_counter() - t) * 1000)
            assert body["data"] is not None, body
        result["zoom_ms_median"] = statistics.median(zoom_ms)
        result["zoom_ms_max"] = max(zoom_ms)
        expanded = time.perf_counter()
        get_json(
            server.base
            + f"api/timeline?run={RUN_ID}&expand_rank=0&t0_us={t0 + span / 2:.3f}&t1_us={t0 + span / 2 + span / 100:.3f}"
        )
        result["zoom_expanded_ms"] = (time.perf_counter() - expanded) * 1000

        server.stop()

        # a run still being written (files open: never cached), then growing
        leave_open(directory)
        server = Server(directory)
        result["startup_open_s"] = server.first_timeline_s()
        result["startup_open_cpu_s"] = server.first_cpu_s
        listener = EventListener(server.base)
        listener.start()
        if not listener.ready.wait(30):
            raise SystemExit("no hello on /api/events")
        event_s, window_s = [], []
        end = t1
        for _ in range(live_rounds):
            listener.arrived.clear()
            written = time.perf_counter()
            end = append_event(directory, end)
            if not listener.arrived.wait(30):
                raise SystemExit("no changed event within 30 s of an append")
            event_s.append(listener.changed[-1] - written)
            body = get_json(
                server.base
                + f"api/timeline?run={RUN_ID}&t0_us={end - 5000:.3f}&t1_us={end + 5000:.3f}"
            )
            starts = (body["data"] or {}).get("slices", {}).get("start_us", [])
            assert any(abs(s - end) < 0.01 for s in starts), (
                "the appended event is not in the window"
            )
            window_s.append(time.perf_counter() - written)
            time.sleep(0.5)
        result["live_event_s_median"] = statistics.median(event_s)
        result["live_to_window_s_median"] = statistics.median(window_s)
        result["live_to_window_s_max"] = max(window_s)
        rss, hwm = rss_mb(server.proc.pid)
        result["server_rss_mb"] = rss
        result["server_peak_rss_mb"] = hwm
        server.stop()

        # the dashboard restarted on the run still being written, which grew meanwhile: the
        # cache of the open files is continued from where the last start stopped reading
        append_event(directory, end)
        server = Server(directory)
        try:
            result["startup_open_grown_s"] = server.first_timeline_s()
            result["startup_open_grown_cpu_s"] = server.first_cpu_s
        finally:
            server.stop()
        return result
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--zooms", type=int, default=15)
    parser.add_argument("--live-rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="50k events, few rounds (smoke)")
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args()
    if args.quick:
        args.events, args.zooms, args.live_rounds = 50_000, 4, 2
    result = measure(args.events, args.ranks, args.zooms, args.live_rounds)
    checks = {
        "startup_s": max(result["startup_cold_s"], result["startup_warm_s"]),
        "zoom_ms": result["zoom_ms_median"],
        "live_s": result["live_to_window_s_median"],
        "rss_mb": result["server_peak_rss_mb"],
    }
    rows = [
        ("start to first timeline, cold (s)", result["startup_cold_s"], GOALS["startup_s"]),
        ("  server CPU until then, cold (s)", result["startup_cold_cpu_s"], None),
        ("start to first timeline, warm (s)", result["startup_warm_s"], GOALS["startup_s"]),
        ("  server CPU until then, warm (s)", result["startup_warm_cpu_s"], None),
        ("start to first timeline, run still open (s)", result["startup_open_s"], GOALS["startup_s"]),
        ("  server CPU until then, open (s)", result["startup_open_cpu_s"], None),
        ("restart on the open run, grown (s)", result["startup_open_grown_s"], GOALS["startup_s"]),
        ("  server CPU until then, restart (s)", result["startup_open_grown_cpu_s"], None),
        ("zoomed window, median (ms)", result["zoom_ms_median"], GOALS["zoom_ms"]),
        ("zoomed window, worst (ms)", result["zoom_ms_max"], GOALS["zoom_ms"]),
        ("expanded rank window (ms)", result["zoom_expanded_ms"], GOALS["zoom_ms"]),
        ("append -> SSE changed, median (s)", result["live_event_s_median"], GOALS["live_s"]),
        ("append -> re-queried window, median (s)", result["live_to_window_s_median"], GOALS["live_s"]),
        ("server RSS / peak (MB)", f"{result['server_rss_mb']:.0f} / {result['server_peak_rss_mb']:.0f}", GOALS["rss_mb"]),
    ]  # fmt: skip
    print(f"\n{result['events']:,} events, {result['ranks']} ranks")
    for label, value, goal in rows:
        shown = f"{value:.3f}" if isinstance(value, float) else value
        # (CPU rows: no goal of their own; the wall time above them is what is promised)
        target = f"goal <= {goal:g}" if goal is not None else "(CPU, for scale)"
        print(f"  {label:<42} {shown:>12}   {target}")
    result["goals"] = GOALS
    result["met"] = {k: checks[k] <= GOALS[k] for k in GOALS}
    result["machine"] = {"cpus": os.cpu_count(), "python": platform.python_version(),
                         "load_avg": os.getloadavg()}  # fmt: skip
    out = args.output or RESULTS / (NAME + (".quick.json" if args.quick else ".json"))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
