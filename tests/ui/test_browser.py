"""The web UI (/ui) in a real headless Chromium (Debian's `chromium`, driven by Playwright) against a
real plnt: Temporal dev server, git repository, reconciler, gateway and runner processes.

The runners' model server is the test peer of tests/openai_peer.py (OpenAI wire format, echo replies
like MockBackend), a STAND-IN for a model server: its per-token delay makes a stream's tokens arrive
apart, so the page can be seen filling in. Recipes are signed by the example's test authority, a
STAND-IN for Sigstore's public services. Each test saves
screenshots to docs/screenshots/ (overwritten every run) for docs/observability.md.
"""

from __future__ import annotations

import os
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import SpecRepo
from tests.e2e.harness import hook, running_plnt, settings_for, status_of, wait_phase
from tests.openai_peer import OpenAIPeer

pytestmark = pytest.mark.integration

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SHOTS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"
RUN_FILE = "workflowruns/review-responder.yaml"
POST_RUN_FILE = "workflowruns/post-generator.yaml"
WAIT_MS = 30_000


@pytest.fixture(scope="module")
async def browser() -> AsyncIterator[Any]:
    # Not a skip: CI installs chromium and playwright, so a missing one is a broken setup.
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium with `bash tools/install_test_services.sh` "
                    "(or `sudo apt-get install -y chromium`); `playwright install` is not used")
    try:
        from playwright.async_api import async_playwright
    except ImportError:
        pytest.fail("the Python package playwright is missing: run `.venv/bin/pip install -e '.[test]'`")
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield launched
        await launched.close()


@pytest.fixture
async def page(browser: Any) -> AsyncIterator[Any]:
    context = await browser.new_context(viewport={"width": 1280, "height": 860})
    opened = await context.new_page()
    opened.set_default_timeout(WAIT_MS)
    errors: list[str] = []
    opened.on("pageerror", lambda exc: errors.append(str(exc)))
    yield opened
    await context.close()
    assert errors == [], f"uncaught errors in the page: {errors}"


