"""charts/plnt with `source.kind: kubernetes` on the REAL API server (tests/k8s/cluster.py): the chart
installs (`helm install --wait`, no spec repository) with one source namespace and the operator's
platform ConfigMap; the live reconciler and worker Deployments carry `--source kubernetes`,
`--source-namespace` and `--platform-dir` with that ConfigMap mounted read-only there.

Then plnt itself, with TokenRequest tokens of the chart's own ServiceAccounts (kwok runs no
containers, so plnt runs here as a process, as tests/k8s/test_kubernetes_source.py runs it):
`plnt up --source kubernetes` as `plnt-reconciler` rolls out a WorkflowRun created in the source
namespace and writes its status and Events; a KubernetesSource as `plnt-worker` lists what a worker
checks a saga against. The audit log shows, for each account in the source namespace, EXACTLY the
grants of the chart's source Role used (tests/k8s/rbac_audit.py), nothing refused there; the same calls
in a namespace not listed are refused by the server, and its SubjectAccessReview refuses each account
what the source mode must not do (a spec write, a delete, another namespace, cluster-wide listing).
"""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from kubernetes import client as k8s
from plnt.reconciler.control.kube import api_client
from plnt.reconciler.control.kube_calls import API_CALLS
from plnt.reconciler.source.kubernetes import KubernetesSource, KubernetesSourceError

from tests.e2e.test_plnt_up_process import gateway_port
from tests.k8s import rbac_audit
from tests.k8s.cluster import LocalCluster, wait_for
from tests.k8s.test_cluster import _helm
from tests.k8s.test_kubernetes_source import (
    EXAMPLE,
    GROUP,
    NS,
    PLURAL,
    VERSION,
    PlntUpFromCluster,
    cr_status,
    platform_dir,
    run_body,
)

pytestmark = [pytest.mark.k8s, pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "plnt"
PLNT_NS, RELEASE = "plnt", "plnt"  # the release name holds the chart's: objects are "plnt-<role>"
SOURCE_NS, OTHER_NS = NS, "team-b"  # plnt reads "default"; team-b exists and is not listed
CONFIGMAP = "plnt-platform"
RESTRICTED = {"pod-security.kubernetes.io/enforce": "restricted"}
# The platform ConfigMap: gitops-example's backend, recipe trust policy and its trusted root (keys are
# flat; the items put them where the policy names them).
PLATFORM_FILES = {"local.yaml": "backends/local.yaml", "policy.yaml": "trust/policy.yaml",
                  "demo-trusted-root.json": "trust/demo-trusted-root.json"}
VALUES = {
    "source": {"kind": "kubernetes", "namespaces": [SOURCE_NS], "platformConfigMap": CONFIGMAP,
               "platformItems": [{"key": key, "path": path} for key, path in PLATFORM_FILES.items()]},
    "temporal": {"address": "temporal.invalid:7233"},
    "auth": {"tokens": {"secretName": "plnt-tokens"}},
}


def source_calls(role: str) -> set[tuple[str, str, str]]:
    return {(c.group, c.resource, c.verb) for c in API_CALLS if c.role == role and c.scope == "source"}


@dataclass
class Installed:
    cluster: LocalCluster
    install: subprocess.CompletedProcess[str]


@pytest.fixture(scope="module")
def installed(k8s_bin_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    """A cluster of this module's own (its audit log holds only this module's calls), the chart installed."""
    tmp = tmp_path_factory.mktemp("k8s-chart-source")
    with LocalCluster(k8s_bin_dir, tmp / "cluster") as cluster:
        core = k8s.CoreV1Api(cluster.api_client())
        for name, labels in ((PLNT_NS, RESTRICTED), ("plnt-runners", RESTRICTED), (OTHER_NS, {})):
            core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=name, labels=labels)))
        core.create_namespaced_secret(PLNT_NS, k8s.V1Secret(metadata=k8s.V1ObjectMeta(name="plnt-tokens"),
                                                            string_data={"tokens": "test-token-0123456789abcdef:read\n"}))
        core.create_namespaced_config_map(PLNT_NS, k8s.V1ConfigMap(
            metadata=k8s.V1ObjectMeta(name=CONFIGMAP),
            data={key: (EXAMPLE / path).read_text() for key, path in PLATFORM_FILES.items()}))
        values = tmp / "values.json"
        values.write_text(json.dumps(VALUES))
        env = {"HOME": str(tmp), "PATH": "/usr/bin:/bin", "HELM_CACHE_HOME": str(tmp / "helm-cache"),
               "HELM_CONFIG_HOME": str(tmp / "helm-config"), "HELM_DATA_HOME": str(tmp / "helm-data")}
        install = subprocess.run([_helm(), "--kubeconfig", str(cluster.kubeconfig), "--namespace", PLNT_NS, "install",
                                  RELEASE, str(CHART), "--values", str(values), "--wait", "--timeout", "180s"],
                                 capture_output=True, text=True, env=env, timeout=240)
        yield Installed(cluster, install)


