"""HelmDriver command lines, output parsing, error mapping and recovery, against a FAKE helm.

`FakeHelm` replaces `run_helm`: it records every argv (and the values file the driver wrote) and
answers with canned outputs shaped as helm 4.1 prints them (`status -o json` is the release record
without the chart, `list -o json` prints revision as a string, `history -o json` an int, `get
values -o json` prints `null` for a release without values; errors are one `Error: ...` line on
stderr, exit code 1). The error texts are helm's own strings (checked against the helm 4.1.4 binary);
the schema/template errors are also produced by the real binary in test_helm_chart.py. Nothing here
talks to a Kubernetes API server: there is none on these machines. The driver's clock is a fixed
`NOW` (a stand-in clock). test_run_helm_runs_the_real_binary is the exception: the real helm.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from plnt.core.specs.loader import SourceFile, load_sources
from plnt.core.specs.models import PlntBackend, RecipeTrustPolicy, WorkflowRun
from plnt.reconciler.drivers.helm import (
    DEFAULT_CHART,
    UNAVAILABLE_POLL_S,
    HelmChartError,
    HelmConfigError,
    HelmDriver,
    RunnerImage,
    SpecCache,
    parse_history,
    parse_list,
    parse_status,
    parse_time,
    parse_values,
    release_name,
    render_values,
    run_helm,
)
from plnt.reconciler.drivers.protocol import InstallRequest, RecipeTrust
from plnt.reconciler.errors import ClusterUnavailable, DriverError, InvalidSpec, NeedsHuman, UnknownBackend
from plnt.reconciler.recipes.registries import RegistryOptions

NOW = datetime(2025, 11, 29, 22, 0, 0, tzinfo=UTC)
LONG_AGO = "2025-11-29T21:40:02.118372913Z"   # 20 minutes before NOW: a dead helm's pending release
JUST_NOW = "2025-11-29T21:59:30.004812345Z"   # 30 s before NOW: maybe a live operation
TARGET = ["--namespace", "agents", "--kube-context", "prod", "--kubeconfig", "/etc/plnt/kubeconfig"]
IMAGE = RunnerImage(repository="ghcr.io/acme/plnt", tag="0.1.0")

BACKEND = PlntBackend.model_validate({
    "apiVersion": "plnt.work/v1", "kind": "PlntBackend", "metadata": {"name": "gpu-cluster-01"},
    "spec": {"type": "kubernetes", "gpuClasses": ["nvidia.com/h100"],
             "kubernetes": {"context": "prod", "namespace": "agents", "kubeconfig": "/etc/plnt/kubeconfig"}},
})


def run(name: str = "review-responder", namespace: str = "team-a", version: str = "1.2.0", **spec: Any) -> WorkflowRun:
    return WorkflowRun.model_validate({
        "apiVersion": "plnt.work/v1", "kind": "WorkflowRun", "metadata": {"name": name, "namespace": namespace},
        "spec": {"workflow": {"ref": f"{name}@{version}", "registry": "s3://microagents"},
                 "backend": {"cluster": "gpu-cluster-01", "gpuClass": "nvidia.com/h100", "gpuCount": 1},
                 "replicas": {"min": 1, "max": 4}, "autoscaling": {"targetInvocationsPerSecond": 25}, **spec},
    })


RUN = run()
RUN_OLD = run(version="1.1.0")
# What the saga verified the recipe with (read from its commit by install_release).
POLICY = RecipeTrustPolicy.model_validate({
    "apiVersion": "plnt.work/v1", "kind": "RecipeTrustPolicy", "metadata": {"name": "release-signers"},
    "spec": {"recipes": ["review-responder"], "trustRoot": {"trustedRootFile": "trust/root.json"},
             "signers": [{"issuer": "https://issuer.example", "identity": "release@acme.example"}]},
})
TRUST = RecipeTrust(policies=(POLICY,), trusted_roots={"trust/root.json": '{"r": 1}'})


def request(workflow: WorkflowRun = RUN, track: str = "canary") -> InstallRequest:
    return InstallRequest(namespace=workflow.metadata.namespace, name=workflow.metadata.name, track=track,
                          version=workflow.spec.workflow.version, spec_fingerprint=workflow.fingerprint(),
                          recipe_digest="sha256:" + "9a" * 32, recipe_dir="/var/lib/plnt/recipes/9a",
                          traffic_percent=5 if track == "canary" else 0, trust=TRUST)


def values(workflow: WorkflowRun = RUN, track: str = "canary") -> dict[str, Any]:
    return render_values(request(workflow, track), workflow.spec, BACKEND, IMAGE)


# --- canned helm outputs ---------------------------------------------------------------------


def status_json(name: str, status: str, revision: int, config: dict[str, Any] | None,
                last_deployed: str = LONG_AGO, description: str = "Upgrade complete") -> str:
    """`helm status NAME -o json` as helm 4 prints it: the release record, chart stripped."""
    record: dict[str, Any] = {
        "name": name,
        "info": {"first_deployed": "2025-11-28T09:12:44.901233117Z", "last_deployed": last_deployed,
                 "description": description, "status": status,
                 "notes": f"In the cluster: http://{name}.agents.svc.cluster.local\n"},
        "manifest": "---\n# Source: workflow-runner/templates/configmap.yaml\napiVersion: v1\nkind: ConfigMap\n...",
        "version": revision,
        "namespace": "agents",
        "apply_method": "ssa",
    }
    if config is not None:
        record["config"] = config  # omitted when a release has no user-supplied values
    return json.dumps(record, separators=(",", ":")) + "\n"


def list_json(*entries: tuple[str, int, str, str]) -> str:
    """`helm list -o json`: revision is a string, updated is Go's time.String()."""
    return json.dumps([
        {"name": name, "namespace": "agents", "revision": str(revision),
         "updated": "2025-11-29 21:40:02.118372913 +0000 UTC", "status": status, "chart": chart, "app_version": "0.1.0"}
        for name, revision, status, chart in entries
    ], separators=(",", ":")) + "\n"


def history_json(*revisions: tuple[int, str, str]) -> str:
    """`helm history NAME -o json`: oldest first, revision an int."""
    return json.dumps([
        {"revision": revision, "updated": "2025-11-29T21:40:02.118372913Z", "status": status,
         "chart": "workflow-runner-0.1.0", "app_version": "0.1.0", "description": description}
        for revision, status, description in revisions
    ], separators=(",", ":")) + "\n"


NOT_FOUND = "Error: release: not found\n"
UNINSTALL_NOT_FOUND = "Error: uninstall: Release not loaded: review-responder-canary: release: not found\n"
IN_PROGRESS = "Error: UPGRADE FAILED: another operation (install/upgrade/rollback) is in progress\n"
UNREACHABLE = ('Error: kubernetes cluster unreachable: Get "https://10.0.0.1:6443/version": dial tcp 10.0.0.1:6443: '
               "connect: connection refused\n")
NO_CONTEXT = 'Error: kubernetes cluster unreachable: context "prod" does not exist\n'
ETCD_AWAY = "Error: UPGRADE FAILED: etcdserver: request timed out\n"
NO_KUBECONFIG = "Error: kubernetes cluster unreachable: stat /etc/plnt/kubeconfig: no such file or directory\n"
SCHEMA = ("Error: values don't meet the specifications of the schema(s) in the following chart(s):\n"
          "workflow-runner:\n- at '/gpu/count': got string, want integer\n")
TEMPLATE = ("Error: UPGRADE FAILED: execution error at (workflow-runner/templates/deployment.yaml:1:4): "
            "replicas.max (1) must be >= replicas.min (3)\n")
HELM4_TEMPLATE = ('Error: UPGRADE FAILED: workflow-runner/templates/deployment.yaml:3:12\n'
                  '  executing "workflow-runner/templates/deployment.yaml" at <.Values.resources.limits>:\n'
                  "    nil pointer evaluating interface {}.limits\n")
