"""charts/plnt installs for real: helm against a real API server (tests/k8s/cluster.py).

One release for the module, installed with `--wait` into a namespace that enforces the `restricted`
Pod Security Standard, with the values the chart requires (it has no runnable defaults: a spec
repository, a Temporal address and a Secret of caller tokens; the Secret is created here). Then, on
that server: the CRDs plnt ships are Established, its custom resources are validated by the server's
own OpenAPI validation (messages naming the field), the printer columns come back in Table output,
the status subresource keeps status apart from spec (generation), the chart's RBAC is enough for
helm as the worker (runner and model-server releases) and for plnt's own KubernetesLease and
StatusMirror as the reconciler, and `helm uninstall` removes the release. kwok runs no containers:
images are never pulled, and no plnt process runs in the pods.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient
from plnt.core.specs.loader import SpecSet
from plnt.core.specs.models import ModelDeployment, WorkflowRun
from plnt.core.status import Phase, WorkflowRunStatus
from plnt.reconciler.control.crds import GROUP, VERSION, cr_status
from plnt.reconciler.control.kube import KubernetesLease, StatusMirror, cr_body
from plnt.reconciler.status_store import StatusStore

from tests.k8s.cluster import LocalCluster, wait_for
from tests.k8s.test_cluster import _helm

pytestmark = [pytest.mark.k8s, pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "plnt"
CRD_DIR = CHART / "crds"
EXAMPLE = ROOT / "gitops-example"
RELEASE = "plnt"
FULLNAME = "plnt"  # the release name contains the chart name: no "-plnt" suffix
DEPLOY_NAMESPACE = "plnt-runners"  # values.yaml deployNamespaces
RESTRICTED = {"pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/enforce-version": "latest"}
TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io"
# What the chart cannot default: it fails the render without them (charts/plnt/templates/_helpers.tpl).
REQUIRED_VALUES = {
    "git.repo": "https://git.invalid/specs.git",
    "temporal.address": "temporal.invalid:7233",
    "auth.tokens.secretName": "plnt-tokens",
}


@dataclass
class Release:
    cluster: LocalCluster
    namespace: str
    helm: list[str]
    env: dict[str, str]
    install: subprocess.CompletedProcess[str]

    def run(self, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*self.helm, *args], capture_output=True, text=True, env=self.env, timeout=timeout)


def _create_namespace(api: Any, name: str, labels: dict[str, str]) -> None:
    try:
        client.CoreV1Api(api).create_namespace({"metadata": {"name": name, "labels": labels}})
    except ApiException as exc:
        if exc.status != 409:
            raise
        client.CoreV1Api(api).patch_namespace(name, {"metadata": {"labels": labels}})


@pytest.fixture(scope="module")
def release(k8s_cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Release]:
    tmp = tmp_path_factory.mktemp("plnt-chart")
    ns = f"plnt-{uuid.uuid4().hex[:8]}"
    with k8s_cluster.api_client() as api:
        # Pod Security first: every pod the chart makes must be admitted under `restricted`.
        _create_namespace(api, ns, RESTRICTED)
        # The deploy namespaces are the operator's (the chart puts Roles there, never the namespace).
        _create_namespace(api, DEPLOY_NAMESPACE, RESTRICTED)
        client.CoreV1Api(api).create_namespaced_secret(ns, {
            "metadata": {"name": REQUIRED_VALUES["auth.tokens.secretName"]},
            "stringData": {"tokens": "test-token-0123456789abcdef:read,invoke\n"}})
    helm = [_helm(), "--kubeconfig", str(k8s_cluster.kubeconfig), "--namespace", ns]
    env = {"HOME": str(tmp), "PATH": "/usr/bin:/bin", "HELM_CACHE_HOME": str(tmp / "helm-cache"),
           "HELM_CONFIG_HOME": str(tmp / "helm-config"), "HELM_DATA_HOME": str(tmp / "helm-data")}
    sets = [arg for key, value in REQUIRED_VALUES.items() for arg in ("--set", f"{key}={value}")]
    install = subprocess.run([*helm, "install", RELEASE, str(CHART), "--create-namespace", *sets,
                              "--wait", "--timeout", "180s"], capture_output=True, text=True, env=env, timeout=240)
    rel = Release(k8s_cluster, ns, helm, env, install)
    yield rel
    listed = rel.run("list", "-q")
    if RELEASE in listed.stdout.split():  # the uninstall test did not run (or failed before)
        rel.run("uninstall", RELEASE, "--wait", "--timeout", "120s")


def _installed(release: Release) -> Release:
    if release.install.returncode != 0:
        pytest.fail(f"helm install failed:\n{release.install.stdout}\n{release.install.stderr}", pytrace=False)
    return release


def _crd_files() -> dict[str, dict[str, Any]]:
    return {(doc := yaml.safe_load(p.read_text()))["metadata"]["name"]: doc for p in sorted(CRD_DIR.glob("*.yaml"))}


def _example(path: str) -> dict[str, Any]:
    return yaml.safe_load((EXAMPLE / path).read_text())


def _workflowrun_body(namespace: str, name: str = "review-responder") -> dict[str, Any]:
    """gitops-example's WorkflowRun as --mirror-status applies it (cr_body), in `namespace`."""
    doc = _example("workflowruns/review-responder.yaml")
    doc["metadata"] = {**doc["metadata"], "name": name, "namespace": namespace}
    return cr_body(WorkflowRun.model_validate(doc))


