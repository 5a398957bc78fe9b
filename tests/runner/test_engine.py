"""The runner's engine, tools, recipe loading and digest, and the example registry's golden cases."""

from __future__ import annotations

import asyncio
import hashlib
import shutil
import sys
import textwrap
import time
from pathlib import Path

import pytest
from plnt.runner.adapters import MockBackend
from plnt.runner.engine import StepFailed, run_workflow
from plnt.runner.recipe import Recipe, RecipeError, directory_digest, load_golden, load_recipe_dir, matches
from plnt.runner.tools import Tools

RECIPES = Path(__file__).resolve().parents[2] / "gitops-example" / "recipes" / "review-responder"
VERSIONS = ["1.2.0", "1.3.0", "1.4.0", "1.5.0"]
REVIEW = {"review": "Great service but slow parking", "brand_voice": "warm, brief"}


def write_recipe(root: Path, steps_yaml: str, module: str | None = None, *, extra: str = "", files: dict[str, str] | None = None) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "workflow.yaml").write_text(
        "apiVersion: microagents.dev/v1\nkind: Workflow\nmetadata: {name: tiny, version: 0.1.0}\n"
        + extra
        + "steps:\n"
        + textwrap.indent(textwrap.dedent(steps_yaml).strip() + "\n", "  ")
    )
    if module is not None:
        (root / "steps.py").write_text(textwrap.dedent(module))
    for name, text in (files or {}).items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


async def run(recipe_dir: Path, inputs: dict | None = None):
    return await run_workflow(load_recipe_dir(recipe_dir), inputs or {}, MockBackend())


# --- DAG ---------------------------------------------------------------------------------------


async def test_steps_run_in_dependency_order_and_see_finished_results(tmp_path: Path) -> None:
    recipe = write_recipe(
        tmp_path,
        """
        - {id: c, tool: python, deps: [b]}
        - {id: b, tool: python, deps: [a]}
        - {id: a, tool: python}
        """,
        """
        ORDER = []
        def a(ctx):
            ORDER.append("a"); return ctx.inputs["x"] + 1
        async def b(ctx):
            ORDER.append("b"); return ctx.results["a"] * 10
        def c(ctx):
            ORDER.append("c"); return {"seen": sorted(ctx.results), "order": list(ORDER)}
        """,
    )
    result = await run(recipe, {"x": 1})
    assert result.output == {"seen": ["a", "b"], "order": ["a", "b", "c"]}
    assert result.results["b"] == 20
    assert set(result.timings_ms) == {"a", "b", "c"}


@pytest.mark.parametrize("kind", ["async", "sync"])
async def test_independent_steps_overlap_in_time(tmp_path: Path, kind: str) -> None:
    sleep = "await asyncio.sleep(0.3)" if kind == "async" else "time.sleep(0.3)"
    prefix = "async def" if kind == "async" else "def"
    recipe = write_recipe(
        tmp_path,
        """
        - {id: left, tool: python}
        - {id: right, tool: python}
        - {id: join, tool: python, deps: [left, right]}
        """,
        f"""
        import asyncio, time
        {prefix} left(ctx):
            start = time.perf_counter(); {sleep}; return (start, time.perf_counter())
        {prefix} right(ctx):
            start = time.perf_counter(); {sleep}; return (start, time.perf_counter())
        def join(ctx):
            return [ctx.results["left"], ctx.results["right"]]
        """,
    )
    started = time.perf_counter()
    result = await run(recipe)
    elapsed = time.perf_counter() - started
    (l_start, l_end), (r_start, r_end) = result.output
    assert l_start < r_end and r_start < l_end, "left and right did not overlap"
    assert elapsed < 0.55
    assert result.timings_ms["left"] >= 290 and result.timings_ms["right"] >= 290


# --- module overrides and tool bindings ------------------------------------------------------


