"""From a git commit to a served invocation, on the embedded default: real Temporal server, real
git repositories, real runner processes, real gateway.

The runners' model is MockBackend (`--backend mock`, the default), a STAND-IN for a model server
unless a test says otherwise; recipes are signed by test authorities (tests/sigstore_ca.py),
STAND-INS for Sigstore's public services."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from plnt.reconciler.drivers.processes import process_start_time

from tests.conftest import SpecRepo
from tests.e2e.harness import hook, invoke, running_plnt, settings_for, status_of, wait_for, wait_phase

pytestmark = pytest.mark.integration

RUN_FILE = "workflowruns/review-responder.yaml"


def _alive(pid: int) -> bool:
    return process_start_time(pid) is not None


def runner_pids(release_id: str) -> list[int]:
    """Live processes whose command line names this runner release."""
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmdline = (proc / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if release_id.encode() in cmdline and _alive(int(proc.name)):
                pids.append(int(proc.name))
    return pids


async def test_commit_adding_a_workflowrun_ends_ready_and_is_served(
    spec_repo: SpecRepo, tmp_path: Path, temporal_address: str, temporal_namespace: str
) -> None:
    # Start on a repository without the WorkflowRun, then commit it, as a user adding a workflow would.
    spec_repo.remove(RUN_FILE)
    spec_repo.commit("no workflows yet")
    settings = settings_for(spec_repo.path, tmp_path / "state", temporal_address, temporal_namespace)
    async with running_plnt(settings) as plnt:
        assert (await invoke(plnt)).status_code == 404
        spec_repo.git("checkout", "-q", "HEAD~1", "--", RUN_FILE)
        commit = spec_repo.commit("add review-responder")
        await hook(plnt)
        status = await wait_phase(plnt, "Ready", version="1.2.0")
        assert status["observedCommit"] == commit
        assert status["smokeTest"]["passed"] is True
        response = await invoke(plnt)
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["version"] == "1.2.0"
        assert body["output"]["intent"] == "mixed"
        assert "parking" in body["output"]["reply"]
        assert response.headers["x-plnt-track"] == "stable"


async def test_version_bump_goes_through_a_canary_then_promotes(
    spec_repo: SpecRepo, tmp_path: Path, temporal_address: str, temporal_namespace: str
) -> None:
    settings = settings_for(spec_repo.path, tmp_path / "state", temporal_address, temporal_namespace)
    async with running_plnt(settings) as plnt:
        await wait_phase(plnt, "Ready", version="1.2.0")
        old_pid = plnt.driver.snapshot()["default/review-responder"].stable.pid
        # 1.5.0 answers in about 0.6 s, so its smoke test keeps it in Canary for a few seconds.
        spec_repo.replace(RUN_FILE, "review-responder@1.2.0", "review-responder@1.5.0")
        spec_repo.replace(RUN_FILE, "trafficPercent: 5", "trafficPercent: 50")
        spec_repo.commit("bump to 1.5.0 with half the traffic on the canary")
        await hook(plnt)
        canary = await wait_phase(plnt, "Canary", version="1.2.0")
        assert canary["canaryVersion"] == "1.5.0" and canary["canaryPercent"] == 50
        # 20 requests at once, all routed while the canary is under test (the smoke test needs
        # about 3 s): at 50% the chance that one of the two versions gets none is 2 in a million.
        responses = await asyncio.gather(*(invoke(plnt) for _ in range(20)))
        assert all(r.status_code == 200 for r in responses), [r.text for r in responses]
        seen = {(r.json()["version"], r.headers["x-plnt-track"]) for r in responses}
        assert seen == {("1.2.0", "stable"), ("1.5.0", "canary")}, seen
        ready = await wait_phase(plnt, "Ready", version="1.5.0")
        assert ready["canaryPercent"] == 0
        assert (await invoke(plnt)).json()["version"] == "1.5.0"
        live = plnt.driver.snapshot()["default/review-responder"]
        assert live.canary is None and live.stable.version == "1.5.0"
        await wait_for(lambda: not _alive(old_pid), timeout=15, what="old stable runner to stop")


@pytest.mark.parametrize(
    ("version", "budget_edit", "reason_part"),
    [
        ("1.4.0", None, "error rate 100%"),                          # a step that errors
        ("1.5.0", ("p95BudgetMs: 2500", "p95BudgetMs: 300"), "p95 latency"),  # slower than the budget
    ],
    ids=["errors", "latency"],
)
async def test_failing_smoke_test_rolls_back_and_old_version_keeps_serving(
    spec_repo: SpecRepo, tmp_path: Path, temporal_address: str, temporal_namespace: str,
    version: str, budget_edit: tuple[str, str] | None, reason_part: str,
) -> None:
    settings = settings_for(spec_repo.path, tmp_path / "state", temporal_address, temporal_namespace)
    async with running_plnt(settings) as plnt:
        await wait_phase(plnt, "Ready", version="1.2.0")
        stable_pid = plnt.driver.snapshot()["default/review-responder"].stable.pid
        spec_repo.replace(RUN_FILE, "review-responder@1.2.0", f"review-responder@{version}")
        if budget_edit:
            spec_repo.replace(RUN_FILE, *budget_edit)
        spec_repo.commit(f"try {version}")
        await hook(plnt)
        status = await wait_phase(plnt, "RolledBack", version="1.2.0")
        assert reason_part in status["lastError"], status
        assert status["smokeTest"]["passed"] is False
        response = await invoke(plnt)
        assert response.status_code == 200 and response.json()["version"] == "1.2.0"
        live = plnt.driver.snapshot()["default/review-responder"]
        assert live.canary is None and live.stable.pid == stable_pid
        fingerprint = plnt.statuses.get("default/review-responder").attempted_fingerprint
        canary_id = f"default.review-responder.{version}.{fingerprint[7:19]}"
        assert (plnt.state.runner_logs / f"{canary_id}.log").exists(), "the canary did run"
        await wait_for(lambda: not runner_pids(canary_id), timeout=15, what="canary runner to stop")
        # One bad commit runs one saga: later polls hold the failed spec instead of retrying it.
        saga_id = status["sagaId"]
        await plnt.reconciler.reconcile_once()
        assert status_of(plnt)["sagaId"] == saga_id
        assert plnt.reconciler.running_sagas == set()


async def test_commit_deleting_the_workflowrun_uninstalls_it(
    spec_repo: SpecRepo, tmp_path: Path, temporal_address: str, temporal_namespace: str
) -> None:
    settings = settings_for(spec_repo.path, tmp_path / "state", temporal_address, temporal_namespace)
    async with running_plnt(settings) as plnt:
        await wait_phase(plnt, "Ready", version="1.2.0")
        pid = plnt.driver.snapshot()["default/review-responder"].stable.pid
        spec_repo.remove(RUN_FILE)
        spec_repo.commit("retire review-responder")
        await hook(plnt)
        await wait_for(lambda: status_of(plnt) is None, what="status to be removed")
        response = await invoke(plnt)
        assert response.status_code == 404, response.text
        assert plnt.driver.snapshot() == {}
        await wait_for(lambda: not _alive(pid), timeout=15, what="runner to stop")


async def test_invalid_commit_is_reported_and_changes_nothing(
    spec_repo: SpecRepo, tmp_path: Path, temporal_address: str, temporal_namespace: str
) -> None:
    settings = settings_for(spec_repo.path, tmp_path / "state", temporal_address, temporal_namespace)
    async with running_plnt(settings) as plnt:
        ready = await wait_phase(plnt, "Ready", version="1.2.0")
        before = plnt.driver.snapshot()
        # A bad version bump: the new ref and an unknown field in one commit.
        spec_repo.replace(RUN_FILE, "review-responder@1.2.0", "review-responder@1.3.0")
        spec_repo.replace(RUN_FILE, "trafficPercent: 5", "trafficPercent: 5\n    trafficPercnt: 7")
        bad = spec_repo.commit("typo")
        await hook(plnt)
        status = await wait_for(
            lambda: (s := status_of(plnt)) and bad[:12] in s["message"] and s, what="status to report the bad commit")
        assert "workflowruns/review-responder.yaml:19: spec.canary.trafficPercnt" in status["lastError"]
        assert status["phase"] == "Ready" and status["version"] == "1.2.0"
        assert plnt.reconciler.source_status["newestCommit"] == bad
        assert plnt.reconciler.source_status["lastReconciledCommit"] == ready["observedCommit"]
        assert plnt.driver.snapshot() == before
        assert plnt.reconciler.running_sagas == set()
        assert (await invoke(plnt)).json()["version"] == "1.2.0"
        # The fix lands in the next commit and deploys.
        spec_repo.replace(RUN_FILE, "\n    trafficPercnt: 7", "")
        spec_repo.commit("fix typo")
        await hook(plnt)
        await wait_phase(plnt, "Ready", version="1.3.0")


async def test_restart_on_same_state_dir_redeploys_nothing(
    spec_repo: SpecRepo, tmp_path: Path, temporal_address: str, temporal_namespace: str
) -> None:
    settings = settings_for(spec_repo.path, tmp_path / "state", temporal_address, temporal_namespace)
    async with running_plnt(settings) as plnt:
        first = await wait_phase(plnt, "Ready", version="1.2.0")
        release_id = plnt.driver.snapshot()["default/review-responder"].stable.release_id
        pid = plnt.driver.snapshot()["default/review-responder"].stable.pid
    assert not _alive(pid), "stopping plnt stops its runners"
    async with running_plnt(settings) as plnt:
        # The recorded release is resumed (same release, new process) before any reconcile.
        live = plnt.driver.snapshot()["default/review-responder"]
        assert live.stable.release_id == release_id and _alive(live.stable.pid)
        assert (await invoke(plnt)).json()["version"] == "1.2.0"
        items = await plnt.reconciler.reconcile_once()
        assert [(i.key, i.action.value) for i in items] == [("default/review-responder", "unchanged")]
        assert plnt.reconciler.running_sagas == set()
        assert status_of(plnt)["sagaId"] == first["sagaId"]
        sagas = [w async for w in plnt.client.list_workflows()]
        assert len(sagas) == 1, "only the first start ran a saga"


async def test_change_during_a_running_saga_does_not_start_a_second_one(
    spec_repo: SpecRepo, tmp_path: Path, temporal_address: str, temporal_namespace: str
) -> None:
    settings = settings_for(spec_repo.path, tmp_path / "state", temporal_address, temporal_namespace)
    async with running_plnt(settings) as plnt:
        await wait_phase(plnt, "Ready", version="1.2.0")
        spec_repo.replace(RUN_FILE, "review-responder@1.2.0", "review-responder@1.5.0")
        spec_repo.commit("1.5.0 (slow smoke test)")
        await hook(plnt)
        await wait_phase(plnt, "Canary", version="1.2.0")
        spec_repo.replace(RUN_FILE, "review-responder@1.5.0", "review-responder@1.3.0")
        spec_repo.commit("1.3.0 while 1.5.0 is still in canary")
        items = await plnt.reconciler.reconcile_once()
        assert [(i.action.value, i.waiting) for i in items] == [("upgrade", True)]
        running = [w async for w in plnt.client.list_workflows("ExecutionStatus = 'Running'")]
        assert len(running) == 1
        # When the running saga ends, the newest spec is deployed.
        await wait_phase(plnt, "Ready", version="1.3.0", timeout=60)
        sagas = [w async for w in plnt.client.list_workflows()]
        assert len(sagas) == 3  # 1.2.0, 1.5.0, 1.3.0: one after another, never side by side


async def test_promotion_under_load_fails_no_request(
    spec_repo: SpecRepo, tmp_path: Path, temporal_address: str, temporal_namespace: str
) -> None:
    """Routes change live on promotion: requests in flight on the old runner finish on it."""
    settings = settings_for(spec_repo.path, tmp_path / "state", temporal_address, temporal_namespace)
    async with running_plnt(settings) as plnt:
        await wait_phase(plnt, "Ready", version="1.2.0")
        done = asyncio.Event()
        outcomes: list[tuple[int, str]] = []

        async def load() -> None:
            while not done.is_set():
                response = await invoke(plnt)
                outcomes.append((response.status_code, response.json().get("version", response.text)))

        workers = [asyncio.create_task(load()) for _ in range(8)]
        try:
            spec_repo.replace(RUN_FILE, "review-responder@1.2.0", "review-responder@1.3.0")
            spec_repo.replace(RUN_FILE, "trafficPercent: 5", "trafficPercent: 30")
            spec_repo.commit("1.3.0 under load")
            await hook(plnt)
            await wait_phase(plnt, "Ready", version="1.3.0")
            await asyncio.sleep(1.0)  # the old runner drains and stops while load continues
        finally:
            done.set()
            await asyncio.gather(*workers)
        failures = [o for o in outcomes if o[0] != 200]
        assert failures == [], failures[:5]
        versions = [version for _, version in outcomes]
        assert "1.2.0" in versions and "1.3.0" in versions
        assert versions[-8:] == ["1.3.0"] * 8


@pytest.mark.parametrize("how", ["signed-by-another-authority", "unsigned"])
async def test_wrongly_signed_recipe_never_deploys_and_the_old_version_keeps_serving(
    spec_repo: SpecRepo, tmp_path: Path, temporal_address: str, temporal_namespace: str, how: str,
) -> None:
    from plnt.reconciler.recipes.archive import pack_recipe_to

    from tests.sigstore_ca import TestSigstoreAuthority

    settings = settings_for(spec_repo.path, tmp_path / "state", temporal_address, temporal_namespace)
    async with running_plnt(settings) as plnt:
        await wait_phase(plnt, "Ready", version="1.2.0")
        stable = plnt.driver.snapshot()["default/review-responder"].stable
        # A registry entry for 1.3.0 that the demo trust policy must refuse.
        entry = spec_repo.path / "unofficial" / "review-responder" / "1.3.0"
        entry.mkdir(parents=True)
        pack_recipe_to(spec_repo.path / "recipes" / "review-responder" / "1.3.0", entry / "recipe.tar.gz")
        if how == "signed-by-another-authority":
            bundle = TestSigstoreAuthority(name="impostor").sign(
                entry / "recipe.tar.gz", "recipes@demo.plnt.invalid", "https://issuer.demo.plnt.invalid")
            (entry / "recipe.tar.gz.sigstore.json").write_text(bundle)
        spec_repo.replace(RUN_FILE, "review-responder@1.2.0", "review-responder@1.3.0")
        spec_repo.replace(RUN_FILE, "registry: file:registry", "registry: file:unofficial")
        spec_repo.commit(f"1.3.0 from an unofficial registry ({how})")
        await hook(plnt)
        status = await wait_phase(plnt, "Failed", version="1.2.0")
        reason = "untrusted-root" if how != "unsigned" else "unsigned"
        assert status["lastError"].startswith(f"VerificationFailed: {reason}: recipe review-responder"), status
        assert not list(plnt.state.runner_logs.glob("default.review-responder.1.3.0.*")), "nothing of 1.3.0 ever ran"
        live = plnt.driver.snapshot()["default/review-responder"]
        assert live.canary is None and live.stable.pid == stable.pid
        response = await invoke(plnt)
        assert response.status_code == 200 and response.json()["version"] == "1.2.0"


@pytest.mark.parametrize("kind", ["oci", "s3"])
async def test_deploys_a_signed_recipe_from_an_oci_or_s3_registry(
    spec_repo: SpecRepo, tmp_path: Path, temporal_address: str, temporal_namespace: str, kind: str,
    request: pytest.FixtureRequest,
) -> None:
    from plnt.reconciler.recipes.registries import RegistryOptions, open_registry

    if kind == "oci":
        address = request.getfixturevalue("oci_registry").address
        url, options = f"oci://{address}/plnt-e2e/{temporal_namespace}", RegistryOptions(allow_insecure_http=(address,))
        overrides = {"oci_insecure_hosts": (address,)}
    else:
        bucket = request.getfixturevalue("s3_bucket")
        url, options = bucket.url("recipes"), RegistryOptions(s3_endpoint_url=bucket.endpoint_url)
        overrides = {"s3_endpoint_url": bucket.endpoint_url}
    # Publish the demo-signed 1.3.0 (archive and bundle as shipped) to the registry.
    shipped = spec_repo.path / "registry" / "review-responder" / "1.3.0"
    open_registry(url, options).push("review-responder", "1.3.0", shipped / "recipe.tar.gz",
                                     shipped / "recipe.tar.gz.sigstore.json")
    settings = settings_for(spec_repo.path, tmp_path / "state", temporal_address, temporal_namespace, **overrides)
    async with running_plnt(settings) as plnt:
        await wait_phase(plnt, "Ready", version="1.2.0")
        spec_repo.replace(RUN_FILE, "review-responder@1.2.0", "review-responder@1.3.0")
        spec_repo.replace(RUN_FILE, "registry: file:registry", f"registry: {url}")
        spec_repo.commit(f"1.3.0 from {kind}")
        await hook(plnt)
        await wait_phase(plnt, "Ready", version="1.3.0")
        assert (await invoke(plnt)).json()["version"] == "1.3.0"


async def test_runners_use_an_openai_compatible_model_server(
    spec_repo: SpecRepo, tmp_path: Path, temporal_address: str, temporal_namespace: str,
) -> None:
    """`plnt up --llm-url/--llm-model/--llm-api-key-env`: the runners call a real peer speaking the
    OpenAI wire format (the test server in tests/openai_peer.py, a STAND-IN for a model server), with
    the key plnt was given (the CLI reads it from the variable --llm-api-key-env names, and runners get
    that one variable)."""
    from pydantic import SecretStr

    from tests.openai_peer import OpenAIPeer

    with OpenAIPeer() as peer:
        peer.configure(api_key="sk-test-123")
        settings = settings_for(spec_repo.path, tmp_path / "state", temporal_address, temporal_namespace,
                                llm_url=peer.url, llm_model="test-model", llm_api_key_env="PLNT_TEST_LLM_KEY",
                                llm_api_key=SecretStr("sk-test-123"))
        async with running_plnt(settings) as plnt:
            await wait_phase(plnt, "Ready", version="1.2.0")
            peer.configure(reply="Thanks a lot, see you soon!")
            response = await invoke(plnt)
            assert response.status_code == 200, response.text
            assert response.json()["output"]["reply"].startswith("Thanks a lot, see you soon!")
            assert any((r.json or {}).get("model") == "test-model" for r in peer.requests), peer.requests[-1:]
        log_text = "".join(p.read_text() for p in (tmp_path / "state" / "runners").glob("*.log"))
        assert "sk-test-123" not in log_text
