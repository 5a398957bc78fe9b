"""What every saga step shares: the heartbeats, the error boundary, the check of who calls, and
the reads that decide trust.

Their inputs are not trusted: anyone who reaches the Temporal namespace can start a DeploySaga or
schedule an activity on plnt's task queue. Each step takes a SagaRef (a WorkflowRun at a commit)
and reads what decides trust from plnt's own clone (`CommitSpecs`): the spec, its backend and the
trust policies at that commit; the recipe directory from plnt's verified cache; the smoke-test
endpoint from the driver's own canary record.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

from plnt.core.specs.models import CanaryStep, Deployable, WorkflowRun, run_key
from plnt.reconciler.drivers.protocol import ReleaseDriver
from plnt.reconciler.errors import LiveStateUnknown, NeedsHuman, PlntError, RetryLater, UntrustedSagaInput
from plnt.reconciler.gates.compare import TrafficReader
from plnt.reconciler.recipes.archive import ExtractLimits
from plnt.reconciler.recipes.pull import ExportFromRepo, ReadFromRepo, RecipeCache
from plnt.reconciler.recipes.registries import RegistryOptions
from plnt.reconciler.recipes.weights import WeightsStore
from plnt.reconciler.saga.activities.weights import ModelWeights
from plnt.reconciler.saga.commit_specs import CommitSpecs, TrustedSaga
from plnt.reconciler.saga.io import SagaRef, saga_workflow_id
from plnt.reconciler.state import LiveWorkflow, Release
from plnt.reconciler.status_store import StatusStore
from temporalio import activity
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError

T = TypeVar("T")

HEARTBEAT_EVERY_S = 1.0
# A saga step that needs a release's live record waits this long for a backend whose live state is
# unknown (its API server restarting, etcd away) before it fails: unknown is not gone, and failing
# at once rolled back a good canary. Polled every LIVE_UNKNOWN_POLL_S, heartbeating meanwhile.
LIVE_UNKNOWN_WAIT_S = 60.0
LIVE_UNKNOWN_POLL_S = 2.0
TRUSTED_RUNS_KEPT = 4096  # saga runs whose task queue was checked, kept (oldest dropped first)
# The SDK sends heartbeats on to Temporal at most this often (its default: 80% of the 10 s heartbeat
# timeout): their details are a running smoke test's live numbers (status smokeProgress, the forge status).
HEARTBEAT_THROTTLE = timedelta(seconds=2)


async def with_heartbeats(work: Awaitable[T], details: Callable[[], object] = lambda: None) -> T:
    """Run `work` while heartbeating from the activity's own task.

    Heartbeats let Temporal notice a dead worker within the heartbeat timeout (instead of the
    whole start-to-close timeout) and deliver cancellation to a running activity.
    """
    task = asyncio.ensure_future(work)
    try:
        while not task.done():
            activity.heartbeat(details())
            await asyncio.wait({task}, timeout=HEARTBEAT_EVERY_S)
    except asyncio.CancelledError:
        task.cancel()
        raise
    return task.result()


def boundary(fn: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
    """Map plnt errors to Temporal's: the exception type decides whether Temporal retries."""

    @functools.wraps(fn)
    async def wrapper(*args: Any, **kwargs: Any) -> T:
        try:
            return await fn(*args, **kwargs)
        except PlntError as exc:
            reason = getattr(exc, "reason", None)  # e.g. VerificationFailed: which check failed
            message = f"{reason}: {exc}" if reason else str(exc)
            raise ApplicationError(message, type=type(exc).__name__, non_retryable=isinstance(exc, NeedsHuman)) from exc

    return wrapper


def on_kubernetes(trusted: TrustedSaga) -> bool:
    return trusted.backend is not None and trusted.backend.spec.type == "kubernetes"


