"""--require-approval (reconciler/review/approval.py).

`judge` is pure and table-tested with hand-made PullRequest/Review values (plain data, no I/O).
The gate runs against a real git repository (a copy of gitops-example, real signed recipes in its
file registry, verified for real) and the DECLARED forge stand-in (tests/forge_standin.py: GitHub
and GitLab REST shapes from their documentation, Gitea's as a real Gitea 1.26.0 answered them in
tests/forge; not a live forge).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from plnt.reconciler.plan.digest import STATUS_CONTEXT, short
from plnt.reconciler.recipes.pull import RecipeCache
from plnt.reconciler.recipes.registries import RegistryOptions
from plnt.reconciler.review.approval import APPROVAL_CONTEXT, ApprovalGate, ApprovalVerdict, judge
from plnt.reconciler.review.forge import PullRequest, Review, make_forge
from plnt.reconciler.review.plan_review import make_review, post
from plnt.reconciler.source.git import GitSource

from tests.conftest import SpecRepo
from tests.forge_standin import ForgeStandin

C = "c" * 40          # the commit judged
HEAD = "d" * 40       # the PR's head
OLD = "e" * 40        # an older push of the PR
DIGEST = "sha256:0123456789ab"
POSTED = f"plan {DIGEST}: 1 to upgrade"
MERGED = PullRequest(number=12, head_sha=HEAD, merged=True, state="merged")
APPROVED_HEAD = Review(reviewer="reviewer-a", state="APPROVED", commit_id=HEAD)


@pytest.mark.parametrize(("name", "pr", "reviews", "posted", "computed", "problems", "approved", "reason"), [
    ("approved on the head, digest equal", MERGED, [APPROVED_HEAD], POSTED, DIGEST, (), True, None),
    ("a comment after the approval changes nothing", MERGED,
     [APPROVED_HEAD, Review(reviewer="reviewer-a", state="COMMENTED", commit_id=HEAD)], POSTED, DIGEST, (), True, None),
    ("changes requested, then approved on the head", MERGED,
     [Review(reviewer="reviewer-b", state="CHANGES_REQUESTED", commit_id=OLD), APPROVED_HEAD,
      Review(reviewer="reviewer-b", state="APPROVED", commit_id=HEAD)], POSTED, DIGEST, (), True, None),
    ("direct push", None, [], None, None, (), False, f"no pull request brought commit {C[:12]} (a direct push)"),
    ("PR open", PullRequest(number=12, head_sha=HEAD, merged=False, state="open"), [APPROVED_HEAD], POSTED, DIGEST, (),
     False, f"PR #12 that contains commit {C[:12]} is open, not merged"),
    ("merged into another branch", PullRequest(number=12, head_sha=HEAD, merged=True, state="merged", base_ref="staging"),
     [APPROVED_HEAD], POSTED, DIGEST, (), False,
     f"PR #12 that brought commit {C[:12]} was merged into staging, not into the tracked branch main"),
    ("merged into the tracked branch", MERGED.model_copy(update={"base_ref": "main"}), [APPROVED_HEAD], POSTED, DIGEST,
     (), True, None),
    ("PR closed unmerged", PullRequest(number=12, head_sha=HEAD, merged=False, state="closed"), [APPROVED_HEAD], POSTED,
     DIGEST, (), False, "is closed, not merged"),
    ("no review", MERGED, [], POSTED, DIGEST, (), False, f"PR #12 has no approving review; approve head {HEAD[:12]}"),
    ("only a comment", MERGED, [Review(reviewer="reviewer-a", state="COMMENTED", commit_id=HEAD)], POSTED, DIGEST, (),
     False, "has no approving review"),
    ("approved on an older push", MERGED, [Review(reviewer="reviewer-a", state="APPROVED", commit_id=OLD)], POSTED,
     DIGEST, (), False, f"PR #12 was approved only on an older push ({OLD[:12]}); approve head {HEAD[:12]}"),
    ("approval dismissed", MERGED, [APPROVED_HEAD, Review(reviewer="reviewer-a", state="DISMISSED", commit_id=HEAD)],
     POSTED, DIGEST, (), False, "has no approving review"),
    ("GitLab without reset_approvals_on_push", MERGED, [Review(reviewer="reviewer-a", state="APPROVED", commit_id=None)],
     POSTED, DIGEST, (), False, "cannot be bound to its head"),
    ("changes requested stands", MERGED,
     [APPROVED_HEAD, Review(reviewer="reviewer-b", state="CHANGES_REQUESTED", commit_id=OLD)], POSTED, DIGEST, (),
     False, "PR #12: reviewer-b requested changes and did not approve since"),
    ("approved, then changes requested by the same reviewer", MERGED,
     [APPROVED_HEAD, Review(reviewer="reviewer-a", state="CHANGES_REQUESTED", commit_id=HEAD)], POSTED, DIGEST, (),
     False, "reviewer-a requested changes"),
    ("no plnt/plan status", MERGED, [APPROVED_HEAD], None, DIGEST, (), False,
     f"PR #12's head {HEAD[:12]} carries no plan digest (no plnt/plan status on it): run `plnt review`"),
    ("a failed plan status", MERGED, [APPROVED_HEAD], "plan invalid: 2 problems", DIGEST, (), False,
     "its plnt/plan status says 'plan invalid: 2 problems'"),
    ("digest differs", MERGED, [APPROVED_HEAD], "plan sha256:ffffffffffff: 1 to upgrade", DIGEST, (), False,
     f"the plan approved on PR #12 (head {HEAD[:12]}: plan sha256:ffffffffffff) is not the plan of commit {C[:12]} "
     f"now (plan {DIGEST})"),
    ("plan cannot be made now", MERGED, [APPROVED_HEAD], POSTED, None,
     ("default/review-responder: recipe x: UntrustedRecipe: signer", "b"), False,
     f"the plan of commit {C[:12]} cannot be made now: default/review-responder: recipe x: UntrustedRecipe: signer "
     "(and 1 more)"),
])
def test_judge(name: str, pr: PullRequest | None, reviews: list[Review], posted: str | None, computed: str | None,
               problems: tuple[str, ...], approved: bool, reason: str | None) -> None:
    verdict = judge(C, pr, reviews, posted=posted, computed=computed, plan_problems=problems, branch="main")
    assert verdict.approved is approved, (name, verdict.reason)
    assert verdict.commit == C
    if approved:
        assert verdict.reason is None and verdict.approvers and verdict.digest == DIGEST
    else:
        assert reason is not None and reason in (verdict.reason or ""), (name, verdict.reason)
        assert verdict.problem() == f"commit {C[:12]} is held: {verdict.reason}"
        if pr is not None:
            assert verdict.pr == pr.number and verdict.head == pr.head_sha


def test_verdict_is_json_for_get_source() -> None:
    verdict = judge(C, None, [], posted=None, computed=None)
    dumped = verdict.model_dump(mode="json")
    assert dumped["commit"] == C and dumped["approved"] is False and dumped["pr"] is None
    assert ApprovalVerdict.model_validate(dumped) == verdict


# --- the gate: real git, real recipes, the forge stand-in ----------------------------------------------

RUN_FILE = "workflowruns/review-responder.yaml"
TOKEN = "forge-token-for-tests"


class World:
    """The spec repo, plnt's clone of it, a CI clone (what `plnt review` sees) and the forge."""

    def __init__(self, repo: SpecRepo, standin: ForgeStandin, tmp: Path) -> None:
        self.repo = repo
        self.standin = standin
        self.source = GitSource(str(repo.path), tmp / "plnt-clone")
        self.ci = GitSource(str(repo.path), tmp / "ci-clone")
        self.cache = RecipeCache(tmp / "recipes")
        self.forge = make_forge(standin.kind, standin.api_url, standin.project, TOKEN, backoff=0.01, attempts=2)
        self.now = 0.0
        self.gate = ApprovalGate(self.forge, self.source, cache=self.cache, registry_options=RegistryOptions(),
                                 clock=lambda: self.now)
        self.next_pr = 11

    async def judge(self, last: str | None) -> ApprovalVerdict | None:
        """A pass after a webhook (a push or a review): held verdicts are judged again."""
        self.gate.recheck()
        return await self.gate.first_unapproved(self.source.fetch(), last)

    def branch(self, name: str, version: str, *, start: str = "main") -> str:
        """A PR branch bumping review-responder to `version`; its head sha."""
        self.repo.git("checkout", "-q", "-B", name, start)
        text = (self.repo.path / RUN_FILE).read_text()
        current = text.split("review-responder@", 1)[1].split()[0]
        self.repo.replace(RUN_FILE, f"review-responder@{current}", f"review-responder@{version}")
        head = self.repo.commit(f"review-responder {version}")
        self.repo.git("checkout", "-q", "main")
        return head

    def open_pr(self, head: str, commits: list[str]) -> int:
        self.next_pr += 1
        self.standin.pulls[self.next_pr] = {"head_sha": head, "merged": False, "commits": list(commits)}
        return self.next_pr

    def merged(self, pr: int, *landed: str) -> None:
        self.standin.pulls[pr]["merged"] = True
        self.standin.pulls[pr]["commits"].extend(landed)

    def approve(self, pr: int, on: str, user: str = "reviewer-a") -> None:
        if self.standin.kind == "gitlab":  # approvals carry no sha
            if on != self.standin.pulls[pr]["head_sha"] and self.standin.gitlab_reset_on_push:
                return  # made on an older push: the push after it removed it (reset_approvals_on_push)
            self.standin.gitlab_approved_by.setdefault(pr, []).append(user)
        else:
            self.standin.add_review(pr, user, "APPROVED", on)

    async def review(self, pr_head: str, pr: int | None = None) -> str:
        """What `plnt review --base main --head PR_HEAD --pr N` does in the PR's CI (its own code,
        review.make_review and review.post): the plan comment and the plnt/plan status on the head."""
        made = make_review(self.ci, "main", pr_head, cache=RecipeCache(self.cache.root.parent / "ci-recipes"),
                           registry_options=RegistryOptions())
        assert made.digest is not None, (made.spec_problems, made.evidence.problems)
        number = pr if pr is not None else next(n for n, p in self.standin.pulls.items() if p["head_sha"] == made.head)
        await post(self.forge, number, made)
        return made.digest


