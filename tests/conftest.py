"""Shared fixtures: a real Temporal dev server for the session, real git repositories."""

from __future__ import annotations

import shutil
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from google.protobuf.duration_pb2 import Duration
from plnt.reconciler.saga.temporal_server import TemporalDevServer, connect
from temporalio.api.workflowservice.v1 import RegisterNamespaceRequest

from tests.hygiene import (  # noqa: F401
    no_runner_outlives_its_test,
    pytest_runtest_makereport,
    pytest_runtest_protocol,
)
from tests.hygiene import pytest_collection_modifyitems as mark_integration
from tests.services import oci_registry, s3_bucket, s3_server  # noqa: F401

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "gitops-example"

# The tests of servers built from Go modules run last, in the order tools/build_go_servers.sh builds
# them: on a first `make test` those builds run in the background meanwhile, and these tests' fixtures
# wait for them (each build's lock).
GO_BUILT_LAST = (("tests/forge/",), ("tests/k8s/",),
                 ("tests/k8s/test_keda_on_cluster.py", "tests/k8s/test_worker_least_privilege.py"))  # KEDA's


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    mark_integration(items)

    def rank(item: pytest.Item) -> int:
        path = item.path.relative_to(ROOT).as_posix() if item.path.is_relative_to(ROOT) else ""
        return max((i + 1 for i, prefixes in enumerate(GO_BUILT_LAST) if path.startswith(prefixes)), default=0)

    items.sort(key=rank)  # (stable: each group keeps its files' order)


GIT_ENV = {
    "GIT_AUTHOR_NAME": "plnt tests", "GIT_AUTHOR_EMAIL": "tests@plnt.invalid",
    "GIT_COMMITTER_NAME": "plnt tests", "GIT_COMMITTER_EMAIL": "tests@plnt.invalid",
}


class SpecRepo:
    """A real git repository (with a work tree) that tests edit and commit to, like a user would."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def git(self, *args: str) -> str:
        import os

        env = {**os.environ, **GIT_ENV}
        return subprocess.run(["git", *args], cwd=self.path, env=env, check=True, capture_output=True, text=True).stdout.strip()

    def write(self, relative: str, text: str) -> None:
        target = self.path / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)

    def replace(self, relative: str, old: str, new: str) -> None:
        target = self.path / relative
        text = target.read_text()
        assert old in text, f"{old!r} not in {relative}"
        target.write_text(text.replace(old, new))

    def commit(self, message: str) -> str:
        self.git("add", "-A")
        self.git("commit", "-q", "-m", message)
        return self.git("rev-parse", "HEAD")

    def remove(self, relative: str) -> None:
        (self.path / relative).unlink()


@pytest.fixture
def spec_repo(tmp_path: Path) -> SpecRepo:
    """A copy of gitops-example as a git repository on branch main, one commit."""
    path = tmp_path / "specs"
    shutil.copytree(EXAMPLE, path)
    repo = SpecRepo(path)
    repo.git("init", "-q", "-b", "main")
    repo.commit("initial specs")
    return repo


@pytest.fixture(scope="session")
async def temporal_address() -> AsyncIterator[str]:
    """One real Temporal dev server (in memory) for the whole session."""
    server = TemporalDevServer(db_file=None)
    address = await server.start()
    yield address
    await server.stop()


@pytest.fixture
async def temporal_namespace(temporal_address: str) -> str:
    """A fresh Temporal namespace per test, so saga ids of one test never meet another's."""
    name = f"t-{uuid.uuid4().hex[:12]}"
    client = await connect(temporal_address)
    await client.workflow_service.register_namespace(
        RegisterNamespaceRequest(namespace=name, workflow_execution_retention_period=Duration(seconds=86400))
    )
    return name


PYTHON = sys.executable
