"""Pause, resume, promote and abort a rollout from the web UI, in a real headless Chromium (Debian's
`chromium`, driven by Playwright) against a real plnt (Temporal dev server, git repository,
reconciler, gateway, runner processes). The runners' model is MockBackend, a STAND-IN for a model
server; recipes are signed by the example's test authority, a STAND-IN for Sigstore's public
services. Saves docs/screenshots/rollout-actions.png (overwritten every run) for docs/resources.md."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import SpecRepo
from tests.e2e.harness import running_plnt, settings_for, status_of, wait_for, wait_phase
from tests.ui.test_browser import RUN_FILE, browser, page, shot  # noqa: F401 - the fixtures

pytestmark = pytest.mark.integration

HELD = """\
    steps:
      - {weight: 20, pause: manual}
      - {weight: 60}
"""


@asynccontextmanager
async def held_rollout(spec_repo: SpecRepo, tmp_path: Path, temporal_address: str,
                       temporal_namespace: str) -> AsyncIterator[tuple[Any, str]]:
    """plnt with an admin's and a reader's gateway token, and 1.3.0's canary held at its manual
    first step: (the running plnt, the commit)."""
    tokens = tmp_path / "tokens"
    tokens.write_text("ui-admin-token scopes=invoke,read,admin\nui-reader-token scopes=invoke,read\n")
    settings = settings_for(spec_repo.path, tmp_path / "state", temporal_address, temporal_namespace,
                            gateway_tokens_file=tokens)
    async with running_plnt(settings) as plnt:
        await wait_phase(plnt, "Ready", version="1.2.0")
        spec_repo.replace(RUN_FILE, "review-responder@1.2.0", "review-responder@1.3.0")
        spec_repo.replace(RUN_FILE, "    trafficPercent: 5\n", HELD)
        commit = spec_repo.commit("1.3.0: 20%, held for a person, then 60%")
        plnt.reconciler.wake()  # (what a signed webhook does)
        await wait_for(lambda: "waiting for a person" in (status_of(plnt) or {}).get("message", ""),
                       timeout=60, what=lambda: f"the held step (now: {status_of(plnt)})")
        yield plnt, commit


async def sign_in(page: Any, url: str, token: str) -> None:  # noqa: F811 - the fixture passed in
    await page.goto(f"{url}/ui")
    if await page.locator("button", has_text="Sign out").count():
        await page.get_by_role("button", name="Sign out").click()
    await page.locator("form.signin").wait_for()
    await page.get_by_label("Gateway token").fill(token)
    await page.keyboard.press("Enter")
    await page.locator('tr[data-workflow="default/review-responder"]').wait_for()


async def test_pause_resume_and_abort_from_the_rollout_view(
    spec_repo: SpecRepo, tmp_path: Path, temporal_address: str, temporal_namespace: str, page: Any,  # noqa: F811
) -> None:
    async with held_rollout(spec_repo, tmp_path, temporal_address, temporal_namespace) as (plnt, commit):

        # A reader sees where the rollout is; acting needs the admin scope, and the page says so.
        await sign_in(page, plnt.url, "ui-reader-token")
        await page.goto(f"{plnt.url}/ui#/rollout/default/review-responder")
        where = page.locator("#rollout-state", has_text="waiting for a person")
        await where.wait_for()
        text = await where.inner_text()
        assert "1.3.0 at" in text and commit[:12] in text and "step 1/2" in text, text
        resume = page.locator('#rollout-controls button[data-verb="resume"]')
        assert await resume.is_enabled()
        assert not await page.locator('#rollout-controls button[data-verb="pause"]').is_disabled()
        await resume.click()
        refused = page.locator("#rollout-answer", has_text="admin")
        await refused.wait_for()
        assert "lacks the 'admin' scope" in await refused.inner_text()
        assert "waiting for a person" in status_of(plnt)["message"], "a refused action moved the rollout"

        # An admin pauses it with a reason, then resumes it: 1.3.0 goes on to its next step and is promoted.
        await sign_in(page, plnt.url, "ui-admin-token")
        await page.goto(f"{plnt.url}/ui#/rollout/default/review-responder")
        await page.locator("#rollout-state", has_text="waiting for a person").wait_for()
        await page.locator("#rollout-reason").fill("watching the 20%")
        await page.locator('#rollout-controls button[data-verb="pause"]').click()
        await page.locator("#rollout-answer", has_text="paused").wait_for()
        await page.locator("#rollout-state", has_text="paused by web UI").wait_for()
        assert await page.locator('#rollout-controls button[data-verb="pause"]').is_disabled()
        await shot(page, "rollout-actions.png")
        await page.locator('#rollout-controls button[data-verb="resume"]').click()
        await wait_phase(plnt, "Ready", version="1.3.0", timeout=60)
        people = page.locator("#people-actions")
        await people.locator('li[data-verb="resume"]').wait_for()
        listed = await people.inner_text()
        assert "pause by web UI" in listed and "watching the 20%" in listed and "resume by web UI" in listed, listed
        await page.locator("#outcome", has_text="promoted").wait_for()
        # No controls once the rollout is over (the view may draw the outcome a refresh before).
        await page.locator("#rollout-controls").wait_for(state="detached", timeout=10_000)

        # Back to 1.2.0, held, then aborted (after a confirmation): rolled back with the reason shown.
        spec_repo.replace(RUN_FILE, "review-responder@1.3.0", "review-responder@1.2.0")
        spec_repo.commit("back to 1.2.0")
        plnt.reconciler.wake()  # (what a signed webhook does)
        await page.locator("#rollout-state", has_text="waiting for a person").wait_for(timeout=60_000)
        page.once("dialog", lambda dialog: dialog.accept())
        await page.locator('#rollout-controls button[data-verb="abort"]').click()
        rolled = await wait_phase(plnt, "RolledBack", version="1.3.0", timeout=60)
        assert rolled["lastError"] == "aborted by web UI at step 1/2", rolled
        await page.locator("#rollback-reason", has_text="aborted by web UI at step 1/2").wait_for()


async def test_promote_now_from_the_rollout_view(
    spec_repo: SpecRepo, tmp_path: Path, temporal_address: str, temporal_namespace: str, page: Any,  # noqa: F811
) -> None:
    async with held_rollout(spec_repo, tmp_path, temporal_address, temporal_namespace) as (plnt, commit):
        asked: list[str] = []

        async def confirm(dialog: Any) -> None:
            asked.append(dialog.message)
            await dialog.accept()

        page.on("dialog", confirm)

        # A reader may press Promote now; the saga is not asked, and the page says why.
        await sign_in(page, plnt.url, "ui-reader-token")
        await page.goto(f"{plnt.url}/ui#/rollout/default/review-responder")
        await page.locator("#rollout-state", has_text="waiting for a person").wait_for()
        promote = page.locator('#rollout-controls button[data-verb="promote"]')
        assert await promote.inner_text() == "Promote now" and await promote.is_enabled()
        await promote.click()
        refused = page.locator("#rollout-answer", has_text="admin")
        await refused.wait_for()
        assert "lacks the 'admin' scope" in await refused.inner_text()
        assert asked == [f"Promote 1.3.0 (commit {commit[:12]}) now?"], asked
        assert "waiting for a person" in status_of(plnt)["message"], "a refused promotion moved the rollout"

        # An admin promotes it with a reason: 1.3.0 is promoted from step 1 of 2, its step 2 skipped.
        await sign_in(page, plnt.url, "ui-admin-token")
        await page.goto(f"{plnt.url}/ui#/rollout/default/review-responder")
        await page.locator("#rollout-state", has_text="waiting for a person").wait_for()
        await page.locator("#rollout-reason").fill("hotfix for the parking reviews")
        await page.locator('#rollout-controls button[data-verb="promote"]').click()
        await page.locator("#rollout-answer", has_text="promoting 1.3.0 now").wait_for()
        ready = await wait_phase(plnt, "Ready", version="1.3.0", timeout=60)
        assert ready["canaryVersion"] is None, ready

        # The view after: the promotion and why, the action in "What people did", 1.3.0 Ready.
        await page.locator("#outcome", has_text="promoted").wait_for()
        why = page.locator("#promotion-reason")
        await why.wait_for()
        assert await why.inner_text() == ("1.3.0 promoted; promoted by web UI at step 1/2, skipping what was left "
                                          "of its steps: hotfix for the parking reviews"), await why.inner_text()
        listed = page.locator('#people-actions li[data-verb="promote"]')
        await listed.wait_for()
        text = await listed.inner_text()
        assert text.startswith("promote by web UI") and "hotfix for the parking reviews" in text, text
        assert await page.locator("#people-actions li").count() == 1
        newest = page.locator("nav.past li").first
        await newest.locator(".badge", has_text="Ready").wait_for()
        assert await newest.locator(".rl-version").inner_text() == "1.3.0"
        await page.locator("#rollout-controls").wait_for(state="detached", timeout=10_000)  # over: no controls
        async with httpx.AsyncClient(trust_env=False, timeout=10) as client:
            saga = (await client.get(f"{plnt.url}/workflows/review-responder/history",
                                     headers={"authorization": "Bearer ui-reader-token"})).json()
        steps = [s["step"] for s in saga["steps"]]
        assert "set_canary_traffic" not in steps and steps[-1] == "promote_release", steps
