"""Every example recipe's golden cases, run against the MockBackend (as `plnt` smoke tests do):
MockBackend is a STAND-IN for a model server (the reply is the prompt's last line).

review-responder 1.4.0 is deliberately broken: its cases must fail at safety_check.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from plnt.core.recipe import load_golden, matches
from plnt.core.specs.models import output_step, step_levels
from plnt.runner.adapters import MockBackend
from plnt.runner.engine import StepFailed, run_workflow
from plnt.runner.recipe import load_recipe_dir

from tests.runner.helpers import EXAMPLE_RECIPES

RECIPE_DIRS = sorted(p.parent for p in EXAMPLE_RECIPES.glob("*/*/workflow.yaml"))
BROKEN = {("review-responder", "1.4.0"): "safety_check"}


def _id(path: Path) -> str:
    return f"{path.parent.name}@{path.name}"


def test_the_example_registry_has_the_recipes_of_the_design() -> None:
    names = {p.parent.name for p in RECIPE_DIRS}
    assert {"review-responder", "post-generator", "booking-triage", "trend-monitor"} <= names


@pytest.mark.parametrize("directory", RECIPE_DIRS, ids=_id)
async def test_golden_cases(directory: Path) -> None:
    recipe = load_recipe_dir(directory)
    assert (recipe.name, recipe.version) == (directory.parent.name, directory.name)
    cases = load_golden(directory)
    assert cases, f"{_id(directory)} has no golden cases"
    broken_step = BROKEN.get((recipe.name, recipe.version))
    for case in cases:
        if broken_step is not None:
            with pytest.raises(StepFailed) as failure:
                await run_workflow(recipe, case.input, MockBackend())
            assert failure.value.step == broken_step
            continue
        result = await run_workflow(recipe, case.input, MockBackend())
        assert matches(case.expect, result.output), f"{_id(directory)} {case.name}: {result.output!r}"
        assert set(result.timings_ms) == {step.id for step in recipe.workflow.steps}


@pytest.mark.parametrize("name", ["post-generator", "booking-triage", "trend-monitor"])
async def test_new_recipes_stream_their_output_text(name: str) -> None:
    """Their output step streams: the tokens, joined, are the text the output carries."""
    directory = EXAMPLE_RECIPES / name / "1.0.0"
    recipe = load_recipe_dir(directory)
    for case in load_golden(directory):
        tokens: list[tuple[str, str]] = []
        result = await run_workflow(recipe, case.input, MockBackend(), sink=lambda step, text, into=tokens: into.append((step, text)))
        assert tokens, f"{name} {case.name}: no tokens"
        assert {step for step, _ in tokens} == {output_step(recipe.workflow)}
        text = result.output if isinstance(result.output, str) else result.output.get("reply", result.output.get("summary"))
        assert "".join(t for _, t in tokens).strip() == text
        assert matches(case.expect, result.output)


def test_trend_monitor_analyses_run_in_one_concurrent_level() -> None:
    recipe = load_recipe_dir(EXAMPLE_RECIPES / "trend-monitor" / "1.0.0")
    assert step_levels(recipe.workflow.steps) == [["topics", "mood", "mentions"], ["summary"]]
    recipe = load_recipe_dir(EXAMPLE_RECIPES / "booking-triage" / "1.0.0")
    assert step_levels(recipe.workflow.steps)[0] == ["intent", "policy"]


@pytest.mark.parametrize("directory", RECIPE_DIRS, ids=_id)
def test_every_recipe_maps_chat_messages_to_its_inputs(directory: Path) -> None:
    recipe = load_recipe_dir(directory)
    chat_inputs = recipe.module.chat_inputs
    messages = [{"role": "system", "content": "be nice"}, {"role": "user", "content": "older"},
                {"role": "assistant", "content": "ok"}, {"role": "user", "content": [{"type": "text", "text": "Newest text"}]}]
    inputs = chat_inputs(messages)
    expected = {
        "review-responder": {"review": "Newest text", "brand_voice": "warm, brief"},
        "post-generator": {"topic": "Newest text", "audience": "general readers"},
        "booking-triage": {"request": "Newest text"},
        "trend-monitor": {"posts": ["Newest text"]},
    }[recipe.name]
    assert inputs == expected
    with pytest.raises(ValueError):
        chat_inputs([{"role": "system", "content": "no user"}])


async def test_a_review_with_braces_is_not_a_template() -> None:
    """Text from a chat goes into prompts: braces in it must stay literal."""
    recipe = load_recipe_dir(EXAMPLE_RECIPES / "review-responder" / "1.2.0")
    result = await run_workflow(recipe, {"review": "Great {staff} but slow {parking}", "brand_voice": "warm"}, MockBackend())
    assert result.output["intent"] == "mixed"
