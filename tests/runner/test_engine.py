"""The runner's engine, tools, recipe loading and digest, and the example registry's golden cases.

Every model call here goes to MockBackend (plnt.runner.adapters: the reply is the prompt's last
line), a STAND-IN for a model server."""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import shutil
from pathlib import Path

import pytest
from plnt.core.recipe import RecipeError, directory_digest, matches
from plnt.runner.adapters import MockBackend
from plnt.runner.engine import InvalidInput, StepFailed, check_inputs, required_inputs, run_workflow
from plnt.runner.recipe import Recipe, load_recipe_dir
from plnt.runner.tools import Tools

from tests.runner.helpers import EXAMPLE_RECIPES, write_recipe

RECIPES = Path(__file__).resolve().parents[2] / "gitops-example" / "recipes" / "review-responder"
VERSIONS = ["1.2.0", "1.3.0", "1.4.0", "1.5.0"]
REVIEW = {"review": "Great service but slow parking", "brand_voice": "warm, brief"}


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
    """Overlap is shown by the steps' own intervals (an ordering), not by a wall-clock budget."""
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
    result = await run(recipe)
    (l_start, l_end), (r_start, r_end) = result.output
    assert l_start < r_end and r_start < l_end, "left and right did not overlap"
    # The engine's timing of a step covers the step's own interval (rounded to the microsecond).
    assert result.timings_ms["left"] >= (l_end - l_start) * 1000 - 0.001
    assert result.timings_ms["right"] >= (r_end - r_start) * 1000 - 0.001


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
            try:
                await asyncio.sleep(2); DONE.append("slow_sibling")
            except asyncio.CancelledError:
                DONE.append("cancelled"); raise
        def boom(ctx): raise ValueError("no such customer")
        def after(ctx): DONE.append("after")
        """,
    )
    loaded = load_recipe_dir(recipe)
    with pytest.raises(StepFailed) as failure:
        await run_workflow(loaded, {}, MockBackend())
    assert failure.value.step == "boom"
    assert "boom" in str(failure.value) and "ValueError: no such customer" in str(failure.value)
    assert loaded.module.DONE == ["cancelled"], "the sibling step was not cancelled (or not awaited)"


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
    """A field the body lacks is the client's mistake (InvalidInput naming it); a step id used
    before that step finished (no dependency declared) is the recipe's (StepFailed)."""
    recipe = write_recipe(tmp_path, "- {id: gen, tool: llm.generate, params: {prompt: 'hi {nobody}'}}")
    with pytest.raises(InvalidInput, match=r"missing input 'nobody': step 'gen' uses \{nobody\}") as missing:
        await run(recipe, {"somebody": 1})
    assert (missing.value.field, missing.value.step) == ("nobody", "gen")
    racing = write_recipe(tmp_path / "racing", "- {id: a, tool: llm.generate, params: {prompt: 'x {b}'}}\n"
                                               "- {id: b, tool: llm.generate, params: {prompt: 'y'}}")
    with pytest.raises(StepFailed, match=r"\{b\} is neither an input nor a finished step"):
        await run(racing, {})


def test_required_inputs_come_from_the_templates_the_bindings_render(tmp_path: Path) -> None:
    recipe = write_recipe(tmp_path, "- {id: a, tool: llm.classify, params: {input: '{review}', labels: ['{x}']}}\n"
                                    "- {id: b, tool: llm.generate, deps: [a], params: {prompt: '{a} {voice[tone]}', "
                                    "system: '{review} {0}'}}")
    recipe = load_recipe_dir(recipe)
    assert required_inputs(recipe) == ("review", "voice")  # not labels, not the step id, not positional
    check_inputs(("review",), {"review": ""})
    with pytest.raises(InvalidInput, match=r"missing input 'review'.*\(missing: review, voice\)") as missing:
        check_inputs(required_inputs(recipe), {})
    assert missing.value.field == "review"
    example = load_recipe_dir(RECIPES / "1.2.0")  # its module's steps are left out: only classify_intent's
    assert required_inputs(example) == ("review", "brand_voice")


