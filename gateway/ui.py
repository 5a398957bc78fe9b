"""The web UI's shell: static files from gateway/ui/ served at `/ui` (index.html) and `/ui/FILE`.

The shell holds no data, so it is open like `/healthz` (auth.is_ui_path): the page asks the user
for a bearer token when the API answers 401 and sends it on every data call, so the UI has
exactly the API's authentication and scopes.

Files are read once when the app is built (a few KiB, no build step) and answered from memory
with a strong ETag (`If-None-Match` gets 304) and `Cache-Control: no-cache`, so a browser
revalidates instead of running an old app.js against a newer gateway. Every answer carries a
Content-Security-Policy allowing this origin only: no inline script or style, nothing fetched
from elsewhere, no framing.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import Response

UI_DIR = Path(__file__).with_name("ui")

_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
}

CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "font-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
_SECURITY_HEADERS = {
    "content-security-policy": CONTENT_SECURITY_POLICY,
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "x-frame-options": "DENY",
}


@dataclass(frozen=True)
class StaticFile:
    body: bytes
    media_type: str
    etag: str


def load_files(directory: Path = UI_DIR) -> dict[str, StaticFile]:
    """Every servable file of `directory` by name. Raises FileNotFoundError naming the folder when
    index.html is missing (a package built without its package-data)."""
    files: dict[str, StaticFile] = {}
    for path in sorted(directory.iterdir()) if directory.is_dir() else []:
        media_type = _TYPES.get(path.suffix)
        if media_type is None or not path.is_file():
            continue
        body = path.read_bytes()
        files[path.name] = StaticFile(body, media_type, f'"{hashlib.sha256(body).hexdigest()[:32]}"')
    if "index.html" not in files:
        raise FileNotFoundError(f"the web UI's files are missing from {directory}: reinstall plnt "
                                "(pyproject.toml package-data ships gateway/ui/*)")
    return files


def _etag_matches(header: str | None, etag: str) -> bool:
    if not header:
        return False
    return header.strip() == "*" or etag in (tag.strip().removeprefix("W/") for tag in header.split(","))


def mount_ui(app: FastAPI, directory: Path = UI_DIR) -> None:
    """Add `GET /ui`, `GET /ui/` and `GET /ui/FILE` to `app` (no other path under /ui)."""
    files = load_files(directory)

    def answer(name: str, request: Request) -> Response:
        item = files.get(name)
        if item is None:
            return Response(b"not found\n", status_code=404, media_type="text/plain; charset=utf-8",
                            headers=_SECURITY_HEADERS)
        headers = {**_SECURITY_HEADERS, "etag": item.etag, "cache-control": "no-cache"}
        if _etag_matches(request.headers.get("if-none-match"), item.etag):
            return Response(status_code=304, headers=headers)
        return Response(item.body, media_type=item.media_type, headers=headers)

    @app.get("/ui", include_in_schema=False)
    async def ui_index(request: Request) -> Response:
        return answer("index.html", request)

    @app.get("/ui/{name:path}", include_in_schema=False)
    async def ui_file(name: str, request: Request) -> Response:
        return answer(name or "index.html", request)


__all__ = ["CONTENT_SECURITY_POLICY", "UI_DIR", "load_files", "mount_ui"]
