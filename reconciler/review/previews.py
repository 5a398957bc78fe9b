"""Preview deploys of pull requests (`--previews 'refs/pull/*/head'`).

For each ref of the origin matching a --previews glob (its `*` is the pull request number N), and
whose pull request the forge says is open, plnt loads the specs at the ref's commit (same limits,
same --verify-commits; an invalid commit deploys nothing and says why on the pull request), and
deploys each WorkflowRun the pull request installs or changes, against the tracked branch, as a
PREVIEW release `<name>--pr<N>`: the same DeploySaga (validate, pull and verify against the trust
policies of that commit, install, smoke test with the same budgets, promote), under its own
identity (status, runner, route, saga id `plnt-<namespace>-<name>--pr<N>`). The saga input names
`preview: N`, and CommitSpecs then checks the commit against plnt's fetch of that pull request's
ref instead of the tracked branch (every other saga keeps the branch check).

A preview takes no regular traffic: the gateway routes to it only a request carrying
`X-Plnt-Preview: N` (core/routes.py `preview_target`). When the pull request is closed or
merged, or its ref disappears, or it no longer changes the WorkflowRun, an uninstall saga removes
the preview. A new push replaces it (the newest spec wins, as for the branch).

On the pull request: a status `plnt/preview/<namespace>/<name>` on the commit each preview is about
(pending, success with the smoke numbers, failure with the reason; "removed" at the end), a
status `plnt/preview` failing when the commit's specs cannot be previewed, and one comment (marker
`plnt:preview`) listing the previews and how to call them.

The decisions (which ref is which pull request, what a pull request changes, what the forge is
told) are pure functions below; the controller does the I/O.
"""

from __future__ import annotations

import asyncio
import fnmatch
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from plnt.core.routes import preview_name, preview_of
from plnt.core.specs.loader import SpecSet, load_sources
from plnt.core.specs.models import WorkflowRun
from plnt.core.status import Phase, WorkflowRunStatus
from plnt.reconciler.drivers.protocol import ReleaseDriver
from plnt.reconciler.plan.diff import Action, DesiredRun, PlanItem, live_from, plan
from plnt.reconciler.review.forge import Forge, ForgeError, ForgeNotFound, State
from plnt.reconciler.review.rollout_report import verdict
from plnt.reconciler.saga.commit_specs import as_preview
from plnt.reconciler.saga.io import SagaInput
from plnt.reconciler.saga.launch import SagaLauncher, poll
from plnt.reconciler.settings import Settings
from plnt.reconciler.source.commit_trust import CommitVerifier
from plnt.reconciler.source.git import GitSource
from plnt.reconciler.status_store import StatusStore
from temporalio.client import Client

log = logging.getLogger(__name__)

MARKER = "plnt:preview"
SPECS_CONTEXT = "plnt/preview"
# Pull requests previewed at once: each preview runs runners, and anyone who may open a pull request
# (a fork, on a public repository) could otherwise start as many as they like.
MAX_PREVIEWED_PULLS = 10
CLOSED_RECHECK_S = 600.0
MAX_LOOKUPS_PER_PASS = 50


# --- pure decisions ---------------------------------------------------------------------------

def pr_number(ref: str, globs: tuple[str, ...]) -> int | None:
    """The pull request number of an origin ref: what the `*` of the first glob it matches stands
    for, when that is a number (refs/pull/7/head -> 7). None when no glob matches or `*` is not a number."""
    for glob in globs:
        if "*" not in glob or not fnmatch.fnmatchcase(ref, glob):
            continue
        prefix, _, suffix = glob.partition("*")
        star = ref[len(prefix): len(ref) - len(suffix)]
        if star.isascii() and star.isdigit() and not star.startswith("0"):
            return int(star)
    return None


def previewed(base: Mapping[str, WorkflowRun], head: Mapping[str, WorkflowRun]) -> list[str]:
    """Keys of the WorkflowRuns a pull request installs or changes (its head against the tracked
    branch's desired state). A WorkflowRun it removes is not previewed: there is nothing to call."""
    return sorted(key for key, run in head.items()
                  if key not in base or base[key].fingerprint() != run.fingerprint())


def admitted(open_pulls: list[int], previewing: set[int], limit: int) -> list[int]:
    """The pull requests previewed under the limit: those with a preview already keep theirs, then
    the oldest (lowest number) first. The rest wait, and are told so."""
    keep = sorted(pr for pr in open_pulls if pr in previewing)[:limit]
    rest = sorted(pr for pr in open_pulls if pr not in previewing)
    return sorted(keep + rest[: max(0, limit - len(keep))])