async def test_module_function_overrides_the_steps_tool_and_can_reuse_bindings(tmp_path: Path) -> None:
    recipe = write_recipe(
        tmp_path,
        """
        - {id: plain, tool: llm.generate, params: {prompt: "ignore this\\nplain {topic}"}}
        - id: custom
          tool: llm.generate
          deps: [plain]
          params: {prompt: "never used"}
        """,
        """
        async def custom(ctx):
            text = await ctx.tools.call("llm.generate", prompt="preamble\\n{plain} and {topic} rocks")
            return text.upper()
        """,
    )
    result = await run(recipe, {"topic": "python"})
    assert result.results["plain"] == "plain python"
    assert result.output == "PLAIN PYTHON AND PYTHON ROCKS"


async def test_failing_step_fails_the_invocation_naming_the_step(tmp_path: Path) -> None:
    recipe = write_recipe(
        tmp_path,
        """
        - {id: ok, tool: python}
        - {id: slow_sibling, tool: python}
        - {id: boom, tool: python}
        - {id: after, tool: python, deps: [boom]}
        """,
        """
        import asyncio
        DONE = []
        def ok(ctx): return 1
        async def slow_sibling(ctx):
            await asyncio.sleep(2); DONE.append("slow_sibling")
        def boom(ctx): raise ValueError("no such customer")
        def after(ctx): DONE.append("after")
        """,
    )
    loaded = load_recipe_dir(recipe)
    started = time.perf_counter()
    with pytest.raises(StepFailed) as failure:
        await run_workflow(loaded, {}, MockBackend())
    assert failure.value.step == "boom"
    assert "boom" in str(failure.value) and "ValueError: no such customer" in str(failure.value)
    assert time.perf_counter() - started < 1.0, "the sibling step was not cancelled"
    assert loaded.module.DONE == []


async def test_python_tool_without_function_is_rejected(tmp_path: Path) -> None:
    recipe = write_recipe(tmp_path, "- {id: compute, tool: python}", "def other(ctx): return 1\n")
    with pytest.raises(RecipeError, match=r"step compute uses tool python but steps.py defines no function compute"):
        load_recipe_dir(recipe)
    # the engine refuses too, should a Recipe be built by hand
    workflow = load_recipe_dir(write_recipe(tmp_path / "ok", "- {id: compute, tool: python}", "def compute(ctx): 1")).workflow
    with pytest.raises(StepFailed, match=r"step 'compute' failed: .*needs a function compute\(ctx\)"):
        await run_workflow(Recipe(workflow=workflow, directory=tmp_path, module=None), {}, MockBackend())


async def test_unknown_tool_is_rejected(tmp_path: Path) -> None:
    recipe = write_recipe(tmp_path, "- {id: summarise, tool: llm.summarize}")
    with pytest.raises(RecipeError) as failure:
        load_recipe_dir(recipe)
    assert str(failure.value).startswith(str(tmp_path / "workflow.yaml"))
    assert "tool" in str(failure.value) and "llm.summarize" in str(failure.value)

    recipe = write_recipe(
        tmp_path / "call",
        "- {id: s, tool: python}",
        "async def s(ctx):\n    return await ctx.tools.call('llm.summarize')\n",
    )
    with pytest.raises(StepFailed, match=r"step 's' failed: ToolError: unknown tool 'llm.summarize'"):
        await run(recipe)


async def test_unknown_template_field_names_the_field(tmp_path: Path) -> None:
    recipe = write_recipe(tmp_path, "- {id: gen, tool: llm.generate, params: {prompt: 'hi {nobody}'}}")
    with pytest.raises(StepFailed, match=r"\{nobody\} is neither an input nor a finished step"):
        await run(recipe, {"somebody": 1})


def test_workflow_yaml_parses_without_the_reconciler_loader(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "plnt.reconciler.loader", None)  # import fails: the fallback parses
    assert load_recipe_dir(RECIPES / "1.2.0").workflow.steps[0].id == "classify_intent"
    with pytest.raises(RecipeError, match=r"workflow.yaml: steps.0.tool: Input should be"):
        load_recipe_dir(write_recipe(tmp_path, "- {id: s, tool: llm.summarize}"))