WAIT_TIMEOUT = ("Error: UPGRADE FAILED: resource Deployment/agents/review-responder-canary not ready. status: InProgress, "
                "message: Deployment does not have minimum availability.\ncontext deadline exceeded\n")
FORBIDDEN = ('Error: UPGRADE FAILED: deployments.apps "review-responder-canary" is forbidden: User '
             '"system:serviceaccount:plnt:plnt" cannot patch resource "deployments" in API group "apps" in the '
             'namespace "agents"\n')
OWNED = ('Error: Unable to continue with install: Service "review-responder-canary" in namespace "agents" exists and '
         "cannot be imported into the current release: invalid ownership metadata; label validation error: missing key "
         '"app.kubernetes.io/managed-by": must be set to "Helm"\n')
THROTTLED = "Error: UPGRADE FAILED: the server has received too many requests and has asked us to try again later\n"


class FakeHelm:
    """A FAKE helm for command-line and parsing tests: scripted answers, every argv recorded."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.values_files: list[dict[str, Any]] = []
        self.values_paths: list[str] = []
        self._script: list[tuple[tuple[str, ...], int, str, str]] = []

    def expect(self, *prefix: str, rc: int = 0, stdout: str = "", stderr: str = "") -> FakeHelm:
        self._script.append((prefix, rc, stdout, stderr))
        return self

    def __call__(self, args: Sequence[str]) -> subprocess.CompletedProcess[str]:
        args = list(args)
        self.calls.append(args)
        if "--values" in args:
            path = args[args.index("--values") + 1]
            self.values_paths.append(path)
            self.values_files.append(json.loads(Path(path).read_text()))
        assert self._script, f"unexpected helm call: {args}"
        prefix, rc, stdout, stderr = self._script.pop(0)
        assert tuple(args[: len(prefix)]) == prefix, f"expected helm {' '.join(prefix)} ..., got {args}"
        return subprocess.CompletedProcess(["helm", *args], rc, stdout, stderr)

    def done(self) -> None:
        assert not self._script, f"helm calls expected but not made: {[p for p, *_ in self._script]}"

    def commands(self) -> list[str]:
        return [" ".join(call[:2]) if call[0] != "upgrade" else f"upgrade {call[2]}" for call in self.calls]


def driver(fake: FakeHelm, backend: PlntBackend = BACKEND, *runs: WorkflowRun) -> HelmDriver:
    specs = SpecCache()
    for workflow in runs or (RUN, RUN_OLD):
        specs.remember(workflow)
    return HelmDriver(backend, specs, image=IMAGE, runner=fake, clock=lambda: NOW)


def upgrade_argv(release: str, track: str, path: str) -> list[str]:
    return ["upgrade", "--install", release, DEFAULT_CHART, *TARGET, "--values", path, "--reset-values",
            "--labels", f"plnt.work/managed-by=plnt,plnt.work/workflow=review-responder,"
                        f"plnt.work/workflow-namespace=team-a,plnt.work/track={track}",
            "--wait", "--timeout", "150s", "--history-max", "10", "-o", "json"]


CANARY = "review-responder-canary"
STABLE = "review-responder"


# --- install ---------------------------------------------------------------------------------


async def test_install_runs_upgrade_install_with_the_rendered_values() -> None:
    fake = FakeHelm().expect("status", CANARY, rc=1, stderr=NOT_FOUND).expect("upgrade", stdout="{}")
    release = await driver(fake).install(request())
    fake.done()
    assert fake.calls == [
        ["status", CANARY, *TARGET, "-o", "json"],
        upgrade_argv(CANARY, "canary", fake.values_paths[0]),
    ]
    assert fake.values_files == [values()]
    assert not Path(fake.values_paths[0]).exists(), "the values file is removed after the call"
    assert release.model_dump() == {
        "release_id": request().release_id, "namespace": "team-a", "name": "review-responder", "track": "canary",
        "version": "1.2.0", "spec_fingerprint": RUN.fingerprint(), "recipe_digest": "sha256:" + "9a" * 32,
        "recipe_dir": "/var/lib/plnt/recipe", "endpoint": "http://review-responder-canary.agents.svc.cluster.local",
        "traffic_percent": 5, "pid": None, "pid_start": None, "port": None,
        "park_after_s": None, "parked": False, "model": None, "llm_model": None, "canary_header": None, "shadow_percent": 0,
        "replicas": 1, "replicas_max": None, "more_replicas": (), "placement": None, "backend": None,
    }


async def test_target_flags_follow_the_backend() -> None:
    bare = PlntBackend.model_validate({
        "apiVersion": "plnt.work/v1", "kind": "PlntBackend", "metadata": {"name": "gpu-cluster-01"},
        "spec": {"type": "kubernetes", "gpuClasses": ["nvidia.com/h100"], "kubernetes": {"namespace": "agents"}},
    })
    fake = FakeHelm().expect("status", rc=1, stderr=NOT_FOUND).expect("upgrade")
    await driver(fake, bare).install(request(track="stable"))
    assert fake.calls[0] == ["status", STABLE, "--namespace", "agents", "-o", "json"]
    assert fake.calls[1][4:6] == ["--namespace", "agents"] and "--kube-context" not in fake.calls[1]


async def test_install_of_an_identical_deployed_release_is_a_no_op() -> None:
    # Decision: deployed + same values + same chart version -> no new revision, no wait.
    fake = (FakeHelm()
            .expect("status", CANARY, stdout=status_json(CANARY, "deployed", 1, values()))
            .expect("list", stdout=list_json((CANARY, 1, "deployed", "workflow-runner-0.1.0"))))
    release = await driver(fake).install(request())
    fake.done()
    assert fake.calls[1] == ["list", *TARGET, "--filter", "^review\\-responder\\-canary$", "-o", "json"]
    assert release.release_id == request().release_id and release.track == "canary"


@pytest.mark.parametrize(("deployed", "chart"), [
    ("other-values", "workflow-runner-0.1.0"),   # another version or spec
    ("same-values", "workflow-runner-0.0.9"),    # a newer chart
])
async def test_install_upgrades_when_values_or_chart_differ(deployed: str, chart: str) -> None:
    config = values(RUN_OLD) if deployed == "other-values" else values()
    fake = FakeHelm().expect("status", CANARY, stdout=status_json(CANARY, "deployed", 4, config))
    if deployed == "same-values":
        fake.expect("list", stdout=list_json((CANARY, 4, "deployed", chart)))
    fake.expect("upgrade", stdout="{}")
    await driver(fake).install(request())
    fake.done()
    assert fake.values_files == [values()]


async def test_install_upgrades_over_a_failed_release() -> None:
    fake = (FakeHelm().expect("status", CANARY, stdout=status_json(CANARY, "failed", 2, values()))
            .expect("upgrade", stdout="{}"))
    await driver(fake).install(request())
    fake.done()


async def test_install_refuses_a_release_owned_by_another_workflow_run() -> None:
    other = values(run(namespace="team-b"))
    fake = FakeHelm().expect("status", CANARY, stdout=status_json(CANARY, "deployed", 1, other))
    with pytest.raises(HelmConfigError, match="belongs to team-b/review-responder"):
        await driver(fake).install(request())
    assert fake.commands() == ["status review-responder-canary"], "never upgraded over someone else's release"


async def test_install_refuses_a_foreign_release_without_plnt_values() -> None:
    fake = FakeHelm().expect("status", STABLE, stdout=status_json(STABLE, "deployed", 1, None))
    with pytest.raises(HelmConfigError, match="not a plnt runner"):
        await driver(fake).install(request(track="stable"))


async def test_install_needs_the_spec_with_the_request_fingerprint() -> None:
    with pytest.raises(DriverError, match="no spec with fingerprint"):
        await driver(FakeHelm(), BACKEND, RUN_OLD).install(request())
    elsewhere = run(backend={"cluster": "other-cluster"})
    with pytest.raises(UnknownBackend, match="other-cluster"):
        await driver(FakeHelm(), BACKEND, elsewhere).install(request(elsewhere))


# --- error mapping ---------------------------------------------------------------------------


@pytest.mark.parametrize(("stderr", "error"), [
    (UNREACHABLE, ClusterUnavailable),
    (ETCD_AWAY, ClusterUnavailable),
    (WAIT_TIMEOUT, DriverError),
    (THROTTLED, DriverError),
    ("Error: UPGRADE FAILED: something nobody has seen before\n", DriverError),
    (SCHEMA, HelmChartError),
    (TEMPLATE, HelmChartError),
    (HELM4_TEMPLATE, HelmChartError),
    (NO_CONTEXT, HelmConfigError),
    (NO_KUBECONFIG, HelmConfigError),
    (FORBIDDEN, HelmConfigError),
    (OWNED, HelmConfigError),
    ('Error: path "/opt/plnt/charts/workflow-runner" not found\n', HelmConfigError),  # no chart where configured
])
async def test_upgrade_errors_map_to_what_happens_next(stderr: str, error: type[Exception]) -> None:
    fake = FakeHelm().expect("status", rc=1, stderr=NOT_FOUND).expect("upgrade", rc=1, stderr=stderr)
    with pytest.raises(error) as caught:
        await driver(fake).install(request())
    assert type(caught.value) is error
    assert isinstance(caught.value, NeedsHuman) == (not issubclass(error, DriverError))
    assert str(caught.value).startswith("helm upgrade review-responder-canary: ")
    assert "\n" not in str(caught.value) and "Error:" not in str(caught.value)


async def test_in_progress_with_a_live_lock_is_retryable() -> None:
    # Another operation holds the release and it is not pending-* by now: just try again later.
    fake = (FakeHelm().expect("status", rc=1, stderr=NOT_FOUND).expect("upgrade", rc=1, stderr=IN_PROGRESS)
            .expect("status", stdout=status_json(CANARY, "deployed", 1, values())))
    with pytest.raises(DriverError, match="another operation"):
        await driver(fake).install(request())
    fake.done()


async def test_status_errors_other_than_not_found_propagate() -> None:
    fake = FakeHelm().expect("status", rc=1, stderr=UNREACHABLE)
    with pytest.raises(DriverError, match="connection refused"):
        await driver(fake).install(request())


async def test_an_install_waits_out_a_cluster_outage_then_goes_on() -> None:
    """The API server refuses twice (restarting), then answers: the install goes on from the top."""
    fake = (FakeHelm().expect("status", rc=1, stderr=UNREACHABLE).expect("status", rc=1, stderr=UNREACHABLE)
            .expect("status", rc=1, stderr=NOT_FOUND).expect("upgrade"))
    specs = SpecCache()
    specs.remember(RUN)
    waiting = HelmDriver(BACKEND, specs, image=IMAGE, runner=fake, clock=lambda: NOW, unavailable_wait_s=30)
    started = time.monotonic()
    released = await waiting.install(request())
    fake.done()
    assert released.track == "canary" and released.version == RUN.spec.workflow.version
    assert time.monotonic() - started >= 2 * UNAVAILABLE_POLL_S


async def test_an_outage_longer_than_the_wait_fails_the_step_retryably() -> None:
    fake = FakeHelm().expect("status", rc=1, stderr=UNREACHABLE).expect("status", rc=1, stderr=UNREACHABLE)
    specs = SpecCache()
    specs.remember(RUN)
    waiting = HelmDriver(BACKEND, specs, image=IMAGE, runner=fake, clock=lambda: NOW, unavailable_wait_s=1)
    with pytest.raises(ClusterUnavailable, match="connection refused") as caught:
        await waiting.install(request())
    assert not isinstance(caught.value, NeedsHuman)
    fake.done()


# --- stuck releases --------------------------------------------------------------------------


async def test_in_progress_on_a_pending_upgrade_rolls_back_then_upgrades() -> None:
    fake = (FakeHelm()
            .expect("status", CANARY, stdout=status_json(CANARY, "deployed", 2, values(RUN_OLD)))
            .expect("upgrade", rc=1, stderr=IN_PROGRESS)
            .expect("status", CANARY, stdout=status_json(CANARY, "pending-upgrade", 3, values(), description="Preparing upgrade"))
            .expect("history", CANARY, stdout=history_json((1, "superseded", "Install complete"),
                                                           (2, "deployed", "Upgrade complete"),
                                                           (3, "pending-upgrade", "Preparing upgrade")))
            .expect("rollback", CANARY)
            .expect("upgrade"))
    await driver(fake).install(request())
    fake.done()
    assert fake.calls[3] == ["history", CANARY, *TARGET, "--max", "256", "-o", "json"]
    assert fake.calls[4] == ["rollback", CANARY, "2", *TARGET, "--wait", "--timeout", "150s", "--history-max", "10"]


async def test_in_progress_on_a_pending_install_that_never_deployed_uninstalls_then_installs() -> None:
    fake = (FakeHelm()
            .expect("status", CANARY, rc=1, stderr=NOT_FOUND)
            .expect("upgrade", rc=1, stderr=IN_PROGRESS)
            .expect("status", CANARY, stdout=status_json(CANARY, "pending-install", 1, values(), description="Initial install underway"))
            .expect("history", CANARY, stdout=history_json((1, "pending-install", "Initial install underway")))
            .expect("uninstall", CANARY)
            .expect("upgrade"))
    await driver(fake).install(request())
    fake.done()
    assert fake.calls[4] == ["uninstall", CANARY, *TARGET, "--wait", "--timeout", "150s", "--ignore-not-found"]


async def test_install_finding_a_pending_release_recovers_it_first() -> None:
    fake = (FakeHelm()
            .expect("status", STABLE, stdout=status_json(STABLE, "pending-rollback", 5, values(track="stable")))
            .expect("history", STABLE, stdout=history_json((3, "superseded", "Upgrade complete"),
                                                          (4, "failed", "Upgrade failed: context deadline exceeded"),
                                                          (5, "pending-rollback", "Rollback to 3")))
            .expect("rollback", STABLE, "3")
            .expect("upgrade"))
    await driver(fake).install(request(track="stable"))
    fake.done()


async def test_a_young_pending_release_is_left_alone() -> None:
    fake = FakeHelm().expect("status", stdout=status_json(CANARY, "pending-upgrade", 3, values(), last_deployed=JUST_NOW))
    with pytest.raises(DriverError, match="pending-upgrade since 30s ago"):
        await driver(fake).install(request())
    assert fake.commands() == ["status review-responder-canary"], "no rollback of a maybe-live operation"


async def test_recover_stuck_on_a_deployed_release_does_nothing() -> None:
    fake = FakeHelm().expect("status", stdout=status_json(CANARY, "deployed", 3, values()))
    await driver(fake).recover_stuck(CANARY)
    fake.done()
    assert fake.commands() == ["status review-responder-canary"]


# --- promote ---------------------------------------------------------------------------------


async def test_promote_upgrades_stable_to_the_canary_values_then_uninstalls_the_canary() -> None:
    fake = (FakeHelm()
            .expect("status", CANARY, stdout=status_json(CANARY, "deployed", 1, values()))
            .expect("status", STABLE, stdout=status_json(STABLE, "deployed", 7, values(RUN_OLD, "stable")))
            .expect("upgrade", stdout="{}")
            .expect("uninstall", CANARY))
    stable = await driver(fake).promote("team-a", "review-responder")
    fake.done()
    expected = values()
    expected["track"] = "stable"
    expected["workflow"]["trafficPercent"] = 0
    assert fake.values_files == [expected]
    assert fake.calls[2] == upgrade_argv(STABLE, "stable", fake.values_paths[0])
    assert fake.calls[3] == ["uninstall", CANARY, *TARGET, "--wait", "--timeout", "150s", "--ignore-not-found"]
    assert stable.track == "stable" and stable.version == "1.2.0" and stable.traffic_percent == 0
    assert stable.release_id == request().release_id, "a promoted canary keeps its release id"
    assert stable.endpoint == "http://review-responder.agents.svc.cluster.local"


async def test_promote_retried_after_success_finds_the_stable_release() -> None:
    promoted = values()
    promoted["track"] = "stable"
    promoted["workflow"]["trafficPercent"] = 0
    fake = (FakeHelm().expect("status", CANARY, rc=1, stderr=NOT_FOUND)
            .expect("status", STABLE, stdout=status_json(STABLE, "deployed", 8, promoted)))
    stable = await driver(fake).promote("team-a", "review-responder")
    fake.done()
    assert stable.version == "1.2.0" and stable.track == "stable"


async def test_promote_retried_between_upgrade_and_uninstall_only_uninstalls() -> None:
    promoted = values()
    promoted["track"] = "stable"
    promoted["workflow"]["trafficPercent"] = 0
    fake = (FakeHelm()
            .expect("status", CANARY, stdout=status_json(CANARY, "deployed", 1, values()))
            .expect("status", STABLE, stdout=status_json(STABLE, "deployed", 8, promoted))
            .expect("list", stdout=list_json((STABLE, 8, "deployed", "workflow-runner-0.1.0")))
            .expect("uninstall", CANARY, rc=1, stderr=UNINSTALL_NOT_FOUND))
    await driver(fake).promote("team-a", "review-responder")
    fake.done()


async def test_promote_without_a_canary_is_retryable() -> None:
    fake = FakeHelm().expect("status", CANARY, rc=1, stderr=NOT_FOUND).expect("status", STABLE, rc=1, stderr=NOT_FOUND)
    with pytest.raises(DriverError, match="no canary to promote"):
        await driver(fake).promote("team-a", "review-responder")


async def test_promote_refuses_a_failed_canary() -> None:
    fake = FakeHelm().expect("status", CANARY, stdout=status_json(CANARY, "failed", 1, values()))
    with pytest.raises(DriverError, match="is failed, not deployed"):
        await driver(fake).promote("team-a", "review-responder")


# --- set_traffic (a stepped canary's next step) -------------------------------------------------


async def test_set_traffic_upgrades_the_canary_with_its_own_values_but_the_share() -> None:
    """FakeHelm (canned helm answers): the canary's recorded values again, only trafficPercent changed."""
    fake = (FakeHelm()
            .expect("status", CANARY, stdout=status_json(CANARY, "deployed", 1, values()))
            .expect("upgrade", stdout="{}"))
    canary = await driver(fake).set_traffic("team-a", "review-responder", 40, canary_header=None)
    fake.done()
    expected = values()
    expected["workflow"]["trafficPercent"] = 40
    assert fake.values_files == [expected]
    assert fake.calls[1] == upgrade_argv(CANARY, "canary", fake.values_paths[0])
    assert canary.track == "canary" and canary.traffic_percent == 40 and canary.release_id == request().release_id


