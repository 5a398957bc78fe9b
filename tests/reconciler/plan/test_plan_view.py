"""The UI's data helpers on the reconciler side: the plan between two revisions (plan_view, shared by
`plnt plan` and GET /plan) on a real git repository, the branch's revisions, a recipe's input names
(a pure function: table tests), and the status row's new fields."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from plnt.core.specs.limits import SpecLimits
from plnt.core.specs.loader import load_recipe
from plnt.core.specs.models import Workflow
from plnt.core.status import Phase, RolloutMark, WorkflowRunStatus
from plnt.reconciler.plan.view import InvalidRevision, InvalidSpecsAt, plan_between, revisions
from plnt.reconciler.saga.io import MAX_INPUTS, PulledRecipeInfo, recipe_inputs
from plnt.reconciler.source.git import GitSource
from typer.testing import CliRunner

from tests.conftest import SpecRepo

RUN_FILE = "workflowruns/review-responder.yaml"
EXAMPLE_RECIPE = Path(__file__).parents[3] / "gitops-example/recipes/review-responder/1.2.0/workflow.yaml"


def _workflow(steps: list[dict[str, Any]]) -> Workflow:
    return Workflow.model_validate({"apiVersion": "microagents.dev/v1", "kind": "Workflow",
                                    "metadata": {"name": "w", "version": "1.0.0"}, "steps": steps})


INPUT_CASES = [
    # (name, steps, inputs)
    ("one template", [{"id": "a", "tool": "llm.generate", "params": {"prompt": "Say {text}"}}], ["text"]),
    ("step ids are no inputs", [
        {"id": "a", "tool": "llm.classify", "params": {"input": "{review}"}},
        {"id": "b", "tool": "llm.generate", "deps": ["a"], "params": {"prompt": "{a}: {review} {tone}"}},
    ], ["review", "tone"]),
    ("attribute and index roots", [{"id": "a", "tool": "python", "params": {"x": "{user.name} {items[0]}"}}],
     ["user", "items"]),
    ("escaped braces and positional fields", [{"id": "a", "tool": "python", "params": {"x": "{{lit}} {} {0}"}}], []),
    ("inside lists and mappings", [{"id": "a", "tool": "python",
                                    "params": {"xs": ["{first}", {"deep": "{second}"}], "n": 3}}], ["first", "second"]),
    ("malformed template names nothing", [{"id": "a", "tool": "python", "params": {"x": "{broken"}}], []),
    ("no params", [{"id": "a", "tool": "python"}], []),
    ("order of first use, no repeats", [
        {"id": "a", "tool": "llm.generate", "params": {"system": "{b_input}", "prompt": "{a_input} {b_input}"}},
    ], ["b_input", "a_input"]),
    ("many inputs are cut", [{"id": "a", "tool": "python",
                              "params": {"x": " ".join(f"{{i{n}}}" for n in range(MAX_INPUTS + 5))}}],
     [f"i{n}" for n in range(MAX_INPUTS)]),
]


@pytest.mark.parametrize(("steps", "inputs"), [c[1:] for c in INPUT_CASES], ids=[c[0] for c in INPUT_CASES])
def test_recipe_inputs(steps: list[dict[str, Any]], inputs: list[str]) -> None:
    assert recipe_inputs(_workflow(steps)) == inputs


def test_recipe_inputs_of_the_example_recipe() -> None:
    assert recipe_inputs(load_recipe(EXAMPLE_RECIPE)) == ["review", "brand_voice"]


def test_a_pull_result_recorded_before_inputs_existed_still_decodes() -> None:
    old = PulledRecipeInfo.model_validate({"digest": "sha256:" + "0" * 64, "version": "1.0.0", "signer": "x"})
    assert old.inputs is None


def test_status_row_shows_signer_rollout_budget_and_inputs() -> None:
    status = WorkflowRunStatus(namespace="default", name="rr", signer="ci@example.com (https://issuer)",
                               rollout=RolloutMark(commit="a" * 40, phase=Phase.CANARY, message="smoke", at=12.5),
                               smoke_budget={"invocations": 10, "p95BudgetMs": 2500}, inputs=["review"])
    row = status.public()
    assert row["signer"] == "ci@example.com (https://issuer)"
    assert row["rollout"] == {"commit": "a" * 40, "phase": "Canary", "message": "smoke", "at": 12.5}
    assert row["smokeBudget"] == {"invocations": 10, "p95BudgetMs": 2500} and row["inputs"] == ["review"]
    empty = WorkflowRunStatus(namespace="default", name="rr").public()
    assert (empty["signer"], empty["rollout"], empty["smokeBudget"], empty["inputs"]) == (None, None, None, None)


@pytest.mark.integration  # git processes
def test_plan_between_two_revisions_matches_plnt_plan(spec_repo: SpecRepo, tmp_path: Path) -> None:
    from plnt.reconciler.cli.main import app

    first = spec_repo.git("rev-parse", "HEAD")
    spec_repo.replace(RUN_FILE, "review-responder@1.2.0", "review-responder@1.3.0")
    second = spec_repo.commit("review-responder 1.3.0")
    source = GitSource(str(spec_repo.path), tmp_path / "clone")
    view = plan_between(source, head=second, base=first[:8], limits=SpecLimits())
    assert (view.base, view.head, view.title) == (first, second, f"plnt plan {first[:12]}..{second[:12]}")
    assert [(i.action.value, i.name, i.to_version) for i in view.items] == [("upgrade", "review-responder", "1.3.0")]
    body = view.api_json()
    assert body["markdown"] == view.markdown() and body["items"] == [view.items[0].to_json()]
    printed = CliRunner().invoke(app, ["plan", "--repo", str(spec_repo.path), "--base", first, "--head", "main",
                                       "--format", "markdown", "--no-cache"])
    assert printed.exit_code == 0, printed.output
    assert printed.stdout == view.markdown()

    assert [(r["commit"], r["subject"]) for r in revisions(source, 10)] == [(second, "review-responder 1.3.0"),
                                                                           (first, "initial specs")]
    assert len(revisions(source, 1)) == 1

    with pytest.raises(InvalidRevision, match="unknown revision 'nope'") as raised:
        plan_between(source, head=second, base="nope")
    assert raised.value.revision == "nope"
    with pytest.raises(InvalidRevision, match="is not a revision"):
        plan_between(source, head="--output=/tmp/x", base=first)


@pytest.mark.integration  # git processes
def test_plan_between_refuses_a_revision_with_invalid_specs(spec_repo: SpecRepo, tmp_path: Path) -> None:
    first = spec_repo.git("rev-parse", "HEAD")
    spec_repo.write("workflowruns/broken.yaml", "apiVersion: plnt.work/v1\nkind: WorkflowRun\nmetadata: {}\n")
    broken = spec_repo.commit("broken")
    source = GitSource(str(spec_repo.path), tmp_path / "clone")
    with pytest.raises(InvalidSpecsAt) as raised:
        plan_between(source, head=broken, base=first)
    assert raised.value.commit == broken and raised.value.problems
    # Without a base: against what live() says runs (plnt plan --state-dir).
    view = plan_between(source, head=first, base=None, live=dict, live_label="nothing")
    assert view.base is None and view.title == f"plnt plan {first[:12]} against nothing"
    assert [i.action.value for i in view.items] == ["install"]


POOL_BACKENDS = """\
apiVersion: plnt.work/v1
kind: PlntBackend
metadata: {name: east, labels: {pool: agents}}
spec: {type: local, capacity: {replicas: 2}}
---
apiVersion: plnt.work/v1
kind: PlntBackend
metadata: {name: west, labels: {pool: agents}}
spec: {type: local, capacity: {replicas: 1}}
"""


@pytest.mark.integration  # git processes
def test_plan_between_shows_where_a_pools_replicas_go_and_what_capacity_is_missing(spec_repo: SpecRepo,
                                                                                 tmp_path: Path) -> None:
    first = spec_repo.git("rev-parse", "HEAD")
    spec_repo.write("backends/pool.yaml", POOL_BACKENDS)
    spec_repo.replace(RUN_FILE, "    cluster: local", "    selector: {matchLabels: {pool: agents}}")
    spec_repo.replace(RUN_FILE, "replicas: {min: 1, max: 1}", "replicas: {min: 2, max: 2}")
    pooled = spec_repo.commit("review-responder on the agents pool, 2 replicas")
    source = GitSource(str(spec_repo.path), tmp_path / "clone")
    [item] = plan_between(source, head=pooled, base=first).items
    assert item.unplaceable is None and item.needs_saga
    assert item.placement == ("replica 1 -> east: 2 of 2 replica slots free, 0 in flight",
                              "replica 2 -> west: 1 of 1 replica slots free, 0 in flight")
    view = plan_between(source, head=pooled, base=first)
    assert "    replica 2 -> west: 1 of 1 replica slots free, 0 in flight" in view.text()
    assert "#### Where the replicas go" in view.markdown()

    # west's capacity lowered to 0 in git: its replica moves to east, which has room for both.
    spec_repo.replace("backends/pool.yaml", "capacity: {replicas: 1}", "capacity: {replicas: 0}")
    lowered = spec_repo.commit("west full")
    [item] = plan_between(source, head=lowered, base=pooled).items
    assert item.placement == ("replica 1 -> east: kept: 1 of 2 replica slots free, 0 in flight",
                              "replica 2 -> east: 1 of 2 replica slots free, 0 in flight")
    # ...moved in place: a scale to the new placement (same version, no saga).
    assert (item.action.value, item.reason, item.replicas_by_backend) == ("scale", "re-placed: east 1, west 1 -> east 2",
                                                                          (("east", 2),))
    assert not item.needs_saga and (item.from_replicas, item.to_replicas) == (2, 2)

    # Three replicas cannot fit in 2 + 0: the plan item fails, naming the missing capacity.
    spec_repo.replace(RUN_FILE, "replicas: {min: 2, max: 2}", "replicas: {min: 3, max: 3}")
    too_many = spec_repo.commit("three replicas")
    view = plan_between(source, head=too_many, base=pooled)
    [item] = view.items
    assert item.action.value == "scale" and not item.needs_saga  # (replicas only)
    assert item.unplaceable == ("needs 1 more replica slot: selector pool=agents has 0 free (east: 0 of 2, "
                                "west: 0 of 0)")
    assert "cannot be placed: needs 1 more replica slot" in view.text()
    assert "1 cannot be placed." in view.text()
    assert "**cannot be placed**" in view.markdown()
    assert view.cli_json()["items"][0]["unplaceable"] == item.unplaceable
