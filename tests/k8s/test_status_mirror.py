"""plnt's own Kubernetes calls against the REAL API server (tests/k8s/cluster.py): the CRDs as plnt
ships them (charts/plnt/crds), `--mirror-status` (server-side apply, the status subresource, one
Event per phase change) and the reconciler's leader Lease.

The same behaviour is tested in more corners against the declared stand-in server
(tests/reconciler/control/test_kube.py); here the server's own schema validation, field ownership,
generation handling, Events and optimistic concurrency decide.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from plnt.core.specs.loader import SpecSet
from plnt.core.specs.models import WorkflowRun
from plnt.core.status import Phase
from plnt.reconciler.control.crds import GROUP, MANAGED_BY_LABEL, VERSION
from plnt.reconciler.control.kube import FIELD_MANAGER, PLURAL, KubernetesLease, StatusMirror, cr_body
from plnt.reconciler.status_store import StatusStore

from tests.k8s.cluster import LocalCluster, wait_for

pytestmark = [pytest.mark.k8s, pytest.mark.integration]

CRDS = Path(__file__).resolve().parents[2] / "charts" / "plnt" / "crds"
LEASE_NS = "plnt"


@pytest.fixture(scope="module")
def cluster(k8s_bin_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A cluster of this module's own, with plnt's CRDs created from charts/plnt/crds."""
    with LocalCluster(k8s_bin_dir, tmp_path_factory.mktemp("k8s-mirror")) as cluster:
        api = cluster.api_client()
        extensions = k8s.ApiextensionsV1Api(api)
        names = []
        for path in sorted(CRDS.glob("*.yaml")):
            body = yaml.safe_load(path.read_text())
            extensions.create_custom_resource_definition(body)
            names.append(body["metadata"]["name"])

        def established() -> bool:
            for name in names:
                conditions = extensions.read_custom_resource_definition(name).status.conditions or []
                if not any(c.type == "Established" and c.status == "True" for c in conditions):
                    return False
            return True

        wait_for("plnt's CRDs Established", established, timeout=30)
        core = k8s.CoreV1Api(api)
        for namespace in ("team-a", LEASE_NS):
            core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=namespace)))
        yield cluster


@pytest.fixture
def api(cluster: LocalCluster) -> k8s.ApiClient:
    return cluster.api_client()


def run_doc(name: str, namespace: str = "default", version: str = "1.2.0", traffic: int = 5) -> WorkflowRun:
    return WorkflowRun.model_validate({
        "apiVersion": "plnt.work/v1", "kind": "WorkflowRun",
        "metadata": {"name": name, "namespace": namespace, "labels": {"team": "care"}},
        "spec": {"workflow": {"ref": f"{name}@{version}", "registry": "file:registry"},
                 "backend": {"cluster": "local"}, "canary": {"trafficPercent": traffic}}})


def specs(*runs: WorkflowRun) -> SpecSet:
    return SpecSet(workflow_runs={run.key: run for run in runs})


def get_cr(api: k8s.ApiClient, name: str, namespace: str = "default") -> dict[str, Any] | None:
    try:
        return k8s.CustomObjectsApi(api).get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


@pytest.fixture
def statuses(tmp_path: Path) -> StatusStore:
    return StatusStore(tmp_path / "status.json")


@pytest.fixture
def mirror(api: k8s.ApiClient, statuses: StatusStore) -> StatusMirror:
    mirror = StatusMirror(api, statuses, identity="plnt-test", request_timeout_s=10)
    statuses.on_change = mirror.status_changed
    return mirror


def test_the_mirror_applies_server_side_and_the_server_owns_the_fields_for_plnt(
        api: k8s.ApiClient, mirror: StatusMirror) -> None:
    one, two = run_doc("apply-one"), run_doc("apply-two", "team-a", "1.0.0")
    mirror.specs_changed("c1", specs(one, two))
    assert mirror.sync_once()
    obj = get_cr(api, "apply-one")
    assert obj is not None and obj["spec"] == cr_body(one)["spec"] and obj["metadata"]["generation"] == 1
    assert obj["metadata"]["labels"] == {"team": "care", MANAGED_BY_LABEL: "plnt"}
    managers = {(m["manager"], m["operation"]) for m in obj["metadata"]["managedFields"]}
    assert (FIELD_MANAGER, "Apply") in managers  # the server records plnt as the owner of what it applied
    assert get_cr(api, "apply-two", "team-a") is not None
    version = obj["metadata"]["resourceVersion"]
    mirror.specs_changed("c2", specs(one, two))  # the same specs again: nothing applied
    assert mirror.sync_once()
    assert get_cr(api, "apply-one")["metadata"]["resourceVersion"] == version  # type: ignore[index]
    mirror.specs_changed("c3", specs(run_doc("apply-one", version="1.3.0"), two))
    assert mirror.sync_once()
    obj = get_cr(api, "apply-one")
    assert obj is not None and obj["metadata"]["generation"] == 2  # the server moved it: the spec changed
    assert obj["spec"]["workflow"]["ref"] == "apply-one@1.3.0"


def test_the_status_subresource_takes_phase_and_conditions_without_moving_the_generation(
        api: k8s.ApiClient, mirror: StatusMirror, statuses: StatusStore) -> None:
    run = run_doc("status-run")
    mirror.specs_changed("c1", specs(run))
    statuses.update("default", "status-run", phase=Phase.CANARY, observed_commit="c1", canary_version="1.2.0",
                    traffic_percent=5, attempted_fingerprint=run.fingerprint(), attempted_version="1.2.0",
                    message="canary 1.2.0 at 5%")
    assert mirror.sync_once()
    obj = get_cr(api, "status-run")
    assert obj is not None and obj["metadata"]["generation"] == 1
    status = obj["status"]
    assert (status["phase"], status["observedGeneration"], status["observedCommit"]) == ("Canary", 1, "c1")
    assert (status["canaryPercent"], status["canaryVersion"]) == (5, "1.2.0")
    assert {c["type"]: c["status"] for c in status["conditions"]} == {"Ready": "Unknown", "Reconciling": "True",
                                                                      "Stalled": "False"}


