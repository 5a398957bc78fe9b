"""Recipe registries (file:, s3://, oci://) against real local services (moto_server standing in
for S3, CNCF distribution for an OCI registry): round trips, missing
recipes, digest checks, unreachable registries, plain-HTTP refusal, progress and interrupted fetches."""

from __future__ import annotations

import hashlib
import json
import os
import random
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from plnt.reconciler.errors import DigestMismatch, InvalidSpec, RecipeNotFound, RegistryUnavailable
from plnt.reconciler.recipes.registries import (
    ARCHIVE_MEDIA_TYPE,
    ARCHIVE_NAME,
    BUNDLE_MEDIA_TYPE,
    BUNDLE_NAME,
    FileRegistry,
    OciRegistry,
    RecipeRegistry,
    RegistryOptions,
    S3Registry,
    oci_tag,
    open_registry,
)

from tests.services import OciServer, S3Bucket, TruncatingProxy, free_port

NAME = "review-responder"
SEED = 20251130


def seeded(request: pytest.FixtureRequest) -> random.Random:
    """Test data bytes: reproducible (seeded), and different per test (blobs are shared by digest
    in the session's OCI registry, and one test swaps a blob's bytes in its storage)."""
    return random.Random(f"{SEED}:{request.node.nodeid}")
MiB = 1024 * 1024
ANY_DIR = RegistryOptions(file_roots=None)  # the operator's own command (plnt recipe push --to file:///dir)


@dataclass
class Published:
    archive: Path
    bundle: Path
    archive_bytes: bytes
    bundle_bytes: bytes

    @property
    def archive_sha256(self) -> str:
        return "sha256:" + hashlib.sha256(self.archive_bytes).hexdigest()


@pytest.fixture
def published(tmp_path: Path, request: pytest.FixtureRequest) -> Published:
    """A 2 MiB random archive (opaque here) and a small bundle, under names unlike the registry's."""
    src = tmp_path / "src"
    src.mkdir()
    rng = seeded(request)
    archive_bytes = rng.randbytes(2 * MiB + 12345)
    bundle_bytes = json.dumps({"mediaType": BUNDLE_MEDIA_TYPE, "nonce": rng.randbytes(8).hex()}).encode()
    (src / "built.tgz").write_bytes(archive_bytes)
    (src / "built.sig.json").write_bytes(bundle_bytes)
    return Published(src / "built.tgz", src / "built.sig.json", archive_bytes, bundle_bytes)


@dataclass
class Backend:
    kind: str
    url: str
    options: RegistryOptions
    base_dir: Path | None = None

    def open(self, **changes: object) -> RecipeRegistry:
        options = RegistryOptions(**{**self.options.__dict__, **changes})
        return open_registry(self.url, options, base_dir=self.base_dir)


def _file_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    (tmp_path / "registry").mkdir()
    return Backend("file", "file:registry", RegistryOptions(), base_dir=tmp_path)


def _s3_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    bucket: S3Bucket = request.getfixturevalue("s3_bucket")
    return Backend("s3", bucket.url("team/recipes"),
                   RegistryOptions(s3_endpoint_url=bucket.endpoint_url, s3_region=bucket.region, timeout_s=10))


def _oci_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    server: OciServer = request.getfixturevalue("oci_registry")
    return Backend("oci", f"oci://{server.address}/plnt/t{os.urandom(4).hex()}",
                   RegistryOptions(timeout_s=10, allow_insecure_http=(server.address,)))


BACKENDS: dict[str, Callable[[pytest.FixtureRequest, Path], Backend]] = {
    "file": _file_backend, "s3": _s3_backend, "oci": _oci_backend,
}


@pytest.fixture(params=[
    "file",
    pytest.param("s3", marks=pytest.mark.integration),
    pytest.param("oci", marks=pytest.mark.integration),
])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    return BACKENDS[request.param](request, tmp_path)


def test_push_then_fetch_round_trip(backend: Backend, published: Published, tmp_path: Path) -> None:
    registry = backend.open()
    location = registry.push(NAME, "1.2.0", published.archive, published.bundle)
    assert NAME in location and "1.2.0" in location

    fetched = registry.fetch(NAME, "1.2.0", tmp_path / "out")

    assert fetched.archive == tmp_path / "out" / ARCHIVE_NAME
    assert fetched.bundle == tmp_path / "out" / BUNDLE_NAME
    assert fetched.archive.read_bytes() == published.archive_bytes
    assert fetched.bundle.read_bytes() == published.bundle_bytes
    assert fetched.archive_sha256 == published.archive_sha256
    assert fetched.transferred_bytes == len(published.archive_bytes) + len(published.bundle_bytes)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [ARCHIVE_NAME, BUNDLE_NAME]
    assert backend.kind in type(registry).__name__.lower()
    assert isinstance(registry, RecipeRegistry)