async def make_world(kind: str, spec_repo: SpecRepo, tmp_path: Path) -> AsyncIterator[World]:
    project = "group/specs" if kind == "gitlab" else "owner/specs"
    with ForgeStandin(kind, project, TOKEN, page_size=2) as standin:
        w = World(spec_repo, standin, tmp_path)
        try:
            yield w
        finally:
            await w.forge.aclose()


@pytest.fixture(params=["github", "gitlab"])
async def world(request: pytest.FixtureRequest, spec_repo: SpecRepo, tmp_path: Path) -> AsyncIterator[World]:
    async for w in make_world(request.param, spec_repo, tmp_path):
        yield w


@pytest.mark.integration
async def test_merge_commit_approved_on_head_then_older_push_and_mismatch(world: World) -> None:
    first = world.repo.git("rev-parse", "HEAD")
    old = world.branch("bump", "1.4.0")
    head = world.branch("bump", "1.3.0", start="bump")  # a second push: back to 1.3.0
    pr = world.open_pr(head, [old, head])
    await world.review(head)
    world.approve(pr, old)  # approved on the first push only
    world.repo.git("merge", "--no-ff", "-q", "-m", "Merge pull request #12", "bump")
    merge = world.repo.git("rev-parse", "HEAD")
    world.merged(pr, merge)

    held = await world.judge(first)
    assert held is not None and held.commit == merge and held.pr == pr
    if world.standin.kind == "github":
        assert held.reason == f"PR #{pr} was approved only on an older push ({old[:12]}); approve head {head[:12]}"
    else:  # GitLab: reset on push dropped the approval of the older push
        assert held.reason == f"PR #{pr} has no approving review; approve head {head[:12]}"

    status = await world.forge.commit_status(merge, APPROVAL_CONTEXT)  # the verdict, on the forge too
    assert status is not None and status.state == "failure" and status.description.startswith(f"held: PR #{pr} ")

    world.approve(pr, head, "reviewer-b")  # approved on the head: the held commit is released
    assert await world.judge(first) is None
    status = await world.forge.commit_status(merge, APPROVAL_CONTEXT)
    assert status is not None and status.state == "success"
    assert status.description.startswith(f"approved: PR #{pr} by reviewer-b, plan sha256:")
    assert world.gate.counters.plans == 1

    # Cached: an approved commit is not asked about again.
    calls = len(world.standin.requests)
    assert await world.judge(first) is None
    assert len(world.standin.requests) == calls and world.gate.counters.cached == 1


