"""Preview deploys of a pull request, end to end: real git (a pull request ref in the origin, made
with `git update-ref` as a forge makes refs/pull/N/head), real Temporal, real runner processes, real
gateway, real signed recipes of gitops-example. The forge is the DECLARED stand-in
(tests/forge_standin.py): no forge server runs here, so pull request state, statuses and the
comment are those of the stand-in, with GitHub's request shapes.

The runners' model is MockBackend (`--backend mock`), a STAND-IN for a model server."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import httpx
import pytest
from plnt.reconciler.app import Plnt

from tests.conftest import SpecRepo
from tests.e2e.harness import REVIEW, hook, invoke, running_plnt, settings_for, status_of, wait_for, wait_phase
from tests.forge_standin import ForgeStandin

pytestmark = pytest.mark.integration

RUN_FILE = "workflowruns/review-responder.yaml"
TOKEN = "forge-token-previews-0123456789"
PREVIEW = "review-responder--pr7"
CONTEXT = "plnt/preview/default/review-responder"


def push_pr(repo: SpecRepo, pr: int, version: str, *, base: str = "main") -> str:
    """A commit on a pull request branch, published as the forge does: refs/pull/<pr>/head."""
    branch = f"pr-{pr}"
    existing = repo.git("branch", "--list", branch)
    repo.git("checkout", "-q", *(["-b", branch, base] if not existing else [branch]))
    text = (repo.path / RUN_FILE).read_text()
    current = text.split("review-responder@", 1)[1].split()[0]
    repo.replace(RUN_FILE, f"review-responder@{current}", f"review-responder@{version}")
    sha = repo.commit(f"review-responder {version}")
    repo.git("update-ref", f"refs/pull/{pr}/head", sha)
    repo.git("checkout", "-q", "main")
    return sha


async def invoke_preview(plnt: Plnt, pr: int | str, name: str = "review-responder") -> httpx.Response:
    async with httpx.AsyncClient(trust_env=False, timeout=30) as client:
        return await client.post(f"{plnt.url}/workflows/{name}/invoke", json=REVIEW,
                                 headers={"X-Plnt-Preview": str(pr)})


def latest(forge: ForgeStandin, sha: str, context: str) -> dict | None:  # type: ignore[type-arg]
    """The newest status of `context` on `sha`, in GitHub's words (GitLab records name/status)."""
    found = [{**s, "context": s.get("context") or s.get("name"), "state": s.get("state") or s.get("status")}
             for s in forge.statuses if s["sha"] == sha and (s.get("context") or s.get("name")) == context]
    return found[-1] if found else None


def comment(forge: ForgeStandin, pr: int) -> str:
    bodies = [c["body"] for c in forge.comments.get(pr, []) if "plnt:preview" in c["body"]]
    assert len(bodies) <= 1, f"one upserted comment, not {len(bodies)}"
    return bodies[0] if bodies else ""


