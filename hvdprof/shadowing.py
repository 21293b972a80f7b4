"""Noticing, and undoing, a folder named ``hvdprof`` that hides the installed package.

A clone of this repository at ``~/hvdprof`` with the user's ``train.py`` in ``~``: Python
puts the script's folder first on ``sys.path``, finds ``~/hvdprof`` (no ``__init__.py`` at
its top) and, when the installed package is reached only through an import hook (as
``pip install -e`` installs it), imports that folder as an empty namespace package
``hvdprof``. Submodules still resolve through the hook, so ``import hvdprof.torch`` works
while ``hvdprof/__init__.py`` never runs: ``from hvdprof import TensorMismatchError``
fails and ``hvdprof.__file__`` is None.

:func:`repair_if_shadowed` is called first by every entry point (``hvdprof.torch``, the
CLI and ``python -m hvdprof``, the analysis, timeline and dashboard packages): it says
once, on stderr, which folder shadows the package and how to fix it, then makes
``sys.modules["hvdprof"]`` the real package for this process, so the job runs as it would
have. Importing a module changes nothing by itself. It imports nothing from hvdprof.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import sysconfig

PACKAGE = "hvdprof"
#: The real package's folder, from this module's own spec (never ``hvdprof.__file__``,
#: which is None for a namespace package).
PACKAGE_DIR = os.path.dirname(os.path.abspath(__spec__.origin if __spec__ else __file__))


def install_dirs() -> frozenset[str]:
    """Where installs put packages. A folder ``hvdprof`` there is the installation's own
    (an editable install by hatchling leaves the page's files in ``hvdprof/_web``), not
    one the user should rename, so it is never named as the culprit. Asked only once a
    namespace package is found: every import of hvdprof passes through this module."""
    return frozenset(os.path.abspath(sysconfig.get_paths()[key]) for key in ("purelib", "platlib"))


def shadowing_folders(module: object) -> list[str] | None:
    """The folders that make up ``module`` when it is a namespace package; None otherwise.

    A regular package has ``__file__``; a namespace package (what a folder without
    ``__init__.py`` becomes) has only ``__path__``.
    """
    if module is None or getattr(module, "__file__", None) is not None:
        return None
    path = getattr(module, "__path__", None)
    if path is None:
        return None
    installed = install_dirs()
    folders = [os.path.abspath(p) for p in path]
    return [f for f in folders if f != PACKAGE_DIR and os.path.dirname(f) not in installed]


def shadowing_message(folders: list[str], package_dir: str = PACKAGE_DIR) -> str:
    """One line: which folder hides the package, what hvdprof did, and how to fix it."""
    shown = ", ".join(folders) or "(a folder on sys.path)"
    parents = sorted({os.path.dirname(f) for f in folders}) or ["its parent folder"]
    parent = ", ".join(parents)
    return (
        f"hvdprof: warning: the folder {shown} shadows the installed hvdprof package: it has "
        f"no __init__.py, and {parent} (your script's folder, or the current directory for "
        f"python -c/-m) comes first on sys.path, so Python imported it as an empty namespace "
        f"package; hvdprof loaded itself from {package_dir} for this run. To fix it, keep "
        f"your script out of {parent} (or run python -c/-m from another folder), or rename "
        f"that folder and reinstall from its new path (pip install -e NEW_PATH)."
    )


def repair_if_shadowed() -> bool:
    """Warn and load the real package when ``hvdprof`` was imported as a namespace package.

    Returns True when a repair happened. Idempotent: the repaired module has ``__file__``.
    """
    module = sys.modules.get(PACKAGE)
    folders = shadowing_folders(module)
    if module is None or folders is None:
        return False
    init = os.path.join(PACKAGE_DIR, "__init__.py")
    print(shadowing_message(folders), file=sys.stderr, flush=True)
    spec = importlib.util.spec_from_file_location(
        PACKAGE, init, submodule_search_locations=[PACKAGE_DIR]
    )
    if spec is None or spec.loader is None:  # pragma: no cover - the file is ours
        return False
    # The same module object stays in sys.modules (submodules already hold it as their
    # parent); it becomes the real package: its path, spec and __init__'s names.
    module.__spec__ = spec
    module.__loader__ = spec.loader
    module.__file__ = init
    module.__path__ = [PACKAGE_DIR]
    spec.loader.exec_module(module)  # type: ignore[arg-type]
    return True
