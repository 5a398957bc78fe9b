"""The Gate kind and the canary's gate names: what loads, and each mistake named with its file, line
and field."""

from __future__ import annotations

from pathlib import Path

import pytest
from plnt.core.specs.loader import load_directory

from tests.core.test_loader import BACKEND, MODEL, POLICY, RUN, load_one, where, write

QUALITY = """\
apiVersion: plnt.work/v1
kind: Gate
metadata: {name: golden-answers, namespace: default}
spec:
  quality: {minPassRate: 0.75, maxDropVsStable: 0}
"""

METRIC = """\
apiVersion: plnt.work/v1
kind: Gate
metadata: {name: canary-errors}
spec:
  metric:
    prometheus: http://127.0.0.1:9090
    query: 'sum(rate(plnt_gateway_errors_total{workflow="$name",track="canary"}[1m]))'
    max: 0.01
"""

WEBHOOK = """\
apiVersion: plnt.work/v1
kind: Gate
metadata: {name: qa-signoff}
spec:
  webhook: {url: "https://qa.example/check", secret: QA, timeout: 20s}
"""

GATED = RUN.replace("    trafficPercent: 5\n", """\
    gates: [canary-errors]
    steps:
      - {weight: 5, gates: [golden-answers]}
      - {weight: 50, gates: [qa-signoff, canary-errors]}
""")


def test_gates_load_and_each_step_has_the_canarys_and_its_own(tmp_path: Path) -> None:
    write(tmp_path, "run.yaml", GATED)
    write(tmp_path, "backend.yaml", BACKEND)
    write(tmp_path, "gates.yaml", "---\n".join((QUALITY, METRIC, WEBHOOK)))
    specs, problems = load_directory(tmp_path)
    assert problems == []
    assert sorted(specs.gates) == ["default/canary-errors", "default/golden-answers", "default/qa-signoff"]
    assert specs.gates["default/golden-answers"].spec.type == "quality"
    assert specs.gates["default/qa-signoff"].spec.webhook.timeout_s == 20.0  # type: ignore[union-attr]
    canary = specs.workflow_runs["default/review-responder"].spec.canary
    assert [canary.step_gates(step) for step in canary.plan_steps()] == [
        ["canary-errors", "golden-answers"], ["canary-errors", "qa-signoff"]]


@pytest.mark.parametrize(("gate", "line", "field", "message"), [
    (QUALITY.replace("quality: {minPassRate: 0.75, maxDropVsStable: 0}", "{}"), 4, "spec",
     "a Gate is one of quality, compare, metric, webhook; this one gives none"),
    (QUALITY.replace("  quality:", "  webhook: {url: 'http://x', secret: X}\n  quality:"), 4, "spec",
     "a Gate is one of quality, compare, metric, webhook; this one gives quality, webhook"),
    (QUALITY.replace("0.75", "1.5"), 5, "spec.quality.minPassRate", "Input should be less than or equal to 1"),
    (METRIC.replace("    max: 0.01\n", ""), 5, "spec.metric", "a metric gate needs max or min"),
    (METRIC.replace("    max: 0.01\n", "    max: 1\n    min: 2\n"), 5, "spec.metric",
     "min 2.0 is above max 1.0: no value could pass"),
    (METRIC.replace("http://127.0.0.1:9090", "ftp://x"), 6, "spec.metric.prometheus", "'ftp://x' is not valid; it must be matching ^https?://"),
    (WEBHOOK.replace("secret: QA", "secret: qa-key"), 5, "spec.webhook.secret", "'qa-key' is not valid; it must be matching ^[A-Z0-9_]{1,64}$"),
    (WEBHOOK.replace("20s", "10m"), 5, "spec.webhook.timeout", "timeout '10m': write a duration of at most 5m"),
])
def test_bad_gates_are_named(tmp_path: Path, gate: str, line: int, field: str, message: str) -> None:
    problems = load_one(tmp_path, gate)
    assert len(problems) == 1 and where(problems)[0][1:] == (line, field), problems
    assert message in problems[0].message, problems[0].message


def test_a_gate_name_that_is_not_declared_is_named_where_it_is_used(tmp_path: Path) -> None:
    write(tmp_path, "run.yaml", GATED)
    write(tmp_path, "backend.yaml", BACKEND)
    write(tmp_path, "gates.yaml", METRIC)
    _, problems = load_directory(tmp_path)
    assert [(p.file, p.line, p.field) for p in problems] == [
        ("run.yaml", 10, "spec.canary.steps[0].gates[0]"), ("run.yaml", 11, "spec.canary.steps[1].gates[0]")]
    assert problems[0].message == ("no Gate named 'golden-answers' in namespace default (known: canary-errors); "
                                   "declare it (kind: Gate) or remove the name")


