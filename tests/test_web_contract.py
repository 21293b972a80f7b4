"""The page reads no key of an API answer that the API's generated contract lacks.

``web/app.js`` draws every section from ``/api/...`` answers whose types are generated
from the analyses' result types (:mod:`hvdprof.analysis.schema`, the dashboard's
``/openapi.json``). A field renamed in a result type would leave the page reading
``undefined`` and drawing nothing, with no error anywhere; this file finds every key the
page reads of an answer and fails naming the ones the contract does not have.

How: ``app.js`` is parsed (tree-sitter's JavaScript grammar) and the answers are followed
through it, a small type inference over the contract (the app's ``openapi()``, made in
this process, so it cannot go stale):

- the roots: ``api("api/…")`` answers the response model of that path, and the drawer
  the ``DRAWERS`` table names for an analysis gets that analysis's typed ``data``;
- from there, through variables, ``state``'s fields, object and array literals, the
  arguments of the page's own functions and of array methods' callbacks, ``for … of``
  and return values; a member read of a typed object (``r.fill_mean``, a destructured
  key, ``x["key"]``) is checked against its schema's properties.

A key read by a computed name on a typed object (``r[key]``) cannot be checked and is
itself an error: the page reads a result's keys by name (or through an accessor
function that does). So is a read of a key the contract names, of a value the check
could not follow to an answer, unless :data:`UNFOLLOWED` lists it with what it is (a DOM
element's ``id``). A value is followed wherever the page sends it, not per call: one
helper given two answers (``rankSeries``: the fusion card's ranks and the GPU card's)
holds their union, and a read of a union must be a key of one of its members. What the
contract leaves untyped is listed in :data:`UNTYPED` (checked against real answers) and
:data:`NOT_IN_OPENAPI`, each with why.
"""

from __future__ import annotations

import copy
import pathlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import tree_sitter
import tree_sitter_javascript

ROOT = pathlib.Path(__file__).resolve().parents[1]
APP_JS = ROOT / "web" / "app.js"

#: the columns of a timeline window's single slices (``TimelineWindow.slices``)
SLICE_COLUMNS = frozenset({
    "row", "start_us", "dur_us", "phase", "name", "tensor", "op", "bytes", "group",
    "group_tensors", "backend", "dtype",
    # a GPU event of a stream lane (gpu_lanes.kernel_columns)
    "kind", "short_name", "stream", "launch_us", "launch_delay_us", "launched_in", "correlation",
})  # fmt: skip
#: What the contract declares without naming its keys, as the page reads it. The timeline
#: window's tables are columns (``TimelineWindow.slices`` and ``.buckets``: one list per
#: column, ``dict[str, list]``) and ``rows`` is ``list[dict]``: the keys below are those
#: ``hvdprof.analysis.window`` and ``gpu_lanes`` write, which
#: :func:`test_the_untyped_tables_hold_the_keys_listed` checks on real windows.
UNTYPED: dict[tuple[str, str], tuple[str, frozenset[str]]] = {
    ("TimelineWindow", "rows"): (
        "rows",
        frozenset({"row", "label", "rank", "tensor", "phase", "stream", "role"}),
    ),
    ("TimelineWindow", "slices"): ("columns", SLICE_COLUMNS),
    ("TimelineWindow", "buckets"): (
        "columns",
        frozenset({"row", "start_us", "dur_us", "phase", "count", "busy_us", "phase_us"}),
    ),
}
#: Answers outside ``/openapi.json``, by path: what they are, and how the page reads them.
NOT_IN_OPENAPI = {
    "api/events": "server-sent events (hello; changed {kind, run, version, at}; runs), "
    "written in hvdprof/dashboard/live.py: the page opens them with EventSource, not api(), "
    "and reads `run` of a changed event (test_live_updates_while_a_job_writes covers it)",
}

