"""The test control plane is a real one: real apiserver, scheduler and controllers, fake (kwok) nodes.

Each test checks something only the real components do: the version they were built as, a Deployment
rolled out by the controllers and scheduled by the scheduler, GPU capacity and node selectors honoured
(and exhausted), the audit log, two clusters not sharing state, and helm's --wait against it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.k8s.cluster import (
    BINARIES,
    DEFAULT_NODES,
    GPU_CLASS_LABEL,
    GPU_RESOURCE,
    KWOK_STAGES,
    ClusterError,
    FakeNode,
    LocalCluster,
    wait_for,
)

pytestmark = [pytest.mark.k8s, pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]
IMAGE = "registry.invalid/plnt/never-pulled:1"  # kwok runs no containers: the image is never fetched


def _namespace(cluster: LocalCluster, prefix: str) -> str:
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    with cluster.api_client() as api:
        client.CoreV1Api(api).create_namespace({"metadata": {"name": name}})
    return name


def _pod(name: str, *, gpus: int = 0, gpu_class: str | None = None) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": IMAGE}
    if gpus:
        container["resources"] = {"limits": {GPU_RESOURCE: str(gpus)}}
    spec: dict[str, Any] = {"containers": [container]}
    if gpu_class:
        spec["nodeSelector"] = {GPU_CLASS_LABEL: gpu_class}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def test_the_server_reports_the_release_it_was_built_from(k8s_cluster: LocalCluster) -> None:
    version = json.loads(k8s_cluster.get("/version"))
    assert version["gitVersion"].startswith("v1.37."), version
    assert (version["major"], version["minor"]) == ("1", "37"), version


def test_a_deployment_is_scheduled_onto_kwok_nodes_and_becomes_available(k8s_cluster: LocalCluster) -> None:
    ns = _namespace(k8s_cluster, "deploy")
    labels = {"app": "web"}
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
        "spec": {"replicas": 3, "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels}, "spec": {"containers": [{"name": "web", "image": IMAGE}]}}},
    }
    with k8s_cluster.api_client() as api:
        apps, core = client.AppsV1Api(api), client.CoreV1Api(api)
        apps.create_namespaced_deployment(ns, deployment)

        def available() -> bool:
            status = apps.read_namespaced_deployment("web", ns).status
            conditions = {c.type: c.status for c in status.conditions or ()}
            return status.ready_replicas == 3 and conditions.get("Available") == "True"

        wait_for("Deployment web to have 3 ready replicas and be Available", available, timeout=90)
        pods = core.list_namespaced_pod(ns, label_selector="app=web").items
        assert len(pods) == 3
        fake_nodes = {n.name for n in DEFAULT_NODES}
        for pod in pods:
            assert pod.spec.node_name in fake_nodes, pod.spec.node_name
            assert pod.status.phase == "Running"
            assert pod.metadata.owner_references[0].kind == "ReplicaSet"  # the deployment controller made it
        # The scheduler (not anything in this test) bound them: it says so in each pod's events.
        events = core.list_namespaced_event(ns, field_selector="reason=Scheduled").items
        assert {e.involved_object.name for e in events} == {p.metadata.name for p in pods}
        assert {e.reporting_component or e.source.component for e in events} == {"default-scheduler"}


def test_a_gpu_pod_lands_only_on_a_node_of_its_gpu_class(k8s_cluster: LocalCluster) -> None:
    ns = _namespace(k8s_cluster, "gpu")
    with k8s_cluster.api_client() as api:
        core = client.CoreV1Api(api)
        core.create_namespaced_pod(ns, _pod("on-l4", gpus=1, gpu_class="l4"))
        core.create_namespaced_pod(ns, _pod("on-a100", gpus=1, gpu_class="a100"))

        def running(name: str) -> Any:
            pod = core.read_namespaced_pod(name, ns)
            return pod if pod.status.phase == "Running" else None

        assert wait_for("pod on-l4 Running", lambda: running("on-l4")).spec.node_name == "gpu-l4-0"
        assert wait_for("pod on-a100 Running", lambda: running("on-a100")).spec.node_name == "gpu-a100-0"

        # The l4 class has one GPU, now taken: a second l4 pod is not placed anywhere else, it waits.
        core.create_namespaced_pod(ns, _pod("second-l4", gpus=1, gpu_class="l4"))

        def unschedulable() -> str:
            pod = core.read_namespaced_pod("second-l4", ns)
            scheduled = next((c for c in pod.status.conditions or () if c.type == "PodScheduled"), None)
            return scheduled.message if scheduled and scheduled.reason == "Unschedulable" else ""

        message = wait_for("pod second-l4 to be reported Unschedulable", unschedulable)
        assert GPU_RESOURCE in message, message  # "Insufficient nvidia.com/gpu"
        assert core.read_namespaced_pod("second-l4", ns).spec.node_name is None

        # Freeing the l4 GPU lets the waiting pod in, on the l4 node.
        core.delete_namespaced_pod("on-l4", ns, grace_period_seconds=0)
        assert wait_for("pod second-l4 Running", lambda: running("second-l4"), timeout=90).spec.node_name == "gpu-l4-0"


def test_the_audit_log_records_who_did_what_to_which_resource_where(k8s_cluster: LocalCluster) -> None:
    ns = _namespace(k8s_cluster, "audit")
    name = f"marker-{uuid.uuid4().hex[:8]}"
    with k8s_cluster.api_client() as api:
        client.CoreV1Api(api).create_namespaced_config_map(ns, {"metadata": {"name": name}, "data": {"k": "v"}})

    def creation() -> dict[str, Any] | None:
        return next((e for e in k8s_cluster.audit_events()
                     if e.get("stage") == "ResponseComplete" and e.get("verb") == "create"
                     and e.get("objectRef", {}).get("name") == name), None)

    event = wait_for(f"an audit event for creating configmap {name}", creation, timeout=10)
    assert event["level"] == "Metadata"
    assert event["user"]["username"] == "plnt-test-admin"
    assert "system:masters" in event["user"]["groups"]
    assert event["objectRef"]["resource"] == "configmaps"
    assert event["objectRef"]["namespace"] == ns
    assert event["responseStatus"]["code"] == 201
    assert "requestObject" not in event  # Metadata level: no bodies


def test_two_clusters_started_at_once_share_nothing(k8s_bin_dir: Path, tmp_path: Path) -> None:
    clusters = [LocalCluster(k8s_bin_dir, tmp_path / name, nodes=[FakeNode(f"{name}-node")]) for name in ("one", "two")]
    errors: list[BaseException] = []

    def start(cluster: LocalCluster) -> None:
        try:
            cluster.start()
        except BaseException as e:  # noqa: BLE001 - re-raised in the test thread below
            errors.append(e)

    threads = [threading.Thread(target=start, args=(c,)) for c in clusters]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        one, two = clusters
        assert one.port != two.port
        only_in_one = _namespace(one, "only-in-one")
        with two.api_client() as api:
            core_two = client.CoreV1Api(api)
            with pytest.raises(ApiException) as missing:
                core_two.read_namespace(only_in_one)
            assert missing.value.status == 404
            assert [n.metadata.name for n in core_two.list_node().items] == ["two-node"]
        with one.api_client() as api:
            assert [n.metadata.name for n in client.CoreV1Api(api).list_node().items] == ["one-node"]
    finally:
        for c in clusters:
            c.close()
    assert not any(alive for c in clusters for alive in c.alive().values())


def _helm() -> str:
    local = ROOT / ".venv" / "bin" / "helm"
    for candidate in (str(local), "/work/main/.venv/bin/helm", shutil.which("helm") or ""):
        if candidate and Path(candidate).is_file():
            return candidate
    pytest.fail("helm not found: `make install` puts it in .venv/bin", pytrace=False)


def test_helm_install_with_wait_completes(k8s_cluster: LocalCluster, tmp_path: Path) -> None:
    chart = tmp_path / "tiny"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: tiny\nversion: 0.1.0\n")
    (chart / "values.yaml").write_text(f"replicas: 2\nimage: {IMAGE}\nnodeSelector: {{}}\n")
    (chart / "templates" / "deployment.yaml").write_text("""\
