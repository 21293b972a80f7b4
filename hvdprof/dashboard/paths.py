"""Mapping names from a URL to files, without ever leaving the served directory.

Every path the API accepts (a run, a static file) goes through :func:`resolve_inside`:
``..`` components, absolute paths, NUL bytes and symlinks whose target lies outside the
root are refused. Starlette has already percent-decoded the path, so ``%2e%2e%2f`` arrives
here as ``../`` and is refused the same way.

:func:`web_directory` finds the page itself: ``hvdprof/_web`` inside an installed wheel
(``pyproject.toml`` maps ``web/`` there), or ``web/`` at the root of a checkout.
"""

from __future__ import annotations

import importlib.resources
import importlib.util
from pathlib import Path, PurePosixPath

#: Files the page needs; a directory lacking one of them is not the page.
PAGE_FILES: tuple[str, ...] = ("index.html", "app.js", "style.css")


class OutsideRootError(ValueError):
    """A requested path leads outside the served directory (or is malformed)."""


def resolve_inside(root: Path, relative: str) -> Path:
    """``root / relative`` with symlinks resolved, or OutsideRootError if it escapes ``root``."""
    if "\x00" in relative or "\\" in relative:
        raise OutsideRootError(f"malformed path {relative!r}")
    parts = PurePosixPath(relative).parts
    if relative.startswith("/") or any(part == ".." for part in parts):
        raise OutsideRootError(f"path {relative!r} leads outside the served directory")
    root = root.resolve()
    try:
        candidate = (root.joinpath(*[p for p in parts if p != "."])).resolve()
    except (RuntimeError, OSError) as exc:  # a symbolic link loop ("Symlink loop from ...")
        raise OutsideRootError(f"path {relative!r} cannot be resolved ({exc})") from None
    if candidate != root and root not in candidate.parents:
        raise OutsideRootError(f"path {relative!r} leads outside the served directory")
    return candidate


def escaping_links(root: Path, directory: Path) -> list[str]:
    """Names of entries of ``directory`` that are symlinks resolving outside ``root``."""
    root = root.resolve()
    bad: list[str] = []
    try:
        entries = list(directory.iterdir()) if directory.is_dir() else [directory]
    except OSError:
        return bad
    for entry in entries:
        if entry.is_symlink():
            try:
                target = entry.resolve()
            except (RuntimeError, OSError):  # a link loop leads nowhere, outside or not
                continue
            if target != root and root not in target.parents:
                bad.append(entry.name)
    return bad


def _page_at(directory: Path) -> bool:
    return all((directory / name).is_file() for name in PAGE_FILES)


def web_directory() -> Path:
    """The dashboard page's static files.

    Found through the import system, not ``__file__``, so it follows wherever ``hvdprof``
    was imported from: the wheel's ``hvdprof/_web`` (a regular install), else ``web/``
    beside the package directory (a checkout or an editable install, where the repo's
    ``web/`` is the page being edited). When neither holds the page, the packaged location
    is returned and the server answers 404 with the reason instead of a page.
    """
    packaged = Path(str(importlib.resources.files("hvdprof") / "_web"))
    if _page_at(packaged):
        return packaged
    spec = importlib.util.find_spec("hvdprof")
    for location in (spec.submodule_search_locations or []) if spec else []:
        checkout = Path(location).resolve().parent / "web"
        if _page_at(checkout):
            return checkout
    return packaged
