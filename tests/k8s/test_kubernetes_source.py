"""`plnt up --source kubernetes` on the REAL API server (tests/k8s/cluster.py): WorkflowRuns come from
their custom resources, created, changed and deleted with the kubernetes client as `kubectl apply`
would; backends, trust policy and the `file:` registry come from a platform directory (a copy of
gitops-example's backends/, trust/ and registry/).

plnt talks to the API server with a TokenRequest token of a ServiceAccount bound to a Role made of
exactly the reconciler's "source" calls in plnt.reconciler.control.kube_calls; the audit log then
shows every call it made was one of them, none refused.

The real console script runs as a process with its embedded Temporal and local runner processes;
the runners' model is MockBackend (`--backend mock`, the default), a STAND-IN for a model server.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from tests.e2e.test_plnt_up_process import PLNT, REVIEW, PlntUp, cmdline, gateway_port
from tests.e2e.test_plnt_up_process import started as started  # noqa: F401 (the fixture: plnt processes killed after the test)
from tests.k8s.cluster import LocalCluster, wait_for

pytestmark = [pytest.mark.k8s, pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]
ACCOUNT, ACCOUNT_NS = "plnt-source", "plnt"
USER = f"system:serviceaccount:{ACCOUNT_NS}:{ACCOUNT}"
EXAMPLE = ROOT / "gitops-example"
GROUP, VERSION, PLURAL, NS = "plnt.work", "v1", "workflowruns", "default"


@pytest.fixture(scope="module")
def cluster(k8s_bin_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A cluster of this module's own, with plnt's CRDs created from charts/plnt/crds."""
    with LocalCluster(k8s_bin_dir, tmp_path_factory.mktemp("k8s-source")) as cluster:
        extensions = k8s.ApiextensionsV1Api(cluster.api_client())
        for path in sorted((ROOT / "charts" / "plnt" / "crds").glob("*.yaml")):
            extensions.create_custom_resource_definition(yaml.safe_load(path.read_text()))

        def established() -> bool:
            return all(any(c.type == "Established" and c.status == "True" for c in (crd.status.conditions or []))
                       for crd in extensions.list_custom_resource_definition().items)

        wait_for("plnt's CRDs Established", established, timeout=30)
        grant_source_calls(cluster)
        yield cluster


def grant_source_calls(cluster: LocalCluster) -> None:
    """A ServiceAccount whose Role in NS is the reconciler's "source" calls of kube_calls, nothing more."""
    from plnt.reconciler.control.kube_calls import API_CALLS

    api = cluster.api_client()
    core, rbac = k8s.CoreV1Api(api), k8s.RbacAuthorizationV1Api(api)
    core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=ACCOUNT_NS)))
    core.create_namespaced_service_account(ACCOUNT_NS, k8s.V1ServiceAccount(metadata=k8s.V1ObjectMeta(name=ACCOUNT)))
    rules = [k8s.V1PolicyRule(api_groups=[c.group], resources=[c.resource], verbs=[c.verb])
             for c in API_CALLS if c.role == "reconciler" and c.scope == "source"]
    rbac.create_namespaced_role(NS, k8s.V1Role(metadata=k8s.V1ObjectMeta(name=ACCOUNT), rules=rules))
    rbac.create_namespaced_role_binding(NS, k8s.V1RoleBinding(
        metadata=k8s.V1ObjectMeta(name=ACCOUNT),
        role_ref=k8s.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="Role", name=ACCOUNT),
        subjects=[k8s.RbacV1Subject(kind="ServiceAccount", name=ACCOUNT, namespace=ACCOUNT_NS)]))


def platform_dir(tmp_path: Path) -> Path:
    """What the operator gives: gitops-example's backends, trust policies and registry, plus an
    `unofficial` registry holding review-responder 1.4.0 WITHOUT a signature."""
    from plnt.reconciler.recipes.archive import pack_recipe_to

    root = tmp_path / "platform"
    for part in ("backends", "trust", "registry"):
        shutil.copytree(EXAMPLE / part, root / part)
    (root / ".plntignore").write_text("registry/\nunofficial/\n")
    entry = root / "unofficial" / "review-responder" / "1.4.0"
    entry.mkdir(parents=True)
    pack_recipe_to(EXAMPLE / "recipes" / "review-responder" / "1.4.0", entry / "recipe.tar.gz")
    return root


