"""Forge client: the plan comment on a pull request, commit statuses, the PR of a commit and its
approvals, and opening a pull request (plnt scale, plnt rollback), on GitHub, GitLab and Gitea REST
APIs (async, httpx).

Endpoints, fields and headers follow each forge's documentation; they are tested against a declared
stand-in (tests/forge_standin.py), not against a live forge.

Errors say what to do next: `ForgeUnavailable` (retry later: 5xx, timeouts, rate limits, and an
answer that is not the API's: a body that is not JSON or JSON of another shape, e.g. a proxy's page),
`ForgeRefused` (a human must fix the token: 401/403), `ForgeNotFound` (404), `ForgeBadRequest`
(the forge rejected the request's content, e.g. GitHub's 1,000 statuses per sha and context).
The token is sent in a header only and never appears in logs, errors or reprs.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
import time
from collections.abc import AsyncIterator
from typing import Any, Literal, Protocol, TypeVar, cast
from urllib.parse import quote

import httpx
from plnt.reconciler.redact import redact
from pydantic import AliasChoices, BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

log = logging.getLogger(__name__)

State = Literal["pending", "success", "failure", "error"]
ForgeKind = Literal["github", "gitlab", "gitea"]

# Room kept in each comment for the hidden marker and the "(part i/n)" header.
_RESERVE = 200


class ForgeError(Exception):
    """A forge request failed; the subclass says what to do next."""


class ForgeUnavailable(ForgeError):
    """Retry later: the forge is down, slow or rate-limiting us (retry_after in seconds when told)."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class ForgeRefused(ForgeError):
    """Needs a human: the token is missing, wrong or lacks the named permission."""


class ForgeNotFound(ForgeError):
    """The project, pull request, commit or comment does not exist (or the token cannot see it)."""


class ForgeBadRequest(ForgeError):
    """The forge rejected the request's content (400/422); retrying the same request will not help."""


class CommentRef(BaseModel):
    id: int
    created: bool  # False: an existing comment was updated in place


class PullRequest(BaseModel):
    number: int
    head_sha: str
    merged: bool
    state: str  # open, closed or merged, on every forge
    base_ref: str | None = None  # the branch it targets (merges into), when the forge says


class OpenedPullRequest(BaseModel):
    """A pull request (GitLab: merge request) plnt opened: its number and the page a person reviews it on."""

    number: int
    url: str


class CommitStatus(BaseModel):
    state: State  # plnt's names on every forge (GitLab's failed/canceled read back as failure/error)
    context: str
    description: str
    target_url: str | None = None


class Review(BaseModel):
    reviewer: str
    state: str  # upper case: APPROVED, CHANGES_REQUESTED, COMMENTED, ...
    commit_id: str | None  # the head the review was made on; None when the forge cannot say
    reviewer_id: int | None = None  # the forge's numeric user id (GitLab's member lookups need it)
    official: bool | None = None  # Gitea: the reviewer was one whose approval the branch rule counts


class Access(BaseModel):
    """What the forge says a reviewer may do on the repository: whether their approval may count."""

    reviewer: str
    may_approve: bool  # GitHub/Gitea: write, maintain, admin or owner; GitLab: Maintainer or Owner
    level: str         # in the forge's words: "read", "maintain", "Developer (30)", "none"
    needs: str         # what may approve there, for the reason a review did not count
    why: str | None = None  # the reason in the forge's own terms, when "LEVEL permission only" would not say it


class Forge(Protocol):
    kind: str
    comment_limit: int
    description_limit: int
    reviews_after_merge: bool

    async def upsert_comment(self, pr: int, body: str, marker: str) -> CommentRef: ...
    async def upsert_comments(self, pr: int, parts: list[str], marker: str) -> list[CommentRef]: ...
    async def set_status(self, sha: str, state: State, context: str, description: str,
                         target_url: str | None = None) -> bool: ...
    async def commit_status(self, sha: str, context: str) -> CommitStatus | None: ...
    async def pull_request_for_commit(self, sha: str) -> PullRequest | None: ...
    async def pull_request(self, number: int) -> PullRequest: ...
    async def approvals(self, pr: int) -> list[Review]: ...
    async def open_pull_request(self, head: str, base: str, title: str, body: str) -> OpenedPullRequest: ...
    async def access(self, review: Review) -> Access: ...
    async def in_team(self, team: str, review: Review) -> bool: ...
    async def aclose(self) -> None: ...


# ---- the answers plnt reads, field by field (other fields are ignored) ----
# Every JSON body goes through _Base._read: a body that is not JSON, or JSON of another shape, is
# ForgeUnavailable naming the endpoint and what was wrong, never a KeyError or AttributeError later.

