"""Recipe pull from file: registries (in the spec repository and on disk) into the cache."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from plnt.reconciler.errors import IntegrityMismatch, InvalidRecipe, InvalidSpec, RecipeNotFound
from plnt.reconciler.recipes import locate, pull_recipe
from plnt.reconciler.source import GitSource
from plnt.reconciler.specs import WorkflowSource
from plnt.runner.recipe import directory_digest

from ..conftest import EXAMPLE, SpecRepo

REGISTRY = EXAMPLE / "registry"


@pytest.mark.parametrize(("registry", "expected"), [
    ("file:registry", ("repo", "registry")),
    ("file:./registry", ("repo", "registry")),
    ("file://./registry", ("repo", "registry")),
    ("file:///srv/recipes", ("dir", "/srv/recipes")),
    ("file:/srv/recipes", ("dir", "/srv/recipes")),
])
def test_locate(registry: str, expected: tuple[str, str]) -> None:
    assert locate(registry) == expected


def test_unsupported_scheme_is_a_dead_end() -> None:
    with pytest.raises(InvalidSpec, match="s3:// registry is not supported yet"):
        locate("s3://bucket/prefix")


def no_repo(commit: str, subdir: str, dest: Path) -> bool:
    raise AssertionError("an absolute file registry must not read the spec repository")


def test_pull_from_a_directory_lands_in_the_cache_by_digest(tmp_path: Path) -> None:
    source = WorkflowSource(ref="review-responder@1.2.0", registry=f"file://{REGISTRY}")
    pulled = pull_recipe(source, commit="c", cache=tmp_path / "cache", export_from_repo=no_repo)
    expected = directory_digest(REGISTRY / "review-responder" / "1.2.0")
    assert pulled.digest == expected
    assert pulled.directory == tmp_path / "cache" / expected.removeprefix("sha256:")
    assert (pulled.directory / "workflow.yaml").exists()
    again = pull_recipe(source, commit="c", cache=tmp_path / "cache", export_from_repo=no_repo)
    assert again == pulled
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [pulled.directory.name], "no staging left behind"


def test_pull_from_the_spec_repository_at_a_commit(spec_repo: SpecRepo, tmp_path: Path) -> None:
    git = GitSource(str(spec_repo.path), tmp_path / "clone")
    commit = git.fetch()
    source = WorkflowSource(ref="review-responder@1.3.0", registry="file:registry")
    pulled = pull_recipe(source, commit=commit, cache=tmp_path / "cache", export_from_repo=git.export)
    assert pulled.digest == directory_digest(REGISTRY / "review-responder" / "1.3.0")


def test_integrity_hash_pins_the_recipe(tmp_path: Path) -> None:
    digest = directory_digest(REGISTRY / "review-responder" / "1.2.0")
    good = WorkflowSource(ref="review-responder@1.2.0", registry=f"file://{REGISTRY}", integrity_hash=digest)
    assert pull_recipe(good, commit="c", cache=tmp_path / "cache", export_from_repo=no_repo).digest == digest
    wrong = "sha256:" + "0" * 64
    bad = WorkflowSource(ref="review-responder@1.2.0", registry=f"file://{REGISTRY}", integrity_hash=wrong)
    with pytest.raises(IntegrityMismatch) as caught:
        pull_recipe(bad, commit="c", cache=tmp_path / "cache2", export_from_repo=no_repo)
    assert wrong in str(caught.value) and digest in str(caught.value)
    assert not any((tmp_path / "cache2").iterdir())


def test_missing_version_and_mislabelled_entry(tmp_path: Path) -> None:
    with pytest.raises(RecipeNotFound, match="review-responder@9.9.9 not found"):
        pull_recipe(WorkflowSource(ref="review-responder@9.9.9", registry=f"file://{REGISTRY}"),
                    commit="c", cache=tmp_path / "cache", export_from_repo=no_repo)
    registry = tmp_path / "registry"
    shutil.copytree(REGISTRY / "review-responder" / "1.2.0", registry / "review-responder" / "2.0.0")
    with pytest.raises(InvalidRecipe, match="holds review-responder@1.2.0, not review-responder@2.0.0"):
        pull_recipe(WorkflowSource(ref="review-responder@2.0.0", registry=f"file://{registry}"),
                    commit="c", cache=tmp_path / "cache", export_from_repo=no_repo)
