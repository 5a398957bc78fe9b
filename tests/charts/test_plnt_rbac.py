"""The plnt chart's RBAC grants exactly what plnt needs: no more, no less.

Expected, per role and namespace, as (apiGroup, resource, verb):
- plnt's own API calls, from reconciler/control/kube_calls.py (API_CALLS, scope "plnt" -> the release's
  namespace, scope "mirror" -> each mirrorStatus namespace when mirroring is on);
- plus what helm needs, DERIVED from rendering the charts the workers install with a matrix of their
  values (chartkit.RUNNER_CASES for workflow-runner, MODEL_SERVER_CASES for model-server: every kind
  they render): the worker installs, upgrades, rolls back and uninstalls those kinds (all seven
  verbs), keeps helm's release records (Secrets) and waits on a Deployment's ReplicaSets and Pods
  (--wait); the reconciler reads the release records (`helm list`, `helm get values`) in each deploy
  namespace.

Rendered with the real helm; the rules are what a cluster would get. That they suffice for helm 4's
server-side apply and kstatus waiting is shown on a real API server by tests/k8s/test_plnt_chart.py
(helm as the worker's service account installs, upgrades, rolls back and uninstalls both charts).
"""

from __future__ import annotations

import functools
from collections import defaultdict
from typing import Any

import pytest
from plnt.reconciler.control.kube_calls import API_CALLS

from tests.charts.chartkit import (
    FULLNAME,
    MODEL_SERVER_CASES,
    NAMESPACE,
    PLNT_CASES,
    PLNT_CHART,
    RUNNER_CASES,
    render,
    render_model_server,
    render_runner,
)

pytestmark = pytest.mark.integration  # every test runs the real helm binary

Grant = tuple[str, str, str]  # (apiGroup, resource, verb)
ALL_VERBS = ("get", "list", "watch", "create", "update", "patch", "delete")

# apiVersion/kind -> (group, plural). A kind the workflow-runner or model-server chart starts rendering
# that is not here fails the test: add it, and the worker's Role in charts/plnt/templates/rbac.yaml.
RESOURCES = {
    ("v1", "ConfigMap"): ("", "configmaps"),
    ("v1", "Service"): ("", "services"),
    ("v1", "Secret"): ("", "secrets"),
    ("v1", "ServiceAccount"): ("", "serviceaccounts"),
    ("apps/v1", "Deployment"): ("apps", "deployments"),
    ("autoscaling/v2", "HorizontalPodAutoscaler"): ("autoscaling", "horizontalpodautoscalers"),
    ("networking.k8s.io/v1", "Ingress"): ("networking.k8s.io", "ingresses"),
    ("networking.k8s.io/v1", "NetworkPolicy"): ("networking.k8s.io", "networkpolicies"),
    ("policy/v1", "PodDisruptionBudget"): ("policy", "poddisruptionbudgets"),
}
# helm's release storage (the default `secret` driver): one Secret per revision, read by name and
# by label, created, updated (status changes) and deleted (history-max, uninstall).
RELEASE_STORAGE: set[Grant] = {("", "secrets", verb) for verb in ("get", "list", "create", "update", "delete")}
RELEASE_READ: set[Grant] = {("", "secrets", "get"), ("", "secrets", "list")}
# --wait on a Deployment reads its ReplicaSets and their Pods.
WAIT_ON_DEPLOYMENT: set[Grant] = {(g, r, v) for g, r in (("apps", "replicasets"), ("", "pods")) for v in ("get", "list", "watch")}
# A server-side apply (a patch) that creates the object is also authorized as `create`
# (https://kubernetes.io/docs/reference/using-api/server-side-apply/#rbac-and-permissions). The
# mirror applies WorkflowRuns server-side, so create is granted beside API_CALLS' patch.
SSA_CREATES: set[Grant] = {("plnt.work", "workflowruns", "create")}