def _modeldeployment_body(namespace: str, name: str = "smollm2") -> dict[str, Any]:
    """gitops-example's ModelDeployment converted the same way (the spec by its YAML names, no nulls)."""
    doc = _example("models/smollm2.yaml")
    model = ModelDeployment.model_validate({**doc, "metadata": {**doc["metadata"], "namespace": namespace}})
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ModelDeployment",
            "metadata": {"name": name, "namespace": namespace},
            "spec": model.spec.model_dump(mode="json", by_alias=True, exclude_none=True)}


def _create(api: Any, body: dict[str, Any], plural: str, validation: str = "Strict") -> dict[str, Any]:
    return client.CustomObjectsApi(api).create_namespaced_custom_object(
        GROUP, VERSION, body["metadata"]["namespace"], plural, body, field_validation=validation)


def _refusal(api: Any, body: dict[str, Any], plural: str) -> tuple[int, str]:
    with pytest.raises(ApiException) as refused:
        _create(api, body, plural)
    status = json.loads(refused.value.body)
    return refused.value.status, status["message"]


def _table(api: Any, path: str) -> dict[str, Any]:
    response = api.call_api("GET", api.configuration.host + path, header_params={"Accept": TABLE})
    response.read()
    assert response.status == 200, response.data
    return json.loads(response.data)


# --- 1 and 6: the install, under the restricted Pod Security Standard


def test_helm_install_with_wait_completes_under_restricted_pod_security(release: Release) -> None:
    _installed(release)
    assert "warning" not in release.install.stderr.lower(), release.install.stderr  # no deprecated API, no dropped field
    status = json.loads(release.run("status", RELEASE, "-o", "json").stdout)
    assert status["info"]["status"] == "deployed"
    with release.cluster.api_client() as api:
        core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
        labels = core.read_namespace(release.namespace).metadata.labels
        assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
        deployments = {d.metadata.name: d for d in apps.list_namespaced_deployment(release.namespace).items}
        expected = {f"{FULLNAME}-reconciler": 1, f"{FULLNAME}-worker": 2, f"{FULLNAME}-gateway": 2}
        assert {name: d.spec.replicas for name, d in deployments.items()} == expected
        for name, replicas in expected.items():
            assert deployments[name].status.ready_replicas == replicas, name
        pods = core.list_namespaced_pod(release.namespace).items
        assert len(pods) == sum(expected.values())
        for pod in pods:
            assert pod.status.phase == "Running", (pod.metadata.name, pod.status.phase)
            assert pod.spec.security_context.run_as_non_root is True
            assert pod.spec.security_context.seccomp_profile.type == "RuntimeDefault"
        # The label is enforced, not decorative: a pod that breaks `restricted` is refused in that namespace.
        with pytest.raises(ApiException) as refused:
            core.create_namespaced_pod(release.namespace, {
                "metadata": {"name": "privileged"},
                "spec": {"containers": [{"name": "c", "image": "registry.invalid/x:1",
                                         "securityContext": {"privileged": True}}]}})
        assert refused.value.status == 403
        assert 'violates PodSecurity "restricted:latest"' in json.loads(refused.value.body)["message"]


