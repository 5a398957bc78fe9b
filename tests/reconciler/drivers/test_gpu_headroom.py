"""The free GPUs of a Kubernetes backend, from its Nodes and pods: the pure part, table-tested on
objects built in memory (the reading against a real cluster: tests/k8s/test_gpu_headroom_on_cluster.py)."""

from __future__ import annotations

import pytest
from kubernetes import client as k8s
from plnt.reconciler.drivers.gpu_headroom import NodeGpus, PodGpus, free_gpus, gpu_source, pod_requests
from plnt.reconciler.plan.placement import NodeFree

H100 = "nvidia.com/h100"
GPU = "nvidia.com/gpu"


def node(name: str, gpus: int, *, labels: dict[str, str] | None = None, resource: str = GPU,
         cordoned: bool = False) -> NodeGpus:
    return NodeGpus(name, labels or {}, {resource: str(gpus), "cpu": "8"}, unschedulable=cordoned)


@pytest.mark.parametrize(("gpu_class", "configured", "expected"), [
    (H100, None, (GPU, H100)),  # a node label; GPUs counted in nvidia.com/gpu (as the charts do)
    (GPU, None, (GPU, None)),  # the device plugin's own resource: any node with it
    ("amd.com/gpu", None, ("amd.com/gpu", None)),
    ("nvidia.com/mig-1g.10gb", None, ("nvidia.com/mig-1g.10gb", None)),
    (H100, "amd.com/gpu", ("amd.com/gpu", H100)),  # the configured resource (kubernetes.gpu_resource)
])
def test_gpu_source_keeps_the_charts_mapping(gpu_class: str, configured: str | None,
                                             expected: tuple[str, str | None]) -> None:
    assert gpu_source(gpu_class, configured) == expected


LABELLED = {H100: "true"}
# (name, classes, nodes, pods, node selector, expected free per class)
CASES = [
    ("allocatable of the labelled nodes", [H100], [node("n1", 4, labels=LABELLED), node("n2", 2, labels=LABELLED),
                                                   node("cpu", 0)], [], {}, {H100: (4, 2)}),
    ("a node without the class label does not count", [H100], [node("n1", 4, labels=LABELLED), node("n2", 8)], [], {},
     {H100: (4,)}),
    ("bound pods' requests are held", [H100], [node("n1", 4, labels=LABELLED), node("n2", 2, labels=LABELLED)],
     [PodGpus("n1", {GPU: 3}), PodGpus("n2", {GPU: 2})], {}, {H100: (1, 0)}),
    ("each Node apart, not summed: 1 free on each of two is (1, 1)", [H100],
     [node("n1", 2, labels=LABELLED), node("n2", 2, labels=LABELLED)], [PodGpus("n1", {GPU: 1}),
                                                                       PodGpus("n2", {GPU: 1})], {}, {H100: (1, 1)}),
    ("pending pods (no node) hold nothing yet", [H100], [node("n1", 2, labels=LABELLED)], [PodGpus(None, {GPU: 2})], {},
     {H100: (2,)}),
    ("an over-committed node counts 0, not less", [H100], [node("n1", 1, labels=LABELLED),
                                                           node("n2", 2, labels=LABELLED)],
     [PodGpus("n1", {GPU: 3})], {}, {H100: (0, 2)}),
    ("the backend's nodeSelector narrows the nodes", [H100],
     [node("n1", 4, labels={**LABELLED, "pool": "a"}), node("n2", 4, labels={**LABELLED, "pool": "b"})], [],
     {"pool": "a"}, {H100: (4,)}),
    ("a cordoned node is left out", [H100], [node("n1", 4, labels=LABELLED, cordoned=True),
                                            node("n2", 1, labels=LABELLED)], [], {}, {H100: (1,)}),
    ("a device plugin class counts its resource on any node that has it", ["amd.com/gpu"],
     [node("n1", 2, resource="amd.com/gpu"), node("n2", 4), node("n3", 3, resource="amd.com/gpu")],
     [PodGpus("n1", {"amd.com/gpu": 1})], {}, {"amd.com/gpu": (1, 3)}),
    ("each class apart", [H100, "nvidia.com/a100"],
     [node("n1", 4, labels=LABELLED), node("n2", 2, labels={"nvidia.com/a100": "true"})],
     [PodGpus("n2", {GPU: 1})], {}, {H100: (4,), "nvidia.com/a100": (1,)}),
    ("no matching node: none", [H100], [], [], {}, {H100: ()}),
]


@pytest.mark.parametrize(("classes", "nodes", "pods", "selector", "expected"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_free_gpus(classes: list[str], nodes: list[NodeGpus], pods: list[PodGpus], selector: dict[str, str],
                   expected: dict[str, tuple[int, ...]]) -> None:
    reading = free_gpus(classes, nodes, pods, selector)
    assert {gpu_class: tuple(node.free for node in each) for gpu_class, each in reading.items()} == expected


def test_free_gpus_keeps_each_node_s_name_and_labels_for_a_run_s_own_node_selector() -> None:
    fast = {**LABELLED, "pool": "a", "gpu": "fast"}
    reading = free_gpus([H100], [node("n1", 2, labels=fast), node("n2", 1, labels={**LABELLED, "pool": "b"}),
                                 node("n3", 4, labels={**LABELLED, "pool": "a", "gpu": "slow"})],
                        [PodGpus("n1", {GPU: 2})], {"pool": "a"})
    assert reading == {H100: (NodeFree("n1", 0, fast), NodeFree("n3", 4, {**LABELLED, "pool": "a", "gpu": "slow"}))}
    assert [n.name for n in reading[H100] if n.matches({"gpu": "fast"})] == ["n1"]


def container(limits: dict[str, str] | None = None, requests: dict[str, str] | None = None) -> k8s.V1Container:
    return k8s.V1Container(name="c", resources=k8s.V1ResourceRequirements(limits=limits, requests=requests))


@pytest.mark.parametrize(("containers", "init", "expected"), [
    ([container(limits={GPU: "2", "cpu": "1"})], [], {GPU: 2}),  # a limit alone is the request
    ([container(limits={GPU: "1"}), container(requests={GPU: "1"}, limits={GPU: "1"})], [], {GPU: 2}),
    ([container(limits={GPU: "1"})], [container(limits={GPU: "3"})], {GPU: 3}),  # the largest init container
    ([container()], [], {}),
    ([container(limits={GPU: "0.5"})], [], {}),  # not a whole number: none
], ids=["limit", "containers summed", "init container", "none", "malformed"])
def test_pod_requests(containers: list[k8s.V1Container], init: list[k8s.V1Container], expected: dict[str, int]) -> None:
    assert pod_requests(k8s.V1PodSpec(containers=containers, init_containers=init)) == expected
