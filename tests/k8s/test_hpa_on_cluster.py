"""charts/workflow-runner's and charts/model-server's HPAs on the REAL API server, acted on by the real
kube-controller-manager's horizontal-pod-autoscaler controller, through the Helm driver (real helm) as
the saga calls it (a WorkflowRun's release; a ModelDeployment's, as install_release's model step
sends it).

No metrics adapter runs here: the HPA cannot read its Pods metric (plnt_runner_in_flight_requests,
plnt_model_in_flight_requests), so it never scales on load; what the controller does without metrics
is hold the Deployment within its minReplicas..maxReplicas. Shown: an autoscaled release's Deployment is rendered without
`spec.replicas` (the HPA owns the count: the controller raises the Deployment to the spec's
`replicas.min`); a count the HPA chose (set here through the Deployment's scale subresource, the call
the HPA makes) survives a promotion, which is a helm upgrade of the same Deployment, and a raised
floor (`plnt scale`: the driver's set_replicas) reaches the Deployment through the HPA; a floor above
the HPA's ceiling raises the ceiling with it (the model-server chart refuses max < min).

kwok's nodes run no containers: the pods are Ready through kwok; the runners and model servers (their
weight-fetching init container and llama-server) never run, no weights are fetched."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from kubernetes import client as k8s
from plnt.reconciler.drivers.helm import HelmDriver, RunnerImage
from plnt.reconciler.drivers.protocol import InstallRequest

from tests.k8s.cluster import FakeNode, LocalCluster, wait_for
from tests.k8s.test_helm_driver_on_cluster import HELM, backend, deployment, driver_for, history, namespace, request, run
from tests.reconciler.drivers.test_helm_models import model
from tests.reconciler.drivers.test_helm_models import request as model_request

pytestmark = [pytest.mark.k8s, pytest.mark.integration]

AUTOSCALED = {"replicas": {"min": 2, "max": 4}, "autoscaling": {"targetInFlight": 4}}


@pytest.fixture(scope="module")
def cluster(k8s_bin_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(k8s_bin_dir, tmp_path_factory.mktemp("k8s-hpa"), nodes=(FakeNode("node-a"),)) as cluster:
        yield cluster


def available(cluster: LocalCluster, ns: str, name: str, replicas: int, version: str) -> bool:
    """The stable Deployment runs `replicas` Available pods of `version`, its rollout done."""
    d = deployment(cluster, ns, name)
    labels = d.spec.template.metadata.labels or {}
    return (d.spec.replicas == replicas and (d.status.available_replicas or 0) == replicas
            and (d.status.updated_replicas or 0) == replicas and (d.status.replicas or 0) == replicas
            and version in labels.values())


@dataclass(frozen=True)
class Autoscaled:
    """One chart's autoscaled release life: its driver, its two versions' install requests, its metric."""

    name: str
    driver: HelmDriver
    v1: InstallRequest
    v2: InstallRequest
    metric: str


def runner_release(cluster: LocalCluster, ns: str) -> Autoscaled:
    """A WorkflowRun's release (charts/workflow-runner)."""
    v1, v2 = run("1.1.0", **AUTOSCALED), run("1.2.0", **AUTOSCALED)
    return Autoscaled("review-responder", driver_for(cluster, ns, v1, v2), request(v1, "stable"),
                      request(v2, "canary"), "plnt_runner_in_flight_requests")


def model_release(cluster: LocalCluster, ns: str) -> Autoscaled:
    """A ModelDeployment's release (charts/model-server), its request as install_release's model step sends it."""
    v1, v2 = (model("chat", backend={"cluster": "test-cluster"}, version=v, **AUTOSCALED) for v in ("1.1.0", "1.2.0"))
    specs = {(m.metadata.namespace, m.metadata.name, m.fingerprint()): m.spec for m in (v1, v2)}
    driver = HelmDriver(backend(cluster, ns), lambda ns_, name, fp: specs.get((ns_, name, fp)),
                        image=RunnerImage(repository="registry.invalid/plnt", tag="0.1.0"), helm=HELM,
                        timeout_s=90, model_timeout_s=90)
    return Autoscaled("chat", driver, model_request(v1, "stable"), model_request(v2, "canary"),
                      "plnt_model_in_flight_requests")


@pytest.mark.parametrize("release_of", [runner_release, model_release], ids=["workflow-runner", "model-server"])
async def test_the_hpa_owns_the_count_and_a_promotion_keeps_it(cluster: LocalCluster, release_of: Callable[[LocalCluster, str], Autoscaled]) -> None:
    ns = namespace(cluster)
    release = release_of(cluster, ns)
    name, driver = release.name, release.driver
    apps, scaling = k8s.AppsV1Api(cluster.api_client()), k8s.AutoscalingV2Api(cluster.api_client())

    await driver.install(release.v1)
    hpa = scaling.read_namespaced_horizontal_pod_autoscaler(name, ns)
    assert (hpa.spec.min_replicas, hpa.spec.max_replicas) == (2, 4)
    assert hpa.spec.scale_target_ref.name == name
    assert hpa.spec.metrics[0].pods.metric.name == release.metric
    if release.metric == "plnt_model_in_flight_requests":  # the server's preStop sleep (drain on stop), as stored
        [server] = [c for c in deployment(cluster, ns, name).spec.template.spec.containers if c.name == "server"]
        assert server.lifecycle.pre_stop.sleep.seconds == 5, server.lifecycle
    # The chart leaves spec.replicas out (created at 1): the HPA controller raises it to its floor.
    wait_for("the HPA raises the Deployment to replicas.min", lambda: available(cluster, ns, name, 2, "1.1.0"),
             timeout=90)

    # Load as the HPA would see it: it sets 3 through the scale subresource.
    apps.patch_namespaced_deployment_scale(name, ns, {"spec": {"replicas": 3}})
    wait_for("3 replicas Available", lambda: available(cluster, ns, name, 3, "1.1.0"), timeout=60)

    await driver.install(release.v2)
    promoted = await driver.promote("team-a", name)
    assert promoted.version == "1.2.0"
    assert [h["status"] for h in history(cluster, ns, name)] == ["superseded", "deployed"]
    # The upgrade rolled the same Deployment to 1.2.0 at the HPA's count: no drop to the floor.
    assert deployment(cluster, ns, name).spec.replicas == 3
    wait_for("1.2.0 rolled out on 3 replicas", lambda: available(cluster, ns, name, 3, "1.2.0"), timeout=90)

    # `plnt scale` to 4 raises the HPA's floor, to 5 (above the ceiling of 4) the ceiling too; the
    # controller brings the Deployment up to it.
    for floor in (4, 5):
        await driver.set_replicas("team-a", name, floor)
        hpa = scaling.read_namespaced_horizontal_pod_autoscaler(name, ns)
        assert (hpa.spec.min_replicas, hpa.spec.max_replicas) == (floor, max(floor, 4))
        wait_for(f"the raised floor {floor} reached", lambda f=floor: available(cluster, ns, name, f, "1.2.0"),
                 timeout=90)
    await driver.remove("team-a", name, "stable")