def test_every_object_the_chart_renders_exists_on_the_server(release: Release) -> None:
    _installed(release)
    manifest = release.run("get", "manifest", RELEASE).stdout
    objects = [doc for doc in yaml.safe_load_all(manifest) if doc]
    kinds = {doc["kind"] for doc in objects}
    assert {"Deployment", "Service", "ServiceAccount", "Role", "RoleBinding", "Secret", "NetworkPolicy",
            "HorizontalPodAutoscaler", "PodDisruptionBudget"} <= kinds, kinds
    with release.cluster.api_client() as api:
        dynamic_client = DynamicClient(api)
        for doc in objects:
            resource = dynamic_client.resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
            namespace = doc["metadata"].get("namespace", release.namespace)
            live = resource.get(name=doc["metadata"]["name"], namespace=namespace)
            assert live.metadata.labels["app.kubernetes.io/managed-by"] == "Helm", doc["metadata"]["name"]


def test_a_deploy_namespace_that_does_not_exist_fails_the_install_naming_it(release: Release) -> None:
    """The chart puts Roles into each deploy namespace but never creates one: the operator does."""
    _installed(release)
    ns, missing = f"plnt-{uuid.uuid4().hex[:8]}", f"nowhere-{uuid.uuid4().hex[:8]}"
    helm = [arg if arg != release.namespace else ns for arg in release.helm]
    sets = [arg for key, value in REQUIRED_VALUES.items() for arg in ("--set", f"{key}={value}")]
    try:
        done = subprocess.run([*helm, "install", "other", str(CHART), "--create-namespace", *sets,
                               "--set", f"deployNamespaces={{{missing}}}", "--timeout", "60s"],
                              capture_output=True, text=True, env=release.env, timeout=120)
        assert done.returncode != 0, done.stdout
        assert f'namespaces "{missing}" not found' in done.stderr, done.stderr
    finally:
        subprocess.run([*helm, "uninstall", "other", "--ignore-not-found", "--wait"], capture_output=True,
                       text=True, env=release.env, timeout=120)


# --- 2: the CRDs


def test_every_crd_plnt_ships_is_established_with_its_names_accepted(release: Release) -> None:
    _installed(release)
    shipped = _crd_files()
    assert {"workflowruns.plnt.work", "modeldeployments.plnt.work"} <= set(shipped)
    with release.cluster.api_client() as api:
        ext = client.ApiextensionsV1Api(api)
        on_server = {c.metadata.name: c for c in ext.list_custom_resource_definition().items
                     if c.spec.group == GROUP}
        assert set(on_server) == set(shipped)
        for name, crd in on_server.items():
            conditions = {c.type: c for c in crd.status.conditions}
            assert conditions["Established"].status == "True", (name, conditions["Established"].message)
            assert conditions["NamesAccepted"].status == "True", (name, conditions["NamesAccepted"].message)
            assert conditions.get("NonStructuralSchema") is None, (name, conditions["NonStructuralSchema"].message)
            assert crd.status.accepted_names.kind == shipped[name]["spec"]["names"]["kind"]
            assert crd.status.accepted_names.short_names == shipped[name]["spec"]["names"].get("shortNames")
        # Discovery serves them (what kubectl's `get wfr` resolves through).
        served = {r.name: r for r in client.CustomObjectsApi(api).get_api_resources(GROUP, VERSION).resources}
        assert {"workflowruns", "workflowruns/status", "modeldeployments"} <= set(served)
        assert served["workflowruns"].short_names == ["wfr"]
        assert served["workflowruns"].categories == ["plnt"]


# --- 3: validation by the server


def test_the_example_workflowrun_and_modeldeployment_are_accepted_as_plnt_writes_them(release: Release) -> None:
    _installed(release)
    ns = release.namespace
    with release.cluster.api_client() as api:
        body = _workflowrun_body(ns, "accepted-wfr")
        created = _create(api, body, "workflowruns")
        assert created["spec"] == body["spec"]  # nothing pruned, nothing defaulted that plnt did not write
        assert created["metadata"]["generation"] == 1
        model = _modeldeployment_body(ns, "accepted-md")
        created = _create(api, model, "modeldeployments")
        assert created["spec"] == model["spec"]
        assert created["spec"]["model"]["rootDigest"].startswith("sha256:")


