"""Pull-request review as deploy approval, end to end on a running plnt (--require-approval,
rollout statuses, --write-notes, --previews): real git, real Temporal, real runners (mock model backend,
a stand-in for a model server), real signed recipes verified for real, and the DECLARED forge
stand-in (tests/forge_standin.py, GitHub REST shapes; not a live forge).

The plan comment and the `plnt/plan` status are posted by `plnt review` itself, run as the PR's
CI job runs it (a process: `plnt review --repo R --base main --head BRANCH --forge github ...`).

How the test starts: the example repository's first commit was pushed directly (no PR), as a
repository's first commit usually is. It is held, so nothing deploys. Nothing being reconciled
yet, the next head is judged alone (its history is the starting point an operator accepts by
turning plnt on): the merge of an approved PR deploys.
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
from pathlib import Path

import httpx
import pytest
from plnt.reconciler.plan.digest import STATUS_CONTEXT
from plnt.reconciler.review.approval import APPROVAL_CONTEXT
from plnt.reconciler.review.forge import make_forge
from pydantic import SecretStr

from tests.conftest import PYTHON, SpecRepo
from tests.e2e.harness import hook, invoke, running_plnt, settings_for, status_of, wait_for, wait_phase
from tests.e2e.test_previews import invoke_preview
from tests.forge_standin import ForgeStandin

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
                                forge_token=SecretStr(TOKEN), require_approval=True, write_notes=True,
                                previews=("refs/pull/*/head",))
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
            standin.pulls[7] = {"head_sha": head, "merged": False, "commits": [older, head]}
            # The PR's CI job: `plnt review` posts the plan comment and the plnt/plan status on the head.
            await asyncio.to_thread(plnt_review, spec_repo, standin, tmp_path, "bump", 7)
            posted = await ci_forge.commit_status(head, STATUS_CONTEXT)
            assert posted is not None and posted.state == "success" and posted.description.startswith("plan sha256:")
            assert len(standin.comments[7]) == 1 and "review-responder" in standin.comments[7][0]["body"]
            standin.add_review(7, "reviewer-a", "APPROVED", older)
            spec_repo.git("checkout", "-q", "main")
            spec_repo.git("merge", "--no-ff", "-q", "-m", "Merge pull request #7 from bump", "bump")
            merge = spec_repo.git("rev-parse", "HEAD")
            standin.pulls[7].update(merged=True, commits=[older, head, merge])
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
            approval = await ci_forge.commit_status(merge, APPROVAL_CONTEXT)
            assert approval is not None and approval.state == "success"
            assert approval.description.startswith("approved: PR #7 by reviewer-b, plan sha256:")
            # The verdict went back to the merge: the rollout's statuses in order, each posted once.
            rollout = await wait_for(lambda: (r := [(s["state"], s["description"]) for s in standin.statuses
                                                    if s["sha"] == merge and s["context"] == "plnt/default/review-responder"])
                                     and r[-1][0] == "success" and r, what="the rollout's success status")
            assert {state for state, _ in rollout[:-1]} == {"pending"} and len(rollout) >= 2, rollout
            assert all(a != b for a, b in zip(rollout, rollout[1:], strict=False)), "a status posted twice in a row"
            assert rollout[-1][1].startswith("Ready 1.3.0: p95 ")
            assert not [s for s in standin.statuses if s["context"] == "plnt/default/review-responder" and s["sha"] != merge]
            # ...and as a git note in the spec repository (--write-notes).
            note = await wait_for(lambda: _note(spec_repo, merge), what="the rollout's git note")
            assert note.startswith("default/review-responder: Ready 1.3.0"), note

            # 3b. PR #8 (back to 1.2.0) is previewed before anyone approves it: Ready as a preview that
            # only X-Plnt-Preview: 8 reaches, verified with the policies of the approved merge; closing
            # the PR removes it.
            spec_repo.git("checkout", "-q", "-b", "back", "main")
            spec_repo.replace(RUN_FILE, "review-responder@1.3.0", "review-responder@1.2.0")
            pr8 = spec_repo.commit("back to 1.2.0")
            spec_repo.git("update-ref", "refs/pull/8/head", pr8)
            spec_repo.git("checkout", "-q", "main")
            standin.pulls[8] = {"head_sha": pr8, "merged": False, "commits": [pr8]}
            await hook(plnt)
            preview = await wait_phase(plnt, "Ready", version="1.2.0", name="review-responder--pr8", timeout=90)
            assert preview["preview"] == 8 and preview["observedCommit"] == pr8
            assert (await invoke_preview(plnt, 8)).json()["version"] == "1.2.0"
            assert (await invoke(plnt)).json()["version"] == "1.3.0", "a preview takes no regular traffic"

            def preview_states() -> list[str]:
                return [s["state"] for s in standin.statuses if s["context"] == "plnt/preview/default/review-responder"]

            # The verdict is posted after Ready, by a follower: waited for, not raced by closing the PR.
            await wait_for(lambda: "success" in preview_states(), timeout=30, what="the preview's success status")
            standin.pulls[8]["closed"] = True
            await hook(plnt)
            await wait_for(lambda: status_of(plnt, "review-responder--pr8") is None, timeout=60, what="the preview removed")
            assert (await invoke_preview(plnt, 8)).status_code == 404
            previewed = preview_states()
            assert previewed[0] == "pending" and "success" in previewed, previewed

            # 4. A direct push on top: nothing running changes; every status says which commit and why.
            spec_repo.replace(RUN_FILE, "review-responder@1.3.0", "review-responder@1.5.0")
            direct = spec_repo.commit("hotfix without review")
            await hook(plnt)
            status = await wait_for(lambda: (s := status_of(plnt)) and direct[:12] in s["message"] and s,
                                    what="the status to name the held commit")
            assert status["message"].startswith(f"Ready 1.3.0; commit {direct[:12]} is held: no pull request brought commit")
            assert (status["phase"], status["version"]) == ("Ready", "1.3.0")
            assert (await get_source(plnt.url))["held"]["commit"] == direct
            assert (await invoke(plnt)).json()["version"] == "1.3.0"
            assert plnt.reconciler.running_sagas == set()
            approval = await ci_forge.commit_status(direct, APPROVAL_CONTEXT)
            assert approval is not None and approval.state == "failure"
            assert approval.description.startswith(f"held: no pull request brought commit {direct[:12]}")

        # 5. The way out the reason names: an operator accepts the direct push by reconciling once
        # without --require-approval; with it on again, judging starts after that commit.
        async with running_plnt(settings.model_copy(
                update={"review": settings.review.model_copy(update={"require_approval": False})})) as plnt:
            await wait_phase(plnt, "Ready", version="1.5.0", timeout=90)
        async with running_plnt(settings) as plnt:
            await plnt.reconciler.reconcile_once()
            assert plnt.reconciler.source_status["held"] is None
            assert plnt.reconciler.source_status["lastReconciledCommit"] == direct
            assert status_of(plnt)["version"] == "1.5.0"
    assert TOKEN not in caplog.text


def _note(repo: SpecRepo, commit: str) -> str | None:
    try:
        return repo.git("notes", "--ref=plnt", "show", commit) or None
    except subprocess.CalledProcessError:
        return None


def plnt_review(repo: SpecRepo, standin: ForgeStandin, tmp_path: Path, head: str, pr: int) -> None:
    token = tmp_path / "ci-forge.token"
    token.write_text(TOKEN + "\n")
    done = subprocess.run([PYTHON, "-m", "plnt.reconciler.cli.main", "review", "--repo", str(repo.path), "--base", "main",
                           "--head", head, "--forge", standin.kind, "--api-url", standin.api_url,
                           "--project", standin.project, "--pr", str(pr), "--token-file", str(token)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


async def test_plnt_reconcile_role_holds_what_no_review_approved(spec_repo: SpecRepo, tmp_path: Path,
                                                                 temporal_address: str, temporal_namespace: str) -> None:
    """`plnt reconcile --forge ... --require-approval` as its own process: the CLI's forge options
    reach the gate (roles.start_reconciler), the token from a file never shows in its log."""
    import socket

    from tests.services import _Process

    first = spec_repo.git("rev-parse", "HEAD")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    (tmp_path / "forge.token").write_text(TOKEN + "\n")
    (tmp_path / "internal.token").write_text("internal-token-of-the-approval-test\n")
    (tmp_path / "tokens").write_text("admin-token-of-the-approval-test\n")
    with ForgeStandin("gitea", "platform/specs", TOKEN) as standin:
        process = _Process([PYTHON, "-m", "plnt.reconciler.cli.main", "reconcile", "--repo", str(spec_repo.path),
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
