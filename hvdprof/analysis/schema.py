"""The published JSON schema of ``hvdprof analyze --json`` and of every analysis's answer,
generated from the result types (``msgspec.json.schema_components``), never written by
hand: a field added to a result is in the schema, the dashboard's ``/openapi.json`` and
the JSON at once.

Print it with ``python -m hvdprof.analysis.schema`` (the copy in
``docs/analysis-schema.json`` is this output; a test keeps them equal). Its ``version`` is
the report's ``"schema"`` key (:data:`hvdprof.analysis.report.SCHEMA_VERSION`), raised
when a key changes meaning or goes away; new keys keep the number.

Why a report type is made here (``msgspec.defstruct``) rather than declared: the report's
keys are the registry's analyses, and one registered later (a plugin, a test) is in
the report, so it is in the schema too.

The other commands' JSON is in it as well, under ``x-commands`` (``diff --json``,
``ab --json FILE``, ``history --json``: command -> its output's schema), from the types
those commands encode; :func:`command_schema` makes one of them the schema's root, for a
validator.
"""

from __future__ import annotations

import inspect
import json
import sys
from typing import Any, Literal, get_type_hints

import msgspec
import msgspec.inspect

from hvdprof.analysis import registry
from hvdprof.analysis.report import SCHEMA_VERSION
from hvdprof.trace.model import Problem

#: where the components sit in the published schema (JSON Schema 2020-12's ``$defs``)
DEFS = "#/$defs/{name}"


def result_type(analysis: registry.Analysis) -> Any:
    """The type of an analysis's answer (its registry entry's ``result``); a plugin's class
    that writes its own ``to_dict()`` rather than being a Struct says nothing msgspec can
    read, so its answer is declared an object, no more."""
    kind = registry.resolve(analysis.result)
    if not (isinstance(kind, type) and issubclass(kind, msgspec.Struct)) and hasattr(
        kind, "to_dict"
    ):
        return dict[str, Any]
    return kind


def report_value_type(analysis: registry.Analysis) -> Any:
    """What the report holds under the analysis's name: its answer, or the attribute or key
    of it that the registry entry names (process sets: the list of sets; stalls: the list)."""
    kind = result_type(analysis)
    name = analysis.report_attribute or analysis.report_key
    return _field_type(kind, name) if name else kind


def _field_type(kind: Any, name: str) -> Any:
    if isinstance(kind, type) and issubclass(kind, msgspec.Struct):
        for f in msgspec.structs.fields(kind):
            if name in (f.name, f.encode_name):
                return f.type
    hints = get_type_hints(kind)
    return hints[name]


def report_struct() -> type[msgspec.Struct]:
    """The shape of ``analyze --json``, from the registry as it stands now."""
    fields: list[tuple[str, Any]] = [
        ("schema", Literal[SCHEMA_VERSION]),  # type: ignore[valid-type]
        ("run", dict[str, Any]),
        ("verdicts", list[str]),
    ]
    for analysis in registry.in_report():
        # None: it could not look (overlap without torch.profiler traces)
        fields.append((analysis.name, report_value_type(analysis) | None))
    fields.append(("problems", list[Problem]))
    return msgspec.defstruct("Report", fields, module=__name__)


def command_types() -> dict[str, Any]:
    """The commands besides ``analyze`` that print or write JSON -> the type they encode."""
    from hvdprof.analysis.ab_runner import AbResult
    from hvdprof.analysis.gate import GatedDiff
    from hvdprof.analysis.history import History

    return {"diff": GatedDiff, "ab": AbResult, "history": History}


def json_schema(ref_template: str = DEFS) -> dict[str, Any]:
    """The report's schema, with every analysis's answer (those the API alone has too)
    among its components, ``x-analyses``: analysis name -> its answer's schema, and
    ``x-commands``: command -> the schema of its JSON."""
    entries = registry.analyses()
    commands = command_types()
    types = [report_struct(), *(result_type(a) for a in entries), *commands.values()]
    (report, *answers), components = msgspec.json.schema_components(
        types, ref_template=ref_template
    )
    _exact_keys(types, components)
    _clean_descriptions(components)
    answers, outputs = answers[: len(entries)], answers[len(entries) :]
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "hvdprof analyze --json",
        "version": SCHEMA_VERSION,
        **report,
        "x-analyses": {a.name: answer for a, answer in zip(entries, answers, strict=True)},
        "x-commands": dict(zip(commands, outputs, strict=True)),
        "$defs": components,
    }


def command_schema(command: str, published: dict[str, Any] | None = None) -> dict[str, Any]:
    """The schema of ``hvdprof COMMAND``'s JSON (``diff``, ``ab``, ``history``): the
    published one (``published``, or :func:`json_schema`'s) with that command's output as
    its root, as a validator takes it."""
    whole = json_schema() if published is None else published
    root = whole["x-commands"][command]
    return {**whole, "title": f"hvdprof {command} --json", "$ref": root["$ref"]}


def _exact_keys(types: list[Any], components: dict[str, Any]) -> None:
    """Every key a result always writes is ``required`` (msgspec lists only the fields
    without a default, but the JSON carries them all, except an ``UNSET`` one, absent
    until set: a GPU rank's ``unrounded``), and no other key is allowed."""
    for info in _structs(msgspec.inspect.multi_type_info(types)):
        component = components.get(info.cls.__name__)
        if component is None or component.get("title") != info.cls.__name__:
            continue
        component["additionalProperties"] = False
        component["required"] = [
            f.encode_name
            for f in info.fields
            if f.required
            or f.default is not msgspec.NODEFAULT
            or f.default_factory is not msgspec.NODEFAULT
        ]


def _clean_descriptions(node: Any) -> None:
    """Each description as ``inspect.cleandoc`` gives the docstring: msgspec 0.23 started
    dedenting docstrings and 0.22 did not, and the published schema must not depend on
    which one the user's environment resolved."""
    if isinstance(node, dict):
        text = node.get("description")
        if isinstance(text, str):
            node["description"] = inspect.cleandoc(text)
        for value in node.values():
            _clean_descriptions(value)
    elif isinstance(node, list):
        for value in node:
            _clean_descriptions(value)


def _structs(infos: Any) -> list[Any]:
    """The struct and dataclass types in msgspec's type information, each once."""
    found: dict[int, Any] = {}
    todo = list(infos)
    while todo:
        info = todo.pop()
        if id(info) in found:
            continue
        if hasattr(info, "fields") and hasattr(info, "cls"):
            found[id(info)] = info
            todo += [f.type for f in info.fields]
        todo += [
            getattr(info, a) for a in ("item_type", "key_type", "value_type") if hasattr(info, a)
        ]
        todo += list(getattr(info, "types", ()))
    return list(found.values())


def inline_schema(kind: Any) -> dict[str, Any]:
    """The schema of ``kind`` with every reference replaced by what it names: one
    self-contained schema, as the dashboard's OpenAPI embeds it in a response model."""
    top, components = msgspec.json.schema_components([kind], ref_template="{name}")
    _exact_keys([kind], components)
    _clean_descriptions(components)
    return _inlined(top[0], components)


def _inlined(node: Any, components: dict[str, Any]) -> Any:
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref in components:
            return _inlined(components[ref], components)
        return {k: _inlined(v, components) for k, v in node.items()}
    if isinstance(node, list):
        return [_inlined(v, components) for v in node]
    return node


def main(argv: list[str] | None = None) -> int:
    """``python -m hvdprof.analysis.schema``: the published schema on stdout."""
    del argv
    sys.stdout.write(json.dumps(json_schema(), indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
