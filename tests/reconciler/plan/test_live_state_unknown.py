"""Unknown live state is never "gone": when the real helm binary cannot reach the cluster (a
kubeconfig pointing at a closed port), the plan neither restores nor uninstalls anything there.

The helm binary is the real one (.venv/bin/helm, from `make install`); there is no Kubernetes API
server on these machines, so a cluster that was readable earlier is a FAKE helm (canned output, as in
test_helm_driver.py) for the first read only; every read after it is the real binary failing.
"""

from __future__ import annotations

import json
import logging
import socket
import sys
from pathlib import Path
from typing import Any

import pytest
from plnt.core.specs.loader import SpecSet
from plnt.core.specs.models import PlntBackend
from plnt.core.status import Phase, WorkflowRunStatus
from plnt.reconciler.drivers.driver_set import DriverSet
from plnt.reconciler.drivers.helm import HelmDriver, run_helm
from plnt.reconciler.drivers.local import LocalDriver
from plnt.reconciler.errors import LiveStateUnknown
from plnt.reconciler.plan.diff import Action, DesiredRun, live_from, plan
from plnt.reconciler.state import StateDir

from tests.conftest import SpecRepo
from tests.reconciler.drivers.test_helm_driver import RUN, STABLE, FakeHelm, list_json, values

pytestmark = pytest.mark.integration  # runs the real helm binary

HELM = Path(sys.executable).parent / "helm"


@pytest.fixture
def unreachable_backend(tmp_path: Path) -> PlntBackend:
    """A kubernetes backend whose kubeconfig names an API server on a port nothing listens on."""
    with socket.socket() as sock:  # bound, never listening: connections are refused
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(f"""\
apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "https://127.0.0.1:{port}", insecure-skip-tls-verify: true}}}}]
users: [{{name: u, user: {{token: not-a-real-token}}}}]
contexts: [{{name: prod, context: {{cluster: c, user: u, namespace: agents}}}}]
current-context: prod
""")
    return PlntBackend.model_validate({
        "apiVersion": "plnt.work/v1", "kind": "PlntBackend", "metadata": {"name": "gpu-cluster-01"},
        "spec": {"type": "kubernetes", "gpuClasses": ["nvidia.com/h100"],
                 "kubernetes": {"context": "prod", "namespace": "agents", "kubeconfig": str(kubeconfig)}},
    })


def real_helm(backend: PlntBackend, lookup: Any) -> HelmDriver:
    if not HELM.is_file():
        pytest.fail(f"no helm at {HELM}: run `make install` (tools/install_helm.sh)")
    return HelmDriver(backend, lookup, runner=lambda args: run_helm(args, helm=str(HELM), timeout_s=60))


def deployed_status() -> WorkflowRunStatus:
    """What status says after plnt promoted RUN: Ready, its fingerprint deployed."""
    return WorkflowRunStatus(namespace=RUN.metadata.namespace, name=RUN.metadata.name, phase=Phase.READY,
                             version="1.2.0", deployed_fingerprint=RUN.fingerprint(),
                             deployed_spec=RUN.spec.model_dump(mode="json", by_alias=True))


async def test_helm_driver_live_on_an_unreachable_cluster_is_unknown_not_empty(unreachable_backend: PlntBackend) -> None:
    driver = real_helm(unreachable_backend, lambda *a: None)
    with pytest.raises(LiveStateUnknown, match=r"gpu-cluster-01.*cannot be read.*connection refused.*reachable") as caught:
        await driver.live()
    assert caught.value.retryable


async def test_an_unreadable_cluster_is_planned_from_the_last_state_read_not_as_gone(
    tmp_path: Path, unreachable_backend: PlntBackend, caplog: pytest.LogCaptureFixture,
) -> None:
    state = StateDir(tmp_path / "state").ensure()
    specs = SpecSet(workflow_runs={RUN.key: RUN}, backends={"gpu-cluster-01": unreachable_backend})
    desired = {RUN.key: DesiredRun.from_spec(RUN)}

    # A first plnt read the release while the cluster answered (FAKE helm: canned list + values).
    readable = FakeHelm().expect("list", stdout=list_json((STABLE, 3, "deployed", "workflow-runner-0.1.0")))
    readable.expect("get", "values", STABLE, stdout=json.dumps(values(track="stable")))
    first = DriverSet(LocalDriver(state), state, lambda b, lookup: HelmDriver(b, lookup, runner=readable))
    first.assign(specs)
    assert set(await first.live()) == {RUN.key}
    readable.done()

    # plnt restarts; the cluster is now unreachable: the real helm fails.
    caplog.set_level(logging.WARNING, logger="plnt.reconciler.drivers.driver_set")
    again = DriverSet(LocalDriver(state), state, real_helm)
    again.assign(specs)
    live = await again.live()
    items = plan(desired, live_from(live, [deployed_status()]))

    assert [(i.action, i.reason) for i in items] == [(Action.UNCHANGED, "in sync")], items
    assert live[RUN.key].stable is not None and live[RUN.key].stable.version == "1.2.0"
    warning = next(r.getMessage() for r in caplog.records if "live-state-unknown" in r.getMessage())
    assert "gpu-cluster-01" in warning and "connection refused" in warning and "nothing there is restored" in warning
    # The repository still decides: a WorkflowRun removed from it is uninstalled (its helm calls retry
    # until the cluster answers), because the last state read says it runs there.
    gone_from_repo = plan({}, live_from(await again.live(), [deployed_status()]))
    assert [(i.action, i.reason) for i in gone_from_repo] == [(Action.UNINSTALL, "removed from the repository")]
    assert len([r for r in caplog.records if "live-state-unknown" in r.getMessage()]) == 1, "logged once, not per poll"


async def test_without_a_last_state_an_unreadable_cluster_adds_nothing(
    tmp_path: Path, unreachable_backend: PlntBackend,
) -> None:
    """No earlier read and nothing deployed there: nothing is invented, nothing is reported gone."""
    state = StateDir(tmp_path / "state").ensure()
    drivers = DriverSet(LocalDriver(state), state, real_helm)
    drivers.assign(SpecSet(workflow_runs={RUN.key: RUN}, backends={"gpu-cluster-01": unreachable_backend}))
    assert await drivers.live() == {}


async def test_without_a_last_state_a_deployed_release_on_an_unreadable_cluster_is_held_not_restored(
    tmp_path: Path, unreachable_backend: PlntBackend, spec_repo: SpecRepo,
) -> None:
    """STATE/helm-live.json lost, status says Ready, the cluster cannot be read: the plan would call the
    release gone; the reconciler holds it instead (no saga), and says why in the status. The Temporal
    client is a STAND-IN that fails the test if a saga is started; git, the specs and helm are real."""
    import yaml
    from plnt.reconciler.control.loop import Reconciler
    from plnt.reconciler.settings import Settings
    from plnt.reconciler.source.git import GitSource
    from plnt.reconciler.status_store import StatusStore

    for path in ("workflowruns/review-responder.yaml", "backends/local.yaml"):
        spec_repo.remove(path)
    spec_repo.write("backends/gpu.yaml", yaml.safe_dump(unreachable_backend.model_dump(mode="json", by_alias=True)))
    spec_repo.write("workflowruns/rr.yaml", yaml.safe_dump(RUN.model_dump(mode="json", by_alias=True)))
    spec_repo.commit("a WorkflowRun on a kubernetes backend")

    class NoSagas:
        def __getattr__(self, name: str) -> Any:
            raise AssertionError(f"the reconciler used Temporal ({name}) for a WorkflowRun it cannot see")

    state = StateDir(tmp_path / "state").ensure()
    statuses = StatusStore(state.status_file)
    ready = deployed_status()
    statuses.update(ready.namespace, ready.name, phase=ready.phase, version=ready.version,
                    deployed_fingerprint=ready.deployed_fingerprint, deployed_spec=ready.deployed_spec)
    drivers = DriverSet(LocalDriver(state), state, real_helm)
    settings = Settings(repo=str(spec_repo.path), state_dir=state.root)
    reconciler = Reconciler(settings=settings, source=GitSource(settings.source.repo, state.source_clone), client=NoSagas(),
                            statuses=statuses, driver=drivers, state=state)
    items = await reconciler.reconcile_once()
    assert [(i.key, i.action) for i in items] == [(RUN.key, Action.INSTALL)], "what the plan alone would do"
    assert drivers.live_unknown(RUN.key) is not None
    status = statuses.get(RUN.key)
    assert status is not None and status.phase is Phase.READY
    assert "cannot be read" in status.message and "nothing is planned" in status.message, status.message
    assert reconciler.running_sagas == set()
