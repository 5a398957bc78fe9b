"""Recipe pull: fetch a signed recipe archive, check it, verify it, unpack it into the cache.

    registry ─fetch─> archive + bundle ─> integrityHash? ─> Sigstore verify ─> safe extract ─> check as data
                                                                                   │
                                    STATE/recipes/<sha256 of the archive>/ <───────┘ (rename: all or nothing)

Registries by URL scheme (`plnt.reconciler.recipes.registries`): `s3://bucket/prefix`, `oci://host/repo`,
`file:///abs/dir`, and `file:rel/dir`, a directory inside the spec repository read from the tree of
the reconciled commit (so a recipe and the spec naming it can travel in one commit).

Every step fails closed: nothing is cached, so nothing can run, unless the archive matched its pin,
carried a valid signature from a signer a RecipeTrustPolicy trusts, extracted safely and passed
the data-only check (`check_recipe_dir`: workflow.yaml, step graph, entrypoint, module syntax).
plnt never imports a recipe's module: only the runner process serving it does.
A second pull of the same registry/name/version finds the cache entry through a small index and
transfers nothing; its signature is verified again (cheap, offline), so a tightened policy applies
to cached recipes too.
"""

from __future__ import annotations

import functools
import hashlib
import json
import shutil
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from plnt.core.recipe import RecipeError, check_recipe_dir
from plnt.core.specs.loader import SpecError, load_recipe
from plnt.core.specs.models import RecipeTrustPolicy, Workflow, WorkflowSource
from plnt.reconciler.errors import IntegrityMismatch, InvalidRecipe, RecipeNotFound, UnsafeArchive
from plnt.reconciler.recipes.archive import ExtractLimits, archive_digest, extract_archive
from plnt.reconciler.recipes.registries import (
    MAX_BUNDLE_BYTES,
    Fetched,
    RecipeRegistry,
    RegistryOptions,
    open_registry,
    read_bounded,
)
from plnt.reconciler.recipes.trust import VerifiedSignature, verify_recipe
from plnt.reconciler.state import atomic_write_json, read_json

ARCHIVE = "recipe.tar.gz"
BUNDLE = "recipe.tar.gz.sigstore.json"

# (commit, subdir, dest) -> False if the commit has no such directory
ExportFromRepo = Callable[[str, str, Path], bool]
# (commit, path) -> bytes of a file in the spec repository at the commit
ReadFromRepo = Callable[[str, str], bytes]


@dataclass(frozen=True)
class PulledRecipe:
    directory: Path          # the unpacked recipe, what a runner serves
    digest: str              # "sha256:<hex>" of the archive
    name: str
    version: str
    signature: VerifiedSignature
    transferred_bytes: int   # 0 when the cache already had it
    workflow: Workflow       # its workflow.yaml, read as data


def repo_subdir(registry: str) -> str | None:
    """The directory inside the spec repository for `file:rel/dir` registries, else None."""
    if registry.startswith("file://./"):
        return registry.removeprefix("file://./").strip("/")
    if registry.startswith("file:") and not registry.startswith("file:/"):
        return registry.removeprefix("file:").removeprefix("./").strip("/")
    return None


class RepoRegistry:
    """A `file:` registry inside the spec repository, read at one commit (read-only)."""

    def __init__(self, export_from_repo: ExportFromRepo, commit: str, subdir: str) -> None:
        self._export = export_from_repo
        self._commit = commit
        self._subdir = subdir

    def describe(self) -> str:
        return f"file:{self._subdir} in the spec repository at {self._commit[:12]}"

    def fetch(self, name: str, version: str, dest_dir: Path, *, progress: Callable[[int], None] | None = None) -> Fetched:
        scratch = dest_dir / f".export-{uuid.uuid4().hex}"
        try:
            if not self._export(self._commit, f"{self._subdir}/{name}/{version}", scratch) or not (scratch / ARCHIVE).is_file():
                raise RecipeNotFound(f"recipe {name}@{version} not found: no {self._subdir}/{name}/{version}/{ARCHIVE} "
                                     f"in the spec repository at {self._commit[:12]}")
            dest_dir.mkdir(parents=True, exist_ok=True)
            archive = dest_dir / ARCHIVE
            (scratch / ARCHIVE).rename(archive)
            bundle: Path | None = dest_dir / BUNDLE
            if (scratch / BUNDLE).is_file():
                (scratch / BUNDLE).rename(bundle)  # type: ignore[arg-type]
            else:
                bundle = None
            size = archive.stat().st_size + (bundle.stat().st_size if bundle else 0)
            if progress is not None:
                progress(size)
            return Fetched(archive=archive, bundle=bundle, archive_sha256=archive_digest(archive), transferred_bytes=size)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    def push(self, name: str, version: str, archive: Path, bundle: Path | None) -> str:
        raise NotImplementedError("a registry inside the spec repository is published by committing to it")


