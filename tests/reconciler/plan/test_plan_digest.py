"""The plan digest (reconciler/plan/digest.py): pure, table-tested."""

from __future__ import annotations

import pytest
from plnt.reconciler.plan.diff import Action, DesiredRun, PlanItem
from plnt.reconciler.plan.digest import RecipeEvidence, digest_of, in_description, short


def _desired(key: str, fingerprint: str) -> DesiredRun:
    namespace, name = key.split("/")
    return DesiredRun(namespace=namespace, name=name, version="1.0.0", fingerprint=fingerprint, spec={})


def _item(key: str, action: Action) -> PlanItem:
    namespace, name = key.split("/")
    return PlanItem(namespace, name, action, "why")


APP = "default/app"
OTHER = "default/other"
RECIPE = RecipeEvidence("app@1.0.0", "sha256:" + "a" * 64, "ci@example.org (https://issuer.example)")
BASE = ([_item(APP, Action.UPGRADE)], {APP: _desired(APP, "f1")}, {APP: RECIPE})


@pytest.mark.parametrize(("name", "items", "desired", "recipes", "same"), [
    ("identical", *BASE, True),
    ("an unchanged WorkflowRun added", [*BASE[0], _item(OTHER, Action.UNCHANGED)],
     {**BASE[1], OTHER: _desired(OTHER, "zz")}, BASE[2], True),
    ("the reason text differs", [PlanItem("default", "app", Action.UPGRADE, "other words")], BASE[1], BASE[2], True),
    ("another spec", BASE[0], {APP: _desired(APP, "f2")}, BASE[2], False),
    ("another action", [_item(APP, Action.INSTALL)], BASE[1], BASE[2], False),
    ("another signer", BASE[0], BASE[1], {APP: RecipeEvidence(RECIPE.ref, RECIPE.digest, "someone-else (x)")}, False),
    ("another recipe digest", BASE[0], BASE[1], {APP: RecipeEvidence(RECIPE.ref, "sha256:" + "b" * 64, RECIPE.signer)}, False),
    ("recipe not verified", BASE[0], BASE[1], {}, False),
    ("one more change", [*BASE[0], _item(OTHER, Action.UNINSTALL)], BASE[1], BASE[2], False),
])
def test_digest_covers_the_plans_effect(name: str, items, desired, recipes, same: bool) -> None:  # type: ignore[no-untyped-def]
    assert (digest_of(items, desired, recipes) == digest_of(*BASE)) is same, name


def test_digest_is_order_free_and_shortened() -> None:
    items = [_item(APP, Action.UPGRADE), _item(OTHER, Action.UNINSTALL)]
    digest = digest_of(items, BASE[1], BASE[2])
    assert digest == digest_of(items[::-1], BASE[1], BASE[2])
    assert digest.startswith("sha256:") and len(digest) == 7 + 64
    assert short(digest) == digest[:19]
    assert in_description(f"plan {short(digest)}: 1 to upgrade") == short(digest)
    assert in_description("plan sha256:abc") is None
    assert in_description("") is None
