"""A platform team's place on a real Gitea (tests/forge/gitea.py), set up through Gitea's API as an
administrator would: an organization `platform` with a team `deployers` (write access to its
repositories) holding a reviewer and an author, and a bot account `plnt-bot` whose tokens plnt and
its CI job use (`make_org`); then spec repositories in it (`new_site`): created with a README, the
bot as a collaborator with write access, branch protection and a webhook once plnt's address is known.
Used by the tests' fixtures (tests/forge/conftest.py) and by bench/merge_to_status.py.
"""

from __future__ import annotations

import itertools
import os
import secrets
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.conftest import EXAMPLE, GIT_ENV
from tests.forge.gitea import Account, GiteaServer

ORG = "platform"
TEAM = "deployers"
# What each token may do, in Gitea's scopes: plnt reads pull requests, reviews and permissions, posts
# statuses and comments, fetches the repository and pushes its notes; the author pushes branches.
BOT_SCOPES = ["write:repository", "write:issue", "read:organization", "read:user"]
AUTHOR_SCOPES = ["write:repository", "write:issue"]


@dataclass
class GiteaOrg:
    gitea: GiteaServer
    reviewer: Account
    author: Account
    bot: Account
    team_id: int
    plnt_token: str    # plnt up's (--forge-token-file, --git-credentials-file)
    review_token: str  # the CI job's (`plnt review --token-file`)
    author_token: str


def secret_file(path: Path, text: str) -> Path:
    """`text` in a file only its owner reads, as a mounted secret."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch(mode=0o600)
    path.write_text(text + "\n")
    return path


def ssh_key(path: Path, comment: str) -> Path:
    """A new ed25519 key pair at `path` and `path`.pub."""
    path.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)], check=True)
    return path


_repos = itertools.count(1)


class SpecSite:
    """One spec repository on the Gitea, and the author's clone of it."""

    def __init__(self, org: GiteaOrg, name: str, work: Path) -> None:
        self.org = org
        self.gitea = org.gitea
        self.project = f"{ORG}/{name}"
        self.work = work
        self._git_env = {**os.environ, **GIT_ENV, "GIT_TERMINAL_PROMPT": "0"}

    # ---- as the author, with git ----

    def git(self, *args: str) -> str:
        return subprocess.run(["git", *args], cwd=self.work, env=self._git_env, check=True, capture_output=True,
                              text=True).stdout.strip()

    def commit(self, message: str, *extra: str) -> str:
        self.git("add", "-A")
        self.git("commit", "-q", *extra, "-m", message)
        return self.git("rev-parse", "HEAD")

    def replace(self, relative: str, old: str, new: str) -> None:
        target = self.work / relative
        text = target.read_text()
        assert old in text, f"{old!r} not in {relative}"
        target.write_text(text.replace(old, new))

    def branch(self, name: str) -> None:
        """A new branch from main as it is on the forge now."""
        self.git("fetch", "-q", "origin")
        self.git("checkout", "-q", "-b", name, "origin/main")

    def push(self, branch: str) -> None:
        self.git("push", "-q", "origin", f"HEAD:refs/heads/{branch}")

    # ---- on the forge, as its users ----

    def api(self, method: str, path: str, **kwargs: Any) -> Any:
        """A call on this repository (path after /repos/OWNER/REPO)."""
        return self.gitea.api(method, f"/repos/{self.project}{path}", **kwargs)

    def open_pull(self, branch: str, title: str) -> int:
        pull = self.api("POST", "/pulls", auth=self.org.author, json={"head": branch, "base": "main", "title": title})
        return int(pull["number"])

    def review(self, pr: int, event: str, commit: str, body: str = "") -> dict[str, Any]:
        return self.api("POST", f"/pulls/{pr}/reviews", auth=self.org.reviewer,  # type: ignore[no-any-return]
                        json={"event": event, "commit_id": commit, "body": body or event.lower()})

    def merge(self, pr: int, *, force: bool = False) -> str:
        """Merge with a merge commit, as the reviewer (force: the site administrator overriding
        branch protection); the merge commit's sha."""
        auth = None if force else self.org.reviewer
        self.api("POST", f"/pulls/{pr}/merge", auth=auth, json={"Do": "merge", "force_merge": force,
                                                               "merge_message_field": f"Merge pull request #{pr}"})
        return str(self.api("GET", f"/pulls/{pr}")["merge_commit_sha"])

    def statuses(self, sha: str) -> list[dict[str, Any]]:
        """Every status posted on `sha`, oldest first (Gitea lists newest first)."""
        found: list[dict[str, Any]] = []
        page = 1
        while batch := self.api("GET", f"/statuses/{sha}", params={"limit": 50, "page": page}):
            found += batch
            page += 1
        return sorted(found, key=lambda s: s["id"])

    def latest_status(self, sha: str, context: str) -> dict[str, Any] | None:
        found = [s for s in self.statuses(sha) if s["context"] == context]
        return found[-1] if found else None

    def add_specs(self) -> None:
        """The example specs (gitops-example), as an author adds them to the repository."""
        for item in EXAMPLE.iterdir():
            target = self.work / item.name
            if item.is_dir():
                shutil.copytree(item, target, dirs_exist_ok=True)
            else:
                shutil.copy2(item, target)

    def plnt_up_options(self, directory: Path, plnt_port: int) -> list[str]:
        """What an operator passes `plnt up` next to this Gitea, from `--repo` on: the repository over
        HTTP with the bot's token (a 0600 file in `directory`), the forge API with the same token, and
        Gitea's webhook to plnt's port, signed with a new secret."""
        webhook_secret = secrets.token_hex(16)
        self.add_webhook(f"http://127.0.0.1:{plnt_port}/hooks/git", webhook_secret)
        files = {"git-credentials": f"{self.org.bot.name}:{self.org.plnt_token}", "forge-token": self.org.plnt_token,
                 "webhook-secret": webhook_secret}
        for name, text in files.items():
            secret_file(directory / name, text)
        return ["--repo", self.gitea.git_url(self.project), "--git-credentials-file", str(directory / "git-credentials"),
                "--forge", "gitea", "--forge-api-url", self.gitea.api_url, "--forge-project", self.project,
                "--forge-token-file", str(directory / "forge-token"),
                "--webhook-secret-file", str(directory / "webhook-secret")]

    def plnt_review(self, plnt: list[str], pr: int, head: str, directory: Path) -> subprocess.CompletedProcess[str]:
        """The pull request's CI job: `plnt review` (the command `plnt`) on its checkout (origin/main as
        last fetched: the base), posting on Gitea with the job's token."""
        self.git("fetch", "-q", "origin")
        token = secret_file(directory / "review-token", self.org.review_token)
        done = subprocess.run([*plnt, "review", "--repo", str(self.work), "--base", "origin/main", "--head", head,
                               "--forge", "gitea", "--api-url", self.gitea.api_url, "--project", self.project,
                               "--pr", str(pr), "--token-file", str(token), "--cache-dir", str(directory / "review-cache")],
                              capture_output=True, text=True, timeout=120, check=False)
        if done.returncode != 0:
            raise AssertionError(f"plnt review exit {done.returncode}:\n{done.stdout}\n{done.stderr}")
        return done

    def approved_pull(self, plnt: list[str], branch: str, change: Callable[[], None], directory: Path) -> tuple[int, str]:
        """A pull request as users make one: a branch from main with `change` committed and pushed, the
        pull request, `plnt review` as its CI job, the reviewer's approval of the head; (number, head)."""
        self.branch(branch)
        change()
        head = self.commit(branch)
        self.push(branch)
        pr = self.open_pull(branch, branch)
        self.plnt_review(plnt, pr, head, directory)
        self.review(pr, "APPROVED", head)
        return pr, head

    def comments(self, pr: int) -> list[dict[str, Any]]:
        return self.api("GET", f"/issues/{pr}/comments")  # type: ignore[no-any-return]

    def protect_main(self, *, dismiss_stale_approvals: bool) -> None:
        """Main as a platform team protects it: no direct pushes, one approval from the team, the
        plan check required."""
        self.api("POST", "/branch_protections", json={
            "rule_name": "main", "enable_push": False, "required_approvals": 1,
            "enable_approvals_whitelist": True, "approvals_whitelist_teams": [TEAM],
            "enable_status_check": True, "status_check_contexts": ["plnt/plan"],
            "dismiss_stale_approvals": dismiss_stale_approvals})

    def add_webhook(self, url: str, secret: str) -> int:
        hook = self.api("POST", "/hooks", json={
            "type": "gitea", "active": True, "branch_filter": "*",
            "config": {"url": url, "content_type": "json", "secret": secret},
            "events": ["push", "pull_request", "pull_request_sync", "pull_request_review_approved",
                       "pull_request_review_rejected"]})
        return int(hook["id"])


