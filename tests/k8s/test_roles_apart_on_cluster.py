"""The roles apart on a Kubernetes backend, as a platform team runs them: `plnt reconcile`, `plnt worker`
and `plnt gateway` as separate processes (here on one machine, in the pod network) with a Temporal dev
server of their own, review-responder on a PlntBackend of type kubernetes (real API server, real helm).

The saga's promotion and rollback run in the worker, which uninstalls the canary's Helm release. The
routes are the control plane's, built from its own reads of the cluster, so before the uninstall the
worker asks it to take the release out of the routes and waits until every `plnt gateway` let go of it
(POST /internal/drain with `leaving`). Shown under a steady load through the gateway, the canary given
half the traffic: a promotion (1.2.0 -> 1.3.0) and a rollback (1.4.0, a step that errors) with no
failed request and no retry (a request the gateway sent to the canary's Service after its pods went
fails before its first byte and is retried on stable: plnt_gateway_retries_total counts it; without the
drain such retries are what the gateway's metrics show), and both logs name the canary that left.
The same on a pool of two clusters (one replica on each, the canary on the first): the worker's
promotion upgrades both backends' stable releases, then the canary leaves as above; then west is
lowered to no capacity and the reconciler re-places its replica (east's release upgraded to two pods,
west's drained from the gateways and uninstalled), still with no failed request.

STAND-IN: no container runs here; tests/k8s/node_standin.py runs each pod's init container and runner
as processes (see tests/k8s/test_commit_through_helm.py). The runners' model is MockBackend.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest
from plnt.reconciler.saga.temporal_server import dev_server_args, free_port, temporal_binary

from tests.conftest import PYTHON, SpecRepo
from tests.e2e.harness import REVIEW
from tests.e2e.test_split_roles import AUTH, RUN_FILE, Roles
from tests.k8s.cluster import wait_for
from tests.k8s.sites import HELM, ClusterSite
from tests.k8s.test_commit_through_helm import VENV_BIN, kubernetes_specs
from tests.k8s.test_commit_through_helm import ns as ns  # noqa: F401 (fixtures)
from tests.k8s.test_commit_through_helm import sites as sites  # noqa: F401
from tests.k8s.test_pool_through_plnt_up import deployments, pool_specs, releases
from tests.services import _Process

pytestmark = [pytest.mark.k8s, pytest.mark.integration]


class RolesInPodNetwork(Roles):
    """The role processes of tests/e2e/test_split_roles.py, started in the pod network (the Services'
    names in their /etc/hosts), helm on their PATH; the worker trusts the test registry over HTTP."""

    def __init__(self, site: ClusterSite, tmp_path: Path, repo: SpecRepo, temporal_address: str) -> None:
        super().__init__(tmp_path, repo, temporal_address, "default")
        self.prefix = [*site.net.exec_prefix(), "env", f"PATH={VENV_BIN}:{Path(HELM).parent}:/usr/bin:/bin"]
        self.registry = site.registry.address

    def _start(self, name: str, args: list[str], ready: str) -> _Process:
        if args[0] == "worker":
            args = [*args, "--oci-insecure-host", self.registry]
        process = _Process([*self.prefix, PYTHON, "-m", "plnt.reconciler.cli.main", *args], self.tmp / f"{name}.log")
        self.processes.append(process)
        process.wait_ready(ready, ok=(200,), timeout_s=120)
        return process

    def logs(self) -> str:
        return "\n".join(f"--- {p.log.name} ---\n{p.tail()}" for p in self.processes)


class Load:
    """Clients invoking review-responder through one gateway until stopped; every answer's status kept."""

    def __init__(self, gateway: str, clients: int = 3) -> None:
        self.gateway = gateway
        self.statuses: Counter[int] = Counter()
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(clients)]

    def _run(self) -> None:
        with httpx.Client(timeout=30, trust_env=False) as client:
            while not self._stop.is_set():
                try:
                    answer = client.post(f"{self.gateway}/workflows/review-responder/invoke", json=REVIEW, headers=AUTH)
                except httpx.HTTPError as exc:
                    self.failures.append(f"{time.strftime('%H:%M:%S')} {exc!r}")
                    continue
                self.statuses[answer.status_code] += 1
                if answer.status_code != 200:
                    self.failures.append(f"{time.strftime('%H:%M:%S')} {answer.status_code} {answer.text[:200]}")

    def __enter__(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=40)


