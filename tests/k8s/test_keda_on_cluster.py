"""Replicas follow the in-flight signal on Kubernetes through KEDA, with real parts: `plnt up` deploys
review-responder through the workflow-runner chart onto a PlntBackend with `kubernetes.autoscaler:
{kind: keda, prometheusAddress}`; the chart's ScaledObject is acted on by KEDA's real operator and
metrics adapter (built from its Go module by tools/build_keda.sh), which query a real Prometheus
scraping the runner pods' `GET /metrics`; the real kube-controller-manager's HPA controller (sync
every 2 s) reads the external metric through the API server's aggregation layer and scales the
Deployment.

Shown: at rest the release runs replicas.min; clients keeping invocations in flight through plnt's
gateway raise the Deployment above it (to replicas.max), and the HPA KEDA made reports the summed
in-flight value; a promotion (a helm upgrade of the same Deployment, 1.2.0 -> 1.3.0) under that load
keeps the count and fails no invocation; when the load ends the count comes back to replicas.min, one pod per
scaleDownAfterSeconds.

STAND-IN: no container runs here. tests/k8s/node_standin.py runs each pod's init container and runner
as processes on the pod's IP (see tests/k8s/test_commit_through_helm.py); KEDA and Prometheus run as
processes beside the cluster (tests/k8s/keda_stack.py) with the admin's credentials, Prometheus's
targets listed from the API server's pods by the test (Debian's prometheus has no kubernetes_sd). The
runners' model is MockBackend, run with `--token-delay` (a wrapper of the `python` the pod's command names) so
an invocation stays in flight for about a second.
"""

from __future__ import annotations

import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.utils import parse_quantity

from tests.conftest import SpecRepo
from tests.k8s.cluster import FakeNode, wait_for
from tests.k8s.keda_stack import running_prometheus, start_keda
from tests.k8s.pod_network import PodNetwork
from tests.k8s.sites import ClusterSite, all_cidrs, cluster_site, site_ranges
from tests.k8s.test_commit_through_helm import RUN_FILE, Watch, plnt_up
from tests.k8s.test_pool_through_plnt_up import SteadyLoad

pytestmark = [pytest.mark.k8s, pytest.mark.integration]

RELEASE = "review-responder"
TOKEN_DELAY_S = 0.05  # MockBackend's delay per token: an invocation of review-responder takes about a second
CLIENTS = 8  # invocations kept in flight; targetInFlight 2 asks for 4 pods, replicas.max caps at 3
SCALED = {"min": 1, "max": 3}
SCALE_DOWN_AFTER_S = 15  # longer than the dip in the summed series while a rollout replaces pods


@pytest.fixture(scope="module")
def keda_site(k8s_bin_dir: Path, keda_bin_dir: Path, tmp_path_factory: pytest.TempPathFactory
              ) -> Iterator[tuple[ClusterSite, str]]:
    """One cluster (HPA sync every 2 s) with KEDA and Prometheus, its pods run by the node stand-in;
    review-responder 1.2.0 and 1.3.0 in its registry. Yields the site and Prometheus's URL."""
    work = tmp_path_factory.mktemp("k8s-keda")
    slow_python = work / "slow-python"
    slow_python.write_text(f"#!/bin/sh\nexec {sys.executable} \"$@\" --token-delay {TOKEN_DELAY_S}\n")
    slow_python.chmod(0o755)
    ranges = [site_ranges(0)]
    with PodNetwork(cidrs=all_cidrs(ranges)) as net, net.entered(), \
            cluster_site(net, k8s_bin_dir, work / "site", ranges[0], nodes=(FakeNode("node-a"), FakeNode("node-b")),
                         programs={"python": str(slow_python)}, hpa_sync_period="2s") as site:
        start_keda(site.cluster, keda_bin_dir, work / "keda")
        with running_prometheus(site.cluster, work / "prometheus") as prometheus:
            site.publish("review-responder", ("1.2.0", "1.3.0"))
            yield site, prometheus


def keda_specs(repo: SpecRepo, site: ClusterSite, ns: str, prometheus: str) -> None:
    """review-responder on the cluster, autoscaled on in-flight invocations, its backend scaling through KEDA."""
    repo.write("backends/cluster.yaml", site.backend_yaml("test-cluster", ns) +
               f"    autoscaler: {{kind: keda, prometheusAddress: \"{prometheus}\"}}\n")
    repo.replace(RUN_FILE, "registry: file:registry", f"registry: oci://{site.registry.address}/recipes")
    repo.replace(RUN_FILE, "cluster: local", "cluster: test-cluster")
    repo.replace(RUN_FILE, "replicas: {min: 1, max: 1}",
                 f"replicas: {{min: {SCALED['min']}, max: {SCALED['max']}}}\n"
                 f"  autoscaling: {{targetInFlight: 2, scaleDownAfterSeconds: {SCALE_DOWN_AFTER_S}}}")
    repo.replace(RUN_FILE, "p95BudgetMs: 2500", "p95BudgetMs: 20000")  # slow on purpose (TOKEN_DELAY_S)
    repo.commit("review-responder on the test cluster, scaled by KEDA on in-flight invocations")


