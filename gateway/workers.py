"""Gateway worker processes: more than one process answering on the public port, so the gateway
uses more than one core (`plnt up --gateway-workers N`, `plnt gateway --workers N`).

Layout: the parent (plnt up's process, or a `plnt gateway`) listens on host:port with SO_REUSEPORT
and starts N-1 children (`python -m plnt.gateway.workers`); each child listens on the same port with
SO_REUSEPORT, so the kernel spreads new connections over N accept queues. A child is a `GatewayRole`
(gateway/role.py): it follows the parent's route table through the same internal route watch
`plnt gateway` uses (GET /internal/routes, the internal token), and starts listening only once it
has a first table (no 503 "no route table" from a fresh or restarted worker).

Under `plnt up` the children follow a private loopback listener of the control plane (not the
public port: a long-poll there could land on a worker) and forward the control plane's own
endpoints (/hooks/git, /source, history, /internal/) to it, with the caller's address passed in a
header that the private listener trusts only with the internal token (control_relay.py), so a
loopback-only hook stays loopback-only whichever process accepted the connection.

The child's config, internal token included, comes as one JSON line on its stdin (never argv, the
environment or a file). The child exits when its stdin reaches EOF (the parent is gone, whatever
killed it), on SIGTERM, and (Linux) on its parent's death (PR_SET_PDEATHSIG); it ignores SIGINT:
Ctrl-C reaches the whole process group and the parent stops its workers in order. The parent
(`WorkerSupervisor`) restarts a worker that dies, with capped backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
from fastapi import Request
from fastapi.responses import Response
from plnt.core.server import ServerStartError
from pydantic import BaseModel, ConfigDict, Field, SecretStr

log = logging.getLogger("plnt.gateway.workers")

MAX_CONFIG_BYTES = 4 * 2**20  # a token file of thousands of tokens still fits


def auto_workers() -> int:
    """Default process count: one per core (measured on 2 cores: bench/gateway_workers.py), at most 4."""
    return max(1, min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1))


class WorkerConfig(BaseModel):
    """What one worker process needs, sent to it on stdin as one JSON line."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    index: int = Field(ge=1)
    parent_pid: int
    control_url: str
    internal_token: SecretStr
    forward_control: bool = False  # plnt up's workers: forward the control plane's endpoints to control_url
    host: str = "127.0.0.1"
    port: int
    tokens_text: SecretStr | None = None  # the token file's content (read once by the parent)
    tokens_source: str = "(tokens)"
    plain_tokens: tuple[SecretStr, ...] = ()
    max_body_bytes: int = 2**20
    request_timeout_s: float = 60.0
    max_header_bytes: int = 64 * 1024
    header_timeout_s: float = 10.0
    watch_wait_s: float = 25.0
    watch_retry_max_s: float = 2.0
    loop: str = "auto"
    verbose: bool = False
    ready_fd: int | None = None  # the worker writes one byte there once it listens
    processes: int = 1  # the gateway processes on the port: each enforces its share of the quotas
    cache_affinity: bool = True  # a model's conversations keep their replica (affinity.py)

    def wire(self) -> bytes:
        """The JSON line with the secrets in clear (only ever written to the child's stdin pipe)."""
        data = self.model_dump(mode="python")
        for key in ("internal_token", "tokens_text"):
            if data[key] is not None:
                data[key] = data[key].get_secret_value()
        data["plain_tokens"] = [t.get_secret_value() for t in self.plain_tokens]
        return json.dumps(data).encode() + b"\n"


# --- /metrics across the workers -------------------------------------------------------------------------

METRICS_PATH = "/internal/gateway-metrics"
METRICS_PUSH_S = 2.0
MAX_METRICS_BYTES = 8 * 2**20