@pytest.mark.integration
async def test_digest_posted_for_another_plan_is_held(world: World) -> None:
    first = world.repo.git("rev-parse", "HEAD")
    other = world.branch("other", "1.4.0")
    head = world.branch("bump", "1.3.0")
    pr = world.open_pr(head, [head])
    posted = await world.review(other, pr)  # a digest of another plan (1.4.0) ...
    await world.forge.set_status(head, "success", STATUS_CONTEXT, f"plan {short(posted)}: 1 to upgrade")  # ... on head
    world.approve(pr, head)
    world.repo.git("merge", "--no-ff", "-q", "-m", "Merge bump", "bump")
    merge = world.repo.git("rev-parse", "HEAD")
    world.merged(pr, merge)
    held = await world.judge(first)
    assert held is not None and held.commit == merge
    assert held.reason is not None and held.reason.startswith(
        f"the plan approved on PR #{pr} (head {head[:12]}: plan {short(posted)}) is not the plan of commit {merge[:12]}")
    assert held.digest is not None and held.digest != short(posted)


@pytest.mark.integration
async def test_squash_merge_and_no_status(world: World) -> None:
    first = world.repo.git("rev-parse", "HEAD")
    head = world.branch("bump", "1.3.0")
    pr = world.open_pr(head, [head])
    world.approve(pr, head)
    world.repo.git("merge", "--squash", "-q", "bump")
    squash = world.repo.commit(f"review-responder 1.3.0 (#{pr})")
    world.merged(pr, squash)
    held = await world.judge(first)
    assert held is not None and held.reason is not None and "carries no plan digest" in held.reason
    await world.review(head)
    assert await world.judge(first) is None


@pytest.mark.integration
async def test_first_parent_walk_holds_a_direct_push_under_an_approved_merge(world: World) -> None:
    first = world.repo.git("rev-parse", "HEAD")
    assert (await world.judge(None)).commit == first  # type: ignore[union-attr]  # nothing reconciled: the head alone

    world.repo.write("NOTES.md", "a direct push\n")
    direct = world.repo.commit("direct push, no PR")
    head = world.branch("bump", "1.3.0")
    pr = world.open_pr(head, [head])
    await world.review(head)
    world.approve(pr, head)
    world.repo.git("merge", "--no-ff", "-q", "-m", "Merge bump", "bump")
    merge = world.repo.git("rev-parse", "HEAD")
    world.merged(pr, merge)

    held = await world.judge(first)
    assert held is not None and held.commit == direct and held.pr is None
    assert held.reason is not None and held.reason.startswith(f"no pull request brought commit {direct[:12]}")
    # From the direct push on (e.g. after an operator accepted it), the merge alone is judged: approved.
    assert await world.judge(direct) is None


