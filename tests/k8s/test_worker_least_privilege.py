"""The Helm driver as the chart's WORKER ServiceAccount on the REAL API server, its Role EQUAL to its use.

For each configuration of charts/plnt that changes the worker's grants (the defaults; no HPA rights,
`runners.autoscaling.enabled=false`; list for --wait, `rbac.worker.listForWait=true`, with helm's
informers listing as they do against an API server without watch-list; KEDA ScaledObjects instead of
HPAs, `runners.autoscaling.keda=true` for a backend with `autoscaler: {kind: keda}`, KEDA's CRDs on the
API server), the Roles `helm template`
renders for this cluster are applied and a token the TokenRequest API issued for `plnt-worker` runs,
through the driver, a whole life in a deploy namespace that enforces Pod Security `restricted`: a
WorkflowRun installed stable, a canary, the canary removed (the saga's rollback), a canary again,
promoted; a canary that never becomes Ready (its pod fits no node: helm's --wait times out and plnt
lists the pods for the reason); a ModelDeployment installed, its canary, promoted; everything
uninstalled. Between the steps the reconciler reads the live state with a token of `plnt-reconciler`.

The audit log then shows, per account: nothing refused, nothing outside the deploy namespace, and the
set of grants used EQUAL to the set granted (tests/k8s/rbac_audit.py: a server-side apply that
creates uses `create` too). Every pod the releases made was admitted under `restricted`. The server's
SubjectAccessReview refuses the worker what it must not do."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from kubernetes import client as k8s
from plnt.reconciler.drivers.helm import DriverError, HelmConfigError, HelmDriver, RunnerImage

from tests.k8s import rbac_audit
from tests.k8s.cluster import LocalCluster
from tests.k8s.keda_stack import apply_keda_crds
from tests.k8s.test_helm_driver_on_cluster import HELM, backend, run
from tests.k8s.test_helm_driver_on_cluster import request as install_request
from tests.reconciler.drivers.test_helm_models import model
from tests.reconciler.drivers.test_helm_models import request as model_request

pytestmark = [pytest.mark.k8s, pytest.mark.integration]

WORKER, RECONCILER = "plnt-worker", "plnt-reconciler"
RESTRICTED = {"pod-security.kubernetes.io/enforce": "restricted"}
NOWHERE = {"plnt.test/pool": "nowhere"}  # a nodeSelector no node of the cluster matches


@dataclass(frozen=True)
class Config:
    sets: tuple[str, ...] = ()
    autoscaling: bool = True  # the WorkflowRuns of the life autoscale (an HPA in their releases)
    env: dict[str, str] = field(default_factory=dict)  # helm's environment
    keda: bool = False  # the backend's autoscaler is KEDA: the releases render a ScaledObject, no HPA


CONFIGS = {
    "defaults": Config(),
    "no-autoscaling": Config(("--set", "runners.autoscaling.enabled=false"), autoscaling=False),
    # client-go's WatchListClient off: helm's informers list, then watch, as they do against an API
    # server without watch-list (Kubernetes < 1.34, where listForWait's `auto` grants list).
    "list-for-wait": Config(("--set", "rbac.worker.listForWait=true"), env={"KUBE_FEATURE_WatchListClient": "false"}),
    "keda": Config(("--set", "runners.autoscaling.enabled=false", "--set", "runners.autoscaling.keda=true"), keda=True),
}
KEDA = {"kind": "keda", "prometheusAddress": "http://prometheus.monitoring:9090"}  # (only KEDA's operator queries it)


@pytest.fixture(scope="module")
def cluster(k8s_bin_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(k8s_bin_dir, tmp_path_factory.mktemp("k8s-worker-rbac")) as cluster:
        yield cluster


def namespaces(cluster: LocalCluster, config: str) -> tuple[str, str]:
    """plnt's namespace and its deploy namespace for one configuration, both enforcing `restricted`."""
    plnt_ns, deploy_ns = f"plnt-{config}", f"runners-{config}"
    for name in (plnt_ns, deploy_ns):
        k8s.CoreV1Api(cluster.api_client()).create_namespace(
            k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=name, labels=RESTRICTED)))
    return plnt_ns, deploy_ns


