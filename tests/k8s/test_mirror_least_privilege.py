"""`plnt up --mirror-status` end to end on the REAL API server, as the chart's reconciler
ServiceAccount: a real plnt (Temporal, worker, reconciler, gateway, runner processes) on a real git
repository rolls out, upgrades and retires a WorkflowRun, and mirrors it into the cluster with a token
the TokenRequest API issued for `plnt-reconciler`, bound only by the Roles `helm template
charts/plnt` renders. The audit log then shows which (verb, resource, namespace) plnt used: exactly
what plnt.reconciler.control.kube_calls declares for the mirror, every call allowed, and the server's
SubjectAccessReview refuses that account what it must not do.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes import utils as k8s_utils
from kubernetes.client.exceptions import ApiException
from plnt.reconciler.control.kube_calls import API_CALLS

from tests.conftest import SpecRepo
from tests.e2e.harness import hook, running_plnt, settings_for, wait_for, wait_phase
from tests.k8s.cluster import LocalCluster
from tests.k8s.cluster import wait_for as wait_until

pytestmark = [pytest.mark.k8s, pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]
PLNT_NS = "plnt"
ACCOUNT = "plnt-reconciler"
USER = f"system:serviceaccount:{PLNT_NS}:{ACCOUNT}"
RUN_FILE = "workflowruns/review-responder.yaml"
RBAC_KINDS = {"ServiceAccount", "Role", "RoleBinding"}
# The values the chart refuses to render without (the Deployments are not applied here: only RBAC).
REQUIRED_VALUES = ("--set", "git.repo=https://git.invalid/specs.git", "--set", "temporal.address=temporal.invalid:7233",
                   "--set", "auth.tokens.secretName=plnt-tokens")


def helm() -> str:
    found = shutil.which("helm") or str(ROOT / ".venv" / "bin" / "helm")
    assert Path(found).exists(), "helm is installed by `make install` (tools/install_helm.sh)"
    return found


@pytest.fixture(scope="module")
def cluster(k8s_bin_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A cluster of this module's own, with plnt's CRDs and the chart's ServiceAccounts and Roles."""
    with LocalCluster(k8s_bin_dir, tmp_path_factory.mktemp("k8s-least-privilege")) as cluster:
        api = cluster.api_client()
        core = k8s.CoreV1Api(api)
        for namespace in (PLNT_NS, "plnt-runners"):
            core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=namespace)))
        extensions = k8s.ApiextensionsV1Api(api)
        for path in sorted((ROOT / "charts" / "plnt" / "crds").glob("*.yaml")):
            extensions.create_custom_resource_definition(yaml.safe_load(path.read_text()))
        rendered = subprocess.run(
            [helm(), "template", "plnt", str(ROOT / "charts" / "plnt"), "--namespace", PLNT_NS,
             "--set", "mirrorStatus.enabled=true", "--set", "mirrorStatus.namespaces={default}", *REQUIRED_VALUES],
            capture_output=True, text=True, check=True).stdout
        for doc in yaml.safe_load_all(rendered):
            if doc and doc["kind"] in RBAC_KINDS:
                k8s_utils.create_from_dict(api, doc)

        def established() -> bool:
            return all(any(c.type == "Established" and c.status == "True" for c in (crd.status.conditions or []))
                       for crd in extensions.list_custom_resource_definition().items)

        wait_until("plnt's CRDs Established", established, timeout=30)
        yield cluster


def token_kubeconfig(cluster: LocalCluster, path: Path) -> Path:
    """A kubeconfig holding a token the TokenRequest API issued for the reconciler's ServiceAccount."""
    request = k8s.AuthenticationV1TokenRequest(spec=k8s.V1TokenRequestSpec(audiences=[], expiration_seconds=3600))
    token = k8s.CoreV1Api(cluster.api_client()).create_namespaced_service_account_token(
        ACCOUNT, PLNT_NS, request).status.token
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "plnt",
        "clusters": [{"name": "test", "cluster": {"server": cluster.server,
                                                  "certificate-authority": str(cluster.pki / "ca.crt")}}],
        "users": [{"name": ACCOUNT, "user": {"token": token}}],
        "contexts": [{"name": "plnt", "context": {"cluster": "test", "user": ACCOUNT}}]}))
    return path