@pytest.mark.integration
async def test_rebase_merge_judges_the_prs_commits_as_one_plan(world: World) -> None:
    first = world.repo.git("rev-parse", "HEAD")
    one = world.branch("bump", "1.4.0")
    two = world.branch("bump", "1.3.0", start="bump")
    pr = world.open_pr(two, [one, two])
    await world.review(two)
    world.approve(pr, two)
    world.repo.git("merge", "--ff-only", "-q", "bump")  # the PR's commits land on the first-parent line
    world.merged(pr)
    assert await world.judge(first) is None, "one plan from the PR's base to its head, as plnt review made it"


@pytest.mark.integration
async def test_forge_unavailable_holds_and_retries(world: World) -> None:
    first = world.repo.git("rev-parse", "HEAD")
    world.repo.write("NOTES.md", "a change\n")
    world.repo.commit("a change")
    world.standin.fail.extend([(503, {}), (503, {})])  # both attempts of the client
    held = await world.judge(first)
    assert held is not None and held.reason is not None and held.reason.startswith("forge unavailable, will retry")
    held = await world.judge(first)  # the forge is back: judged for real
    assert held is not None and held.reason is not None and "no pull request brought" in held.reason


@pytest.mark.integration
async def test_gitlab_without_reset_on_push_cannot_bind(spec_repo: SpecRepo, tmp_path: Path) -> None:
    with ForgeStandin("gitlab", "group/specs", TOKEN, gitlab_reset_on_push=False) as standin:
        w = World(spec_repo, standin, tmp_path)
        try:
            first = spec_repo.git("rev-parse", "HEAD")
            head = w.branch("bump", "1.3.0")
            pr = w.open_pr(head, [head])
            await w.review(head)
            w.approve(pr, head)
            spec_repo.git("merge", "--no-ff", "-q", "-m", "Merge bump", "bump")
            w.merged(pr, spec_repo.git("rev-parse", "HEAD"))
            held = await w.judge(first)
            assert held is not None and held.reason is not None and "reset_approvals_on_push" in held.reason
        finally:
            await w.forge.aclose()


@pytest.mark.integration
async def test_a_held_commit_is_judged_again_after_recheck_s_or_a_webhook(world: World) -> None:
    first = world.repo.git("rev-parse", "HEAD")
    world.repo.write("NOTES.md", "a change\n")
    direct = world.repo.commit("a direct push")
    head = world.source.fetch()
    held = await world.gate.first_unapproved(head, first)
    assert held is not None and held.commit == direct
    calls = len(world.standin.requests)
    world.now += world.gate.recheck_s - 1  # polls within recheck_s: the verdict is reused, no forge call
    assert await world.gate.first_unapproved(head, first) == held
    assert len(world.standin.requests) == calls
    world.now += 2  # past recheck_s: asked again
    assert await world.gate.first_unapproved(head, first) == held
    assert len(world.standin.requests) > calls
    calls = len(world.standin.requests)
    world.gate.recheck()  # a webhook: at once
    assert await world.gate.first_unapproved(head, first) == held
    assert len(world.standin.requests) > calls
    # The forge says when to come back (Retry-After beyond the client's own patience): not before.
    world.gate.recheck()
    world.standin.fail.append((503, {"Retry-After": "600"}))
    busy = await world.gate.first_unapproved(head, first)
    assert busy is not None and busy.reason is not None and busy.reason.startswith("forge unavailable, will retry")
    calls = len(world.standin.requests)
    world.now += world.gate.recheck_s + 1
    assert await world.gate.first_unapproved(head, first) == busy and len(world.standin.requests) == calls
    world.now += 600
    assert await world.gate.first_unapproved(head, first) == held


@pytest.mark.integration
async def test_a_pr_approved_into_another_branch_does_not_approve_the_tracked_one(world: World) -> None:
    first = world.repo.git("rev-parse", "HEAD")
    world.repo.git("branch", "staging")
    head = world.branch("bump", "1.3.0", start="staging")
    pr = world.open_pr(head, [head])
    world.standin.pulls[pr]["base"] = "staging"
    await world.review(head, pr)
    world.approve(pr, head)
    world.repo.git("checkout", "-q", "staging")
    world.repo.git("merge", "--no-ff", "-q", "-m", "Merge bump into staging", "bump")
    merge = world.repo.git("rev-parse", "HEAD")
    world.merged(pr, merge)
    world.repo.git("checkout", "-q", "main")
    world.repo.git("merge", "--ff-only", "-q", "staging")  # pushed to main without a PR into main
    held = await world.judge(first)
    assert held is not None and held.commit == merge and held.pr == pr
    assert held.reason is not None and "was merged into staging, not into the tracked branch main" in held.reason


@pytest.mark.integration
async def test_no_approval_status_without_report_status(world: World) -> None:
    world.gate.report = False
    first = world.repo.git("rev-parse", "HEAD")
    world.repo.write("NOTES.md", "a change\n")
    direct = world.repo.commit("a direct push")
    assert (await world.judge(first)) is not None
    assert await world.forge.commit_status(direct, APPROVAL_CONTEXT) is None
    assert not [r for r in world.standin.requests if r.method == "POST"]


# --- who may approve (issue 24, 3) ---------------------------------------------------------------

