"""The pull-request flow against a real forge: Gitea built from its Go module (tests/forge/gitea.py),
`plnt up` as users run it (the console script, its own process, embedded Temporal, local runner
processes; the runners' model is MockBackend, a STAND-IN for a model server), and `plnt review` run
as the pull request's CI job runs it. Recipes are signed by test authorities (tests/sigstore_ca.py,
STAND-INS for Sigstore's public services) and verified for real.

plnt polls only every 600 s here, so what moves it is Gitea's webhook (signed with its secret), and it
fetches the repository from Gitea over HTTP with a token that must never show: not in its log, not in
a status, not in an URL it reports.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
from plnt.reconciler.review.forge import make_forge
from plnt.reconciler.review.plan_review import MARKER as PLAN_MARKER

from tests.e2e.test_plnt_up_process import PLNT, REVIEW, PlntUp, gateway_port
from tests.e2e.test_plnt_up_process import started as started  # noqa: F401 (the fixture: plnt processes killed after the test)
from tests.forge.gitea import GiteaError
from tests.forge.site import TEAM, SpecSite, ssh_key

pytestmark = [pytest.mark.integration, pytest.mark.forge]

RUN_FILE = "workflowruns/review-responder.yaml"
CONTEXT = "plnt/default/review-responder"
T = TypeVar("T")


def wait_until(check: Callable[[], T | None], what: str, plnt: PlntUp, timeout: float = 90.0) -> T:
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        assert plnt.process.poll() is None, plnt.why(f"plnt exited ({plnt.process.returncode}) waiting for {what}")
        last = check()
        if last:
            return last
        time.sleep(0.2)
    raise AssertionError(plnt.why(f"timed out after {timeout:.0f}s waiting for {what}; last: {last!r}"))


def get(plnt: PlntUp, path: str) -> Any:
    response = httpx.get(f"{plnt.url}{path}", timeout=10, trust_env=False)
    response.raise_for_status()
    return response.json()


def held(plnt: PlntUp) -> dict[str, Any] | None:
    """GET /source's held commit; None while plnt does not answer yet or holds nothing."""
    try:
        return get(plnt, "/source").get("held")  # type: ignore[no-any-return]
    except httpx.TransportError:
        return None


def invoke(plnt: PlntUp, **headers: str) -> httpx.Response:
    return httpx.post(f"{plnt.url}/workflows/review-responder/invoke", json=REVIEW, headers=headers, timeout=30,
                      trust_env=False)


def start_plnt(site: SpecSite, tmp_path: Path, started: list[PlntUp], *extra: str) -> PlntUp:
    """`plnt up` on the site's repository, as an operator would run it next to Gitea (SpecSite.plnt_up_options)."""
    port = gateway_port()
    options = site.plnt_up_options(tmp_path / "secrets", port)
    assert options[0] == "--repo"
    plnt = PlntUp(options[1], tmp_path / "state", port, tmp_path / "plnt.log",  # type: ignore[arg-type]
                  extra=("--interval", "600", *options[2:], *extra))
    started.append(plnt)
    return plnt


