"""`--require-approval`: a commit deploys only when the pull request that brought it was approved
on its head, and the plan posted there is the plan of the commit now.

For every first-parent commit the tracked branch gained since the last reconciled commit
(`git rev-list --first-parent NEW --not LAST`; the head alone when nothing was reconciled yet),
plnt asks the forge for the pull request that introduced it, that PR's reviews and the `plnt/plan`
status `plnt review` posted on the PR's head, and computes the plan digest of the commit again
(its first parent's specs as the live side, recipes pulled and verified through the reconciler's
recipe cache, as `plnt review` does). `judge` (pure) decides; `ApprovalGate` does the I/O.

Consecutive first-parent commits of one PR (a rebase merge or a GitLab fast-forward merge puts
each of the PR's commits on the first-parent line) are judged together: their plan runs from the
parent of the first to the last, which is what `plnt review` planned for the PR.

Only reviewers plnt trusts count, for approvals and change requests alike: those the forge reports
with write permission on the repository or more (GitLab: the Maintainer role or more, its default
"Allowed to merge"), and, with --approvers, only the users and teams listed there. Lookups are made
once per pass; one that fails holds the commit as "forge unavailable", never counts as approval. The
verdict lists whose approval counted and why each other did not. With --code-owners, each file the
pull request changes also needs the approval of one of its owners in CODEOWNERS (codeowners.py), as
the file was on the tracked branch before the pull request.

A merge commit and a squash commit are one first-parent commit each. Commits inside a merged
branch are not judged one by one: the PR's approval covers them (`--verify-commits all` checks
their signatures). An approved verdict is cached per commit (a merged PR's approval on its head
cannot change); a held one is judged again at every pass, so approving the head (or re-running
`plnt review`) releases it without a new push.
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from plnt.reconciler.errors import PlntError
from plnt.reconciler.review.codeowners import LOCATIONS, CodeOwnersError, Owners, owners_of, parse
from plnt.reconciler.review.codeowners import MAX_BYTES as MAX_CODEOWNERS_BYTES
from plnt.reconciler.review.forge import (
    Forge,
    ForgeError,
    ForgeNotFound,
    ForgeRefused,
    ForgeUnavailable,
    PullRequest,
    Review,
    State,
)
from pydantic import BaseModel, ConfigDict

NOT_LISTED = "not in the approvers allowlist (--approvers)"
from plnt.core.specs.limits import SpecLimits
from plnt.core.specs.loader import DEFAULT_LIMITS
from plnt.reconciler.plan.digest import STATUS_CONTEXT, in_description, short
from plnt.reconciler.recipes.pull import RecipeCache
from plnt.reconciler.recipes.registries import RegistryOptions
from plnt.reconciler.review.plan_review import review_commits
from plnt.reconciler.source.git import GitSource

log = logging.getLogger(__name__)

# More new first-parent commits than this in one pass are not judged one by one (each costs forge
# calls and a plan): the head is held with a reason instead.
MAX_COMMITS = 100

# The commit status plnt sets on each judged commit of the tracked branch (with --report-status).
APPROVAL_CONTEXT = "plnt/approval"

# A held commit is judged again after this many seconds, or at once on a webhook (recheck()).
RECHECK_S = 30.0

# A commit stays in every later range until it is judged approved (a revert on top does not take it
# out): what a held commit that no review can approve any more needs.
_WAY_OUT = ("take it off the branch (force-push), or an operator accepts it by reconciling once without "
            "--require-approval")

_DECIDING = ("APPROVED", "CHANGES_REQUESTED", "DISMISSED")


class Ignored(BaseModel):
    """A review that did not count, and why."""

    model_config = ConfigDict(frozen=True)

    reviewer: str
    why: str  # e.g. "read permission only (needs write, maintain or admin permission)", "approved an older head ..."

    def __str__(self) -> str:
        return f"{self.reviewer}: {self.why}"


class ApprovalVerdict(BaseModel):
    """One commit's verdict (GET /source `held` when not approved)."""

    model_config = ConfigDict(frozen=True)

    commit: str
    approved: bool
    pr: int | None = None
    head: str | None = None       # the PR's head commit, where the approval and the plan digest must be
    approvers: tuple[str, ...] = ()  # whose approval of the head counted
    ignored: tuple[Ignored, ...] = ()  # each other review that would have decided, and why it did not count
    digest: str | None = None     # the short plan digest computed now (when it was computed)
    reason: str | None = None     # why held, and what to do

    def problem(self) -> str:
        return f"commit {self.commit[:12]} is held: {self.reason}"


