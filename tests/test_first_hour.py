"""The first hour of a new user (issue 16), each step as a newcomer meets it.

1. Install: the installed metadata states a torch range (no exact pin) whose lowest
   version is the one our set-up script tests, and the README says how to install into
   one's own environment, naming every extra.
2. The README's commands, run as written in a fresh shell (``env -i``, PATH and HOME
   only) after the activation it documents.
3. A script beside a clone named ``hvdprof``: the shadowing is named with its fix, and the
   job, ``from hvdprof import ...`` and the timeline's renderer child still work.
4. A mismatch inside autograd or ``optimizer.step()``: the one-line error points at the
   user's line, not into torch.
5. ``--autotune`` on a script that exits right after ``init()``: no traceback.
6. A timeline path that is a file: every rank says it must be a directory, and
   ``hvdprof run`` refuses before starting ranks (exit 2, one line).
7. The README's list of what is not supported is checked against the code.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import traceback
from pathlib import Path

import pytest
import torch
from conftest import RANK_LINE, REPO, child_env, run_in_group
from packaging.requirements import Requirement
from packaging.version import Version

import hvdprof
from hvdprof.config import timeline_path_problem
from hvdprof.excepthook import user_frame

pytestmark = pytest.mark.timeout(300)

README = (REPO / "README.md").read_text()
#: Seconds any one command below may take before the test fails (it never waits longer).
COMMAND_TIMEOUT = 150.0


def _run(
    argv: list[str], *, cwd: Path, env: dict[str, str], timeout: float = COMMAND_TIMEOUT
) -> subprocess.CompletedProcess[str]:
    return run_in_group(argv, env=env, cwd=cwd, timeout=timeout)


def _launch(
    command: list[str],
    *,
    cwd: Path,
    num_proc: int = 2,
    launcher_args: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """``python -m hvdprof run -np N --timeout T [launcher_args] -- command`` in ``cwd``."""
    argv = [sys.executable, "-m", "hvdprof", "run", "-np", str(num_proc)]
    argv += ["--timeout", str(COMMAND_TIMEOUT - 20), *launcher_args, "--", *command]
    return _run(argv, cwd=cwd, env=child_env(env, COMMAND_TIMEOUT))


def _rank_lines(text: str, rank: int, stream: str) -> list[str]:
    return [
        m[3]
        for m in map(RANK_LINE.match, text.splitlines())
        if m and (m[1], m[2]) == (str(rank), stream)
    ]


def _section(title: str) -> str:
    """The README's ``## title`` section, up to the next ``## `` heading."""
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## )", README, re.S | re.M)
    assert match, f"README has no '## {title}' section"
    return match[1]


def _shell_block(first_line: str) -> str:
    """The README's ```bash block whose first line is ``first_line``."""
    blocks = re.findall(r"^```bash\n(.*?)^```", README, re.S | re.M)
    found = [b for b in blocks if b.splitlines()[:1] == [first_line]]
    assert len(found) == 1, f"README needs exactly one ```bash block starting {first_line!r}"
    return found[0]


# ------------------------------------------------------------------------ 1. install


def _torch_requirement() -> Requirement:
    requirements = [Requirement(r) for r in importlib.metadata.requires("hvdprof") or []]
    found = [r for r in requirements if r.name == "torch" and r.marker is None]
    assert len(found) == 1, f"hvdprof's metadata should require torch once: {requirements}"
    return found[0]


def test_installed_metadata_requires_a_torch_range_whose_lowest_version_we_test() -> None:
    requirement = _torch_requirement()
    operators = {spec.operator for spec in requirement.specifier}
    assert not operators & {"==", "===", "~="}, (
        f"{requirement}: an exact pin makes users replace their own torch; state a range"
    )
    lower = [Version(s.version) for s in requirement.specifier if s.operator == ">="]
    assert len(lower) == 1, f"{requirement}: state the lowest torch supported (>=)"
    # "Test the lowest torch you claim": .ci/setup pins exactly the lower bound.
    pinned = re.search(r"torch==([0-9][0-9.]*)", (REPO / ".ci" / "setup").read_text())
    assert pinned, ".ci/setup should pin the torch it tests"
    assert Version(pinned[1]) == lower[0], f".ci/setup tests {pinned[1]}, we claim {requirement}"
    installed = Version(torch.__version__).base_version
    assert requirement.specifier.contains(installed), f"torch {installed} is outside {requirement}"


