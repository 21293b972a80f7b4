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


def _package(module: str) -> str:
    """``hvdprof.runtime.cycle`` -> ``runtime``; ``hvdprof.errors`` -> ``errors``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "hvdprof"


def _import_graph() -> dict[str, set[str]]:
    """Package -> packages it imports (module level or inside functions alike)."""
    graph: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        parts = [p for p in rel.parts if p != "__init__"]
        src = _package(".".join(parts))
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                if node.module == "hvdprof":
                    targets = [f"hvdprof.{a.name}" for a in node.names]
                elif node.module.startswith("hvdprof."):
                    targets = [node.module]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names if a.name.startswith("hvdprof.")]
            for target in targets:
                dst = _package(target)
                if dst != src:
                    graph.setdefault(src, set()).add(dst)
    return graph


#: package -> packages it must never import: data flows one way (front end -> runtime ->
#: timeline sink and autotuner; trace files -> analysis -> CLI and dashboard), and the
#: shared vocabulary (common) sits below all of them
FORBIDDEN: dict[str, set[str]] = {
    "errors": {"config", "common", "runtime", "timeline", "autotune", "analysis", "torch"},
    "common": {"runtime", "timeline", "autotune", "analysis", "dashboard", "torch"},
    "timeline": {"runtime", "autotune", "analysis", "dashboard", "torch"},
    "autotune": {"runtime", "timeline", "analysis", "dashboard", "torch"},
    "runtime": {"analysis", "dashboard", "torch", "cli"},
    "analysis": {"runtime", "torch", "dashboard", "cli"},
    "dashboard": {"runtime", "torch", "cli"},
}


def test_lower_packages_never_import_higher_ones() -> None:
    graph = _import_graph()
    wrong = [
        f"{src} imports {dst}"
        for src, banned in FORBIDDEN.items()
        for dst in sorted(graph.get(src, set()) & banned)
    ]
    assert not wrong, "\n".join(wrong)


def test_no_import_cycle_between_packages() -> None:
    graph = _import_graph()
    cycles = []

    def visit(node: str, path: list[str]) -> None:
        for nxt in sorted(graph.get(node, ())):
            if nxt == path[0]:
                cycles.append(" -> ".join([*path, nxt]))
            elif nxt not in path and nxt > path[0]:  # each cycle once, from its least node
                visit(nxt, [*path, nxt])

    for start in sorted(graph):
        visit(start, [start])
    assert not cycles, "\n".join(cycles)
