"""A pool of two Kubernetes backends through `plnt up` (the console script, embedded Temporal), as a
user runs it: the spec repo holds two PlntBackends of type kubernetes labelled `pool: agents`, one on
each cluster of the `sites` fixture (its own namespace, Service domain and node stand-in), and
review-responder with `backend: {selector: {matchLabels: {pool: agents}}}` and two replicas.

Shown, on the real API servers with real helm, through the real saga and gateway:
- Ready at 1.2.0: one Helm release per placed backend, each Deployment Available with one pod; the
  gateway's invocations answer 200 and reach the runner pod on each cluster (each pod's own /stats);
- a bump to 1.3.0: the canary is one Helm release on the first placed backend only; promoted, both
  backends' releases run 1.3.0 and the canary is gone; the saga's steps as for one backend;
- a bad version (1.4.0, a step that errors) rolls back on the pool: its canary removed, both stable
  releases untouched (the same helm history) and both still serving;
- back to 1.3.0 in git, then west's `capacity.replicas` lowered to 0: the plan's `scale` re-places in
  place (no saga: the saga id stays), east's Deployment goes to 2 pods (a helm upgrade of the same
  release), west's release is uninstalled, and a steady load through the gateway meanwhile sees no
  failure.

STAND-IN: no container runs here; tests/k8s/node_standin.py runs each pod's init container and runner
as processes (see tests/k8s/test_commit_through_helm.py). The runners' model is MockBackend.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import pytest
from kubernetes import client as k8s

from tests.conftest import SpecRepo
from tests.e2e.test_plnt_up_process import REVIEW, PlntUp
from tests.k8s.cluster import wait_for
from tests.k8s.sites import ClusterSite
from tests.k8s.test_commit_through_helm import RUN_FILE, Watch, answered_by, history, invoke, plnt_up
from tests.k8s.test_commit_through_helm import ns as ns  # noqa: F401 (fixtures)
from tests.k8s.test_commit_through_helm import sites as sites  # noqa: F401

pytestmark = [pytest.mark.k8s, pytest.mark.integration]

INSTANCE = "app.kubernetes.io/instance"


def pool_specs(repo: SpecRepo, east: ClusterSite, west: ClusterSite, ns: str) -> None:
    """gitops-example's review-responder on a pool of two kubernetes backends, one per cluster."""
    for name, site in (("east", east), ("west", west)):
        repo.write(f"backends/{name}.yaml",
                   site.backend_yaml(name, ns, labels={"pool": "agents"}, capacity_replicas=2))
    repo.replace(RUN_FILE, "registry: file:registry", f"registry: oci://{east.registry.address}/recipes")
    repo.replace(RUN_FILE, "    cluster: local", "    selector: {matchLabels: {pool: agents}}")
    repo.replace(RUN_FILE, "replicas: {min: 1, max: 1}", "replicas: {min: 2, max: 2}")
    repo.commit("review-responder on the agents pool (east and west), two replicas")


def releases(site: ClusterSite, ns: str) -> set[str]:
    return {r["name"] for r in site.helm(ns, "list")}


def deployments(site: ClusterSite, ns: str) -> dict[str, tuple[int, int]]:
    """Each Deployment in `ns`: (spec.replicas, status.availableReplicas)."""
    items = k8s.AppsV1Api(site.api()).list_namespaced_deployment(ns).items
    return {d.metadata.name: (d.spec.replicas, d.status.available_replicas or 0) for d in items}


def released_version(site: ClusterSite, ns: str, release: str = "review-responder") -> str:
    """The recipe version a Helm release deploys, from the values plnt gave it."""
    values = site.helm(ns, "get", "values", release)
    return str(values["workflow"]["version"])


