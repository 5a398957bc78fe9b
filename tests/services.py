"""Real local services for tests: an OCI registry (CNCF distribution) and an S3 emulator (moto).

Each listens on 127.0.0.1 on a port picked at start, and is stopped by the PID it was started
with. A missing binary FAILS the test with how to install it (these are not optional).

Fixtures (registered for every test through tests/conftest.py):
  - `oci_registry` (session): OciServer(address="127.0.0.1:PORT", storage=Path) of `docker-registry serve`.
  - `s3_server` (session): the endpoint URL of `moto_server`.
  - `s3_bucket` (function): a fresh bucket on it, as S3Bucket; also points boto3's standard credential
    chain at dummy credentials for the test (monkeypatch), so code under test that builds its own
    client never reads the machine's AWS configuration or instance metadata.

Helpers: `free_port()`, `TruncatingProxy` (a TCP proxy that breaks one response off midway).
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import pytest
from plnt.reconciler.drivers.processes import free_port

S3_REGION = "us-east-1"
S3_ACCESS_KEY = "plnt-test-access-key"
S3_SECRET_KEY = "plnt-test-secret-key"




class OciServer(NamedTuple):
    address: str  # "127.0.0.1:PORT"
    storage: Path  # the registry's storage.filesystem.rootdirectory

    def blob_file(self, digest: str) -> Path:
        """Where distribution keeps a blob's bytes."""
        algorithm, _, hexdigest = digest.partition(":")
        return self.storage / "docker" / "registry" / "v2" / "blobs" / algorithm / hexdigest[:2] / hexdigest / "data"


class S3Bucket(NamedTuple):
    endpoint_url: str
    name: str
    region: str
    client: Any  # a boto3 S3 client with explicit dummy credentials

    def url(self, prefix: str = "recipes") -> str:
        return f"s3://{self.name}/{prefix}" if prefix else f"s3://{self.name}"


class _Process:
    """A started service: its Popen and its log file."""

    def __init__(self, argv: list[str], log: Path, *, cwd: Path | None = None) -> None:
        self.log = log
        self._log_handle = open(log, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(argv, stdout=self._log_handle, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     cwd=cwd, start_new_session=True)

    def wait_ready(self, url: str, *, ok: tuple[int, ...], timeout_s: float = 20.0) -> None:
        deadline = time.monotonic() + timeout_s
        with httpx.Client(trust_env=False, timeout=1.0) as client:
            while True:
                if self.proc.poll() is not None:
                    pytest.fail(f"{self.proc.args[0]} exited with {self.proc.returncode} before it was ready:\n{self.tail()}")
                try:
                    if client.get(url).status_code in ok:
                        return
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    self.stop()
                    pytest.fail(f"{self.proc.args[0]} not ready at {url} after {timeout_s} s:\n{self.tail()}")
                time.sleep(0.05)

    def tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()  # this PID only
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self._log_handle.close()


@pytest.fixture(scope="session")
def oci_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OciServer]:
    """A real OCI registry (CNCF distribution 2.8, `docker-registry serve`) for the session."""
    with running_oci_registry(tmp_path_factory.mktemp("oci-registry")) as server:
        yield server


@contextlib.contextmanager
def running_oci_registry(base: Path) -> Iterator[OciServer]:
    """`docker-registry serve` on a free port of 127.0.0.1 (of the calling thread's network namespace),
    storing under `base`, until the block ends."""
    binary = shutil.which("docker-registry")
    if binary is None:
        pytest.fail("docker-registry not found on PATH: install CNCF distribution with `apt-get install -y docker-registry` "
                    "(the tests run `docker-registry serve CONFIG.yml` themselves; no service needs to be enabled)")
    storage = base / "storage"
    storage.mkdir()
    port = free_port()
    config = base / "config.yml"
    config.write_text(
        "version: 0.1\n"
        "log: {level: warn, accesslog: {disabled: true}}\n"
        f"storage: {{filesystem: {{rootdirectory: {storage}}}, delete: {{enabled: true}}}}\n"
        f"http: {{addr: 127.0.0.1:{port}}}\n"
    )
    process = _Process([binary, "serve", str(config)], base / "registry.log")
    try:
        process.wait_ready(f"http://127.0.0.1:{port}/v2/", ok=(200,))
        yield OciServer(address=f"127.0.0.1:{port}", storage=storage)
    finally:
        process.stop()