async def test_set_traffic_already_at_the_share_changes_nothing() -> None:
    at = values()
    at["workflow"]["trafficPercent"] = 40
    fake = FakeHelm().expect("status", CANARY, stdout=status_json(CANARY, "deployed", 2, at))
    assert (await driver(fake).set_traffic("team-a", "review-responder", 40, canary_header=None)).traffic_percent == 40
    fake.done()
    assert fake.commands() == ["status review-responder-canary"], "a retried step finds its own work"


async def test_set_traffic_without_a_deployed_canary_is_retryable() -> None:
    fake = FakeHelm().expect("status", CANARY, rc=1, stderr=NOT_FOUND)
    with pytest.raises(DriverError, match="no deployed canary to give 40% of the traffic"):
        await driver(fake).set_traffic("team-a", "review-responder", 40, canary_header=None)


async def test_set_traffic_gives_the_step_its_own_cohort_and_takes_it_away() -> None:
    """FakeHelm (canned helm answers): a step's headerRoute replaces the canary's in the values the
    gateway reads; a later step without one (and no canary-wide one) leaves none."""
    fake = (FakeHelm()
            .expect("status", CANARY, stdout=status_json(CANARY, "deployed", 1, values()))
            .expect("upgrade", stdout="{}"))
    canary = await driver(fake).set_traffic("team-a", "review-responder", 0, canary_header=("x-cohort", "testers"))
    fake.done()
    assert fake.values_files[0]["workflow"]["canaryHeader"] == {"name": "x-cohort", "value": "testers"}
    assert canary.canary_header == ("x-cohort", "testers") and canary.traffic_percent == 0
    fake = (FakeHelm()
            .expect("status", CANARY, stdout=status_json(CANARY, "deployed", 2, fake.values_files[0]))
            .expect("upgrade", stdout="{}"))
    canary = await driver(fake).set_traffic("team-a", "review-responder", 0, canary_header=None)
    fake.done()
    assert "canaryHeader" not in fake.values_files[0]["workflow"], "only the cohort changed, and it went"
    assert canary.canary_header is None