def context_of(namespace: str, name: str) -> str:
    return f"plnt/preview/{namespace}/{name}"


_PENDING = {Phase.PENDING, Phase.VERIFYING, Phase.DEPLOYING, Phase.CANARY, Phase.DELETING}


def forge_status(status: WorkflowRunStatus, pr: int) -> tuple[State, str]:
    """What the pull request's status for one preview says, from the preview's plnt status: the
    rollout's verdict (smoke numbers against budgets, as for the branch), the header first."""
    found = verdict(status)
    if found is not None:
        return found[0], f"X-Plnt-Preview: {pr} · {found[1]}"
    if status.phase in _PENDING:
        return "pending", f"preview {status.phase.value}: {status.message}"
    if status.phase is Phase.READY:
        smoke = _smoke_line(status.smoke_test)
        return "success", f"preview {status.version} Ready (X-Plnt-Preview: {pr}){'; ' + smoke if smoke else ''}"
    serving = f"; {status.version} keeps serving the preview" if status.version else ""
    return "failure", f"preview {status.phase.value}: {status.last_error or status.message}{serving}"


def _smoke_line(smoke: Mapping[str, Any] | None) -> str:
    if not smoke:
        return ""
    return str(smoke.get("reason") or "")


def comment_body(pr: int, rows: list[WorkflowRunStatus], gateway_url: str, *, problem: str | None = None,
                 removed: str | None = None) -> str:
    """The one comment on the pull request (upserted by marker): its previews and how to call them."""
    out = [f"### plnt previews of #{pr}", ""]
    if removed is not None:
        out.append(f"Previews removed: {removed}.")
        return "\n".join(out) + "\n"
    if problem is not None:
        out += [f"**Nothing is previewed**: {problem}", ""]
    if not rows and problem is None:
        out.append("This pull request changes no WorkflowRun: nothing to preview.")
        return "\n".join(out) + "\n"
    if rows:
        out += ["| WorkflowRun | Version | Phase | Message |", "|---|---|---|---|"]
        for row in rows:
            base = (preview_of(row.name) or (row.name, pr))[0]
            version = row.version or row.attempted_version or ""
            out.append(f"| `{row.namespace}/{base}` | {version} | **{row.phase.value}** | {_md(row.message)} |")
        out += ["", "Call a preview (it takes no regular traffic):", "", "```sh"]
        for row in rows:
            base = (preview_of(row.name) or (row.name, pr))[0]
            namespace = "" if row.namespace == "default" else f"?namespace={row.namespace}"
            out.append(f"curl -H 'X-Plnt-Preview: {pr}' -H 'Content-Type: application/json' -d '{{...}}' "
                       f"{gateway_url}/workflows/{base}/invoke{namespace}")
        out.append("```")
    return "\n".join(out) + "\n"


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")[:300]


@dataclass(frozen=True)
class PullRef:
    pr: int
    ref: str
    sha: str


@dataclass
class _Reported:
    """What was last told to the forge for one pull request (so nothing is re-posted)."""

    sha: str
    contexts: dict[str, str]  # context -> the sha its status was set on
    comment: str | None = None
    told: dict[tuple[str, str], tuple[str, str]] | None = None  # (sha, context) -> (state, description)


# --- the controller ---------------------------------------------------------------------------

