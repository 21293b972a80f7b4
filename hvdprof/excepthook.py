"""Uncaught hvdprof errors as one clear line, pointing at the user's own line.

Our errors already name the problem, the rank and the fix; a traceback through the
runtime's internals only buries that. The hook is installed by ``hvdprof.torch``; it
lives apart from :mod:`hvdprof.errors` (the lowest module, which every other imports) so
that reading the log level from the configuration does not make the two import each other.
"""

from __future__ import annotations

import contextlib
import os
import sys
import traceback
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from hvdprof.config import name_of
from hvdprof.errors import HvdprofError


def _under(path: str, folders: Iterable[str]) -> bool:
    return any(path == folder or path.startswith(folder + os.sep) for folder in folders)


@dataclass(frozen=True)
class _FrameFolders:
    """Where the frames between the user's call and our ``raise`` live."""

    #: hvdprof and torch (autograd and optimizer wrappers sit between the user and us)
    runtime: tuple[str, ...]
    #: installed libraries (site-packages), a better answer than torch but worse than the user
    libraries: tuple[str, ...]
    #: the standard library (threading, runpy); site-packages may lie inside it
    stdlib: tuple[str, ...]

    @classmethod
    def of_this_process(cls) -> _FrameFolders:
        import site
        import sysconfig

        runtime = [os.path.dirname(os.path.abspath(__file__))]
        torch_file = getattr(sys.modules.get("torch"), "__file__", None)
        if torch_file:
            runtime.append(os.path.dirname(os.path.abspath(torch_file)))
        paths = sysconfig.get_paths()
        libraries = {paths.get("purelib", ""), paths.get("platlib", "")}
        with contextlib.suppress(AttributeError):  # some virtualenvs' site.py lack these
            libraries.update(site.getsitepackages())
            libraries.add(site.getusersitepackages())
        stdlib = {paths.get("stdlib", ""), paths.get("platstdlib", "")}
        return cls(
            tuple(runtime),
            tuple(sorted(os.path.abspath(f) for f in libraries if f)),
            tuple(sorted(os.path.abspath(f) for f in stdlib if f)),
        )

    def kind(self, filename: str) -> str:
        """``user``, ``library`` or ``skip`` (hvdprof, torch, stdlib, frozen modules)."""
        if filename in ("<string>", "<stdin>"):
            return "user"  # python -c / python - : the user's own code
        if filename.startswith("<"):
            return "skip"  # <frozen runpy> and the like
        path = os.path.abspath(filename)
        if _under(path, self.runtime):
            return "skip"
        if _under(path, self.libraries):
            return "library"
        if _under(path, self.stdlib):
            return "skip"
        return "user"


def user_frame(frames: Sequence[traceback.FrameSummary]) -> str:
    """``file:line`` of the innermost frame that is the user's code ("" when none is).

    Walks from the raise outwards, past hvdprof, torch and the standard library: a
    mismatch raised inside ``loss.backward()`` or ``optimizer.step()`` should point at that
    line of the user's script, not at ``torch/autograd/function.py``. A frame in another
    installed library (site-packages) is the answer only when no frame is the user's.
    """
    folders = _FrameFolders.of_this_process()
    library = ""
    for frame in reversed(frames):
        kind = folders.kind(frame.filename)
        where = f"{frame.filename}:{frame.lineno}"
        if kind == "user":
            return where
        if kind == "library" and not library:
            library = where
    return library


def install_excepthook() -> None:
    """Print an uncaught hvdprof error as one clear line instead of a traceback.

    Our errors already name the problem, the rank and the fix; a traceback through the
    runtime's internals only buries that. HVDPROF_LOG_LEVEL=debug keeps the full traceback.
    Other exceptions go to the previous hook untouched.
    """
    previous = sys.excepthook
    if getattr(previous, "_hvdprof", False):
        return

    def hook(exc_type: type[BaseException], exc: BaseException, tb: object) -> None:
        debug = os.environ.get(name_of("log_level"), "").strip().lower() == "debug"
        if not issubclass(exc_type, HvdprofError) or debug:
            previous(exc_type, exc, tb)  # type: ignore[arg-type]
            return
        where = user_frame(traceback.extract_tb(tb))  # type: ignore[arg-type]
        suffix = (
            f" (raised at {where}; HVDPROF_LOG_LEVEL=debug shows the traceback)" if where else ""
        )
        print(f"hvdprof: error: {exc}{suffix}", file=sys.stderr, flush=True)

    hook._hvdprof = True  # type: ignore[attr-defined]
    sys.excepthook = hook
