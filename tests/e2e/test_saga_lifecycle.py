"""The saga under a stream of commits and out-of-band changes: real Temporal, git, runners.

The runners' model is MockBackend (`--backend mock`, the default), a STAND-IN for a model server
unless a test says otherwise; recipes are signed by test authorities (tests/sigstore_ca.py),
STAND-INS for Sigstore's public services."""

from __future__ import annotations

import asyncio
import os
import signal
import uuid
from pathlib import Path

import pytest

from tests.conftest import SpecRepo
from tests.e2e.harness import hook, invoke, running_plnt, settings_for, status_of, wait_for, wait_phase
from tests.e2e.test_commit_to_serving import RUN_FILE, _alive, runner_pids
from tests.services import OciServer

pytestmark = pytest.mark.integration


async def test_three_quick_commits_only_the_newest_ends_ready(
    spec_repo: SpecRepo, tmp_path: Path, temporal_address: str, temporal_namespace: str
) -> None:
    settings = settings_for(spec_repo.path, tmp_path / "state", temporal_address, temporal_namespace)
    async with running_plnt(settings) as plnt:
        await wait_phase(plnt, "Ready", version="1.2.0")
        for version in ("1.5.0", "1.4.0", "1.3.0"):  # slow, broken, good: each supersedes the last
            spec_repo.replace(RUN_FILE, _current_ref(spec_repo), f"review-responder@{version}")
            spec_repo.commit(f"review-responder {version}")
            await hook(plnt)
            await asyncio.sleep(0.3)
        await wait_phase(plnt, "Ready", version="1.3.0", timeout=60)
        await wait_for(lambda: plnt.reconciler.running_sagas == set(), what="no saga running")
        live = plnt.driver.snapshot()["default/review-responder"]
        assert live.canary is None and live.stable.version == "1.3.0"
        for version in ("1.5.0", "1.4.0"):
            assert not [p for p in _runner_pids_of_version(version)], f"a {version} runner was left behind"
        assert (await invoke(plnt)).json()["version"] == "1.3.0"


def _current_ref(repo: SpecRepo) -> str:
    text = (repo.path / RUN_FILE).read_text()
    start = text.index("review-responder@")
    return text[start:text.index("\n", start)]


def _runner_pids_of_version(version: str) -> list[int]:
    return runner_pids(f"default.review-responder.{version}.")  # prefix of the release id


async def test_reverting_a_commit_mid_saga_keeps_the_stable_release(
    spec_repo: SpecRepo, tmp_path: Path, temporal_address: str, temporal_namespace: str
) -> None:
    settings = settings_for(spec_repo.path, tmp_path / "state", temporal_address, temporal_namespace)
    async with running_plnt(settings) as plnt:
        await wait_phase(plnt, "Ready", version="1.2.0")
        stable_pid = plnt.driver.snapshot()["default/review-responder"].stable.pid
        spec_repo.replace(RUN_FILE, "review-responder@1.2.0", "review-responder@1.5.0")
        spec_repo.commit("1.5.0")
        await hook(plnt)
        await wait_phase(plnt, "Canary", version="1.2.0")
        spec_repo.git("revert", "--no-edit", "HEAD")
        await hook(plnt)
        status = await wait_for(lambda: (s := status_of(plnt)) and s["phase"] == "Ready" and s["canaryVersion"] is None
                                and plnt.reconciler.running_sagas == set() and s, what="back to Ready 1.2.0")
        assert status["version"] == "1.2.0"
        live = plnt.driver.snapshot()["default/review-responder"]
        assert live.canary is None and live.stable.pid == stable_pid
        assert not _runner_pids_of_version("1.5.0")


