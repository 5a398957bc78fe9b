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

import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from kubernetes import client as k8s

from tests.conftest import EXAMPLE, SpecRepo
from tests.e2e.test_plnt_up_process import REVIEW, PlntUp, gateway_port
from tests.k8s.cluster import FakeNode, wait_for
from tests.k8s.pod_network import PodNetwork
from tests.k8s.sites import HELM, ClusterSite, all_cidrs, cluster_site, site_ranges

pytestmark = [pytest.mark.k8s, pytest.mark.integration]

VENV_BIN = Path(sys.executable).parent
GPU_CLASS = "nvidia.com/a100"  # the workflow-runner chart's convention: GPU pools are labelled `<class>: "true"`
NODES = (FakeNode("node-a"), FakeNode("node-b"), FakeNode("gpu-a100-0", gpus=1, labels={GPU_CLASS: "true"}))
RUN_FILE = "workflowruns/review-responder.yaml"
EXAMPLE_RUN = EXAMPLE / RUN_FILE
VERSIONS = ("1.2.0", "1.3.0", "1.4.0", "1.5.0")  # 1.4.0 has a step that errors; 1.5.0 answers in ~0.6 s
DOMAINS = ("cluster.local", "west.cluster.example")


@pytest.fixture(scope="module")
def sites(k8s_bin_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ClusterSite, ClusterSite]]:
    """Two clusters in one pod network, each with the recipes in its own registry."""
    work = tmp_path_factory.mktemp("k8s-commit")
    ranges = [site_ranges(i) for i in range(len(DOMAINS))]
    with PodNetwork(cidrs=all_cidrs(ranges)) as net, net.entered(), \
            cluster_site(net, k8s_bin_dir, work / "east", ranges[0], nodes=NODES, domain=DOMAINS[0]) as east, \
            cluster_site(net, k8s_bin_dir, work / "west", ranges[1], nodes=NODES, domain=DOMAINS[1]) as west:
        for site in (east, west):
            site.publish("review-responder", VERSIONS)
        yield east, west


@pytest.fixture
def site(sites: tuple[ClusterSite, ClusterSite]) -> ClusterSite:
    return sites[0]


@pytest.fixture
def ns(sites: tuple[ClusterSite, ClusterSite]) -> str:
    """Each test's own backend namespace on both clusters, enforcing Pod Security `restricted`."""
    name = f"agents-{uuid.uuid4().hex[:6]}"
    for each in sites:
        with each.net.entered():
            each.create_namespace(name)
    return name


def kubernetes_specs(repo: SpecRepo, site: ClusterSite, ns: str) -> None:
    """gitops-example moved onto the cluster: a PlntBackend of type kubernetes, the recipe in its registry."""
    repo.write("backends/cluster.yaml", site.backend_yaml("test-cluster", ns, gpu_classes=[GPU_CLASS]))
    repo.replace(RUN_FILE, "registry: file:registry", f"registry: oci://{site.registry.address}/recipes")
    repo.replace(RUN_FILE, "cluster: local", "cluster: test-cluster")
    repo.commit("review-responder on the test cluster")


def plnt_up(site: ClusterSite, repo: SpecRepo, tmp_path: Path, *registries: str, extra: tuple[str, ...] = ()) -> PlntUp:
    """plnt up in the pod network (the Service names in its /etc/hosts), helm on its PATH."""
    path = f"{VENV_BIN}:{Path(HELM).parent}:/usr/bin:/bin"
    insecure = [a for r in registries for a in ("--oci-insecure-host", r)]
    return PlntUp(repo.path, tmp_path / "state", gateway_port(), tmp_path / "plnt.log", extra=(*insecure, *extra),
                  prefix=(*site.net.exec_prefix(), "env", f"PATH={path}"))