def test_missing_version_is_recipe_not_found(backend: Backend, published: Published, tmp_path: Path) -> None:
    registry = backend.open()
    registry.push(NAME, "1.2.0", published.archive, published.bundle)
    registry.fetch(NAME, "1.2.0", tmp_path / "out")  # an earlier fetch into the same directory...
    with pytest.raises(RecipeNotFound, match="1.9.9"):
        registry.fetch(NAME, "1.9.9", tmp_path / "out")
    with pytest.raises(RecipeNotFound):
        registry.fetch("no-such-recipe", "1.2.0", tmp_path / "out")
    assert list((tmp_path / "out").iterdir()) == []  # ...leaves nothing that looks like this one's result


def test_unsigned_recipe_has_no_bundle(backend: Backend, published: Published, tmp_path: Path) -> None:
    registry = backend.open()
    registry.push(NAME, "2.0.0", published.archive, published.bundle)
    registry.push(NAME, "2.0.0", published.archive, None)  # re-push unsigned: the old bundle must not linger

    fetched = registry.fetch(NAME, "2.0.0", tmp_path / "out")

    assert fetched.bundle is None
    assert not (tmp_path / "out" / BUNDLE_NAME).exists()
    assert fetched.archive.read_bytes() == published.archive_bytes
    assert fetched.transferred_bytes == len(published.archive_bytes)


def test_progress_is_reported_about_every_mebibyte(backend: Backend, tmp_path: Path) -> None:
    archive = tmp_path / "big.tgz"
    archive.write_bytes(random.Random(f"{SEED}:progress:{backend.kind}").randbytes(4 * MiB + 1))
    registry = backend.open()
    registry.push(NAME, "3.0.0", archive, None)
    seen: list[int] = []

    fetched = registry.fetch(NAME, "3.0.0", tmp_path / "out", progress=seen.append)

    assert len(seen) >= 4
    assert seen == sorted(seen)
    assert seen[-1] == fetched.transferred_bytes == 4 * MiB + 1
    assert all(b - a <= MiB + 64 * 1024 for a, b in zip([0, *seen], seen, strict=False))


def test_a_new_fetch_replaces_an_old_one_in_the_same_directory(backend: Backend, published: Published,
                                                                tmp_path: Path) -> None:
    registry = backend.open()
    registry.push(NAME, "1.0.0", published.archive, published.bundle)
    registry.fetch(NAME, "1.0.0", tmp_path / "out")
    registry.push(NAME, "1.0.1", published.archive, None)
    fetched = registry.fetch(NAME, "1.0.1", tmp_path / "out")
    assert fetched.bundle is None and not (tmp_path / "out" / BUNDLE_NAME).exists()


# --- file: ------------------------------------------------------------------------------------------


def test_file_urls(tmp_path: Path) -> None:
    absolute = open_registry(f"file://{tmp_path}/abs", ANY_DIR)
    assert isinstance(absolute, FileRegistry) and absolute.root == tmp_path / "abs"
    assert open_registry(f"file:{tmp_path}/abs", ANY_DIR).root == tmp_path / "abs"  # type: ignore[attr-defined]
    assert open_registry("file:rel/dir", base_dir=tmp_path).root == tmp_path / "rel" / "dir"  # type: ignore[attr-defined]
    assert open_registry("file://./rel", base_dir=tmp_path).root == tmp_path / "rel"  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="base_dir"):
        open_registry("file:rel/dir")
    with pytest.raises(InvalidSpec):
        open_registry("file:../outside", base_dir=tmp_path)
    with pytest.raises(InvalidSpec, match="unsupported scheme"):
        open_registry("ftp://example.com/recipes")


def test_file_layout(tmp_path: Path, published: Published) -> None:
    registry = open_registry(f"file://{tmp_path}/reg", ANY_DIR)
    registry.push(NAME, "1.2.0", published.archive, published.bundle)
    entry = tmp_path / "reg" / NAME / "1.2.0"
    assert sorted(p.name for p in entry.iterdir()) == [ARCHIVE_NAME, BUNDLE_NAME]
    with pytest.raises(ValueError):
        registry.fetch("../escape", "1.2.0", tmp_path / "out")