#: Reads of keys the contract also names, of values that are not API answers (or not
#: followed): (the page's function, the object read) -> what it is.
UNFOLLOWED = {
    ("api", "response"): "fetch()'s Response",
    ("api", "body"): "an error answer's body (FastAPI's {detail})",
    ("draw", "el"): "a DOM element (its id)",
    ("drawTimeline", "el.dataset"): "a DOM element's data attributes",
    ("drawGpu", "tr.dataset"): "a DOM element's data attributes",
    ("drawSurface", "el.dataset"): "a DOM element's data attributes",
    ("genericCard", "card"): "a DOM element (its id)",
    ("timelineBars", "g"): "the page's own bars by phase (a Map's entries are not followed)",
    ("connectLive", "e"): "an EventSource message (its data: NOT_IN_OPENAPI)",
}
#: methods of an array (or a string) the page calls, on a value that holds one there
METHODS = {
    "map", "flatMap", "forEach", "filter", "find", "findIndex", "some", "every", "sort",
    "slice", "concat", "includes", "indexOf", "join", "reduce", "reverse", "push", "flat",
}  # fmt: skip
#: the page's one converter of a column table into records (``rows(data.slices)``)
ROWS_FUNCTION = "rows"
#: the page's table of the analyses it draws itself: name -> drawer
DRAWERS_TABLE = "DRAWERS"
#: array methods whose callbacks get the array's items (argument index -> parameter indices)
ITEM_CALLBACKS = {
    **dict.fromkeys(
        ("map", "flatMap", "forEach", "filter", "find", "findIndex", "some", "every"), (0,)
    ),
    "sort": (0, 1),
    "reduce": (1,),
}
SAME_ARRAY = {"filter", "slice", "sort", "reverse", "concat"}
ONE_ITEM = {"find", "pop", "shift", "at", "get"}
#: a Map or Set the page makes holds (gives back with ``get``, spreads) what it was made of
COLLECTIONS = {b"Map", b"Set"}
#: what puts an item into an array, a Set or a Map: method -> the argument that is the item
ADDS = {"push": 0, "add": 0, "set": 1}
SCOPES = {
    "program",
    "function_declaration",
    "function_expression",
    "arrow_function",
    "method_definition",
}


# ------------------------------------------------------------------ abstract values
class Shape:
    """A schema of the contract: what an answer (or a part of it) holds."""

    def __init__(self, name: str, node: dict[str, Any]) -> None:
        self.name, self.node = name, node

    def __hash__(self) -> int:
        return hash((self.name, id(self.node)))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Shape) and (self.name, id(self.node)) == (
            other.name,
            id(other.node),
        )

    def __repr__(self) -> str:
        return self.name


@dataclass(frozen=True)
class Made:
    """An object, array or function the page makes (at ``site``): its fields, items or
    parameters and return value live in slots keyed by it."""

    kind: str  # "object", "array", "function"
    site: tuple[int, int]


Value = Shape | Made
Values = frozenset[Value]
NONE: Values = frozenset()


def key_of(node: tree_sitter.Node) -> tuple[int, int]:
    return (node.start_byte, node.end_byte)


@dataclass
class Read:
    """One key the page reads of a typed answer."""

    line: int
    key: str
    shapes: tuple[str, ...]
    ok: bool


