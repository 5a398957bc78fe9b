"""A shadow run (the gateway's mirror of a live request: X-Plnt-Shadow) does not run the recipe's
sideEffects steps; a normal run does. Its LLM calls carry X-Plnt-Shadow to the gateway, which so does
not mirror them to a model's canary again. The engine runs the recipe with MockBackend, or an
HTTPBackend talking to the OpenAI test peer: both STAND-INS for a model server."""

from __future__ import annotations

from pathlib import Path

import pytest
from plnt.runner.adapters import HTTPBackend, MockBackend
from plnt.runner.engine import run_workflow
from plnt.runner.recipe import load_recipe_dir

from tests.openai_peer import OpenAIPeer
from tests.runner.helpers import GENERATE_STEPS, write_recipe


async def test_a_shadow_run_skips_side_effects(tmp_path: Path) -> None:
    sent = tmp_path / "sent.log"
    recipe_dir = write_recipe(
        tmp_path / "recipe",
        """
        - {id: notify, tool: python, sideEffects: true}
        - {id: answer, tool: python, deps: [notify]}
        """,
        f"""
        def notify(ctx):
            with open({str(sent)!r}, "a") as f:
                f.write("sent\\n")
            return "sent"
        def answer(ctx):
            return {{"notified": ctx.results["notify"]}}
        """,
    )
    recipe = load_recipe_dir(recipe_dir)
    normal = await run_workflow(recipe, {}, MockBackend())
    shadow = await run_workflow(recipe, {}, MockBackend(), shadow=True)
    assert normal.output == {"notified": "sent"} and shadow.output == {"notified": None}
    assert sent.read_text() == "sent\n", "the shadow run sent nothing"
    assert shadow.timings_ms["notify"] == 0.0


@pytest.mark.integration
async def test_a_shadow_runs_llm_calls_are_marked_and_a_normal_runs_are_not(tmp_path: Path) -> None:
    recipe = load_recipe_dir(write_recipe(tmp_path / "recipe", GENERATE_STEPS))
    with OpenAIPeer() as peer:
        backend = HTTPBackend(peer.url, "smollm2")
        try:
            await run_workflow(recipe, {}, backend, shadow=True)
            await run_workflow(recipe, {}, backend)  # the same task: the mark does not outlive its run
            await run_workflow(recipe, {}, backend, shadow=True, sink=lambda step, text: None)  # streamed
        finally:
            await backend.aclose()
        marks = [(r.headers.get("x-plnt-shadow"), bool(r.json.get("stream"))) for r in peer.requests]
    assert marks == [("1", False), (None, False), ("1", True)]
