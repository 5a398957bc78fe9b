"""Every Kubernetes API call plnt's own code makes through the official client, by role.

The plnt chart's RBAC grants exactly these, plus what helm needs for the workflow-runner chart
(tests/charts/test_plnt_rbac.py); the tests of the client code check that every request they record
is listed here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class ApiCall:
    role: Literal["reconciler", "worker", "gateway"]
    group: str  # "" is the core group
    resource: str  # plural; a subresource as "workflowruns/status"
    verb: Literal["get", "list", "watch", "create", "update", "patch", "delete"]
    # plnt's own namespace; each namespace WorkflowRuns are mirrored into; each --source-namespace
    # (--source kubernetes, which also writes status and Events there as "mirror" says, never a spec);
    # the whole cluster of a type: kubernetes backend (rbac.reconciler.readGpuHeadroom in the chart).
    scope: Literal["plnt", "mirror", "source", "cluster"]


API_CALLS: tuple[ApiCall, ...] = (
    # Leader election of the reconciler: one Lease in plnt's namespace.
    ApiCall("reconciler", "coordination.k8s.io", "leases", "get", "plnt"),
    ApiCall("reconciler", "coordination.k8s.io", "leases", "create", "plnt"),
    ApiCall("reconciler", "coordination.k8s.io", "leases", "update", "plnt"),
    # --mirror-status: WorkflowRuns applied server-side, their status written, Events on phase changes.
    ApiCall("reconciler", "plnt.work", "workflowruns", "get", "mirror"),
    ApiCall("reconciler", "plnt.work", "workflowruns", "list", "mirror"),
    ApiCall("reconciler", "plnt.work", "workflowruns", "patch", "mirror"),
    ApiCall("reconciler", "plnt.work", "workflowruns", "delete", "mirror"),
    ApiCall("reconciler", "plnt.work", "workflowruns/status", "patch", "mirror"),
    ApiCall("reconciler", "", "events", "create", "mirror"),
    # --source kubernetes: the reconciler lists (and watches, to wake early) the objects it deploys;
    # a worker lists them to check a saga's input. Status and Events as the mirror's, no spec write.
    ApiCall("reconciler", "plnt.work", "workflowruns", "list", "source"),
    ApiCall("reconciler", "plnt.work", "workflowruns", "watch", "source"),
    ApiCall("reconciler", "plnt.work", "modeldeployments", "list", "source"),
    ApiCall("reconciler", "plnt.work", "modeldeployments", "watch", "source"),
    ApiCall("reconciler", "plnt.work", "workflowruns/status", "patch", "source"),
    ApiCall("reconciler", "", "events", "create", "source"),
    ApiCall("worker", "plnt.work", "workflowruns", "list", "source"),
    ApiCall("worker", "plnt.work", "modeldeployments", "list", "source"),
    # Placement's observed free GPUs of a Kubernetes backend (reconciler/drivers/gpu_headroom.py).
    ApiCall("reconciler", "", "nodes", "list", "cluster"),
    ApiCall("reconciler", "", "pods", "list", "cluster"),
)
