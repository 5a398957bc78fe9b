"""KEDA and a real Prometheus beside a test cluster (tests/k8s/cluster.py), as a cluster that scales on
the in-flight signal through KEDA runs them, with processes in place of their pods:

- KEDA's CRDs (ScaledObject...) from the release tools/build_keda.sh built, applied to the API server;
- KEDA's operator (the ScaledObject controller, which makes and drives each one's HPA, and the gRPC
  metrics service that runs the scalers' queries) and its metrics adapter (the external metrics API
  server), from the same build, with the cluster's admin kubeconfig, leader election and certificate
  rotation off: one certificate from the cluster's CA (server and client: the operator and the adapter
  talk mutual TLS) in a cert dir holding ca.crt, tls.crt and tls.key, as KEDA's own Secret would;
- the APIService v1beta1.external.metrics.k8s.io: the aggregator resolves its Service, of type
  ExternalName `localhost` (no kube-proxy here, and Endpoints refuse 127.0.0.1), to
  https://localhost:PORT (k8s.io/apiserver's proxy.ResolveCluster), and checks the adapter's
  certificate for the Service's name (NAME.NAMESPACE.svc) against the APIService's caBundle;
- Prometheus (Debian's `prometheus` binary) scraping each Running pod's container port named `http` on
  the pod's IP every second, each series labelled `namespace` and `pod`, as a Prometheus scraping pods
  labels them. Debian builds it without kubernetes_sd: the targets come from the API server's pod list
  through a file_sd file (PodTargets, a STAND-IN for that discovery).

Call it inside the cluster's PodNetwork (tests/k8s/pod_network.py): the pods' IPs answer only there.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s

from tests.k8s.cluster import LocalCluster, free_port, wait_for

KEDA_NAMESPACE = "keda"
ADAPTER_SERVICE = "keda-operator-metrics-apiserver"
EXTERNAL_METRICS = "v1beta1.external.metrics.k8s.io"


def _certs(cluster: LocalCluster, into: Path) -> Path:
    """KEDA's cert dir: the cluster CA, and one certificate for the operator's gRPC server, the adapter's
    gRPC client and the adapter's HTTPS server (the aggregator dials it as the Service's name)."""
    cluster.issue("keda", into, server=True, client=True, ips=["127.0.0.1"],
                  dns=["localhost", f"{ADAPTER_SERVICE}.{KEDA_NAMESPACE}.svc", f"keda-operator.{KEDA_NAMESPACE}.svc"])
    return into


def apply_keda_crds(cluster: LocalCluster, keda_bin: Path) -> None:
    api = k8s.ApiextensionsV1Api(cluster.api_client())
    names = []
    for path in sorted((keda_bin / "crds").glob("*.yaml")):
        body = yaml.safe_load(path.read_text())
        api.create_custom_resource_definition(body)
        names.append(body["metadata"]["name"])

    def established() -> bool:
        for name in names:
            conditions = api.read_custom_resource_definition(name).status.conditions or []
            if not any(c.type == "Established" and c.status == "True" for c in conditions):
                return False
        return True

    wait_for("KEDA's CRDs Established", established, timeout=30)


def start_keda(cluster: LocalCluster, keda_bin: Path, work: Path) -> None:
    """KEDA's CRDs, operator, metrics adapter and APIService on `cluster`; returns once the API server
    reports the external metrics API Available (it reached the adapter)."""
    core = k8s.CoreV1Api(cluster.api_client())
    core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=KEDA_NAMESPACE)))
    apply_keda_crds(cluster, keda_bin)
    certs = _certs(cluster, work / "keda-certs")
    grpc = f"127.0.0.1:{free_port()}"
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "KUBECONFIG": str(cluster.kubeconfig),
           # KEDA's own namespace (its Secrets for TriggerAuthentications, leader election) and every
           # namespace watched, as its Deployment sets them from the downward API.
           "KEDA_CLUSTER_OBJECT_NAMESPACE": KEDA_NAMESPACE, "POD_NAMESPACE": KEDA_NAMESPACE, "WATCH_NAMESPACE": ""}
    cluster.run_beside("keda-operator", keda_bin / "keda-operator", [
        f"--kubeconfig={cluster.kubeconfig}", f"--cert-dir={certs}", f"--metrics-service-bind-address={grpc}",
        f"--metrics-bind-address=127.0.0.1:{free_port()}", f"--health-probe-bind-address=127.0.0.1:{free_port()}",
        "--leader-elect=false", "--enable-cert-rotation=false",
        "--enable-webhook-patching=false", "--enable-apiservice-patching=false",  # no webhooks; the APIService is ours
        "--zap-log-level=info"], env=env)
    adapter_port = free_port()
    cluster.run_beside("keda-adapter", keda_bin / "keda-adapter", [
        f"--secure-port={adapter_port}", "--bind-address=127.0.0.1",
        f"--tls-cert-file={certs / 'tls.crt'}", f"--tls-private-key-file={certs / 'tls.key'}", f"--cert-dir={certs}",
        f"--lister-kubeconfig={cluster.kubeconfig}", f"--authentication-kubeconfig={cluster.kubeconfig}",
        f"--authorization-kubeconfig={cluster.kubeconfig}",
        f"--metrics-service-address={grpc}", f"--port={free_port()}",  # --port: the adapter's own /metrics
        "--zap-log-level=info"], env=env)
    core.create_namespaced_service(KEDA_NAMESPACE, k8s.V1Service(
        metadata=k8s.V1ObjectMeta(name=ADAPTER_SERVICE),
        spec=k8s.V1ServiceSpec(type="ExternalName", external_name="localhost")))
    registration = k8s.ApiregistrationV1Api(cluster.api_client())
    registration.create_api_service({
        "apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService", "metadata": {"name": EXTERNAL_METRICS},
        "spec": {"group": "external.metrics.k8s.io", "version": "v1beta1", "groupPriorityMinimum": 100,
                 "versionPriority": 100, "caBundle": base64.b64encode((certs / "ca.crt").read_bytes()).decode(),
                 "service": {"name": ADAPTER_SERVICE, "namespace": KEDA_NAMESPACE, "port": adapter_port}}})

    def available() -> Any:
        cluster.check_alive()
        conditions = registration.read_api_service(EXTERNAL_METRICS).status.conditions or []
        return next((c for c in conditions if c.type == "Available" and c.status == "True"), None) or conditions

    wait_for("the external metrics API Available (the aggregator reaching KEDA's adapter)", available, timeout=90)


class PodTargets(threading.Thread):
    """STAND-IN for Prometheus's kubernetes_sd (role pod), which Debian's prometheus is built without:
    every 0.5 s, the Running pods of the API server (terminating ones too, until they are gone, as
    kubernetes_sd lists them) with a container port named `http`, written as a file_sd target list
    (POD_IP:PORT, labelled with the pod's `namespace` and `pod`)."""

    def __init__(self, cluster: LocalCluster, path: Path) -> None:
        super().__init__(name="pod-targets", daemon=True)
        self.core = k8s.CoreV1Api(cluster.api_client())
        self.path = path
        self.stop = threading.Event()
        self.write([])

    def write(self, targets: list[dict[str, Any]]) -> None:
        partial = self.path.with_suffix(".partial")
        partial.write_text(json.dumps(targets))
        partial.replace(self.path)  # Prometheus never reads half a file

    def run(self) -> None:
        last: list[dict[str, Any]] = []
        while not self.stop.is_set():
            try:
                targets = [
                    {"targets": [f"{pod.status.pod_ip}:{port.container_port}"],
                     "labels": {"namespace": pod.metadata.namespace, "pod": pod.metadata.name}}
                    for pod in self.core.list_pod_for_all_namespaces().items
                    if pod.status.pod_ip and pod.status.phase == "Running"
                    for container in pod.spec.containers for port in container.ports or () if port.name == "http"]
            except Exception:  # noqa: BLE001 - the API server away for a moment: the last list stands
                targets = last
            if targets != last:
                self.write(targets)
                last = targets
            self.stop.wait(0.5)


def prometheus_config(targets: Path) -> str:
    """Each target scraped every second at /metrics."""
    return f"""
global: {{scrape_interval: 1s, scrape_timeout: 1s}}
scrape_configs:
  - job_name: pods
    file_sd_configs:
      - {{files: ["{targets}"], refresh_interval: 1s}}
"""


@contextlib.contextmanager
def running_prometheus(cluster: LocalCluster, work: Path) -> Iterator[str]:
    """Prometheus scraping the cluster's pods (targets from PodTargets); yields its URL once it is ready."""
    import httpx

    binary = shutil.which("prometheus")
    if binary is None:
        raise RuntimeError("prometheus is not on PATH: run tools/install_test_services.sh (Debian's prometheus package)")
    work.mkdir(parents=True, exist_ok=True)
    targets = PodTargets(cluster, work / "pod-targets.json")
    config = work / "prometheus.yml"
    config.write_text(prometheus_config(targets.path))
    port = free_port()
    cluster.run_beside("prometheus", Path(binary), [
        f"--config.file={config}", f"--storage.tsdb.path={work / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}"])
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        cluster.check_alive()
        return httpx.get(f"{url}/-/ready", timeout=2, trust_env=False).status_code == 200

    wait_for("Prometheus ready", ready, timeout=30)
    targets.start()
    try:
        yield url
    finally:
        targets.stop.set()
        targets.join(10)
