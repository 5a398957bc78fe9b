"""Prometheus metrics of the control plane: rollouts, saga steps, smoke gates, commit to Ready,
reconcile passes and git fetches. Its own registry (several plnts in one test process never share
or collide), served after the gateway's series on the same `GET /metrics` (`append_to`), or on a
`plnt worker`'s own listener (`mount`).

Series (`namespace`/`name` are a WorkflowRun's or ModelDeployment's, `kind` its kind; previews,
whose names come and go with pull requests, are left out of the per-workflow series):
- `plnt_rollouts_total{namespace,name,kind,outcome}`: rollouts ended, outcome = promoted |
  rolled_back | failed (each saga's own final phase record: Ready, RolledBack, Failed). Every
  outcome starts at 0 when the workflow is first seen, so `increase()` sees the first rollback.
- `plnt_saga_step_duration_seconds{step,outcome}`: histogram, each saga activity (validate,
  pull_recipe, install_release, smoke_test, promote_release, remove_release, record_phase) as the
  worker that ran it measured it; outcome = ok | error | cancelled. Recorded by a Temporal worker
  interceptor (`interceptor()`), so on `plnt worker` for the steps a worker runs.
- `plnt_smoke_gate_value{namespace,name,gate}` / `plnt_smoke_gate_budget{namespace,name,gate}`:
  the newest finished smoke test's measure and its budget, gate = p95 | ttft | tpot (p95 latencies,
  seconds) | errors (ratio 0-1). A gate without a budget (ttft/tpot unset) has no budget series.
- `plnt_smoke_gate_failures_total{namespace,name,gate}`: smoke tests in which that gate was over budget.
- `plnt_commit_to_ready_seconds{namespace,name}`: histogram, the reconciler's first sight of a
  commit (its fetch) to the Ready record of that commit's rollout. A commit seen before this
  process started counts from the start.
- `plnt_reconcile_duration_seconds{pass,outcome}`: histogram, one pass (pass = full | light,
  outcome = ok | skipped | error).
- `plnt_git_fetch_duration_seconds`, `plnt_git_fetch_errors_total`,
  `plnt_git_last_fetch_success_timestamp_seconds`: the spec repository's fetches.
- Read from the statuses at scrape time: `plnt_workflows{phase,kind}` (every phase, 0 included),
  `plnt_canary_traffic_ratio{namespace,name,kind}` (0 without a canary),
  `plnt_sagas_in_progress` and `plnt_saga_start_timestamp_seconds{namespace,name,kind}` (while a
  workflow is in Pending, Verifying, Deploying, Canary or Deleting: when this process saw it enter
  them; a saga adopted after a restart counts from the restart).

Recording never blocks nor breaks what it records: every entry point catches its own errors and
logs them at debug level.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from plnt.core.routes import preview_of
from plnt.core.specs.models import SmokeTest
from plnt.core.status import FINAL_PHASES, Phase, WorkflowRunStatus
from plnt.reconciler.status_store import StatusStore
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from temporalio import activity
from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput, Interceptor

log = logging.getLogger(__name__)

STEP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
COMMIT_BUCKETS = (1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0, 3600.0)
PASS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
FETCH_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)

OUTCOMES = {Phase.READY: "promoted", Phase.ROLLED_BACK: "rolled_back", Phase.FAILED: "failed"}
KINDS = ("WorkflowRun", "ModelDeployment")
# gate, the smoke record's measure, the budget (spec's canary.smokeTest, camelCase), the scale to seconds/ratio
GATES = (
    ("p95", "p95_ms", "p95BudgetMs", 0.001),
    ("errors", "error_percent", "errorBudgetPercent", 0.01),
    ("ttft", "ttft_p95_ms", "ttftBudgetMs", 0.001),
    ("tpot", "tpot_p95_ms", "tpotBudgetMs", 0.001),
)
_DEFAULT_BUDGETS = {field.alias or name: field.default for name, field in SmokeTest.model_fields.items()}
MAX_COMMITS = 256  # commits remembered for commit-to-Ready (one fetch a second finds few)


def smoke_gates(smoke: dict[str, Any] | None, budget: dict[str, Any] | None) -> dict[str, tuple[float, float | None]]:
    """{gate: (value, budget)} in seconds / ratio from a smoke record (SmokeResult as JSON) and the
    spec's canary.smokeTest (camelCase, defaults where unset); gates the test did not measure are left out."""
    measured = (smoke or {}).get("metrics")
    if not isinstance(measured, dict):
        return {}
    budgets = {**_DEFAULT_BUDGETS, **(budget or {})}
    out: dict[str, tuple[float, float | None]] = {}
    for gate, field, budget_field, scale in GATES:
        value = measured.get(field)
        if isinstance(value, int | float):
            limit = budgets.get(budget_field)
            out[gate] = (float(value) * scale, float(limit) * scale if isinstance(limit, int | float) else None)
    return out


class ControlPlaneMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.rollouts = Counter("plnt_rollouts", "Rollouts ended, by outcome (promoted, rolled_back, failed).",
                                ("namespace", "name", "kind", "outcome"), registry=r)
        self.steps = Histogram("plnt_saga_step_duration_seconds", "Saga activities (steps) as their worker ran them.",
                               ("step", "outcome"), buckets=STEP_BUCKETS, registry=r)
        self.gate_failures = Counter("plnt_smoke_gate_failures", "Smoke tests in which this gate was over its budget.",
                                     ("namespace", "name", "gate"), registry=r)
        self.commit_to_ready = Histogram("plnt_commit_to_ready_seconds",
                                         "A commit first fetched to the Ready record of its rollout.",
                                         ("namespace", "name"), buckets=COMMIT_BUCKETS, registry=r)
        self.passes = Histogram("plnt_reconcile_duration_seconds", "One reconcile pass (full: with a fetch; light: after a saga ended).",
                                ("pass", "outcome"), buckets=PASS_BUCKETS, registry=r)
        self.fetch_duration = Histogram("plnt_git_fetch_duration_seconds", "Fetches of the spec repository.",
                                        buckets=FETCH_BUCKETS, registry=r)
        self.fetch_errors = Counter("plnt_git_fetch_errors", "Fetches of the spec repository that failed.", registry=r)
        self._last_fetch_ok: float | None = None
        self._statuses: StatusStore | None = None
        self._seen: dict[str, WorkflowRunStatus] = {}  # each status as last looked at (records are frozen)
        self._marks: dict[str, tuple[str, Phase, float]] = {}  # each saga's last phase record (commit, phase, at)
        self._started: dict[str, float] = {}  # in a saga's phases since
        self._gates: dict[str, tuple[str, dict[str, tuple[float, float | None]]]] = {}  # key -> (kind, gates)
        self._commits: OrderedDict[str, float] = OrderedDict()  # commit -> first fetched (time.time())
        self._scan_pending = False
        self._loop: asyncio.AbstractEventLoop | None = None
        r.register(_StatusCollector(self))

    # --- recording (never raises) ----------------------------------------------------------------

    def commit_seen(self, commit: str) -> None:
        """A fetch found `commit`: when first seen, the start of its commit-to-Ready time."""
        try:
            if commit not in self._commits:
                self._commits[commit] = time.time()
                while len(self._commits) > MAX_COMMITS:
                    self._commits.popitem(last=False)
        except Exception:  # noqa: BLE001 - metrics never break what they measure
            log.debug("metrics-commit-seen-failed", exc_info=True)

    def fetch_finished(self, ok: bool, seconds: float) -> None:
        try:
            self.fetch_duration.observe(seconds)
            if ok:
                self._last_fetch_ok = time.time()
            else:
                self.fetch_errors.inc()
        except Exception:  # noqa: BLE001
            log.debug("metrics-fetch-failed", exc_info=True)

    def pass_finished(self, full: bool, outcome: str, seconds: float) -> None:
        try:
            self.passes.labels("full" if full else "light", outcome).observe(seconds)
        except Exception:  # noqa: BLE001
            log.debug("metrics-pass-failed", exc_info=True)

    def step_finished(self, step: str, outcome: str, seconds: float) -> None:
        try:
            self.steps.labels(step, outcome).observe(seconds)
        except Exception:  # noqa: BLE001
            log.debug("metrics-step-failed", exc_info=True)

    def interceptor(self) -> Interceptor:
        """For `Worker(interceptors=[...])`: times every activity the worker runs."""
        return _StepInterceptor(self)

    # --- following the statuses -------------------------------------------------------------------

    def attach(self, statuses: StatusStore) -> Callable[[], Awaitable[None]]:
        """Chain onto statuses.on_change (what is set there keeps running first): each change is
        looked at once the event-loop turn is over, whatever thread made it. What the statuses hold
        now is taken as already counted (a restart does not count old rollouts again). Returns the cleanup."""
        self._statuses = statuses
        self._loop = asyncio.get_running_loop()
        now = time.time()
        for status in statuses.all():
            self._look(status, now, count=False)
        previous = statuses.on_change

        def on_change() -> None:
            previous()
            self._changed()

        statuses.on_change = on_change

        async def detach() -> None:
            if statuses.on_change is on_change:
                statuses.on_change = previous

        return detach

    def _changed(self) -> None:
        if self._scan_pending or self._loop is None:
            return
        self._scan_pending = True
        with contextlib.suppress(RuntimeError):  # the loop is closing: nothing left to count
            self._loop.call_soon_threadsafe(self._scan)

    def _scan(self) -> None:
        self._scan_pending = False
        statuses = self._statuses
        if statuses is None:
            return
        try:
            now = time.time()
            current = statuses.all()
            for status in current:
                if self._seen.get(status.key) is not status:
                    self._look(status, now, count=True)
            if len(current) != len(self._seen):
                for key in set(self._seen) - {status.key for status in current}:
                    for held in (self._seen, self._marks, self._started, self._gates):
                        held.pop(key, None)  # type: ignore[attr-defined]
        except Exception:  # noqa: BLE001
            log.debug("metrics-status-scan-failed", exc_info=True)

    def _look(self, status: WorkflowRunStatus, now: float, *, count: bool) -> None:
        key = status.key
        first = key not in self._seen
        self._seen[key] = status
        if preview_of(status.name) is not None:
            return
        if first:  # every outcome and gate from 0: increase() then sees the first one
            for outcome in OUTCOMES.values():
                self.rollouts.labels(status.namespace, status.name, status.kind, outcome)
            for gate, *_ in GATES:
                self.gate_failures.labels(status.namespace, status.name, gate)
        if status.phase in FINAL_PHASES:
            self._started.pop(key, None)
        else:
            self._started.setdefault(key, now)
        mark = status.rollout
        if mark is None:
            return
        ident = (mark.commit, mark.phase, mark.at)
        if self._marks.get(key) == ident:
            return
        self._marks[key] = ident
        outcome = OUTCOMES.get(mark.phase)
        gates = smoke_gates(status.smoke_test, status.smoke_budget)
        if gates and (outcome is not None or not count):
            self._gates[key] = (status.kind, gates)
        if outcome is None or not count:
            return
        self.rollouts.labels(status.namespace, status.name, status.kind, outcome).inc()
        for gate, (value, budget) in gates.items():
            if budget is not None and value > budget:
                self.gate_failures.labels(status.namespace, status.name, gate).inc()
        if mark.phase is Phase.READY and mark.commit in self._commits:
            self.commit_to_ready.labels(status.namespace, status.name).observe(
                max(0.0, (mark.at or now) - self._commits[mark.commit]))

    # --- serving ----------------------------------------------------------------------------------

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def append_to(self, app: Any) -> None:
        """The gateway app's GET /metrics (app.state.render_metrics, the gateway's series or their
        sum over gateway workers) followed by these: no family of one is in the other."""
        previous = app.state.render_metrics

        def render() -> bytes:
            return previous() + self.render()

        app.state.render_metrics = render

    def mount(self, app: Any) -> None:
        """GET /metrics on an app of its own (`plnt worker`'s health listener)."""
        from fastapi.responses import Response

        @app.get("/metrics")
        async def metrics() -> Response:
            return Response(self.render(), media_type=self.content_type)


