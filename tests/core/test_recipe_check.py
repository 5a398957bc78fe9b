"""The data-only recipe check plnt runs in its own processes: it never executes recipe code.

Each recipe here has a module that, if anything imported it, would leave a marker file; every test
asserts the marker is absent (and no recipe module is in sys.modules) after the check.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
from plnt.core.recipe import RecipeError, check_recipe_dir, load_golden

from tests.conftest import EXAMPLE

SOURCE = EXAMPLE / "recipes" / "review-responder" / "1.2.0"


def recipe(tmp_path: Path, steps: str | bytes | None = None, *, edit: tuple[str, str] | None = None) -> Path:
    directory = tmp_path / "recipe"
    shutil.copytree(SOURCE, directory)
    marker = tmp_path / "imported"
    prologue = f"open({str(marker)!r}, 'w').write('imported')\n"
    if isinstance(steps, bytes):
        (directory / "steps.py").write_bytes(steps)
    else:
        (directory / "steps.py").write_text(prologue + (steps if steps is not None else (SOURCE / "steps.py").read_text()))
    if edit is not None:
        workflow = directory / "workflow.yaml"
        assert edit[0] in workflow.read_text()
        workflow.write_text(workflow.read_text().replace(*edit))
    return directory


@pytest.fixture(autouse=True)
def never_imported(tmp_path: Path):  # type: ignore[no-untyped-def]
    before = set(sys.modules)
    yield
    assert not (tmp_path / "imported").exists(), "the recipe's module was executed"
    assert not [name for name in set(sys.modules) - before if name.startswith("plnt_recipe_")]


def test_a_good_recipe_is_checked_without_running_it(tmp_path: Path) -> None:
    checked = check_recipe_dir(recipe(tmp_path))
    assert (checked.name, checked.version) == ("review-responder", "1.2.0")
    assert checked.entry is not None and checked.entry.name == "steps.py"
    assert checked.digest.startswith("sha256:")


@pytest.mark.parametrize(("steps", "edit", "message"), [
    ("def broken(:\n", None, "steps.py: not valid Python: "),
    (b"x = 1\0\n", None, "steps.py: not valid Python: source code string cannot contain null bytes"),
    ("x = " + "(" * 5000 + ")" * 5000 + "\n", None, "steps.py: not valid Python: too many nested parentheses"),
    ("x = " + "[" * 150_000 + "]" * 150_000 + "\n", None, "steps.py: not valid Python: "),
    ("def other():\n    pass\n", ("tool: llm.generate", "tool: python"),
     "step draft_reply uses tool python but steps.py defines no function draft_reply()"),
    (None, ("entrypoint: steps.py", "entrypoint: ../outside.py"), "runtime.entrypoint '../outside.py' is outside the recipe"),
    (None, ("entrypoint: steps.py", "entrypoint: knowledge"), "runtime.entrypoint is not a regular file"),
    (None, ("entrypoint: steps.py", "entrypoint: gone.py"), "runtime.entrypoint not found"),
])
def test_a_broken_recipe_is_refused_as_data(tmp_path: Path, steps: str | bytes | None, edit: tuple[str, str] | None,
                                            message: str) -> None:
    with pytest.raises(RecipeError) as caught:
        check_recipe_dir(recipe(tmp_path, steps, edit=edit))
    assert message in str(caught.value)


def test_python_steps_defined_in_ways_only_running_code_shows_are_left_to_the_runner(tmp_path: Path) -> None:
    python_step = ("tool: llm.generate", "tool: python")
    dynamic = "from json import *\n"  # a star import may bind any name: the runner checks at its start
    assert check_recipe_dir(recipe(tmp_path, dynamic, edit=python_step)).entry is not None
    shutil.rmtree(tmp_path / "recipe")
    conditional = "try:\n    import json\nexcept ImportError:\n    pass\nelse:\n    def draft_reply(x):\n        return x\n"
    assert check_recipe_dir(recipe(tmp_path, conditional, edit=python_step)).entry is not None


def test_a_link_in_the_recipe_is_refused(tmp_path: Path) -> None:
    directory = recipe(tmp_path)
    (directory / "workflow.yaml").rename(directory / "real.yaml")
    (directory / "workflow.yaml").symlink_to(directory / "real.yaml")
    with pytest.raises(RecipeError, match="a recipe directory needs a workflow.yaml, a regular file"):
        check_recipe_dir(directory)


@pytest.mark.parametrize(("golden", "message"), [
    ("a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\ncases: [*b]\n",
     "line 2: aliases (*name) are not allowed in golden.yaml"),
    ("cases: " + "[" * 100_000 + "]" * 100_000 + "\n", "invalid YAML: nested too deeply"),
    ("cases:\n" + "  - {input: {review: " + "x" * 2**20 + "}, expect: {}}\n", "larger than 1048576 bytes"),
    ("cases: [\udcff]\n", "invalid YAML"),
])
def test_hostile_golden_cases_are_refused_as_data(tmp_path: Path, golden: str, message: str) -> None:
    directory = recipe(tmp_path)
    (directory / "golden.yaml").write_bytes(golden.encode("utf-8", "surrogateescape"))
    with pytest.raises(RecipeError) as caught:
        load_golden(directory)
    assert message in str(caught.value)


def test_recipes_checked_in_many_threads_at_once(tmp_path: Path) -> None:
    """Concurrent sagas check recipes in threads. CPython 3.11's AST constructor keeps its recursion
    depth per interpreter, so two parses interleaved by a garbage collection failed with
    "SystemError: AST constructor recursion depth mismatch" (seen with 1,000 sagas). A GC callback
    that yields the GIL makes the interleaving happen here within a few hundred checks."""
    import gc
    import threading
    import time

    body = "".join(f"    y{i} = [x + {i}, {{'a': (1, 2, {i})}}]\n" for i in range(300))
    directory = recipe(tmp_path, (SOURCE / "steps.py").read_text() + "\n\ndef padding(x):\n" + body)
    errors: list[BaseException] = []

    def check_many() -> None:
        for _ in range(60):
            try:
                check_recipe_dir(directory)
            except BaseException as exc:  # noqa: BLE001 - every failure is the finding
                errors.append(exc)

    def yield_gil(phase: str, info: dict[str, int]) -> None:
        time.sleep(0.0001)

    threshold = gc.get_threshold()
    gc.callbacks.append(yield_gil)
    gc.set_threshold(50)
    try:
        threads = [threading.Thread(target=check_many) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        gc.callbacks.remove(yield_gil)
        gc.set_threshold(*threshold)
    assert errors == []
