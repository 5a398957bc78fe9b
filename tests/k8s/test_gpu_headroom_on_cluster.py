"""Placement by the free GPUs a REAL API server reports (reconciler/drivers/gpu_headroom.py): two
PlntBackends of type kubernetes on one cluster, each a GPU pool of kwok nodes (its nodeSelector), a
WorkflowRun on both by a label selector. The reading keeps each Node apart: west's 2 free GPUs, 1 on
each of two Nodes, take no replica of 2 GPUs (the real scheduler leaves such a pod Pending), east's
2 on one Node do. A pod scheduled onto one pool's GPUs (by the real scheduler) moves the next
placement to the other, with the observed count in the reason; a request larger than what is free
names the missing GPUs; a reader without RBAC to list Nodes is "unknown" and placement
says it goes by declared capacity. A run's own nodeSelector counts only the Nodes it matches: north's
one free GPU is on a Node its selector leaves out, so it goes to south (a run without the selector
still goes to north's free GPU), and on north alone it is refused with the missing GPU named, as the
real scheduler refuses its pod. The reading runs with a ServiceAccount token granted list on
nodes and pods and nothing else, and the audit log shows it used only those.

kwok's nodes run no containers: the GPUs are the Nodes' allocatable `nvidia.com/gpu`, as a device
plugin would advertise them; no real GPU is used (docs/development.md, unproven)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from plnt.core.specs.models import PlntBackend, WorkflowRun
from plnt.reconciler.drivers.gpu_headroom import observe_gpu_headroom
from plnt.reconciler.plan.placement import place_all, with_gpu_readings

from tests.k8s.cluster import GPU_RESOURCE, FakeNode, LocalCluster, wait_for

pytestmark = [pytest.mark.k8s, pytest.mark.integration]

H100 = "nvidia.com/h100"  # the charts' convention: GPU pools are labelled `<class>: "true"`
NODES = (FakeNode("node-a"),
         FakeNode("east-0", gpus=2, labels={H100: "true", "pool": "east"}),
         FakeNode("west-0", gpus=1, labels={H100: "true", "pool": "west"}),
         FakeNode("west-1", gpus=1, labels={H100: "true", "pool": "west"}),
         # two pools whose Nodes differ by a label a run's own nodeSelector may name (`gpu: fast`)
         FakeNode("north-fast", gpus=1, labels={H100: "true", "pool": "north", "gpu": "fast"}),
         FakeNode("north-slow", gpus=1, labels={H100: "true", "pool": "north", "gpu": "slow"}),
         FakeNode("south-fast", gpus=1, labels={H100: "true", "pool": "south", "gpu": "fast"}))
READER = "plnt-placement"  # a ServiceAccount with list on nodes and pods only (what the reconciler needs)


@pytest.fixture(scope="module")
def cluster(k8s_bin_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(k8s_bin_dir, tmp_path_factory.mktemp("k8s-gpu-headroom"), nodes=NODES) as cluster:
        yield cluster


def reader_kubeconfig(cluster: LocalCluster, path: Path, *, granted: bool) -> Path:
    """A token kubeconfig of a fresh ServiceAccount; `granted`: a ClusterRole of list nodes and pods."""
    api = cluster.api_client()
    core, rbac = k8s.CoreV1Api(api), k8s.RbacAuthorizationV1Api(api)
    account = f"{READER}-{uuid.uuid4().hex[:6]}"
    core.create_namespaced_service_account("default", k8s.V1ServiceAccount(metadata=k8s.V1ObjectMeta(name=account)))
    if granted:
        rbac.create_cluster_role(k8s.V1ClusterRole(metadata=k8s.V1ObjectMeta(name=account), rules=[
            k8s.V1PolicyRule(api_groups=[""], resources=["nodes", "pods"], verbs=["list"])]))
        rbac.create_cluster_role_binding(k8s.V1ClusterRoleBinding(
            metadata=k8s.V1ObjectMeta(name=account),
            role_ref=k8s.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="ClusterRole", name=account),
            subjects=[k8s.RbacV1Subject(kind="ServiceAccount", name=account, namespace="default")]))
    return cluster.token_kubeconfig(account, "default", path / f"{account}.kubeconfig")


def backend(name: str, pool: str, kubeconfig: Path, gpus: int | None = None) -> PlntBackend:
    spec: dict[str, Any] = {"type": "kubernetes", "gpuClasses": [H100], "nodeSelector": {"pool": pool},
                            "kubernetes": {"namespace": f"agents-{pool}", "kubeconfig": str(kubeconfig)}}
    if gpus is not None:
        spec["capacity"] = {"gpus": {H100: gpus}}
    return PlntBackend.model_validate({"apiVersion": "plnt.work/v1", "kind": "PlntBackend",
                                       "metadata": {"name": name, "labels": {"tier": "gpu"}}, "spec": spec})


def gpu_run(replicas: int, gpus: int = 1, pool: dict[str, Any] | None = None,
            node_selector: dict[str, str] | None = None) -> WorkflowRun:
    return WorkflowRun.model_validate({
        "apiVersion": "plnt.work/v1", "kind": "WorkflowRun", "metadata": {"name": "review-responder"},
        "spec": {"workflow": {"ref": "review-responder@1.0.0", "registry": "oci://registry.example/recipes"},
                 "backend": {**(pool or {"selector": {"matchLabels": {"tier": "gpu"}}}), "gpuClass": H100,
                             "gpuCount": gpus, "nodeSelector": node_selector or {}},
                 "replicas": {"min": replicas}}})


def placed(backends: dict[str, PlntBackend], run: WorkflowRun) -> Any:
    readings = asyncio.run(observe_gpu_headroom(backends, timeout_s=20))
    observed = with_gpu_readings({}, readings)
    return readings, place_all([run], backends, {}, observed)[run.key]


def free_per_node(readings: dict[str, Any]) -> dict[str, Any]:
    """A reading in short: each backend's free GPUs of each class, one count per Node."""
    return {name: reading if isinstance(reading, str) else
            {gpu_class: tuple(node.free for node in each) for gpu_class, each in reading.items()}
            for name, reading in readings.items()}


