"""`plnt scale` (reconciler/cli/scale.py, reconciler/review/proposals.py) opening its pull request on
GitHub and GitLab, as the console command runs it: a real git repository (bare, as a forge holds it)
and the DECLARED forge stand-in (tests/forge_standin.py) checking the documented shapes of each API.
No live GitHub or GitLab runs here; Gitea's pull requests run against a real Gitea in
tests/forge/test_verbs_pull_requests.py."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import GIT_ENV, SpecRepo
from tests.e2e.test_plnt_up_process import PLNT
from tests.forge_standin import ForgeStandin

pytestmark = pytest.mark.integration

TOKEN = "forge-token-of-a-person-0b1c"


@pytest.fixture(params=["github", "gitlab"])
def standin(request: pytest.FixtureRequest) -> Iterator[ForgeStandin]:
    with ForgeStandin(request.param, "platform/specs", TOKEN) as s:
        yield s


def scale(standin: ForgeStandin, bare: Path, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    token = tmp_path / "forge-token"
    token.write_text(TOKEN + "\n")
    return subprocess.run([*PLNT, "scale", "review-responder", *args, "--repo", str(bare), "--forge", standin.kind,
                           "--forge-api-url", standin.api_url, "--forge-project", standin.project,
                           "--forge-token-file", str(token)],
                          capture_output=True, text=True, timeout=120, check=False, env={**os.environ, **GIT_ENV})


def test_scale_pushes_a_branch_and_opens_its_pull_request(spec_repo: SpecRepo, standin: ForgeStandin,
                                                          tmp_path: Path) -> None:
    bare = tmp_path / "specs.git"
    spec_repo.git("clone", "-q", "--bare", str(spec_repo.path), str(bare))
    done = scale(standin, bare, tmp_path, "--replicas", "3", "--max", "5")
    assert done.returncode == 0, done.stderr
    [pull] = standin.pulls.values()
    assert (pull["head"], pull["base"], pull["title"]) == ("plnt/scale-review-responder-3-5", "main",
                                                           "Scale default/review-responder to 3-5 replicas")
    assert done.stdout.strip().endswith("/1") and TOKEN not in done.stdout + done.stderr
    shown = subprocess.run(["git", f"--git-dir={bare}", "show", "plnt/scale-review-responder-3-5:"
                            "workflowruns/review-responder.yaml"], capture_output=True, text=True, check=True).stdout
    assert "  replicas: {min: 3, max: 5}\n" in shown
    main = subprocess.run(["git", f"--git-dir={bare}", "show", "main:workflowruns/review-responder.yaml"],
                          capture_output=True, text=True, check=True).stdout
    assert "  replicas: {min: 1, max: 1}\n" in main, "main is unchanged until the pull request is merged"


def test_a_pull_request_the_token_may_not_open_says_what_was_pushed(spec_repo: SpecRepo, standin: ForgeStandin,
                                                                    tmp_path: Path) -> None:
    bare = tmp_path / "specs.git"
    spec_repo.git("clone", "-q", "--bare", str(spec_repo.path), str(bare))
    standin.deny.add("open")
    done = scale(standin, bare, tmp_path, "--replicas", "2")
    assert done.returncode == 3, done.stderr
    assert "branch plnt/scale-review-responder-2 is pushed" in done.stderr and "403" in done.stderr, done.stderr
    assert "open it by hand" in done.stderr and TOKEN not in done.stderr
