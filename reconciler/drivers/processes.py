"""Runner processes: which process is a runner of ours, whether it is healthy, and how it stops.

A pid alone is not trusted (pids are reused): a runner is known by its pid and its start time
(`process_start_time`, from /proc), and it is signalled only while both still match. A runner is
healthy once its /healthz answers with its release and version. It stops on SIGTERM (it drains what
it received), and gets SIGKILL after the stop timeout.

A runner that no release record names (failed or cancelled install, plnt killed mid-install or
mid-promote) is stopped at once when that can be done, and otherwise at the next start
(`stop_unrecorded`), which also looks in /proc for runners whose cwd is one of STATE/runners/*:
plnt can die between a fork and the pid file.

Process identity lives here, below both the local driver and the zygote client, which import it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

import httpx
from plnt.core.upstream import UpstreamClient, UpstreamError
from plnt.reconciler.drivers.records import RunnerPidFiles
from plnt.reconciler.errors import DriverError
from plnt.reconciler.state import Release

log = logging.getLogger(__name__)

# A model release's server (llama.cpp), run as a script by the runtime's interpreter: imports no plnt.
MODEL_SERVER_SCRIPT = Path(__file__).resolve().parents[2] / "runner" / "model_server.py"
HEALTH_POLL_FIRST_S = 0.01  # a starting runner's health polls: 10 ms, growing 1.5x to at most 100 ms
HEALTH_POLL_MAX_S = 0.1
LOAD_PATH = "/load"  # a runner's or model server's in-flight requests (runner/load.py)
MAX_LOAD_BYTES = 4096  # {"inFlight": n, "waiting": m} is a few dozen bytes
STOP_POLL_S = 0.01  # how often a stopping runner is checked for its exit (a promote waits for the old one)


class RunnerProcess(Protocol):
    """A runner this plnt started: the Popen of an exec'd one, or a ForkedRunner (zygote.py)."""

    pid: int

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int | None: ...

    def kill(self) -> None: ...


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


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


