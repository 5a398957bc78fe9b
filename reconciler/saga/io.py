"""Inputs and results of the deploy saga and its activities: one model per activity, so fields can
be added without breaking histories already recorded.

A saga's input is not trusted (anyone who reaches the Temporal namespace can start one, or schedule
an activity on plnt's task queue): it only NAMES a commit and what plnt computed from it. Every
activity reads the spec, its backend and the trust policies again from plnt's own clone at that
commit (`plnt.reconciler.saga.commit_specs`) and refuses an input that disagrees (UntrustedSagaInput).
"""

from __future__ import annotations

import string
from typing import Any, Literal

from plnt.core.routes import preview_of
from plnt.core.specs.models import NAME_PATTERN, VERSION_PATTERN, Workflow
from plnt.core.status import Phase
from plnt.reconciler.saga.smoke import SmokeResult
from plnt.reconciler.settings import RetrySettings
from plnt.reconciler.state import Release, Track
from pydantic import BaseModel, ConfigDict, Field, model_validator

COMMIT_PATTERN = r"^[0-9a-f]{40}$"
FINGERPRINT_PATTERN = r"^sha256:[0-9a-f]{64}$"


class _Io(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class SagaRef(_Io):
    """What a saga names: a WorkflowRun at a commit, and the fingerprint and version plnt computed
    from that commit (None for an uninstall). Nothing in it is believed until checked."""

    action: Literal["deploy", "uninstall"]
    namespace: str = Field(pattern=NAME_PATTERN)
    name: str = Field(pattern=NAME_PATTERN)
    commit: str = Field(pattern=COMMIT_PATTERN, description="full sha of a commit of the tracked branch")
    fingerprint: str | None = Field(default=None, pattern=FINGERPRINT_PATTERN)
    version: str | None = Field(default=None, pattern=VERSION_PATTERN)
    # A preview (reconciler/review/previews.py): pull request number; `name` is then the preview release
    # `<WorkflowRun>--pr<N>`, and a deploy's commit must be one plnt fetched for that pull request's ref.
    preview: int | None = Field(default=None, ge=1)
    # A preview deploy: the tracked branch's commit whose trust policies and backends it uses, the one
    # the reconciler last reconciled (trusted, and approved under --require-approval), not merely the
    # newest fetched. None: the branch's head as fetched.
    policy_commit: str | None = Field(default=None, pattern=COMMIT_PATTERN)

    @model_validator(mode="after")
    def _preview_name(self) -> SagaRef:
        if self.policy_commit is not None and self.preview is None:
            raise ValueError("policy_commit is for preview sagas only")
        if self.preview is not None:
            of = preview_of(self.name)
            if of is None or of[1] != self.preview:
                raise ValueError(f"a preview saga for pull request {self.preview} names its release "
                                 f"<WorkflowRun>--pr{self.preview}, not {self.name!r}")
        return self

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def run_name(self) -> str:
        """The WorkflowRun's name in the commit (a preview's release name less its suffix)."""
        of = preview_of(self.name) if self.preview is not None else None
        return of[0] if of is not None else self.name


class SagaInput(SagaRef):
    retry: RetrySettings = RetrySettings()
    # A person's emergency pin (plnt rollback --now): the release is promoted as soon as it is installed,
    # as if this person had promoted its canary at once (no smoke test, no steps). None for every other saga,
    # so histories recorded before it replay as they were.
    promote_at_once: RolloutTarget | None = None
    # A pool's placement as the reconciler decided it (replicas per backend, the canary's first): where
    # it runs depends on live capacity, not only on the commit. The install step checks it against the
    # commit (every backend in the run's pool, the sum its replica count). None for one backend.
    placement: dict[str, int] | None = None

    @property
    def workflow_id(self) -> str:
        return saga_workflow_id(self.namespace, self.name)

    def ref(self) -> SagaRef:
        return SagaRef.model_validate(self.model_dump(exclude={"retry", "promote_at_once", "placement"}))


def saga_workflow_id(namespace: str, name: str) -> str:
    return f"plnt-{namespace}-{name}"


class SagaResult(_Io):
    phase: Phase
    reason: str
    version: str | None = None


class PhaseUpdate(_Io):
    namespace: str
    name: str
    phase: Phase | None = None   # None: the WorkflowRun is gone (after an uninstall)
    commit: str | None = None
    message: str = ""
    saga_id: str | None = None
    fields: dict[str, Any] = {}


class ValidateInput(_Io):
    saga: SagaRef


class CanaryStepPlan(_Io):
    weight: int     # the canary's share of the traffic at this step
    pause_s: float  # then a wait (a durable timer) before the next step
    manual: bool = False  # or a wait until a person resumes, promotes or aborts (plnt rollout)
    gates: list[str] = []  # the Gates the step must pass after its smoke test (check_gates)


class DependenciesInput(_Io):
    saga: SagaRef


class GateInput(_Io):
    saga: SagaRef
    step: int = Field(ge=1)  # 1-based: the step whose gates (at the saga's commit) are checked
    since: float | None = None  # epoch s: when the canary took this step's share (a compare gate's start)


class GateVerdict(_Io):
    """One Gate's verdict at one step."""

    name: str
    type: str  # quality | compare | metric | webhook
    passed: bool
    reason: str
    failing: list[str] = []  # a quality gate's failing cases: "NAME: why" (at most 20)
    duration_ms: float = 0.0  # how long the gate took to give its verdict


class GateResults(_Io):
    verdicts: list[GateVerdict]

    @property
    def passed(self) -> bool:
        return all(verdict.passed for verdict in self.verdicts)

    def failure(self) -> str | None:
        """Why the step fails (its failing gates), or None."""
        failed = [f"gate {v.name} ({v.type}): {v.reason}" for v in self.verdicts if not v.passed]
        return "; ".join(failed) if failed else None


RolloutVerb = Literal["pause", "resume", "promote", "abort"]


class RolloutTarget(_Io):
    """The rollout an action is meant for (as GET /workflows/NAME/rollout showed it), and who acts."""

    commit: str = Field(pattern=COMMIT_PATTERN)
    fingerprint: str = Field(pattern=FINGERPRINT_PATTERN)
    by: str = Field(default="", max_length=200, description="who, as the caller says (the token is what is checked)")
    reason: str = Field(default="", max_length=500)


class RolloutAction(RolloutTarget):
    """A person's action on a running rollout (`plnt rollout VERB NAME`, the UI, POST
    /workflows/NAME/rollout/VERB), sent to its saga as a Temporal update: recorded in the saga's
    history. The saga refuses it when the commit or the spec's fingerprint is not its own: an action
    seen on an older rollout must not act on a newer one."""

    verb: RolloutVerb


class RolloutState(_Io):
    """A running rollout as its saga sees it (the saga's `rollout` query): what an action must name."""

    commit: str
    fingerprint: str | None
    version: str | None
    step: str  # the saga's step under way (validate, smoke_test, ...)
    canary_step: int | None = None  # 1-based, once the canary is installed
    canary_steps: int | None = None
    paused_by: str | None = None  # held by a person's pause
    waiting_for_person: bool = False  # at a `pause: manual` step
    decision: str | None = None  # "promote" or "abort" once a person decided
    actions: list[str] = []  # what was done, in order: "pause by NAME: reason"


class ValidatedSpec(_Io):
    """What the validate activity read at the commit (and so may be shown and recorded)."""

    backend_type: str
    version: str
    traffic_percent: int  # the first step's weight
    spec: dict[str, Any]   # the WorkflowRun's spec (camelCase JSON), recorded as deployed_spec
    # The canary's steps (canary.steps, or one at trafficPercent). Histories recorded before steps
    # existed carry none, and replay as the one-step saga they were.
    canary_steps: list[CanaryStepPlan] = []
    # dependsOn: names whose spec at the commit must be promoted first (wait_for_dependencies).
    depends_on: list[str] = []


class PullInput(_Io):
    saga: SagaRef


class PulledRecipeInfo(_Io):
    digest: str
    version: str
    signer: str = ""
    transferred_bytes: int = 0
    # A recipe's input names (recipe_inputs), read as data from its workflow.yaml; None for model weights.
    inputs: list[str] | None = None


class InstallInput(_Io):
    saga: SagaRef
    track: Track
    recipe_digest: str   # must be the verified cache entry of the recipe the commit names
    placement: dict[str, int] | None = None  # a pool's (SagaInput.placement), checked against the commit


class SmokeInput(_Io):
    saga: SagaRef


class CanaryStepInput(_Io):
    """Move the canary to a step of its WorkflowRun's canary.steps: the weight is read from the commit,
    never taken from the (untrusted) input."""

    saga: SagaRef
    step: int = Field(ge=1, le=20)  # 1-based


class ReleaseRef(_Io):
    saga: SagaRef
    track: Track = "canary"


MAX_INPUTS = 64  # a form of more fields helps nobody; the status row stays small


def recipe_inputs(workflow: Workflow) -> list[str]:
    """The inputs a recipe expects, as data: every `{placeholder}` root name in its steps' params
    (strings, also inside lists and mappings) that is not a step id, in order of first use.
    `{a.b}`/`{a[0]}` name `a`; `{{literal}}`, positional `{}`/`{0}` and malformed templates name
    nothing. The recipe's code is never imported (plnt only reads workflow.yaml)."""
    step_ids = {step.id for step in workflow.steps}
    names: list[str] = []

    def scan(value: Any) -> None:
        if isinstance(value, str):
            if "{" not in value:
                return
            try:
                parsed = list(string.Formatter().parse(value))
            except ValueError:  # an unbalanced brace: the runner refuses it, and it names no input
                return
            for _, field, _, _ in parsed:
                root = field.replace("[", ".").split(".", 1)[0] if field else ""
                if root and not root.isdigit() and root not in step_ids and root not in names:
                    names.append(root)
        elif isinstance(value, list):
            for item in value:
                scan(item)
        elif isinstance(value, dict):
            for item in value.values():
                scan(item)

    for step in workflow.steps:
        scan(step.params)
    return names[:MAX_INPUTS]


__all__ = [
    "InstallInput", "PhaseUpdate", "PullInput", "PulledRecipeInfo", "Release", "ReleaseRef", "SagaInput",
    "SagaRef", "SagaResult", "SmokeInput", "SmokeResult", "ValidateInput", "ValidatedSpec", "recipe_inputs",
    "saga_workflow_id",
]
