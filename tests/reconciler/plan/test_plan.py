"""The plan is a pure function: table tests, no I/O."""

from __future__ import annotations

from typing import Any

import pytest
from plnt.core.status import Pin
from plnt.reconciler.plan.diff import Action, DesiredRun, LiveRun, plan, render_markdown, render_text


def spec(version: str = "1.2.0", percent: int = 5, budget: int = 2500) -> dict[str, Any]:
    return {
        "workflow": {"ref": f"review-responder@{version}", "registry": "file:registry", "integrityHash": None},
        "backend": {"cluster": "local"},
        "canary": {"trafficPercent": percent, "smokeTest": {"p95BudgetMs": budget}},
    }


def desired(version: str = "1.2.0", fp: str = "A", **kw: Any) -> DesiredRun:
    return DesiredRun("default", "rr", version, fp, spec(version, **kw))


def live(version: str | None = "1.2.0", fp: str | None = "A", **kw: Any) -> LiveRun:
    return LiveRun("default", "rr", version=version, fingerprint=fp, spec=spec(version or "1.2.0"), **kw)


K = "default/rr"
PIN = Pin(version="1.2.0", commit="c" * 40, by="ops@host")

CASES = [
    # (name, desired, live, action, reason contains, waiting)
    ("new", desired(), None, Action.INSTALL, "new WorkflowRun", False),
    ("status only, never promoted", desired(), live(None, None), Action.INSTALL, "new WorkflowRun", False),
    ("in sync", desired(), live(), Action.UNCHANGED, "in sync", False),
    ("version bump", desired("1.3.0", "B"), live(), Action.UPGRADE, "workflow.ref: review-responder@1.2.0 -> review-responder@1.3.0", False),
    ("budget change", desired("1.2.0", "C", budget=300), live(), Action.UPGRADE, "canary.smokeTest.p95BudgetMs: 2500 -> 300", False),
    ("removed", None, live(), Action.UNINSTALL, "removed from the repository", False),
    ("removed, never deployed", None, live(None, None), None, None, False),
    ("failed spec is held", desired("1.4.0", "F"), live(failed_fingerprint="F", failed_reason="smoke test failed"),
     Action.UNCHANGED, "held: this spec already failed (smoke test failed); 1.2.0 keeps serving", False),
    ("failed install is held", desired("1.4.0", "F"), live(None, None, failed_fingerprint="F"), Action.UNCHANGED, "already failed", False),
    ("a new spec after a failure runs", desired("1.3.0", "G"), live(failed_fingerprint="F"), Action.UPGRADE, "1.3.0", False),
    ("change while a saga runs waits", desired("1.3.0", "B"), live(saga_running=True), Action.UPGRADE, "1.3.0", True),
    ("removal while a saga runs waits", None, live(saga_running=True), Action.UNINSTALL, "removed", True),
    # A person's emergency pin (plnt rollback --now) holds against any spec naming another version...
    ("pinned: a newer version is held", desired("1.3.0", "B"), live(pin=PIN), Action.UNCHANGED,
     "drift: pinned by a person (ops@host) to 1.2.0 until the commit lands; the spec names 1.3.0", False),
    ("pinned: its own saga is not superseded", desired("1.3.0", "B"), live(pin=PIN, saga_running=True,
                                                                       saga_fingerprint="P"),
     Action.UNCHANGED, "drift: pinned", True),
    # ...and a spec naming the pinned version is planned as ever (the loop releases the pin then).
    ("pinned version landed, other fields changed", desired("1.2.0", "C", percent=10), live(pin=PIN),
     Action.UPGRADE, "canary.trafficPercent: 5 -> 10", False),
    ("removed while pinned", None, live(pin=PIN), Action.UNINSTALL, "removed", False),
]

SUPERSEDE_CASES = [
    # (name, desired fingerprint or None, running saga deploys, supersedes)
    ("the saga deploys the newest spec", "B", "B", False),
    ("a newer commit changed the spec", "C", "B", True),
    ("the commit was reverted to what runs", "A", "B", True),
    ("removed while a deploy saga runs", None, "B", True),
    ("removed while an uninstall saga runs", None, None, False),
    ("re-added while an uninstall saga runs", "A", None, True),
]


@pytest.mark.parametrize(("want_fp", "saga_fp", "supersedes"), [c[1:] for c in SUPERSEDE_CASES],
                         ids=[c[0] for c in SUPERSEDE_CASES])