@pytest.mark.parametrize(("plural", "mutate", "status", "messages"), [
    pytest.param("workflowruns", lambda b: b["spec"]["replicas"].update(min="one"), 422,
                 ['spec.replicas.min: Invalid value: "string": spec.replicas.min in body must be of type integer'],
                 id="wfr-wrong-type"),
    pytest.param("workflowruns", lambda b: b["spec"]["workflow"].pop("ref"), 422,
                 ["spec.workflow.ref: Required value"], id="wfr-missing-ref"),
    pytest.param("workflowruns", lambda b: b.pop("spec"), 422, ["spec: Required value"], id="wfr-no-spec"),
    pytest.param("workflowruns", lambda b: b["spec"]["workflow"].update(ref="Review Responder@1.2"), 422,
                 ["spec.workflow.ref: Invalid value: \"Review Responder@1.2\": spec.workflow.ref in body should match"],
                 id="wfr-bad-ref"),
    pytest.param("workflowruns", lambda b: b["spec"]["canary"].update(trafficPercent=150), 422,
                 ["spec.canary.trafficPercent: Invalid value: 150: spec.canary.trafficPercent in body should be less "
                  "than or equal to 100"], id="wfr-out-of-range"),
    # A null where the schema has no `nullable` is dropped before validation: the field is then missing.
    # (backend.cluster is no longer required: a pool names refs or a selector instead; plnt's loader
    # checks that exactly one is given.)
    pytest.param("workflowruns", lambda b: b["spec"].update(backend=None), 422,
                 ["spec.backend: Required value"], id="wfr-null-backend"),
    pytest.param("workflowruns", lambda b: b["spec"].update(replica={"min": 1}), 400,
                 ['unknown field "spec.replica"'], id="wfr-unknown-field-strict"),
    pytest.param("modeldeployments", lambda b: b["spec"].pop("runtime"), 422,
                 ["spec.runtime: Required value"], id="md-missing-runtime"),
    pytest.param("modeldeployments", lambda b: b["spec"]["runtime"].update(type="vllm-nightly"), 422,
                 ['spec.runtime.type: Unsupported value: "vllm-nightly"'], id="md-unknown-runtime"),
    pytest.param("modeldeployments", lambda b: b["spec"]["model"].update(rootDigest="sha256:abc"), 422,
                 ['spec.model.rootDigest: Invalid value: "sha256:abc"'], id="md-bad-digest"),
])
def test_an_invalid_object_is_refused_by_the_server_naming_the_field(
        release: Release, plural: str, mutate: Any, status: int, messages: list[str]) -> None:
    _installed(release)
    body = (_workflowrun_body if plural == "workflowruns" else _modeldeployment_body)(
        release.namespace, f"invalid-{uuid.uuid4().hex[:6]}")
    mutate(body)
    with release.cluster.api_client() as api:
        code, message = _refusal(api, body, plural)
    assert code == status, message
    for expected in messages:
        assert expected in message, message


def test_without_strict_validation_an_unknown_field_is_pruned_with_a_warning(release: Release) -> None:
    _installed(release)
    body = _workflowrun_body(release.namespace, "pruned")
    body["spec"]["replica"] = {"min": 1}
    body["spec"]["workflow"]["digest"] = "sha256:0"
    with release.cluster.api_client() as api:
        objects = client.CustomObjectsApi(api)
        response = objects.create_namespaced_custom_object_with_http_info(
            GROUP, VERSION, release.namespace, "workflowruns", body, field_validation="Warn")
        created, headers = response[0], response[2]
        assert "replica" not in created["spec"] and "digest" not in created["spec"]["workflow"]
        warning = headers.get("Warning", "")
        # 299 - "unknown field \"spec.replica\"", ... (kubectl prints them as `Warning: unknown field ...`)
        assert r'unknown field \"spec.replica\"' in warning, warning
        assert r'unknown field \"spec.workflow.digest\"' in warning, warning


# --- 4: printer columns


def _columns(crd: dict[str, Any]) -> list[tuple[str, str, int]]:
    return [(c["name"], c["type"], c.get("priority", 0)) for c in crd["spec"]["versions"][0]["additionalPrinterColumns"]]