@functools.cache
def helm_needs(helm: str) -> set[Grant]:
    rendered = {(doc["apiVersion"], doc["kind"]) for docs in deployed_kinds(helm).values() for doc in docs}
    unknown = rendered - set(RESOURCES)
    assert not unknown, f"the charts the workers install render kinds this test does not map yet: {sorted(unknown)}"
    needs = {(*RESOURCES[kind], verb) for kind in rendered for verb in ALL_VERBS} | RELEASE_STORAGE
    if any(kind == "Deployment" for _, kind in rendered):
        needs |= WAIT_ON_DEPLOYMENT
    return frozenset(needs)  # type: ignore[return-value]  # cached: never mutated by callers


@functools.cache
def deployed_kinds(helm: str) -> dict[str, list[dict[str, Any]]]:
    """Every object of the charts the workers install, by chart, over their values matrices."""
    return {"workflow-runner": [doc for case in RUNNER_CASES for doc in render_runner(helm, case)],
            "model-server": [doc for case in MODEL_SERVER_CASES for doc in render_model_server(helm, case)]}


def api_calls(role: str, scope: str) -> set[Grant]:
    return {(c.group, c.resource, c.verb) for c in API_CALLS if c.role == role and c.scope == scope}


def expected_grants(helm: str, values: dict[str, Any]) -> dict[tuple[str, str], set[Grant]]:
    expected: dict[tuple[str, str], set[Grant]] = defaultdict(set)
    needs = helm_needs(helm)
    for role in ("reconciler", "worker", "gateway"):
        expected[(role, NAMESPACE)] |= api_calls(role, "plnt")
        mirror = values.get("mirrorStatus", {})
        if mirror.get("enabled"):
            for namespace in mirror["namespaces"]:
                calls = api_calls(role, "mirror")
                expected[(role, namespace)] |= calls | ({g for g in SSA_CREATES if (g[0], g[1], "patch") in calls})
    for namespace in values.get("deployNamespaces", ["plnt-runners"]):
        expected[("worker", namespace)] |= needs
        expected[("reconciler", namespace)] |= RELEASE_READ
    return {key: grants for key, grants in expected.items() if grants}


def granted(docs: list[dict[str, Any]]) -> dict[tuple[str, str], set[Grant]]:
    roles = {(d["metadata"]["namespace"], d["metadata"]["name"]): d for d in docs if d["kind"] == "Role"}
    accounts = {d["metadata"]["name"]: d["metadata"]["name"].removeprefix(f"{FULLNAME}-") for d in docs if d["kind"] == "ServiceAccount"}
    out: dict[tuple[str, str], set[Grant]] = defaultdict(set)
    bound: set[tuple[str, str]] = set()
    for binding in (d for d in docs if d["kind"] == "RoleBinding"):
        namespace = binding["metadata"]["namespace"]
        assert binding["roleRef"]["kind"] == "Role" and binding["roleRef"]["apiGroup"] == "rbac.authorization.k8s.io"
        role = roles[(namespace, binding["roleRef"]["name"])]
        bound.add((namespace, binding["roleRef"]["name"]))
        for subject in binding["subjects"]:
            assert subject["kind"] == "ServiceAccount" and subject["namespace"] == NAMESPACE, subject
            for rule in role["rules"]:
                for group in rule["apiGroups"]:
                    for resource in rule["resources"]:
                        for verb in rule["verbs"]:
                            out[(accounts[subject["name"]], namespace)].add((group, resource, verb))
    assert bound == set(roles), f"Roles bound to nobody: {set(roles) - bound}"
    return dict(out)


