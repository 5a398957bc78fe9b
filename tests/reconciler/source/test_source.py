"""Git source against real git repositories (a work-tree repo, a bare repo over file://)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from plnt.core.specs.limits import SpecLimits
from plnt.core.specs.loader import load_sources
from plnt.reconciler.source.git import GitSource, SourceError, UnreadableTree

from tests.conftest import SpecRepo


def test_fetch_reads_specs_at_the_newest_commit_and_skips_ignored_paths(spec_repo: SpecRepo, tmp_path: Path) -> None:
    source = GitSource(str(spec_repo.path), tmp_path / "clone")
    first = source.fetch()
    assert first == spec_repo.git("rev-parse", "HEAD")
    paths = [f.path for f in source.spec_files(first)]
    # registry/ and recipes/ are in .plntignore; trust/ holds the demo RecipeTrustPolicy
    assert paths == ["backends/local.yaml", "trust/models-policy.yaml", "trust/policy.yaml", "workflowruns/review-responder.yaml"]

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
    from plnt.reconciler.source.git import normalise_url

    result = normalise_url(given)
    if expected_absolute:
        assert Path(result).is_absolute() and result.endswith("specs")
    else:
        assert result == given


# --- trees git itself would refuse, and the spec limits on the git path ----------------------


def commit_with_entry(repo: SpecRepo, name: str, under: str = "") -> str:
    """Commit HEAD's tree plus a directory entry named `name` (e.g. `..`, made with `git mktree`,
    as no work tree can hold it) holding `escaped.yaml`; under: a directory of HEAD to put it in.
    The branch moves to the new commit; the work tree is left as it was."""
    def mktree(lines: list[str]) -> str:
        return subprocess.run(["git", "mktree"], cwd=repo.path, input="\n".join(lines) + "\n", text=True,
                              capture_output=True, check=True).stdout.strip()

    blob = subprocess.run(["git", "hash-object", "-w", "--stdin"], cwd=repo.path, input="planted: true\n",
                          text=True, capture_output=True, check=True).stdout.strip()
    inner = mktree([f"100644 blob {blob}\tescaped.yaml"])
    target = f"HEAD:{under}" if under else "HEAD^{tree}"
    tree = mktree(repo.git("ls-tree", target).splitlines() + [f"040000 tree {inner}\t{name}"])
    if under:  # replace `under` in the root tree with the new subtree
        root = [line for line in repo.git("ls-tree", "HEAD^{tree}").splitlines() if not line.endswith(f"\t{under}")]
        tree = mktree(root + [f"040000 tree {tree}\t{under}"])
    commit = repo.git("commit-tree", tree, "-p", "HEAD", "-m", f"tree with an entry named {name}")
    repo.git("update-ref", "refs/heads/main", commit)
    return commit


@pytest.mark.parametrize("name", ["..", ".", ".git", ".GIT"])
def test_a_tree_git_would_refuse_is_one_problem_naming_the_entry(spec_repo: SpecRepo, tmp_path: Path, name: str) -> None:
    commit = commit_with_entry(spec_repo, name)
    source = GitSource(str(spec_repo.path), tmp_path / "clone")
    assert source.fetch() == commit
    files = source.spec_files(commit)
    assert [(f.path, f.text) for f in files] == [(name, "")]
    problem = files[0].problem
    assert str(problem) == (f"{name}:1: tree: the commit's tree holds an entry named '{name}', which git refuses to "
                            "check out; plnt reads nothing of this commit: remove the entry in a new commit")
    _, problems = load_sources(files)
    assert problems == [problem]


def test_export_refuses_such_a_tree_before_writing_anything(spec_repo: SpecRepo, tmp_path: Path) -> None:
    commit = commit_with_entry(spec_repo, "..", under="registry")
    source = GitSource(str(spec_repo.path), tmp_path / "clone")
    source.fetch()
    dest = tmp_path / "out" / "dest"
    with pytest.raises(UnreadableTree, match=r"entry named '\.\.' \(at 'registry/\.\.'\)"):
        source.export(commit, "registry", dest)
    assert not (tmp_path / "out").exists()  # neither inside dest nor next to it
    with pytest.raises(UnreadableTree):
        source.export(commit, "registry/../..", dest)
    with pytest.raises(UnreadableTree):
        source.read_file(commit, "registry/../backends/local.yaml")
    # The rest of the commit, away from the entry, still reads (GitPython alone would raise ValueError).
    assert source.read_file(commit, "backends/local.yaml") == (spec_repo.path / "backends/local.yaml").read_bytes()


def test_git_spec_files_apply_the_limits_before_reading_blobs(spec_repo: SpecRepo, tmp_path: Path) -> None:
    spec_repo.write("workflowruns/huge.yaml", "# " + "x" * 5000 + "\n")
    (spec_repo.path / "workflowruns" / "latin1.yaml").write_bytes(b"a: 1\nname: caf\xe9\n")
    commit = spec_repo.commit("a large file and a Latin-1 file")
    source = GitSource(str(spec_repo.path), tmp_path / "clone")
    source.fetch()
    files = {f.path: f for f in source.spec_files(commit, SpecLimits(max_file_bytes=4096))}
    assert str(files["workflowruns/huge.yaml"].problem).startswith(
        "workflowruns/huge.yaml:1: document: file is 5003 bytes, over the limit of 4096")
    assert str(files["workflowruns/latin1.yaml"].problem) == (
        "workflowruns/latin1.yaml:2: document: not UTF-8 text: byte 0xe9 at column 10 (invalid continuation byte); "
        "save the file as UTF-8")
    count = len(files)
    limited = source.spec_files(commit, SpecLimits(max_files=count - 1))
    assert len(limited) == 1 and f"more than {count - 1} spec files" in str(limited[0].problem)


def test_is_on_branch_follows_a_force_push(spec_repo: SpecRepo, tmp_path: Path) -> None:
    """Answers are kept per (commit, branch head): a force-push that drops a commit is seen at once."""
    source = GitSource(str(spec_repo.path), tmp_path / "clone")
    base = source.fetch()
    spec_repo.replace("workflowruns/review-responder.yaml", "@1.2.0", "@1.3.0")
    dropped = spec_repo.commit("bump")
    assert source.fetch() == dropped
    assert source.is_on_branch(dropped) and source.is_on_branch(base)
    assert source.is_on_branch(dropped), "asked again (the kept answer)"
    spec_repo.git("reset", "--hard", base)
    spec_repo.replace("workflowruns/review-responder.yaml", "@1.2.0", "@1.4.0")
    replacement = spec_repo.commit("force-pushed instead")
    assert source.fetch() == replacement
    assert not source.is_on_branch(dropped), "force-pushed away: no longer on the branch"
    assert source.is_on_branch(base) and source.is_on_branch(replacement)
    assert not source.is_on_branch("0" * 40), "an unknown commit"