def gpu_pod(cluster: LocalCluster, pool: str, gpus: int, labels: dict[str, str] | None = None) -> str:
    """A pod (not plnt's) asking for `gpus` GPUs of the pool (and of its Nodes with `labels`), left to the
    scheduler: its name."""
    core = k8s.CoreV1Api(cluster.api_client())
    name = f"filler-{uuid.uuid4().hex[:6]}"
    wait_for("the default ServiceAccount", lambda: core.list_namespaced_service_account(
        "default", field_selector="metadata.name=default").items)
    core.create_namespaced_pod("default", k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(name=name),
        spec=k8s.V1PodSpec(node_selector={"pool": pool, H100: "true", **(labels or {})}, containers=[k8s.V1Container(
            name="train", image="registry.invalid/train:1",
            resources=k8s.V1ResourceRequirements(limits={GPU_RESOURCE: str(gpus)}))])))
    return name


def fill(cluster: LocalCluster, pool: str, gpus: int, labels: dict[str, str] | None = None) -> str:
    """A pod (not plnt's) asking for `gpus` GPUs of the pool, bound to one of its nodes by the scheduler:
    that Node's name."""
    core = k8s.CoreV1Api(cluster.api_client())
    name = gpu_pod(cluster, pool, gpus, labels)
    return str(wait_for(f"pod {name} bound to a {pool} node",
                        lambda: core.read_namespaced_pod(name, "default").spec.node_name))