# --- remove ----------------------------------------------------------------------------------


async def test_remove_uninstalls_and_waits() -> None:
    fake = FakeHelm().expect("status", CANARY, stdout=status_json(CANARY, "failed", 1, values())).expect("uninstall")
    await driver(fake).remove("team-a", "review-responder", "canary")
    fake.done()
    assert fake.calls[1] == ["uninstall", CANARY, *TARGET, "--wait", "--timeout", "150s", "--ignore-not-found"]


async def test_remove_of_nothing_is_success() -> None:
    fake = FakeHelm().expect("status", STABLE, rc=1, stderr=NOT_FOUND)
    await driver(fake).remove("team-a", "review-responder", "stable")
    fake.done()
    assert fake.commands() == ["status review-responder"]


async def test_remove_when_uninstall_says_not_found_is_success() -> None:
    fake = (FakeHelm().expect("status", CANARY, stdout=status_json(CANARY, "deployed", 1, values()))
            .expect("uninstall", rc=1, stderr=UNINSTALL_NOT_FOUND))
    await driver(fake).remove("team-a", "review-responder", "canary")
    fake.done()


async def test_remove_never_uninstalls_another_workflow_runs_release() -> None:
    fake = FakeHelm().expect("status", CANARY, stdout=status_json(CANARY, "deployed", 1, values(run(namespace="team-b"))))
    with pytest.raises(HelmConfigError):
        await driver(fake).remove("team-a", "review-responder", "canary")
    assert fake.commands() == ["status review-responder-canary"]


# --- live ------------------------------------------------------------------------------------