class PreviewController:
    def __init__(self, *, settings: Settings, source: GitSource, client: Client, statuses: StatusStore,
                 driver: ReleaseDriver, forge: Forge, verifier: CommitVerifier | None = None,
                 gateway_url: Callable[[], str] = lambda: "http://PLNT-GATEWAY",
                 max_pulls: int = MAX_PREVIEWED_PULLS) -> None:
        self._max_pulls = max_pulls
        self._settings = settings
        self._source = source
        self._statuses = statuses
        self._driver = driver
        self._forge = forge
        self._verifier = verifier
        self._gateway_url = gateway_url
        self._base: tuple[str, SpecSet] | None = None  # the tracked branch's last reconciled commit
        self._wake = asyncio.Event()
        self._sagas = SagaLauncher(client, settings.temporal.task_queue, self._wake, what="preview-saga", subject="preview")
        self._specs: dict[str, tuple[dict[str, WorkflowRun], str | None]] = {}  # sha -> (runs, problem)
        self._reported: dict[int, _Reported] = {}
        self._closed: dict[int, tuple[str, float]] = {}  # pr -> (head sha, when the forge said it is not open)
        self._adopted = False

    # --- wiring ----------------------------------------------------------------------------

    def on_branch(self, commit: str, specs: SpecSet) -> None:
        """A Reconciler spec listener: previews plan against the branch's newest valid commit."""
        self._base = (commit, specs)
        self._wake.set()

    def wake(self) -> None:
        self._wake.set()

    async def run(self, stop: asyncio.Event) -> None:
        await poll(stop, self._wake, self._settings.source.interval_s, self._pass, what="previews")

    async def _pass(self) -> None:
        if self._base is not None:  # (none until the branch's first valid commit)
            await self.reconcile_once()

    async def close(self) -> None:
        await self._sagas.close()

    # --- one pass --------------------------------------------------------------------------

    async def reconcile_once(self) -> list[PlanItem]:
        assert self._base is not None
        if not self._adopted:
            await self._sagas.adopt(status for status in self._statuses.all() if preview_of(status.name) is not None)
            self._adopted = True
        base_commit, base = self._base
        previewing = {pr for status in self._statuses.all() if (pr := _pr_of(status.name))}
        pulls, closed, unknown = await self._open_pulls(previewing)
        desired: dict[str, DesiredRun] = {}
        # Pull requests whose previews stay as they are: newest commit invalid, or state unknown.
        held: set[int] = set(unknown)
        problems: dict[int, str] = {}
        allowed = set(admitted(list(pulls), previewing, self._max_pulls))
        for pull in pulls.values():
            if pull.pr not in allowed:
                held.add(pull.pr)
                problems[pull.pr] = (f"waiting: {self._max_pulls} pull requests are previewed already (the limit); "
                                     f"this one is previewed when one of them closes")
                continue
            runs, problem = await self._pull_specs(pull.sha, base_commit)
            if problem is not None:
                held.add(pull.pr)
                problems[pull.pr] = problem
                continue
            for key in previewed(base.workflow_runs, runs):
                try:
                    run = as_preview(runs[key], pull.pr)
                except ValueError as exc:
                    problems[pull.pr] = str(exc)
                    continue
                if run.key in base.workflow_runs:  # a branch WorkflowRun already has that (reserved) name
                    problems[pull.pr] = f"cannot preview {key}: the branch has a WorkflowRun named {run.key}"
                    continue
                desired[run.key] = DesiredRun.from_spec(run)
        live = {key: run for key, run in live_from(await self._driver.live(), self._statuses.all(),
                                                   self._sagas.fingerprints).items()
                if (of := preview_of(run.name)) is not None and of[1] not in held and key not in base.workflow_runs}
        items = plan(desired, live)
        budget = self._settings.temporal.max_concurrent_sagas - len(self._sagas)
        for item in items:
            pr = _pr_of(item.name)
            if item.supersedes:
                await self._sagas.cancel(item.namespace, item.name, why="a newer push changed it")
            elif item.needs_saga and budget > 0:
                pull = pulls.get(pr)
                commit = pull.sha if pull is not None and item.action is not Action.UNINSTALL else base_commit
                await self._start_saga(item, pr, commit)
                budget -= 1
        self._forget_failed(desired, live)
        await self._heal(desired)
        await self._report(pulls, closed, problems)
        return items

    async def _heal(self, desired: Mapping[str, DesiredRun]) -> None:
        """A preview runner that stopped out of band is restarted, as selfHeal does for the branch's
        (whose reconciler leaves previews alone). A worker's runners: asked of it through the driver."""
        for key in (await self._driver.drift()):
            want = desired.get(key)
            if want is None or key in self._sagas or not want.self_heal:
                continue
            healed = await self._driver.repair(want.namespace, want.name)
            if healed:
                log.warning("preview-drift-healed preview=%s restored=%s", key, ", ".join(r.release_id for r in healed))

    async def _open_pulls(self, previewing: set[int]) -> tuple[dict[int, PullRef], set[int], set[int]]:
        """Preview refs whose pull request is open; the pull requests reported before that are not
        (closed, merged, or their ref gone); and those whose state is unknown this pass.

        A forge keeps refs/pull/N/head of every closed pull request: a closed verdict is remembered
        per head (asked again after CLOSED_RECHECK_S, in case it was reopened), and at most
        MAX_LOOKUPS_PER_PASS pull requests not previewed yet are asked about per pass, newest first,
        so a repository with thousands of old pull requests costs no thousands of calls per pass."""
        refs = await asyncio.to_thread(self._source.fetch_previews)
        pulls: dict[int, PullRef] = {}
        for ref, sha in refs.items():
            pr = pr_number(ref, self._settings.review.previews)
            if pr is not None:
                pulls[pr] = PullRef(pr, ref, sha)
        unknown: set[int] = set()
        now = time.monotonic()
        lookups = 0
        # Pull requests with a preview (or reported) first: their state decides whether it is removed.
        for pr in sorted(pulls, key=lambda n: (n not in previewing and n not in self._reported, -n)):
            seen = self._closed.get(pr)
            if seen is not None and seen[0] == pulls[pr].sha and now - seen[1] < CLOSED_RECHECK_S:
                del pulls[pr]
                continue
            if pr not in previewing and pr not in self._reported:
                if lookups >= MAX_LOOKUPS_PER_PASS:
                    del pulls[pr]  # asked about on a later pass
                    continue
                lookups += 1
            try:
                state = (await self._forge.pull_request(pr)).state
            except ForgeNotFound:
                state = "gone"
            except ForgeError as exc:
                # Unknown is not closed: keep what runs, decide on the next pass.
                log.warning("preview-forge-unreadable pr=%d error=%s", pr, exc)
                unknown.add(pr)
                continue
            if state != "open":
                self._closed[pr] = (pulls[pr].sha, now)
                del pulls[pr]
            else:
                self._closed.pop(pr, None)
        closed = {pr for pr in self._reported if pr not in pulls and pr not in unknown}
        for pr in unknown:
            pulls.pop(pr, None)
        return pulls, closed, unknown

    async def _pull_specs(self, sha: str, base_commit: str) -> tuple[dict[str, WorkflowRun], str | None]:
        """The WorkflowRuns at a pull request's commit, or why it cannot be previewed (cached per commit)."""
        cached = self._specs.get(sha)
        if cached is not None:
            return cached
        problem: str | None = None
        runs: dict[str, WorkflowRun] = {}
        if self._verifier is not None and self._verifier.mode != "none":
            # The pull request's own commits (those not on the branch), as --verify-commits checks the branch's.
            untrusted = await asyncio.to_thread(self._verifier.first_untrusted, self._source.git_dir, sha, base_commit)
            if untrusted is not None:
                problem = untrusted.problem()
        if problem is None:
            limits = self._settings.spec_limits
            specs, problems = await asyncio.to_thread(
                lambda: load_sources(self._source.spec_files(sha, limits), limits=limits))
            if problems:
                problem = f"commit {sha[:12]} has {len(problems)} spec problem(s): {problems[0]}"
            else:
                runs = dict(specs.workflow_runs)
        if problem is not None:
            log.error("preview-refused commit=%s problem=%r", sha[:12], problem)
        if len(self._specs) > 64:
            self._specs.clear()
        self._specs[sha] = (runs, problem)
        return runs, problem

    def _forget_failed(self, desired: Mapping[str, DesiredRun], live: Mapping[str, Any]) -> None:
        """A preview no longer wanted that never got a release (its first saga failed) has nothing to
        uninstall: its status goes, so its route answers 404 rather than 503."""
        for key, run in live.items():
            if key in desired or key in self._sagas or run.version is not None:
                continue
            status = self._statuses.get(key)
            if status is not None and status.phase in (Phase.ROLLED_BACK, Phase.FAILED):
                self._statuses.remove(status.namespace, status.name)

    async def _start_saga(self, item: PlanItem, pr: int, commit: str) -> None:
        if item.action is Action.UNINSTALL:
            saga = SagaInput(action="uninstall", namespace=item.namespace, name=item.name, commit=commit,
                             preview=pr, retry=self._settings.temporal.retry)
        else:
            desired_fp = None
            runs, _ = self._specs.get(commit, ({}, None))
            base_name = _base_name(item.name)
            run = runs.get(f"{item.namespace}/{base_name}")
            if run is None:
                return
            desired_fp = run.fingerprint()
            saga = SagaInput(action="deploy", namespace=item.namespace, name=item.name, commit=commit,
                             fingerprint=desired_fp, version=run.spec.workflow.version, preview=pr,
                             policy_commit=self._base[0] if self._base else None, retry=self._settings.temporal.retry)
            self._statuses.update(item.namespace, item.name, phase=Phase.PENDING, observed_commit=commit,
                                  attempted_version=saga.version,
                                  message=f"preview of #{pr}: {item.action.value}: {item.reason}")
        if await self._sagas.start(item.key, saga):
            log.info("preview-saga-started preview=%s pr=%d action=%s version=%s commit=%s",
                     item.key, pr, item.action.value, item.to_version or item.from_version, commit[:12])

    # --- the pull request's statuses and comment -------------------------------------------

    async def _report(self, pulls: Mapping[int, PullRef], closed: set[int], problems: Mapping[int, str]) -> None:
        by_pr: dict[int, list[WorkflowRunStatus]] = {}
        for status in self._statuses.all():
            pr = _pr_of(status.name)
            if pr is not None:
                by_pr.setdefault(pr, []).append(status)
        for pull in pulls.values():
            try:
                await self._report_open(pull, sorted(by_pr.get(pull.pr, []), key=lambda s: s.key),
                                        problems.get(pull.pr))
            except ForgeError as exc:
                log.warning("preview-report-failed pr=%d error=%s", pull.pr, exc)
        for pr in closed:
            if by_pr.get(pr) or any(_pr_of(key.split("/", 1)[1]) == pr for key in self._sagas.running):
                continue  # still being removed
            try:
                await self._report_removed(pr)
            except ForgeError as exc:
                log.warning("preview-report-failed pr=%d error=%s", pr, exc)

    async def _report_open(self, pull: PullRef, rows: list[WorkflowRunStatus], problem: str | None) -> None:
        reported = self._reported.setdefault(pull.pr, _Reported(sha=pull.sha, contexts={}))
        reported.sha = pull.sha
        if problem is not None:  # "waiting" (over the limit) is pending; anything else failed
            await self._set(reported, pull.sha, SPECS_CONTEXT,
                            "pending" if problem.startswith("waiting:") else "failure", problem)
        else:
            await self._set(reported, pull.sha, SPECS_CONTEXT, "success",
                            f"{len(rows)} preview(s); call with X-Plnt-Preview: {pull.pr}" if rows else
                            "no WorkflowRun changed: nothing to preview")
        live_contexts = set()
        for row in rows:
            base = _base_name(row.name)
            context = context_of(row.namespace, base)
            live_contexts.add(context)
            state, description = forge_status(row, pull.pr)
            await self._set(reported, row.observed_commit or pull.sha, context, state, description)
        for context, sha in list(reported.contexts.items()):
            if context != SPECS_CONTEXT and context not in live_contexts:
                await self._set(reported, sha, context, "success", "preview removed: the pull request no longer "
                                                                     "changes this WorkflowRun")
                reported.contexts.pop(context, None)
        await self._comment(reported, pull.pr, comment_body(pull.pr, rows, self._gateway_url(), problem=problem))

    async def _report_removed(self, pr: int) -> None:
        reported = self._reported.pop(pr, None)
        if reported is None:
            return
        for context, sha in reported.contexts.items():
            if context != SPECS_CONTEXT:
                await self._forge.set_status(sha, "success", context, "preview removed: the pull request is closed")
        await self._forge.upsert_comment(pr, comment_body(pr, [], self._gateway_url(),
                                                          removed="the pull request is closed"), MARKER)
        log.info("preview-removed pr=%d", pr)

    async def _set(self, reported: _Reported, sha: str, context: str, state: State, description: str) -> None:
        told = reported.told if reported.told is not None else {}
        if told.get((sha, context)) != (state, description):  # no forge call per pass for an unchanged one
            await self._forge.set_status(sha, state, context, description)  # (the client too skips a repost)
            told[(sha, context)] = (state, description)
            reported.told = told
        reported.contexts[context] = sha

    async def _comment(self, reported: _Reported, pr: int, body: str) -> None:
        if reported.comment == body:
            return
        await self._forge.upsert_comment(pr, body, MARKER)
        reported.comment = body

    @property
    def running_sagas(self) -> set[str]:
        return self._sagas.running


def _base_name(name: str) -> str:
    of = preview_of(name)
    return of[0] if of is not None else name


def _pr_of(name: str) -> int:
    of = preview_of(name)
    return of[1] if of is not None else 0


__all__ = ["MARKER", "PreviewController", "PullRef", "comment_body", "context_of", "forge_status", "pr_number",
           "preview_name", "previewed"]
