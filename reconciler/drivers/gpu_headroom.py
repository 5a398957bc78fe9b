"""Free GPUs of a Kubernetes backend, as its cluster reports them: placement's observed GPU headroom.

For each GPU class the backend offers, each of its schedulable Nodes that match the backend's
nodeSelector and carry the class: its allocatable GPUs less the GPU requests of the pods bound to it
and not finished. Kept per Node (`GpusFree`), not summed: a replica's GPUs must all be on one Node;
with the Node's labels: a run's own nodeSelector counts only the Nodes it matches (placement filters,
the reading is one per backend for all its runs). A class means what it means in the charts
(helm.gpu_resource_name): a device plugin's resource name (nvidia.com/gpu, amd.com/gpu,
nvidia.com/mig-*) is counted as that resource on any matching Node; any other class (e.g. nvidia.com/h100) is the GPU pool's node label
(`<class>: "true"`) and its GPUs are counted in nvidia.com/gpu (or the configured resource).

`free_gpus` is pure (table-tested); `read_gpu_headroom` lists Nodes and Pods (RBAC: list nodes, list
pods in all namespaces), bounded in pages and time. A reading that fails is `HeadroomUnknown`:
placement then goes by declared capacity and says so.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from plnt.core.specs.models import PlntBackend
from plnt.reconciler.drivers.helm import backend_api_client, gpu_resource_name
from plnt.reconciler.plan.placement import GpusFree, NodeFree

log = logging.getLogger(__name__)

DEFAULT_GPU_RESOURCE = "nvidia.com/gpu"
PAGE = 500  # objects per list call
MAX_PAGES = 20  # a cluster with more Nodes or pods than PAGE * MAX_PAGES is "unknown", not read in full
READ_TIMEOUT_S = 10.0  # each list call; the whole reading is bounded by `timeout_s`
FINISHED = ("Succeeded", "Failed")  # phases of pods that hold no GPU any more


class HeadroomUnknown(Exception):
    """The cluster's free GPUs could not be read (unreachable, RBAC, too big): placement uses the
    declared capacity alone for this backend."""


@dataclass(frozen=True)
class NodeGpus:
    """What placement needs of a Node: its labels, its allocatable resources, whether pods may go there."""

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    allocatable: Mapping[str, str] = field(default_factory=dict)
    unschedulable: bool = False


@dataclass(frozen=True)
class PodGpus:
    """A pod's Node (None: not bound yet) and the resources it requests (its effective requests)."""

    node: str | None
    requests: Mapping[str, int] = field(default_factory=dict)


def gpu_source(gpu_class: str, configured: str | None = None) -> tuple[str, str | None]:
    """(the resource the class's GPUs are counted in, the node label key a Node needs, or None)."""
    resource = gpu_resource_name(gpu_class, configured)
    if resource == "":
        return gpu_class, None  # the class is itself the device plugin's resource
    return resource, gpu_class


def free_gpus(gpu_classes: Iterable[str], nodes: Iterable[NodeGpus], pods: Iterable[PodGpus],
              node_selector: Mapping[str, str], configured: str | None = None) -> GpusFree:
    """Free GPUs of each class on each Node matching `node_selector` and carrying the class (its label,
    if the class is one, and its resource), in the Nodes' order, with each Node's name and labels (a
    Node's free GPUs: allocatable less what bound pods request, never below 0; cordoned Nodes are left
    out)."""
    nodes = [n for n in nodes if not n.unschedulable and all(n.labels.get(k) == v for k, v in node_selector.items())]
    held: dict[tuple[str, str], int] = {}
    for pod in pods:
        if pod.node is None:
            continue
        for resource, count in pod.requests.items():
            held[pod.node, resource] = held.get((pod.node, resource), 0) + count
    out: GpusFree = {}
    for gpu_class in gpu_classes:
        resource, label = gpu_source(gpu_class, configured)
        out[gpu_class] = tuple(
            NodeFree(node.name, max(_quantity(node.allocatable.get(resource, "0")) - held.get((node.name, resource), 0),
                                    0), dict(node.labels))
            for node in nodes if resource in node.allocatable and (label is None or node.labels.get(label) == "true"))
    return out


def _quantity(value: Any) -> int:
    """An extended resource's quantity: a whole number ("4"); anything else counts as none."""
    try:
        return max(int(str(value)), 0)
    except ValueError:
        return 0


