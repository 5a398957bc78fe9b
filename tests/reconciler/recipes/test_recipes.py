"""The recipe pull pipeline with real registries (file, S3 on moto, OCI on distribution), real
Sigstore verification against test trust roots generated at test start, and real archives.

The signatures come from TestSigstoreAuthority (tests/sigstore_ca.py), a STAND-IN for Sigstore's
public services (Fulcio, Rekor) and an OIDC issuer; moto_server stands in for S3."""

from __future__ import annotations

import io
import tarfile
import uuid
from pathlib import Path
from typing import Any

import pytest
from plnt.core.specs.models import RecipeTrustPolicy, WorkflowSource
from plnt.reconciler.errors import (
    DigestMismatch,
    IntegrityMismatch,
    InvalidRecipe,
    RecipeNotFound,
    UnsafeArchive,
    VerificationFailed,
)
from plnt.reconciler.recipes.archive import ExtractLimits, pack_recipe_to
from plnt.reconciler.recipes.pull import RecipeCache, pull_recipe, repo_subdir
from plnt.reconciler.recipes.registries import RegistryOptions, open_registry
from plnt.reconciler.source.git import GitSource

from tests.conftest import EXAMPLE, SpecRepo
from tests.services import OciServer, S3Bucket
from tests.sigstore_ca import TestSigstoreAuthority

SOURCE = EXAMPLE / "recipes" / "review-responder" / "1.2.0"
IDENTITY, ISSUER = "release@recipes.test", "https://issuer.test"


def policy(identity: str = IDENTITY, issuer: str = ISSUER, recipes: tuple[str, ...] = ("review-responder",)) -> RecipeTrustPolicy:
    return RecipeTrustPolicy.model_validate({
        "apiVersion": "plnt.work/v1", "kind": "RecipeTrustPolicy", "metadata": {"name": "test"},
        "spec": {"recipes": list(recipes), "trustRoot": {"trustedRootFile": "trust/root.json"},
                 "signers": [{"issuer": issuer, "identity": identity}]}})


class Publisher:
    """Packs, signs (with a test authority) and pushes recipes, as a recipe author's CI would."""

    def __init__(self, tmp: Path, authority: TestSigstoreAuthority) -> None:
        self.tmp = tmp
        self.authority = authority

    def build(self, source: Path = SOURCE, *, identity: str = IDENTITY, issuer: str = ISSUER,
              signer: TestSigstoreAuthority | None = None, sign: bool = True) -> tuple[Path, Path | None, str]:
        out = self.tmp / f"build-{len(list(self.tmp.glob('build-*')))}"
        out.mkdir()
        archive = out / "recipe.tar.gz"
        digest = pack_recipe_to(source, archive)
        bundle = None
        if sign:
            bundle = out / "recipe.tar.gz.sigstore.json"
            bundle.write_text((signer or self.authority).sign(archive, identity, issuer))
        return archive, bundle, digest


@pytest.fixture
def authority() -> TestSigstoreAuthority:
    return TestSigstoreAuthority(name="recipes-test")


@pytest.fixture
def publisher(tmp_path: Path, authority: TestSigstoreAuthority) -> Publisher:
    return Publisher(tmp_path, authority)


# The operator's own choice (like `plnt recipe push --to file:///dir`): file:/// anywhere, and the
# session's loopback OCI registry over plain HTTP is passed per test.
ANY_DIR = RegistryOptions(file_roots=None)


def pull(url: str, authority: TestSigstoreAuthority, cache: Path, *, ref: str = "review-responder@1.2.0",
         pin: str | None = None, policies: list[RecipeTrustPolicy] | None = None, **kwargs: Any):
    kwargs.setdefault("registry_options", ANY_DIR)
    return pull_recipe(
        WorkflowSource(ref=ref, registry=url, integrity_hash=pin), commit="c0ffee", cache=RecipeCache(cache),
        policies=[policy()] if policies is None else policies,
        read_from_repo=lambda commit, path: authority.trusted_root_json().encode(),
        export_from_repo=lambda *a: pytest.fail("not a repository registry"), **kwargs)


