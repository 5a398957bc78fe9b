"""plnt's Kubernetes client code (plnt.reconciler.control.kube) against a DECLARED STAND-IN API server.

The same code runs against a real API server in tests/k8s/ (test_status_mirror.py and others);
this module keeps the corners a real server does not produce on demand. tests/kube_standin.py is a small real HTTP server on 127.0.0.1
that answers the endpoints plnt calls with the shapes of the Kubernetes API documentation (Lease,
metav1.Status errors, server-side apply, the status subresource, Events); the real `kubernetes`
client reaches it through a generated kubeconfig. What the stand-in does not model (and so what is
not proven here) is listed in its docstring and in docs/kubernetes.md ("CRDs and --mirror-status").

Every request a test makes is checked, at teardown, against plnt.reconciler.control.kube_calls.API_CALLS:
a call the chart's RBAC would not grant fails the test.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from plnt.core.specs.loader import SpecSet
from plnt.core.specs.models import WorkflowRun
from plnt.core.status import Phase
from plnt.reconciler.control.crds import MANAGED_BY_LABEL
from plnt.reconciler.control.kube import KubernetesLease, StatusMirror, api_client, attach_status_mirror, cr_body
from plnt.reconciler.control.kube_calls import API_CALLS
from plnt.reconciler.settings import Settings
from plnt.reconciler.status_store import StatusStore

from tests.kube_standin import TOKEN, KubeStandIn, Request, Stored, api_call_of

pytestmark = pytest.mark.integration  # every test here starts the stand-in HTTP server

LEASE_NS = "plnt"
MIRROR_NAMESPACES = {"default", "team-a"}
GRANTED = {(c.group, c.resource, c.verb, c.scope) for c in API_CALLS if c.role == "reconciler"}


def check_rbac(requests: list[Request]) -> None:
    for request in requests:
        group, resource, verb, namespace = api_call_of(request)
        scope = "plnt" if namespace == LEASE_NS else "mirror" if namespace in MIRROR_NAMESPACES else "?"
        assert (group, resource, verb, scope) in GRANTED, (
            f"{request.method} {request.path}: {verb} {group or 'core'}/{resource} in {namespace} is not in "
            "plnt.reconciler.control.kube_calls.API_CALLS (the chart's RBAC would refuse it)")


@pytest.fixture
def standin() -> Iterator[KubeStandIn]:
    with KubeStandIn() as server:
        yield server
        check_rbac(server.history)


@pytest.fixture
def api(standin: KubeStandIn, tmp_path: Path) -> k8s.ApiClient:
    return api_client(standin.kubeconfig(tmp_path))


def lease(api: k8s.ApiClient, identity: str, duration: int = 1, renew: float = 0.1,
          clock: Any = time.monotonic) -> KubernetesLease:
    return KubernetesLease("plnt-reconciler", LEASE_NS, identity, lease_duration_s=duration, renew_every_s=renew,
                           api=api if identity == "c" else k8s.CoordinationV1Api(api), request_timeout_s=1,
                           clock=clock)


def lease_spec(standin: KubeStandIn) -> dict[str, Any]:
    obj = standin.get("coordination.k8s.io", "leases", LEASE_NS, "plnt-reconciler")
    assert obj is not None
    return obj["spec"]


async def eventually(check: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


# --- the Lease ---------------------------------------------------------------------------------------

async def test_acquire_creates_the_lease_hold_renews_it_release_hands_it_over(standin: KubeStandIn,
                                                                               api: k8s.ApiClient) -> None:
    # b's clock never moves: by its own clock a's record never expires, so b can only take over a
    # released lease. (Before: an upper bound on the wall-clock time of the takeover.)
    a, b = lease(api, "a", duration=3), lease(api, "b", duration=3, clock=lambda: 0.0)
    stop_a, stop_b = asyncio.Event(), asyncio.Event()
    assert await asyncio.wait_for(a.acquire(stop_a), 5)
    spec = lease_spec(standin)
    assert spec["holderIdentity"] == "a" and spec["leaseDurationSeconds"] == 3 and spec["leaseTransitions"] == 0
    assert spec["acquireTime"] and spec["renewTime"]
    created = [r for r in standin.requests if r.method == "POST"]
    assert created[0].path == f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NS}/leases"

    holding = asyncio.create_task(a.hold(stop_a))
    first_renew = spec["renewTime"]
    await eventually(lambda: lease_spec(standin)["renewTime"] != first_renew)
    assert lease_spec(standin)["acquireTime"] == spec["acquireTime"]  # a renewal keeps acquireTime

    waiting = asyncio.create_task(b.acquire(stop_b))
    await asyncio.sleep(3.5)  # over a lease duration: a renews, so b never takes over
    assert not waiting.done() and lease_spec(standin)["holderIdentity"] == "a"
    puts = [r for r in standin.requests if r.method == "PUT"]
    assert all(r.body["metadata"]["resourceVersion"] for r in puts)  # optimistic concurrency on every write

    stop_a.set()
    await holding
    await a.release()
    assert lease_spec(standin).get("holderIdentity", "") in ("", "b")
    assert await asyncio.wait_for(waiting, 30)  # taken over because a released it (b's clock never expires it)
    spec = lease_spec(standin)
    assert spec["holderIdentity"] == "b" and spec["leaseTransitions"] == 1
    stop_b.set()


async def test_a_lease_whose_holder_stopped_renewing_is_taken_over_after_it_expires(standin: KubeStandIn,
                                                                                      api: k8s.ApiClient) -> None:
    a, b = lease(api, "a", duration=1), lease(api, "b", duration=1)
    stop = asyncio.Event()
    assert await a.acquire(stop)  # ... and then a hangs: no hold, no release
    started = time.monotonic()
    assert await asyncio.wait_for(b.acquire(stop), 5)
    assert time.monotonic() - started >= 1.0  # not before a full lease duration on b's own clock
    spec = lease_spec(standin)
    assert spec["holderIdentity"] == "b" and spec["leaseTransitions"] == 1
    # a wakes up: its next renewal finds b holding, so it reports the lease lost at once.
    await asyncio.wait_for(a.hold(asyncio.Event()), 30)
    assert not a.held and lease_spec(standin)["holderIdentity"] == "b"


async def test_a_write_that_conflicts_loses(standin: KubeStandIn, api: k8s.ApiClient) -> None:
    """b reads an expired lease, but c writes it before b's PUT: b gets 409 Conflict and keeps waiting."""
    a, b = lease(api, "a", duration=1), lease(api, "b", duration=1)
    stop = asyncio.Event()
    assert await a.acquire(stop)
    await a.release()

    def c_wins(request: Request) -> None:
        if request.method == "PUT" and request.body["spec"].get("holderIdentity") == "b":
            standin.before = None
            stored = standin.objects[("coordination.k8s.io", "leases", LEASE_NS, "plnt-reconciler")]
            stored.obj["spec"].update(holderIdentity="c", leaseDurationSeconds=30)
            standin._bump(stored.obj)

    standin.before = c_wins
    waiting = asyncio.create_task(b.acquire(stop))
    await asyncio.sleep(1.5)
    assert not waiting.done() and lease_spec(standin)["holderIdentity"] == "c"
    conflicts = [r for r in standin.requests if r.method == "PUT" and r.body["spec"].get("holderIdentity") == "b"]
    assert len(conflicts) == 1  # the one write that lost; since then b only reads
    stop.set()
    assert await waiting is False