def latest_deciding(reviews: Sequence[Review]) -> dict[str, Review]:
    """Each reviewer's latest deciding review (a comment decides nothing)."""
    latest: dict[str, Review] = {}
    for review in reviews:
        if review.state in _DECIDING:
            latest[review.reviewer] = review
    return latest


def count_reviews(reviews: Sequence[Review], head: str,
                  distrusted: Mapping[str, str]) -> tuple[dict[str, Review], tuple[str, ...], tuple[Ignored, ...]]:
    """The latest deciding reviews of trusted reviewers, whose approval of `head` counts, and each
    review that does not count with why (`distrusted`: reviewer -> why they may not approve). Pure."""
    latest = latest_deciding(reviews)
    ignored = [Ignored(reviewer=name, why=distrusted[name]) for name, r in sorted(latest.items())
               if name in distrusted and r.state != "DISMISSED"]
    trusted = {name: r for name, r in latest.items() if name not in distrusted}
    counted = tuple(sorted(name for name, r in trusted.items() if r.state == "APPROVED" and r.commit_id == head))
    ignored += [Ignored(reviewer=name, why=f"approved an older head ({r.commit_id[:12]})")
                for name, r in sorted(trusted.items())
                if r.state == "APPROVED" and r.commit_id is not None and r.commit_id != head]
    return trusted, counted, tuple(ignored)


def judge_review(commit: str, pr: PullRequest | None, reviews: Sequence[Review], *,
                 branch: str | None = None, distrusted: Mapping[str, str] | None = None,
                 no_review_after_merge: str | None = None) -> ApprovalVerdict | None:
    """The review half of `judge`: a held verdict, or None when the PR is merged (into `branch`, the
    tracked one, when the forge names its target) and approved on its head by a reviewer plnt trusts
    (`distrusted`: reviewer -> why their reviews do not count; `no_review_after_merge`: the forge's
    name when it takes no review on a merged pull request, so "approve the head" cannot be the way
    out). Pure. (The gate calls it first, so a commit no review approves costs no plan.)"""
    c = commit[:12]
    if pr is None:
        return ApprovalVerdict(commit=commit, approved=False, reason=(
            f"no pull request brought commit {c} (a direct push); with --require-approval only merged, "
            f"approved pull requests deploy: {_WAY_OUT}"))
    head = pr.head_sha[:12]
    held = {"commit": commit, "approved": False, "pr": pr.number, "head": pr.head_sha}
    if not pr.merged:
        return ApprovalVerdict(**held, reason=(
            f"PR #{pr.number} that contains commit {c} is {pr.state}, not merged; only what a merged, "
            f"approved pull request brings deploys: {_WAY_OUT}"))
    if branch is not None and pr.base_ref is not None and pr.base_ref != branch:
        return ApprovalVerdict(**held, reason=(
            f"PR #{pr.number} that brought commit {c} was merged into {pr.base_ref}, not into the tracked branch "
            f"{branch}; a review for another branch does not approve this one: {_WAY_OUT}"))
    distrusted = distrusted or {}

    def approve(advice: str) -> str:
        if no_review_after_merge is None:
            return advice
        return (f"{no_review_after_merge} takes no review on a merged pull request, so no approval can release it "
                f"now: {_WAY_OUT}")

    latest, on_head, ignored = count_reviews(reviews, pr.head_sha, distrusted)
    held["ignored"] = ignored
    # Why reviews of reviewers plnt does not trust did not count (the others' say so in the reason).
    untrusted = [str(i) for i in ignored if i.reviewer in distrusted]
    not_counted = f"; not counted: {', '.join(untrusted)}" if untrusted else ""
    approvals = [r for r in reviews if r.state == "APPROVED" and r.reviewer not in distrusted]
    if approvals and all(r.commit_id is None for r in approvals):
        return ApprovalVerdict(**held, reason=(
            f"PR #{pr.number}'s approvals cannot be bound to its head {head}: the forge does not say which "
            "push they approved (GitLab: enable 'Remove all approvals when commits are added' "
            "(reset_approvals_on_push) on the project, then approve again)"))
    blocking = sorted(name for name, r in latest.items() if r.state == "CHANGES_REQUESTED")
    if blocking:
        return ApprovalVerdict(**held, reason=(
            f"PR #{pr.number}: {', '.join(blocking)} requested changes and did not approve since; "
            + approve(f"their approval of head {head} (or a dismissal of the review) releases it") + not_counted))
    if not on_head:
        older = sorted({r.commit_id[:12] for r in approvals if r.commit_id and r.commit_id != pr.head_sha})
        if older:
            stale = ("" if no_review_after_merge is None else
                     f" (with 'Dismiss stale approvals' or 'Ignore stale approvals' in the branch's protection, "
                     f"{no_review_after_merge} refuses such a merge)")
            return ApprovalVerdict(**held, reason=(
                f"PR #{pr.number} was approved only on an older push ({', '.join(older)}); "
                + approve(f"approve head {head}") + stale + not_counted))
        if untrusted:
            return ApprovalVerdict(**held, reason=(
                f"PR #{pr.number} has no approving review from a reviewer who may approve{not_counted}; "
                + approve(f"approve head {head} as one")))
        return ApprovalVerdict(**held, reason=f"PR #{pr.number} has no approving review; " + approve(f"approve head {head}"))
    return None