@pytest.mark.parametrize("case", sorted(PLNT_CASES))
def test_roles_grant_exactly_the_api_calls_and_helms_needs(helm: str, case: str) -> None:
    values = PLNT_CASES[case]
    docs = render(helm, PLNT_CHART, values)
    actual, expected = granted(docs), expected_grants(helm, values)
    for key in sorted(set(actual) | set(expected)):
        more = actual.get(key, set()) - expected.get(key, set())
        less = expected.get(key, set()) - actual.get(key, set())
        assert not more, f"{case}: {key[0]} in {key[1]} is granted more than it needs: {sorted(more)}"
        assert not less, f"{case}: {key[0]} in {key[1]} lacks: {sorted(less)}"
    assert not any(role == "gateway" for role, _ in actual), "the gateway gets no API rights"


@pytest.mark.parametrize("case", sorted(PLNT_CASES))
def test_no_wildcards_no_cluster_scope_and_names_where_possible(helm: str, case: str) -> None:
    docs = render(helm, PLNT_CHART, PLNT_CASES[case])
    kinds = {d["kind"] for d in docs}
    assert not kinds & {"ClusterRole", "ClusterRoleBinding"}, "namespaced Roles only"
    for role in (d for d in docs if d["kind"] == "Role"):
        for rule in role["rules"]:
            for field in ("apiGroups", "resources", "verbs", "resourceNames"):
                assert "*" not in rule.get(field, []) and not any("*" in item for item in rule.get(field, [])), (role["metadata"]["name"], rule)
            assert set(rule["verbs"]) <= set(ALL_VERBS), rule  # no escalate, bind, impersonate, deletecollection
            assert "nonResourceURLs" not in rule
    for binding in (d for d in docs if d["kind"] == "RoleBinding"):
        assert binding["roleRef"]["name"] != "cluster-admin" and binding["roleRef"]["kind"] == "Role"
    # The Lease: get and update only on plnt's own (create cannot be limited by name).
    [lease_role] = [d for d in docs if d["kind"] == "Role" and d["metadata"]["name"] == f"{FULLNAME}-reconciler-lease"]
    assert lease_role["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": [f"{FULLNAME}-reconciler"],
         "verbs": ["get", "update"]},
    ]
    reconciler_args = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == f"{FULLNAME}-reconciler")
    args = reconciler_args["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--lease-name") + 1] == f"{FULLNAME}-reconciler"


def test_helm_needs_follow_the_runner_chart(helm: str) -> None:
    """The derivation itself: the kinds of the runner chart's matrix, each with all seven verbs."""
    needs = helm_needs(helm)
    for resource in ("configmaps", "services", "deployments", "horizontalpodautoscalers", "ingresses"):
        assert {verb for _, r, verb in needs if r == resource} == set(ALL_VERBS), resource
    assert {verb for _, r, verb in needs if r == "secrets"} >= {"get", "list", "create", "update", "delete"}
    assert ("", "pods", "watch") in needs and ("", "pods", "delete") not in needs


def test_the_model_server_chart_needs_nothing_the_runner_chart_does_not(helm: str) -> None:
    """The worker's Role was written for the runner chart; the model-server chart's kinds (ConfigMap,
    Service, Deployment) are among them, so its releases need no grant of their own."""
    kinds = {chart: {(doc["apiVersion"], doc["kind"]) for doc in docs} for chart, docs in deployed_kinds(helm).items()}
    assert kinds["model-server"] == {("v1", "ConfigMap"), ("v1", "Service"), ("apps/v1", "Deployment")}
    assert kinds["model-server"] <= kinds["workflow-runner"]


def test_a_chart_granting_more_fails(helm: str) -> None:
    """The comparison catches an extra verb (a stand-in for a careless edit of rbac.yaml)."""
    values = PLNT_CASES["defaults"]
    docs = render(helm, PLNT_CHART, values)
    for doc in docs:
        if doc["kind"] == "Role" and doc["metadata"]["name"] == f"{FULLNAME}-reconciler-releases":
            doc["rules"][0]["verbs"].append("watch")
    actual, expected = granted(docs), expected_grants(helm, values)
    assert actual != expected
    assert actual[("reconciler", "plnt-runners")] - expected[("reconciler", "plnt-runners")] == {("", "secrets", "watch")}
