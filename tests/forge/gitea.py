"""A real Gitea on 127.0.0.1 for tests: the binary tools/build_gitea.sh builds from the Go module
`code.gitea.io/gitea`, SQLite in a temporary directory, no front end (the API and git over HTTP need
none; templates and options are read from the module's own directory).

`GiteaServer` writes app.ini, migrates the database, creates the site administrator with Gitea's own
CLI, starts `gitea web` and stops it by PID. Everything after that goes through Gitea's REST API, as
an administrator would script it: users, organizations, teams, repositories, tokens, branch
protection and webhooks (`GiteaServer.api`).
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "tools" / "build_gitea.sh"


def gitea_bin_dir(*, build: bool = True) -> Path:
    """The directory tools/build_gitea.sh built (`gitea` and `static-root`), building it if asked."""
    done = subprocess.run(["bash", str(BUILD), *([] if build else ["--check"])], capture_output=True, text=True,
                          check=False)
    if done.returncode != 0:
        raise RuntimeError(f"tools/build_gitea.sh failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return Path(done.stdout.strip().splitlines()[-1])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class GiteaError(AssertionError):
    """A Gitea API call answered an error: the method, path, status and Gitea's message."""


@dataclass
class Account:
    name: str
    password: str
    tokens: dict[str, str] = field(default_factory=dict)  # token name -> token

    @property
    def email(self) -> str:
        return f"{self.name}@plnt.invalid"


