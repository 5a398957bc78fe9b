"""canary.steps in a WorkflowRun (and a ModelDeployment): what the saga goes through, and each
mistake reported with its file, line and field."""

from __future__ import annotations

from pathlib import Path

import pytest
from plnt.core.specs.loader import load_directory
from plnt.core.specs.models import Canary, CanaryStep, ModelCanary

from tests.core.test_loader import BACKEND, RUN, load_one, where, write

STEPPED = RUN.replace("    trafficPercent: 5\n", """\
    steps:
      - {weight: 5}
      - {weight: 25, pause: 30s}
      - {weight: 100, pause: 2m}
""")


def test_steps_are_what_the_saga_goes_through(tmp_path: Path) -> None:
    write(tmp_path, "run.yaml", STEPPED)
    write(tmp_path, "backend.yaml", BACKEND)
    specs, problems = load_directory(tmp_path)
    assert problems == []
    canary = specs.workflow_runs["default/review-responder"].spec.canary
    assert [(s.weight, s.pause_s) for s in canary.plan_steps()] == [(5, 0.0), (25, 30.0), (100, 120.0)]


@pytest.mark.parametrize("canary", [Canary(), Canary.model_validate({"trafficPercent": 0}), ModelCanary()],
                         ids=["default", "no-traffic", "model"])
def test_without_steps_one_step_at_traffic_percent(canary: Canary | ModelCanary) -> None:
    assert canary.plan_steps() == [CanaryStep(weight=canary.traffic_percent)]


@pytest.mark.parametrize(("steps", "line", "field", "message"), [
    ("      - {weight: 25}\n      - {weight: 5}\n", 7, "spec.canary",
     "canary.steps[1].weight 5 must be above the step before it (25): weights rise from step to step"),
    ("      - {weight: 5}\n      - {weight: 5}\n", 7, "spec.canary",
     "canary.steps[1].weight 5 must be above the step before it (5)"),
    ("      - {weight: 5, pause: 3 days}\n", 9, "spec.canary.steps[0].pause",
     "pause '3 days' is not a duration: write a whole number and s, m or h (30s, 5m, 2h)"),
    ("      - {weight: 5, pause: 25h}\n", 9, "spec.canary.steps[0].pause", "pause '25h' is longer than 24h"),
    ("      - {weight: 101}\n", 9, "spec.canary.steps[0].weight", "Input should be less than or equal to 100"),
])
def test_bad_steps_are_named(tmp_path: Path, steps: str, line: int, field: str, message: str) -> None:
    text = RUN.replace("    trafficPercent: 5\n", "    steps:\n" + steps)
    problems = load_one(tmp_path, text)
    assert len(problems) == 1 and where(problems)[0][1:] == (line, field), problems
    assert problems[0].message.startswith(message), problems[0].message


def test_steps_and_traffic_percent_together_are_refused(tmp_path: Path) -> None:
    problems = load_one(tmp_path, RUN.replace("    trafficPercent: 5\n", "    trafficPercent: 5\n    steps: [{weight: 5}]\n"))
    assert [p.field for p in problems] == ["spec.canary"]
    assert problems[0].message.startswith("give canary.steps or canary.trafficPercent, not both")



@pytest.mark.parametrize(("route", "field", "message"), [
    ("{header: X-Plnt-Track, value: canary}", "spec.canary.headerRoute.header",
     "header 'X-Plnt-Track' has a meaning of its own to the gateway; choose another"),
    ("{header: 'X Cohort', value: a}", "spec.canary.headerRoute.header", "'X Cohort' is not valid"),
    ("{header: X-Cohort, value: ''}", "spec.canary.headerRoute.value", "at least 1 character"),
])
def test_bad_header_routes_are_named(tmp_path: Path, route: str, field: str, message: str) -> None:
    problems = load_one(tmp_path, RUN.replace("    trafficPercent: 5\n", f"    headerRoute: {route}\n"))
    assert [p.field for p in problems] == [field], problems
    assert message in problems[0].message, problems[0].message


def test_a_step_names_its_own_cohort_else_the_canarys(tmp_path: Path) -> None:
    write(tmp_path, "run.yaml", RUN.replace("    trafficPercent: 5\n", """\
    headerRoute: {header: X-Cohort, value: staff}
    steps:
      - {weight: 0, headerRoute: {header: X-Cohort, value: testers}}
      - {weight: 25}
"""))
    write(tmp_path, "backend.yaml", BACKEND)
    specs, problems = load_directory(tmp_path)
    assert problems == []
    canary = specs.workflow_runs["default/review-responder"].spec.canary
    assert [canary.step_canary_header(step) for step in canary.plan_steps()] == [
        ("x-cohort", "testers"), ("x-cohort", "staff")]
    assert Canary().step_canary_header(Canary().plan_steps()[0]) is None


def test_a_bad_step_cohort_is_named_at_its_line(tmp_path: Path) -> None:
    text = RUN.replace("    trafficPercent: 5\n", "    steps:\n      - {weight: 0, headerRoute: {header: Host, value: a}}\n")
    problems = load_one(tmp_path, text)
    assert where(problems)[0][1:] == (9, "spec.canary.steps[0].headerRoute.header"), problems
    assert "header 'Host' has a meaning of its own to the gateway" in problems[0].message
