"""A pool's Helm releases, the pure parts, table-tested: the replica count and placement each backend's
release is rendered with (`pool_replicas`), and how the releases of several backends become the one
Release the plan and the gateway see (`merged`, `merged_live`, `Release.replicas_by_backend`). The
helm calls themselves run against a real cluster in tests/k8s/test_pool_on_cluster.py."""

from __future__ import annotations

from typing import Any

import pytest
from plnt.core.specs.models import PlntBackend
from plnt.reconciler.drivers.helm import chart_replicas, pool_replicas
from plnt.reconciler.drivers.helm_pool import merged, merged_live
from plnt.reconciler.errors import DriverError
from plnt.reconciler.state import LiveWorkflow, Release

from tests.reconciler.drivers.test_helm_driver import request


def kube(name: str) -> PlntBackend:
    return PlntBackend.model_validate({"apiVersion": "plnt.work/v1", "kind": "PlntBackend", "metadata": {"name": name},
                                       "spec": {"type": "kubernetes", "kubernetes": {"namespace": f"agents-{name}"}}})


def helm_release(backend: str, pods: int, release_id: str = "team-a.rr.1.2.0.aaaa", track: str = "stable") -> Release:
    """A release as HelmDriver reads one backend's back: its Service, its pods, the pool's placement."""
    return Release(release_id=release_id, namespace="team-a", name="rr", track=track, version="1.2.0",
                   spec_fingerprint="sha256:" + "1" * 64, recipe_digest="sha256:" + "2" * 64, recipe_dir="/r",
                   endpoint=f"http://rr.agents-{backend}.svc.cluster.local", replicas=pods,
                   placement={"east": 1, "west": 1}, backend=backend)


@pytest.mark.parametrize(("track", "placement", "backend", "shape", "expected"), [
    ("stable", None, "east", {"min": 3, "max": 5}, {"replicas": {"min": 3, "max": 5}}),  # one backend: the spec's
    ("canary", {"east": 2, "west": 1}, "east", {"min": 3, "max": 3},
     {"replicas": {"min": 1, "max": 1}, "placement": {"east": 2, "west": 1}}),  # a pool's canary: one pod
    ("stable", {"east": 2, "west": 1}, "east", {"min": 3, "max": 3},
     {"replicas": {"min": 2, "max": 2}, "placement": {"east": 2, "west": 1}}),
    ("stable", {"east": 2, "west": 1}, "west", 3, {"replicas": 1, "placement": {"east": 2, "west": 1}}),  # a model's
])
def test_a_pools_release_on_a_backend_runs_that_backends_count(track: str, placement: dict[str, int] | None,
                                                                backend: str, shape: Any, expected: Any) -> None:
    wanted = request(track=track).model_copy(update={"placement": placement})
    assert pool_replicas(wanted, kube(backend), shape) == expected


def test_a_backend_the_placement_leaves_out_gets_no_stable_release() -> None:
    wanted = request(track="stable").model_copy(update={"placement": {"east": 2}})
    with pytest.raises(DriverError, match="puts no stable replica on backend 'west'"):
        pool_replicas(wanted, kube("west"), {"min": 2, "max": 2})
    assert chart_replicas({"min": 1, "max": 9}, 4) == {"min": 4, "max": 4} and chart_replicas(1, 4) == 4


@pytest.mark.parametrize(("releases", "endpoints", "placement"), [
    ([helm_release("east", 1), helm_release("west", 1)],
     ("http://rr.agents-east.svc.cluster.local", "http://rr.agents-west.svc.cluster.local"), {"east": 1, "west": 1}),
    ([helm_release("east", 3)], ("http://rr.agents-east.svc.cluster.local",), {"east": 3}),
    # A promotion half done: west still runs the old release; the routes send to the one with more pods.
    ([helm_release("east", 2), helm_release("west", 1, release_id="team-a.rr.1.1.0.bbbb")],
     ("http://rr.agents-east.svc.cluster.local",), {"east": 2}),
])
def test_a_pools_releases_merge_into_one_with_an_endpoint_per_backend(
        releases: list[Release], endpoints: tuple[str, ...], placement: dict[str, int]) -> None:
    pool = merged(releases)
    assert pool.endpoints == endpoints
    assert pool.placement == placement and pool.replicas == sum(placement.values())
    assert pool.replicas_by_backend() == placement  # the pods per backend, not one per Service


def test_a_pools_live_state_is_its_members_views_merged() -> None:
    canary = helm_release("east", 1, release_id="team-a.rr.1.3.0.cccc", track="canary")
    views = [LiveWorkflow(namespace="team-a", name="rr", stable=helm_release("east", 1), canary=canary),
             LiveWorkflow(namespace="team-a", name="rr", stable=helm_release("west", 2))]
    live = merged_live(views)
    assert live is not None and live.canary == canary
    assert live.stable is not None and live.stable.replicas_by_backend() == {"east": 1, "west": 2}
    assert merged_live([]) is None


def test_a_local_pools_processes_are_counted_one_by_one() -> None:
    """A local pool's release names a pid: each process counts, whatever the placement says."""
    local = helm_release("east", 2).model_copy(update={"pid": 42, "placement": {"east": 2}})
    assert local.replicas_by_backend() == {"east": 1}  # one process recorded so far