READ_ONLY = "read permission only (needs write, maintain or admin permission)"


def test_judge_counts_only_trusted_reviewers_and_says_why_the_others_did_not_count() -> None:
    outsider = Review(reviewer="alice", state="APPROVED", commit_id=HEAD)
    older = Review(reviewer="carol", state="APPROVED", commit_id=OLD)
    held = judge(C, MERGED, [outsider, older], posted=POSTED, computed=DIGEST, branch="main",
                 distrusted={"alice": READ_ONLY})
    assert not held.approved and held.approvers == ()
    assert [str(i) for i in held.ignored] == [f"alice: {READ_ONLY}", f"carol: approved an older head ({OLD[:12]})"]
    assert held.reason == (f"PR #12 was approved only on an older push ({OLD[:12]}); approve head {HEAD[:12]}; "
                           f"not counted: alice: {READ_ONLY}")
    alone = judge(C, MERGED, [outsider], posted=POSTED, computed=DIGEST, distrusted={"alice": READ_ONLY})
    assert alone.reason == (f"PR #12 has no approving review from a reviewer who may approve; not counted: "
                            f"alice: {READ_ONLY}; approve head {HEAD[:12]} as one")
    # The same reviews from trusted reviewers: alice's approval counts, carol's older one is still listed.
    approved = judge(C, MERGED, [outsider, older], posted=POSTED, computed=DIGEST)
    assert approved.approved and approved.approvers == ("alice",)
    assert [str(i) for i in approved.ignored] == [f"carol: approved an older head ({OLD[:12]})"]
    dumped = held.model_dump(mode="json")  # what GET /source shows
    assert dumped["ignored"][0] == {"reviewer": "alice", "why": READ_ONLY}


def test_a_change_request_from_an_untrusted_reviewer_does_not_block() -> None:
    reviews = [APPROVED_HEAD, Review(reviewer="mallory", state="CHANGES_REQUESTED", commit_id=HEAD)]
    blocked = judge(C, MERGED, reviews, posted=POSTED, computed=DIGEST)
    assert not blocked.approved and "mallory requested changes" in (blocked.reason or "")
    verdict = judge(C, MERGED, reviews, posted=POSTED, computed=DIGEST, distrusted={"mallory": "no access"})
    assert verdict.approved and verdict.approvers == ("reviewer-a",)
    assert [str(i) for i in verdict.ignored] == ["mallory: no access"]


def test_approvers_setting_needs_require_approval_and_valid_entries() -> None:
    from plnt.reconciler.settings import Settings
    from pydantic import SecretStr, ValidationError

    forge = {"repo": "x", "forge": "github", "forge_api_url": "https://api.github.com", "forge_project": "o/r",
             "forge_token": SecretStr(TOKEN)}
    assert Settings(**forge, require_approval=True, approvers=("alice", "acme/deployers")).review.approvers == (
        "alice", "acme/deployers")
    for alone in ({"approvers": ("alice",)}, {"code_owners": True}):
        with pytest.raises(ValidationError, match="add --require-approval"):
            Settings(**forge, **alone)  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="each is a user name or ORG/TEAM"):
        Settings(**forge, require_approval=True, approvers=("acme/",))


# Each forge's words for a reviewer who may not approve, and for one who may. Gitea says it itself:
# its reviews carry `official` (the branch rule counted the reviewer), which plnt reads.
GITEA_NEEDS = "write permission, or a place on the approvals allowlist of the branch's protection rule when it has one"
NOT_OFFICIAL = f"not an official reviewer on Gitea (needs {GITEA_NEEDS})"
NO_WRITE = {"github": ("read", READ_ONLY),
            "gitea": ("read", NOT_OFFICIAL),
            "gitlab": (30, "Developer (30) permission only (needs the Maintainer role or above)")}
MAY = {"github": "maintain", "gitea": "write", "gitlab": 40}


@pytest.fixture(params=["github", "gitlab", "gitea"])
async def world3(request: pytest.FixtureRequest, spec_repo: SpecRepo, tmp_path: Path) -> AsyncIterator[World]:
    """The World on each of the three forges."""
    async for w in make_world(request.param, spec_repo, tmp_path):
        yield w


async def merged_pr(w: World) -> tuple[int, str, str, str]:
    """A PR bumping review-responder, reviewed (`plnt review`) and merged with a merge commit; not yet approved."""
    first = w.repo.git("rev-parse", "HEAD")
    head = w.branch("bump", "1.3.0")
    pr = w.open_pr(head, [head])
    await w.review(head)
    w.repo.git("merge", "--no-ff", "-q", "-m", "Merge bump", "bump")
    merge = w.repo.git("rev-parse", "HEAD")
    w.merged(pr, merge)
    return pr, first, head, merge


def lookups(w: World) -> list[str]:
    return [r.path for r in w.standin.requests if "/permission" in r.path or "/members/all/" in r.path]


def team(w: World, *members: str) -> set[str]:
    """A team's members; on Gitea plnt's token account too, as Gitea shows a team only to its members."""
    return {*members, *([w.standin.token_user] if w.standin.kind == "gitea" else [])}


