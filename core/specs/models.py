"""Spec models: the resources a spec repository holds, and the recipe a registry serves.

`WorkflowRun`, `PlntBackend` and `RecipeTrustPolicy` (apiVersion plnt.work/v1) live in the spec repository;
`Workflow` (apiVersion microagents.dev/v1) is a recipe's `workflow.yaml`.

Models are strict: unknown fields and wrong types are errors, never coerced or ignored.
Field names in YAML are camelCase (as in Kubernetes); attributes are snake_case.
Cross-document checks (duplicates, backend references, GPU classes, step graphs) are in
`plnt.core.specs.loader`, where they can name the file and line.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import re
from collections.abc import Mapping
from functools import cached_property
from typing import Annotated, Any, ClassVar, Literal, Self, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)
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
        # Refused here, at the spec's own line: read later, `..` would be reported as a refused name in
        # the commit's tree (file:rel) or silently resolved against the host (file:///).
        if value.startswith("file:") and ".." in value.removeprefix("file:").split("/"):
            raise ValueError(f"{value!r}: a file registry path must not contain '..': name a directory inside the "
                             "spec repository (file:registry) or under a directory plnt is started with "
                             "--allow-file-registry DIR (file:///DIR/sub)")
        return value


class Toleration(SpecModel):
    key: str | None = None
    operator: Literal["Exists", "Equal"] = "Equal"
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None


class BackendSelector(SpecModel):
    """The PlntBackends whose metadata.labels hold every one of `matchLabels` (as a Kubernetes selector)."""

    match_labels: dict[str, str] = Field(min_length=1, description="labels a PlntBackend must carry, all of them")

    def matches(self, backend: PlntBackend) -> bool:
        labels = backend.metadata.labels
        return all(labels.get(key) == value for key, value in self.match_labels.items())


POOL_FIELDS = ("cluster", "refs", "selector")


class BackendPlacement(SpecModel):
    """Where a WorkflowRun or ModelDeployment runs: one PlntBackend by name (`cluster`), or a pool of
    them (`refs`, or a `selector` on their labels) across which plnt places its replicas by free
    capacity (reconciler/plan/placement.py); and what each replica needs there."""

    cluster: str | None = Field(default=None, pattern=NAME_PATTERN, description="metadata.name of a PlntBackend")
    refs: list[Annotated[str, Field(pattern=NAME_PATTERN)]] | None = Field(
        default=None, min_length=1, max_length=50,
        description="a pool: metadata.names of PlntBackends; plnt spreads the replicas across them")
    selector: BackendSelector | None = Field(default=None, description=(
        "a pool: the PlntBackends whose labels match; plnt spreads the replicas across them"))
    gpu_class: str | None = None
    gpu_count: int = Field(default=0, ge=0, description="GPUs of gpuClass each replica needs")
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[Toleration] = Field(default_factory=list)

    @model_validator(mode="after")
    def _gpu_count_needs_class(self) -> BackendPlacement:
        given = [name for name in POOL_FIELDS if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of cluster (one PlntBackend), refs (a list of them) or selector "
                             f"(matchLabels on their labels); this gives {' and '.join(given) or 'none'}")
        if self.refs is not None and len(set(self.refs)) != len(self.refs):
            twice = sorted({ref for ref in self.refs if self.refs.count(ref) > 1})
            raise ValueError(f"refs names {', '.join(twice)} more than once; list each backend once")
        if self.gpu_count > 0 and self.gpu_class is None:
            raise ValueError("gpuCount > 0 needs a gpuClass")
        return self

    @model_serializer(mode="wrap")
    def _without_unset_pool(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # The pool fields are left out when unset: a spec naming one backend keeps the fingerprint
        # (a digest of this dump) it had before pools existed, so nothing is rolled out again.
        data: dict[str, Any] = handler(self)
        for name in POOL_FIELDS:
            if data.get(name) is None:
                data.pop(name, None)
        return data

    @property
    def pooled(self) -> bool:
        """A pool (refs or selector) rather than one backend."""
        return self.cluster is None

    def members(self, backends: Mapping[str, PlntBackend]) -> list[str]:
        """The names of the declared backends this placement may use: the cluster, the refs (in
        their order) or those the selector matches (by name); a name no backend has is left out."""
        if self.cluster is not None:
            return [self.cluster] if self.cluster in backends else []
        if self.refs is not None:
            return [name for name in self.refs if name in backends]
        assert self.selector is not None
        return sorted(name for name, backend in backends.items() if self.selector.matches(backend))

    def describe(self) -> str:
        """The placement as a person wrote it: `a`, `refs [a, b]` or `selector pool=x`."""
        if self.cluster is not None:
            return self.cluster
        if self.refs is not None:
            return f"refs [{', '.join(self.refs)}]"
        assert self.selector is not None
        return "selector " + ",".join(f"{k}={v}" for k, v in sorted(self.selector.match_labels.items()))


class Replicas(SpecModel):
    """min: 0 is scale to zero (local backends only): the runner stops after its backend's scaleToZeroAfterSeconds without an invocation, and the next request starts it again."""  # noqa: E501

    min: int = Field(default=1, ge=0)
    max: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _max_not_below_min(self) -> Replicas:
        if self.max is not None and self.max < self.min:
            raise ValueError(f"max ({self.max}) must be >= min ({self.min})")
        return self


DEFAULT_SCALE_DOWN_AFTER_S = 60.0