class Contract:
    """The API's schemas, resolved: component refs followed, nullable unions opened."""

    def __init__(self, openapi: dict[str, Any]) -> None:
        self.openapi = openapi
        self.components = openapi["components"]["schemas"]
        #: every key a schema of the API names
        self.keys = {k for n in nodes_of(openapi) for k in n.get("properties") or ()}
        self.keys |= {k for _, keys in UNTYPED.values() for k in keys}
        self._made: dict[tuple[str, str], Shape] = {}

    def resolve(self, node: Any, name: str) -> list[Shape]:
        if not isinstance(node, dict):
            return []
        ref = node.get("$ref")
        if isinstance(ref, str):
            title = ref.rsplit("/", 1)[-1]
            return self.resolve(self.components[title], title)
        branches = node.get("anyOf") or node.get("oneOf")
        if branches:
            return [s for b in branches for s in self.resolve(b, name)]
        if node.get("type") == "null":
            return []
        if node.get("type") == "object" and "properties" in node:
            name = node.get("title") or name
        return [Shape(name, node)]

    def response(self, path: str) -> list[Shape]:
        """The 200 answer of ``GET /path``; nothing when the API has no such path."""
        op = self.openapi["paths"].get("/" + path, {}).get("get")
        if op is None:
            return []
        content = op["responses"].get("200", {}).get("content", {})
        schema = content.get("application/json", {}).get("schema")
        return self.resolve(schema, path)

    def responses(self, path: tree_sitter.Node) -> list[Shape]:
        """The answers ``api(path)`` may get: a literal path's, or for ``"api/x/" + name``
        those of every path under ``/api/x/``."""
        literal = string_literal(path)
        if literal is not None:
            return self.response(literal)
        left = path.child_by_field_name("left") if path.type == "binary_expression" else None
        prefix = string_literal(left)
        if not prefix or not prefix.endswith("/"):
            return []
        under = [p[1:] for p in self.openapi["paths"] if p.startswith("/" + prefix)]
        return [s for p in under for s in self.response(p)]

    def member(self, shape: Shape, key: str) -> tuple[bool | None, list[Shape]]:
        """Whether ``shape`` has ``key`` (None: not a record, nothing to check), and
        what it holds there."""
        node = shape.node
        props = node.get("properties")
        if node.get("type") == "array" or node.get("type") in ("string", "number", "integer"):
            return None, []  # a method or property of the JavaScript value
        if props is None:
            extra = node.get("additionalProperties")
            return (None, self.resolve(extra, f"{shape.name}[]")) if extra else (None, [])
        if key not in props:
            return False, []
        untyped = UNTYPED.get((shape.name, key))
        if untyped:
            return True, [self.untyped(shape.name, key, *untyped)]
        return True, self.resolve(props[key], f"{shape.name}.{key}")

    def untyped(self, parent: str, key: str, form: str, keys: frozenset[str]) -> Shape:
        if (parent, key) not in self._made:
            record = {
                "type": "object",
                "properties": {k: {} for k in sorted(keys)},
                "additionalProperties": False,
            }
            node = {"type": "array", "items": record} if form == "rows" else dict(record)
            if form == "columns":
                node["x-columns"] = record
            self._made[(parent, key)] = Shape(f"{parent}.{key}", node)
        return self._made[(parent, key)]

    def records(self, tables: list[Shape]) -> list[Shape]:
        """``rows(table)``: a column table's rows as records."""
        out = []
        for table in tables:
            if "x-columns" in table.node:
                key = (table.name, "[]")
                if key not in self._made:
                    self._made[key] = Shape(
                        table.name, {"type": "array", "items": table.node["x-columns"]}
                    )
                out.append(self._made[key])
        return out

    def items(self, shape: Shape) -> list[Shape]:
        node = shape.node
        if node.get("type") == "array":
            return self.resolve(node.get("items"), f"{shape.name}[]")
        return []


