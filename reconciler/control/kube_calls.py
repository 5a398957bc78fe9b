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
    scope: Literal["plnt", "mirror"]  # plnt's own namespace, or each namespace WorkflowRuns are mirrored into


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
)
