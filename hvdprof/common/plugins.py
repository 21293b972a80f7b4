"""Plug-ins: analyses and trace formats that live outside hvdprof, each in one module.

A plug-in module declares what it adds as one module-level attribute (``ANALYSIS`` for an
analysis, ``FORMAT`` for a trace format), the way each built-in module declares its own.
Two places name plug-in modules, read when the registry is first used (not at import):

- an entry point in an installed distribution's metadata, group ``hvdprof.analyses`` or
  ``hvdprof.formats`` (``toy = "mypkg.toy"``, or ``"mypkg.toy:ANALYSIS"`` to name the
  object itself): how a package that is pip-installed adds itself, as pytest's plug-ins do;
- a variable, ``HVDPROF_ANALYSES`` or ``HVDPROF_FORMATS``: comma-separated module names
  importable on ``sys.path`` (``PYTHONPATH``), for a file that is not packaged.

A plug-in that cannot be imported, or declares nothing, is one :class:`PluginError`
naming it and where it was named: the CLI prints that line and stops.
"""

from __future__ import annotations

import importlib
import os
import re
from importlib import metadata
from typing import Any

from hvdprof import config
from hvdprof.errors import HvdprofError

_MODULE_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


class PluginError(HvdprofError):
    """A plug-in named in the environment or an entry point could not be loaded."""


def named_in_variable(attr: str) -> list[str]:
    """The modules ``Config.<attr>``'s variable names (``HVDPROF_ANALYSES``), in order."""
    variable = config.name_of(attr)
    raw = os.environ.get(variable, "")
    names = [n.strip() for n in raw.split(",") if n.strip()]
    for name in names:
        if not _MODULE_NAME.fullmatch(name):
            raise PluginError(f"{variable}={raw!r}: {name!r} is not a module name")
    return names


def load(group: str, attr: str, declared: str) -> list[tuple[str, Any]]:
    """``(where it was named, the object declared)`` for every plug-in: the entry points of
    ``group`` first (by name), then the modules in ``attr``'s variable, each once."""
    found: list[tuple[str, Any]] = []
    seen: set[str] = set()
    for point in sorted(metadata.entry_points(group=group), key=lambda p: p.name):
        where = f"entry point {point.name} = {point.value} (group {group})"
        if point.value in seen:
            continue
        seen.add(point.value)
        if point.attr:
            found.append((where, _guarded(where, point.load)))
        else:
            found.append((where, _declared(where, point.module, declared)))
    variable = config.name_of(attr)
    for name in named_in_variable(attr):
        if name in seen:
            continue
        seen.add(name)
        found.append((f"{variable}: {name}", _declared(f"{variable}: {name}", name, declared)))
    return found


def _declared(where: str, module_name: str, declared: str) -> Any:
    module = _guarded(where, lambda: importlib.import_module(module_name))
    value = getattr(module, declared, None)
    if value is None:
        raise PluginError(f"{where}: the module {module_name} declares no {declared}")
    return value


def _guarded(where: str, call: Any) -> Any:
    try:
        return call()
    except PluginError:
        raise
    except Exception as exc:  # a plug-in's own bug or a missing module: said, in one line
        raise PluginError(
            f"{where}: cannot load the plug-in ({type(exc).__name__}: {exc})"
        ) from None
