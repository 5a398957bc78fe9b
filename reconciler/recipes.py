"""Recipe pull: fetch a recipe from its registry into the content-addressed cache.

Registries by URL scheme. For now `file:` only (s3:// and oci:// arrive with signed recipes):
  - `file:///abs/dir`: a directory on this machine;
  - `file:rel/dir` (or `file://./rel/dir`): a directory inside the spec repository, read from the
    tree of the reconciled commit, so a recipe and the spec naming it travel in one commit.
Layout: `<registry>/<name>/<version>/` holding `workflow.yaml`, the module, optional golden.yaml
and knowledge files.

A pulled recipe lands in STATE/recipes/<hex>/, where <hex> is its canonical directory digest
(`plnt.runner.recipe.directory_digest`); `integrityHash: sha256:<hex>` on the WorkflowRun pins it.
The copy is made in a temporary directory and renamed into place, so an interrupted pull never
leaves an entry that looks complete.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from plnt.runner.recipe import RecipeError, directory_digest, load_recipe_dir

from .errors import IntegrityMismatch, InvalidRecipe, InvalidSpec, RecipeNotFound
from .specs import WorkflowSource

# (commit, subdir, dest) -> False if the commit has no such directory
ExportFromRepo = Callable[[str, str, Path], bool]


@dataclass(frozen=True)
class PulledRecipe:
    directory: Path
    digest: str
    name: str
    version: str


def locate(registry: str) -> tuple[str, str]:
    """("repo", subdir) for a registry inside the spec repository, ("dir", path) for an absolute one."""
    if registry.startswith("file://./"):
        return "repo", registry.removeprefix("file://./")
    if registry.startswith("file://"):
        return "dir", registry.removeprefix("file://")
    if registry.startswith("file:"):
        rest = registry.removeprefix("file:")
        return ("dir", rest) if rest.startswith("/") else ("repo", rest.removeprefix("./"))
    scheme = registry.split("://", 1)[0]
    raise InvalidSpec(f"registry {registry!r}: the {scheme}:// registry is not supported yet; use a file: registry")


def pull_recipe(source: WorkflowSource, *, commit: str, cache: Path, export_from_repo: ExportFromRepo) -> PulledRecipe:
    kind, where = locate(source.registry)
    entry = f"{where.rstrip('/')}/{source.name}/{source.version}"
    cache.mkdir(parents=True, exist_ok=True)
    staging = cache / f".pull-{uuid.uuid4().hex}"
    try:
        if kind == "repo":
            found = export_from_repo(commit, entry, staging)
        else:
            found = Path(entry).is_dir()
            if found:
                shutil.copytree(entry, staging, symlinks=False, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        if not found:
            where_text = f"the spec repository at {commit[:12]}" if kind == "repo" else "this machine"
            raise RecipeNotFound(f"recipe {source.ref} not found: no directory {entry} in {where_text}")
        digest = directory_digest(staging)
        if source.integrity_hash is not None and source.integrity_hash != digest:
            raise IntegrityMismatch(
                f"recipe {source.ref}: integrityHash {source.integrity_hash} does not match the recipe's "
                f"canonical directory digest {digest}"
            )
        try:
            recipe = load_recipe_dir(staging)
        except RecipeError as exc:
            raise InvalidRecipe(f"recipe {source.ref}: {exc.problem}") from exc
        if (recipe.name, recipe.version) != (source.name, source.version):
            raise InvalidRecipe(
                f"registry entry {entry} holds {recipe.name}@{recipe.version}, not {source.ref}"
            )
        final = cache / digest.removeprefix("sha256:")
        if not final.exists():
            staging.rename(final)
        return PulledRecipe(directory=final, digest=digest, name=source.name, version=source.version)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
