"""Local driver: each release is a runner process on 127.0.0.1 (the embedded default).

A release counts as installed once its /healthz answers with the right version. Release records
live in STATE/releases so a restarted `plnt up` knows what is live: `resume()` restarts the runner
processes of recorded releases (the same release, not a redeploy) and no saga runs for them.
Order matters for serving without errors: records (and so the gateway's routes) change first,
then the old process is stopped; the runner drains in-flight requests on SIGTERM.

Isolation of a runner (it runs recipe code): its environment is built from an allowlist (see
`allowlisted_env`; plnt's own credentials never reach it), its cwd, HOME and TMPDIR are its own
directory STATE/runners/RELEASE_ID/, and it sets the resource limits of its backend (runnerLimits)
before it imports the recipe, and makes itself undumpable (plnt.runner.isolation) so that other
runners cannot read its memory or environment. It runs as plnt's user, so it is not a filesystem
sandbox.

How a runner starts (`runner_start`): "fork" (the default on Linux) asks one pre-imported zygote
process (plnt.runner.zygote, via zygote_client) to fork it: ~10 ms of CPU and ~11 MiB of private
memory per runner; "exec" starts `python -m plnt.runner` afresh (~0.4 s CPU, ~36 MiB). Both run the
same runner `main` with the same options, environment, directory and limits, and both survive plnt:
a forked runner is its own session leader, and the zygote exits when plnt does without them.

No runner is lost: each process is written to STATE/runner-pids/PID.json (pid + start time) right
after it starts, before its health check, and that entry goes only when the process is gone. A
runner that no release record names (failed or cancelled install, plnt killed mid-install or
mid-promote) is stopped at once when that can be done, and otherwise at the next start. The next
start also looks in /proc for runners whose cwd is one of STATE/runners/*: plnt can die between a
fork and the pid file.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar

from plnt.core import telemetry
from plnt.core.parking import PARKED_FILE, read_parked
from plnt.core.specs.models import RunnerLimits
from plnt.core.upstream import UpstreamClient, UpstreamError
from plnt.reconciler.drivers.protocol import InstallRequest
from plnt.reconciler.drivers.zygote import ForkedRunner, ZygoteClient, ZygoteError
from plnt.reconciler.errors import DriverError, InvalidRecipe, InvalidSpec
from plnt.reconciler.state import LiveWorkflow, Release, StateDir, Track, atomic_write_json, read_json

log = logging.getLogger(__name__)

RECIPE_LOAD_FAILED_EXIT = 2  # the runner's exit code when its recipe does not load (a model server's: its weights)
# A model release's server (llama.cpp), run as a script by the runtime's interpreter: imports no plnt.
MODEL_SERVER_SCRIPT = Path(__file__).resolve().parents[2] / "runner" / "model_server.py"
HEALTH_POLL_FIRST_S = 0.01  # a starting runner's health polls: 10 ms, growing 1.5x to at most 100 ms
HEALTH_POLL_MAX_S = 0.1
_T = TypeVar("_T")
SHUTDOWN_PARALLEL = 64  # runners stopped at once when plnt stops
RESUME_PARALLEL = 16  # runners restarted at once when plnt starts (each is a fork and a health wait)
STOP_POLL_S = 0.01  # how often a stopping runner is checked for its exit (a promote waits for the old one)

# What of plnt's own environment a runner may see: nothing secret. PYTHONPATH only matters when plnt
# itself is imported through it; SSL_CERT_* let an https model server with a private CA work.
# Tracing: only where to send spans, by which protocol, under which service name and how many
# (telemetry.RUNNER_ENV_NAMES); never OTEL_EXPORTER_OTLP_HEADERS, which may hold a collector's credentials.
RUNNER_ENV_NAMES = frozenset({"PATH", "LANG", "LANGUAGE", "TZ", "PYTHONPATH", "SSL_CERT_FILE", "SSL_CERT_DIR"}
                             | telemetry.RUNNER_ENV_NAMES)
RUNNER_ENV_PREFIXES = ("LC_",)
MODEL_TOKEN_ENV = "PLNT_MODEL_TOKEN"  # a bound runner's token for the gateway (scope `models`)

LimitsLookup = Callable[[str, str], RunnerLimits]  # (namespace, name) -> limits of its backend
# (namespace, name, spec fingerprint) -> idle seconds after which that release's runner parks, or None
ParkLookup = Callable[[str, str, str], float | None]
RunnerStart = Literal["fork", "exec"]
RunnerProcess = subprocess.Popen[bytes] | ForkedRunner


def allowlisted_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables of `environ` every runner may inherit (the CLI passes os.environ)."""
    return {k: v for k, v in environ.items() if k in RUNNER_ENV_NAMES or k.startswith(RUNNER_ENV_PREFIXES)}