class _StatusCollector(Collector):
    """The series read from the statuses (and what following them kept) at scrape time: nothing to
    update on the way, and a removed workflow's series go with it."""

    def __init__(self, metrics: ControlPlaneMetrics) -> None:
        self._m = metrics

    def describe(self) -> Iterator[GaugeMetricFamily]:
        return iter(())  # families known only at collect(): auto_describe must not call collect at register

    def collect(self) -> Iterator[GaugeMetricFamily]:
        m = self._m
        workflows = GaugeMetricFamily("plnt_workflows", "WorkflowRuns and ModelDeployments by phase.",
                                      labels=("phase", "kind"))
        canary = GaugeMetricFamily("plnt_canary_traffic_ratio", "Share of traffic routed to the canary (0-1).",
                                   labels=("namespace", "name", "kind"))
        running = GaugeMetricFamily("plnt_sagas_in_progress",
                                    "Workflows in a saga's phases (Pending, Verifying, Deploying, Canary, Deleting).")
        started = GaugeMetricFamily("plnt_saga_start_timestamp_seconds",
                                    "When this process saw the workflow enter a saga's phases (Unix time).",
                                    labels=("namespace", "name", "kind"))
        value = GaugeMetricFamily("plnt_smoke_gate_value", "Newest finished smoke test's measure: p95/ttft/tpot "
                                  "in seconds, errors as a ratio (0-1).", labels=("namespace", "name", "gate"))
        budget = GaugeMetricFamily("plnt_smoke_gate_budget", "Budget of that smoke test's gate: p95/ttft/tpot "
                                   "in seconds, errors as a ratio (0-1).", labels=("namespace", "name", "gate"))
        fetched = GaugeMetricFamily("plnt_git_last_fetch_success_timestamp_seconds",
                                    "Last successful fetch of the spec repository (Unix time).")
        try:
            if m._last_fetch_ok is not None:
                fetched.add_metric((), m._last_fetch_ok)
            statuses = m._statuses
            if statuses is not None:
                counts = {(phase.value, kind): 0 for phase in Phase for kind in KINDS}
                in_progress = 0
                for status in statuses.all():
                    counts[(status.phase.value, status.kind)] = counts.get((status.phase.value, status.kind), 0) + 1
                    if status.phase not in FINAL_PHASES:
                        in_progress += 1
                    if preview_of(status.name) is not None:
                        continue
                    labels = (status.namespace, status.name, status.kind)
                    canary.add_metric(labels, status.traffic_percent / 100 if status.canary_version else 0.0)
                    since = m._started.get(status.key)
                    if since is not None and status.phase not in FINAL_PHASES:
                        started.add_metric(labels, since)
                    gates = m._gates.get(status.key)
                    for gate, (measured, limit) in (gates[1] if gates else {}).items():
                        value.add_metric((status.namespace, status.name, gate), measured)
                        if limit is not None:
                            budget.add_metric((status.namespace, status.name, gate), limit)
                for (phase, kind), count in counts.items():
                    workflows.add_metric((phase, kind), count)
                running.add_metric((), in_progress)
        except Exception:  # noqa: BLE001 - a scrape still gets the rest
            log.debug("metrics-collect-failed", exc_info=True)
        yield from (workflows, canary, running, started, value, budget, fetched)


class _StepInterceptor(Interceptor):
    def __init__(self, metrics: ControlPlaneMetrics) -> None:
        self._metrics = metrics

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _StepTimer(next, self._metrics)


class _StepTimer(ActivityInboundInterceptor):
    def __init__(self, next: ActivityInboundInterceptor, metrics: ControlPlaneMetrics) -> None:
        super().__init__(next)
        self._metrics = metrics

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        started = time.perf_counter()
        outcome = "error"
        try:
            result = await self.next.execute_activity(input)
            outcome = "ok"
            return result
        except asyncio.CancelledError:
            outcome = "cancelled"
            raise
        finally:
            try:
                step = activity.info().activity_type
            except Exception:  # noqa: BLE001
                step = "unknown"
            self._metrics.step_finished(step, outcome, time.perf_counter() - started)
