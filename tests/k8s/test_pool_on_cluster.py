"""A pool over two Kubernetes backends, deployed with real helm on the REAL API server: two PlntBackends
of type kubernetes (two namespaces of one cluster), a WorkflowRun with `backend: {refs: [east, west]}`
and replicas.min 2, driven through the DriverSet exactly as the saga's steps and the plan's
re-placement call it (install of the canary with the placement, promote, place_replicas, remove).

Shown: the canary is one Helm release on the first placed backend only; promotion leaves each
backend's namespace its own release with its count (the Deployment's spec.replicas, Available through
the real controllers and kwok), the canary gone; the gateway's route lists one endpoint per backend
(its Service); a plnt restarted on the same state reads the pool back from the clusters; lowering one
backend's capacity re-places (plan/placement.py) with a helm upgrade on the other and an uninstall
where it went to 0.

kwok's nodes run no containers: the runners never answer (the serving check is off, as in
test_helm_driver_on_cluster.py); what is shown is what the clusters hold."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from plnt.core.specs.models import PlntBackend, WorkflowRun
from plnt.reconciler.app import build_route_table
from plnt.reconciler.drivers.driver_set import DriverSet
from plnt.reconciler.drivers.helm import HelmDriver, RunnerImage, SpecLookup
from plnt.reconciler.drivers.local import LocalDriver
from plnt.reconciler.drivers.protocol import InstallRequest
from plnt.reconciler.plan.placement import place_all
from plnt.reconciler.state import StateDir
from plnt.reconciler.status_store import StatusStore

from tests.k8s.cluster import LocalCluster
from tests.k8s.test_helm_driver_on_cluster import HELM, namespace
from tests.reconciler.drivers.test_helm_driver import TRUST  # a RecipeTrustPolicy the saga verified with

pytestmark = [pytest.mark.k8s, pytest.mark.integration]

DIGEST = "sha256:" + "7c" * 32
KEY = "team-a/review-responder"


def backend(cluster: LocalCluster, name: str, ns: str, replicas: int | None = None) -> PlntBackend:
    spec: dict[str, Any] = {"type": "kubernetes", "kubernetes": {"namespace": ns, "kubeconfig": str(cluster.kubeconfig)}}
    if replicas is not None:
        spec["capacity"] = {"replicas": replicas}
    return PlntBackend.model_validate({"apiVersion": "plnt.work/v1", "kind": "PlntBackend",
                                       "metadata": {"name": name, "labels": {"pool": "agents"}}, "spec": spec})


def pool_run() -> WorkflowRun:
    return WorkflowRun.model_validate({
        "apiVersion": "plnt.work/v1", "kind": "WorkflowRun", "metadata": {"name": "review-responder", "namespace": "team-a"},
        "spec": {"workflow": {"ref": "review-responder@1.2.0", "registry": "oci://registry.example/recipes"},
                 "backend": {"refs": ["east", "west"]}, "replicas": {"min": 2, "max": 2}}})


def make_helm(backend: PlntBackend, lookup: SpecLookup) -> HelmDriver:
    return HelmDriver(backend, lookup, image=RunnerImage(repository="registry.invalid/plnt", tag="0.1.0"), helm=HELM,
                      timeout_s=60)


def deployments(cluster: LocalCluster, ns: str) -> dict[str, tuple[int, int]]:
    """Each Deployment in `ns`: (spec.replicas, status.availableReplicas)."""
    items = k8s.AppsV1Api(cluster.api_client()).list_namespaced_deployment(ns).items
    return {d.metadata.name: (d.spec.replicas, d.status.available_replicas or 0) for d in items}


def releases(cluster: LocalCluster, ns: str) -> dict[str, tuple[int, str]]:
    """Each deployed Helm release in `ns`: (revision, status), as helm itself lists them."""
    done = subprocess.run([HELM, "list", "-n", ns, "-o", "json", "--kubeconfig", str(cluster.kubeconfig)],
                          capture_output=True, text=True, check=True)
    return {r["name"]: (int(r["revision"]), r["status"]) for r in json.loads(done.stdout)}


def route_endpoints(drivers: DriverSet, tmp_path: Path) -> set[str]:
    table = build_route_table(drivers.snapshot(), StatusStore(tmp_path / "status.json"))
    route = table.lookup("review-responder", "team-a")
    assert route is not None
    return {b.endpoint for b in route.stable_replicas}


async def test_a_pool_deploys_one_helm_release_per_placed_backend_and_re_places(k8s_cluster: LocalCluster,
                                                                                tmp_path: Path) -> None:
    cluster = k8s_cluster
    east_ns, west_ns = namespace(cluster), namespace(cluster)
    backends = {"east": backend(cluster, "east", east_ns, replicas=4), "west": backend(cluster, "west", west_ns, replicas=4)}
    run = pool_run()
    state = StateDir(tmp_path / "state")
    drivers = DriverSet(LocalDriver(state), state, make_helm)
    drivers.remember(run, backends["east"], backends.values())  # what the saga's steps do with its commit

    placement = place_all([run], backends)[KEY]
    assert placement.placed and placement.counts() == {"east": 1, "west": 1}  # spread: one replica each
    request = InstallRequest(namespace="team-a", name="review-responder", track="canary", version="1.2.0",
                             spec_fingerprint=run.fingerprint(), recipe_digest=DIGEST, recipe_dir="/var/lib/plnt/recipe",
                             traffic_percent=10, trust=TRUST, replicas=2, placement=placement.counts())
    try:
        canary = await drivers.install(request)
        assert (canary.backend, canary.placement) == ("east", {"east": 1, "west": 1})
        assert canary.endpoint == f"http://review-responder-canary.{east_ns}.svc.cluster.local"
        assert deployments(cluster, east_ns) == {"review-responder-canary": (1, 1)}  # one pod, on the first backend
        assert deployments(cluster, west_ns) == {}

        stable = await drivers.promote("team-a", "review-responder")
        assert deployments(cluster, east_ns) == {"review-responder": (1, 1)}  # the canary uninstalled
        assert deployments(cluster, west_ns) == {"review-responder": (1, 1)}
        east_svc = f"http://review-responder.{east_ns}.svc.cluster.local"
        west_svc = f"http://review-responder.{west_ns}.svc.cluster.local"
        assert (stable.endpoints, stable.replicas, stable.placement) == ((east_svc, west_svc), 2, {"east": 1, "west": 1})
        assert route_endpoints(drivers, tmp_path) == {east_svc, west_svc}  # one endpoint per backend's Service
        assert (await drivers.promote("team-a", "review-responder")).endpoints == (east_svc, west_svc)  # a retry

        # A plnt restarted on the same state reads the pool back from both clusters.
        again = DriverSet(LocalDriver(state), state, make_helm)
        live = (await again.live())[KEY]  # (before it learns any spec: the pool's members are in its state)
        assert live.canary is None and live.stable is not None
        assert live.stable.replicas_by_backend() == {"east": 1, "west": 1}
        assert set(live.stable.endpoints) == {east_svc, west_svc}

        # west's capacity lowered to nothing: its replica is placed again, on east.
        lowered = {**backends, "west": backend(cluster, "west", west_ns, replicas=0)}
        again.remember(run, lowered["east"], lowered.values())  # the commit's specs, as every pass assigns them
        replaced = place_all([run], lowered, {KEY: live.stable.replicas_by_backend()})[KEY]
        assert replaced.placed and replaced.counts() == {"east": 2}, replaced.lines()
        moved = await again.place_replicas("team-a", "review-responder", {**replaced.counts(), "west": 0})
        assert (moved.endpoints, moved.replicas, moved.placement) == ((east_svc,), 2, {"east": 2})
        assert deployments(cluster, east_ns) == {"review-responder": (2, 2)}
        assert releases(cluster, east_ns) == {"review-responder": (2, "deployed")}  # a helm upgrade of the same release
        assert releases(cluster, west_ns) == {} and deployments(cluster, west_ns) == {}  # uninstalled
        assert route_endpoints(again, tmp_path) == {east_svc}
        assert (await again.live())[KEY].stable.replicas_by_backend() == {"east": 2}  # type: ignore[union-attr]
    finally:
        await drivers.remove("team-a", "review-responder", "canary")
        await drivers.remove("team-a", "review-responder", "stable")
    assert releases(cluster, east_ns) == {} and releases(cluster, west_ns) == {}
    assert KEY not in await drivers.live()
