"""The roles of plnt run apart: `plnt reconcile` and `plnt worker` (the gateway role is `plnt gateway`).

    plnt reconcile   fetch, plan, start sagas; runs the DeploySaga workflows and their status writes;
                     serves the control API (status, history, source, hooks, the route table, the
                     workers' runner reports, the gateways' calls and the traffic ledger compare
                     gates read). Exactly one active: a lease elects it.
    plnt worker      runs the saga's steps (validate, pull and verify, install, smoke test, promote,
                     remove) on Temporal; hosts the local runner processes it installs and reports
                     them to the control API. Any number for Kubernetes backends.

They share no disk: each has its own state directory and git clone; the worker learns which commit
to act on from the saga, the reconciler learns what runs from the Helm backends and the workers'
reports, the gateways learn the routes from the control API. `plnt up` is all of them in one process.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from plnt.core import telemetry
from plnt.core.limits import HttpLimits
from plnt.core.server import GatewayServer, ServerStartError
from plnt.core.traffic import TrafficLedger
from plnt.gateway.app import create_app
from plnt.gateway.calls import CallsHub
from plnt.gateway.route_watch import (
    InternalGuard,
    RoutePublisher,
    add_control_routes,
    internal_guard,
    release_everywhere,
)
from plnt.gateway.router import Router
from plnt.reconciler.app import (
    TurnBatched,
    add_reconciler_routes,
    attach_status_followers,
    build_route_table,
    make_activities,
    make_autoscaler,
    make_driver_set,
    make_local_driver,
    make_reconciler,
    make_saga_worker,
    make_source,
    make_verifier,
    on_fallbacks,
    on_policy,
    resume_runners,
    run_autoscaler,
    start_previews,
)
from plnt.reconciler.control.access import internal_token, load_role_access
from plnt.reconciler.control.lease import FileLease, LeaderLease
from plnt.reconciler.control.metrics import ControlPlaneMetrics
from plnt.reconciler.drivers.reported import RUNNERS_PATH, ReportedRunners, RunnerReport, RunnerReporter
from plnt.reconciler.gates.compare import ControlTraffic
from plnt.reconciler.saga.activities.recorder import PhaseRecorder
from plnt.reconciler.saga.temporal_server import connect_external
from plnt.reconciler.settings import Settings
from plnt.reconciler.state import Release, StateDir
from plnt.reconciler.status_store import StatusStore
from prometheus_client import CollectorRegistry, Gauge, generate_latest
from pydantic import ValidationError
from temporalio.contrib.pydantic import pydantic_data_converter

log = logging.getLogger(__name__)

Cleanup = Callable[[], Awaitable[None]]


def default_identity() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


@dataclass
class Role:
    """A running role: what the CLI and tests hold on to."""

    name: str
    server: GatewayServer
    stop_event: asyncio.Event = field(default_factory=asyncio.Event)
    # Set when the role ends by itself (a lost lease): the CLI exits non-zero so a supervisor restarts it.
    failed: asyncio.Event = field(default_factory=asyncio.Event)
    _tasks: list[asyncio.Task[Any]] = field(default_factory=list)
    _cleanups: list[Cleanup] = field(default_factory=list)

    @property
    def url(self) -> str:
        return self.server.url

    async def stop(self) -> None:
        self.stop_event.set()
        for cleanup in reversed(self._cleanups):
            try:
                await cleanup()
            except Exception:  # noqa: BLE001 - keep stopping the rest
                log.exception("shutdown-step-failed role=%s", self.name)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


async def _undo(cleanups: list[Cleanup]) -> None:
    for cleanup in reversed(cleanups):
        try:
            await cleanup()
        except Exception:  # noqa: BLE001
            log.exception("cleanup-after-failed-start")


def _require_temporal(settings: Settings, role: str) -> None:
    if settings.temporal.address is None:
        raise ServerStartError(f"plnt {role} needs --temporal-address HOST:PORT: the roles share one Temporal server "
                               "(start one with `temporal server start-dev`, or run everything in one process "
                               "with `plnt up`)")


# --- plnt reconcile ----------------------------------------------------------------------------


class _StandbyGate:
    """In front of the control API: until this replica holds the lease, everything but the health
    checks and GET /metrics answers 503, so a Service sends nothing to a standby replica (its /readyz
    fails too). /metrics answers (with its usual auth) because Prometheus scrapes every pod, standby
    included, and a 503 there would read as `up == 0`: a false alarm."""

    def __init__(self, app: Any, active: Callable[[], bool]) -> None:
        self.app = app
        self._active = active

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and not self._active() and scope["path"] not in ("/healthz", "/readyz", "/metrics"):
            response = JSONResponse({"error": {"type": "standby", "message": "this reconciler is on standby: "
                                               "another replica holds the lease"}}, status_code=503)
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


def _serve_leader_metrics(app: Any, control_metrics: ControlPlaneMetrics, active: Callable[[], bool]) -> None:
    """GET /metrics of the control API: `plnt_reconciler_leader` (1 on the Lease holder, 0 on a
    standby) after the app's own series; the control plane's series on the Lease holder only. A
    standby's statuses are whatever it loaded at start (stale, or a shared volume's copy): summed with
    the leader's they would double-count workflows and could fire PlntSagaStuck."""
    registry = CollectorRegistry()
    Gauge("plnt_reconciler_leader", "1 when this reconciler holds the Lease (the active one), 0 on a standby.",
          registry=registry).set_function(lambda: 1.0 if active() else 0.0)
    own = app.state.render_metrics
    control_metrics.append_to(app)
    with_control_plane = app.state.render_metrics

    def render() -> bytes:
        return (with_control_plane() if active() else own()) + generate_latest(registry)

    app.state.render_metrics = render