def _moto_server_argv() -> list[str]:
    beside_python = Path(sys.executable).parent / "moto_server"
    if beside_python.exists():
        return [str(beside_python)]
    found = shutil.which("moto_server")
    if found is None:
        pytest.fail(f"moto_server not found: install it into the test environment with "
                    f"`{Path(sys.executable).parent / 'pip'} install 'moto[server]'`")
    return [found]


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real S3 emulator (moto_server) for the session; yields its endpoint URL."""
    argv = _moto_server_argv()
    base = tmp_path_factory.mktemp("moto")
    port = free_port()
    process = _Process([*argv, "-H", "127.0.0.1", "-p", str(port)], base / "moto.log", cwd=base)
    endpoint = f"http://127.0.0.1:{port}"
    try:
        process.wait_ready(f"{endpoint}/moto-api/", ok=(200,))
        yield endpoint
    finally:
        process.stop()


def s3_client(endpoint_url: str, **config: Any) -> Any:
    """A boto3 S3 client for the emulator with explicit dummy credentials."""
    import boto3
    from botocore.config import Config

    return boto3.session.Session().client(
        "s3", endpoint_url=endpoint_url, region_name=S3_REGION,
        aws_access_key_id=S3_ACCESS_KEY, aws_secret_access_key=S3_SECRET_KEY,
        config=Config(s3={"addressing_style": "path"}, **config),
    )


@pytest.fixture
def s3_bucket(s3_server: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> S3Bucket:
    """A fresh, empty bucket; boto3's standard chain sees dummy credentials for this test only."""
    missing = tmp_path / "no-aws-config"
    for variable in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN",
                     "AWS_ROLE_ARN", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                     "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3",
                     "HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", S3_ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", S3_SECRET_KEY)
    monkeypatch.setenv("AWS_DEFAULT_REGION", S3_REGION)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(missing))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(missing))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    client = s3_client(s3_server)
    name = f"plnt-test-{uuid.uuid4().hex[:16]}"
    client.create_bucket(Bucket=name)
    return S3Bucket(endpoint_url=s3_server, name=name, region=S3_REGION, client=client)


class TruncatingProxy:
    """A TCP proxy on 127.0.0.1 in front of `upstream` ("host:port"). On the first connection it
    forwards only `cut_after` bytes of the upstream's answer, then closes both sides (the client sees
    a connection dropped mid-response); later connections are forwarded whole. `cuts` counts the
    connections it broke off."""

    def __init__(self, upstream: str, *, cut_after: int) -> None:
        host, _, port = upstream.rpartition(":")
        self._upstream = (host, int(port))
        self._cut_after = cut_after
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.connections = 0
        self.cuts = 0
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._closed = False
        self._thread = threading.Thread(target=self._accept, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> TruncatingProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._closed = True
        self._listener.close()
        with self._lock:
            for sock in self._sockets:
                _close(sock)
        self._thread.join(timeout=5)

    def _accept(self) -> None:
        self._listener.settimeout(0.05)  # close() alone does not wake a blocked accept()
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            client.settimeout(None)
            try:
                upstream = socket.create_connection(self._upstream)
            except OSError:
                _close(client)
                continue
            with self._lock:
                self.connections += 1
                first = self.connections == 1
                self._sockets += [client, upstream]
            limit = self._cut_after if first else None
            threading.Thread(target=self._pump, args=(client, upstream, None), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, limit), daemon=True).start()

    def _pump(self, source: socket.socket, target: socket.socket, limit: int | None) -> None:
        sent = 0
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                if limit is not None and sent + len(data) >= limit:
                    target.sendall(data[: limit - sent])
                    with self._lock:
                        self.cuts += 1
                    break
                target.sendall(data)
                sent += len(data)
        except OSError:
            pass
        finally:
            _close(source)
            _close(target)


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()
