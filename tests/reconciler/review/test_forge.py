"""The forge client (reconciler/review/forge.py) against a DECLARED stand-in (tests/forge_standin.py) that
checks requests against the shapes of GitHub and GitLab REST documentation, and answers as a real
Gitea 1.26.0 does where the pull-request flow against one (tests/forge) showed it. Here no live forge."""

from __future__ import annotations

import logging
import re
import socket
import time
from collections.abc import Iterator

import pytest
from plnt.reconciler.review.forge import (
    ForgeBadRequest,
    ForgeNotFound,
    ForgeRefused,
    ForgeUnavailable,
    GitLabForge,
    PullRequest,
    Review,
    make_forge,
    marker_tag,
    split_body,
)

from tests.forge_standin import ForgeStandin

KINDS = ["github", "gitlab", "gitea"]
TOKEN = "s3cr3t-token-value-XYZ"
SHA = "a" * 40
HEAD = "b" * 40
OLD = "c" * 40


@pytest.fixture(params=KINDS)
def standin(request: pytest.FixtureRequest) -> Iterator[ForgeStandin]:
    project = "group/sub/name" if request.param == "gitlab" else "owner/repo"
    with ForgeStandin(request.param, project, TOKEN, page_size=3) as s:
        yield s


def client(s: ForgeStandin, token: str = TOKEN):  # type: ignore[no-untyped-def]
    return make_forge(s.kind, s.api_url, s.project, token, per_page=50, backoff=0.01)


def test_split_body_at_lines() -> None:
    text = "".join(f"line {i:05d} " + "x" * 80 + "\n" for i in range(2000))
    parts = split_body(text, 65_536)
    assert len(parts) > 1
    assert all(len(p) <= 65_536 - 200 for p in parts)
    assert parts[0].startswith(f"(part 1/{len(parts)})")
    # nothing lost, cut only at line ends
    assert "".join(p.split("\n\n", 1)[1] for p in parts) == text
    assert split_body("short", 65_536) == ["short"]


@pytest.mark.integration
async def test_upsert_creates_once_then_updates_across_pages(standin: ForgeStandin) -> None:
    for i in range(10):  # many other comments: the marker's comment is past several pages
        standin.add_comment(7, f"unrelated {i}")
    async with client(standin) as forge:
        first = await forge.upsert_comment(7, "plan v1", "plnt:plan")
        for i in range(4):
            standin.add_comment(7, f"later {i}")
        second = await forge.upsert_comment(7, "plan v2", "plnt:plan")
    assert first.created and not second.created and first.id == second.id
    ours = [c for c in standin.comments[7] if marker_tag("plnt:plan") in c["body"]]
    assert len(ours) == 1 and "plan v2" in ours[0]["body"]
    pages = {int(r.query["page"][0]) for r in standin.requests if r.method == "GET" and "page" in r.query}
    assert max(pages) >= 5  # 10 + 1 + 4 comments, 3 a page: every page was read
    if standin.kind == "gitlab":  # the project path is sent URL-encoded as the id
        assert all("/projects/group%2Fsub%2Fname/" in r.path for r in standin.requests)


@pytest.mark.integration
async def test_long_plan_in_parts_and_leftovers_deleted(standin: ForgeStandin) -> None:
    for i in range(5):
        standin.add_comment(3, f"noise {i}")
    limit = 2_000
    long_plan = "".join(f"- change {i}: " + "y" * 60 + "\n" for i in range(100))
    async with client(standin) as forge:
        parts = split_body(long_plan, limit)
        assert len(parts) >= 3
        refs = await forge.upsert_comments(3, parts, "plnt:plan")
        assert all(r.created for r in refs)
        ours = [c for c in standin.comments[3] if "plnt:plan:" in c["body"]]
        assert len(ours) == len(parts)
        short = split_body(long_plan[:2500], limit)
        assert 1 < len(short) < len(parts)
        refs2 = await forge.upsert_comments(3, short, "plnt:plan")
    assert not any(r.created for r in refs2)
    assert [r.id for r in refs2] == [r.id for r in refs[: len(short)]]
    ours = [c for c in standin.comments[3] if "plnt:plan:" in c["body"]]
    assert len(ours) == len(short)
    assert len([c for c in standin.comments[3] if c["body"].startswith("noise")]) == 5


@pytest.mark.integration
async def test_statuses_mapped_and_truncated(standin: ForgeStandin) -> None:
    long = "smoke p95 812ms/1000ms budget, errors 0.1%/1% " * 10
    async with client(standin) as forge:
        for state in ("pending", "success", "failure", "error"):
            await forge.set_status(SHA, state, "plnt/ns/app", long, target_url="https://ci.example/1")  # type: ignore[arg-type]
        limit = forge.description_limit
    key = "state" if standin.kind == "github" else "status"  # GitLab and Gitea answer `status`
    got = [s[key] for s in standin.statuses]
    if standin.kind == "gitlab":
        assert got == ["pending", "success", "failed"]  # error maps to failed too: unchanged, not posted again
        assert all(s["name"] == "plnt/ns/app" for s in standin.statuses)
    else:
        assert got == ["pending", "success", "failure", "error"]
        assert all(s["context"] == "plnt/ns/app" for s in standin.statuses)
    assert all(len(s["description"]) <= limit for s in standin.statuses)
    if standin.kind == "github":
        assert limit == 140