async def test_live_parses_list_and_values_into_live_workflows() -> None:
    other = run(name="summariser", namespace="team-b")
    stable = values(RUN_OLD, "stable")
    fake = (FakeHelm()
            .expect("list", stdout=list_json((STABLE, 7, "deployed", "workflow-runner-0.1.0"),
                                             (CANARY, 1, "deployed", "workflow-runner-0.1.0"),
                                             ("summariser", 1, "pending-install", "workflow-runner-0.1.0"),
                                             ("summariser-canary", 1, "failed", "workflow-runner-0.1.0"),
                                             ("stray", 1, "deployed", "workflow-runner-0.1.0"),
                                             ("gone", 2, "deployed", "workflow-runner-0.1.0")))
            .expect("get", "values", STABLE, stdout=json.dumps(stable, separators=(",", ":")) + "\n")
            .expect("get", "values", CANARY, stdout=json.dumps(values(), separators=(",", ":")) + "\n")
            .expect("get", "values", "stray", stdout="null\n")
            .expect("get", "values", "gone", rc=1, stderr=NOT_FOUND))
    live = await driver(fake, BACKEND, RUN, RUN_OLD, other).live()
    fake.done()
    assert fake.calls[0] == ["list", *TARGET, "--selector", "plnt.work/managed-by=plnt", "--max", "4096", "-o", "json"]
    assert fake.calls[1] == ["get", "values", STABLE, "--revision", "7", *TARGET, "-o", "json"]
    assert list(live) == ["team-a/review-responder"], "pending, failed, unreadable and vanished releases are not live"
    workflow = live["team-a/review-responder"]
    assert workflow.stable is not None and workflow.canary is not None
    assert (workflow.stable.version, workflow.stable.track, workflow.stable.traffic_percent) == ("1.1.0", "stable", 0)
    assert workflow.stable.release_id == request(RUN_OLD, "stable").release_id
    assert workflow.stable.endpoint == "http://review-responder.agents.svc.cluster.local"
    assert (workflow.canary.version, workflow.canary.traffic_percent) == ("1.2.0", 5)
    assert workflow.canary.spec_fingerprint == RUN.fingerprint()
    assert workflow.canary.endpoint == "http://review-responder-canary.agents.svc.cluster.local"


async def test_a_release_mid_upgrade_is_live_as_the_revision_that_still_serves() -> None:
    """A stable release pending-upgrade (a worker promoting it, the roles apart; FAKE helm, canned
    output) is read as its revision before, which its Service serves until the new pods are ready.
    Read as not live, the reconciler's routes had no stable for the upgrade: the gateway answered 503s."""
    fake = (FakeHelm()
            .expect("list", stdout=list_json((STABLE, 8, "pending-upgrade", "workflow-runner-0.1.0"),
                                             (CANARY, 1, "deployed", "workflow-runner-0.1.0")))
            .expect("get", "values", STABLE, stdout=json.dumps(values(RUN_OLD, "stable")) + "\n")
            .expect("get", "values", CANARY, stdout=json.dumps(values()) + "\n")
            .expect("list", stdout=list_json((STABLE, 8, "pending-upgrade", "workflow-runner-0.1.0"))))
    helm = driver(fake, BACKEND, RUN, RUN_OLD)
    during = (await helm.live())["team-a/review-responder"]
    assert during.stable is not None and during.stable.version == "1.1.0", during
    assert fake.calls[1][:5] == ["get", "values", STABLE, "--revision", "7"], fake.calls[1]
    again = (await helm.live())["team-a/review-responder"]  # (its values read once)
    fake.done()
    assert again.stable == during.stable and again.canary is None


async def test_a_canary_installed_again_is_read_with_its_values_not_those_of_the_one_before() -> None:
    """A canary uninstalled and installed again is revision 1 again (FAKE helm, canned output). A driver
    that read the first one's values must not answer them for the second: a worker (the roles apart,
    no reconcile passes between its saga steps) saw the promoted 1.1.0 canary where 1.2.0 had been
    installed, and the smoke test failed "no canary release of fingerprint ...". Told apart by the
    revision's time; and this driver's own uninstall forgets what it read of the release."""
    def listed(updated: str) -> str:
        entries = json.loads(list_json((CANARY, 1, "deployed", "workflow-runner-0.1.0")))
        entries[0]["updated"] = updated
        return json.dumps(entries)

    def values_of(workflow: WorkflowRun) -> str:
        return json.dumps(values(workflow), separators=(",", ":")) + "\n"

    fake = (FakeHelm()
            .expect("list", stdout=listed("2025-11-29 21:40:02.1 +0000 UTC"))
            .expect("get", "values", CANARY, stdout=values_of(RUN_OLD))
            .expect("list", stdout=listed("2025-11-29 21:40:02.1 +0000 UTC"))  # the same revision: not read again
            .expect("list", stdout=listed("2025-11-29 21:41:30.7 +0000 UTC"))  # installed again (by another process)
            .expect("get", "values", CANARY, stdout=values_of(RUN))
            .expect("status", CANARY, stdout=status_json(CANARY, "deployed", 1, values()))
            .expect("uninstall", CANARY)
            .expect("list", stdout=listed("2025-11-29 21:41:30.7 +0000 UTC"))  # (a clock that did not move)
            .expect("get", "values", CANARY, stdout=values_of(RUN_OLD)))
    helm = driver(fake, BACKEND, RUN, RUN_OLD)
    versions = []
    for _ in range(2):
        versions.append((await helm.live())["team-a/review-responder"].canary.version)  # type: ignore[union-attr]
    versions.append((await helm.live())["team-a/review-responder"].canary.version)  # type: ignore[union-attr]
    await helm.remove("team-a", "review-responder", "canary")
    versions.append((await helm.live())["team-a/review-responder"].canary.version)  # type: ignore[union-attr]
    fake.done()
    assert versions == ["1.1.0", "1.1.0", "1.2.0", "1.1.0"], versions


async def test_a_pass_and_a_saga_step_reading_live_at_once_read_a_revision_once() -> None:
    """Two live reads at the same time (the reconcile pass and a saga step): one `get values` per
    revision between them (the bench saw a canary's values read twice within 70 ms). A FAKE helm that
    answers by command, the `get values` slow enough for the second read to arrive meanwhile."""
    import threading

    listing = list_json((STABLE, 7, "deployed", "workflow-runner-0.1.0"), (CANARY, 1, "deployed", "workflow-runner-0.1.0"))
    answers = {STABLE: json.dumps(values(RUN_OLD, "stable")), CANARY: json.dumps(values())}
    reads: list[str] = []
    lock = threading.Lock()

    def fake(args: Sequence[str]) -> subprocess.CompletedProcess[str]:
        if args[0] == "list":
            return subprocess.CompletedProcess(["helm", *args], 0, listing, "")
        assert list(args[:2]) == ["get", "values"], args
        with lock:
            reads.append(args[2])
        time.sleep(0.2)
        return subprocess.CompletedProcess(["helm", *args], 0, answers[args[2]], "")

    specs = SpecCache()
    for workflow in (RUN, RUN_OLD):
        specs.remember(workflow)
    helm = HelmDriver(BACKEND, specs, image=IMAGE, runner=fake, clock=lambda: NOW)
    first, second = await asyncio.gather(helm.live(), helm.live())
    assert first == second and set(first) == {"team-a/review-responder"}
    assert sorted(reads) == sorted([STABLE, CANARY]), reads


async def test_an_idle_live_read_is_one_helm_list_whatever_the_number_of_releases() -> None:
    """A revision's values never change: they are read once, so the reconciler's drift check on every
    pass costs one `helm list` (one API request), not one `get values` per release."""
    listing = list_json((STABLE, 7, "deployed", "workflow-runner-0.1.0"), (CANARY, 1, "deployed", "workflow-runner-0.1.0"))
    stable, canary = values(RUN_OLD, "stable"), values()
    fake = (FakeHelm()
            .expect("list", stdout=listing)
            .expect("get", "values", STABLE, stdout=json.dumps(stable))
            .expect("get", "values", CANARY, stdout=json.dumps(canary))
            .expect("list", stdout=listing)  # the next pass: nothing changed, nothing read again
            .expect("list", stdout=list_json((STABLE, 8, "deployed", "workflow-runner-0.1.0")))  # promoted
            .expect("get", "values", STABLE, stdout=json.dumps(values(RUN, "stable"))))
    helm = driver(fake, BACKEND, RUN, RUN_OLD)
    first = await helm.live()
    assert await helm.live() == first
    promoted = await helm.live()
    fake.done()
    assert [call[0] for call in fake.calls] == ["list", "get", "get", "list", "list", "get"]
    assert fake.calls[-1][:5] == ["get", "values", STABLE, "--revision", "8"]
    workflow = promoted["team-a/review-responder"]
    assert workflow.stable is not None and workflow.stable.version == "1.2.0" and workflow.canary is None