def run_body(name: str, version: str = "1.2.0", registry: str = "file:registry", backend: str = "local") -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "WorkflowRun", "metadata": {"name": name, "namespace": NS},
            "spec": {"workflow": {"ref": f"{name}@{version}", "registry": registry}, "backend": {"cluster": backend},
                     "replicas": {"min": 1, "max": 1},
                     "canary": {"trafficPercent": 5, "smokeTest": {"invocations": 10, "p95BudgetMs": 2500,
                                                                   "errorBudgetPercent": 1}}}}


def get_cr(api: k8s.CustomObjectsApi, name: str) -> dict[str, Any] | None:
    try:
        return api.get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, name)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def cr_status(api: k8s.CustomObjectsApi, name: str) -> dict[str, Any]:
    return (get_cr(api, name) or {}).get("status") or {}


def patch_spec(api: k8s.CustomObjectsApi, name: str, workflow: dict[str, str]) -> None:
    api.patch_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, name, {"spec": {"workflow": workflow}})


class PlntUpFromCluster(PlntUp):
    """`plnt up --source kubernetes`, as a user runs it."""

    def __init__(self, platform: Path, kubeconfig: Path, state_dir: Path, port: int, log_file: Path) -> None:
        self.url = f"http://127.0.0.1:{port}"
        self.log_file = log_file
        self.seen: dict[int, str] = {}
        args = [*PLNT, "up", "--source", "kubernetes", "--kubeconfig", str(kubeconfig), "--source-namespace", NS,
                "--platform-dir", str(platform), "--state-dir", str(state_dir), "--port", str(port), "--interval", "1"]
        import os

        with open(log_file, "wb") as out:
            self.process = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                            start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})

    def sagas_started(self, name: str = "review-responder") -> int:
        return sum(1 for line in self.log().splitlines() if "saga-started" in line and f"workflowrun={NS}/{name} " in line)

    def row(self, name: str) -> dict[str, Any] | None:
        return next((r for r in self.workflows() or [] if r["name"] == name), None)

    def wait_row(self, name: str, what: str, check: Any, timeout: float = 120.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        row = None
        while time.monotonic() < deadline:
            assert self.process.poll() is None, self.why(f"plnt exited with code {self.process.returncode}")
            self.record_descendants()
            row = self.row(name)
            if check(row):
                return row  # type: ignore[return-value]
            time.sleep(0.3)
        raise AssertionError(self.why(f"{what} not within {timeout:.0f}s; row: {row}"))

    def wait_passes(self, count: int) -> None:
        start = self.full_passes()
        deadline = time.monotonic() + 60
        while self.full_passes() < start + count:
            assert time.monotonic() < deadline, self.why(f"no {count} reconcile passes within 60 s")
            time.sleep(0.2)

    def invoke(self, name: str = "review-responder") -> httpx.Response:
        return httpx.post(f"{self.url}/workflows/{name}/invoke", json=REVIEW, timeout=30, trust_env=False)


def test_workflowruns_from_the_cluster_roll_out_are_refused_and_retire(
        cluster: LocalCluster, tmp_path: Path, started: list[PlntUp]) -> None:
    api = k8s.CustomObjectsApi(cluster.api_client())
    kubeconfig = cluster.token_kubeconfig(ACCOUNT, ACCOUNT_NS, tmp_path / "plnt.kubeconfig")
    plnt = PlntUpFromCluster(platform_dir(tmp_path), kubeconfig, tmp_path / "state", gateway_port(),
                             tmp_path / "plnt.log")
    started.append(plnt)
    plnt.wait_passes(1)

    # `kubectl apply -f workflow.yaml`: the WorkflowRun becomes Ready, the runner answers through the gateway.
    api.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, run_body("review-responder"))
    ready = plnt.wait_ready(timeout=120)
    assert ready["version"] == "1.2.0", ready
    response = plnt.invoke()
    assert response.status_code == 200 and response.json()["version"] == "1.2.0", plnt.why(response.text)
    status = wait_for("the CR's status Ready", lambda: cr_status(api, "review-responder").get("phase") == "Ready"
                      and cr_status(api, "review-responder"), timeout=30)
    assert status["version"] == "1.2.0" and status["observedGeneration"] == 1, status
    assert {c["type"]: c["status"] for c in status["conditions"]}["Ready"] == "True"
    assert plnt.sagas_started() == 1

    # A status write and a label change move no generation: no new revision, no saga.
    api.patch_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "review-responder",
                                       {"metadata": {"labels": {"team": "care"}}})
    api.patch_namespaced_custom_object_status(GROUP, VERSION, NS, PLURAL, "review-responder",
                                              {"status": {"message": "written by someone else"}})
    plnt.wait_passes(4)
    assert plnt.sagas_started() == 1, plnt.why("a status or label write started a saga")
    assert (get_cr(api, "review-responder") or {})["metadata"]["generation"] == 1

    # A spec change (a new version) rolls out through a canary.
    patch_spec(api, "review-responder", {"ref": "review-responder@1.3.0"})
    plnt.wait_row("review-responder", "1.3.0 Ready", lambda r: r and r["phase"] == "Ready" and r["version"] == "1.3.0")
    assert plnt.sagas_started() == 2
    events = k8s.CoreV1Api(cluster.api_client()).list_namespaced_event(
        NS, field_selector="involvedObject.name=review-responder").items
    assert {"Verifying", "Deploying", "Canary", "Ready"} <= {e.reason for e in events}, [e.reason for e in events]
    wait_for("the CR's status at generation 2", lambda: cr_status(api, "review-responder").get("observedGeneration") == 2
             and cr_status(api, "review-responder").get("version") == "1.3.0", timeout=30)
    assert plnt.invoke().json()["version"] == "1.3.0"

    # An unsigned recipe is refused with the reason on the CR; 1.3.0 keeps serving.
    patch_spec(api, "review-responder", {"ref": "review-responder@1.4.0", "registry": "file:unofficial"})
    failed = plnt.wait_row("review-responder", "Failed", lambda r: r and r["phase"] == "Failed")
    assert failed["version"] == "1.3.0" and failed["lastError"].startswith("VerificationFailed: unsigned"), failed
    status = wait_for("the CR's status Failed", lambda: cr_status(api, "review-responder").get("phase") == "Failed"
                      and cr_status(api, "review-responder"), timeout=30)
    assert "unsigned" in status["lastError"] and status["version"] == "1.3.0", status
    assert {c["type"]: c["status"] for c in status["conditions"]}["Stalled"] == "True"
    assert plnt.invoke().json()["version"] == "1.3.0"
    assert not list((tmp_path / "state").rglob("default.review-responder.1.4.0.*")), "nothing of 1.4.0 ran"

    # An object plnt refuses beyond the CRD schema: named in its status, the others untouched.
    api.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, run_body("booking-triage", "1.0.0", backend="gpu-pool"))
    refused = plnt.wait_row("booking-triage", "booking-triage refused", lambda r: r and r["phase"] == "Failed")
    assert "default/workflowruns/booking-triage" in refused["lastError"], refused
    assert "spec.backend.cluster: unknown backend 'gpu-pool'" in refused["lastError"], refused
    wait_for("the refusal on the CR", lambda: "unknown backend" in (cr_status(api, "booking-triage").get("lastError") or ""),
             timeout=30)
    shown = subprocess.run([*PLNT, "status", "--url", plnt.url], capture_output=True, text=True, timeout=30)
    assert shown.returncode == 0 and "default/booking-triage" in shown.stdout, shown.stdout + shown.stderr
    assert "unknown backend 'gpu-pool'" in shown.stdout, shown.stdout
    assert plnt.invoke().json()["version"] == "1.3.0"
    api.delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "booking-triage")
    plnt.wait_row("booking-triage", "the refused row gone", lambda r: r is None)

    # Deleting the CR retires the release.
    api.delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "review-responder")
    plnt.wait_row("review-responder", "the release retired", lambda r: r is None)
    response = plnt.invoke()
    assert response.status_code == 404, response.text
    left = [line for pid in plnt.record_descendants() if "review-responder" in (line := cmdline(pid))]
    assert not left, plnt.why(f"a runner of review-responder still runs: {left}")

    plnt.stop_and_check(signal.SIGINT)

    # Only the declared calls, only in the namespace read, none refused (no spec written, nothing deleted).
    from plnt.reconciler.control.kube_calls import API_CALLS

    used = cluster.requests_of(USER)
    declared = {(c.group, c.resource, c.verb) for c in API_CALLS if c.role == "reconciler" and c.scope == "source"}
    assert used and not [u for u in used if u[4] in (401, 403)], sorted(used)
    assert {(group, resource, verb) for group, resource, verb, *_ in used} == declared, sorted(used)
    assert {namespace for _, _, _, namespace, _ in used} == {NS}
