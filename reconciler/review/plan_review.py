"""`plnt review`: a pull request's plan, made in its CI job, posted on it as the thing reviewers approve.

`make_review` (blocking I/O: git, recipe pulls) computes what merging HEAD would change: specs at
`git merge-base BASE HEAD` (so a base branch that moved on since the branch point shows no changes
of its own) against specs at HEAD, planned with reconciler/plan/diff.py, and every recipe the plan
installs or upgrades pulled and verified exactly as the saga would (plan_digest.recipe_evidence).
`render_comment` and `status_of` are pure; `post` writes the one comment (upserted by a hidden
marker, split at the forge's size limit) and the `plnt/plan` commit status whose description
carries the plan digest the reconciler reads back with `--require-approval`.

A plan that cannot be made (invalid specs at HEAD, a recipe that is missing, unsigned, signed by
an untrusted identity or not matching its pin) is reported as such, with no digest: nothing can
approve it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from plnt.core.specs.limits import SpecLimits
from plnt.core.specs.loader import DEFAULT_LIMITS, SpecSet, load_sources
from plnt.reconciler.plan.diff import Action, DesiredRun, LiveRun, PlanItem, plan, render_markdown
from plnt.reconciler.plan.digest import STATUS_CONTEXT, PlanEvidence, digest_of, recipe_evidence, short
from plnt.reconciler.recipes.pull import RecipeCache
from plnt.reconciler.recipes.registries import RegistryOptions
from plnt.reconciler.redact import redact
from plnt.reconciler.review.forge import Forge, State, split_body
from plnt.reconciler.source.git import GitSource, SourceError

MARKER = "plnt:plan"


@dataclass
class Review:
    """What `plnt review` found for BASE...HEAD."""

    base_tip: str     # --base, resolved
    merge_base: str   # where HEAD branched off: the plan's base
    head: str
    items: list[PlanItem] = field(default_factory=list)
    desired: dict[str, DesiredRun] = field(default_factory=dict)
    spec_problems: list[str] = field(default_factory=list)  # FILE:LINE: field: message, at HEAD
    base_warnings: list[str] = field(default_factory=list)  # problems at the base (its valid specs are used)
    evidence: PlanEvidence = field(default_factory=PlanEvidence)

    @property
    def ok(self) -> bool:
        return not self.spec_problems and not self.evidence.problems

    @property
    def digest(self) -> str | None:
        """The plan digest, or None when the plan cannot be made (nothing may approve it)."""
        return digest_of(self.items, self.desired, self.evidence.recipes) if self.ok else None


def desired_runs(specs: SpecSet) -> dict[str, DesiredRun]:
    return {key: DesiredRun.from_spec(run) for key, run in specs.deployables().items()}


def as_live(desired: Mapping[str, DesiredRun]) -> dict[str, LiveRun]:
    """A commit's specs as if they were deployed: the live side of a commit-to-commit plan."""
    return {key: LiveRun.as_deployed(d) for key, d in desired.items()}


def make_review(source: GitSource, base: str, head: str, *, cache: RecipeCache, registry_options: RegistryOptions,
                limits: SpecLimits = DEFAULT_LIMITS) -> Review:
    """Resolve, load, plan and verify (blocking). Raises SourceError when a revision cannot be read."""
    head_sha = source.resolve(head)
    base_tip = source.resolve(base)
    return review_commits(source, source.merge_base(base_tip, head_sha), head_sha, base_tip=base_tip, cache=cache,
                          registry_options=registry_options, limits=limits)


def review_commits(source: GitSource, merge_base: str | None, head_sha: str, *, base_tip: str | None = None,
                   cache: RecipeCache, registry_options: RegistryOptions, limits: SpecLimits = DEFAULT_LIMITS) -> Review:
    """`make_review` on commits already fetched, no fetch: also what `--require-approval` computes for a
    commit that landed (merge_base: its first parent; None for a root commit, where all is new)."""
    review = Review(base_tip=base_tip or merge_base or "", merge_base=merge_base or "", head=head_sha)
    head_specs, problems = load_sources(source.spec_files(head_sha, limits), limits=limits)
    if problems:
        review.spec_problems = [str(p) for p in problems]
        return review
    # An invalid base is what this pull request may be fixing: plan against its valid documents.
    try:
        if merge_base is None:
            base_specs = SpecSet()
        else:
            base_specs, base_problems = load_sources(source.spec_files(merge_base, limits), limits=limits)
            review.base_warnings = [str(p) for p in base_problems]
    except SourceError as exc:  # the pull request creates the spec directory: everything is new
        base_specs, review.base_warnings = SpecSet(), [str(exc)]
    review.desired = desired_runs(head_specs)
    review.items = plan(review.desired, as_live(desired_runs(base_specs)))
    review.evidence = recipe_evidence(review.items, head_specs, commit=head_sha, cache=cache,
                                      read_from_repo=source.read_file, export_from_repo=source.export,
                                      registry_options=registry_options)
    return review


