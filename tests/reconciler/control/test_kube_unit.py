"""plnt.reconciler.control.kube without any server: configuration errors and the shapes it builds."""

from __future__ import annotations

from pathlib import Path

import pytest
from plnt.core.specs.models import WorkflowRun
from plnt.reconciler.control.crds import MANAGED_BY_LABEL
from plnt.reconciler.control.kube import KubeConfigError, KubernetesLease, api_client, cr_body


def test_a_missing_kubeconfig_says_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(KubeConfigError, match="--kubeconfig"):
        api_client(tmp_path / "nope")


def test_no_in_cluster_service_account_says_what_to_do() -> None:
    with pytest.raises(KubeConfigError, match="service account"):
        api_client(None)


def test_a_lease_that_renews_no_faster_than_it_expires_is_refused() -> None:
    with pytest.raises(ValueError, match="renew_every_s"):
        KubernetesLease("l", "plnt", "me", lease_duration_s=5, renew_every_s=5, api=object())  # type: ignore[arg-type]


def test_cr_body_is_the_spec_by_yaml_names_with_plnts_label() -> None:
    run = WorkflowRun.model_validate({
        "apiVersion": "plnt.work/v1", "kind": "WorkflowRun",
        "metadata": {"name": "r", "namespace": "team-a", "labels": {"team": "x"}, "annotations": {"a": "b"}},
        "spec": {"workflow": {"ref": "r@1.0.0", "registry": "file:registry"}, "backend": {"cluster": "local"}}})
    body = cr_body(run)
    assert body["apiVersion"] == "plnt.work/v1" and body["kind"] == "WorkflowRun"
    assert body["metadata"] == {"name": "r", "namespace": "team-a", "labels": {"team": "x", MANAGED_BY_LABEL: "plnt"},
                                "annotations": {"a": "b"}}
    assert body["spec"]["canary"]["trafficPercent"] == 5 and "integrityHash" not in body["spec"]["workflow"]
    assert WorkflowRun.model_validate({**body, "metadata": run.metadata.model_dump(by_alias=True)}) == run
