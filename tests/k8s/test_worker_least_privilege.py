"""The Helm driver as the chart's WORKER ServiceAccount on the REAL API server: a token the
TokenRequest API issued for `plnt-worker`, bound only by the Roles `helm template charts/plnt`
renders, runs a release's whole life (stable, canary, the canary removed, a canary again, promoted,
retired) in the deploy namespace. The audit log then shows every (verb, resource) helm used: each one
granted, none refused, none outside the deploy namespace; what the Role grants and this life did not
use is listed (and bounded) below, each with its reason."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes import utils as k8s_utils

from tests.k8s.cluster import LocalCluster
from tests.k8s.test_helm_driver_on_cluster import driver_for, run
from tests.k8s.test_helm_driver_on_cluster import request as install_request
from tests.k8s.test_mirror_least_privilege import PLNT_NS, REQUIRED_VALUES, ROOT, helm

pytestmark = [pytest.mark.k8s, pytest.mark.integration]

DEPLOY_NS = "plnt-runners"  # the chart's default deploy namespace
WORKER = "plnt-worker"
USER = f"system:serviceaccount:{PLNT_NS}:{WORKER}"
# Granted and not used by helm 4 in this life, and why they stay granted:
NOT_USED_HERE = {
    # helm 4 creates and changes objects by server-side apply (PATCH); helm 3 (>= 3.13 is supported)
    # creates them and updates by three-way merge.
    ("", "configmaps", "create"), ("", "services", "create"), ("apps", "deployments", "create"),
    ("autoscaling", "horizontalpodautoscalers", "create"),
    ("", "configmaps", "update"), ("", "services", "update"), ("apps", "deployments", "update"),
    ("autoscaling", "horizontalpodautoscalers", "update"), ("", "secrets", "update"),
    ("networking.k8s.io", "ingresses", "get"), ("networking.k8s.io", "ingresses", "list"),
    ("networking.k8s.io", "ingresses", "watch"), ("networking.k8s.io", "ingresses", "create"),
    ("networking.k8s.io", "ingresses", "update"), ("networking.k8s.io", "ingresses", "patch"),
    ("networking.k8s.io", "ingresses", "delete"),  # a WorkflowRun with an ingress (off by default)
    ("", "configmaps", "watch"), ("", "services", "watch"), ("apps", "deployments", "watch"),
    ("autoscaling", "horizontalpodautoscalers", "watch"),  # helm 3's --wait, and uninstall --wait of some kinds
    ("", "pods", "get"), ("apps", "replicasets", "get"), ("apps", "replicasets", "watch"),
    ("", "pods", "watch"),  # --wait's readers vary by helm version
    ("", "configmaps", "list"), ("", "services", "list"), ("apps", "deployments", "list"),
    ("autoscaling", "horizontalpodautoscalers", "list"),
}


@pytest.fixture(scope="module")
def cluster(k8s_bin_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(k8s_bin_dir, tmp_path_factory.mktemp("k8s-worker-rbac")) as cluster:
        api = cluster.api_client()
        for name in (PLNT_NS, DEPLOY_NS):
            labels = {"pod-security.kubernetes.io/enforce": "restricted"}
            k8s.CoreV1Api(api).create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=name, labels=labels)))
        rendered = subprocess.run([helm(), "template", "plnt", str(ROOT / "charts" / "plnt"), "--namespace", PLNT_NS,
                                   *REQUIRED_VALUES], capture_output=True, text=True, check=True).stdout
        for doc in yaml.safe_load_all(rendered):
            if doc and doc["kind"] in ("ServiceAccount", "Role", "RoleBinding"):
                k8s_utils.create_from_dict(api, doc)
        yield cluster


def worker_kubeconfig(cluster: LocalCluster, path: Path) -> Path:
    request = k8s.AuthenticationV1TokenRequest(spec=k8s.V1TokenRequestSpec(audiences=[], expiration_seconds=3600))
    token = k8s.CoreV1Api(cluster.api_client()).create_namespaced_service_account_token(
        WORKER, PLNT_NS, request).status.token
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "worker",
        "clusters": [{"name": "test", "cluster": {"server": cluster.server,
                                                  "certificate-authority": str(cluster.pki / "ca.crt")}}],
        "users": [{"name": WORKER, "user": {"token": token}}],
        "contexts": [{"name": "worker", "context": {"cluster": "test", "user": WORKER}}]}))
    return path


def granted(cluster: LocalCluster) -> set[tuple[str, str, str]]:
    rbac = k8s.RbacAuthorizationV1Api(cluster.api_client())
    out = set()
    for binding in rbac.list_namespaced_role_binding(DEPLOY_NS).items:
        if any(s.name == WORKER and s.namespace == PLNT_NS for s in binding.subjects or []):
            for rule in rbac.read_namespaced_role(binding.role_ref.name, DEPLOY_NS).rules:
                out |= {(g, r, v) for g in rule.api_groups for r in rule.resources for v in rule.verbs}
    return out


async def test_a_release_life_as_the_charts_worker_uses_only_what_its_role_grants(
        cluster: LocalCluster, tmp_path: Path) -> None:
    kubeconfig = worker_kubeconfig(cluster, tmp_path / "worker.kubeconfig")
    scaled = {"replicas": {"min": 1, "max": 3}, "autoscaling": {"targetInvocationsPerSecond": 25}}
    v1, v2, v3 = run("1.1.0", **scaled), run("1.2.0", **scaled), run("1.3.0", **scaled)
    driver = driver_for(cluster, DEPLOY_NS, v1, v2, v3, kubeconfig=kubeconfig)
    await driver.install(install_request(v1, "stable"))
    await driver.install(install_request(v2, "canary"))
    await driver.remove("team-a", "review-responder", "canary")
    await driver.install(install_request(v3, "canary"))
    await driver.promote("team-a", "review-responder")
    assert {key: lw.stable.version for key, lw in (await driver.live()).items() if lw.stable} == {
        "team-a/review-responder": "1.3.0"}
    await driver.remove("team-a", "review-responder", "stable")
    assert await driver.live() == {}

    used: set[tuple[str, str, str]] = set()
    for event in cluster.audit_events():
        if event.get("user", {}).get("username") != USER or event.get("stage") != "ResponseComplete":
            continue
        ref = event.get("objectRef") or {}
        code = event.get("responseStatus", {}).get("code", 0)
        if not ref:  # discovery (/version, /api, /apis): open to every authenticated user
            assert event["requestURI"].startswith(("/version", "/api", "/openapi")), event["requestURI"]
            continue
        assert code not in (401, 403), f"refused: {event['verb']} {ref}"
        assert ref.get("namespace") == DEPLOY_NS, f"outside the deploy namespace: {event['verb']} {ref}"
        used.add((ref.get("apiGroup", ""), ref.get("resource", ""), event["verb"]))
    grants = granted(cluster)
    assert used, "the worker's token was not used"
    assert used <= grants, used - grants
    unused = grants - used
    print(f"worker Role: {len(grants)} grants, {len(used)} used, unused: {sorted(unused)}")
    assert unused <= NOT_USED_HERE, sorted(unused - NOT_USED_HERE)