class Autoscaling(SpecModel):
    """Replicas between replicas.min and replicas.max follow the load. `targetInFlight`: the in-flight
    requests (being served plus waiting) one replica should carry; plnt's local driver scales on it,
    and so does the Kubernetes charts' HPA (a Pods metric through a metrics adapter, docs/kubernetes.md).
    `targetInvocationsPerSecond`: the workflow-runner chart's HPA only (Kubernetes)."""

    target_in_flight: float | None = Field(default=None, gt=0, le=10_000, description=(
        "in-flight requests (being served plus waiting) per replica: above it replicas are added at once, "
        "up to replicas.max"))
    target_invocations_per_second: float | None = Field(default=None, gt=0, description=(
        "Kubernetes WorkflowRuns: invocations per second per pod, for the chart's HPA"))
    scale_down_after_seconds: float = Field(default=DEFAULT_SCALE_DOWN_AFTER_S, ge=1, le=86_400, description=(
        "how long the load must stay low enough for one replica fewer before one is stopped (one at a time)"))

    @model_validator(mode="after")
    def _some_target(self) -> Self:
        if self.target_in_flight is None and self.target_invocations_per_second is None:
            raise ValueError("autoscaling needs a target: targetInFlight (in-flight requests per replica, e.g. 4)"
                             " or, on Kubernetes, targetInvocationsPerSecond")
        return self


class SmokeTest(SpecModel):
    """Invocations sent to the canary before promotion, and the budgets they must meet."""

    invocations: int = Field(default=10, ge=1, le=10_000)
    p95_budget_ms: float = Field(default=2500, gt=0)
    error_budget_percent: float = Field(default=1, ge=0, le=100)
    ttft_budget_ms: float | None = Field(default=None, gt=0)
    tpot_budget_ms: float | None = Field(default=None, gt=0)
    concurrency: int = Field(default=2, ge=1, le=256)


_DURATION = re.compile(r"^([1-9][0-9]{0,5})(s|m|h)$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600}
MANUAL = "manual"  # a pause that lasts until a person acts (plnt rollout)


def duration_s(value: str | None) -> float | None:
    """Seconds of a duration as specs write it (30s, 5m, 2h), or None when it is not one."""
    found = _DURATION.match(value or "")
    return float(int(found[1]) * _UNIT_S[found[2]]) if found else None


RESERVED_HEADERS = {"authorization", "host", "content-type", "content-length", "cookie", "x-plnt-track",
                    "x-plnt-preview", "x-session-id", "x-forwarded-for"}


class HeaderRoute(SpecModel):
    """Requests carrying `header: value` go to the canary while it is under test, whatever its
    share (an internal tester cohort); the others are shared by weight as before."""

    header: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9-]{0,63}$", description="a header name, e.g. X-Cohort")
    value: str = Field(min_length=1, max_length=200)

    @field_validator("header")
    @classmethod
    def _not_reserved(cls, value: str) -> str:
        if value.lower() in RESERVED_HEADERS:
            raise ValueError(f"header {value!r} has a meaning of its own to the gateway; choose another (e.g. X-Cohort)")
        return value

    def pair(self) -> tuple[str, str]:
        """As releases and routes carry it: (lower-case name, value)."""
        return self.header.lower(), self.value


class CanaryStep(SpecModel):
    """One step of a stepped canary: the canary takes `weight`% of the traffic and its smoke test must
    pass there; then the rollout waits `pause` (30s, 5m, 1h) before the next step, or with `manual`
    until a person says `plnt rollout resume` (or promote, or abort)."""

    weight: int = Field(ge=0, le=100)
    pause: str | None = Field(default=None, description=(
        "a duration: 30s, 5m or 2h (at most 24h); or manual: until `plnt rollout resume|promote|abort`"))
    gates: list[str] = Field(default_factory=list, max_length=20, description=(
        "names of Gates (same namespace) this step must pass after its smoke test, besides canary.gates"))
    header_route: HeaderRoute | None = Field(default=None, description=(
        "requests with this header value go to the canary during this step, instead of canary.headerRoute "
        "(e.g. only the testers at a 0% first step)"))

    @field_validator("pause")
    @classmethod
    def _duration(cls, value: str | None) -> str | None:
        if value is not None and value != MANUAL:
            seconds = duration_s(value)
            if seconds is None:
                raise ValueError(f"pause {value!r} is not a duration: write a whole number and s, m or h (30s, 5m, "
                                 f"2h), or {MANUAL} to wait for a person")
            if seconds > 86_400:
                raise ValueError(f"pause {value!r} is longer than 24h")
        return value

    @property
    def pause_s(self) -> float:
        return duration_s(self.pause) or 0.0

    @property
    def manual(self) -> bool:
        return self.pause == MANUAL


class _SteppedCanary(SpecModel):
    """`trafficPercent` (one step) or `steps` (several, weights rising): what the saga goes through."""

    steps: list[CanaryStep] = Field(default_factory=list, max_length=20, description=(
        "weights the canary goes through, rising (e.g. 5, 25, 50), each with its smoke test and an optional "
        "pause; then the promotion. Without it: one step at trafficPercent"))
    gates: list[str] = Field(default_factory=list, max_length=20, description=(
        "names of Gates (same namespace) every step must pass after its smoke test"))
    header_route: HeaderRoute | None = Field(default=None, description=(
        "requests with this header value go to the canary at every step that names none of its own (a tester cohort)"))
    shadow_percent: int = Field(default=0, ge=0, le=100, description=(
        "share of the stable release's live invocations also sent to the canary, its answers discarded (and its "
        "sideEffects steps not run): a compare gate then sees the canary without exposing anyone to it"))

    @model_validator(mode="after")
    def _rising(self) -> Self:
        if self.steps and "traffic_percent" in self.model_fields_set:
            raise ValueError("give canary.steps or canary.trafficPercent, not both (one step: steps: [{weight: N}])")
        for i, (before, after) in enumerate(zip(self.steps, self.steps[1:], strict=False), 1):
            if after.weight < before.weight:
                raise ValueError(f"canary.steps[{i}].weight {after.weight} must be above the step before it "
                                 f"({before.weight}): weights rise from step to step")
            # The same weight again is a step only when it sends another cohort (0% testers, then 0% staff).
            if after.weight == before.weight and self.step_canary_header(after) == self.step_canary_header(before):
                raise ValueError(f"canary.steps[{i}].weight {after.weight} must be above the step before it "
                                 f"({before.weight}): weights rise from step to step, or stay with another headerRoute")
        return self

    def plan_steps(self) -> list[CanaryStep]:
        """The steps the saga goes through: `steps`, or one step at `trafficPercent`."""
        return list(self.steps) or [CanaryStep(weight=self.traffic_percent)]  # type: ignore[attr-defined]

    def step_gates(self, step: CanaryStep) -> list[str]:
        """The Gates a step must pass: canary.gates, then the step's own (each once)."""
        return list(dict.fromkeys([*self.gates, *step.gates]))

    def step_canary_header(self, step: CanaryStep) -> tuple[str, str] | None:
        """The cohort a step sends to the canary: the step's own headerRoute, else canary.headerRoute."""
        route = step.header_route or self.header_route
        return route.pair() if route is not None else None

    def gate_names(self) -> list[str]:
        """Every Gate the canary names (for the loader's reference check)."""
        return list(dict.fromkeys([*self.gates, *(name for step in self.steps for name in step.gates)]))


