"""The web UI's API on a real plnt: the rows' signer/rollout/budget/inputs, past rollouts and one
rollout's timeline from Temporal's history, the plan preview (the same markdown as `plnt plan`),
X-Plnt-Track, and the invocation log merged over gateway worker processes.

Real Temporal server, real git repository, real runner processes, real gateway (and its worker
processes). The runners' model is MockBackend (`--backend mock`), a STAND-IN for a model server."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from tests.conftest import SpecRepo
from tests.e2e.harness import REVIEW, hook, running_plnt, settings_for, wait_for, wait_phase

pytestmark = pytest.mark.integration

RUN_FILE = "workflowruns/review-responder.yaml"
NAME = "review-responder"
BUDGET = {"invocations": 10, "p95BudgetMs": 2500, "errorBudgetPercent": 1}  # the example's canary.smokeTest


async def test_rows_rollouts_timeline_plan_and_track_of_a_promotion_and_a_rollback(
    spec_repo: SpecRepo, tmp_path: Path, temporal_address: str, temporal_namespace: str
) -> None:
    first = spec_repo.git("rev-parse", "HEAD")
    settings = settings_for(spec_repo.path, tmp_path / "state", temporal_address, temporal_namespace,
                            gateway_workers=1)
    async with running_plnt(settings) as plnt, httpx.AsyncClient(base_url=plnt.url, trust_env=False,
                                                                 timeout=30) as client:
        ready = await wait_phase(plnt, "Ready", version="1.2.0")
        row = next(r for r in (await client.get("/workflows")).json() if r["name"] == NAME)
        assert row == {**row, "signer": ready["signer"], "inputs": ["review", "brand_voice"]}
        assert row["smokeBudget"] == {**row["smokeBudget"], **BUDGET}
        assert row["signer"] and row["signer"].endswith(")") and " (" in row["signer"], row
        assert row["rollout"]["commit"] == first and row["rollout"]["phase"] == "Ready" and row["rollout"]["at"] > 0

        # A commit whose canary errors: rolled back.
        spec_repo.replace(RUN_FILE, "review-responder@1.2.0", "review-responder@1.4.0")
        second = spec_repo.commit("try 1.4.0")
        await hook(plnt)
        await wait_phase(plnt, "RolledBack", version="1.2.0", timeout=60)

        # Past rollouts, newest first (Temporal's visibility list may lag a moment).
        async def two() -> list[dict[str, Any]] | None:
            got = await client.get(f"/workflows/{NAME}/rollouts", params={"namespace": "default"})
            rows = got.json() if got.status_code == 200 else []
            return rows if len(rows) == 2 and all(r["status"] == "COMPLETED" for r in rows) else None

        rollouts = await wait_for(two, timeout=20, what="two completed rollouts")
        newest, oldest = rollouts
        assert newest == {**newest, "commit": second, "version": "1.4.0", "phase": "RolledBack", "action": "deploy"}
        assert "error rate" in newest["reason"] and newest["durationMs"] > 0 and newest["closedAt"]
        assert oldest == {**oldest, "commit": first, "version": "1.2.0", "phase": "Ready"}
        assert newest["startedAt"] > oldest["startedAt"]
        assert (await client.get(f"/workflows/{NAME}/rollouts", params={"limit": 1})).json()[0]["runId"] == \
            newest["runId"]
        missing = await client.get("/workflows/nobody/rollouts")
        assert missing.status_code == 404 and "no saga has run for default/nobody" in missing.text

        # One rollout's timeline: the older run by its id, the newest without one.
        promoted = (await client.get(f"/workflows/{NAME}/history", params={"run": oldest["runId"]})).json()
        assert promoted["run_id"] == oldest["runId"]
        assert promoted == {**promoted, "commit": first, "version": "1.2.0", "phase": "Ready",
                            "signer": row["signer"]}
        assert promoted["budget"] == {**promoted["budget"], **BUDGET}
        assert promoted["smoke"]["passed"] is True and promoted["smoke"]["metrics"]["invocations"] == 10
        steps = {s["step"]: s for s in promoted["steps"]}
        assert list(steps) == ["validate", "pull_recipe", "install_release", "smoke_test", "promote_release"]
        assert steps["pull_recipe"]["detail"]["digest"].startswith("sha256:")
        assert steps["pull_recipe"]["detail"]["signer"] == row["signer"]
        assert steps["pull_recipe"]["detail"]["inputs"] == ["review", "brand_voice"]
        assert steps["smoke_test"]["detail"]["metrics"]["p95_ms"] >= 0
        assert "endpoint" not in json.dumps(steps["install_release"]["detail"])
        rolled = (await client.get(f"/workflows/{NAME}/history")).json()
        assert rolled["run_id"] == newest["runId"] and rolled["phase"] == "RolledBack"
        assert rolled["smoke"]["passed"] is False and "error rate" in rolled["reason"]
        unknown_run = await client.get(f"/workflows/{NAME}/history", params={"run": "0" * 36})
        assert unknown_run.status_code == 404

        # No canary under test now: the playground's "canary" pick is refused, "stable" served.
        forced = await client.post(f"/workflows/{NAME}/invoke", json=REVIEW, headers={"x-plnt-track": "canary"})
        assert forced.status_code == 409 and forced.json()["error"]["type"] == "no_canary", forced.text
        stable = await client.post(f"/workflows/{NAME}/invoke", json=REVIEW, headers={"x-plnt-track": "stable"})
        assert stable.status_code == 200 and stable.headers["x-plnt-version"] == "1.2.0"

        # The plan preview: the branch's revisions, and the same markdown `plnt plan` prints.
        revisions = (await client.get("/plan/revisions", params={"limit": 5})).json()
        assert [(r["commit"], r["subject"]) for r in revisions] == [(second, "try 1.4.0"), (first, "initial specs")]
        assert revisions[0]["short"] == second[:len(revisions[0]["short"])] and revisions[0]["at"] > 0
        plan = await client.get("/plan", params={"base": first[:10], "head": second})
        assert plan.status_code == 200, plan.text
        body = plan.json()
        assert body["base"] == first and body["head"] == second
        assert body["title"] == f"plnt plan {first[:12]}..{second[:12]}"
        assert [(i["action"], i["name"], i["fromVersion"], i["toVersion"]) for i in body["items"]] == \
            [("upgrade", NAME, "1.2.0", "1.4.0")], body
        printed = await asyncio.to_thread(CliRunner().invoke, _cli(), [
            "plan", "--repo", str(spec_repo.path), "--base", first, "--head", second, "--format", "markdown",
            "--no-cache"])
        assert printed.exit_code == 0, printed.output
        assert body["markdown"] == printed.stdout
        bad = await client.get("/plan", params={"base": "no-such-rev", "head": second})
        assert bad.status_code == 400 and "no-such-rev" in bad.json()["error"]["message"]
        option = await client.get("/plan", params={"base": "--upload-pack=x", "head": second})
        assert option.status_code == 400


def _cli() -> Any:
    from plnt.reconciler.cli.main import app

    return app


async def test_calls_merge_every_gateway_process(
    spec_repo: SpecRepo, tmp_path: Path, temporal_address: str, temporal_namespace: str
) -> None:
    from tests.e2e.test_gateway_workers import pinned_clients

    settings = settings_for(spec_repo.path, tmp_path / "state", temporal_address, temporal_namespace,
                            gateway_workers=3)
    async with running_plnt(settings) as plnt:
        await wait_phase(plnt, "Ready", version="1.2.0")
        clients = await pinned_clients(plnt.url, 3)
        try:
            assert sorted(clients) == [1, 2, 3]
            for index, client in clients.items():  # one call per worker, each with its own session
                response = await client.post(f"/workflows/{NAME}/invoke", json=REVIEW,
                                             headers={"x-session-id": f"w{index}"})
                assert response.status_code == 200, response.text
            wrong = await clients[2].post("/workflows/nobody/invoke", json=REVIEW)
            assert wrong.status_code == 404

            async def merged() -> list[dict[str, Any]] | None:
                calls = (await clients[1].get("/calls", params={"limit": 50})).json()
                return calls if len(calls) == 4 else None

            calls = await wait_for(merged, timeout=20, what="the 4 calls of 3 workers in one log")
            assert [c["at"] for c in calls] == sorted((c["at"] for c in calls), reverse=True)
            assert calls[0] == {**calls[0], "workflow": "", "code": 404, "errorType": "not_found", "api": "invoke"}
            assert [(c["workflow"], c["version"], c["track"], c["code"]) for c in calls[1:]] == \
                [(NAME, "1.2.0", "stable", 200)] * 3
            # Pushed by the worker that served it, whichever process is asked (bounded wait: a loaded
            # machine may delay the push; its cadence is calls.PUSH_S).
            await clients[3].post(f"/workflows/{NAME}/invoke", json=REVIEW)

            async def fifth() -> bool:
                return len((await clients[2].get("/calls")).json()) == 5

            await wait_for(fifth, timeout=20, what="the fifth call in the merged log")
        finally:
            for client in clients.values():
                await client.aclose()
