"""The status of a WorkflowRun or ModelDeployment: what `plnt status`, `GET /workflows`, the CRD
status and the rollout reports show. Data only; the store that persists it is
plnt.reconciler.status_store."""

from __future__ import annotations

from enum import Enum
from typing import Any

from plnt.core.routes import preview_of
from pydantic import AliasChoices, BaseModel, ConfigDict, Field


class Phase(str, Enum):
    PENDING = "Pending"
    VERIFYING = "Verifying"
    DEPLOYING = "Deploying"
    CANARY = "Canary"
    READY = "Ready"
    ROLLED_BACK = "RolledBack"
    FAILED = "Failed"
    DELETING = "Deleting"


FINAL_PHASES = {Phase.READY, Phase.ROLLED_BACK, Phase.FAILED}


class RolloutMark(BaseModel):
    """The saga's own last phase record: which commit that rollout deploys, where it stands, when.
    Written only by the saga (PhaseRecorder), so a later "in sync" or "invalid commit" update of the
    status never changes the verdict reported on the rollout's commit (plnt.reconciler.review.rollout_report)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    commit: str
    phase: Phase
    message: str = ""
    at: float = 0.0


class Pin(BaseModel):
    """A person's emergency pin of the stable release (`plnt rollback --now`): `version`, as deployed from
    `commit` (an earlier commit that promoted it), held against newer commits until a commit naming that
    version lands on the tracked branch, which releases it. Shown as drift meanwhile."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    version: str
    commit: str
    by: str = ""
    reason: str = ""
    at: float = 0.0

    def drift(self) -> str:
        who = f" ({self.by})" if self.by else ""
        return f"pinned by a person{who} to {self.version} until the commit lands"


class WorkflowRunStatus(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    namespace: str
    name: str
    kind: str = "WorkflowRun"  # or "ModelDeployment": what the row is (the reconciler sets it)
    phase: Phase = Phase.PENDING
    version: str | None = Field(default=None, description="version serving as stable")
    canary_version: str | None = None
    # (status files written before it had this name say canary_percent; the public shape says canaryPercent)
    traffic_percent: int = Field(default=0, validation_alias=AliasChoices("traffic_percent", "canary_percent"))
    # A stepped canary's place: step `canary_step` of `canary_steps` (None for a one-step canary).
    canary_step: int | None = None
    canary_steps: int | None = None
    endpoint: str | None = None
    observed_commit: str | None = None
    message: str = ""
    last_error: str | None = None
    saga_id: str | None = None
    # The spec the newest saga tried and how it ended: a failed spec is not retried until it changes.
    attempted_fingerprint: str | None = None
    attempted_version: str | None = None
    smoke_test: dict[str, Any] | None = None
    # A running smoke test's numbers so far ({done, of, metrics}), read from its heartbeats while Canary.
    smoke_progress: dict[str, Any] | None = None
    # The spec of the promoted release, so a plan can name what a new commit changes.
    deployed_spec: dict[str, Any] | None = None
    deployed_fingerprint: str | None = None
    # The budgets of the smoke test under way or last run (the spec's canary.smokeTest, camelCase).
    smoke_budget: dict[str, Any] | None = None
    rollout: RolloutMark | None = None
    # Who signed the recipe (or model) the newest rollout verified: "identity (issuer)".
    signer: str | None = None
    # A WorkflowRun's recipe inputs (its templates' placeholders, saga_io.recipe_inputs); None for models.
    inputs: list[str] | None = None
    pin: Pin | None = None  # a person's emergency pin (plnt rollback --now), until its commit lands
    updated_at: float = 0.0

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def public(self) -> dict[str, Any]:
        """The shape of `GET /workflows` and `plnt status --json`."""
        return {
            "name": self.name,
            "namespace": self.namespace,
            "kind": self.kind,
            "phase": self.phase.value,
            "version": self.version,
            "canaryVersion": self.canary_version,
            "canaryPercent": self.traffic_percent,
            "canaryStep": self.canary_step,
            "canarySteps": self.canary_steps,
            "endpoint": self.endpoint,
            "observedCommit": self.observed_commit,
            "message": self.message,
            "lastError": self.last_error,
            "sagaId": self.saga_id,
            "smokeTest": self.smoke_test,
            "smokeProgress": self.smoke_progress,
            # A preview release (reconciler/review/previews.py): the pull request number, reached with X-Plnt-Preview.
            "preview": of[1] if (of := preview_of(self.name)) is not None else None,
            "signer": self.signer,
            "rollout": self.rollout.model_dump(mode="json") if self.rollout is not None else None,
            "smokeBudget": self.smoke_budget,
            "inputs": self.inputs,
            # The promoted release's placement and replicas, as its spec said (plnt list): None until one is promoted.
            "backend": (self.deployed_spec or {}).get("backend", {}).get("cluster"),
            "replicas": (self.deployed_spec or {}).get("replicas"),
            "pin": self.pin.model_dump(mode="json") if self.pin is not None else None,
        }
