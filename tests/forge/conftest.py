"""A real Gitea with a platform organization on it, for the pull-request flow (tests/forge): the
server and its organization once per session (`gitea`), a spec repository of its own per test
(`spec_site`). What they hold: tests/forge/site.py."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.forge.gitea import BUILD, GiteaServer
from tests.forge.site import GiteaOrg, SpecSite, make_org, new_site, ssh_key

# Gitea's first build (minutes, or the background build of `make test` still under way) happens in the
# setup of the first test here: then each is given this long instead of the suite's per-test timeout.
COLD_BUILD_TIMEOUT = 3600


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    forge = [item for item in items if item.path.is_relative_to(here)]
    if forge and subprocess.run(["bash", str(BUILD), "--check"], capture_output=True).returncode:
        for item in forge:
            item.add_marker(pytest.mark.timeout(COLD_BUILD_TIMEOUT))


@pytest.fixture(scope="session")
def gitea(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GiteaOrg]:
    """Gitea, signing the commits it makes with an SSH key of its own (its .pub: `signing_key`)."""
    base = tmp_path_factory.mktemp("gitea")
    with GiteaServer(base, signing_key=ssh_key(base / "signing" / "gitea", "gitea@plnt.invalid")) as server:
        yield make_org(server)


@pytest.fixture
def spec_site(gitea: GiteaOrg, tmp_path: Path) -> SpecSite:
    return new_site(gitea, tmp_path / "author-clone")