async def test_a_pull_request_is_previewed_replaced_and_removed(
    spec_repo: SpecRepo, tmp_path: Path, temporal_address: str, temporal_namespace: str
) -> None:
    with ForgeStandin("github", "acme/specs", TOKEN) as forge:
        settings = settings_for(spec_repo.path, tmp_path / "state", temporal_address, temporal_namespace,
                                forge="github", forge_api_url=forge.api_url, forge_project="acme/specs",
                                forge_token=TOKEN, previews=("refs/pull/*/head",))
        async with running_plnt(settings) as plnt:
            await wait_phase(plnt, "Ready", version="1.2.0")
            main_pid = plnt.driver.snapshot()["default/review-responder"].stable.pid

            # Before any preview: the header names a preview that does not exist.
            missing = await invoke_preview(plnt, 7)
            assert missing.status_code == 404 and "pull request 7" in missing.json()["error"]["message"]

            # A pull request changing review-responder to 1.3.0.
            t0 = time.monotonic()
            head = push_pr(spec_repo, 7, "1.3.0")
            forge.pulls[7] = {"head_sha": head, "merged": False, "commits": [head]}
            await hook(plnt)
            preview = await wait_phase(plnt, "Ready", version="1.3.0", name=PREVIEW, timeout=60)
            print(f"\nfigure: push to refs/pull/7/head (+ webhook) -> preview Ready: {time.monotonic() - t0:.2f} s")
            assert preview["preview"] == 7 and preview["observedCommit"] == head
            assert preview["smokeTest"]["passed"] is True

            answered = await invoke_preview(plnt, 7)
            assert answered.status_code == 200, answered.text
            assert answered.json()["version"] == "1.3.0"
            regular = await invoke(plnt)
            assert regular.status_code == 200 and regular.json()["version"] == "1.2.0"
            # The preview takes no regular traffic: not by its own name, not as a model.
            assert (await invoke(plnt, name=PREVIEW)).status_code == 404
            assert (await invoke_preview(plnt, "seven")).status_code == 404
            async with httpx.AsyncClient(trust_env=False) as client:
                models = (await client.get(f"{plnt.url}/v1/models")).json()["data"]
                rows = (await client.get(f"{plnt.url}/workflows")).json()
            assert [m["id"] for m in models] == ["review-responder"]
            assert {(r["name"], r["preview"]) for r in rows} == {("review-responder", None), (PREVIEW, 7)}

            ok = await wait_for(lambda: (s := latest(forge, head, CONTEXT)) and s["state"] == "success" and s,
                                what="the preview's success status on the PR head")
            assert "1.3.0" in ok["description"] and "X-Plnt-Preview: 7" in ok["description"]
            assert latest(forge, head, "plnt/preview")["state"] == "success"  # type: ignore[index]
            body = await wait_for(lambda: "Ready" in comment(forge, 7) and comment(forge, 7), what="the comment")
            assert "curl -H 'X-Plnt-Preview: 7'" in body and "/workflows/review-responder/invoke" in body
            pending = [s for s in forge.statuses if s["context"] == CONTEXT and s["sha"] == head]
            assert pending[0]["state"] == "pending", pending
            # The branch's rollout statuses (plnt/<namespace>/<name>) leave previews to this controller.
            assert not [s for s in forge.statuses if "--pr" in s["context"]]

            # A push of 1.4.0 (its smoke test fails in the example registry) replaces the preview:
            # it fails with the reason on the PR; 1.3.0 keeps serving the preview; main is untouched.
            broken = push_pr(spec_repo, 7, "1.4.0")
            forge.pulls[7]["head_sha"] = broken
            forge.pulls[7]["commits"].append(broken)
            await hook(plnt)
            failed = await wait_phase(plnt, "RolledBack", name=PREVIEW, timeout=60)
            assert failed["observedCommit"] == broken and "error rate" in failed["lastError"]
            bad = await wait_for(lambda: (s := latest(forge, broken, CONTEXT)) and s["state"] == "failure" and s,
                                 what="the preview's failure status on the new head")
            assert "error rate" in bad["description"]
            assert (await invoke_preview(plnt, 7)).json()["version"] == "1.3.0"
            main = status_of(plnt)
            assert main is not None and main["phase"] == "Ready" and main["version"] == "1.2.0"
            assert plnt.driver.snapshot()["default/review-responder"].stable.pid == main_pid
            assert (await invoke(plnt)).json()["version"] == "1.2.0"
            # One comment, updated in place.
            await wait_for(lambda: "RolledBack" in comment(forge, 7), what="the comment to say RolledBack")
            assert len(forge.comments[7]) == 1

            # The pull request is closed: the preview is removed (runner stopped, route gone).
            preview_pid = plnt.driver.snapshot()[f"default/{PREVIEW}"].stable.pid
            forge.pulls[7]["closed"] = True
            await hook(plnt)
            await wait_for(lambda: status_of(plnt, PREVIEW) is None and f"default/{PREVIEW}" not in plnt.driver.snapshot(),
                           timeout=60, what="the preview removed")
            await wait_for(lambda: not _alive(preview_pid), what="the preview's runner to stop")
            gone = await invoke_preview(plnt, 7)
            assert gone.status_code == 404, gone.text
            assert (await invoke(plnt)).json()["version"] == "1.2.0"
            await wait_for(lambda: "removed" in comment(forge, 7), what="the comment to say removed")
            removed = latest(forge, broken, CONTEXT)
            assert removed is not None and "removed" in removed["description"], removed