def unschedulable(cluster: LocalCluster, pool: str, gpus: int, labels: dict[str, str] | None = None) -> str:
    """What the real scheduler says of a pod asking for `gpus` GPUs of the pool that it cannot bind
    (the pod is deleted after: it held nothing)."""
    core = k8s.CoreV1Api(cluster.api_client())
    name = gpu_pod(cluster, pool, gpus, labels)

    def refused() -> str | None:
        pod = core.read_namespaced_pod(name, "default")
        assert pod.spec.node_name is None, f"the scheduler bound {name} to {pod.spec.node_name}"
        return next((c.message for c in pod.status.conditions or ()
                     if c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable"), None)

    try:
        return str(wait_for(f"pod {name} refused by the scheduler", refused))
    finally:
        core.delete_namespaced_pod(name, "default", grace_period_seconds=0)


def test_placement_follows_the_free_gpus_the_cluster_reports(cluster: LocalCluster, tmp_path: Path) -> None:
    kubeconfig = reader_kubeconfig(cluster, tmp_path, granted=True)
    backends = {"east": backend("east", "east", kubeconfig), "west": backend("west", "west", kubeconfig)}

    readings, first = placed(backends, gpu_run(1))
    assert free_per_node(readings) == {"east": {H100: (2,)}, "west": {H100: (1, 1)}}  # west-0 and west-1, 1 each
    assert first.lines() == ["replica 1 -> east: 2 (observed) GPUs of class nvidia.com/h100 free, 0 in flight"]

    # A replica of 2 GPUs needs them on one Node: west's two are split, so west is passed over...
    _, two = placed({"west": backends["west"]}, gpu_run(1, gpus=2, pool={"cluster": "west"}))
    assert two.missing == ("needs 1 more replica of 2 GPUs of class nvidia.com/h100 on one Node: west has 2 free "
                           "(west: 2 observed, at most 1 on one Node)")
    assert "Insufficient nvidia.com/gpu" in unschedulable(cluster, "west", 2)  # ...as the real scheduler would
    _, pooled = placed(backends, gpu_run(2, gpus=2))
    assert pooled.counts() == {"east": 1}
    assert pooled.missing == ("needs 1 more replica of 2 GPUs of class nvidia.com/h100 on one Node: selector "
                              "tier=gpu has 2 free (east: 0 observed, west: 2 observed, at most 1 on one Node)")

    fill(cluster, "east", 2)  # another workload takes every GPU of east (the scheduler binds 2 on one Node)
    readings, moved = placed(backends, gpu_run(1))
    assert free_per_node(readings) == {"east": {H100: (0,)}, "west": {H100: (1, 1)}}
    assert moved.lines() == ["replica 1 -> west: 2 (observed) GPUs of class nvidia.com/h100 free, 0 in flight"]

    fill(cluster, "west", 1)
    _, short = placed(backends, gpu_run(2))
    assert short.counts() == {"west": 1}
    assert short.missing == ("needs 1 more GPU of class nvidia.com/h100: selector tier=gpu has 0 free "
                             "(east: 0 observed, west: 0 observed)")

    # What the reading did, as the API server recorded it: lists of nodes and pods, nothing else.
    user = f"system:serviceaccount:default:{kubeconfig.stem}"
    assert {(group, resource, verb, code) for group, resource, verb, _, code in cluster.requests_of(user)} \
        == {("", "nodes", "list", 200), ("", "pods", "list", 200)}


def test_an_unreadable_cluster_is_unknown_and_placement_says_it_uses_declared_capacity(
        cluster: LocalCluster, tmp_path: Path) -> None:
    kubeconfig = reader_kubeconfig(cluster, tmp_path, granted=False)  # no RBAC to list nodes: 403
    backends = {"east": backend("east", "east", kubeconfig, gpus=4)}
    readings, placement = placed(backends, gpu_run(1))
    why = "forbidden: its account needs list on nodes and pods, cluster-wide"
    assert readings == {"east": why}
    assert placement.lines() == ["replica 1 -> east: 4 of 4 GPUs of class nvidia.com/h100 free, free GPUs unknown "
                                 f"({why}): by declared capacity, 0 in flight"]


def test_a_run_s_own_node_selector_counts_only_the_nodes_it_matches(cluster: LocalCluster, tmp_path: Path) -> None:
    kubeconfig = reader_kubeconfig(cluster, tmp_path, granted=True)
    backends = {"north": backend("north", "north", kubeconfig), "south": backend("south", "south", kubeconfig)}
    fast = {"gpu": "fast"}
    assert fill(cluster, "north", 1, fast) == "north-fast"  # another workload takes north's fast GPU

    # north has a free GPU, on its slow Node: a run asking for fast Nodes goes to south...
    readings, to_south = placed(backends, gpu_run(1, pool={"refs": ["north", "south"]}, node_selector=fast))
    assert free_per_node(readings) == {"north": {H100: (0, 1)}, "south": {H100: (1,)}}
    assert to_south.lines() == ["replica 1 -> south: 1 (observed) GPUs of class nvidia.com/h100 free on the Nodes "
                                "matching the run's nodeSelector {gpu: fast}, 0 in flight"]
    # ...while a run without it takes north's free GPU (fewer replicas held there, then by name)
    _, anywhere = placed(backends, gpu_run(1, pool={"refs": ["north", "south"]}))
    assert anywhere.lines() == ["replica 1 -> north: 1 (observed) GPUs of class nvidia.com/h100 free, 0 in flight"]

    # On north alone the fast run is refused, the free GPU it may not use named...
    _, refused = placed({"north": backends["north"]}, gpu_run(1, pool={"cluster": "north"}, node_selector=fast))
    assert refused.missing == ("needs 1 more GPU of class nvidia.com/h100: north has 0 free (north: 0 observed on "
                               "the Nodes matching the run's nodeSelector {gpu: fast}, 1 on other Nodes)")
    assert "Insufficient nvidia.com/gpu" in unschedulable(cluster, "north", 1, fast)  # ...as the scheduler would
    _, nowhere = placed({"north": backends["north"]}, gpu_run(1, pool={"cluster": "north"},
                                                              node_selector={"gpu": "tpu"}))
    assert nowhere.missing == ("needs 1 more GPU of class nvidia.com/h100: north has 0 free (north: 0 observed, "
                               "no Node matches the run's nodeSelector {gpu: tpu})")

    user = f"system:serviceaccount:default:{kubeconfig.stem}"
    assert {(group, resource, verb, code) for group, resource, verb, _, code in cluster.requests_of(user)} \
        == {("", "nodes", "list", 200), ("", "pods", "list", 200)}