def make_lease(settings: Settings, state: StateDir) -> LeaderLease:
    identity = settings.roles.identity or default_identity()
    if settings.roles.lease == "kubernetes":
        from kubernetes import client as k8s  # the kubernetes client only where it is used
        from plnt.reconciler.control.kube import KubernetesLease, api_client

        namespace = settings.roles.lease_namespace or _pod_namespace()
        api = k8s.CoordinationV1Api(api_client(settings.kubernetes.kubeconfig))
        return KubernetesLease(settings.roles.lease_name, namespace, identity, api=api)
    return FileLease(state.root / "reconciler.lease", identity=identity)


def _pod_namespace() -> str:
    try:
        with open("/var/run/secrets/kubernetes.io/serviceaccount/namespace", encoding="utf-8") as file:
            return file.read().strip()
    except OSError:
        raise ServerStartError("--lease kubernetes needs --lease-namespace outside a pod") from None


async def start_reconciler(settings: Settings, *, lease: LeaderLease | None = None) -> Role:
    """Serve the control API at once (standby until the lease is held), then reconcile while it is."""
    _require_temporal(settings, "reconcile")
    telemetry.start("plnt-reconciler")
    access = load_role_access(settings)
    state = StateDir(settings.state_dir).ensure()
    lease = lease or make_lease(settings, state)
    verifier = make_verifier(settings, state)  # a bad --allowed-signers or --gpg-keys fails the start
    statuses = StatusStore(state.status_file)
    router = Router(cache_affinity=settings.gateway.cache_affinity)
    publisher = RoutePublisher()  # what `plnt gateway` replicas follow
    holder: dict[str, Any] = {}

    built: dict[str, Any] = {}  # routes with the records they came from (build_route_table)

    def rebuild_routes() -> None:
        # reported local runners + known Helm releases
        table = build_route_table(drivers.snapshot(), statuses, built, holder.get("policy"), holder.get("fallbacks"))
        router.replace(table)
        publisher.publish(table, [status.public() for status in statuses.all()])

    # Once per event-loop turn, however many changes it made. (Nothing drains here: a worker asks
    # POST /internal/drain before it stops a runner or uninstalls a Helm release, answered once every
    # `plnt gateway` let go of it.)
    refresh_routes = TurnBatched(rebuild_routes)

    def apply_fallbacks(fallbacks: dict[str, str]) -> None:  # its ModelDeployments' spec.fallback, by key
        holder["fallbacks"] = fallbacks
        refresh_routes()

    def apply_policy(policy: Any) -> None:  # the reconciled commit's GatewayPolicy, carried by the routes
        holder["policy"] = policy
        refresh_routes()

    async def drain(release: Release) -> None:
        # A pool's Helm release leaving the routes here (a re-placement): every `plnt gateway` lets go
        # of its Service before helm uninstalls it (its other changes run, and drain, in workers).
        refresh_routes.flush()
        outcome = await release_everywhere(publisher, router, release.endpoint, settings.runners.stop_timeout_s)
        if not outcome.drained:
            log.warning("release-drain-timeout release=%s %s (uninstalling it anyway)", release.release_id,
                        outcome.describe())
        else:
            log.info("release-drained release=%s endpoint=%s %s (uninstalled next)", release.release_id,
                     release.endpoint, outcome.describe())

    runners = ReportedRunners(on_change=refresh_routes)
    drivers = make_driver_set(settings, runners, state, on_change=refresh_routes, drain=drain)
    source = make_source(settings, state)
    statuses.on_change = refresh_routes

    async def on_git_hook() -> None:
        if "reconciler" in holder:
            holder["reconciler"].wake()

    control = create_app(router, list_workflows=lambda: [s.public() for s in statuses.all()],
                         on_git_hook=on_git_hook, tokens=access.tokens.tokens,
                         max_body_bytes=settings.gateway.max_body_bytes,
                         request_timeout_s=settings.gateway.request_timeout_s, webhook_secret=access.webhook_secret,
                         host=settings.host)
    active = asyncio.Event()
    add_role_health(control, "reconciler", lambda: {"active": active.is_set()}, ready=active.is_set)
    def release_leaving(endpoint: str, release_id: str | None) -> None:
        # A worker uninstalls this Helm release next (a promotion's canary, a rollback, a pool's member):
        # out of the routes before its drain request waits for the gateways to let go.
        known = [release.release_id for release in drivers.leaving(endpoint, release_id)]
        for leaving_id in known + ([release_id] if release_id and release_id not in known else []):
            log.info("release-leaving release=%s endpoint=%s (a worker uninstalls it once drained)",
                     leaving_id, endpoint)
        refresh_routes.flush()

    add_control_routes(control, publisher, access.internal_token, leaving=release_leaving)
    add_runner_reports(control, runners, internal_guard(control, access.internal_token))
    # Every `plnt gateway` process pushes its calls here; a worker's compare gate reads the ledger
    # (GET /internal/traffic). Kept in memory: a reconciler taking over starts it empty.
    control.gateway.calls.ledger = TrafficLedger()
    CallsHub(control.gateway.calls).mount(control, access.internal_token)
    control_metrics = ControlPlaneMetrics()  # after the app's own series on GET /metrics (reconciler/control/metrics.py)
    _serve_leader_metrics(control, control_metrics, active.is_set)
    server = GatewayServer(_StandbyGate(control, active.is_set), host=settings.host, port=settings.port,
                           limits=HttpLimits(max_head_bytes=settings.gateway.max_header_bytes,
                                             head_timeout_s=settings.gateway.header_timeout_s))
    role = Role("reconciler", server)
    await server.start()
    role._cleanups.append(server.stop)
    role._cleanups.append(statuses.flush)  # after the passes and sagas stopped

    async def close_publisher() -> None:  # long-polls answer at once rather than at their timeout
        publisher.close()

    role._cleanups.append(close_publisher)
    role._cleanups.append(control_metrics.attach(statuses))
    autoscaler = make_autoscaler(drivers, control_metrics)  # runs while this replica leads
    refresh_routes()

    async def lead() -> None:
        if not await lease.acquire(role.stop_event):
            return
        cleanups: list[Cleanup] = [lease.release]
        try:
            client = await connect_external(settings, data_converter=pydantic_data_converter)
            # The workflows and their status writes only: the saga's steps run on the workers.
            recorder = PhaseRecorder(statuses)
            cleanups.append(recorder.report_progress(settings.temporal.namespace, settings.temporal.task_queue))
            worker = make_saga_worker(client, settings, activities=[recorder.record_phase], metrics=control_metrics,
                                      remote_activities=False)
            worker_task = asyncio.create_task(worker.run(), name="temporal-workflow-worker")
            cleanups.append(worker.shutdown)
            reconciler = make_reconciler(settings, state=state, source=source, client=client, statuses=statuses,
                                         drivers=drivers, verifier=verifier, metrics=control_metrics, cleanups=cleanups)
            holder["reconciler"] = reconciler
            reconciler.spec_listeners.append(on_policy(apply_policy))
            reconciler.spec_listeners.append(on_fallbacks(apply_fallbacks))
            add_reconciler_routes(control, reconciler, client)
            cleanups.append(reconciler.close)
            cleanups.extend(attach_status_followers(settings, statuses, reconciler, source))
            if settings.review.previews:  # the preview sagas' steps run on the workers too
                _, close_previews = start_previews(
                    settings, source=source, client=client, statuses=statuses, driver=drivers, reconciler=reconciler,
                    verifier=verifier, gateway_url=lambda: server.url, stop=role.stop_event)
                cleanups.append(close_previews)
            reconcile_task = asyncio.create_task(reconciler.run(role.stop_event), name="reconciler")
            cleanups.append(run_autoscaler(autoscaler, role.stop_event))
            active.set()
            log.info("reconciler-active control=%s repo=%s branch=%s temporal=%s", server.url, source.url,
                     settings.source.branch, settings.temporal.address)
            await lease.hold(role.stop_event)
            if not role.stop_event.is_set():
                log.error("lease-lost: stopping reconciliation at once (another replica may now be active)")
                role.failed.set()
            active.clear()
            reconcile_task.cancel()
            await asyncio.gather(reconcile_task, worker_task, return_exceptions=True)
        finally:
            active.clear()
            await _undo(cleanups)

    role._tasks.append(asyncio.create_task(lead(), name="lead"))
    log.info("reconciler-started control=%s state=%s (waiting for the lease)", server.url, state.root)
    return role


