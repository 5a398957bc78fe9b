"""A small real HTTP server speaking the OCI distribution API's read side, scripted to lie: a
STAND-IN for a hostile or broken OCI registry (the real one, docker-registry, never lies).

    with LyingOci() as oci:
        oci.publish("plnt/review-responder", "1.2.0", archive_bytes, bundle_bytes)   # honest by default
        oci.blob_override[digest] = Serve(body=b"x" * 10**7)       # serve other bytes than announced
        oci.blob_override[digest] = Redirect("http://localhost:PORT/elsewhere")
        oci.status = 401                                           # every request answered 401
        oci.basic_auth = "user:password"                           # htpasswd-style Basic auth required

`oci.requests` records (method, path) of every request it parsed; `oci.sent[digest]` the bytes it
managed to write for a blob before the client stopped reading.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import Any

from tests.http_thread import ThreadedHttp

ARCHIVE_MEDIA_TYPE = "application/vnd.plnt.recipe.v1.tar+gzip"
BUNDLE_MEDIA_TYPE = "application/vnd.dev.sigstore.bundle.v0.3+json"
MANIFEST_MEDIA_TYPE = "application/vnd.oci.image.manifest.v1+json"


@dataclass
class Serve:
    """Answer a blob with these bytes (`body`) or with `chunks` of `chunk` (streamed without a length)."""

    body: bytes = b""
    chunk: bytes = b""
    chunks: int = 0


@dataclass
class Redirect:
    location: str
    status: int = 307


class LyingOci:
    def __init__(self) -> None:
        self.manifests: dict[tuple[str, str], bytes] = {}
        self.blobs: dict[str, bytes] = {}
        self.blob_override: dict[str, Serve | Redirect] = {}
        self.status: int | None = None  # answer every request with this status (401, 403, ...)
        self.basic_auth: str | None = None  # "user:password" every request must carry (Basic challenge)
        self.requests: list[tuple[str, str]] = []
        self.sent: dict[str, int] = {}
        self._http = ThreadedHttp(self._handler())

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self._http.port}"

    def __enter__(self) -> LyingOci:
        self._http.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._http.__exit__()

    def publish(self, repository: str, tag: str, archive: bytes, bundle: bytes | None = None, *,
                archive_size: int | None = None) -> dict[str, Any]:
        """An honest artifact, except for the archive's announced size when `archive_size` is given."""
        layers = [self._layer(archive, ARCHIVE_MEDIA_TYPE, archive_size)]
        if bundle is not None:
            layers.append(self._layer(bundle, BUNDLE_MEDIA_TYPE, None))
        config = b"{}"
        self.blobs[_digest(config)] = config
        manifest = {"schemaVersion": 2, "mediaType": MANIFEST_MEDIA_TYPE,
                    "config": {"mediaType": "application/vnd.plnt.recipe.config.v1+json", "digest": _digest(config),
                               "size": len(config)},
                    "layers": layers}
        self.manifests[(repository, tag)] = json.dumps(manifest).encode()
        return manifest

    def _layer(self, data: bytes, media_type: str, size: int | None) -> dict[str, Any]:
        self.blobs[_digest(data)] = data
        return {"mediaType": media_type, "digest": _digest(data), "size": len(data) if size is None else size}

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        oci = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

            def do_GET(self) -> None:  # noqa: N802
                oci.requests.append(("GET", self.path))
                if oci.status is not None:
                    return self._answer(oci.status, b'{"errors":[{"code":"UNAUTHORIZED","message":"authentication '
                                                    b'required"}]}', {"WWW-Authenticate": 'Basic realm="oci"'})
                if oci.basic_auth is not None:
                    expected = "Basic " + base64.b64encode(oci.basic_auth.encode()).decode()
                    if self.headers.get("Authorization") != expected:
                        return self._answer(401, b'{"errors":[{"code":"UNAUTHORIZED","message":"authentication '
                                                 b'required"}]}', {"WWW-Authenticate": 'Basic realm="Registry Realm"'})
                path = self.path.split("?")[0]
                if path == "/v2/":
                    return self._answer(200, b"{}")
                repository, _, rest = path.removeprefix("/v2/").rpartition("/")
                repository, kind = repository.rpartition("/")[0], repository.rpartition("/")[2]
                if kind == "manifests" and (repository, rest) in oci.manifests:
                    body = oci.manifests[(repository, rest)]
                    return self._answer(200, body, {"Content-Type": MANIFEST_MEDIA_TYPE,
                                                    "Docker-Content-Digest": _digest(body)})
                if kind == "blobs":
                    override = oci.blob_override.get(rest)
                    if isinstance(override, Redirect):
                        return self._answer(override.status, b"", {"Location": override.location})
                    if isinstance(override, Serve):
                        return self._stream(rest, override)
                    if rest in oci.blobs:
                        return self._answer(200, oci.blobs[rest])
                return self._answer(404, b'{"errors":[{"code":"NOT_FOUND","message":"not found"}]}')

            def _answer(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
                self.send_response(status)
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _stream(self, digest: str, serve: Serve) -> None:
                self.send_response(200)
                self.send_header("Connection", "close")
                if serve.body:
                    self.send_header("Content-Length", str(len(serve.body)))
                self.end_headers()
                self.close_connection = True
                parts: Iterator[bytes] = iter([serve.body]) if serve.body else (serve.chunk for _ in range(serve.chunks))
                oci.sent[digest] = 0
                try:
                    for part in parts:
                        self.wfile.write(part)
                        oci.sent[digest] += len(part)
                except OSError:  # the client stopped reading: what a cap should make it do
                    pass

        return Handler


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()