async def test_live_with_no_releases() -> None:
    fake = FakeHelm().expect("list", stdout="[]\n")
    assert await driver(fake).live() == {}


# --- names, values, parsing --------------------------------------------------------------------


def test_release_names_are_checked_for_both_tracks() -> None:
    assert release_name("review-responder", "stable") == "review-responder"
    assert release_name("review-responder", "canary") == "review-responder-canary"
    assert release_name("a" * 46, "canary") == "a" * 46 + "-canary"
    with pytest.raises(InvalidSpec, match="53"):
        release_name("a" * 47, "stable")  # its canary would be 54 characters
    with pytest.raises(InvalidSpec, match="DNS-1035"):
        release_name("9lives", "stable")  # names a Service: a letter first


def test_render_values_merges_backend_and_spec_placement() -> None:
    document = BACKEND.model_dump(mode="json", by_alias=True)
    document["spec"].update(nodeSelector={"pool": "general", "zone": "a"},
                            tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}])
    backend = PlntBackend.model_validate(document)
    workflow = run(backend={"cluster": "gpu-cluster-01", "nodeSelector": {"pool": "agents"},
                            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]},
                   replicas={"min": 2}, autoscaling=None)
    rendered = render_values(request(workflow, "stable"), workflow.spec, backend, IMAGE, resources={"requests": {"cpu": "250m"}})
    assert rendered["nodeSelector"] == {"pool": "agents", "zone": "a"}, "the WorkflowRun's choice wins"
    assert rendered["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert rendered["replicas"] == {"min": 2, "max": 2} and rendered["autoscaling"] == {}
    assert rendered["gpu"] == {"class": "", "count": 0}
    assert rendered["resources"] == {"requests": {"cpu": "250m"}}
    assert rendered["image"] == {"repository": "ghcr.io/acme/plnt", "tag": "0.1.0", "pullPolicy": "IfNotPresent"}


def test_render_values_rejects_a_gpu_class_that_is_no_label_key() -> None:
    workflow = run(backend={"cluster": "gpu-cluster-01", "gpuClass": "NVIDIA H100", "gpuCount": 1})
    with pytest.raises(InvalidSpec, match="label key"):
        render_values(request(workflow), workflow.spec, BACKEND, IMAGE)


def policy(name: str, recipes: list[str], root: dict[str, Any]) -> RecipeTrustPolicy:
    return RecipeTrustPolicy.model_validate({
        "apiVersion": "plnt.work/v1", "kind": "RecipeTrustPolicy", "metadata": {"name": name},
        "spec": {"recipes": recipes, "trustRoot": root, "signers": [{"issuer": "https://i.example", "identity": "a@b.c"}]},
    })


PUBLIC = policy("public", ["review-*"], {"publicGood": True})
OTHER_ROOT = policy("other-root", ["*"], {"trustedRootFile": "trust/other.json"})
NOT_COVERING = policy("translate-only", ["translate"], {"trustedRootFile": "trust/never.json"})
ROOTS = {"trust/root.json": '{"r": 1}', "trust/other.json": '{"r": 2}', "trust/never.json": '{"r": 3}'}


@pytest.mark.parametrize(("policies", "options", "secret", "expected"), [
    pytest.param((POLICY,), RegistryOptions(), "", {
        "policyNames": ["release-signers"], "trustedRoots": {"trust/root.json": '{"r": 1}'},
        "s3": {"endpointUrl": "", "region": ""}, "ociInsecureHosts": [], "maxDownloadMB": 256,
        "credentialsSecret": ""}, id="one-root-defaults"),
    pytest.param((NOT_COVERING, PUBLIC, POLICY, OTHER_ROOT),
                 RegistryOptions(s3_endpoint_url="http://minio.storage:9000", s3_region="eu-west-1",
                                 allow_insecure_http=("registry.local:5000",), max_download_bytes=10 * 2**20 + 1),
                 "recipe-registry", {
        "policyNames": ["other-root", "public", "release-signers"],  # only those covering the recipe, sorted
        "trustedRoots": {"trust/root.json": '{"r": 1}', "trust/other.json": '{"r": 2}'},
        "s3": {"endpointUrl": "http://minio.storage:9000", "region": "eu-west-1"},
        "ociInsecureHosts": ["registry.local:5000"], "maxDownloadMB": 11, "credentialsSecret": "recipe-registry"},
        id="several-policies-settings-secret"),
    pytest.param((PUBLIC,), RegistryOptions(), "", {
        "policyNames": ["public"], "trustedRoots": {}, "s3": {"endpointUrl": "", "region": ""},
        "ociInsecureHosts": [], "maxDownloadMB": 256, "credentialsSecret": ""}, id="public-good-no-root"),
])
def test_render_values_gives_the_pod_the_sagas_trust_and_registry_settings(
    policies: tuple[RecipeTrustPolicy, ...], options: RegistryOptions, secret: str, expected: dict[str, Any],
) -> None:
    req = request().model_copy(update={"trust": RecipeTrust(policies=policies, trusted_roots=ROOTS)})
    fetch = render_values(req, RUN.spec, BACKEND, IMAGE, registry_options=options, credentials_secret=secret)["recipeFetch"]
    documents = list(yaml.safe_load_all(fetch.pop("policies")))
    assert [doc["metadata"]["name"] for doc in documents] == expected.pop("policyNames")
    # The policy text round-trips through plnt's own loader: what `plnt recipe fetch --policy` reads.
    specs, problems = load_sources([SourceFile("policies.yaml", yaml.safe_dump_all(documents))], check_references=False)
    assert not problems and {p.metadata.name: p for p in specs.trust_policies.values()} == \
        {p.metadata.name: p for p in policies if p.covers("review-responder")}
    assert fetch == expected
    assert req.recipe_digest == render_values(req, RUN.spec, BACKEND, IMAGE)["workflow"]["digest"], "the saga's pin"


@pytest.mark.parametrize(("trust", "registry", "message"), [
    (RecipeTrust(), "s3://microagents", "no RecipeTrustPolicy covering recipe 'review-responder'"),
    (RecipeTrust(policies=(NOT_COVERING,), trusted_roots=ROOTS), "s3://microagents", "no RecipeTrustPolicy covering"),
    (RecipeTrust(policies=(POLICY,)), "s3://microagents", "trustedRootFile 'trust/root.json' was not read"),
    (TRUST, "file:registry", "cannot be reached from a Kubernetes runner pod.*s3:// or oci://"),
    (TRUST, "file:///srv/recipes", "cannot be reached from a Kubernetes runner pod"),
])
def test_render_values_refuses_what_a_pod_could_not_verify(trust: RecipeTrust, registry: str, message: str) -> None:
    workflow = run(workflow={"ref": "review-responder@1.2.0", "registry": registry})
    req = request(workflow).model_copy(update={"trust": trust})
    with pytest.raises(InvalidSpec, match=message):
        render_values(req, workflow.spec, BACKEND, IMAGE)


def test_parsers_read_helm_json() -> None:
    assert parse_time("2025-11-29T21:40:02.118372913Z") == datetime(2025, 11, 29, 21, 40, 2, 118372, tzinfo=UTC)
    assert parse_time("2025-11-29T22:40:02+01:00") == datetime(2025, 11, 29, 21, 40, 2, tzinfo=UTC)
    assert parse_time("") is None and parse_time(None) is None
    status = parse_status(status_json(CANARY, "pending-install", 1, None, description="Initial install underway"))
    assert (status.name, status.revision, status.status, status.config, status.pending) == (CANARY, 1, "pending-install", {}, True)
    assert status.last_deployed == NOW - timedelta(minutes=19, seconds=57, microseconds=881628)
    [entry] = parse_list(list_json((STABLE, 12, "deployed", "workflow-runner-0.1.0")))
    assert (entry.revision, entry.chart, entry.status) == (12, "workflow-runner-0.1.0", "deployed")
    assert [rev.revision for rev in parse_history(history_json((1, "superseded", "x"), (2, "deployed", "y")))] == [1, 2]
    assert parse_values("null\n") == {} and parse_values('{"track":"stable"}\n') == {"track": "stable"}


def test_run_helm_without_a_binary_needs_a_human(tmp_path: Path) -> None:
    with pytest.raises(HelmConfigError, match="install helm"):
        run_helm(["version"], helm=str(tmp_path / "no-helm"))


async def test_runner_releases_keep_the_runners_timeout_whatever_the_model_timeout() -> None:
    """Against the FAKE helm: `model_timeout_s` is for model-server releases only; a runner release's
    rollback (of a stuck release) and upgrade wait `timeout_s`, and it is stuck after `timeout_s` + 120 s."""
    specs = SpecCache()
    specs.remember(RUN)
    fake = (FakeHelm()
            .expect("status", CANARY, stdout=status_json(CANARY, "pending-upgrade", 3, values()))  # 20 minutes old
            .expect("history", CANARY, stdout=history_json((2, "deployed", "Upgrade complete"),
                                                           (3, "pending-upgrade", "Preparing upgrade")))
            .expect("rollback", CANARY, "2")
            .expect("upgrade"))
    await HelmDriver(BACKEND, specs, image=IMAGE, runner=fake, clock=lambda: NOW, model_timeout_s=3600).install(request())
    fake.done()
    assert [call[call.index("--timeout") + 1] for call in fake.calls if "--timeout" in call] == ["150s", "150s"]


def test_the_default_runner_kills_helm_after_the_timeout_of_its_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """The driver's default runner with `run_helm` replaced by a recorder (a FAKE: no process runs): the
    helm process is killed HELM_EXIT_MARGIN_S after the --timeout of its own call (a model upgrade's
    1800s, not the runners' 150s), and after the driver's timeout_s for calls without one."""
    from plnt.reconciler.drivers import helm as helm_driver

    seen: list[tuple[str, float]] = []

    def recorder(args: Sequence[str], *, helm: str, timeout_s: float) -> subprocess.CompletedProcess[str]:
        seen.append((helm, timeout_s))
        return subprocess.CompletedProcess([helm, *args], 0, "", "")

    monkeypatch.setattr(helm_driver, "run_helm", recorder)
    runner = helm_driver.helm_runner("/opt/helm", 150.0)
    runner(["upgrade", "--install", "chat", "model-server", "--wait", "--timeout", "1800s", "-o", "json"])
    runner(["status", "chat", "-o", "json"])
    runner(("uninstall", "chat", "--wait", "--timeout", "150s", "--ignore-not-found"))
    assert seen == [("/opt/helm", 1820.0), ("/opt/helm", 170.0), ("/opt/helm", 170.0)]
    assert helm_driver.HELM_EXIT_MARGIN_S == 20.0
    assert helm_driver.wait_seconds(["status", "--timeout"], 5.0) == 5.0, "a flag without a value"
    assert helm_driver.wait_seconds(["--timeout", "5m"], 5.0) == 5.0, "the driver writes seconds only"


@pytest.mark.integration
def test_run_helm_runs_the_real_binary() -> None:
    """The real helm binary (no FakeHelm), pointed at an API server address where nothing listens."""
    import sys

    helm = Path(sys.executable).parent / "helm"
    if not helm.is_file():
        pytest.fail(f"no helm at {helm}: run tools/install_helm.sh")
    result = run_helm(["version", "--short"], helm=str(helm))
    assert result.returncode == 0 and result.stdout.startswith("v"), result.stderr
    # A real failure to reach a cluster, mapped as the driver maps it.
    result = run_helm(["status", "x", "--kube-apiserver", "https://127.0.0.1:1", "-o", "json"], helm=str(helm))
    assert result.returncode == 1 and "connection refused" in result.stderr
    from plnt.reconciler.drivers.helm import classify

    error = classify("status", "x", result.stderr)
    assert type(error) is ClusterUnavailable and error.retryable


def test_driver_set_routes_kubernetes_runs_to_helm_and_remembers_backends(tmp_path: Path) -> None:
    """DriverSet with a FAKE helm (canned output) and a real LocalDriver that is never started."""
    from plnt.core.specs.loader import SpecSet
    from plnt.reconciler.drivers.driver_set import DriverSet
    from plnt.reconciler.drivers.local import LocalDriver
    from plnt.reconciler.state import StateDir

    state = StateDir(tmp_path / "state").ensure()
    local_backend = PlntBackend.model_validate({"apiVersion": "plnt.work/v1", "kind": "PlntBackend",
                                                "metadata": {"name": "local"}, "spec": {"type": "local"}})
    on_local = run(name="on-local", backend={"cluster": "local"})
    specs = SpecSet(workflow_runs={RUN.key: RUN, on_local.key: on_local},
                    backends={BACKEND.metadata.name: BACKEND, "local": local_backend})
    fake = FakeHelm()
    made: list[str] = []

    def make_helm(backend: PlntBackend, lookup: Any) -> HelmDriver:
        made.append(backend.metadata.name)
        return HelmDriver(backend, lookup, runner=fake)

    local = LocalDriver(state)
    drivers = DriverSet(local, state, make_helm)
    drivers.assign(specs)
    assert isinstance(drivers.driver_for(RUN.metadata.namespace, RUN.metadata.name), HelmDriver)
    assert drivers.driver_for("team-a", "on-local") is local
    assert drivers.driver_for("default", "never-seen") is local
    # After a restart the mapping is still known, e.g. to uninstall a WorkflowRun removed from the repo.
    again = DriverSet(local, state, make_helm)
    assert isinstance(again.driver_for(RUN.metadata.namespace, RUN.metadata.name), HelmDriver)
    assert made == [BACKEND.metadata.name, BACKEND.metadata.name]


async def test_routes_come_from_every_backend_with_the_canary_share_and_sticky_sessions(tmp_path: Path) -> None:
    """The gateway's route table from a DriverSet whose Kubernetes backend has a stable and a canary
    release: helm is the FAKE helm (canned output; no cluster), the LocalDriver is real but never started."""
    import random

    from plnt.core.specs.loader import SpecSet
    from plnt.gateway.router import Router
    from plnt.reconciler.app import build_route_table
    from plnt.reconciler.drivers.driver_set import DriverSet
    from plnt.reconciler.drivers.local import LocalDriver
    from plnt.reconciler.state import StateDir
    from plnt.reconciler.status_store import StatusStore

    state = StateDir(tmp_path / "state").ensure()
    fake = (FakeHelm().expect("status", STABLE, rc=1, stderr=NOT_FOUND).expect("upgrade")
            .expect("status", CANARY, rc=1, stderr=NOT_FOUND).expect("upgrade")
            .expect("status", CANARY, stdout=status_json(CANARY, "deployed", 1, values()))
            .expect("uninstall", CANARY))
    changes: list[int] = []
    drivers = DriverSet(LocalDriver(state), state, lambda b, lookup: HelmDriver(b, lookup, image=IMAGE, runner=fake),
                        on_change=lambda: changes.append(1))
    for workflow in (RUN_OLD, RUN):  # 1.1.0 was deployed from an earlier commit; 1.2.0 is the canary
        drivers.assign(SpecSet(workflow_runs={workflow.key: workflow}, backends={BACKEND.metadata.name: BACKEND}))
    await drivers.install(request(RUN_OLD, "stable"))
    await drivers.install(request(RUN, "canary"))
    assert len(changes) == 2, "each Helm change refreshes the routes"

    statuses = StatusStore(state.status_file)
    route = build_route_table(drivers.snapshot(), statuses).lookup("review-responder", "team-a")
    assert route is not None and route.traffic_percent == 5
    assert [(b.endpoint, b.version) for b in route.stable_replicas] == [
        ("http://review-responder.agents.svc.cluster.local", "1.1.0")]
    assert route.canary is not None
    assert (route.canary.endpoint, route.canary.version) == ("http://review-responder-canary.agents.svc.cluster.local", "1.2.0")

    router = Router(rng=random.Random(7))
    tracks = [router.choose(route)[1] for _ in range(20_000)]
    assert 0.04 < tracks.count("canary") / len(tracks) < 0.06, "the canary's share, as for local runners"
    sessions = {f"user-{i}": router.choose(route, session=f"user-{i}")[1] for i in range(4_000)}
    assert 0.04 < list(sessions.values()).count("canary") / len(sessions) < 0.06
    for session, track in list(sessions.items())[:500]:
        assert all(router.choose(route, session=session)[1] == track for _ in range(5)), "sticky sessions"

    # The canary removed (rolled back): the table follows without a live() read.
    await drivers.remove("team-a", "review-responder", "canary")
    fake.done()
    route = build_route_table(drivers.snapshot(), statuses).lookup("review-responder", "team-a")
    assert route is not None and route.canary is None and route.stable_replicas[0].version == "1.1.0"
    assert len(changes) == 3


async def test_a_canary_leaving_one_kubernetes_backend_is_out_of_the_routes_and_drained_before_its_uninstall(
        tmp_path: Path) -> None:
    """Promotion and rollback on one Kubernetes backend (FAKE helm, canned output; no cluster): the
    canary leaves the routes, the gateways let go of it (`drain`), and only then helm uninstalls it.
    Before, the uninstall came first, and requests the gateways had sent the canary were cut."""
    from plnt.core.specs.loader import SpecSet
    from plnt.reconciler.drivers.driver_set import DriverSet
    from plnt.reconciler.drivers.local import LocalDriver
    from plnt.reconciler.state import Release, StateDir

    state = StateDir(tmp_path / "state").ensure()
    promoted = values()
    promoted["track"] = "stable"
    promoted["workflow"]["trafficPercent"] = 0
    fake = (FakeHelm().expect("status", STABLE, rc=1, stderr=NOT_FOUND).expect("upgrade")
            .expect("status", CANARY, rc=1, stderr=NOT_FOUND).expect("upgrade")
            .expect("status", CANARY, stdout=status_json(CANARY, "deployed", 1, values()))
            .expect("status", STABLE, stdout=status_json(STABLE, "deployed", 1, values(RUN_OLD, "stable")))
            .expect("upgrade", stdout="{}")
            .expect("uninstall", CANARY)
            .expect("status", CANARY, rc=1, stderr=NOT_FOUND).expect("upgrade")
            .expect("status", CANARY, stdout=status_json(CANARY, "deployed", 1, values()))
            .expect("uninstall", CANARY))
    events: list[tuple[str, ...]] = []

    async def drain(release: Release) -> None:
        live = drivers.snapshot()["team-a/review-responder"]
        events.append(("drain", release.endpoint, live.canary.endpoint if live.canary else "no canary routed",
                       str(sum(call[0] == "uninstall" for call in fake.calls))))

    drivers = DriverSet(LocalDriver(state), state, lambda b, lookup: HelmDriver(b, lookup, image=IMAGE, runner=fake),
                        drain=drain)
    for workflow in (RUN_OLD, RUN):
        drivers.assign(SpecSet(workflow_runs={workflow.key: workflow}, backends={BACKEND.metadata.name: BACKEND}))
    await drivers.install(request(RUN_OLD, "stable"))
    canary_endpoint = "http://review-responder-canary.agents.svc.cluster.local"
    await drivers.install(request(RUN, "canary"))
    stable = await drivers.promote("team-a", "review-responder")
    assert stable.version == "1.2.0"
    assert events == [("drain", canary_endpoint, "no canary routed", "0")], events  # drained, then uninstalled

    await drivers.install(request(RUN, "canary"))
    await drivers.remove("team-a", "review-responder", "canary")  # a rollback
    fake.done()
    assert events[1:] == [("drain", canary_endpoint, "no canary routed", "1")], events
    assert drivers.snapshot()["team-a/review-responder"].canary is None


async def test_a_worker_drains_a_canary_it_did_not_install_before_its_rollback_uninstalls_it(tmp_path: Path) -> None:
    """A worker's DriverSet (the roles apart) rolling back a canary another worker installed (FAKE helm,
    canned output; no cluster): it knows no release there, so it reads the canary from helm and has the
    gateways let go of it (`drain`: the worker asks the control plane) before the uninstall."""
    from plnt.core.specs.models import run_key
    from plnt.reconciler.drivers.driver_set import DriverSet
    from plnt.reconciler.drivers.local import LocalDriver
    from plnt.reconciler.state import Release, StateDir

    state = StateDir(tmp_path / "state").ensure()
    fake = (FakeHelm().expect("status", CANARY, stdout=status_json(CANARY, "deployed", 1, values()))
            .expect("status", CANARY, stdout=status_json(CANARY, "deployed", 1, values()))
            .expect("uninstall", CANARY))
    drained: list[tuple[str, str, int]] = []

    async def drain(release: Release) -> None:
        drained.append((release.endpoint, release.track, sum(call[0] == "uninstall" for call in fake.calls)))

    drivers = DriverSet(LocalDriver(state), state, lambda b, lookup: HelmDriver(b, lookup, image=IMAGE, runner=fake),
                        drain=drain)
    drivers.remember(RUN, BACKEND)  # as a saga step's input gives it to a worker
    assert run_key("team-a", "review-responder") not in drivers.snapshot()
    await drivers.remove("team-a", "review-responder", "canary")
    fake.done()
    assert drained == [("http://review-responder-canary.agents.svc.cluster.local", "canary", 0)]

    # The cluster away when the worker reads the canary: no drain, and the removal goes on (waiting an
    # outage out as it always did; here the cluster is back at once) instead of failing on the read.
    fake.expect("status", CANARY, rc=1, stderr=UNREACHABLE) \
        .expect("status", CANARY, stdout=status_json(CANARY, "deployed", 1, values())).expect("uninstall", CANARY)
    await drivers.remove("team-a", "review-responder", "canary")
    fake.done()
    assert len(drained) == 1


@pytest.mark.parametrize(("install_timeout_s", "install", "remove"), [
    (150.0, 180.0, 180.0),   # the default: the steps keep their 3 minutes (recorded inputs replay as they were)
    (10.0, 180.0, 180.0),    # a shorter helm wait never shortens a step
    (600.0, 630.0, 630.0),   # slow image pulls: install, promote and remove get the wait plus 30 s
])
def test_a_runner_install_timeout_raises_its_steps_timeouts_only(install_timeout_s: float, install: float,
                                                                  remove: float) -> None:
    from plnt.reconciler.drivers.helm import runner_step_timeouts
    from plnt.reconciler.settings import StepTimeouts

    base = StepTimeouts()
    got = runner_step_timeouts(base, install_timeout_s)
    assert (got.of("install_release"), got.of("promote_release"), got.of("remove_release")) == (install, install, remove)
    assert got.of("smoke_test") == base.of("smoke_test") and got.of("pull_recipe") == base.of("pull_recipe")