@pytest.fixture(params=["file", pytest.param("s3", marks=pytest.mark.integration),
                        pytest.param("oci", marks=pytest.mark.integration)])
def registry(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, RegistryOptions]:
    """A real registry of each kind: its URL and the options that reach it."""
    if request.param == "file":
        return f"file://{tmp_path / 'registry'}", RegistryOptions(file_roots=(str(tmp_path),))
    if request.param == "s3":
        bucket: S3Bucket = request.getfixturevalue("s3_bucket")
        return bucket.url("recipes"), RegistryOptions(s3_endpoint_url=bucket.endpoint_url)
    server: OciServer = request.getfixturevalue("oci_registry")
    return f"oci://{server.address}/plnt-tests/{uuid.uuid4().hex[:12]}", RegistryOptions(allow_insecure_http=(server.address,))


def test_good_recipe_from_each_registry(registry: tuple[str, RegistryOptions], publisher: Publisher,
                                        authority: TestSigstoreAuthority, tmp_path: Path) -> None:
    url, options = registry
    archive, bundle, digest = publisher.build()
    open_registry(url, options).push("review-responder", "1.2.0", archive, bundle)
    pulled = pull(url, authority, tmp_path / "cache", pin=digest, registry_options=options)
    assert pulled.digest == digest and pulled.transferred_bytes > archive.stat().st_size
    assert (pulled.directory / "workflow.yaml").read_text() == (SOURCE / "workflow.yaml").read_text()
    assert pulled.signature.identity == IDENTITY
    # The second pull of the same version transfers nothing and still verifies.
    again = pull(url, authority, tmp_path / "cache", registry_options=options)
    assert again.directory == pulled.directory and again.transferred_bytes == 0


@pytest.mark.integration
def test_second_pull_does_not_touch_the_registry(s3_bucket: S3Bucket, publisher: Publisher,
                                                 authority: TestSigstoreAuthority, tmp_path: Path) -> None:
    """`Counting` wraps the real S3 registry (a stand-in that counts fetches, then delegates)."""
    registry = open_registry(s3_bucket.url(), RegistryOptions(s3_endpoint_url=s3_bucket.endpoint_url))
    registry.push("review-responder", "1.2.0", *publisher.build()[:2])
    fetches: list[str] = []

    class Counting:
        def describe(self) -> str:
            return registry.describe()

        def fetch(self, *args: Any, **kwargs: Any):
            fetches.append(args[1])
            return registry.fetch(*args, **kwargs)

    for _ in range(3):
        pull(s3_bucket.url(), authority, tmp_path / "cache", registry=Counting())
    assert fetches == ["1.2.0"]


@pytest.mark.parametrize(("case", "reason"), [
    ("tampered", "tampered"), ("wrong identity", "wrong-identity"), ("wrong issuer", "wrong-issuer"),
    ("untrusted root", "untrusted-root"), ("missing bundle", "unsigned"), ("no policy", "no-policy"),
])
def test_verification_failures_fail_closed(case: str, reason: str, publisher: Publisher,
                                           authority: TestSigstoreAuthority, tmp_path: Path) -> None:
    registry_dir = tmp_path / "registry"
    kwargs: dict[str, Any] = {}
    if case == "wrong identity":
        archive, bundle, _ = publisher.build(identity="attacker@recipes.test")
    elif case == "wrong issuer":
        archive, bundle, _ = publisher.build(issuer="https://evil.test")
    elif case == "untrusted root":
        archive, bundle, _ = publisher.build(signer=TestSigstoreAuthority(name="other"))
    elif case == "missing bundle":
        archive, bundle, _ = publisher.build(sign=False)
    else:
        archive, bundle, _ = publisher.build()
    if case == "no policy":
        kwargs["policies"] = [policy(recipes=("someone-else",))]
    open_registry(f"file://{registry_dir}", ANY_DIR).push("review-responder", "1.2.0", archive, bundle)
    if case == "tampered":  # the registry serves other bytes under the signed name
        stored = registry_dir / "review-responder" / "1.2.0" / "recipe.tar.gz"
        other = tmp_path / "other.tar.gz"
        stored.write_bytes(_tar({"workflow.yaml": b"x"}))
        assert stored.read_bytes() != archive.read_bytes()
        del other
    with pytest.raises(VerificationFailed) as caught:
        pull(f"file://{registry_dir}", authority, tmp_path / "cache", **kwargs)
    assert caught.value.reason == reason
    assert _cache_entries(tmp_path / "cache") == [], "nothing unverified is cached"