# ------------------------------------------------------------------ the page, followed
@dataclass
class Page:
    """``app.js`` followed through: its reads of typed answers, and what went wrong."""

    source: bytes
    contract: Contract
    tree: Any = None
    slots: dict[Any, set[Value]] = field(default_factory=dict)
    reads: list[Read] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    #: (function, object) of reads of contract keys of values not followed
    unknown: set[tuple[str, str]] = field(default_factory=set)
    changed: bool = False

    # ---------------------------------------------------------- slots
    def slot(self, key: Any) -> Values:
        return frozenset(self.slots.get(key, ()))

    def join(self, key: Any, values: Values) -> None:
        have = self.slots.setdefault(key, set())
        if not values <= have:
            have |= values
            self.changed = True

    # ---------------------------------------------------------- scopes
    def scope_of(self, node: tree_sitter.Node) -> tree_sitter.Node:
        node = node.parent
        while node.type not in SCOPES:
            node = node.parent
        return node

    def binding(self, ident: tree_sitter.Node) -> Any:
        """The slot an identifier names: its declaration's (the nearest enclosing scope
        that declares it), or a global's."""
        name = ident.text.decode()
        scope = self.scope_of(ident)
        while True:
            if name in self.declared.get(key_of(scope), ()):
                return ("var", key_of(scope), name)
            if scope.type == "program":
                return ("global", name)
            scope = self.scope_of(scope)

    def declare_all(self) -> None:
        self.declared: dict[tuple[int, int], set[str]] = {}
        for node in walk(self.tree.root_node):
            names: list[tuple[tree_sitter.Node, tree_sitter.Node]] = []
            if node.type == "function_declaration":
                names.append((self.scope_of(node), node.child_by_field_name("name")))
            if node.type in SCOPES and node.type != "program":
                names += [(node, p) for p in parameters(node)]
            if node.type == "variable_declarator" or (
                node.type == "for_in_statement" and node.child_by_field_name("kind")
            ):
                target = node.child_by_field_name(
                    "name" if node.type != "for_in_statement" else "left"
                )
                names += [(self.scope_of(node), n) for n in bound_names(target)]
            if node.type == "catch_clause" and node.child_by_field_name("parameter"):
                names.append((self.scope_of(node), node.child_by_field_name("parameter")))
            for scope, ident in names:
                self.declared.setdefault(key_of(scope), set()).add(ident.text.decode())

    # ---------------------------------------------------------- values of expressions
    def value(self, node: tree_sitter.Node | None) -> Values:
        if node is None:
            return NONE
        kind = node.type
        if kind in ("parenthesized_expression", "await_expression"):
            return self.value(node.named_children[-1])
        if kind == "identifier":
            return self.slot(self.binding(node))
        if kind in ("arrow_function", "function_expression", "function_declaration"):
            return frozenset({Made("function", key_of(node))})
        if kind in ("object", "array"):
            return frozenset({Made(kind, key_of(node))})
        if kind == "binary_expression":
            op = node.child_by_field_name("operator").type
            right = self.value(node.child_by_field_name("right"))
            if op == "&&":
                return right
            if op in ("||", "??"):
                return self.value(node.child_by_field_name("left")) | right
            return NONE
        if kind == "ternary_expression":
            return self.value(node.child_by_field_name("consequence")) | self.value(
                node.child_by_field_name("alternative")
            )
        if kind == "assignment_expression":
            return self.value(node.child_by_field_name("right"))
        if kind == "member_expression":
            prop = node.child_by_field_name("property").text.decode()
            return self.member(self.value(node.child_by_field_name("object")), prop)
        if kind == "subscript_expression":
            return self.subscript(node)
        if kind == "call_expression":
            return self.call_value(node)
        if kind == "new_expression" and node.child_by_field_name("constructor").text in COLLECTIONS:
            return frozenset({Made("array", key_of(node))})
        return NONE

    def member(self, values: Values, key: str) -> Values:
        out: set[Value] = set()
        for v in values:
            if isinstance(v, Shape):
                out |= set(self.contract.member(v, key)[1])
            elif v.kind == "object":
                out |= self.slot(("field", v.site, key))
        return frozenset(out)

    def items(self, values: Values) -> Values:
        out: set[Value] = set()
        for v in values:
            if isinstance(v, Shape):
                out |= set(self.contract.items(v))
            elif v.kind == "array":
                out |= self.slot(("item", v.site))
        return frozenset(out)

    def subscript(self, node: tree_sitter.Node) -> Values:
        obj = self.value(node.child_by_field_name("object"))
        index = node.child_by_field_name("index")
        literal = string_literal(index)
        out = set(self.items(obj))
        for v in obj:
            if isinstance(v, Shape) and v.node.get("type") != "array":
                if literal is not None:
                    out |= set(self.contract.member(v, literal)[1])
                elif "properties" not in v.node:
                    out |= set(self.contract.member(v, "")[1])
        return frozenset(out)

    def call_value(self, node: tree_sitter.Node) -> Values:
        callee = node.child_by_field_name("function")
        args = node.child_by_field_name("arguments").named_children
        if callee.type == "identifier" and callee.text == b"api" and args:
            return frozenset(self.contract.responses(args[0]))
        if callee.type == "identifier" and callee.text.decode() == ROWS_FUNCTION and args:
            tables = [s for s in self.value(args[0]) if isinstance(s, Shape)]
            back = frozenset(v for v in self.returns(callee) if not is_columns(v))
            return frozenset(self.contract.records(tables)) | back
        if callee.type == "member_expression":
            obj = self.value(callee.child_by_field_name("object"))
            method = callee.child_by_field_name("property").text.decode()
            if method in SAME_ARRAY:
                extra = self.value(args[0]) if method == "concat" and args else NONE
                return frozenset(v for v in obj if self.is_array(v)) | extra
            if method in ONE_ITEM:
                return self.items(obj)
            if method in ("map", "flatMap"):
                return frozenset({Made("array", key_of(node))})
            if method == "then":
                return NONE
        return self.returns(callee)

    def returns(self, callee: tree_sitter.Node) -> Values:
        out: set[Value] = set()
        for v in self.value(callee):
            if isinstance(v, Made) and v.kind == "function":
                out |= self.slot(("return", v.site))
        return frozenset(out)

    def is_array(self, v: Value) -> bool:
        if isinstance(v, Shape):
            return v.node.get("type") == "array"
        return v.kind == "array"

    # ---------------------------------------------------------- what a node does
    def flow(self, node: tree_sitter.Node) -> None:
        kind = node.type
        if kind == "variable_declarator":
            self.bind(
                node.child_by_field_name("name"), self.value(node.child_by_field_name("value"))
            )
        elif kind == "assignment_expression":
            self.assign(
                node.child_by_field_name("left"), self.value(node.child_by_field_name("right"))
            )
        elif kind == "for_in_statement":
            right = self.value(node.child_by_field_name("right"))
            self.bind(node.child_by_field_name("left"), self.items(right))
        elif kind == "return_statement" and node.named_children:
            self.join(
                ("return", key_of(enclosing_function(node))), self.value(node.named_children[0])
            )
        elif kind == "arrow_function":
            body = node.child_by_field_name("body")
            if body.type != "statement_block":
                self.join(("return", key_of(node)), self.value(body))
        elif kind == "function_declaration":
            name = node.child_by_field_name("name")
            self.join(self.binding(name), frozenset({Made("function", key_of(node))}))
        elif kind == "object":
            self.fields(node)
        elif kind == "array":
            for element in node.named_children:
                spread = element.type == "spread_element"
                values = self.value(element.named_children[0] if spread else element)
                self.join(("item", key_of(node)), self.items(values) if spread else values)
        elif kind == "call_expression":
            self.call_flow(node)
        elif (
            kind == "new_expression" and node.child_by_field_name("constructor").text in COLLECTIONS
        ):
            args = node.child_by_field_name("arguments")
            if args is not None and args.named_children:
                items = self.items(self.value(args.named_children[0]))
                if node.child_by_field_name("constructor").text == b"Map":  # [key, value] pairs
                    items = self.items(items)
                self.join(("item", key_of(node)), items)

    def fields(self, node: tree_sitter.Node) -> None:
        for member in node.named_children:
            if member.type == "pair":
                key = member.child_by_field_name("key").text.decode().strip("\"'")
                self.join(
                    ("field", key_of(node), key), self.value(member.child_by_field_name("value"))
                )
            elif member.type == "shorthand_property_identifier":
                field_slot = ("field", key_of(node), member.text.decode())
                self.join(field_slot, self.slot(self.binding(member)))

    def bind(self, target: tree_sitter.Node | None, values: Values) -> None:
        if target is None:
            return
        if target.type == "assignment_pattern":
            self.bind(target.child_by_field_name("left"), values)
        elif target.type == "identifier":
            self.join(self.binding(target), values)
        elif target.type == "array_pattern":
            for element in target.named_children:
                self.bind(element, self.items(values))
        elif target.type == "object_pattern":
            for _, key in pattern_keys(target):
                self.join(("var", key_of(self.scope_of(target)), key), self.member(values, key))

    def assign(self, target: tree_sitter.Node, values: Values) -> None:
        if target.type == "identifier":
            self.join(self.binding(target), values)
        elif target.type == "member_expression":
            key = target.child_by_field_name("property").text.decode()
            for v in self.value(target.child_by_field_name("object")):
                if isinstance(v, Made) and v.kind == "object":
                    self.join(("field", v.site, key), values)

    def call_flow(self, node: tree_sitter.Node) -> None:
        callee = node.child_by_field_name("function")
        args = node.child_by_field_name("arguments").named_children
        for fn in self.value(callee):  # the page's own functions: arguments -> parameters
            if isinstance(fn, Made) and fn.kind == "function":
                self.pass_arguments(fn.site, [self.value(a) for a in args])
        if callee.type != "member_expression":
            return
        obj = self.value(callee.child_by_field_name("object"))
        method = callee.child_by_field_name("property").text.decode()
        if method in ADDS:  # an array's push, a Set's add, a Map's set (its value)
            for v in obj:
                if isinstance(v, Made) and v.kind == "array" and len(args) > ADDS[method]:
                    self.join(("item", v.site), self.value(args[ADDS[method]]))
        if method == "then" and args:
            for fn in self.value(args[0]):
                if isinstance(fn, Made) and fn.kind == "function":
                    self.pass_arguments(fn.site, [self.value(callee.child_by_field_name("object"))])
        if method in ITEM_CALLBACKS and args:
            items = self.items(obj)
            for fn in self.value(args[0]):
                if isinstance(fn, Made) and fn.kind == "function":
                    at = ITEM_CALLBACKS[method]
                    self.pass_arguments(
                        fn.site, [items if i in at else NONE for i in range(max(at) + 1)]
                    )
                    if method in ("map", "flatMap"):
                        values = self.slot(("return", fn.site))
                        self.join(
                            ("item", key_of(node)),
                            self.items(values) if method == "flatMap" else values,
                        )

    def pass_arguments(self, site: tuple[int, int], args: list[Values]) -> None:
        for param, values in zip(parameters(self.functions[site]), args, strict=False):
            self.bind(param, values)

    # ---------------------------------------------------------- the roots
    def drawers(self) -> Iterator[tuple[str, tree_sitter.Node]]:
        """``const DRAWERS = {name: drawer, ...}``: (analysis name, the drawer's name)."""
        for node in walk(self.tree.root_node):
            if (
                node.type == "variable_declarator"
                and node.child_by_field_name("name").text == DRAWERS_TABLE.encode()
            ):
                for pair in node.child_by_field_name("value").named_children:
                    if pair.type == "pair":
                        yield (
                            pair.child_by_field_name("key").text.decode(),
                            pair.child_by_field_name("value"),
                        )

    def seed(self) -> None:
        """Each drawer of ``DRAWERS`` gets its analysis's ``data``."""
        for name, drawer in self.drawers():
            section = self.contract.response(f"api/analysis/{name}")
            data = self.member(frozenset(section), "data")
            for fn in self.value(drawer):
                if isinstance(fn, Made) and fn.kind == "function":
                    self.pass_arguments(fn.site, [data])

    # ---------------------------------------------------------- the check
    def check(self, node: tree_sitter.Node) -> None:
        kind = node.type
        if kind == "member_expression":
            key = node.child_by_field_name("property").text.decode()
            called = (
                node.parent.type == "call_expression"
                and node.parent.child_by_field_name("function") == node
            )
            if called and key in METHODS:  # an array's method, called where the value is one
                return
            obj = self.value(node.child_by_field_name("object"))
            self.check_key(node, obj, key)
            if not obj and key in self.contract.keys:
                self.unfollowed(node)
        elif kind == "subscript_expression":
            obj = self.value(node.child_by_field_name("object"))
            literal = string_literal(node.child_by_field_name("index"))
            if literal is not None:
                self.check_key(node, obj, literal)
            else:
                records = sorted(str(v) for v in obj if is_record(v))
                if records:
                    self.error(node, f"{node.text.decode()!r} reads a key of {'|'.join(records)} "
                                     "by a computed name: read it by its name")  # fmt: skip
        elif kind == "object_pattern" and node.parent.type == "variable_declarator":
            values = self.value(node.parent.child_by_field_name("value"))
            for part, key in pattern_keys(node):
                self.check_key(part, values, key)
        elif kind == "call_expression":
            callee = node.child_by_field_name("function")
            args = node.child_by_field_name("arguments").named_children
            if callee.type == "identifier" and callee.text == b"api" and args:
                path = string_literal(args[0])
                known = path is None or self.contract.response(path) or path in NOT_IN_OPENAPI
                if not known:
                    self.error(node, f"the page asks for {path}, which /openapi.json does not have")

    def unfollowed(self, node: tree_sitter.Node) -> None:
        """A read of a key the contract has, of a value the check could not follow."""
        obj = node.child_by_field_name("object").text.decode()
        where = (function_name(node), obj)
        self.unknown.add(where)
        if where not in UNFOLLOWED:
            self.error(node, f"{node.text.decode()!r} in {where[0]}(): what {obj!r} holds is not "
                             "followed from an API answer (pass the answer in, or list it in "
                             "UNFOLLOWED with why)")  # fmt: skip

    def check_key(self, node: tree_sitter.Node, values: Values, key: str) -> None:
        verdicts = [(v, self.contract.member(v, key)[0]) for v in values if isinstance(v, Shape)]
        records = [(v, ok) for v, ok in verdicts if ok is not None]
        if not records:
            return
        ok = any(ok for _, ok in records)
        shapes = tuple(sorted({v.name for v, _ in records}))
        self.reads.append(Read(node.start_point.row + 1, key, shapes, ok))
        if not ok:
            self.error(node, f"{'|'.join(shapes)}.{key} is not in the contract "
                             "(the API's generated schema)")  # fmt: skip

    def error(self, node: tree_sitter.Node, message: str) -> None:
        self.errors.append(f"app.js:{node.start_point.row + 1}: {message}")

    def check_drawers(self) -> None:
        for name, drawer in self.drawers():
            if not self.contract.response(f"api/analysis/{name}"):
                self.error(drawer, f"{DRAWERS_TABLE} draws {name!r}, which the API does not "
                                   f"answer (GET /api/analysis/{name})")  # fmt: skip

    def run(self, rounds: int = 40) -> Page:
        parser = tree_sitter.Parser(tree_sitter.Language(tree_sitter_javascript.language()))
        self.tree = parser.parse(self.source)
        assert not self.tree.root_node.has_error, "app.js does not parse"
        nodes = list(walk(self.tree.root_node))
        self.functions = {key_of(n): n for n in nodes if n.type in SCOPES}
        self.declare_all()
        for _ in range(rounds):
            self.changed = False
            self.seed()
            for node in nodes:
                self.flow(node)
            if not self.changed:
                break
        else:
            raise AssertionError(f"the page's values did not settle in {rounds} rounds")
        self.check_drawers()
        for node in nodes:
            self.check(node)
        return self