class SagaStep:
    """The state the steps share. Each step group (validate.py, pull.py, ...) is a subclass of this,
    and SagaActivities (this package's __init__) is all of them in one object, so that a pull's
    weights and a run's checked caller are seen by the later steps of the same saga."""

    def __init__(
        self,
        *,
        driver: ReleaseDriver,
        statuses: StatusStore | None,
        commit_specs: CommitSpecs,
        export_from_repo: ExportFromRepo,
        read_from_repo: ReadFromRepo,
        recipe_cache: Path,
        registry_options: RegistryOptions = RegistryOptions(),
        limits: ExtractLimits = ExtractLimits(),
        smoke_request_timeout_s: float = 30.0,
        supported_backend_types: tuple[str, ...] = ("local",),
        saga_task_queue: str | None,
        weights: WeightsStore | None = None,
        traffic: TrafficReader | None = None,
    ) -> None:
        """`weights`: where ModelDeployments' verified weights are kept (None: this plnt deploys none).
        `saga_task_queue`: the queue plnt's DeploySaga runs on; an activity scheduled by any other
        workflow is refused. None skips that check: only for tests that run an activity outside any workflow."""
        self._driver = driver
        self._statuses = statuses
        self._specs = commit_specs
        self._export = export_from_repo
        self._read = read_from_repo
        self._cache = RecipeCache(recipe_cache)
        self._registry_options = registry_options
        self._limits = limits
        self._smoke_timeout_s = smoke_request_timeout_s
        self._backend_types = supported_backend_types
        self._saga_task_queue = saga_task_queue
        self._weights = ModelWeights(weights) if weights is not None else None
        # Each release's real traffic as the gateways answered it (a compare gate's data): plnt up's own
        # ledger, or a plnt worker's read of the reconciler's (reconciler/gates/compare.py).
        self._traffic = traffic
        # Saga runs (workflow id, run id) found on plnt's task queue: one describe per saga, not one
        # per step (each is a Temporal round trip; 5 per saga were measured in bench/saga_profile.py).
        self._trusted_runs: dict[tuple[str, str], None] = {}

    async def _check_caller(self, ref: SagaRef) -> None:
        """Only plnt's own DeploySaga for this WorkflowRun, running on plnt's task queue, may call.

        Temporal lets any workflow in the namespace schedule an activity on any task queue; the
        workflow type and id come from the server, and its task queue from describing it.
        """
        if self._saga_task_queue is None:
            return
        info = activity.info()
        expected = saga_workflow_id(ref.namespace, ref.name)
        if info.workflow_type != "DeploySaga" or info.workflow_id != expected:
            raise UntrustedSagaInput(f"{info.activity_type} for {ref.key} runs only in plnt's DeploySaga {expected}, "
                                     f"not in workflow {info.workflow_type} {info.workflow_id}")
        run = (info.workflow_id, info.workflow_run_id)
        if run in self._trusted_runs:
            return  # this very run was described already: a run's task queue never changes
        try:
            caller = await activity.client().get_workflow_handle(info.workflow_id, run_id=info.workflow_run_id).describe()
        except RPCError as exc:
            raise RetryLater(f"cannot describe the workflow {info.workflow_id} that scheduled {info.activity_type}: "
                             f"{exc.message}") from exc
        if caller.task_queue != self._saga_task_queue:
            raise UntrustedSagaInput(f"{info.activity_type} for {ref.key}: workflow {info.workflow_id} runs on task queue "
                                     f"{caller.task_queue!r}, not plnt's {self._saga_task_queue!r}")
        self._trusted_runs[run] = None
        if len(self._trusted_runs) > TRUSTED_RUNS_KEPT:
            del self._trusted_runs[next(iter(self._trusted_runs))]  # the oldest: its saga is long over

    async def _deploy(self, ref: SagaRef) -> tuple[TrustedSaga, Deployable]:
        """The saga's WorkflowRun as its commit gives it, or UntrustedSagaInput."""
        await self._check_caller(ref)
        if ref.action != "deploy":
            raise UntrustedSagaInput(f"{activity.info().activity_type} is a deploy step; this saga is an {ref.action}")
        trusted = await self._specs.resolve(ref)
        assert trusted.run is not None
        remember = getattr(self._driver, "remember", None)
        if remember is not None and trusted.backend is not None:
            # A worker learns each WorkflowRun's backend (a pool's members) from its commit.
            remember(trusted.run, trusted.backend, trusted.backends)
        return trusted, trusted.run

    def _step_at(self, run: Deployable, step: int) -> CanaryStep:
        """Canary step `step` (1-based) of the run at its commit; a saga naming another is refused."""
        steps = run.spec.canary.plan_steps()
        if step > len(steps):
            raise UntrustedSagaInput(f"{run.key} has {len(steps)} canary step(s) at its commit, not {step}")
        return steps[step - 1]

    def _verified_recipe(self, run: WorkflowRun, digest: str) -> Path:
        """The recipe directory of plnt's own verified cache entry for what the run names."""
        source = run.spec.workflow
        entry = self._cache.lookup(source.registry, source.name, source.version)
        if entry is None or f"sha256:{entry.name}" != digest:
            raise UntrustedSagaInput(f"recipe {digest} is not plnt's verified copy of {source.ref} from "
                                     f"{source.registry}: pull_recipe must verify it first")
        return entry / "recipe"

    async def _live_of(self, run: Deployable) -> LiveWorkflow | None:
        return await self._live(run.metadata.namespace, run.metadata.name)

    async def _live(self, namespace: str, name: str) -> LiveWorkflow | None:
        return await with_heartbeats(self._live_waiting(namespace, name))

    async def _live_waiting(self, namespace: str, name: str) -> LiveWorkflow | None:
        waited = 0.0
        while True:
            try:
                return await self._live_once(namespace, name)
            except LiveStateUnknown as unknown:
                if waited >= LIVE_UNKNOWN_WAIT_S:
                    raise
                activity.logger.warning("live-state-unknown %s/%s waited=%.0fs: %s; trying again",
                                        namespace, name, waited, unknown)
                await asyncio.sleep(LIVE_UNKNOWN_POLL_S)
                waited += LIVE_UNKNOWN_POLL_S

    async def _live_once(self, namespace: str, name: str) -> LiveWorkflow | None:
        live_of = getattr(self._driver, "live_of", None)  # a DriverSet: one record, not all of them
        if live_of is not None:
            found: LiveWorkflow | None = await live_of(namespace, name)
            return found
        return (await self._driver.live()).get(run_key(namespace, name))

    async def _release_of(self, run: Deployable, track: str) -> Release:
        """The driver's own record of this run's release on `track`, made for this very spec."""
        live = await self._live_of(run)
        release: Release | None = getattr(live, track) if live is not None else None
        if release is None or release.spec_fingerprint != run.fingerprint():
            raise UntrustedSagaInput(f"{run.key} has no {track} release of fingerprint {run.fingerprint()} "
                                     f"(version {run.version}): nothing this saga installed")
        return release