class Watch:
    """Polls GET /workflows from the test's thread (in the pod network) and keeps each WorkflowRun's
    phase changes (phase, canary version), whichever one a call waits for."""

    def __init__(self, up: PlntUp) -> None:
        self.up = up
        self.phases: dict[str, list[tuple[str, str | None]]] = {}

    def until(self, what: str, done: Any, name: str = "review-responder", timeout: float = 180.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        row: dict[str, Any] | None = None
        while time.monotonic() < deadline:
            assert self.up.process.poll() is None, self.up.why(f"plnt exited with code {self.up.process.returncode}")
            rows = {r["name"]: r for r in self.up.workflows() or []}
            for key, each in rows.items():
                seen = self.phases.setdefault(key, [])
                if not seen or seen[-1] != (each["phase"], each.get("canaryVersion")):
                    seen.append((each["phase"], each.get("canaryVersion")))
            row = rows.get(name)
            if row is not None and done(row):
                return row
            time.sleep(0.1)
        raise AssertionError(self.up.why(f"{name} not {what} within {timeout:.0f}s; phases seen {self.phases}; "
                                         f"last row {row}"))


def invoke(up: PlntUp, name: str = "review-responder") -> httpx.Response:
    return httpx.post(f"{up.url}/workflows/{name}/invoke", json=REVIEW, timeout=30, trust_env=False)


def answered_by(up: PlntUp, version: str, name: str = "review-responder", within_s: float = 30.0) -> None:
    """After a promotion on Kubernetes: every answer a 200, and only `version` answering within
    `within_s` (five in a row). The old stable's pods drain for the chart's runner.drainOnStopSeconds
    (5 s) and answer a request sent on a connection the gateway kept alive to one of them (the old
    version: docs/kubernetes.md); none may fail."""
    deadline, in_a_row, seen = time.monotonic() + within_s, 0, []
    while in_a_row < 5:
        answer = invoke(up, name)
        assert answer.status_code == 200 and answer.json().get("version"), up.why(answer.text)
        seen.append(answer.json()["version"])
        in_a_row = in_a_row + 1 if seen[-1] == version else 0
        assert time.monotonic() < deadline, f"{name} not answered by {version} only within {within_s:.0f}s: {seen}"
        time.sleep(0 if in_a_row else 0.3)


def history(up: PlntUp) -> dict[str, Any]:
    return httpx.get(f"{up.url}/workflows/review-responder/history", timeout=10, trust_env=False).json()


def test_a_commit_rolls_out_through_helm_and_a_bad_canary_is_rolled_back(
    site: ClusterSite, ns: str, spec_repo: SpecRepo, tmp_path: Path
) -> None:
    kubernetes_specs(spec_repo, site, ns)
    with site.net.entered():
        up = plnt_up(site, spec_repo, tmp_path, site.registry.address)
        try:
            watch = Watch(up)
            first = watch.until("Ready at 1.2.0", lambda r: r["phase"] == "Ready" and r["version"] == "1.2.0")
            core, apps = k8s.CoreV1Api(site.api()), k8s.AppsV1Api(site.api())
            stable = apps.read_namespaced_deployment("review-responder", ns)
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
            pods = core.list_namespaced_pod(ns, label_selector="app.kubernetes.io/instance=review-responder-canary")
            assert pods.items, "the canary release's pods"
            init = pods.items[0].spec.init_containers[0]
            args = [*init.command, *init.args]
            assert args[:3] == ["plnt", "recipe", "fetch"], args
            assert args[args.index("--registry") + 1] == f"oci://{site.registry.address}/recipes", args
            assert args[args.index("--digest") + 1].startswith("sha256:"), args
            assert {r["name"] for r in site.helm(ns, "list")} == {"review-responder", "review-responder-canary"}
            promoted = watch.until("Ready at 1.3.0", lambda r: r["phase"] == "Ready" and r["version"] == "1.3.0")
            assert promoted["canaryVersion"] is None, promoted
            steps = [s["step"] for s in history(up)["steps"]]
            assert steps == ["validate", "pull_recipe", "install_release", "smoke_test", "promote_release"], steps
            answered_by(up, "1.3.0")
            assert {r["name"] for r in site.helm(ns, "list")} == {"review-responder"}
            stable_history = site.helm(ns, "history", "review-responder")
            assert [h["status"] for h in stable_history][-1] == "deployed", stable_history

            # A bad canary (a step that errors): the smoke test fails, helm removes the canary release,
            # the stable release is untouched (same revisions) and keeps serving 1.3.0.
            spec_repo.replace(RUN_FILE, "review-responder@1.3.0", "review-responder@1.4.0")
            spec_repo.commit("try 1.4.0")
            rolled = watch.until("RolledBack", lambda r: r["phase"] == "RolledBack", timeout=240)
            assert "error rate 100%" in rolled["lastError"], rolled
            assert rolled["version"] == "1.3.0", rolled
            assert site.helm(ns, "history", "review-responder") == stable_history
            wait_for("the canary release gone", lambda: {r["name"] for r in site.helm(ns, "list")} == {"review-responder"})
            wait_for("the canary's pods gone", lambda: not core.list_namespaced_pod(
                ns, label_selector="app.kubernetes.io/instance=review-responder-canary").items)
            assert invoke(up).json()["version"] == "1.3.0"
            phases = [p for p, _ in watch.phases["review-responder"]]
            for phase in ("Deploying", "Canary", "RolledBack"):
                assert phase in phases, watch.phases
        finally:
            up.kill()


def test_one_commit_rolls_out_to_two_clusters_each_with_its_own_canary_and_verdict(
    sites: tuple[ClusterSite, ClusterSite], ns: str, spec_repo: SpecRepo, tmp_path: Path
) -> None:
    """Two PlntBackends on two running clusters (their own Service domains); one commit moves the
    WorkflowRun on each: east's canary passes and is promoted, west's fails and is rolled back."""
    east, west = sites
    spec_repo.remove(RUN_FILE)
    for name, site in (("east", east), ("west", west)):
        spec_repo.write(f"backends/{name}.yaml", site.backend_yaml(name, ns))
        spec_repo.write(f"workflowruns/{name}.yaml", EXAMPLE_RUN.read_text()
                        .replace("name: review-responder\n", f"name: review-responder-{name}\n")
                        .replace("registry: file:registry", f"registry: oci://{site.registry.address}/recipes")
                        .replace("cluster: local", f"cluster: {name}"))
    spec_repo.commit("review-responder on two clusters")
    with east.net.entered():
        up = plnt_up(east, spec_repo, tmp_path, east.registry.address, west.registry.address)
        try:
            watch = Watch(up)
            for name in ("east", "west"):
                watch.until("Ready at 1.2.0", lambda r: r["phase"] == "Ready" and r["version"] == "1.2.0",
                            name=f"review-responder-{name}")
                answer = invoke(up, f"review-responder-{name}")
                assert answer.status_code == 200 and answer.json()["version"] == "1.2.0", up.why(answer.text)
            # Each release on its own cluster only.
            assert {r["name"] for r in east.helm(ns, "list")} == {"review-responder-east"}
            assert {r["name"] for r in west.helm(ns, "list")} == {"review-responder-west"}

            spec_repo.replace("workflowruns/east.yaml", "review-responder@1.2.0", "review-responder@1.3.0")
            spec_repo.replace("workflowruns/west.yaml", "review-responder@1.2.0", "review-responder@1.4.0")
            spec_repo.commit("east to 1.3.0, west to 1.4.0")
            west_history = west.helm(ns, "history", "review-responder-west")
            promoted = watch.until("Ready at 1.3.0", lambda r: r["phase"] == "Ready" and r["version"] == "1.3.0",
                                   name="review-responder-east")
            rolled = watch.until("RolledBack", lambda r: r["phase"] == "RolledBack", name="review-responder-west",
                                 timeout=240)
            assert promoted["observedCommit"] == rolled["observedCommit"] == spec_repo.git("rev-parse", "HEAD")
            assert "error rate 100%" in rolled["lastError"] and rolled["version"] == "1.2.0", rolled
            for name, canary in (("east", "1.3.0"), ("west", "1.4.0")):
                assert ("Canary", canary) in watch.phases[f"review-responder-{name}"], watch.phases
            answered_by(up, "1.3.0", "review-responder-east")
            assert invoke(up, "review-responder-west").json()["version"] == "1.2.0"
            assert west.helm(ns, "history", "review-responder-west") == west_history
            wait_for("west's canary release gone",
                     lambda: {r["name"] for r in west.helm(ns, "list")} == {"review-responder-west"})
            assert {r["name"] for r in east.helm(ns, "list")} == {"review-responder-east"}
        finally:
            up.kill()


@pytest.mark.parametrize("component", ["kube-apiserver", "etcd"])
def test_the_cluster_away_for_30s_mid_canary_loses_nothing_and_the_rollout_completes(
    site: ClusterSite, ns: str, spec_repo: SpecRepo, tmp_path: Path, component: str
) -> None:
    """kube-apiserver (or etcd behind it) stopped for 30 s while the canary is under test: plnt reads
    the live state as unknown (not gone) and removes nothing, the stable release keeps answering
    through the gateway, and the rollout completes once the server is back."""
    kubernetes_specs(spec_repo, site, ns)
    with site.net.entered():
        up = plnt_up(site, spec_repo, tmp_path, site.registry.address)
        try:
            watch = Watch(up)
            watch.until("Ready at 1.2.0", lambda r: r["phase"] == "Ready" and r["version"] == "1.2.0")
            stable_history = site.helm(ns, "history", "review-responder")
            # 1.5.0 answers in ~0.6 s: 40 invocations, 2 at a time, keep it in Canary for ~12 s.
            spec_repo.replace(RUN_FILE, "review-responder@1.2.0", "review-responder@1.5.0")
            spec_repo.replace(RUN_FILE, "invocations: 10", "invocations: 40")
            spec_repo.commit("1.5.0, a longer smoke test")
            watch.until("in Canary", lambda r: r["phase"] == "Canary" and r["canaryVersion"] == "1.5.0")
            site.cluster.stop_component(component)
            away_until = time.monotonic() + 30
            answers: list[int] = []
            while time.monotonic() < away_until:
                row = watch.until("still rolling out", lambda r: True)
                assert row["phase"] in ("Canary", "Deploying", "Ready"), row  # nothing gave up or removed
                answers.append(invoke(up).status_code)
                time.sleep(1)
            assert set(answers) == {200}, answers
            site.cluster.restart_component(component)
            done = watch.until("Ready at 1.5.0", lambda r: r["phase"] == "Ready" and r["version"] == "1.5.0",
                               timeout=240)
            assert done["canaryVersion"] is None, done
            answered_by(up, "1.5.0")
            # The stable release was upgraded once (the promotion), nothing rolled back or reinstalled.
            history_now = site.helm(ns, "history", "review-responder")
            assert [(h["revision"], h["updated"]) for h in history_now] == \
                [(h["revision"], h["updated"]) for h in stable_history] + [(len(stable_history) + 1, history_now[-1]["updated"])]
            assert [h["status"] for h in history_now][-2:] == ["superseded", "deployed"], history_now
            assert "RolledBack" not in [p for p, _ in watch.phases["review-responder"]], watch.phases
        finally:
            up.kill()
            if component not in site.cluster.alive():
                site.cluster.restart_component(component)


def test_a_canary_with_no_free_gpu_fails_with_the_missing_capacity_in_status(
    site: ClusterSite, ns: str, spec_repo: SpecRepo, tmp_path: Path
) -> None:
    """1.3.0 asks for 2 GPUs of a pool that has 1: its canary pod stays Pending; once helm's wait
    (--install-timeout 10) runs out, the install step fails with the scheduler's reason, which GET
    /workflows and `plnt status` show; the canary is removed and 1.2.0 keeps serving."""
    kubernetes_specs(spec_repo, site, ns)
    with site.net.entered():
        up = plnt_up(site, spec_repo, tmp_path, site.registry.address, extra=("--install-timeout", "10"))
        try:
            watch = Watch(up)
            watch.until("Ready at 1.2.0", lambda r: r["phase"] == "Ready" and r["version"] == "1.2.0")
            spec_repo.replace(RUN_FILE, "review-responder@1.2.0", "review-responder@1.3.0")
            spec_repo.replace(RUN_FILE, "cluster: test-cluster", f"cluster: test-cluster\n    gpuClass: {GPU_CLASS}\n"
                              "    gpuCount: 2")
            spec_repo.commit("1.3.0 on two a100s")
            failed = watch.until("Failed", lambda r: r["phase"] == "Failed", timeout=240)
            assert "Insufficient nvidia.com/gpu" in failed["lastError"], failed
            assert failed["version"] == "1.2.0", failed
            status = subprocess.run([str(VENV_BIN / "plnt"), "status", "--url", up.url], capture_output=True,
                                    text=True, timeout=60)
            assert "Insufficient nvidia.com/gpu" in status.stdout, status.stdout + status.stderr
            answer = invoke(up)
            assert answer.status_code == 200 and answer.json()["version"] == "1.2.0", up.why(answer.text)
            wait_for("the canary release gone", lambda: {r["name"] for r in site.helm(ns, "list")} == {"review-responder"})
        finally:
            up.kill()