def nodes_of(tree: Any) -> Iterator[dict[str, Any]]:
    if isinstance(tree, dict):
        yield tree
        for v in tree.values():
            yield from nodes_of(v)
    elif isinstance(tree, list):
        for v in tree:
            yield from nodes_of(v)


def function_name(node: tree_sitter.Node) -> str:
    """The name of the page's function a node is in (an arrow's: the constant's)."""
    while node.type != "program":
        if node.type == "function_declaration":
            return node.child_by_field_name("name").text.decode()
        if node.type == "variable_declarator" and node.child_by_field_name("value").type in SCOPES:
            return node.child_by_field_name("name").text.decode()
        node = node.parent
    return "(top level)"


def is_record(v: Value) -> bool:
    """A schema with named keys (not an array, a column table or a dict)."""
    node = v.node if isinstance(v, Shape) else {}
    return "properties" in node and node.get("type") != "array" and "x-columns" not in node


def is_columns(v: Value) -> bool:
    return isinstance(v, Shape) and "x-columns" in v.node


def walk(node: tree_sitter.Node) -> Iterator[tree_sitter.Node]:
    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        stack.extend(reversed(n.children))


def parameters(fn: tree_sitter.Node) -> list[tree_sitter.Node]:
    """A function's parameters, by position: names, or patterns (``[key, value]``)."""
    single = fn.child_by_field_name("parameter")
    if single is not None:
        return [single]
    params = fn.child_by_field_name("parameters")
    return [p for p in params.named_children if p.type != "comment"] if params else []