def cr(api: k8s.ApiClient) -> dict[str, Any] | None:
    try:
        return k8s.CustomObjectsApi(api).get_namespaced_custom_object(
            "plnt.work", "v1", "default", "workflowruns", "review-responder")
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def used_by_plnt(cluster: LocalCluster) -> list[tuple[str, str, str, str, int]]:
    """(group, resource, verb, namespace, response code) of every request the account made."""
    used = []
    for event in cluster.audit_events():
        if event.get("user", {}).get("username") != USER or event.get("stage") != "ResponseComplete":
            continue
        ref = event.get("objectRef") or {}
        resource = ref.get("resource", "") + (f"/{ref['subresource']}" if ref.get("subresource") else "")
        used.append((ref.get("apiGroup", ""), resource, event["verb"], ref.get("namespace", ""),
                     event.get("responseStatus", {}).get("code", 0)))
    return used


def can(api: k8s.ApiClient, verb: str, resource: str, namespace: str | None, group: str = "",
        subresource: str | None = None) -> bool:
    review = k8s.V1SubjectAccessReview(spec=k8s.V1SubjectAccessReviewSpec(
        user=USER, groups=["system:serviceaccounts", f"system:serviceaccounts:{PLNT_NS}", "system:authenticated"],
        resource_attributes=k8s.V1ResourceAttributes(verb=verb, resource=resource, namespace=namespace, group=group,
                                                     subresource=subresource)))
    return bool(k8s.AuthorizationV1Api(api).create_subject_access_review(review).status.allowed)


async def test_a_rollout_mirrored_with_the_charts_reconciler_token_uses_exactly_what_its_roles_grant(
        cluster: LocalCluster, spec_repo: SpecRepo, tmp_path: Path, temporal_address: str,
        temporal_namespace: str) -> None:
    admin = cluster.api_client()
    kubeconfig = token_kubeconfig(cluster, tmp_path / "reconciler.kubeconfig")
    settings = settings_for(spec_repo.path, tmp_path / "state", temporal_address, temporal_namespace,
                            mirror_status=True, kubeconfig=kubeconfig)
    async with running_plnt(settings) as plnt:
        await wait_phase(plnt, "Ready", version="1.2.0")
        status = await wait_for(lambda: ((cr(admin) or {}).get("status") or {}).get("phase") == "Ready"
                                and cr(admin)["status"], what="the CR's status to be Ready")  # type: ignore[index]
        assert status["version"] == "1.2.0" and status["observedGeneration"] == 1
        assert {c["type"]: c["status"] for c in status["conditions"]} == {
            "Ready": "True", "Reconciling": "False", "Stalled": "False"}

        spec_repo.replace(RUN_FILE, "review-responder@1.2.0", "review-responder@1.3.0")
        spec_repo.commit("review-responder 1.3.0")
        await hook(plnt)
        await wait_phase(plnt, "Ready", version="1.3.0")
        await wait_for(lambda: ((cr(admin) or {}).get("status") or {}).get("version") == "1.3.0",
                       what="the CR to show 1.3.0")
        events = k8s.CoreV1Api(admin).list_namespaced_event(
            "default", field_selector="involvedObject.name=review-responder").items
        assert {"Verifying", "Deploying", "Canary", "Ready"} <= {e.reason for e in events}

        spec_repo.remove(RUN_FILE)
        spec_repo.commit("retire review-responder")
        await hook(plnt)
        await wait_for(lambda: cr(admin) is None, what="the CR to be deleted")

    used = used_by_plnt(cluster)
    refused = [u for u in used if u[4] in (401, 403)]
    assert used and not refused, refused
    declared = {(c.group, c.resource, c.verb) for c in API_CALLS if c.role == "reconciler" and c.scope == "mirror"}
    used_calls = {(group, resource, verb) for group, resource, verb, namespace, _ in used}
    assert {namespace for *_, namespace, _ in used} == {"default"}  # only the mirrored namespace
    assert used_calls <= declared, used_calls - declared
    # Granted and unused: the mirror's grants plnt did not need in this rollout would show here.
    assert declared - used_calls <= {("plnt.work", "workflowruns", "get")}, declared - used_calls

    # What the account must not do, as the server's own authorizer answers.
    assert can(admin, "patch", "workflowruns", "default", "plnt.work")
    assert not can(admin, "get", "secrets", "kube-system")
    assert not can(admin, "list", "secrets", "default")
    assert not can(admin, "create", "pods", "plnt-runners", subresource="exec")
    assert not can(admin, "create", "namespaces", None)
    assert not can(admin, "create", "clusterrolebindings", None, "rbac.authorization.k8s.io")
    assert not can(admin, "patch", "workflowruns", "team-a", "plnt.work")  # a namespace not mirrored
