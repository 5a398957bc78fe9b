"""The plnt chart's RBAC grants exactly what plnt needs: no more, no less.

Expected, per role and namespace, as (apiGroup, resource, verb):
- plnt's own API calls, from reconciler/control/kube_calls.py (API_CALLS, scope "plnt" -> the release's
  namespace, scope "mirror" -> each mirrorStatus namespace when mirroring is on, scope "source" -> each
  source.namespaces namespace with source.kind kubernetes, or every namespace ("*": a ClusterRole) when
  none is listed);
- plus what helm 4 does in each deploy namespace, with the kinds DERIVED from rendering the charts
  the workers install, with the values plnt's Helm driver gives them (chartkit.RUNNER_CASES but the
  `ingress` one: the driver never enables the runner chart's Ingress; MODEL_SERVER_CASES): the worker
  gets, creates (server-side apply that creates), patches (server-side apply), deletes and watches
  (--wait) those kinds, HPAs only with runners.autoscaling.enabled, list too with
  rbac.worker.listForWait (auto: a cluster older than 1.34); keeps helm's release records (Secrets);
  lists a Deployment's ReplicaSets and Pods (--wait, and plnt's reason when it times out); the
  reconciler reads the release records (`helm list`, `helm get values`).

Rendered with the real helm; the rules are what a cluster would get. That each of them is used, and
nothing else, by helm 4 as the worker's service account through a whole release life, is shown on a
real API server by tests/k8s/test_worker_least_privilege.py (the audit log against these Roles).
"""

from __future__ import annotations

import functools
from collections import defaultdict
from typing import Any

import pytest
from plnt.reconciler.control.kube_calls import API_CALLS

from tests.charts.chartkit import (
    BASE,
    FROM_EVERY_NAMESPACE,
    FULLNAME,
    MODEL_SERVER_CASES,
    NAMESPACE,
    PLNT_CASES,
    PLNT_CHART,
    RUNNER_CASES,
    SOURCE_NAMESPACES,
    merged,
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
    ("keda.sh/v1alpha1", "ScaledObject"): ("keda.sh", "scaledobjects"),
    ("networking.k8s.io/v1", "Ingress"): ("networking.k8s.io", "ingresses"),
    ("networking.k8s.io/v1", "NetworkPolicy"): ("networking.k8s.io", "networkpolicies"),
    ("policy/v1", "PodDisruptionBudget"): ("policy", "poddisruptionbudgets"),
}
HPA = ("autoscaling/v2", "HorizontalPodAutoscaler")
SCALED_OBJECT = ("keda.sh/v1alpha1", "ScaledObject")
# The runner chart's cases plnt's driver produces: render_values never sets `ingress` (tested below).
DRIVER_RUNNER_CASES = tuple(case for case in RUNNER_CASES if case != "ingress")
# helm 4 on each object of a release: get (does it exist, whose is it), create and patch (server-side
# apply: a patch, authorized as create too when it creates;
# https://kubernetes.io/docs/reference/using-api/server-side-apply/#rbac-and-permissions), delete,
# watch (--wait's informers: a watch-list where the API server serves it).
OBJECT_VERBS = ("get", "watch", "create", "patch", "delete")
# ... and list, where the informers list before they watch (no watch-list on the API server).
WAIT_LIST = "list"
# helm's release storage (the default `secret` driver): one Secret per revision, read by name and
# by label, created, updated (status changes) and deleted (history-max, uninstall).
RELEASE_STORAGE: set[Grant] = {("", "secrets", verb) for verb in ("get", "list", "create", "update", "delete")}
RELEASE_READ: set[Grant] = {("", "secrets", "get"), ("", "secrets", "list")}
# --wait on a Deployment lists its ReplicaSets and Pods; plnt lists the Pods when --wait times out.
WAIT_ON_DEPLOYMENT: set[Grant] = {("apps", "replicasets", "list"), ("", "pods", "list")}
# A server-side apply (a patch) that creates the object is also authorized as `create`. The
# mirror applies WorkflowRuns server-side, so create is granted beside API_CALLS' patch.
SSA_CREATES: set[Grant] = {("plnt.work", "workflowruns", "create")}
EVERY_NAMESPACE = "*"  # where a ClusterRole's grants apply (source.kind kubernetes without source.namespaces)
WATCH_LIST_SINCE = (1, 34)  # Kubernetes' WatchList feature, on by default (listForWait: auto)
DEFAULT_KUBE_VERSION = (1, 35)  # what `helm template` (helm 4.1) assumes without --kube-version