class GiteaServer:
    """One Gitea process; `with GiteaServer(base) as gitea:` starts it and stops it by PID."""

    def __init__(self, base: Path, bin_dir: Path | None = None, *, port: int | None = None,
                 signing_key: Path | None = None) -> None:
        """signing_key: an SSH private key (its .pub beside it) Gitea signs the commits it makes with:
        a repository's first commit and every merge, as a forge feeding `--verify-commits all` must."""
        self.bin_dir = bin_dir or gitea_bin_dir()
        self.binary = self.bin_dir / "gitea"
        self.base = base
        self.port = port or _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.api_url = f"{self.url}/api/v1"
        self.config = base / "custom" / "conf" / "app.ini"
        self.log_dir = base / "log"
        self.process: subprocess.Popen[bytes] | None = None
        self.signing_key = signing_key
        self.admin = Account("site-admin", secrets.token_hex(12))
        self._env = {**os.environ, "GITEA_WORK_DIR": str(base), "HOME": str(base / "home"),
                     # Tests run as root in CI; Gitea refuses root unless told this (its own switch).
                     "GITEA_I_AM_BEING_UNSAFE_RUNNING_AS_ROOT": "true",
                     "GIT_CONFIG_NOSYSTEM": "1"}
        self._client = httpx.Client(timeout=30, trust_env=False)

    # ---- process ----

    def _write_config(self) -> None:
        self.config.parent.mkdir(parents=True, exist_ok=True)
        (self.base / "home").mkdir(exist_ok=True)
        data = self.base / "data"
        # Only what a SQLite test server needs; Gitea fills in the rest. Webhooks may go to loopback
        # (plnt runs there); Gitea refuses private and loopback targets by default.
        self.config.write_text(f"""\
APP_NAME = plnt test forge
RUN_MODE = prod
WORK_PATH = {self.base}

[server]
PROTOCOL = http
HTTP_ADDR = 127.0.0.1
HTTP_PORT = {self.port}
ROOT_URL = {self.url}/
DISABLE_SSH = true
START_SSH_SERVER = false
LFS_START_SERVER = false
OFFLINE_MODE = true
APP_DATA_PATH = {data}
STATIC_ROOT_PATH = {self.bin_dir / "static-root"}

[database]
DB_TYPE = sqlite3
PATH = {data / "gitea.db"}
SQLITE_JOURNAL_MODE = WAL

[repository]
ROOT = {self.base / "repositories"}
DEFAULT_BRANCH = main

[security]
INSTALL_LOCK = true
SECRET_KEY = {secrets.token_hex(32)}
INTERNAL_TOKEN = {secrets.token_hex(40)}
PASSWORD_HASH_ALGO = pbkdf2_hi

[oauth2]
ENABLED = false
{self._signing()}
[service]
DISABLE_REGISTRATION = true
REQUIRE_SIGNIN_VIEW = true
DEFAULT_KEEP_EMAIL_PRIVATE = true
ENABLE_NOTIFY_MAIL = false

[mailer]
ENABLED = false

[webhook]
ALLOWED_HOST_LIST = loopback
DELIVER_TIMEOUT = 10

[indexer]
ISSUE_INDEXER_TYPE = db
REPO_INDEXER_ENABLED = false

[cron]
ENABLED = false

[cron.update_checker]
ENABLED = false

[session]
PROVIDER = memory

[cache]
ADAPTER = memory

[queue]
TYPE = channel

[log]
MODE = file
LEVEL = info
ROOT_PATH = {self.log_dir}

[actions]
ENABLED = false

[packages]
ENABLED = false
""")

    def _signing(self) -> str:
        if self.signing_key is None:
            return ""
        return f"""
[repository.signing]
SIGNING_FORMAT = ssh
SIGNING_KEY = {self.signing_key}.pub
SIGNING_NAME = Gitea
SIGNING_EMAIL = gitea@plnt.invalid
INITIAL_COMMIT = always
MERGES = always
CRUD_ACTIONS = always
"""

    def _run(self, *args: str) -> str:
        done = subprocess.run([str(self.binary), "--config", str(self.config), "--work-path", str(self.base), *args],
                              env=self._env, capture_output=True, text=True, timeout=300, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"gitea {' '.join(args[:2])} failed (exit {done.returncode}):\n{done.stdout}\n{done.stderr}")
        return done.stdout

    def start(self) -> GiteaServer:
        self.base.mkdir(parents=True, exist_ok=True)
        self._write_config()
        self._run("migrate")
        self._run("admin", "user", "create", "--admin", "--username", self.admin.name, "--password", self.admin.password,
                  "--email", self.admin.email, "--must-change-password=false")
        out = open(self.base / "gitea.out", "wb")  # noqa: SIM115 (closed in stop)
        self.process = subprocess.Popen(
            [str(self.binary), "web", "--config", str(self.config), "--work-path", str(self.base)],
            env=self._env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self._out = out
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"gitea web exited ({self.process.returncode}):\n{self.output()[-3000:]}")
            try:
                if self._client.get(f"{self.url}/api/healthz").status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"gitea web did not answer within 60 s:\n{self.output()[-3000:]}")

    def output(self) -> str:
        """What gitea web wrote to stdout/stderr and its log files."""
        parts = [(self.base / "gitea.out").read_text(errors="replace") if (self.base / "gitea.out").exists() else ""]
        parts += [f.read_text(errors="replace") for f in sorted(self.log_dir.glob("*.log"))] if self.log_dir.exists() else []
        return "\n".join(parts)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        if self.process is not None:
            self._out.close()
        self._client.close()

    def __enter__(self) -> GiteaServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- REST API ----

    def api(self, method: str, path: str, *, auth: Account | str | None = None, ok: tuple[int, ...] = (),
            **kwargs: Any) -> Any:
        """One API call as `auth` (an account: basic auth; a str: a token; None: the site administrator).
        Returns the JSON body (None when empty); raises GiteaError on any status >= 400 not in `ok`."""
        headers = kwargs.pop("headers", {})
        if isinstance(auth, str):
            headers["Authorization"] = f"token {auth}"
            basic = None
        else:
            account = auth or self.admin
            basic = (account.name, account.password)
        response = self._client.request(method, f"{self.api_url}{path}", auth=basic, headers=headers, **kwargs)
        if response.status_code >= 400 and response.status_code not in ok:
            raise GiteaError(f"gitea {method} {path}: HTTP {response.status_code}: {response.text[:500]}")
        return response.json() if response.content and response.headers.get("content-type", "").startswith(
            "application/json") else None

    def create_user(self, name: str) -> Account:
        account = Account(name, secrets.token_hex(12))
        self.api("POST", "/admin/users", json={"username": name, "email": account.email, "password": account.password,
                                               "must_change_password": False})
        return account

    def create_token(self, account: Account, name: str, scopes: list[str]) -> str:
        """An API token of `account` (made with its password, as a user makes one in settings)."""
        token = self.api("POST", f"/users/{account.name}/tokens", auth=account, json={"name": name, "scopes": scopes})
        account.tokens[name] = token["sha1"]
        return str(token["sha1"])

    def git_url(self, repo: str, account: Account | None = None, token: str | None = None) -> str:
        """The repository's HTTP clone URL; with an account, carrying its token (or password)."""
        if account is None:
            return f"{self.url}/{repo}.git"
        return f"http://{account.name}:{token or account.password}@127.0.0.1:{self.port}/{repo}.git"