def test_the_printer_columns_come_back_in_table_output(release: Release) -> None:
    _installed(release)
    ns = release.namespace
    crds = _crd_files()
    with release.cluster.api_client() as api:
        run = _create(api, _workflowrun_body(ns, "table-wfr"), "workflowruns")
        status = WorkflowRunStatus(namespace=ns, name="table-wfr", phase=Phase.CANARY, version="1.2.0",
                                   canary_version="1.4.0", traffic_percent=5, observed_commit="0123abc",
                                   message="smoke test 3/10")
        _patch_status(api, ns, "table-wfr", status, run["metadata"]["generation"])
        model = _create(api, _modeldeployment_body(ns, "table-md"), "modeldeployments")

        table = _table(api, f"/apis/{GROUP}/{VERSION}/namespaces/{ns}/workflowruns/table-wfr")
        assert table["kind"] == "Table"
        declared = _columns(crds["workflowruns.plnt.work"])
        assert [(c["name"], c["type"], c["priority"]) for c in table["columnDefinitions"]] == [
            ("Name", "string", 0), *declared]
        assert declared[:4] == [("Phase", "string", 0), ("Version", "string", 0), ("Canary %", "integer", 0),
                                ("Age", "date", 0)]
        (row,) = table["rows"]
        cells = row["cells"]
        assert cells[:4] == ["table-wfr", "Canary", "1.2.0", 5]
        assert cells[4].endswith("s")  # Age, e.g. "0s"
        assert cells[5:] == ["1.4.0", "0123abc", "smoke test 3/10"]

        table = _table(api, f"/apis/{GROUP}/{VERSION}/namespaces/{ns}/modeldeployments?fieldSelector="
                            f"metadata.name%3Dtable-md")
        assert [c["name"] for c in table["columnDefinitions"]] == [
            "Name", *(name for name, _, _ in _columns(crds["modeldeployments.plnt.work"]))]
        (row,) = table["rows"]
        digest = model["spec"]["model"]["rootDigest"]
        assert [c for i, c in enumerate(row["cells"]) if i != 4] == ["table-md", "smollm2", "1.0.0", "llama.cpp",
                                                                     digest]


# --- 5: the status subresource


def _patch_status(api: Any, ns: str, name: str, status: WorkflowRunStatus, generation: int) -> dict[str, Any]:
    """The status as --mirror-status writes it: server-side apply on /status, fieldManager plnt."""
    body = cr_status(status, generation, [], datetime.now(UTC)).model_dump(mode="json", by_alias=True,
                                                                           exclude_none=True)
    return client.CustomObjectsApi(api).patch_namespaced_custom_object_status(
        GROUP, VERSION, ns, "workflowruns", name,
        {"apiVersion": f"{GROUP}/{VERSION}", "kind": "WorkflowRun", "metadata": {"name": name, "namespace": ns},
         "status": body}, field_manager="plnt", force=True, _content_type="application/apply-patch+yaml")


def test_the_status_subresource_keeps_status_and_spec_apart(release: Release) -> None:
    _installed(release)
    ns, name = release.namespace, "status-wfr"
    with release.cluster.api_client() as api:
        objects = client.CustomObjectsApi(api)
        created = _create(api, _workflowrun_body(ns, name), "workflowruns")
        assert created["metadata"]["generation"] == 1 and "status" not in created

        status = WorkflowRunStatus(namespace=ns, name=name, phase=Phase.READY, version="1.2.0",
                                   observed_commit="feedbee", message="serving 1.2.0")
        patched = _patch_status(api, ns, name, status, 1)
        assert patched["status"]["phase"] == "Ready" and patched["status"]["observedGeneration"] == 1
        ready = {c["type"]: c["status"] for c in patched["status"]["conditions"]}
        assert ready == {"Ready": "True", "Reconciling": "False", "Stalled": "False"}
        assert patched["metadata"]["generation"] == 1  # a status write is not a spec change
        assert patched["metadata"]["resourceVersion"] != created["metadata"]["resourceVersion"]

        # A status sent to the main resource is ignored; a spec sent to /status is ignored.
        objects.patch_namespaced_custom_object(GROUP, VERSION, ns, "workflowruns", name,
                                               {"status": {"phase": "Failed"}})
        objects.patch_namespaced_custom_object_status(GROUP, VERSION, ns, "workflowruns", name,
                                                      {"spec": {"replicas": {"max": 9}}})
        now = objects.get_namespaced_custom_object(GROUP, VERSION, ns, "workflowruns", name)
        assert now["status"]["phase"] == "Ready" and now["spec"]["replicas"]["max"] == 1
        assert now["metadata"]["generation"] == 1

        # A spec change bumps the generation; the status stays as plnt wrote it.
        changed = objects.patch_namespaced_custom_object(GROUP, VERSION, ns, "workflowruns", name,
                                                         {"spec": {"replicas": {"max": 2}}})
        assert changed["metadata"]["generation"] == 2
        assert changed["status"]["phase"] == "Ready" and changed["status"]["observedGeneration"] == 1

        # The status is validated too: a phase plnt does not have is refused, naming the field.
        with pytest.raises(ApiException) as refused:
            objects.patch_namespaced_custom_object_status(GROUP, VERSION, ns, "workflowruns", name,
                                                          {"status": {"phase": "Exploded"}})
        assert refused.value.status == 422
        assert 'status.phase: Unsupported value: "Exploded"' in json.loads(refused.value.body)["message"]


