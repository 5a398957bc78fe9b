"""CRDs generated from the spec models (plnt.reconciler.control.crds, `plnt crds`): the checked-in files match
the models, they pass kubernetes-validate strictly, their schemas are structural, and every example
spec validates against them while broken ones do not. Pure: no cluster, no server."""

from __future__ import annotations

import copy
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

import jsonschema
import kubernetes_validate
import pytest
import yaml
from plnt.core.specs.models import KIND_MODELS, PLNT_API_VERSION, SpecModel
from plnt.core.status import Phase, WorkflowRunStatus
from plnt.reconciler.cli.main import app
from plnt.reconciler.control.crds import (
    KINDS,
    CrdError,
    CrStatus,
    all_crds,
    conditions_for,
    cr_status,
    crd_files,
    json_schema,
    kind_of,
    structural,
)
from pydantic import BaseModel, Field
from typer.testing import CliRunner

from tests.conftest import EXAMPLE, ROOT

CRD_DIR = ROOT / "charts" / "plnt" / "crds"
NOW = datetime(2026, 12, 1, 1, 0, 0, tzinfo=UTC)


# --- the generator, table-tested ------------------------------------------------------------------

class Inner(SpecModel):
    """An inner block."""

    size: int = Field(default=3, ge=1, le=9)


class Sample(SpecModel):
    name: str = Field(pattern=r"^[a-z]+$", description="a name")
    maybe: str | None = None
    mode: Literal["a", "b"] = "a"
    fixed: Literal["x"] = "x"
    ratio: float = Field(default=1.0, gt=0, lt=2)
    tags: dict[str, str] = Field(default_factory=dict)
    free: dict[str, Any] = Field(default_factory=dict)
    inner: Inner = Field(default_factory=Inner)
    inner_opt: Inner | None = None
    items: list[Inner] = Field(default_factory=list)
    names: list[str] = Field(default_factory=list, min_length=1)


SAMPLE = structural(Sample.model_json_schema(by_alias=True))


@pytest.mark.parametrize(("field", "expected"), [
    ("name", {"type": "string", "description": "a name", "pattern": "^[a-z]+$"}),
    ("maybe", {"type": "string", "nullable": True}),
    ("mode", {"type": "string", "enum": ["a", "b"], "default": "a"}),
    ("fixed", {"type": "string", "enum": ["x"], "default": "x"}),
    ("ratio", {"type": "number", "minimum": 0, "exclusiveMinimum": True, "maximum": 2, "exclusiveMaximum": True,
               "default": 1.0}),
    ("tags", {"type": "object", "additionalProperties": {"type": "string"}}),
    ("free", {"type": "object", "x-kubernetes-preserve-unknown-fields": True}),
    ("inner", {"type": "object", "description": "An inner block.",
               "properties": {"size": {"type": "integer", "minimum": 1, "maximum": 9, "default": 3}}}),
    ("innerOpt", {"type": "object", "description": "An inner block.", "nullable": True,
                  "properties": {"size": {"type": "integer", "minimum": 1, "maximum": 9, "default": 3}}}),
    ("items", {"type": "array", "items": {"type": "object", "description": "An inner block.",
                                          "properties": {"size": {"type": "integer", "minimum": 1, "maximum": 9,
                                                                  "default": 3}}}}),
    ("names", {"type": "array", "minItems": 1, "items": {"type": "string"}}),
])
def test_structural_turns_each_pydantic_construct_into_its_openapi_form(field: str, expected: dict[str, Any]) -> None:
    assert SAMPLE["properties"][field] == expected


def test_structural_keeps_required_and_drops_additional_properties_false() -> None:
    assert SAMPLE["required"] == ["name"]
    assert "additionalProperties" not in SAMPLE and "$defs" not in SAMPLE


class TwoTypes(BaseModel):
    value: int | str


class Pair(BaseModel):
    value: tuple[int, str]


class Untyped(BaseModel):
    value: list  # type: ignore[type-arg]


@pytest.mark.parametrize(("model", "words"), [
    (TwoTypes, "value: a union of 2 types"),
    (Pair, "value: prefixItems"),
])
def test_structural_refuses_what_a_structural_schema_cannot_say(model: type[BaseModel], words: str) -> None:
    with pytest.raises(CrdError, match=words):
        structural(model.model_json_schema(by_alias=True))


def test_a_list_of_anything_is_free_form_items() -> None:
    assert structural(Untyped.model_json_schema())["properties"]["value"] == {
        "type": "array", "items": {"x-kubernetes-preserve-unknown-fields": True}}


# --- the checked-in CRDs ------------------------------------------------------------------------