def bound_names(target: tree_sitter.Node | None) -> list[tree_sitter.Node]:
    if target is None:
        return []
    if target.type in ("identifier", "shorthand_property_identifier_pattern"):
        return [target]
    return [
        n
        for c in target.named_children
        for n in bound_names(c if c.type != "pair_pattern" else c.child_by_field_name("value"))
    ]


def enclosing_function(node: tree_sitter.Node) -> tree_sitter.Node:
    node = node.parent
    while node.type not in SCOPES - {"program"}:
        node = node.parent
    return node


def pattern_keys(pattern: tree_sitter.Node) -> Iterator[tuple[tree_sitter.Node, str]]:
    """(part, key) for each key an object pattern (``{a, b: c}``) destructures."""
    for part in pattern.named_children:
        name = (
            part
            if part.type == "shorthand_property_identifier_pattern"
            else part.child_by_field_name("key")
        )
        if name is not None:
            yield part, name.text.decode()


def string_literal(node: tree_sitter.Node | None) -> str | None:
    if node is not None and node.type == "string":
        return node.text.decode()[1:-1]
    return None


# ------------------------------------------------------------------ the tests
@pytest.fixture(scope="module")
def openapi() -> dict[str, Any]:
    from hvdprof.dashboard.app import create_app
    from hvdprof.dashboard.settings import DashboardSettings

    return create_app(DashboardSettings(ROOT)).openapi()