async def test_of_two_contenders_exactly_one_wins(standin: KubeStandIn, api: k8s.ApiClient) -> None:
    stop = asyncio.Event()
    contenders = [lease(api, name, duration=2, renew=0.05) for name in ("a", "b", "c")]
    tasks = {asyncio.create_task(c.acquire(stop)): c for c in contenders}
    done, pending = await asyncio.wait(tasks, timeout=3, return_when=asyncio.FIRST_COMPLETED)
    await asyncio.sleep(0.5)
    winners = [tasks[t] for t in tasks if t.done()]
    assert len(winners) == 1 and lease_spec(standin)["holderIdentity"] == winners[0].identity
    holding = asyncio.create_task(winners[0].hold(stop))
    await asyncio.sleep(3)  # more than a lease duration: the others still wait
    assert sum(t.done() for t in tasks) == 1
    stop.set()
    await holding
    assert [await t for t in tasks].count(True) == 1


async def test_api_down_is_unknown_not_lost_until_the_lease_duration_passes(standin: KubeStandIn,
                                                                            api: k8s.ApiClient,
                                                                            caplog: pytest.LogCaptureFixture) -> None:
    """a's clock is the test's (`now`): "a lease duration without a renewal" is then a logical fact,
    whatever the machine's speed, and failed renewals are counted from the log, not waited for."""
    caplog.set_level(logging.INFO, logger="plnt.reconciler.control.kube")
    now = [0.0]

    def api_errors() -> int:
        return sum(r.getMessage().startswith("lease-api-error") for r in caplog.records)

    async def failed_renewals(more: int) -> None:
        target = api_errors() + more
        await eventually(lambda: api_errors() >= target, timeout=30)

    a = lease(api, "a", duration=2, renew=0.1, clock=lambda: now[0])
    stop = asyncio.Event()
    assert await a.acquire(stop)  # renewed at 0.0 on a's clock
    holding = asyncio.create_task(a.hold(stop))
    standin.down()
    now[0] = 1.9
    await failed_renewals(3)  # renewals fail for just under a lease duration: unknown, still ours
    assert not holding.done() and a.held
    standin.up()
    renewed = lease_spec(standin)["renewTime"]
    await eventually(lambda: lease_spec(standin)["renewTime"] != renewed, timeout=30)  # renewed at 1.9
    assert not holding.done() and a.held and lease_spec(standin)["holderIdentity"] == "a"
    standin.down()
    now[0] = 1.9 + 1.9
    await failed_renewals(3)
    assert not holding.done() and a.held  # 1.9 s since the last renewal: still ours
    now[0] = 1.9 + 2.0
    await asyncio.wait_for(holding, 30)  # a whole lease duration without a renewal: lost at the next try
    assert not a.held
    assert "lease-lost" in caplog.text and "lease-api-error" in caplog.text
    # Acquiring while the API is down waits (no exception) and succeeds once it is back.
    b = lease(api, "b", duration=2, renew=0.1)
    waiting = asyncio.create_task(b.acquire(stop))
    await asyncio.sleep(0.5)
    assert not waiting.done()
    standin.up()
    assert await asyncio.wait_for(waiting, 30)  # a's record is stale: b takes over after a lease duration
    assert TOKEN not in caplog.text


