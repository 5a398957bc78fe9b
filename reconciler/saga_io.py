"""Inputs and results of the deploy saga and its activities: one model per activity, so fields can
be added without breaking histories already recorded."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from .settings import RetrySettings
from .smoke import SmokeResult
from .state import Release, Track
from .status import Phase


class _Io(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class SagaInput(_Io):
    action: Literal["deploy", "uninstall"]
    namespace: str
    name: str
    commit: str
    spec: dict[str, Any] | None = None          # the WorkflowRun document (camelCase JSON)
    backends: dict[str, dict[str, Any]] = {}   # PlntBackend documents by name, at the same commit
    trust_policies: dict[str, dict[str, Any]] = {}  # RecipeTrustPolicy documents by name, at the same commit
    fingerprint: str | None = None
    version: str | None = None
    retry: RetrySettings = RetrySettings()

    @property
    def workflow_id(self) -> str:
        return saga_workflow_id(self.namespace, self.name)


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
    spec: dict[str, Any]
    backends: dict[str, dict[str, Any]]


class ValidatedSpec(_Io):
    backend_type: str
    version: str


class PullInput(_Io):
    spec: dict[str, Any]
    commit: str
    trust_policies: dict[str, dict[str, Any]] = {}


class PulledRecipeInfo(_Io):
    directory: str
    digest: str
    version: str
    signer: str = ""
    transferred_bytes: int = 0


class InstallInput(_Io):
    namespace: str
    name: str
    track: Track
    version: str
    fingerprint: str
    recipe_digest: str
    recipe_dir: str
    traffic_percent: int


class SmokeInput(_Io):
    endpoint: str
    recipe_dir: str
    spec: dict[str, Any]


class ReleaseRef(_Io):
    namespace: str
    name: str
    track: Track = "canary"


__all__ = [
    "InstallInput", "PhaseUpdate", "PullInput", "PulledRecipeInfo", "Release", "ReleaseRef",
    "SagaInput", "SagaResult", "SmokeInput", "SmokeResult", "ValidateInput", "ValidatedSpec",
    "saga_workflow_id",
]