def follow(openapi: dict[str, Any], source: str | None = None) -> Page:
    text = APP_JS.read_text() if source is None else source
    return Page(text.encode(), Contract(openapi)).run()


def test_every_key_the_page_reads_is_in_the_contract(openapi: dict[str, Any]) -> None:
    page = follow(openapi)
    assert not page.errors, "\n".join(page.errors)
    assert page.unknown == set(UNFOLLOWED), (
        f"UNFOLLOWED lists what the page no longer reads: {sorted(set(UNFOLLOWED) - page.unknown)}"
    )
    # the check followed the answers: every drawer's result, and the other answers, read
    checked = {shape for r in page.reads for shape in r.shapes}
    drawn = dict(page.drawers())
    assert {"breakdown", "stragglers", "fusion", "gpu", "autotune", "surrogate"} <= set(drawn)
    for name in drawn:
        (section,) = Contract(openapi).response(f"api/analysis/{name}")
        data = {s.name for s in Contract(openapi).resolve(section.node["properties"]["data"], name)}
        assert data & checked, f"no key of the {name} answer ({data}) was followed to a read"
    assert {"RunList", "RunInfo", "TimelineWindow", "RunDiff", "AnalysisRoute"} <= checked
    assert len({(s, r.key) for r in page.reads for s in r.shapes}) > 150


