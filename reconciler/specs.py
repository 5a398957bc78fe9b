"""Spec models: the resources a spec repository holds, and the recipe a registry serves.

`WorkflowRun` and `PlntBackend` (apiVersion plnt.work/v1) live in the spec repository;
`Workflow` (apiVersion microagents.dev/v1) is a recipe's `workflow.yaml`.

Models are strict: unknown fields and wrong types are errors, never coerced or ignored.
Field names in YAML are camelCase (as in Kubernetes); attributes are snake_case.
Cross-document checks (duplicates, backend references, GPU classes, step graphs) are in
`plnt.reconciler.loader`, where they can name the file and line.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

PLNT_API_VERSION = "plnt.work/v1"
RECIPE_API_VERSION = "microagents.dev/v1"

# RFC 1123 label, as Kubernetes requires for names it turns into DNS and labels.
NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
# semver-ish: 1.2.0, 1.3.0-rc.1, 2.0.0+build.5
VERSION_PATTERN = r"^[0-9]+\.[0-9]+\.[0-9]+([-+][0-9A-Za-z.+-]+)?$"
REF_PATTERN = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?@[0-9]+\.[0-9]+\.[0-9]+([-+][0-9A-Za-z.+-]+)?$"
INTEGRITY_PATTERN = r"^sha256:[0-9a-f]{64}$"


class SpecModel(BaseModel):
    """Base for every spec model: strict, immutable, camelCase in YAML."""

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        strict=True,
        alias_generator=to_camel,
        populate_by_name=True,
    )


# --- plnt.work/v1 -------------------------------------------------------------------------


class Metadata(SpecModel):
    name: str = Field(pattern=NAME_PATTERN)
    namespace: str = Field(default="default", pattern=NAME_PATTERN)
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


class WorkflowSource(SpecModel):
    """Which recipe to run: `name@version` from a registry, optionally pinned by digest."""

    ref: str = Field(pattern=REF_PATTERN, description="recipe name@version, e.g. review-responder@1.2.0")
    registry: str = Field(
        min_length=1,
        description="s3://bucket/prefix, oci://host/repo, or file:///abs/dir (file:relative/dir is "
        "resolved against the root of the spec repository at the reconciled commit)",
    )
    integrity_hash: str | None = Field(default=None, pattern=INTEGRITY_PATTERN)

    @property
    def name(self) -> str:
        return self.ref.split("@", 1)[0]

    @property
    def version(self) -> str:
        return self.ref.split("@", 1)[1]

    @field_validator("registry")
    @classmethod
    def _known_scheme(cls, value: str) -> str:
        if not re.match(r"^(s3://|oci://|file:)", value):
            raise ValueError("registry must start with s3://, oci:// or file: (a local directory)")
        return value


class Toleration(SpecModel):
    key: str | None = None
    operator: Literal["Exists", "Equal"] = "Equal"
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None


class BackendPlacement(SpecModel):
    """Where a WorkflowRun runs: a PlntBackend by name, and what it needs there."""

    cluster: str = Field(pattern=NAME_PATTERN, description="metadata.name of a PlntBackend")
    gpu_class: str | None = None
    gpu_count: int = Field(default=0, ge=0)
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[Toleration] = Field(default_factory=list)

    @model_validator(mode="after")
    def _gpu_count_needs_class(self) -> BackendPlacement:
        if self.gpu_count > 0 and self.gpu_class is None:
            raise ValueError("gpuCount > 0 needs a gpuClass")
        return self


class Replicas(SpecModel):
    min: int = Field(default=1, ge=1)
    max: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _max_not_below_min(self) -> Replicas:
        if self.max is not None and self.max < self.min:
            raise ValueError(f"max ({self.max}) must be >= min ({self.min})")
        return self


class Autoscaling(SpecModel):
    target_invocations_per_second: float = Field(gt=0)


class SmokeTest(SpecModel):
    """Invocations sent to the canary before promotion, and the budgets they must meet."""

    invocations: int = Field(default=10, ge=1, le=10_000)
    p95_budget_ms: float = Field(default=2500, gt=0)
    error_budget_percent: float = Field(default=1, ge=0, le=100)
    ttft_budget_ms: float | None = Field(default=None, gt=0)
    tpot_budget_ms: float | None = Field(default=None, gt=0)
    concurrency: int = Field(default=2, ge=1, le=256)


class Canary(SpecModel):
    traffic_percent: int = Field(default=5, ge=0, le=100)
    smoke_test: SmokeTest = Field(default_factory=SmokeTest)


class WorkflowRunSpec(SpecModel):
    workflow: WorkflowSource
    backend: BackendPlacement
    replicas: Replicas = Field(default_factory=Replicas)
    autoscaling: Autoscaling | None = None
    canary: Canary = Field(default_factory=Canary)
    self_heal: bool = True


class WorkflowRun(SpecModel):
    api_version: Literal["plnt.work/v1"]
    kind: Literal["WorkflowRun"]
    metadata: Metadata
    spec: WorkflowRunSpec

    @property
    def key(self) -> str:
        return run_key(self.metadata.namespace, self.metadata.name)

    def fingerprint(self) -> str:
        """A stable digest of the spec: equal specs deploy the same release."""
        return spec_fingerprint(self.spec)


class KubernetesTarget(SpecModel):
    context: str | None = None
    namespace: str = Field(default="default", pattern=NAME_PATTERN)
    kubeconfig: str | None = None


class PlntBackendSpec(SpecModel):
    type: Literal["local", "kubernetes"]
    gpu_classes: list[str] = Field(default_factory=list)
    kubernetes: KubernetesTarget | None = None
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[Toleration] = Field(default_factory=list)

    @model_validator(mode="after")
    def _kubernetes_needs_target(self) -> PlntBackendSpec:
        if self.type == "kubernetes" and self.kubernetes is None:
            raise ValueError("type: kubernetes needs a kubernetes: {context, namespace} block")
        if self.type == "local" and self.kubernetes is not None:
            raise ValueError("kubernetes: is only allowed with type: kubernetes")
        return self


class BackendMetadata(SpecModel):
    """Backends are cluster-wide: a name, no namespace."""

    name: str = Field(pattern=NAME_PATTERN)
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


class PlntBackend(SpecModel):
    api_version: Literal["plnt.work/v1"]
    kind: Literal["PlntBackend"]
    metadata: BackendMetadata
    spec: PlntBackendSpec


# --- microagents.dev/v1 (the recipe) -------------------------------------------------------


class RecipeMetadata(SpecModel):
    name: str = Field(pattern=NAME_PATTERN)
    version: str = Field(pattern=VERSION_PATTERN)


class Runtime(SpecModel):
    image: str | None = None
    entrypoint: str = Field(
        default="steps.py", description="the recipe's Python module, relative to workflow.yaml"
    )


StepTool = Literal["llm.classify", "llm.generate", "rag.query", "policy.moderate", "python"]


class Step(SpecModel):
    id: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    tool: StepTool
    deps: list[str] = Field(default_factory=list)
    params: dict[str, Any] = Field(default_factory=dict)


class Requirements(SpecModel):
    gpu_class: str | None = None
    gpu_count: int = Field(default=0, ge=0)
    memory_gi_b: float | None = Field(default=None, gt=0, alias="memoryGiB")


class Workflow(SpecModel):
    api_version: Literal["microagents.dev/v1"]
    kind: Literal["Workflow"]
    metadata: RecipeMetadata
    description: str = ""
    runtime: Runtime = Field(default_factory=Runtime)
    steps: list[Step] = Field(min_length=1)
    output: str | None = Field(default=None, description="id of the step whose result is returned")
    requirements: Requirements = Field(default_factory=Requirements)


# --- helpers -------------------------------------------------------------------------------

KIND_MODELS: dict[tuple[str, str], type[SpecModel]] = {
    (PLNT_API_VERSION, "WorkflowRun"): WorkflowRun,
    (PLNT_API_VERSION, "PlntBackend"): PlntBackend,
    (RECIPE_API_VERSION, "Workflow"): Workflow,
}


def run_key(namespace: str, name: str) -> str:
    return f"{namespace}/{name}"


def spec_fingerprint(model: BaseModel) -> str:
    canonical = json.dumps(model.model_dump(mode="json", by_alias=True), sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


def flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}; lists are leaves. Used to name what changed."""
    if isinstance(data, dict) and data:
        out: dict[str, Any] = {}
        for key, value in data.items():
            out.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: data}


def step_levels(steps: list[Step]) -> list[list[str]]:
    """Step ids grouped into levels: every step's deps are in earlier levels.

    Steps in one level are independent and may run concurrently. Raises ValueError on an
    unknown dependency or a cycle (the loader reports those with file and line first).
    """
    ids = {step.id for step in steps}
    pending = {step.id: set(step.deps) for step in steps}
    for step in steps:
        unknown = set(step.deps) - ids
        if unknown:
            raise ValueError(f"step {step.id} depends on unknown step(s) {sorted(unknown)}")
    levels: list[list[str]] = []
    done: set[str] = set()
    while pending:
        ready = [step.id for step in steps if step.id in pending and pending[step.id] <= done]
        if not ready:
            raise ValueError(f"steps {sorted(pending)} form a dependency cycle")
        levels.append(ready)
        done.update(ready)
        for step_id in ready:
            del pending[step_id]
    return levels


def output_step(workflow: Workflow) -> str:
    """The step whose result the workflow returns: `output`, else the last step with no dependents."""
    if workflow.output is not None:
        return workflow.output
    depended_on = {dep for step in workflow.steps for dep in step.deps}
    sinks = [step.id for step in workflow.steps if step.id not in depended_on]
    return sinks[-1]