def test_the_newest_spec_supersedes_a_running_saga(want_fp: str | None, saga_fp: str | None, supersedes: bool) -> None:
    desired_runs = {K: desired("1.3.0", want_fp)} if want_fp else {}
    [item] = plan(desired_runs, {K: live(saga_running=True, saga_fingerprint=saga_fp)})
    assert item.supersedes is supersedes and item.waiting and not item.needs_saga


@pytest.mark.parametrize(("desired_run", "live_run", "action", "reason", "waiting"),
                         [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_plan_decides(desired_run: DesiredRun | None, live_run: LiveRun | None, action: Action | None,
                      reason: str | None, waiting: bool) -> None:
    items = plan({K: desired_run} if desired_run else {}, {K: live_run} if live_run else {})
    if action is None:
        assert items == []
        return
    [item] = items
    assert item.action is action
    assert reason in item.reason
    assert item.waiting is waiting
    assert item.needs_saga is (action is not Action.UNCHANGED and not waiting)
    # Held with a stable serving: what a re-placement may still move (placement.with_placements).
    assert item.held is (reason.startswith("held:") and live_run is not None and live_run.version is not None)


def test_upgrade_lists_each_changed_field_and_versions() -> None:
    [item] = plan({K: desired("1.3.0", "B", percent=20)}, {K: live()})
    assert [c.field for c in item.changes] == ["canary.trafficPercent", "workflow.ref"]
    assert (item.from_version, item.to_version) == ("1.2.0", "1.3.0")
    assert item.to_json()["changes"][0] == {"field": "canary.trafficPercent", "old": 5, "new": 20}


def test_plan_is_sorted_and_covers_every_key() -> None:
    other = DesiredRun("team-b", "aa", "1.0.0", "X", spec("1.0.0"))
    items = plan({K: desired(), "team-b/aa": other}, {K: live(), "default/gone": LiveRun("default", "gone", "0.9.0", "Z", {})})
    assert [(i.key, i.action) for i in items] == [
        ("default/gone", Action.UNINSTALL), ("default/rr", Action.UNCHANGED), ("team-b/aa", Action.INSTALL)]


def test_renderings_name_the_change() -> None:
    items = plan({K: desired("1.3.0", "B")}, {K: live()})
    text = render_text(items)
    assert "~ default/rr" in text and "1.2.0 -> 1.3.0" in text and "workflow.ref" in text
    markdown = render_markdown(items, title="PR #7")
    assert markdown.startswith("### PR #7")
    assert "| ~ | `default/rr` | **upgrade** | 1.2.0 -> 1.3.0 |" in markdown
    assert "Plan: 0 to install, 1 to upgrade, 0 to uninstall, 0 unchanged." in markdown


def test_markdown_escapes_pipes() -> None:
    weird = DesiredRun("default", "rr", "1.2.0", "B", {**spec(), "note": "a|b"})
    markdown = render_markdown(plan({K: weird}, {K: live()}))
    assert "a\\|b" in markdown


def test_live_from_combines_releases_statuses_and_running_sagas() -> None:
    from plnt.core.status import Phase, WorkflowRunStatus
    from plnt.reconciler.plan.diff import live_from
    from plnt.reconciler.state import LiveWorkflow, Release

    stable = Release(release_id="r", namespace="default", name="rr", track="stable", version="1.2.0",
                     spec_fingerprint="A", recipe_digest="d", recipe_dir="/x", endpoint="http://127.0.0.1:1")
    releases = {"default/rr": LiveWorkflow(namespace="default", name="rr", stable=stable)}
    statuses = [
        WorkflowRunStatus(namespace="default", name="rr", phase=Phase.ROLLED_BACK, attempted_fingerprint="F",
                          last_error="smoke test failed", deployed_spec=spec()),
        WorkflowRunStatus(namespace="default", name="new", phase=Phase.READY, attempted_fingerprint="G"),
    ]
    live = live_from(releases, statuses, running_sagas=["default/new"])
    assert live["default/rr"] == LiveRun("default", "rr", "1.2.0", "A", spec(), "F", "smoke test failed", False,
                                         replicas=1)
    assert live["default/new"] == LiveRun("default", "new", saga_running=True)  # Ready holds nothing back


DRIFT_CASES = [
    # (name, live stable fingerprint (None: gone), self_heal, action, reason part)
    ("release removed by hand, self-heal", None, True, Action.INSTALL, "drift: the release plnt deployed is gone; restoring"),
    ("release removed by hand, report only", None, False, Action.UNCHANGED, "selfHeal: false, so only reported"),
    ("release changed by hand, self-heal", "X", True, Action.UPGRADE, "runs 1.2.0 with another spec; restoring"),
    ("release changed by hand, report only", "X", False, Action.UNCHANGED, "drift: the release plnt deployed runs 1.2.0"),
    ("in sync", "A", False, Action.UNCHANGED, "in sync"),
]


@pytest.mark.parametrize(("live_fp", "self_heal", "action", "reason"), [c[1:] for c in DRIFT_CASES],
                         ids=[c[0] for c in DRIFT_CASES])
def test_drift_of_a_deployed_release(live_fp: str | None, self_heal: bool, action: Action, reason: str) -> None:
    want = DesiredRun("default", "rr", "1.2.0", "A", spec(), self_heal=self_heal)
    have = LiveRun("default", "rr", version="1.2.0" if live_fp else None, fingerprint=live_fp, spec=spec(),
                   deployed_fingerprint="A")
    [item] = plan({K: want}, {K: have})
    assert item.action is action and reason in item.reason


def test_a_new_spec_is_not_drift() -> None:
    want = DesiredRun("default", "rr", "1.3.0", "B", spec("1.3.0"), self_heal=False)
    [item] = plan({K: want}, {K: LiveRun("default", "rr", "1.2.0", "A", spec(), deployed_fingerprint="A")})
    assert item.action is Action.UPGRADE and "workflow.ref" in item.reason


def test_the_memo_plans_what_plan_plans_and_decides_again_only_what_changed() -> None:
    """PlanMemo (the reconciler's plan, asked after every saga's end) gives exactly
    plan(desired, live_from(...)) after each change, and decides again only the WorkflowRuns whose
    inputs are not the same objects as last time."""
    from plnt.core.status import Phase, WorkflowRunStatus
    from plnt.reconciler.plan.diff import PlanMemo, live_from
    from plnt.reconciler.state import LiveWorkflow, Release

    def want(name: str, version: str, fp: str) -> DesiredRun:
        return DesiredRun("default", name, version, fp, spec(version))

    def record(name: str, version: str, fp: str) -> LiveWorkflow:
        stable = Release(release_id=f"{name}-{version}", namespace="default", name=name, track="stable", version=version,
                         spec_fingerprint=fp, recipe_digest="d", recipe_dir="/x", endpoint="http://127.0.0.1:1")
        return LiveWorkflow(namespace="default", name=name, stable=stable)

    def status(name: str, phase: Phase, **fields: Any) -> WorkflowRunStatus:
        return WorkflowRunStatus(namespace="default", name=name, phase=phase, **fields)

    def keep(key: str) -> bool:
        return "--pr" not in key  # the reconciler leaves preview releases to their controller

    desired = {f"default/{n}": want(n, "1.0.0", f"{n}-1") for n in ("a", "b", "c", "d")}
    releases = {"default/a": record("a", "1.0.0", "a-1"), "default/b": record("b", "1.0.0", "b-1"),
                "default/gone": record("gone", "1.0.0", "gone-1"), "default/a--pr3": record("a--pr3", "2.0.0", "p")}
    statuses = {"default/a": status("a", Phase.READY, deployed_fingerprint="a-1"),
                "default/c": status("c", Phase.FAILED, attempted_fingerprint="c-1", last_error="smoke")}
    running: dict[str, str | None] = {}
    memo = PlanMemo()

    def check(expect_decided: set[str]) -> None:
        got = memo.plan(desired, releases, list(statuses.values()), running, keep=keep)
        assert {key.split("/")[1] for key in memo.last_decided} == expect_decided
        live = {key: run for key, run in live_from(releases, statuses.values(), running).items()
                if key in desired or keep(key)}
        assert got == plan(desired, live)

    check({"a", "b", "c", "d", "gone"})  # everything, the first time
    check(set())  # nothing changed: nothing decided again
    statuses["default/b"] = status("b", Phase.VERIFYING)  # a saga's status
    running["default/d"] = "d-1"  # a saga started
    check({"b", "d"})
    releases["default/d"] = record("d", "1.0.0", "d-1")  # ...and promoted
    del running["default/d"]
    check({"d"})
    running["default/gone"] = None  # an uninstall saga
    check({"gone"})
    desired = {**desired, "default/b": want("b", "1.1.0", "b-2")}  # a new commit changed b
    check({"b"})
    del desired["default/c"]  # ...and removed c
    check({"c"})
    releases["default/a--pr3"] = record("a--pr3", "2.1.0", "q")  # a preview changed: not the reconciler's
    check(set())


def test_a_pin_is_never_superseded_by_the_spec_it_holds_against() -> None:
    [item] = plan({K: desired("1.3.0", "B")}, {K: live(pin=PIN, saga_running=True, saga_fingerprint="P")})
    assert not item.supersedes and not item.needs_saga


# Scale in place: a change of the replica count only (outside the fingerprint) scales the live release.
SCALE_CASES = [
    # (name, desired replicas (min, max in sync), live replicas, running saga, action, to_replicas)
    ("same count", (2, 2), 2, False, Action.UNCHANGED, None),
    ("up: 1 -> 3", (3, 3), 1, False, Action.SCALE, 3),
    ("down: 3 -> 1", (1, 1), 3, False, Action.SCALE, 1),
    ("autoscaled within min..max is in sync", (1, 4), 3, False, Action.UNCHANGED, None),
    ("below the autoscaling floor: up to min", (2, 4), 1, False, Action.SCALE, 2),
    ("above the autoscaling ceiling: down to max", (1, 4), 6, False, Action.SCALE, 4),
    ("count unknown (e.g. a plan between two commits' sides)", (3, 3), None, False, Action.UNCHANGED, None),
    ("a saga of this spec runs: wait for it", (3, 3), 1, True, Action.UNCHANGED, None),
]


@pytest.mark.parametrize(("name", "want", "have", "saga", "action", "to"), SCALE_CASES, ids=[c[0] for c in SCALE_CASES])
def test_scale_in_place(name: str, want: tuple[int, int], have: int | None, saga: bool, action: Action,
                        to: int | None) -> None:
    desired_run = DesiredRun("default", "rr", "1.2.0", "A", spec(), replicas=want[0], replicas_max=want[1])
    items = plan({K: desired_run}, {K: live(replicas=have, saga_running=saga, saga_fingerprint="A" if saga else None)})
    assert [i.action for i in items] == [action]
    assert items[0].to_replicas == to
    assert not items[0].needs_saga, "a scale runs no saga"
    if action is Action.SCALE:
        assert items[0].from_replicas == have and items[0].reason == f"replicas {have} -> {to}"
        text = render_text(items)
        assert f"scale     1.2.0 replicas {have} -> {to}" in text and "1 to scale" in text
        assert items[0].to_json()["toReplicas"] == to


def test_a_real_change_with_a_new_count_is_an_upgrade_not_a_scale() -> None:
    """The saga installs the new release at the new count (promote starts its replicas)."""
    items = plan({K: DesiredRun("default", "rr", "1.3.0", "B", spec("1.3.0"), replicas=3, replicas_max=3)},
                 {K: live(replicas=1)})
    assert [i.action for i in items] == [Action.UPGRADE]


def test_only_the_count_stays_out_of_the_fingerprint() -> None:
    """replicas and autoscaling do not name a new release, parking (min 0) does; a spec at the default
    count keeps the digest it had before counts were left out (a plain sha256 of the whole spec)."""
    import hashlib
    import json

    from plnt.core.specs.models import WorkflowRunSpec, spec_fingerprint

    def of(**extra: Any) -> WorkflowRunSpec:
        return WorkflowRunSpec.model_validate({"workflow": {"ref": "rr@1.2.0", "registry": "file:r"},
                                               "backend": {"cluster": "local"}, **extra})

    base = of()
    whole = json.dumps(base.model_dump(mode="json", by_alias=True), sort_keys=True, separators=(",", ":"))
    assert spec_fingerprint(base) == "sha256:" + hashlib.sha256(whole.encode()).hexdigest()
    assert spec_fingerprint(of(replicas={"min": 3, "max": 5}, autoscaling={"targetInvocationsPerSecond": 9})) \
        == spec_fingerprint(base)
    assert spec_fingerprint(of(replicas={"min": 0})) != spec_fingerprint(base)
    assert spec_fingerprint(of(canary={"trafficPercent": 7})) != spec_fingerprint(base)
