"""The Helm driver (real helm) against the REAL API server with a kubeconfig it must not get past: a
cluster certificate signed by another CA, and a token the server does not accept. Each is a
HelmConfigError (needs a human, not retried) naming the backend, and nothing is deployed."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from plnt.core.specs.models import PlntBackend
from plnt.reconciler.drivers.helm import HelmConfigError, HelmDriver
from plnt.reconciler.errors import LiveStateUnknown

from tests.k8s.cluster import _CA, LocalCluster, _write_cert

pytestmark = [pytest.mark.k8s, pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]
HELM = shutil.which("helm") or str(ROOT / ".venv" / "bin" / "helm")


def backend(kubeconfig: Path) -> PlntBackend:
    return PlntBackend.model_validate({
        "apiVersion": "plnt.work/v1", "kind": "PlntBackend", "metadata": {"name": "test-cluster"},
        "spec": {"type": "kubernetes", "kubernetes": {"namespace": "default", "kubeconfig": str(kubeconfig)}}})


def broken(cluster: LocalCluster, tmp_path: Path, how: str) -> Path:
    config: dict[str, Any] = yaml.safe_load(cluster.kubeconfig.read_text())
    if how == "wrong CA":
        other = _CA.create("some-other-ca")
        _write_cert(tmp_path / "other-ca.crt", other.cert)
        config["clusters"][0]["cluster"]["certificate-authority"] = str(tmp_path / "other-ca.crt")
    else:  # a token the server did not issue (as an expired or revoked one is refused)
        config["users"][0]["user"] = {"token": "eyJhbGciOiJSUzI1NiJ9.eyJleHAiOjF9.c2ln"}
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.parametrize("how", ["wrong CA", "unaccepted token"])
async def test_a_kubeconfig_the_cluster_refuses_is_a_clear_error_naming_the_backend(
        k8s_cluster: LocalCluster, tmp_path: Path, how: str) -> None:
    driver = HelmDriver(backend(broken(k8s_cluster, tmp_path, how)), lambda *key: None, helm=HELM)
    with pytest.raises(HelmConfigError) as caught:
        await driver.status("review-responder")
    message = str(caught.value)
    assert message.startswith("backend 'test-cluster': helm status review-responder: "), message
    assert ("x509: certificate signed by unknown authority" if how == "wrong CA"
            else "provide credentials") in message
    assert "check the kubeconfig this backend names" in message
    with pytest.raises(LiveStateUnknown, match="backend 'test-cluster'"):  # unknown, never "everything is gone"
        await driver.live()
    listed = subprocess.run([HELM, "list", "-n", "default", "--filter", "^review-responder", "-o", "json", "--kubeconfig", str(k8s_cluster.kubeconfig)],
                            capture_output=True, text=True, check=True)
    assert yaml.safe_load(listed.stdout) == []  # nothing deployed