def helm_needs(helm: str, autoscaling: bool = True, lists: bool = False, keda: bool = False) -> set[Grant]:
    rendered = {(doc["apiVersion"], doc["kind"]) for docs in deployed_kinds(helm).values() for doc in docs}
    unknown = rendered - set(RESOURCES)
    assert not unknown, f"the charts the workers install render kinds this test does not map yet: {sorted(unknown)}"
    if not autoscaling:
        rendered.discard(HPA)
    if not keda:
        rendered.discard(SCALED_OBJECT)
    verbs = (*OBJECT_VERBS, WAIT_LIST) if lists else OBJECT_VERBS
    needs = {(*RESOURCES[kind], verb) for kind in rendered for verb in verbs} | RELEASE_STORAGE
    if any(kind == "Deployment" for _, kind in rendered):
        needs |= WAIT_ON_DEPLOYMENT
    return needs


@functools.cache
def deployed_kinds(helm: str) -> dict[str, list[dict[str, Any]]]:
    """Every object of the charts the workers install, by chart, over the values plnt's driver gives."""
    return {"workflow-runner": [doc for case in DRIVER_RUNNER_CASES for doc in render_runner(helm, case)],
            "model-server": [doc for case in MODEL_SERVER_CASES for doc in render_model_server(helm, case)]}


def lists_for_wait(values: dict[str, Any], kube_version: tuple[int, int] = DEFAULT_KUBE_VERSION) -> bool:
    mode = values.get("rbac", {}).get("worker", {}).get("listForWait", "auto")
    return kube_version < WATCH_LIST_SINCE if mode == "auto" else bool(mode)


def api_calls(role: str, scope: str) -> set[Grant]:
    return {(c.group, c.resource, c.verb) for c in API_CALLS if c.role == role and c.scope == scope}


def expected_grants(helm: str, values: dict[str, Any],
                    kube_version: tuple[int, int] = DEFAULT_KUBE_VERSION) -> dict[tuple[str, str], set[Grant]]:
    expected: dict[tuple[str, str], set[Grant]] = defaultdict(set)
    autoscaling = values.get("runners", {}).get("autoscaling", {}).get("enabled", True)
    keda = values.get("runners", {}).get("autoscaling", {}).get("keda", False)
    needs = helm_needs(helm, autoscaling=autoscaling, lists=lists_for_wait(values, kube_version), keda=keda)
    for role in ("reconciler", "worker", "gateway"):
        expected[(role, NAMESPACE)] |= api_calls(role, "plnt")
        mirror = values.get("mirrorStatus", {})
        if mirror.get("enabled"):
            for namespace in mirror["namespaces"]:
                calls = api_calls(role, "mirror")
                expected[(role, namespace)] |= calls | ({g for g in SSA_CREATES if (g[0], g[1], "patch") in calls})
        source = values.get("source", {})
        if source.get("kind") == "kubernetes":
            for namespace in source.get("namespaces") or [EVERY_NAMESPACE]:
                expected[(role, namespace)] |= api_calls(role, "source")
    if values.get("rbac", {}).get("reconciler", {}).get("readGpuHeadroom"):
        expected[("reconciler", EVERY_NAMESPACE)] |= api_calls("reconciler", "cluster")
    for namespace in values.get("deployNamespaces", ["plnt-runners"]):
        expected[("worker", namespace)] |= needs
        expected[("reconciler", namespace)] |= RELEASE_READ
    return {key: grants for key, grants in expected.items() if grants}