def judge(commit: str, pr: PullRequest | None, reviews: Sequence[Review], *, posted: str | None,
          computed: str | None, plan_problems: Sequence[str] = (), branch: str | None = None,
          distrusted: Mapping[str, str] | None = None) -> ApprovalVerdict:
    """One commit's verdict. `posted`: the description of the `plnt/plan` status on the PR's head
    (None: none posted); `computed`: the short digest of the commit's plan now (None when it cannot
    be made, `plan_problems` saying why); `distrusted`: reviewer -> why their reviews do not count. Pure."""
    held_by_review = judge_review(commit, pr, reviews, branch=branch, distrusted=distrusted)
    if held_by_review is not None:
        return held_by_review
    assert pr is not None
    head = pr.head_sha[:12]
    _, approvers, ignored = count_reviews(reviews, pr.head_sha, distrusted or {})
    base = {"commit": commit, "pr": pr.number, "head": pr.head_sha, "approvers": approvers, "ignored": ignored,
            "digest": computed}
    if computed is None:
        first = plan_problems[0] if plan_problems else "unknown reason"
        more = f" (and {len(plan_problems) - 1} more)" if len(plan_problems) > 1 else ""
        return ApprovalVerdict(**base, approved=False, reason=(
            f"the plan of commit {commit[:12]} cannot be made now: {first}{more}; fix it in a new pull request"))
    posted_digest = in_description(posted or "")
    if posted_digest is None:
        what = f"its {STATUS_CONTEXT} status says {posted!r}" if posted else f"no {STATUS_CONTEXT} status on it"
        return ApprovalVerdict(**base, approved=False, reason=(
            f"PR #{pr.number}'s head {head} carries no plan digest ({what}): run `plnt review` in the "
            "pull request's CI, then approve"))
    if posted_digest != computed:
        return ApprovalVerdict(**base, approved=False, reason=(
            f"the plan approved on PR #{pr.number} (head {head}: plan {posted_digest}) is not the plan of "
            f"commit {commit[:12]} now (plan {computed}): what deploys changed since the review (the base "
            "branch, a recipe or its signer); re-run `plnt review` on a new pull request and approve that"))
    return ApprovalVerdict(**base, approved=True)


@dataclass(frozen=True)
class PlanDigest:
    digest: str | None          # the full plan digest, None when the plan cannot be made
    problems: tuple[str, ...]


def plan_digest_between(source: GitSource, base: str | None, head: str, *, cache: RecipeCache,
                        registry_options: RegistryOptions, limits: SpecLimits = DEFAULT_LIMITS) -> PlanDigest:
    """The digest `plnt review --base BASE --head HEAD` posts, for commits already fetched: the same
    code (review.review_commits) with BASE as the merge base, which it is when BASE is HEAD's first
    parent (base None: a root commit, everything new). Blocking: call it in a thread."""
    made = review_commits(source, base, head, cache=cache, registry_options=registry_options, limits=limits)
    return PlanDigest(made.digest, (*made.spec_problems, *made.evidence.problems))


@dataclass
class GateCounters:
    """What the gate did (the bench prints these)."""

    forge_calls: int = 0
    plans: int = 0
    cached: int = 0