@pytest.mark.integration
async def test_github_1000_statuses_per_context_is_a_bad_request() -> None:
    with ForgeStandin("github", "owner/repo", TOKEN) as s:
        s.statuses.extend({"sha": SHA, "context": "plnt/plan", "state": "pending"} for _ in range(1000))
        async with client(s) as forge:
            with pytest.raises(ForgeBadRequest, match="maximum number of statuses"):
                await forge.set_status(SHA, "success", "plnt/plan", "ok")
            await forge.set_status(SHA, "success", "plnt/other", "ok")  # another context is fine


@pytest.mark.integration
async def test_pull_request_for_commit(standin: ForgeStandin) -> None:
    standin.pulls[12] = {"head_sha": HEAD, "merged": True, "commits": [OLD, HEAD, SHA]}
    async with client(standin) as forge:
        pr = await forge.pull_request_for_commit(SHA)
        none = await forge.pull_request_for_commit("d" * 40)
    assert pr is not None and pr.number == 12 and pr.head_sha == HEAD and pr.merged
    assert none is None


@pytest.mark.integration
async def test_open_pull_request(standin: ForgeStandin) -> None:
    """plnt scale / plnt rollback open one pull request (GitLab: merge request) of their branch; a second
    one of the same branch is the forge's refusal (a bad request), and a token that may not is refused."""
    async with client(standin) as forge:
        opened = await forge.open_pull_request("plnt/scale-review-responder-3", "main", "scale", "why")
        with pytest.raises(ForgeBadRequest) as again:
            await forge.open_pull_request("plnt/scale-review-responder-3", "main", "scale", "why")
    assert opened.number in standin.pulls and opened.url.endswith(str(opened.number))
    pull = standin.pulls[opened.number]
    assert (pull["head"], pull["base"], pull["title"], pull["body"]) == ("plnt/scale-review-responder-3", "main",
                                                                         "scale", "why")
    assert ("422" if standin.kind == "github" else "409") in str(again.value)
    [sent, *_] = [r for r in standin.requests if r.method == "POST"]
    assert set(sent.body) == ({"source_branch", "target_branch", "title", "description"} if standin.kind == "gitlab"
                              else {"head", "base", "title", "body"})
    standin.deny.add("open")
    async with client(standin) as forge:
        with pytest.raises(ForgeRefused) as denied:
            await forge.open_pull_request("plnt/other", "main", "t", "b")
    expected = {"github": "Pull requests: write", "gitlab": "Developer role", "gitea": "write:repository"}
    assert expected[standin.kind] in str(denied.value)


@pytest.mark.integration
async def test_approvals_with_commit_ids_across_pages(standin: ForgeStandin) -> None:
    standin.pulls[5] = {"head_sha": HEAD, "merged": False, "commits": [OLD, HEAD]}
    if standin.kind == "gitlab":
        standin.gitlab_approved_by[5] = ["signer-a", "signer-b"]
    else:
        standin.add_review(5, "signer-a", "APPROVED", OLD)
        for i in range(5):
            standin.add_review(5, f"c{i}", "COMMENTED", OLD)
        standin.add_review(5, "signer-b", "APPROVED", HEAD)
    async with client(standin) as forge:
        reviews = await forge.approvals(5)
    approved = {(r.reviewer, r.commit_id) for r in reviews if r.state == "APPROVED"}
    if standin.kind == "gitlab":
        # bound to the head read around them, since the project resets approvals on push
        assert approved == {("signer-a", HEAD), ("signer-b", HEAD)}
    else:
        assert approved == {("signer-a", OLD), ("signer-b", HEAD)}
        assert len(reviews) == 7  # crossed pages of 3


@pytest.mark.integration
async def test_gitlab_approvals_unbound_without_reset_on_push() -> None:
    with ForgeStandin("gitlab", "g/n", TOKEN) as s:
        s.pulls[5] = {"head_sha": HEAD, "merged": False, "commits": [HEAD]}
        s.gitlab_approved_by[5] = ["signer-a"]
        s.gitlab_reset_on_push = False
        async with client(s) as forge:
            assert isinstance(forge, GitLabForge)
            reviews = await forge.approvals(5)
    assert [(r.reviewer, r.commit_id) for r in reviews] == [("signer-a", None)]