# --- s3:// ------------------------------------------------------------------------------------------


@pytest.mark.integration
def test_s3_layout_and_recorded_digest(s3_bucket: S3Bucket, published: Published) -> None:
    registry = S3Registry(s3_bucket.url("team/recipes"),
                          RegistryOptions(s3_endpoint_url=s3_bucket.endpoint_url, s3_region=s3_bucket.region))
    location = registry.push(NAME, "1.2.0", published.archive, published.bundle)
    key = f"team/recipes/{NAME}/1.2.0/{ARCHIVE_NAME}"
    assert location == f"s3://{s3_bucket.name}/{key}"
    keys = sorted(o["Key"] for o in s3_bucket.client.list_objects_v2(Bucket=s3_bucket.name)["Contents"])
    assert keys == [key, f"team/recipes/{NAME}/1.2.0/{BUNDLE_NAME}"]
    head = s3_bucket.client.head_object(Bucket=s3_bucket.name, Key=key)
    assert "sha256:" + head["Metadata"]["sha256"] == published.archive_sha256


@pytest.mark.integration
def test_s3_object_not_matching_its_recorded_digest_is_a_digest_mismatch(s3_bucket: S3Bucket, published: Published,
                                                                         tmp_path: Path) -> None:
    key = f"recipes/{NAME}/1.2.0/{ARCHIVE_NAME}"
    s3_bucket.client.put_object(Bucket=s3_bucket.name, Key=key, Body=b"other bytes",
                                Metadata={"sha256": published.archive_sha256.removeprefix("sha256:")})
    registry = S3Registry(s3_bucket.url("recipes"), RegistryOptions(s3_endpoint_url=s3_bucket.endpoint_url,
                                                                    s3_region=s3_bucket.region))
    with pytest.raises(DigestMismatch, match=published.archive_sha256):
        registry.fetch(NAME, "1.2.0", tmp_path / "out")
    assert list((tmp_path / "out").iterdir()) == []


@pytest.mark.integration
def test_s3_missing_bucket_is_recipe_not_found(s3_bucket: S3Bucket, tmp_path: Path) -> None:
    registry = open_registry("s3://no-such-bucket-plnt/recipes",
                             RegistryOptions(s3_endpoint_url=s3_bucket.endpoint_url, s3_region=s3_bucket.region))
    with pytest.raises(RecipeNotFound, match="no-such-bucket-plnt"):
        registry.fetch(NAME, "1.2.0", tmp_path / "out")


