"""What a review approves: the plan's effect, the recipes it deploys and who signed them, as one digest.

`plnt review` posts the digest on the pull request's head commit (status `plnt/plan`, description
"plan sha256:<12 hex> ..."); with `--require-approval` the reconciler computes it again for the
commit that landed and deploys only when both agree. The digest covers, for every WorkflowRun the
plan changes (install, upgrade, uninstall): its key, the action, the desired spec's fingerprint
(which includes the recipe's pinned digest and registry) and the verified recipe (archive digest,
signer identity and issuer). Unchanged WorkflowRuns are left out, so an unrelated change merged
meanwhile elsewhere does not void an approval; a different change to the same WorkflowRun does.

`digest_of` is pure; `recipe_evidence` pulls and verifies (I/O, through the recipe cache).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from plnt.core.specs.loader import SpecSet
from plnt.reconciler.errors import PlntError
from plnt.reconciler.plan.diff import Action, DesiredRun, PlanItem
from plnt.reconciler.recipes.pull import ExportFromRepo, ReadFromRepo, RecipeCache, pull_recipe
from plnt.reconciler.recipes.registries import RegistryOptions

STATUS_CONTEXT = "plnt/plan"
_SHORT = 12
_IN_DESCRIPTION = re.compile(r"\bplan (sha256:[0-9a-f]{" + str(_SHORT) + r"})\b")


@dataclass(frozen=True)
class RecipeEvidence:
    """A recipe as the pull verified it."""

    ref: str      # NAME@VERSION
    digest: str   # sha256:<hex> of the archive
    signer: str   # "identity (issuer)" that the trust policy accepted


@dataclass
class PlanEvidence:
    recipes: dict[str, RecipeEvidence] = field(default_factory=dict)  # by WorkflowRun key
    problems: list[str] = field(default_factory=list)  # one line per recipe that could not be verified


def changed(items: Sequence[PlanItem]) -> list[PlanItem]:
    return [item for item in items if item.action is not Action.UNCHANGED]


def digest_of(items: Sequence[PlanItem], desired: Mapping[str, DesiredRun],
              recipes: Mapping[str, RecipeEvidence]) -> str:
    """sha256 over the canonical JSON of the plan's effect (see the module docstring)."""
    effect = []
    for item in sorted(changed(items), key=lambda i: i.key):
        want = desired.get(item.key) if item.action is not Action.UNINSTALL else None
        recipe = recipes.get(item.key) if want is not None else None
        effect.append({
            "key": item.key,
            "action": item.action.value,
            "fingerprint": want.fingerprint if want else None,
            "recipe": {"ref": recipe.ref, "digest": recipe.digest, "signer": recipe.signer} if recipe else None,
            **({"replicas": item.to_replicas} if item.action is Action.SCALE else {}),  # approves that count
        })
    canonical = json.dumps(effect, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


def short(digest: str) -> str:
    """What the status description carries: sha256: and 12 hex digits."""
    return digest[: len("sha256:") + _SHORT]


def in_description(description: str) -> str | None:
    """The short digest a `plnt/plan` status description carries, or None."""
    found = _IN_DESCRIPTION.search(description or "")
    return found.group(1) if found else None


def recipe_evidence(items: Sequence[PlanItem], specs: SpecSet, *, commit: str, cache: RecipeCache,
                    read_from_repo: ReadFromRepo, export_from_repo: ExportFromRepo,
                    registry_options: RegistryOptions) -> PlanEvidence:
    """Pull and verify the recipe of every WorkflowRun the plan installs or upgrades, as the saga
    would (same pin check, same trust policies from the commit, same cache). Blocking: call it in a
    thread. A recipe that cannot be verified is a problem, never a silent gap in the digest."""
    evidence = PlanEvidence()
    for item in changed(items):
        run = specs.workflow_runs.get(item.key)
        if item.action in (Action.UNINSTALL, Action.SCALE) or run is None:
            continue  # (a scale keeps the verified release that runs)
        source = run.spec.workflow
        try:
            pulled = pull_recipe(source, commit=commit, cache=cache, policies=specs.trust_policies.values(),
                                 read_from_repo=read_from_repo, export_from_repo=export_from_repo,
                                 registry_options=registry_options)
        except PlntError as exc:
            reason = getattr(exc, "reason", None)
            evidence.problems.append(f"{item.key}: recipe {source.ref} from {source.registry}: "
                                     f"{type(exc).__name__}: {reason + ': ' if reason else ''}{exc}")
            continue
        evidence.recipes[item.key] = RecipeEvidence(
            ref=source.ref, digest=pulled.digest,
            signer=f"{pulled.signature.identity} ({pulled.signature.issuer})")
    return evidence
