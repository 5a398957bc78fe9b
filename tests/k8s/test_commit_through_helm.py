"""A commit deployed through a Kubernetes PlntBackend, end to end, as a user runs it: `plnt up` (the
console script, embedded Temporal) polls a spec repository whose WorkflowRun names a PlntBackend of
type kubernetes (this test cluster's kubeconfig); each saga runs real helm against the real API
server; the Deployments become Available through the real controllers, scheduler and EndpointSlices;
the smoke test and the gateway reach the runner pods through their Services' names.

STAND-IN: no container runs here. tests/k8s/node_standin.py does the kubelet's and kube-proxy's part
for kwok's nodes inside a network namespace (tests/k8s/pod_network.py): it runs each pod's init
container (`plnt recipe fetch`, which pulls the recipe from a real OCI registry and checks its
signature) and then its runner (`python -m plnt.runner`), the processes the plnt image would run, with
the arguments and environment the pod spec carries, on the pod's IP, reports the pod Ready when its
readiness probe answers, and proxies each Service's cluster IP to its ready endpoints. The runners'
model is MockBackend (the chart's default), the recipes those of gitops-example (signed by its demo
authority).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from kubernetes import client as k8s

from tests.conftest import EXAMPLE, SpecRepo
from tests.e2e.test_plnt_up_process import PLNT, REVIEW, PlntUp, gateway_port
from tests.k8s.cluster import FakeNode, LocalCluster, wait_for
from tests.k8s.pod_network import PodNetwork, stages_without_pod_readiness
from tests.services import OciServer, running_oci_registry

pytestmark = [pytest.mark.k8s, pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
HELM = shutil.which("helm") or str(VENV_BIN / "helm")
NODES = (FakeNode("node-a"), FakeNode("node-b"))
NS = "agents"  # the backend's namespace: Pod Security `restricted` enforced
RUN_FILE = "workflowruns/review-responder.yaml"
VERSIONS = ("1.2.0", "1.3.0", "1.4.0")  # 1.4.0 has a step that errors: its smoke test fails


@dataclass
class Site:
    """One cluster in its own pod network, with a registry and the node stand-in."""

    net: PodNetwork
    cluster: LocalCluster
    registry: OciServer
    work: Path

    def api(self) -> Any:
        return self.cluster.api_client()

    def helm(self, *args: str) -> Any:
        done = subprocess.run([HELM, *args, "-n", NS, "-o", "json", "--kubeconfig", str(self.cluster.kubeconfig)],
                              capture_output=True, text=True, check=True)
        return json.loads(done.stdout)


@pytest.fixture(scope="module")
def site(k8s_bin_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    work = tmp_path_factory.mktemp("k8s-commit")
    with PodNetwork() as net, net.entered():
        stages = stages_without_pod_readiness(k8s_bin_dir, work / "kwok-stages.yaml")
        registry_dir = work / "registry"
        registry_dir.mkdir()
        with LocalCluster(k8s_bin_dir, work / "cluster", nodes=NODES, kwok_stages=stages) as cluster, \
                running_oci_registry(registry_dir) as registry:
            labels = {"pod-security.kubernetes.io/enforce": "restricted"}
            k8s.CoreV1Api(cluster.api_client()).create_namespace(
                k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=NS, labels=labels)))
            with open(work / "node-standin.log", "wb") as log:
                standin = subprocess.Popen(
                    [sys.executable, "-m", "tests.k8s.node_standin", "--kubeconfig", str(cluster.kubeconfig),
                     "--work-dir", str(work / "node"), "--hosts-file", str(net.hosts_file),
                     *(a for n in NODES for a in ("--node", n.name)),
                     "--program", f"plnt={VENV_BIN / 'plnt'}", "--program", f"python={sys.executable}"],
                    cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
            try:
                for version in VERSIONS:
                    archive = EXAMPLE / "registry" / "review-responder" / version / "recipe.tar.gz"
                    subprocess.run([*PLNT, "recipe", "push", str(archive), "--to", f"oci://{registry.address}/recipes",
                                    "--name", "review-responder", "--version", version,
                                    "--oci-insecure-host", registry.address], check=True, capture_output=True)
                yield Site(net, cluster, registry, work)
            finally:
                standin.terminate()
                standin.wait(30)


def kubernetes_specs(repo: SpecRepo, site: Site) -> None:
    """gitops-example moved onto the cluster: a PlntBackend of type kubernetes, the recipe in the registry."""
    repo.write("backends/cluster.yaml", (
        "apiVersion: plnt.work/v1\nkind: PlntBackend\nmetadata:\n  name: test-cluster\nspec:\n  type: kubernetes\n"
        f"  kubernetes:\n    namespace: {NS}\n    kubeconfig: {site.cluster.kubeconfig}\n"))
    repo.replace(RUN_FILE, "registry: file:registry", f"registry: oci://{site.registry.address}/recipes")
    repo.replace(RUN_FILE, "cluster: local", "cluster: test-cluster")
    repo.commit("review-responder on the test cluster")


class Watch:
    """Polls GET /workflows from the test's thread (in the pod network) and keeps each phase change."""

    def __init__(self, up: PlntUp) -> None:
        self.up = up
        self.phases: list[tuple[str, str | None]] = []

    def until(self, what: str, done: Any, timeout: float = 180.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        row: dict[str, Any] | None = None
        while time.monotonic() < deadline:
            assert self.up.process.poll() is None, self.up.why(f"plnt exited with code {self.up.process.returncode}")
            row = next((r for r in self.up.workflows() or [] if r["name"] == "review-responder"), None)
            if row is not None:
                seen = (row["phase"], row.get("canaryVersion"))
                if not self.phases or self.phases[-1] != seen:
                    self.phases.append(seen)
                if done(row):
                    return row
            time.sleep(0.1)
        raise AssertionError(self.up.why(f"not {what} within {timeout:.0f}s; phases seen {self.phases}; last row {row}"))


def invoke(up: PlntUp) -> httpx.Response:
    return httpx.post(f"{up.url}/workflows/review-responder/invoke", json=REVIEW, timeout=30, trust_env=False)


def history(up: PlntUp) -> dict[str, Any]:
    return httpx.get(f"{up.url}/workflows/review-responder/history", timeout=10, trust_env=False).json()


def test_a_commit_rolls_out_through_helm_and_a_bad_canary_is_rolled_back(
    site: Site, spec_repo: SpecRepo, tmp_path: Path
) -> None:
    kubernetes_specs(spec_repo, site)
    env_path = f"{VENV_BIN}:{Path(HELM).parent}"
    with site.net.entered():
        up = PlntUp(spec_repo.path, tmp_path / "state", gateway_port(), tmp_path / "plnt.log",
                    extra=("--oci-insecure-host", site.registry.address),
                    prefix=(*site.net.exec_prefix(), "env", f"PATH={env_path}:/usr/bin:/bin"))
        try:
            watch = Watch(up)
            first = watch.until("Ready at 1.2.0", lambda r: r["phase"] == "Ready" and r["version"] == "1.2.0")
            core, apps = k8s.CoreV1Api(site.api()), k8s.AppsV1Api(site.api())
            stable = apps.read_namespaced_deployment("review-responder", NS)
            assert stable.status.available_replicas == 1, stable.status
            answer = invoke(up)
            assert answer.status_code == 200, up.why(answer.text)
            assert answer.json()["version"] == "1.2.0", answer.text
            assert first["sagaId"]

            # A new version: Verifying -> Deploying (helm installs the canary release) -> Canary -> promoted.
            spec_repo.replace(RUN_FILE, "review-responder@1.2.0", "review-responder@1.3.0")
            spec_repo.commit("bump review-responder to 1.3.0")
            canary = watch.until("in Canary", lambda r: r["phase"] == "Canary")
            assert canary["canaryVersion"] == "1.3.0", canary
            pods = core.list_namespaced_pod(NS, label_selector="app.kubernetes.io/instance=review-responder-canary")
            assert pods.items, "the canary release's pods"
            init = pods.items[0].spec.init_containers[0]
            args = [*init.command, *init.args]
            assert args[:3] == ["plnt", "recipe", "fetch"], args
            assert args[args.index("--registry") + 1] == f"oci://{site.registry.address}/recipes", args
            assert args[args.index("--digest") + 1].startswith("sha256:"), args
            assert {r["name"] for r in site.helm("list")} == {"review-responder", "review-responder-canary"}
            promoted = watch.until("Ready at 1.3.0", lambda r: r["phase"] == "Ready" and r["version"] == "1.3.0")
            assert promoted["canaryVersion"] is None, promoted
            steps = [s["step"] for s in history(up)["steps"]]
            assert steps == ["validate", "pull_recipe", "install_release", "smoke_test", "promote_release"], steps
            assert invoke(up).json()["version"] == "1.3.0"
            assert {r["name"] for r in site.helm("list")} == {"review-responder"}
            stable_history = site.helm("history", "review-responder")
            assert [h["status"] for h in stable_history][-1] == "deployed", stable_history

            # A bad canary (a step that errors): the smoke test fails, helm removes the canary release,
            # the stable release is untouched (same revisions) and keeps serving 1.3.0.
            spec_repo.replace(RUN_FILE, "review-responder@1.3.0", "review-responder@1.4.0")
            spec_repo.commit("try 1.4.0")
            rolled = watch.until("RolledBack", lambda r: r["phase"] == "RolledBack", timeout=240)
            assert "error rate 100%" in rolled["lastError"], rolled
            assert rolled["version"] == "1.3.0", rolled
            assert site.helm("history", "review-responder") == stable_history
            wait_for("the canary release gone", lambda: {r["name"] for r in site.helm("list")} == {"review-responder"})
            wait_for("the canary's pods gone", lambda: not core.list_namespaced_pod(
                NS, label_selector="app.kubernetes.io/instance=review-responder-canary").items)
            assert invoke(up).json()["version"] == "1.3.0"
            phases = [p for p, _ in watch.phases]
            for phase in ("Deploying", "Canary", "RolledBack"):
                assert phase in phases, watch.phases
        finally:
            up.kill()
