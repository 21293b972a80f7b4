"""The dashboard under load: 200 concurrent clients on a real run's main endpoints.

A real 2-rank training job (the demo, ``hvdprof run --timeline``) records a run; a real
``hvdprof dashboard`` process serves it on a free loopback port. Then, from this process,
``--clients`` asyncio clients each send ``--requests`` GETs in turn over the endpoints
the page calls (``/api/runs``, ``/api/run``, ``/api/timeline`` of the whole run,
``/api/analysis/{stragglers,breakdown,fusion}``), in two modes, interleaved by round:

* ``keep-alive``: each client keeps one HTTP/1.1 connection for all its requests (what a
  browser does);
* ``new connection``: each request opens its own connection (``Connection: close``).

Per mode: latency p50 and p99 over every request, errors (anything but a 200, or a
failed connection), requests per second; and the server's resident memory after the first
1,000 requests and at the end (it must stay flat). The clients run on the same machine as
the server (2 cores here), so the figures include their CPU too.

Goals (issue 23): p99 <= 300 ms, 0 errors, RSS flat after the first 1,000 requests.

    python benchmarks/dashboard_load.py [--clients 200] [--requests 20] [--rounds 2] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import _harness as h

NAME = "dashboard_load"
REPO = Path(__file__).resolve().parents[1]


def record_run(directory: Path, epochs: int) -> None:
    command = [
        sys.executable, "-m", "hvdprof", "run", "-np", "2", "--timeline", str(directory),
        "--", sys.executable, "-m", "hvdprof.demo", "--epochs", str(epochs),
    ]  # fmt: skip
    subprocess.run(command, check=True, capture_output=True, timeout=600, cwd=REPO)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


async def _read_response(reader: asyncio.StreamReader) -> int:
    """Status code of one response, its body read whole (Content-Length or chunked)."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])}
    if "content-length" in headers:
        await reader.readexactly(int(headers["content-length"]))
    elif headers.get("transfer-encoding") == "chunked":
        while True:
            size = int((await reader.readuntil(b"\r\n")).strip(), 16)
            await reader.readexactly(size + 2)
            if size == 0:
                break
    return status


class Load:
    def __init__(self, port: int, paths: list[str]) -> None:
        self.port = port
        self.paths = paths
        self.latencies: list[float] = []
        self.errors: list[str] = []
        self.done = 0
        self.on_count: Any = None

    def _count(self) -> None:
        self.done += 1
        if self.on_count is not None:
            self.on_count(self.done)

    async def client(self, index: int, requests: int, keep_alive: bool) -> None:
        conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        for k in range(requests):
            path = self.paths[(index + k) % len(self.paths)]
            close = b"" if keep_alive else b"Connection: close\r\n"
            request = (
                f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\n".encode() + close + b"\r\n"
            )
            t0 = time.perf_counter()
            try:
                if conn is None:
                    conn = await asyncio.open_connection("127.0.0.1", self.port)
                reader, writer = conn
                writer.write(request)
                await writer.drain()
                status = await _read_response(reader)
                self.latencies.append(time.perf_counter() - t0)
                if status != 200:
                    self.errors.append(f"{path}: HTTP {status}")
            except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
                self.errors.append(f"{path}: {type(exc).__name__}: {exc}")
                conn = None
            if not keep_alive and conn is not None:
                conn[1].close()
                conn = None
            self._count()
        if conn is not None:
            conn[1].close()

    async def run(self, clients: int, requests: int, keep_alive: bool) -> float:
        t0 = time.perf_counter()
        await asyncio.gather(*(self.client(i, requests, keep_alive) for i in range(clients)))
        return time.perf_counter() - t0