apiVersion: apps/v1
kind: Deployment
metadata: {name: "{{ .Release.Name }}"}
spec:
  replicas: {{ .Values.replicas }}
  selector: {matchLabels: {app: "{{ .Release.Name }}"}}
  template:
    metadata: {labels: {app: "{{ .Release.Name }}"}}
    spec:
      nodeSelector: {{ toJson .Values.nodeSelector }}
      containers: [{name: app, image: "{{ .Values.image }}"}]
""")
    (chart / "templates" / "service.yaml").write_text("""\
apiVersion: v1
kind: Service
metadata: {name: "{{ .Release.Name }}"}
spec:
  selector: {app: "{{ .Release.Name }}"}
  ports: [{port: 80}]
""")
    ns = f"helm-{uuid.uuid4().hex[:8]}"
    helm = [_helm(), "--kubeconfig", str(k8s_cluster.kubeconfig), "--namespace", ns]
    env = {"HOME": str(tmp_path), "PATH": "/usr/bin:/bin",  # no user helm config, no cache outside tmp
           "HELM_CACHE_HOME": str(tmp_path / "helm-cache"), "HELM_CONFIG_HOME": str(tmp_path / "helm-config"),
           "HELM_DATA_HOME": str(tmp_path / "helm-data")}
    done = subprocess.run([*helm, "install", "tiny", str(chart), "--create-namespace", "--wait", "--timeout", "120s"],
                          capture_output=True, text=True, env=env, timeout=180)
    assert done.returncode == 0, f"helm install failed:\n{done.stdout}\n{done.stderr}"
    status = json.loads(subprocess.run([*helm, "status", "tiny", "-o", "json"], capture_output=True, text=True,
                                       env=env, check=True).stdout)
    assert status["info"]["status"] == "deployed"
    with k8s_cluster.api_client() as api:
        deployment = client.AppsV1Api(api).read_namespaced_deployment("tiny", ns)
        assert deployment.status.ready_replicas == 2
        assert client.CoreV1Api(api).read_namespaced_service("tiny", ns).spec.cluster_ip.startswith("10.0.0.")

    # --wait really waits: a release whose pods fit no node (no h100 class here) fails at its timeout.
    label = GPU_CLASS_LABEL.replace(".", "\\.")  # --set splits keys at unescaped dots
    stuck = subprocess.run([*helm, "install", "stuck", str(chart), "--set", f"nodeSelector.{label}=h100",
                            "--wait", "--timeout", "5s"], capture_output=True, text=True, env=env, timeout=60)
    assert stuck.returncode != 0, stuck.stdout
    assert "not ready" in stuck.stderr and "Deployment" in stuck.stderr, stuck.stderr


def test_a_process_that_dies_during_start_is_named_with_the_end_of_its_log(k8s_bin_dir: Path, tmp_path: Path) -> None:
    bins = tmp_path / "bin"
    bins.mkdir()
    for name in (*BINARIES, KWOK_STAGES):
        (bins / name).symlink_to(k8s_bin_dir / name)
    (bins / "kube-apiserver").unlink()
    (bins / "kube-apiserver").write_text("#!/bin/sh\necho 'refusing to serve: a test says so' >&2\nexit 3\n")
    (bins / "kube-apiserver").chmod(0o755)
    cluster = LocalCluster(bins, tmp_path / "work")
    with pytest.raises(ClusterError) as failed:
        cluster.start()
    assert "kube-apiserver exited with code 3" in str(failed.value)
    assert "refusing to serve: a test says so" in str(failed.value)
    assert cluster.alive() == {"etcd": False, "kube-apiserver": False}  # etcd, started before it, was stopped
