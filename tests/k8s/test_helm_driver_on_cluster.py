"""The Helm driver (real helm, charts/workflow-runner) against the REAL API server: a stable release,
a canary beside it, the canary removed as a rollback does with the stable release untouched (its helm
history), a promotion; and a GPU WorkflowRun placed by the real scheduler on its GPU pool only, or
left Pending with the reason when no GPU is free.

kwok's nodes run no containers: a pod's init container (`plnt recipe fetch`) and runner never run
here; what is shown is what the cluster holds and does with them (Deployments Available through the
controllers, scheduler and kwok; the pod spec's arguments as the chart renders them)."""

from __future__ import annotations

import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from plnt.core.specs.models import PlntBackend, WorkflowRun
from plnt.reconciler.drivers.helm import DriverError, HelmDriver, RunnerImage
from plnt.reconciler.drivers.protocol import InstallRequest

from tests.k8s.cluster import GPU_RESOURCE, FakeNode, LocalCluster, wait_for
from tests.reconciler.drivers.test_helm_driver import TRUST  # a RecipeTrustPolicy the saga verified with

pytestmark = [pytest.mark.k8s, pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]
HELM = shutil.which("helm") or str(ROOT / ".venv" / "bin" / "helm")
GPU_CLASS = "nvidia.com/a100"  # the workflow-runner chart's convention: GPU pools are labelled `<class>: "true"`
NODES = (FakeNode("node-a"), FakeNode("node-b"),
         FakeNode("gpu-a100-0", gpus=1, labels={GPU_CLASS: "true"}),
         FakeNode("gpu-l4-0", gpus=1, labels={"nvidia.com/l4": "true"}))
DIGEST = "sha256:" + "9a" * 32


@pytest.fixture(scope="module")
def cluster(k8s_bin_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(k8s_bin_dir, tmp_path_factory.mktemp("k8s-helm-driver"), nodes=NODES) as cluster:
        yield cluster


def namespace(cluster: LocalCluster) -> str:
    """A fresh namespace enforcing Pod Security `restricted`: the charts' pods must be admitted there."""
    name = f"agents-{uuid.uuid4().hex[:6]}"
    labels = {"pod-security.kubernetes.io/enforce": "restricted"}
    k8s.CoreV1Api(cluster.api_client()).create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=name,
                                                                                                labels=labels)))
    return name


def backend(cluster: LocalCluster, ns: str, kubeconfig: Path | None = None,
            autoscaler: dict[str, Any] | None = None) -> PlntBackend:
    return PlntBackend.model_validate({
        "apiVersion": "plnt.work/v1", "kind": "PlntBackend", "metadata": {"name": "test-cluster"},
        "spec": {"type": "kubernetes", "gpuClasses": [GPU_CLASS],
                 "kubernetes": {"namespace": ns, "kubeconfig": str(kubeconfig or cluster.kubeconfig),
                                **({"autoscaler": autoscaler} if autoscaler else {})}}})


def run(version: str, **spec: Any) -> WorkflowRun:
    return WorkflowRun.model_validate({
        "apiVersion": "plnt.work/v1", "kind": "WorkflowRun",
        "metadata": {"name": "review-responder", "namespace": "team-a"},
        "spec": {"workflow": {"ref": f"review-responder@{version}", "registry": "oci://registry.example/recipes"},
                 "backend": {"cluster": "test-cluster", **spec.pop("backend", {})}, **spec}})


def request(workflow: WorkflowRun, track: str) -> InstallRequest:
    return InstallRequest(namespace=workflow.metadata.namespace, name=workflow.metadata.name, track=track,
                          version=workflow.spec.workflow.version, spec_fingerprint=workflow.fingerprint(),
                          recipe_digest=DIGEST, recipe_dir="/var/lib/plnt/recipe",
                          traffic_percent=5 if track == "canary" else 0, trust=TRUST)


def driver_for(cluster: LocalCluster, ns: str, *runs: WorkflowRun, timeout_s: float = 60,
               kubeconfig: Path | None = None) -> HelmDriver:
    by_fingerprint = {(r.metadata.namespace, r.metadata.name, r.fingerprint()): r.spec for r in runs}
    return HelmDriver(backend(cluster, ns, kubeconfig), lambda ns_, name, fp: by_fingerprint.get((ns_, name, fp)),
                      image=RunnerImage(repository="registry.invalid/plnt", tag="0.1.0"), helm=HELM,
                      timeout_s=timeout_s)


