"""Two `plnt reconcile` replicas elected by the REAL Lease API (`--lease kubernetes`), as separate
processes with their own state directories, beside a `plnt worker` on one real Temporal dev server and
one real git repository. The leader is SIGKILLed in the middle of a saga: the standby takes over
within the Lease's duration, the saga is not run twice, and `plnt_reconciler_leader` agrees.
Runners use the offline mock model backend, a stand-in for a model server.

Both replicas run as the chart's reconciler ServiceAccount (a TokenRequest token, the Roles `helm
template charts/plnt` renders): the audit log shows they used exactly the grants of its Lease Role
(create; get and update of that one Lease), nothing refused, nothing elsewhere."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from kubernetes import client as k8s
from temporalio.client import Client, WorkflowExecutionStatus

from tests.conftest import SpecRepo
from tests.e2e.test_split_roles import AUTH, RUN_FILE, Roles, free_port, status, wait_phase
from tests.k8s import rbac_audit
from tests.k8s.cluster import LocalCluster
from tests.k8s.test_helm_driver_on_cluster import HELM

pytestmark = [pytest.mark.k8s, pytest.mark.integration]

LEASE_NS = "plnt"
LEASE_DURATION_S = 15  # plnt's KubernetesLease default; renewals every 5 s
ACCOUNT = "plnt-reconciler"


@pytest.fixture(scope="module")
def cluster(k8s_bin_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(k8s_bin_dir, tmp_path_factory.mktemp("k8s-leader")) as cluster:
        for name in (LEASE_NS, "plnt-runners"):  # plnt's namespace; the chart's default deploy namespace
            k8s.CoreV1Api(cluster.api_client()).create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=name)))
        rbac_audit.apply_chart_rbac(cluster, HELM, LEASE_NS)  # the release plnt: its Lease is plnt-reconciler
        yield cluster


@pytest.fixture(scope="module")
def reconciler_kubeconfig(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return rbac_audit.token_kubeconfig(cluster, LEASE_NS, ACCOUNT, tmp_path_factory.mktemp("leader") / "kubeconfig")


@pytest.fixture
def roles(tmp_path: Path, spec_repo: SpecRepo, temporal_address: str, temporal_namespace: str) -> Iterator[Roles]:
    roles = Roles(tmp_path, spec_repo, temporal_address, temporal_namespace)
    try:
        yield roles
    finally:
        roles.stop_all()


def replica(roles: Roles, kubeconfig: Path, name: str, port: int, *, wait_active: bool):  # type: ignore[no-untyped-def]
    args = ["reconcile", "--repo", str(roles.repo.path), "--state-dir", str(roles.tmp / name), "--port", str(port),
            "--interval", "1", "--internal-token-file", str(roles.token_file), "--retry-initial-s", "0.2",
            "--tokens-file", str(roles.tokens), "--lease", "kubernetes", "--kubeconfig", str(kubeconfig),
            "--lease-namespace", LEASE_NS, "--identity", name, *roles.temporal]
    return roles._start(name, args, f"http://127.0.0.1:{port}/{'readyz' if wait_active else 'healthz'}")


async def leader_gauge(client: httpx.AsyncClient, url: str) -> float | None:
    try:
        text = (await client.get(f"{url}/metrics", headers=AUTH)).text
    except httpx.HTTPError:
        return None
    for line in text.splitlines():
        if line.startswith("plnt_reconciler_leader"):
            return float(line.split()[-1])
    return None


async def test_the_standby_takes_over_from_a_killed_leader_mid_saga_without_running_it_twice(
        cluster: LocalCluster, reconciler_kubeconfig: Path, roles: Roles, temporal_address: str,
        temporal_namespace: str) -> None:
    leader = replica(roles, reconciler_kubeconfig, "replica-a", roles.control_port, wait_active=True)
    standby_port = free_port()
    standby_url = f"http://127.0.0.1:{standby_port}"
    replica(roles, reconciler_kubeconfig, "replica-b", standby_port, wait_active=False)
    roles.worker()
    coordination = k8s.CoordinationV1Api(cluster.api_client())
    assert coordination.read_namespaced_lease("plnt-reconciler", LEASE_NS).spec.holder_identity == "replica-a"
    async with httpx.AsyncClient(timeout=10) as client:
        await wait_phase(client, roles.control_url, "Ready", "1.2.0")
        assert await leader_gauge(client, roles.control_url) == 1.0
        assert await leader_gauge(client, standby_url) == 0.0

        roles.repo.replace(RUN_FILE, "review-responder@1.2.0", "review-responder@1.3.0")
        roles.repo.commit("review-responder 1.3.0")
        await wait_phase(client, roles.control_url, "Canary", "1.3.0")  # mid-saga: its canary is being judged
        leader.proc.kill()  # SIGKILL: no release of the Lease
        killed = time.monotonic()
        while (await client.get(f"{standby_url}/readyz")).status_code != 200:
            assert time.monotonic() - killed < LEASE_DURATION_S + 15, "the standby did not take over"
            await asyncio.sleep(0.2)
        took_over_s = time.monotonic() - killed
        lease = coordination.read_namespaced_lease("plnt-reconciler", LEASE_NS).spec
        assert (lease.holder_identity, lease.lease_transitions) == ("replica-b", 1)
        assert await leader_gauge(client, standby_url) == 1.0
        row = await wait_phase(client, standby_url, "Ready", "1.3.0", timeout=120)
        assert row["version"] == "1.3.0", row
        assert (await status(client, standby_url)) is not None
    print(f"standby took over {took_over_s:.1f} s after the leader's SIGKILL (Lease duration {LEASE_DURATION_S} s)")
    # The Lease was not released: the standby waited until it expired, not for a clean hand-over.
    assert took_over_s >= LEASE_DURATION_S - 5 - 1  # a renewal may have landed up to 5 s before the kill

    temporal = await Client.connect(temporal_address, namespace=temporal_namespace)
    deadline = time.monotonic() + 20
    while True:  # Temporal's visibility store catches up with the histories shortly after
        executions = [e async for e in temporal.list_workflows('WorkflowId = "plnt-default-review-responder"')]
        if len(executions) >= 2 and all(e.status is not WorkflowExecutionStatus.RUNNING for e in executions) \
                or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.5)
    # One saga per version (1.2.0, 1.3.0): the standby followed the running saga instead of starting another.
    assert sorted(e.status for e in executions) == [WorkflowExecutionStatus.COMPLETED] * 2, executions

    # The chart's reconciler account did all of it with its Lease Role, every grant of it used.
    roles.stop_all()
    calls = rbac_audit.calls(cluster, rbac_audit.user(LEASE_NS, ACCOUNT))
    assert {c.namespace for c in calls} == {LEASE_NS} and {c.name for c in calls} == {"plnt-reconciler"}
    lease = rbac_audit.usage(cluster, LEASE_NS, ACCOUNT, only={LEASE_NS})
    assert not lease.refused and not lease.ungranted, (lease.refused, lease.ungranted)
    print(f"reconciler in {LEASE_NS} (Lease Role): {lease.figure()}")
    assert lease.used == lease.grants, f"granted and not used: {sorted(lease.unused)}"
    assert not rbac_audit.can(cluster, LEASE_NS, ACCOUNT, "update", "leases", LEASE_NS, "coordination.k8s.io",
                              name="someone-elses")
    assert not rbac_audit.can(cluster, LEASE_NS, ACCOUNT, "delete", "leases", LEASE_NS, "coordination.k8s.io",
                              name="plnt-reconciler")