async def test_load_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(RecipeError, match="workflow.yaml: not found"):
        load_recipe_dir(tmp_path)
    cyclic = write_recipe(tmp_path / "cycle", "- {id: a, tool: python, deps: [b]}\n- {id: b, tool: python, deps: [a]}", "def a(c): 0\ndef b(c): 0\n")
    with pytest.raises(RecipeError, match="cycle"):
        load_recipe_dir(cyclic)
    broken = write_recipe(tmp_path / "broken", "- {id: a, tool: python}", "def a(ctx) return 1\n")
    with pytest.raises(RecipeError, match=r"steps.py: import failed: SyntaxError"):
        load_recipe_dir(broken)


def test_classify_is_keyword_based_then_hashed(tmp_path: Path) -> None:
    async def classify(text: str, **params) -> str:
        tools = Tools(MockBackend(), tmp_path, {"t": text})
        return await tools.call("llm.classify", input="{t}", **params)

    labels = ["mixed", "praise", "complaint"]
    keywords = {"mixed": ["but"], "praise": ["great"], "complaint": ["slow", "cold"]}
    assert asyncio.run(classify("Great service but slow parking", labels=labels, keywords=keywords)) == "mixed"
    assert asyncio.run(classify("Slow and cold", labels=labels, keywords=keywords)) == "complaint"
    assert asyncio.run(classify("a PRAISE of it", labels=labels)) == "praise"  # default keyword: the label
    fallback = asyncio.run(classify("nothing matches here", labels=labels, keywords=keywords))
    assert fallback == labels[int(hashlib.sha256(b"nothing matches here").hexdigest(), 16) % 3]


def test_rag_query_returns_the_relevant_paragraph() -> None:
    directory = RECIPES / "1.2.0"
    tools = Tools(MockBackend(), directory, {"q": "how to answer a complaint: apologise?"}, digest=directory_digest(directory))
    paragraphs = asyncio.run(tools.call("rag.query", query="{q}", k=2))
    assert 1 <= len(paragraphs) <= 2
    assert paragraphs[0].startswith("Complaint: apologise once")
    assert asyncio.run(tools.call("rag.query", query="zebra xylophone")) == []


def test_policy_moderate_blocks_words(tmp_path: Path) -> None:
    tools = Tools(MockBackend(), tmp_path, {})
    verdict = asyncio.run(tools.call("policy.moderate", text="We guarantee a Refund!", blocked=["refund", "lawsuit"]))
    assert verdict == {"approved": False, "reasons": ["blocked word: refund"], "text": "We guarantee a Refund!"}
    assert asyncio.run(tools.call("policy.moderate", text="Thanks!", blocked=["refund"]))["approved"] is True


async def test_mock_backend_echoes_the_last_line_word_by_word() -> None:
    backend = MockBackend()
    prompt = "system stuff\nReply with:\nThanks for  visiting us\n\n"
    assert [t async for t in backend.stream(prompt)] == ["Thanks ", "for  ", "visiting ", "us"]
    assert await backend.complete(prompt) == "Thanks for  visiting us"
    assert await backend.complete(prompt, max_tokens=2) == "Thanks for  "
    slow = MockBackend(token_delay=0.05)
    started = time.perf_counter()
    await slow.complete("one two three")
    assert time.perf_counter() - started >= 0.14


# --- recipe directories ------------------------------------------------------------------------