# --- --mirror-status ---------------------------------------------------------------------------------

def run_doc(name: str = "review-responder", namespace: str = "default", version: str = "1.2.0",
            traffic: int = 5) -> WorkflowRun:
    return WorkflowRun.model_validate({
        "apiVersion": "plnt.work/v1", "kind": "WorkflowRun",
        "metadata": {"name": name, "namespace": namespace, "labels": {"team": "care"}},
        "spec": {"workflow": {"ref": f"{name}@{version}", "registry": "file:registry"},
                 "backend": {"cluster": "local"}, "canary": {"trafficPercent": traffic}}})


def specs(*runs: WorkflowRun) -> SpecSet:
    return SpecSet(workflow_runs={run.key: run for run in runs})


def cr(standin: KubeStandIn, name: str = "review-responder", namespace: str = "default") -> dict[str, Any] | None:
    return standin.get("plnt.work", "workflowruns", namespace, name)


@pytest.fixture
def statuses(tmp_path: Path) -> StatusStore:
    return StatusStore(tmp_path / "status.json")


@pytest.fixture
def mirror(api: k8s.ApiClient, statuses: StatusStore) -> StatusMirror:
    mirror = StatusMirror(api, statuses, identity="plnt-test", request_timeout_s=1)
    statuses.on_change = mirror.status_changed
    return mirror