def helm_driver(cluster: LocalCluster, deploy_ns: str, kubeconfig: Path, specs: dict, timeout_s: float = 90,
                keda: bool = False) -> HelmDriver:
    return HelmDriver(backend(cluster, deploy_ns, kubeconfig, KEDA if keda else None),
                      lambda ns, name, fp: specs.get((ns, name, fp)),
                      image=RunnerImage(repository="registry.invalid/plnt", tag="0.1.0"), helm=HELM,
                      timeout_s=timeout_s, model_timeout_s=timeout_s)


async def release_life(cluster: LocalCluster, deploy_ns: str, worker_kc: Path, reconciler_kc: Path,
                       autoscaling: bool, keda: bool = False) -> None:
    scaled = {"replicas": {"min": 1, "max": 3}, "autoscaling": {"targetInvocationsPerSecond": 25}} if autoscaling else {}
    v1, v2, v3 = run("1.1.0", **scaled), run("1.2.0", **scaled), run("1.3.0", **scaled)
    stuck = run("1.4.0", backend={"nodeSelector": NOWHERE}, **scaled)
    chat, chat_next = (model("chat", backend={"cluster": "test-cluster"}, version=v) for v in ("1.0.0", "1.1.0"))
    specs = {(r.metadata.namespace, r.metadata.name, r.fingerprint()): r.spec for r in (v1, v2, v3, stuck, chat, chat_next)}
    worker = helm_driver(cluster, deploy_ns, worker_kc, specs, keda=keda)
    reconciler = helm_driver(cluster, deploy_ns, reconciler_kc, specs, keda=keda)  # the reconciler only reads: live()

    await worker.install(install_request(v1, "stable"))
    await worker.install(install_request(v2, "canary"))
    await reconciler.live()
    await worker.remove("team-a", "review-responder", "canary")  # the saga's rollback of a canary
    await worker.install(install_request(v3, "canary"))
    await worker.promote("team-a", "review-responder")

    # A canary whose pod fits no node: helm's --wait times out; plnt lists the pods to say why.
    impatient = helm_driver(cluster, deploy_ns, worker_kc, specs, timeout_s=5, keda=keda)
    with pytest.raises(DriverError) as caught:
        await impatient.install(install_request(stuck, "canary"))
    assert "is not scheduled (Unschedulable)" in str(caught.value), str(caught.value)
    await worker.remove("team-a", "review-responder", "canary")

    await worker.install(model_request(chat, "stable"))
    await worker.install(model_request(chat_next, "canary"))
    await worker.promote("team-a", "chat")
    live = await reconciler.live()
    assert {key: lw.stable.version for key, lw in live.items() if lw.stable} == {
        "team-a/review-responder": "1.3.0", "team-a/chat": "1.1.0"}
    assert not any(lw.canary for lw in live.values())
    await worker.remove("team-a", "chat", "stable")
    await worker.remove("team-a", "review-responder", "stable")
    assert await reconciler.live() == {}


def pods_admitted(cluster: LocalCluster, deploy_ns: str) -> int:
    """Every pod create in the namespace (by the ReplicaSet controller) was admitted: 201, none refused."""
    creates = [e for e in cluster.audit_events() if e.get("stage") == "ResponseComplete" and e["verb"] == "create"
               and (e.get("objectRef") or {}).get("resource") == "pods" and not e["objectRef"].get("subresource")
               and e["objectRef"].get("namespace") == deploy_ns]
    refused = [e.get("responseStatus") for e in creates if e["responseStatus"]["code"] != 201]
    assert not refused, refused
    return len(creates)