class _Answer(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class _Id(_Answer):
    id: int


class _Comment(_Answer):
    id: int
    body: str | None = None
    system: bool = False  # GitLab's "added 1 commit" notes


class _Login(_Answer):
    login: str


class _Sha(_Answer):
    sha: str


class _Ref(_Answer):
    ref: str | None = None


class _GitHubPull(_Answer):
    number: int
    state: str
    head: _Sha
    base: _Ref | None = None
    merged_at: str | None = None  # GitHub
    merged: bool | None = None    # Gitea


class _GitHubOpened(_Answer):
    number: int
    html_url: str


class _GitLabOpened(_Answer):
    iid: int
    web_url: str


class _GitHubStatus(_Answer):
    context: str
    state: str = Field(validation_alias=AliasChoices("state", "status"))  # Gitea names it `status`
    description: str | None = None
    target_url: str | None = None


class _GitHubCombined(_Answer):
    statuses: list[_GitHubStatus] | None  # Gitea: null when the commit has none


class _GitHubReview(_Answer):
    user: _Login | None = None  # null: a deleted account
    state: str
    commit_id: str | None = None
    dismissed: bool = False  # Gitea
    official: bool | None = None  # Gitea


class _RepoPermission(_Answer):
    permission: str
    role_name: str | None = None


class _TeamMembership(_Answer):
    state: str  # active or pending (invited, not yet a member)


class _GiteaTeam(_Answer):
    id: int
    name: str


class _GiteaTeams(_Answer):
    data: list[_GiteaTeam]


class _GitLabStatus(_Answer):
    name: str
    status: str
    description: str | None = None
    target_url: str | None = None


class _GitLabMR(_Answer):
    iid: int
    sha: str
    state: str
    target_branch: str | None = None


class _GitLabApprovalSettings(_Answer):
    reset_approvals_on_push: bool


class _GitLabUser(_Answer):
    id: int
    username: str


class _GitLabApprover(_Answer):
    user: _GitLabUser


class _GitLabApprovals(_Answer):
    approved_by: list[_GitLabApprover]


class _GitLabMember(_Answer):
    access_level: int
    state: str | None = None  # active, blocked, awaiting


T = TypeVar("T")


@functools.cache
def _adapter(shape: Any) -> TypeAdapter[Any]:
    return TypeAdapter(shape)


def marker_tag(marker: str) -> str:
    """The hidden HTML comment a forge renders as nothing."""
    return f"<!-- {marker} -->"


def split_body(markdown: str, limit: int) -> list[str]:
    """`markdown` in parts of at most `limit - _RESERVE` chars, cut at line boundaries (a longer line
    is cut hard), each headed `(part i/n)` when there is more than one."""
    budget = limit - _RESERVE
    if budget <= 0:
        raise ValueError(f"limit {limit} leaves no room for a comment body")
    if len(markdown) <= budget:
        return [markdown]
    chunks: list[str] = []
    current = ""
    for line in markdown.splitlines(keepends=True):
        while len(line) > budget:  # one line alone is too long: cut it
            if current:
                chunks.append(current)
                current = ""
            chunks.append(line[:budget])
            line = line[budget:]
        if len(current) + len(line) > budget:
            chunks.append(current)
            current = ""
        current += line
    if current:
        chunks.append(current)
    n = len(chunks)
    return [f"(part {i}/{n})\n\n{chunk}" for i, chunk in enumerate(chunks, 1)]


def _next_link(link: str | None) -> str | None:
    """The rel="next" URL of a Link header (GitHub, Gitea)."""
    for part in (link or "").split(","):
        m = re.match(r'\s*<([^>]+)>\s*;.*rel="?next"?', part)
        if m:
            return m.group(1)
    return None


class _Base:
    kind: str = ""
    comment_limit = 65_536
    description_limit = 140
    # Whether an approval can still be given once the pull request is merged (what releases a held
    # merge). Gitea refuses it (ErrSubmitReviewOnClosedPR, seen on a real Gitea); not checked elsewhere.
    reviews_after_merge = True
    page_param = "per_page"
    # Permissions named in ForgeRefused, by operation, as each forge documents them.
    permissions: dict[str, str] = {}

    def __init__(self, api_url: str, project: str, token: str, *, per_page: int = 100, attempts: int = 4,
                 backoff: float = 0.5, max_retry_after: float = 60.0, timeout: float = 30.0,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        if not re.fullmatch(r"[^/\s]+(/[^/\s]+)+", project):
            raise ValueError(f"project must look like OWNER/REPO, got {project!r}")
        self.api_url = api_url.rstrip("/")
        self.project = project
        self._token = token
        self.per_page = per_page
        self.attempts = attempts
        self.backoff = backoff
        self.max_retry_after = max_retry_after
        self._client = httpx.AsyncClient(headers=self._auth_headers(token), timeout=timeout, transport=transport)

    def __repr__(self) -> str:  # never the token
        return f"{type(self).__name__}(api_url={self.api_url!r}, project={self.project!r})"

    def _auth_headers(self, token: str) -> dict[str, str]:
        raise NotImplementedError

    async def aclose(self) -> None:
        await self._client.aclose()

    async def __aenter__(self) -> _Base:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def _clean(self, text: str) -> str:
        return redact(text, self._token)

    def _where(self, method: str, url: str | httpx.URL) -> str:
        """The forge, the verb and the path (never the query or the token): what errors name."""
        return self._clean(f"{self.kind} {method} {httpx.URL(url).path}")

    def _read(self, resp: httpx.Response, shape: type[T]) -> T:
        """The one checked reader of forge answers: `shape` (a pydantic model or list of them) read from
        the JSON body, or ForgeUnavailable saying what came instead (bodies are not quoted: they may be
        large, and are not the forge's API)."""
        where = f"{self._where(resp.request.method, resp.request.url)}: HTTP {resp.status_code}"
        try:
            data = resp.json()
        except ValueError:  # json.JSONDecodeError and UnicodeDecodeError both are
            ctype = resp.headers.get("content-type") or "no content type"
            raise ForgeUnavailable(f"{where} answered {len(resp.content)} bytes of {ctype} that are not JSON (not the "
                                   "forge's API: a proxy, login or maintenance page in front of it?)") from None
        try:
            return cast(T, _adapter(shape).validate_python(data))
        except ValidationError as e:
            first = e.errors(include_url=False, include_input=False)[0]
            at = ".".join(str(part) for part in first["loc"]) or "the body"
            more = f" (and {e.error_count() - 1} more)" if e.error_count() > 1 else ""
            raise ForgeUnavailable(f"{where} answered JSON of an unexpected shape: {at}: {first['msg']}{more} (not the "
                                   "forge's documented API: a proxy in front of it, or an API version plnt does not "
                                   "know)") from None

    async def _get(self, path: str, op: str, shape: type[T], *, params: dict[str, Any] | None = None) -> T:
        return self._read(await self._request("GET", path, op, params=params), shape)

    async def _request(self, method: str, url: str, op: str, *, params: dict[str, Any] | None = None,
                       json: Any = None) -> httpx.Response:
        """One call, retried with backoff while the forge is unavailable; errors typed by what to do."""
        if not url.startswith("http"):
            url = self.api_url + url
        where = self._where(method, url)
        last: ForgeUnavailable | None = None
        for attempt in range(1, self.attempts + 1):
            try:
                resp = await self._client.request(method, url, params=params, json=json)
            except httpx.TransportError as e:  # timeouts, refused connections, resets
                last = ForgeUnavailable(f"{where}: {type(e).__name__}")
                delay = self.backoff * 2 ** (attempt - 1)
            else:
                status = resp.status_code
                rate_limited = status == 429 or (status == 403 and (
                    "retry-after" in resp.headers or resp.headers.get("x-ratelimit-remaining") == "0"))
                if status < 400:
                    return resp
                if rate_limited or status >= 500:
                    retry_after = _retry_after(resp)
                    if retry_after is None and resp.headers.get("x-ratelimit-remaining") == "0":
                        retry_after = _until_reset(resp)  # GitHub's primary limit: wait for its reset
                    last = ForgeUnavailable(f"{where}: HTTP {status}", retry_after)
                    delay = retry_after if retry_after is not None else self.backoff * 2 ** (attempt - 1)
                    if delay > self.max_retry_after:  # do not sleep for minutes inside one call
                        raise last
                elif status in (401, 403):
                    need = self.permissions.get(op, "access to this project")
                    raise ForgeRefused(f"{where}: HTTP {status} ({'invalid or missing token' if status == 401 else 'forbidden'});"
                                       f" the token needs {need}")
                elif status == 404:
                    raise ForgeNotFound(f"{where}: HTTP 404 (or the token cannot see it)")
                else:
                    raise ForgeBadRequest(f"{where}: HTTP {status}: {self._clean(resp.text[:300])}")
            if attempt < self.attempts:
                log.warning("%s: %s; retry %d/%d in %.2fs", where, last, attempt, self.attempts - 1, delay)
                await asyncio.sleep(delay)
        assert last is not None
        raise last

    async def _pages(self, path: str, op: str, item: type[T]) -> AsyncIterator[T]:
        """Every item of a paginated list: following Link rel=next (GitHub, Gitea) or x-next-page (GitLab)."""
        url: str | None = self.api_url + path
        params: dict[str, Any] | None = {self.page_param: self.per_page, "page": 1}
        while url:
            resp = await self._request("GET", url, op, params=params)
            for one in self._read(resp, list[item]):  # type: ignore[valid-type]
                yield one
            url, params = self._next_page(resp, url, params)

    def _next_page(self, resp: httpx.Response, url: str,
                   params: dict[str, Any] | None) -> tuple[str | None, dict[str, Any] | None]:
        nxt = _next_link(resp.headers.get("link"))
        if not nxt:
            return None, None
        # Only the next link's query (page, per_page/limit) is taken, on our own URL: the token goes with
        # every request, and the link's host and path may differ (GitHub's /repositories/{id}/..., a
        # Gitea ROOT_URL other than the address we reach it at).
        return url.split("?")[0], dict(httpx.URL(nxt).params)

    # ---- comments (per forge: paths and verbs) ----

    def _comments_path(self, pr: int) -> str:
        raise NotImplementedError

    def _comment_path(self, pr: int, comment_id: int) -> str:
        raise NotImplementedError

    update_verb = "PATCH"

    async def _list_comments(self, pr: int) -> list[_Comment]:
        return [c async for c in self._pages(self._comments_path(pr), "comment", _Comment)]

    async def _write_comment(self, pr: int, existing: int | None, body: str) -> CommentRef:
        if existing is None:
            resp = await self._request("POST", self._comments_path(pr), "comment", json={"body": body})
            return CommentRef(id=self._read(resp, _Id).id, created=True)
        await self._request(self.update_verb, self._comment_path(pr, existing), "comment", json={"body": body})
        return CommentRef(id=existing, created=False)

    async def _delete_comment(self, pr: int, comment_id: int) -> None:
        await self._request("DELETE", self._comment_path(pr, comment_id), "comment")

    def _with_marker(self, body: str, marker: str) -> str:
        tag = marker_tag(marker)
        text = body if tag in body else f"{tag}\n{body}"
        if len(text) > self.comment_limit:
            raise ValueError(f"comment of {len(text)} chars exceeds the {self.kind} limit {self.comment_limit}: split_body it")
        return text

    async def upsert_comment(self, pr: int, body: str, marker: str) -> CommentRef:
        """Update in place the one comment carrying `marker`, or create it; never a second one."""
        tag = marker_tag(marker)
        text = self._with_marker(body, marker)
        found = [c.id for c in await self._list_comments(pr) if tag in (c.body or "")]
        ref = await self._write_comment(pr, found[0] if found else None, text)
        for dup in found[1:]:  # a duplicate from a past race: keep only the first
            await self._delete_comment(pr, dup)
        return ref

    async def upsert_comments(self, pr: int, parts: list[str], marker: str) -> list[CommentRef]:
        """One comment per part (markers `marker:1`, `marker:2`, ...); parts left over from a longer
        earlier plan, and a comment posted under the bare `marker` by `upsert_comment`, are deleted."""
        numbered = re.compile(re.escape(f"<!-- {marker}:") + r"(\d+) -->")
        by_part: dict[int, list[int]] = {}
        for c in await self._list_comments(pr):
            body = c.body or ""
            m = numbered.search(body)
            if m:
                by_part.setdefault(int(m.group(1)), []).append(c.id)
            elif marker_tag(marker) in body:
                by_part.setdefault(0, []).append(c.id)  # part 0 never exists: deleted below
        refs = []
        for i, part in enumerate(parts, 1):
            ids = by_part.pop(i, [])
            refs.append(await self._write_comment(pr, ids[0] if ids else None, self._with_marker(part, f"{marker}:{i}")))
            for dup in ids[1:]:
                await self._delete_comment(pr, dup)
        for ids in by_part.values():  # parts beyond the new count
            for cid in ids:
                await self._delete_comment(pr, cid)
        return refs

    def _truncate(self, description: str) -> str:
        if len(description) <= self.description_limit:
            return description
        return description[: self.description_limit - 1] + "…"


def _retry_after(resp: httpx.Response) -> float | None:
    value = resp.headers.get("retry-after")
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None  # an HTTP date: fall back to our own backoff


def _until_reset(resp: httpx.Response) -> float | None:
    """Seconds until `x-ratelimit-reset` (epoch seconds), as GitHub documents for its primary limit."""
    try:
        return max(0.0, float(resp.headers["x-ratelimit-reset"]) - time.time())
    except (KeyError, ValueError):
        return None


class GitHubForge(_Base):
    """GitHub REST (api_url e.g. https://api.github.com); PR comments are issue comments."""

    kind = "github"
    comment_limit = 65_536
    description_limit = 140
    permissions = {
        "comment": "'Pull requests: write' (fine-grained token) or the 'repo' / 'public_repo' scope (classic)",
        "status": "'Commit statuses: write' (fine-grained token) or the 'repo:status' scope (classic)",
        "read": "'Pull requests: read' and 'Contents: read' (fine-grained token) or the 'repo' scope (classic)",
        "open": "'Pull requests: write' (fine-grained token) or the 'repo' scope (classic)",
        "members": "'Metadata: read' on the repository and, for --approvers teams, 'Members: read' on the "
                   "organization (fine-grained token), or the 'repo' and 'read:org' scopes (classic)",
    }
    # Repository permissions whose approval counts (GitHub's `permission` says write for the maintain role).
    approving = ("write", "admin")
    approving_needs = "write, maintain or admin permission"

    def _auth_headers(self, token: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {token}", "Accept": "application/vnd.github+json",
                "X-GitHub-Api-Version": "2022-11-28"}

    @property
    def _repo(self) -> str:
        return f"/repos/{self.project}"

    def _comments_path(self, pr: int) -> str:
        return f"{self._repo}/issues/{pr}/comments"

    def _comment_path(self, pr: int, comment_id: int) -> str:
        return f"{self._repo}/issues/comments/{comment_id}"

    async def set_status(self, sha: str, state: State, context: str, description: str,
                         target_url: str | None = None) -> bool:
        """Post the status unless the context's latest one already says the same (False then): one
        status per change, never a flood (GitHub keeps at most 1,000 per sha and context)."""
        body: dict[str, Any] = {"state": state, "context": context, "description": self._truncate(description)}
        if target_url:
            body["target_url"] = target_url
        latest = await self.commit_status(sha, context)
        if latest is not None and (latest.state, latest.description, latest.target_url) == (
                state, body["description"], target_url):
            return False
        await self._request("POST", f"{self._repo}/statuses/{sha}", "status", json=body)
        return True

    async def commit_status(self, sha: str, context: str) -> CommitStatus | None:
        """The latest status of `context` on `sha` (the combined status lists the latest of each)."""
        combined = await self._get(f"{self._repo}/commits/{sha}/status", "status", _GitHubCombined,
                                   params={self.page_param: 100})
        return _latest_of(combined.statuses or [], context)

    async def pull_request(self, number: int) -> PullRequest:
        return _github_pull(await self._get(f"{self._repo}/pulls/{number}", "read", _GitHubPull))

    async def pull_request_for_commit(self, sha: str) -> PullRequest | None:
        prs = [_github_pull(p) async for p in self._pages(f"{self._repo}/commits/{sha}/pulls", "read", _GitHubPull)]
        return _pick(prs, sha)

    async def open_pull_request(self, head: str, base: str, title: str, body: str) -> OpenedPullRequest:
        """POST /repos/{owner}/{repo}/pulls (GitHub and Gitea): branch `head` into `base`."""
        opened = self._read(await self._request("POST", f"{self._repo}/pulls", "open", json={
            "head": head, "base": base, "title": title, "body": body}), _GitHubOpened)
        return OpenedPullRequest(number=opened.number, url=opened.html_url)

    async def approvals(self, pr: int) -> list[Review]:
        # A deleted account's review (user null) is left out: no one can say what it may approve.
        # Gitea marks reviews made on an older head `stale`; commit_id says which head either way.
        return [Review(reviewer=r.user.login, state=r.state.upper(), commit_id=r.commit_id)
                async for r in self._pages(f"{self._repo}/pulls/{pr}/reviews", "read", _GitHubReview)
                if r.user is not None and not r.dismissed]

    async def access(self, review: Review) -> Access:
        """The reviewer's permission on the repository (GitHub and Gitea: GET collaborators/{user}/permission)."""
        try:
            p = await self._get(f"{self._repo}/collaborators/{quote(review.reviewer, safe='')}/permission", "members",
                                _RepoPermission)
        except ForgeNotFound:  # no such account (any account may read a public repository)
            return Access(reviewer=review.reviewer, may_approve=False, level="none", needs=self.approving_needs)
        return Access(reviewer=review.reviewer, may_approve=p.permission in self.approving,
                      level=p.role_name or p.permission, needs=self.approving_needs)

    async def in_team(self, team: str, review: Review) -> bool:
        """`team` (ORG/TEAM_SLUG) has the reviewer as an active member (a pending invitation is not one)."""
        org, slug = team.split("/", 1)
        try:
            m = await self._get(f"/orgs/{quote(org, safe='')}/teams/{quote(slug, safe='')}/memberships/"
                                f"{quote(review.reviewer, safe='')}", "members", _TeamMembership)
        except ForgeNotFound:
            return False
        return m.state == "active"


class GiteaForge(GitHubForge):
    """Gitea REST (api_url e.g. https://gitea.example/api/v1): GitHub-like paths; pages by `limit`."""

    kind = "gitea"
    reviews_after_merge = False
    comment_limit = 65_536  # not documented; GitHub's, as a safe limit
    description_limit = 255  # not documented; conservative
    page_param = "limit"
    permissions = {
        "comment": "the 'write:issue' scope",
        "status": "the 'write:repository' scope",
        "read": "the 'read:repository' scope",
        "open": "the 'write:repository' scope and write access to the repository",
        # Gitea shows an organization's teams only to its members (seen on Gitea 1.26: 403 otherwise).
        "members": "the 'read:repository' scope; for --approvers teams, 'read:organization' with the token's "
                   "account a member of each team; for a review without Gitea's `official` flag, the token's "
                   "account a repository administrator (Gitea shows others' permissions to no one else)",
    }
    approving = ("write", "admin", "owner")
    # Gitea's official reviewers: write access, or the approvals allowlist of the branch's protection rule.
    approving_needs = ("write permission, or a place on the approvals allowlist of the branch's protection "
                       "rule when it has one")

    def _auth_headers(self, token: str) -> dict[str, str]:
        return {"Authorization": f"token {token}", "Accept": "application/json"}

    # Gitea's review states (REQUEST_CHANGES, COMMENT) in GitHub's words, which plnt judges by.
    STATES: dict[str, str] = {"REQUEST_CHANGES": "CHANGES_REQUESTED", "COMMENT": "COMMENTED"}

    async def approvals(self, pr: int) -> list[Review]:
        # As GitHub's, with Gitea's state names mapped and its `official` flag kept: whether the branch's
        # protection rule (its approvals allowlist, else write access) counted the reviewer when they reviewed.
        return [Review(reviewer=r.user.login, state=self.STATES.get(r.state.upper(), r.state.upper()),
                       commit_id=r.commit_id, official=r.official)
                async for r in self._pages(f"{self._repo}/pulls/{pr}/reviews", "read", _GitHubReview)
                if r.user is not None and not r.dismissed]

    async def access(self, review: Review) -> Access:
        """Gitea's own verdict on the review (`official`), when it carries one: reading another user's
        permission needs a repository administrator's token on Gitea, which plnt should not need."""
        if review.official is None:
            return await super().access(review)
        return Access(reviewer=review.reviewer, may_approve=review.official,
                      level="official reviewer" if review.official else "not an official reviewer",
                      needs=self.approving_needs,
                      why=None if review.official else f"not an official reviewer on Gitea (needs {self.approving_needs})")

    async def commit_status(self, sha: str, context: str) -> CommitStatus | None:
        """As GitHub's, through every page (Link rel=next): Gitea's combined status holds at most 50
        contexts a page (the most recently updated first), so on a busy commit an older `plnt/plan`
        is on a later page."""
        url: str | None = f"{self.api_url}{self._repo}/commits/{sha}/status"
        params: dict[str, Any] | None = {self.page_param: self.per_page, "page": 1}
        while url:
            resp = await self._request("GET", url, "status", params=params)
            found = _latest_of(self._read(resp, _GitHubCombined).statuses or [], context)
            if found is not None:
                return found
            url, params = self._next_page(resp, url, params)
        return None

    async def pull_request_for_commit(self, sha: str) -> PullRequest | None:
        # Gitea documents GET /repos/{owner}/{repo}/commits/{sha}/pull: one PR, 404 when none.
        try:
            p = await self._get(f"{self._repo}/commits/{sha}/pull", "read", _GitHubPull)
        except ForgeNotFound:
            return None
        return _github_pull(p)

    async def in_team(self, team: str, review: Review) -> bool:
        """Gitea names teams, not slugs: the team is found by name in its organization, then asked for the member.
        Gitea lists a team only to its members and site administrators (and answers 403 for the
        members of a team one is not in): a team not found is a token that cannot see it, or a wrong name,
        never "not a member", which would drop every approval from it without saying why."""
        org, name = team.split("/", 1)
        found = await self._get(f"/orgs/{quote(org, safe='')}/teams/search", "members", _GiteaTeams, params={"q": name})
        ids = [t.id for t in found.data if t.name.lower() == name.lower()]
        if not ids:
            raise ForgeRefused(f"gitea: team {team} is not visible to plnt's token (Gitea lists a team only to its "
                               "members and site administrators): add the token's account to the team, or "
                               "check the name")
        try:
            await self._get(f"/teams/{ids[0]}/members/{quote(review.reviewer, safe='')}", "members", _Login)
        except ForgeNotFound:
            return False
        return True


class GitLabForge(_Base):
    """GitLab REST v4 (api_url e.g. https://gitlab.com/api/v4); the project path is URL-encoded as its id."""

    kind = "gitlab"
    comment_limit = 1_000_000
    description_limit = 255  # not documented; conservative
    update_verb = "PUT"
    permissions = {
        "comment": "the 'api' scope and at least the Reporter role on the project",
        "status": "the 'api' scope and at least the Developer role on the project",
        "read": "the 'read_api' scope and at least the Reporter role on the project",
        "open": "the 'api' scope and at least the Developer role on the project",
        "members": "the 'read_api' scope and at least the Reporter role on the project (and on each --approvers group)",
    }
    # GitLab's default for a protected branch is "Allowed to merge: Maintainers": an approval counts from
    # the Maintainer role up, not from Developer (who may push to unprotected branches only).
    APPROVING_LEVEL = 40
    ROLES: dict[int, str] = {0: "No access", 5: "Minimal access", 10: "Guest", 15: "Planner", 20: "Reporter",
                             30: "Developer", 40: "Maintainer", 50: "Owner"}
    # plnt's states to GitLab's (pending, running, success, failed, canceled).
    STATES: dict[str, str] = {"pending": "pending", "success": "success", "failure": "failed", "error": "failed"}
    STATES_BACK: dict[str, State] = {"pending": "pending", "running": "pending", "success": "success",
                                     "failed": "failure", "canceled": "error"}

    def _auth_headers(self, token: str) -> dict[str, str]:
        return {"PRIVATE-TOKEN": token}

    @property
    def _proj(self) -> str:
        return f"/projects/{quote(self.project, safe='')}"

    def _next_page(self, resp: httpx.Response, url: str,
                   params: dict[str, Any] | None) -> tuple[str | None, dict[str, Any] | None]:
        nxt = resp.headers.get("x-next-page", "").strip()
        if not nxt:
            return None, None
        return url.split("?")[0], {self.page_param: self.per_page, "page": int(nxt)}

    def _comments_path(self, pr: int) -> str:
        return f"{self._proj}/merge_requests/{pr}/notes"

    def _comment_path(self, pr: int, comment_id: int) -> str:
        return f"{self._proj}/merge_requests/{pr}/notes/{comment_id}"

    async def _list_comments(self, pr: int) -> list[_Comment]:
        # System notes ("added 1 commit") are never ours.
        return [c for c in await super()._list_comments(pr) if not c.system]

    async def set_status(self, sha: str, state: State, context: str, description: str,
                         target_url: str | None = None) -> bool:
        """Post the status unless the latest one of that name already says the same (False then)."""
        body: dict[str, Any] = {"state": self.STATES[state], "name": context, "description": self._truncate(description)}
        if target_url:
            body["target_url"] = target_url
        latest = await self.commit_status(sha, context)
        if latest is not None and (self.STATES[latest.state], latest.description, latest.target_url) == (
                body["state"], body["description"], target_url):
            return False
        try:
            await self._request("POST", f"{self._proj}/statuses/{sha}", "status", json=body)
            return True
        except ForgeBadRequest as e:
            # GitLab refuses pending->pending and running->running (HTTP 400 "Cannot transition status
            # via ..."), where GitHub accepts a repeat: the state asked for already holds. (The
            # description of that status then stays the earlier one: GitLab cannot update it in place.)
            if body["state"] in ("pending", "running") and "Cannot transition status" in str(e):
                log.debug("gitlab status %s on %s already %s", context, sha[:12], body["state"])
                return False
            raise

    async def commit_status(self, sha: str, context: str) -> CommitStatus | None:
        # Without `all`, GitLab lists only the latest status of each name.
        latest = await self._get(f"{self._proj}/repository/commits/{sha}/statuses", "status", list[_GitLabStatus],
                                 params={"name": context, "per_page": 100})
        for s in latest:
            if s.name == context:
                return CommitStatus(state=self.STATES_BACK.get(s.status, "error"), context=context,
                                    description=s.description or "", target_url=s.target_url)
        return None

    async def pull_request(self, number: int) -> PullRequest:
        return _gitlab_pull(await self._get(f"{self._proj}/merge_requests/{number}", "read", _GitLabMR))

    async def pull_request_for_commit(self, sha: str) -> PullRequest | None:
        mrs = await self._get(f"{self._proj}/repository/commits/{sha}/merge_requests", "read", list[_GitLabMR])
        return _pick([_gitlab_pull(m) for m in mrs], sha)

    async def open_pull_request(self, head: str, base: str, title: str, body: str) -> OpenedPullRequest:
        """POST /projects/:id/merge_requests: a merge request of branch `head` into `base`."""
        opened = self._read(await self._request("POST", f"{self._proj}/merge_requests", "open", json={
            "source_branch": head, "target_branch": base, "title": title, "description": body}), _GitLabOpened)
        return OpenedPullRequest(number=opened.iid, url=opened.web_url)

    async def approvals(self, pr: int) -> list[Review]:
        """GitLab approvals carry no commit id. They are bound to the MR's head read before and after
        them, and only when the project resets approvals on push (`reset_approvals_on_push`), so an
        approval listed then is one made on that head. Otherwise commit_id is None: not bindable."""
        mr_path = f"{self._proj}/merge_requests/{pr}"
        try:
            rules = await self._get(f"{self._proj}/approvals", "read", _GitLabApprovalSettings)
            resets = rules.reset_approvals_on_push
        except ForgeNotFound:  # approval settings not available on this tier
            resets = False
        before = (await self._get(mr_path, "read", _GitLabMR)).sha
        data = await self._get(f"{mr_path}/approvals", "read", _GitLabApprovals)
        after = (await self._get(mr_path, "read", _GitLabMR)).sha
        if before != after:
            raise ForgeUnavailable(f"gitlab: merge request {pr} was pushed to while reading its approvals; retry")
        commit = after if resets else None
        return [Review(reviewer=a.user.username, state="APPROVED", commit_id=commit, reviewer_id=a.user.id)
                for a in data.approved_by]

    def _member_access(self, review: Review, member: _GitLabMember | None) -> Access:
        needs = f"the {self.ROLES[self.APPROVING_LEVEL]} role or above"
        if member is None:
            return Access(reviewer=review.reviewer, may_approve=False, level="none (not a member)", needs=needs)
        active = member.state in (None, "active")
        level = f"{self.ROLES.get(member.access_level, 'access level')} ({member.access_level})"
        return Access(reviewer=review.reviewer, may_approve=active and member.access_level >= self.APPROVING_LEVEL,
                      level=level if active else f"{level}, {member.state}", needs=needs)

    async def _member(self, group_or_project: str, review: Review) -> _GitLabMember | None:
        """The reviewer's membership, inherited ones included (members/all); None when not a member."""
        if review.reviewer_id is None:  # approvals always carry it; a review from elsewhere may not
            raise ForgeBadRequest(f"gitlab: no user id for {review.reviewer!r}: its membership cannot be looked up")
        try:
            return await self._get(f"{group_or_project}/members/all/{review.reviewer_id}", "members", _GitLabMember)
        except ForgeNotFound:
            return None

    async def access(self, review: Review) -> Access:
        return self._member_access(review, await self._member(self._proj, review))

    async def in_team(self, team: str, review: Review) -> bool:
        """`team` is a group's full path (GROUP/SUBGROUP): the reviewer is an active member of it."""
        member = await self._member(f"/groups/{quote(team, safe='')}", review)
        return member is not None and member.state in (None, "active")


_STATES = ("pending", "success", "failure", "error")


def _latest_of(statuses: list[_GitHubStatus], context: str) -> CommitStatus | None:
    """The status of `context` in a combined status (which lists the latest of each context)."""
    for s in statuses:
        if s.context.lower() == context.lower():
            # Gitea answers "" for no link: read as None, the "no link" it was set with.
            return CommitStatus(state=s.state if s.state in _STATES else "error", context=s.context,
                                description=s.description or "", target_url=s.target_url or None)
    return None


def _github_pull(p: _GitHubPull) -> PullRequest:
    """GitHub says merged_at, Gitea merged; both say state open/closed. Merged reads as state "merged"."""
    merged = p.merged_at is not None if "merged_at" in p.model_fields_set else bool(p.merged)
    return PullRequest(number=p.number, head_sha=p.head.sha, merged=merged, state="merged" if merged else p.state,
                       base_ref=p.base.ref if p.base else None)


def _gitlab_pull(m: _GitLabMR) -> PullRequest:
    """GitLab's opened/closed/locked/merged read as open/closed/merged, as on the other forges."""
    state = {"opened": "open", "locked": "open"}.get(m.state, m.state)
    return PullRequest(number=m.iid, head_sha=m.sha, merged=m.state == "merged", state=state,
                       base_ref=m.target_branch)


def _pick(prs: list[PullRequest], sha: str) -> PullRequest | None:
    """The PR that brought `sha`: a merged one first, then one whose head is `sha`, then any."""
    for ok in (lambda p: p.merged, lambda p: p.head_sha == sha, lambda p: True):
        for p in prs:
            if ok(p):
                return p
    return None


def make_forge(kind: str, api_url: str, project: str, token: str, **options: Any) -> GitHubForge | GitLabForge | GiteaForge:
    classes: dict[str, type[GitHubForge] | type[GitLabForge] | type[GiteaForge]] = {
        "github": GitHubForge, "gitlab": GitLabForge, "gitea": GiteaForge}
    if kind not in classes:
        raise ValueError(f"unknown forge {kind!r}: one of {', '.join(classes)}")
    return classes[kind](api_url, project, token, **options)