def test_mirror_applies_each_workflowrun_server_side(standin: KubeStandIn, mirror: StatusMirror) -> None:
    one, two = run_doc(), run_doc("booking-triage", "team-a", "1.0.0")
    mirror.specs_changed("c1", specs(one, two))
    assert mirror.sync_once()
    obj = cr(standin)
    assert obj is not None and obj["spec"] == cr_body(one)["spec"] and obj["metadata"]["generation"] == 1
    assert obj["metadata"]["labels"] == {"team": "care", MANAGED_BY_LABEL: "plnt"}
    assert cr(standin, "booking-triage", "team-a") is not None
    applies = [r for r in standin.requests if r.method == "PATCH"]
    assert {r.path for r in applies} == {"/apis/plnt.work/v1/namespaces/default/workflowruns/review-responder",
                                         "/apis/plnt.work/v1/namespaces/team-a/workflowruns/booking-triage"}
    assert {(r.content_type, r.query["fieldManager"], r.query.get("fieldValidation")) for r in applies} == {
        ("application/apply-patch+yaml", "plnt", "Strict")}
    # Every reconcile pass hands over the same specs: nothing is applied again.
    standin.clear()
    mirror.specs_changed("c1", specs(one, two))
    mirror.specs_changed("c2", specs(one, two))
    assert mirror.sync_once() and standin.requests == []
    # A changed spec is applied again, and the generation moves.
    mirror.specs_changed("c3", specs(run_doc(version="1.3.0"), two))
    assert mirror.sync_once()
    obj = cr(standin)
    assert obj is not None and obj["metadata"]["generation"] == 2
    assert obj["spec"]["workflow"]["ref"] == "review-responder@1.3.0"


def test_mirror_writes_status_with_conditions_and_observed_generation(standin: KubeStandIn, mirror: StatusMirror,
                                                                      statuses: StatusStore) -> None:
    v1, v2 = run_doc(), run_doc(version="1.3.0")
    mirror.specs_changed("c1", specs(v1))
    statuses.update("default", "review-responder", phase=Phase.VERIFYING, observed_commit="c1",
                    attempted_fingerprint=v1.fingerprint(), attempted_version="1.2.0", message="verifying 1.2.0")
    assert mirror.sync_once()
    obj = cr(standin)
    assert obj is not None
    status = obj["status"]
    assert status["phase"] == "Verifying" and status["observedGeneration"] == 1 and status["observedCommit"] == "c1"
    assert {c["type"]: c["status"] for c in status["conditions"]} == {"Ready": "Unknown", "Reconciling": "True",
                                                                      "Stalled": "False"}
    status_patches = [r for r in standin.requests if r.path.endswith("/status")]
    assert len(status_patches) == 1 and status_patches[0].content_type == "application/apply-patch+yaml"
    assert obj["metadata"]["generation"] == 1  # a status write does not move the generation

    statuses.update("default", "review-responder", phase=Phase.READY, version="1.2.0",
                    deployed_fingerprint=v1.fingerprint(), message="1.2.0 is serving")
    assert mirror.sync_once()
    status = cr(standin)["status"]  # type: ignore[index]
    ready = {c["type"]: c for c in status["conditions"]}
    assert ready["Ready"]["status"] == "True" and ready["Ready"]["reason"] == "Ready"
    assert ready["Ready"]["observedGeneration"] == 1 and status["version"] == "1.2.0"

    # A new spec (generation 2): until a saga attempts it, the status is still about generation 1.
    mirror.specs_changed("c2", specs(v2))
    statuses.update("default", "review-responder", observed_commit="c2")
    assert mirror.sync_once()
    obj = cr(standin)
    assert obj["metadata"]["generation"] == 2 and obj["status"]["observedGeneration"] == 1  # type: ignore[index]
    statuses.update("default", "review-responder", phase=Phase.CANARY, canary_version="1.3.0", traffic_percent=5,
                    attempted_fingerprint=v2.fingerprint(), attempted_version="1.3.0")
    assert mirror.sync_once()
    status = cr(standin)["status"]  # type: ignore[index]
    assert status["observedGeneration"] == 2 and status["canaryPercent"] == 5 and status["canaryVersion"] == "1.3.0"
    # Nothing changed: nothing written.
    standin.clear()
    statuses.update("default", "review-responder")
    assert mirror.sync_once() and standin.requests == []