class Canary(_SteppedCanary):
    traffic_percent: int = Field(default=5, ge=0, le=100)
    smoke_test: SmokeTest = Field(default_factory=SmokeTest)


DependencyName = Annotated[str, Field(pattern=NAME_PATTERN)]
DEPENDS_ON_HELP = ("names of WorkflowRuns or ModelDeployments of this namespace whose spec at the same commit must be "
                   "promoted before this one's canary is installed; if one of them fails, so does this rollout")


class WorkflowRunSpec(SpecModel):
    workflow: WorkflowSource
    backend: BackendPlacement
    model: str | None = Field(default=None, pattern=NAME_PATTERN, description=(
        "metadata.name of a ModelDeployment in this namespace: the runners' LLM calls go to it through the "
        "gateway (a model canary gets its share of them); default: plnt's --llm-url, or the offline mock"))
    replicas: Replicas = Field(default_factory=Replicas)
    autoscaling: Autoscaling | None = None
    canary: Canary = Field(default_factory=Canary)
    self_heal: bool = True
    depends_on: list[DependencyName] = Field(default_factory=list, max_length=20, description=DEPENDS_ON_HELP)


class WorkflowRun(SpecModel):
    api_version: Literal["plnt.work/v1"]
    kind: Literal["WorkflowRun"]
    metadata: Metadata
    spec: WorkflowRunSpec

    @property
    def key(self) -> str:
        return run_key(self.metadata.namespace, self.metadata.name)

    @property
    def version(self) -> str:
        """The version a release of this spec serves (the recipe's)."""
        return self.spec.workflow.version

    def fingerprint(self) -> str:
        """A stable digest of the spec: equal specs deploy the same release."""
        return spec_fingerprint(self.spec)


# --- ModelDeployment: signed weights served by a model runtime -------------------------------

MODEL_RUNTIMES = ("llama.cpp", "vllm", "tgi", "sglang")
LOCAL_MODEL_RUNTIMES = ("llama.cpp",)  # what a type: local backend can run (on its CPU)
# Set by plnt for every runtime (where it listens, which file it serves): never from spec.runtime.args.
RESERVED_RUNTIME_ARGS = ("--host", "--port", "--model", "--model_alias", "--served-model-name", "--model-id",
                         "--model-path", "--api_key", "--api-key", "--config_file", "--hostname")
DEFAULT_SMOKE_PROMPTS = ("Reply with one short sentence: what is a canary release?",)


class ModelSource(SpecModel):
    """Which weights to serve: NAME@VERSION from a registry, pinned by the root digest of the signed
    manifest (sha256 over the per-file digests in name order, as the OpenSSF model-signing format)."""

    registry: str = Field(min_length=1, description="s3://bucket/prefix, oci://host/repo, or file:///abs/dir "
                          "(file:relative/dir: inside the spec repository at the reconciled commit)")
    name: str = Field(pattern=NAME_PATTERN, description="the model's name in the registry and in its signed manifest")
    version: str = Field(pattern=VERSION_PATTERN)
    root_digest: str = Field(pattern=INTEGRITY_PATTERN, description="pin: the signed manifest's root digest "
                             "(`plnt model manifest DIR --name NAME` prints it)")
    trust_policy: str | None = Field(default=None, pattern=NAME_PATTERN, description=(
        "metadata.name of the RecipeTrustPolicy that must accept the signature; default: any policy whose "
        "spec.recipes globs cover the model's name"))

    _known_scheme = field_validator("registry")(WorkflowSource._known_scheme.__func__)  # type: ignore[attr-defined]


class ModelResources(SpecModel):
    """What one model server may use. Local: memoryMiB is its address-space limit (instead of the
    backend's runnerLimits.memoryMiB: weights are mapped into memory). Kubernetes: requests and limits."""

    memory_mi_b: int = Field(ge=256, le=2**24, alias="memoryMiB", description="memory of one model server, MiB")
    cpu: float | None = Field(default=None, gt=0, le=1024, description="Kubernetes: CPU cores requested")


class ModelRuntime(SpecModel):
    """The server that serves the weights. llama.cpp runs on a local backend's CPU (and on
    Kubernetes); vLLM, TGI and SGLang run on Kubernetes backends only."""

    type: Literal["llama.cpp", "vllm", "tgi", "sglang"]
    args: list[str] = Field(default_factory=list, description="extra arguments for the runtime's server")
    context_length: int = Field(default=2048, ge=128, le=1 << 20)
    threads: int | None = Field(default=None, ge=1, le=512, description="CPU threads (llama.cpp); default: its own")
    image: str | None = Field(default=None, min_length=1, description="Kubernetes: the runtime's container image")
    resources: ModelResources | None = Field(default=None, description=(
        "default: the backend's runnerLimits (local) or plnt's setting (Kubernetes)"))

    @field_validator("args")
    @classmethod
    def _no_reserved_args(cls, value: list[str]) -> list[str]:
        for arg in value:
            if arg.split("=", 1)[0] in RESERVED_RUNTIME_ARGS:
                raise ValueError(f"{arg.split('=', 1)[0]} is set by plnt (where the server listens and what it "
                                 "serves); remove it from spec.runtime.args")
        return value