async def shot(page: Any, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    await page.screenshot(path=str(SHOTS / name), full_page=True)


async def tab_to(page: Any, text: str, limit: int = 60) -> None:
    """From the top of the page (a click on the header), press Tab until the focused element's text
    (or aria-label) is `text`: the element is reachable by keyboard."""
    await page.mouse.click(2, 2)
    for _ in range(limit):
        await page.keyboard.press("Tab")
        focused = await page.evaluate(
            "() => { const e = document.activeElement; return e ? (e.getAttribute('aria-label') || e.textContent || '').trim() : ''; }")
        if focused == text:
            return
    raise AssertionError(f"{text!r} is not reachable with Tab ({limit} presses)")


def add_post_generator(spec_repo: SpecRepo) -> None:
    """A second WorkflowRun whose output step streams tokens (review-responder's output step does not)."""
    text = (spec_repo.path / RUN_FILE).read_text()
    spec_repo.write(POST_RUN_FILE, text.replace("name: review-responder", "name: post-generator")
                    .replace("review-responder@1.2.0", "post-generator@1.0.0"))


async def test_workflows_stream_rollout_gates_and_rollback_in_the_browser(
    spec_repo: SpecRepo, tmp_path: Path, temporal_address: str, temporal_namespace: str, page: Any,
) -> None:
    add_post_generator(spec_repo)
    first_commit = spec_repo.commit("add post-generator")
    peer = OpenAIPeer().start()
    settings = settings_for(spec_repo.path, tmp_path / "state", temporal_address, temporal_namespace,
                            llm_url=peer.url, llm_model="test-model")
    try:
        await _workflows_stream_rollout_gates_and_rollback(spec_repo, settings, peer, first_commit, page)
    finally:
        peer.stop()


async def _workflows_stream_rollout_gates_and_rollback(
    spec_repo: SpecRepo, settings: Any, peer: OpenAIPeer, first_commit: str, page: Any,
) -> None:
    async with running_plnt(settings) as plnt:
        ready = await wait_phase(plnt, "Ready", version="1.2.0")
        await wait_phase(plnt, "Ready", version="1.0.0", name="post-generator")

        # Workflows: review-responder listed Ready with its signer and its verdict against the budget.
        await page.goto(f"{plnt.url}/ui")
        row = page.locator('tr[data-workflow="default/review-responder"][data-phase="Ready"]')
        await row.wait_for()
        signer = ready.get("signer") or "recipes@demo.plnt.invalid"
        assert signer in await row.locator("td.signer").inner_text()
        cells = await row.inner_text()
        assert "1.2.0" in cells and "passed" in cells and "budget 2500 ms" in cells, cells
        assert ready["observedCommit"][:12] in cells
        await page.locator("#live.mode-live").wait_for()
        await shot(page, "workflows.png")

        # Keyboard: every view is reached with Tab and Enter.
        await tab_to(page, "Playground")
        await page.keyboard.press("Enter")
        await page.wait_for_function("() => location.hash === '#/playground'")
        assert await page.locator("h1").inner_text() == "Playground"
        await page.locator("#pg-workflow").wait_for()

        # Playground: the form of post-generator's inputs; the invocation streams in.
        await page.select_option("#pg-workflow", "default/post-generator")
        await page.locator("#in-topic").fill("code review")
        await page.locator("#in-audience").fill("developers")
        # Record what the output shows at each change: tokens must show before the result does.
        await page.evaluate("""() => {
            window.__seen = [];
            const out = document.getElementById('pg-output'), res = document.getElementById('pg-result');
            new MutationObserver(() => window.__seen.push([out.textContent.length, res.textContent.length]))
              .observe(out, {childList: true, characterData: true, subtree: true});
        }""")
        peer.configure(token_delay=0.03)  # ~30 tokens per LLM step: the post streams for about a second
        await page.locator("#pg-run").focus()
        await page.keyboard.press("Enter")
        await page.wait_for_function("() => document.getElementById('pg-result').textContent.length > 0")
        peer.reset()
        output = await page.locator("#pg-output").inner_text()
        assert output.startswith("Code review for developers, explained."), output
        seen = await page.evaluate("() => window.__seen")
        before_result = [length for length, result in seen if result == 0]
        assert len(before_result) >= 5 and before_result == sorted(before_result) and before_result[0] > 0, \
            f"the output did not grow token by token before the result: {seen}"
        pieces = int((await page.locator("#pg-chunks").inner_text()).split()[0])
        assert pieces >= 5, pieces  # one per token event of the stream
        assert await page.locator("#pg-version").inner_text() == "1.0.0"
        assert await page.locator("#pg-track-used").inner_text() == "stable"
        assert await page.locator("#pg-status").inner_text() == "200"
        log_row = page.locator("#calls-table tbody tr").first
        await log_row.wait_for()
        assert "post-generator" in await log_row.inner_text()
        await shot(page, "playground.png")
        # Chat through /v1/chat/completions (stream: true) with the model picked from GET /v1/models,
        # pinned to the stable track (X-Plnt-Track).
        await page.locator("label", has_text="Chat (/v1/chat/completions)").click()
        await page.locator("#pg-model option[value='review-responder']").wait_for(state="attached")
        await page.select_option("#pg-model", "review-responder")
        await page.select_option("#pg-track", "stable")
        await page.locator("#pg-message").fill("Great service but slow parking")
        await page.locator("#pg-run").click()
        await page.locator("#pg-meta", has_text="done").wait_for()
        assert await page.locator("#pg-status").inner_text() == "200"
        assert await page.locator("#pg-track-used").inner_text() == "stable"
        assert "parking" in await page.locator("#pg-output").inner_text()

        # Rollout view of review-responder, left open while a commit rolls out 1.3.0.
        await tab_to(page, "Workflows")
        await page.keyboard.press("Enter")
        await row.wait_for()
        await tab_to(page, "Rollout of review-responder")
        await page.keyboard.press("Enter")
        await page.wait_for_function("() => location.hash === '#/rollout/default/review-responder'")
        await page.locator("#outcome", has_text="promoted").wait_for()
        # A second tab on the workflows view: it must update without a reload.
        watcher = await page.context.new_page()
        await watcher.goto(f"{plnt.url}/ui#/workflows")
        await watcher.locator('tr[data-workflow="default/review-responder"]').wait_for()
        await watcher.evaluate("() => { window.__sameDocument = true; }")

        spec_repo.replace(RUN_FILE, "review-responder@1.2.0", "review-responder@1.3.0")
        promoted_commit = spec_repo.commit("review-responder 1.3.0")
        await hook(plnt)
        status = await wait_phase(plnt, "Ready", version="1.3.0")
        metrics = status["smokeTest"]["metrics"]
        timeline = page.locator("ol.timeline")
        await timeline.locator('[data-step="Canary"]', has_text="1.3.0").wait_for()
        await page.locator("#outcome", has_text="promoted").wait_for()
        assert promoted_commit[:12] in await timeline.locator('[data-step="Commit"]').inner_text()
        assert signer in await timeline.locator('[data-step="Verification"]').inner_text()
        p95 = await page.locator('#gates tr[data-gate="p95"]').inner_text()
        assert f"{round(metrics['p95_ms'], 2):g} ms" in p95 and "2500 ms" in p95 and "within budget" in p95, p95
        errors = await page.locator('#gates tr[data-gate="errors"]').inner_text()
        assert "0 %" in errors and "1 %" in errors and "within budget" in errors, errors
        smoke_step = await timeline.locator('[data-step="Smoke gates"] .stepinfo').inner_text()
        assert re.search(r"completed \d+(\.\d)? m?s · 1 attempt", smoke_step), smoke_step
        assert await page.locator("nav.past li").count() >= 2, "both rollouts are listed"
        # The saga closes just after its Ready phase: the list follows it without a reload.
        await page.locator("nav.past li").first.locator(".badge", has_text="Ready").wait_for()
        await shot(page, "rollout.png")
        new_row = watcher.locator('tr[data-workflow="default/review-responder"]')
        await new_row.locator("td", has_text="1.3.0").first.wait_for()
        assert await watcher.evaluate("() => window.__sameDocument === true"), "the workflows view reloaded"

        # 1.4.0 is deliberately broken: the rollout shows RolledBack and the reason.
        spec_repo.replace(RUN_FILE, "review-responder@1.3.0", "review-responder@1.4.0")
        spec_repo.commit("review-responder 1.4.0")
        await hook(plnt)
        rolled = await wait_phase(plnt, "RolledBack", version="1.3.0")
        assert "error rate 100%" in rolled["lastError"]
        await page.locator("#outcome", has_text="rolled back").wait_for()
        reason = await page.locator("#rollback-reason").inner_text()
        assert "error rate 100%" in reason, reason
        assert "over budget" in await page.locator('#gates tr[data-gate="errors"]').inner_text()
        await watcher.locator('tr[data-workflow="default/review-responder"][data-phase="RolledBack"]').wait_for()
        assert "error rate 100%" in await watcher.locator('tr[data-workflow="default/review-responder"]').inner_text()
        await shot(page, "rollback.png")
        # The promoted rollout stays one click away in the list of past rollouts.
        await page.locator("nav.past a", has_text="1.3.0").first.click()
        await page.locator("#outcome", has_text="promoted").wait_for()
        await watcher.close()

        # Plan preview: the comment's Markdown rendered (tables, code, bold), nothing left raw.
        await tab_to(page, "Plan preview")
        await page.keyboard.press("Enter")
        await page.locator("#plan-base option").first.wait_for(state="attached")
        await page.select_option("#plan-base", first_commit)
        await page.locator("#plan-show").click()
        plan = page.locator("#plan-out .md")
        await plan.locator("td code", has_text="default/review-responder").wait_for()
        text = await plan.inner_text()
        assert "1 to upgrade" in text and "1.2.0 -> 1.4.0" in text, text
        assert await plan.locator("strong", has_text="upgrade").count() == 1
        assert "**" not in text and "`" not in text, text
        await shot(page, "plan.png")
        # Markup inside a plan (spec values are the repository's text) stays text: the renderer
        # builds elements for the Markdown subset only, and never parses HTML.
        rendered = await page.evaluate("""async () => {
            const { renderMarkdown } = await import('/ui/markdown.js');
            const el = renderMarkdown('### <img src=x onerror=alert(1)>\\n\\n| a | b |\\n|---|---|\\n' +
                                      '| <script>x</script> | `<b>` **<i>y</i>** a\\\\|b<br>c |');
            return { tags: [...el.querySelectorAll('*')].map((e) => e.tagName.toLowerCase()), text: el.textContent };
        }""")
        assert set(rendered["tags"]) == {"h3", "table", "thead", "tbody", "tr", "th", "td", "code", "strong", "br"}, rendered
        assert "<img src=x onerror=alert(1)>" in rendered["text"] and "<i>y</i>" in rendered["text"], rendered
        assert "a|b" in rendered["text"], rendered
        assert status_of(plnt)["phase"] == "RolledBack"


async def test_with_tokens_the_page_asks_for_one_then_shows_what_it_may_see(
    spec_repo: SpecRepo, tmp_path: Path, temporal_address: str, temporal_namespace: str, page: Any,
) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("ui-reader-token scopes=invoke,read\nui-invoke-token scopes=invoke\n")
    settings = settings_for(spec_repo.path, tmp_path / "state", temporal_address, temporal_namespace,
                            gateway_tokens_file=tokens)
    async with running_plnt(settings) as plnt:
        await wait_phase(plnt, "Ready", version="1.2.0")
        await page.goto(f"{plnt.url}/ui")
        form = page.locator("form.signin")
        await form.wait_for()
        assert "Unauthorised (401)" in await form.inner_text()
        assert await page.locator("#workflows-table").count() == 0, "no data without a token"
        assert await page.evaluate("() => document.activeElement.id") == "token", "the token field has focus"
        await shot(page, "signin.png")

        # A wrong token: asked again, with the gateway's reason.
        await page.get_by_label("Gateway token").fill("not-a-token")
        await page.keyboard.press("Enter")
        await page.locator("form.signin", has_text="rejected this token").wait_for()
        assert "invalid bearer token" in await page.locator("form.signin").inner_text()

        await page.get_by_label("Gateway token").fill("ui-reader-token")
        await page.keyboard.press("Enter")
        await page.locator('tr[data-workflow="default/review-responder"][data-phase="Ready"]').wait_for()
        # Kept for the tab (sessionStorage): a reload shows data without asking again.
        await page.reload()
        await page.locator('tr[data-workflow="default/review-responder"]').wait_for()
        assert await page.locator("form.signin").count() == 0

        # A token without the read scope: the rollout view says it is forbidden, and why.
        await page.get_by_role("button", name="Sign out").click()
        await page.locator("form.signin").wait_for()
        await page.get_by_label("Gateway token").fill("ui-invoke-token")
        await page.keyboard.press("Enter")
        await page.locator('tr[data-workflow="default/review-responder"]').wait_for()
        await page.goto(f"{plnt.url}/ui#/rollout/default/review-responder")
        forbidden = page.locator(".rollout .problem", has_text="Forbidden")
        await forbidden.wait_for()
        assert "read" in await forbidden.inner_text()

        # The network gone (Chromium's offline emulation: requests fail as with no route to the
        # gateway): the page says the gateway is unreachable instead of showing stale data.
        await page.evaluate("() => { location.hash = '#/workflows'; }")
        await page.locator('tr[data-workflow="default/review-responder"]').wait_for()
        await page.context.set_offline(True)
        await page.evaluate("() => { location.hash = '#/rollout/default/review-responder'; }")
        await page.locator(".rollout .problem", has_text="Gateway unreachable").wait_for()
        await page.context.set_offline(False)