def test_mirror_emits_one_event_per_phase_change(standin: KubeStandIn, mirror: StatusMirror,
                                                 statuses: StatusStore) -> None:
    run = run_doc()
    mirror.specs_changed("c1", specs(run))
    phases = [Phase.PENDING, Phase.VERIFYING, Phase.DEPLOYING, Phase.CANARY, Phase.ROLLED_BACK]
    for phase in phases:  # faster than the mirror writes: the status write coalesces, the Events do not
        statuses.update("default", "review-responder", phase=phase, message=f"now {phase.value}")
        statuses.update("default", "review-responder", message=f"still {phase.value}")  # no phase change
    assert mirror.sync_once()
    obj = cr(standin)
    assert obj is not None
    assert [e["reason"] for e in standin.events] == [p.value for p in phases]
    first, last = standin.events[0], standin.events[-1]
    assert first["involvedObject"] == {"apiVersion": "plnt.work/v1", "kind": "WorkflowRun", "name": "review-responder",
                                       "namespace": "default", "uid": obj["metadata"]["uid"],
                                       "resourceVersion": first["involvedObject"]["resourceVersion"]}
    assert first["type"] == "Normal" and last["type"] == "Warning"
    assert last["message"] == "Canary -> RolledBack: now RolledBack"
    assert first["source"] == {"component": "plnt"} and first["reportingComponent"] == "plnt"
    assert obj["status"]["phase"] == "RolledBack"
    assert {c["type"]: c["status"] for c in obj["status"]["conditions"]}["Stalled"] == "True"
    assert mirror.sync_once() and len(standin.events) == len(phases)  # none twice


def test_mirror_deletes_crs_of_workflowruns_gone_from_git_and_only_plnts(standin: KubeStandIn, mirror: StatusMirror,
                                                                        statuses: StatusStore) -> None:
    one, two = run_doc(), run_doc("booking-triage", "default", "1.0.0")
    mirror.specs_changed("c1", specs(one, two))
    statuses.update("default", "booking-triage", phase=Phase.READY)
    assert mirror.sync_once()
    # Gone from git: while plnt uninstalls it, the CR stays and shows Deleting; then it goes.
    mirror.specs_changed("c1b", specs(one))
    statuses.update("default", "booking-triage", phase=Phase.DELETING)
    assert mirror.sync_once()
    assert cr(standin, "booking-triage")["status"]["phase"] == "Deleting"  # type: ignore[index]
    statuses.remove("default", "booking-triage")
    assert mirror.sync_once()
    assert cr(standin, "booking-triage") is None
    mirror.specs_changed("c1c", specs(one, two))
    assert mirror.sync_once() and cr(standin, "booking-triage") is not None
    # Someone else's WorkflowRun in the same namespace, with another manager's label, and one with none.
    for name, labels in (("theirs", {MANAGED_BY_LABEL: "argocd"}), ("handmade", {})):
        standin.objects[("plnt.work", "workflowruns", "default", name)] = Stored(
            {"apiVersion": "plnt.work/v1", "kind": "WorkflowRun",
             "metadata": {"name": name, "namespace": "default", "labels": labels, "uid": name, "resourceVersion": "1"},
             "spec": {}})
    standin.clear()
    mirror.specs_changed("c2", specs(one))
    assert mirror.sync_once()
    assert cr(standin, "booking-triage") is None and cr(standin) is not None
    assert cr(standin, "theirs") is not None and cr(standin, "handmade") is not None
    deletes = [r for r in standin.requests if r.method == "DELETE"]
    assert [r.path for r in deletes] == ["/apis/plnt.work/v1/namespaces/default/workflowruns/booking-triage"]
    lists = [r for r in standin.requests if r.method == "GET" and r.path.endswith("/workflowruns")]
    assert lists and all(r.query["labelSelector"] == f"{MANAGED_BY_LABEL}=plnt" for r in lists)


