"""`plnt scale` and `plnt rollback` against a real forge: Gitea built from its Go module
(tests/forge/gitea.py), `plnt up` as users run it (the console script, its own process, embedded
Temporal, local runner processes; the runners' model is MockBackend, a STAND-IN for a model server),
and the verbs run as a person runs them, with the author's token. Each opens a pull request on Gitea;
merging it through Gitea's API is what makes plnt roll the change out (Gitea's signed webhook wakes it).
Recipes are signed by test authorities (tests/sigstore_ca.py), STAND-INS for Sigstore's public services."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import GIT_ENV
from tests.e2e.test_plnt_up_process import PLNT, PlntUp
from tests.e2e.test_plnt_up_process import started as started  # noqa: F401 (the fixture: plnt processes killed after the test)
from tests.e2e.test_verbs import wait_row
from tests.forge.site import SpecSite, secret_file
from tests.forge.test_gitea_pull_request_flow import RUN_FILE, start_plnt

pytestmark = [pytest.mark.integration, pytest.mark.forge]


def verb(site: SpecSite, directory: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """A plnt verb as the author runs it: the repository over HTTP and the forge, with the author's token."""
    org = site.org
    credentials = secret_file(directory / "author-git", f"{org.author.name}:{org.author_token}")
    token = secret_file(directory / "author-token", org.author_token)
    return subprocess.run(
        [*PLNT, *args, "--repo", site.gitea.git_url(site.project), "--git-credentials-file", str(credentials),
         "--forge", "gitea", "--forge-api-url", site.gitea.api_url, "--forge-project", site.project,
         "--forge-token-file", str(token)],
        capture_output=True, text=True, timeout=120, check=False, env={**os.environ, **GIT_ENV})


def pull_of(site: SpecSite, url: str) -> dict:  # type: ignore[type-arg]
    number = int(url.rstrip("/").rsplit("/", 1)[1])
    return site.api("GET", f"/pulls/{number}")  # type: ignore[no-any-return]


def test_scale_and_rollback_open_pull_requests_that_deploy_once_merged(spec_site: SpecSite, tmp_path: Path,
                                                                      started: list[PlntUp]) -> None:
    site = spec_site
    site.add_specs()
    site.commit("add the specs")
    site.push("main")
    plnt = start_plnt(site, tmp_path, started)
    assert plnt.wait_ready(timeout=90)["version"] == "1.2.0"

    # plnt scale: a pull request on Gitea, nothing changed live until it is merged.
    scaled = verb(site, tmp_path, "scale", "review-responder", "--replicas", "2")
    assert scaled.returncode == 0, plnt.why(scaled.stderr)
    url = scaled.stdout.strip()
    pull = pull_of(site, url)
    assert pull["html_url"] == url and pull["state"] == "open", pull
    assert (pull["head"]["ref"], pull["base"]["ref"]) == ("plnt/scale-review-responder-2", "main"), pull
    assert pull["title"] == "Scale default/review-responder to 2 replicas", pull
    site.git("fetch", "-q", "origin")
    diff = site.git("diff", "origin/main", f"origin/{pull['head']['ref']}")
    changed = [line for line in diff.splitlines() if line[:1] in "+-" and line[:3] not in ("+++", "---")]
    assert changed == ["-  replicas: {min: 1, max: 1}", "+  replicas: {min: 2, max: 2}"], diff  # one line, in place
    assert site.org.author_token not in scaled.stdout + scaled.stderr
    assert next(r for r in plnt.workflows() or [] if r["name"] == "review-responder")["replicas"]["min"] == 1
    site.merge(pull["number"])
    wait_row(plnt, lambda row: row["replicas"] == {"min": 2, "max": 2} and row["phase"] == "Ready",
             "the merged scale rolled out")

    # Asked again once merged: main says so already; refused, nothing pushed.
    again = verb(site, tmp_path, "scale", "review-responder", "--replicas", "2")
    assert again.returncode == 1 and "already says so" in again.stderr, again.stderr

    # A new version through an ordinary pull request, then plnt rollback back to the one before it.
    site.branch("bump")
    site.replace(RUN_FILE, "review-responder@1.2.0", "review-responder@1.3.0")
    site.commit("review-responder 1.3.0")
    site.push("bump")
    site.merge(site.open_pull("bump", "review-responder 1.3.0"))
    wait_row(plnt, lambda row: row["version"] == "1.3.0" and row["phase"] == "Ready", "1.3.0 promoted", timeout=120)
    rolled = verb(site, tmp_path, "rollback", "review-responder", "--url", plnt.url)
    assert rolled.returncode == 0, plnt.why(rolled.stderr)
    pull = pull_of(site, rolled.stdout.strip())
    assert pull["head"]["ref"] == "plnt/rollback-review-responder-1.2.0", pull
    assert next(r for r in plnt.workflows() or [] if r["name"] == "review-responder")["version"] == "1.3.0"
    twice = verb(site, tmp_path, "rollback", "review-responder", "--url", plnt.url)  # its pull request is open
    assert twice.returncode == 1 and "branch plnt/rollback-review-responder-1.2.0 exists already" in twice.stderr, \
        twice.stderr
    site.merge(pull["number"])
    row = wait_row(plnt, lambda row: row["version"] == "1.2.0" and row["phase"] == "Ready",
                   "the rollback to 1.2.0 rolled out", timeout=120)
    assert row["replicas"] == {"min": 2, "max": 2}, row

    # Where main is protected, --commit-to-branch is refused by Gitea, and the command says so.
    site.protect_main(dismiss_stale_approvals=True)
    direct = verb(site, tmp_path, "scale", "review-responder", "--replicas", "3", "--commit-to-branch")
    assert direct.returncode == 3, direct.stderr
    assert "leave out --commit-to-branch to open a pull request" in direct.stderr, direct.stderr
    assert "nothing was pushed" in direct.stderr and site.org.author_token not in direct.stderr, direct.stderr