# --- the chart's RBAC, exercised: helm as the worker's and the reconciler's service accounts


def _as(release: Release, role: str) -> list[str]:
    return ["--kube-as-user", f"system:serviceaccount:{release.namespace}:{FULLNAME}-{role}"]


def _as_deployer(release: Release, role: str, *args: str) -> subprocess.CompletedProcess[str]:
    """helm in the deploy namespace as `role`'s service account, the flags plnt's Helm driver gives."""
    helm = [arg if arg != release.namespace else DEPLOY_NAMESPACE for arg in release.helm]
    return subprocess.run([*helm, *_as(release, role), *args], capture_output=True, text=True, env=release.env,
                          timeout=240)


@pytest.mark.parametrize(("chart", "name", "kinds", "upgrade"), [
    # The upgrade is a new version, autoscaled: an HPA appears (and goes again with the rollback).
    ("workflow-runner", "rbac-runner", {"Deployment", "Service", "ConfigMap", "HorizontalPodAutoscaler"},
     ["--set", "workflow.ref=example@0.0.1", "--set", "workflow.version=0.0.1", "--set", "replicas.max=3",
      "--set", "autoscaling.targetInvocationsPerSecond=5"]),
    ("model-server", "rbac-model", {"Deployment", "Service", "ConfigMap"}, ["--set", "model.version=0.0.1"]),
])
def test_the_workers_role_lets_helm_install_upgrade_roll_back_and_uninstall_a_release(
        release: Release, chart: str, name: str, kinds: set[str], upgrade: list[str]) -> None:
    """What the Helm driver runs (reconciler/drivers/helm.py), as the worker, in a `restricted` namespace."""
    _installed(release)
    path = str(ROOT / "charts" / chart)

    def ok(*args: str) -> subprocess.CompletedProcess[str]:
        done = _as_deployer(release, "worker", *args)
        assert done.returncode == 0, f"helm {args[0]} as the worker failed:\n{done.stdout}\n{done.stderr}"
        return done

    try:
        _worker_lifecycle(release, ok, path, name, kinds, upgrade)
    finally:  # a failure above leaves nothing behind for the next case
        subprocess.run([*release.helm[:-1], DEPLOY_NAMESPACE, "uninstall", name, "--ignore-not-found", "--wait"],
                       capture_output=True, text=True, env=release.env, timeout=120)
    # Nowhere else: the worker has no rights in plnt's own namespace.
    elsewhere = subprocess.run([*release.helm, *_as(release, "worker"), "list"], capture_output=True, text=True,
                               env=release.env, timeout=60)
    assert elsewhere.returncode != 0 and "forbidden" in elsewhere.stderr, elsewhere.stderr