def row(roles: Roles) -> dict | None:
    try:
        answer = httpx.get(f"{roles.control_url}/workflows", headers=AUTH, timeout=5, trust_env=False)
    except httpx.HTTPError:
        return None
    rows = [r for r in answer.json() if r["name"] == "review-responder"] if answer.status_code == 200 else []
    return rows[0] if rows else None


def until(roles: RolesInPodNetwork, what: str, done: object, timeout: float = 240) -> dict:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = row(roles)
        if last is not None and done(last):  # type: ignore[operator]
            return last
        time.sleep(0.2)
    raise AssertionError(f"review-responder not {what} within {timeout:.0f}s; last row {last}\n{roles.logs()}")


@pytest.mark.parametrize("where", ["one-backend", "pool"])
def test_a_workers_promotion_and_rollback_on_kubernetes_drain_the_canary_before_its_uninstall(
    sites: tuple[ClusterSite, ClusterSite], ns: str, spec_repo: SpecRepo, tmp_path: Path, where: str  # noqa: F811
) -> None:
    """`pool`: review-responder on a pool of the two clusters (a replica on each), its canary on east;
    the worker's promotion upgrades both backends' stable releases before the canary leaves."""
    site = sites[0]
    placed = sites if where == "pool" else (site,)
    if where == "pool":
        pool_specs(spec_repo, *sites, ns)
    else:
        kubernetes_specs(spec_repo, site, ns)
    spec_repo.replace(RUN_FILE, "trafficPercent: 5", "trafficPercent: 50")
    spec_repo.commit("the canary gets half the traffic")
    with site.net.entered():
        temporal_port = free_port()
        temporal = _Process([temporal_binary(), *dev_server_args(None, temporal_port, free_port(), free_port())],
                            tmp_path / "temporal.log")
        roles = RolesInPodNetwork(site, tmp_path, spec_repo, f"127.0.0.1:{temporal_port}")
        try:
            wait_for("Temporal's gRPC port", lambda: _listening(temporal_port), timeout=60)
            roles.reconciler()
            roles.worker()
            gateway = roles.gateway("gateway")
            until(roles, "Ready at 1.2.0", lambda r: r["phase"] == "Ready" and r["version"] == "1.2.0")
            with Load(gateway) as load:
                wait_for("answers through the gateway", lambda: load.statuses[200] >= 5, timeout=60)
                spec_repo.replace(RUN_FILE, "review-responder@1.2.0", "review-responder@1.3.0")
                spec_repo.commit("bump review-responder to 1.3.0")
                until(roles, "Ready at 1.3.0", lambda r: r["phase"] == "Ready" and r["version"] == "1.3.0")
                for each in placed:
                    wait_for(f"only the stable release on {each.domain}",
                             lambda s=each: {r["name"] for r in s.helm(ns, "list")} == {"review-responder"})
                    assert str(each.helm(ns, "get", "values", "review-responder")["workflow"]["version"]) == "1.3.0"
                promoted_at = sum(load.statuses.values())
                spec_repo.replace(RUN_FILE, "review-responder@1.3.0", "review-responder@1.4.0")
                spec_repo.commit("try 1.4.0")
                rolled = until(roles, "RolledBack", lambda r: r["phase"] == "RolledBack")
                assert rolled["version"] == "1.3.0", rolled
                wait_for("more answers after the rollback",
                         lambda: sum(load.statuses.values()) > promoted_at + 20, timeout=60)
                if where == "pool":
                    moved = west_full_moves_its_replica_to_east(spec_repo, sites, ns, roles, load)
                    assert moved["sagaId"] == rolled["sagaId"], ("the re-placement runs no saga", moved, rolled)
            # The bad canary's own answers are its error (the smoke test's verdict comes from those too);
            # anything else (a 502 or 503, a dropped connection) is a request the roles lost.
            lost = [f for f in load.failures if "moderation policy not loaded" not in f]
            (tmp_path / "lost.txt").write_text("\n".join(lost))
            assert lost == [], (len(lost), lost[:10], roles.logs())
            assert set(load.statuses) <= {200, 500} and load.statuses[200] > 40, load.statuses
            metrics = httpx.get(f"{gateway}/metrics", headers=AUTH, timeout=10, trust_env=False).text
            retried = [line for line in metrics.splitlines() if line.startswith("plnt_gateway_retries_total{")]
            assert retried == [], (retried, roles.logs())
            logs = {p.log.name: p.log.read_text(errors="replace") for p in roles.processes}
            # Each canary that left (1.2.0's first install, 1.3.0 promoted, 1.4.0 rolled back): taken out of
            # the routes by the control plane at the worker's request, and drained before its uninstall.
            # (1.4.0 fails its smoke test within about a second of its install, often before the control
            # plane's next read: the worker's request names the release, kept out of reads under way.)
            left = [line for line in logs["reconciler.log"].splitlines() if "release-leaving" in line]
            assert [version_in(line) for line in left] == ["1.2.0", "1.3.0", "1.4.0"], left
            assert all("review-responder-canary." in line for line in left), left
            drained = [line for line in logs["worker.log"].splitlines() if "runner-drained" in line]
            assert [version_in(line) for line in drained] == ["1.2.0", "1.3.0", "1.4.0"], drained
            if where == "pool":  # west's stable, drained by the reconciler (which re-places a Kubernetes pool)
                west_left = [line for line in logs["reconciler.log"].splitlines() if "release-drained" in line]
                assert [version_in(line) for line in west_left] == ["1.3.0"], west_left
                assert f"endpoint=http://review-responder.{ns}.svc.{sites[1].domain}" in west_left[0], west_left
        finally:
            roles.stop_all()
            temporal.stop()