def add_role_health(app: FastAPI, role: str, details: Callable[[], dict[str, Any]],
                    ready: Callable[[], bool] = lambda: True) -> None:
    """GET /readyz: 200 when this replica should get traffic (a standby reconciler: 503).
    (GET /healthz, liveness, is the gateway app's own and answers 200 while the process serves.)"""

    @app.get("/readyz")
    async def readyz() -> JSONResponse:
        return JSONResponse({"role": role, "ready": ready(), **details()}, status_code=200 if ready() else 503)


def add_runner_reports(app: FastAPI, runners: ReportedRunners, guard: InternalGuard) -> None:
    """PUT /internal/runners: a worker's report of its local runners (the internal token)."""

    @app.put(RUNNERS_PATH, include_in_schema=False)
    async def runner_report(request: Request) -> Response:
        if (refused := guard(request, f"PUT {RUNNERS_PATH}")) is not None:
            return refused
        try:
            report = RunnerReport.model_validate_json(await request.body())
        except ValidationError as exc:
            return JSONResponse({"error": {"type": "invalid_report", "message": str(exc.errors()[:3])}}, status_code=422)
        return JSONResponse(runners.accept(report).model_dump(mode="json"))


# --- plnt worker -------------------------------------------------------------------------------


async def start_worker(settings: Settings) -> Role:
    """Run the saga's steps; host the local runners they install and report them."""
    _require_temporal(settings, "worker")
    telemetry.start("plnt-worker")
    if settings.roles.control_url is None:
        raise ServerStartError("plnt worker needs --control-url URL: the reconciler's control API, where it reports "
                               "the runners it hosts")
    state = StateDir(settings.state_dir).ensure()
    cleanups: list[Cleanup] = []
    try:
        client = await connect_external(settings, data_converter=pydantic_data_converter)
        identity = settings.roles.identity or default_identity()
        token = internal_token(settings)
        holder: dict[str, RunnerReporter] = {}

        async def drain(release: Release) -> None:
            # Gateways run elsewhere: report the change, then wait until the control plane says each
            # dropped this runner and finished what it sent it, before it stops.
            await holder["reporter"].drain(release, timeout_s=settings.runners.stop_timeout_s,
                                           grace_s=settings.roles.drain_grace_s)

        async def drain_helm_release(release: Release) -> None:
            # A Helm release this worker uninstalls next: the control plane takes it out of the routes
            # (its own live reads would, a pass later) and answers once the gateways let go of it.
            await holder["reporter"].drain(release, timeout_s=settings.runners.stop_timeout_s,
                                           grace_s=settings.roles.drain_grace_s, leaving=True)

        local = make_local_driver(settings, state, on_change=lambda: holder["reporter"].push_now(),
                                  drain=drain, limits_for=lambda ns, name: drivers.runner_limits(ns, name))
        drivers = make_driver_set(settings, local, state, drain=drain_helm_release)
        reporter = RunnerReporter(worker=identity, control_url=settings.roles.control_url, token=token, local=local,
                                  interval_s=settings.roles.report_interval_s)
        holder["reporter"] = reporter
        cleanups.append(local.shutdown)
        # A compare gate reads the traffic the gateways pushed to the reconciler.
        traffic = ControlTraffic(settings.roles.control_url, token) if token is not None else None
        activities = make_activities(settings, state, drivers, make_source(settings, state), statuses=None,
                                     verifier=make_verifier(settings, state),
                                     traffic=traffic.reader if traffic is not None else None)

        app = FastAPI(title="plnt worker", docs_url=None, redoc_url=None, openapi_url=None)

        @app.get("/healthz")
        async def healthz() -> dict[str, str]:
            return {"status": "ok"}

        def details() -> dict[str, Any]:
            return {"runners": len(local.snapshot()),
                    "control": "unreachable" if reporter.unreachable_since is not None else
                    ("reachable" if reporter.last_ok is not None else "not yet reached")}

        add_role_health(app, "worker", details)
        step_metrics = ControlPlaneMetrics()  # the saga steps this worker runs, on its GET /metrics
        step_metrics.mount(app)
        server = GatewayServer(app, host=settings.host, port=settings.port)
        role = Role("worker", server)
        await resume_runners(local)
        worker = make_saga_worker(client, settings, activities=activities.remote(), metrics=step_metrics,
                                  workflows=False)
        role._tasks.append(asyncio.create_task(worker.run(), name="temporal-activity-worker"))
        cleanups.append(worker.shutdown)
        role._tasks.append(asyncio.create_task(reporter.run(role.stop_event), name="runner-reports"))
        await server.start()
        cleanups.append(server.stop)
        role._cleanups = cleanups
        log.info("worker-started identity=%s health=%s temporal=%s task_queue=%s control=%s", identity, server.url,
                 settings.temporal.address, settings.temporal.task_queue, settings.roles.control_url)
        return role
    except BaseException:
        await _undo(cleanups)
        raise
