"""Fixtures for tests against a real Kubernetes control plane (tests/k8s/cluster.py).

The binaries come from tools/build_k8s.sh, which builds them once (minutes, see docs/kubernetes.md,
"Building the test control plane") and then answers from its cache at once. PLNT_K8S_BIN=DIR uses
binaries already built there instead. KEDA's (tests/k8s/test_keda_on_cluster.py) come from
tools/build_keda.sh the same way, or PLNT_KEDA_BIN=DIR.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.k8s.cluster import LocalCluster

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "tools" / "build_k8s.sh"
BUILD_KEDA = ROOT / "tools" / "build_keda.sh"
# A cold build (empty Go caches, 2 cores) takes far longer than the suite's per-test timeout, and it
# happens inside the setup of whichever k8s test runs first: when nothing is built yet, each is given this
# long (`-k`/`-m` deselect after this hook, so the first to run is not known here).
COLD_BUILD_TIMEOUT = 3600


def _built() -> bool:
    for script, env in BUILDS:
        if not os.environ.get(env) and subprocess.run(["bash", str(script), "--check"], capture_output=True).returncode:
            return False
    return True


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    k8s = [item for item in items if item.get_closest_marker("k8s") is not None]
    if k8s and not _built():
        for item in k8s:
            item.add_marker(pytest.mark.timeout(COLD_BUILD_TIMEOUT))


# Each build script and the variable that names a directory built elsewhere instead.
BUILDS = ((BUILD, "PLNT_K8S_BIN"), (BUILD_KEDA, "PLNT_KEDA_BIN"))


def _built_dir(script: Path, env: str) -> Path:
    """$env if set, else the bin directory `script` prints (building it the first time)."""
    if os.environ.get(env):
        return Path(os.environ[env])
    # stderr (the build's progress) is left to pytest's capture: shown if the build fails.
    done = subprocess.run(["bash", str(script)], stdout=subprocess.PIPE, text=True)
    if done.returncode != 0:
        pytest.fail(f"tools/{script.name} failed (exit {done.returncode}); its output is above", pytrace=False)
    return Path(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def k8s_bin_dir() -> Path:
    """The directory holding etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok."""
    return _built_dir(BUILD, "PLNT_K8S_BIN")


@pytest.fixture(scope="session")
def keda_bin_dir() -> Path:
    """KEDA's operator, metrics adapter and CRDs (crds/), from tools/build_keda.sh."""
    return _built_dir(BUILD_KEDA, "PLNT_KEDA_BIN")


@pytest.fixture(scope="session")
def k8s_cluster(k8s_bin_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """One real cluster for the session: 2 plain kwok nodes and 2 GPU nodes (a100, l4)."""
    with LocalCluster(k8s_bin_dir, tmp_path_factory.mktemp("k8s-cluster")) as cluster:
        yield cluster