class ReplicaLog(threading.Thread):
    """The Deployment's spec.replicas every 0.5 s, with the time: what the HPA set, and what a helm
    upgrade did to it."""

    def __init__(self, site: ClusterSite, ns: str) -> None:
        super().__init__(name="replica-log", daemon=True)
        self.apps = k8s.AppsV1Api(site.api())
        self.ns = ns
        self.seen: list[tuple[float, int | None]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self.seen.append((time.monotonic(), self.apps.read_namespaced_deployment(RELEASE, self.ns).spec.replicas))
            except k8s.ApiException:
                pass
            self.stop.wait(0.5)

    def since(self, t0: float) -> list[int | None]:
        return [replicas for t, replicas in self.seen if t >= t0]


def hpa_in_flight(scaling: Any, ns: str) -> float | None:
    """What the HPA KEDA made last read of its external metric (KEDA's query, the in-flight invocations
    summed over the release's pods), as the per-pod average it compares with targetInFlight."""
    hpa = scaling.read_namespaced_horizontal_pod_autoscaler(RELEASE, ns)
    for metric in hpa.status.current_metrics or []:
        if metric.type == "External" and metric.external.current.average_value is not None:
            return float(parse_quantity(metric.external.current.average_value))
    return None


def test_keda_scales_the_runner_deployment_on_in_flight_invocations_and_a_promotion_keeps_the_count(
    keda_site: tuple[ClusterSite, str], spec_repo: SpecRepo, tmp_path: Path
) -> None:
    site, prometheus = keda_site
    ns = f"agents-{uuid.uuid4().hex[:6]}"
    with site.net.entered():
        site.create_namespace(ns)
        keda_specs(spec_repo, site, ns, prometheus)
        up = plnt_up(site, spec_repo, tmp_path, site.registry.address)
        replica_log = ReplicaLog(site, ns)
        try:
            watch = Watch(up)
            watch.until("Ready at 1.2.0", lambda r: r["phase"] == "Ready" and r["version"] == "1.2.0", timeout=240)
            apps, scaling = k8s.AppsV1Api(site.api()), k8s.AutoscalingV2Api(site.api())
            custom = k8s.CustomObjectsApi(site.api())
            scaled = custom.get_namespaced_custom_object("keda.sh", "v1alpha1", ns, "scaledobjects", RELEASE)
            assert scaled["spec"]["triggers"][0]["metadata"]["serverAddress"] == prometheus
            # KEDA made the HPA (named after the release), on its external metric, and it reads a value.
            hpa = wait_for("KEDA's HPA", lambda: scaling.read_namespaced_horizontal_pod_autoscaler(RELEASE, ns), timeout=60)
            assert hpa.metadata.owner_references[0].kind == "ScaledObject", hpa.metadata.owner_references
            assert (hpa.spec.min_replicas, hpa.spec.max_replicas) == (SCALED["min"], SCALED["max"])
            assert hpa.spec.metrics[0].type == "External", hpa.spec.metrics
            wait_for("the HPA reading the in-flight metric at rest", lambda: hpa_in_flight(scaling, ns) is not None,
                     timeout=60)
            assert apps.read_namespaced_deployment(RELEASE, ns).spec.replicas == SCALED["min"]
            replica_log.start()

            loaded_at = time.monotonic()
            with SteadyLoad(site, up, clients=CLIENTS) as load:
                wait_for(f"the Deployment scaled to {SCALED['max']} on {CLIENTS} invocations in flight",
                         lambda: apps.read_namespaced_deployment(RELEASE, ns).spec.replicas == SCALED["max"], timeout=120)
                scaled_up_s = time.monotonic() - loaded_at
                reading = hpa_in_flight(scaling, ns)
                assert reading is not None and reading >= 2, reading  # per pod, above targetInFlight 2 at the rise
                wait_for(f"{SCALED['max']} pods Available",
                         lambda: (apps.read_namespaced_deployment(RELEASE, ns).status.available_replicas or 0)
                         == SCALED["max"], timeout=120)

                # New pods joining the Service under load fail no invocation.
                promoted_from = time.monotonic()
                assert not load.failed(0, promoted_from), load.failed(0, promoted_from)[:5]

                # A promotion under the load: the stable release upgraded to 1.3.0 (the same Deployment).
                spec_repo.replace(RUN_FILE, "review-responder@1.2.0", "review-responder@1.3.0")
                spec_repo.commit("bump review-responder to 1.3.0")
                watch.until("Ready at 1.3.0", lambda r: r["phase"] == "Ready" and r["version"] == "1.3.0", timeout=300)
                counts = replica_log.since(promoted_from)
                assert counts and min(c or 0 for c in counts) == SCALED["max"], counts  # never dropped to the floor
                deployment = apps.read_namespaced_deployment(RELEASE, ns)
                assert deployment.spec.replicas == SCALED["max"]
                assert deployment.spec.template.metadata.labels["app.kubernetes.io/version"] == "1.3.0"
                # The rollout replaces 3 pods under load and fails no invocation: each stopped runner drains
                # its kept-alive connections (the chart's runner.drainOnStopSeconds). (Before, 2 to 4 of some
                # 250 failed: 502 "runner closed the connection mid-response".)
                print(f"invocations served {load.served}, failed during the promotion's rollout "
                      f"{len(load.failed(promoted_from))}: {load.failed(promoted_from)[:3]}")
                assert not load.failed(promoted_from), load.failed(promoted_from)[:5]

            # The load gone: one pod fewer per scaleDownAfterSeconds, down to the floor.
            unloaded_at = time.monotonic()
            wait_for(f"back to replicas.min ({SCALED['min']})",
                     lambda: apps.read_namespaced_deployment(RELEASE, ns).spec.replicas == SCALED["min"], timeout=120)
            print(f"{SCALED['min']} -> {SCALED['max']} replicas {scaled_up_s:.1f} s after the load began (HPA read "
                  f"{reading:g} in flight per pod); back to {SCALED['min']} {time.monotonic() - unloaded_at:.1f} s after it ended")
        finally:
            replica_log.stop.set()
            up.kill()
