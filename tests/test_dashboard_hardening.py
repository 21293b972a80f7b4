"""The dashboard's defects found by probing (issue 23), each reproduced as it happened.

Parse workers outliving a stopped server, the start-up preload writing through a link
out of the served directory, Nagle on kept-alive connections, a foreign cookie breaking
token mode, the result cache's race, ``hvdprof report`` crashing on an escaping link,
an absurd rank answering 200, and DNS rebinding (the Host and Origin checks).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from dashboard_support import HOROVOD_TIMELINE, child_env, free_port, get
from fastapi.testclient import TestClient
from synthetic_runs import SyntheticSpec, write_synthetic_run

from hvdprof.dashboard import service
from hvdprof.dashboard.app import create_app
from hvdprof.dashboard.catalog import LoadedRun, RunCatalog, RunEntry
from hvdprof.dashboard.server import bind
from hvdprof.dashboard.settings import DashboardSettings

pytestmark = pytest.mark.timeout(180)

REPO = Path(__file__).resolve().parents[1]
LOOPBACK = "http://127.0.0.1"


def _horovod_root(tmp_path: Path) -> Path:
    root = tmp_path / "served"
    root.mkdir()
    shutil.copy(HOROVOD_TIMELINE, root / "horovod_timeline.json")
    return root


def _children(pid: int) -> list[int]:
    kids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            kids.append(int(entry))
    return kids


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_stopping_the_dashboard_while_it_parses_leaves_no_process_and_frees_the_port(tmp_path):
    run = tmp_path / "big"
    write_synthetic_run(str(run), SyntheticSpec(ranks=2, steps=1500, tensors=20))  # ~60 MB
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "hvdprof", "dashboard", str(tmp_path), "--port", str(port),
         "--no-browser"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=child_env(), cwd=REPO,
    )  # fmt: skip
    workers: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not workers and proc.poll() is None:
            workers = _children(proc.pid)
            time.sleep(0.01)
        assert workers, "the dashboard started no parse worker for a 60 MB run"
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(_alive(w) for w in workers):
            time.sleep(0.05)
        assert not [w for w in workers if _alive(w)], "parse workers outlived the dashboard"
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", port))  # raises "Address already in use" if still held
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        for w in workers:  # never leave an orphan behind, even when the test failed
            if _alive(w):
                os.kill(w, signal.SIGKILL)


def test_the_preload_never_writes_through_a_link_out_of_the_served_directory(tmp_path):
    root, outside = tmp_path / "served", tmp_path / "outside"
    outside.mkdir()
    run = root / "aaa"
    write_synthetic_run(str(run), SyntheticSpec(ranks=2, steps=5))
    (run / ".hvdprof-cache").symlink_to(outside, target_is_directory=True)
    catalog = RunCatalog(root)
    assert catalog.start_reading() is None  # refused, as /api/run?run=aaa is (403)
    with TestClient(create_app(DashboardSettings(root), catalog=catalog), base_url=LOOPBACK) as c:
        assert c.get("/api/run", params={"run": "aaa"}).status_code == 403
        time.sleep(0.5)  # the app's own preload thread has had its chance
    assert list(outside.iterdir()) == []


def test_report_without_run_names_the_escaping_link(tmp_path):
    root = tmp_path / "served"
    run = root / "aaa"
    write_synthetic_run(str(run), SyntheticSpec(ranks=2, steps=5))
    (run / "extra.json").symlink_to(HOROVOD_TIMELINE)
    proc = subprocess.run(
        [sys.executable, "-m", "hvdprof", "report", str(root), "-o", str(tmp_path / "r.html")],
        capture_output=True, text=True, timeout=120, env=child_env(), cwd=REPO,
    )  # fmt: skip
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr, proc.stderr
    assert "extra.json" in proc.stderr and "outside the served directory" in proc.stderr


def test_accepted_connections_have_nagle_off():
    settings = DashboardSettings(REPO / "tests", port=0)
    listener = bind(settings)
    port = listener.getsockname()[1]
    seen: list[int] = []

    async def main() -> None:
        def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            sock = writer.get_extra_info("socket")
            seen.append(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()

        server = await asyncio.start_server(accepted, sock=listener)  # as uvicorn does
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        for _ in range(200):
            if seen:
                break
            await asyncio.sleep(0.01)
        writer.close()
        server.close()

    asyncio.run(main())
    assert seen and seen[0] != 0


def test_a_foreign_cookie_does_not_break_token_mode(tmp_path):
    root = _horovod_root(tmp_path)
    app = create_app(DashboardSettings(root, token="TOK"))
    with TestClient(app, raise_server_exceptions=False, base_url=LOOPBACK) as c:
        ok = c.get("/api/runs", headers={"Cookie": "a@b=c; hvdprof_token=TOK; x=(y)"})
        assert ok.status_code == 200, ok.text
        wrong = c.get("/api/runs", headers={"Cookie": "a@b=c; hvdprof_token=NOT"})
        assert wrong.status_code == 401


def test_huge_or_negative_ranks_are_a_422(tmp_path):
    root = _horovod_root(tmp_path)
    with TestClient(create_app(DashboardSettings(root)), base_url=LOOPBACK) as c:
        run = c.get("/api/runs").json()["runs"][0]["id"]
        for query in (
            {"ranks": "99999999999999999999999999"},
            {"ranks": "-1"},
            {"expand_rank": "99999999999999999999999999"},
        ):
            r = c.get("/api/timeline", params={"run": run, **query})
            assert r.status_code == 422, (query, r.status_code, r.text)


def test_host_and_origin_are_checked_on_loopback(tmp_path):
    root = _horovod_root(tmp_path)
    app = create_app(DashboardSettings(root))
    with TestClient(app, raise_server_exceptions=False, base_url=LOOPBACK) as c:
        assert c.get("/api/runs").status_code == 200
        assert c.get("/api/runs", headers={"Host": "localhost:8050"}).status_code == 200
        assert c.get("/api/runs", headers={"Host": "[::1]:8050"}).status_code == 200
        rebound = c.get("/api/runs", headers={"Host": "evil.example:8050"})
        assert rebound.status_code == 403 and "DNS rebinding" in rebound.json()["detail"]
        foreign = c.get(
            "/api/runs", headers={"Host": "127.0.0.1:8050", "Origin": "http://evil.example"}
        )
        assert foreign.status_code == 403
        same = c.get(
            "/api/runs", headers={"Host": "127.0.0.1:8050", "Origin": "http://127.0.0.1:8050"}
        )
        assert same.status_code == 200


def test_a_real_server_refuses_a_rebound_host(tmp_path):
    root = _horovod_root(tmp_path)
    from dashboard_support import dashboard_server

    with dashboard_server(root) as base:
        assert get(base + "api/runs")[0] == 200
        port = int(base.rstrip("/").rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(
                b"GET /api/runs HTTP/1.1\r\nHost: attacker.example\r\nConnection: close\r\n\r\n"
            )
            head = s.recv(200)
        assert head.startswith(b"HTTP/1.1 403"), head


def test_the_result_cache_survives_concurrent_requests_and_new_versions():
    entry = RunEntry("x", Path("."), "file")
    loaded = LoadedRun(entry, run=None, signature=())
    errors: list[BaseException] = []
    stop = time.monotonic() + 3

    def hammer(seed: int) -> None:
        k = seed
        while time.monotonic() < stop:
            k += 1
            try:
                service._cached(loaded, ("section", k % 200), lambda k=k: k)
                if k % 97 == 0:
                    loaded.version += 1
            except BaseException as exc:
                errors.append(exc)
                return

    threads = [threading.Thread(target=hammer, args=(i * 1000,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == []
