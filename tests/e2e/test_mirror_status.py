"""`plnt up --mirror-status` end to end: a real plnt (Temporal, worker, reconciler, gateway, runner
processes) on a real git repository, mirroring into a DECLARED STAND-IN Kubernetes API server
(tests/kube_standin.py: not Kubernetes; a small HTTP server with the API's request and response
shapes), reached by the real `kubernetes` client through a generated kubeconfig."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.conftest import SpecRepo
from tests.e2e.harness import hook, running_plnt, settings_for, wait_for, wait_phase
from tests.kube_standin import KubeStandIn
from tests.reconciler.control.test_kube import check_rbac

pytestmark = pytest.mark.integration

RUN_FILE = "workflowruns/review-responder.yaml"


def cr_status(standin: KubeStandIn) -> dict[str, Any]:
    obj = standin.get("plnt.work", "workflowruns", "default", "review-responder")
    return (obj or {}).get("status") or {}


async def test_kubectl_get_wfr_shows_what_plnt_status_shows(
    spec_repo: SpecRepo, tmp_path: Path, temporal_address: str, temporal_namespace: str
) -> None:
    with KubeStandIn() as standin:
        settings = settings_for(spec_repo.path, tmp_path / "state", temporal_address, temporal_namespace,
                                mirror_status=True, kubeconfig=standin.kubeconfig(tmp_path))
        async with running_plnt(settings) as plnt:
            await wait_phase(plnt, "Ready", version="1.2.0")
            status = await wait_for(lambda: cr_status(standin).get("phase") == "Ready" and cr_status(standin),
                                    what="the CR's status to be Ready")
            obj = standin.get("plnt.work", "workflowruns", "default", "review-responder")
            assert obj is not None and obj["metadata"]["generation"] == 1
            assert status["version"] == "1.2.0" and status["observedGeneration"] == 1
            assert status["observedCommit"] == plnt.statuses.get("default/review-responder").observed_commit
            assert {c["type"]: c["status"] for c in status["conditions"]} == {
                "Ready": "True", "Reconciling": "False", "Stalled": "False"}
            assert status["smokeTest"]["passed"] is True
            await wait_for(lambda: [e["reason"] for e in standin.events][-1:] == ["Ready"], what="a Ready Event")

            spec_repo.replace(RUN_FILE, "review-responder@1.2.0", "review-responder@1.3.0")
            spec_repo.commit("review-responder 1.3.0")
            await hook(plnt)
            await wait_phase(plnt, "Ready", version="1.3.0")
            status = await wait_for(lambda: cr_status(standin).get("version") == "1.3.0" and cr_status(standin),
                                    what="the CR to show 1.3.0")
            obj = standin.get("plnt.work", "workflowruns", "default", "review-responder")
            assert obj["metadata"]["generation"] == 2 and status["observedGeneration"] == 2  # type: ignore[index]
            assert obj["spec"]["workflow"]["ref"] == "review-responder@1.3.0"  # type: ignore[index]
            await wait_for(lambda: [e["reason"] for e in standin.events].count("Ready") == 2, what="a second Ready")
            reasons = [e["reason"] for e in standin.events]
            assert {"Verifying", "Deploying", "Canary"} <= set(reasons), reasons

            spec_repo.remove(RUN_FILE)
            spec_repo.commit("retire review-responder")
            await hook(plnt)
            await wait_for(lambda: standin.get("plnt.work", "workflowruns", "default", "review-responder") is None,
                           what="the CR to be deleted")
        check_rbac(standin.history)