@pytest.mark.parametrize("config", sorted(CONFIGS))
async def test_a_release_life_as_the_charts_worker_uses_exactly_what_its_role_grants(
        cluster: LocalCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, config: str,
        request: pytest.FixtureRequest) -> None:
    setup = CONFIGS[config]
    if setup.keda:  # (KEDA's CRDs only: nothing here needs its operator to act on a ScaledObject)
        apply_keda_crds(cluster, request.getfixturevalue("keda_bin_dir"))
    for name, value in setup.env.items():
        monkeypatch.setenv(name, value)
    plnt_ns, deploy_ns = namespaces(cluster, config)
    rbac_audit.apply_chart_rbac(cluster, HELM, plnt_ns, "--set", f"deployNamespaces={{{deploy_ns}}}", *setup.sets)
    worker_kc = rbac_audit.token_kubeconfig(cluster, plnt_ns, WORKER, tmp_path / "worker.kubeconfig")
    reconciler_kc = rbac_audit.token_kubeconfig(cluster, plnt_ns, RECONCILER, tmp_path / "reconciler.kubeconfig")

    await release_life(cluster, deploy_ns, worker_kc, reconciler_kc, setup.autoscaling, setup.keda)

    worker = rbac_audit.usage(cluster, plnt_ns, WORKER)
    assert worker.used, "the worker's token was not used"
    assert not worker.refused and not worker.ungranted, (worker.refused, worker.ungranted)
    assert {g[0] for g in worker.grants} == {deploy_ns}  # the worker's Roles are in the deploy namespace only
    print(f"{config}: worker {worker.figure()} ({deploy_ns})")
    assert worker.used == worker.grants, f"granted and not used: {sorted(worker.unused)}"
    hpa, scaled_objects = ("autoscaling", "horizontalpodautoscalers"), ("keda.sh", "scaledobjects")
    assert any(g[1:3] == hpa for g in worker.grants) is (setup.autoscaling and not setup.keda)
    assert any(g[1:3] == scaled_objects for g in worker.grants) is setup.keda
    if setup.keda:  # the life's autoscaled releases made ScaledObjects, by the worker's own token
        made = [e for e in cluster.audit_events() if e.get("stage") == "ResponseComplete"
                and (e.get("objectRef") or {}).get("resource") == "scaledobjects"
                and e["objectRef"].get("namespace") == deploy_ns and e["verb"] == "patch"
                and e["user"]["username"] == f"system:serviceaccount:{plnt_ns}:{WORKER}"]
        assert made and all(e["responseStatus"]["code"] in (200, 201) for e in made), made

    # The reconciler reads helm's release records in the deploy namespace (its Role there), nothing more.
    reconciler = rbac_audit.usage(cluster, plnt_ns, RECONCILER, only={deploy_ns})
    assert not reconciler.refused and not reconciler.ungranted, (reconciler.refused, reconciler.ungranted)
    print(f"{config}: reconciler in {deploy_ns}: {reconciler.figure()}")
    assert reconciler.used == reconciler.grants, f"granted and not used: {sorted(reconciler.unused)}"

    # Pod Security `restricted` admitted every pod: two runner tracks (three times), the stuck canary, models.
    assert pods_admitted(cluster, deploy_ns) >= 6

    # What the worker must not do, as the server's authorizer answers.
    def worker_can(verb: str, resource: str, where: str | None, group: str = "", sub: str | None = None) -> bool:
        return rbac_audit.can(cluster, plnt_ns, WORKER, verb, resource, where, group, sub)

    assert worker_can("patch", "deployments", deploy_ns, "apps")
    assert not worker_can("get", "secrets", plnt_ns) and not worker_can("list", "secrets", "kube-system")
    assert not worker_can("create", "pods", deploy_ns, sub="exec")
    assert not worker_can("create", "namespaces", None)
    assert not worker_can("create", "clusterrolebindings", None, "rbac.authorization.k8s.io")
    assert not worker_can("update", "deployments", deploy_ns, "apps")  # helm 3's verb: not granted
    assert not worker_can("create", "ingresses", deploy_ns, "networking.k8s.io")  # plnt's releases have none
    assert worker_can("list", "configmaps", deploy_ns) is ("list-for-wait" == config)

    if not setup.autoscaling:
        # Without HPA rights, a WorkflowRun that autoscales fails its install, naming what is missing.
        scaled = run("2.0.0", replicas={"min": 1, "max": 2}, autoscaling={"targetInvocationsPerSecond": 5})
        driver = helm_driver(cluster, deploy_ns, worker_kc, {("team-a", "review-responder", scaled.fingerprint()):
                                                             scaled.spec})
        with pytest.raises(HelmConfigError) as refused:
            await driver.install(install_request(scaled, "stable"))
        assert 'cannot get resource "horizontalpodautoscalers"' in str(refused.value), str(refused.value)
        # helm checks every object before it creates any: nothing was made, not even a release record.
        assert k8s.AppsV1Api(cluster.api_client()).list_namespaced_deployment(deploy_ns).items == []
        assert await driver.live() == {}
