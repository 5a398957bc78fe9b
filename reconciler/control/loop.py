"""The reconcile loop: fetch, load, plan, start one saga per drift.

Woken every `interval` seconds, by `POST /hooks/git`, and when a saga ends (so the newest spec
of a WorkflowRun whose saga was running is picked up at once). A commit whose specs are invalid
changes nothing that runs: the problems are recorded with the commit and shown in status.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, NamedTuple

from plnt.core import telemetry
from plnt.core.routes import preview_of
from plnt.core.specs.loader import Problem, SpecSet
from plnt.core.specs.models import Deployable, PlntBackend
from plnt.core.status import FINAL_PHASES, Phase, Pin
from plnt.reconciler.bulk import in_bulk_thread
from plnt.reconciler.control.metrics import ControlPlaneMetrics
from plnt.reconciler.control.pins import PinRefused, PinRequest, promoting_commit
from plnt.reconciler.drivers.helm import model_step_timeouts, runner_step_timeouts
from plnt.reconciler.drivers.protocol import ReleaseDriver
from plnt.reconciler.errors import PlntError
from plnt.reconciler.plan.diff import Action, DesiredRun, LiveRun, PlanItem, PlanMemo, live_from
from plnt.reconciler.plan.placement import (
    GpusFree,
    Observed,
    Placement,
    gpu_backends,
    place_commit,
    with_gpu_readings,
    with_placements,
)
from plnt.reconciler.review.approval import ApprovalGate
from plnt.reconciler.saga.history import MAX_ROLLOUTS, NoSaga, saga_rollouts
from plnt.reconciler.saga.io import RolloutTarget, SagaInput
from plnt.reconciler.saga.launch import SagaLauncher, poll
from plnt.reconciler.saga.smoke_progress import follow_smoke_progress
from plnt.reconciler.settings import Settings
from plnt.reconciler.source.commit_trust import CommitVerifier
from plnt.reconciler.source.git import GitSource, redact
from plnt.reconciler.source.kubernetes import KubernetesSource
from plnt.reconciler.state import LiveWorkflow, Release, StateDir, atomic_write_json, read_json
from plnt.reconciler.status_store import StatusStore
from temporalio.client import Client

log = logging.getLogger(__name__)

# Problems kept in status and GET /source for one invalid commit (10,000 bad files would make every
# status write megabytes); `plnt validate` lists them all.
MAX_SHOWN_PROBLEMS = 100


class _Placed(NamedTuple):
    """The placements last decided, with what they were decided from (see Reconciler._placements)."""

    commit: str
    specs: SpecSet
    stables: dict[str, Release]
    serving: frozenset[str]  # the held runs, placed as the spec their stable serves
    placements: dict[str, Placement]
    current: dict[str, dict[str, int]]  # replicas per backend where they run


class Reconciler:
    def __init__(
        self,
        *,
        settings: Settings,
        source: GitSource | KubernetesSource,
        client: Client,
        statuses: StatusStore,
        driver: ReleaseDriver,
        state: StateDir,
        verifier: CommitVerifier | None = None,
        approval: ApprovalGate | None = None,
        metrics: ControlPlaneMetrics | None = None,
    ) -> None:
        self._settings = settings
        self._verifier = verifier
        self._approval = approval  # --require-approval
        self.metrics = metrics or ControlPlaneMetrics()  # passes, fetches, commits seen (reconciler/control/metrics.py)
        self._source = source
        self._client = client
        self._statuses = statuses
        self._driver = driver
        self._state = state
        self._wake = asyncio.Event()  # a saga ended (a light pass), or wake() (a full one)
        self._full_pass_due = True
        self._fetched: str | None = None  # the commit the last fetch found
        self._last_full = 0.0  # (loop time) of the last full pass
        self._sagas = SagaLauncher(client, settings.temporal.task_queue, self._wake)
        self._loaded: tuple[str, SpecSet, list[Problem]] | None = None
        self._desired_at: tuple[str, SpecSet, dict[str, DesiredRun]] | None = None
        # The specs of the last commit this loop reconciled: while a newer commit is refused, they are
        # what plnt keeps enforcing (drift healed), read again from the clone after a restart.
        self._trusted: tuple[str, SpecSet] | None = None
        # The inputs of the last pass that found everything in sync, and its plan (see reconcile_once).
        self._quiet: tuple[Any, ...] | None = None
        self._quiet_items: list[PlanItem] = []
        self._plan = PlanMemo()
        self._placed: _Placed | None = None  # see _placements
        # Measured load per backend for placement (each local replica's GET /load), or None.
        self.observe: Callable[[Mapping[str, LiveWorkflow], Mapping[str, Mapping[str, int]]],
                               Awaitable[Mapping[str, Observed]]] | None = None
        # Free GPUs per class and Node of each backend whose cluster reports them (Kubernetes backends:
        # their Nodes less the pods' requests, reconciler/drivers/gpu_headroom.py), or why not (a string).
        self.observe_gpus: Callable[[Mapping[str, PlntBackend]], Awaitable[Mapping[str, GpusFree | str]]] \
            | None = None
        self.source_status: dict[str, Any] = read_json(state.source_file, default={}) or {}
        # Called with (commit, specs) for every valid commit a pass reconciles (e.g. --mirror-status).
        self.spec_listeners: list[Callable[[str, SpecSet], None]] = []
        # Called (no arguments) after source_status changed: it is read then, e.g. to report a refusal.
        self.source_listeners: list[Callable[[], None]] = []
        self._refused: set[str] = set()  # --source kubernetes: the objects the last pass refused
        self._scaling: dict[str, asyncio.Task[None]] = {}  # scales in place under way, by key (see _scale)

    # --- loop --------------------------------------------------------------------------------

    def wake(self) -> None:
        if self._approval is not None:  # a webhook may mean a review was submitted: judge a held commit again
            self._approval.recheck()
        self._full_pass_due = True
        self._wake.set()

    async def run(self, stop: asyncio.Event) -> None:
        await self.adopt_running_sagas()
        progress = asyncio.create_task(follow_smoke_progress(self._client, self._statuses, stop), name="smoke-progress")
        try:
            await self._loop(stop)
        finally:
            progress.cancel()
            await asyncio.gather(progress, return_exceptions=True)

    async def _loop(self, stop: asyncio.Event) -> None:
        self._last_full = asyncio.get_running_loop().time()
        await poll(stop, self._wake, self._settings.source.interval_s, self._pass, what="reconcile",
                   on_skipped=lambda exc: self._record_source(error=str(exc)))

    async def _pass(self) -> None:
        # Full when asked (a webhook, the interval) or when the interval passed since the last
        # full one: saga ends that keep waking the loop must not keep it from fetching.
        now = asyncio.get_running_loop().time()
        full = self._full_pass_due or now - self._last_full >= self._settings.source.interval_s
        self._full_pass_due = False
        if full:
            self._last_full = now
        started, outcome = time.perf_counter(), "error"
        try:
            await self.reconcile_once(full=full)
            outcome = "ok"
        except PlntError:
            outcome = "skipped"
            raise
        finally:
            self.metrics.pass_finished(full, outcome, time.perf_counter() - started)

    async def close(self) -> None:
        for task in self._scaling.values():
            task.cancel()
        await asyncio.gather(*self._scaling.values(), return_exceptions=True)
        await self._sagas.close()

    @property
    def running_sagas(self) -> set[str]:
        return self._sagas.running

    @property
    def plans_made(self) -> int:
        """How often a pass asked the plan (a pass with nothing changed skips it)."""
        return self._plan.plans

    # --- one pass ----------------------------------------------------------------------------

    async def reconcile_once(self, *, full: bool = True) -> list[PlanItem]:
        """One pass. A light one (full=False: woken by a saga's end, to start the next sagas) plans
        the commit the last fetch found and leaves drift to the next full pass: during a rollout of
        1,000 WorkflowRuns a saga ends every few hundred ms, and each full pass is a `git fetch`
        and a check of every runner."""
        pass_started_ns = time.time_ns()  # a pass that starts sagas is traced, from here (telemetry)
        if full or self._fetched is None:
            self._fetched = await self._fetch()
        commit = self._fetched
        if self._verifier is not None and self._verifier.mode != "none":
            untrusted = await asyncio.to_thread(self._verifier.first_untrusted, self._source.git_dir, commit,
                                                self.source_status.get("lastReconciledCommit"))
            if untrusted is not None:
                return await self._refuse(commit, [untrusted.problem()], [], full=full,
                                          untrusted=untrusted.model_dump(mode="json"))
        specs, problems = await self._load(commit)
        if problems:
            return await self._refuse(commit, [str(p) for p in problems], [str(w) for w in specs.warnings], full=full)
        if self._approval is not None:  # after the specs check: an invalid commit is reported as invalid
            held = await self._approval.first_unapproved(commit, self.source_status.get("lastReconciledCommit"))
            if held is not None:  # like an untrusted commit: nothing running changes
                return await self._refuse(commit, [held.problem()], [str(w) for w in specs.warnings], full=full,
                                          held=held.model_dump(mode="json"))
        self._trusted = (commit, specs)
        self._driver.assign(specs)
        for listener in self.spec_listeners:
            listener(commit, specs)
        refused = self._note_refused(commit)
        desired = self._desired(commit, specs)
        self._release_pins(desired)
        releases = await self._driver.live()
        quiet = self._quiet_inputs(commit, specs, releases)
        if quiet is not None and quiet == self._quiet:
            # Nothing the plan reads changed since a pass that found everything in sync: the plan
            # would be the same, with nothing to do. Drift is still checked (and healed) every full pass.
            if full:
                await self._heal_drift(specs)
            self._record_source(commit=commit, reconciled=True, warnings=[str(w) for w in specs.warnings])
            return self._quiet_items
        self._quiet = None
        # Preview releases (`<name>--pr<N>`) belong to the PreviewController (reconciler/review/previews.py).
        items = self._plan.plan(desired, releases, self._statuses.all(), self._sagas.fingerprints,
                                keep=lambda key: preview_of(key.split("/", 1)[1]) is None)
        placements, current = await self._placements(commit, specs, releases, self._serving(items))
        items = with_placements(items, placements, current)
        in_sync = all(item.action is Action.UNCHANGED and not item.waiting for item in items)
        budget = self._settings.temporal.max_concurrent_sagas - len(self._sagas)
        live_unknown = getattr(self._driver, "live_unknown", lambda key: None)
        starts = []
        for item in items:
            if item.key in refused:
                continue  # its spec is refused (--source kubernetes): nothing is planned, what runs keeps running
            unknown = live_unknown(item.key)
            if unknown is not None and item.key not in self._sagas and self._was_deployed(item.key):
                self._hold_unknown(item, unknown)
            elif item.unplaceable is not None and item.action is not Action.UNCHANGED and not item.waiting:
                self._note_unplaceable(item, specs, commit)
            elif item.supersedes:
                await self._sagas.cancel(item.namespace, item.name,
                                         why="a newer commit changed it; cancelling the running saga")
            elif item.needs_saga and self._scale_under_way(item.key):
                continue  # its release is changing in place: the scale's end wakes the loop, whose plan decides
            elif item.needs_saga and budget > 0:
                starts.append(self._start_saga(item, specs, commit))
                budget -= 1
            elif item.action is Action.SCALE and not item.waiting:
                self._start_scale(item, specs, commit)
            elif item.action is Action.UNCHANGED and not item.waiting:
                self._observe(item, commit)
        # All of this pass's sagas are started at once: each start is a Temporal round trip, and a
        # commit changing many WorkflowRuns should not start them one after the other. (Each writes
        # its Pending status before its first await, so in plan order.) A failed start fails the
        # pass, as before, once the others were started.
        if starts and telemetry.ENABLED:
            # The trace of a rollout starts here: the commit seen, then one saga per WorkflowRun it changes.
            with telemetry.span("reconcile", {"plnt.commit": commit, "plnt.sagas": len(starts),
                                              "plnt.commit.previous": self.source_status.get("lastReconciledCommit")},
                                start_time=pass_started_ns):
                done = await asyncio.gather(*starts, return_exceptions=True)
        else:
            done = await asyncio.gather(*starts, return_exceptions=True)
        failed = [r for r in done if isinstance(r, BaseException)]
        if failed:
            raise failed[0]
        if in_sync and not any(live_unknown(item.key) for item in items):
            # Taken after the pass (its status updates included): the next pass compares with it.
            self._quiet, self._quiet_items = self._quiet_inputs(commit, specs, releases), items
        if full:
            await self._heal_drift(specs)
        self._record_source(commit=commit, reconciled=True, warnings=[str(w) for w in specs.warnings])
        return items

    async def _fetch(self) -> str:
        started = time.perf_counter()
        try:
            commit = await asyncio.to_thread(self._source.fetch)
        except Exception:  # (a cancelled fetch, at shutdown, is no fetch error)
            self.metrics.fetch_finished(False, time.perf_counter() - started)
            raise
        self.metrics.fetch_finished(True, time.perf_counter() - started)
        self.metrics.commit_seen(commit)
        return commit

    def _quiet_inputs(self, commit: str, specs: SpecSet, releases: dict[str, Any]) -> tuple[Any, ...] | None:
        """What a plan reads besides the commit's specs (the SpecSet object is kept per commit), or
        None when it cannot be told cheaply (a status store without a revision, a live state not known)."""
        revision = getattr(self._statuses, "revision", None)
        unknown = getattr(self._driver, "any_live_unknown", None)
        if revision is None or (unknown is not None and unknown()) or \
                (unknown is None and hasattr(self._driver, "live_unknown")):
            return None
        return commit, id(specs), revision, dict(self._sagas.fingerprints), releases

    async def live_runs(self) -> dict[str, LiveRun]:
        return live_from(await self._driver.live(), self._statuses.all(), self._sagas.fingerprints)

    async def adopt_running_sagas(self) -> None:
        """After a restart, follow the sagas Temporal is still running instead of starting new ones
        (not a preview's: the PreviewController follows its own)."""
        await self._sagas.adopt(status for status in self._statuses.all() if preview_of(status.name) is None)

    # --- internals ---------------------------------------------------------------------------

    async def _load(self, commit: str) -> tuple[SpecSet, list[Problem]]:
        if self._loaded is None or self._loaded[0] != commit:
            # Reading and parsing in a thread: a large (or hostile, see SpecLimits) commit must not
            # stall the gateway, which serves from this loop; a low-priority one, so that it does
            # not take the CPU from gateway workers and runners either.
            specs, problems = await in_bulk_thread(self._read_specs, commit)
            for warning in specs.warnings:  # once per commit, as the commit is loaded once
                log.warning("commit-warning commit=%s %s", commit[:12], warning)
            self._loaded = (commit, specs, problems)
        return self._loaded[1], self._loaded[2]

    def _desired(self, commit: str, specs: SpecSet) -> dict[str, DesiredRun]:
        """The desired side of the plan, built once per commit (a fingerprint is a JSON dump of the spec)."""
        if self._desired_at is None or self._desired_at[0] != commit or self._desired_at[1] is not specs:
            self._desired_at = (commit, specs, {key: DesiredRun.from_spec(run) for key, run in specs.deployables().items()})
        return self._desired_at[2]

    def _read_specs(self, commit: str) -> tuple[SpecSet, list[Problem]]:
        limits = self._settings.spec_limits
        return self._source.load(commit, limits)

    async def _start_saga(self, item: PlanItem, specs: SpecSet, commit: str) -> None:
        run = specs.deployable(item.key)
        if item.action is Action.UNINSTALL or run is None:
            saga = SagaInput(action="uninstall", namespace=item.namespace, name=item.name, commit=commit,
                             retry=self._settings.temporal.retry)
        else:
            # The input names the commit; the saga's activities read the spec, its backend and the
            # trust policies from plnt's own clone at that commit (it carries none of them).
            saga = self._deploy_input(run, commit)
            if self._statuses.get(item.key) is None:
                self._statuses.update_nowait(item.namespace, item.name, phase=Phase.PENDING, observed_commit=commit,
                                             attempted_version=saga.version, message=f"{item.action.value}: {item.reason}",
                                             kind=run.kind)
        # Around the start: Temporal's interceptor puts StartWorkflow, then the saga's spans, under this span.
        traced = telemetry.span(f"saga {item.key}", {
            "plnt.workflow": item.name, "plnt.namespace": item.namespace, "plnt.version": saga.version,
            "plnt.commit": commit, "plnt.action": saga.action, "plnt.reason": item.reason,
        }) if telemetry.ENABLED else contextlib.nullcontext()
        if await self._sagas.start(item.key, saga, traced):
            # Where a pool's (or a backend with declared capacity's) replicas go and why, as the plan says it.
            placed = f" placement={'; '.join(item.placement)!r}" if item.placement else ""
            log.info("saga-started workflowrun=%s action=%s version=%s commit=%s reason=%r%s",
                     item.key, item.action.value, item.to_version or item.from_version, commit[:12], item.reason, placed)

    def _deploy_input(self, run: Deployable, commit: str, **more: Any) -> SagaInput:
        """The input of a saga deploying `run` as commit `commit` has it."""
        retry = self._settings.temporal.retry
        if run.kind == "ModelDeployment":
            # A model release's helm --wait covers the weights fetch and the server's start
            # (model_install_timeout_s), far longer than a runner's: its install and promote steps
            # get that plus a margin. Given here, in the saga's input, and not by raising the
            # defaults: a runner's steps keep their 3 minutes, and saga/workflow.py is unchanged, so recorded
            # histories replay as they were (their input carries the timeouts they ran with).
            retry = retry.model_copy(update={"step_timeouts": model_step_timeouts(
                retry.step_timeouts, self._settings.kubernetes.model_install_timeout_s)})
        else:  # a raised runner install timeout (kubernetes.install_timeout_s) raises its steps' too
            retry = retry.model_copy(update={"step_timeouts": runner_step_timeouts(
                retry.step_timeouts, self._settings.kubernetes.install_timeout_s)})
        if run.spec.backend.pooled and "placement" not in more:  # where the replicas go (the install checks it)
            placed = self._placed.placements.get(run.key) if self._placed is not None else None
            more["placement"] = placed.counts() if placed is not None and placed.placed else None
        return SagaInput(action="deploy", namespace=run.metadata.namespace, name=run.metadata.name, commit=commit,
                         fingerprint=run.fingerprint(), version=run.version, retry=retry, **more)

    async def pin(self, namespace: str, name: str, request: PinRequest) -> str:
        """A person's emergency pin (reconciler/control/pins.py): deploy `request.version` again at once
        from the commit that last promoted it, and hold it until a commit naming it lands. PinRefused
        says why not (a rollout under way, a version never promoted, its commit no longer that release)."""
        key = f"{namespace}/{name}"
        if key in self._sagas:
            raise PinRefused(f"a rollout of {key} is under way: abort it first (plnt rollout abort {name}), then pin")
        try:
            rollouts = await saga_rollouts(self._client, namespace, name, MAX_ROLLOUTS)
        except NoSaga as exc:
            raise PinRefused(f"{exc}: there is no release to pin") from exc
        commit = promoting_commit(rollouts, request.version)
        if commit is None:
            raise PinRefused(f"plnt never promoted {request.version} for {key}, so there is no release of it to pin at "
                             f"once; roll back through git alone (plnt rollback without --now)")
        specs, _ = await in_bulk_thread(self._read_specs, commit)
        run = specs.deployable(key)
        if run is None or run.version != request.version:
            raise PinRefused(f"commit {commit[:12]}, which promoted {request.version}, does not read as that release "
                             "now (its specs no longer load); roll back through git alone (plnt rollback without --now)")
        pin = Pin(version=request.version, commit=commit, by=request.by, reason=request.reason, at=time.time())
        self._statuses.update(namespace, name, pin=pin, message=f"drift: {pin.drift()}")
        live = (await self._driver.live()).get(key)
        if live is not None and live.stable is not None and live.stable.spec_fingerprint == run.fingerprint():
            return f"{key} serves {request.version} already; pinned until the commit naming it lands"
        target = RolloutTarget(commit=commit, fingerprint=run.fingerprint(), by=request.by,
                               reason=request.reason or "emergency pin")
        saga = self._deploy_input(run, commit, promote_at_once=target)
        if not await self._sagas.start(key, saga):
            raise PinRefused(f"a rollout of {key} started meanwhile: abort it (plnt rollout abort {name}), then pin")
        log.warning("pin workflowrun=%s version=%s commit=%s by=%r: promoting it at once", key, request.version,
                    commit[:12], request.by)
        return f"pinning {key} to {request.version} (as commit {commit[:12]} deployed it): promoted once installed"

    def _release_pins(self, desired: dict[str, DesiredRun]) -> None:
        """A pin ends when the commit naming its version lands (or its resource leaves the repository)."""
        for status in self._statuses.all():
            if status.pin is None:
                continue
            want = desired.get(status.key)
            if want is None or want.version == status.pin.version:
                log.info("pin-released workflowrun=%s version=%s: the commit naming it landed", status.key,
                         status.pin.version)
                self._statuses.update_nowait(status.namespace, status.name, pin=None,
                                             message=f"pin to {status.pin.version} released: the commit landed")

    def _scale_under_way(self, key: str) -> bool:
        running = self._scaling.get(key)
        return running is not None and not running.done()

    def _start_scale(self, item: PlanItem, specs: SpecSet, commit: str) -> None:
        """Scale in place, in the background (a model server takes seconds to load): one at a time per
        WorkflowRun; its end wakes the loop, whose next plan sees the new count."""
        if self._scale_under_way(item.key):
            return
        task = asyncio.create_task(self._scale(item, specs, commit), name=f"scale {item.key}")
        self._scaling[item.key] = task

        def done(_: asyncio.Task[None]) -> None:
            if self._scaling.get(item.key) is task:
                del self._scaling[item.key]
            self._wake.set()

        task.add_done_callback(done)

    async def _scale(self, item: PlanItem, specs: SpecSet, commit: str) -> None:
        """The plan's "scale": the live release runs `to_replicas` processes (pods), no saga: the same
        release, whose version is proven. The status records the spec it now serves (so a later change
        is named against it) and the count."""
        run, replicas = specs.deployable(item.key), item.to_replicas
        if run is None or replicas is None:
            return
        try:
            if item.replicas_by_backend:  # a pool's: each replica where it is placed (moved, added, stopped)
                release = await self._driver.place_replicas(  # type: ignore[attr-defined]
                    item.namespace, item.name, dict(item.replicas_by_backend))
            else:
                release = await self._driver.set_replicas(item.namespace, item.name, replicas)
        except PlntError as exc:
            log.error("scale-failed workflowrun=%s replicas=%s error=%s", item.key, replicas, exc)
            self._statuses.update_nowait(item.namespace, item.name,
                                         message=f"scale {item.from_replicas} -> {replicas} failed: {exc}")
            return
        log.info("scaled workflowrun=%s replicas=%s -> %s commit=%s reason=%r", item.key, item.from_replicas, replicas,
                 commit[:12], item.reason)
        # A held run's stable moved: it still serves the spec deployed before the one that failed, and
        # its status keeps saying why it is held.
        if not item.held and self._statuses.get(item.key) is not None:
            self._statuses.update_nowait(item.namespace, item.name, observed_commit=commit,
                                         deployed_spec=run.spec.model_dump(mode="json", by_alias=True),
                                         message=f"{release.version} scaled {item.from_replicas} -> {replicas} replicas")

    async def _heal_drift(self, specs: SpecSet) -> None:
        """Releases that stopped running out of band are restored (selfHeal, the default) or reported."""
        for key, releases in (await self._driver.drift()).items():
            run = specs.deployable(key)
            if run is None or key in self._sagas:
                continue  # being removed, or a saga owns it right now
            what = ", ".join(f"{r.track} {r.version}" for r in releases)
            if run.spec.self_heal:
                healed = await self._driver.repair(run.metadata.namespace, run.metadata.name)
                if not healed:
                    continue  # could not restart (logged by the driver), or a worker was asked already
                log.warning("drift-healed workflowrun=%s restored=%s", key, ", ".join(r.release_id for r in healed))
                status = self._statuses.get(key)
                if status is not None:
                    self._statuses.update(run.metadata.namespace, run.metadata.name,
                                          message=f"drift healed: {what} was not running and was restarted",
                                          endpoint=next((r.endpoint for r in healed if r.track == "stable"), status.endpoint))
            else:
                message = f"drift: {what} is not running (selfHeal: false, so plnt only reports it)"
                status = self._statuses.get(key)
                if status is not None and status.message != message:
                    log.warning("drift-detected workflowrun=%s releases=%s selfHeal=false", key, what)
                    self._statuses.update(run.metadata.namespace, run.metadata.name, message=message)

    def _note_refused(self, commit: str) -> dict[str, str]:
        """--source kubernetes: each object the revision refused gets its reason in its status
        (beside what it still serves), and the row of a refused object never deployed goes once the
        object leaves the cluster. Git refuses a whole commit instead (_reject)."""
        if not isinstance(self._source, KubernetesSource):
            return {}
        snapshot = self._source.snapshot(commit)
        for key, why in snapshot.refused.items():
            listed = snapshot.objects[key]
            status = self._statuses.get(key)
            if status is None or status.version is None:
                fields: dict[str, Any] = dict(phase=Phase.FAILED, message=why, last_error=why)
            else:
                fields = dict(message=f"{status.phase.value} {status.version}; {why}", last_error=why)
            if status is None or any(getattr(status, name) != value for name, value in fields.items()):
                if status is None or status.phase is not Phase.FAILED:
                    log.warning("object-refused workflowrun=%s reason=%r", key, why)
                self._statuses.update_nowait(listed.namespace, listed.name, observed_commit=commit, kind=listed.kind,
                                             **fields)
        for key in self._refused - set(snapshot.refused) - set(snapshot.objects):
            status = self._statuses.get(key)
            if status is not None and status.deployed_fingerprint is None and key not in self._sagas:
                self._statuses.remove(status.namespace, status.name)
        self._refused = set(snapshot.refused)
        return snapshot.refused

    async def _placements(self, commit: str, specs: SpecSet, releases: dict[str, Any],
                          serving: dict[str, dict[str, Any]]) -> tuple[dict[str, Placement], dict[str, dict[str, int]]]:
        """Where every run's replicas go at this commit (reconciler/plan/placement.py), and where they
        run now (replicas per backend), decided again when the commit, a stable release (its replicas
        started, stopped or moved) or the runs held (`serving`: placed as the spec their stable serves)
        change. A pool's release records each replica's backend; a release on one backend runs its
        replicas there. The measured load (`observe`) is read then, not on every pass: it only orders
        the backends new replicas go to. So are the free GPUs the backends' clusters report
        (`observe_gpus`), when a run asks for GPUs."""
        stables = {key: live.stable for key, live in releases.items() if live.stable is not None}
        placed = self._placed
        if placed is not None and placed.commit == commit and placed.specs is specs \
                and placed.serving == serving.keys() and placed.stables.keys() == stables.keys() \
                and all(placed.stables[key] is stable for key, stable in stables.items()):
            return placed.placements, placed.current
        current: dict[str, dict[str, int]] = {}
        for key, stable in stables.items():
            if stable.placement is not None:
                current[key] = stable.replicas_by_backend()
                continue
            status = self._statuses.get(key)
            deployed = status.deployed_spec if status is not None else None
            cluster = (deployed or {}).get("backend", {}).get("cluster")
            if isinstance(cluster, str):  # where plnt last promoted it, with the replicas it runs
                current[key] = {cluster: stable.replicas}
        observed = await self._observe_backends(releases, current)
        observed = await self._observe_gpus(specs, observed or {}) or observed
        self._placed = _Placed(commit, specs, stables, frozenset(serving),
                               place_commit(specs, current, observed, serving), current)
        return self._placed.placements, current

    def _serving(self, items: list[PlanItem]) -> dict[str, dict[str, Any]]:
        """Held runs (their spec in git failed) by key, each with the spec its stable release serves."""
        out = {}
        for item in items:
            status = self._statuses.get(item.key) if item.held else None
            if status is not None and status.deployed_spec:
                out[item.key] = status.deployed_spec
        return out

    async def _observe_backends(self, releases: dict[str, Any],
                          current: Mapping[str, Mapping[str, int]]) -> dict[str, Observed] | None:
        """The measured load per backend (requests in flight and queued), from `observe` when this
        plnt has one (the replicas' own counts); a failed or missing reading is "unknown": the
        placement then goes by declared capacity alone."""
        if self.observe is None:
            return None
        try:
            return dict(await self.observe(releases, current))
        except Exception as exc:  # (a reading is an optimisation: never a reason to stop placing)
            log.warning("placement-observe-failed error=%s (placing by declared capacity)", exc)
            return None

    async def _observe_gpus(self, specs: SpecSet, observed: dict[str, Observed]) -> dict[str, Observed] | None:
        """`observed` with the free GPUs of the backends that runs asking for GPUs may use, as their
        clusters report them; a backend that could not be read is "unknown" (declared capacity
        counts, and the placement's reason says so). None when nothing was read."""
        if self.observe_gpus is None:
            return None
        backends = gpu_backends(specs)
        if not backends:
            return None
        try:
            readings = await self.observe_gpus(backends)
        except Exception as exc:  # (a reading is an optimisation: never a reason to stop placing)
            log.warning("placement-gpus-failed error=%s (placing by declared capacity)", type(exc).__name__)
            return None
        return with_gpu_readings(observed, readings)

    def _note_unplaceable(self, item: PlanItem, specs: SpecSet, commit: str) -> None:
        """An install or upgrade whose replicas do not fit: no saga; the missing capacity in its status,
        beside what it still serves (Failed when nothing of it runs). Not held like a failed saga: the
        spec is tried again as soon as the capacity is there (a backend added, another release gone)."""
        why = f"cannot be placed: {item.unplaceable}"
        status = self._statuses.get(item.key)
        if status is None or status.version is None:
            fields: dict[str, Any] = dict(phase=Phase.FAILED, message=why, last_error=why)
        else:
            fields = dict(message=f"{status.phase.value} {status.version} keeps serving; {why}", last_error=why)
        if status is None or any(getattr(status, name) != value for name, value in fields.items()):
            log.warning("plan-unplaceable workflowrun=%s reason=%r", item.key, item.unplaceable)
            run = specs.deployable(item.key)
            self._statuses.update_nowait(item.namespace, item.name, observed_commit=commit,
                                         **({"kind": run.kind} if run is not None else {}), **fields)

    def _was_deployed(self, key: str) -> bool:
        """Status says plnt deployed it: then "not seen" on an unreadable backend is not "gone". (A
        WorkflowRun never deployed goes ahead: its saga's first helm call says what is wrong.)"""
        status = self._statuses.get(key)
        return status is not None and status.deployed_fingerprint is not None

    def _hold_unknown(self, item: PlanItem, why: str) -> None:
        """Nothing is planned for a WorkflowRun whose live state cannot be read: it is not gone."""
        message = f"{why}; nothing is planned for it until the backend can be read"
        status = self._statuses.get(item.key)
        if status is not None and status.message != message:
            log.warning("plan-held workflowrun=%s reason=%r", item.key, why)
            self._statuses.update(item.namespace, item.name, message=message)

    def _observe(self, item: PlanItem, commit: str) -> None:
        status = self._statuses.get(item.key)
        if status is None or status.phase not in FINAL_PHASES:
            return
        fields: dict[str, Any] = {"observed_commit": commit}
        if item.reason.startswith("drift:"):
            fields.update(message=item.reason)
        elif status.phase is Phase.READY:
            fields.update(message=f"{status.version} in sync", last_error=None)
        elif item.reason.startswith("in sync") and status.version is not None:
            # What failed is no longer asked for (e.g. the commit was reverted): the stable release is the spec.
            fields.update(phase=Phase.READY, message=f"{status.version} in sync", last_error=None)
        else:  # RolledBack or Failed, and held until the spec changes
            fields.update(message=item.reason)
        if any(getattr(status, field) != value for field, value in fields.items()):
            self._statuses.update_nowait(item.namespace, item.name, **fields)

    async def _refuse(self, commit: str, problems: list[str], warnings: list[str], *, full: bool,
                      untrusted: dict[str, Any] | None = None, held: dict[str, Any] | None = None) -> list[PlanItem]:
        """A refused commit (invalid, untrusted, held for approval) changes nothing that runs, and
        stops nothing from being enforced: the last reconciled commit's releases are still healed
        (before the statuses are written, so that they end on what is refused, beside what serves)."""
        if full:
            trusted = await self._last_trusted_specs()
            if trusted is not None:
                await self._heal_drift(trusted)
        self._reject(commit, problems, warnings, untrusted=untrusted, held=held)
        return []

    async def _last_trusted_specs(self) -> SpecSet | None:
        """The specs of the last reconciled commit: kept from the pass that reconciled it, or read
        again from the clone (a restart while the newest commit is refused)."""
        commit = self.source_status.get("lastReconciledCommit")
        if not isinstance(commit, str):
            return None  # nothing was ever reconciled: nothing plnt deployed to keep running
        if self._trusted is None or self._trusted[0] != commit:
            try:
                specs, problems = await in_bulk_thread(self._read_specs, commit)
            except Exception as exc:  # noqa: BLE001 - e.g. gone from the clone after a force-push: heal nothing, report the refusal
                log.warning("trusted-specs-unreadable commit=%s error=%s", commit[:12], redact(str(exc)))
                return None
            if problems:  # it was valid when reconciled; a stricter plnt may disagree: heal nothing then
                log.warning("trusted-specs-invalid commit=%s first=%r", commit[:12], str(problems[0]))
                return None
            self._trusted = (commit, specs)
            self._driver.assign(specs)  # (after a restart: the driver has seen no specs yet)
        return self._trusted[1]

    def _reject(self, commit: str, problems: list[str], warnings: list[str], *,
                untrusted: dict[str, Any] | None = None, held: dict[str, Any] | None = None) -> None:
        """Nothing running changes: the commit's problems go to GET /source and every status, beside
        what each still serves ("Ready 1.2.0; commit abc123 is held: ...")."""
        lines = problems[:MAX_SHOWN_PROBLEMS]
        if self.source_status.get("newestCommit") != commit or self.source_status.get("problems") != lines:
            log.error("commit-%s commit=%s problems=%d first=%r (nothing running was changed)",
                      "untrusted" if untrusted else "held" if held else "invalid", commit[:12], len(problems), lines[0])
        self._record_source(commit=commit, problems=lines, warnings=warnings, untrusted=untrusted, held=held)
        summary = (lines[0] if untrusted or held else
                   f"commit {commit[:12]} is invalid ({len(problems)} problem{'s' if len(problems) != 1 else ''}): {lines[0]}")
        for status in self._statuses.all():
            if preview_of(status.name) is not None:
                continue  # a preview is its PR's
            message = f"{status.phase.value} {status.version}; {summary}" if status.version else summary
            if status.message != message:
                self._statuses.update(status.namespace, status.name, message=message, last_error="\n".join(lines))

    def _record_source(self, *, commit: str | None = None, problems: list[str] | None = None,
                       reconciled: bool = False, error: str | None = None, warnings: list[str] | None = None,
                       untrusted: dict[str, Any] | None = None, held: dict[str, Any] | None = None) -> None:
        new = dict(self.source_status)
        if commit is not None:
            new["untrusted"] = untrusted  # the verdict of the first untrusted commit (--verify-commits)
            if self._approval is not None or "held" in new:
                new["held"] = held  # the verdict of the first unapproved commit (--require-approval)
        # source.url holds no credentials; errors may quote a URL that does (git echoes them).
        new.update({"repo": redact(self._source.url), "branch": self._source.branch, "path": self._source.path})
        if commit is not None:
            new["newestCommit"] = commit
            new["problems"] = problems or []
            new["warnings"] = warnings or []
        if reconciled:
            new["lastReconciledCommit"] = commit
        new["fetchError"] = redact(error) if error is not None else None
        if new != self.source_status:
            self.source_status = new
            atomic_write_json(self._state.source_file, new)
            for listener in self.source_listeners:
                listener()

