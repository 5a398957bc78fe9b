"""Local runners when the roles run apart: the worker hosts them, the reconciler learns of them.

`plnt worker` starts and stops runner processes (the saga's install, promote and remove run there),
so only it can see them. It reports them to the reconciler's control API (`PUT /internal/runners`,
the internal token): at once after each change, and every few seconds as a heartbeat that also
carries the releases whose runner is not running (drift). The reconciler answers with the
WorkflowRuns whose drift it wants healed (selfHeal), and the worker restarts those, with the
replica counts it wants (a scale in place), which the worker sets, and with the placements it wants
for a pool's replicas (a re-placement in place), which the worker applies.

On the reconciler, `ReportedRunners` stands in for the local driver in the DriverSet: its live state
is the last report. Until a worker has reported since the reconciler started, that state is unknown,
not empty: nothing is restored or uninstalled on the strength of a report that has not come yet.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable

import httpx
from plnt.reconciler.drivers.protocol import InstallRequest
from plnt.reconciler.errors import DriverError, PlntError
from plnt.reconciler.redact import redact
from plnt.reconciler.state import LiveWorkflow, Release, Track
from pydantic import BaseModel, ConfigDict, Field

log = logging.getLogger(__name__)

RUNNERS_PATH = "/internal/runners"
DRAIN_PATH = "/internal/drain"  # gateway/route_watch.py: wait until every gateway let go of a runner


class RunnerReport(BaseModel):
    """What one worker's runners are: its release records and the ones not running."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    worker: str = Field(min_length=1, max_length=253)
    live: dict[str, LiveWorkflow] = Field(default_factory=dict)
    drift: dict[str, list[Release]] = Field(default_factory=dict)


