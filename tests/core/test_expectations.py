"""Golden cases' expectations (core/expectations.py): each check kind passing and failing, with the
failure a person reads, and golden.yaml mistakes named by case and check."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from plnt.core.expectations import Check
from plnt.core.recipe import GoldenCase, RecipeError, load_golden

OUTPUT = {"reply": "Thank you! Warm regards, the team", "intent": "praise", "score": 0.82,
          "items": [{"name": "coffee"}], "approved": True}


@pytest.mark.parametrize(("check", "failure"), [
    ({"path": "intent", "equals": "praise"}, None),
    ({"path": "intent", "equals": "complaint"}, 'intent: expected "complaint", got "praise"'),
    ({"path": "approved", "equals": None}, "approved: expected null, got true"),
    ({"path": "reply", "contains": "regards"}, None),
    ({"path": "reply", "contains": "sorry"}, 'reply: does not contain "sorry": "Thank you! Warm regards, the team"'),
    ({"path": "score", "contains": "8"}, 'score: expected a string containing "8", got 0.82'),
    ({"path": "reply", "regex": "(?i)warm REGARDS"}, None),
    ({"path": "reply", "regex": "^Dear"}, 'reply: no match for /^Dear/: "Thank you! Warm regards, the team"'),
    ({"path": "items.0.name", "equals": "coffee"}, None),
    ({"path": "items.1.name", "equals": "tea"}, "items.1.name: missing"),
    ({"path": "nope", "contains": "x"}, "nope: missing"),
    ({"schema": {"type": "object", "required": ["reply", "intent"]}}, None),
    ({"schema": {"type": "object", "required": ["reasons"]}}, "the output: 'reasons' is a required property"),
    ({"path": "items", "schema": {"type": "array", "items": {"type": "object", "required": ["price"]}}},
     "items.0: 'price' is a required property"),
    ({"path": "score", "near": 0.8, "tolerance": 0.05}, None),
    ({"path": "score", "near": 0.5, "tolerance": 0.1}, "score: 0.82 is not within 0.1 of 0.5"),
    ({"path": "approved", "near": 1, "tolerance": 0.5}, "approved: expected a number near 1, got true"),
])
def test_each_check(check: dict[str, Any], failure: str | None) -> None:
    assert Check.model_validate(check).failure(OUTPUT) == failure


def test_a_pathological_regex_fails_its_check_in_bounded_time() -> None:
    check = Check.model_validate({"path": "text", "regex": "(a|aa)+$"})  # exponential backtracking
    started = time.monotonic()
    failure = check.failure({"text": "a" * 60 + "b"})
    assert time.monotonic() - started < 2
    assert failure == "text: regex /(a|aa)+$/ took over 0.1 s: simplify it"


def test_expect_and_checks_together_list_every_failure() -> None:
    case = GoldenCase(name="c", input={}, expect={"intent": "complaint", "approved": True},
                      checks=(Check.model_validate({"path": "reply", "contains": "sorry"}),))
    assert case.failures(OUTPUT) == ['intent: expected "complaint", got "praise"',
                                     'reply: does not contain "sorry": "Thank you! Warm regards, the team"']
    assert GoldenCase(name="ok", input={}, expect={"intent": "praise"}).failures(OUTPUT) == []


@pytest.mark.parametrize(("checks", "message"), [
    ("[{path: reply}]", "cases[0].checks[0]: a check is one of equals, contains, regex, schema, near; this one gives none"),
    ("[{path: reply, contains: a, regex: b}]", "this one gives contains, regex"),
    ("[{path: reply, regex: '(unclosed'}]", "regex '(unclosed' does not compile"),
    ("[{schema: {type: nonsense}}]", "schema is not a valid JSON Schema"),
    ("[{path: s, contains: a, tolerance: 1}]", "tolerance goes with near"),
    ("[{path: s, near: 1, because: x}]", "cases[0].checks[0].because: Extra inputs are not permitted"),
    ("{path: s}", "cases[0].checks: expected a list of checks"),
])
def test_golden_mistakes_are_named(tmp_path: Path, checks: str, message: str) -> None:
    (tmp_path / "golden.yaml").write_text(f"cases:\n  - name: a\n    input: {{}}\n    checks: {checks}\n")
    with pytest.raises(RecipeError) as raised:
        load_golden(tmp_path)
    assert message in str(raised.value), str(raised.value)
    assert str(raised.value).startswith(f"{tmp_path / 'golden.yaml'}: ")


def test_golden_cases_load_their_checks(tmp_path: Path) -> None:
    (tmp_path / "golden.yaml").write_text(
        "cases:\n  - name: a\n    input: {review: x}\n    checks:\n      - {path: reply, regex: '(?i)thank'}\n"
        "      - {schema: {type: object}}\n")
    (case,) = load_golden(tmp_path)
    assert case.expect is None and [c.kind for c in case.checks] == ["regex", "schema"]
    assert case.failures(OUTPUT) == []
