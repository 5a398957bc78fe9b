"""A shadow run (the gateway's mirror of a live request: X-Plnt-Shadow) does not run the recipe's
sideEffects steps; a normal run does. The engine runs the recipe with MockBackend, a STAND-IN for a
model server."""

from __future__ import annotations

from pathlib import Path

from plnt.runner.adapters import MockBackend
from plnt.runner.engine import run_workflow
from plnt.runner.recipe import load_recipe_dir

from tests.runner.helpers import write_recipe


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