@pytest.mark.integration
def test_s3_fetch_broken_off_midway_leaves_no_archive_and_the_next_fetch_succeeds(
        s3_bucket: S3Bucket, published: Published, tmp_path: Path) -> None:
    """TruncatingProxy (tests/services.py) stands in for a network that drops the connection midway."""
    seeding = S3Registry(s3_bucket.url(), RegistryOptions(s3_endpoint_url=s3_bucket.endpoint_url, s3_region=s3_bucket.region))
    seeding.push(NAME, "1.2.0", published.archive, published.bundle)
    upstream = s3_bucket.endpoint_url.removeprefix("http://")
    out = tmp_path / "out"
    with TruncatingProxy(upstream, cut_after=MiB + MiB // 2) as proxy:
        # one attempt per request: a botocore retry must not hide the broken transfer
        registry = open_registry(s3_bucket.url(), RegistryOptions(s3_endpoint_url=proxy.url, s3_region=s3_bucket.region,
                                                                  s3_max_attempts=1, timeout_s=10))
        seen: list[int] = []
        with pytest.raises(RegistryUnavailable, match="broke off"):
            registry.fetch(NAME, "1.2.0", out, progress=seen.append)
        assert proxy.cuts == 1
        assert seen and seen[-1] < len(published.archive_bytes)  # bytes did arrive before the cut
        assert not (out / ARCHIVE_NAME).exists()
        assert not (out / BUNDLE_NAME).exists()
        assert all(p.name.endswith(".partial") for p in out.iterdir())

        fetched = registry.fetch(NAME, "1.2.0", out)
        assert proxy.connections >= 2

    assert fetched.archive.read_bytes() == published.archive_bytes
    assert fetched.bundle is not None and fetched.bundle.read_bytes() == published.bundle_bytes
    assert sorted(p.name for p in out.iterdir()) == [ARCHIVE_NAME, BUNDLE_NAME]


# --- oci:// -----------------------------------------------------------------------------------------


def _manifest(server: OciServer, repo_path: str, tag: str) -> tuple[dict, str]:
    with httpx.Client(trust_env=False) as client:
        response = client.get(f"http://{server.address}/v2/{repo_path}/manifests/{tag}",
                              headers={"Accept": "application/vnd.oci.image.manifest.v1+json"})
    response.raise_for_status()
    return response.json(), response.headers["Docker-Content-Digest"]


@pytest.mark.integration
def test_oci_artifact_layout(oci_registry: OciServer, published: Published) -> None:
    registry = open_registry(f"oci://{oci_registry.address}/plnt/layout",
                             RegistryOptions(timeout_s=10, allow_insecure_http=(oci_registry.address,)))
    location = registry.push(NAME, "1.2.0+build.7", published.archive, published.bundle)
    manifest, digest = _manifest(oci_registry, f"plnt/layout/{NAME}", oci_tag("1.2.0+build.7"))
    assert location == f"{oci_registry.address}/plnt/layout/{NAME}:1.2.0_build.7@{digest}"
    assert manifest["mediaType"] == "application/vnd.oci.image.manifest.v1+json"
    assert manifest["config"]["mediaType"] == "application/vnd.plnt.recipe.config.v1+json"
    assert [layer["mediaType"] for layer in manifest["layers"]] == [ARCHIVE_MEDIA_TYPE, BUNDLE_MEDIA_TYPE]
    assert manifest["layers"][0]["digest"] == published.archive_sha256
    assert manifest["layers"][0]["size"] == len(published.archive_bytes)
    assert "plain HTTP" in registry.describe()


def _push_oci(server: OciServer, published: Published, version: str = "1.2.0") -> tuple[OciRegistry, dict]:
    repo = f"plnt/t{os.urandom(4).hex()}"
    registry = OciRegistry(f"oci://{server.address}/{repo}",
                           RegistryOptions(timeout_s=10, allow_insecure_http=(server.address,)))
    registry.push(NAME, version, published.archive, published.bundle)
    manifest, _ = _manifest(server, f"{repo}/{NAME}", version)
    return registry, manifest


@pytest.mark.integration
@pytest.mark.parametrize("swap", ["same size", "longer", "shorter"])
def test_oci_blob_swapped_in_storage_is_a_digest_mismatch(oci_registry: OciServer, published: Published,
                                                          tmp_path: Path, swap: str) -> None:
    registry, manifest = _push_oci(oci_registry, published)
    layer = next(layer for layer in manifest["layers"] if layer["mediaType"] == ARCHIVE_MEDIA_TYPE)
    blob = oci_registry.blob_file(layer["digest"])
    assert blob.read_bytes() == published.archive_bytes
    size = {"same size": layer["size"], "longer": layer["size"] + 1000, "shorter": layer["size"] // 2}[swap]
    other = random.Random(f"{SEED}:swap:{swap}").randbytes(size)
    blob.write_bytes(other)
    try:
        with pytest.raises(DigestMismatch) as caught:
            registry.fetch(NAME, "1.2.0", tmp_path / "out")
    finally:
        blob.write_bytes(published.archive_bytes)
    message = str(caught.value)
    assert layer["digest"] in message
    assert ARCHIVE_NAME in message
    if swap != "longer":  # a longer blob is cut off once it passes the announced size: the hash is of a prefix
        assert "sha256:" + hashlib.sha256(other).hexdigest() in message
    assert not (tmp_path / "out" / ARCHIVE_NAME).exists()
    assert not (tmp_path / "out" / BUNDLE_NAME).exists()


@pytest.mark.integration
def test_oci_manifest_not_matching_its_announced_digest_is_a_digest_mismatch(oci_registry: OciServer,
                                                                            published: Published, tmp_path: Path) -> None:
    registry, manifest = _push_oci(oci_registry, published)
    _, digest = _manifest(oci_registry, f"{registry.repository}/{NAME}", "1.2.0")
    stored = oci_registry.blob_file(digest)
    original = stored.read_bytes()
    manifest["annotations"]["dev.plnt.recipe.version"] = "6.6.6"  # same JSON shape, other bytes
    stored.write_bytes(json.dumps(manifest, separators=(",", ":")).encode())
    try:
        with pytest.raises(DigestMismatch, match=digest):
            registry.fetch(NAME, "1.2.0", tmp_path / "out")
    finally:
        stored.write_bytes(original)
    assert not (tmp_path / "out" / ARCHIVE_NAME).exists()


@pytest.mark.integration
def test_oci_layers_are_found_by_media_type_not_order(oci_registry: OciServer, published: Published,
                                                      tmp_path: Path) -> None:
    registry, manifest = _push_oci(oci_registry, published)
    manifest["layers"].reverse()
    body = json.dumps(manifest).encode()
    with httpx.Client(trust_env=False) as client:
        client.put(f"http://{oci_registry.address}/v2/{registry.repository}/{NAME}/manifests/1.2.1", content=body,
                   headers={"Content-Type": "application/vnd.oci.image.manifest.v1+json"}).raise_for_status()
    fetched = registry.fetch(NAME, "1.2.1", tmp_path / "out")
    assert fetched.archive.read_bytes() == published.archive_bytes
    assert fetched.bundle is not None and fetched.bundle.read_bytes() == published.bundle_bytes


# --- unreachable registries and plain HTTP ---------------------------------------------------------


@pytest.mark.parametrize("scheme", ["s3", "oci"])
def test_unreachable_registry_is_registry_unavailable(scheme: str, published: Published, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """time.sleep is replaced by a recorder: a retry loop shows as the waits it asks for (none
    allowed), not as elapsed time."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "x")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    port = free_port()  # nothing listens there
    if scheme == "s3":
        registry = open_registry("s3://bucket/recipes", RegistryOptions(
            s3_endpoint_url=f"http://127.0.0.1:{port}", s3_region="us-east-1", s3_max_attempts=1, timeout_s=5))
    else:
        registry = open_registry(f"oci://127.0.0.1:{port}/recipes",
                                 RegistryOptions(timeout_s=5, allow_insecure_http=(f"127.0.0.1:{port}",)))
    slept: list[float] = []
    monkeypatch.setattr(time, "sleep", slept.append)
    with pytest.raises(RegistryUnavailable, match=f"127.0.0.1:{port}|unreachable"):
        registry.fetch(NAME, "1.2.0", tmp_path / "out")
    with pytest.raises(RegistryUnavailable):
        registry.push(NAME, "1.2.0", published.archive, published.bundle)
    assert slept == [], "no hidden retry loop (oras-py's own would sleep for minutes)"
    assert not (tmp_path / "out" / ARCHIVE_NAME).exists()


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Any name lookup or connection attempt fails the test."""
    attempts: list[object] = []

    def refuse(*args: object, **kwargs: object) -> None:
        attempts.append(args)
        raise AssertionError(f"network used: {args}")

    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    return attempts


def test_plain_http_to_a_remote_oci_host_is_refused_before_connecting(no_network: list[object]) -> None:
    """`no_network` replaces name lookup and connect with stand-ins that fail the test if called."""
    with pytest.raises(InvalidSpec, match=r"plain HTTP to registry\.example\.com refused.*allow_insecure_http"):
        open_registry("oci+http://registry.example.com/recipes")
    with pytest.raises(InvalidSpec, match="allow_insecure_http"):
        OciRegistry("oci://registry.example.com:5000/recipes", plain_http=True)
    with pytest.raises(InvalidSpec, match="allow_insecure_http"):
        OciRegistry("oci://10.0.0.7:5000/recipes", RegistryOptions(allow_insecure_http=("other.example.com",)),
                    plain_http=True)
    assert no_network == []  # refused before any lookup or connection, hence at once


def test_oci_transport_choice(no_network: list[object]) -> None:
    """`no_network` replaces name lookup and connect with stand-ins that fail the test if called."""
    def transport(url: str, **options: object) -> bool:
        registry = open_registry(url, RegistryOptions(**options))  # type: ignore[arg-type]
        assert isinstance(registry, OciRegistry)
        return registry.plain_http

    assert transport("oci://registry.example.com/recipes") is False
    # Loopback is not plain HTTP unless the operator names it: a spec must not probe local services.
    assert transport("oci://127.0.0.1:5000/recipes") is False
    assert transport("oci://localhost:5000/recipes") is False
    assert transport("oci://[::1]:5000/recipes") is False
    assert transport("oci://127.0.0.1:5000/recipes", allow_insecure_http=("127.0.0.1:5000",)) is True
    assert transport("oci+https://127.0.0.1:5000/recipes") is False
    assert transport("oci://registry.lan:5000/r", allow_insecure_http=("registry.lan",)) is True
    assert transport("oci://registry.lan:5000/r", allow_insecure_http=("registry.lan:5000",)) is True
    assert transport("oci+http://registry.lan:5000/r", allow_insecure_http=("registry.lan",)) is True
    assert transport("oci://registry.lan:5001/r", allow_insecure_http=("registry.lan:5000",)) is False
    assert no_network == []