@pytest.mark.integration
async def test_an_approval_without_write_permission_does_not_count(world3: World) -> None:
    """Issue 24 (3): an approval on the head from an account the forge reports without write
    permission (GitLab: below Maintainer) holds the commit, saying whose approval did not count and why."""
    w = world3
    kind = w.standin.kind
    w.standin.access["outsider"] = NO_WRITE[kind][0]
    w.standin.access["maintainer"] = MAY[kind]
    pr, first, head, merge = await merged_pr(w)
    w.approve(pr, head, "outsider")
    held = await w.judge(first)
    assert held is not None and held.commit == merge and held.approvers == ()
    assert [str(i) for i in held.ignored] == [f"outsider: {NO_WRITE[kind][1]}"]
    # Gitea takes no review on a merged pull request: the reason names the way out instead.
    way_out = "Gitea takes no review on a merged pull request" if kind == "gitea" else f"approve head {head[:12]} as one"
    assert held.reason is not None and held.reason.startswith(
        f"PR #{pr} has no approving review from a reviewer who may approve; not counted: "
        f"outsider: {NO_WRITE[kind][1]}; {way_out}"), held.reason

    w.approve(pr, head, "maintainer")
    assert await w.judge(first) is None
    approved = w.gate._approved[merge]
    assert approved.approvers == ("maintainer",) and [i.reviewer for i in approved.ignored] == ["outsider"]
    status = await w.forge.commit_status(merge, APPROVAL_CONTEXT)
    assert status is not None and status.description.startswith(f"approved: PR #{pr} by maintainer, plan ")


@pytest.mark.integration
async def test_the_approvers_allowlist_narrows_who_may_approve(world3: World) -> None:
    w = world3
    kind = w.standin.kind
    w.gate = ApprovalGate(w.forge, w.source, cache=w.cache, registry_options=RegistryOptions(),
                          clock=lambda: w.now, approvers=("carol", "acme/deployers"))
    w.standin.teams["acme/deployers"] = team(w, "dave", "erin")
    w.standin.access.update({"bob": MAY[kind], "dave": MAY[kind], "erin": NO_WRITE[kind][0]})
    pr, first, head, merge = await merged_pr(w)
    for user in ("bob", "erin"):  # write but not listed; listed (by team) but without write
        w.approve(pr, head, user)
    held = await w.judge(first)
    assert held is not None and held.approvers == ()
    assert [str(i) for i in held.ignored] == ["bob: not in the approvers allowlist (--approvers)",
                                              f"erin: {NO_WRITE[kind][1]}"]
    w.approve(pr, head, "dave")  # in the team, with write: counts
    assert await w.judge(first) is None
    assert w.gate._approved[merge].approvers == ("dave",)


@pytest.mark.integration
async def test_permission_lookups_are_made_once_per_pass(world3: World) -> None:
    w = world3
    first = w.repo.git("rev-parse", "HEAD")
    prs = []
    for i, version in enumerate(("1.3.0", "1.4.0")):  # two merged PRs, both approved by the same reviewer
        head = w.branch(f"bump{i}", version)
        pr = w.open_pr(head, [head])
        await w.review(head)
        w.approve(pr, head, "maintainer")
        w.repo.git("merge", "--no-ff", "-q", "-m", f"Merge bump{i}", f"bump{i}")
        w.merged(pr, w.repo.git("rev-parse", "HEAD"))
        prs.append(pr)
    assert await w.judge(first) is None
    # Gitea's reviews say whether the reviewer was official: no lookup there.
    assert len(lookups(w)) == (0 if w.standin.kind == "gitea" else 1), lookups(w)


@pytest.mark.integration
async def test_a_failed_permission_lookup_holds_never_approves(world3: World) -> None:
    w = world3
    pr, first, head, merge = await merged_pr(w)
    w.approve(pr, head, "maintainer")
    if w.standin.kind == "gitea":  # reviews without `official` (Gitea's make the lookup needless), a token that may ask
        w.standin.access[w.standin.token_user] = "admin"
        w.standin.reviews[pr][-1].pop("official")
    w.standin.deny.add("members")  # the token may not read permissions: held, with what the token needs
    held = await w.judge(first)
    assert held is not None and held.reason is not None
    assert held.reason.startswith("the forge refused plnt's token (") and "the token needs" in held.reason
    w.standin.deny.clear()
    w.standin.garble.append((r"/(collaborators/[^/]+/permission|members/all/\d+)$", b"<html>maintenance</html>"))
    held = await w.judge(first)
    assert held is not None and held.reason is not None and held.reason.startswith("forge unavailable, will retry (")
    assert "that are not JSON" in held.reason
    assert await w.judge(first) is None  # the forge answers again: approved


# --- forge answers of the wrong shape reach the status as "forge unavailable" (issue 24, 5) ---------

