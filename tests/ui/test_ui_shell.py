"""The web UI's shell as the gateway serves it (gateway/ui.py): open without a token, strict CSP,
ETag revalidation, only its own files, and every file shipped in the package. In-process (the
FastAPI app through its test client); the browser tests are in test_browser.py."""

from __future__ import annotations

import fnmatch
import tomllib
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from plnt.core.auth import TokenSet, is_ui_path
from plnt.gateway.app import create_app
from plnt.gateway.router import Router
from plnt.gateway.ui import CONTENT_SECURITY_POLICY, UI_DIR, load_files

ROOT = Path(__file__).resolve().parents[2]


def _client(tokens: TokenSet | None = None) -> TestClient:
    app = create_app(Router(), list_workflows=lambda: [], tokens=tokens)
    return TestClient(app, base_url="http://127.0.0.1")


def test_index_and_assets_are_served_with_csp_and_etag() -> None:
    with _client() as client:
        for path, media in [("/ui", "text/html"), ("/ui/", "text/html"), ("/ui/app.js", "text/javascript"),
                            ("/ui/api.js", "text/javascript"), ("/ui/markdown.js", "text/javascript"),
                            ("/ui/app.css", "text/css")]:
            response = client.get(path)
            assert response.status_code == 200, path
            assert response.headers["content-type"].startswith(media), path
            assert response.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
            assert response.headers["x-content-type-options"] == "nosniff"
            assert response.headers["cache-control"] == "no-cache"
            again = client.get(path, headers={"If-None-Match": response.headers["etag"]})
            assert again.status_code == 304 and again.content == b"", path
        changed = client.get("/ui/app.js", headers={"If-None-Match": '"stale"'})
        assert changed.status_code == 200 and b"import" in changed.content


def test_csp_allows_this_origin_only() -> None:
    directives = dict(part.strip().split(" ", 1) for part in CONTENT_SECURITY_POLICY.split(";"))
    assert directives["default-src"] == "'none'"
    for name in ("script-src", "style-src", "connect-src"):
        assert directives[name] == "'self'", name  # no 'unsafe-inline', no other host
    assert directives["frame-ancestors"] == "'none'"


def test_shell_holds_no_external_reference_or_inline_code() -> None:
    html = (UI_DIR / "index.html").read_text()
    assert "<script>" not in html and "style=" not in html and "http://" not in html and "https://" not in html
    for name in ("app.js", "api.js", "markdown.js"):
        text = (UI_DIR / name).read_text()
        assert "innerHTML" not in text.replace("never innerHTML", ""), name
        assert "http://" not in text and "https://" not in text, name


def test_unknown_files_are_404_and_nothing_outside_the_folder() -> None:
    with _client() as client:
        assert client.get("/ui/nope.js").status_code == 404
        assert client.get("/ui/../gateway/app.py").status_code == 404
        assert client.get("/ui/%2e%2e/app.py").status_code == 404


def test_shell_is_open_but_data_needs_the_token() -> None:
    tokens = TokenSet.parse(None, ["s3cret"])
    with _client(tokens) as client:
        assert client.get("/ui").status_code == 200
        assert client.get("/ui/app.js").status_code == 200
        assert client.get("/workflows").status_code == 401
        assert client.get("/uix").status_code == 401  # a prefix of /ui is not the UI
        assert client.get("/workflows", headers={"Authorization": "Bearer s3cret"}).status_code == 200
    assert is_ui_path("/ui") and is_ui_path("/ui/app.js")
    assert not is_ui_path("/uix") and not is_ui_path("/ui-admin") and not is_ui_path("/")


def test_missing_files_name_the_folder(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=str(tmp_path)):
        load_files(tmp_path)


def test_package_data_ships_every_ui_file() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"]["plnt.gateway"]
    files = sorted(p.relative_to(UI_DIR.parent).as_posix() for p in UI_DIR.iterdir() if p.is_file())
    assert files and {"ui/index.html", "ui/app.js", "ui/app.css"} <= set(files)
    unshipped = [f for f in files if not any(fnmatch.fnmatch(f, pattern) for pattern in patterns)]
    assert unshipped == [], f"add these to [tool.setuptools.package-data] in pyproject.toml: {unshipped}"
    assert set(load_files()) == {Path(f).name for f in files}, "every shipped file is served"