def _worker_lifecycle(release: Release, ok: Any, path: str, name: str, kinds: set[str], upgrade: list[str]) -> None:
    ok("upgrade", "--install", name, path, "--labels", "plnt.work/managed-by=plnt", "--wait", "--timeout", "120s",
       "--history-max", "10", "-o", "json")
    ok("upgrade", "--install", name, path, *upgrade, "--reset-values", "--wait", "--timeout", "120s",
       "--history-max", "10", "-o", "json")
    manifest = [doc for doc in yaml.safe_load_all(ok("get", "manifest", name).stdout) if doc]
    assert kinds == {doc["kind"] for doc in manifest}
    ok("rollback", name, "1", "--wait", "--timeout", "120s", "--history-max", "10")
    with release.cluster.api_client() as api:
        hpas = client.AutoscalingV2Api(api).list_namespaced_horizontal_pod_autoscaler(DEPLOY_NAMESPACE).items
        assert hpas == []
    history = json.loads(ok("history", name, "--max", "256", "-o", "json").stdout)
    assert [h["status"] for h in history] == ["superseded", "superseded", "deployed"]

    # The reconciler reads the live state there: `helm list` and `helm get values`, nothing else.
    listed = _as_deployer(release, "reconciler", "list", "--selector", "plnt.work/managed-by=plnt", "-o", "json")
    assert listed.returncode == 0, listed.stderr
    assert [r["name"] for r in json.loads(listed.stdout)] == [name]
    values = _as_deployer(release, "reconciler", "get", "values", name, "-o", "json")
    assert values.returncode == 0, values.stderr
    # It may not change anything: an uninstall as the reconciler fails and leaves the release deployed.
    denied = _as_deployer(release, "reconciler", "uninstall", name)
    assert denied.returncode != 0 and f"failed to delete release: {name}" in denied.stderr, denied.stderr
    still = json.loads(ok("status", name, "-o", "json").stdout)
    assert still["info"]["status"] == "deployed" and still["version"] == 3
    reconciler = f"system:serviceaccount:{release.namespace}:{FULLNAME}-reconciler"
    refused = wait_for("the audit log's 403 for the reconciler's write", lambda: [
        e for e in release.cluster.audit_events()
        if e.get("stage") == "ResponseComplete" and e.get("impersonatedUser", {}).get("username") == reconciler
        and e["responseStatus"]["code"] == 403
        and e["objectRef"].get("namespace") == DEPLOY_NAMESPACE], timeout=10)
    # helm tried to delete the release's objects; RBAC said no to each, and nothing it may read was refused.
    assert ("delete", "deployments") in {(e["verb"], e["objectRef"]["resource"]) for e in refused}
    assert {e["verb"] for e in refused} <= {"create", "update", "patch", "delete"}, refused
    with release.cluster.api_client() as api:
        assert client.AppsV1Api(api).read_namespaced_deployment(name, DEPLOY_NAMESPACE).status.ready_replicas == 1

    ok("uninstall", name, "--wait", "--timeout", "120s", "--ignore-not-found")
    with release.cluster.api_client() as api:
        assert client.AppsV1Api(api).list_namespaced_deployment(DEPLOY_NAMESPACE).items == []


def test_the_reconcilers_role_covers_its_lease_and_nothing_else_there(release: Release) -> None:
    _installed(release)
    ns, user = release.namespace, f"system:serviceaccount:{release.namespace}:{FULLNAME}-reconciler"
    with release.cluster.api_client() as api:
        authz = client.AuthorizationV1Api(api)

        def allowed(verb: str, resource: str, name: str = "", group: str = "coordination.k8s.io") -> bool:
            review = authz.create_subject_access_review({"spec": {"user": user, "resourceAttributes": {
                "namespace": ns, "verb": verb, "group": group, "resource": resource, "name": name}}})
            return review.status.allowed

        lease = f"{FULLNAME}-reconciler"
        assert allowed("create", "leases")
        assert allowed("get", "leases", lease) and allowed("update", "leases", lease)
        assert not allowed("update", "leases", "someone-elses")
        assert not allowed("get", "secrets", group="") and not allowed("list", "pods", group="")


# --- plnt's own calls, as the reconciler's service account: its Lease and --mirror-status


def _impersonating(cluster: LocalCluster, user: str) -> Any:
    api = cluster.api_client()
    api.set_default_header("Impersonate-User", user)
    return api