def test_a_gate_of_another_namespace_does_not_count(tmp_path: Path) -> None:
    write(tmp_path, "run.yaml", RUN.replace("    trafficPercent: 5\n", "    gates: [canary-errors]\n"))
    write(tmp_path, "backend.yaml", BACKEND)
    write(tmp_path, "gates.yaml", METRIC.replace("metadata: {name: canary-errors}",
                                                 "metadata: {name: canary-errors, namespace: team-b}"))
    _, problems = load_directory(tmp_path)
    assert [p.field for p in problems] == ["spec.canary.gates[0]"]
    assert "no Gate named 'canary-errors' in namespace default (known: none in this namespace)" in problems[0].message


def test_duplicate_gates_are_refused(tmp_path: Path) -> None:
    write(tmp_path, "a.yaml", METRIC)
    write(tmp_path, "b.yaml", METRIC)
    _, problems = load_directory(tmp_path)
    assert [(p.file, p.field) for p in problems] == [("b.yaml", "metadata.name")]
    assert "duplicate Gate default/canary-errors; first declared at a.yaml:3" in problems[0].message



def test_a_judge_must_be_a_model_deployment_of_the_namespace(tmp_path: Path) -> None:
    judged = QUALITY.replace("quality: {minPassRate: 0.75, maxDropVsStable: 0}",
                             "quality: {judge: {model: smollm2, rubric: 'A warm reply', minScore: 4}}")
    write(tmp_path, "run.yaml", GATED)
    write(tmp_path, "backend.yaml", BACKEND)
    write(tmp_path, "gates.yaml", "---\n".join((judged, METRIC, WEBHOOK)))
    _, problems = load_directory(tmp_path)
    assert [(p.file, p.field) for p in problems] == [("run.yaml", "spec.canary.steps[0].gates[0]")]
    assert "Gate 'golden-answers' is judged by 'smollm2', which is no ModelDeployment of namespace default" in \
        problems[0].message


# --- a ModelDeployment's golden cases (canary.golden) ---------------------------------------

GOLDEN_MODEL = MODEL.replace("  backend: {cluster: local}\n", """\
  backend: {cluster: local}
  canary:
    gates: [golden-answers]
    golden:
      - name: capital
        prompt: "What is the capital of France? One word."
        checks: [{regex: "(?i)paris"}]
      - name: json-reply
        system: "Answer in JSON."
        prompt: "Give {\\"ok\\": true}"
        maxTokens: 16
        checks: [{path: ok, equals: true}]
""")


def test_a_quality_gate_checks_a_models_golden_cases(tmp_path: Path) -> None:
    write(tmp_path, "specs.yaml", BACKEND + "---\n" + POLICY + "---\n" + GOLDEN_MODEL + "---\n" + QUALITY)
    specs, problems = load_directory(tmp_path)
    assert problems == []
    golden = specs.model_deployments["default/smollm2"].spec.canary.golden
    assert [(case.name, case.max_tokens, case.system) for case in golden] == [
        ("capital", 64, None), ("json-reply", 16, "Answer in JSON.")]


def test_a_quality_gate_on_a_model_without_golden_cases_is_refused_at_its_line(tmp_path: Path) -> None:
    model = MODEL.replace("  backend: {cluster: local}\n", "  backend: {cluster: local}\n  canary: {gates: [golden-answers]}\n")
    problems = load_one(tmp_path, BACKEND + "---\n" + POLICY + "---\n" + model + "---\n" + QUALITY)
    assert [(p.line, p.field) for p in problems] == [(21, "spec.canary.gates[0]")], problems
    assert "Gate 'golden-answers' is a quality gate, which checks a model's golden cases: give spec.canary.golden" \
        in problems[0].message


@pytest.mark.parametrize(("check", "field", "message"), [
    ('{regex: "(unclosed"}', "spec.canary.golden[0].checks", "checks[0]: regex '(unclosed' does not compile"),
    ("{contains: a, equals: b}", "spec.canary.golden[0].checks", "checks[0]: a check is one of equals, contains"),
    ("{bogus: 1}", "spec.canary.golden[0].checks", "checks[0].bogus: Extra inputs are not permitted"),
])
def test_a_bad_model_check_is_named(tmp_path: Path, check: str, field: str, message: str) -> None:
    model = GOLDEN_MODEL.replace('checks: [{regex: "(?i)paris"}]', f"checks: [{check}]")
    problems = load_one(tmp_path, BACKEND + "---\n" + POLICY + "---\n" + model + "---\n" + QUALITY)
    assert [p.field for p in problems] == [field], problems
    assert message in problems[0].message, problems[0].message


def test_golden_case_names_are_unique(tmp_path: Path) -> None:
    model = GOLDEN_MODEL.replace("name: json-reply", "name: capital")
    problems = load_one(tmp_path, BACKEND + "---\n" + POLICY + "---\n" + model + "---\n" + QUALITY)
    assert [p.field for p in problems] == ["spec.canary.golden"], problems
    assert "capital given more than once" in problems[0].message