def summary(load: Load, wall_s: float) -> dict[str, Any]:
    ms = sorted(x * 1e3 for x in load.latencies)
    q = statistics.quantiles(ms, n=100) if len(ms) >= 2 else [ms[0]] * 99
    return {
        "requests": len(ms) + len(load.errors),
        "p50_ms": round(q[49], 1),
        "p90_ms": round(q[89], 1),
        "p99_ms": round(q[98], 1),
        "max_ms": round(ms[-1], 1),
        "errors": len(load.errors),
        "first_errors": load.errors[:5],
        "requests_per_s": round((len(ms) + len(load.errors)) / wall_s, 1),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=200)
    p.add_argument("--requests", type=int, default=20, help="requests per client per round")
    p.add_argument("--rounds", type=int, default=2, help="rounds per mode, interleaved")
    p.add_argument("--epochs", type=int, default=3, help="epochs of the recorded demo run")
    p.add_argument("--quick", action="store_true", help="20 clients, 5 requests, 1 round")
    p.add_argument("--output", type=Path, default=None)
    args = p.parse_args()
    if args.quick:
        args.clients, args.requests, args.rounds, args.epochs = 20, 5, 1, 1
    with tempfile.TemporaryDirectory(prefix="hvdprof-load-") as tmp:
        root = Path(tmp)
        record_run(root / "run", args.epochs)
        port = free_port()
        server = subprocess.Popen(
            [sys.executable, "-m", "hvdprof", "dashboard", str(root), "--port", str(port),
             "--no-browser"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=REPO,
        )  # fmt: skip
        try:
            base = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 60
            while True:
                with (
                    contextlib.suppress(OSError),
                    urllib.request.urlopen(base + "/api/run?run=run", timeout=30) as r,
                ):
                    if r.status == 200:
                        break
                if time.monotonic() > deadline or server.poll() is not None:
                    raise SystemExit("the dashboard did not start")
                time.sleep(0.2)
            paths = [
                "/api/runs",
                "/api/run?run=run",
                "/api/timeline?run=run",
                "/api/analysis/stragglers?run=run",
                "/api/analysis/breakdown?run=run",
                "/api/analysis/fusion?run=run",
            ]
            modes = {"keep-alive": True, "new connection": False}
            loads = {m: Load(port, paths) for m in modes}
            rss: dict[str, float] = {}
            total = [0]

            def counted(_n: int) -> None:
                total[0] += 1
                if total[0] == 1000:
                    rss["after_1000"] = rss_mb(server.pid)

            walls = dict.fromkeys(modes, 0.0)
            for rnd in range(args.rounds):
                order = list(modes) if rnd % 2 == 0 else list(modes)[::-1]
                for mode in order:
                    loads[mode].on_count = counted
                    walls[mode] += asyncio.run(
                        loads[mode].run(args.clients, args.requests, modes[mode])
                    )
                    h.log(f"round {rnd + 1}/{args.rounds} {mode} done")
            rss["end"] = rss_mb(server.pid)
            results = {m: summary(loads[m], walls[m]) for m in modes}
        finally:
            server.terminate()
            server.wait(30)
    rows = [
        [m, r["requests"], r["p50_ms"], r["p90_ms"], r["p99_ms"], r["max_ms"], r["errors"],
         r["requests_per_s"]]
        for m, r in results.items()
    ]  # fmt: skip
    print()
    print(
        f"{NAME}: {args.clients} concurrent clients x {args.requests} requests x "
        f"{args.rounds} rounds per mode, on a real 2-rank run"
    )
    print(h.table(rows, ["mode", "requests", "p50 ms", "p90 ms", "p99 ms", "max ms", "errors",
                         "req/s"]))  # fmt: skip
    after = rss.get("after_1000", float("nan"))
    print(f"server RSS: {after:.0f} MB after 1,000 requests, {rss['end']:.0f} MB at the end")
    goals = {
        "p99_ms <= 300": all(r["p99_ms"] <= 300 for r in results.values()),
        "errors == 0": all(r["errors"] == 0 for r in results.values()),
        "rss flat (end <= 1.1 x after 1,000)": rss["end"] <= 1.1 * after,
    }
    print("goals: " + ", ".join(f"{k}: {'met' if v else 'NOT met'}" for k, v in goals.items()))
    path = h.write_results(
        NAME,
        {
            "settings": vars(args) | {"output": str(args.output) if args.output else None},
            "variants": results,
            "rss_mb": rss,
            "goals": goals,
        },
        output=args.output,
        quick=args.quick,
    )
    print(f"results: {path}")


if __name__ == "__main__":
    main()
