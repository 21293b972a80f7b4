"""Mapping names from a URL to files, without ever leaving the served directory.

Every path the API accepts (a run, a static file) goes through :func:`resolve_inside`:
``..`` components, absolute paths, NUL bytes and symlinks whose target lies outside the
root are refused. Starlette has already percent-decoded the path, so ``%2e%2e%2f`` arrives
here as ``../`` and is refused the same way.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath


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
    candidate = (root.joinpath(*[p for p in parts if p != "."])).resolve()
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
            target = entry.resolve()
            if target != root and root not in target.parents:
                bad.append(entry.name)
    return bad
