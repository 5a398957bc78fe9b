"""`plnt up --mirror-status` end to end on the REAL API server, as the chart's reconciler
ServiceAccount: a real plnt (Temporal, worker, reconciler, gateway, runner processes) on a real git
repository rolls out, upgrades and retires a WorkflowRun, and mirrors it into the cluster with a token
the TokenRequest API issued for `plnt-reconciler`, bound only by the Roles `helm template
charts/plnt` renders. The audit log then shows which (verb, resource, namespace) plnt used: in the
mirrored namespace, EXACTLY what the chart's mirror Role grants (tests/k8s/rbac_audit.py: the apply
that creates the CR uses `create` too), all of it declared in plnt.reconciler.control.kube_calls,
every call allowed; and the server's SubjectAccessReview refuses that account what it must not do.
The reconciler's other grants are measured where their code runs: its Lease by
test_leader_election.py, helm's release records by test_worker_least_privilege.py.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from plnt.reconciler.control.kube_calls import API_CALLS

from tests.conftest import SpecRepo
from tests.e2e.harness import hook, running_plnt, settings_for, wait_for, wait_phase
from tests.k8s import rbac_audit
from tests.k8s.cluster import LocalCluster
from tests.k8s.cluster import wait_for as wait_until

pytestmark = [pytest.mark.k8s, pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]
PLNT_NS = "plnt"
ACCOUNT = "plnt-reconciler"
MIRRORED = "default"  # gitops-example's WorkflowRun's namespace
RUN_FILE = "workflowruns/review-responder.yaml"
RESTRICTED = {"pod-security.kubernetes.io/enforce": "restricted"}


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
            core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=namespace, labels=RESTRICTED)))
        extensions = k8s.ApiextensionsV1Api(api)
        for path in sorted((ROOT / "charts" / "plnt" / "crds").glob("*.yaml")):
            extensions.create_custom_resource_definition(yaml.safe_load(path.read_text()))
        rbac_audit.apply_chart_rbac(cluster, helm(), PLNT_NS, "--set", "mirrorStatus.enabled=true",
                                    "--set", f"mirrorStatus.namespaces={{{MIRRORED}}}")

        def established() -> bool:
            return all(any(c.type == "Established" and c.status == "True" for c in (crd.status.conditions or []))
                       for crd in extensions.list_custom_resource_definition().items)

        wait_until("plnt's CRDs Established", established, timeout=30)
        yield cluster


def cr(api: k8s.ApiClient) -> dict[str, Any] | None:
    try:
        return k8s.CustomObjectsApi(api).get_namespaced_custom_object(
            "plnt.work", "v1", MIRRORED, "workflowruns", "review-responder")
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


async def test_a_rollout_mirrored_with_the_charts_reconciler_token_uses_exactly_what_its_roles_grant(
        cluster: LocalCluster, spec_repo: SpecRepo, tmp_path: Path, temporal_address: str,
        temporal_namespace: str) -> None:
    admin = cluster.api_client()
    kubeconfig = rbac_audit.token_kubeconfig(cluster, PLNT_NS, ACCOUNT, tmp_path / "reconciler.kubeconfig")
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
            MIRRORED, field_selector="involvedObject.name=review-responder").items
        assert {"Verifying", "Deploying", "Canary", "Ready"} <= {e.reason for e in events}

        spec_repo.remove(RUN_FILE)
        spec_repo.commit("retire review-responder")
        await hook(plnt)
        await wait_for(lambda: cr(admin) is None, what="the CR to be deleted")

    calls = rbac_audit.calls(cluster, rbac_audit.user(PLNT_NS, ACCOUNT))
    assert calls and {c.namespace for c in calls} == {MIRRORED}  # only the mirrored namespace
    mirror = rbac_audit.usage(cluster, PLNT_NS, ACCOUNT, only={MIRRORED})
    assert not mirror.refused and not mirror.ungranted, (mirror.refused, mirror.ungranted)
    print(f"reconciler in {MIRRORED} (mirror Role): {mirror.figure()}")
    assert mirror.used == mirror.grants, f"granted and not used: {sorted(mirror.unused)}"
    # What plnt's code declares it calls is what it called (the create is the apply's).
    declared = {(c.group, c.resource, c.verb) for c in API_CALLS if c.role == "reconciler" and c.scope == "mirror"}
    assert {(c.group, c.resource, c.verb) for c in calls} == declared

    # What the account must not do, as the server's own authorizer answers.
    def can(verb: str, resource: str, where: str | None, group: str = "", sub: str | None = None) -> bool:
        return rbac_audit.can(cluster, PLNT_NS, ACCOUNT, verb, resource, where, group, sub)

    assert can("patch", "workflowruns", MIRRORED, "plnt.work")
    assert not can("get", "secrets", "kube-system")
    assert not can("list", "secrets", MIRRORED)
    assert not can("create", "pods", "plnt-runners", sub="exec")
    assert not can("create", "namespaces", None)
    assert not can("create", "clusterrolebindings", None, "rbac.authorization.k8s.io")
    assert not can("patch", "workflowruns", "team-a", "plnt.work")  # a namespace not mirrored
    assert not can("delete", "secrets", "plnt-runners")  # helm's release records: read only
