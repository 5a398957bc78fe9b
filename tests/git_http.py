"""A real git server over HTTP with basic auth: git's own `git http-backend` (smart HTTP, CGI) behind
a small threaded HTTP server that checks `Authorization: Basic` first, as a forge does.

    with GitHttpServer(repos_dir, user="oauth2", password="s3cret") as server:
        url = server.url("specs.git", with_credentials=True)   # http://oauth2:s3cret@127.0.0.1:PORT/specs.git

`server.password` can be changed while it runs (a rotated token); `server.requests` records
(method, path, authorized) of every request.
"""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import quote

from tests.http_thread import ThreadedHttp


class GitHttpServer:
    def __init__(self, project_root: Path, *, user: str, password: str) -> None:
        self.project_root = project_root
        self.user = user
        self.password = password
        self.requests: list[tuple[str, str, bool]] = []
        backend = shutil.which("git-http-backend", path=subprocess.run(
            ["git", "--exec-path"], capture_output=True, text=True, check=True).stdout.strip())
        if backend is None:
            raise RuntimeError("git-http-backend not found in `git --exec-path`: install git")
        self._backend = backend
        self._http = ThreadedHttp(self._handler())

    @property
    def port(self) -> int:
        return self._http.port

    def url(self, repo: str, *, with_credentials: bool = True) -> str:
        auth = f"{quote(self.user, safe='')}:{quote(self.password, safe='')}@" if with_credentials else ""
        return f"http://{auth}127.0.0.1:{self.port}/{repo}"

    def __enter__(self) -> GitHttpServer:
        self._http.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._http.__exit__()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet test output
                pass

            def do_GET(self) -> None:  # noqa: N802
                self._serve()

            def do_POST(self) -> None:  # noqa: N802
                self._serve()

            def _authorized(self) -> bool:
                header = self.headers.get("Authorization", "")
                if not header.startswith("Basic "):
                    return False
                try:
                    user, _, password = base64.b64decode(header[6:]).decode().partition(":")
                except ValueError:
                    return False
                return (user, password) == (server.user, server.password)

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    data = bytearray()
                    while True:
                        size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                        if size == 0:
                            self.rfile.readline()
                            return bytes(data)
                        data.extend(self.rfile.read(size))
                        self.rfile.readline()
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def _serve(self) -> None:
                path, _, query = self.path.partition("?")
                authorized = self._authorized()
                server.requests.append((self.command, path, authorized))
                body = self._body() if self.command == "POST" else b""
                if not authorized:
                    self.send_response(401)
                    self.send_header("WWW-Authenticate", 'Basic realm="git"')
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                env = {
                    "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                    "GIT_PROJECT_ROOT": str(server.project_root), "GIT_HTTP_EXPORT_ALL": "1",
                    "REQUEST_METHOD": self.command, "PATH_INFO": path, "QUERY_STRING": query,
                    "CONTENT_TYPE": self.headers.get("Content-Type", ""), "CONTENT_LENGTH": str(len(body)),
                    "REMOTE_USER": server.user, "REMOTE_ADDR": "127.0.0.1",
                    "GIT_PROTOCOL": self.headers.get("Git-Protocol", ""),
                    "HTTP_CONTENT_ENCODING": self.headers.get("Content-Encoding", ""),
                }
                out = subprocess.run([server._backend], input=body, env=env, capture_output=True, check=False).stdout
                head, _, payload = out.partition(b"\r\n\r\n")
                status, headers = 200, []
                for line in head.decode("latin-1").split("\r\n"):
                    name, _, value = line.partition(":")
                    if name.lower() == "status":
                        status = int(value.strip().split()[0])
                    elif name:
                        headers.append((name, value.strip()))
                self.send_response(status)
                for name, value in headers:
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        return Handler