def test_checked_in_crds_match_the_models() -> None:
    """Fails when a model changes without `plnt crds --out charts/plnt/crds` (or the files were hand-edited)."""
    expected = crd_files()
    found = {path.name: path.read_text(encoding="utf-8") for path in CRD_DIR.glob("*.yaml")}
    assert sorted(found) == sorted(expected), "run: plnt crds --out charts/plnt/crds"
    for name, text in expected.items():
        assert found[name] == text, f"{name} drifted from the models; run: plnt crds --out charts/plnt/crds"


@pytest.mark.parametrize("doc", all_crds(), ids=lambda d: d["metadata"]["name"])
def test_crds_pass_kubernetes_validate_strict(doc: dict[str, Any]) -> None:
    kubernetes_validate.validate(doc, "1.33", strict=True)


def walk(node: dict[str, Any], path: str = "") -> list[tuple[str, dict[str, Any]]]:
    out = [(path, node)]
    for name, child in node.get("properties", {}).items():
        out += walk(child, f"{path}.{name}")
    if isinstance(node.get("additionalProperties"), dict):
        out += walk(node["additionalProperties"], f"{path}.*")
    if "items" in node:
        out += walk(node["items"], f"{path}[]")
    return out


@pytest.mark.parametrize("doc", all_crds(), ids=lambda d: d["metadata"]["name"])
def test_schemas_are_structural(doc: dict[str, Any]) -> None:
    version = doc["spec"]["versions"][0]
    schema = version["schema"]["openAPIV3Schema"]
    free_form = []
    for path, node in walk(schema):
        assert not {"$ref", "anyOf", "oneOf", "allOf", "not", "$defs", "title"} & set(node), path
        assert "type" in node or node.get("x-kubernetes-preserve-unknown-fields") is True, f"{path} has no type"
        assert not ("properties" in node and "additionalProperties" in node), path
        assert node.get("additionalProperties") is not False, path
        if node.get("x-kubernetes-preserve-unknown-fields"):
            free_form.append(path)
        if "pattern" in node:  # the API server compiles patterns as RE2 (Go): no lookaround, no backreferences
            assert not re.search(r"\(\?[=!<]|\\[1-9]", node["pattern"]), f"{path}: {node['pattern']} is not RE2"
        if "enum" in node:
            assert all(isinstance(v, {"string": str, "integer": int}[node["type"]]) for v in node["enum"]), path
        if "default" in node:  # defaults must fit their own node
            jsonschema.Draft4Validator(json_schema(node, root=False)).validate(node["default"])
    # Free-form only where the model is dict[str, Any]: a run's smoke-test figures, a model's golden
    # checks (each checked by core/expectations.Check when the spec loads).
    assert free_form == {"WorkflowRun": [".status.smokeTest"],
                         "ModelDeployment": [".spec.canary.golden[].checks[]"]}.get(doc["spec"]["names"]["kind"], [])
    assert version["served"] is version["storage"] is True
    # WorkflowRuns live in a namespace; backends and trust policies are cluster-wide, as in the spec repository.
    expected_scope = "Namespaced" if doc["spec"]["names"]["kind"] in ("WorkflowRun", "ModelDeployment") else "Cluster"
    assert doc["spec"]["group"] == "plnt.work" and doc["spec"]["scope"] == expected_scope
    assert doc["spec"]["names"]["categories"] == ["plnt"]


def test_workflowrun_crd_has_status_subresource_columns_and_short_name() -> None:
    doc = next(d for d in all_crds() if d["metadata"]["name"] == "workflowruns.plnt.work")
    version = doc["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    assert doc["spec"]["names"]["shortNames"] == ["wfr"]
    columns = {c["name"]: c for c in version["additionalPrinterColumns"] if "priority" not in c}
    assert list(columns) == ["Phase", "Version", "Canary %", "Age"]
    assert columns["Canary %"] == {"name": "Canary %", "type": "integer", "jsonPath": ".status.canaryPercent"}
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    assert {"observedGeneration", "phase", "version", "canaryVersion", "canaryPercent", "message",
            "observedCommit", "conditions"} <= set(status)
    assert status["phase"]["enum"] == [p.value for p in Phase]
    conditions = status["conditions"]
    assert conditions["x-kubernetes-list-type"] == "map" and conditions["x-kubernetes-list-map-keys"] == ["type"]
    assert set(conditions["items"]["required"]) == {"type", "status", "reason", "message", "lastTransitionTime"}
    assert set(conditions["items"]["properties"]) == {"type", "status", "reason", "message", "lastTransitionTime",
                                                       "observedGeneration"}


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.kind)
def test_spec_schema_names_every_model_field_by_its_yaml_name(kind: Any) -> None:
    spec_model = kind.model.model_fields["spec"].annotation
    schema = next(d for d in all_crds() if d["metadata"]["name"] == kind.crd_name)
    spec = schema["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert set(spec["properties"]) == {f.alias or n for n, f in spec_model.model_fields.items()}


# --- specs against the schemas -------------------------------------------------------------------

def validator(kind_name: str) -> jsonschema.Draft4Validator:
    doc = next(d for d in all_crds() if d["spec"]["names"]["kind"] == kind_name)
    return jsonschema.Draft4Validator(json_schema(doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]))