def pod_invocations(site: ClusterSite, ns: str, release: str = "review-responder") -> dict[str, int]:
    """Each ready pod of the release: the invocations its runner served (its own /stats on the pod's IP)."""
    served: dict[str, int] = {}
    for pod in k8s.CoreV1Api(site.api()).list_namespaced_pod(ns, label_selector=f"{INSTANCE}={release}").items:
        if pod.metadata.deletion_timestamp is not None or not pod.status.pod_ip:
            continue
        port = pod.spec.containers[0].ports[0].container_port
        stats = httpx.get(f"http://{pod.status.pod_ip}:{port}/stats", timeout=5, trust_env=False).json()
        served[pod.metadata.name] = stats["invocations"]
    return served


class SteadyLoad:
    """Threads invoking review-responder through plnt's gateway without pause (each in the pod
    network); every answer that is not a 200 with a version is a failure."""

    def __init__(self, site: ClusterSite, up: PlntUp, clients: int = 2) -> None:
        self.site, self.up = site, up
        self.served = 0
        self.failures: list[str] = []
        self.failed_at: list[float] = []  # time.monotonic() of each failure, in step with `failures`
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._client, name=f"load-{i}", daemon=True) for i in range(clients)]

    def _client(self) -> None:
        with self.site.net.entered(), httpx.Client(trust_env=False, timeout=30) as http:
            while not self.stop.is_set():
                try:
                    answer = http.post(f"{self.up.url}/workflows/review-responder/invoke", json=REVIEW)
                except httpx.HTTPError as exc:
                    self._failed(f"{type(exc).__name__}: {exc}")
                    continue
                if answer.status_code == 200 and answer.json().get("version"):
                    self.served += 1
                else:
                    self._failed(f"{answer.status_code} {answer.text[:200]}")

    def _failed(self, what: str) -> None:
        self.failed_at.append(time.monotonic())
        self.failures.append(what)

    def failed(self, start: float, end: float = float("inf")) -> list[str]:
        """The failures between two time.monotonic() readings."""
        return [what for t, what in zip(self.failed_at, self.failures, strict=False) if start <= t < end]

    def __enter__(self) -> SteadyLoad:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(60)