class ApprovalGate:
    """The I/O half: forge reads, the plan digest, the first-parent walk, the cache."""

    def __init__(self, forge: Forge, source: GitSource, *, cache: RecipeCache, registry_options: RegistryOptions,
                 limits: SpecLimits = DEFAULT_LIMITS, max_commits: int = MAX_COMMITS, recheck_s: float = RECHECK_S,
                 report: bool = True, git: str = "git", clock: Callable[[], float] = time.monotonic,
                 approvers: Sequence[str] = (), code_owners: bool = False) -> None:
        self.forge = forge
        self._code_owners = code_owners
        self._members: dict[tuple[str, str], bool] = {}  # this pass's team lookups: (team, reviewer) -> member
        # --approvers: users (a name) and teams (ORG/TEAM; GitLab: a group's full path) whose approval may count.
        self._users = {a.casefold() for a in approvers if "/" not in a}
        self._teams = tuple(a for a in approvers if "/" in a)
        self._allowlist = bool(approvers)
        # This pass's verdicts: (reviewer, Gitea's official flag) -> why not trusted (None: trusted).
        self._distrust: dict[tuple[str, bool | None], str | None] = {}
        self._source = source
        self._cache = cache
        self._registry_options = registry_options
        self._limits = limits
        self._max_commits = max_commits
        self._git = git
        self.recheck_s = recheck_s
        self.report = report
        self._reported: dict[str, tuple[State, str]] = {}  # commit -> (state, description) last set
        self._clock = clock
        self._held: tuple[tuple[str, str | None], ApprovalVerdict, float] | None = None
        self._approved: dict[str, ApprovalVerdict] = {}
        self._digests: dict[tuple[str, str], PlanDigest] = {}  # (base, head): only digests made without problems
        self.counters = GateCounters()

    async def aclose(self) -> None:
        await self.forge.aclose()

    def recheck(self) -> None:
        """Judge a held commit again at the next pass (a webhook: e.g. a review was just submitted)."""
        self._held = None

    async def first_unapproved(self, head: str, last_reconciled: str | None) -> ApprovalVerdict | None:
        """The first held commit (oldest first) the branch gained since `last_reconciled`, or None.
        A held verdict is reused for `recheck_s` (longer when the forge asked us to wait), so a poll
        every few seconds does not spend the forge's rate limit; `recheck()` ends that at once."""
        if last_reconciled == head:
            return None
        key = (head, last_reconciled)
        if self._held is not None and self._held[0] == key and self._clock() < self._held[2]:
            return self._held[1]
        verdict, wait = await self._judge_range(head, last_reconciled)
        self._held = (key, verdict, self._clock() + wait) if verdict is not None else None
        return verdict

    async def _judge_range(self, head: str, last_reconciled: str | None) -> tuple[ApprovalVerdict | None, float]:
        self._distrust, self._members = {}, {}  # a reviewer's permission or team may change between passes
        commits = await asyncio.to_thread(self._new_commits, head, last_reconciled)
        try:
            if len(commits) > self._max_commits:
                held: ApprovalVerdict | None = ApprovalVerdict(commit=head, approved=False, reason=(
                    f"{len(commits)} new first-parent commits since {str(last_reconciled)[:12]}, more than the "
                    f"{self._max_commits} plnt judges in one pass; review the range by hand, then reconcile it "
                    "once without --require-approval"))
            else:
                held = await self._walk(commits)
            if held is not None:
                await self._report(held)
            return held, self.recheck_s
        except ForgeUnavailable as exc:
            return ApprovalVerdict(commit=head, approved=False, reason=f"forge unavailable, will retry ({exc})"), \
                max(self.recheck_s, exc.retry_after or 0.0)
        except ForgeRefused as exc:
            return ApprovalVerdict(commit=head, approved=False, reason=(
                f"the forge refused plnt's token ({exc}); give --forge-token that permission")), self.recheck_s
        except ForgeError as exc:
            return ApprovalVerdict(commit=head, approved=False, reason=f"forge error, will retry ({exc})"), \
                self.recheck_s

    async def _walk(self, commits: list[str]) -> ApprovalVerdict | None:
        prs: dict[str, PullRequest | None] = {}  # this pass's lookups (the look-ahead asks for the next one)
        i = 0
        while i < len(commits):
            commit = commits[i]
            if commit in self._approved:
                self.counters.cached += 1
                i += 1
                continue
            pr = await self._pr_of(commit, prs)
            group = [commit]
            # The PR's further commits right after this one (a rebase or fast-forward merge): one plan.
            while pr is not None and i + len(group) < len(commits):
                nxt = commits[i + len(group)]
                nxt_pr = await self._pr_of(nxt, prs)
                if nxt_pr is None or nxt_pr.number != pr.number:
                    break
                group.append(nxt)
            verdict = await self._judge_group(group, pr)
            if not verdict.approved:
                return verdict
            for member in group:
                self._approved[member] = verdict.model_copy(update={"commit": member})
            await self._report(verdict)
            i += len(group)
        return None

    async def _report(self, verdict: ApprovalVerdict) -> None:
        """The verdict as the commit's `plnt/approval` status on the forge: one per change, and a
        failure to write it never holds or releases anything (logged once)."""
        if not self.report:
            return
        state: State
        if verdict.approved:
            state, text = "success", (f"approved: PR #{verdict.pr} by {', '.join(verdict.approvers)}, "
                                      f"plan {verdict.digest}")
        else:
            state, text = "failure", f"held: {verdict.reason}"
        if self._reported.get(verdict.commit) == (state, text):
            return
        self._reported[verdict.commit] = (state, text)
        try:
            await self.forge.set_status(verdict.commit, state, APPROVAL_CONTEXT, text)
        except ForgeError as exc:
            log.warning("approval-status-not-set commit=%s error=%s", verdict.commit[:12], exc)

    async def _pr_of(self, commit: str, seen: dict[str, PullRequest | None]) -> PullRequest | None:
        if commit not in seen:
            self.counters.forge_calls += 1
            try:
                seen[commit] = await self.forge.pull_request_for_commit(commit)
            except ForgeNotFound:
                seen[commit] = None
        return seen[commit]

    async def _judge_group(self, group: list[str], pr: PullRequest | None) -> ApprovalVerdict:
        last = group[-1]
        reviews: list[Review] = []
        distrusted: dict[str, str] = {}
        if pr is not None and pr.merged:
            self.counters.forge_calls += 1
            reviews = await self.forge.approvals(pr.number)
            distrusted = await self._distrusted(reviews)
        held = judge_review(last, pr, reviews, branch=self._source.branch, distrusted=distrusted,
                            no_review_after_merge=None if self.forge.reviews_after_merge else self.forge.kind.title())
        if held is not None:
            return held
        assert pr is not None
        parent = await asyncio.to_thread(self._first_parent, group[0])
        if self._code_owners:
            held = await self._owners_held(last, parent, pr, reviews, distrusted)
            if held is not None:
                return held
        self.counters.forge_calls += 1
        status = await self.forge.commit_status(pr.head_sha, STATUS_CONTEXT)
        made = await self._digest(parent, last)
        verdict = judge(last, pr, reviews, posted=status.description if status else None,
                        computed=short(made.digest) if made.digest else None, plan_problems=made.problems,
                        branch=self._source.branch, distrusted=distrusted)
        log.info("approval commit=%s pr=%d head=%s approved=%s", last[:12], pr.number, pr.head_sha[:12], verdict.approved)
        return verdict

    async def _distrusted(self, reviews: Sequence[Review]) -> dict[str, str]:
        """Reviewer -> why their reviews do not count, for each reviewer whose latest review decides.
        Forge errors propagate: a lookup that fails holds the commit, it never approves."""
        out: dict[str, str] = {}
        for name, review in sorted(latest_deciding(reviews).items()):
            if review.state == "DISMISSED":
                continue
            # Keyed by what the verdict depends on: the name, and on Gitea the review's own `official`
            # flag, which belongs to one pull request (a reviewer may count on one and not on the next).
            key = (name, review.official)
            if key not in self._distrust:
                self._distrust[key] = await self._why_not_trusted(review)
            why = self._distrust[key]
            if why is not None:
                out[name] = why
        return out

    async def _in_team(self, team: str, review: Review) -> bool:
        key = (team, review.reviewer)
        if key not in self._members:
            self.counters.forge_calls += 1
            self._members[key] = await self.forge.in_team(team, review)
        return self._members[key]

    async def _owns(self, owners: Owners, review: Review) -> bool:
        """The reviewer is one of the owners, by name or through a team (an e-mail owner never matches)."""
        for owner in owners.owners:
            if "@" in owner:
                continue
            if "/" in owner:
                if await self._in_team(owner, review):
                    return True
            elif owner.casefold() == review.reviewer.casefold():
                return True
        return False

    async def _owners_held(self, commit: str, parent: str | None, pr: PullRequest, reviews: Sequence[Review],
                           distrusted: Mapping[str, str]) -> ApprovalVerdict | None:
        """--code-owners: held unless each file the commit changes (since its first parent) has an approval
        of the head from one of its owners, per CODEOWNERS as it was at the first parent."""
        latest, approvers, ignored = count_reviews(reviews, pr.head_sha, distrusted)
        held = {"commit": commit, "approved": False, "pr": pr.number, "head": pr.head_sha, "approvers": approvers,
                "ignored": ignored}
        if parent is None:  # a root commit: no CODEOWNERS before it
            return None
        try:
            found = await asyncio.to_thread(self._codeowners_at, parent)
            if found is None:
                return None
            where, text = found
            rules = parse(text)
            changed = await asyncio.to_thread(self._changed_paths, parent, commit)
        except (CodeOwnersError, PlntError, OSError) as exc:
            return ApprovalVerdict(**held, reason=(
                f"CODEOWNERS at {parent[:12]} cannot be read: {exc}; fix it on the tracked branch (--code-owners)"))
        missing: list[Owners] = []
        for needed in owners_of(rules, changed):
            if not [name for name in approvers if await self._owns(needed, latest[name])]:
                missing.append(needed)
        if not missing:
            return None
        first = missing[0]
        section = f", section [{first.rule.section}]" if first.rule.section else ""
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        return ApprovalVerdict(**held, reason=(
            f"PR #{pr.number}: {first.path} needs an approval from one of its code owners "
            f"({', '.join('@' + o if '@' not in o else o for o in first.owners)}: {where} line {first.rule.line}"
            f"{section} at {parent[:12]}){more}; approve head {pr.head_sha[:12]} as one of them"))

    async def _why_not_trusted(self, review: Review) -> str | None:
        if self._allowlist and review.reviewer.casefold() not in self._users:
            for team in self._teams:
                if await self._in_team(team, review):
                    break
            else:
                return NOT_LISTED
        self.counters.forge_calls += 1
        access = await self.forge.access(review)
        if access.may_approve:
            return None
        if access.why:
            return access.why
        if access.level.startswith("none"):
            return f"no access to the repository (needs {access.needs})"
        return f"{access.level} permission only (needs {access.needs})"

    async def _digest(self, base: str | None, head: str) -> PlanDigest:
        key = (base or "", head)
        cached = self._digests.get(key)
        if cached is not None:
            return cached
        self.counters.plans += 1
        made = await asyncio.to_thread(plan_digest_between, self._source, base, head, cache=self._cache,
                                       registry_options=self._registry_options, limits=self._limits)
        if made.digest is not None:  # problems may be passing (a registry down): judged again next pass
            self._digests[key] = made
        return made

    # --- git (blocking) ---------------------------------------------------------------------

    def _run_git(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
        env.update(GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL=os.devnull, LC_ALL="C")
        return subprocess.run([self._git, f"--git-dir={Path(self._source.git_dir)}", *args], env=env,
                              capture_output=True, text=True, timeout=120)

    def _new_commits(self, head: str, last: str | None) -> list[str]:
        """First-parent commits from `last` (exclusive) to `head`, oldest first; the head alone when
        nothing was reconciled yet or `last` is gone (a force-push, then gc)."""
        if last is None:
            return [head]
        done = self._run_git("rev-list", "--first-parent", "--reverse", head, "--not", last)
        if done.returncode != 0:
            log.warning("require-approval: cannot list commits since %s (%s); judging the head only",
                        last[:12], done.stderr.strip()[:200])
            return [head]
        return done.stdout.split() or [head]

    def _codeowners_at(self, commit: str) -> tuple[str, str] | None:
        """(where, text) of the first CODEOWNERS file found at the commit, or None."""
        for where in LOCATIONS:
            try:
                data = self._source.read_file(commit, where, limit=MAX_CODEOWNERS_BYTES)
            except FileNotFoundError:
                continue
            return where, data.decode("utf-8", errors="replace")
        return None

    def _changed_paths(self, parent: str, commit: str) -> list[str]:
        """Every path the commit changes since `parent`, both sides of a rename (relative to the repository root)."""
        done = self._run_git("diff", "--name-only", "--no-renames", "-z", parent, commit)
        if done.returncode != 0:
            raise OSError(f"git diff {parent[:12]} {commit[:12]}: {done.stderr.strip()[:200]}")
        return [p for p in done.stdout.split("\0") if p]

    def _first_parent(self, commit: str) -> str | None:
        done = self._run_git("rev-parse", "--verify", "--quiet", f"{commit}^1")
        return done.stdout.strip() or None if done.returncode == 0 else None