def history(cluster: LocalCluster, ns: str, release: str) -> list[dict[str, Any]]:
    import json

    done = subprocess.run([HELM, "history", release, "-n", ns, "-o", "json", "--kubeconfig", str(cluster.kubeconfig)],
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def deployment(cluster: LocalCluster, ns: str, name: str) -> k8s.V1Deployment:
    return k8s.AppsV1Api(cluster.api_client()).read_namespaced_deployment(name, ns)


async def test_stable_canary_rollback_and_promotion_through_real_helm(cluster: LocalCluster) -> None:
    ns = namespace(cluster)
    v1, v2 = run("1.1.0"), run("1.2.0")
    driver = driver_for(cluster, ns, v1, v2)
    stable = await driver.install(request(v1, "stable"))
    assert stable.endpoint == f"http://review-responder.{ns}.svc.cluster.local"
    ready = deployment(cluster, ns, "review-responder")
    assert ready.status.available_replicas == ready.spec.replicas == 1  # --wait returned: Available for real
    init = ready.spec.template.spec.init_containers[0]
    assert [*init.command, *init.args][:3] == ["plnt", "recipe", "fetch"] or "fetch" in (init.args or []), init
    assert DIGEST in " ".join([*(init.command or []), *(init.args or [])])

    await driver.install(request(v2, "canary"))
    assert deployment(cluster, ns, "review-responder-canary").status.available_replicas == 1
    live = await driver.live()
    assert {(t, r.version) for lw in live.values() for t, r in (("stable", lw.stable), ("canary", lw.canary)) if r} \
        == {("stable", "1.1.0"), ("canary", "1.2.0")}

    # A bad canary is compensated: its release goes, the stable one is as it was (one revision, deployed).
    await driver.remove("team-a", "review-responder", "canary")
    assert [h["status"] for h in history(cluster, ns, "review-responder")] == ["deployed"]
    with pytest.raises(k8s.ApiException):
        deployment(cluster, ns, "review-responder-canary")

    canary = await driver.install(request(v2, "canary"))
    pods = {p.metadata.uid for p in k8s.CoreV1Api(cluster.api_client()).list_namespaced_pod(ns).items}
    # A stepped canary's next step: a new revision with the share, and no pod changed (templates do not read it).
    moved = await driver.set_traffic("team-a", "review-responder", 40, canary_header=("x-cohort", "testers"))
    assert moved.traffic_percent == 40 and moved.release_id == canary.release_id
    assert moved.canary_header == ("x-cohort", "testers")
    assert (await driver.live())["team-a/review-responder"].canary.traffic_percent == 40  # type: ignore[union-attr]
    assert [h["status"] for h in history(cluster, ns, "review-responder-canary")][-1] == "deployed"
    assert len(history(cluster, ns, "review-responder-canary")) == 2
    assert {p.metadata.uid for p in k8s.CoreV1Api(cluster.api_client()).list_namespaced_pod(ns).items} == pods
    promoted = await driver.promote("team-a", "review-responder")
    assert promoted.version == "1.2.0"
    assert [h["status"] for h in history(cluster, ns, "review-responder")] == ["superseded", "deployed"]
    live = await driver.live()
    (only,) = live.values()
    assert only.stable is not None and only.stable.version == "1.2.0" and only.canary is None


async def test_a_gpu_workflowrun_lands_on_its_gpu_pool_or_waits_with_the_reason(cluster: LocalCluster) -> None:
    ns = namespace(cluster)
    gpu = run("1.0.0", backend={"gpuClass": GPU_CLASS, "gpuCount": 1})
    driver = driver_for(cluster, ns, gpu, timeout_s=20)
    await driver.install(request(gpu, "stable"))
    pods = k8s.CoreV1Api(cluster.api_client()).list_namespaced_pod(ns).items
    (pod,) = [p for p in pods if p.metadata.name.startswith("review-responder-")]
    assert pod.spec.node_name == "gpu-a100-0"  # the a100 pool only, though an l4 GPU was free too
    runner = pod.spec.containers[0]
    assert runner.resources.limits[GPU_RESOURCE] == "1"

    # The pool's one GPU is taken: the canary cannot be scheduled. helm --wait times out, and the
    # error says why the pod waits (the scheduler's reason), not only that it timed out.
    with pytest.raises(DriverError) as caught:
        await driver.install(request(gpu.model_copy(deep=True), "canary"))
    pending = wait_for("the canary pod", lambda: [
        p for p in k8s.CoreV1Api(cluster.api_client()).list_namespaced_pod(ns).items
        if p.metadata.name.startswith("review-responder-canary")])
    (waiting,) = pending
    assert waiting.status.phase == "Pending"
    conditions = {c.type: c for c in waiting.status.conditions or []}
    assert conditions["PodScheduled"].reason == "Unschedulable"
    assert f"Insufficient {GPU_RESOURCE}" in conditions["PodScheduled"].message
    assert f"Insufficient {GPU_RESOURCE}" in str(caught.value), str(caught.value)
    await free_the_gpus(cluster, driver, ns, "team-a", "review-responder")


def api_requests(cluster: LocalCluster, namespace: str) -> list[str]:
    """The admin's (so the driver's helm's) resource requests to `namespace` so far, from the audit log."""
    return [f"{e['verb']} {e['objectRef'].get('resource')}" for e in cluster.audit_events()
            if e.get("stage") == "ResponseComplete" and e.get("user", {}).get("username") == "plnt-test-admin"
            and (e.get("objectRef") or {}).get("namespace") == namespace]


async def test_an_idle_live_read_costs_the_same_api_requests_for_3_or_9_releases(cluster: LocalCluster) -> None:
    """The drift check runs on every reconcile pass: its cost must not grow with the WorkflowRuns."""
    ns = namespace(cluster)
    runs = [run("1.0.0").model_copy(update={"metadata": run("1.0.0").metadata.model_copy(update={"name": f"wf-{i}"})})
            for i in range(9)]
    driver = driver_for(cluster, ns, *runs)

    async def idle_cost() -> int:
        await driver.live()  # reads what it has not seen
        before = len(api_requests(cluster, ns))
        await driver.live()  # the idle pass
        return len(api_requests(cluster, ns)) - before

    for workflow in runs[:3]:
        await driver.install(request(workflow, "stable"))
    with_3 = await idle_cost()
    for workflow in runs[3:]:
        await driver.install(request(workflow, "stable"))
    with_9 = await idle_cost()
    print(f"API requests of an idle live read: {with_3} with 3 releases, {with_9} with 9")
    assert len(await driver.live()) == 9
    assert with_3 == with_9 == 1  # one list of helm's release Secrets


async def test_a_vllm_model_deployment_lands_on_its_gpu_pool_or_says_which_capacity_is_missing(
        cluster: LocalCluster) -> None:
    from tests.reconciler.drivers.test_helm_models import model
    from tests.reconciler.drivers.test_helm_models import request as model_request

    ns = namespace(cluster)
    chat = model("chat", runtime={"type": "vllm"}, backend={"cluster": "test-cluster", "gpuClass": GPU_CLASS,
                                                             "gpuCount": 1})
    by_fingerprint = {(chat.metadata.namespace, chat.metadata.name, chat.fingerprint()): chat.spec}
    driver = HelmDriver(backend(cluster, ns), lambda ns_, name, fp: by_fingerprint.get((ns_, name, fp)),
                        image=RunnerImage(repository="registry.invalid/plnt", tag="0.1.0"), helm=HELM,
                        timeout_s=20, model_timeout_s=20)
    await driver.install(model_request(chat, "stable"))
    pods = k8s.CoreV1Api(cluster.api_client()).list_namespaced_pod(ns).items
    (pod,) = pods
    assert pod.spec.node_name == "gpu-a100-0"
    assert pod.spec.containers[0].resources.limits[GPU_RESOURCE] == "1"
    with pytest.raises(DriverError) as caught:  # the a100 pool's one GPU is taken
        await driver.install(model_request(chat, "canary"))
    assert "not scheduled (Unschedulable)" in str(caught.value) and f"Insufficient {GPU_RESOURCE}" in str(caught.value)
    await free_the_gpus(cluster, driver, ns, "team-a", "chat")


async def free_the_gpus(cluster: LocalCluster, driver: HelmDriver, ns: str, namespace: str, name: str) -> None:
    """Uninstall both tracks and wait until their pods are gone: the next GPU test needs the pool."""
    await driver.remove(namespace, name, "canary")
    await driver.remove(namespace, name, "stable")
    wait_for("the GPU pods gone", lambda: not k8s.CoreV1Api(cluster.api_client()).list_namespaced_pod(ns).items,
             timeout=60)