class RunnerReportReply(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    repair: list[str] = Field(default_factory=list, description="WorkflowRun keys whose drift to heal now")
    scale: dict[str, int] = Field(default_factory=dict, description="WorkflowRun key -> stable replicas to run")
    place: dict[str, dict[str, int]] = Field(
        default_factory=dict, description="WorkflowRun key -> a pool's stable replicas per backend to run")


class ReportedRunners:
    """The reconciler's view of the local runners: what the workers last reported."""

    def __init__(self, on_change: Callable[[], None] = lambda: None) -> None:
        self._reports: dict[str, RunnerReport] = {}
        self._repair: set[str] = set()
        self._scale: dict[str, int] = {}  # replica counts to ask of the worker that runs each (set_replicas)
        self._place: dict[str, dict[str, int]] = {}  # a pool's placements to ask of it (place_replicas)
        self._on_change = on_change

    # --- fed by the control API ----------------------------------------------------------------

    def accept(self, report: RunnerReport) -> RunnerReportReply:
        first = report.worker not in self._reports
        changed = self._reports.get(report.worker) != report
        self._reports[report.worker] = report
        if first:
            log.info("worker-reported worker=%s runners=%d", report.worker, len(report.live))
        for key in report.live:
            others = [w for w, r in self._reports.items() if w != report.worker and key in r.live]
            if others:
                log.warning("runners-reported-twice workflowrun=%s workers=%s,%s (run one worker per machine for "
                            "local backends: a release's canary and stable must be on the same one)",
                            key, report.worker, ",".join(others))
        repair = sorted(self._repair & set(report.drift))
        self._repair -= set(repair)
        scale = {key: n for key, n in self._scale.items() if key in report.live}
        for key, n in scale.items():  # asked until its report shows the count
            stable = report.live[key].stable
            if stable is None or stable.replicas == n:
                del self._scale[key]
        for key, wanted in list(self._place.items()):  # asked until its report shows every replica placed
            stable = report.live[key].stable if key in report.live else None
            if key in report.live and (stable is None or (stable.placement == wanted
                                                          and stable.replicas_by_backend() == wanted)):
                del self._place[key]
        place = {key: wanted for key, wanted in self._place.items() if key in report.live}
        if changed:
            self._on_change()
        return RunnerReportReply(repair=repair, scale=scale, place=place)

    # --- the part of the driver interface the reconciler uses ---------------------------------

    def assign(self, specs: object) -> None:
        """Nothing to map: every local WorkflowRun runs on the worker that installed it."""

    def snapshot(self) -> dict[str, LiveWorkflow]:
        live: dict[str, LiveWorkflow] = {}
        for report in self._reports.values():
            live.update(report.live)
        return live

    async def live(self) -> dict[str, LiveWorkflow]:
        return self.snapshot()

    def unknown_reason(self) -> str | None:
        if self._reports:
            return None
        return "no worker has reported its local runners since this reconciler started"

    async def drift(self) -> dict[str, list[Release]]:
        drifted: dict[str, list[Release]] = {}
        for report in self._reports.values():
            drifted.update(report.drift)
        return drifted

    async def repair(self, namespace: str, name: str) -> list[Release]:
        """Asks the worker (in its next report's reply) to restart them; returns what was asked."""
        key = f"{namespace}/{name}"
        if key in self._repair:
            return []  # asked already; the worker's next report answers
        self._repair.add(key)
        return [release for report in self._reports.values() for release in report.drift.get(key, [])]

    async def install(self, request: InstallRequest) -> Release:
        raise DriverError("local runners are installed by a worker (plnt worker), not by the reconciler")

    async def promote(self, namespace: str, name: str) -> Release:
        raise DriverError("local runners are promoted by a worker (plnt worker), not by the reconciler")

    async def set_traffic(self, namespace: str, name: str, percent: int, *,
                          canary_header: tuple[str, str] | None) -> Release:
        raise DriverError("local runners' traffic is set by a worker (plnt worker), not by the reconciler")

    async def remove(self, namespace: str, name: str, track: Track) -> None:
        raise DriverError("local runners are removed by a worker (plnt worker), not by the reconciler")

    async def set_replicas(self, namespace: str, name: str, replicas: int) -> Release:
        """Asks the worker that runs it (in the reply to its next report) to run `replicas`; returns the
        release as last reported. The plan sees the new count once the worker reported it."""
        key = f"{namespace}/{name}"
        stable = self.snapshot().get(key, LiveWorkflow(namespace=namespace, name=name)).stable
        if stable is None:
            raise DriverError(f"{key}: no stable release reported to scale to {replicas} replicas")
        self._scale[key] = replicas
        return stable

    async def place_replicas(self, namespace: str, name: str, placement: dict[str, int]) -> Release:
        """Asks the worker that runs a pool's release (in the reply to its next report) to run it as
        `placement` (replicas per backend); returns the release as last reported. The plan sees the
        new placement once the worker reported it."""
        key = f"{namespace}/{name}"
        stable = self.snapshot().get(key, LiveWorkflow(namespace=namespace, name=name)).stable
        if stable is None:
            raise DriverError(f"{key}: no stable release reported to place as {placement}")
        self._place[key] = {backend: count for backend, count in placement.items() if count > 0}
        return stable


class RunnerReporter:
    """The worker's side: pushes reports, and heals what the reconciler asks it to."""

    def __init__(
        self,
        *,
        worker: str,
        control_url: str,
        token: str | None,
        local: object,
        interval_s: float = 2.0,
        timeout_s: float = 10.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._worker = worker
        self._url = control_url.rstrip("/") + RUNNERS_PATH
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._local = local  # a LocalDriver: snapshot(), drift(), repair()
        self._interval_s = interval_s
        self._timeout_s = timeout_s
        self._transport = transport
        self._now = asyncio.Event()
        self.last_ok: float | None = None
        self.unreachable_since: float | None = None

    def push_now(self) -> None:
        """Report at once (a runner started or stopped)."""
        self._now.set()

    async def drain(self, release: Release, *, timeout_s: float, grace_s: float, leaving: bool = False) -> bool:
        """Before a runner that left this worker's records stops: report that at once, then wait
        until the control plane says every gateway serves routes without it and has no request left
        on it (`POST /internal/drain`, at most `timeout_s`). A control plane that cannot say (one
        without the endpoint, or unreachable) gets the fixed `grace_s` instead. `leaving`: a Helm
        release this worker uninstalls next (no report names those: the control plane takes it out
        of the routes on this request)."""
        self.push_now()
        url = self._url.removesuffix(RUNNERS_PATH) + DRAIN_PATH
        started = time.monotonic()
        try:
            async with httpx.AsyncClient(timeout=timeout_s + self._timeout_s, transport=self._transport) as client:
                response = await client.post(url, headers=self._headers,
                                             json={"endpoint": release.endpoint, "timeout_s": timeout_s,
                                                   **({"leaving": True, "release_id": release.release_id} if leaving else {})})
            if response.status_code != 200:
                raise ValueError(f"{response.status_code} {response.text[:300]}")
            answer = response.json()
        except (httpx.HTTPError, ValueError) as exc:
            log.warning("drain-unconfirmed release=%s error=%s (waiting %.1fs instead)", release.release_id,
                        redact(str(exc)) or type(exc).__name__, grace_s)
            await asyncio.sleep(max(0.0, grace_s - (time.monotonic() - started)))
            return False
        drained = answer.get("drained") is True if isinstance(answer, dict) else False
        if drained:
            log.info("runner-drained release=%s waited=%.2fs followers=%s", release.release_id,
                     time.monotonic() - started, answer.get("followers"))
        else:
            log.warning("runner-drain-timeout release=%s lagging=%s (stopping it anyway)", release.release_id,
                        answer.get("lagging") if isinstance(answer, dict) else None)
        return drained

    async def run(self, stop: asyncio.Event) -> None:
        backoff = self._interval_s
        async with httpx.AsyncClient(timeout=self._timeout_s, transport=self._transport) as client:
            while not stop.is_set():
                self._now.clear()
                try:
                    await self._report(client)
                    backoff = self._interval_s
                    wait = self._interval_s
                except (httpx.HTTPError, ValueError) as exc:
                    if self.unreachable_since is None:
                        self.unreachable_since = time.monotonic()
                        log.warning("control-unreachable url=%s error=%s (runners keep serving; reporting again "
                                    "with backoff)", redact(self._url), redact(str(exc)) or type(exc).__name__)
                    # Capped low: a restarted reconciler holds its plan until a worker reports.
                    backoff = min(backoff * 2, max(5.0, self._interval_s))
                    wait = backoff * random.uniform(0.5, 1.0)
                stop_task = asyncio.ensure_future(stop.wait())
                now_task = asyncio.ensure_future(self._now.wait())
                try:
                    await asyncio.wait({stop_task, now_task}, timeout=wait, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    stop_task.cancel()
                    now_task.cancel()

    async def _report(self, client: httpx.AsyncClient) -> None:
        drift = await self._local.drift()  # type: ignore[attr-defined]
        report = RunnerReport(worker=self._worker, live=self._local.snapshot(), drift=drift)  # type: ignore[attr-defined]
        response = await client.put(self._url, content=report.model_dump_json(), headers={
            **self._headers, "Content-Type": "application/json"})
        if response.status_code != 200:
            raise ValueError(f"{response.status_code} {response.text[:300]}")
        reply = RunnerReportReply.model_validate_json(response.content)
        self.last_ok = time.monotonic()
        if self.unreachable_since is not None:
            log.info("control-reachable url=%s after=%.1fs", redact(self._url), self.last_ok - self.unreachable_since)
            self.unreachable_since = None
        for key in reply.repair:
            namespace, _, name = key.partition("/")
            healed = await self._local.repair(namespace, name)  # type: ignore[attr-defined]
            log.warning("drift-healed workflowrun=%s restored=%s (asked by the reconciler)",
                        key, ",".join(r.release_id for r in healed) or "-")
        for key, replicas in reply.scale.items():
            namespace, _, name = key.partition("/")
            try:
                await self._local.set_replicas(namespace, name, replicas)  # type: ignore[attr-defined]
            except PlntError as exc:
                log.error("scale-failed workflowrun=%s replicas=%d error=%s (asked by the reconciler)", key, replicas,
                          redact(str(exc)))
        for key, placement in reply.place.items():
            namespace, _, name = key.partition("/")
            try:
                await self._local.place_replicas(namespace, name, placement)  # type: ignore[attr-defined]
            except PlntError as exc:
                log.error("place-failed workflowrun=%s placement=%s error=%s (asked by the reconciler)", key,
                          placement, redact(str(exc)))
        if reply.repair or reply.scale or reply.place:
            self._now.set()  # report the restarted (scaled, placed) runners at once
