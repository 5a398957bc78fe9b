"""Minimal textual edits of a spec file (plnt scale, plnt rollback): set or remove fields of one
WorkflowRun or ModelDeployment where they stand in the text, so every comment, blank line, key order
and quoting style around them stays as the author wrote it.

`edit_resource` finds the document by kind, namespace and name (PyYAML's node tree gives each value's
place in the text), changes only the spans of the values it sets (a missing key is added beside its
siblings, in their style: block or flow), then loads the result with plnt's loader and checks that
the resource now equals the old one with exactly those changes. Anything else is EditRefused, saying
what to edit by hand.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml
from plnt.core.specs.loader import SourceFile, load_sources

FieldPath = tuple[str, ...]  # a field's keys from the document's root, in YAML's (camelCase) names
REMOVE = None  # the value that removes a field


class EditRefused(ValueError):
    """The file cannot be edited safely here (its shape, or what the edit would change): edit it by hand."""


@dataclass(frozen=True)
class _Splice:
    start: int
    end: int
    text: str


def edit_resource(text: str, file: str, kind: str, namespace: str, name: str,
                  changes: Mapping[FieldPath, str | int | None]) -> str:
    """`text` with each field of `changes` set (None: removed) in the resource kind/namespace/name."""
    document = _find(text, file, kind, namespace, name)
    splices = [_splice(text, file, document, path, value) for path, value in changes.items()]
    splices = [s for s in splices if s is not None]
    edited = text
    for splice in sorted(splices, key=lambda s: s.start, reverse=True):
        edited = edited[:splice.start] + splice.text + edited[splice.end:]
    _check(text, edited, file, kind, namespace, name, changes)
    return edited


def find_resource(text: str, file: str, kind: str, namespace: str, name: str) -> bool:
    """Whether `text` holds a document of that kind, namespace and name."""
    try:
        _find(text, file, kind, namespace, name)
    except EditRefused:
        return False
    return True


def _find(text: str, file: str, kind: str, namespace: str, name: str) -> yaml.MappingNode:
    try:
        documents = list(yaml.compose_all(text, Loader=yaml.SafeLoader))
    except yaml.YAMLError as exc:
        raise EditRefused(f"{file}: not YAML plnt can read ({exc})") from exc
    for document in documents:
        if not isinstance(document, yaml.MappingNode):
            continue
        metadata = _child(document, "metadata")
        found = (_scalar(_child(document, "kind")), _scalar(_child(metadata, "namespace")) or "default",
                 _scalar(_child(metadata, "name")))
        if found == (kind, namespace, name):
            return document
    raise EditRefused(f"{file} holds no {kind} {namespace}/{name}")


def _child(node: yaml.Node | None, key: str) -> yaml.Node | None:
    if not isinstance(node, yaml.MappingNode):
        return None
    for key_node, value in node.value:
        if isinstance(key_node, yaml.ScalarNode) and key_node.value == key:
            return value  # type: ignore[no-any-return]
    return None


def _scalar(node: yaml.Node | None) -> str | None:
    return node.value if isinstance(node, yaml.ScalarNode) else None


def render(value: str | int, style: str | None = None) -> str:
    """A value as YAML text that reads back as itself: in the style of the value it replaces when
    that was quoted, plain when plain text reads back the same, else double-quoted."""
    if isinstance(value, int):
        return str(value)
    if style == "'" and "'" not in value and "\n" not in value:
        return f"'{value}'"
    if style is None or style == "":
        try:
            if yaml.safe_load(value) == value and "#" not in value and "\n" not in value:
                return value
        except yaml.YAMLError:
            pass
    return json.dumps(value)  # a JSON string is a YAML double-quoted scalar


def _splice(text: str, file: str, document: yaml.MappingNode, path: FieldPath, value: str | int | None) -> _Splice | None:
    where = ".".join(path)
    parent: yaml.Node = document
    for depth, key in enumerate(path[:-1]):
        child = _child(parent, key)
        if child is None:  # the mapping is missing: add it, holding the rest of the path, in flow style
            if value is REMOVE:
                return None
            nested = render(value)
            for inner in reversed(path[depth + 1:]):
                nested = f"{{{inner}: {nested}}}"
            return _add_key(text, file, parent, key, nested, where)
        parent = child
    if not isinstance(parent, yaml.MappingNode):
        raise EditRefused(f"{file}:{parent.start_mark.line + 1}: {'.'.join(path[:-1])} is not a mapping: edit it by hand")
    key = path[-1]
    current = _child(parent, key)
    if current is None:
        return None if value is REMOVE else _add_key(text, file, parent, key, render(value), where)
    if value is REMOVE:
        return _remove_key(text, file, parent, key, where)
    if not isinstance(current, yaml.ScalarNode):
        raise EditRefused(f"{file}:{current.start_mark.line + 1}: {where} is not a single value: edit it by hand")
    if current.value == str(value) and (isinstance(value, str) or not current.style):
        return None  # already so: its text stays as written
    return _Splice(current.start_mark.index, current.end_mark.index, render(value, current.style))


def _add_key(text: str, file: str, mapping: yaml.MappingNode, key: str, value_text: str, where: str) -> _Splice:
    """`key: value` as the first entry of `mapping`, in its style (block: on a line of its own at the
    indentation of its keys; flow: `{key: value, ...}`)."""
    if mapping.flow_style:
        at = mapping.start_mark.index + 1  # after the "{"
        return _Splice(at, at, f"{key}: {value_text}" + (", " if mapping.value else ""))
    if not mapping.value:
        raise EditRefused(f"{file}:{mapping.start_mark.line + 1}: cannot add {where} to an empty mapping: edit it by hand")
    first = mapping.value[0][0].start_mark
    line_start = text.rfind("\n", 0, first.index) + 1
    if text[line_start:first.index].strip(" "):  # the first key shares its line with something (`- key: ...`)
        raise EditRefused(f"{file}:{first.line + 1}: cannot add {where} beside a key that does not start its line: "
                          "edit it by hand")
    return _Splice(first.index, first.index, f"{key}: {value_text}\n{' ' * first.column}")


def _remove_key(text: str, file: str, mapping: yaml.MappingNode, key: str, where: str) -> _Splice:
    """The line(s) of `key: value` in a block mapping, when the entry has its lines to itself."""
    for key_node, value in mapping.value:
        if key_node.value != key:
            continue
        line_start = text.rfind("\n", 0, key_node.start_mark.index) + 1
        line_end = text.find("\n", value.end_mark.index)
        line_end = len(text) if line_end < 0 else line_end + 1
        own_lines = not text[line_start:key_node.start_mark.index].strip(" ")
        rest = text[value.end_mark.index:line_end].strip()
        if mapping.flow_style or not own_lines or (rest and not rest.startswith("#")):
            raise EditRefused(f"{file}:{key_node.start_mark.line + 1}: cannot remove {where} here: edit it by hand")
        return _Splice(line_start, line_end, "")
    raise AssertionError(key)  # the caller found it


def _check(before: str, after: str, file: str, kind: str, namespace: str, name: str,
           changes: Mapping[FieldPath, str | int | None]) -> None:
    """The edited text loads, and the resource in it is the old one with exactly `changes`."""
    old, new = _load(before, file, kind, namespace, name), _load(after, file, kind, namespace, name)
    expected = json.loads(json.dumps(old))
    for path, value in changes.items():
        _set(expected, path, value)
    expected_model = _load_data(expected, file, kind)
    if expected_model != new:
        raise EditRefused(f"{file}: the edit would change more than {', '.join('.'.join(p) for p in changes)}: "
                          "edit it by hand")


def _load(text: str, file: str, kind: str, namespace: str, name: str) -> dict[str, Any]:
    specs, problems = load_sources([SourceFile(file, text)], check_references=None)
    if problems:
        raise EditRefused(f"the edit leaves {file} invalid: {problems[0]}")
    found = (specs.workflow_runs if kind == "WorkflowRun" else specs.model_deployments).get(f"{namespace}/{name}")
    if found is None:
        raise EditRefused(f"{file} holds no valid {kind} {namespace}/{name}")
    return found.model_dump(mode="json", by_alias=True, exclude_defaults=True)


def _load_data(data: dict[str, Any], file: str, kind: str) -> dict[str, Any]:
    """`data` (a resource as JSON) validated as the loader validates it, dumped as _load dumps."""
    text = json.dumps(data)
    specs, problems = load_sources([SourceFile(file, text)], check_references=None)
    if problems:
        raise EditRefused(f"{file}: the change is not valid: {problems[0].field}: {problems[0].message}")
    found = next(iter((specs.workflow_runs if kind == "WorkflowRun" else specs.model_deployments).values()))
    return found.model_dump(mode="json", by_alias=True, exclude_defaults=True)


def _set(data: dict[str, Any], path: FieldPath, value: str | int | None) -> None:
    for key in path[:-1]:
        data = data.setdefault(key, {})
    if value is REMOVE:
        data.pop(path[-1], None)
    else:
        data[path[-1]] = value