def merge_metrics(texts: list[bytes]) -> bytes:
    """One Prometheus text exposition from several processes' own: samples with the same name and
    labels summed (counters, histogram buckets, in-flight gauges), `*_created` the earliest."""
    from prometheus_client.parser import text_string_to_metric_families

    families: dict[str, tuple[str, str, dict[tuple[str, tuple[tuple[str, str], ...]], float]]] = {}
    for text in texts:
        for family in text_string_to_metric_families(text.decode("utf-8", "replace")):
            _, _, samples = families.setdefault(family.name, (family.type, family.documentation, {}))
            earliest = family.name.endswith("_created")
            for sample in family.samples:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                value = float(sample.value)
                old = samples.get(key)
                samples[key] = value if old is None else min(old, value) if earliest else old + value
    lines: list[str] = []
    for name, (kind_, doc, samples) in families.items():
        shown = name + "_total" if kind_ == "counter" and not name.endswith("_total") else name
        lines.append(f"# HELP {shown} {_escape_help(doc)}")
        lines.append(f"# TYPE {shown} {kind_}")
        for (sample_name, labels), value in samples.items():
            rendered = ",".join(f'{k}="{_escape(v)}"' for k, v in labels)
            lines.append(f"{sample_name}{{{rendered}}} {value!r}" if rendered else f"{sample_name} {value!r}")
    return ("\n".join(lines) + "\n").encode()


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class WorkerMetrics:
    """The control plane's side: each worker's latest metrics (pushed every METRICS_PUSH_S) and the
    sum of them with its own, served as its GET /metrics (to which the workers forward)."""

    def __init__(self, own: Callable[[], bytes]) -> None:
        self.own = own
        self.latest: dict[int, bytes] = {}

    def render(self) -> bytes:
        return merge_metrics([self.own(), *self.latest.values()])

    def mount(self, app: Any, internal_token: str) -> None:
        from plnt.gateway.route_watch import internal_guard, read_at_most

        guard = internal_guard(app, internal_token)

        @app.put(METRICS_PATH + "/{index}", include_in_schema=False)
        async def put_metrics(index: int, request: Request) -> Response:
            if (refused := guard(request, f"PUT {METRICS_PATH}")) is not None:
                return refused
            body = await read_at_most(request, MAX_METRICS_BYTES)
            if body is None:
                return Response(status_code=413)
            try:
                merge_metrics([body])  # refuse what would break the merged /metrics
            except ValueError as exc:
                return Response(f"not Prometheus text: {exc}", status_code=400)
            self.latest[index] = body
            return Response(status_code=204)


async def push_metrics(render: Callable[[], bytes], control_url: str, index: int, internal_token: str,
                       every_s: float = METRICS_PUSH_S) -> None:
    """The worker's side: its own metrics to the control plane, every `every_s`, until cancelled."""
    url = f"{control_url.rstrip('/')}{METRICS_PATH}/{index}"
    headers = {"authorization": f"Bearer {internal_token}", "content-type": "text/plain"}
    async with httpx.AsyncClient(trust_env=False, timeout=10) as client:
        while True:
            try:
                response = await client.put(url, content=render(), headers=headers)
                if response.status_code != 204:
                    log.warning("metrics-push-refused status=%d", response.status_code)
            except httpx.HTTPError as exc:
                log.debug("metrics-push-failed: %s", type(exc).__name__)
            await asyncio.sleep(every_s)


# --- the parent's side --------------------------------------------------------------------------------


class WorkerSupervisor:
    """Starts `count` worker processes from `config_for(index)`, restarts any that exits while
    running (backoff 0.5 s doubling to 10 s; reset after a minute up), stops them all on `stop`."""

    def __init__(self, config_for: Callable[[int], WorkerConfig], count: int, *, what: str = "gateway-worker") -> None:
        self.config_for = config_for
        self.count = count
        self.what = what
        self.processes: dict[int, asyncio.subprocess.Process] = {}
        self.restarts = 0
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False

    @property
    def pids(self) -> dict[int, int]:
        return {index: p.pid for index, p in self.processes.items() if p.returncode is None}

    async def start(self, ready_timeout_s: float = 60.0) -> None:
        """Start every worker and wait until each listens (WorkerStartError if one does not)."""
        ready = [await self._spawn(index) for index in range(1, self.count + 1)]
        for index in range(1, self.count + 1):
            self._tasks.append(asyncio.create_task(self._watch(index), name=f"{self.what}-{index}"))
        try:
            async with asyncio.timeout(ready_timeout_s):
                done = await asyncio.gather(*ready)
        except TimeoutError:
            done = [False]
        if not all(done):
            await self.stop()
            raise WorkerStartError(f"{self.count} gateway worker process(es) did not all start listening within "
                                   f"{ready_timeout_s:.0f}s; see the log lines above (run with -v for more)")

    async def _spawn(self, index: int) -> Awaitable[bool]:
        """Start worker `index`; returns what resolves to True once it listens (False if it died first)."""
        read_end, write_end = os.pipe()
        try:
            config = self.config_for(index).model_copy(update={"ready_fd": write_end})
            # stdout/stderr: the parent's (one log); stdin: the config, then held open as the life line.
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "plnt.gateway.workers", stdin=asyncio.subprocess.PIPE,
                env={**os.environ, "PYTHONUNBUFFERED": "1"}, pass_fds=(write_end,))
        except BaseException:
            os.close(read_end)
            raise
        finally:
            os.close(write_end)
        assert process.stdin is not None
        process.stdin.write(config.wire())
        await process.stdin.drain()
        self.processes[index] = process
        log.info("%s-started index=%d pid=%d", self.what, index, process.pid)
        return _read_ready(read_end)

    async def _watch(self, index: int) -> None:
        backoff = 0.5
        while not self._stopping:
            process = self.processes[index]
            started = time.monotonic()
            code = await process.wait()
            if self._stopping:
                return
            if time.monotonic() - started > 60:
                backoff = 0.5
            log.warning("%s-exited index=%d pid=%d code=%s: restarting in %.1fs", self.what, index, process.pid,
                        code, backoff)
            await asyncio.sleep(backoff)
            backoff = min(10.0, backoff * 2)
            if self._stopping:
                return
            try:
                ready = await self._spawn(index)
                self.restarts += 1
                if await ready:
                    log.info("%s-restarted index=%d pid=%d", self.what, index, self.processes[index].pid)
            except OSError as exc:
                log.error("%s-restart-failed index=%d: %s", self.what, index, exc)

    async def stop(self, timeout_s: float = 15.0) -> None:
        """SIGTERM (and stdin closed) to every worker, wait for them, SIGKILL what is left."""
        self._stopping = True
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        live = [p for p in self.processes.values() if p.returncode is None]
        for process in live:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
            if process.stdin is not None:
                process.stdin.close()
        try:
            async with asyncio.timeout(timeout_s):
                await asyncio.gather(*(p.wait() for p in live))
        except TimeoutError:
            for process in live:
                if process.returncode is None:
                    log.warning("%s-kill pid=%d: not stopped within %.0fs of SIGTERM", self.what, process.pid, timeout_s)
                    with contextlib.suppress(ProcessLookupError):
                        process.kill()
            await asyncio.gather(*(p.wait() for p in live), return_exceptions=True)


