"""Every secret option of the CLI has a file or environment-variable form (a value on the command
line is visible to every user in `ps`). The gateway here is a small real HTTP server that answers
only to the right bearer token: a stand-in for plnt's gateway."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
from plnt.reconciler.cli.main import app
from typer.testing import CliRunner

from tests.conftest import SpecRepo
from tests.http_thread import ThreadedHttp

TOKEN = "gw-token-7f3a"


@contextmanager
def gateway_wanting(token: str) -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            ok = self.headers.get("Authorization") == f"Bearer {token}"
            body = json.dumps([] if ok else {"error": "unauthorized"}).encode()
            self.send_response(200 if ok else 401)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    with ThreadedHttp(Handler) as server:
        yield server.url


def status(url: str, tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["status", "--url", url, "--state-dir", str(tmp_path / "none"), *args], env=env)
    return result.exit_code, result.output


@pytest.mark.integration  # starts a real HTTP server standing in for a plnt gateway
def test_status_token_from_a_file_or_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PLNT_TOKEN", raising=False)
    monkeypatch.delenv("PLNT_TOKEN_FILE", raising=False)
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    with gateway_wanting(TOKEN) as url:
        code, output = status(url, tmp_path)  # no token: refused (401), and no saved state to fall back to
        assert code == 2 and "no plnt answers" in output
        assert status(url, tmp_path, "--token-file", str(token_file)) == (0, "No WorkflowRuns.\n")
        assert status(url, tmp_path, env={"PLNT_TOKEN_FILE": str(token_file)}) == (0, "No WorkflowRuns.\n")
        assert status(url, tmp_path, env={"PLNT_TOKEN": TOKEN}) == (0, "No WorkflowRuns.\n")
        empty = tmp_path / "empty"
        empty.write_text("\n")
        code, output = status(url, tmp_path, "--token-file", str(empty))
        assert code == 2 and f"{empty} is empty" in output and "--token" in output
        code, output = status(url, tmp_path, "--token-file", str(tmp_path / "missing"))
        assert code == 2 and "cannot read the secret for --token" in output


@pytest.mark.parametrize("command", [["history", "review-responder"], ["bench", "review-responder", "-n", "1"]])
def test_history_and_bench_take_a_token_file(command: list[str], tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.write_text("")
    result = CliRunner().invoke(app, [*command, "--url", "http://127.0.0.1:9", "--token-file", str(empty)])
    assert result.exit_code == 2 and f"{empty} is empty" in result.output


def test_sign_reads_the_identity_token_from_a_file_or_sigstore_id_token(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in ("GITHUB_ACTIONS", "ACTIONS_ID_TOKEN_REQUEST_URL", "SIGSTORE_ID_TOKEN", "GOOGLE_SERVICE_ACCOUNT_NAME"):
        monkeypatch.delenv(variable, raising=False)
    archive = tmp_path / "recipe.tar.gz"
    archive.write_bytes(b"archive")
    token_file = tmp_path / "oidc"
    token_file.write_text("not-a-jwt\n")
    # Each form reaches the offline check of the token (refused there, before any signing service).
    by_file = CliRunner().invoke(app, ["recipe", "sign", str(archive), "--identity-token-file", str(token_file)])
    by_env = CliRunner().invoke(app, ["recipe", "sign", str(archive)], env={"SIGSTORE_ID_TOKEN": "not-a-jwt"})
    for result in (by_file, by_env):
        assert result.exit_code == 1 and "identity token was refused" in result.output, result.output
    missing = CliRunner().invoke(app, ["recipe", "sign", str(archive)])
    assert missing.exit_code == 2 and "SIGSTORE_ID_TOKEN" in missing.output and "--identity-token-file" in missing.output


def test_the_repository_url_can_come_from_plnt_repo(spec_repo: SpecRepo, tmp_path: Path) -> None:
    """A URL with credentials belongs in the environment: `plnt plan`/`plnt up` read PLNT_REPO."""
    head = spec_repo.git("rev-parse", "HEAD")
    result = CliRunner().invoke(app, ["plan", "--base", head, "--head", head, "--format", "json"],
                                env={"PLNT_REPO": str(spec_repo.path)})
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["head"] == head


def test_log_lines_and_tracebacks_lose_url_credentials() -> None:
    import logging
    import sys

    from plnt.reconciler.cli.common import RedactingFormatter

    try:
        raise RuntimeError("git said: fatal: unable to access 'https://oauth2:tok-123@git.example/s.git/'")
    except RuntimeError:
        record = logging.LogRecord("plnt", logging.ERROR, __file__, 1, "fetch %s failed", ("https://u:tok-123@h/r",),
                                   sys.exc_info())
    line = RedactingFormatter("%(message)s").format(record)
    assert "tok-123" not in line
    assert "fetch https://***@h/r failed" in line and "https://***@git.example/s.git/" in line
