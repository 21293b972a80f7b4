"""Where ``hvdprof`` may write a file a user named: ``analyze --summary FILE``,
``report -o FILE``, ``ab --json FILE``, ``timeline merge -o FILE`` and the merged trace
``HOROVOD_TIMELINE=FILE`` leaves.

A path on the command line is a wish, not a licence: ``--summary /dev/null`` run as root
would replace the device with a regular file, ``--summary RUN/rank.0.json`` would put a
12 kB summary where an 897 kB trace was, and a symbolic link would be replaced by a
file rather than followed. So a file is written only to a path that does not exist yet
or over a regular file that is not a trace (an older summary, a stray text file), never
over a device, FIFO, socket, directory or symbolic link, and never over anything the
trace readers would take for a trace or part of a run. A merged trace (``timeline
merge -o``, ``HOROVOD_TIMELINE``) may replace an older merged trace, the file it is
meant to renew, but never a file of a run (a rank's timeline, its manifest, a
torch.profiler trace named as one).

The write is atomic (a temporary file beside the target, then ``os.replace``: a CI job
killed mid-write keeps the old baseline), and the temporary file is removed on every
path out, an exception or Ctrl+C included.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path

from hvdprof.errors import HvdprofError

#: a summary names its format in its first bytes (``read_summary`` looks there too)
_SUMMARY_MARK = b'"format":"hvdprof-summary"'


class OutputRefused(HvdprofError):
    """The named output path is not one hvdprof will write over."""


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def _is_summary(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
    except OSError:
        return False
    return _SUMMARY_MARK in head.replace(b" ", b"").replace(b"\n", b"")


def _is_trace(path: str) -> bool:
    """Would a reader take ``path`` for a trace, or for a file of a run directory?"""
    from hvdprof.trace.formats import part_of_run, single_file_run

    p = Path(path)
    try:
        return part_of_run(p) or single_file_run(p)
    except (OSError, ValueError):
        return True  # cannot tell: not replaced


def _is_run_file(path: str) -> bool:
    """One of the per-rank files of a run, by its name (what a merged trace may not
    replace)."""
    from hvdprof.trace.kineto_format import KINETO_NAME_RE
    from hvdprof.trace.manifest import MANIFEST_RE, TRACE_RE

    name = os.path.basename(path)
    return bool(TRACE_RE.match(name) or MANIFEST_RE.match(name) or KINETO_NAME_RE.match(name))


def refusal(path: str, what: str = "--summary", *, trace_ok: bool = False) -> str | None:
    """Why ``path`` must not be written (one line naming it), or None when it may
    (``trace_ok``: the output is itself a merged trace, which may renew an older one)."""
    if not path:
        return f"{what}: expected a file name, got ''"
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        parent = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(parent):
            return f"{what} {path}: there is no directory {parent}; nothing written"
        return None  # a new file
    except OSError as exc:
        return f"{what} {path}: cannot look at it ({exc.strerror or exc}); nothing written"
    if not stat.S_ISREG(info.st_mode):
        extra = ""
        if stat.S_ISLNK(info.st_mode):
            with contextlib.suppress(OSError):
                extra = f" (to {os.readlink(path)}); name the file itself"
        return f"{what} {path}: it is {_kind(info.st_mode)}{extra}; not replaced"
    if trace_ok:
        if _is_run_file(path):
            return f"{what} {path}: it is a file of a run; not replaced: name a new file"
        return None
    if not _is_summary(path) and _is_trace(path):
        return f"{what} {path}: it is a trace (or part of a run); not replaced: name a new file"
    return None


def write_atomically(path: str, data: bytes, what: str = "--summary") -> None:
    """Write ``data`` to ``path`` when :func:`refusal` allows it (else
    :class:`OutputRefused`); the old file stays whole until the new one is complete."""
    problem = refusal(path, what)
    if problem is not None:
        raise OutputRefused(problem)
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            umask = os.umask(0)
            os.umask(umask)
            os.fchmod(f.fileno(), 0o666 & ~umask)  # as open() would have made it
            f.write(data)
        problem = refusal(path, what)  # changed while we wrote? (a link planted meanwhile)
        if problem is not None:
            raise OutputRefused(problem)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