def example_specs() -> list[tuple[str, dict[str, Any]]]:
    found = []
    for path in sorted(EXAMPLE.rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and doc.get("apiVersion") == PLNT_API_VERSION:
                found.append((str(path.relative_to(EXAMPLE)), doc))
    return found


RICH = [
    {"apiVersion": "plnt.work/v1", "kind": "WorkflowRun", "metadata": {"name": "gpu-run", "namespace": "team-a"},
     "spec": {"workflow": {"ref": "review-responder@2.0.0-rc.1", "registry": "oci://registry.example/recipes",
                           "integrityHash": "sha256:" + "a" * 64},
              "backend": {"cluster": "gpu-cluster-01", "gpuClass": "nvidia.com/h100", "gpuCount": 2,
                          "nodeSelector": {"pool": "agent-workflows"},
                          "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]},
              "replicas": {"min": 1, "max": 4}, "autoscaling": {"targetInvocationsPerSecond": 25},
              "canary": {"trafficPercent": 10, "smokeTest": {"invocations": 20, "p95BudgetMs": 2500.5,
                                                             "errorBudgetPercent": 1, "ttftBudgetMs": 300,
                                                             "tpotBudgetMs": 40, "concurrency": 4}},
              "selfHeal": False}},
    {"apiVersion": "plnt.work/v1", "kind": "PlntBackend", "metadata": {"name": "gpu-cluster-01"},
     "spec": {"type": "kubernetes", "gpuClasses": ["nvidia.com/h100"],
              "kubernetes": {"context": "prod", "namespace": "agents"},
              "nodeSelector": {"pool": "gpu"}, "tolerations": [{"key": "gpu", "value": "yes", "effect": "NoExecute"}]}},
    {"apiVersion": "plnt.work/v1", "kind": "RecipeTrustPolicy", "metadata": {"name": "ci"},
     "spec": {"recipes": ["team-*"], "trustRoot": {"publicGood": True},
              "signers": [{"issuer": "https://token.actions.githubusercontent.com",
                           "identityRegex": r"https://github\.com/acme/.*"}]}},
]


@pytest.mark.parametrize(("where", "doc"), example_specs() + [("rich", d) for d in RICH],
                         ids=lambda v: v if isinstance(v, str) else "")
def test_every_example_spec_validates_against_its_crd(where: str, doc: dict[str, Any]) -> None:
    KIND_MODELS[(doc["apiVersion"], doc["kind"])].model_validate(doc)  # the model accepts it ...
    validator(doc["kind"]).validate(doc)  # ... and so does the CRD


def test_the_examples_cover_every_kind() -> None:
    assert {doc["kind"] for _, doc in example_specs()} == {k.kind for k in KINDS}


def mutated(doc: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    *parents, last = path.split(".")
    node = out
    for key in parents:
        node = node[key]
    node[last] = value
    return out


BROKEN = [
    ("unknown field", RICH[0], "spec.canary.trafficPercnt", 5),
    ("unknown top-level spec field", RICH[0], "spec.replica", {"min": 1}),
    ("wrong type: string for integer", RICH[0], "spec.canary.trafficPercent", "5"),
    ("wrong type: object for string", RICH[0], "spec.workflow.ref", {"name": "x"}),
    ("above maximum", RICH[0], "spec.canary.trafficPercent", 101),
    ("exclusive minimum", RICH[0], "spec.autoscaling.targetInvocationsPerSecond", 0),
    ("pattern", RICH[0], "spec.workflow.ref", "review-responder:1.2.0"),
    ("pattern of a digest", RICH[0], "spec.workflow.integrityHash", "md5:abc"),
    ("enum", RICH[0], "spec.backend.tolerations", [{"operator": "Maybe"}]),
    ("null where not nullable", RICH[0], "spec.replicas.min", None),
    ("missing required", RICH[0], "spec.workflow", {"ref": "a@1.0.0"}),
    ("unknown field in a backend", RICH[1], "spec.kubernetes.cluster", "x"),
    ("enum of a backend type", RICH[1], "spec.type", "docker"),
    ("wrong type in a policy", RICH[2], "spec.recipes", "team-*"),
    ("unknown field in a signer", RICH[2], "spec.signers", [{"issuer": "x", "identity": "y", "subject": "z"}]),
    ("metadata name", RICH[0], "metadata.name", "Not_A_Name"),
]


@pytest.mark.parametrize(("why", "doc", "path", "value"), BROKEN, ids=[b[0] for b in BROKEN])
def test_a_broken_spec_does_not_validate(why: str, doc: dict[str, Any], path: str, value: Any) -> None:
    bad = mutated(doc, path, value)
    with pytest.raises(jsonschema.ValidationError):
        validator(doc["kind"]).validate(bad)
    with pytest.raises(ValueError):  # the model agrees (pydantic's ValidationError is a ValueError)
        KIND_MODELS[(bad["apiVersion"], bad["kind"])].model_validate(bad)


# --- the status plnt writes ------------------------------------------------------------------------

@pytest.mark.parametrize(("phase", "ready", "reconciling", "stalled"), [
    (Phase.PENDING, "Unknown", "True", "False"),
    (Phase.VERIFYING, "Unknown", "True", "False"),
    (Phase.DEPLOYING, "Unknown", "True", "False"),
    (Phase.CANARY, "Unknown", "True", "False"),
    (Phase.READY, "True", "False", "False"),
    (Phase.ROLLED_BACK, "False", "False", "True"),
    (Phase.FAILED, "False", "False", "True"),
    (Phase.DELETING, "False", "True", "False"),
])
def test_conditions_follow_the_phase(phase: Phase, ready: str, reconciling: str, stalled: str) -> None:
    conditions = conditions_for(phase, "why", 3, [], NOW)
    assert [(c.type, c.status, c.reason, c.observed_generation) for c in conditions] == [
        ("Ready", ready, phase.value, 3), ("Reconciling", reconciling, phase.value, 3),
        ("Stalled", stalled, phase.value, 3)]


def test_last_transition_time_moves_only_when_a_condition_status_changes() -> None:
    first = [c.model_dump(by_alias=True) for c in conditions_for(Phase.VERIFYING, "", 1, [], NOW)]
    later = NOW + timedelta(minutes=5)
    second = {c.type: c for c in conditions_for(Phase.CANARY, "", 1, first, later)}
    assert {c.last_transition_time for c in second.values()} == {"2026-12-01T01:00:00Z"}  # all unchanged
    third = {c.type: c for c in conditions_for(Phase.READY, "", 2, first, later)}
    assert third["Ready"].last_transition_time == third["Reconciling"].last_transition_time == "2026-12-01T01:05:00Z"
    assert third["Stalled"].last_transition_time == "2026-12-01T01:00:00Z"


def test_cr_status_fits_the_status_schema() -> None:
    status = WorkflowRunStatus(namespace="default", name="r", phase=Phase.CANARY, version="1.2.0",
                               canary_version="1.3.0", traffic_percent=5, observed_commit="a" * 40,
                               message="smoke-testing 1.3.0", smoke_test={"p95_ms": 12.5, "errors": 0})
    body = cr_status(status, 4, [], NOW).model_dump(mode="json", by_alias=True, exclude_none=True)
    assert body["observedGeneration"] == 4 and body["phase"] == "Canary" and body["canaryPercent"] == 5
    doc = next(d for d in all_crds() if d["metadata"]["name"] == "workflowruns.plnt.work")
    schema = doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    jsonschema.Draft4Validator(json_schema(schema, root=False)).validate(body)
    CrStatus.model_validate(body)


def test_kind_of_finds_a_kind_by_any_of_its_names() -> None:
    assert kind_of("wfr").kind == kind_of("workflowruns").kind == kind_of("WorkflowRun").kind == "WorkflowRun"


# --- the command -------------------------------------------------------------------------------

def test_plnt_crds_prints_every_crd_and_writes_them_with_out(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["crds"], catch_exceptions=False)
    assert result.exit_code == 0
    docs = [d for d in yaml.safe_load_all(result.stdout) if d]
    assert [d["metadata"]["name"] for d in docs] == ["workflowruns.plnt.work", "modeldeployments.plnt.work", "plntbackends.plnt.work",
                                                     "recipetrustpolicies.plnt.work"]
    result = CliRunner().invoke(app, ["crds", "--out", str(tmp_path / "crds")], catch_exceptions=False)
    assert result.exit_code == 0
    assert {p.name: p.read_text() for p in (tmp_path / "crds").iterdir()} == crd_files()