def west_full_moves_its_replica_to_east(spec_repo: SpecRepo, sites: tuple[ClusterSite, ClusterSite], ns: str,
                                        roles: RolesInPodNetwork, load: Load) -> dict:
    """Back to 1.3.0 in git (in sync: no saga), then west lowered to no capacity: the reconciler
    re-places west's replica on east itself (a Kubernetes pool's scale runs where the plan is made: a
    helm upgrade of east's release to 2 replicas, then west's release out of the routes, drained from
    every `plnt gateway` and uninstalled) while the load goes on. Returns the row after."""
    east, west = sites
    spec_repo.replace(RUN_FILE, "review-responder@1.4.0", "review-responder@1.3.0")
    spec_repo.commit("back to 1.3.0")
    spec_repo.replace("backends/west.yaml", "capacity: {replicas: 2}", "capacity: {replicas: 0}")
    spec_repo.commit("west is full")
    wait_for("east at 2 pods", lambda: deployments(east, ns) == {"review-responder": (2, 2)}, timeout=180)
    wait_for("west's release uninstalled", lambda: releases(west, ns) == set(), timeout=120)
    assert str(east.helm(ns, "get", "values", "review-responder")["workflow"]["version"]) == "1.3.0"
    moved = until(roles, "at the move's commit", lambda r: r["observedCommit"] == spec_repo.git("rev-parse", "HEAD"))
    assert moved["phase"] == "Ready" and moved["version"] == "1.3.0" and moved["canaryVersion"] is None, moved
    served = sum(load.statuses.values())
    wait_for("more answers after the move", lambda: sum(load.statuses.values()) > served + 20, timeout=60)
    return moved


def version_in(line: str) -> str:
    """The version of the release a log line names (release=NAMESPACE.NAME.VERSION.FINGERPRINT)."""
    release = line.split("release=", 1)[1].split()[0]
    return release.split(".", 2)[2].rsplit(".", 1)[0]


def _listening(port: int) -> bool:
    import socket

    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0
