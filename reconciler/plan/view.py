"""One plan between two revisions (or against live state), as `plnt plan` prints it and as the UI's
plan preview shows it (`GET /plan?base=&head=`), from one function: `plan_between`.

Also `revisions`: the tracked branch's newest commits (`GET /plan/revisions`), from plnt's own clone.

Git work blocks (fetch, read blobs): the HTTP endpoints run these in a thread (asyncio.to_thread).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from plnt.core.specs.limits import SpecLimits
from plnt.core.specs.loader import DEFAULT_LIMITS, Problem, SpecSet
from plnt.reconciler.plan.diff import DesiredRun, LiveRun, PlanItem, render_markdown, render_text
from plnt.reconciler.plan.diff import plan as make_plan
from plnt.reconciler.source.git import GitSource, SourceError

MAX_REVISIONS = 200
# What a revision may look like here: a sha, a branch, a tag, origin/branch, HEAD~2 ... Never an
# option (a leading '-') and nothing long.
_REVISION = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_./~^@{}-]{0,199}$")


class InvalidRevision(ValueError):
    """A revision that does not resolve in the repository (the API answers 400 naming it)."""

    def __init__(self, revision: str, message: str) -> None:
        self.revision = revision
        super().__init__(message)


class InvalidSpecsAt(ValueError):
    """A revision whose specs do not load: no plan can be made from it."""

    def __init__(self, commit: str, problems: list[Problem]) -> None:
        self.commit = commit
        self.problems = problems
        super().__init__(f"commit {commit[:12]} has invalid specs ({len(problems)} problem(s))")


@dataclass(frozen=True)
class PlanView:
    base: str | None  # full sha; None: planned against live state
    head: str
    title: str
    items: list[PlanItem]

    def markdown(self) -> str:
        """Exactly what `plnt plan --format markdown` prints (the pull request comment)."""
        return render_markdown(self.items, title=self.title)

    def text(self) -> str:
        return f"{self.title}\n" + render_text(self.items)

    def cli_json(self) -> dict[str, Any]:
        """`plnt plan --format json`."""
        return {"head": self.head, "base": self.base, "items": [i.to_json() for i in self.items]}

    def api_json(self) -> dict[str, Any]:
        """`GET /plan`."""
        return {"base": self.base, "head": self.head, "title": self.title, "markdown": self.markdown(),
                "items": [i.to_json() for i in self.items]}


def _resolve(source: GitSource, revision: str) -> str:
    if not _REVISION.match(revision):
        raise InvalidRevision(revision, f"{revision[:60]!r} is not a revision (a sha, branch or tag)")
    try:
        return source.resolve(revision)
    except SourceError as exc:
        if str(exc).startswith("no revision"):
            raise InvalidRevision(revision, f"unknown revision {revision!r}: {exc}") from None
        raise


def _load(source: GitSource, commit: str, limits: SpecLimits) -> SpecSet:
    specs, problems = source.load(commit, limits)
    if problems:
        raise InvalidSpecsAt(commit, problems)
    return specs


def plan_between(source: GitSource, *, head: str | None, base: str | None,
                 live: Callable[[], Mapping[str, LiveRun]] | None = None, live_label: str = "live state",
                 limits: SpecLimits = DEFAULT_LIMITS) -> PlanView:
    """What `head` (default: the tracked branch, fetched) changes relative to `base`, or, without a
    base, relative to `live()` (plnt up's state). Raises InvalidRevision, InvalidSpecsAt, SourceError."""
    head_commit = _resolve(source, head) if head else source.fetch()
    desired_specs = _load(source, head_commit, limits)
    # A file unchanged between base and head gives the same (frozen) model object from the parse
    # cache: its DesiredRun (a JSON dump of the spec) is made once, not once per side.
    made: dict[int, DesiredRun] = {}

    def desired_of(run: Any) -> DesiredRun:
        if id(run) not in made:
            made[id(run)] = DesiredRun.from_spec(run)
        return made[id(run)]

    desired = {k: desired_of(r) for k, r in desired_specs.deployables().items()}
    base_commit: str | None = None
    if base is not None:
        base_commit = _resolve(source, base)
        base_specs = _load(source, base_commit, limits)
        have = {key: LiveRun.as_deployed(desired_of(r)) for key, r in base_specs.deployables().items()}
        title = f"plnt plan {base_commit[:12]}..{head_commit[:12]}"
    else:
        have = dict(live()) if live is not None else {}
        title = f"plnt plan {head_commit[:12]} against {live_label}"
    return PlanView(base=base_commit, head=head_commit, title=title, items=make_plan(desired, have))


def revisions(source: GitSource, limit: int = 30) -> list[dict[str, Any]]:
    """The tracked branch's newest commits as plnt last fetched them (fetching when it never did):
    [{commit, short, subject, at (epoch seconds)}], newest first."""
    limit = max(1, min(limit, MAX_REVISIONS))
    head = source.branch_head()
    out = source.run_git("log", f"--max-count={limit}", "--format=%H%x1f%h%x1f%ct%x1f%s", head, "--")
    rows = []
    for line in out.splitlines():
        parts = line.split("\x1f", 3)
        if len(parts) == 4 and parts[2].isdigit():
            rows.append({"commit": parts[0], "short": parts[1], "subject": parts[3][:200], "at": int(parts[2])})
    return rows


def _error(status: int, kind: str, message: str, **extra: Any) -> Any:
    from fastapi.responses import JSONResponse

    return JSONResponse({"error": {"type": kind, "message": message, **extra}}, status_code=status)


def add_plan_routes(app: Any, source: GitSource, spec_limits: SpecLimits | None = None) -> None:
    """`GET /plan/revisions?limit=30` and `GET /plan?base=REV&head=REV` on the control plane (scope
    read; gateway workers forward them). Git work runs in a thread; specs load within `spec_limits`."""
    import asyncio

    limits = spec_limits or DEFAULT_LIMITS

    @app.get("/plan/revisions")
    async def plan_revisions(limit: int = 30) -> Any:
        try:
            return await asyncio.to_thread(revisions, source, limit)
        except SourceError as exc:
            return _error(502, "git_unavailable", str(exc))

    @app.get("/plan")
    async def plan_preview(base: str | None = None, head: str | None = None) -> Any:
        if not base:
            return _error(400, "invalid_request", "send ?base=REV (and ?head=REV, default: the tracked branch): "
                          "the plan shows what head changes relative to base")
        try:
            view = await asyncio.to_thread(plan_between, source, head=head, base=base, limits=limits)
        except InvalidRevision as exc:
            return _error(400, "invalid_revision", str(exc), revision=exc.revision)
        except InvalidSpecsAt as exc:
            shown = [str(p) for p in exc.problems[:50]]
            return _error(422, "invalid_specs", f"{exc}: no plan can be made from it", commit=exc.commit,
                          problems=shown)
        except SourceError as exc:
            return _error(502, "git_unavailable", str(exc))
        return view.api_json()


__all__ = ["InvalidRevision", "InvalidSpecsAt", "PlanView", "add_plan_routes", "plan_between", "revisions"]