# --- rendering (pure) -------------------------------------------------------------------------------


def counts(items: Sequence[PlanItem]) -> str:
    """The plan's changes in a few words: "1 to install, 2 to upgrade", or "no changes"."""
    words = {Action.INSTALL: "to install", Action.UPGRADE: "to upgrade", Action.SCALE: "to scale",
             Action.UNINSTALL: "to uninstall"}
    parts = [f"{n} {words[a]}" for a in words if (n := sum(1 for i in items if i.action is a))]
    return ", ".join(parts) or "no changes"


def status_of(review: Review) -> tuple[State, str]:
    """The `plnt/plan` status: success with "plan sha256:<12 hex>: <counts>", else failure, no digest."""
    if review.spec_problems:
        n = len(review.spec_problems)
        return "failure", f"plan invalid: {n} problem{'s' if n != 1 else ''}"
    if review.evidence.problems:
        n = len(review.evidence.problems)
        who = ", ".join(p.split(":", 1)[0] for p in review.evidence.problems)
        return "failure", f"plan blocked: {n} recipe problem{'s' if n != 1 else ''} ({who})"
    digest = review.digest
    assert digest is not None
    return "success", f"plan {short(digest)}: {counts(review.items)}"


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _block(lines: Sequence[str]) -> list[str]:
    # Problems quote spec text: a code block keeps it from being rendered as Markdown.
    return ["```", *(line.replace("```", "'''") for line in lines), "```"]


def render_comment(review: Review) -> str:
    """The pull request comment: plan, recipes and signers, digest, commits, and what approving means."""
    head, base = review.head[:12], review.merge_base[:12]
    out: list[str] = []
    if review.spec_problems:
        n = len(review.spec_problems)
        out += [f"### plnt plan: invalid ({n} problem{'s' if n != 1 else ''})", "",
                f"The specs at head `{head}` are invalid, so no plan can be made and nothing can be approved. "
                "Fix these (`plnt validate DIR` shows the same lines):", "", *_block(review.spec_problems)]
    else:
        out.append(render_markdown(review.items, title=f"plnt plan {base}..{head}").rstrip("\n"))
        if review.evidence.problems:
            n = len(review.evidence.problems)
            out += ["", f"#### Blocked: {n} recipe{'s' if n != 1 else ''} cannot be trusted", "",
                    "plnt would refuse to deploy these, so this plan cannot be approved:", "",
                    *_block(review.evidence.problems)]
        if review.evidence.recipes:
            out += ["", "#### Recipes this plan deploys (pulled and verified as the rollout will)", "",
                    "| WorkflowRun | Recipe | Archive digest | Signed by (issuer) |", "|---|---|---|---|"]
            for key, r in sorted(review.evidence.recipes.items()):
                out.append(f"| `{key}` | `{_md(r.ref)}` | `{r.digest}` | {_md(r.signer)} |")
    if review.base_warnings:
        out += ["", f"Note: the base `{base}` has no valid specs or some invalid ones; the plan compares against "
                    "its valid documents:", "",
                *_block(review.base_warnings)]
    out += ["", "| | |", "|---|---|",
            f"| Plan digest | `{review.digest or 'none: the plan cannot be made'}` |",
            f"| Base | `{review.merge_base}` (merge base of `{review.base_tip[:12]}` and the head) |",
            f"| Head | `{review.head}` |"]
    if review.ok:
        out += ["", f"**Approving means:** plnt running with `--require-approval` deploys the merge of this pull "
                    f"request only if an approving review was made on head `{head}` and the plan digest it computes "
                    f"then equals `{short(review.digest or '')}`. A new push needs a new review."]
    return "\n".join(out) + "\n"


def to_json(review: Review) -> dict[str, Any]:
    state, description = status_of(review)
    return {
        "base": review.base_tip, "mergeBase": review.merge_base, "head": review.head,
        "digest": review.digest, "state": state, "description": description,
        "items": [item.to_json() for item in review.items],
        "recipes": {key: {"ref": r.ref, "digest": r.digest, "signer": r.signer}
                    for key, r in sorted(review.evidence.recipes.items())},
        "problems": review.spec_problems + review.evidence.problems,
        "baseWarnings": review.base_warnings,
    }


def dumps(review: Review) -> str:
    return json.dumps(to_json(review), indent=2)


# --- posting (I/O) ----------------------------------------------------------------------------------


async def post(forge: Forge, pr: int, review: Review, *, target_url: str | None = None) -> tuple[int, State, str]:
    """Upsert the comment (one per part, found again by marker) then the head's `plnt/plan` status.
    Returns (comment parts, state, description). Raises ForgeError."""
    # Problems quote registry URLs: never a credential in them on a pull request anyone may read.
    parts = split_body(redact(render_comment(review)), forge.comment_limit)
    await forge.upsert_comments(pr, parts, MARKER)
    state, description = status_of(review)
    await forge.set_status(review.head, state, STATUS_CONTEXT, description, target_url)
    return len(parts), state, description
