"""The release driver: one Protocol, two implementations (local processes, Helm).

Everything above the driver (plan, saga, gateway routes) is the same for both. Every method is
idempotent, so a retried saga activity finds its own earlier work and continues.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol

from plnt.core.specs.loader import SpecSet
from plnt.core.specs.models import RecipeTrustPolicy
from plnt.reconciler.state import LiveWorkflow, ModelServing, Release, Track
from pydantic import BaseModel, ConfigDict, Field


class RecipeTrust(BaseModel):
    """What the saga verified the recipe (or a model's weights) with, read from the saga's commit:
    the RecipeTrustPolicies covering it and the trusted-root JSON of each `trustedRootFile` they name
    (path -> text). A driver whose pods fetch and verify it themselves (Helm: the pod's init
    container) hands these to them; the local driver runs plnt's verified copy and needs none."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    policies: tuple[RecipeTrustPolicy, ...] = ()
    trusted_roots: dict[str, str] = Field(default_factory=dict)

    @classmethod
    def of(cls, policies: Iterable[RecipeTrustPolicy], read_root: Callable[[str], bytes]) -> RecipeTrust:
        """These policies with the trusted root each `trustedRootFile` names, read by `read_root(path)`."""
        policies = tuple(policies)
        paths = sorted({p.spec.trust_root.trusted_root_file for p in policies if p.spec.trust_root.trusted_root_file})
        return cls(policies=policies, trusted_roots={path: read_root(path).decode("utf-8") for path in paths})


class InstallRequest(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    namespace: str
    name: str
    track: Track
    version: str
    spec_fingerprint: str
    recipe_digest: str  # a recipe's archive digest, or a model's root digest (the signed manifest's pin)
    # plnt's verified copy of it (a recipe's directory, a model's directory in the weights store); "" for
    # a model on Kubernetes, whose pod fetches and verifies the weights itself (`model.registry`, `trust`)
    recipe_dir: str
    traffic_percent: int = 0
    canary_header: tuple[str, str] | None = None  # canary.headerRoute: (lower-case name, value)
    shadow_percent: int = 0  # canary.shadowPercent
    trust: RecipeTrust = RecipeTrust()  # a model's: the policies its weights were verified with
    model: ModelServing | None = None  # a ModelDeployment's release: a model server, not a runner
    llm_model: str | None = None  # a WorkflowRun bound to a ModelDeployment: its "namespace/name"
    # Processes the release runs once it is the stable one (the spec's replicas.min, at least 1); a
    # canary runs one, and promote starts the others before the old stable is retired.
    replicas: int = Field(default=1, ge=1)
    # A spec that autoscales (autoscaling.targetInFlight): its replicas.max. A promotion then starts the
    # new stable at the count the old one runs (within replicas..replicas_max), not back at the floor.
    replicas_max: int | None = Field(default=None, ge=1)
    # A pool's placement (reconciler/plan/placement.py): replicas per backend, summing to `replicas`;
    # the canary runs on the first backend, promote starts the others where they are placed.
    placement: dict[str, int] | None = None

    def release(self, endpoint: str = "") -> Release:
        """The release this request makes, before a driver gives it an endpoint (and a process)."""
        return Release(release_id=self.release_id, endpoint=endpoint, **self.model_dump(exclude={"trust"}))

    @property
    def release_id(self) -> str:
        # Same spec, same id: a retried install finds the release it made before. The track is not
        # part of it: a promoted canary keeps its id as the stable release.
        return f"{self.namespace}.{self.name}.{self.version}.{self.spec_fingerprint[7:19]}"


class ReleaseDriver(Protocol):
    def assign(self, specs: SpecSet) -> None:
        """Called with every valid spec set before a plan: which backend each WorkflowRun uses."""
        ...

    async def install(self, request: InstallRequest) -> Release:
        """Install (or find) the release; returns once it is healthy."""
        ...

    async def promote(self, namespace: str, name: str) -> Release:
        """Make the canary the stable release and remove the previous stable one."""
        ...

    async def set_traffic(self, namespace: str, name: str, percent: int, *,
                          canary_header: tuple[str, str] | None) -> Release:
        """Give the canary `percent` of the traffic and the step's header cohort (a stepped canary's
        next step); returns the canary. Nothing restarts: the share and the cohort are the gateway's,
        read from the release's record."""
        ...

    async def remove(self, namespace: str, name: str, track: Track) -> None:
        """Remove one track's release; nothing to remove is not an error."""
        ...

    async def set_replicas(self, namespace: str, name: str, replicas: int) -> Release:
        """Run the live stable release as `replicas` processes (pods), in place: the same release, no
        canary (its version is proven). Returns it as recorded. Scale in place (the plan's "scale")
        and the autoscaler call it; DriverError when there is no stable release."""
        ...

    async def live(self) -> dict[str, LiveWorkflow]:
        """Every WorkflowRun with a release, by key namespace/name."""
        ...

    async def drift(self) -> dict[str, list[Release]]:
        """Recorded releases that are not running as recorded (changed or removed out of band)."""
        ...

    async def repair(self, namespace: str, name: str) -> list[Release]:
        """Restore one WorkflowRun's drifted releases to their records; returns what was restored."""
        ...
