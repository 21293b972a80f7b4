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


def _is_module(name: str) -> bool:
    """Whether ``hvdprof.<name>`` is a module or package (not a name its ``__init__`` holds)."""
    return (PACKAGE / f"{name}.py").is_file() or (PACKAGE / name / "__init__.py").is_file()


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
                if node.module == "hvdprof":  # a submodule, or a name of hvdprof/__init__.py
                    targets = [
                        f"hvdprof.{a.name}" if _is_module(a.name) else "hvdprof" for a in node.names
                    ]
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
    "errors": {"config", "common", "trace", "runtime", "timeline", "autotune", "analysis", "torch"},
    "common": {"trace", "runtime", "timeline", "autotune", "analysis", "dashboard", "torch"},
    # the trace layer: below the timeline (which writes the files it reads) and the analyses
    "trace": {"runtime", "timeline", "autotune", "analysis", "dashboard", "torch", "cli"},
    "timeline": {"runtime", "autotune", "analysis", "dashboard", "torch"},
    "autotune": {"runtime", "timeline", "analysis", "dashboard", "torch"},
    "runtime": {"analysis", "dashboard", "torch", "cli"},
    "analysis": {"runtime", "torch", "dashboard", "cli"},
    "dashboard": {"runtime", "torch", "cli"},
}


#: the launchers (hvdprof/launch/) start ranks: above runtime and timeline (and every
#: other package named above), below the CLI and the Ray and Spark front ends that reuse
#: them (the elastic driver, the output sink)
FORBIDDEN["launch"] = {"analysis", "dashboard", "torch", "cli", "ray", "spark"}
for _lower in set(FORBIDDEN) - {"launch"}:
    FORBIDDEN[_lower].add("launch")


def test_the_launchers_sit_between_runtime_and_the_front_ends() -> None:
    graph = _import_graph()
    assert "runtime" in graph["launch"]  # (the graph holds the package: it was read)
    assert all("launch" in graph[front] for front in ("cli", "ray", "spark"))
    stray = [p.name for p in PACKAGE.glob("*.py") if "launch" in p.stem]
    assert not stray, f"launchers belong in hvdprof/launch/: {stray}"


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


#: the layer diagram in the docs, which this file keeps true
LAYERS_DOC = ROOT / "docs" / "how-it-works.md"


def _diagram() -> tuple[dict[str, str], dict[str, set[str]]]:
    """The layer diagram of ``docs/how-it-works.md``: node -> the path its label names,
    and node -> the nodes it points at (``a --> b & c``)."""
    block = re.search(r"```mermaid\n(.*?)```", LAYERS_DOC.read_text(), re.S)
    assert block, f"{LAYERS_DOC.name} has no mermaid block of the layers"
    node = r'\s*(\w+)(?:\["([^"]+)"\])?\s*'
    labels: dict[str, str] = {}
    arrows: dict[str, set[str]] = {}
    for line in block.group(1).splitlines()[1:]:  # after "flowchart TD"
        head, *tail = line.split("-->")
        parts = [head, *tail[0].split("&")] if tail else [head]
        ends = [re.fullmatch(node, part) for part in parts]
        assert len(tail) <= 1 and all(ends), f"cannot read this diagram line: {line!r}"
        for end in ends:
            if end.group(2):
                labels[end.group(1)] = end.group(2)
        arrows.setdefault(ends[0].group(1), set()).update(end.group(1) for end in ends[1:])
    return labels, arrows


def _layer_name(path: str) -> str:
    """``hvdprof/trace/`` -> ``trace``; ``hvdprof/cli.py`` -> ``cli``; ``hvdprof/__init__.py``
    -> ``hvdprof`` (the names :func:`_import_graph` uses)."""
    rel = path.rstrip("/").removeprefix("hvdprof/").removesuffix(".py")
    return "hvdprof" if rel == "__init__" else rel


def _diagram_layers() -> dict[str, set[str]]:
    """Package -> every package the diagram lets it import (what it reaches)."""
    labels, arrows = _diagram()
    unnamed = sorted(set(arrows).union(*arrows.values()) - set(labels))
    assert not unnamed, f"diagram nodes without a path label: {unnamed}"
    reach: dict[str, set[str]] = {}

    def below(n: str, seen: tuple[str, ...]) -> set[str]:
        assert n not in seen, "the diagram has a cycle: " + " --> ".join([*seen, n])
        if n not in reach:
            reach[n] = set()
            for m in arrows.get(n, ()):
                reach[n] |= {m} | below(m, (*seen, n))
        return reach[n]

    return {_layer_name(labels[n]): {_layer_name(labels[m]) for m in below(n, ())} for n in labels}