def granted(docs: list[dict[str, Any]]) -> dict[tuple[str, str], set[Grant]]:
    """(role, namespace) -> its grants; a ClusterRole's (bound by a ClusterRoleBinding) under EVERY_NAMESPACE."""
    roles = {(d["metadata"].get("namespace", EVERY_NAMESPACE), d["metadata"]["name"]): d
             for d in docs if d["kind"] in ("Role", "ClusterRole")}
    accounts = {d["metadata"]["name"]: d["metadata"]["name"].removeprefix(f"{FULLNAME}-") for d in docs if d["kind"] == "ServiceAccount"}
    out: dict[tuple[str, str], set[Grant]] = defaultdict(set)
    bound: set[tuple[str, str]] = set()
    for binding in (d for d in docs if d["kind"] in ("RoleBinding", "ClusterRoleBinding")):
        namespace = binding["metadata"].get("namespace", EVERY_NAMESPACE)
        # A RoleBinding names a Role of its namespace; a ClusterRoleBinding a ClusterRole.
        kind = "Role" if binding["kind"] == "RoleBinding" else "ClusterRole"
        assert binding["roleRef"]["kind"] == kind and binding["roleRef"]["apiGroup"] == "rbac.authorization.k8s.io"
        role = roles[(namespace, binding["roleRef"]["name"])]
        assert role["kind"] == kind, binding
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
    """The derivation itself: the kinds of the runner chart's matrix, each with helm 4's verbs."""
    needs = helm_needs(helm)
    for resource in ("configmaps", "services", "deployments", "horizontalpodautoscalers"):
        assert {verb for _, r, verb in needs if r == resource} == set(OBJECT_VERBS), resource
    assert not {r for _, r, _ in needs} & {"ingresses", "replicasets/scale", "pods/exec"}
    assert {verb for _, r, verb in needs if r == "secrets"} == {"get", "list", "create", "update", "delete"}
    assert {verb for _, r, verb in needs if r in ("pods", "replicasets")} == {"list"}
    assert {r for _, r, _ in helm_needs(helm, autoscaling=False)} == {
        "configmaps", "services", "deployments", "secrets", "pods", "replicasets"}
    assert {verb for _, r, verb in helm_needs(helm, lists=True) if r == "deployments"} == {*OBJECT_VERBS, "list"}


def test_plnts_driver_never_renders_a_runner_ingress() -> None:
    """Why the runner chart's `ingress` case is not among the worker's needs: no spec can ask for one."""
    from tests.reconciler.drivers.test_helm_driver import run, values

    for spec in ({}, {"replicas": {"min": 1, "max": 4}, "autoscaling": {"targetInvocationsPerSecond": 5}},
                 {"backend": {"cluster": "gpu-cluster-01", "gpuClass": "nvidia.com/h100", "gpuCount": 1}}):
        for track in ("stable", "canary"):
            assert "ingress" not in values(run(**spec), track)


@pytest.mark.parametrize(("sets", "kube_version", "lists"), [
    ({}, (1, 33), True),  # auto: no watch-list by default before 1.34
    ({}, (1, 34), False),
    ({}, (1, 37), False),
    ({"rbac": {"worker": {"listForWait": True}}}, (1, 37), True),
    ({"rbac": {"worker": {"listForWait": False}}}, (1, 30), False),
])
def test_list_for_wait_follows_the_clusters_version_unless_set(
        helm: str, sets: dict[str, Any], kube_version: tuple[int, int], lists: bool) -> None:
    values = merged(BASE, sets)
    docs = render(helm, PLNT_CHART, values, extra=["--kube-version", "{}.{}.0".format(*kube_version)])
    actual, expected = granted(docs), expected_grants(helm, values, kube_version)
    assert actual == expected
    assert (("apps", "deployments", "list") in actual[("worker", "plnt-runners")]) is lists


def test_keda_gives_the_workers_scaled_objects_and_nothing_else(helm: str) -> None:
    """runners.autoscaling.keda: the ScaledObjects a keda backend's releases render, with helm's verbs;
    off (the default), no right on keda.sh at all."""
    values = merged(BASE, {"runners": {"autoscaling": {"keda": True}}})
    actual = granted(render(helm, PLNT_CHART, values))
    assert actual == expected_grants(helm, values)
    worker = actual[("worker", "plnt-runners")]
    assert {verb for group, r, verb in worker if (group, r) == ("keda.sh", "scaledobjects")} == set(OBJECT_VERBS)
    by_default = granted(render(helm, PLNT_CHART, BASE))[("worker", "plnt-runners")]
    assert not any(group == "keda.sh" for group, _, _ in by_default)


def test_runner_autoscaling_off_takes_the_hpa_rights_away(helm: str) -> None:
    values = merged(BASE, {"runners": {"autoscaling": {"enabled": False}}})
    worker = granted(render(helm, PLNT_CHART, values))[("worker", "plnt-runners")]
    assert not any(r == "horizontalpodautoscalers" for _, r, _ in worker)
    assert ("apps", "deployments", "patch") in worker


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


# --- source.kind kubernetes: the cluster's custom resources as the spec source -----------------

SOURCE_RECONCILER: set[Grant] = {("plnt.work", "workflowruns", "list"), ("plnt.work", "workflowruns", "watch"),
                                 ("plnt.work", "modeldeployments", "list"), ("plnt.work", "modeldeployments", "watch"),
                                 ("plnt.work", "workflowruns/status", "patch"), ("", "events", "create")}