@pytest.mark.integration
async def test_bad_token_and_missing_permission_refused(standin: ForgeStandin,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    async with client(standin, token="wrong-" + TOKEN) as forge:
        with pytest.raises(ForgeRefused) as bad:
            await forge.upsert_comment(1, "x", "plnt:plan")
        assert TOKEN not in repr(forge)
    assert "401" in str(bad.value) and TOKEN not in str(bad.value)
    standin.deny.add("status")
    async with client(standin) as forge:
        with pytest.raises(ForgeRefused) as denied:
            await forge.set_status(SHA, "pending", "plnt/plan", "x")
    msg = str(denied.value)
    assert "403" in msg and TOKEN not in msg
    expected = {"github": "Commit statuses: write", "gitlab": "Developer role", "gitea": "write:repository"}
    assert expected[standin.kind] in msg
    assert TOKEN not in caplog.text


@pytest.mark.integration
async def test_500_then_200_is_retried(standin: ForgeStandin, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    standin.fail.extend([(500, {}), (502, {})])
    async with client(standin) as forge:
        await forge.set_status(SHA, "success", "plnt/plan", "ok")
    assert len(standin.statuses) == 1
    # the status read before the post failed twice, then read and post went through
    assert [r.method for r in standin.requests] == ["GET", "GET", "GET", "POST"]
    assert "retry" in caplog.text and TOKEN not in caplog.text


@pytest.mark.integration
async def test_429_retry_after_honoured(standin: ForgeStandin) -> None:
    standin.fail.append((429, {"Retry-After": "0.3"}))
    async with client(standin) as forge:
        t0 = time.monotonic()
        await forge.set_status(SHA, "success", "plnt/plan", "ok")
        elapsed = time.monotonic() - t0
    assert elapsed >= 0.3 and len(standin.statuses) == 1


@pytest.mark.integration
async def test_unavailable_after_bounded_retries(standin: ForgeStandin, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    standin.fail.extend([(503, {})] * 10)
    async with make_forge(standin.kind, standin.api_url, standin.project, TOKEN, attempts=3, backoff=0.01) as forge:
        with pytest.raises(ForgeUnavailable):
            await forge.set_status(SHA, "success", "plnt/plan", "ok")
    assert len(standin.requests) == 3
    assert TOKEN not in caplog.text


@pytest.mark.integration
async def test_long_retry_after_not_slept() -> None:
    with ForgeStandin("github", "o/r", TOKEN) as s:
        s.fail.append((429, {"Retry-After": "3600"}))
        async with make_forge("github", s.api_url, s.project, TOKEN, max_retry_after=5) as forge:
            with pytest.raises(ForgeUnavailable) as e:
                await forge.set_status(SHA, "success", "plnt/plan", "ok")
    assert e.value.retry_after == 3600


def test_make_forge_rejects_unknown() -> None:
    with pytest.raises(ValueError):
        make_forge("bitbucket", "http://127.0.0.1:1", "o/r", TOKEN)


@pytest.mark.integration
async def test_gitlab_repeated_pending_is_not_an_error() -> None:
    # GitLab answers 400 "Cannot transition status via :enqueue from :pending" to a repeat; GitHub does not.
    with ForgeStandin("gitlab", "g/n", TOKEN) as s:
        async with client(s) as forge:
            await forge.set_status(SHA, "pending", "plnt/ns/app", "canary 10%")
            await forge.set_status(SHA, "pending", "plnt/ns/app", "canary 50%")
            await forge.set_status(SHA, "success", "plnt/ns/app", "ready")
    assert [x["status"] for x in s.statuses] == ["pending", "success"]


@pytest.mark.integration
async def test_github_secondary_rate_limit_403_is_retried() -> None:
    with ForgeStandin("github", "o/r", TOKEN) as s:
        s.fail.append((403, {"Retry-After": "0.1"}))
        async with client(s) as forge:
            await forge.set_status(SHA, "success", "plnt/plan", "ok")
    assert len(s.statuses) == 1


@pytest.mark.integration
async def test_single_comment_replaced_by_parts(standin: ForgeStandin) -> None:
    async with client(standin) as forge:
        await forge.upsert_comment(4, "short plan", "plnt:plan")
        await forge.upsert_comments(4, ["(part 1/2)\n\na", "(part 2/2)\n\nb"], "plnt:plan")
    bodies = [c["body"] for c in standin.comments[4]]
    assert len(bodies) == 2 and all("plnt:plan:" in b for b in bodies)


@pytest.mark.integration
async def test_pagination_link_host_not_followed() -> None:
    # Next links naming another host: their page is read from the API's own origin (the token stays there).
    with ForgeStandin("github", "o/r", TOKEN, link_base="http://127.0.0.2:9") as s:
        for i in range(5):
            s.add_comment(1, f"c{i}")
        s.add_comment(1, marker_tag("plnt:plan") + "\nold")
        async with client(s) as forge:
            ref = await forge.upsert_comment(1, "new", "plnt:plan")
    assert not ref.created and len(s.comments[1]) == 6
    assert {r.query.get("page", ["1"])[0] for r in s.requests if r.method == "GET"} == {"1", "2"}


@pytest.mark.integration
async def test_github_primary_rate_limit_waits_for_reset() -> None:
    with ForgeStandin("github", "o/r", TOKEN) as s:
        s.fail.append((403, {"x-ratelimit-remaining": "0", "x-ratelimit-reset": str(int(time.time()) + 3600)}))
        async with make_forge("github", s.api_url, s.project, TOKEN, max_retry_after=5) as forge:
            with pytest.raises(ForgeUnavailable) as e:
                await forge.set_status(SHA, "success", "plnt/plan", "ok")
    assert e.value.retry_after is not None and e.value.retry_after > 3000


async def test_unreachable_forge_is_unavailable(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    async with make_forge("gitea", f"http://127.0.0.1:{port}/api/v1", "o/r", TOKEN, attempts=2, backoff=0.01) as forge:
        with pytest.raises(ForgeUnavailable, match="ConnectError"):
            await forge.approvals(1)
    assert TOKEN not in caplog.text


@pytest.mark.integration
async def test_unchanged_status_is_not_posted_again(standin: ForgeStandin) -> None:
    async with client(standin) as forge:
        posted = [await forge.set_status(SHA, "pending", "plnt/ns/app", "canary 10%") for _ in range(20)]
        posted.append(await forge.set_status(SHA, "success", "plnt/ns/app", "ready"))
        posted.append(await forge.set_status(SHA, "success", "plnt/ns/app", "ready"))
    assert posted == [True] + [False] * 19 + [True, False]
    assert len(standin.statuses) == 2


@pytest.mark.integration
async def test_commit_status_reads_back_the_latest_of_a_context(standin: ForgeStandin) -> None:
    async with client(standin) as forge:
        assert await forge.commit_status(HEAD, "plnt/plan") is None
        await forge.set_status(HEAD, "pending", "plnt/plan", "planning")
        await forge.set_status(HEAD, "failure", "plnt/plan", "plan sha256:0123456789ab")
        await forge.set_status(HEAD, "success", "other/check", "fine")
        got = await forge.commit_status(HEAD, "plnt/plan")
    assert got is not None
    assert (got.state, got.context, got.description) == ("failure", "plnt/plan", "plan sha256:0123456789ab")


@pytest.mark.integration
async def test_pull_request_by_number_open_closed_merged(standin: ForgeStandin) -> None:
    standin.pulls[3] = {"head_sha": HEAD, "merged": False, "commits": [HEAD]}
    standin.pulls[4] = {"head_sha": OLD, "merged": False, "closed": True, "commits": [OLD]}
    standin.pulls[5] = {"head_sha": SHA, "merged": True, "commits": [SHA]}
    async with client(standin) as forge:
        states = [(pr.number, pr.head_sha, pr.state, pr.merged) for pr in
                  [await forge.pull_request(n) for n in (3, 4, 5)]]
        with pytest.raises(ForgeNotFound):
            await forge.pull_request(99)
    assert states == [(3, HEAD, "open", False), (4, OLD, "closed", False), (5, SHA, "merged", True)]


# --- answers of the wrong shape: classified as ForgeUnavailable, never a traceback ------------------

GARBAGE = {
    "non-UTF-8 bytes": b"\xff\xfe\x80\x81 not json \xc3\x28",
    "an HTML page": b"<!DOCTYPE html><html><body><h1>502 Bad Gateway</h1></body></html>",
    # a list where the API answers a dict (and a dict where it answers a list)
    "the other container": lambda payload: {"items": payload} if isinstance(payload, list) else [payload],
    "a dict missing keys": lambda payload: [{"message": "ok"}] if isinstance(payload, list) else {"message": "ok"},
}

# Each endpoint family: the path the garbage is answered on, and the call that reads it.
FAMILIES = {
    "comments": (r"/(issues/\d+/comments|merge_requests/\d+/notes)$",
                 lambda forge: forge.upsert_comment(5, "plan", "plnt:plan")),
    "status": (r"/commits/[0-9a-f]+/status(es)?$", lambda forge: forge.commit_status(HEAD, "plnt/plan")),
    "pulls of a commit": (r"/commits/[0-9a-f]+/(pulls?|merge_requests)$",
                          lambda forge: forge.pull_request_for_commit(HEAD)),
    "pull request": (r"/(pulls|merge_requests)/5$", lambda forge: forge.pull_request(5)),
    "reviews": (r"/(pulls/5/reviews|merge_requests/5/approvals)$", lambda forge: forge.approvals(5)),
    "permission": (r"/(collaborators/[^/]+/permission|members/all/\d+)$",
                   lambda forge: forge.access(Review(reviewer="signer-a", state="APPROVED", commit_id=HEAD,
                                                     reviewer_id=100))),
    "team": (r"/(teams/[^/]+/memberships/[^/]+|teams/search|groups/[^/]+/members/all/\d+)$",
             lambda forge: forge.in_team("acme/deployers", Review(reviewer="signer-a", state="APPROVED",
                                                                   commit_id=HEAD, reviewer_id=100))),
}


@pytest.mark.integration
@pytest.mark.parametrize("family", list(FAMILIES))
async def test_an_answer_of_the_wrong_shape_is_forge_unavailable(standin: ForgeStandin, family: str) -> None:
    """Issue 24 (5): a body that is not JSON, or JSON of another shape, on any endpoint family of any
    forge is ForgeUnavailable naming the forge, the endpoint and what was wrong (no UnicodeDecodeError,
    no AttributeError: 'list' object has no attribute 'get'), and the token is in none of it."""
    standin.pulls[5] = {"head_sha": HEAD, "merged": True, "commits": [HEAD]}
    standin.add_comment(5, "someone else's comment")
    standin.add_review(5, "signer-a", "APPROVED", HEAD)
    standin.gitlab_approved_by[5] = ["signer-a"]
    # Gitea shows a team only to its members, and another user's permission only to a repository administrator.
    standin.teams["acme/deployers"] = {"signer-a", standin.token_user}
    standin.access[standin.token_user] = "admin"
    standin.user_id("signer-a")  # GitLab: id 100, as the Review in FAMILIES says
    path, call = FAMILIES[family]
    async with client(standin) as forge:
        await forge.set_status(HEAD, "success", "plnt/plan", "plan sha256:0123456789ab")
        await call(forge)  # the endpoint answers well: the call works
        for garbage, answer in GARBAGE.items():
            standin.garble.append((path, answer))
            with pytest.raises(ForgeUnavailable) as caught:
                await call(forge)
            assert not standin.garble, f"the {family} call never read the garbled answer ({garbage})"
            msg = str(caught.value)
            assert msg.startswith(f"{standin.kind} GET /") and ": HTTP 200 answered " in msg, (garbage, msg)
            what = "that are not JSON" if isinstance(answer, bytes) else "JSON of an unexpected shape"
            assert what in msg and TOKEN not in msg and "\n" not in msg, (garbage, msg)


@pytest.mark.integration
async def test_the_shape_error_names_the_field() -> None:
    with ForgeStandin("github", "owner/repo", TOKEN) as s:
        s.pulls[5] = {"head_sha": HEAD, "merged": True, "commits": [HEAD]}
        s.garble.append((r"/pulls/5$", lambda p: {**p, "head": ["not", "a", "dict"]}))
        async with client(s) as forge:
            with pytest.raises(ForgeUnavailable) as caught:
                await forge.pull_request(5)
    assert str(caught.value).startswith("github GET /repos/owner/repo/pulls/5: HTTP 200 answered JSON of an "
                                        "unexpected shape: head: Input should be a valid dictionary")


# --- who may approve: the permission and team endpoints ------------------------------------------

@pytest.mark.integration
@pytest.mark.parametrize(("kind", "role", "may", "level"), [
    ("github", "admin", True, "admin"), ("github", "maintain", True, "maintain"), ("github", "write", True, "write"),
    ("github", "triage", False, "triage"), ("github", "read", False, "read"),
    ("gitea", "owner", True, "owner"), ("gitea", "write", True, "write"), ("gitea", "read", False, "read"),
    ("gitlab", 50, True, "Owner (50)"), ("gitlab", 40, True, "Maintainer (40)"),
    ("gitlab", 30, False, "Developer (30)"), ("gitlab", 20, False, "Reporter (20)"),
    ("gitlab", 0, False, "none (not a member)"),
])
async def test_access_as_the_forge_reports_it(kind: str, role: str | int, may: bool, level: str) -> None:
    with ForgeStandin(kind, "owner/repo", TOKEN) as s:
        s.access["alice"] = role
        s.access[s.token_user] = "admin"  # Gitea answers another user's permission only to a repository admin
        # (a Review without Gitea's `official`: the client asks the permission endpoint)
        review = Review(reviewer="alice", state="APPROVED", commit_id=HEAD, reviewer_id=s.user_id("alice"))
        async with client(s) as forge:
            got = await forge.access(review)
    assert (got.reviewer, got.may_approve, got.level) == ("alice", may, level)
    if kind == "gitlab":  # GitLab's default "Allowed to merge" on a protected branch: Maintainers
        assert got.needs == "the Maintainer role or above"


@pytest.mark.integration
@pytest.mark.parametrize("kind", KINDS)
async def test_team_membership(kind: str) -> None:
    with ForgeStandin(kind, "owner/repo", TOKEN) as s:
        s.teams["acme/deployers"] = {"alice", s.token_user}  # Gitea: the token's account sees its own teams
        s.teams["acme/others"] = {"bob"}

        def review(user: str) -> Review:
            return Review(reviewer=user, state="APPROVED", commit_id=HEAD, reviewer_id=s.user_id(user))

        async with client(s) as forge:
            got = [await forge.in_team("acme/deployers", review("alice")),
                   await forge.in_team("acme/deployers", review("bob"))]
            if kind == "gitea":  # a team Gitea does not show is never "not a member" (see below)
                with pytest.raises(ForgeRefused, match="acme/nosuchteam"):
                    await forge.in_team("acme/nosuchteam", review("alice"))
            else:
                got.append(await forge.in_team("acme/nosuchteam", review("alice")))
        s.deny.add("members")
        async with client(s) as forge:
            with pytest.raises(ForgeRefused, match="the token needs"):
                await forge.in_team("acme/deployers", review("alice"))
    assert got == ([True, False] if kind == "gitea" else [True, False, False])


# --- Gitea as a real Gitea 1.26.0 answers (tests/forge) -------------------------------------------

@pytest.fixture
def gitea() -> Iterator[ForgeStandin]:
    with ForgeStandin("gitea", "platform/specs", TOKEN, page_size=3) as s:
        yield s


def requested(s: ForgeStandin, pattern: str) -> list[str]:
    return [f"{r.method} {r.path}" for r in s.requests if re.search(pattern, r.path)]


@pytest.mark.integration
async def test_gitea_commit_status_reads_status_a_null_list_and_an_empty_target_url(gitea: ForgeStandin) -> None:
    async with client(gitea) as forge:
        assert await forge.commit_status(HEAD, "plnt/plan") is None  # Gitea: "statuses": null
        assert await forge.set_status(HEAD, "failure", "plnt/plan", "plan invalid: 1 problem")  # no target_url
        got = await forge.commit_status(HEAD, "plnt/plan")
        # The same status again is not posted: Gitea's "status" and "" target_url read back as what was set.
        assert not await forge.set_status(HEAD, "failure", "plnt/plan", "plan invalid: 1 problem")
        assert await forge.set_status(HEAD, "success", "plnt/plan", "plan sha256:0123456789ab")
    assert got is not None
    assert (got.state, got.context, got.description, got.target_url) == (
        "failure", "plnt/plan", "plan invalid: 1 problem", None)
    assert [st["status"] for st in gitea.statuses] == ["failure", "success"]
    assert all("state" not in st and st["target_url"] == "" for st in gitea.statuses)
    assert len(requested(gitea, r"/statuses/")) == 2


@pytest.mark.integration
async def test_gitea_status_with_a_link_is_read_back_unchanged(gitea: ForgeStandin) -> None:
    async with client(gitea) as forge:
        assert await forge.set_status(HEAD, "pending", "plnt/ns/app", "canary 10%", target_url="https://ci.example/1")
        got = await forge.commit_status(HEAD, "plnt/ns/app")
        assert not await forge.set_status(HEAD, "pending", "plnt/ns/app", "canary 10%", target_url="https://ci.example/1")
        assert await forge.set_status(HEAD, "pending", "plnt/ns/app", "canary 10%", target_url="https://ci.example/2")
    assert got is not None and (got.state, got.target_url) == ("pending", "https://ci.example/1")


@pytest.mark.integration
async def test_gitea_commit_status_found_on_a_later_page_of_the_combined_status(gitea: ForgeStandin) -> None:
    """Gitea's combined status lists at most a page of contexts, the most recently updated first: an
    older plnt/plan on a busy commit is on a later page, reached through Link rel=next."""
    async with client(gitea) as forge:
        assert await forge.set_status(HEAD, "success", "plnt/plan", "plan sha256:0123456789ab")
        for n in range(5):  # the stand-in's page holds 3 contexts
            assert await forge.set_status(HEAD, "pending", f"ci/job-{n}", "running")
        got = await forge.commit_status(HEAD, "plnt/plan")
        assert await forge.commit_status(HEAD, "plnt/none") is None
    assert got is not None and got.description == "plan sha256:0123456789ab"
    pages = [r.query.get("page", ["1"])[0] for r in gitea.requests if r.path.endswith(f"/commits/{HEAD}/status")]
    assert pages[-2:] == ["1", "2"] or pages[-3:] == ["1", "2", "3"], pages


@pytest.mark.integration
async def test_gitea_approvals_in_plnts_words_with_official(gitea: ForgeStandin) -> None:
    from plnt.reconciler.review.approval import judge

    gitea.access.update({"lead": "write", "visitor": "read"})
    gitea.pulls[5] = {"head_sha": HEAD, "merged": True, "commits": [OLD, HEAD]}
    gitea.add_review(5, "lead", "APPROVED", OLD)
    gitea.add_review(5, "visitor", "COMMENT", HEAD)
    gitea.add_review(5, "visitor", "APPROVED", HEAD)
    gitea.add_review(5, "lead", "REQUEST_CHANGES", HEAD)
    gitea.add_review(5, "gone", "APPROVED", HEAD, dismissed=True)
    assert [r["state"] for r in gitea.reviews[5]] == ["APPROVED", "COMMENT", "APPROVED", "REQUEST_CHANGES", "APPROVED"]
    async with client(gitea) as forge:
        reviews = await forge.approvals(5)
    assert [(r.reviewer, r.state, r.commit_id, r.official) for r in reviews] == [
        ("lead", "APPROVED", OLD, False),  # Gitea cleared it: the reviewer's later change request is the official one
        ("visitor", "COMMENTED", HEAD, False),
        ("visitor", "APPROVED", HEAD, False),  # read access only
        ("lead", "CHANGES_REQUESTED", HEAD, True)]
    # A Gitea change request holds the commit, as GitHub's does.
    verdict = judge("f" * 40, PullRequest(number=5, head_sha=HEAD, merged=True, state="merged"), reviews,
                    posted="plan sha256:0123456789ab: 1 to upgrade", computed="sha256:0123456789ab")
    assert not verdict.approved and "lead requested changes" in (verdict.reason or "")


@pytest.mark.integration
async def test_gitea_official_follows_the_approvals_allowlist(gitea: ForgeStandin) -> None:
    gitea.approvals_allowlist = {"carol", "platform/deployers"}
    gitea.teams["platform/deployers"] = {"dave"}
    gitea.access.update({"bob": "admin", "dave": "read"})
    gitea.pulls[5] = {"head_sha": HEAD, "merged": True, "commits": [HEAD]}
    for user in ("bob", "carol", "dave"):
        gitea.add_review(5, user, "APPROVED", HEAD)
    async with client(gitea) as forge:
        reviews = await forge.approvals(5)
        access = {r.reviewer: await forge.access(r) for r in reviews}
    assert {name: a.may_approve for name, a in access.items()} == {"bob": False, "carol": True, "dave": True}
    assert access["bob"].why == f"not an official reviewer on Gitea (needs {access['bob'].needs})"
    assert "approvals allowlist" in access["bob"].needs
    assert access["carol"].why is None and access["carol"].level == "official reviewer"
    assert not requested(gitea, r"/permission$")


@pytest.mark.integration
async def test_gitea_access_uses_official_without_the_permission_endpoint(gitea: ForgeStandin) -> None:
    gitea.access.update({"writer": "write", "reader": "read"})
    gitea.pulls[5] = {"head_sha": HEAD, "merged": True, "commits": [HEAD]}
    gitea.add_review(5, "writer", "APPROVED", HEAD)
    gitea.add_review(5, "reader", "APPROVED", HEAD)
    async with client(gitea) as forge:
        got = [await forge.access(r) for r in await forge.approvals(5)]
    assert [(a.reviewer, a.may_approve, a.level) for a in got] == [
        ("writer", True, "official reviewer"), ("reader", False, "not an official reviewer")]
    assert requested(gitea, r"/permission$") == []
    # The endpoint would have refused: plnt's token is no repository administrator (Gitea 1.26: 403).
    async with client(gitea) as forge:
        with pytest.raises(ForgeRefused, match="403"):
            await forge.access(Review(reviewer="writer", state="APPROVED", commit_id=HEAD))


@pytest.mark.integration
async def test_gitea_review_without_official_falls_back_to_the_permission_endpoint(gitea: ForgeStandin) -> None:
    gitea.access.update({"writer": "write", "reader": "read", gitea.token_user: "admin"})
    gitea.pulls[5] = {"head_sha": HEAD, "merged": True, "commits": [HEAD]}
    gitea.add_review(5, "writer", "APPROVED", HEAD)
    gitea.add_review(5, "reader", "APPROVED", HEAD)
    gitea.garble.append((r"/pulls/5/reviews$", lambda page: [{k: v for k, v in r.items() if k != "official"}
                                                            for r in page]))
    async with client(gitea) as forge:
        reviews = await forge.approvals(5)
        assert [r.official for r in reviews] == [None, None]
        got = [await forge.access(r) for r in reviews]
    assert [(a.reviewer, a.may_approve, a.level, a.why) for a in got] == [
        ("writer", True, "write", None), ("reader", False, "read", None)]
    assert requested(gitea, r"/permission$") == ["GET /api/v1/repos/platform/specs/collaborators/writer/permission",
                                                 "GET /api/v1/repos/platform/specs/collaborators/reader/permission"]


@pytest.mark.integration
async def test_gitea_in_team_refuses_a_team_the_token_cannot_see(gitea: ForgeStandin) -> None:
    """Gitea lists a team only to its members (site administrators aside): a team the search does not
    list is a token that cannot see it, or a wrong name, never "not a member"."""
    gitea.teams.update({"platform/deployers": {"alice"}, "platform/readers": {"bob", gitea.token_user}})

    def review(user: str) -> Review:
        return Review(reviewer=user, state="APPROVED", commit_id=HEAD)

    async with client(gitea) as forge:
        for team in ("platform/deployers", "platform/deployerz"):  # exists but unseen; misspelt
            with pytest.raises(ForgeRefused) as refused:
                await forge.in_team(team, review("alice"))
            assert f"team {team} is not visible to plnt's token" in str(refused.value)
        assert not requested(gitea, r"/teams/\d+/members/")
        gitea.teams["platform/deployers"].add(gitea.token_user)  # the token's account joins the team
        assert await forge.in_team("platform/deployers", review("alice")) is True
        assert await forge.in_team("platform/deployers", review("bob")) is False
    gitea.teams["platform/deployers"].discard(gitea.token_user)
    gitea.site_admins.add(gitea.token_user)  # a site administrator's token sees every team
    async with client(gitea) as forge:
        assert await forge.in_team("platform/deployers", review("alice")) is True


@pytest.mark.integration
async def test_the_gitea_standin_answers_as_gitea_1_26(gitea: ForgeStandin) -> None:
    """The stand-in's raw answers, as tests/forge saw them from a real Gitea 1.26.0."""
    import httpx

    auth = {"Authorization": f"token {TOKEN}"}
    repo = f"{gitea.api_url}/repos/{gitea.project}"
    gitea.teams.update({"platform/deployers": {"alice"}, "platform/readers": {gitea.token_user},
                        "platform/Owners": {"root"}})
    gitea.pulls[5] = {"head_sha": HEAD, "merged": False, "commits": [OLD, HEAD]}
    gitea.add_review(5, "alice", "APPROVED", OLD)
    async with httpx.AsyncClient(headers=auth, trust_env=False) as http:
        combined = (await http.get(f"{repo}/commits/{HEAD}/status")).json()
        assert (combined["statuses"], combined["state"], combined["total_count"]) == (None, "pending", 0)
        posted = (await http.post(f"{repo}/statuses/{HEAD}", json={"state": "success", "context": "a"})).json()
        await http.post(f"{repo}/statuses/{HEAD}", json={"state": "pending", "context": "b", "description": " x "})
        assert set(posted) == {"id", "status", "target_url", "description", "url", "context", "creator",
                               "created_at", "updated_at"}
        assert (posted["status"], posted["target_url"], posted["description"]) == ("success", "", "")
        listed = (await http.get(f"{repo}/statuses/{HEAD}")).json()
        assert [(st["context"], st["description"]) for st in listed] == [("b", "x"), ("a", "")]  # newest first
        combined = (await http.get(f"{repo}/commits/{HEAD}/status")).json()
        assert combined["state"] == "pending" and {st["context"] for st in combined["statuses"]} == {"a", "b"}

        [review] = (await http.get(f"{repo}/pulls/5/reviews")).json()
        assert {k: review[k] for k in ("state", "official", "stale", "dismissed", "commit_id")} == {
            "state": "APPROVED", "official": True, "stale": True, "dismissed": False, "commit_id": OLD}
        assert review["user"]["login"] == "alice"

        permission = await http.get(f"{repo}/collaborators/alice/permission")
        assert permission.status_code == 403 and permission.json()["message"].startswith("Only admins can query")
        own = await http.get(f"{repo}/collaborators/{gitea.token_user}/permission")
        assert own.status_code == 200 and own.json()["permission"] == "write"

        search = (await http.get(f"{gitea.api_url}/orgs/platform/teams/search", params={"q": ""})).json()
        assert [t["name"] for t in search["data"]] == ["readers"]  # only the token's account's teams
        deployers = gitea._team_id("platform/deployers")
        member = await http.get(f"{gitea.api_url}/teams/{deployers}/members/alice")
        assert member.status_code == 403 and member.json()["message"] == "Must be a team member"
        gitea.teams["platform/readers"].discard(gitea.token_user)  # no longer in the organization at all
        assert (await http.get(f"{gitea.api_url}/teams/{deployers}/members/alice")).status_code == 404
        search = await http.get(f"{gitea.api_url}/orgs/platform/teams/search", params={"q": ""})
        assert search.status_code == 403 and search.json()["message"] == "Must be an organization member"
        gitea.teams["platform/Owners"].add(gitea.token_user)  # an owner: asks any team for its members...
        assert (await http.get(f"{gitea.api_url}/teams/{deployers}/members/alice")).status_code == 200
        search = (await http.get(f"{gitea.api_url}/orgs/platform/teams/search", params={"q": ""})).json()
        assert [t["name"] for t in search["data"]] == ["Owners"]  # ...but searches only its own teams
        assert (await http.get(f"{repo}/collaborators/alice/permission")).status_code == 200  # owns the repository