@pytest.mark.parametrize("self_heal", [True, False], ids=["self-heal", "report-only"])
async def test_a_runner_killed_by_hand_is_restored_or_reported(
    spec_repo: SpecRepo, tmp_path: Path, temporal_address: str, temporal_namespace: str, self_heal: bool
) -> None:
    if not self_heal:
        spec_repo.replace(RUN_FILE, "  replicas:", "  selfHeal: false\n  replicas:")
        spec_repo.commit("report drift only")
    settings = settings_for(spec_repo.path, tmp_path / "state", temporal_address, temporal_namespace)
    async with running_plnt(settings) as plnt:
        await wait_phase(plnt, "Ready", version="1.2.0")
        release = plnt.driver.snapshot()["default/review-responder"].stable
        saga_id = status_of(plnt)["sagaId"]
        os.kill(release.pid, signal.SIGKILL)
        await wait_for(lambda: not _alive(release.pid), what="runner to die")
        if self_heal:
            healed = await wait_for(
                lambda: (r := plnt.driver.snapshot()["default/review-responder"].stable).pid != release.pid and _alive(r.pid) and r,
                timeout=15, what="runner restarted")
            assert healed.release_id == release.release_id and healed.version == "1.2.0"
            assert "drift healed" in status_of(plnt)["message"]
            assert (await invoke(plnt)).json()["version"] == "1.2.0"
        else:
            await wait_for(lambda: "drift:" in status_of(plnt)["message"], timeout=15, what="drift reported")
            assert "selfHeal: false" in status_of(plnt)["message"]
            assert plnt.driver.snapshot()["default/review-responder"].stable.pid == release.pid, "left alone"
            assert (await invoke(plnt)).status_code == 502
        assert status_of(plnt)["sagaId"] == saga_id, "healing is not a redeploy"


async def test_gpu_class_the_backend_lacks_fails_validation_and_installs_nothing(
    spec_repo: SpecRepo, tmp_path: Path, temporal_address: str, temporal_namespace: str
) -> None:
    settings = settings_for(spec_repo.path, tmp_path / "state", temporal_address, temporal_namespace)
    async with running_plnt(settings) as plnt:
        await wait_phase(plnt, "Ready", version="1.2.0")
        before = plnt.driver.snapshot()
        spec_repo.replace(RUN_FILE, "review-responder@1.2.0", "review-responder@1.3.0")
        spec_repo.replace(RUN_FILE, "    cluster: local", "    cluster: local\n    gpuClass: nvidia.com/h100\n    gpuCount: 1")
        bad = spec_repo.commit("1.3.0 on an H100")
        await hook(plnt)
        status = await wait_for(lambda: (s := status_of(plnt)) and bad[:12] in s["message"] and s, what="rejection")
        assert "spec.backend.gpuClass" in status["lastError"] and "offers no GPU classes" in status["lastError"]
        assert plnt.driver.snapshot() == before and plnt.reconciler.running_sagas == set()
        assert not list(plnt.state.runner_logs.glob("default.review-responder.1.3.0.*"))


async def test_history_shows_each_step_of_the_newest_saga(
    spec_repo: SpecRepo, tmp_path: Path, temporal_address: str, temporal_namespace: str
) -> None:
    from plnt.reconciler.cli.main import app
    from typer.testing import CliRunner

    settings = settings_for(spec_repo.path, tmp_path / "state", temporal_address, temporal_namespace)
    async with running_plnt(settings) as plnt:
        await wait_phase(plnt, "Ready", version="1.2.0")
        spec_repo.replace(RUN_FILE, "review-responder@1.2.0", "review-responder@1.4.0")
        spec_repo.commit("broken 1.4.0")
        await hook(plnt)
        await wait_phase(plnt, "RolledBack", version="1.2.0")
        await wait_for(lambda: plnt.reconciler.running_sagas == set(), what="saga over")
        runner = CliRunner()
        # The CLI is synchronous and plnt serves from this event loop: run the CLI in a thread.
        shown = await asyncio.to_thread(runner.invoke, app, ["history", "review-responder", "--url", plnt.url, "--json"])
        assert shown.exit_code == 0, shown.output
        import json

        data = json.loads(shown.output)
        steps = [(s["step"], s["outcome"]) for s in data["steps"]]
        assert steps == [("validate", "completed"), ("pull_recipe", "completed"), ("install_release", "completed"),
                         ("smoke_test", "completed"), ("remove_release", "completed")]
        assert all(s["attempts"] == 1 and s["duration_ms"] >= 0 for s in data["steps"])
        assert data["result"]["phase"] == "RolledBack" and "error rate 100%" in data["result"]["reason"]
        table = await asyncio.to_thread(runner.invoke, app, ["history", "review-responder", "--url", plnt.url])
        assert "smoke_test" in table.output and "RolledBack" in table.output
        missing = await asyncio.to_thread(runner.invoke, app, ["history", "nope", "--url", plnt.url])
        assert missing.exit_code == 1 and "no saga has run for default/nope" in missing.output