def test_readme_install_section_covers_own_environment_and_every_extra() -> None:
    install = _section("Install")
    assert re.search(r"^pip install /path/to/clone\s", install, re.M), "plain install missing"
    assert re.search(r"^pip install -e /path/to/clone\s", install, re.M), "editable missing"
    lower = next(s.version for s in _torch_requirement().specifier if s.operator == ">=")
    assert f"`torch>={lower}`" in install, "the Install section should state the torch range"
    extras = importlib.metadata.metadata("hvdprof").get_all("Provides-Extra") or []
    assert extras, "hvdprof's metadata lists no extras"
    missing = [e for e in extras if f"`{e}`" not in install]
    assert not missing, f"extras not described in the README's Install section: {missing}"


# ------------------------------------------------------------- 2. README commands as written

ACTIVATE = "source .venv/bin/activate"


def test_readme_commands_work_as_written_in_a_fresh_shell(tmp_path: Path) -> None:
    two_commands = _section("Two commands")
    assert ACTIVATE in two_commands and ".venv/bin/hvdprof" in two_commands
    block = _shell_block(ACTIVATE)
    venv = Path(sys.prefix)
    if (REPO / ".venv" / "bin" / "activate").exists():
        cwd = REPO  # the state the two set-up commands leave: .venv in the clone
    elif (venv / "bin" / "activate").exists():
        cwd = tmp_path  # the tests run from another venv: stand it where the README says
        (tmp_path / ".venv").symlink_to(venv)
    else:
        pytest.skip(f"no virtual environment to activate ({sys.prefix} is not one)")
    fresh = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}  # as `env -i PATH=... HOME=...`
    bare = _run(["bash", "-c", "command -v hvdprof"], cwd=cwd, env=fresh)
    if bare.returncode == 0:
        pytest.fail(f"a fresh shell already finds hvdprof at {bare.stdout.strip()}")
    done = _run(["bash", "-c", "set -e\n" + block], cwd=cwd, env=fresh)
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"the README's commands failed:\n{block}\n{output}"
    for rank in (0, 1):
        assert _rank_lines(output, rank, "stdout") == [f"rank {rank} of 2"], output
    assert "Traceback" not in output and "shadows" not in output, output


# ------------------------------------------------------- 3. a script beside a clone

TRAIN = """\
import json, os, sys
import torch
import hvdprof.torch as hvd
from hvdprof import TensorMismatchError, __version__

hvd.init()
total = hvd.allreduce(torch.full((4,), float(hvd.rank() + 1)), name="x", op=hvd.Sum)
print("SUM", total.tolist(), "VERSION", __version__, "ERROR", TensorMismatchError.__name__)
"""