class ModelGoldenCase(SpecModel):
    """A model's golden case, what a quality Gate holds its canary (and its stable release) to: the
    reply to `prompt` at temperature 0 must pass each of `checks` (core/expectations.py: equals,
    contains, regex, schema, near). The checked output is the reply's text; a check with a `path`,
    or a `schema` check, reads the text as JSON."""

    name: str = Field(pattern=NAME_PATTERN)
    prompt: str = Field(min_length=1, max_length=8000, description="the user message")
    system: str | None = Field(default=None, max_length=8000, description="a system message sent before it")
    max_tokens: int = Field(default=64, ge=1, le=4096, description="tokens the reply may generate")
    checks: list[dict[str, Any]] = Field(min_length=1, max_length=20, description=(
        "what the reply must satisfy, each one of {equals}, {contains}, {regex}, {schema}, {near, tolerance}, "
        "with an optional path into the reply read as JSON"))

    @field_validator("checks")
    @classmethod
    def _checks(cls, value: list[dict[str, Any]]) -> list[dict[str, Any]]:
        from plnt.core.expectations import Check  # (jsonschema and regex: loaded only for specs that have checks)
        from pydantic import ValidationError

        for i, check in enumerate(value):
            try:
                Check.model_validate(check)
            except ValidationError as exc:
                error = exc.errors()[0]
                where = ".".join(str(part) for part in error["loc"])
                raise ValueError(f"checks[{i}]{'.' + where if where else ''}: "
                                 f"{error['msg'].removeprefix('Value error, ')}") from None
        return value


class ModelCanary(_SteppedCanary):
    traffic_percent: int = Field(default=5, ge=0, le=100)
    smoke_test: SmokeTest = Field(default_factory=lambda: SmokeTest(invocations=5, concurrency=1))
    prompts: list[str] = Field(default_factory=lambda: list(DEFAULT_SMOKE_PROMPTS), min_length=1,
                               description="user messages the smoke test sends, in turn")
    max_tokens: int = Field(default=16, ge=1, le=4096, description="tokens each smoke-test reply may generate")
    golden: list[ModelGoldenCase] = Field(default_factory=list, max_length=50, description=(
        "prompts with expectations, for a quality Gate (canary.gates): run on the canary and the stable release"))

    @field_validator("golden")
    @classmethod
    def _unique(cls, value: list[ModelGoldenCase]) -> list[ModelGoldenCase]:
        names = [case.name for case in value]
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            raise ValueError(f"golden case names must be unique: {', '.join(twice)} given more than once")
        return value


class ModelReplicas(Replicas):
    """A model server keeps its weights in memory: no scale to zero (min 1 or more)."""

    min: int = Field(default=1, ge=1)


class ModelDeploymentSpec(SpecModel):
    model: ModelSource
    runtime: ModelRuntime
    backend: BackendPlacement
    replicas: ModelReplicas = Field(default_factory=ModelReplicas)
    autoscaling: Autoscaling | None = None
    canary: ModelCanary = Field(default_factory=ModelCanary)
    self_heal: bool = True
    depends_on: list[DependencyName] = Field(default_factory=list, max_length=20, description=DEPENDS_ON_HELP)
    fallback: str | None = Field(default=None, pattern=NAME_PATTERN, description=(
        "metadata.name of another ModelDeployment of this namespace: the gateway sends this model's chat "
        "completions there when this one is down or over its own limit (one hop; never past a token's limits)"))

    # Routing only, left out of the fingerprint (spec_fingerprint): a change reaches the gateways with the
    # next reconciled commit and rolls nothing out.
    routing_fields: ClassVar[frozenset[str]] = frozenset({"fallback"})


class ModelDeployment(SpecModel):
    """Signed model weights served by a runtime, rolled out by the same saga as a WorkflowRun.
    Its name shares the namespace's names with WorkflowRuns (one key per name): the gateway serves
    it at /v1/chat/completions with model = its name."""

    api_version: Literal["plnt.work/v1"]
    kind: Literal["ModelDeployment"]
    metadata: Metadata
    spec: ModelDeploymentSpec

    @property
    def key(self) -> str:
        return run_key(self.metadata.namespace, self.metadata.name)

    @property
    def version(self) -> str:
        return self.spec.model.version

    def fingerprint(self) -> str:
        return spec_fingerprint(self.spec)


Deployable = WorkflowRun | ModelDeployment  # what a saga rolls out


DEFAULT_SCALE_TO_ZERO_AFTER_S = 300.0