def test_workflow_yaml_problems_are_named_at_file_and_line(tmp_path: Path) -> None:
    """The runner reads workflow.yaml with the spec loader of plnt.core, as plnt does: the same
    FILE:LINE problem either way (there is no second, line-less parser in the runner any more)."""
    assert load_recipe_dir(RECIPES / "1.2.0").workflow.steps[0].id == "classify_intent"
    with pytest.raises(RecipeError, match=r"workflow.yaml:\d+: steps\[0\]\.tool: Input should be .*\(got 'llm.summarize'\)"):
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


async def test_mock_backend_echoes_the_last_line_word_by_word(monkeypatch: pytest.MonkeyPatch) -> None:
    """MockBackend is the model stand-in itself; its token delay is checked with asyncio.sleep
    replaced by a recorder (counts the waits instead of timing them)."""
    backend = MockBackend()
    prompt = "system stuff\nReply with:\nThanks for  visiting us\n\n"
    assert [t async for t in backend.stream(prompt)] == ["Thanks ", "for  ", "visiting ", "us"]
    assert await backend.complete(prompt) == "Thanks for  visiting us"
    assert await backend.complete(prompt, max_tokens=2) == "Thanks for  "
    slept: list[float] = []
    real_sleep = asyncio.sleep
    this_test = asyncio.current_task()

    async def recording_sleep(delay: float) -> None:
        # (the loop is shared by the session: other tests' background tasks sleep on it too)
        if asyncio.current_task() is this_test:
            slept.append(delay)
            delay = 0
        await real_sleep(delay)

    monkeypatch.setattr(asyncio, "sleep", recording_sleep)
    slow = MockBackend(token_delay=0.05)
    assert await slow.complete("one two three") == "one two three"
    assert slept == [0.05, 0.05, 0.05]  # one wait before each token


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


async def test_versions_differ_by_reply_and_speed(monkeypatch: pytest.MonkeyPatch) -> None:
    """asyncio.sleep is replaced by a recorder: 1.5.0's slowness is the wait its steps ask for,
    counted, not timed (and the test does not wait it out). Only the workflow's own sleeps count:
    those in this test's context (its tasks inherit it), not another thread's or a leftover task's."""
    slept: dict[str, list[float]] = {}
    real_sleep = asyncio.sleep
    recording: contextvars.ContextVar[bool] = contextvars.ContextVar("recording", default=False)
    recording.set(True)

    async def recording_sleep(delay: float) -> None:
        if delay > 0 and recording.get():
            slept[version].append(delay)
        await real_sleep(0)

    monkeypatch.setattr(asyncio, "sleep", recording_sleep)
    outputs = {}
    for version in ("1.2.0", "1.3.0", "1.5.0"):
        slept[version] = []
        result = await run_workflow(load_recipe_dir(RECIPES / version), REVIEW, MockBackend())
        outputs[version] = result
        assert result.output["intent"] == "mixed" and result.output["approved"] is True
        assert result.output["version"] == version
    assert "great service" in outputs["1.2.0"].output["reply"] and "slow parking" in outputs["1.2.0"].output["reply"]
    assert outputs["1.2.0"].output["reply"] != outputs["1.3.0"].output["reply"]
    assert slept == {"1.2.0": [], "1.3.0": [], "1.5.0": [0.6]}  # DELIBERATELY SLOW: 0.6 s in draft_reply
    descriptions = {v: load_recipe_dir(RECIPES / v).workflow.description for v in VERSIONS}
    assert "DELIBERATELY BROKEN" in descriptions["1.4.0"] and "DELIBERATELY SLOW" in descriptions["1.5.0"]
    assert "DELIBERATELY" not in descriptions["1.2.0"] + descriptions["1.3.0"]


def test_matches_is_a_subset_match() -> None:
    assert matches({"a": 1, "b": {"c": [1, 2]}}, {"a": 1, "b": {"c": [1, 2], "d": 0}, "e": 3})
    assert not matches({"a": 1}, {"a": 2})
    assert not matches({"b": {"c": [1]}}, {"b": {"c": [1, 2]}})
    assert not matches({"a": 1}, "a")