def test_every_phase_change_is_a_kubernetes_event_with_the_reason_plnt_status_shows(
        api: k8s.ApiClient, mirror: StatusMirror, statuses: StatusStore) -> None:
    mirror.specs_changed("c1", specs(run_doc("events-run")))
    phases = [Phase.PENDING, Phase.VERIFYING, Phase.DEPLOYING, Phase.CANARY, Phase.ROLLED_BACK]
    for phase in phases:
        statuses.update("default", "events-run", phase=phase, message=f"now {phase.value}")
    assert mirror.sync_once()
    obj = get_cr(api, "events-run")
    assert obj is not None
    events = k8s.CoreV1Api(api).list_namespaced_event(
        "default", field_selector="involvedObject.name=events-run,involvedObject.kind=WorkflowRun").items
    events.sort(key=lambda e: (e.event_time or e.first_timestamp or e.metadata.creation_timestamp, e.metadata.name))
    assert [e.reason for e in events] == [p.value for p in phases]
    assert {e.involved_object.uid for e in events} == {obj["metadata"]["uid"]}
    assert events[-1].type == "Warning" and events[-1].message == "Canary -> RolledBack: now RolledBack"
    assert events[0].type == "Normal" and events[0].reporting_component == "plnt"
    assert mirror.sync_once()
    again = k8s.CoreV1Api(api).list_namespaced_event(
        "default", field_selector="involvedObject.name=events-run").items
    assert len(again) == len(phases)  # none twice


def test_the_server_refuses_what_the_crd_schema_does_not_allow(api: k8s.ApiClient) -> None:
    body = cr_body(run_doc("refused-run"))
    body["spec"]["canary"]["trafficPercent"] = "five"
    with pytest.raises(ApiException) as refused:
        k8s.CustomObjectsApi(api).create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, body)
    assert refused.value.status == 422
    assert "spec.canary.trafficPercent" in str(refused.value.body), refused.value.body


def lease(api: k8s.ApiClient, identity: str, duration: int) -> KubernetesLease:
    return KubernetesLease("plnt-reconciler", LEASE_NS, identity, lease_duration_s=duration, renew_every_s=0.2,
                           api=k8s.CoordinationV1Api(api), request_timeout_s=5)


async def test_leader_election_on_the_real_lease_api(api: k8s.ApiClient) -> None:
    a, b = lease(api, "reconciler-a", 2), lease(api, "reconciler-b", 2)
    stop = asyncio.Event()
    assert await asyncio.wait_for(a.acquire(stop), 10)
    coordination = k8s.CoordinationV1Api(api)
    spec = coordination.read_namespaced_lease("plnt-reconciler", LEASE_NS).spec
    assert (spec.holder_identity, spec.lease_duration_seconds, spec.lease_transitions) == ("reconciler-a", 2, 0)
    # a stops renewing (as a SIGKILLed leader does): b takes over after a lease duration, not before.
    started = time.monotonic()
    assert await asyncio.wait_for(b.acquire(stop), 15)
    assert time.monotonic() - started >= 2.0
    spec = coordination.read_namespaced_lease("plnt-reconciler", LEASE_NS).spec
    assert (spec.holder_identity, spec.lease_transitions) == ("reconciler-b", 1)
    # a comes back: its next renewal finds b holding, so a reports the lease lost and b keeps it.
    await asyncio.wait_for(a.hold(asyncio.Event()), 15)
    assert not a.held
    assert coordination.read_namespaced_lease("plnt-reconciler", LEASE_NS).spec.holder_identity == "reconciler-b"
    await b.release()


@pytest.mark.parametrize("component", ["kube-apiserver", "etcd"])
def test_the_mirror_loses_nothing_while_the_api_server_or_etcd_is_down(
        cluster: LocalCluster, api: k8s.ApiClient, statuses: StatusStore, component: str) -> None:
    name = f"outage-{component}"
    mirror = StatusMirror(api, statuses, identity="plnt-test", request_timeout_s=2)
    statuses.on_change = mirror.status_changed
    run = run_doc(name)
    mirror.specs_changed("c1", specs(run))
    statuses.update("default", name, phase=Phase.VERIFYING, message="verifying 1.2.0")
    assert mirror.sync_once()
    cluster.stop_component(component)
    try:
        # What happens meanwhile is kept: both phase changes, and the status they end in.
        statuses.update("default", name, phase=Phase.DEPLOYING, message="deploying 1.2.0")
        statuses.update("default", name, phase=Phase.CANARY, message="canary 1.2.0 at 5%")
        assert not mirror.sync_once()  # it says it did not get through, and raises nothing
    finally:
        cluster.restart_component(component)
    wait_for("the mirror to get through", mirror.sync_once, timeout=60)
    obj = get_cr(api, name)
    assert obj is not None and obj["status"]["phase"] == "Canary" and obj["status"]["message"] == "canary 1.2.0 at 5%"
    events = k8s.CoreV1Api(api).list_namespaced_event("default", field_selector=f"involvedObject.name={name}").items
    assert sorted(e.reason for e in events) == sorted(["Verifying", "Deploying", "Canary"])