class ClusterAutoscaler(SpecModel):
    """What scales a Kubernetes backend's releases that set spec.autoscaling, on the same in-flight
    signal plnt's local autoscaler follows (docs/kubernetes.md, "Autoscaling on in-flight requests").
    `hpa`: the charts' own autoscaling/v2 HPA on Pods metrics, which a custom-metrics adapter (e.g.
    prometheus-adapter) must serve. `keda`: a KEDA ScaledObject whose Prometheus trigger queries
    `prometheusAddress` for the release's pods' series (KEDA makes and drives the HPA)."""

    kind: Literal["hpa", "keda"] = "hpa"
    prometheus_address: str | None = Field(default=None, max_length=2048, description=(
        "kind keda: the Prometheus KEDA's operator queries, e.g. http://prometheus.monitoring:9090"))

    @field_validator("prometheus_address")
    @classmethod
    def _an_http_url(cls, address: str | None) -> str | None:
        if address is not None and not re.fullmatch(r"https?://[^\s/?#]+(/[^\s?#]*)?", address):
            raise ValueError(f"{address!r} is not an http:// or https:// URL of a Prometheus server "
                             "(e.g. http://prometheus.monitoring:9090)")
        return address

    @model_validator(mode="after")
    def _address_with_keda(self) -> Self:
        if self.kind == "keda" and self.prometheus_address is None:
            raise ValueError("autoscaler kind keda needs prometheusAddress: the Prometheus that scrapes the "
                             "runner pods, as KEDA's operator reaches it (e.g. http://prometheus.monitoring:9090)")
        if self.kind == "hpa" and self.prometheus_address is not None:
            raise ValueError("prometheusAddress is only used with autoscaler kind keda (the hpa kind reads a "
                             "metrics adapter's Pods metrics); set kind: keda or remove prometheusAddress")
        return self


