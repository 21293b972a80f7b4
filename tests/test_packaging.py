"""A regular (non-editable) install carries the dashboard's page.

The page lives in ``web/`` at the repo root; ``pyproject.toml`` maps it into the wheel as
``hvdprof/_web``. These tests build the real wheel with pip (offline: ``--no-deps
--no-index --no-build-isolation``, so the build backend comes from this environment),
install it with pip into a target directory, and start the dashboard app from that copy
in a fresh interpreter: it must find the page through the import system and serve the
same bytes as ``web/``. Every subprocess has a hard timeout.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

pytest.importorskip("fastapi")

REPO = Path(__file__).resolve().parent.parent
PAGE = ("index.html", "app.js", "style.css")
#: Building the wheel reads the whole tree; a loaded 2-core VM takes ~10 s.
BUILD_TIMEOUT_S = 240
#: Installing the built wheel into a target directory.
INSTALL_TIMEOUT_S = 120
#: Importing hvdprof's dashboard and answering three requests.
SERVE_TIMEOUT_S = 120

#: Run in a fresh interpreter with only the installed copy ahead of the environment.
SERVE_SCRIPT = r"""
import hashlib, json, sys
from pathlib import Path

import hvdprof
from fastapi.testclient import TestClient
from hvdprof.dashboard.app import create_app
from hvdprof.dashboard.paths import web_directory
from hvdprof.dashboard.settings import DashboardSettings

served = {}
with TestClient(create_app(DashboardSettings(sys.argv[1])), raise_server_exceptions=False, base_url="http://127.0.0.1") as c:
    for path in ("/", "/static/app.js", "/static/style.css"):
        r = c.get(path)
        served[path] = [r.status_code, hashlib.sha256(r.content).hexdigest(), r.text[:300]]
print(json.dumps({"package": hvdprof.__spec__.origin, "web": str(web_directory()),
                  "served": served}))
"""


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HVDPROF_", "PIP_"))}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env.pop("PYTHONPATH", None)
    return env


def _run(command: list[str], timeout: float, **kwargs) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout, **kwargs)
    assert proc.returncode == 0, (
        f"{command} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    )
    return proc


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """hvdprof's wheel, built from this checkout by pip and the project's build backend."""
    try:
        import hatchling  # noqa: F401  (the backend pyproject.toml names)
    except ImportError:
        if os.environ.get("CI") == "true":
            pytest.fail("hatchling is missing but CI=true: .ci/setup installs the dev extra")
        pytest.skip("hatchling (the build backend, in the dev extra) is not installed")
    out = tmp_path_factory.mktemp("wheel")
    _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-index", "--no-build-isolation",
         "-w", str(out), str(REPO)],
        BUILD_TIMEOUT_S, env=_env(), cwd=out,
    )  # fmt: skip
    built = sorted(out.glob("hvdprof-*.whl"))
    assert len(built) == 1, [p.name for p in out.iterdir()]
    return built[0]


def test_wheel_holds_the_page_as_package_data(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        for name in PAGE:
            member = f"hvdprof/_web/{name}"
            assert member in names, sorted(n for n in names if "web" in n)
            assert hashlib.sha256(z.read(member)).hexdigest() == _sha(REPO / "web" / name)
    assert "hvdprof/dashboard/paths.py" in names and "hvdprof/analysis/window.py" in names
    assert not any(n.startswith("web/") for n in names)  # not a top-level "web" package
    assert not any("__pycache__" in n for n in names)


def test_sdist_carries_the_page_into_its_wheel(wheel: Path, tmp_path: Path) -> None:
    """``python -m build`` (sdist, then a wheel from it) and ``pip install hvdprof.tar.gz``."""
    _run(
        [sys.executable, "-m", "hatchling", "build", "-t", "sdist", "-d", str(tmp_path)],
        BUILD_TIMEOUT_S, env=_env(), cwd=REPO,
    )  # fmt: skip
    sdists = sorted(tmp_path.glob("hvdprof-*.tar.gz"))
    assert len(sdists) == 1, [p.name for p in tmp_path.iterdir()]
    with tarfile.open(sdists[0]) as t:
        names = {name.split("/", 1)[1] for name in t.getnames() if "/" in name}
    assert {f"web/{name}" for name in PAGE} <= names
    out = tmp_path / "from-sdist"
    _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-index", "--no-build-isolation",
         "-w", str(out), str(sdists[0])],
        BUILD_TIMEOUT_S, env=_env(), cwd=tmp_path,
    )  # fmt: skip
    (built,) = out.glob("hvdprof-*.whl")
    with zipfile.ZipFile(built) as z:
        for name in PAGE:
            assert hashlib.sha256(z.read(f"hvdprof/_web/{name}")).hexdigest() == _sha(
                REPO / "web" / name
            )


def _serve_from(target: Path, served_dir: Path) -> dict:
    env = _env()
    env["PYTHONPATH"] = str(target)  # ahead of this environment's (editable) hvdprof
    proc = _run(
        [sys.executable, "-c", SERVE_SCRIPT, str(served_dir)],
        SERVE_TIMEOUT_S, env=env, cwd=served_dir,
    )  # fmt: skip
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_installed_wheel_serves_the_page(wheel: Path, tmp_path: Path) -> None:
    target = tmp_path / "site"
    _run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--target",
         str(target), str(wheel)],
        INSTALL_TIMEOUT_S, env=_env(), cwd=tmp_path,
    )  # fmt: skip
    served_dir = tmp_path / "runs"
    served_dir.mkdir()
    result = _serve_from(target, served_dir)
    # the installed copy was imported, and it found the page inside itself
    assert Path(result["package"]).resolve().is_relative_to(target.resolve()), result
    assert Path(result["web"]).resolve() == (target / "hvdprof" / "_web").resolve(), result
    for path, name in (("/", "index.html"), ("/static/app.js", "app.js"),
                       ("/static/style.css", "style.css")):  # fmt: skip
        status, digest, _head = result["served"][path]
        assert status == 200, (path, result["served"][path])
        assert digest == _sha(REPO / "web" / name), path

    # without the page (a broken install) "/" says why, instead of a 500
    shutil.rmtree(target / "hvdprof" / "_web")
    broken = _serve_from(target, served_dir)
    status, _digest, head = broken["served"]["/"]
    assert status == 404 and "not installed" in head, broken["served"]["/"]


def test_checkout_serves_its_own_web_directory() -> None:
    """In this checkout (editable install) the page being edited, ``web/``, is served."""
    from hvdprof.dashboard.paths import web_directory

    assert web_directory() == (REPO / "web").resolve()
