"""A DECLARED STAND-IN for GitHub, GitLab and Gitea REST APIs: not a forge, and not proof that plnt
works against a live one. This real HTTP server on 127.0.0.1 implements only the endpoints
reconciler/review/forge.py calls:

- Gitea: the shapes below marked "Gitea 1.26" were checked against a real Gitea 1.26.0 (built from
  its Go module by tools/build_gitea.sh; the pull-request flow against it is tests/forge) and its
  source (routers/api/v1, modules/structs); the rest of Gitea's answers follow its documentation.
- GitHub and GitLab: no such server can run on these machines; their request and response shapes
  remain checked only against each API's documentation.

What it models:

- auth headers (GitHub `Authorization: Bearer` + `Accept: application/vnd.github+json` +
  `X-GitHub-Api-Version: 2022-11-28`; GitLab `PRIVATE-TOKEN`; Gitea `Authorization: token`):
  401 when wrong, 403 for an operation listed in `deny` (a token without that permission);
- required fields and enums (422 on GitHub/Gitea, 400 on GitLab; stricter than Gitea 1.26, which
  stores any status state it is sent);
- pagination with a small page size (Link rel="next" on GitHub/Gitea, x-next-page on GitLab);
- GitHub's limit of 1,000 statuses per sha and context (422 beyond);
- failures queued in `fail` (status, headers) are answered before the next request is served;
- answers of the wrong shape queued in `garble` (path regex, bytes or a function of the payload): the
  next request whose path matches gets those bytes (HTTP 200, text/html) or its payload changed;
- commit statuses, Gitea 1.26: each names its state `status` (`{"id", "status", "target_url",
  "description", "url", "context", "creator", "created_at", "updated_at"}`, "" for no target_url, text
  trimmed, contexts compared exactly) while `POST /repos/{o}/{r}/statuses/{sha}` takes `state`; the
  combined status (`GET /repos/{o}/{r}/commits/{sha}/status`: `state`, `sha`, `total_count`,
  `statuses`) answers `"statuses": null` for a commit without status and at most 50 contexts (the
  latest updated); `GET /repos/{o}/{r}/statuses/{sha}` lists them all, newest first. `statuses` holds
  each as answered, with its `sha` (GitLab's: `name`/`status`; GitHub's: `context`/`state`);
- reviews, Gitea 1.26: states APPROVED, PENDING, COMMENT, REQUEST_CHANGES, REQUEST_REVIEW (`add_review`
  takes GitHub's CHANGES_REQUESTED and COMMENTED too and stores Gitea's words), each with `official`
  (an APPROVED or REQUEST_CHANGES review by a reviewer the base branch's rule counts: one on
  `approvals_allowlist`, users or ORG/TEAM, when it is set, else one with write access; a reviewer's
  newer deciding review clears `official` on their earlier ones), `stale` (made on another commit
  than the pull request's head), `dismissed`, `commit_id` and `user`;
- who may approve: GitHub and Gitea `GET /repos/{owner}/{repo}/collaborators/{user}/permission`
  ({"permission", "role_name"}), GitLab `GET /projects/:id/members/all/:user_id` and
  `GET /groups/:id/members/all/:user_id` ({"access_level", "state"}, 404 for a non-member), GitHub
  `GET /orgs/{org}/teams/{team_slug}/memberships/{user}` ({"state"}), Gitea
  `GET /orgs/{org}/teams/search?q=` then `GET /teams/{id}/members/{user}`. A user not in `access`
  has `default_access` (write, GitLab Maintainer: tests about something else need not list reviewers);
- what the token's account (`token_user`) may see on Gitea 1.26: the permission endpoint answers 403
  unless that account is a site administrator (`site_admins`), an administrator or owner of the
  repository (`access`, or the owner organization's `ORG/Owners` team), or the user asked about;
  organizations are their teams (`teams`, "ORG/TEAM" -> members; `ORG/Owners` are the owners): the
  team search answers 403 to an account in none of the organization's teams and lists only the
  teams the account is in (every team to a site administrator; an organization owner too sees only
  its own teams there), and `GET /teams/{id}/members/{user}` answers 403 "Must be a team member" to
  an organization member outside the team (not to an owner), 404 to anyone else outside it.

Comments, statuses, reviews and pull requests live in memory; every request is recorded.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

from tests.http_thread import ThreadedHttp

GITHUB_STATES = {"pending", "success", "failure", "error"}
GITEA_STATES = {"pending", "success", "failure", "error", "warning", "skipped"}
GITEA_REVIEW_STATES = {"APPROVED", "PENDING", "COMMENT", "REQUEST_CHANGES", "REQUEST_REVIEW"}
_GITEA_REVIEW_WORDS = {"CHANGES_REQUESTED": "REQUEST_CHANGES", "COMMENTED": "COMMENT"}  # GitHub's -> Gitea's
_GITEA_MAX_ITEMS = 50  # Gitea's [api] MAX_RESPONSE_ITEMS default: the most one page answers
_GITEA_DEFAULT_PAGE = 30  # [api] DEFAULT_PAGING_NUM: a page without `limit`
_GITEA_PERMISSION_403 = ("Only admins can query all permissions, repo admins can query all repo permissions, "
                         "collaborators can query only their own")
_NOW = "2026-12-01T00:00:00Z"
GITLAB_STATES = {"pending", "running", "success", "failed", "canceled"}


@dataclass
class Recorded:
    method: str
    path: str  # raw, as sent (GitLab's project id stays %2F-encoded)
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: Any


@dataclass
class ForgeStandin:
    kind: str  # github | gitlab | gitea
    project: str
    token: str
    page_size: int = 3
    deny: set[str] = field(default_factory=set)  # operations answered 403: comment, status, read, open
    fail: list[tuple[int, dict[str, str]]] = field(default_factory=list)
    comments: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    statuses: list[dict[str, Any]] = field(default_factory=list)
    reviews: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    pulls: dict[int, dict[str, Any]] = field(default_factory=dict)  # number -> {head_sha, merged, commits[, closed, base]}
    gitlab_approved_by: dict[int, list[str]] = field(default_factory=dict)
    gitlab_reset_on_push: bool = True
    requests: list[Recorded] = field(default_factory=list)
    link_base: str | None = None  # a different origin in Link headers (to test the client refuses it)
    # Wrong-shape answers: (path regex, raw bytes answered with 200 text/html, or a function of the payload).
    garble: list[tuple[str, bytes | Callable[[Any], Any]]] = field(default_factory=list)
    # Repository access by user: GitHub role (admin, maintain, write, triage, read), Gitea permission
    # (owner, admin, write, read) or GitLab access level (10..50); "none" / 0: not a collaborator/member.
    access: dict[str, str | int] = field(default_factory=dict)
    default_access: str | int | None = None  # None: write (GitHub, Gitea), Maintainer 40 (GitLab)
    teams: dict[str, set[str]] = field(default_factory=dict)  # "org/team" (GitLab: group path) -> members
    # The account the token belongs to (plnt's comments are its; on Gitea its statuses too, and it decides
    # what the token may see), Gitea's site administrators, and the approvals allowlist of the base
    # branch's protection rule on Gitea (user names and "org/team"s; None: no rule with an allowlist, so
    # a reviewer with write access is official).
    token_user: str = "plnt"
    site_admins: set[str] = field(default_factory=set)
    approvals_allowlist: set[str] | None = None

    def user_id(self, name: str) -> int:
        """A user's numeric id (GitLab, Gitea): given on first use, the same for that name afterwards."""
        with self._ids_lock:
            return self._ids.setdefault(name, 100 + len(self._ids))

    def _user_named(self, uid: int) -> str | None:
        return next((n for n, i in self._ids.items() if i == uid), None)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._ids: dict[str, int] = {}
        self._ids_lock = threading.Lock()
        self._next_id = 1000
        self._http = ThreadedHttp(self._handler())

    # ---- lifecycle ----
    def __enter__(self) -> ForgeStandin:
        self._http.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._http.__exit__(*exc)

    @property
    def api_url(self) -> str:
        return self._http.url + ("/api/v4" if self.kind == "gitlab" else "/api/v1" if self.kind == "gitea" else "")

    # ---- seeding ----
    def add_comment(self, pr: int, body: str, user: str = "someone") -> int:
        with self._lock:
            self._next_id += 1
            self.comments.setdefault(pr, []).append(self._comment(self._next_id, body, user))
            return self._next_id

    def _comment(self, cid: int, body: str, user: str) -> dict[str, Any]:
        if self.kind == "gitlab":
            return {"id": cid, "body": body, "author": {"username": user}, "system": False}
        return {"id": cid, "body": body, "user": {"login": user}}

    # ---- HTTP ----
    def _handler(self) -> type[BaseHTTPRequestHandler]:
        standin = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _serve(self) -> None:
                split = urlsplit(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:
                    body = None
                rec = Recorded(self.command, split.path, parse_qs(split.query), dict(self.headers.items()), body)
                with standin._lock:
                    standin.requests.append(rec)
                    failure = standin.fail.pop(0) if standin.fail else None
                    garbled = next((g for g in standin.garble if re.search(g[0], split.path)), None)
                    if garbled is not None:
                        standin.garble.remove(garbled)
                if failure:
                    return self._send(failure[0], {"message": "injected failure"}, failure[1])
                if garbled is not None and isinstance(garbled[1], bytes):
                    return self._send(200, garbled[1], {}, "text/html; charset=utf-8")
                status, payload, headers = standin._route(rec, f"http://{self.headers.get('Host')}")
                if garbled is not None and callable(garbled[1]):
                    payload = garbled[1](payload)
                self._send(status, payload, headers)

            def _send(self, status: int, payload: Any, headers: dict[str, str],
                      content_type: str = "application/json") -> None:
                data = payload if isinstance(payload, bytes) else b"" if payload is None else json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = _serve

        return Handler

    def _auth_error(self, rec: Recorded) -> tuple[int, Any, dict[str, str]] | None:
        h = {k.lower(): v for k, v in rec.headers.items()}
        if self.kind == "github":
            if h.get("accept") != "application/vnd.github+json" or h.get("x-github-api-version") != "2022-11-28":
                return 400, {"message": "missing Accept or X-GitHub-Api-Version header"}, {}
            ok = h.get("authorization") == f"Bearer {self.token}"
            return None if ok else (401, {"message": "Bad credentials"}, {})
        if self.kind == "gitlab":
            return None if h.get("private-token") == self.token else (401, {"message": "401 Unauthorized"}, {})
        return None if h.get("authorization") == f"token {self.token}" else (401, {"message": "token is required"}, {})

    def _page(self, rec: Recorded, items: list[Any], base: str) -> tuple[int, Any, dict[str, str]]:
        size_param = "limit" if self.kind == "gitea" else "per_page"
        page = int(rec.query.get("page", ["1"])[0])
        size = min(int(rec.query.get(size_param, [str(self.page_size)])[0]), self.page_size)
        chunk = items[(page - 1) * size: page * size]
        more = page * size < len(items)
        headers: dict[str, str] = {}
        if self.kind == "gitlab":
            headers = {"x-page": str(page), "x-per-page": str(size), "x-total": str(len(items)),
                       "x-next-page": str(page + 1) if more else ""}
        elif more:
            headers["Link"] = f'<{self.link_base or base}{rec.path}?page={page + 1}&{size_param}={size}>; rel="next"'
        return 200, chunk, headers

    def _route(self, rec: Recorded, base: str) -> tuple[int, Any, dict[str, str]]:
        err = self._auth_error(rec)
        if err:
            return err
        if self.kind == "gitlab":
            return self._gitlab(rec, base)
        return self._github_like(rec, base)

    def _denied(self, op: str) -> tuple[int, Any, dict[str, str]] | None:
        if op not in self.deny:
            return None
        msg = {"github": "Resource not accessible by personal access token", "gitlab": "403 Forbidden"}
        return 403, {"message": msg.get(self.kind, "token does not have at least one of required scope(s)")}, {}

    def _github_like(self, rec: Recorded, base: str) -> tuple[int, Any, dict[str, str]]:
        prefix = "/api/v1" if self.kind == "gitea" else ""
        repo = f"{prefix}/repos/{self.project}"
        p, m = rec.path, rec.method
        unprocessable = 422
        if mt := re.fullmatch(re.escape(repo) + r"/issues/(\d+)/comments", p):
            if denied := self._denied("comment" if m == "POST" else "read"):
                return denied
            pr = int(mt.group(1))
            if m == "GET":
                return self._page(rec, list(self.comments.get(pr, [])), base)
            if m == "POST":
                if not isinstance(rec.body, dict) or not isinstance(rec.body.get("body"), str):
                    return unprocessable, {"message": "Validation Failed: body is required"}, {}
                if self.kind == "github" and len(rec.body["body"]) > 65_536:
                    return unprocessable, {"message": "Validation Failed: body is too long (maximum is 65536 characters)"}, {}
                cid = self.add_comment(pr, rec.body["body"], self.token_user)
                return 201, self._find_comment(cid)[1], {}
        if mt := re.fullmatch(re.escape(repo) + r"/issues/comments/(\d+)", p):
            if denied := self._denied("comment"):
                return denied
            found = self._find_comment(int(mt.group(1)))
            if not found:
                return 404, {"message": "Not Found"}, {}
            pr, comment = found
            if m == "PATCH":
                if not isinstance(rec.body, dict) or not isinstance(rec.body.get("body"), str):
                    return unprocessable, {"message": "Validation Failed: body is required"}, {}
                comment["body"] = rec.body["body"]
                return 200, comment, {}
            if m == "DELETE":
                self.comments[pr].remove(comment)
                return 204, None, {}
        if mt := re.fullmatch(re.escape(repo) + r"/statuses/([0-9a-f]{7,64})", p):
            if m == "GET" and self.kind == "gitea":  # Gitea 1.26: every status of the commit, newest first
                if denied := self._denied("read"):
                    return denied
                wanted = rec.query.get("state", [None])[0]
                listed = [self._gitea_status(st) for st in reversed(self.statuses)
                          if st["sha"] == mt.group(1) and wanted in (None, st["status"])]
                return self._page(rec, listed, base)
            if m != "POST":
                return 405, {"message": "Method Not Allowed"}, {}
            if denied := self._denied("status"):
                return denied
            states = GITHUB_STATES if self.kind == "github" else GITEA_STATES
            body = rec.body if isinstance(rec.body, dict) else {}
            if body.get("state") not in states:
                return unprocessable, {"message": f"Validation Failed: state must be one of {sorted(states)}"}, {}
            sha = mt.group(1)
            if self.kind == "gitea":
                return 201, self._gitea_status(self._add_gitea_status(sha, body, base + repo)), {}
            context = body.get("context") or "default"
            if self.kind == "github":
                if len(body.get("description") or "") > 140:
                    return unprocessable, {"message": "Validation Failed: description is too long (maximum is 140 characters)"}, {}
                same = [s for s in self.statuses if s["sha"] == sha and s["context"].lower() == context.lower()]
                if len(same) >= 1000:
                    return unprocessable, {"message": "Validation Failed",
                                           "errors": [{"message": "This SHA and context has reached the maximum number of statuses."}]}, {}
            status = {"sha": sha, "state": body["state"], "context": context, "description": body.get("description"),
                      "target_url": body.get("target_url")}
            self.statuses.append(status)
            return 201, status, {}
        if mt := re.fullmatch(re.escape(repo) + r"/commits/([0-9a-f]{7,64})/status", p):
            if denied := self._denied("status"):
                return denied
            if self.kind == "gitea":
                combined, more = self._gitea_combined(mt.group(1), rec, base + repo)
                headers = {}
                if more:  # Gitea sets Link rel="next" (and X-Total-Count) on this answer too
                    page = max(int(rec.query.get("page", ["1"])[0] or 1), 1)
                    size = rec.query.get("limit", [str(_GITEA_DEFAULT_PAGE)])[0]
                    headers["Link"] = f'<{self.link_base or base}{rec.path}?page={page + 1}&limit={size}>; rel="next"'
                return 200, combined, headers
            latest: dict[str, dict[str, Any]] = {}  # the combined status: the latest of each context
            for st in self.statuses:
                if st["sha"] == mt.group(1):
                    latest[st["context"].lower()] = st
            return 200, {"sha": mt.group(1), "total_count": len(latest), "statuses": list(latest.values())[::-1]}, {}
        if mt := re.fullmatch(re.escape(repo) + r"/commits/([0-9a-f]{7,64})/pulls?", p):
            if denied := self._denied("read"):
                return denied
            sha = mt.group(1)
            prs = [self._github_pr(n, pr) for n, pr in self.pulls.items() if sha in pr["commits"]]
            if self.kind == "github" and p.endswith("/pulls"):
                return self._page(rec, prs, base)
            if self.kind == "gitea" and p.endswith("/pull"):
                return (200, prs[0], {}) if prs else (404, {"message": "Not Found"}, {})
        if p == f"{repo}/pulls" and m == "POST":
            return self._open_pull(rec, base, unprocessable)
        if (mt := re.fullmatch(re.escape(repo) + r"/pulls/(\d+)", p)) and m == "GET":
            if denied := self._denied("read"):
                return denied
            n = int(mt.group(1))
            return (200, self._github_pr(n, self.pulls[n]), {}) if n in self.pulls else (404, {"message": "Not Found"}, {})
        if mt := re.fullmatch(re.escape(repo) + r"/pulls/(\d+)/reviews", p):
            if denied := self._denied("read"):
                return denied
            n = int(mt.group(1))
            if n not in self.pulls:
                return 404, {"message": "Not Found"}, {}
            reviews = list(self.reviews.get(n, []))
            if self.kind == "gitea":  # Gitea 1.26: stale is a review made on another commit than the head
                reviews = [{**r, "stale": r["commit_id"] != self.pulls[n]["head_sha"]} for r in reviews]
            return self._page(rec, reviews, base)
        if (mt := re.fullmatch(re.escape(repo) + r"/collaborators/([^/]+)/permission", p)) and m == "GET":
            if denied := self._denied("members"):
                return denied
            if self.kind == "gitea" and not self._may_read_permission(mt.group(1)):
                return 403, {"message": _GITEA_PERMISSION_403, "url": f"{base}/api/swagger"}, {}
            return self._permission(mt.group(1))
        if mt := re.fullmatch(prefix + r"/orgs/([^/]+)/teams/([^/]+)/memberships/([^/]+)", p):
            if self.kind != "github" or (denied := self._denied("members")):
                return denied or (404, {"message": "Not Found"}, {})
            team, user = f"{mt.group(1)}/{mt.group(2)}", mt.group(3)
            if user not in self.teams.get(team, set()):
                return 404, {"message": "Not Found"}, {}
            return 200, {"url": f"{base}{p}", "role": "member", "state": "active"}, {}
        if (mt := re.fullmatch(prefix + r"/orgs/([^/]+)/teams/search", p)) and self.kind == "gitea":
            if denied := self._denied("members"):
                return denied
            org, me = mt.group(1), self.token_user
            admin = me in self.site_admins
            if not admin and me not in self._org_members(org):  # Gitea 1.26: reqOrgMembership
                return 403, {"message": "Must be an organization member", "url": f"{base}/api/swagger"}, {}
            q = rec.query.get("q", [""])[0].lower()
            # Gitea 1.26: only a site administrator searches every team; anyone else, the teams they are in.
            names = sorted((t.split("/", 1)[1] for t, members in self.teams.items()
                            if t.split("/", 1)[0] == org and (admin or me in members)), key=str.lower)
            return 200, {"ok": True, "data": [self._gitea_team(f"{org}/{n}") for n in names if q in n.lower()]}, {}
        if (mt := re.fullmatch(prefix + r"/teams/(\d+)/members/([^/]+)", p)) and self.kind == "gitea":
            if denied := self._denied("members"):
                return denied
            team = next((t for t in self.teams if self._team_id(t) == int(mt.group(1))), None)
            if team is None:
                return 404, {"message": "Not Found"}, {}
            org, me = team.split("/", 1)[0], self.token_user
            # Gitea 1.26: reqTeamMembership, a site administrator, an owner of the organization or a member of the team.
            if not (me in self.site_admins or me in self._owners(org) or me in self.teams[team]):
                if me in self._org_members(org):
                    return 403, {"message": "Must be a team member", "url": f"{base}/api/swagger"}, {}
                return 404, {"message": "Not Found"}, {}
            if mt.group(2) not in self.teams[team]:
                return 404, {"message": "Not Found"}, {}
            return 200, self._gitea_user(mt.group(2)), {}
        return 404, {"message": "Not Found"}, {}

    # ---- Gitea 1.26 ----
    def _gitea_user(self, name: str) -> dict[str, Any]:
        return {"id": self.user_id(name), "login": name, "username": name, "full_name": "",
                "email": f"{name}@noreply.localhost", "is_admin": name in self.site_admins}

    def _gitea_team(self, team: str) -> dict[str, Any]:
        return {"id": self._team_id(team), "name": team.split("/", 1)[1], "description": "", "permission": "write",
                "includes_all_repositories": True, "can_create_org_repo": False}

    def _org_members(self, org: str) -> set[str]:
        """A Gitea organization's members: the members of its teams."""
        return set().union(*(members for t, members in self.teams.items() if t.split("/", 1)[0] == org))

    def _owners(self, org: str) -> set[str]:
        return self.teams.get(f"{org}/Owners", set())

    def _gitea_level(self, user: str) -> str:
        if user in self.access:
            return str(self.access[user])
        if user in self._owners(self.project.split("/", 1)[0]):
            return "owner"
        return str(self._default_access())

    def _may_read_permission(self, user: str) -> bool:
        me = self.token_user
        return (me in self.site_admins or me.lower() == user.lower()
                or self._gitea_level(me) in ("admin", "owner"))

    def _official(self, user: str) -> bool:
        """Gitea 1.26's IsOfficialReviewer: on the allowlist (a user or a team of it) when the rule has
        one, else write access."""
        if self.approvals_allowlist is None:
            return user in self.site_admins or self._gitea_level(user) in ("write", "admin", "owner")
        return user in self.approvals_allowlist or any(
            user in self.teams.get(t, set()) for t in self.approvals_allowlist if "/" in t)

    def _add_gitea_status(self, sha: str, body: dict[str, Any], repo_url: str) -> dict[str, Any]:
        with self._lock:
            status = {"sha": sha, "id": 1 + sum(1 for st in self.statuses if st["sha"] == sha),
                      "status": body["state"], "target_url": str(body.get("target_url") or "").strip(),
                      "description": str(body.get("description") or "").strip(),
                      "url": f"{repo_url}/statuses/{sha}", "context": str(body.get("context") or "").strip(),
                      "creator": self._gitea_user(self.token_user), "created_at": _NOW, "updated_at": _NOW}
            self.statuses.append(status)
            return status

    @staticmethod
    def _gitea_status(status: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in status.items() if k != "sha"}  # the sha is the stand-in's, not in the answer

    def _gitea_combined(self, sha: str, rec: Recorded, repo_url: str) -> tuple[dict[str, Any], bool]:
        """The combined status's page, and whether another page follows."""
        latest: dict[str, dict[str, Any]] = {}  # the latest of each context (Gitea hashes it: case matters)
        for st in self.statuses:
            if st["sha"] == sha:
                latest[st["context"]] = st
        # One page of contexts, the latest updated first (Gitea paginates this too, at most 50).
        # (capped by page_size too, like every list here, so that tests reach a second page cheaply)
        size = min(int(rec.query.get("limit", ["0"])[0] or 0) or _GITEA_DEFAULT_PAGE, _GITEA_MAX_ITEMS, self.page_size)
        page = max(int(rec.query.get("page", ["1"])[0] or 1), 1)
        newest_first = sorted(latest.values(), key=lambda st: st["id"], reverse=True)
        chosen = newest_first[(page - 1) * size: page * size]
        more = len(newest_first) > page * size
        chosen.sort(key=lambda st: st["id"])
        states = [st["status"] for st in chosen]
        if any(x in ("error", "failure", "warning") for x in states):
            state = "failure"
        elif states and all(x in ("success", "skipped") for x in states):
            state = "success"
        else:
            state = "pending"
        return {"state": state, "sha": sha, "total_count": len(chosen),
                "statuses": [self._gitea_status(st) for st in chosen] or None,  # Gitea 1.26: null, not []
                "repository": {"full_name": self.project}, "commit_url": f"{repo_url}/commits/{sha}",
                "url": f"{repo_url}/commits/{sha}/status"}, more

    def _default_access(self) -> str | int:
        if self.default_access is not None:
            return self.default_access
        return 40 if self.kind == "gitlab" else "write"

    def _team_id(self, team: str) -> int:
        return 500 + sorted(self.teams).index(team)

    def _permission(self, user: str) -> tuple[int, Any, dict[str, str]]:
        role = self._gitea_level(user) if self.kind == "gitea" else str(self.access.get(user, self._default_access()))
        if self.kind == "github":  # `permission` is the legacy name: maintain reads write, triage read
            legacy = {"maintain": "write", "triage": "read"}.get(role, role)
            return 200, {"permission": legacy, "role_name": role, "user": {"login": user}}, {}
        return 200, {"permission": role, "role_name": role, "user": {"login": user}}, {}

    def _open_pull(self, rec: Recorded, base: str, invalid: int) -> tuple[int, Any, dict[str, str]]:
        """A new pull request (GitHub and Gitea: POST /repos/{o}/{r}/pulls {head, base, title, body}, 201 with
        `number` and `html_url`; GitLab: POST /projects/:id/merge_requests {source_branch, target_branch, title,
        description}, 201 with `iid` and `web_url`). Missing fields: 422 (GitLab 400); a second open pull
        request of the same branch: 422 on GitHub ("A pull request already exists"), 409 on Gitea and GitLab."""
        if denied := self._denied("open"):
            return denied
        body = rec.body if isinstance(rec.body, dict) else {}
        gitlab = self.kind == "gitlab"
        head, into = (body.get("source_branch"), body.get("target_branch")) if gitlab else (body.get("head"), body.get("base"))
        if not all(isinstance(v, str) and v for v in (head, into, body.get("title"))):
            return invalid, {"message": "Validation Failed: head, base and title are required"}, {}
        if any(pr.get("head") == head and not pr["merged"] and not pr.get("closed") for pr in self.pulls.values()):
            return (422, {"message": f"Validation Failed: A pull request already exists for {head}."}, {}) \
                if self.kind == "github" else (409, {"message": "pull request already exists for these targets"}, {})
        with self._lock:
            number = max(self.pulls, default=0) + 1
            self.pulls[number] = {"head_sha": "0" * 40, "merged": False, "commits": [], "base": into, "head": head,
                                  "title": body["title"], "body": body.get("body", body.get("description", ""))}
        if gitlab:
            return 201, {**self._gitlab_mr(number, self.pulls[number]),
                         "web_url": f"{base}/{self.project}/-/merge_requests/{number}"}, {}
        return 201, {**self._github_pr(number, self.pulls[number]), "html_url": f"{base}/{self.project}/pull/{number}"}, {}

    def _github_pr(self, n: int, pr: dict[str, Any]) -> dict[str, Any]:
        closed = pr["merged"] or pr.get("closed", False)
        out: dict[str, Any] = {"number": n, "state": "closed" if closed else "open", "head": {"sha": pr["head_sha"]},
                               "base": {"ref": pr.get("base", "main")}}
        if self.kind == "github":
            out["merged_at"] = "2026-12-01T00:00:00Z" if pr["merged"] else None
        else:
            out["merged"] = pr["merged"]
        return out

    @staticmethod
    def _gitlab_mr(n: int, pr: dict[str, Any]) -> dict[str, Any]:
        state = "merged" if pr["merged"] else "closed" if pr.get("closed") else "opened"
        return {"iid": n, "sha": pr["head_sha"], "state": state, "target_branch": pr.get("base", "main")}

    def add_review(self, pr: int, user: str, state: str, commit_id: str, *, official: bool | None = None,
                   dismissed: bool = False) -> int:
        """A review, in the forge's shape; its id. Gitea: in Gitea's words (GitHub's CHANGES_REQUESTED and
        COMMENTED are taken for theirs), `official` as Gitea 1.26 decides it unless given."""
        with self._lock:
            self._next_id += 1
            if self.kind != "gitea":
                self.reviews.setdefault(pr, []).append(
                    {"id": self._next_id, "user": {"login": user}, "state": state, "commit_id": commit_id})
                return self._next_id
            state = _GITEA_REVIEW_WORDS.get(state, state)
            if state not in GITEA_REVIEW_STATES:
                raise ValueError(f"not a Gitea review state: {state!r} (one of {sorted(GITEA_REVIEW_STATES)})")
            deciding = state in ("APPROVED", "REQUEST_CHANGES")
            if deciding:  # Gitea 1.26: only a reviewer's latest approval or change request is official
                for earlier in self.reviews.get(pr, []):
                    if earlier["user"]["login"] == user:
                        earlier["official"] = False
            self.reviews.setdefault(pr, []).append({
                "id": self._next_id, "user": self._gitea_user(user), "team": None, "state": state, "body": "",
                "commit_id": commit_id, "stale": False,
                "official": (deciding and self._official(user)) if official is None else official,
                "dismissed": dismissed, "comments_count": 0, "submitted_at": _NOW, "updated_at": _NOW})
            return self._next_id

    def _find_comment(self, cid: int) -> tuple[int, dict[str, Any]] | None:
        for pr, items in self.comments.items():
            for c in items:
                if c["id"] == cid:
                    return pr, c
        return None

    def _gitlab(self, rec: Recorded, base: str) -> tuple[int, Any, dict[str, str]]:
        proj = "/api/v4/projects/" + quote(self.project, safe="")
        p, m = rec.path, rec.method
        if mt := re.fullmatch(r"/api/v4/groups/([^/]+)/members/all/(\d+)", p):
            if denied := self._denied("members"):
                return denied
            user = self._user_named(int(mt.group(2)))
            if user is None or user not in self.teams.get(unquote(mt.group(1)), set()):
                return 404, {"message": "404 Not found"}, {}
            return 200, {"id": int(mt.group(2)), "username": user, "state": "active", "access_level": 30}, {}
        if not p.startswith(proj):
            return 404, {"message": "404 Project Not Found"}, {}
        rest = p[len(proj):]
        if mt := re.fullmatch(r"/merge_requests/(\d+)/notes", rest):
            if denied := self._denied("comment" if m == "POST" else "read"):
                return denied
            pr = int(mt.group(1))
            if m == "GET":
                return self._page(rec, list(self.comments.get(pr, [])), base)
            if m == "POST":
                if not isinstance(rec.body, dict) or not isinstance(rec.body.get("body"), str):
                    return 400, {"error": "body is missing"}, {}
                return 201, self._find_comment(self.add_comment(pr, rec.body["body"], self.token_user))[1], {}  # type: ignore[index]
        if mt := re.fullmatch(r"/merge_requests/(\d+)/notes/(\d+)", rest):
            if denied := self._denied("comment"):
                return denied
            found = self._find_comment(int(mt.group(2)))
            if not found:
                return 404, {"message": "404 Not found"}, {}
            pr, comment = found
            if m == "PUT":
                if not isinstance(rec.body, dict) or not isinstance(rec.body.get("body"), str):
                    return 400, {"error": "body is missing"}, {}
                comment["body"] = rec.body["body"]
                return 200, comment, {}
            if m == "DELETE":
                self.comments[pr].remove(comment)
                return 204, None, {}
        if mt := re.fullmatch(r"/statuses/([0-9a-f]{7,64})", rest):
            if denied := self._denied("status"):
                return denied
            body = rec.body if isinstance(rec.body, dict) else {}
            if body.get("state") not in GITLAB_STATES:
                return 400, {"error": "state does not have a valid value"}, {}
            name = body.get("name") or body.get("context") or "default"
            last = [s for s in self.statuses if s["sha"] == mt.group(1) and s["name"] == name][-1:]
            if last and last[0]["status"] == body["state"] and body["state"] in ("pending", "running"):
                verb = {"pending": "enqueue", "running": "run"}[body["state"]]
                return 400, {"message": f"Cannot transition status via :{verb} from :{body['state']} "
                                        f"(Reason(s): Status cannot transition via \"{verb}\")"}, {}
            status = {"sha": mt.group(1), "status": body["state"], "name": body.get("name") or body.get("context") or "default",
                      "description": body.get("description"), "target_url": body.get("target_url")}
            self.statuses.append(status)
            return 201, status, {}
        if mt := re.fullmatch(r"/repository/commits/([0-9a-f]{7,64})/statuses", rest):
            if denied := self._denied("status"):
                return denied
            latest_by: dict[str, dict[str, Any]] = {}  # without `all`: the latest of each name
            for st in self.statuses:
                if st["sha"] == mt.group(1):
                    latest_by[st["name"]] = st
            name = rec.query.get("name", [None])[0]
            return 200, [st for n, st in latest_by.items() if name in (None, n)], {}
        if mt := re.fullmatch(r"/repository/commits/([0-9a-f]{7,64})/merge_requests", rest):
            if denied := self._denied("read"):
                return denied
            sha = mt.group(1)
            return 200, [self._gitlab_mr(n, pr) for n, pr in self.pulls.items() if sha in pr["commits"]], {}
        if mt := re.fullmatch(r"/members/all/(\d+)", rest):
            if denied := self._denied("members"):
                return denied
            user = self._user_named(int(mt.group(1)))
            level = int(self.access.get(user, self._default_access())) if user else 0
            if not level:
                return 404, {"message": "404 Not found"}, {}
            return 200, {"id": int(mt.group(1)), "username": user, "state": "active", "access_level": level}, {}
        if rest == "/merge_requests" and m == "POST":
            return self._open_pull(rec, base, 400)
        if rest == "/approvals":
            return 200, {"reset_approvals_on_push": self.gitlab_reset_on_push}, {}
        if mt := re.fullmatch(r"/merge_requests/(\d+)(/approvals)?", rest):
            if denied := self._denied("read"):
                return denied
            n = int(mt.group(1))
            if n not in self.pulls:
                return 404, {"message": "404 Not found"}, {}
            if mt.group(2):
                return 200, {"iid": n, "approved_by": [{"user": {"id": self.user_id(u), "username": u}}
                                                       for u in self.gitlab_approved_by.get(n, [])]}, {}
            return 200, self._gitlab_mr(n, self.pulls[n]), {}
        return 404, {"message": "404 Not found"}, {}
