"""The chart's RBAC against what plnt did, on the REAL API server: the Roles `helm template charts/plnt`
renders are applied, plnt runs with a TokenRequest token of one of the chart's ServiceAccounts, and
the audit log is compared with the rules, grant by grant.

A grant is (namespace, apiGroup, resource[/subresource], verb, resourceName or ""), one per
combination a Role's rule lists. A call is what the audit log holds for the account (its
ResponseComplete events): it uses every grant that authorizes it. A server-side apply that creates
its object (a PATCH answered 201) is authorized as `create` as well as `patch`
(https://kubernetes.io/docs/reference/using-api/server-side-apply/#rbac-and-permissions): it uses
both. Discovery (/api, /apis, /version, /openapi) is open to every authenticated user and is no grant.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s
from kubernetes import utils as k8s_utils

from tests.k8s.cluster import LocalCluster

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "plnt"
RBAC_KINDS = ("ServiceAccount", "Role", "RoleBinding")
# The values the chart refuses to render without (only its RBAC is applied in these tests).
REQUIRED_VALUES = ("--set", "git.repo=https://git.invalid/specs.git", "--set", "temporal.address=temporal.invalid:7233",
                   "--set", "auth.tokens.secretName=plnt-tokens")
DISCOVERY = ("/version", "/api", "/apis", "/openapi")

Grant = tuple[str, str, str, str, str]  # (namespace, apiGroup, resource, verb, resourceName or "")


@dataclass(frozen=True)
class Call:
    namespace: str
    group: str
    resource: str  # with its subresource: "workflowruns/status"
    verb: str
    name: str
    code: int
    uri: str


def user(namespace: str, account: str) -> str:
    return f"system:serviceaccount:{namespace}:{account}"


def apply_chart_rbac(cluster: LocalCluster, helm: str, namespace: str, *sets: str) -> list[dict[str, Any]]:
    """Render charts/plnt as `helm install` into this cluster would (its Kubernetes version), with
    `sets`, and create its ServiceAccounts, Roles and RoleBindings. Returns the RBAC objects."""
    version = k8s.VersionApi(cluster.api_client()).get_code().git_version
    rendered = subprocess.run([helm, "template", "plnt", str(CHART), "--namespace", namespace, "--kube-version", version,
                               *REQUIRED_VALUES, *sets], capture_output=True, text=True, check=True).stdout
    docs = [doc for doc in yaml.safe_load_all(rendered) if doc and doc["kind"] in RBAC_KINDS]
    for doc in docs:
        k8s_utils.create_from_dict(cluster.api_client(), doc)
    return docs


def token_kubeconfig(cluster: LocalCluster, namespace: str, account: str, path: Path) -> Path:
    """A kubeconfig holding a token the TokenRequest API issued for the ServiceAccount."""
    return cluster.token_kubeconfig(account, namespace, path)


def granted(cluster: LocalCluster, namespace: str, account: str) -> set[Grant]:
    """Every grant the Roles bound to the account give it, in every namespace, as the server holds them."""
    rbac = k8s.RbacAuthorizationV1Api(cluster.api_client())
    out: set[Grant] = set()
    for binding in rbac.list_role_binding_for_all_namespaces().items:
        if not any(s.kind == "ServiceAccount" and s.name == account and s.namespace == namespace
                   for s in binding.subjects or []):
            continue
        assert binding.role_ref.kind == "Role", binding.metadata.name  # namespaced Roles only
        where = binding.metadata.namespace
        for rule in rbac.read_namespaced_role(binding.role_ref.name, where).rules:
            out |= {(where, g, r, v, n) for g in rule.api_groups for r in rule.resources for v in rule.verbs
                    for n in (rule.resource_names or [""])}
    return out


def calls(cluster: LocalCluster, username: str) -> list[Call]:
    """Every request the user made, from the audit log (discovery left out: it is checked to be only that)."""
    out = []
    for event in cluster.audit_events():
        if event.get("user", {}).get("username") != username or event.get("stage") != "ResponseComplete":
            continue
        ref = event.get("objectRef") or {}
        if not ref:
            assert event["requestURI"].startswith(DISCOVERY), event["requestURI"]
            continue
        resource = ref.get("resource", "") + (f"/{ref['subresource']}" if ref.get("subresource") else "")
        out.append(Call(ref.get("namespace", ""), ref.get("apiGroup", ""), resource, event["verb"], ref.get("name", ""),
                        event.get("responseStatus", {}).get("code", 0), event["requestURI"]))
    return out


def authorizing(call: Call, grants: set[Grant]) -> set[Grant]:
    """The grants that authorize the call (RBAC: any one suffices), with an apply's create."""
    verbs = {call.verb, "create"} if call.verb == "patch" and call.code == 201 else {call.verb}
    return {g for g in grants if g[:3] == (call.namespace, call.group, call.resource) and g[3] in verbs
            and g[4] in ("", call.name)}


@dataclass
class Usage:
    grants: set[Grant]
    used: set[Grant]
    refused: list[Call]
    ungranted: list[Call]  # calls no grant authorizes (and that the server did not refuse either)

    @property
    def unused(self) -> set[Grant]:
        return self.grants - self.used

    def figure(self) -> str:
        return f"{len(self.used)} of {len(self.grants)} grants used"


def usage(cluster: LocalCluster, namespace: str, account: str, only: set[str] | None = None) -> Usage:
    """The account's grants (in the namespaces `only`, when given) against its calls."""
    grants = {g for g in granted(cluster, namespace, account) if only is None or g[0] in only}
    used: set[Grant] = set()
    refused, ungranted = [], []
    for call in calls(cluster, user(namespace, account)):
        if call.code in (401, 403):
            refused.append(call)
            continue
        by = authorizing(call, grants)
        # a call authorized by one verb of several (an apply that creates): each one it needed
        if call.verb == "patch" and call.code == 201:
            needed = {"patch", "create"}
            if {g[3] for g in by} != needed:
                ungranted.append(call)
        elif not by:
            ungranted.append(call)
        used |= by
    return Usage(grants, used, refused, ungranted)


def can(cluster: LocalCluster, namespace: str, account: str, verb: str, resource: str, where: str | None,
        group: str = "", subresource: str | None = None, name: str | None = None) -> bool:
    """The server's own answer (SubjectAccessReview) for the ServiceAccount."""
    review = k8s.V1SubjectAccessReview(spec=k8s.V1SubjectAccessReviewSpec(
        user=user(namespace, account),
        groups=["system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"],
        resource_attributes=k8s.V1ResourceAttributes(verb=verb, resource=resource, namespace=where, group=group,
                                                     subresource=subresource, name=name)))
    return bool(k8s.AuthorizationV1Api(cluster.api_client()).create_subject_access_review(review).status.allowed)
