"""--require-approval on a running plnt: real git, real Temporal, real runners (mock model backend,
a stand-in for a model server), real signed recipes verified for real, and the DECLARED forge
stand-in (tests/forge_standin.py, GitHub REST shapes; not a live forge).

The `plnt/plan` status is posted the way `plnt review` posts it in a PR's CI job: the digest is
computed from a CI clone of the PR branch with the same functions (loader.load_sources,
plan.plan, plan_digest.recipe_evidence and plan_digest.digest_of, through
approval.plan_digest_between on the PR's merge base and head), and written through the forge
client's set_status with `plnt review`'s description "plan sha256:<12 hex>: <counts>".

How the test starts: the example repository's first commit was pushed directly (no PR), as a
repository's first commit usually is. It is held, so nothing deploys. Nothing being reconciled
yet, the next head is judged alone (its history is the starting point an operator accepts by
turning plnt on): the merge of an approved PR deploys.
"""

from __future__ import annotations

import logging
from pathlib import Path

import httpx
import pytest
from plnt.reconciler.approval import plan_digest_between
from plnt.reconciler.forge import make_forge
from plnt.reconciler.plan_digest import STATUS_CONTEXT, short
from plnt.reconciler.recipes import RecipeCache
from plnt.reconciler.registries import RegistryOptions
from plnt.reconciler.source import GitSource
from pydantic import SecretStr

from ..conftest import SpecRepo
from ..forge_standin import ForgeStandin
from .harness import hook, invoke, running_plnt, settings_for, status_of, wait_for, wait_phase

pytestmark = pytest.mark.integration

RUN_FILE = "workflowruns/review-responder.yaml"
TOKEN = "forge-token-e2e-approval"


async def get_source(url: str) -> dict:  # type: ignore[type-arg]
    async with httpx.AsyncClient(trust_env=False) as client:
        response = await client.get(f"{url}/source")
        response.raise_for_status()
        return response.json()  # type: ignore[no-any-return]


async def test_only_approved_plans_deploy(spec_repo: SpecRepo, tmp_path: Path, temporal_address: str,
                                         temporal_namespace: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="plnt")
    first = spec_repo.git("rev-parse", "HEAD")
    with ForgeStandin("github", "platform/specs", TOKEN) as standin:
        settings = settings_for(spec_repo.path, tmp_path / "state", temporal_address, temporal_namespace,
                                forge="github", forge_api_url=standin.api_url, forge_project="platform/specs",
                                forge_token=SecretStr(TOKEN), require_approval=True, report_status=False)
        ci = GitSource(str(spec_repo.path), tmp_path / "ci-clone")
        async with running_plnt(settings) as plnt, \
                make_forge("github", standin.api_url, "platform/specs", TOKEN) as ci_forge:
            # 1. The first commit came by a direct push: held, nothing deploys, GET /source says why.
            held = await wait_for(lambda: plnt.reconciler.source_status.get("held"), what="the direct push held")
            assert held["commit"] == first and held["approved"] is False and held["pr"] is None
            source = await get_source(plnt.url)
            assert source["held"] == held
            assert source["problems"] == [f"commit {first[:12]} is held: {held['reason']}"]
            assert held["reason"].startswith(f"no pull request brought commit {first[:12]} (a direct push)")
            assert source.get("lastReconciledCommit") is None
            assert status_of(plnt) is None and plnt.driver.snapshot() == {}, "nothing deploys from a held commit"
            # Judged again at each webhook (a review submitted releases it at once), logged once.
            def asked() -> int:
                return sum(r.path.endswith(f"/commits/{first}/pulls") for r in standin.requests)

            for n in (2, 3):
                await hook(plnt)
                await wait_for(lambda n=n: asked() >= n, what=f"pass {n} over the held commit")  # type: ignore[misc]
            assert sum("commit-held" in r.getMessage() and first[:12] in r.getMessage() for r in caplog.records) == 1

            # 2. PR #7: two pushes; approved on the first push only; merged with a merge commit.
            spec_repo.git("checkout", "-q", "-b", "bump")
            spec_repo.replace(RUN_FILE, "review-responder@1.2.0", "review-responder@1.4.0")
            older = spec_repo.commit("review-responder 1.4.0")
            spec_repo.replace(RUN_FILE, "review-responder@1.4.0", "review-responder@1.3.0")
            head = spec_repo.commit("no: review-responder 1.3.0")
            # The PR's CI job: the plan of the PR head against its merge base, posted on the head.
            base = spec_repo.git("merge-base", "main", "bump")
            made = await _review(ci, base, head, tmp_path)
            await ci_forge.set_status(head, "success", STATUS_CONTEXT, f"plan {short(made)}: 1 to upgrade")
            standin.add_review(7, "reviewer-a", "APPROVED", older)
            spec_repo.git("checkout", "-q", "main")
            spec_repo.git("merge", "--no-ff", "-q", "-m", "Merge pull request #7 from bump", "bump")
            merge = spec_repo.git("rev-parse", "HEAD")
            standin.pulls[7] = {"head_sha": head, "merged": True, "commits": [older, head, merge]}
            await hook(plnt)
            held = await wait_for(lambda: (h := plnt.reconciler.source_status.get("held")) and h["commit"] == merge and h,
                                  what="the merge held: approved on an older push only")
            assert held["reason"] == f"PR #7 was approved only on an older push ({older[:12]}); approve head {head[:12]}"
            assert held["pr"] == 7 and held["head"] == head
            assert plnt.driver.snapshot() == {} and plnt.reconciler.running_sagas == set()

            # 3. Approved on the head: the same commit is released without a new push, and deploys.
            standin.add_review(7, "reviewer-b", "APPROVED", head)
            await hook(plnt)
            await wait_phase(plnt, "Ready", version="1.3.0", timeout=90)
            assert plnt.reconciler.source_status["held"] is None
            assert plnt.reconciler.source_status["lastReconciledCommit"] == merge
            assert (await invoke(plnt)).json()["version"] == "1.3.0"

            # 4. A direct push on top: nothing running changes; every status says which commit and why.
            spec_repo.replace(RUN_FILE, "review-responder@1.3.0", "review-responder@1.5.0")
            direct = spec_repo.commit("hotfix without review")
            await hook(plnt)
            status = await wait_for(lambda: (s := status_of(plnt)) and direct[:12] in s["message"] and s,
                                    what="the status to name the held commit")
            assert status["message"].startswith(f"commit {direct[:12]} is held: no pull request brought commit")
            assert (status["phase"], status["version"]) == ("Ready", "1.3.0")
            assert (await get_source(plnt.url))["held"]["commit"] == direct
            assert (await invoke(plnt)).json()["version"] == "1.3.0"
            assert plnt.reconciler.running_sagas == set()
    assert TOKEN not in caplog.text