def runner_env(base: Mapping[str, str], runner_dir: Path, extra: Mapping[str, str]) -> dict[str, str]:
    """A runner's whole environment: the allowlisted base, its own directory as HOME and TMPDIR,
    no user site-packages from that HOME, and `extra` (the one LLM key the operator names)."""
    env = {"PATH": os.defpath, **allowlisted_env(base)}
    env.update(HOME=str(runner_dir), TMPDIR=str(runner_dir), PYTHONNOUSERSITE="1")
    env.update(extra)
    return env


def raise_open_files_limit() -> tuple[int, int]:
    """Raise plnt's soft RLIMIT_NOFILE to its hard limit: with 1,000 runners plnt holds a connection
    or more per runner (gateway pools, health checks, smoke tests), past the usual soft 1,024. Runners
    set their own (runnerLimits). Returns (soft, hard) as they are now."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else 1 << 20  # Linux's default fs.nr_open
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (OSError, ValueError) as exc:
            log.warning("open-files-limit-unchanged soft=%s hard=%s error=%s", soft, hard, exc)
    return soft, hard


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def process_start_time(pid: int) -> str | None:
    """Start time of a process (clock ticks since boot), or None if it is gone or a zombie."""
    try:  # os.open/os.read, not Path.read_text: drift checks every release on every poll
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY)
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    try:
        stat = os.read(fd, 4096).decode("utf-8", "replace")
    except ProcessLookupError:  # exited between open and read
        return None
    finally:
        os.close(fd)
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] in ("Z", "X"):
        return None
    return fields[19]


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
        self._python = python
        self._host = host
        self._start_timeout_s = start_timeout_s
        self._stop_timeout_s = stop_timeout_s
        self._on_change = on_change or (lambda: None)
        # Waits until the gateway has no request in flight to a release it no longer routes to.
        self._drain = drain
        # Extra runner options for every release, e.g. the model backend (--backend http --upstream-url ...).
        self._runner_args = runner_args
        # The allowlisted part of plnt's environment, and the LLM key (name -> value) runners get.
        self._env = allowlisted_env(env or {})
        self._secret_env = dict(secret_env or {})
        self._limits_for = limits_for or (lambda namespace, name: RunnerLimits())
        # Scale to zero only where something wakes parked runners (plnt up's gateway); None: never park.
        self._park_after_for = park_after_for
        # The model runtime's interpreter (its own venv: tools/install_llm.sh); None: no model releases.
        self._model_python = model_python
        # Runners of a WorkflowRun bound to a ModelDeployment call it through this gateway, with this
        # token (scope `models` only) when the gateway requires one.
        self._gateway_url = gateway_url
        self._model_token = model_token
        self._pids = self._state.root / "runner-pids"
        self._pids.mkdir(exist_ok=True)
        self._locks: dict[str, asyncio.Lock] = {}
        self._children: dict[int, RunnerProcess] = {}
        # fork needs Linux (fork of a single-threaded zygote, prctl); elsewhere runners are exec'd.
        self._runner_start: RunnerStart = runner_start if sys.platform.startswith("linux") else "exec"
        zygote_dir = self._state.root / "zygote"  # its cwd, HOME, TMPDIR and log; not under runners/
        self._zygote = ZygoteClient(python, zygote_dir, runner_env(self._env, zygote_dir, {}))
        # Set by shutdown, for good: a start still in flight then (a drift heal of the reconciler's
        # last pass, say) must not leave a runner that the shutdown's sweep already missed.
        self._shutting_down = False
        self._records: dict[str, tuple[tuple[int, int, int], LiveWorkflow]] = {}  # snapshot's parsed records
        # The releases directory's stamp when a snapshot may be reused whole (see snapshot), and that snapshot.
        self._listing: tuple[tuple[int, int, int], dict[str, LiveWorkflow]] | None = None
        # Each child's start time, read once: a child not yet reaped keeps its pid (see _alive).
        self._child_starts: dict[int, tuple[subprocess.Popen[bytes], str | None]] = {}

    # --- the driver interface ---------------------------------------------------------------

    def assign(self, specs: object) -> None:
        """Every WorkflowRun the local driver sees runs here: nothing to map."""

    async def install(self, request: InstallRequest) -> Release:
        async with self._lock(request.namespace, request.name):
            live = self._read(request.namespace, request.name)
            current: Release | None = getattr(live, request.track)
            if current is not None and current.release_id == request.release_id and self.is_running(current):
                if await self._healthy(current, request.version, timeout_s=2.0):
                    return current
            if current is not None:
                self._write(live.model_copy(update={request.track: None}))
                await self._stop(current)
            park_after = (self._park_after_for(request.namespace, request.name, request.spec_fingerprint)
                          if self._park_after_for is not None else None)
            release = await self._start(request.release().model_copy(update={"park_after_s": park_after}))
            try:
                live = self._read(request.namespace, request.name)
                self._write(live.model_copy(update={request.track: release}))
            except BaseException:
                self._kill_unrecorded(release)
                raise
            return release

    async def promote(self, namespace: str, name: str) -> Release:
        async with self._lock(namespace, name):
            live = self._read(namespace, name)
            if live.canary is None:
                if live.stable is not None:
                    return live.stable  # promoted already: a retried promote finds its own work
                raise DriverError(f"{namespace}/{name}: no canary to promote")
            new_stable = live.canary.model_copy(update={"track": "stable", "traffic_percent": 0})
            old = live.stable
            self._write(LiveWorkflow(namespace=namespace, name=name, stable=new_stable))
            if old is not None and old.pid != new_stable.pid:
                await self._stop(old)
            return new_stable

    async def remove(self, namespace: str, name: str, track: Track) -> None:
        async with self._lock(namespace, name):
            live = self._read(namespace, name)
            release: Release | None = getattr(live, track)
            if release is None:
                return
            self._write(live.model_copy(update={track: None}))
            await self._stop(release)

    async def live(self) -> dict[str, LiveWorkflow]:
        return self.snapshot()

    def record_of(self, namespace: str, name: str) -> LiveWorkflow | None:
        """One WorkflowRun's record, as `live()` would give it (None when it has no release)."""
        live = self._read(namespace, name)
        return None if live.empty else live

    def snapshot(self) -> dict[str, LiveWorkflow]:
        """The release records as they are now (no process checks). A record is parsed again only
        when its file changed (records are replaced whole, so a write is a new inode): a poll of
        1,000 records costs 1,000 stats, not 1,000 JSON reads. And while the directory itself is
        unchanged (a record written, added or removed is a rename or unlink in it, which moves its
        mtime), the last snapshot is the answer: an idle poll costs one stat, not one per record."""
        try:
            directory = os.stat(self._state.releases)
        except FileNotFoundError:
            directory = None
        stamp = (directory.st_ino, directory.st_mtime_ns, directory.st_ctime_ns) if directory else None
        if stamp is not None and self._listing is not None and self._listing[0] == stamp:
            return dict(self._listing[1])
        result = self._scan()
        # Trusted only once the directory's mtime is safely in the past: a change in the same clock
        # tick as the scan could keep the same mtime (file timestamps are coarse), so a directory
        # changed under 2 s ago is scanned again next time (git's "racily clean" rule).
        settled = directory is not None and time.time_ns() - directory.st_mtime_ns > 2_000_000_000
        self._listing = (stamp, result) if settled and stamp is not None else None
        return dict(result)

    def _scan(self) -> dict[str, LiveWorkflow]:
        known = self._records
        seen: dict[str, tuple[tuple[int, int, int], LiveWorkflow]] = {}
        result: dict[str, LiveWorkflow] = {}
        with os.scandir(self._state.releases) as listing:
            entries = sorted((e for e in listing if e.name.endswith(".json")), key=lambda e: e.name)
        for entry in entries:
            try:
                stat = entry.stat()
            except FileNotFoundError:  # removed since the listing
                continue
            stamp = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
            hit = known.get(entry.name)
            if hit is not None and hit[0] == stamp:
                live = hit[1]
            else:
                raw = read_json(Path(entry.path))
                if raw is None:
                    continue
                live = LiveWorkflow.model_validate(raw)
            seen[entry.name] = (stamp, live)
            if not live.empty:
                result[live.key] = live
        self._records = seen  # replaced whole: a snapshot in another thread reads one or the other
        return result

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
            dead = [r for r in gone if not self._parked_itself(r)]  # (each parked file read once)
            if len(dead) < len(gone):
                parked.append(live)
            if dead:
                drifted[key] = dead
        for live in parked:
            await self._note_parked(live.namespace, live.name)
        return drifted

    async def repair(self, namespace: str, name: str) -> list[Release]:
        """Restart the runner of each recorded release of one WorkflowRun that is not running:
        the same release (recipe, version, id), on its old port if free."""
        restarted: list[Release] = []
        async with self._lock(namespace, name):
            live = self._read(namespace, name)
            for track in ("stable", "canary"):
                release: Release | None = getattr(live, track)
                if release is None or release.parked or self.is_running(release) or self._parked_itself(release):
                    continue  # (one that parked is woken by a request, not restarted: see wake)
                try:
                    new = await self._start(release, preferred_port=release.port)
                except DriverError as exc:
                    log.error("restart-failed release=%s error=%s", release.release_id, exc)
                    continue
                live = live.model_copy(update={track: new})
                self._write(live)
                restarted.append(new)
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
            live = self._read(namespace, name)
            found = [r for r in (live.stable, live.canary) if r is not None and r.release_id == release_id]
            if not found:
                return None
            release = found[0]
            if not release.parked:
                if not self._parked_itself(release, alive_too=True):
                    return release if self.is_running(release) else None
                await self._wait_parked(release)  # it parks right now: its port is free once it exited
            started_at = time.monotonic()
            woken = await self._start(release.model_copy(update={"parked": False}), preferred_port=release.port)
            self._write(live.model_copy(update={release.track: woken}))  # (records change only under the lock)
            log.info("runner-woken release=%s endpoint=%s pid=%s in %.0f ms", release_id, woken.endpoint, woken.pid,
                     (time.monotonic() - started_at) * 1000)
            return woken

    def _parked_itself(self, release: Release, *, alive_too: bool = False) -> bool:
        """Whether this release's runner process wrote that it parks (runner/idle.py), and is gone
        (or, with `alive_too`, still exiting)."""
        if release.pid is None or (not alive_too and self.is_running(release)):
            return False
        return read_parked(self._state.runner_logs / release.release_id) == release.pid

    async def _wait_parked(self, release: Release) -> None:
        """Wait (up to the stop timeout) for a parking runner to exit: it answers a request it
        accepted before closing its listener. Then SIGTERM, and SIGKILL, as any stop."""
        assert release.pid is not None
        deadline = time.monotonic() + self._stop_timeout_s
        while time.monotonic() < deadline and self._alive(release.pid, release.pid_start):
            await asyncio.sleep(STOP_POLL_S)
        if self._alive(release.pid, release.pid_start):
            await self._terminate(release.pid, release.pid_start, release.release_id)
        self._reap(release.pid)

    async def _note_parked(self, namespace: str, name: str) -> None:
        """Record as parked each release of one WorkflowRun whose runner parked itself and exited.
        Not while an install, promote or wake of it holds its lock: the pass that asks must not wait
        for a runner's start, and the next pass notes it."""
        lock = self._lock(namespace, name)
        if lock.locked():
            return
        async with lock:
            live = self._read(namespace, name)
            update: dict[str, Release] = {}
            for track in ("stable", "canary"):
                release: Release | None = getattr(live, track)
                if release is not None and not release.parked and self._parked_itself(release):
                    log.info("runner-parked release=%s port=%s: no invocation for %gs; the next request starts "
                             "it again", release.release_id, release.port, release.park_after_s or 0)
                    self._reap(release.pid)
                    update[track] = release.model_copy(update={"parked": True, "pid": None, "pid_start": None})
            if update:
                self._write(live.model_copy(update=update))

    async def shutdown(self) -> None:
        """Stop every runner process this driver knows of, up to SHUTDOWN_PARALLEL at once (one after
        another, each drain and exit took a few milliseconds: minutes for Ctrl-C with 1,000 runners);
        the release records stay."""
        self._shutting_down = True  # from here on no start forks, and one that already did kills its runner
        releases = [release for live in (await self.live()).values()
                    for release in (live.stable, live.canary) if release is not None]
        results = await _at_most(SHUTDOWN_PARALLEL, [self._stop(release) for release in releases])
        for release, result in zip(releases, results, strict=True):
            if isinstance(result, BaseException):  # the others are stopped all the same
                log.error("runner-stop-failed release=%s error=%s", release.release_id, result)
        await self.stop_unrecorded()
        await asyncio.to_thread(self._zygote.close)

    async def stop_unrecorded(self) -> list[int]:
        """Stop every runner in STATE/runner-pids that no release record names; returns their pids.
        Only when no install runs (at start and at shutdown): an install's runner is unrecorded
        until it is healthy."""
        recorded = {(r.pid, r.pid_start) for live in self.snapshot().values()
                    for r in (live.stable, live.canary) if r is not None}
        stopped: list[int] = []
        for path in sorted(self._pids.glob("*.json")):
            try:
                entry = read_json(path)
            except (OSError, ValueError):
                entry = None
            if not isinstance(entry, dict) or not isinstance(entry.get("pid"), int):
                log.warning("runner-pid-file-unreadable path=%s (removed)", path)  # plnt writes them whole
                path.unlink(missing_ok=True)
                continue
            pid, start = entry["pid"], entry.get("pid_start")
            if (pid, start) in recorded:
                continue
            if process_start_time(pid) == start and _is_runner(pid):
                log.warning("runner-unrecorded-stop release=%s pid=%s", entry.get("release_id"), pid)
                await self._terminate(pid, start, str(entry.get("release_id")))
                stopped.append(pid)
            path.unlink(missing_ok=True)
        # A plnt killed between a fork and its pid file left a runner no file names: found by its cwd.
        for pid, (start, release_id) in runners_under(self._state.runner_logs).items():
            if (pid, start) not in recorded and pid not in stopped:
                log.warning("runner-unrecorded-stop release=%s pid=%s (no pid file)", release_id, pid)
                await self._terminate(pid, start, release_id)
                stopped.append(pid)
        return stopped

    def is_running(self, release: Release) -> bool:
        return release.pid is not None and self._alive(release.pid, release.pid_start)

    # --- internals ---------------------------------------------------------------------------

    def _lock(self, namespace: str, name: str) -> asyncio.Lock:
        return self._locks.setdefault(f"{namespace}/{name}", asyncio.Lock())

    def _record_path(self, namespace: str, name: str) -> Path:
        return self._state.releases / f"{namespace}.{name}.json"

    def _read(self, namespace: str, name: str) -> LiveWorkflow:
        raw = read_json(self._record_path(namespace, name))
        return LiveWorkflow.model_validate(raw) if raw else LiveWorkflow(namespace=namespace, name=name)

    def _write(self, live: LiveWorkflow) -> None:
        path = self._record_path(live.namespace, live.name)
        if live.empty:
            path.unlink(missing_ok=True)
        else:
            atomic_write_json(path, live.model_dump(mode="json"))
        self._on_change()

    async def _start(self, release: Release, preferred_port: int | None = None) -> Release:
        runner_dir = self._state.runner_logs / release.release_id  # cwd, HOME and TMPDIR of the runner
        runner_dir.mkdir(parents=True, exist_ok=True)
        limits = self._limits_for(release.namespace, release.name)
        # A model server needs no LLM key: it is the model. A runner bound to one gets the models token.
        if release.model is not None:
            secrets_given: Mapping[str, str] = {}
        elif release.llm_model is not None:
            secrets_given = {MODEL_TOKEN_ENV: self._model_token} if self._model_token else {}
        else:
            secrets_given = self._secret_env
        env = runner_env(self._env, runner_dir, secrets_given)
        last_error = ""
        for attempt in range(3):
            self._refuse_if_shutting_down(release)
            port = preferred_port if (attempt == 0 and preferred_port) else free_port(self._host)
            log_path = self._state.runner_logs / f"{release.release_id}.log"
            if release.model is not None:
                argv = self._model_argv(release, port, limits)
            else:
                argv = self._runner_argv(release, port, limits)
            (runner_dir / PARKED_FILE).unlink(missing_ok=True)  # an earlier process's: this one has not parked
            if release.model is not None:
                child = await self._spawn_model(argv, runner_dir, log_path, env)
            else:
                child = await self._spawn(argv, runner_dir, log_path, env)
            self._children[child.pid] = child
            started = release.model_copy(
                update={
                    "pid": child.pid,
                    "pid_start": process_start_time(child.pid),
                    "port": port,
                    "endpoint": f"http://{self._host}:{port}",
                }
            )
            try:
                self._remember(started)  # before the health check: a plnt killed from here on finds it
                # (No await since the fork: either shutdown's sweep sees the pid file just written, or
                # the sweep had begun and this start kills its own runner.)
                self._refuse_if_shutting_down(release)
                healthy = await self._wait_healthy(started, child)
                # Healthy only after shutdown's sweep began (which can miss a child forked moments
                # before, still under the zygote's name): this start stops its own runner.
                self._refuse_if_shutting_down(release)
            except BaseException:  # cancelled (a newer commit superseded the saga) or failed: it never served
                self._kill_unrecorded(started)
                raise
            if healthy:
                log.info("runner-started release=%s endpoint=%s pid=%s", release.release_id, started.endpoint, child.pid)
                return started
            code = child.poll()
            tail = _tail(log_path)
            await self._stop(started)
            if code == RECIPE_LOAD_FAILED_EXIT:
                what = "model server could not load its weights" if release.model else "runner could not load its recipe"
                raise InvalidRecipe(f"{what} for {release.version}: {tail}")
            last_error = f"exit code {code}" if code is not None else f"not healthy within {self._start_timeout_s:.0f}s"
            last_error += f"; log {log_path}: {tail}"
        raise DriverError(f"runner {release.release_id} did not start: {last_error}")

    def _runner_argv(self, release: Release, port: int, limits: RunnerLimits) -> list[str]:
        return [
                "--recipe", str(Path(release.recipe_dir).resolve()),
                "--host", self._host,
                "--port", str(port),
                "--release-id", release.release_id,
                "--limit-memory-mib", str(limits.memory_mi_b),
                "--limit-open-files", str(limits.open_files),
                "--limit-processes", str(limits.processes),
                *(["--park-after-idle-s", f"{release.park_after_s:g}"] if release.park_after_s else []),
                *(self._model_backend_args(release.llm_model) if release.llm_model else self._runner_args),
            ]

    def _model_backend_args(self, model: str) -> list[str]:
        if self._gateway_url is None:
            raise DriverError(f"runner bound to model {model}: this plnt has no gateway for its runners to call "
                              "models through")
        return ["--backend", "http", "--upstream-url", self._gateway_url(), "--model", model,
                *(["--api-key-env", MODEL_TOKEN_ENV] if self._model_token else [])]

    def _model_argv(self, release: Release, port: int, limits: RunnerLimits) -> list[str]:
        model = release.model
        assert model is not None
        if self._model_python is None or not Path(self._model_python).exists():
            raise InvalidSpec(f"{release.namespace}/{release.name}: the {model.runtime} runtime is not installed "
                              f"({self._model_python or 'no --llm-venv'}): run `make install-llm` (or "
                              "`bash tools/install_llm.sh .venv-llm`), then push again")
        return [
            self._model_python, str(MODEL_SERVER_SCRIPT),
            "--model", str(Path(release.recipe_dir).resolve() / model.model_file),
            "--alias", model.alias,
            "--host", self._host,
            "--port", str(port),
            "--release-id", release.release_id,
            "--version", release.version,
            "--context", str(model.context_length),
            *(["--threads", str(model.threads)] if model.threads else []),
            "--limit-memory-mib", str(model.memory_mib or limits.memory_mi_b),
            "--limit-open-files", str(limits.open_files),
            "--limit-processes", str(limits.processes),
            "--", *model.args,
        ]

    async def _spawn_model(self, argv: list[str], runner_dir: Path, log_path: Path,
                           env: dict[str, str]) -> RunnerProcess:
        """A model server is exec'd from the runtime's own interpreter (never forked from plnt's zygote)."""
        with open(log_path, "ab") as log_file:
            try:
                return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
                                        cwd=runner_dir, env=env, start_new_session=True)
            except OSError as exc:
                raise DriverError(f"model server could not be started: {exc}") from None

    def _refuse_if_shutting_down(self, release: Release) -> None:
        if self._shutting_down:
            raise DriverError(f"runner {release.release_id} not started: plnt is stopping (the next start "
                              "installs it again)")

    async def _spawn(self, argv: list[str], runner_dir: Path, log_path: Path, env: dict[str, str]) -> RunnerProcess:
        if self._runner_start == "fork":
            try:
                return await self._zygote.spawn(argv, runner_dir.resolve(), log_path.resolve(), env)
            except (ZygoteError, OSError) as exc:
                raise DriverError(f"runner could not be forked: {exc}") from None
        with open(log_path, "ab") as log_file:
            return subprocess.Popen(
                [self._python, "-m", "plnt.runner", *argv],
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                cwd=runner_dir,
                env=env,
                start_new_session=True,  # Ctrl-C in the terminal reaches plnt, which stops runners in order
            )

    async def _wait_healthy(self, release: Release, child: RunnerProcess) -> bool:
        deadline = time.monotonic() + self._start_timeout_s
        # Polled often: a refused connection costs well under a millisecond, and a runner that is
        # up waits at most one delay for plnt to notice (was 50 ms growing to 500 ms: up to a
        # quarter of a second lost per install, measured in bench/saga_profile.py).
        delay = HEALTH_POLL_FIRST_S
        client = UpstreamClient(read_timeout_s=1.0, connect_timeout_s=1.0)
        try:
            while time.monotonic() < deadline:
                self._refuse_if_shutting_down(release)
                if child.poll() is not None:
                    return False
                if await self._healthy(release, release.version, client):
                    return True
                await asyncio.sleep(delay)
                delay = min(delay * 1.5, HEALTH_POLL_MAX_S)
            return False
        finally:
            await client.aclose()

    async def _healthy(self, release: Release, version: str, client: UpstreamClient | None = None,
                       timeout_s: float = 1.0) -> bool:
        """Whether the runner at the release's endpoint answers as that release. Through the
        gateway's client for runners (plain HTTP): an httpx client per poll was 3 % of plnt's
        event loop while 1,000 runners started (bench/many_workflowruns.py, py-spy)."""
        own = client is None
        client = client or UpstreamClient(read_timeout_s=timeout_s, connect_timeout_s=timeout_s)
        try:
            response = await client.request(release.endpoint, "GET", "/healthz")
            body = json.loads(response.body) if response.status == 200 else {}
        except (UpstreamError, ValueError):
            return False
        finally:
            if own:
                await client.aclose()
        return isinstance(body, dict) and body.get("version") == version and body.get("release") == release.release_id

    async def _stop(self, release: Release) -> None:
        if release.pid is None or not self.is_running(release):
            self._reap(release.pid)
            return
        try:
            # Records (so routes) changed first; let requests that chose this runner finish on it. Not
            # at shutdown: the runner leaves no routes then (the gateways stop, or lose every runner of
            # this process), and a runner drains what it received on SIGTERM.
            if self._drain is not None and not self._shutting_down:
                await self._drain(release)
        finally:  # also when cancelled while draining: its record is gone already, so must it be
            await self._terminate(release.pid, release.pid_start, release.release_id)

    async def _terminate(self, pid: int, start: str | None, release_id: str) -> None:
        """SIGTERM (the runner drains and exits), SIGKILL after the stop timeout; forget the pid."""
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + self._stop_timeout_s
        while time.monotonic() < deadline and self._alive(pid, start):
            await asyncio.sleep(STOP_POLL_S)
        if self._alive(pid, start):
            log.warning("runner-kill release=%s pid=%s (no exit %.0fs after SIGTERM)", release_id, pid, self._stop_timeout_s)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self._reap(pid)
        log.info("runner-stopped release=%s pid=%s", release_id, pid)

    def _kill_unrecorded(self, release: Release) -> None:
        """SIGKILL a runner that never served (no record, no route): nothing to drain, and no await,
        so it also works while the install is being cancelled."""
        if release.pid is not None and self._alive(release.pid, release.pid_start):
            log.warning("runner-abandoned release=%s pid=%s: install did not complete", release.release_id, release.pid)
            try:
                os.kill(release.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self._reap(release.pid)

    def _alive(self, pid: int, start: str | None) -> bool:
        child = self._children.get(pid)
        if child is None:
            return process_start_time(pid) == start
        if child.poll() is not None:
            return False
        if not getattr(child, "reports_exit", True):  # a forked runner whose zygote is gone
            return process_start_time(pid) == start
        # Not reaped yet, so the pid is still this child's: its start time is read once, not on
        # every drift check (1,000 runners would be 1,000 /proc reads per poll).
        known = self._child_starts.get(pid)
        if known is None or known[0] is not child:
            known = self._child_starts[pid] = (child, process_start_time(pid))
        return known[1] == start

    def _remember(self, release: Release) -> None:
        atomic_write_json(self._pids / f"{release.pid}.json",
                          {"pid": release.pid, "pid_start": release.pid_start, "release_id": release.release_id})

    def _reap(self, pid: int | None) -> None:
        """Collect a stopped child's exit status and drop its STATE/runner-pids entry."""
        if pid is None:
            return
        child = self._children.pop(pid, None)
        self._child_starts.pop(pid, None)
        if child is not None:
            try:
                child.wait(timeout=5)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        if not self._alive(pid, read_json(self._pids / f"{pid}.json", default={}).get("pid_start")):
            (self._pids / f"{pid}.json").unlink(missing_ok=True)


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


def _is_runner(pid: int) -> bool:
    """A pid file names a runner only if that process is one (a pid file is not trusted alone)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    # Forked runners rewrite theirs to the same (plnt.runner.zygote.retitle); one forked a moment ago
    # still has the zygote's. A model server is the runtime's python running MODEL_SERVER_SCRIPT.
    return (b"plnt.runner" in argv[:3] or b"plnt.runner.zygote" in argv[:3]
            or argv[1:2] == [str(MODEL_SERVER_SCRIPT).encode()])


def runners_under(root: Path) -> dict[int, tuple[str | None, str]]:
    """Live runner processes whose cwd is a release directory under `root` (STATE/runners):
    pid -> (start time, release id). Read from /proc; what is not readable is not ours."""
    root = root.resolve()
    found: dict[int, tuple[str | None, str]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or not _is_runner(pid := int(entry.name)):
            continue
        try:
            cwd = (entry / "cwd").resolve(strict=True)
        except OSError:
            continue
        if cwd.parent == root and (start := process_start_time(pid)) is not None:
            found[pid] = (start, cwd.name)
    return found


def _tail(path: Path, lines: int = 5) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except FileNotFoundError:
        return "(no log)"
    return " | ".join(text[-lines:]) or "(empty log)"
