"""What a golden case expects of an output, and which expectations an output fails.

A golden case (the recipe's golden.yaml) carries `expect` (a subset the output must contain, as
today: core.recipe.matches) and `checks`, each one of:

    {path: reply, equals: "..."}                 exactly this value
    {path: reply, contains: "sorry"}             a string containing this
    {path: reply, regex: "(?i)regards"}          a string this regular expression finds something in
    {schema: {type: object, required: [reply]}}  a value valid against this JSON Schema
    {path: score, near: 0.8, tolerance: 0.05}    a number within tolerance of this

`path` walks the output by keys and list indices (`items.0.name`); without it the check is of the
whole output. Read as data and evaluated in plnt's own process, so bounded: a regex has a time limit
(the `regex` module's timeout), a schema cannot fetch anything (no remote $ref), and the texts in a
failure are shortened.
"""

from __future__ import annotations

import json
import math
from typing import Any

import regex
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from pydantic import BaseModel, ConfigDict, Field, model_validator

REGEX_TIMEOUT_S = 0.1  # per search: a pathological pattern fails its check instead of holding plnt
MAX_SHOWN = 80  # characters of a value shown in a failure
KINDS = ("equals", "contains", "regex", "schema", "near")


class Check(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    path: str | None = Field(default=None, max_length=200)
    equals: Any = None
    contains: str | None = Field(default=None, max_length=10_000)
    regex: str | None = Field(default=None, max_length=2_000)
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    near: float | None = None
    tolerance: float = Field(default=0.0, ge=0)

    @model_validator(mode="after")
    def _one_kind(self) -> Check:
        given = [kind for kind in KINDS if kind in self._given()]
        if len(given) != 1:
            raise ValueError(f"a check is one of {', '.join(KINDS)}; this one gives {', '.join(given) or 'none'}")
        if self.regex is not None:
            try:
                regex.compile(self.regex)
            except regex.error as exc:
                raise ValueError(f"regex {self.regex!r} does not compile: {exc}") from None
        if self.schema_ is not None:
            try:
                Draft202012Validator.check_schema(self.schema_)
            except SchemaError as exc:
                raise ValueError(f"schema is not a valid JSON Schema: {exc.message}") from None
        if "tolerance" in self.model_fields_set and self.near is None:
            raise ValueError("tolerance goes with near")
        return self

    def _given(self) -> set[str]:
        return {"schema" if name == "schema_" else name for name in self.model_fields_set}

    @property
    def kind(self) -> str:
        return next(kind for kind in KINDS if kind in self._given())

    def failure(self, output: Any) -> str | None:
        """Why `output` fails this check, or None."""
        where = self.path or "the output"
        found, value = at_path(output, self.path)
        if not found:
            return f"{where}: missing"
        kind = self.kind
        if kind == "equals":
            return None if value == self.equals else f"{where}: expected {_shown(self.equals)}, got {_shown(value)}"
        if kind == "contains":
            assert self.contains is not None
            if not isinstance(value, str):
                return f"{where}: expected a string containing {_shown(self.contains)}, got {_shown(value)}"
            return None if self.contains in value else f"{where}: does not contain {_shown(self.contains)}: {_shown(value)}"
        if kind == "regex":
            if not isinstance(value, str):
                return f"{where}: expected a string matching /{self.regex}/, got {_shown(value)}"
            try:
                hit = regex.search(self.regex, value, timeout=REGEX_TIMEOUT_S)  # type: ignore[arg-type]
            except TimeoutError:
                return f"{where}: regex /{self.regex}/ took over {REGEX_TIMEOUT_S:g} s: simplify it"
            return None if hit else f"{where}: no match for /{self.regex}/: {_shown(value)}"
        if kind == "schema":
            error = next(iter(Draft202012Validator(self.schema_ or {}).iter_errors(value)), None)
            if error is None:
                return None
            inside = ".".join(str(part) for part in error.absolute_path)
            return f"{where}{'.' + inside if inside else ''}: {error.message[:200]}"
        assert self.near is not None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return f"{where}: expected a number near {self.near:g}, got {_shown(value)}"
        if abs(value - self.near) <= self.tolerance:
            return None
        return f"{where}: {value:g} is not within {self.tolerance:g} of {self.near:g}"


def at_path(output: Any, path: str | None) -> tuple[bool, Any]:
    """(found, value) at a dotted path of keys and list indices."""
    if path is None:
        return True, output
    value = output
    for part in path.split("."):
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            return False, None
    return True, value


def subset_failure(expect: Any, actual: Any, where: str = "") -> str | None:
    """The first place where `actual` is not a superset of `expect` (core.recipe.matches), or None."""
    if isinstance(expect, dict):
        if not isinstance(actual, dict):
            return f"{where or 'the output'}: expected a mapping, got {_shown(actual)}"
        for key, value in expect.items():
            inner = f"{where}.{key}" if where else str(key)
            if key not in actual:
                return f"{inner}: missing"
            if (failure := subset_failure(value, actual[key], inner)) is not None:
                return failure
        return None
    return None if expect == actual else f"{where or 'the output'}: expected {_shown(expect)}, got {_shown(actual)}"


def _shown(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str) if not isinstance(value, str) else json.dumps(value)
    return text if len(text) <= MAX_SHOWN else text[: MAX_SHOWN - 1] + "…"