def rename(text: str, old: str, new: str) -> tuple[str, int]:
    """``text`` with the first ``old`` made ``new``, and the line it was on."""
    at = text.index(old)
    return text[:at] + new + text[at + len(old) :], text.count("\n", 0, at) + 1


@pytest.mark.parametrize(
    ("old", "new", "named"),
    [
        ("[r.rank, r.fill_mean || 0]", "[r.rank, r.fill_avg || 0]", "RankFusion.fill_avg"),
        ("result.straggler", "result.straggler_rank", "Stragglers.straggler_rank"),
        ("r.compute_share", "r.compute_fraction", "RankGpu.compute_fraction"),
        ("s.score_mb_per_s", "s.score", "SampleWindow.score"),
        ("info.complete", "info.finished", "RunInfo.finished"),
        ("lane.stream", "lane.stream_id", "TimelineWindow.rows[].stream_id"),
        ("it.launch_delay_us", "it.launch_delay", "TimelineWindow.slices[].launch_delay"),
        ("r.a_ms", "r.baseline_ms", "DiffRow.baseline_ms"),
    ],
)
def test_a_key_renamed_in_the_page_is_named(
    openapi: dict[str, Any], old: str, new: str, named: str
) -> None:
    source, line = rename(APP_JS.read_text(), old, new)
    errors = follow(openapi, source).errors
    assert len(errors) == 1 and errors[0].startswith(f"app.js:{line}: "), errors
    assert f"{named} is not in the contract" in errors[0]


def test_a_key_renamed_in_the_contract_is_named(openapi: dict[str, Any]) -> None:
    # a result type's field renamed (here in the generated schema, wherever it is inlined):
    # every read of the old name is named, at its line
    renamed = copy.deepcopy(openapi)
    for node in nodes_of(renamed):
        if node.get("title") == "Stragglers" and "straggler" in node.get("properties", {}):
            node["properties"]["straggler_rank"] = node["properties"].pop("straggler")
    errors = follow(renamed).errors
    text = APP_JS.read_text()
    line = text.count("\n", 0, text.index("result ? result.straggler")) + 1
    assert errors and all("Stragglers.straggler is not in the contract" in e for e in errors)
    assert f"app.js:{line}: " in "\n".join(errors)


@pytest.mark.parametrize(
    ("old", "new", "said"),
    [
        # a key read by a computed name cannot be checked: it is an error itself
        ("(r) => r.idle_share", '(r) => r["idle" + "_share"]', "by a computed name"),
        ('api("api/runs")', 'api("api/run-list")', "/openapi.json does not have"),
        ("surrogate: drawSurface", "surface: drawSurface", "which the API does not answer"),
        # a contract key read of a value the check cannot follow from an answer
        ("p.verdict)", "window.userPhases.verdict)", "'window.userPhases.verdict' in drawUserPhases()"),
    ],
)  # fmt: skip
def test_what_the_check_cannot_follow_is_an_error(
    openapi: dict[str, Any], old: str, new: str, said: str
) -> None:
    source, line = rename(APP_JS.read_text(), old, new)
    errors = follow(openapi, source).errors
    assert any(e.startswith(f"app.js:{line}: ") and said in e for e in errors), errors


def test_the_untyped_tables_hold_the_keys_listed() -> None:
    # the timeline window's rows and column tables, as the API answers them for a run's
    # ranks (single slices and bins) and a GPU rank's stream lanes (kernels, launches)
    from fastapi.testclient import TestClient

    from hvdprof.dashboard.app import create_app
    from hvdprof.dashboard.settings import DashboardSettings

    app = create_app(DashboardSettings(ROOT / "tests" / "data"))
    client = TestClient(app, base_url="http://127.0.0.1")
    seen: dict[str, set[str]] = {"rows": set(), "slices": set(), "buckets": set()}
    for query in [
        "run=hvdprof-demo",
        "run=hvdprof-demo&max_items=10",
        "run=kineto-hta&expand_rank=0&lanes=stream",
        "run=kineto-hta&expand_rank=0&lanes=stream&max_items=10",
    ]:
        answer = client.get(f"/api/timeline?{query}")
        assert answer.status_code == 200, answer.text
        data = answer.json()["data"]
        seen["rows"] |= {k for row in data["rows"] for k in row}
        seen["slices"] |= set(data["slices"])
        seen["buckets"] |= set(data["buckets"])
    for (_, key), (_, listed) in UNTYPED.items():
        assert seen[key] == listed, f"TimelineWindow.{key}: the API writes {sorted(seen[key])}"