# --- streaming: the token sink ------------------------------------------------------------------


class Collect:
    """A sink callback that records (step, text) in order."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    def __call__(self, step: str, text: str) -> None:
        self.events.append((step, text))

    @property
    def text(self) -> str:
        return "".join(text for _, text in self.events)


async def test_output_llm_generate_streams_its_tokens_and_other_steps_do_not(tmp_path: Path) -> None:
    recipe = write_recipe(
        tmp_path,
        """
        - {id: first, tool: llm.generate, params: {prompt: "x\\nnot streamed here"}}
        - {id: last, tool: llm.generate, deps: [first], params: {prompt: "{first}\\nstreamed words here"}}
        """,
    )
    sink = Collect()
    result = await run_workflow(load_recipe_dir(recipe), {}, MockBackend(), sink=sink)
    assert sink.events == [("last", "streamed "), ("last", "words "), ("last", "here")]
    assert result.output == "streamed words here" == sink.text
    assert result.results["first"] == "not streamed here"


async def test_module_step_streams_with_ctx_stream_emit_or_an_async_iterator(tmp_path: Path) -> None:
    module = """
        import asyncio

        async def via_stream(ctx):
            tokens = [t async for t in ctx.stream("llm.generate", prompt="p\\nalpha beta")]
            ctx.emit("!")
            return {"text": "".join(tokens), "streaming": ctx.streaming}

        async def via_generator(ctx):
            for word in ("gamma ", "delta"):
                await asyncio.sleep(0)
                yield word

        def via_thread(ctx):  # a sync step: emit is called from its worker thread
            for word in ("eps ", "ilon"):
                ctx.emit(word)
            return "epsilon"
    """
    for output, expected_tokens, expected_output in [
        ("via_stream", ["alpha ", "beta", "!"], {"text": "alpha beta", "streaming": True}),
        ("via_generator", ["gamma ", "delta"], "gamma delta"),
        ("via_thread", ["eps ", "ilon"], "epsilon"),
    ]:
        recipe = write_recipe(
            tmp_path / output,
            f"- {{id: {output}, tool: python}}",
            module,
        )
        sink = Collect()
        result = await run_workflow(load_recipe_dir(recipe), {}, MockBackend(), sink=sink)
        assert [text for _, text in sink.events] == expected_tokens
        assert {step for step, _ in sink.events} == {output}
        assert result.output == expected_output
        # the same steps without a client: same result, nothing emitted anywhere
        plain = await run_workflow(load_recipe_dir(recipe), {}, MockBackend())
        expected_plain = {**expected_output, "streaming": False} if isinstance(expected_output, dict) else expected_output
        assert plain.output == expected_plain


async def test_max_tokens_caps_only_the_output_step(tmp_path: Path) -> None:
    recipe = write_recipe(
        tmp_path,
        """
        - {id: a, tool: llm.generate, params: {prompt: "one two three four"}}
        - {id: b, tool: llm.generate, deps: [a], params: {prompt: "{a}", maxTokens: 3}}
        """,
    )
    result = await run_workflow(load_recipe_dir(recipe), {}, MockBackend(), max_tokens=2)
    assert result.results["a"] == "one two three four"
    assert result.output == "one two "
    result = await run_workflow(load_recipe_dir(recipe), {}, MockBackend(), max_tokens=10)
    assert result.output == "one two three "  # the step's own maxTokens still holds


# --- the step cache ----------------------------------------------------------------------------


async def test_step_cache_hits_on_repeat_and_keys_on_inputs_and_deps(tmp_path: Path) -> None:
    from plnt.runner.cache import StepCache

    recipe = load_recipe_dir(write_recipe(
        tmp_path,
        """
        - {id: label, tool: llm.classify, params: {labels: [a, b], input: "{x}"}}
        - {id: gen, tool: llm.generate, params: {prompt: "{x}"}}
        - {id: mod, tool: python, deps: [label]}
        - {id: nocache, tool: python, params: {cache: false}}
        """,
        """
        CALLS = []
        def mod(ctx):
            CALLS.append("mod"); return {"seen": ctx.results["label"]}
        def nocache(ctx):
            CALLS.append("nocache"); return 1
        """,
    ))
    cache = StepCache(16)
    first = await run_workflow(recipe, {"x": "b b"}, MockBackend(), cache=cache)
    assert (first.cache_hits, first.cache_misses, first.cached) == (0, 2, set())
    second = await run_workflow(recipe, {"x": "b b"}, MockBackend(), cache=cache)
    assert (second.cache_hits, second.cache_misses, second.cached) == (2, 0, {"label", "mod"})
    assert second.output == first.output and second.results["mod"] == {"seen": "b"}
    assert sorted(recipe.module.CALLS) == ["mod", "nocache", "nocache"]
    second.results["mod"]["seen"] = "mutated"  # a result handed out is a copy
    third = await run_workflow(recipe, {"x": "a"}, MockBackend(), cache=cache)  # other inputs: other keys
    assert (third.cache_hits, third.cache_misses) == (0, 2)
    assert (await run_workflow(recipe, {"x": "b b"}, MockBackend(), cache=cache)).results["mod"] == {"seen": "b"}
    assert cache.stats() == {"hits": 4, "misses": 4, "hitRate": 0.5, "size": 4, "capacity": 16}


def test_step_cache_is_a_bounded_lru() -> None:
    from plnt.runner.cache import MISSING, StepCache

    cache = StepCache(2)
    cache.put(("d", "s", "1"), 1)
    cache.put(("d", "s", "2"), 2)
    assert cache.get(("d", "s", "1")) == 1  # 1 is now the most recent
    cache.put(("d", "s", "3"), 3)  # evicts 2, the least recently used
    assert cache.get(("d", "s", "2")) is MISSING
    assert cache.get(("d", "s", "1")) == 1 and cache.get(("d", "s", "3")) == 3
    assert len(cache) == 2 and cache.stats()["size"] == 2
    off = StepCache(0)
    off.put(("d", "s", "1"), 1)
    assert len(off) == 0 and not off.enabled


async def test_a_streamed_output_step_is_never_cached(tmp_path: Path) -> None:
    from plnt.runner.cache import StepCache

    recipe = load_recipe_dir(write_recipe(
        tmp_path,
        "- {id: out, tool: python}",
        """
        CALLS = []
        async def out(ctx):
            CALLS.append(1)
            ctx.emit("hello")
            return "hello"
        """,
    ))
    cache = StepCache(16)
    await run_workflow(recipe, {}, MockBackend(), cache=cache)
    assert (await run_workflow(recipe, {}, MockBackend(), cache=cache)).cached == {"out"}  # JSON: cached
    sink = Collect()
    streamed = await run_workflow(recipe, {}, MockBackend(), cache=cache, sink=sink)
    assert sink.text == "hello" and streamed.cached == set() and (streamed.cache_hits, streamed.cache_misses) == (0, 0)
    assert len(recipe.module.CALLS) == 2


def test_rag_query_scores_with_bm25_and_stems() -> None:
    from plnt.runner.tools import stem

    assert {stem(w) for w in ("cancel", "cancelling", "cancellations")} == {"cancel"}
    assert stem("booked") == stem("booking") == "book" and stem("less") == "less"
    directory = EXAMPLE_RECIPES / "booking-triage" / "1.0.0"
    tools = Tools(MockBackend(), directory, {"q": "Please cancel my table for tomorrow"}, digest=directory_digest(directory))
    paragraphs = asyncio.run(tools.call("rag.query", query="{q}", k=2))
    assert paragraphs[0].startswith("Cancellations:")
    # a rare term outweighs a frequent one (idf): "dogs" finds the pets policy among many "booking"s
    assert asyncio.run(tools.call("rag.query", query="booking with dogs", k=1))[0].startswith("Pets:")