def test_mirror_forces_its_own_fields_back_but_leaves_someone_elses_cr_alone(
        standin: KubeStandIn, mirror: StatusMirror, statuses: StatusStore, caplog: pytest.LogCaptureFixture) -> None:
    mirror.specs_changed("c1", specs(run_doc()))
    assert mirror.sync_once()
    standin.edit("plnt.work", "workflowruns", "default", "review-responder", "kubectl", "spec.canary.trafficPercent", 50)
    mirror.specs_changed("c2", specs(run_doc(traffic=10)))
    assert mirror.sync_once()
    obj = cr(standin)
    assert obj is not None and obj["spec"]["canary"]["trafficPercent"] == 10  # git wins on plnt's own CR
    applies = [r for r in standin.requests if r.method == "PATCH" and not r.path.endswith("/status")]
    assert [r.query.get("force") for r in applies[-2:]] == [None, "true"]  # forced only after the conflict

    # A WorkflowRun of the same name that plnt did not create: not overwritten, no status written.
    standin.objects[("plnt.work", "workflowruns", "team-a", "handmade")] = Stored(
        {"apiVersion": "plnt.work/v1", "kind": "WorkflowRun",
         "metadata": {"name": "handmade", "namespace": "team-a", "labels": {}, "uid": "u", "resourceVersion": "1",
                      "generation": 1}, "spec": {"canary": {"trafficPercent": 70}}},
        owners={".spec.canary.trafficPercent": ("kubectl", 70)})
    mirror.specs_changed("c3", specs(run_doc(traffic=10), run_doc("handmade", "team-a")))
    statuses.update("team-a", "handmade", phase=Phase.PENDING)
    assert not mirror.sync_once()
    assert cr(standin, "handmade", "team-a")["spec"] == {"canary": {"trafficPercent": 70}}  # type: ignore[index]
    assert "status" not in cr(standin, "handmade", "team-a")  # type: ignore[operator]
    assert "plnt does not manage" in caplog.text


async def test_mirror_survives_the_api_server_being_down_and_catches_up(
        standin: KubeStandIn, api: k8s.ApiClient, statuses: StatusStore, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="plnt.reconciler.control.kube")
    mirror = StatusMirror(api, statuses, identity="plnt-test", request_timeout_s=0.5, max_backoff_s=0.5)
    statuses.on_change = mirror.status_changed
    stop = asyncio.Event()
    task = asyncio.create_task(mirror.run(stop))
    mirror.specs_changed("c1", specs(run_doc()))
    statuses.update("default", "review-responder", phase=Phase.PENDING)
    await eventually(lambda: (cr(standin) or {}).get("status", {}).get("phase") == "Pending")

    # Every API call the mirror makes, with the thread it runs on and whether it is still in flight.
    calls: list[int] = []
    in_flight = [0]
    real_call = mirror._call

    def watched_call(*args: Any, **kwargs: Any) -> Any:
        calls.append(threading.get_ident())
        in_flight[0] += 1
        try:
            return real_call(*args, **kwargs)
        finally:
            in_flight[0] -= 1

    mirror._call = watched_call  # type: ignore[method-assign]
    standin.down()
    for phase in (Phase.VERIFYING, Phase.DEPLOYING):  # status writes never call the API: the mirror never blocks them
        statuses.update("default", "review-responder", phase=phase)
    assert threading.get_ident() not in calls, "a status write called the Kubernetes API on the caller's thread"
    passes = mirror.passes
    await eventually(lambda: mirror.passes >= passes + 2)  # it keeps trying (backoff), without raising
    assert not task.done()

    standin.up()
    statuses.update("default", "review-responder", phase=Phase.READY, version="1.2.0")
    await eventually(lambda: (cr(standin) or {}).get("status", {}).get("phase") == "Ready")
    await eventually(lambda: len(standin.events) >= 4)  # Events go out after the status write of a pass
    await asyncio.sleep(0.2)
    assert [e["reason"] for e in standin.events] == ["Pending", "Verifying", "Deploying", "Ready"]

    # An API server that accepts connections but does not answer: the event loop stays free.
    standin.hang_s = 1.5
    statuses.update("default", "review-responder", phase=Phase.DELETING)
    # The loop keeps turning while a hanging call is in flight (the calls run in threads, with timeouts):
    # an ordering, not a rate. Were a call made on the loop, no tick could happen while one is in flight.
    ticks_during_a_call = 0
    deadline = time.monotonic() + 10  # give up waiting only
    while ticks_during_a_call < 3 and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
        ticks_during_a_call += in_flight[0] > 0
    assert ticks_during_a_call >= 3, "the event loop did not run while a mirror call hung"
    assert threading.get_ident() not in calls
    standin.hang_s = 0
    await eventually(lambda: (cr(standin) or {}).get("status", {}).get("phase") == "Deleting", timeout=10)
    stop.set()
    await asyncio.wait_for(task, 5)
    assert "mirror-error" in caplog.text and TOKEN not in caplog.text