class WorkerStartError(ServerStartError):
    """Gateway workers did not start listening."""


async def _read_ready(fd: int) -> bool:
    """True once a byte arrives on `fd`, False on EOF (the worker exited before it listened)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[bool] = loop.create_future()
    os.set_blocking(fd, False)

    def readable() -> None:
        try:
            data = os.read(fd, 1)
        except BlockingIOError:
            return
        if not done.done():
            done.set_result(bool(data))

    loop.add_reader(fd, readable)
    try:
        return await done
    finally:
        loop.remove_reader(fd)
        os.close(fd)


# --- the worker's side --------------------------------------------------------------------------------


def _die_with_parent(parent_pid: int) -> None:
    """Linux: SIGTERM when the parent dies, whatever killed it; checked once against a parent that
    died before the call."""
    if sys.platform.startswith("linux"):
        import ctypes

        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM), 0, 0, 0)  # PR_SET_PDEATHSIG
    if os.getppid() != parent_pid:
        raise SystemExit(0)


async def _run_worker(config: WorkerConfig) -> None:
    from plnt.core.auth import TokenSet
    from plnt.gateway.role import GatewayRole, GatewayRoleConfig

    tokens = TokenSet.parse(config.tokens_text.get_secret_value() if config.tokens_text else None,
                            [t.get_secret_value() for t in config.plain_tokens], source=config.tokens_source)
    role = GatewayRole(
        GatewayRoleConfig(control_url=config.control_url, internal_token=config.internal_token.get_secret_value(),
                          host=config.host, port=config.port, tokens=tokens, max_body_bytes=config.max_body_bytes,
                          request_timeout_s=config.request_timeout_s, max_header_bytes=config.max_header_bytes,
                          header_timeout_s=config.header_timeout_s, watch_wait_s=config.watch_wait_s,
                          watch_retry_max_s=config.watch_retry_max_s, processes=config.processes,
                          cache_affinity=config.cache_affinity),
        worker_index=config.index, reuse_port=True, forward_control=config.forward_control)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    # stdin EOF: the parent is gone (or closed it to stop us).
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)

    async def life_line() -> None:
        while await reader.read(4096):
            pass
        stop.set()

    watch = asyncio.create_task(life_line())
    pushing = None
    if config.forward_control:  # plnt up's /metrics sums its workers' (each pushes its own; calls: role.py)
        pushing = asyncio.create_task(push_metrics(role.app.app.gateway.metrics.render, config.control_url,
                                                   config.index, config.internal_token.get_secret_value()))
    await role.start(wait_for_table_s=30.0)
    if config.ready_fd is not None:
        os.write(config.ready_fd, b"1")
        os.close(config.ready_fd)
    log.info("gateway-worker-up index=%d pid=%d listening=%s", config.index, os.getpid(), role.url)
    await stop.wait()
    watch.cancel()
    if pushing is not None:
        pushing.cancel()
    await role.stop()
    log.info("gateway-worker-stopped index=%d", config.index)


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C: the parent stops its workers
    line = sys.stdin.buffer.readline(MAX_CONFIG_BYTES)
    config = WorkerConfig.model_validate_json(line)
    _die_with_parent(config.parent_pid)
    logging.basicConfig(level=logging.DEBUG if config.verbose else logging.INFO, stream=sys.stderr,
                        format=f"%(asctime)s %(levelname)s %(name)s[w{config.index}] %(message)s", datefmt="%H:%M:%S")
    for noisy in ("httpx", "httpcore", "uvicorn.error"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = None
    if config.loop != "asyncio":
        with contextlib.suppress(ImportError):
            import uvloop

            loop_factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(_run_worker(config))

if __name__ == "__main__":
    main()