def _alive(pid: int) -> bool:
    from plnt.reconciler.drivers.processes import process_start_time

    return process_start_time(pid) is not None


async def test_an_invalid_pull_request_previews_nothing_and_a_vanished_ref_removes_the_preview(
    spec_repo: SpecRepo, tmp_path: Path, temporal_address: str, temporal_namespace: str
) -> None:
    with ForgeStandin("gitlab", "acme/specs", TOKEN) as forge:
        settings = settings_for(spec_repo.path, tmp_path / "state", temporal_address, temporal_namespace,
                                forge="gitlab", forge_api_url=forge.api_url, forge_project="acme/specs",
                                forge_token=TOKEN, previews=("refs/merge-requests/*/head",))
        async with running_plnt(settings) as plnt:
            await wait_phase(plnt, "Ready", version="1.2.0")

            # A merge request whose WorkflowRun does not parse: nothing deploys, the MR is told why.
            spec_repo.git("checkout", "-q", "-b", "mr-8")
            spec_repo.replace(RUN_FILE, "trafficPercent: 5", "trafficPercent: lots")
            invalid = spec_repo.commit("invalid traffic")
            spec_repo.git("update-ref", "refs/merge-requests/8/head", invalid)
            spec_repo.git("checkout", "-q", "main")
            forge.pulls[8] = {"head_sha": invalid, "merged": False, "commits": [invalid]}
            await hook(plnt)
            refused = await wait_for(lambda: latest(forge, invalid, "plnt/preview"), what="the MR's refusal")
            assert refused["state"] == "failed" and "problem" in refused["description"], refused
            await wait_for(lambda: "Nothing is previewed" in comment(forge, 8), what="the comment to say why")
            assert status_of(plnt, "review-responder--pr8") is None
            assert set(plnt.driver.snapshot()) == {"default/review-responder"}

            # Fixed by a new push (a new WorkflowRun too): both preview, the unchanged one does not.
            spec_repo.git("checkout", "-q", "mr-8")
            spec_repo.replace(RUN_FILE, "trafficPercent: lots", "trafficPercent: 5")
            spec_repo.replace(RUN_FILE, "review-responder@1.2.0", "review-responder@1.3.0")
            fixed = spec_repo.commit("fixed: 1.3.0")
            spec_repo.git("update-ref", "refs/merge-requests/8/head", fixed)
            spec_repo.git("checkout", "-q", "main")
            forge.pulls[8]["head_sha"] = fixed
            await hook(plnt)
            await wait_phase(plnt, "Ready", version="1.3.0", name="review-responder--pr8", timeout=60)
            assert (await invoke_preview(plnt, 8)).json()["version"] == "1.3.0"
            ok = await wait_for(lambda: (s := latest(forge, fixed, "plnt/preview/default/review-responder"))
                                and s["state"] == "success" and s, what="the MR's preview status")
            assert "X-Plnt-Preview: 8" in ok["description"]

            # The ref disappears (the forge deleted it): the preview is removed though the MR reads open.
            spec_repo.git("update-ref", "-d", "refs/merge-requests/8/head")
            await hook(plnt)
            await wait_for(lambda: status_of(plnt, "review-responder--pr8") is None
                           and set(plnt.driver.snapshot()) == {"default/review-responder"},
                           timeout=60, what="the preview removed")
            assert (await invoke_preview(plnt, 8)).status_code == 404
            await wait_for(lambda: "removed" in comment(forge, 8), what="the comment to say removed")
            assert (await invoke(plnt)).json()["version"] == "1.2.0"