def test_the_layer_diagram_names_every_module_and_nothing_else() -> None:
    labels, _ = _diagram()
    missing = [p for p in labels.values() if not (ROOT / p).exists()]
    assert not missing, f"{LAYERS_DOC.name}: the diagram names what does not exist: {missing}"
    shown = {_layer_name(p) for p in labels.values()}
    real = {_layer_name(p.relative_to(ROOT).as_posix()) for p in PACKAGE.glob("*.py")}
    real |= {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    assert not real - shown, (
        f"{LAYERS_DOC.name}: add these to the layer diagram: {sorted(real - shown)}"
    )
    assert not shown - real, f"{LAYERS_DOC.name}: not modules of hvdprof: {sorted(shown - real)}"


def test_every_import_is_allowed_by_the_layer_diagram() -> None:
    layers = _diagram_layers()
    graph = _import_graph()
    assert len(graph) > 10 and len(layers) > 10  # both were read
    wrong = [
        f"{src} imports {dst}"
        for src in sorted(graph)
        for dst in sorted(graph[src] - layers.get(src, set()))
    ]
    assert not wrong, (
        f"imports that {LAYERS_DOC.name}'s layer diagram does not allow "
        "(fix the import, or draw the arrow if it is right):\n" + "\n".join(wrong)
    )


def test_the_layer_diagram_allows_nothing_the_rules_forbid() -> None:
    layers = _diagram_layers()
    drawn = [
        f"{src} reaches {dst}"
        for src, banned in sorted(FORBIDDEN.items())
        for dst in sorted(layers.get(src, set()) & banned)
    ]
    assert not drawn, f"{LAYERS_DOC.name}'s diagram contradicts FORBIDDEN:\n" + "\n".join(drawn)


def _module_graph() -> dict[str, set[str]]:
    """Module -> hvdprof modules it imports (module level or inside functions alike;
    ``from pkg import name`` counts as the submodule when ``name`` is one)."""
    modules: dict[str, pathlib.Path] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        modules[".".join(p for p in rel.parts if p != "__init__")] = path
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package[: len(package) - (node.level - 1)]
                    base = ".".join([*up, *([node.module] if node.module else [])])
                if base.split(".")[0] == "hvdprof":
                    targets = [f"{base}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names if a.name.split(".")[0] == "hvdprof"]
            for target in targets:
                while target not in modules and "." in target:
                    target = target.rsplit(".", 1)[0]
                if target in modules and target != name:
                    graph.setdefault(name, set()).add(target)
    return graph


def test_no_import_cycle_between_modules() -> None:
    # a module that imports its own importer (runtime/environment.py once reached back
    # into runtime.py inside a function) is two concepts tangled: pass what it needs in
    graph = _module_graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def connect(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    assert len(graph) > 50  # the graph was read (a parse that found nothing passes anything)
    assert not cycles, "modules importing each other:\n" + "\n".join(map(str, cycles))


#: what detects a trace format: the registry's own business (hvdprof/trace/formats.py)
_FORMAT_DETECTION = {
    "TRACE_RE",
    "MANIFEST_RE",
    "KINETO_NAME_RE",
    "is_kineto_file",
    "looks_like_kineto",
    "sniff_rank",
    "_is_horovod",
    "looks_like_horovod",
}
_FORMAT_MODULES = {
    "hvdprof.trace.kineto_format",
    "hvdprof.trace.horovod_format",
    "hvdprof.trace.hvdprof_format",
    "hvdprof.trace.hvdprof_reader",
}


def test_no_format_is_detected_outside_the_registry() -> None:
    # the dashboard asks hvdprof.trace.formats what a run is (and of which format); a
    # copy of a format's detection there is a second truth that drifts (issue 39)
    found = []
    checked = 0
    for path in sorted((PACKAGE / "dashboard").rglob("*.py")):
        checked += 1
        for node in ast.walk(ast.parse(path.read_text())):
            names: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module:
                if node.module in _FORMAT_MODULES:
                    names.append(node.module)
                names += [a.name for a in node.names if a.name in _FORMAT_DETECTION]
                if node.module == "hvdprof.analysis":
                    names += [
                        f"hvdprof.analysis.{a.name}"
                        for a in node.names
                        if f"hvdprof.analysis.{a.name}" in _FORMAT_MODULES
                    ]
            elif isinstance(node, ast.Import):
                names += [a.name for a in node.names if a.name in _FORMAT_MODULES]
            elif isinstance(node, ast.Name) and node.id in _FORMAT_DETECTION:
                names.append(node.id)
            elif isinstance(node, ast.Attribute) and node.attr in _FORMAT_DETECTION:
                names.append(node.attr)
            found += [f"{path.relative_to(ROOT)}:{node.lineno}: {n}" for n in names]
    assert checked > 3  # the dashboard's modules were read
    assert not found, "ask hvdprof.trace.formats instead:\n" + "\n".join(found)


def _analysis_function_names() -> set[str]:
    """The analysis functions, as the registry finds them (each module's ``ANALYSIS``)."""
    from hvdprof.analysis import registry

    return set(registry.function_names())


def test_no_front_end_names_an_analysis_function() -> None:
    # the CLI's printer and the dashboard loop over the registry: an analysis named there
    # again is a second list of the analyses, which goes stale when one is added
    names = _analysis_function_names()
    assert {"time_breakdown", "find_stragglers", "gpu_report", "autotune_surface"} <= names
    word = re.compile(r"\b(" + "|".join(sorted(names)) + r")\b")
    paths = [*sorted((PACKAGE / "dashboard").rglob("*.py")), PACKAGE / "analysis" / "cli.py"]
    named = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Name):
                found = [node.id]
            elif isinstance(node, ast.Attribute):
                found = [node.attr]
            elif isinstance(node, ast.alias):
                found = [node.name.rpartition(".")[2]]
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                found = word.findall(node.value)
            else:
                continue
            named += [
                f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', '?')}: {n}"
                for n in found
                if n in names
            ]
    assert not named, "loop over hvdprof.analysis.registry instead:\n" + "\n".join(named)


#: the trace layer's modules that read a format's files (the schema modules, model, gpu and
#: manifest, are what analyses read)
_READERS = {
    "hvdprof.trace.formats",
    "hvdprof.trace.files",
    "hvdprof.trace.columns",
    "hvdprof.trace.loader",
    "hvdprof.trace.chrome_json",
    "hvdprof.trace.hvdprof_reader",
    "hvdprof.trace.hvdprof_format",
    "hvdprof.trace.kineto_format",
    "hvdprof.trace.horovod_format",
}
#: the one analysis that reads input besides the run: ``--kineto`` traces of its ranks
#: (through the trace layer's one Kineto reader, ``kineto_format.backward_compute``)
_READS_ITS_OWN_INPUT = {"hvdprof.analysis.overlap": {"hvdprof.trace.kineto_format"}}


def _analysis_modules() -> set[str]:
    """The modules the analysis registry finds the built-in analyses in, and the modules
    their tables are printed by."""
    from hvdprof.analysis import registry

    tables = {registry.module_of(a.table) for a in registry.analyses() if a.table}
    return set(registry.BUILTIN_MODULES) | tables


def test_analyses_ask_the_runs_capabilities_never_its_format() -> None:
    # HTA's analyzers never see the file format: an analysis that tests run.format (or
    # imports a reader) is a second place that knows how a format looks, which a new
    # format then has to be added to; they ask run.capabilities and the typed tables
    asked = []
    paths = sorted((PACKAGE / "analysis").rglob("*.py"))
    for path in paths:
        tree = ast.parse(path.read_text())
        called = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr == "format" and id(node) not in called:
                asked.append(f"{path.relative_to(ROOT)}:{node.lineno}: .format")
            if isinstance(node, ast.Compare):
                names = [n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)]
                if "source_format" in names:
                    asked.append(f"{path.relative_to(ROOT)}:{node.lineno}: source_format ==")
    assert len(paths) > 20  # the analyses were read
    assert not asked, "ask run.capabilities instead:\n" + "\n".join(asked)
    graph = _module_graph()
    analyses = _analysis_modules()
    assert {"hvdprof.analysis.stragglers", "hvdprof.analysis.fusion"} <= analyses
    reading = [
        f"{module} imports {target}"
        for module in sorted(analyses)
        for target in sorted(graph.get(module, set()) & _READERS)
        if target not in _READS_ITS_OWN_INPUT.get(module, set())
    ]
    assert not reading, "analyses read the run, not files:\n" + "\n".join(reading)


def test_the_trace_layer_is_one_package_below_the_analyses() -> None:
    graph = _import_graph()
    assert "trace" in graph["analysis"] and "trace" in graph["timeline"]
    assert not graph.get("trace", set()) - {"common", "config", "errors", "hvdprof"}
    # every format's reader lives in it: no module elsewhere parses trace JSON by hand
    old = [
        p.relative_to(ROOT).as_posix()
        for p in [*PACKAGE.glob("analysis/*_format.py"), PACKAGE / "timeline" / "reader.py"]
        if p.exists()
    ]
    assert not old, f"trace readers belong in hvdprof/trace/: {old}"


def test_the_analyses_shared_modules_sit_below_every_analysis() -> None:
    # shared vocabulary and statistics (the phases' categories and words, the bootstrap,
    # steps, intervals) are what the analyses import besides one another; none of them may
    # reach an analysis, or an analysis depends on another through a helper (issue 51: the
    # categories lived in the breakdown analysis, and five modules imported it for them)
    from hvdprof.analysis import registry

    graph = _module_graph()
    analyses = set(registry.BUILTIN_MODULES)
    shared = {
        m
        for a in analyses
        for m in graph.get(a, set())
        if m.startswith("hvdprof.analysis.") and m not in analyses
    }
    assert {"hvdprof.analysis.phases", "hvdprof.analysis.bootstrap"} <= shared  # (read)
    wrong = []
    for module in sorted(shared):
        seen, todo = set(), [module]
        while todo:
            for nxt in graph.get(todo.pop(), set()) - seen:
                seen.add(nxt)
                todo.append(nxt)
        wrong += [f"{module} reaches {a}" for a in sorted(seen & analyses)]
    assert not wrong, "move what the analyses share below them:\n" + "\n".join(wrong)