class RecipeCache:
    """STATE/recipes: entries by archive digest, and an index from (registry, name, version) to them."""

    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "index").mkdir(parents=True, exist_ok=True)
        # A pull killed midway leaves its staging directory: never an entry, only litter.
        for leftover in root.glob(".staging-*"):
            shutil.rmtree(leftover, ignore_errors=True)

    def entry(self, digest: str) -> Path:
        return self.root / digest.removeprefix("sha256:")

    def lookup(self, registry: str, name: str, version: str) -> Path | None:
        record = read_json(self._index_file(registry, name, version))
        if not record:
            return None
        entry = self.entry(record["digest"])
        return entry if (entry / "recipe" / "workflow.yaml").is_file() else None

    def remember(self, registry: str, name: str, version: str, digest: str) -> None:
        atomic_write_json(self._index_file(registry, name, version),
                          {"registry": registry, "name": name, "version": version, "digest": digest})

    def staging(self) -> Path:
        path = self.root / f".staging-{uuid.uuid4().hex}"
        path.mkdir(parents=True)
        return path

    def _index_file(self, registry: str, name: str, version: str) -> Path:
        key = hashlib.sha256(f"{registry}\n{name}\n{version}".encode()).hexdigest()
        return self.root / "index" / f"{key}.json"


def pull_recipe(
    source: WorkflowSource,
    *,
    commit: str,
    cache: RecipeCache,
    policies: Iterable[RecipeTrustPolicy],
    read_from_repo: ReadFromRepo,
    export_from_repo: ExportFromRepo,
    registry_options: RegistryOptions = RegistryOptions(),
    limits: ExtractLimits = ExtractLimits(),
    progress: Callable[[int], None] | None = None,
    registry: RecipeRegistry | None = None,
    policy_commit: str | None = None,
) -> PulledRecipe:
    """`policy_commit`: where the policies' trusted roots are read, when not `commit` (a preview
    verifies with the tracked branch's policies, never with those of the pull request)."""
    policies = list(policies)
    roots_at = policy_commit or commit

    def verify(archive_hex: str, bundle: bytes | None) -> VerifiedSignature:
        return verify_recipe(archive_hex, bundle, recipe=source.name, policies=policies,
                             load_trusted_root=lambda path: read_from_repo(roots_at, path))

    cached = cache.lookup(source.registry, source.name, source.version)
    if cached is not None:
        digest = f"sha256:{cached.name}"
        _check_pin(source, digest)
        bundle_file = cached / BUNDLE
        bundle = read_bounded(bundle_file, MAX_BUNDLE_BYTES, what=f"the bundle of recipe {source.ref} in the cache",
                              remedy=f"remove {cached} and plnt fetches the recipe again") \
            if bundle_file.exists() else None
        signature = verify(cached.name, bundle)
        try:
            workflow = load_recipe(cached / "recipe" / "workflow.yaml")
        except SpecError as exc:  # an entry is checked before it is cached: only a damaged cache gets here
            raise InvalidRecipe(f"recipe {source.ref} in the cache: {exc}") from exc
        return PulledRecipe(cached / "recipe", digest, source.name, source.version, signature, transferred_bytes=0,
                            workflow=workflow)

    if registry is None:
        subdir = repo_subdir(source.registry)
        registry = (RepoRegistry(export_from_repo, commit, subdir) if subdir is not None
                    else _shared_registry(source.registry, registry_options))
    staging = cache.staging()
    try:
        fetched = registry.fetch(source.name, source.version, staging, progress=progress)
        _check_pin(source, fetched.archive_sha256)
        bundle = None if fetched.bundle is None else read_bounded(
            fetched.bundle, MAX_BUNDLE_BYTES, what=f"the bundle of recipe {source.ref} from {registry.describe()}")
        signature = verify(fetched.archive_sha256.removeprefix("sha256:"), bundle)
        try:
            extract_archive(fetched.archive, staging / "recipe", limits)
        except UnsafeArchive as exc:  # name the recipe and registry, not our staging path
            message = str(exc).replace(str(fetched.archive), ARCHIVE)
            raise UnsafeArchive(f"recipe {source.ref} from {registry.describe()}: {message}") from exc
        try:
            recipe = check_recipe_dir(staging / "recipe")
        except RecipeError as exc:
            raise InvalidRecipe(f"recipe {source.ref}: {exc.problem}") from exc
        if (recipe.name, recipe.version) != (source.name, source.version):
            raise InvalidRecipe(f"{registry.describe()} serves {recipe.name}@{recipe.version} as {source.ref}")
        final = cache.entry(fetched.archive_sha256)
        if not final.exists():
            staging.rename(final)  # one rename: an entry is complete or absent
        cache.remember(source.registry, source.name, source.version, fetched.archive_sha256)
        (final / "signature.json").write_text(json.dumps(signature.__dict__, default=str))
        return PulledRecipe(final / "recipe", fetched.archive_sha256, source.name, source.version, signature,
                            transferred_bytes=fetched.transferred_bytes, workflow=recipe.workflow)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


@functools.lru_cache(maxsize=32)
def _shared_registry(url: str, options: RegistryOptions) -> RecipeRegistry:
    """Registry clients are reused: building a boto3 client costs about 100 ms."""
    return open_registry(url, options)


def _check_pin(source: WorkflowSource, digest: str) -> None:
    if source.integrity_hash is not None and source.integrity_hash != digest:
        raise IntegrityMismatch(
            f"recipe {source.ref}: integrityHash {source.integrity_hash} does not match the archive's sha256 {digest}"
        )