async def test_a_preview_outlives_a_restart_and_goes_when_its_pull_request_merges(
    spec_repo: SpecRepo, tmp_path: Path, temporal_address: str, temporal_namespace: str
) -> None:
    with ForgeStandin("gitea", "acme/specs", TOKEN) as forge:
        settings = settings_for(spec_repo.path, tmp_path / "state", temporal_address, temporal_namespace,
                                forge="gitea", forge_api_url=forge.api_url, forge_project="acme/specs",
                                forge_token=TOKEN, previews=("refs/pull/*/head",))
        head = push_pr(spec_repo, 3, "1.3.0")
        forge.pulls[3] = {"head_sha": head, "merged": False, "commits": [head]}
        async with running_plnt(settings) as plnt:
            await wait_phase(plnt, "Ready", version="1.2.0")
            await wait_phase(plnt, "Ready", version="1.3.0", name="review-responder--pr3", timeout=60)
            release = plnt.driver.snapshot()["default/review-responder--pr3"].stable.release_id

        # plnt restarts: the preview is the same release, not removed nor deployed again.
        async with running_plnt(settings) as plnt:
            await wait_for(lambda: plnt.reconciler.source_status.get("lastReconciledCommit"), what="a pass")
            asked = len([r for r in forge.requests if r.path.endswith("/pulls/3")])
            await hook(plnt)
            # Two passes of the preview controller since the restart (each asks the forge for the PR's state).
            await wait_for(lambda: len([r for r in forge.requests if r.path.endswith("/pulls/3")]) >= asked + 2,
                           what="two preview passes")
            assert plnt.previews is not None and plnt.previews.running_sagas == set()
            status = status_of(plnt, "review-responder--pr3")
            assert status is not None and status["phase"] == "Ready" and status["version"] == "1.3.0"
            assert plnt.driver.snapshot()["default/review-responder--pr3"].stable.release_id == release
            assert (await invoke_preview(plnt, 3)).json()["version"] == "1.3.0"

            # The preview's runner killed out of band: restarted (selfHeal), the same release.
            pid = plnt.driver.snapshot()["default/review-responder--pr3"].stable.pid
            os.kill(pid, signal.SIGKILL)
            await wait_for(lambda: (r := plnt.driver.snapshot()["default/review-responder--pr3"].stable)
                           and r.pid != pid and _alive(r.pid), timeout=30, what="the preview's runner restarted")
            assert plnt.driver.snapshot()["default/review-responder--pr3"].stable.release_id == release
            assert (await invoke_preview(plnt, 3)).json()["version"] == "1.3.0"

            # Merged: main moves to the pull request's head; the preview goes, main deploys 1.3.0.
            spec_repo.git("merge", "-q", "--ff-only", "pr-3")
            forge.pulls[3]["merged"] = True
            await hook(plnt)
            await wait_phase(plnt, "Ready", version="1.3.0", timeout=60)
            await wait_for(lambda: status_of(plnt, "review-responder--pr3") is None
                           and set(plnt.driver.snapshot()) == {"default/review-responder"},
                           timeout=60, what="the preview removed")
            assert (await invoke_preview(plnt, 3)).status_code == 404
            assert (await invoke(plnt)).json()["version"] == "1.3.0"


async def test_previews_with_the_roles_apart(tmp_path: Path, spec_repo: SpecRepo, temporal_address: str,
                                              temporal_namespace: str) -> None:
    """`plnt reconcile` (the controller, the forge) + `plnt worker --previews` (the preview saga's steps,
    the commit checked against its own fetch of the pull request's ref) + `plnt gateway` (routes by header):
    separate processes, no shared disk."""
    from tests.e2e.test_split_roles import AUTH, Roles

    roles = Roles(tmp_path, spec_repo, temporal_address, temporal_namespace)
    token_file = tmp_path / "forge.token"
    token_file.write_text(TOKEN + "\n")
    head = push_pr(spec_repo, 7, "1.3.0")
    try:
        with ForgeStandin("github", "acme/specs", TOKEN) as forge:
            forge.pulls[7] = {"head_sha": head, "merged": False, "commits": [head]}
            forge_args = ["--forge", "github", "--forge-api-url", forge.api_url, "--forge-project", "acme/specs",
                          "--forge-token-file", str(token_file), "--previews", "refs/pull/*/head"]
            original = roles._start

            def start(name: str, args: list[str], ready: str):  # type: ignore[no-untyped-def]
                extra = forge_args if args[0] == "reconcile" else ["--previews", "refs/pull/*/head"] \
                    if args[0] == "worker" else []
                return original(name, [*args, *extra], ready)

            roles._start = start  # type: ignore[method-assign]
            roles.reconciler()
            roles.worker()
            gateway = roles.gateway("gateway-1")
            async with httpx.AsyncClient(timeout=30, trust_env=False) as client:
                async def preview_version() -> str | None:
                    response = await client.post(f"{gateway}/workflows/review-responder/invoke", json=REVIEW,
                                                 headers={**AUTH, "X-Plnt-Preview": "7"})
                    return response.json()["version"] if response.status_code == 200 else None

                assert await wait_for(preview_version, timeout=90, what="the preview through the gateway") == "1.3.0"

                async def regular_version() -> str | None:
                    response = await client.post(f"{gateway}/workflows/review-responder/invoke", json=REVIEW,
                                                 headers=AUTH)
                    return response.json()["version"] if response.status_code == 200 else None

                assert await wait_for(regular_version, timeout=60, what="main through the gateway") == "1.2.0"
                assert await preview_version() == "1.3.0"
                await wait_for(lambda: (s := latest(forge, head, CONTEXT)) and s["state"] == "success",
                               what="the PR's success status")
                assert TOKEN not in (tmp_path / "reconciler.log").read_text(), "the forge token is in the log"
    finally:
        roles.stop_all()


async def test_closed_pull_requests_refs_cost_one_forge_call_each(
    spec_repo: SpecRepo, tmp_path: Path, temporal_address: str, temporal_namespace: str
) -> None:
    """A forge keeps refs/pull/N/head of every closed pull request: each is asked about once (the
    verdict is remembered for its head), not once per pass."""
    main = spec_repo.git("rev-parse", "HEAD")
    with ForgeStandin("github", "acme/specs", TOKEN) as forge:
        for n in range(1, 61):
            spec_repo.git("update-ref", f"refs/pull/{n}/head", main)
            forge.pulls[n] = {"head_sha": main, "merged": n % 2 == 0, "closed": True, "commits": [main]}
        settings = settings_for(spec_repo.path, tmp_path / "state", temporal_address, temporal_namespace,
                                forge="github", forge_api_url=forge.api_url, forge_project="acme/specs",
                                forge_token=TOKEN, previews=("refs/pull/*/head",))
        async with running_plnt(settings) as plnt:
            await wait_phase(plnt, "Ready", version="1.2.0")
            assert plnt.previews is not None
            for _ in range(4):  # more passes than the 60 refs need at 50 lookups a pass
                await plnt.previews.reconcile_once()
            asked = [r.path.rsplit("/", 1)[1] for r in forge.requests if "/pulls/" in r.path]
            assert sorted(map(int, asked)) == list(range(1, 61)), "each closed pull request asked about exactly once"
            assert not [s for s in plnt.statuses.all() if "--pr" in s.name]
            assert not [s for s in forge.statuses if s["context"].startswith("plnt/preview")] and not forge.comments