def plnt_review(site: SpecSite, pr: int, head: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return site.plnt_review(PLNT, pr, head, tmp_path)


def plan_comments(site: SpecSite, pr: int) -> list[dict[str, Any]]:
    """The bot's comments carrying the plan's marker (plnt up posts its previews' comment beside it)."""
    return [c for c in site.comments(pr) if c["user"]["login"] == site.org.bot.name and f"<!-- {PLAN_MARKER}" in c["body"]]


def test_a_pull_request_from_push_to_verdict(spec_site: SpecSite, tmp_path: Path, started: list[PlntUp]) -> None:
    site = spec_site
    org = site.org
    site.protect_main(dismiss_stale_approvals=True)
    plnt = start_plnt(site, tmp_path, started, "--require-approval", "--approvers", f"platform/{TEAM}",
                      "--write-notes", "--previews", "refs/pull/*/head")
    readme = site.git("rev-parse", "HEAD")

    # The repository's first commit (Gitea's README) came by no pull request: held, nothing deploys.
    first = wait_until(lambda: held(plnt), "the README commit held", plnt)
    assert first["commit"] == readme and first["reason"].startswith(f"no pull request brought commit {readme[:12]}")
    # Branch protection is Gitea's: a direct push to main is refused there.
    (site.work / "direct.txt").write_text("no review\n")
    site.commit("direct push")
    with pytest.raises(subprocess.CalledProcessError) as refused:
        site.push("main")
    assert "protected branch" in refused.value.stderr.lower() or "not allowed" in refused.value.stderr.lower(), \
        refused.value.stderr
    site.git("reset", "-q", "--hard", "origin/main")

    # Bootstrap: PR #1 adds the specs; reviewed, approved, merged: review-responder 1.2.0 is installed.
    first_pr, _ = site.approved_pull(PLNT, "add-specs", site.add_specs, tmp_path)
    first_merge = site.merge(first_pr)
    ready = plnt.wait_ready(timeout=90)
    assert ready["version"] == "1.2.0", ready
    assert wait_until(lambda: (s := site.latest_status(first_merge, CONTEXT)) and s["status"] == "success" and s,
                      "the install's success status", plnt)["description"].startswith("Ready 1.2.0")

    # 1. The author pushes a branch bumping review-responder and opens PR #2.
    site.branch("bump-review-responder")
    site.replace(RUN_FILE, "review-responder@1.2.0", "review-responder@1.4.0")
    push_a = site.commit("review-responder 1.4.0")
    site.push("bump-review-responder")
    pr = site.open_pull("bump-review-responder", "Bump review-responder")

    # 2. `plnt review` posts one plan comment and the plnt/plan status with the digest, read back from Gitea.
    plnt_review(site, pr, push_a, tmp_path)
    comments = plan_comments(site, pr)
    assert len(comments) == 1 and "review-responder" in comments[0]["body"] and push_a in comments[0]["body"], comments
    plan_a = site.latest_status(push_a, "plnt/plan")
    assert plan_a is not None and plan_a["status"] == "success", plan_a
    assert plan_a["description"].startswith("plan sha256:") and plan_a["description"].endswith(": 1 to upgrade"), plan_a
    # The next push: the same comment, updated in place; a new status on the new head.
    site.replace(RUN_FILE, "review-responder@1.4.0", "review-responder@1.3.0")
    push_b = site.commit("review-responder 1.3.0, not 1.4.0")
    site.push("bump-review-responder")
    plnt_review(site, pr, push_b, tmp_path)
    updated = plan_comments(site, pr)
    assert [c["id"] for c in updated] == [comments[0]["id"]], "one comment, updated in place"
    assert push_b in updated[0]["body"] and push_a not in updated[0]["body"]
    plan_b = site.latest_status(push_b, "plnt/plan")
    assert plan_b is not None and plan_b["status"] == "success" and plan_b["description"] != plan_a["description"]

    # 3. The reviewer approves; the author pushes again: Gitea dismisses the approval (branch protection's
    #    "dismiss stale approvals") and refuses the merge; plnt, asked, sees no approval either.
    site.review(pr, "APPROVED", push_b)
    site.replace(RUN_FILE, "invocations: 10", "invocations: 12")
    push_c = site.commit("a longer smoke test")
    site.push("bump-review-responder")
    plnt_review(site, pr, push_c, tmp_path)
    reviews = wait_until(lambda: [r for r in site.api("GET", f"/pulls/{pr}/reviews") if r["state"] == "APPROVED"
                                  and r["dismissed"]] or None, "Gitea to dismiss the stale approval", plnt, timeout=30)
    assert reviews[0]["commit_id"] == push_b
    with pytest.raises(GiteaError, match="HTTP 405"):
        site.merge(pr)
    assert approvals_seen_by_plnt(site, pr) == []
    site.review(pr, "APPROVED", push_c)

    # 4. Merge: Gitea's webhook wakes plnt (it would poll only in 600 s), which fetches over HTTP.
    merge = site.merge(pr)
    statuses = wait_until(lambda: (s := [x for x in site.statuses(merge) if x["context"] == CONTEXT])
                          and s[-1]["status"] == "success" and s, "the rollout's success status on the merge", plnt)
    assert plnt.wait_ready()["version"] == "1.3.0"
    # 5. The canary ran, and its verdict is on the merge commit: pending while it ran, then success.
    # (The pending ones before it are coalesced: a saga of about a second may leave only one, or none.)
    descriptions = [s["description"] for s in statuses]
    assert all(s["status"] == "pending" for s in statuses[:-1]), statuses
    assert descriptions[-1].startswith("Ready 1.3.0: p95 "), descriptions
    promoted = next(r for r in get(plnt, "/workflows") if r["name"] == "review-responder")
    assert promoted["smokeTest"]["metrics"]["invocations"] == 12, "the canary's smoke test of this commit ran"
    approval = site.latest_status(merge, "plnt/approval")
    assert approval is not None and approval["status"] == "success", approval
    plan_c = site.latest_status(push_c, "plnt/plan")
    assert plan_c is not None and plan_c["description"].startswith("plan sha256:")
    digest = plan_c["description"].split(":")[1].strip()  # the 12 hex the approval was bound to
    assert approval["description"].startswith(f"approved: PR #{pr} by {org.reviewer.name}, plan sha256:{digest}"), approval
    # ...and as a git note, pushed to Gitea with the bot's token.
    note = wait_until(lambda: git_note(site, merge), "the rollout's git note on Gitea", plnt, timeout=30)
    assert note.startswith("default/review-responder: Ready 1.3.0"), note
    assert invoke(plnt).json()["version"] == "1.3.0"

    # 5b. A preview for an open PR answers under its header, and goes when the PR closes.
    site.branch("try-1.5.0")
    site.replace(RUN_FILE, "review-responder@1.3.0", "review-responder@1.5.0")
    preview_head = site.commit("try review-responder 1.5.0")
    site.push("try-1.5.0")
    preview_pr = site.open_pull("try-1.5.0", "Try review-responder 1.5.0")
    wait_until(lambda: (s := site.latest_status(preview_head, f"plnt/preview/{CONTEXT.removeprefix('plnt/')}"))
               and s["status"] == "success", "the preview's success status", plnt)
    answer = invoke(plnt, **{"X-Plnt-Preview": str(preview_pr)})
    assert answer.status_code == 200 and answer.json()["version"] == "1.5.0", answer.text
    assert invoke(plnt).json()["version"] == "1.3.0", "without the header: the promoted release"
    site.api("PATCH", f"/pulls/{preview_pr}", auth=org.author, json={"state": "closed"})
    wait_until(lambda: invoke(plnt, **{"X-Plnt-Preview": str(preview_pr)}).status_code == 404,
               "the preview removed after the PR closed", plnt)
    wait_until(lambda: (s := site.latest_status(preview_head, f"plnt/preview/{CONTEXT.removeprefix('plnt/')}"))
               and "removed" in s["description"], "the preview's status to say removed", plnt, timeout=30)

    # What woke plnt was Gitea's signed webhook: a hook without a valid signature is refused.
    body = b'{"ref": "refs/heads/main"}'
    for headers in ({}, {"X-Gitea-Signature": "0" * 64}):
        refused_hook = httpx.post(f"{plnt.url}/hooks/git", content=body, headers=headers, timeout=10, trust_env=False)
        assert refused_hook.status_code == 401, refused_hook.text

    # No token anywhere it could be read: plnt's log, what it reports, the statuses and notes on Gitea.
    tokens = (org.plnt_token, org.review_token, org.author_token)
    shown = [plnt.log(), str(get(plnt, "/source")), str(get(plnt, "/workflows"))]
    shown += [str(site.statuses(sha)) for sha in (first_merge, merge, preview_head)]
    shown += [str(site.comments(n)) for n in (first_pr, pr, preview_pr)]
    for token in tokens:
        assert not [text for text in shown if token in text], "a token shows"
    assert f"{org.bot.name}:" not in get(plnt, "/source").get("repo", "")
    plnt.stop_and_check(signal.SIGINT)


def approvals_seen_by_plnt(site: SpecSite, pr: int) -> list[str]:
    """The approvals plnt's forge client reads from Gitea (the reviewers)."""
    import asyncio

    async def read() -> list[str]:
        async with make_forge("gitea", site.gitea.api_url, site.project, site.org.plnt_token) as forge:
            return [r.reviewer for r in await forge.approvals(pr) if r.state == "APPROVED"]

    return asyncio.run(read())


def git_note(site: SpecSite, sha: str) -> str | None:
    try:
        site.git("fetch", "-q", "origin", "+refs/notes/plnt:refs/notes/plnt")
        return site.git("notes", "--ref", "plnt", "show", sha)
    except subprocess.CalledProcessError:
        return None


@pytest.mark.parametrize("dismiss_stale_approvals", [False, True], ids=["dismissal-off", "dismissal-on"])
def test_an_approval_of_an_older_push_does_not_count(spec_site: SpecSite, tmp_path: Path, started: list[PlntUp],
                                                    dismiss_stale_approvals: bool) -> None:
    """Approved, then pushed to, then merged: plnt deploys nothing, whatever Gitea's own setting says.
    With "dismiss stale approvals" off (Gitea's default) Gitea counts the old approval and merges; with it
    on, Gitea refuses the merge, and a site administrator's override merges it anyway."""
    site = spec_site
    site.protect_main(dismiss_stale_approvals=dismiss_stale_approvals)
    plnt = start_plnt(site, tmp_path, started, "--require-approval")
    wait_until(lambda: held(plnt), "the README commit held", plnt)
    pr, approved = site.approved_pull(PLNT, "add-specs", site.add_specs, tmp_path)
    site.replace(RUN_FILE, "review-responder@1.2.0", "review-responder@1.4.0")
    pushed = site.commit("and 1.4.0, after the approval")
    site.push("add-specs")
    plnt_review(site, pr, pushed, tmp_path)

    if dismiss_stale_approvals:
        with pytest.raises(GiteaError, match="HTTP 405"):
            site.merge(pr)
        merge = site.merge(pr, force=True)
        reason = f"PR #{pr} has no approving review; Gitea takes no review on a merged pull request"
    else:
        merge = site.merge(pr)  # Gitea counts the approval of the older push
        reason = (f"PR #{pr} was approved only on an older push ({approved[:12]}); Gitea takes no review on a "
                  "merged pull request")
    verdict = wait_until(lambda: (h := held(plnt)) and h["commit"] == merge and h, "the merge held", plnt)
    assert verdict["reason"].startswith(reason), verdict
    assert verdict["pr"] == pr and verdict["head"] == pushed and verdict["approvers"] == []
    status = wait_until(lambda: site.latest_status(merge, "plnt/approval"), "the plnt/approval status", plnt)
    assert status["status"] == "failure" and status["description"].startswith(f"held: {reason}"[:100]), status
    assert get(plnt, "/workflows") == [], "nothing deploys from a held commit"
    # Gitea refuses the approval that the reason says cannot come.
    with pytest.raises(GiteaError, match="HTTP 4"):
        site.review(pr, "APPROVED", pushed)


def test_a_pull_request_with_an_unsigned_commit_is_refused(spec_site: SpecSite, tmp_path: Path,
                                                          started: list[PlntUp]) -> None:
    """--verify-commits all against Gitea, which signs its own commits (the README, every merge) with an
    SSH key the operator trusts beside the authors': a pull request carrying an unsigned commit gets a
    failing preview status naming it, and its merge is refused with a status on the merge and on that
    commit, while what runs keeps running."""
    site = spec_site
    author_key = ssh_key(tmp_path / "author-key", "author@plnt.invalid")
    gitea_key = site.gitea.signing_key
    assert gitea_key is not None
    allowed = tmp_path / "allowed_signers"
    allowed.write_text(f"gitea@plnt.invalid {gitea_key.with_suffix('.pub').read_text().strip()}\n"
                       f"author@plnt.invalid {author_key.with_suffix('.pub').read_text().strip()}\n")
    plnt = start_plnt(site, tmp_path, started, "--verify-commits", "all", "--allowed-signers", str(allowed),
                      "--previews", "refs/pull/*/head")

    def signed(message: str) -> str:
        return site.commit(message, "-S", "--gpg-sign=" + str(author_key.with_suffix(".pub")))

    def source() -> dict[str, Any]:
        try:
            return get(plnt, "/source")  # type: ignore[no-any-return]
        except httpx.TransportError:
            return {}

    readme = site.git("rev-parse", "HEAD")
    wait_until(lambda: source().get("lastReconciledCommit") == readme, "Gitea's signed README commit trusted", plnt)
    site.git("config", "gpg.format", "ssh")
    site.branch("add-specs")
    site.add_specs()
    signed("Add the platform's specs")
    site.push("add-specs")
    site.merge(site.open_pull("add-specs", "Add the platform's specs"))
    assert plnt.wait_ready()["version"] == "1.2.0"

    site.branch("bump")
    site.replace(RUN_FILE, "review-responder@1.2.0", "review-responder@1.3.0")
    signed("review-responder 1.3.0")
    site.replace(RUN_FILE, "invocations: 10", "invocations: 12")
    unsigned = site.commit("a longer smoke test, unsigned")
    site.push("bump")
    pr = site.open_pull("bump", "Bump review-responder")
    refusal = f"commit {unsigned[:12]} is not trusted: unsigned"
    preview = wait_until(lambda: (s := site.latest_status(unsigned, "plnt/preview")) and s["status"] == "failure" and s,
                         "the preview refused", plnt)
    assert refusal in preview["description"], preview

    merge = site.merge(pr)
    for commit in (merge, unsigned):
        status = wait_until(lambda commit=commit: site.latest_status(commit, "plnt/verify-commits"),  # type: ignore[misc]
                            f"plnt/verify-commits on {commit[:12]}", plnt)
        assert (status["status"], status["description"]) == ("failure", f"refused: {refusal}"), status
    assert source()["untrusted"]["commit"] == unsigned
    row = plnt.wait_ready()
    assert row["version"] == "1.2.0" and refusal in row["message"], row
    assert invoke(plnt).json()["version"] == "1.2.0"
