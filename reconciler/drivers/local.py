"""Local driver: each release is one or more runner processes on 127.0.0.1 (the embedded default).

Replicas: a stable release runs `release.replicas` processes (the spec's replicas.min, or what a scale
set since), each on its own port; a canary runs one, and promote starts the others before the old
stable is retired. One record per WorkflowRun holds every process (Release.more_replicas). A process
that dies is restarted alone (repair) while the others serve; a scale adds or stops processes of the
live release (set_replicas), with no new release.

A release counts as installed once its /healthz answers with the right version. Release records
live in STATE/releases so a restarted `plnt up` knows what is live: `resume()` restarts the runner
processes of recorded releases (the same release, not a redeploy) and no saga runs for them.
Order matters for serving without errors: records (and so the gateway's routes) change first,
then the old process is stopped; the runner drains in-flight requests on SIGTERM.

The driver composes its parts, one job each:
- records.py: the release records and the runner pid files (STATE/releases, STATE/runner-pids);
- spawn.py: how a runner starts (its allowlisted environment, its command line, fork or exec);
- processes.py: process identity (pid and start time), health waits, stops, runners left behind;
- parking.py: scale to zero (a runner that parked itself, and waking it);
and holds what ties them together: one lock per WorkflowRun, under which its records change.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any, TypeVar

from plnt.core.specs.models import RunnerLimits
from plnt.reconciler.drivers.parking import ParkedRunners
from plnt.reconciler.drivers.processes import RunnerProcesses, free_port, log_tail, process_start_time, read_loads
from plnt.reconciler.drivers.protocol import InstallRequest
from plnt.reconciler.drivers.records import ReleaseRecords, RunnerPidFiles
from plnt.reconciler.drivers.spawn import RunnerSpawner, RunnerStart, allowlisted_env, runner_env
from plnt.reconciler.drivers.zygote import ZygoteClient
from plnt.reconciler.errors import DriverError, InvalidRecipe
from plnt.reconciler.plan.autoscale import replicas_to_stop
from plnt.reconciler.state import LiveWorkflow, Release, StateDir, Track

log = logging.getLogger(__name__)

RECIPE_LOAD_FAILED_EXIT = 2  # the runner's exit code when its recipe does not load (a model server's: its weights)
START_ATTEMPTS = 3  # a runner that is not healthy is started again, on another free port
_T = TypeVar("_T")
SHUTDOWN_PARALLEL = 64  # runners stopped at once when plnt stops
LOAD_READ_TIMEOUT_S = 0.5  # a scale down reads each replica's GET /load for at most this long
RESUME_PARALLEL = 16  # runners restarted at once when plnt starts (each is a fork and a health wait)

LimitsLookup = Callable[[str, str], RunnerLimits]  # (namespace, name) -> limits of its backend
# (namespace, name, spec fingerprint) -> idle seconds after which that release's runner parks, or None
ParkLookup = Callable[[str, str, str], float | None]


class LocalDriver:
    def __init__(
        self,
        state: StateDir,
        *,
        python: str = sys.executable,
        host: str = "127.0.0.1",
        start_timeout_s: float = 30.0,
        stop_timeout_s: float = 10.0,
        on_change: Callable[[], None] | None = None,
        drain: Callable[[Release], Awaitable[object]] | None = None,
        runner_args: tuple[str, ...] = (),
        env: Mapping[str, str] | None = None,
        secret_env: Mapping[str, str] | None = None,
        limits_for: LimitsLookup | None = None,
        runner_start: RunnerStart = "fork",
        park_after_for: ParkLookup | None = None,
        model_python: str | None = None,
        gateway_url: Callable[[], str] | None = None,
        model_token: str | None = None,
    ) -> None:
        self._state = state.ensure()
        self._host = host
        # Waits until the gateway has no request in flight to a release it no longer routes to.
        self._drain = drain
        self._limits_for = limits_for or (lambda namespace, name: RunnerLimits())
        # Scale to zero only where something wakes parked runners (plnt up's gateway); None: never park.
        self._park_after_for = park_after_for
        self._locks: dict[str, asyncio.Lock] = {}
        self._records = ReleaseRecords(self._state.releases, on_change or (lambda: None))
        self._pid_files = RunnerPidFiles(self._state.root / "runner-pids")
        self._processes = RunnerProcesses(self._pid_files, start_timeout_s=start_timeout_s,
                                          stop_timeout_s=stop_timeout_s)
        self._parking = ParkedRunners(self._state.runner_logs, self._processes)
        zygote_dir = self._state.root / "zygote"  # its cwd, HOME, TMPDIR and log; not under runners/
        self._zygote = ZygoteClient(python, zygote_dir, runner_env(allowlisted_env(env or {}), zygote_dir, {}))
        self._spawner = RunnerSpawner(
            self._zygote, python=python, host=host, runner_start=runner_start, runner_args=runner_args,
            env=env or {}, secret_env=secret_env or {}, model_python=model_python, gateway_url=gateway_url,
            model_token=model_token)

    # --- the driver interface ---------------------------------------------------------------

    def assign(self, specs: object) -> None:
        """Every WorkflowRun the local driver sees runs here: nothing to map."""

    async def install(self, request: InstallRequest) -> Release:
        async with self._lock(request.namespace, request.name):
            live = self._records.read(request.namespace, request.name)
            current: Release | None = getattr(live, request.track)
            if current is not None and current.release_id == request.release_id and self.is_running(current):
                healthy = await asyncio.gather(*(self._processes.healthy(p, request.version, timeout_s=2.0)
                                                 for p in current.processes()))
                if all(healthy):
                    return current
            if current is not None:
                self._records.write(live.model_copy(update={request.track: None}))
                await self._stop(current)
            park_after = (self._park_after_for(request.namespace, request.name, request.spec_fingerprint)
                          if self._park_after_for is not None else None)
            release = request.release().model_copy(update={"park_after_s": park_after})
            count = release.replicas if request.track == "stable" else 1  # a canary is one process
            backends = release.placed_backends()[:count]  # (a pool's canary: on the first placed backend)
            release = release.with_processes(await self._start_replicas(release, range(count), backends))
            try:
                live = self._records.read(request.namespace, request.name)
                self._records.write(live.model_copy(update={request.track: release}))
            except BaseException:
                for process in release.processes():
                    self._processes.kill_unrecorded(process)
                raise
            return release

    async def promote(self, namespace: str, name: str) -> Release:
        async with self._lock(namespace, name):
            live = self._records.read(namespace, name)
            if live.canary is None:
                if live.stable is not None:
                    return live.stable  # promoted already: a retried promote finds its own work
                raise DriverError(f"{namespace}/{name}: no canary to promote")
            new_stable = live.canary.model_copy(update={"track": "stable", "traffic_percent": 0, "canary_header": None,
                                                        "shadow_percent": 0})
            # The canary's one process becomes the first replica; the others start before the routes
            # change, so the new release serves with all of them the moment the old one leaves.
            # A pool's: each where it is placed (the canary's on the first placed backend).
            old = live.stable
            new_stable = new_stable.model_copy(update={"replicas": promoted_count(new_stable, old)})
            running = new_stable.processes()
            if not new_stable.parked and len(running) < new_stable.replicas:
                more = range(len(running), new_stable.replicas)
                running += await self._start_replicas(new_stable, more, new_stable.placed_backends()[more.start:])
                new_stable = new_stable.with_processes(running)
            self._records.write(LiveWorkflow(namespace=namespace, name=name, stable=new_stable))
            if old is not None and old.pid != new_stable.pid:
                await self._stop(old)
            return new_stable

    async def set_traffic(self, namespace: str, name: str, percent: int, *,
                          canary_header: tuple[str, str] | None) -> Release:
        async with self._lock(namespace, name):
            live = self._records.read(namespace, name)
            if live.canary is None:
                raise DriverError(f"{namespace}/{name}: no canary to give {percent}% of the traffic")
            if (live.canary.traffic_percent, live.canary.canary_header) != (percent, canary_header):
                self._records.write(live.model_copy(update={"canary": live.canary.model_copy(
                    update={"traffic_percent": percent, "canary_header": canary_header})}))
            return self._records.read(namespace, name).canary  # type: ignore[return-value]

    async def remove(self, namespace: str, name: str, track: Track) -> None:
        async with self._lock(namespace, name):
            live = self._records.read(namespace, name)
            release: Release | None = getattr(live, track)
            if release is None:
                return
            self._records.write(live.model_copy(update={track: None}))
            await self._stop(release)

    async def set_replicas(self, namespace: str, name: str, replicas: int) -> Release:
        """Run the stable release as `replicas` processes: new ones start (and are recorded once
        healthy, so the gateway routes to them), surplus ones (the idlest by their GET /load, never
        the first: reconciler/plan/autoscale.py, replicas_to_stop) leave the records first, then
        drain and stop. A parked release (scale to zero) only records the count: a request wakes its
        first replica, and a later scale adds the others."""
        if replicas < 1:
            raise DriverError(f"{namespace}/{name}: a release runs at least one replica (replicas.min: 0 parks it)")
        async with self._lock(namespace, name):
            live = self._records.read(namespace, name)
            stable = live.stable
            if stable is None:
                raise DriverError(f"{namespace}/{name}: no stable release to scale to {replicas} replicas")
            if stable.placement is not None:
                raise DriverError(f"{namespace}/{name}: a pool's release is scaled by placing its replicas "
                                  "(place_replicas), not by a count")
            running = stable.processes()
            surplus: list[Release] = []
            if stable.parked:
                pass
            elif replicas > len(running):
                running += await self._start_replicas(stable, range(len(running), replicas))
            elif replicas < len(running):
                loaded = await read_loads((process.endpoint for process in running), timeout_s=LOAD_READ_TIMEOUT_S)
                loads = [loaded.get(process.endpoint) for process in running]  # None: unknown, counted busiest
                stop = set(replicas_to_stop(loads, replicas))
                surplus = [process for i, process in enumerate(running) if i in stop]
                running = [process for i, process in enumerate(running) if i not in stop]
            scaled = stable.model_copy(update={"replicas": replicas}).with_processes(running)
            if scaled != stable:
                self._records.write(live.model_copy(update={"stable": scaled}))
                log.info("release-scaled release=%s replicas=%d (was %d)%s", stable.release_id, replicas,
                         len(stable.processes()),
                         f" stopping={','.join(str(p.port) for p in surplus)} (the idlest)" if surplus else "")
            await asyncio.gather(*(self._stop_process(process) for process in surplus))
            return scaled

    async def place_replicas(self, namespace: str, name: str, placement: dict[str, int]) -> Release:
        """Run the stable release of a pool as `placement` (replicas per backend), in place: the
        processes already on a backend that keeps them stay, the missing ones start where they are
        placed (recorded once healthy, so the gateway routes to them), then the ones a backend gives
        up leave the records, drain and stop. The same release (no canary: its version is proven)."""
        if sum(placement.values()) < 1 or any(count < 0 for count in placement.values()):
            raise DriverError(f"{namespace}/{name}: a placement runs at least one replica, none negative: {placement}")
        async with self._lock(namespace, name):
            live = self._records.read(namespace, name)
            stable = live.stable
            if stable is None:
                raise DriverError(f"{namespace}/{name}: no stable release to place as {placement}")
            wanted = {backend: count for backend, count in placement.items() if count > 0}
            if stable.parked:  # a request wakes its first replica; the next placement starts the others
                placed = stable.model_copy(update={"placement": wanted, "replicas": sum(wanted.values())})
                if placed != stable:
                    self._records.write(live.model_copy(update={"stable": placed}))
                return placed
            kept: list[Release] = []
            surplus: list[Release] = []
            have: dict[str | None, int] = {}
            for process in stable.processes():
                if have.get(process.backend, 0) < wanted.get(process.backend or "", 0):
                    have[process.backend] = have.get(process.backend, 0) + 1
                    kept.append(process)
                else:
                    surplus.append(process)
            missing = [backend for backend, count in wanted.items() for _ in range(count - have.get(backend, 0))]
            first = len(stable.processes())  # (new replica numbers after every old one: their logs stay apart)
            started = await self._start_replicas(stable, range(first, first + len(missing)), missing)
            placed = stable.model_copy(update={"placement": wanted, "replicas": sum(wanted.values())}) \
                .with_processes(kept + started)
            if placed != stable:
                self._records.write(live.model_copy(update={"stable": placed}))
                log.info("release-placed release=%s placement=%s (was %s)", stable.release_id,
                         ",".join(f"{b}:{n}" for b, n in wanted.items()),
                         ",".join(f"{b}:{n}" for b, n in stable.replicas_by_backend().items()) or "-")
            await asyncio.gather(*(self._stop_process(process) for process in surplus))
            return placed

    async def live(self) -> dict[str, LiveWorkflow]:
        return self.snapshot()

    def record_of(self, namespace: str, name: str) -> LiveWorkflow | None:
        """One WorkflowRun's record, as `live()` would give it (None when it has no release)."""
        live = self._records.read(namespace, name)
        return None if live.empty else live

    def snapshot(self) -> dict[str, LiveWorkflow]:
        """The release records as they are now (no process checks; see ReleaseRecords.snapshot)."""
        return self._records.snapshot()

    @property
    def record_scans(self) -> int:
        """How often snapshots scanned the release directory (not reused while it is unchanged)."""
        return self._records.scans

    def is_running(self, release: Release) -> bool:
        """Whether every replica process of the release runs."""
        return all(self._processes.running(process) for process in release.processes())

    # --- lifecycle of `plnt up` --------------------------------------------------------------

    async def drift(self) -> dict[str, list[Release]]:
        """Recorded releases whose runner is not running (died, killed by hand). A runner that parked
        (scale to zero) is not drift: its record is marked parked here, and a request wakes it."""
        drifted: dict[str, list[Release]] = {}
        parked: list[LiveWorkflow] = []
        for key, live in self.snapshot().items():
            gone = [r for r in (live.stable, live.canary) if r is not None and not r.parked and not self.is_running(r)]
            if not gone:
                continue
            # (each parked file read once; only a release of one replica parks: see repair)
            dead = [r for r in gone if r.more_replicas or not self._parking.parked_itself(r)]
            if len(dead) < len(gone):
                parked.append(live)
            if dead:
                drifted[key] = dead
        for live in parked:
            await self._note_parked(live.namespace, live.name)
        return drifted

    async def repair(self, namespace: str, name: str) -> list[Release]:
        """Restart each replica process of one WorkflowRun's recorded releases that is not running:
        the same release (recipe, version, id), on its old port if free; the replicas that run keep
        serving meanwhile (the gateway retries a refused connect on another replica)."""
        restarted: list[Release] = []
        async with self._lock(namespace, name):
            live = self._records.read(namespace, name)
            for track in ("stable", "canary"):
                release: Release | None = getattr(live, track)
                if release is None or release.parked or self.is_running(release):
                    continue
                if not release.more_replicas and self._parking.parked_itself(release):
                    continue  # (one that parked is woken by a request, not restarted: see wake)
                processes = release.processes()
                dead = [i for i, process in enumerate(processes) if not self._processes.running(process)]
                results = await asyncio.gather(*(self._start(processes[i], preferred_port=processes[i].port, replica=i)
                                                 for i in dead), return_exceptions=True)
                for i, result in zip(dead, results, strict=True):
                    if isinstance(result, DriverError):
                        log.error("restart-failed release=%s replica=%d error=%s", release.release_id, i, result)
                    elif isinstance(result, BaseException):
                        raise result
                    else:
                        processes[i] = result
                restored = release.with_processes(processes)
                if restored != release:
                    live = live.model_copy(update={track: restored})
                    self._records.write(live)
                    restarted.append(restored)
        return restarted

    async def resume(self) -> list[Release]:
        """At start: stop runners no record names (left by a plnt that was killed), then restart
        the runner of every recorded release whose process is gone."""
        await self.stop_unrecorded()
        # Up to RESUME_PARALLEL at once: `plnt up` serves once this returns, and 1,000 releases
        # restarted one after another (about 0.15 s each) kept it from serving for minutes.
        results = await _at_most(RESUME_PARALLEL, [self.repair(live.namespace, live.name)
                                                   for live in self.snapshot().values()])
        failed = [result for result in results if isinstance(result, BaseException)]
        if failed:
            raise failed[0]
        return [release for result in results if not isinstance(result, BaseException) for release in result]

    async def wake(self, namespace: str, name: str, release_id: str) -> Release | None:
        """Start a parked release's runner again (scale to zero): the same release on its recorded port
        when that is free. Returns the running release (at once if it runs already: another request
        woke it), or None when that release is not recorded or did not park (a runner that died is
        drift, restarted by the reconciler's heal, not by a request)."""
        async with self._lock(namespace, name):
            live = self._records.read(namespace, name)
            found = [r for r in (live.stable, live.canary) if r is not None and r.release_id == release_id]
            if not found:
                return None
            release = found[0]
            if not release.parked:
                if not self._parking.parked_itself(release, alive_too=True):
                    return release if self.is_running(release) else None
                await self._parking.wait_gone(release)  # it parks right now: its port is free once it exited
            started_at = time.monotonic()
            woken = await self._start(release.model_copy(update={"parked": False}), preferred_port=release.port)
            self._records.write(live.model_copy(update={release.track: woken}))  # (records change only under the lock)
            log.info("runner-woken release=%s endpoint=%s pid=%s in %.0f ms", release_id, woken.endpoint, woken.pid,
                     (time.monotonic() - started_at) * 1000)
            return woken

    async def _note_parked(self, namespace: str, name: str) -> None:
        """Record as parked each release of one WorkflowRun whose runner parked itself and exited.
        Not while an install, promote or wake of it holds its lock: the pass that asks must not wait
        for a runner's start, and the next pass notes it."""
        lock = self._lock(namespace, name)
        if lock.locked():
            return
        async with lock:
            live = self._records.read(namespace, name)
            update = self._parking.newly_parked(live)
            if update:
                self._records.write(live.model_copy(update=update))

    async def shutdown(self) -> None:
        """Stop every runner process this driver knows of, up to SHUTDOWN_PARALLEL at once (one after
        another, each drain and exit took a few milliseconds: minutes for Ctrl-C with 1,000 runners);
        the release records stay."""
        self._processes.stopping = True  # from here on no start forks, and one that already did kills its runner
        releases = [process for live in (await self.live()).values()
                    for release in (live.stable, live.canary) if release is not None for process in release.processes()]
        results = await _at_most(SHUTDOWN_PARALLEL, [self._stop_process(release) for release in releases])
        for release, result in zip(releases, results, strict=True):
            if isinstance(result, BaseException):  # the others are stopped all the same
                log.error("runner-stop-failed release=%s error=%s", release.release_id, result)
        await self.stop_unrecorded()
        await asyncio.to_thread(self._zygote.close)

    async def stop_unrecorded(self) -> list[int]:
        """Stop every runner in STATE/runner-pids (or under STATE/runners) that no release record
        names; returns their pids. Only when no install runs (at start and at shutdown)."""
        recorded = {(p.pid, p.pid_start) for live in self.snapshot().values()
                    for r in (live.stable, live.canary) if r is not None for p in r.processes()}
        return await self._processes.stop_unrecorded(recorded, self._state.runner_logs)

    # --- internals ---------------------------------------------------------------------------

    def _lock(self, namespace: str, name: str) -> asyncio.Lock:
        return self._locks.setdefault(f"{namespace}/{name}", asyncio.Lock())

    async def _start_replicas(self, release: Release, replicas: range,
                              backends: list[str | None] | None = None) -> list[Release]:
        """Start these replica processes of `release` at once (each on a free port; a pool's each on
        its backend of `backends`, in order) and wait until all are healthy; if one fails, the others
        are stopped and its error raised."""
        where = list(backends or ()) + [None] * len(replicas)
        results = await asyncio.gather(*(self._start(release.model_copy(update={"more_replicas": (), "backend": where[j]}),
                                                     replica=i)
                                         for j, i in enumerate(replicas)), return_exceptions=True)
        failed = [result for result in results if isinstance(result, BaseException)]
        if failed:
            await asyncio.gather(*(self._stop_process(r) for r in results if isinstance(r, Release)),
                                 return_exceptions=True)
            raise failed[0]
        return [result for result in results if isinstance(result, Release)]

    async def _start(self, release: Release, preferred_port: int | None = None, replica: int = 0) -> Release:
        """Start one replica process of the release and wait until it is healthy; its pid file is
        written before the health check, and a runner that never served is killed whatever ends the
        start. Replicas share the release's directory; each has its own log."""
        runner_dir = self._state.runner_logs / release.release_id  # cwd, HOME and TMPDIR of the runner
        runner_dir.mkdir(parents=True, exist_ok=True)
        limits = self._limits_for(release.namespace, release.name)
        env = self._spawner.env_for(release, runner_dir)
        suffix = f".{replica}" if replica else ""
        if replica:  # only the first replica parks (scale to zero): the others are a scale's, which stops them
            release = release.model_copy(update={"park_after_s": None})
        log_path = self._state.runner_logs / f"{release.release_id}{suffix}.log"
        last_error = ""
        for attempt in range(START_ATTEMPTS):
            self._processes.refuse_if_stopping(release)
            port = preferred_port if (attempt == 0 and preferred_port) else free_port(self._host)
            argv = self._spawner.argv(release, port, limits)
            self._parking.clear(release)
            child = await self._spawner.spawn(release, argv, runner_dir, log_path, env)
            self._processes.track(child)
            started = release.model_copy(
                update={
                    "pid": child.pid,
                    "pid_start": process_start_time(child.pid),
                    "port": port,
                    "endpoint": f"http://{self._host}:{port}",
                }
            )
            try:
                self._pid_files.remember(started)  # before the health check: a plnt killed from here on finds it
                # (No await since the fork: either shutdown's sweep sees the pid file just written, or
                # the sweep had begun and this start kills its own runner.)
                self._processes.refuse_if_stopping(release)
                healthy = await self._processes.wait_healthy(started, child)
                # Healthy only after shutdown's sweep began (which can miss a child forked moments
                # before, still under the zygote's name): this start stops its own runner.
                self._processes.refuse_if_stopping(release)
            except BaseException:  # cancelled (a newer commit superseded the saga) or failed: it never served
                self._processes.kill_unrecorded(started)
                raise
            if healthy:
                log.info("runner-started release=%s endpoint=%s pid=%s", release.release_id, started.endpoint, child.pid)
                return started
            code = child.poll()
            tail = log_tail(log_path)
            await self._stop_process(started)
            if code == RECIPE_LOAD_FAILED_EXIT:
                what = "model server could not load its weights" if release.model else "runner could not load its recipe"
                raise InvalidRecipe(f"{what} for {release.version}: {tail}")
            last_error = (f"exit code {code}" if code is not None
                          else f"not healthy within {self._processes.start_timeout_s:.0f}s")
            last_error += f"; log {log_path}: {tail}"
        raise DriverError(f"runner {release.release_id} did not start: {last_error}")

    async def _stop(self, release: Release) -> None:
        """Stop every replica process of the release (each drained first), at once."""
        results = await asyncio.gather(*(self._stop_process(p) for p in release.processes()), return_exceptions=True)
        failed = [result for result in results if isinstance(result, BaseException)]
        if failed:
            raise failed[0]

    async def _stop_process(self, release: Release) -> None:
        """Stop one process (`release` as `Release.processes()` gives it)."""
        if release.pid is None or not self._processes.running(release):
            self._processes.reap(release.pid)
            return
        try:
            # Records (so routes) changed first; let requests that chose this runner finish on it. Not
            # at shutdown: the runner leaves no routes then (the gateways stop, or lose every runner of
            # this process), and a runner drains what it received on SIGTERM.
            if self._drain is not None and not self._processes.stopping:
                await self._drain(release)
        finally:  # also when cancelled while draining: its record is gone already, so must it be
            await self._processes.terminate(release.pid, release.pid_start, release.release_id)


def promoted_count(new_stable: Release, old: Release | None) -> int:
    """The replicas a promoted release starts with: its spec's floor, or, when its spec autoscales
    (`replicas_max`), as many as the old stable runs now (within floor..replicas_max), so that a
    promotion under load does not drop to the floor until the autoscaler raises it again."""
    if new_stable.replicas_max is None or old is None or old.parked or new_stable.placement is not None:
        return new_stable.replicas
    return max(new_stable.replicas, min(new_stable.replicas_max, len(old.processes())))


async def _at_most(limit: int, calls: list[Coroutine[Any, Any, _T]]) -> list[_T | BaseException]:
    """Await `calls`, at most `limit` at a time; each one's result or exception, in order."""
    slots = asyncio.Semaphore(limit)

    async def one(call: Coroutine[Any, Any, _T]) -> _T:
        try:
            async with slots:
                return await call
        finally:
            call.close()  # one cancelled while it waited for a slot never ran: no "never awaited"

    return await asyncio.gather(*(one(call) for call in calls), return_exceptions=True)