async def test_attach_status_mirror_chains_on_change_and_follows_reconciled_specs(
        standin: KubeStandIn, statuses: StatusStore, tmp_path: Path) -> None:
    calls: list[str] = []
    statuses.on_change = lambda: calls.append("routes")

    class Reconciler:
        spec_listeners: list[Any] = []

    reconciler = Reconciler()
    settings = Settings(repo=str(tmp_path), mirror_status=True, kubeconfig=standin.kubeconfig(tmp_path))
    cleanup = attach_status_mirror(settings, statuses, reconciler)
    try:
        [listener] = reconciler.spec_listeners
        listener("c1", specs(run_doc()))
        statuses.update("default", "review-responder", phase=Phase.READY, version="1.2.0")
        assert calls == ["routes"]  # what was set before still runs
        await eventually(lambda: (cr(standin) or {}).get("status", {}).get("phase") == "Ready")
    finally:
        await cleanup()


@pytest.mark.parametrize(("method", "path", "query"), [
    ("PUT", "/apis/plnt.work/v1/namespaces/default/workflowruns/x", {}),  # update: plnt only patches
    ("GET", "/api/v1/namespaces/default/secrets/x", {}),
    ("GET", "/apis/plnt.work/v1/namespaces/default/workflowruns", {"watch": "true"}),
    ("DELETE", "/apis/coordination.k8s.io/v1/namespaces/plnt/leases/x", {}),
    ("GET", "/apis/coordination.k8s.io/v1/namespaces/default/leases/x", {}),  # a Lease outside plnt's namespace
    ("PATCH", "/apis/plnt.work/v1/namespaces/default/plntbackends/x", {}),
])
def test_the_rbac_check_refuses_a_call_api_calls_does_not_list(method: str, path: str, query: dict[str, str]) -> None:
    with pytest.raises(AssertionError, match="not in plnt.reconciler.control.kube_calls.API_CALLS"):
        check_rbac([Request(method, path, query, "", None)])


async def test_server_errors_on_renewal_are_unknown_not_lost(standin: KubeStandIn, api: k8s.ApiClient) -> None:
    a = lease(api, "a", duration=2, renew=0.1)
    stop = asyncio.Event()
    assert await a.acquire(stop)
    holding = asyncio.create_task(a.hold(stop))
    standin.fail["/leases/plnt-reconciler"] = 500
    await asyncio.sleep(1.0)
    assert not holding.done() and a.held
    del standin.fail["/leases/plnt-reconciler"]
    await asyncio.sleep(0.5)
    assert not holding.done() and a.held
    stop.set()
    await holding


def test_a_refused_workflowrun_does_not_hold_up_the_others(standin: KubeStandIn, mirror: StatusMirror,
                                                           statuses: StatusStore,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    standin.fail["/workflowruns/booking-triage"] = 422  # say, a label value the API server refuses
    mirror.specs_changed("c1", specs(run_doc(), run_doc("booking-triage", "default", "1.0.0")))
    statuses.update("default", "review-responder", phase=Phase.READY)
    statuses.update("default", "booking-triage", phase=Phase.READY)
    assert not mirror.sync_once()
    assert cr(standin)["status"]["phase"] == "Ready"  # type: ignore[index]
    assert cr(standin, "booking-triage") is None
    assert "HTTP 422" in caplog.text and "CRDs installed and current" in caplog.text
    assert not mirror.sync_once()  # tried again, logged once
    assert caplog.text.count("mirror-error apply default/booking-triage") == 1
    standin.fail.clear()
    assert mirror.sync_once()
    assert cr(standin, "booking-triage")["status"]["phase"] == "Ready"  # type: ignore[index]
    assert [e["reason"] for e in standin.events] == ["Ready", "Ready"]