def test_a_pool_of_two_clusters_rolls_out_through_the_saga_and_re_places_under_load(
    sites: tuple[ClusterSite, ClusterSite], ns: str, spec_repo: SpecRepo, tmp_path: Path  # noqa: F811
) -> None:
    east, west = sites
    pool_specs(spec_repo, east, west, ns)
    with east.net.entered():
        up = plnt_up(east, spec_repo, tmp_path, east.registry.address)
        try:
            watch = Watch(up)
            first = watch.until("Ready at 1.2.0", lambda r: r["phase"] == "Ready" and r["version"] == "1.2.0")
            # One release per placed backend, each one pod (spread: a replica on each cluster).
            for site in (east, west):
                assert releases(site, ns) == {"review-responder"}, site.domain
                assert deployments(site, ns) == {"review-responder": (1, 1)}, site.domain
                assert released_version(site, ns) == "1.2.0"
            for _ in range(20):
                answer = invoke(up)
                assert answer.status_code == 200, up.why(answer.text)
                assert answer.json()["version"] == "1.2.0", answer.text
            for site in (east, west):  # the gateway reached both backends' Services, so both pods
                served = pod_invocations(site, ns)
                assert len(served) == 1 and all(n > 0 for n in served.values()), (site.domain, served)

            # 1.3.0 through the saga: the canary on the first placed backend (east) only, then promoted on both.
            spec_repo.replace(RUN_FILE, "review-responder@1.2.0", "review-responder@1.3.0")
            spec_repo.commit("bump review-responder to 1.3.0")
            canary = watch.until("in Canary", lambda r: r["phase"] == "Canary")
            assert canary["canaryVersion"] == "1.3.0", canary
            assert releases(east, ns) == {"review-responder", "review-responder-canary"}
            assert releases(west, ns) == {"review-responder"}
            assert deployments(east, ns)["review-responder-canary"][0] == 1
            promoted = watch.until("Ready at 1.3.0", lambda r: r["phase"] == "Ready" and r["version"] == "1.3.0")
            assert promoted["canaryVersion"] is None and promoted["sagaId"] != first["sagaId"], promoted
            steps = [s["step"] for s in history(up)["steps"]]
            assert steps == ["validate", "pull_recipe", "install_release", "smoke_test", "promote_release"], steps
            for site in (east, west):
                wait_for(f"only the stable release on {site.domain}", lambda s=site: releases(s, ns) == {"review-responder"})
                assert released_version(site, ns) == "1.3.0"
                wait_for(f"1.3.0 Available on {site.domain}",
                         lambda s=site: deployments(s, ns) == {"review-responder": (1, 1)})
            answered_by(up, "1.3.0")

            # A bad canary (a step that errors) on the pool: its smoke test fails, helm removes the canary
            # from east, both backends' stable releases are untouched (same revisions) and keep serving.
            histories = {site.domain: site.helm(ns, "history", "review-responder") for site in (east, west)}
            spec_repo.replace(RUN_FILE, "review-responder@1.3.0", "review-responder@1.4.0")
            spec_repo.commit("try 1.4.0")
            rolled = watch.until("RolledBack", lambda r: r["phase"] == "RolledBack", timeout=240)
            assert "error rate 100%" in rolled["lastError"] and rolled["version"] == "1.3.0", rolled
            assert ("Canary", "1.4.0") in watch.phases["review-responder"], watch.phases
            wait_for("the canary release gone", lambda: releases(east, ns) == {"review-responder"})
            for site in (east, west):
                assert site.helm(ns, "history", "review-responder") == histories[site.domain], site.domain
                assert releases(site, ns) == {"review-responder"}, site.domain
            before = {site.domain: sum(pod_invocations(site, ns).values()) for site in (east, west)}
            answers = [invoke(up) for _ in range(10)]
            assert {(a.status_code, a.json().get("version")) for a in answers} == {(200, "1.3.0")}, [a.text for a in answers]
            for site in (east, west):
                assert sum(pod_invocations(site, ns).values()) > before[site.domain], site.domain

            # Back to 1.3.0 in git (in sync with what runs: no saga), then west lowered to no capacity:
            # its replica is placed again on east, in place (the plan's scale, no saga), while clients
            # keep invoking through the gateway.
            spec_repo.replace(RUN_FILE, "review-responder@1.4.0", "review-responder@1.3.0")
            spec_repo.commit("back to 1.3.0")
            east_history = east.helm(ns, "history", "review-responder")
            with SteadyLoad(east, up) as load:
                wait_for("the load served", lambda: load.served >= 5, timeout=30)
                spec_repo.replace("backends/west.yaml", "capacity: {replicas: 2}", "capacity: {replicas: 0}")
                spec_repo.commit("west is full")
                wait_for("east at 2 pods", lambda: deployments(east, ns) == {"review-responder": (2, 2)}, timeout=120)
                wait_for("west's release uninstalled", lambda: releases(west, ns) == set(), timeout=120)
                wait_for("west's pods gone", lambda: not k8s.CoreV1Api(west.api()).list_namespaced_pod(
                    ns, label_selector=f"{INSTANCE}=review-responder").items, timeout=60)
                served_before = load.served
                wait_for("the load served after the move", lambda: load.served >= served_before + 10, timeout=30)
            assert not load.failures, f"{len(load.failures)} failed of {load.served + len(load.failures)}: {load.failures[:5]}"
            moved = watch.until("the move's commit observed",
                                lambda r: r["observedCommit"] == spec_repo.git("rev-parse", "HEAD"))
            assert moved["version"] == "1.3.0" and moved["canaryVersion"] is None, moved
            assert moved["sagaId"] == rolled["sagaId"], "neither the revert nor the re-placement runs a saga"
            now = east.helm(ns, "history", "review-responder")
            assert len(now) == len(east_history) + 1 and now[-1]["status"] == "deployed", now  # one helm upgrade
            assert released_version(east, ns) == "1.3.0"
            assert len(pod_invocations(east, ns)) == 2
            answer = invoke(up)
            assert answer.status_code == 200 and answer.json()["version"] == "1.3.0", answer.text
            print(f"re-placement under load: served={load.served} failed={len(load.failures)}")
        finally:
            up.kill()