async def test_a_kubernetes_backend_goes_through_the_helm_driver(
    spec_repo: SpecRepo, tmp_path: Path, temporal_address: str, temporal_namespace: str, oci_registry: OciServer,
) -> None:
    """The real helm binary, the real chart, a kube context that does not exist (no cluster can run
    here): the saga reaches helm, the error is a dead end named in the status, and the WorkflowRun on
    the local backend is untouched. Its recipe is the example's signed archive, pushed to a real OCI
    registry: a runner pod fetches its recipe itself and reaches no `file:` registry."""
    import shutil

    from plnt.reconciler.drivers.helm import DEFAULT_CHART
    from plnt.reconciler.recipes.registries import RegistryOptions, open_registry

    helm = shutil.which("helm") or str(Path(__import__("sys").executable).parent / "helm")
    entry = spec_repo.path / "registry" / "review-responder" / "1.2.0"
    registry = f"oci://{oci_registry.address}/e2e-{uuid.uuid4().hex[:8]}"
    open_registry(registry, RegistryOptions(allow_insecure_http=(oci_registry.address,))).push(
        "review-responder", "1.2.0", entry / "recipe.tar.gz", entry / "recipe.tar.gz.sigstore.json")
    spec_repo.write("backends/gpu.yaml", (
        "apiVersion: plnt.work/v1\nkind: PlntBackend\nmetadata: {name: gpu-cluster-01}\n"
        "spec:\n  type: kubernetes\n  gpuClasses: [nvidia.com/h100]\n"
        f"  kubernetes: {{context: plnt-test-no-such-context, namespace: agents, kubeconfig: {tmp_path / 'kubeconfig'}}}\n"))
    (tmp_path / "kubeconfig").write_text("apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\nusers: []\n")
    text = (spec_repo.path / RUN_FILE).read_text()
    spec_repo.write("workflowruns/on-gpu.yaml", text.replace("name: review-responder\n", "name: rr-gpu\n")
                    .replace("    cluster: local", "    cluster: gpu-cluster-01\n    gpuClass: nvidia.com/h100\n    gpuCount: 1")
                    .replace("registry: file:registry", f"registry: {registry}"))
    spec_repo.write("workflowruns/from-file.yaml", text.replace("name: review-responder\n", "name: rr-file\n")
                    .replace("    cluster: local", "    cluster: gpu-cluster-01"))
    spec_repo.commit("a WorkflowRun on a kubernetes backend")
    settings = settings_for(spec_repo.path, tmp_path / "state", temporal_address, temporal_namespace,
                            helm_binary=helm, helm_chart=DEFAULT_CHART, oci_insecure_hosts=(oci_registry.address,))
    async with running_plnt(settings) as plnt:
        await wait_phase(plnt, "Ready", version="1.2.0")
        status = await wait_phase(plnt, "Failed", name="rr-gpu", timeout=60)
        assert status["lastError"].startswith("HelmConfigError"), status
        assert "plnt-test-no-such-context" in status["lastError"]
        # A registry inside the spec repository cannot reach a pod: refused at validation, before the pull.
        refused = await wait_phase(plnt, "Failed", name="rr-file", timeout=60)
        assert refused["lastError"].startswith("InvalidSpec") and "cannot be reached from a runner pod" in \
            refused["lastError"], refused
        assert set(plnt.driver.snapshot()) == {"default/review-responder"}, "nothing of rr-gpu ran locally"
        assert set(plnt.drivers.snapshot()) == {"default/review-responder"}, "no Helm release was made"
        assert (await invoke(plnt)).json()["version"] == "1.2.0"