async def _review(ci: GitSource, base: str, head: str, tmp_path: Path) -> str:
    import asyncio

    made = await asyncio.to_thread(plan_digest_between, ci, ci.resolve(base), ci.resolve(head),
                                   cache=RecipeCache(tmp_path / "ci-recipes"), registry_options=RegistryOptions())
    assert made.digest is not None, made.problems
    return made.digest


async def test_plnt_reconcile_role_holds_what_no_review_approved(spec_repo: SpecRepo, tmp_path: Path,
                                                                 temporal_address: str, temporal_namespace: str) -> None:
    """`plnt reconcile --forge ... --require-approval` as its own process: the CLI's forge options
    reach the gate (roles.start_reconciler), the token from a file never shows in its log."""
    import socket

    from ..conftest import PYTHON
    from ..services import _Process

    first = spec_repo.git("rev-parse", "HEAD")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    (tmp_path / "forge.token").write_text(TOKEN + "\n")
    (tmp_path / "internal.token").write_text("internal-token-of-the-approval-test\n")
    (tmp_path / "tokens").write_text("admin-token-of-the-approval-test\n")
    with ForgeStandin("gitea", "platform/specs", TOKEN) as standin:
        process = _Process([PYTHON, "-m", "plnt.reconciler.cli", "reconcile", "--repo", str(spec_repo.path),
                            "--state-dir", str(tmp_path / "state"), "--port", str(port), "--interval", "1",
                            "--internal-token-file", str(tmp_path / "internal.token"),
                            "--tokens-file", str(tmp_path / "tokens"),
                            "--temporal-address", temporal_address, "--temporal-namespace", temporal_namespace,
                            "--forge", "gitea", "--forge-api-url", standin.api_url, "--forge-project", "platform/specs",
                            "--forge-token-file", str(tmp_path / "forge.token"), "--require-approval"],
                           tmp_path / "reconcile.log")
        try:
            process.wait_ready(f"http://127.0.0.1:{port}/readyz", ok=(200,), timeout_s=60)

            async def held() -> dict | None:  # type: ignore[type-arg]
                async with httpx.AsyncClient(trust_env=False) as client:
                    response = await client.get(f"http://127.0.0.1:{port}/source",
                                                headers={"Authorization": "Bearer admin-token-of-the-approval-test"})
                    return response.json().get("held") if response.status_code == 200 else None

            verdict = await wait_for(held, what="GET /source of plnt reconcile to show the held commit")
            assert verdict["commit"] == first and verdict["approved"] is False
            assert verdict["reason"].startswith(f"no pull request brought commit {first[:12]}")
            assert any(r.path.endswith(f"/commits/{first}/pull") for r in standin.requests), "Gitea's PR-of-commit"
        finally:
            process.stop()
        assert TOKEN not in process.log.read_text(errors="replace")