def parse_load(body: bytes) -> int | None:
    """A replica's load from its GET /load answer: inFlight (running plus waiting), or None when the
    answer is not one (a replica that answers nonsense counts as unknown, never as idle)."""
    try:
        data = json.loads(body)
    except ValueError:
        return None
    value = data.get("inFlight") if isinstance(data, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 10**9 else None


async def read_load(http: httpx.AsyncClient, endpoint: str) -> int | None:
    """The in-flight requests of the replica at `endpoint` (GET /load, at most MAX_LOAD_BYTES, within
    the client's timeout), or None when it does not answer with one."""
    try:
        async with http.stream("GET", endpoint + LOAD_PATH) as response:
            if response.status_code != 200:
                return None
            body = b""
            async for chunk in response.aiter_bytes():
                body += chunk
                if len(body) > MAX_LOAD_BYTES:
                    return None
            return parse_load(body)
    except (httpx.HTTPError, OSError):
        return None


async def read_loads(endpoints: Iterable[str], *, timeout_s: float = 0.5) -> dict[str, int]:
    """The in-flight requests of each replica that answers GET /load within `timeout_s` (all read at
    once); one that does not is left out ("unknown")."""
    wanted = sorted(set(endpoints))
    if not wanted:
        return {}
    async with httpx.AsyncClient(timeout=timeout_s, trust_env=False) as http:
        loads = await asyncio.gather(*(read_load(http, endpoint) for endpoint in wanted))
    return {endpoint: load for endpoint, load in zip(wanted, loads, strict=True) if load is not None}


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


def is_runner(pid: int) -> bool:
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
        if not entry.name.isdigit() or not is_runner(pid := int(entry.name)):
            continue
        try:
            cwd = (entry / "cwd").resolve(strict=True)
        except OSError:
            continue
        if cwd.parent == root and (start := process_start_time(pid)) is not None:
            found[pid] = (start, cwd.name)
    return found


def log_tail(path: Path, lines: int = 5) -> str:
    """The last lines of a runner's log, on one line: what a failed start reports."""
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except FileNotFoundError:
        return "(no log)"
    return " | ".join(text[-lines:]) or "(empty log)"


class RunnerProcesses:
    """The runner processes of one local driver: the children it started (reaped here, their pid
    files dropped when they are gone), and any runner named by pid and start time (one an earlier
    plnt left)."""

    def __init__(self, pid_files: RunnerPidFiles, *, start_timeout_s: float, stop_timeout_s: float) -> None:
        self.start_timeout_s = start_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self._pid_files = pid_files
        self._children: dict[int, RunnerProcess] = {}
        # Each child's start time, read once: a child not yet reaped keeps its pid (see alive).
        self._child_starts: dict[int, tuple[RunnerProcess, str | None]] = {}
        # Set by the driver's shutdown, for good: a start still in flight then (a drift heal of the
        # reconciler's last pass, say) must not leave a runner that the shutdown's sweep already missed.
        self.stopping = False

    def track(self, child: RunnerProcess) -> None:
        """A runner just started: its exit is learnt from its handle, not from /proc."""
        self._children[child.pid] = child

    def refuse_if_stopping(self, release: Release) -> None:
        if self.stopping:
            raise DriverError(f"runner {release.release_id} not started: plnt is stopping (the next start "
                              "installs it again)")

    async def wait_healthy(self, release: Release, child: RunnerProcess) -> bool:
        deadline = time.monotonic() + self.start_timeout_s
        # Polled often: a refused connection costs well under a millisecond, and a runner that is
        # up waits at most one delay for plnt to notice (was 50 ms growing to 500 ms: up to a
        # quarter of a second lost per install, measured in bench/saga_profile.py).
        delay = HEALTH_POLL_FIRST_S
        client = UpstreamClient(read_timeout_s=1.0, connect_timeout_s=1.0)
        try:
            while time.monotonic() < deadline:
                self.refuse_if_stopping(release)
                if child.poll() is not None:
                    return False
                if await self.healthy(release, release.version, client):
                    return True
                await asyncio.sleep(delay)
                delay = min(delay * 1.5, HEALTH_POLL_MAX_S)
            return False
        finally:
            await client.aclose()

    async def healthy(self, release: Release, version: str, client: UpstreamClient | None = None,
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

    def running(self, release: Release) -> bool:
        return release.pid is not None and self.alive(release.pid, release.pid_start)

    def alive(self, pid: int, start: str | None) -> bool:
        """Whether `pid` is still the process that started at `start`."""
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

    async def terminate(self, pid: int, start: str | None, release_id: str) -> None:
        """SIGTERM (the runner drains and exits), SIGKILL after the stop timeout; forget the pid."""
        signal_process(pid, signal.SIGTERM)
        await self.wait_exit(pid, start)
        if self.alive(pid, start):
            log.warning("runner-kill release=%s pid=%s (no exit %.0fs after SIGTERM)", release_id, pid, self.stop_timeout_s)
            signal_process(pid, signal.SIGKILL)
        self.reap(pid)
        log.info("runner-stopped release=%s pid=%s", release_id, pid)

    async def wait_exit(self, pid: int, start: str | None) -> None:
        """Until the process is gone, or the stop timeout has passed."""
        deadline = time.monotonic() + self.stop_timeout_s
        while time.monotonic() < deadline and self.alive(pid, start):
            await asyncio.sleep(STOP_POLL_S)

    def kill_unrecorded(self, release: Release) -> None:
        """SIGKILL a runner that never served (no record, no route): nothing to drain, and no await,
        so it also works while the install is being cancelled."""
        if release.pid is not None and self.alive(release.pid, release.pid_start):
            log.warning("runner-abandoned release=%s pid=%s: install did not complete", release.release_id, release.pid)
            signal_process(release.pid, signal.SIGKILL)
        self.reap(release.pid)

    def reap(self, pid: int | None) -> None:
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
        if not self.alive(pid, self._pid_files.start_of(pid)):
            self._pid_files.forget(pid)

    async def stop_unrecorded(self, recorded: set[tuple[int | None, str | None]], runners_dir: Path) -> list[int]:
        """Stop every runner in STATE/runner-pids that is not `recorded` (pid, start time); returns
        their pids. Only when no install runs (at start and at shutdown): an install's runner is
        unrecorded until it is healthy."""
        stopped: list[int] = []
        for path, entry in self._pid_files.entries():
            if entry is None:
                log.warning("runner-pid-file-unreadable path=%s (removed)", path)  # plnt writes them whole
                path.unlink(missing_ok=True)
                continue
            if (entry.pid, entry.pid_start) in recorded:
                continue
            if process_start_time(entry.pid) == entry.pid_start and is_runner(entry.pid):
                log.warning("runner-unrecorded-stop release=%s pid=%s", entry.release_id, entry.pid)
                await self.terminate(entry.pid, entry.pid_start, str(entry.release_id))
                stopped.append(entry.pid)
            path.unlink(missing_ok=True)
        # A plnt killed between a fork and its pid file left a runner no file names: found by its cwd.
        for pid, (start, release_id) in runners_under(runners_dir).items():
            if (pid, start) not in recorded and pid not in stopped:
                log.warning("runner-unrecorded-stop release=%s pid=%s (no pid file)", release_id, pid)
                await self.terminate(pid, start, release_id)
                stopped.append(pid)
        return stopped


def signal_process(pid: int, signum: signal.Signals) -> None:
    """Send `signum` to `pid`; one already gone is not an error (it is what a stop wants)."""
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass
