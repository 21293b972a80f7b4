"""No function over :data:`LIMIT` lines in ``hvdprof/``, ``benchmarks/`` or ``web/app.js``.

Why: a function that long does several things, and a reader (or a reviewer comparing it
with Horovod's or HTA's code, see ``shared/STYLE.md``) cannot see its stages. Split it
into named stages (HTA's ``straggler.py`` reads as three calls), not into arbitrary
halves.

A Python function's length runs from its ``def`` line to the last line of its body
(decorators not counted), nested functions counted both in their parent and alone. In
``web/app.js`` a brace-matching scan (strings, template literals, comments and regular
expression literals skipped) measures ``function name(...) {...}`` and arrow functions
given a name (``const name = (...) => {...}``) the same way.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LIMIT = 120

#: Functions allowed over the limit for now, each with the reason; keep this short.
#: "path:qualified.name" -> why
ALLOWED: dict[str, str] = {}


def python_functions(source: str, filename: str = "<source>") -> list[tuple[str, int, int]]:
    """``(qualified name, first line, lines)`` of every function and method in a module."""
    tree = ast.parse(source, filename=filename)
    found: list[tuple[str, int, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                assert child.end_lineno is not None
                found.append(
                    (prefix + child.name, child.lineno, child.end_lineno - child.lineno + 1)
                )
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(tree, "")
    return found


# --- JavaScript ------------------------------------------------------------------------------

_JS_HEAD = re.compile(
    r"\bfunction\s*\*?\s*(?P<fn>[A-Za-z_$][\w$]*)\s*\("  # function name(
    r"|\b(?:const|let|var)\s+(?P<arrow>[A-Za-z_$][\w$]*)\s*=\s*(?:async\s+)?"
    r"(?:\([^()]*\)|[A-Za-z_$][\w$]*)\s*=>\s*\{"  # const name = (a, b) => {
)
#: after one of these (or a keyword below) a ``/`` starts a regular expression, not a division
_REGEX_AFTER = set("(,=:[!&|?{};+-*%<>~^")
_REGEX_KEYWORDS = ("return", "typeof", "case", "do", "else", "in", "of", "void", "yield")


def _js_code_mask(text: str) -> list[bool]:
    """For each character of ``text``: is it code (not inside a string, template literal's
    text, comment or regular expression)? Braces of ``${...}`` in templates are code."""
    code = [True] * len(text)
    i, n = 0, len(text)
    stack: list[int] = []  # open braces; -1 marks a template literal's ${ (its } resumes it)
    last = ""  # the last significant code character (for the regex-or-division question)
    word = ""

    def skip_string(start: int, quote: str) -> int:
        j = start + 1
        while j < n and text[j] != quote:
            j += 2 if text[j] == "\\" else 1
        for k in range(start, min(j + 1, n)):
            code[k] = False
        return j + 1

    def skip_template(start: int) -> int:
        """From after a backtick (or a ``}`` closing ``${``): to the closing backtick or an
        opening ``${``, which it leaves on the stack."""
        j = start
        while j < n:
            if text[j] == "\\":
                code[j] = False
                if j + 1 < n:
                    code[j + 1] = False
                j += 2
            elif text[j] == "`":
                code[j] = False
                return j + 1
            elif text.startswith("${", j):
                code[j] = code[j + 1] = False
                stack.append(-1)
                return j + 2
            else:
                code[j] = False
                j += 1
        return j

    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            for k in range(i, j):
                code[k] = False
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            for k in range(i, j):
                code[k] = False
            i = j
        elif c in "'\"":
            i = skip_string(i, c)
            last, word = c, ""
        elif c == "`":
            code[i] = False
            i = skip_template(i + 1)
            last, word = "`", ""
        elif c == "/" and (last in _REGEX_AFTER or last == "" or word in _REGEX_KEYWORDS):
            j, in_class = i + 1, False
            while j < n and text[j] != "\n":
                if text[j] == "\\":
                    j += 2
                    continue
                if text[j] == "[":
                    in_class = True
                elif text[j] == "]":
                    in_class = False
                elif text[j] == "/" and not in_class:
                    break
                j += 1
            for k in range(i, min(j + 1, n)):
                code[k] = False
            i = j + 1
            last, word = "/", ""
        elif c == "{":
            stack.append(i)
            last, word = c, ""
            i += 1
        elif c == "}":
            if stack and stack.pop() == -1:  # the end of a template's ${...}: back to its text
                code[i] = False
                i = skip_template(i + 1)
                last, word = "`", ""
            else:
                last, word = c, ""
                i += 1
        else:
            if c.isalnum() or c in "_$":
                word = word + c if last.isalnum() or last in "_$" else c
                last = c
            elif not c.isspace():
                last, word = c, ""
            i += 1
    return code


def js_functions(text: str) -> list[tuple[str, int, int]]:
    """``(name, first line, lines)`` of every named function in a script."""
    code = _js_code_mask(text)
    found: list[tuple[str, int, int]] = []
    for match in _JS_HEAD.finditer(text):
        if not code[match.start()]:
            continue
        name = match.group("fn") or match.group("arrow")
        start = match.end() - 1 if match.group("arrow") else _after_parameters(text, code, match)
        open_at = text.find("{", start)
        while open_at >= 0 and not code[open_at]:
            open_at = text.find("{", open_at + 1)
        depth, i = 0, open_at
        while i < len(text):
            if code[i] and text[i] == "{":
                depth += 1
            elif code[i] and text[i] == "}":
                depth -= 1
                if depth == 0:
                    break
            i += 1
        first = text.count("\n", 0, match.start()) + 1
        found.append((name, first, text.count("\n", 0, i) + 1 - first + 1))
    return found


def _after_parameters(text: str, code: list[bool], match: re.Match[str]) -> int:
    """The index after the ``)`` closing a ``function name(`` head's parameters."""
    depth, i = 1, match.end()
    while i < len(text) and depth:
        if code[i]:
            depth += {"(": 1, ")": -1}.get(text[i], 0)
        i += 1
    return i


# --- the tests ---------------------------------------------------------------------------------


def _long_python_functions() -> dict[str, int]:
    long: dict[str, int] = {}
    for root in ("hvdprof", "benchmarks"):
        for path in sorted((REPO / root).rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            for name, _first, lines in python_functions(path.read_text("utf-8"), rel):
                if lines > LIMIT:
                    long[f"{rel}:{name}"] = lines
    return long


def test_no_python_function_over_the_limit() -> None:
    long = _long_python_functions()
    over = {key: lines for key, lines in long.items() if key not in ALLOWED}
    assert not over, f"functions over {LIMIT} lines (split into named stages): {over}"


def test_the_allow_list_holds_only_long_functions() -> None:
    """An entry whose function was split (or renamed) goes: the list stays as short as it can."""
    stale = sorted(set(ALLOWED) - set(_long_python_functions()))
    assert not stale, f"no longer over {LIMIT} lines, remove from ALLOWED: {stale}"


def test_no_web_function_over_the_limit() -> None:
    functions = js_functions((REPO / "web" / "app.js").read_text(encoding="utf-8"))
    names = {name for name, _first, _lines in functions}
    assert {"drawTimeline", "drawGpu", "kernelHover"} <= names, sorted(
        names
    )  # the scan finds real functions
    over = {f"web/app.js:{name} (line {first})": n for name, first, n in functions if n > LIMIT}
    assert not over, f"functions over {LIMIT} lines (split into named stages): {over}"


def test_the_scans_measure_what_they_should() -> None:
    """The counting itself: a known function's length, braces in strings, templates,
    comments and regular expressions not counted as code."""
    script = (
        "function outer(a) {\n"  # 1
        '  const s = "}{";\n'
        "  const t = `x ${a + `${'}'}`} }`;\n"
        "  // }\n"
        "  /* { */\n"
        "  const r = /[}]/g;\n"
        "  const inner = (x) => {\n"  # 7
        "    return x / 2 / 1;\n"
        "  };\n"  # 9
        "  return { a: 1 };\n"
        "}\n"  # 11
        "function after() { return 1; }\n"  # 12
    )
    found = {name: (first, lines) for name, first, lines in js_functions(script)}
    assert found == {"outer": (1, 11), "inner": (7, 3), "after": (12, 1)}, found
    source = "class A:\n    @property\n    def f(self):\n        x = 1\n\n        return x\n"
    assert python_functions(source) == [("A.f", 3, 4)]