def make_org(server: GiteaServer) -> GiteaOrg:
    """The organization, its team, the reviewer, the author and the bot, with their tokens."""
    reviewer, author, bot = (server.create_user(name) for name in ("reviewer", "author", "plnt-bot"))
    server.api("POST", "/orgs", json={"username": ORG, "visibility": "private"})
    team = server.api("POST", f"/orgs/{ORG}/teams", json={
        "name": TEAM, "permission": "write", "includes_all_repositories": True,
        "units": ["repo.code", "repo.pulls", "repo.issues"]})
    for member in (reviewer, author):
        server.api("PUT", f"/teams/{team['id']}/members/{member.name}")
    # plnt reads the team's members for --approvers: Gitea shows a team only to its own members and
    # site administrators, so the bot is in it (it never reviews).
    server.api("PUT", f"/teams/{team['id']}/members/{bot.name}")
    return GiteaOrg(gitea=server, reviewer=reviewer, author=author, bot=bot, team_id=int(team["id"]),
                    plnt_token=server.create_token(bot, "plnt-up", BOT_SCOPES),
                    review_token=server.create_token(bot, "plnt-review", BOT_SCOPES),
                    author_token=server.create_token(author, "author-push", AUTHOR_SCOPES))


def new_site(org: GiteaOrg, work: Path) -> SpecSite:
    """A new repository `platform/specs-N` (README only, on main), with the bot as a collaborator, and
    the author's clone of it at `work`."""
    name = f"specs-{next(_repos)}"
    org.gitea.api("POST", f"/orgs/{ORG}/repos", json={
        "name": name, "private": True, "auto_init": True, "readme": "Default", "default_branch": "main"})
    org.gitea.api("PUT", f"/repos/{ORG}/{name}/collaborators/{org.bot.name}", json={"permission": "write"})
    url = org.gitea.git_url(f"{ORG}/{name}", org.author, org.author_token)
    subprocess.run(["git", "clone", "-q", url, str(work)], check=True, capture_output=True,
                   env={**os.environ, **GIT_ENV, "GIT_TERMINAL_PROMPT": "0"})
    return SpecSite(org, name, work)
