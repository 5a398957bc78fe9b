"""Git source against real git repositories (a work-tree repo, a bare repo over file://)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from plnt.reconciler.loader import load_sources
from plnt.reconciler.source import GitSource, SourceError

from ..conftest import SpecRepo


def test_fetch_reads_specs_at_the_newest_commit_and_skips_ignored_paths(spec_repo: SpecRepo, tmp_path: Path) -> None:
    source = GitSource(str(spec_repo.path), tmp_path / "clone")
    first = source.fetch()
    assert first == spec_repo.git("rev-parse", "HEAD")
    paths = [f.path for f in source.spec_files(first)]
    # registry/ and recipes/ are in .plntignore; trust/ holds the demo RecipeTrustPolicy
    assert paths == ["backends/local.yaml", "trust/policy.yaml", "workflowruns/review-responder.yaml"]

    spec_repo.replace("workflowruns/review-responder.yaml", "@1.2.0", "@1.3.0")
    second = spec_repo.commit("bump")
    assert source.fetch() == second
    specs, problems = load_sources(source.spec_files(second))
    assert problems == []
    assert specs.workflow_runs["default/review-responder"].spec.workflow.version == "1.3.0"
    # The older commit still reads as it was: a running saga is not affected by newer fetches.
    old, _ = load_sources(source.spec_files(first))
    assert old.workflow_runs["default/review-responder"].spec.workflow.version == "1.2.0"


def test_file_url_of_a_bare_repository_and_a_subdirectory(spec_repo: SpecRepo, tmp_path: Path) -> None:
    bare = tmp_path / "remote.git"
    subprocess.run(["git", "clone", "-q", "--bare", str(spec_repo.path), str(bare)], check=True)
    source = GitSource(f"file://{bare}", tmp_path / "clone", path="workflowruns")
    files = source.spec_files(source.fetch())
    assert [f.path for f in files] == ["review-responder.yaml"]


def test_other_branch_and_missing_branch(spec_repo: SpecRepo, tmp_path: Path) -> None:
    spec_repo.git("checkout", "-q", "-b", "staging")
    spec_repo.replace("workflowruns/review-responder.yaml", "@1.2.0", "@1.3.0")
    staging = spec_repo.commit("staging only")
    assert GitSource(str(spec_repo.path), tmp_path / "a", branch="staging").fetch() == staging
    with pytest.raises(SourceError, match="cannot fetch branch 'nope'"):
        GitSource(str(spec_repo.path), tmp_path / "b", branch="nope").fetch()


def test_unreachable_repository_is_a_retryable_error(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="cannot clone") as caught:
        GitSource(str(tmp_path / "missing"), tmp_path / "clone").fetch()
    assert caught.value.retryable is True


def test_restart_reuses_the_clone(spec_repo: SpecRepo, tmp_path: Path) -> None:
    clone = tmp_path / "clone"
    GitSource(str(spec_repo.path), clone).fetch()
    marker = (clone / "HEAD").stat().st_ino
    again = GitSource(str(spec_repo.path), clone)
    assert again.fetch() == spec_repo.git("rev-parse", "HEAD")
    assert (clone / "HEAD").stat().st_ino == marker


def test_resolve_revisions_and_missing_subdirectory(spec_repo: SpecRepo, tmp_path: Path) -> None:
    first = spec_repo.git("rev-parse", "HEAD")
    spec_repo.git("tag", "v1")
    spec_repo.replace("workflowruns/review-responder.yaml", "@1.2.0", "@1.3.0")
    spec_repo.commit("bump")
    source = GitSource(str(spec_repo.path), tmp_path / "clone", path="nowhere")
    assert source.resolve("v1") == first
    assert source.resolve(first[:10]) == first
    assert source.resolve("main") == spec_repo.git("rev-parse", "HEAD")
    with pytest.raises(SourceError, match="no revision 'nope'"):
        source.resolve("nope")
    with pytest.raises(SourceError, match="has no directory 'nowhere'"):
        source.spec_files(first)


def test_export_copies_a_directory_of_a_commit(spec_repo: SpecRepo, tmp_path: Path) -> None:
    source = GitSource(str(spec_repo.path), tmp_path / "clone")
    commit = source.fetch()
    dest = tmp_path / "out"
    assert source.export(commit, "recipes/review-responder/1.2.0", dest)
    assert (dest / "workflow.yaml").read_bytes() == (spec_repo.path / "recipes/review-responder/1.2.0/workflow.yaml").read_bytes()
    assert (dest / "knowledge" / "brand_voice.md").exists()
    assert not source.export(commit, "recipes/review-responder/9.9.9", tmp_path / "none")


def test_read_file_at_a_commit(spec_repo: SpecRepo, tmp_path: Path) -> None:
    source = GitSource(str(spec_repo.path), tmp_path / "clone")
    commit = source.fetch()
    assert source.read_file(commit, "backends/local.yaml") == (spec_repo.path / "backends/local.yaml").read_bytes()
    with pytest.raises(FileNotFoundError, match="not in the spec repository"):
        source.read_file(commit, "nope.json")
    with pytest.raises(FileNotFoundError, match="is not a file"):
        source.read_file(commit, "backends")


@pytest.mark.parametrize(("given", "expected_absolute"), [
    ("https://git.example.com/platform/specs.git", False),
    ("ssh://git@git.example.com/platform/specs.git", False),
    ("git@git.example.com:platform/specs.git", False),
    ("file:///srv/git/specs.git", False),
    ("specs", True),
    ("./specs", True),
])
def test_urls_pass_through_and_paths_become_absolute(given: str, expected_absolute: bool) -> None:
    from plnt.reconciler.source import normalise_url

    result = normalise_url(given)
    if expected_absolute:
        assert Path(result).is_absolute() and result.endswith("specs")
    else:
        assert result == given
