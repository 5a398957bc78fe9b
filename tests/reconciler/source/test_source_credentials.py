"""Credentials in the repository URL, against a real git server over HTTP with basic auth
(`git http-backend`, tests/git_http.py): git gets them, nothing else does."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from plnt.reconciler.source.git import GitSource, SourceError, redact, split_credentials

from tests.conftest import SpecRepo
from tests.git_http import GitHttpServer

TOKEN = "glpat-Zq7Xk2tokenNEVERLOGGED"


@pytest.fixture
def git_server(spec_repo: SpecRepo, tmp_path: Path) -> Iterator[GitHttpServer]:
    """The example spec repository, served as specs.git to `oauth2:TOKEN` only."""
    repos = tmp_path / "served"
    repos.mkdir()
    subprocess.run(["git", "clone", "-q", "--bare", str(spec_repo.path), str(repos / "specs.git")], check=True)
    with GitHttpServer(repos, user="oauth2", password=TOKEN) as server:
        yield server


def files_holding(root: Path, secret: str) -> list[str]:
    return [str(p) for p in root.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]


def test_redact_and_split() -> None:
    assert redact(f"fatal: unable to access 'https://oauth2:{TOKEN}@gitlab.example/x.git/': 403") == \
        "fatal: unable to access 'https://***@gitlab.example/x.git/': 403"
    assert redact("https://ghp_tokenAsUser@github.com/a/b") == "https://***@github.com/a/b"
    assert redact("ssh://git@host/x and git@github.com:a/b") == "ssh://git@host/x and git@github.com:a/b"
    assert redact(f"echoed {TOKEN} bare", TOKEN) == "echoed *** bare"
    assert split_credentials(f"https://oauth2:{TOKEN}@h:8443/x.git") == ("https://h:8443/x.git", "oauth2", TOKEN)
    assert split_credentials("https://u:p%40ss@h/x") == ("https://h/x", "u", "p@ss")
    assert split_credentials("ssh://git@h/x") == ("ssh://git@h/x", None, None)


@pytest.mark.integration  # a real git server
def test_credentials_reach_git_only(git_server: GitHttpServer, spec_repo: SpecRepo, tmp_path: Path,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # A user-wide `credential.helper store` would write any credential that worked to ~/.git-credentials.
    home = tmp_path / "home"
    home.mkdir()
    (home / ".gitconfig").write_text("[credential]\n\thelper = store\n")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("GIT_TRACE", str(tmp_path / "git-trace.log"))  # every command line git runs

    source = GitSource(git_server.url("specs.git"), tmp_path / "clone")
    assert source.fetch() == spec_repo.git("rev-parse", "HEAD")

    assert TOKEN not in source.url and source.url == git_server.url("specs.git", with_credentials=False)
    assert (False in {a for _, _, a in git_server.requests}) and (True in {a for _, _, a in git_server.requests}), \
        "git asked, and then sent the credential"
    assert files_holding(tmp_path / "clone", TOKEN) == [], "the clone's config keeps the URL without the token"
    assert not (home / ".git-credentials").exists(), "no other credential helper saw the token"
    trace = (tmp_path / "git-trace.log").read_text()
    assert "git fetch" in trace or "clone" in trace
    assert TOKEN not in trace, "the token is on no command line (ps shows those)"


@pytest.mark.integration  # a real git server
def test_a_refused_token_is_a_clear_retryable_error_without_the_token(git_server: GitHttpServer,
                                                                       tmp_path: Path) -> None:
    url = git_server.url("specs.git")
    git_server.password = "rotated"
    with pytest.raises(SourceError) as caught:
        GitSource(url, tmp_path / "clone").fetch()
    message = str(caught.value)
    assert TOKEN not in message and TOKEN not in repr(caught.value.__cause__)
    assert f"cannot clone http://127.0.0.1:{git_server.port}/specs.git" in message
    assert "check the credentials in the repository URL" in message
    assert caught.value.retryable


@pytest.mark.integration  # a real git server
def test_a_clone_that_kept_a_token_in_its_config_is_replaced(git_server: GitHttpServer, tmp_path: Path) -> None:
    """A clone made by an older plnt, with the token in remote.origin.url, is recloned without it."""
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", "--bare", git_server.url("specs.git"), str(clone)], check=True,
                   capture_output=True)
    assert files_holding(clone, TOKEN)
    GitSource(git_server.url("specs.git"), clone).fetch()
    assert files_holding(clone, TOKEN) == []


def test_settings_do_not_show_the_repository_url() -> None:
    from plnt.reconciler.settings import Settings

    settings = Settings(repo=f"https://oauth2:{TOKEN}@gitlab.example/specs.git")
    assert TOKEN not in repr(settings) and TOKEN not in str(settings)
    assert settings.source.repo.endswith("@gitlab.example/specs.git")  # GitSource still gets it whole


@pytest.mark.integration  # a real git server
def test_a_credentials_file_reaches_git_only(git_server: GitHttpServer, spec_repo: SpecRepo, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """--git-credentials-file (a mounted Secret in the chart): USER:TOKEN, as a URL's user info would be."""
    monkeypatch.setenv("GIT_TRACE", str(tmp_path / "git-trace.log"))
    secret = tmp_path / "credentials"
    secret.write_text(f"oauth2:{TOKEN}\n")
    source = GitSource(git_server.url("specs.git", with_credentials=False), tmp_path / "clone", credentials_file=secret)
    assert source.fetch() == spec_repo.git("rev-parse", "HEAD")
    assert files_holding(tmp_path / "clone", TOKEN) == []
    assert TOKEN not in (tmp_path / "git-trace.log").read_text()
    git_server.password = "rotated"
    with pytest.raises(SourceError) as caught:
        GitSource(git_server.url("specs.git", with_credentials=False), tmp_path / "clone2",
                  credentials_file=secret).fetch()
    assert TOKEN not in str(caught.value)


def test_credentials_file_formats_and_refusals(tmp_path: Path) -> None:
    from plnt.reconciler.errors import InvalidSpec
    from plnt.reconciler.source.git import read_credentials_file

    file = tmp_path / "credentials"
    file.write_text("ghp_onlyAToken\n")
    assert read_credentials_file(file) == ("x-access-token", "ghp_onlyAToken", None)
    file.write_text("deploy:glpat-x:y\n")  # a token may hold ':'
    assert read_credentials_file(file) == ("deploy", "glpat-x:y", None)
    file.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nAAAA\n-----END OPENSSH PRIVATE KEY-----")
    assert read_credentials_file(file)[2] is not None
    file.write_text("\n")
    with pytest.raises(InvalidSpec, match="is empty: write TOKEN or USER:TOKEN"):
        read_credentials_file(file)
    file.write_text("ghp_x\n")
    with pytest.raises(InvalidSpec, match="carries credentials and --git-credentials-file"):
        GitSource(f"https://u:{TOKEN}@git.example/x.git", tmp_path / "c", credentials_file=file)
    # An ssh key: git gets it through GIT_SSH_COMMAND, from a copy only plnt's user can read.
    file.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nAAAA\n-----END OPENSSH PRIVATE KEY-----\n")
    file.chmod(0o644)
    source = GitSource("ssh://git@git.example/x.git", tmp_path / "state" / "source", credentials_file=file)
    key = tmp_path / "state" / "git-ssh-key"
    assert key.stat().st_mode & 0o077 == 0
    assert f"-i {key}" in source._git_env["GIT_SSH_COMMAND"]
    assert "StrictHostKeyChecking=accept-new" in source._git_env["GIT_SSH_COMMAND"]