class KubernetesTarget(SpecModel):
    context: str | None = None
    namespace: str = Field(default="default", pattern=NAME_PATTERN)
    kubeconfig: str | None = None
    # The DNS domain under which plnt's gateway and smoke test reach this cluster's Services
    # (RELEASE.NAMESPACE.svc.DOMAIN): cluster.local from inside the cluster; with several clusters,
    # the domain each one's Services are reachable under from where plnt runs.
    cluster_domain: str = Field(
        default="cluster.local", max_length=253,
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
    # What scales releases with spec.autoscaling here: the charts' HPA (default) or a KEDA ScaledObject.
    autoscaler: ClusterAutoscaler = Field(default_factory=ClusterAutoscaler)


class RunnerLimits(SpecModel):
    """Resource limits of each runner process on a `type: local` backend, set (soft and hard) by the
    runner before it imports any recipe code. memoryMiB caps the address space (RLIMIT_AS: virtual
    memory, so leave room above the resident size; a runner starts at ~160 MiB); processes is
    RLIMIT_NPROC, which Linux counts per user (every process and thread of plnt's user), and root
    is not held by it."""

    memory_mi_b: int = Field(default=2048, ge=256, le=2**22, alias="memoryMiB")
    open_files: int = Field(default=1024, ge=64, le=2**20)
    processes: int = Field(default=4096, ge=64, le=2**22)


class BackendCapacity(SpecModel):
    """What plnt may place on a backend (declared, not measured): GPUs of each class, and replicas
    (runner and model-server processes or pods) in all. Unset: no limit of that kind."""

    gpus: dict[str, Annotated[int, Field(ge=0, le=1_000_000)]] = Field(default_factory=dict, description=(
        "GPUs of each class (a class of spec.gpuClasses) that replicas may request here, e.g. {nvidia.com/h100: 8}"))
    replicas: int | None = Field(default=None, ge=0, le=1_000_000, description=(
        "replicas of every WorkflowRun and ModelDeployment this backend may run at once"))


class PlntBackendSpec(SpecModel):
    type: Literal["local", "kubernetes"]
    gpu_classes: list[str] = Field(default_factory=list)
    capacity: BackendCapacity | None = Field(default=None, description=(
        "what plnt may place here (GPUs per class, replicas); placement across pools spreads by what is free"))
    kubernetes: KubernetesTarget | None = None
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[Toleration] = Field(default_factory=list)
    runner_limits: RunnerLimits = Field(default_factory=RunnerLimits)
    # Idle seconds after which the runner of a `replicas.min: 0` WorkflowRun stops (type: local).
    scale_to_zero_after_seconds: float = Field(default=DEFAULT_SCALE_TO_ZERO_AFTER_S, ge=1, le=7 * 86400)

    @model_validator(mode="after")
    def _kubernetes_needs_target(self) -> PlntBackendSpec:
        unoffered = sorted(set(self.capacity.gpus) - set(self.gpu_classes)) if self.capacity is not None else []
        if unoffered:
            raise ValueError(f"capacity.gpus names {', '.join(unoffered)}, which spec.gpuClasses does not list; add "
                             "it to gpuClasses or remove it from capacity.gpus")
        if self.type == "kubernetes" and self.kubernetes is None:
            raise ValueError("type: kubernetes needs a kubernetes: {context, namespace} block")
        if self.type == "local" and self.kubernetes is not None:
            raise ValueError("kubernetes: is only allowed with type: kubernetes")
        if self.type == "kubernetes" and self.runner_limits != RunnerLimits():
            # Not silently ignored: pods get their limits from the chart's resources. (Compared with the
            # defaults, not "was it set": dumped and re-read backends carry the defaults.)
            raise ValueError("runnerLimits: is only allowed with type: local (Kubernetes runners: chart resources)")
        if self.type == "kubernetes" and self.scale_to_zero_after_seconds != DEFAULT_SCALE_TO_ZERO_AFTER_S:
            raise ValueError("scaleToZeroAfterSeconds: is only allowed with type: local (plnt does not scale "
                             "Kubernetes runners to zero)")
        return self


class BackendMetadata(SpecModel):
    """Cluster-wide resources (PlntBackend, RecipeTrustPolicy): a name, no namespace."""

    name: str = Field(pattern=NAME_PATTERN)
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


class PlntBackend(SpecModel):
    api_version: Literal["plnt.work/v1"]
    kind: Literal["PlntBackend"]
    metadata: BackendMetadata
    spec: PlntBackendSpec


def loose_dots(pattern: str) -> list[int]:
    """Offsets of each '.' in a regex that matches any one character where a literal dot was likely
    meant: not escaped, not inside [...], not followed by a quantifier (`.*`, `.+` are wildcards on purpose)."""
    found: list[int] = []
    i, in_class = 0, False
    while i < len(pattern):
        char = pattern[i]
        if char == "\\":
            i += 2
            continue
        if in_class:
            in_class = char != "]"
        elif char == "[":
            in_class = True
            i += 1
            i += pattern.startswith("^", i)
            i += pattern.startswith("]", i)  # a ']' first in a class is a literal
            continue
        elif char == "." and pattern[i + 1 : i + 2] not in ("*", "+", "?", "{"):
            found.append(i)
        i += 1
    return found


class SignerSpec(SpecModel):
    """Who may sign a recipe: an exact OIDC issuer plus an exact identity or a full-match regex.

    The identity is matched against the signing certificate's email and URI SANs (a person's
    email, or a CI workflow identity such as
    https://github.com/acme/recipes/.github/workflows/release.yml@refs/tags/v1).
    """

    issuer: str = Field(min_length=1, description="exact OIDC issuer URL")
    identity: str | None = Field(default=None, min_length=1, description="exact SAN (email or URI)")
    identity_regex: str | None = Field(
        default=None, min_length=1, description="regular expression that must match a whole SAN (re.fullmatch)"
    )

    @field_validator("identity_regex")
    @classmethod
    def _regex_compiles(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"identityRegex is not a valid regular expression: {exc}; fix or quote it") from exc
        return value

    @model_validator(mode="after")
    def _one_identity(self) -> SignerSpec:
        if (self.identity is None) == (self.identity_regex is None):
            raise ValueError("a signer needs exactly one of identity (exact) or identityRegex (full match)")
        return self

    def matches_identity(self, sans: list[str]) -> bool:
        if self.identity is not None:
            return self.identity in sans
        assert self.identity_regex is not None
        pattern = re.compile(self.identity_regex)
        return any(pattern.fullmatch(san) for san in sans)

    def regex_warnings(self) -> list[str]:
        """Loose spots in identityRegex. It is applied with re.fullmatch (see matches_identity), so it
        is anchored at both ends already and a missing ^ or $ is no risk; an unescaped '.' is."""
        if self.identity_regex is None:
            return []
        dots = loose_dots(self.identity_regex)
        if not dots:
            return []
        pattern = self.identity_regex
        # A SAN that differs from the intended one only at the first dot, if the regex accepts it.
        other = re.sub(r"\\(.)", r"\1", pattern[: dots[0]] + "X" + pattern[dots[0] + 1 :]).strip("^$")
        example = f" ({other!r} is accepted too)" if re.fullmatch(pattern, other) else ""
        return [f"an unescaped '.' in {pattern!r} matches any character, not only a dot{example}; "
                "write '\\.' for a literal dot"]

    def describe(self) -> str:
        who = self.identity if self.identity is not None else f"/{self.identity_regex}/"
        return f"{who} via {self.issuer}"


class TrustRootSpec(SpecModel):
    """Which Sigstore trust root signatures must chain to: exactly one of the two."""

    public_good: bool | None = Field(
        default=None, description="the Sigstore public-good root bundled with sigstore-python, used offline"
    )
    trusted_root_file: str | None = Field(
        default=None, min_length=1, description="a trusted-root JSON file, relative to the spec repository root"
    )

    @field_validator("trusted_root_file")
    @classmethod
    def _relative_inside_repo(cls, value: str | None) -> str | None:
        if value is not None:
            parts = value.replace("\\", "/").split("/")
            if value.startswith("/") or ".." in parts:
                raise ValueError(
                    f"trustedRootFile {value!r} must be a path relative to the spec repository root, without '..'"
                )
        return value

    @model_validator(mode="after")
    def _exactly_one(self) -> TrustRootSpec:
        if self.public_good is False:
            raise ValueError("publicGood: false selects nothing; use publicGood: true or trustedRootFile")
        if (self.public_good is None) == (self.trusted_root_file is None):
            raise ValueError("trustRoot needs exactly one of publicGood: true or trustedRootFile")
        return self

    def describe(self) -> str:
        return "Sigstore public-good root (offline)" if self.public_good else f"trusted root {self.trusted_root_file}"


class RecipeTrustPolicySpec(SpecModel):
    recipes: list[str] = Field(description="fnmatch globs over recipe names (at least one)")
    trust_root: TrustRootSpec
    signers: list[SignerSpec] = Field(description="at least one; a signature must match one of them")

    @field_validator("recipes")
    @classmethod
    def _globs_not_empty(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError('recipes needs at least one recipe name or glob, e.g. [review-responder, "team-*"]')
        for pattern in value:
            if not pattern.strip():
                raise ValueError("recipes entries must be non-empty name patterns, e.g. review-responder or team-*")
        return value

    @field_validator("signers")
    @classmethod
    def _some_signer(cls, value: list[SignerSpec]) -> list[SignerSpec]:
        if not value:
            raise ValueError("signers needs at least one {issuer, identity or identityRegex}; without one nothing is trusted")
        return value


class RecipeTrustPolicy(SpecModel):
    """Which signers a recipe must be signed by, for the recipes whose names match `spec.recipes`.

    Cluster-wide (no namespace). Several policies may cover the same recipe: a recipe is accepted
    if ANY policy covering it accepts its signature; a recipe no policy covers is rejected.
    """

    api_version: Literal["plnt.work/v1"]
    kind: Literal["RecipeTrustPolicy"]
    metadata: BackendMetadata
    spec: RecipeTrustPolicySpec

    def covers(self, recipe_name: str) -> bool:
        return any(fnmatch.fnmatchcase(recipe_name, pattern) for pattern in self.spec.recipes)


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
    side_effects: bool = Field(default=False, description=(
        "the step acts on the world (sends, writes, charges): in a shadow run (canary.shadowPercent) it is "
        "not run and its result is null"))


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

# --- Gate: a check a canary step must pass beyond its smoke test ------------------------------


class JudgeRubric(SpecModel):
    """An LLM as judge: a ModelDeployment of the namespace scores each golden case's answer 1-5
    against the rubric; a case passes only with at least `minScore` (and its expectations)."""

    model: str = Field(pattern=NAME_PATTERN, description="metadata.name of a ModelDeployment in this namespace")
    rubric: str = Field(min_length=1, max_length=4000, description="what a good answer is, in the judge's words")
    min_score: int = Field(default=3, ge=1, le=5)


class QualityGate(SpecModel):
    """The recipe's golden cases (golden.yaml: `expect` and `checks`) run on the canary and on the
    stable release: the canary's pass rate must reach `minPassRate`, and fall no more than
    `maxDropVsStable` below the stable release's on the same cases."""

    min_pass_rate: float = Field(default=1.0, ge=0, le=1, description="share of golden cases that must pass (0-1)")
    max_drop_vs_stable: float | None = Field(default=0.0, ge=0, le=1, description=(
        "how far the canary's pass rate may fall below the stable release's on the same cases (0-1); "
        "null: no comparison"))
    judge: JudgeRubric | None = None


class MetricGate(SpecModel):
    """A PromQL instant query against a Prometheus; its one value must be within `max`/`min`. In the
    query, $namespace, $name, $canary_version and $stable_version are replaced."""

    prometheus: str = Field(pattern=r"^https?://", max_length=500, description="the Prometheus base URL")
    query: str = Field(min_length=1, max_length=4000)
    max: float | None = None
    min: float | None = None

    @model_validator(mode="after")
    def _bound(self) -> Self:
        if self.max is None and self.min is None:
            raise ValueError("a metric gate needs max or min (or both): the threshold its value is held to")
        if self.max is not None and self.min is not None and self.min > self.max:
            raise ValueError(f"min {self.min} is above max {self.max}: no value could pass")
        return self


GATE_SECRET_PREFIX = "PLNT_GATE_SECRET_"  # a webhook gate's key comes from plnt's environment, never from git


class WebhookGate(SpecModel):
    """An HTTP check: plnt POSTs the rollout (HMAC-signed with the secret) and the answer
    {"pass": bool, "reason": str} is the verdict."""

    url: str = Field(pattern=r"^https?://", max_length=2000)
    secret: str = Field(pattern=r"^[A-Z0-9_]{1,64}$", description=(
        f"the HMAC key's name: plnt reads it from its environment variable {GATE_SECRET_PREFIX}<secret>"))
    timeout: str = Field(default="10s", description="a duration: at most 5m")

    @field_validator("timeout")
    @classmethod
    def _timeout(cls, value: str) -> str:
        seconds = duration_s(value)
        if seconds is None or seconds > 300:
            raise ValueError(f"timeout {value!r}: write a duration of at most 5m (10s, 1m)")
        return value

    @property
    def timeout_s(self) -> float:
        return duration_s(self.timeout) or 0.0  # (validated above)


class CompareGate(SpecModel):
    """Live comparison at the gateway: the real traffic the canary served since its step began,
    against what the stable release served meanwhile, once each has `minRequests` (waiting at most
    `window`; fewer fails the gate: a verdict on three requests is noise)."""

    min_requests: int = Field(default=50, ge=1, le=20_000, description=(
        "requests each release must have served (for TTFT, TPOT and tokens: calls that have the figure)"))
    window: str = Field(default="5m", description="how long to wait, at most, for minRequests each (at most 1h)")
    p95_ratio: float | None = Field(default=1.2, gt=0, description="canary p95 <= p95Ratio x stable p95 + p95SlackMs")
    p95_slack_ms: float = Field(default=10.0, ge=0, description=(
        "added to the allowed p95: on millisecond latencies a ratio alone is noise"))
    error_rate_points: float | None = Field(default=1.0, ge=0, description=(
        "canary error rate (5xx, %) <= stable's + this many points"))
    # Streamed chat (a ModelDeployment's or a workflow's): judged over the calls that have the figure,
    # minRequests of them each; none by default.
    ttft_ratio: float | None = Field(default=None, gt=0, description=(
        "canary TTFT p95 <= ttftRatio x stable TTFT p95 + ttftSlackMs (streamed calls)"))
    ttft_slack_ms: float = Field(default=10.0, ge=0, description="added to the allowed TTFT p95")
    tpot_ratio: float | None = Field(default=None, gt=0, description=(
        "canary TPOT p95 <= tpotRatio x stable TPOT p95 + tpotSlackMs (streamed calls of 2 tokens or more)"))
    tpot_slack_ms: float = Field(default=2.0, ge=0, description="added to the allowed TPOT p95")
    tokens_ratio: float | None = Field(default=None, ge=1, description=(
        "canary mean completion tokens per call within stable's / tokensRatio and stable's x tokensRatio "
        "(a model that rambles or cuts short)"))

    @field_validator("window")
    @classmethod
    def _window(cls, value: str) -> str:
        seconds = duration_s(value)
        if seconds is None or seconds > 3600:
            raise ValueError(f"window {value!r}: write a duration of at most 1h (30s, 5m)")
        return value

    @property
    def window_s(self) -> float:
        return duration_s(self.window) or 0.0  # (validated above)


GATE_TYPES = ("quality", "compare", "metric", "webhook")


class GateSpec(SpecModel):
    quality: QualityGate | None = None
    compare: CompareGate | None = None
    metric: MetricGate | None = None
    webhook: WebhookGate | None = None

    @model_validator(mode="after")
    def _one(self) -> Self:
        given = [name for name in GATE_TYPES if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError(f"a Gate is one of {', '.join(GATE_TYPES)}; this one gives "
                             f"{', '.join(given) if given else 'none'}")
        return self

    @property
    def type(self) -> str:
        return next(name for name in GATE_TYPES if getattr(self, name) is not None)


class Gate(SpecModel):
    """A check a canary step must pass beyond its smoke test, declared once and named by
    WorkflowRuns and ModelDeployments of its namespace (canary.gates, canary.steps[].gates)."""

    api_version: Literal["plnt.work/v1"]
    kind: Literal["Gate"]
    metadata: Metadata
    spec: GateSpec

    @property
    def key(self) -> str:
        return run_key(self.metadata.namespace, self.metadata.name)


# --- GatewayPolicy: quotas and prices at the gateway ------------------------------------------------

# A token's name in the token file (`name=`): what a policy and the usage name, never the secret itself.
TOKEN_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$"


class Budget(SpecModel):
    """What a token may spend per period (UTC day or calendar month), in the policy's currency."""

    amount: float = Field(ge=0, le=1e12)
    per: Literal["day", "month"] = "day"


class Limits(SpecModel):
    """A token's limits. Unset: no limit of that kind."""

    requests_per_minute: int | None = Field(default=None, ge=1, le=10**9)
    # LLM tokens (prompt + completion) per minute, charged once a call has answered: the call that
    # goes over is answered, the next ones wait until the minute's share is back.
    tokens_per_minute: int | None = Field(default=None, ge=1, le=10**12)
    budget: Budget | None = None


class TokenLimits(Limits):
    """One token's limits, by its name in the token file (`TOKEN name=NAME ...`)."""

    name: str = Field(pattern=TOKEN_NAME_PATTERN)


class ModelPrice(SpecModel):
    """What one workflow's or model's tokens cost, per million, in the policy's currency."""

    model: str = Field(pattern=r"^([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?/)?[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
    input_per_million: float = Field(ge=0, le=1e9)
    output_per_million: float = Field(ge=0, le=1e9)


class ModelLimit(SpecModel):
    """A ModelDeployment's capacity at the gateway: chat completions per minute, whoever asks. Over it, a
    model with a `fallback` sends the request there; one without answers 429."""

    model: str = Field(pattern=r"^([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?/)?[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
    requests_per_minute: int = Field(ge=1, le=10**9)


class GatewayPolicySpec(SpecModel):
    currency: str = Field(default="USD", pattern=r"^[A-Z]{3}$")
    prices: list[ModelPrice] = Field(default_factory=list)
    tokens: list[TokenLimits] = Field(default_factory=list)
    # The limits of every token the list does not name (a token with no `name=` included).
    default: Limits | None = None
    models: list[ModelLimit] = Field(default_factory=list)

    def model_limit(self, namespace: str, name: str) -> ModelLimit | None:
        """The limit of model `namespace/name`: an entry naming it with its namespace first, else by name."""
        return _entry_for(self.models, namespace, name)

    @cached_property
    def _by_name(self) -> dict[str, TokenLimits]:  # limits_for is on every request's path
        return {entry.name: entry for entry in self.tokens}

    def limits_for(self, token: str) -> Limits | None:
        """The limits of the token named `token` (its own entry, else `default`)."""
        return self._by_name.get(token, self.default)

    def price_of(self, namespace: str, name: str) -> ModelPrice | None:
        """The price of `namespace/name`: an entry naming it with its namespace first, else by name."""
        return _entry_for(self.prices, namespace, name)


_Entry = TypeVar("_Entry", ModelPrice, ModelLimit)


def _entry_for(entries: list[_Entry], namespace: str, name: str) -> _Entry | None:
    """The entry whose `model` is `namespace/name`, else the last one naming `name` alone, else None."""
    found = None
    for entry in entries:
        if entry.model == f"{namespace}/{name}":
            return entry
        if entry.model == name:
            found = entry
    return found


class GatewayPolicy(SpecModel):
    """Quotas and prices the gateway enforces (at most one per repository; cluster-wide, like a
    PlntBackend): per token name a request rate, an LLM token rate and a budget, and a price table."""

    api_version: Literal["plnt.work/v1"]
    kind: Literal["GatewayPolicy"]
    metadata: BackendMetadata
    spec: GatewayPolicySpec


KIND_MODELS: dict[tuple[str, str], type[SpecModel]] = {
    (PLNT_API_VERSION, "WorkflowRun"): WorkflowRun,
    (PLNT_API_VERSION, "ModelDeployment"): ModelDeployment,
    (PLNT_API_VERSION, "PlntBackend"): PlntBackend,
    (PLNT_API_VERSION, "RecipeTrustPolicy"): RecipeTrustPolicy,
    (PLNT_API_VERSION, "Gate"): Gate,
    (PLNT_API_VERSION, "GatewayPolicy"): GatewayPolicy,
    (RECIPE_API_VERSION, "Workflow"): Workflow,
}


def run_key(namespace: str, name: str) -> str:
    return f"{namespace}/{name}"


def spec_fingerprint(model: BaseModel) -> str:
    """The digest of a spec, which names its release: all of it but its `routing_fields` (which change
    no release) and a WorkflowRun's or ModelDeployment's replica count (`replicas`, `autoscaling`):
    changing only that scales the live release in place (the plan's "scale"), it makes no new
    release. Whether it parks (`replicas.min: 0`) is kept in: a parking runner is started another
    way. Specs at the default count keep the digest they always had."""
    exclude = getattr(type(model), "routing_fields", None)
    data = model.model_dump(mode="json", by_alias=True, exclude=set(exclude) if exclude else None)
    if isinstance(model, WorkflowRunSpec | ModelDeploymentSpec):
        data["replicas"] = {"min": 0 if model.replicas.min == 0 else 1, "max": None}
        if "autoscaling" in data:
            data["autoscaling"] = None
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


def replica_count(spec: WorkflowRunSpec | ModelDeploymentSpec) -> int:
    """The processes (pods) a stable release of this spec starts with: replicas.min, at least one
    (min 0 parks that one when idle)."""
    return max(spec.replicas.min, 1)


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