def test_digest_is_canonical_stable_and_tracks_content(tmp_path: Path) -> None:
    recipe = write_recipe(tmp_path / "a", "- {id: s, tool: python}", "def s(ctx): return 1\n", files={"knowledge/k.md": "hello\n"})
    digest = directory_digest(recipe)
    expected_lines = sorted(
        f"{p.relative_to(recipe).as_posix()} {hashlib.sha256(p.read_bytes()).hexdigest()}\n"
        for p in recipe.rglob("*")
        if p.is_file()
    )
    assert digest == "sha256:" + hashlib.sha256("".join(expected_lines).encode()).hexdigest()
    assert directory_digest(recipe) == digest

    copy = shutil.copytree(recipe, tmp_path / "elsewhere")
    assert directory_digest(copy) == digest  # location does not count
    (copy / "__pycache__").mkdir()
    (copy / "__pycache__" / "steps.cpython-311.pyc").write_bytes(b"\0junk")
    (copy / "knowledge" / "stray.pyc").write_bytes(b"\0junk")
    assert directory_digest(copy) == digest  # bytecode does not count

    (copy / "knowledge" / "k.md").write_text("hello!\n")
    assert directory_digest(copy) != digest
    (copy / "knowledge" / "k.md").write_text("hello\n")
    assert directory_digest(copy) == digest
    (copy / "knowledge" / "k.md").rename(copy / "knowledge" / "renamed.md")
    assert directory_digest(copy) != digest

    (tmp_path / "a" / "link.md").symlink_to(tmp_path / "a" / "knowledge" / "k.md")
    with pytest.raises(ValueError, match="not a regular file"):
        directory_digest(recipe)


def test_each_load_gets_its_own_module() -> None:
    v12, v13, v12_again = (load_recipe_dir(RECIPES / v) for v in ("1.2.0", "1.3.0", "1.2.0"))
    assert v12.module is not v13.module and v12.module is not v12_again.module
    assert len({v12.module.__name__, v13.module.__name__, v12_again.module.__name__}) == 3
    assert v12.module.SIGN_OFF != v13.module.SIGN_OFF
    assert v12.digest == v12_again.digest != v13.digest
    assert not list(RECIPES.rglob("__pycache__")), "loading a recipe must not write into the registry"


# --- the example registry ----------------------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
async def test_golden_cases_of_example_versions(version: str) -> None:
    recipe = load_recipe_dir(RECIPES / version)
    assert recipe.workflow.metadata.version == version
    cases = load_golden(RECIPES / version)
    assert cases, f"{version} has no golden cases"
    for case in cases:
        if version == "1.4.0":  # deliberately broken: safety_check raises
            with pytest.raises(StepFailed) as failure:
                await run_workflow(recipe, case.input, MockBackend())
            assert failure.value.step == "safety_check"
            continue
        result = await run_workflow(recipe, case.input, MockBackend())
        assert matches(case.expect, result.output), f"{version} {case.name}: {result.output}"


async def test_versions_differ_by_reply_and_speed() -> None:
    outputs = {}
    for version in ("1.2.0", "1.3.0", "1.5.0"):
        result = await run_workflow(load_recipe_dir(RECIPES / version), REVIEW, MockBackend())
        outputs[version] = result
        assert result.output["intent"] == "mixed" and result.output["approved"] is True
        assert result.output["version"] == version
    assert "great service" in outputs["1.2.0"].output["reply"] and "slow parking" in outputs["1.2.0"].output["reply"]
    assert outputs["1.2.0"].output["reply"] != outputs["1.3.0"].output["reply"]
    assert outputs["1.5.0"].timings_ms["draft_reply"] >= 600
    assert outputs["1.2.0"].timings_ms["draft_reply"] < 100
    descriptions = {v: load_recipe_dir(RECIPES / v).workflow.description for v in VERSIONS}
    assert "DELIBERATELY BROKEN" in descriptions["1.4.0"] and "DELIBERATELY SLOW" in descriptions["1.5.0"]
    assert "DELIBERATELY" not in descriptions["1.2.0"] + descriptions["1.3.0"]


def test_matches_is_a_subset_match() -> None:
    assert matches({"a": 1, "b": {"c": [1, 2]}}, {"a": 1, "b": {"c": [1, 2], "d": 0}, "e": 3})
    assert not matches({"a": 1}, {"a": 2})
    assert not matches({"b": {"c": [1]}}, {"b": {"c": [1, 2]}})
    assert not matches({"a": 1}, "a")