@pytest.mark.integration
@pytest.mark.parametrize("family", ["pulls", "reviews", "status"])
async def test_a_garbled_forge_answer_holds_as_forge_unavailable(world3: World, family: str) -> None:
    w = world3
    pr, first, head, merge = await merged_pr(w)
    w.approve(pr, head, "maintainer")
    path = {"pulls": r"/commits/[0-9a-f]+/(pulls?|merge_requests)$",
            "reviews": r"/(pulls/\d+/reviews|merge_requests/\d+/approvals)$",
            "status": r"/commits/[0-9a-f]+/status(es)?$"}[family]
    w.standin.garble.append((path, lambda payload: [payload] if isinstance(payload, dict) else {"items": payload}))
    held = await w.judge(first)
    assert held is not None and held.commit == merge and held.approved is False
    assert held.reason is not None and held.reason.startswith(f"forge unavailable, will retry ({w.standin.kind} GET /")
    assert "answered JSON of an unexpected shape" in held.reason and TOKEN not in held.reason
    assert held.problem().startswith(f"commit {merge[:12]} is held: forge unavailable")  # what GET /source lists
    assert await w.judge(first) is None  # retried at the next pass: the forge answers well again


# --- CODEOWNERS (--code-owners) ----------------------------------------------------------------------

@pytest.mark.integration
async def test_code_owners_of_each_changed_file_must_approve(world3: World) -> None:
    """Each file the PR changes needs an approval of the head from one of its owners (a user or a
    team), per CODEOWNERS as it was on the tracked branch before the PR: a PR that names its own
    approver as owner does not get its way."""
    w = world3
    w.gate = ApprovalGate(w.forge, w.source, cache=w.cache, registry_options=RegistryOptions(),
                          clock=lambda: w.now, code_owners=True)
    w.standin.teams["acme/deployers"] = team(w, "dave")
    w.repo.write(".github/CODEOWNERS", "* @maintainer\n/workflowruns/ @acme/deployers\n")
    first = w.repo.commit("CODEOWNERS")
    head = w.branch("bump", "1.3.0")
    w.repo.git("checkout", "-q", "bump")
    w.repo.write(".github/CODEOWNERS", "* @maintainer\n/workflowruns/ @maintainer\n")  # the PR names its own owner
    head = w.repo.commit("workflowruns are mine now")
    w.repo.git("checkout", "-q", "main")
    pr = w.open_pr(head, [head])
    await w.review(head)
    w.repo.git("merge", "--no-ff", "-q", "-m", "Merge bump", "bump")
    merge = w.repo.git("rev-parse", "HEAD")
    w.merged(pr, merge)

    w.approve(pr, head, "maintainer")  # owns CODEOWNERS (`*`), not workflowruns/ (before the PR)
    held = await w.judge(first)
    assert held is not None and held.commit == merge and held.approvers == ("maintainer",)
    assert held.reason == (f"PR #{pr}: {RUN_FILE} needs an approval from one of its code owners (@acme/deployers: "
                           f".github/CODEOWNERS line 2 at {first[:12]}); approve head {head[:12]} as one of them")
    w.approve(pr, head, "dave")  # in acme/deployers
    assert await w.judge(first) is None
    assert w.gate._approved[merge].approvers == ("dave", "maintainer")


@pytest.mark.integration
async def test_an_unsupported_codeowners_line_holds_naming_it(world: World) -> None:
    w = world
    w.gate = ApprovalGate(w.forge, w.source, cache=w.cache, registry_options=RegistryOptions(),
                          clock=lambda: w.now, code_owners=True)
    w.repo.write("CODEOWNERS", "* @maintainer\n!secret.yaml @nobody\n")
    first = w.repo.commit("CODEOWNERS")
    pr, _, head, merge = await merged_pr(w)
    w.approve(pr, head, "maintainer")
    held = await w.judge(first)
    assert held is not None and held.reason is not None
    assert held.reason.startswith(f"CODEOWNERS at {first[:12]} cannot be read: CODEOWNERS line 2: '!secret.yaml': "
                                  "negation and character classes are not supported")


# --- Gitea, as a real Gitea 1.26.0 answers (tests/forge) --------------------------------------------

@pytest.fixture
async def gitea_world(spec_repo: SpecRepo, tmp_path: Path) -> AsyncIterator[World]:
    async for w in make_world("gitea", spec_repo, tmp_path):
        yield w


async def reviewed_then_merged(w: World, *reviews: tuple[str, str], version: str = "1.3.0") -> tuple[int, str, str, str]:
    """A PR bumping review-responder to `version`, reviewed (`plnt review`), then the (user, Gitea state) reviews on
    its head, then merged with a merge commit: on Gitea the reviews come before the merge, which
    takes none after."""
    first = w.repo.git("rev-parse", "HEAD")
    head = w.branch("bump", version)
    pr = w.open_pr(head, [head])
    await w.review(head)
    for user, state in reviews:
        w.standin.add_review(pr, user, state, head)
    w.repo.git("merge", "--no-ff", "-q", "-m", "Merge bump", "bump")
    merge = w.repo.git("rev-parse", "HEAD")
    w.merged(pr, merge)
    return pr, first, head, merge