def test_integrity_pin_mismatch_names_both_hashes(publisher: Publisher, authority: TestSigstoreAuthority,
                                                  tmp_path: Path) -> None:
    archive, bundle, digest = publisher.build()
    open_registry(f"file://{tmp_path / 'registry'}", ANY_DIR).push("review-responder", "1.2.0", archive, bundle)
    wrong = "sha256:" + "0" * 64
    with pytest.raises(IntegrityMismatch) as caught:
        pull(f"file://{tmp_path / 'registry'}", authority, tmp_path / "cache", pin=wrong)
    assert wrong in str(caught.value) and digest in str(caught.value)


def _tar(members: dict[str, bytes], *, link: tuple[str, str] | None = None) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        if link:
            info = tarfile.TarInfo(link[0])
            info.type, info.linkname = tarfile.SYMTYPE, link[1]
            tar.addfile(info)
    return raw.getvalue()


@pytest.mark.parametrize(("members", "link", "limits", "message"), [
    ({"workflow.yaml": b"x", "../../evil.py": b"boom"}, None, ExtractLimits(), ".."),
    ({"workflow.yaml": b"x"}, ("knowledge", "/etc"), ExtractLimits(), "link"),
    ({"workflow.yaml": b"x" * 4096}, None, ExtractLimits(max_total_bytes=1024), "max_total_bytes=1024"),
], ids=["path-traversal", "link-escaping", "over-size-limit"])
def test_signed_but_unsafe_archives_are_refused(members: dict[str, bytes], link: tuple[str, str] | None,
                                                limits: ExtractLimits, message: str, authority: TestSigstoreAuthority,
                                                tmp_path: Path) -> None:
    """A valid signature does not make an archive safe to unpack."""
    build = tmp_path / "build"
    build.mkdir()
    archive = build / "recipe.tar.gz"
    archive.write_bytes(_tar(members, link=link))
    bundle = build / "recipe.tar.gz.sigstore.json"
    bundle.write_text(authority.sign(archive, IDENTITY, ISSUER))
    open_registry(f"file://{tmp_path / 'registry'}", ANY_DIR).push("review-responder", "1.2.0", archive, bundle)
    with pytest.raises(UnsafeArchive) as caught:
        pull(f"file://{tmp_path / 'registry'}", authority, tmp_path / "cache", limits=limits)
    assert message in str(caught.value).lower() and "review-responder@1.2.0" in str(caught.value)
    assert ".staging" not in str(caught.value)
    assert _cache_entries(tmp_path / "cache") == []
    assert not (tmp_path / "evil.py").exists()


@pytest.mark.integration
def test_oci_blob_swapped_in_the_registry_is_refused(oci_registry: OciServer, publisher: Publisher,
                                                     authority: TestSigstoreAuthority, tmp_path: Path) -> None:
    url = f"oci://{oci_registry.address}/plnt-tests/swapped"
    options = RegistryOptions(allow_insecure_http=(oci_registry.address,))
    archive, bundle, digest = publisher.build()
    open_registry(url, options).push("review-responder", "1.2.0", archive, bundle)
    blob = oci_registry.blob_file(digest)
    blob.write_bytes(b"\x00" * blob.stat().st_size)
    with pytest.raises(DigestMismatch, match=digest.removeprefix("sha256:")[:12]):
        pull(url, authority, tmp_path / "cache", registry_options=options)
    assert _cache_entries(tmp_path / "cache") == []