def _clone_named_hvdprof(parent: Path) -> Path:
    """``parent/hvdprof``: a real ``git clone`` of this checkout where git can make one."""
    clone = parent / "hvdprof"
    if (REPO / ".git").exists() and shutil.which("git"):
        done = _run(
            ["git", "clone", "-q", str(REPO), str(clone)],
            cwd=parent,
            env=dict(os.environ),
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
    else:  # a tarball checkout: the folder's top level is what matters
        clone.mkdir()
        for name in ("README.md", "pyproject.toml"):
            shutil.copy(REPO / name, clone / name)
    assert not (clone / "__init__.py").exists()
    return clone


#: Starts a script the way it runs under an editable install made by setuptools
#: (``pip install -e`` with the setuptools backend): the package is reached only through
#: a finder at the end of ``sys.meta_path``, not through a ``sys.path`` entry, so a folder
#: ``hvdprof`` (no ``__init__.py``) beside the script becomes a namespace package first.
HOOK_INSTALL = """\
import importlib.util, os, runpy, sys
package = os.environ["HVDTEST_PACKAGE_DIR"]
root = os.path.dirname(package)
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != root]

class EditableFinder:
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name != "hvdprof" and not name.startswith("hvdprof."):
            return None
        base = os.path.join(package, *name.split(".")[1:])
        if os.path.isfile(os.path.join(base, "__init__.py")):
            return importlib.util.spec_from_file_location(
                name, os.path.join(base, "__init__.py"), submodule_search_locations=[base]
            )
        if os.path.isfile(base + ".py"):
            return importlib.util.spec_from_file_location(name, base + ".py")
        return None

sys.meta_path.append(EditableFinder)
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def _check_script_ran(output: str, timeline: Path) -> None:
    for rank in (0, 1):
        assert _rank_lines(output, rank, "stdout") == [
            f"SUM [3.0, 3.0, 3.0, 3.0] VERSION {hvdprof.__version__} ERROR TensorMismatchError"
        ], output
        # the renderer child started (found through __spec__, not hvdprof.__file__)
        manifest = json.loads((timeline / f"manifest.rank.{rank}.json").read_text())
        assert manifest["renderer_pid"] not in (None, manifest["os_pid"]), manifest
        assert json.loads((timeline / f"rank.{rank}.json").read_text()), "empty timeline"
    assert "PathLike" not in output and "Traceback" not in output, output


def test_script_beside_a_clone_named_hvdprof_runs_with_this_install(tmp_path: Path) -> None:
    """However this checkout is installed, the script runs; it is warned exactly when
    Python really imported the clone's folder in place of the package."""
    _clone_named_hvdprof(tmp_path)
    (tmp_path / "train.py").write_text(TRAIN)
    probe = _run(
        [sys.executable, "-c", "import importlib.util as u; print(u.find_spec('hvdprof').origin)"],
        cwd=tmp_path,
        env=child_env(),
    )
    shadowed = probe.stdout.strip() == "None"  # a namespace package has no origin
    timeline = tmp_path / "tl"
    done = _launch(
        [sys.executable, "train.py"], cwd=tmp_path, launcher_args=("--timeline", str(timeline))
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    for rank in (0, 1):
        warnings = [line for line in _rank_lines(output, rank, "stderr") if "shadows" in line]
        assert len(warnings) == int(shadowed), f"shadowed={shadowed}, rank {rank}:\n{output}"
    _check_script_ran(output, timeline)


def test_script_beside_a_clone_named_hvdprof_is_told_and_still_runs(tmp_path: Path) -> None:
    """Under a hook-style editable install the clone's folder does shadow the package:
    each rank says so once, with the fix, and the job runs as it would have."""
    clone = _clone_named_hvdprof(tmp_path)
    (tmp_path / "train.py").write_text(TRAIN)
    (tmp_path / "start.py").write_text(HOOK_INSTALL)
    timeline = tmp_path / "tl"
    done = _launch(
        [sys.executable, "start.py", "train.py"],
        cwd=tmp_path,
        launcher_args=("--timeline", str(timeline)),
        env={"HVDTEST_PACKAGE_DIR": str(Path(hvdprof.__file__).parent)},
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    for rank in (0, 1):
        warnings = [line for line in _rank_lines(output, rank, "stderr") if "shadows" in line]
        assert len(warnings) == 1, f"rank {rank} should say once that it was shadowed:\n{output}"
        # (not site-packages/hvdprof, where hatchling's editable install keeps _web)
        assert f"the folder {clone} shadows the installed hvdprof package" in warnings[0]
        assert f"keep your script out of {tmp_path}" in warnings[0]
        assert "rename that folder" in warnings[0]
    _check_script_ran(output, timeline)


# ------------------------------------------------------------- 4. the error's location

MISMATCH_IN_AUTOGRAD = """\
import torch
import hvdprof.torch as hvd

hvd.init()
x = torch.ones(2 + hvd.rank(), requires_grad=True)
y = hvd.allreduce(x, name="grad.path")  # USER LINE
print("not reached", y)
"""

MISMATCH_IN_OPTIMIZER = """\
import torch
import hvdprof.torch as hvd

hvd.init()
model = torch.nn.Linear(4, 3 + hvd.rank())
optimizer = hvd.DistributedOptimizer(
    torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters()
)
model(torch.ones(2, 4)).sum().backward()
optimizer.step()  # USER LINE
print("not reached")
"""


@pytest.mark.parametrize(
    "script", [MISMATCH_IN_AUTOGRAD, MISMATCH_IN_OPTIMIZER], ids=["autograd", "optimizer"]
)
def test_a_mismatch_error_points_at_the_users_line(tmp_path: Path, script: str) -> None:
    path = tmp_path / "user_script.py"
    path.write_text(script)
    line = next(i for i, text in enumerate(script.splitlines(), 1) if "# USER LINE" in text)
    done = _launch([sys.executable, str(path)], cwd=tmp_path)
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    for rank in _seen_ranks(output):
        stderr = _rank_lines(output, rank, "stderr")
        errors = [line for line in stderr if line.startswith("hvdprof: error:")]
        assert len(errors) == 1, f"rank {rank}: expected one error line:\n{output}"
        assert "Mismatched allreduce" in errors[0], errors[0]
        assert f"(raised at {path}:{line};" in errors[0], errors[0]
        assert "Traceback" not in "\n".join(_rank_lines(output, rank, "stderr")), output


def _seen_ranks(output: str) -> list[int]:
    """Ranks that printed anything (the launcher may stop a rank before it reports)."""
    ranks = sorted({int(m[1]) for m in map(RANK_LINE.match, output.splitlines()) if m})
    assert 0 in ranks, f"rank 0 printed nothing:\n{output}"
    return ranks


def test_user_frame_skips_hvdprof_torch_and_the_standard_library(tmp_path: Path) -> None:
    hvdprof_file = str(Path(hvdprof.__spec__.origin).parent / "runtime" / "runtime.py")
    torch_file = str(Path(torch.__file__).parent / "autograd" / "function.py")
    threading_file = str(Path(sysconfig.get_paths()["stdlib"]) / "threading.py")
    library_file = str(Path(sysconfig.get_paths()["purelib"]) / "somelib" / "loop.py")
    user = str(tmp_path / "train.py")

    def frames(*files: str) -> list[traceback.FrameSummary]:  # outermost first
        return [traceback.FrameSummary(f, 10 + i, "f") for i, f in enumerate(files)]

    assert (
        user_frame(frames(user, torch_file, hvdprof_file, torch_file, hvdprof_file)) == f"{user}:10"
    )
    assert user_frame(frames(user, library_file, torch_file, hvdprof_file)) == f"{user}:10"
    assert user_frame(frames(threading_file, library_file, hvdprof_file)) == f"{library_file}:11"
    assert user_frame(frames("<frozen runpy>", "<string>", hvdprof_file)) == "<string>:11"
    assert user_frame(frames(threading_file, torch_file, hvdprof_file)) == ""


# ---------------------------------------------------------- 5. autotune, exit at once


def test_autotune_on_a_script_that_exits_right_after_init_is_quiet(tmp_path: Path) -> None:
    done = _launch(
        [sys.executable, "-c", "import hvdprof.torch as hvd; hvd.init()"],
        cwd=tmp_path,
        launcher_args=("--autotune",),
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "Traceback" not in output, output
    assert "can't register atexit" not in output, output
    rank_stderr = _rank_lines(output, 0, "stderr") + _rank_lines(output, 1, "stderr")
    assert len(rank_stderr) <= 1, f"say nothing, or one line:\n{output}"


# --------------------------------------------------------- 6. a timeline path that is a file


@pytest.mark.parametrize("how", ["--timeline", "HVDPROF_TIMELINE"])
def test_hvdprof_run_refuses_a_timeline_file_before_starting_ranks(
    tmp_path: Path, how: str
) -> None:
    file = tmp_path / "timeline.json"
    file.write_text("{}")
    started = tmp_path / "started"
    command = [sys.executable, "-c", f"open({str(started)!r}, 'w').close()"]
    if how == "--timeline":
        done = _launch(command, cwd=tmp_path, launcher_args=("--timeline", str(file)))
    else:
        done = _launch(command, cwd=tmp_path, env={"HVDPROF_TIMELINE": str(file)})
    assert done.returncode == 2, done.stdout + done.stderr
    assert not started.exists(), "a rank was started"
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"hvdprof: error: {how}: the timeline path ")
    assert str(file) in lines[0] and "must be a directory" in lines[0], lines[0]


def test_timeline_path_problem_names_the_file_in_the_way(tmp_path: Path) -> None:
    file = tmp_path / "timeline.json"
    file.write_text("{}")
    assert timeline_path_problem(str(tmp_path)) is None  # an existing directory
    assert timeline_path_problem(str(tmp_path / "new" / "deeper")) is None  # to be created
    assert timeline_path_problem("") is None  # timeline off
    assert "is a file; it must be a directory" in (timeline_path_problem(str(file)) or "")
    inside = timeline_path_problem(str(file / "sub" / "dir")) or ""
    assert "cannot be created" in inside and f"{str(file)!r} is a file" in inside, inside


def test_every_rank_says_a_timeline_file_must_be_a_directory(tmp_path: Path) -> None:
    file = tmp_path / "timeline.json"
    file.write_text("{}")
    # set inside the script, as a user's own code would, so the launcher cannot check it
    script = f"import os; os.environ['HVDPROF_TIMELINE'] = {str(file)!r}\n"
    script += "import hvdprof.torch as hvd; hvd.init(); print('not reached')"
    done = _launch([sys.executable, "-c", script], cwd=tmp_path)
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    assert "not reached" not in output and "Traceback" not in output, output
    for rank in _seen_ranks(output):
        lines = _rank_lines(output, rank, "stderr")
        assert len(lines) == 1, f"rank {rank}: one line expected:\n{output}"
        assert lines[0].startswith(f"hvdprof: error: hvdprof rank {rank}: the timeline path ")
        assert f"{str(file)!r} is a file; it must be a directory" in lines[0], lines[0]


# ------------------------------------------------------------- 7. what is not supported


#: Each bullet of the README's list, by a phrase it must contain, with a check that the
#: thing is still unsupported. A new bullet needs a check here; a check that stops holding
#: means the list is no longer true.
NOT_SUPPORTED = {
    "`horovod.run`": lambda capsys: (
        not hasattr(hvdprof, "run") and importlib.util.find_spec("hvdprof.run") is None
    ),
}


def test_readme_not_supported_list_is_true(capsys: pytest.CaptureFixture[str]) -> None:
    match = re.search(r"^Not supported[^\n]*\n\n((?:- .*\n(?:  .*\n)*)+)", README, re.M)
    assert match, "README has no 'Not supported' list"
    bullets = [" ".join(b.split()) for b in re.split(r"^- ", match[1], flags=re.M) if b.strip()]
    for bullet in bullets:
        keys = [k for k in NOT_SUPPORTED if k in bullet]
        assert len(keys) == 1, f"no check for this README bullet (add one here): {bullet!r}"
    for key, still_unsupported in NOT_SUPPORTED.items():
        assert any(key in b for b in bullets), f"README's not-supported list lost {key}"
        assert still_unsupported(capsys), f"{key} is supported now: update the README's list"