@pytest.mark.integration
async def test_gitea_a_reviewer_the_branch_rule_does_not_count_is_not_official(gitea_world: World) -> None:
    """Gitea decides who is an official reviewer (the approvals allowlist of the branch's protection
    rule, else write access) and says so on each review: plnt takes its word, in its words, and asks
    no permission endpoint (which answers only a repository administrator's token there)."""
    w = gitea_world
    w.standin.approvals_allowlist = {"platform/deployers"}
    w.standin.teams["platform/deployers"] = {"dave"}
    w.standin.access.update({"bob": "admin", "dave": "read"})
    # bob: admin, but not on the allowlist; dave: on it through the team, with read access only
    pr, first, head, merge = await reviewed_then_merged(w, ("bob", "APPROVED"), ("dave", "APPROVED"))
    assert [r["official"] for r in w.standin.reviews[pr]] == [False, True]
    assert await w.judge(first) is None
    approved = w.gate._approved[merge]
    assert approved.approvers == ("dave",) and [str(i) for i in approved.ignored] == [f"bob: {NOT_OFFICIAL}"]
    assert lookups(w) == []

    pr, _, head, merge = await reviewed_then_merged(w, ("bob", "APPROVED"), version="1.4.0")  # none official: held
    held = await w.judge(first)
    assert held is not None and held.commit == merge and held.approvers == ()
    assert held.reason is not None and held.reason.startswith(
        f"PR #{pr} has no approving review from a reviewer who may approve; not counted: bob: {NOT_OFFICIAL}; "), held.reason
    assert lookups(w) == []


@pytest.mark.integration
async def test_gitea_official_is_judged_per_pull_request_within_one_pass(gitea_world: World) -> None:
    """A reviewer official on one pull request and not on the next (write access taken away between
    the two reviews), both merges judged in one pass: the second is held. (Verdicts once cached per
    reviewer name for the pass would have approved it on the first one's.)"""
    w = gitea_world
    w.standin.access["xavier"] = "write"
    first = w.repo.git("rev-parse", "HEAD")
    pr_a, _, _, merge_a = await reviewed_then_merged(w, ("xavier", "APPROVED"))
    w.standin.access["xavier"] = "read"
    pr_b, _, _, merge_b = await reviewed_then_merged(w, ("xavier", "APPROVED"), version="1.4.0")
    assert [r["official"] for r in (*w.standin.reviews[pr_a], *w.standin.reviews[pr_b])] == [True, False]
    held = await w.judge(first)
    assert held is not None and held.commit == merge_b and held.pr == pr_b, held
    assert w.gate._approved[merge_a].approvers == ("xavier",)
    assert [str(i) for i in held.ignored] == [f"xavier: {NOT_OFFICIAL}"]


@pytest.mark.integration
async def test_gitea_a_change_request_holds_the_commit(gitea_world: World) -> None:
    w = gitea_world
    w.standin.access["visitor"] = "read"
    # A change request from a reviewer Gitea does not count does not block (and says why).
    pr, first, head, merge = await reviewed_then_merged(w, ("maintainer", "APPROVED"), ("visitor", "REQUEST_CHANGES"))
    assert await w.judge(first) is None
    assert [str(i) for i in w.gate._approved[merge].ignored] == [f"visitor: {NOT_OFFICIAL}"]
    # An official one holds the merge: Gitea's REQUEST_CHANGES is GitHub's CHANGES_REQUESTED to plnt.
    pr, _, head, merge = await reviewed_then_merged(w, ("maintainer", "APPROVED"), ("lead", "REQUEST_CHANGES"),
                                                    version="1.4.0")
    assert w.standin.reviews[pr][-1]["state"] == "REQUEST_CHANGES" and w.standin.reviews[pr][-1]["official"]
    held = await w.judge(first)
    assert held is not None and held.commit == merge and held.reason is not None
    assert held.reason.startswith(f"PR #{pr}: lead requested changes and did not approve since"), held.reason


@pytest.mark.integration
async def test_gitea_reviews_without_official_ask_the_permission_endpoint(gitea_world: World) -> None:
    w = gitea_world
    pr, first, head, merge = await reviewed_then_merged(w, ("maintainer", "APPROVED"))
    w.standin.reviews[pr][-1].pop("official")
    held = await w.judge(first)  # plnt's token is no repository administrator: Gitea answers 403
    assert held is not None and held.reason is not None and held.reason.startswith("the forge refused plnt's token (")
    assert lookups(w) == [f"/api/v1/repos/{w.standin.project}/collaborators/maintainer/permission"]
    w.standin.access[w.standin.token_user] = "admin"
    assert await w.judge(first) is None
    assert w.gate._approved[merge].approvers == ("maintainer",)


@pytest.mark.integration
async def test_gitea_an_approvers_team_the_token_cannot_see_holds_saying_so(gitea_world: World) -> None:
    """Gitea lists a team only to its members: --approvers naming a team plnt's token account is not in
    holds the merge naming the team, not "not in the approvers allowlist" for each of its members."""
    w = gitea_world
    w.gate = ApprovalGate(w.forge, w.source, cache=w.cache, registry_options=RegistryOptions(),
                          clock=lambda: w.now, approvers=("platform/deployers",))
    w.standin.teams.update({"platform/deployers": {"dave"}, "platform/readers": {w.standin.token_user}})
    pr, first, head, merge = await reviewed_then_merged(w, ("dave", "APPROVED"))
    held = await w.judge(first)
    assert held is not None and held.commit == merge and held.reason is not None
    assert held.reason.startswith("the forge refused plnt's token (") and "team platform/deployers is not visible" \
        in held.reason, held.reason
    w.standin.teams["platform/deployers"].add(w.standin.token_user)
    assert await w.judge(first) is None
    assert w.gate._approved[merge].approvers == ("dave",)