SOURCE_WORKER: set[Grant] = {("plnt.work", "workflowruns", "list"), ("plnt.work", "modeldeployments", "list")}


def test_the_cluster_source_gets_its_calls_in_each_source_namespace_and_never_a_spec_write(helm: str) -> None:
    """The "source" entries of kube_calls, spelled out: list and watch, the status subresource, Events;
    the worker lists. Nothing writes a WorkflowRun's spec or deletes one (they are the source)."""
    assert api_calls("reconciler", "source") == SOURCE_RECONCILER and api_calls("worker", "source") == SOURCE_WORKER
    values = PLNT_CASES["kubernetes-source"]
    actual = granted(render(helm, PLNT_CHART, values))
    assert actual[("reconciler", "team-b")] == SOURCE_RECONCILER and actual[("worker", "team-b")] == SOURCE_WORKER
    # team-a is a deploy namespace too: helm's grants there beside the source's, in Roles of their own.
    assert actual[("reconciler", "team-a")] == SOURCE_RECONCILER | RELEASE_READ
    assert actual[("worker", "team-a")] == SOURCE_WORKER | helm_needs(helm, lists=lists_for_wait(values))
    assert {namespace for _, namespace in actual} == {NAMESPACE, "plnt-runners", *SOURCE_NAMESPACES}
    for grants in actual.values():
        assert not {(g, r, v) for g, r, v in grants if g == "plnt.work" and r in ("workflowruns", "modeldeployments")
                    and v not in ("list", "watch")}, grants
    assert not [d for d in render(helm, PLNT_CHART, values) if d["kind"] in ("ClusterRole", "ClusterRoleBinding")]


def test_the_cluster_source_over_every_namespace_is_one_cluster_role_per_role(helm: str) -> None:
    """source.namespaces empty: the same rules cluster-wide (a ClusterRole and its binding per role), the
    only cluster-scoped objects the chart makes; named after plnt's namespace too (they are shared)."""
    docs = render(helm, PLNT_CHART, FROM_EVERY_NAMESPACE)
    actual, expected = granted(docs), expected_grants(helm, FROM_EVERY_NAMESPACE)
    assert actual == expected
    assert actual[("reconciler", EVERY_NAMESPACE)] == SOURCE_RECONCILER and actual[("worker", EVERY_NAMESPACE)] == SOURCE_WORKER
    names = {role: f"{NAMESPACE}-{FULLNAME}-{role}-source" for role in ("reconciler", "worker")}
    cluster_scoped = sorted((d["kind"], d["metadata"]["name"]) for d in docs if "namespace" not in d["metadata"])
    assert cluster_scoped == sorted((kind, name) for name in names.values() for kind in ("ClusterRole", "ClusterRoleBinding"))
    listed = render(helm, PLNT_CHART, PLNT_CASES["kubernetes-source"])
    for role, name in names.items():
        [cluster_role] = [d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] == name]
        [binding] = [d for d in docs if d["kind"] == "ClusterRoleBinding" and d["metadata"]["name"] == name]
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": f"{FULLNAME}-{role}", "namespace": NAMESPACE}]
        assert not any("resourceNames" in rule or "nonResourceURLs" in rule or "*" in str(rule) for rule in cluster_role["rules"])
        for namespace in SOURCE_NAMESPACES:  # the rules a listed namespace's Role has
            [namespaced] = [d for d in listed if d["kind"] == "Role" and d["metadata"]["name"] == f"{FULLNAME}-{role}-source"
                            and d["metadata"]["namespace"] == namespace]
            assert namespaced["rules"] == cluster_role["rules"], role


def test_reading_gpu_headroom_is_one_cluster_role_to_list_nodes_and_pods(helm: str) -> None:
    """rbac.reconciler.readGpuHeadroom: placement's free GPUs of the cluster plnt runs in (a backend
    without a kubeconfig); the reconciler alone may list nodes and pods, nothing more, and only then."""
    values = merged(BASE, {"rbac": {"reconciler": {"readGpuHeadroom": True}}})
    docs = render(helm, PLNT_CHART, values)
    actual, expected = granted(docs), expected_grants(helm, values)
    assert actual == expected
    assert actual[("reconciler", EVERY_NAMESPACE)] == {("", "nodes", "list"), ("", "pods", "list")}
    name = f"{NAMESPACE}-{FULLNAME}-reconciler-gpu-headroom"
    assert sorted((d["kind"], d["metadata"]["name"]) for d in docs if "namespace" not in d["metadata"]) \
        == [("ClusterRole", name), ("ClusterRoleBinding", name)]