def test_missing_version_and_mislabelled_archive(publisher: Publisher, authority: TestSigstoreAuthority,
                                                 tmp_path: Path) -> None:
    url = f"file://{tmp_path / 'registry'}"
    with pytest.raises(RecipeNotFound):
        pull(url, authority, tmp_path / "cache", ref="review-responder@9.9.9")
    archive, bundle, _ = publisher.build()
    open_registry(url, ANY_DIR).push("review-responder", "2.0.0", archive, bundle)  # 1.2.0's archive pushed as 2.0.0
    with pytest.raises(InvalidRecipe, match="serves review-responder@1.2.0 as review-responder@2.0.0"):
        pull(url, authority, tmp_path / "cache", ref="review-responder@2.0.0")


def test_interrupted_pull_leaves_no_entry_and_the_retry_succeeds(publisher: Publisher, authority: TestSigstoreAuthority,
                                                                 tmp_path: Path) -> None:
    """`DiesMidway` is a stand-in registry whose transfer breaks off after writing half a file."""
    url = f"file://{tmp_path / 'registry'}"
    open_registry(url, ANY_DIR).push("review-responder", "1.2.0", *publisher.build()[:2])
    registry = open_registry(url, ANY_DIR)

    class DiesMidway:
        def describe(self) -> str:
            return "a registry whose transfer breaks off"

        def fetch(self, name: str, version: str, dest_dir: Path, **kwargs: Any):
            (dest_dir / "recipe.tar.gz.partial").write_bytes(b"half an archive")
            raise ConnectionResetError("connection reset by peer")

    with pytest.raises(ConnectionResetError):
        pull(url, authority, tmp_path / "cache", registry=DiesMidway())
    assert _cache_entries(tmp_path / "cache") == [] and not list((tmp_path / "cache").glob(".staging-*"))
    assert pull(url, authority, tmp_path / "cache", registry=registry).transferred_bytes > 0


def test_a_pull_killed_midway_leaves_nothing_that_passes_for_an_entry(publisher: Publisher,
                                                                      authority: TestSigstoreAuthority, tmp_path: Path) -> None:
    url = f"file://{tmp_path / 'registry'}"
    archive, bundle, digest = publisher.build()
    open_registry(url, ANY_DIR).push("review-responder", "1.2.0", archive, bundle)
    # What a process killed in the middle of a pull leaves: a staging directory with part of the work.
    cache_dir = tmp_path / "cache"
    RecipeCache(cache_dir)
    leftover = cache_dir / ".staging-killed"
    (leftover / "recipe").mkdir(parents=True)
    (leftover / "recipe.tar.gz").write_bytes(archive.read_bytes()[:100])
    (leftover / "recipe" / "workflow.yaml").write_text("half")
    cache = RecipeCache(cache_dir)  # the next plnt start
    assert cache.lookup(url, "review-responder", "1.2.0") is None
    assert not leftover.exists()
    pulled = pull(url, authority, cache_dir)
    assert pulled.digest == digest and pulled.transferred_bytes > 0


def test_registry_inside_the_spec_repository(spec_repo: SpecRepo, tmp_path: Path) -> None:
    """The example's own demo registry and trust policy, read from a commit."""
    git = GitSource(str(spec_repo.path), tmp_path / "clone")
    commit = git.fetch()
    from plnt.core.specs.loader import load_sources

    specs, problems = load_sources(git.spec_files(commit))
    assert problems == []
    pulled = pull_recipe(
        WorkflowSource(ref="review-responder@1.3.0", registry="file:registry"), commit=commit,
        cache=RecipeCache(tmp_path / "cache"), policies=specs.trust_policies.values(),
        read_from_repo=git.read_file, export_from_repo=git.export)
    assert pulled.version == "1.3.0" and pulled.signature.identity == "recipes@demo.plnt.invalid"
    assert repo_subdir("file:registry") == "registry" and repo_subdir("file://./registry") == "registry"
    assert repo_subdir("file:///srv/r") is None and repo_subdir("s3://b/p") is None


def _cache_entries(cache: Path) -> list[str]:
    return sorted(p.name for p in cache.iterdir() if not p.name.startswith(".") and p.name != "index") if cache.exists() else []