async def test_a_slow_first_token_rolls_back_on_the_ttft_budget(
    spec_repo: SpecRepo, tmp_path: Path, temporal_address: str, temporal_namespace: str
) -> None:
    """A streaming workflow (post-generator) with a TTFT budget: 1.0.0 passes it; a 1.0.1 whose
    first token comes 2 s late is rolled back with a reason that names TTFT. (The budget, 1.5 s,
    leaves 1.0.0 room on a busy machine: at 300 ms a loaded CI machine once rolled 1.0.0 back.)"""
    import shutil

    from plnt.reconciler.recipes.archive import pack_recipe_to

    from tests.sigstore_ca import TestSigstoreAuthority

    # 1.0.1: the same recipe, two seconds slower to its first token. Signed by a test authority
    # that a second trust policy in the spec repository trusts for post-generator.
    source = tmp_path / "post-generator-1.0.1"
    shutil.copytree(spec_repo.path / "recipes" / "post-generator" / "1.0.0", source)
    (source / "workflow.yaml").write_text((source / "workflow.yaml").read_text().replace("version: 1.0.0", "version: 1.0.1"))
    steps = (source / "steps.py").read_text()
    (source / "steps.py").write_text(steps.replace("    text = draft(", "    await __import__('asyncio').sleep(2.0)\n    text = draft(", 1))
    entry = spec_repo.path / "testregistry" / "post-generator" / "1.0.1"
    entry.mkdir(parents=True)
    pack_recipe_to(source, entry / "recipe.tar.gz")
    authority = TestSigstoreAuthority(name="ttft-test")
    (entry / "recipe.tar.gz.sigstore.json").write_text(authority.sign(entry / "recipe.tar.gz", "ci@test", "https://issuer.test"))
    authority.write_trusted_root(spec_repo.path / "trust" / "test-root.json")
    spec_repo.write("trust/test-policy.yaml", (
        "apiVersion: plnt.work/v1\nkind: RecipeTrustPolicy\nmetadata: {name: ttft-test}\n"
        "spec:\n  recipes: [post-generator]\n  trustRoot: {trustedRootFile: trust/test-root.json}\n"
        "  signers: [{issuer: https://issuer.test, identity: ci@test}]\n"))
    spec_repo.write("workflowruns/post-generator.yaml", (
        "apiVersion: plnt.work/v1\nkind: WorkflowRun\nmetadata: {name: post-generator}\n"
        "spec:\n  workflow: {ref: post-generator@1.0.0, registry: 'file:registry'}\n  backend: {cluster: local}\n"
        "  canary:\n    trafficPercent: 5\n    smokeTest: {invocations: 6, p95BudgetMs: 10000, ttftBudgetMs: 1500}\n"))
    spec_repo.commit("post-generator with a TTFT budget")
    settings = settings_for(spec_repo.path, tmp_path / "state", temporal_address, temporal_namespace)
    async with running_plnt(settings) as plnt:
        ready = await wait_phase(plnt, "Ready", version="1.0.0", name="post-generator")
        assert ready["smokeTest"]["metrics"]["ttft_p95_ms"] is not None, "the smoke test streamed"
        assert ready["smokeTest"]["metrics"]["ttft_p95_ms"] < 1500
        spec_repo.replace("workflowruns/post-generator.yaml", "post-generator@1.0.0, registry: 'file:registry'",
                          "post-generator@1.0.1, registry: 'file:testregistry'")
        spec_repo.commit("post-generator 1.0.1")
        await hook(plnt)
        status = await wait_phase(plnt, "RolledBack", version="1.0.0", name="post-generator", timeout=60)
        assert "TTFT p95" in status["lastError"] and "over budget 1500 ms" in status["lastError"], status
        assert plnt.driver.snapshot()["default/post-generator"].canary is None


async def test_removing_every_workflowrun_of_a_backend_in_one_commit(
    spec_repo: SpecRepo, tmp_path: Path, temporal_address: str, temporal_namespace: str
) -> None:
    text = (spec_repo.path / RUN_FILE).read_text()
    for name in ("rr-two", "rr-three"):
        spec_repo.write(f"workflowruns/{name}.yaml", text.replace("name: review-responder\n", f"name: {name}\n"))
    spec_repo.commit("three WorkflowRuns on the local backend")
    settings = settings_for(spec_repo.path, tmp_path / "state", temporal_address, temporal_namespace)
    async with running_plnt(settings) as plnt:
        for name in ("review-responder", "rr-two", "rr-three"):
            await wait_phase(plnt, "Ready", version="1.2.0", name=name)
        pids = [live.stable.pid for live in plnt.driver.snapshot().values()]
        assert len(pids) == 3
        spec_repo.git("rm", "-q", "-r", "workflowruns", "backends")  # the backend and all its WorkflowRuns
        spec_repo.commit("retire the local backend")
        await hook(plnt)
        await wait_for(lambda: plnt.statuses.all() == [] and plnt.driver.snapshot() == {}, timeout=60,
                       what="all three uninstalled")
        assert all(not _alive(pid) for pid in pids)
        assert (await invoke(plnt, name="rr-two")).status_code == 404
