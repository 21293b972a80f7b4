"""The code's structure holds: every HVDPROF_* variable is spelled in one place.

``hvdprof/config.py`` is the registry of the variables (name, parser, default, meaning);
everything else names them through ``config.name_of(attr)``, so a renamed or misspelt
variable is an error at import, not a setting silently ignored.
"""

from __future__ import annotations

import ast
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "hvdprof"


def test_no_hvdprof_variable_is_spelt_outside_the_registry() -> None:
    spelt = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == PACKAGE / "config.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and re.fullmatch(r"HVDPROF_[A-Z0-9_]+", node.value)
            ):
                spelt.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value}")
    assert not spelt, "use hvdprof.config.name_of(attr) instead:\n" + "\n".join(spelt)