def test_plnts_lease_and_status_mirror_work_as_the_reconciler_with_mirroring_enabled(
        release: Release, tmp_path: Path) -> None:
    """KubernetesLease and StatusMirror (reconciler/control/kube.py), the real code, under the chart's RBAC."""
    _installed(release)
    mirror_ns = f"team-{uuid.uuid4().hex[:8]}"
    with release.cluster.api_client() as api:
        _create_namespace(api, mirror_ns, {})
    upgraded = release.run("upgrade", RELEASE, str(CHART), "--reuse-values", "--set", "mirrorStatus.enabled=true",
                           "--set", f"mirrorStatus.namespaces={{{mirror_ns}}}", "--wait", "--timeout", "180s")
    assert upgraded.returncode == 0, f"helm upgrade failed:\n{upgraded.stdout}\n{upgraded.stderr}"
    user = f"system:serviceaccount:{release.namespace}:{FULLNAME}-reconciler"

    with _impersonating(release.cluster, user) as api:
        lease = KubernetesLease(f"{FULLNAME}-reconciler", release.namespace, "pod-a", lease_duration_s=2,
                                renew_every_s=0.5, api=client.CoordinationV1Api(api), request_timeout_s=5)

        async def take_and_release() -> bool:
            taken = await asyncio.wait_for(lease.acquire(asyncio.Event()), 20)
            await lease.release()
            return taken

        assert asyncio.run(take_and_release())

        statuses = StatusStore(tmp_path / "status.json")
        mirror = StatusMirror(api, statuses, identity="pod-a", request_timeout_s=5)
        statuses.on_change = mirror.status_changed
        doc = _example("workflowruns/review-responder.yaml")
        run = WorkflowRun.model_validate({**doc, "metadata": {**doc["metadata"], "namespace": mirror_ns}})
        mirror.specs_changed("c1", SpecSet(workflow_runs={run.key: run}))
        statuses.update(mirror_ns, run.metadata.name, phase=Phase.CANARY, observed_commit="c1", version="1.1.0",
                        canary_version="1.2.0", traffic_percent=5, attempted_fingerprint=run.fingerprint(),
                        message="smoke test 1/10")
        assert mirror.sync_once(), "a StatusMirror pass failed as the reconciler (see the log)"

    with release.cluster.api_client() as api:
        objects, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
        cr = objects.get_namespaced_custom_object(GROUP, VERSION, mirror_ns, "workflowruns", run.metadata.name)
        assert cr["spec"] == cr_body(run)["spec"] and cr["metadata"]["generation"] == 1
        assert cr["status"]["phase"] == "Canary" and cr["status"]["observedGeneration"] == 1
        managers = {(m["manager"], m.get("subresource", "")) for m in cr["metadata"]["managedFields"]}
        assert managers == {("plnt", ""), ("plnt", "status")}
        events = core.list_namespaced_event(mirror_ns, field_selector=f"involvedObject.name={run.metadata.name}")
        assert [e.reason for e in events.items] == ["Canary"]
        held = client.CoordinationV1Api(api).read_namespaced_lease(f"{FULLNAME}-reconciler", release.namespace)
        assert held.spec.lease_transitions == 0 and not held.spec.holder_identity  # taken, then released

    # Gone from git: plnt deletes its CR once the uninstall is over.
    with _impersonating(release.cluster, user) as api:
        mirror = StatusMirror(api, statuses, identity="pod-a", request_timeout_s=5)
        mirror.specs_changed("c1", SpecSet(workflow_runs={run.key: run}))
        assert mirror.sync_once()
        mirror.specs_changed("c2", SpecSet())
        statuses.remove(mirror_ns, run.metadata.name)
        assert mirror.sync_once()
    with release.cluster.api_client() as api:
        with pytest.raises(ApiException) as gone:
            client.CustomObjectsApi(api).get_namespaced_custom_object(GROUP, VERSION, mirror_ns, "workflowruns",
                                                                      run.metadata.name)
        assert gone.value.status == 404
    refused = [e for e in release.cluster.audit_events() if e.get("impersonatedUser", {}).get("username") == user
               and e.get("stage") == "ResponseComplete" and e["responseStatus"]["code"] == 403
               and e["objectRef"].get("namespace") in (mirror_ns, release.namespace)]
    assert refused == []


# --- the end: uninstall (last in this module: the tests above use the release)


def test_helm_uninstall_removes_the_release_and_keeps_the_crds(release: Release) -> None:
    _installed(release)
    with release.cluster.api_client() as api:
        _create(api, _workflowrun_body(release.namespace, "outlives-the-release"), "workflowruns")
    done = release.run("uninstall", RELEASE, "--wait", "--timeout", "120s")
    assert done.returncode == 0, f"helm uninstall failed:\n{done.stdout}\n{done.stderr}"
    assert release.run("list", "-q").stdout.split() == []
    with release.cluster.api_client() as api:
        core, apps, rbac = client.CoreV1Api(api), client.AppsV1Api(api), client.RbacAuthorizationV1Api(api)
        ns = release.namespace
        assert apps.list_namespaced_deployment(ns).items == []
        wait_for("the chart's pods to be gone", lambda: not core.list_namespaced_pod(ns).items, timeout=60)
        assert [s.metadata.name for s in core.list_namespaced_secret(ns).items] == ["plnt-tokens"]
        assert rbac.list_namespaced_role(DEPLOY_NAMESPACE, label_selector="app.kubernetes.io/instance=plnt").items == []
        # helm never deletes what crds/ installed (its documented rule): the custom resources survive.
        crds = {c.metadata.name for c in client.ApiextensionsV1Api(api).list_custom_resource_definition().items}
        assert set(_crd_files()) <= crds
        left = client.CustomObjectsApi(api).list_namespaced_custom_object(GROUP, VERSION, ns, "workflowruns")
        assert "outlives-the-release" in {o["metadata"]["name"] for o in left["items"]}