def pod_requests(spec: Any) -> dict[str, int]:
    """A pod's effective requests of whole-number resources, as the scheduler counts them: the sum over
    its containers, or the largest init container's if more (an extended resource's limit is its
    request)."""
    def of(container: Any) -> dict[str, int]:
        resources = container.resources
        limits = (resources.limits if resources is not None else None) or {}
        requests = (resources.requests if resources is not None else None) or {}
        out = {name: _quantity(value) for name, value in limits.items() if "/" in name}
        out.update({name: _quantity(value) for name, value in requests.items() if "/" in name})
        return out

    total: dict[str, int] = {}
    for container in spec.containers or ():
        for name, count in of(container).items():
            total[name] = total.get(name, 0) + count
    for container in spec.init_containers or ():
        for name, count in of(container).items():
            total[name] = max(total.get(name, 0), count)
    return {name: count for name, count in total.items() if count}


def _list_all(call: Any, **kwargs: Any) -> list[Any]:
    """Every item of a list call, page by page, at most MAX_PAGES pages."""
    items: list[Any] = []
    token = None
    for _ in range(MAX_PAGES):
        page = call(limit=PAGE, _continue=token, _request_timeout=READ_TIMEOUT_S, **kwargs)
        items.extend(page.items)
        token = page.metadata._continue
        if not token:
            return items
    raise HeadroomUnknown(f"more than {PAGE * MAX_PAGES} objects to read")


def _read(backend: PlntBackend, configured: str | None) -> GpusFree:
    from kubernetes import client as k8s

    assert backend.spec.kubernetes is not None
    api = backend_api_client(backend.spec.kubernetes)
    with api:
        core = k8s.CoreV1Api(api)
        selector = ",".join(f"{k}={v}" for k, v in backend.spec.node_selector.items()) or None
        nodes = [NodeGpus(name=n.metadata.name, labels=n.metadata.labels or {},
                          allocatable=(n.status.allocatable if n.status is not None else None) or {},
                          unschedulable=bool(n.spec is not None and n.spec.unschedulable))
                 for n in _list_all(core.list_node, label_selector=selector)]
        phases = ",".join(f"status.phase!={phase}" for phase in FINISHED)
        pods = [PodGpus(node=p.spec.node_name, requests=pod_requests(p.spec))
                for p in _list_all(core.list_pod_for_all_namespaces, field_selector=phases)]
    return free_gpus(backend.spec.gpu_classes, nodes, pods, backend.spec.node_selector, configured)


async def read_gpu_headroom(backend: PlntBackend, *, configured: str | None = None,
                            timeout_s: float = 15.0) -> GpusFree:
    """Free GPUs per class and Node of a `type: kubernetes` backend (see the module); HeadroomUnknown when its
    cluster cannot be read within `timeout_s` (the reason, secret-free)."""
    try:
        async with asyncio.timeout(timeout_s):  # (the thread's calls end by their own READ_TIMEOUT_S)
            return await asyncio.to_thread(_read, backend, configured)
    except HeadroomUnknown:
        raise
    except TimeoutError:
        raise HeadroomUnknown(f"no answer within {timeout_s:g}s") from None
    except Exception as exc:  # (the API's own errors carry headers: the type and status only)
        status = getattr(exc, "status", None)
        if status == 403:
            raise HeadroomUnknown("forbidden: its account needs list on nodes and pods, cluster-wide") from None
        raise HeadroomUnknown(f"{type(exc).__name__}{f' {status}' if status else ''}") from None


async def observe_gpu_headroom(backends: Mapping[str, PlntBackend], *, configured: str | None = None,
                               timeout_s: float = 15.0) -> dict[str, GpusFree | str]:
    """Free GPUs per class and Node for each `type: kubernetes` backend offering GPU classes, read at once; a
    backend that could not be read maps to why (a string)."""
    names = [name for name, b in backends.items() if b.spec.type == "kubernetes" and b.spec.gpu_classes]
    results = await asyncio.gather(*(read_gpu_headroom(backends[n], configured=configured, timeout_s=timeout_s)
                                     for n in names), return_exceptions=True)
    out: dict[str, GpusFree | str] = {}
    for name, result in zip(names, results, strict=True):
        if isinstance(result, HeadroomUnknown):
            log.warning("gpu-headroom-unknown backend=%s reason=%s (placing by declared capacity)", name, result)
            out[name] = str(result)
        elif isinstance(result, BaseException):
            raise result
        else:
            out[name] = result
    return out
