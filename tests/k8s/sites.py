"""Clusters that plnt deploys to end to end: each a LocalCluster whose pods run (as processes, through
the node stand-in) in a shared PodNetwork, and an OCI registry holding gitops-example's recipes.

    ranges = [site_ranges(i) for i in range(2)]
    with PodNetwork(cidrs=all_cidrs(ranges)) as net, net.entered(), \\
            cluster_site(net, bin_dir, work / "a", ranges[0], domain="a.cluster.example") as a, ...:

Each cluster gets its own pod and Service ranges (site_ranges) and its own cluster domain, so the
Service names of two clusters (RELEASE.NS.svc.DOMAIN) and their addresses never meet, as a
PlntBackend's `kubernetes.clusterDomain` tells plnt. See tests/k8s/node_standin.py for what stands
in for the kubelet and kube-proxy.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client as k8s

from tests.k8s.cluster import FakeNode, LocalCluster
from tests.k8s.pod_network import PodNetwork, stages_without_pod_readiness
from tests.services import OciServer, running_oci_registry

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "gitops-example"
VENV_BIN = Path(sys.executable).parent
HELM = shutil.which("helm") or str(VENV_BIN / "helm")
PLNT = str(VENV_BIN / "plnt")
RESTRICTED = {"pod-security.kubernetes.io/enforce": "restricted"}


@dataclass(frozen=True)
class Ranges:
    pods: str
    services: str


def site_ranges(index: int) -> Ranges:
    """Cluster `index`'s pod range (4,094 addresses) and Service range, apart from every other index's."""
    return Ranges(pods=f"10.244.{16 * index}.0/20", services=f"10.{96 + index}.0.0/20")


def all_cidrs(ranges: Sequence[Ranges]) -> tuple[str, ...]:
    return tuple(c for r in ranges for c in (r.pods, r.services))


@dataclass
class ClusterSite:
    """One cluster in a PodNetwork, with the node stand-in running its pods and a registry."""

    net: PodNetwork
    cluster: LocalCluster
    registry: OciServer
    domain: str
    work: Path

    def api(self) -> Any:
        return self.cluster.api_client()

    def helm(self, namespace: str, *args: str) -> Any:
        done = subprocess.run([HELM, *args, "-n", namespace, "-o", "json", "--kubeconfig", str(self.cluster.kubeconfig)],
                              capture_output=True, text=True, check=True)
        return json.loads(done.stdout)

    def create_namespace(self, name: str) -> None:
        """A namespace enforcing Pod Security `restricted`: every pod plnt creates must be admitted there."""
        k8s.CoreV1Api(self.api()).create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=name, labels=RESTRICTED)))

    def backend_yaml(self, name: str, namespace: str, gpu_classes: Sequence[str] = (), *,
                     labels: Mapping[str, str] | None = None, capacity_replicas: int | None = None) -> str:
        """A PlntBackend of type kubernetes on this cluster; `labels` and `capacity_replicas` for a pool's member."""
        return ("apiVersion: plnt.work/v1\nkind: PlntBackend\nmetadata:\n"
                f"  name: {name}\n" + (f"  labels: {json.dumps(dict(labels))}\n" if labels else "") +
                f"spec:\n  type: kubernetes\n  gpuClasses: {json.dumps(list(gpu_classes))}\n" +
                (f"  capacity: {{replicas: {capacity_replicas}}}\n" if capacity_replicas is not None else "") +
                f"  kubernetes:\n    namespace: {namespace}\n"
                f"    kubeconfig: {self.cluster.kubeconfig}\n    clusterDomain: {self.domain}\n")

    def publish(self, name: str, versions: Sequence[str]) -> str:
        """gitops-example's signed archives of `name` pushed to this site's registry; its oci:// URL."""
        url = f"oci://{self.registry.address}/recipes"
        for version in versions:
            archive = EXAMPLE / "registry" / name / version / "recipe.tar.gz"
            subprocess.run([PLNT, "recipe", "push", str(archive), "--to", url, "--name", name, "--version", version,
                            "--oci-insecure-host", self.registry.address], check=True, capture_output=True)
        return url


@contextlib.contextmanager
def cluster_site(net: PodNetwork, bin_dir: Path, work: Path, ranges: Ranges, *, nodes: Sequence[FakeNode],
                 domain: str = "cluster.local", programs: Mapping[str, str] | None = None,
                 hpa_sync_period: str | None = None) -> Iterator[ClusterSite]:
    """Call inside `net.entered()`: the cluster, its registry and its node stand-in live in the namespace.
    programs: what a container's command runs, over the default (`plnt` and `python` of this checkout)."""
    commands = {"plnt": PLNT, "python": sys.executable, **(programs or {})}
    work.mkdir(parents=True, exist_ok=True)
    stages = stages_without_pod_readiness(bin_dir, work / "kwok-stages.yaml")
    (work / "registry").mkdir()
    with LocalCluster(bin_dir, work / "cluster", nodes=nodes, kwok_stages=stages, service_cidr=ranges.services,
                      hpa_sync_period=hpa_sync_period) as cluster, \
            running_oci_registry(work / "registry") as registry, open(work / "node-standin.log", "wb") as log:
        standin = subprocess.Popen(
            [sys.executable, "-m", "tests.k8s.node_standin", "--kubeconfig", str(cluster.kubeconfig),
             "--work-dir", str(work / "node"), "--hosts-file", str(net.hosts_file),
             "--pod-cidr", ranges.pods, "--cluster-domain", domain,
             *(a for n in nodes for a in ("--node", n.name)),
             *(a for command, path in commands.items() for a in ("--program", f"{command}={path}"))],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        try:
            yield ClusterSite(net, cluster, registry, domain, work)
        finally:
            standin.terminate()
            standin.wait(30)