def test_the_chart_reads_the_cluster_with_exactly_the_source_calls(installed: Installed, tmp_path: Path) -> None:
    cluster, install = installed.cluster, installed.install
    assert install.returncode == 0, f"helm install failed:\n{install.stdout}\n{install.stderr}"
    assert "warning" not in install.stderr.lower(), install.stderr

    # The live Deployments: the source flags, no git flag, the ConfigMap read-only at --platform-dir.
    apps = k8s.AppsV1Api(cluster.api_client())
    for role, command in (("reconciler", "reconcile"), ("worker", "worker")):
        deployment = apps.read_namespaced_deployment(f"{RELEASE}-{role}", PLNT_NS)
        assert deployment.status.ready_replicas == deployment.spec.replicas, role
        pod = deployment.spec.template.spec
        [container] = pod.containers
        assert container.args[:7] == [command, "--source", "kubernetes", "--source-namespace", SOURCE_NS,
                                      "--platform-dir", "/etc/plnt/platform"], container.args
        assert not {"--repo", "--branch", "--path"} & set(container.args)
        [mount] = [m for m in container.volume_mounts if m.mount_path == "/etc/plnt/platform"]
        assert mount.read_only is True
        [volume] = [v for v in pod.volumes if v.name == mount.name]
        assert volume.config_map.name == CONFIGMAP
        assert {(i.key, i.path) for i in volume.config_map.items} == set(PLATFORM_FILES.items())
        assert pod.service_account_name == f"{RELEASE}-{role}"

    # plnt as the chart's reconciler: a WorkflowRun created in the source namespace rolls out, its
    # status and Events written onto it.
    admin = k8s.CustomObjectsApi(cluster.api_client())
    platform = platform_dir(tmp_path)
    kubeconfig = cluster.token_kubeconfig(f"{RELEASE}-reconciler", PLNT_NS, tmp_path / "reconciler.kubeconfig")
    plnt = PlntUpFromCluster(platform, kubeconfig, tmp_path / "state", gateway_port(), tmp_path / "plnt.log")
    try:
        plnt.wait_passes(1)
        admin.create_namespaced_custom_object(GROUP, VERSION, SOURCE_NS, PLURAL, run_body("review-responder"))
        ready = plnt.wait_ready(timeout=180)
        assert ready["version"] == "1.2.0", ready
        status = wait_for("the CR's status Ready", lambda: cr_status(admin, "review-responder").get("phase") == "Ready"
                          and cr_status(admin, "review-responder"), timeout=60)
        assert status["observedGeneration"] == 1, status
        events = k8s.CoreV1Api(cluster.api_client()).list_namespaced_event(
            SOURCE_NS, field_selector="involvedObject.name=review-responder").items
        assert "Ready" in {e.reason for e in events}, [e.reason for e in events]
        plnt.wait_passes(2)  # a watch round and a listing after the rollout
    except BaseException:
        plnt.kill()
        raise
    plnt.stop_and_check(signal.SIGINT)

    # The same code as the chart's worker: the listing a worker checks a saga's input against.
    worker_config = cluster.token_kubeconfig(f"{RELEASE}-worker", PLNT_NS, tmp_path / "worker.kubeconfig")
    with api_client(worker_config) as api:
        source = KubernetesSource(api, platform, namespaces=(SOURCE_NS,))
        assert "review-responder" in {o.name for o in source.snapshot(source.fetch()).objects.values()}
    # Elsewhere the server refuses both accounts: a namespace not listed, and every namespace.
    for config in (kubeconfig, worker_config):
        for namespaces in ((OTHER_NS,), ()):
            with api_client(config) as api, pytest.raises(KubernetesSourceError, match="HTTP 403"):
                KubernetesSource(api, platform, namespaces=namespaces).fetch()

    # The audit log: in the source namespace each account used every grant of its source Role and
    # nothing else; outside it, only refusals.
    for role in ("reconciler", "worker"):
        account = f"{RELEASE}-{role}"
        calls = rbac_audit.calls(cluster, rbac_audit.user(PLNT_NS, account))
        there = [c for c in calls if c.namespace == SOURCE_NS]
        assert there and all(c.code < 400 for c in there), [c for c in there if c.code >= 400]
        assert {(c.group, c.resource, c.verb) for c in there} == source_calls(role), role
        elsewhere = [c for c in calls if c.namespace != SOURCE_NS]
        assert elsewhere and all(c.code == 403 for c in elsewhere), elsewhere
        assert {c.namespace for c in elsewhere} == {OTHER_NS, ""}, "the namespace not listed, and every namespace"
        used = rbac_audit.usage(cluster, PLNT_NS, account, only={SOURCE_NS})
        assert not used.ungranted, used.ungranted
        print(f"{role} in {SOURCE_NS} (source Role): {used.figure()}")
        assert used.used == used.grants, f"granted and not used: {sorted(used.unused)}"
        assert {g[1:4] for g in used.grants} == source_calls(role)

    # What the source mode must not do, as the server's own authorizer answers.
    def can(role: str, verb: str, resource: str, where: str | None, group: str = GROUP, sub: str | None = None) -> bool:
        return rbac_audit.can(cluster, PLNT_NS, f"{RELEASE}-{role}", verb, resource, where, group, sub)

    assert can("reconciler", "watch", "workflowruns", SOURCE_NS) and can("reconciler", "patch", "workflowruns", SOURCE_NS,
                                                                          sub="status")
    for verb in ("get", "create", "update", "patch", "delete"):  # never a spec write, never a delete
        assert not can("reconciler", verb, "workflowruns", SOURCE_NS), verb
        assert not can("worker", verb, "workflowruns", SOURCE_NS), verb
    assert not can("worker", "watch", "workflowruns", SOURCE_NS)
    assert not can("worker", "patch", "workflowruns", SOURCE_NS, sub="status")
    assert not can("worker", "create", "events", SOURCE_NS, group="")
    for role in ("reconciler", "worker"):
        assert not can(role, "list", "workflowruns", OTHER_NS)
        assert not can(role, "list", "modeldeployments", None)  # every namespace: a ClusterRole it was not given
    assert not can("reconciler", "patch", "workflowruns", OTHER_NS, sub="status")
    assert not can("reconciler", "create", "events", OTHER_NS, group="")
    assert not can("reconciler", "get", "configmaps", PLNT_NS, group="")  # the platform comes from the mount
    assert not can("reconciler", "list", "plntbackends", None)  # backends and trust: never from the cluster
    manifest = yaml.safe_load_all(subprocess.run(
        [_helm(), "--kubeconfig", str(cluster.kubeconfig), "--namespace", PLNT_NS, "get", "manifest", RELEASE],
        capture_output=True, text=True, check=True, env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}).stdout)
    assert not {d["kind"] for d in manifest if d} & {"ClusterRole", "ClusterRoleBinding"}
