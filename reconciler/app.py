"""`plnt up`: the composition root. Temporal (embedded or remote), a worker, the reconciler and the
gateway, in one process and one event loop, deploying through the local driver."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fastapi.responses import JSONResponse
from plnt.core import telemetry
from plnt.core.auth import MODELS, Grant
from plnt.core.auth import is_loopback_host as _loopback
from plnt.core.limits import HttpLimits
from plnt.core.routes import Backend, Route, RouteTable
from plnt.core.server import GatewayServer, ServerStartError, check_free, reuse_port_socket
from plnt.core.specs.limits import SpecLimits
from plnt.core.specs.loader import SpecSet
from plnt.core.specs.models import GatewayPolicy, GatewayPolicySpec, PlntBackend
from plnt.core.traffic import TrafficLedger
from plnt.gateway.app import create_app
from plnt.gateway.calls import CallLog, CallsHub
from plnt.gateway.control_relay import TrustForwarded
from plnt.gateway.route_watch import RoutePublisher, add_control_routes, release_everywhere
from plnt.gateway.router import Router
from plnt.gateway.workers import WorkerConfig, WorkerMetrics, WorkerSupervisor, auto_workers
from plnt.reconciler.control.access import GatewayTokens, load_role_access
from plnt.reconciler.control.autoscaler import Autoscaler, local_targets
from plnt.reconciler.control.loop import Reconciler
from plnt.reconciler.control.metrics import ControlPlaneMetrics
from plnt.reconciler.control.pins import PinRefused, PinRequest
from plnt.reconciler.drivers.driver_set import DriverSet
from plnt.reconciler.drivers.gpu_headroom import observe_gpu_headroom
from plnt.reconciler.drivers.helm import DEFAULT_CHART, DEFAULT_MODEL_CHART, HelmDriver, RunnerImage, SpecLookup
from plnt.reconciler.drivers.local import LocalDriver
from plnt.reconciler.drivers.processes import raise_open_files_limit, read_loads
from plnt.reconciler.drivers.reported import ReportedRunners
from plnt.reconciler.gates.compare import TrafficReader, in_process
from plnt.reconciler.plan.placement import Observed, observed_load
from plnt.reconciler.plan.view import add_plan_routes
from plnt.reconciler.recipes.archive import ExtractLimits
from plnt.reconciler.recipes.pull import RecipeCache
from plnt.reconciler.recipes.registries import RegistryOptions
from plnt.reconciler.recipes.weights import WeightsStore
from plnt.reconciler.review.approval import ApprovalGate
from plnt.reconciler.review.forge import Forge, make_forge
from plnt.reconciler.review.notify import make_notifier
from plnt.reconciler.review.previews import PreviewController
from plnt.reconciler.saga.activities import SagaActivities
from plnt.reconciler.saga.activities.base import HEARTBEAT_THROTTLE
from plnt.reconciler.saga.commit_specs import CommitSpecs
from plnt.reconciler.saga.history import NoSaga, saga_history, saga_rollouts
from plnt.reconciler.saga.io import RolloutAction, RolloutTarget, RolloutVerb
from plnt.reconciler.saga.rollout import NoRollout, RolloutActionRefused, act_on_rollout, rollout_state
from plnt.reconciler.saga.temporal_server import TemporalDevServer, connect, connect_external
from plnt.reconciler.saga.workflow import DeploySaga
from plnt.reconciler.settings import Settings
from plnt.reconciler.source.commit_trust import CommitVerifier
from plnt.reconciler.source.git import GitSource
from plnt.reconciler.source.kubernetes import KubernetesSource
from plnt.reconciler.state import LiveWorkflow, Release, StateDir
from plnt.reconciler.status_store import StatusStore
from pydantic import SecretStr
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

log = logging.getLogger(__name__)

# plnt's workers run DeploySaga outside Temporal's workflow sandbox. The sandbox guards workflow code
# against non-determinism (it is not a security boundary: the saga is plnt's own code, and recipe code
# never runs in plnt), and it imports the saga's modules again for every saga, a large share of plnt's
# CPU per saga. The saga tests (tests/reconciler/saga/test_saga.py) run every path of DeploySaga inside the
# sandbox, so a non-deterministic call in it still fails them.
SAGA_RUNNER = UnsandboxedWorkflowRunner()


def build_route_table(live: dict[str, LiveWorkflow], statuses: StatusStore,
                      built: dict[str, tuple[LiveWorkflow, Route]] | None = None,
                      policy: GatewayPolicySpec | None = None,
                      fallbacks: Mapping[str, str] | None = None) -> RouteTable:
    """Routes from the live releases; a WorkflowRun known to status but not promoted gets a route
    with no stable backend (the gateway answers 503 rather than 404). `policy`: the reconciled
    commit's GatewayPolicy, which travels with the routes to every gateway process; `fallbacks`: its
    ModelDeployments' spec.fallback by key (routing only: no release carries it).

    `built` (kept by the caller between rebuilds) holds each route with the record it was built
    from: records are frozen and a snapshot hands back the same object for an unchanged one, so a
    rebuild of 1,000 builds only the routes whose record changed."""

    def backend(release: Release | None) -> Backend | None:
        return None if release is None else Backend(release.endpoint, release.version, release.release_id)

    def replicas(release: Release | None) -> tuple[Backend, ...]:
        """Every replica process of the stable release (the gateway takes them in turn)."""
        return () if release is None else tuple(Backend(endpoint, release.version, release.release_id)
                                                for endpoint in release.endpoints)

    def route(item: LiveWorkflow) -> Route:
        serving = item.stable or item.canary
        return Route(namespace=item.namespace, name=item.name, stable_replicas=replicas(item.stable), stable=None,
                     canary=backend(item.canary), traffic_percent=item.canary.traffic_percent if item.canary else 0,
                     canary_header=item.canary.canary_header if item.canary else None,
                     shadow_percent=item.canary.shadow_percent if item.canary else 0,
                     protocol="openai" if serving is not None and serving.model is not None else "runner",
                     fallback=fallback_of.get(item.key))

    fallback_of = fallbacks or {}
    previous = built or {}
    fresh: dict[str, tuple[LiveWorkflow, Route]] = {}
    for key, item in live.items():
        hit = previous.get(key)
        same = hit is not None and hit[0] is item and hit[1].fallback == fallback_of.get(item.key)
        fresh[key] = hit if same and hit is not None else (item, route(item))
    routes = {key: made for key, (_, made) in fresh.items()}
    for status in statuses.all():
        key = status.key
        if key not in routes:
            routes[key] = Route(namespace=status.namespace, name=status.name, stable=None)
    if built is not None:
        built.clear()
        built.update(fresh)
    return RouteTable(routes.values(), policy)


# How usage and quotas name the token plnt up gives the runners of WorkflowRuns bound to a model.
RUNNERS_TOKEN_NAME = "runners"


def on_policy(apply: Callable[[GatewayPolicySpec | None], None]) -> Callable[[str, SpecSet], None]:
    """A spec listener that hands a reconciled commit's GatewayPolicy to `apply` (which rebuilds the
    routes: they carry it to the gateway processes) when it changed; a pass with the same policy does
    nothing. A refused commit is no reconciled one: the last policy stays."""
    seen: list[GatewayPolicy | None] = [None]

    def listener(_commit: str, specs: SpecSet) -> None:
        if specs.gateway_policy != seen[0]:
            seen[0] = specs.gateway_policy
            apply(specs.gateway_policy.spec if specs.gateway_policy is not None else None)

    return listener


def on_fallbacks(apply: Callable[[dict[str, str]], None]) -> Callable[[str, SpecSet], None]:
    """A spec listener that hands a reconciled commit's ModelDeployment fallbacks ({key: fallback name}) to
    `apply` (which rebuilds the routes: they carry them to the gateways) when they changed."""
    seen: list[dict[str, str] | None] = [None]

    def listener(_commit: str, specs: SpecSet) -> None:
        fallbacks = {key: model.spec.fallback for key, model in specs.model_deployments.items() if model.spec.fallback}
        if fallbacks != seen[0]:
            seen[0] = fallbacks
            apply(fallbacks)

    return listener


def public_rows(statuses: StatusStore, live: dict[str, LiveWorkflow]) -> list[dict[str, Any]]:
    """`GET /workflows`: each status's public row, with `"parked": true` where the promoted release's
    runner parked (scale to zero: the next request starts it), and its replica count: `replicasLive`
    (the processes recorded for it, 0 while parked; None on Kubernetes, where the pods are the
    Deployment's) and `replicasDesired`."""
    rows = []
    for status in statuses.all():
        row = status.public()
        item = live.get(status.key)
        stable = item.stable if item is not None else None
        if stable is not None and stable.parked:
            row["parked"] = True
        if stable is not None:
            local = stable.pid is not None or stable.parked
            row["replicasLive"] = (0 if stable.parked else len(stable.endpoints)) if local else None
            row["replicasDesired"] = stable.replicas
        rows.append(row)
    return rows


def with_scaling(rows: list[dict[str, Any]], autoscaler: Autoscaler | None) -> list[dict[str, Any]]:
    """`GET /workflows` rows with `autoscale` {running, desired, inFlight, reason} where the autoscaler
    follows the release (its last decision), else without."""
    if autoscaler is not None:
        for row in rows:
            view = autoscaler.view(f"{row['namespace']}/{row['name']}")
            if view is not None:
                row["autoscale"] = view.public()
    return rows


class TurnBatched:
    """Runs `rebuild` once the current event-loop turn is over, however often it was asked for,
    and at most as often as keeps it under a tenth of the loop's time.

    A route rebuild reads every release record and every status: one per change made each saga's
    ten status and record writes cost ten rebuilds, each growing with the number of WorkflowRuns
    (bench/saga_profile.py, bench/many_workflowruns.py). So a rebuild waits, after the last one,
    ten times what the last one took (at most MAX_WAIT_S): nothing at a few WorkflowRuns, about a
    quarter of a second at 1,000 while sagas run, where every rebuild would otherwise follow the
    last. `flush` runs a pending one at once (a drain must not wait for it).
    """

    COST_FACTOR = 10.0
    MAX_WAIT_S = 0.5

    def __init__(self, rebuild: Callable[[], None]) -> None:
        self._rebuild = rebuild
        self._pending = False
        self._ready_at = 0.0  # loop time from which the next rebuild may run
        self._timer: asyncio.TimerHandle | asyncio.Handle | None = None

    def __call__(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (a synchronous caller): nothing to batch with
            self._rebuild()
            return
        if not self._pending:
            self._pending = True
            wait = self._ready_at - loop.time()
            self._timer = loop.call_later(wait, self.flush) if wait > 0 else loop.call_soon(self.flush)

    def flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._pending:
            self._pending = False
            started = time.monotonic()
            self._rebuild()
            took = time.monotonic() - started
            try:
                now = asyncio.get_running_loop().time()
            except RuntimeError:
                return
            self._ready_at = now + min(self.MAX_WAIT_S, took * self.COST_FACTOR)


@dataclass
class Plnt:
    """A running plnt: what tests and the CLI hold on to."""

    settings: Settings
    state: StateDir
    client: Client
    statuses: StatusStore
    driver: LocalDriver
    router: Router
    reconciler: Reconciler
    gateway: GatewayServer
    stop_event: asyncio.Event
    publisher: RoutePublisher | None = None  # the route watch that `plnt gateway` follows
    gateway_workers: WorkerSupervisor | None = None  # --gateway-workers N > 1: the other N-1 processes
    control_listener: GatewayServer | None = None  # the private loopback listener those workers follow
    public_url: str | None = None  # when only the workers listen on the gateway port
    model_token: str | None = field(default=None, repr=False)  # bound runners' gateway token (scope models)
    drivers: DriverSet | None = None
    previews: PreviewController | None = None  # --previews
    _tasks: list[asyncio.Task[Any]] = field(default_factory=list)
    _cleanups: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    _built_routes: dict[str, tuple[LiveWorkflow, Route]] = field(default_factory=dict)  # see build_route_table
    gateway_policy: GatewayPolicySpec | None = None  # the reconciled commit's, carried by the routes
    model_fallbacks: dict[str, str] = field(default_factory=dict)  # its ModelDeployments' spec.fallback, by key
    autoscaler: Autoscaler | None = None  # local releases with spec.autoscaling

    @property
    def url(self) -> str:
        return self.public_url or self.gateway.url

    def __post_init__(self) -> None:
        self._refresh = TurnBatched(self._rebuild_routes)

    def refresh_routes(self) -> None:
        """Rebuild the routes once the current event-loop turn is over (see TurnBatched)."""
        self._refresh()

    def apply_policy(self, policy: GatewayPolicySpec | None) -> None:
        """A reconciled commit's GatewayPolicy (quotas), to every gateway process with the routes."""
        self.gateway_policy = policy
        self.refresh_routes()

    def apply_fallbacks(self, fallbacks: dict[str, str]) -> None:
        """A reconciled commit's ModelDeployment fallbacks, to every gateway process with the routes."""
        self.model_fallbacks = fallbacks
        self.refresh_routes()

    def flush_routes(self) -> None:
        """Apply a pending rebuild now: before draining a release the routes must have let go of it."""
        self._refresh.flush()

    def _rebuild_routes(self) -> None:
        # Every backend: local runners and the last known releases of each Kubernetes backend.
        source = self.drivers if self.drivers is not None else self.driver
        live = source.snapshot()
        table = build_route_table(live, self.statuses, self._built_routes, self.gateway_policy, self.model_fallbacks)
        self.router.replace(table)
        if self.publisher is not None:
            self.publisher.publish(table, with_scaling(public_rows(self.statuses, live), self.autoscaler))

    async def stop(self) -> None:
        """Stop everything `start` started, runners included; release records stay for the next start."""
        self.stop_event.set()
        for cleanup in reversed(self._cleanups):
            try:
                await cleanup()
            except Exception:  # noqa: BLE001 - keep stopping the rest
                log.exception("shutdown-step-failed")
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


def make_saga_worker(client: Client, settings: Settings, *, activities: Sequence[Callable[..., Any]],
                     metrics: ControlPlaneMetrics, workflows: bool = True, remote_activities: bool = True) -> Worker:
    """plnt's Temporal worker on the saga task queue: the DeploySaga workflows (outside the sandbox:
    SAGA_RUNNER) unless `workflows` is False, and `activities`, timed by `metrics`. With
    `remote_activities` False it takes no activity task from the queue (the reconciler apart: its
    only activity is the status write each saga makes in-process; the steps run on the workers)."""
    if remote_activities:
        options: dict[str, Any] = dict(max_concurrent_activities=max(4, settings.temporal.max_concurrent_sagas * 2),
                                       max_heartbeat_throttle_interval=HEARTBEAT_THROTTLE)
    else:
        options = dict(no_remote_activities=True)
    if workflows:
        options.update(workflows=[DeploySaga], workflow_runner=SAGA_RUNNER)
    return Worker(client, task_queue=settings.temporal.task_queue, activities=activities,
                  interceptors=[metrics.interceptor()],
                  **options)


def make_local_driver(settings: Settings, state: StateDir, *, on_change: Callable[[], None],
                      drain: Callable[[Release], Awaitable[object]],
                      limits_for: Callable[[str, str], Any],
                      park_after_for: Callable[[str, str, str], float | None] | None = None,
                      gateway_url: Callable[[], str] | None = None, model_token: str | None = None) -> LocalDriver:
    raise_open_files_limit()  # a connection or more per runner: 1,000 runners pass the usual soft 1,024
    return LocalDriver(
        state, host="127.0.0.1", start_timeout_s=settings.runners.start_timeout_s,
        stop_timeout_s=settings.runners.stop_timeout_s, on_change=on_change,
        runner_args=settings.runners.args(), env=settings.runners.env,
        secret_env={settings.runners.llm_api_key_env: settings.runners.llm_api_key.get_secret_value()}
        if settings.runners.llm_api_key_env and settings.runners.llm_api_key else None,
        limits_for=limits_for, drain=drain, runner_start=settings.runners.start, park_after_for=park_after_for,
        model_python=str(settings.runners.llm_venv / "bin" / "python"), gateway_url=gateway_url, model_token=model_token,
    )


def registry_options(settings: Settings) -> RegistryOptions:
    return RegistryOptions(
        s3_endpoint_url=settings.registries.s3_endpoint_url, s3_region=settings.registries.s3_region,
        allow_insecure_http=tuple(settings.registries.oci_insecure_hosts), timeout_s=settings.registries.timeout_s,
        max_download_bytes=settings.registries.max_download_bytes,
        file_roots=tuple(str(root) for root in settings.registries.file_registry_roots))


def make_driver_set(settings: Settings, local: LocalDriver | ReportedRunners, state: StateDir, *,
                    on_change: Callable[[], None] | None = None,
                    drain: Callable[[Release], Awaitable[object]] | None = None) -> DriverSet:
    """`drain`: how a Helm release leaving the routes (a promoted or rolled back canary, a pool's member)
    is let go of by the gateways before helm uninstalls it: in the process they follow, or, on a
    worker, by asking the control plane (POST /internal/drain with `leaving`)."""
    def make_helm(backend: PlntBackend, specs: SpecLookup) -> HelmDriver:
        # Runner and model-server pods reach registries with plnt's own registry settings (their
        # credentials: a Secret); model releases get their own helm --wait (weights fetch and load).
        kube = settings.kubernetes
        return HelmDriver(backend, specs, helm=kube.helm_binary, chart=kube.helm_chart or DEFAULT_CHART,
                          model_chart=kube.helm_model_chart or DEFAULT_MODEL_CHART,
                          image=RunnerImage(repository=kube.runner_image, tag=kube.runner_image_tag),
                          registry_options=registry_options(settings),
                          credentials_secret=kube.runner_registry_secret,
                          timeout_s=kube.install_timeout_s, model_timeout_s=kube.model_install_timeout_s,
                          gpu_resource=kube.gpu_resource,
                          serving_timeout_s=kube.serving_timeout_s, unavailable_wait_s=kube.unavailable_wait_s)

    return DriverSet(local, state, make_helm, on_change=on_change, drain=drain)


def make_source(settings: Settings, state: StateDir) -> GitSource | KubernetesSource:
    """The spec source: plnt's clone of the spec repository, or (--source kubernetes) the cluster's
    custom resources with the operator's platform directory."""
    if settings.source.kind == "kubernetes":
        from plnt.reconciler.control.kube import api_client

        assert settings.source.platform_dir is not None  # SourceSettings requires it
        api = api_client(settings.kubernetes.kubeconfig)
        return KubernetesSource(api, settings.source.platform_dir, namespaces=settings.source.namespaces,
                                limits=settings.spec_limits, server=str(api.configuration.host or ""))
    return GitSource(settings.source.repo, state.source_clone, branch=settings.source.branch, path=settings.source.path,
                     credentials_file=settings.source.git_credentials_file, known_hosts=settings.source.git_known_hosts,
                     previews=settings.review.previews)


def make_forge_client(settings: Settings) -> Forge | None:
    """--forge: the one forge client of this process (approvals, rollout statuses, previews)."""
    if settings.review.forge is None:
        return None
    assert settings.review.forge_api_url and settings.review.forge_project and settings.review.forge_token
    return make_forge(settings.review.forge, settings.review.forge_api_url, settings.review.forge_project,
                      settings.review.forge_token.get_secret_value())


def attach_status_followers(settings: Settings, statuses: StatusStore, reconciler: Reconciler,
                            source: GitSource | KubernetesSource) -> list[Callable[[], Awaitable[None]]]:
    """What follows each status change: notifications (--notify-*), the WorkflowRun custom resources
    (--mirror-status, and always with --source kubernetes: the status goes onto the objects read), and
    each rollout's verdict back to its commit: a forge status (--forge, unless --no-report-status) and
    a git note (--write-notes).
    Chained after statuses.on_change is set; returns the cleanups."""
    cleanups: list[Callable[[], Awaitable[None]]] = []
    notifier = make_notifier(settings.notify)
    if notifier is not None:  # each rollout transition to the operator's receivers (reconciler/review/notify.py)
        cleanups.append(notifier.attach(statuses))
    if isinstance(source, KubernetesSource):
        from plnt.reconciler.control.kube import attach_status_mirror

        cleanups.append(attach_status_mirror(settings, statuses, reconciler, source))
        cleanups.append(attach_source_watch(source, reconciler))
        return cleanups  # (Settings refuses --forge and --write-notes with it: there are no commits)
    if settings.kubernetes.mirror_status:
        from plnt.reconciler.control.kube import attach_status_mirror

        cleanups.append(attach_status_mirror(settings, statuses, reconciler))
    if settings.review.forge is not None and settings.review.report_status:
        from plnt.reconciler.review.rollout_report import attach_rollout_reporter

        forge = make_forge_client(settings)
        assert forge is not None
        cleanups.append(forge.aclose)  # runs after the reporter stopped (cleanups run in reverse)
        cleanups.append(attach_rollout_reporter(forge, statuses))
        if settings.trust.verify_commits != "none":
            from plnt.reconciler.review.rollout_report import attach_refusal_reporter

            cleanups.append(attach_refusal_reporter(forge, statuses, lambda: reconciler.source_status,
                                                    reconciler.source_listeners))
    if settings.review.write_notes:
        from plnt.reconciler.review.notes import attach_notes_writer

        cleanups.append(attach_notes_writer(source, statuses))
    return cleanups


def attach_source_watch(source: KubernetesSource, reconciler: Reconciler) -> Callable[[], Awaitable[None]]:
    """--source kubernetes: a watch on the custom resources wakes the loop when one is created,
    deleted or its spec changes (not on a status write), rather than at the next poll."""
    loop = asyncio.get_running_loop()
    stop = threading.Event()

    def wake() -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closing
            loop.call_soon_threadsafe(reconciler.wake)

    thread = threading.Thread(target=source.watch, args=(wake, stop), name="source-watch", daemon=True)
    thread.start()

    async def cleanup() -> None:
        stop.set()
        await asyncio.to_thread(thread.join, 15)

    return cleanup


def make_approval_gate(settings: Settings, state: StateDir, source: GitSource | KubernetesSource) -> ApprovalGate | None:
    """--require-approval: approvals read through the forge; recipes verified through the saga's cache."""
    if not settings.review.require_approval:
        return None
    assert isinstance(source, GitSource)  # Settings refuses --require-approval with --source kubernetes
    forge = make_forge_client(settings)
    if forge is None:  # Settings refuses --require-approval without a forge; kept for a hand-made Settings
        raise ValueError("--require-approval needs a forge: add --forge, --forge-api-url, --forge-project "
                         "and --forge-token-env")
    return ApprovalGate(forge, source, cache=RecipeCache(state.recipes), registry_options=registry_options(settings),
                        limits=settings.spec_limits, report=settings.review.report_status,
                        approvers=settings.review.approvers, code_owners=settings.review.code_owners)


def make_reconciler(settings: Settings, *, state: StateDir, source: GitSource | KubernetesSource, client: Client, statuses: StatusStore,
                    drivers: DriverSet, verifier: CommitVerifier | None, metrics: ControlPlaneMetrics,
                    cleanups: list[Callable[[], Awaitable[None]]]) -> Reconciler:
    """The reconcile loop, with its approval gate under --require-approval (closed by `cleanups`)."""
    approval = make_approval_gate(settings, state, source)
    if approval is not None:
        cleanups.append(approval.aclose)
    reconciler = Reconciler(settings=settings, source=source, client=client, statuses=statuses, driver=drivers,
                            state=state, verifier=verifier, approval=approval, metrics=metrics)
    # Placement counts the free GPUs Kubernetes backends' clusters report (RBAC: list nodes and pods).
    gpu_resource = settings.kubernetes.gpu_resource
    reconciler.observe_gpus = lambda backends: observe_gpu_headroom(backends, configured=gpu_resource)
    reconciler.observe = observe_replica_load
    return reconciler


async def observe_replica_load(releases: Mapping[str, LiveWorkflow],
                               current: Mapping[str, Mapping[str, int]]) -> dict[str, Observed]:
    """Requests in flight (and waiting) per backend for placement, as each local replica counts them
    itself (GET /load, the autoscaler's signal): the same with gateway workers, several gateways or the
    roles apart (on one machine). A replica that does not answer counts nowhere; Kubernetes releases
    (no process of plnt's: their endpoint is a Service) are not read."""
    endpoints = [process.endpoint for live in releases.values() for release in (live.stable, live.canary)
                 if release is not None and release.pid is not None and not release.parked
                 for process in release.processes()]
    return observed_load(await read_loads(endpoints), releases, current)


async def resume_runners(driver: LocalDriver) -> None:
    """The local runners of the last run, started again (their release records survive a restart)."""
    restarted = await driver.resume()
    if restarted:
        log.info("releases-resumed count=%d", len(restarted))


def make_verifier(settings: Settings, state: StateDir) -> CommitVerifier | None:
    """--verify-commits: the trusted signers come from plnt's settings, never from the repository."""
    if settings.trust.verify_commits == "none":
        return None
    return CommitVerifier(settings.trust.verify_commits, home=state.root / "commit-trust",
                          allowed_signers=settings.trust.allowed_signers, gpg_keys=settings.trust.gpg_keys)


def make_activities(settings: Settings, state: StateDir, drivers: DriverSet, source: GitSource | KubernetesSource,
                    statuses: StatusStore | None, verifier: CommitVerifier | None = None,
                    traffic: TrafficReader | None = None) -> SagaActivities:
    """`traffic`: how a compare gate reads each release's real traffic (plnt up: its own ledger; a
    plnt worker: the reconciler's, reconciler/gates/compare.py)."""
    return SagaActivities(
        driver=drivers, statuses=statuses,
        commit_specs=CommitSpecs(source, limits=settings.spec_limits, verifier=verifier),
        export_from_repo=source.export, read_from_repo=source.read_file,
        supported_backend_types=("local", "kubernetes"), saga_task_queue=settings.temporal.task_queue,
        recipe_cache=state.recipes, smoke_request_timeout_s=settings.runners.smoke_request_timeout_s,
        registry_options=registry_options(settings),
        limits=ExtractLimits(max_total_bytes=settings.registries.max_recipe_bytes,
                             max_files=settings.registries.max_recipe_files,
                             max_file_bytes=settings.registries.max_recipe_file_bytes),
        weights=WeightsStore(state.root / "weights", budget_bytes=settings.runners.weights_budget_bytes),
        traffic=traffic,
    )


def add_reconciler_routes(app: Any, reconciler: Reconciler, client: Client, *, source: GitSource | None = None,
                          spec_limits: SpecLimits | None = None) -> None:
    """The control plane's own endpoints beside the gateway's (scopes: GET /source needs admin,
    history needs read, checked in front of every route)."""

    @app.get("/source")
    async def source_status() -> dict[str, Any]:
        return reconciler.source_status

    @app.get("/workflows/{name}/history")
    async def history(name: str, namespace: str = "default", run: str | None = None) -> Any:
        try:
            return (await saga_history(client, namespace, name, run)).model_dump(mode="json")
        except NoSaga as exc:
            return JSONResponse({"error": {"type": "not_found", "message": str(exc)}}, status_code=404)

    # The UI's past rollouts and plan preview (history.saga_rollouts, plan_view.add_plan_routes).
    @app.get("/workflows/{name}/rollouts")
    async def rollouts(name: str, namespace: str = "default", limit: int = 20) -> Any:
        try:
            return [r.model_dump(mode="json") for r in await saga_rollouts(client, namespace, name, limit)]
        except NoSaga as exc:
            return JSONResponse({"error": {"type": "not_found", "message": str(exc)}}, status_code=404)

    # A person's hand on a running rollout (saga/rollout.py): where it is (read), and pause, resume,
    # promote, abort (admin), each naming the commit and spec fingerprint it was meant for.
    @app.get("/workflows/{name}/rollout")
    async def rollout(name: str, namespace: str = "default") -> Any:
        try:
            return (await rollout_state(client, namespace, name)).model_dump(mode="json")
        except NoRollout as exc:
            return JSONResponse({"error": {"type": "not_found", "message": str(exc)}}, status_code=404)

    @app.post("/workflows/{name}/rollout/{verb}")
    async def act(name: str, verb: RolloutVerb, body: RolloutTarget, namespace: str = "default") -> Any:
        action = RolloutAction(verb=verb, **body.model_dump())
        try:
            message = await act_on_rollout(client, namespace, name, action)
        except NoRollout as exc:
            return JSONResponse({"error": {"type": "not_found", "message": str(exc)}}, status_code=404)
        except RolloutActionRefused as exc:
            return JSONResponse({"error": {"type": "refused", "message": str(exc)}}, status_code=409)
        log.info("rollout-action workflowrun=%s/%s verb=%s by=%r commit=%s: %s", namespace, name, verb, action.by,
                 action.commit[:12], message)
        return {"message": message, "rollout": (await rollout_state(client, namespace, name)).model_dump(mode="json")
                if verb in ("pause", "resume") else None}

    # A person's emergency pin (plnt rollback --now; reconciler/control/pins.py). Scope `admin`.
    @app.post("/workflows/{name}/pin")
    async def pin(name: str, body: PinRequest, namespace: str = "default") -> Any:
        try:
            message = await reconciler.pin(namespace, name, body)
        except PinRefused as exc:
            return JSONResponse({"error": {"type": "refused", "message": str(exc)}}, status_code=409)
        log.warning("pin workflowrun=%s/%s version=%s by=%r reason=%r", namespace, name, body.version, body.by,
                    body.reason)
        return {"message": message}

    if source is not None:
        add_plan_routes(app, source, spec_limits)


async def start(settings: Settings) -> Plnt:
    telemetry.start("plnt")  # OTEL_* asks for traces, or nothing (before the Temporal client: its interceptor)
    access = load_role_access(settings)
    tokens = access.tokens.tokens
    # Runners of WorkflowRuns bound to a ModelDeployment call it through the gateway: with tokens
    # required, they get this one (scope `models`: chat with models, nothing else), made per start.
    model_token = secrets.token_urlsafe(32) if tokens.enabled else None
    if model_token is not None:
        tokens = tokens.with_token(model_token, Grant(None, frozenset({MODELS}), RUNNERS_TOKEN_NAME))
    state = StateDir(settings.state_dir).ensure()
    cleanups: list[Callable[[], Awaitable[None]]] = []
    try:
        address = settings.temporal.address
        if address is None:
            server = TemporalDevServer(state.temporal_db, log_file=state.root / "temporal.log")
            address = await server.start()
            cleanups.append(server.stop)
            client = await connect(address, settings.temporal.namespace, data_converter=pydantic_data_converter)
        else:
            client = await connect_external(settings, data_converter=pydantic_data_converter)

        statuses = StatusStore(state.status_file)
        cleanups.append(statuses.flush)  # last but the Temporal server: after the sagas and passes stopped
        router = Router(cache_affinity=settings.gateway.cache_affinity)
        holder: dict[str, Plnt] = {}
        driver = make_local_driver(
            settings, state, on_change=lambda: holder["plnt"].refresh_routes() if "plnt" in holder else None,
            limits_for=lambda namespace, name: drivers.runner_limits(namespace, name),
            drain=lambda release: _drain_after_flush(holder, router, release, settings.runners.stop_timeout_s),
            # Scale to zero: this process's gateway (and its workers, through /internal/wake) wakes them.
            park_after_for=lambda namespace, name, fingerprint: drivers.park_after(namespace, name, fingerprint),
            gateway_url=lambda: holder["plnt"].url, model_token=model_token,
        )
        cleanups.append(driver.shutdown)
        # Helm state changes (installs, promotions, removals, live reads) change routes too.
        drivers = make_driver_set(settings, driver, state,
                                  on_change=lambda: holder["plnt"].refresh_routes() if "plnt" in holder else None,
                                  drain=lambda release: _drain_after_flush(holder, router, release,
                                                                           settings.runners.stop_timeout_s))
        source = make_source(settings, state)
        verifier = make_verifier(settings, state)
        # What each release served through this plnt's gateway processes (and any `plnt gateway`
        # following it): compare gates read it (calls.CallsHub, core/traffic.py).
        own_calls = CallLog()
        own_calls.ledger = TrafficLedger()
        calls_hub = CallsHub(own_calls)
        activities = make_activities(settings, state, drivers, source, statuses, verifier, in_process(calls_hub.reading))
        # Phase changes also change routes (a WorkflowRun seen for the first time answers 503, not 404).
        control_metrics = ControlPlaneMetrics()  # the control plane's series, after the gateway's on GET /metrics
        reconciler = make_reconciler(settings, state=state, source=source, client=client, statuses=statuses,
                                     drivers=drivers, verifier=verifier, metrics=control_metrics, cleanups=cleanups)

        def list_workflows() -> list[dict[str, Any]]:
            return with_scaling(public_rows(statuses, drivers.snapshot()), holder["plnt"].autoscaler
                                if "plnt" in holder else None)

        async def on_git_hook() -> None:
            reconciler.wake()

        worker_count = settings.gateway.workers or auto_workers()
        async def wake(namespace: str, name: str, release_id: str) -> str | None:
            woken = await drivers.wake(namespace, name, release_id)
            return woken.endpoint if woken is not None else None

        gateway_app = create_app(router, list_workflows=list_workflows, on_git_hook=on_git_hook, tokens=tokens,
                                 max_body_bytes=settings.gateway.max_body_bytes,
                                 request_timeout_s=settings.gateway.request_timeout_s,
                                 webhook_secret=access.webhook_secret, host=settings.host,
                                 health=lambda: (200, {"status": "ok", "worker": 0, "workers": worker_count}),
                                 wake=wake, gateway_processes=worker_count)

        gateway_app.gateway.calls = own_calls  # (the gateway processes' calls reach it through the hub)
        # The plan preview between revisions reads git history (--source kubernetes has none).
        add_reconciler_routes(gateway_app, reconciler, client, source=source if isinstance(source, GitSource) else None,
                              spec_limits=settings.spec_limits)
        publisher = RoutePublisher()
        internal_token = access.internal_token
        if internal_token is None and worker_count > 1:
            # The workers follow the route watch with it; made here, it exists only in memory and in
            # the workers' stdin pipes (workers.py).
            internal_token = secrets.token_urlsafe(32)
        add_control_routes(gateway_app, publisher, internal_token, wake=wake)
        if worker_count > 1:  # GET /metrics: the sum over the gateway processes (each pushes its own)
            assert internal_token is not None
            worker_metrics = WorkerMetrics(gateway_app.gateway.metrics.render)
            worker_metrics.mount(gateway_app, internal_token)
            gateway_app.state.render_metrics = worker_metrics.render
        calls_hub.mount(gateway_app, internal_token)  # GET /calls: every gateway process's; their pushes
        control_metrics.append_to(gateway_app)  # after the workers' sum: these are this process's alone
        http_limits = HttpLimits(max_head_bytes=settings.gateway.max_header_bytes,
                                 head_timeout_s=settings.gateway.header_timeout_s)
        apart = worker_count > 1 and not settings.gateway.control_plane_gateway
        if apart:  # only the workers take the gateway port; this process answers them on loopback
            assert internal_token is not None
            gateway = GatewayServer(TrustForwarded(gateway_app, internal_token), host="127.0.0.1", port=0,
                                    limits=http_limits)
        else:
            gateway = GatewayServer(gateway_app, host=settings.host, port=settings.port,
                                    reuse_port=worker_count > 1, limits=http_limits)
        stop_event = asyncio.Event()
        plnt = Plnt(settings=settings, state=state, client=client, statuses=statuses, driver=driver, router=router,
                    reconciler=reconciler, gateway=gateway, stop_event=stop_event, publisher=publisher,
                    drivers=drivers, model_token=model_token)
        holder["plnt"] = plnt
        statuses.on_change = plnt.refresh_routes
        reconciler.spec_listeners.append(on_policy(plnt.apply_policy))
        reconciler.spec_listeners.append(on_fallbacks(plnt.apply_fallbacks))
        cleanups.extend(attach_status_followers(settings, statuses, reconciler, source))  # after on_change is set
        cleanups.append(control_metrics.attach(statuses))

        await resume_runners(driver)
        plnt.refresh_routes()

        cleanups.append(activities.recorder.report_progress(settings.temporal.namespace, settings.temporal.task_queue))
        worker = make_saga_worker(client, settings, activities=activities.all(), metrics=control_metrics)
        worker_task = asyncio.create_task(worker.run(), name="temporal-worker")
        plnt._tasks.append(worker_task)
        cleanups.append(worker.shutdown)

        await gateway.start()
        cleanups.append(gateway.stop)
        if worker_count > 1:
            assert internal_token is not None
            await start_gateway_workers(plnt, settings, worker_count, internal_token, access.tokens, cleanups,
                                        apart=apart, app=gateway_app)
        cleanups.append(_closer(publisher))  # runs before gateway.stop: long-polls answer at once
        cleanups.append(reconciler.close)
        plnt._tasks.append(asyncio.create_task(reconciler.run(stop_event), name="reconciler"))
        plnt.autoscaler = make_autoscaler(drivers, control_metrics)
        cleanups.append(run_autoscaler(plnt.autoscaler, stop_event))  # stopped before the runners are
        if settings.review.previews:
            plnt.previews, close_previews = start_previews(
                settings, source=source, client=client, statuses=statuses, driver=drivers, reconciler=reconciler,
                verifier=verifier, gateway_url=lambda: plnt.url, stop=stop_event)
            cleanups.append(close_previews)
        plnt._cleanups = cleanups
        log.info("plnt-up gateway=%s repo=%s branch=%s path=%s state=%s temporal=%s",
                 plnt.url, source.url, settings.source.branch, settings.source.path or "/", state.root, address)
        if tokens.enabled:
            log.info("gateway-auth bearer tokens=%d (GET /healthz is open; everything else needs a token)", len(tokens))
        else:
            log.warning("gateway-open-no-auth host=%s: no tokens configured, anyone who can reach %s can invoke "
                        "every workflow%s", settings.host, plnt.url,
                        "" if settings.gateway.insecure_no_auth and not _loopback(settings.host) else " (loopback only)")
        return plnt
    except BaseException:
        for cleanup in reversed(cleanups):
            try:
                await cleanup()
            except Exception:  # noqa: BLE001
                log.exception("cleanup-after-failed-start")
        raise


def make_autoscaler(drivers: DriverSet, metrics: ControlPlaneMetrics) -> Autoscaler:
    """The autoscaler of local releases (reconciler/control/autoscaler.py), its series in `metrics`:
    it reads their replicas' load and sets their count through the driver (plnt up's runners, or on
    the reconcile role the workers', which take the count in the reply to their next report)."""
    local = drivers.local
    autoscaler = Autoscaler(lambda: local_targets(local.snapshot(), drivers.scale_policy), drivers.set_replicas)
    autoscaler.register(metrics.registry)
    return autoscaler


def run_autoscaler(autoscaler: Autoscaler, stop: asyncio.Event) -> Callable[[], Awaitable[None]]:
    """Run its loop until `stop`; returns what stops it sooner."""
    task = asyncio.create_task(autoscaler.run(stop), name="autoscaler")

    async def halt() -> None:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    return halt


async def start_gateway_workers(plnt: Plnt, settings: Settings, count: int, internal_token: str, tokens: GatewayTokens,
                                cleanups: list[Callable[[], Awaitable[None]]], *, apart: bool, app: Any) -> None:
    """--gateway-workers N > 1: worker processes on the gateway's port (gateway/workers.py), following
    the route table through a private loopback listener of this process (on the public port their
    long-polls would land on each other); it serves the same app, trusting the caller address the
    workers forward with the internal token.

    `apart` (the default): the N processes on the port are all workers, this one only holds the port
    (bound, not listening: the kernel gives it no connection) and `plnt.gateway` is the private
    listener. Otherwise this process listens there too and starts N-1 workers."""
    host = settings.host
    if apart:
        private = plnt.gateway
        if settings.port:
            try:
                check_free(host, settings.port)
            except OSError as exc:
                raise ServerStartError(f"cannot listen on {host}:{settings.port} ({exc.strerror}); is another plnt "
                                       "running? choose a port with --port") from None
        holder = reuse_port_socket(host, settings.port, listen=False)
        port = int(holder.getsockname()[1])
        plnt.public_url = f"http://{host}:{port}" if ":" not in host else f"http://[{host}]:{port}"

        async def release() -> None:
            holder.close()

        cleanups.append(release)  # after the workers stopped (cleanups run in reverse)
        workers = count
    else:
        private = GatewayServer(TrustForwarded(app, internal_token), host="127.0.0.1", port=0, lifespan=False,
                                limits=plnt.gateway.limits)
        await private.start()
        cleanups.append(private.stop)
        port = plnt.gateway.port
        workers = count - 1
    plnt.control_listener = private
    tokens_text = tokens.file_text  # as start read it: every gateway process gets the same tokens
    if plnt.model_token is not None:  # the bound runners' token (see start), for every gateway process
        tokens_text = f"{tokens_text or ''}\n{plnt.model_token} name={RUNNERS_TOKEN_NAME} scopes=models\n"
    parent = os.getpid()

    def config_for(index: int) -> WorkerConfig:
        return WorkerConfig(
            index=index, parent_pid=parent, control_url=private.url, internal_token=SecretStr(internal_token),
            forward_control=True, host=host, port=port,
            tokens_text=SecretStr(tokens_text) if tokens_text is not None else None,
            tokens_source=tokens.source, plain_tokens=tuple(SecretStr(t) for t in tokens.plain),
            max_body_bytes=settings.gateway.max_body_bytes, request_timeout_s=settings.gateway.request_timeout_s,
            max_header_bytes=settings.gateway.max_header_bytes, header_timeout_s=settings.gateway.header_timeout_s,
            watch_retry_max_s=1.0, verbose=log.isEnabledFor(logging.DEBUG), processes=count,
            cache_affinity=settings.gateway.cache_affinity)

    supervisor = WorkerSupervisor(config_for, workers)
    plnt.gateway_workers = supervisor
    cleanups.append(supervisor.stop)  # runs first: workers stop taking connections, then the rest
    await supervisor.start()
    log.info("gateway-workers processes=%d on %s (plnt up's own process %s) pids=%s", count, plnt.url,
             "only holds the port" if apart else "is one of them", sorted(supervisor.pids.values()))


def start_previews(settings: Settings, *, source: GitSource | KubernetesSource, client: Client, statuses: StatusStore,
                   driver: Any, reconciler: Reconciler, verifier: CommitVerifier | None,
                   gateway_url: Callable[[], str], stop: asyncio.Event) -> tuple[PreviewController, Callable[[], Awaitable[None]]]:
    """--previews (reconciler/review/previews.py): a PreviewController beside the reconciler, planning each
    pull request against the branch's newest valid commit. Returns it and its cleanup."""
    forge = make_forge_client(settings)
    assert forge is not None  # Settings refuses --previews without --forge
    assert isinstance(source, GitSource)  # and with --source kubernetes
    previews = PreviewController(settings=settings, source=source, client=client, statuses=statuses, driver=driver,
                                 forge=forge, verifier=verifier, gateway_url=gateway_url)
    reconciler.spec_listeners.append(previews.on_branch)
    task = asyncio.create_task(previews.run(stop), name="previews")

    async def close() -> None:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await previews.close()
        await forge.aclose()

    return previews, close


async def _drain_after_flush(holder: dict[str, Plnt], router: Router, release: Release, timeout_s: float) -> bool:
    """Once the routes no longer name `release` (a rebuild may still be pending), wait until this
    process and every gateway worker following its routes let go of the runner: each serves a table
    without it and has no request left on it (route_watch.release_everywhere). At most `timeout_s`:
    a runner stopped then still finishes, on SIGTERM, the requests it received."""
    plnt = holder.get("plnt")
    if plnt is not None:
        plnt.flush_routes()
    if plnt is None or plnt.publisher is None:
        return await router.drain(Backend(release.endpoint, release.version, release.release_id), timeout_s=timeout_s)
    outcome = await release_everywhere(plnt.publisher, router, release.endpoint, timeout_s)
    if outcome.drained:
        log.info("runner-drained release=%s %s", release.release_id, outcome.describe())
    else:
        log.warning("runner-drain-timeout release=%s %s (stopping it anyway)", release.release_id, outcome.describe())
    return outcome.drained


def _closer(publisher: RoutePublisher) -> Callable[[], Awaitable[None]]:
    async def close() -> None:
        publisher.close()

    return close
