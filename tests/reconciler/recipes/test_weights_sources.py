"""Model weights published to a registry (file:, s3://, oci://) and pulled through the real
WeightsStore with real signature verification: against a real moto_server (S3) and a real CNCF
distribution registry (`docker-registry`), from tests/services.py. The Sigstore authority that signs
the manifests is the test one (tests/sigstore_ca.py: a STAND-IN for Fulcio, Rekor and an OIDC issuer,
verified by sigstore-python).

Faults: a transfer cut off midway is, for s3:// and oci://, a real TCP connection closed by
`RangeProxy` (TruncatingProxy from tests/services.py, in front of the real registry, which also
records the Range header of each request); for file:, `CutOff` (test_weights_store.py), a FAKE
fault: the real directory source whose iterator raises RegistryUnavailable after N bytes."""

from __future__ import annotations

import hashlib
import json
import re
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from plnt.reconciler.errors import (
    DigestMismatch,
    DownloadRefused,
    InvalidSpec,
    RecipeNotFound,
    RegistryUnavailable,
    VerificationFailed,
)
from plnt.reconciler.recipes.registries import BUNDLE_MEDIA_TYPE, RegistryOptions, oci_tag
from plnt.reconciler.recipes.weights import SIGNATURE_NAME, WeightsSource, WeightsStore
from plnt.reconciler.recipes.weights_sources import (
    EMPTY_DESCRIPTOR,
    MODEL_ARTIFACT_TYPE,
    WeightsNotPublishable,
    open_weights_source,
    publish_weights,
)

from tests.reconciler.recipes.test_registries import BACKENDS, Backend, MiB, _manifest, backend, seeded  # noqa: F401 - backend: a fixture
from tests.reconciler.recipes.test_weights_store import EMAIL, ISSUER, CutOff, verifier
from tests.reconciler.recipes.test_weights_store import publish as author
from tests.services import OciServer, S3Bucket, TruncatingProxy, free_port
from tests.sigstore_ca import TestSigstoreAuthority

NAME, VERSION = "smollm2", "1.0.0"
BIG = "model.safetensors"  # between config.json and tokenizer/vocab.json in manifest order


@pytest.fixture(scope="module")
def ca() -> TestSigstoreAuthority:
    return TestSigstoreAuthority("weights-sources")


def weights(request: pytest.FixtureRequest) -> dict[str, bytes]:
    """A small model: a few MiB of seeded random bytes, a file in a subdirectory, per-test bytes
    (the session's OCI registry shares blobs by digest)."""
    rng = seeded(request)
    return {"config.json": json.dumps({"seed": rng.randbytes(8).hex()}).encode(),
            BIG: rng.randbytes(3 * MiB + 12345),
            "tokenizer/vocab.json": json.dumps({"tokens": rng.randbytes(64).hex()}).encode()}


class Recording:
    """The real source, recording each read (name, offset) and the bytes it yielded."""

    def __init__(self, source: WeightsSource) -> None:
        self.source = source
        self.reads: list[tuple[str, int]] = []
        self.read_bytes = 0

    def describe(self) -> str:
        return self.source.describe()

    def signature(self) -> bytes | None:
        return self.source.signature()

    def read(self, name: str, offset: int) -> Iterator[bytes]:
        self.reads.append((name, offset))
        for chunk in self.source.read(name, offset):
            self.read_bytes += len(chunk)
            yield chunk


class _Requests:
    """The client side of one proxied connection: records (and may rename) Range headers."""

    def __init__(self, sock: socket.socket, proxy: RangeProxy) -> None:
        self._sock, self._proxy = sock, proxy

    def recv(self, size: int) -> bytes:
        data = self._sock.recv(size)
        self._proxy.ranges += [m.decode() for m in re.findall(rb"\r\nrange: *(bytes=[0-9]+-[0-9]*)\r\n", data, re.I)]
        if self._proxy.ignore_range:
            data = re.sub(rb"\r\nrange:", b"\r\nX-Ignored-Range:", data, flags=re.I)
        return data

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


class RangeProxy(TruncatingProxy):
    """TruncatingProxy (tests/services.py) in front of a real registry, cutting the first connection
    whose answers pass `cut_after` bytes, once (whichever connection carries the large file: boto3
    opens one per object, requests reuses one); it records the Range header of every request it
    forwards in `ranges`, and with `ignore_range` renames that header, so that the registry answers
    200 with the whole blob, as a registry without ranged reads would."""

    def __init__(self, upstream: str, *, cut_after: int | None = None, ignore_range: bool = False) -> None:
        super().__init__(upstream, cut_after=1 << 40)
        self.cut_after = cut_after
        self.ranges: list[str] = []
        self.ignore_range = ignore_range

    def _pump(self, source: socket.socket, target: socket.socket, limit: int | None) -> None:
        if source.getsockname()[1] == self.port:  # an accepted connection: requests, client to registry
            super()._pump(_Requests(source, self), target, None)  # type: ignore[arg-type]
        else:
            super()._pump(source, target, self.cut_after if self.cuts == 0 else None)


@dataclass
class Target:
    """A registry of each kind (Backend from test_registries.py, on the real services) and the ways
    the published weights are changed behind the author's back."""

    backend: Backend
    request: pytest.FixtureRequest

    @property
    def kind(self) -> str:
        return self.backend.kind

    def source(self, version: str = VERSION, **changes: Any) -> WeightsSource:
        options = RegistryOptions(**{**self.backend.options.__dict__, **changes})
        return open_weights_source(self.backend.url, NAME, version, options, base_dir=self.backend.base_dir)

    def publish(self, directory: Path, version: str = VERSION) -> str:
        return publish_weights(directory, self.backend.url, NAME, version, self.backend.options,
                               base_dir=self.backend.base_dir)

    def through(self, proxy: RangeProxy) -> WeightsSource:
        """The source, reached through `proxy` (s3 and oci)."""
        if self.kind == "s3":
            return self.source(s3_endpoint_url=proxy.url, s3_max_attempts=1)
        repo = self.backend.url.split("/", 3)[3]
        return open_weights_source(f"oci://127.0.0.1:{proxy.port}/{repo}", NAME, VERSION,
                                   RegistryOptions(timeout_s=10, allow_insecure_http=(f"127.0.0.1:{proxy.port}",)))

    def upstream(self) -> str:
        if self.kind == "s3":
            return self.bucket.endpoint_url.removeprefix("http://")
        return self.server.address

    @property
    def bucket(self) -> S3Bucket:
        return self.request.getfixturevalue("s3_bucket")

    @property
    def server(self) -> OciServer:
        return self.request.getfixturevalue("oci_registry")

    # --- the published copy, changed -------------------------------------------------------------

    def _file(self, name: str) -> Path:
        assert self.backend.base_dir is not None
        return self.backend.base_dir / "registry" / NAME / VERSION / name

    def _key(self, name: str) -> str:
        return f"team/recipes/{NAME}/{VERSION}/{name}"

    def _oci_repo(self) -> str:
        return f"{self.backend.url.split('/', 3)[3]}/{NAME}"

    def oci_manifest(self) -> dict:
        return _manifest(self.server, self._oci_repo(), oci_tag(VERSION))[0]

    def _put_oci_manifest(self, manifest: dict) -> None:
        with httpx.Client(trust_env=False) as client:
            client.put(f"http://{self.server.address}/v2/{self._oci_repo()}/manifests/{oci_tag(VERSION)}",
                       content=json.dumps(manifest).encode(),
                       headers={"Content-Type": "application/vnd.oci.image.manifest.v1+json"}).raise_for_status()

    def _write(self, name: str, data: bytes) -> None:
        if self.kind == "file":
            self._file(name).write_bytes(data)
        else:
            self.bucket.client.put_object(Bucket=self.bucket.name, Key=self._key(name), Body=data)

    def tamper(self, name: str, data: bytes) -> None:
        if self.kind != "oci":
            self._write(name, data)
            return
        layer = next(x for x in self.oci_manifest()["layers"] if x["annotations"]["org.opencontainers.image.title"] == name)
        self.server.blob_file(layer["digest"]).write_bytes(data)  # distribution serves what its storage holds

    def remove(self, name: str) -> None:
        if self.kind == "file":
            self._file(name).unlink()
        elif self.kind == "s3":
            self.bucket.client.delete_object(Bucket=self.bucket.name, Key=self._key(name))
        else:
            manifest = self.oci_manifest()
            manifest["layers"] = [x for x in manifest["layers"] if x["annotations"]["org.opencontainers.image.title"] != name]
            self._put_oci_manifest(manifest)

    def add(self, name: str, data: bytes) -> None:
        if self.kind != "oci":
            self._write(name, data)
            return
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        with httpx.Client(trust_env=False) as client:
            started = client.post(f"http://{self.server.address}/v2/{self._oci_repo()}/blobs/uploads/")
            location = httpx.URL(f"http://{self.server.address}").join(started.headers["Location"])
            client.put(location.copy_merge_params({"digest": digest}), content=data,
                       headers={"Content-Type": "application/octet-stream"}).raise_for_status()
        manifest = self.oci_manifest()
        manifest["layers"].append({"mediaType": "application/octet-stream", "digest": digest, "size": len(data),
                                   "annotations": {"org.opencontainers.image.title": name}})
        self._put_oci_manifest(manifest)


@pytest.fixture
def target(backend: Backend, request: pytest.FixtureRequest) -> Target:  # noqa: F811 - the fixture, requested
    """Each kind of registry: test_registries.py's `backend` fixture (file:, and s3:// and oci:// on the
    real services, marked integration)."""
    return Target(backend, request)


@pytest.fixture
def model(ca: TestSigstoreAuthority, tmp_path: Path, request: pytest.FixtureRequest) -> tuple[dict[str, bytes], str]:
    files = weights(request)
    return files, author(ca, tmp_path / "author", files)


def store(tmp_path: Path, name: str = "store") -> WeightsStore:
    return WeightsStore(tmp_path / name, budget_bytes=64 << 20)


def model_dir_files(directory: Path) -> dict[str, bytes]:
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in sorted(directory.rglob("*"))
            if p.is_file() and p.name != SIGNATURE_NAME}


def nothing_assembled(weights_store: WeightsStore) -> bool:
    return list((weights_store.root / "models").iterdir()) == [] and list((weights_store.root / "partial").iterdir()) == []


# --- publish, pull, pull again -----------------------------------------------------------------


def test_publish_then_pull_and_a_second_pull_transfers_nothing(target: Target, model: tuple[dict[str, bytes], str],
                                                               ca: TestSigstoreAuthority, tmp_path: Path) -> None:
    files, root = model
    where = target.publish(tmp_path / "author")
    assert NAME in where and VERSION in where
    weights_store = store(tmp_path)
    source = Recording(target.source())
    pulled = weights_store.pull(source, verifier(ca, pin=root))
    assert pulled.root_digest == root and pulled.signer == f"{EMAIL} ({ISSUER})"
    assert model_dir_files(pulled.directory) == files
    assert (pulled.directory / SIGNATURE_NAME).read_bytes() == (tmp_path / "author" / SIGNATURE_NAME).read_bytes()
    total = sum(len(data) for data in files.values())
    assert pulled.transferred_bytes == source.read_bytes == total
    assert sorted(source.reads) == sorted((name, 0) for name in files)

    again = Recording(target.source())
    second = weights_store.pull(again, verifier(ca, pin=root))
    assert (second.transferred_bytes, again.reads, second.directory) == (0, [], pulled.directory)


def test_the_published_layout(target: Target, model: tuple[dict[str, bytes], str], tmp_path: Path) -> None:
    files, root = model
    where = target.publish(tmp_path / "author")
    expected = sorted([*files, SIGNATURE_NAME])
    if target.kind == "file":
        entry = tmp_path / "registry" / NAME / VERSION
        assert where == str(entry)
        assert sorted(p.relative_to(entry).as_posix() for p in entry.rglob("*") if p.is_file()) == expected
    elif target.kind == "s3":
        listed = target.bucket.client.list_objects_v2(Bucket=target.bucket.name)["Contents"]
        assert sorted(o["Key"] for o in listed) == [f"team/recipes/{NAME}/{VERSION}/{name}" for name in expected]
        assert where == f"s3://{target.bucket.name}/team/recipes/{NAME}/{VERSION}/"
    else:
        manifest, digest = _manifest(target.server, target._oci_repo(), oci_tag(VERSION))
        assert where == f"{target.server.address}/{target._oci_repo()}:{VERSION}@{digest}"
        assert manifest["artifactType"] == MODEL_ARTIFACT_TYPE == "application/vnd.plnt.model.v1"
        assert manifest["config"] == EMPTY_DESCRIPTOR
        assert manifest["config"]["mediaType"] == "application/vnd.oci.empty.v1+json"
        titles = {x["annotations"]["org.opencontainers.image.title"]: x for x in manifest["layers"]}
        assert sorted(titles) == expected
        for name, data in files.items():
            assert titles[name]["mediaType"] == "application/octet-stream"
            assert titles[name]["digest"] == "sha256:" + hashlib.sha256(data).hexdigest()
            assert titles[name]["size"] == len(data)
        assert titles[SIGNATURE_NAME]["mediaType"] == BUNDLE_MEDIA_TYPE
        assert manifest["annotations"]["dev.plnt.model.root-digest"] == root


# --- attacks through the real pull -----------------------------------------------------------------


def test_a_tampered_published_file_is_a_digest_mismatch_and_nothing_is_assembled(
        target: Target, model: tuple[dict[str, bytes], str], ca: TestSigstoreAuthority, tmp_path: Path) -> None:
    files, root = model
    target.publish(tmp_path / "author")
    forged = bytearray(files[BIG])
    forged[len(forged) // 2] ^= 0xFF  # same size: only the digest tells
    target.tamper(BIG, bytes(forged))
    weights_store = store(tmp_path)
    with pytest.raises(DigestMismatch, match=f"{BIG} has sha256 .* the signed manifest says"):
        weights_store.pull(target.source(), verifier(ca, pin=root))
    assert nothing_assembled(weights_store)
    assert not (weights_store.root / "blobs" / hashlib.sha256(forged).hexdigest()).exists()


def test_a_file_missing_from_the_registry_is_not_found_and_names_it(
        target: Target, model: tuple[dict[str, bytes], str], ca: TestSigstoreAuthority, tmp_path: Path) -> None:
    _, root = model
    target.publish(tmp_path / "author")
    target.remove("tokenizer/vocab.json")
    weights_store = store(tmp_path)
    with pytest.raises(RecipeNotFound) as caught:
        weights_store.pull(target.source(), verifier(ca, pin=root))
    message = str(caught.value)
    for part in (NAME, VERSION, "tokenizer/vocab.json", "plnt model push"):
        assert part in message
    assert {"file": "file registry", "s3": "S3 registry s3://", "oci": "OCI registry oci://"}[target.kind] in message
    assert list((weights_store.root / "models").iterdir()) == []


def test_a_file_published_beyond_the_manifest_is_never_fetched(
        target: Target, model: tuple[dict[str, bytes], str], ca: TestSigstoreAuthority, tmp_path: Path) -> None:
    files, root = model
    target.publish(tmp_path / "author")
    target.add("extra.bin", b"never signed, never fetched")
    source = Recording(target.source())
    pulled = store(tmp_path).pull(source, verifier(ca, pin=root))
    assert "extra.bin" not in {name for name, _ in source.reads}
    assert not (pulled.directory / "extra.bin").exists()
    assert model_dir_files(pulled.directory) == files


def test_an_untrusted_signer_or_another_pin_fetches_nothing(target: Target, ca: TestSigstoreAuthority,
                                                            tmp_path: Path, request: pytest.FixtureRequest) -> None:
    files = weights(request)
    author(ca, tmp_path / "stranger", files, identity="someone@example.com")
    target.publish(tmp_path / "stranger")
    weights_store = store(tmp_path)
    source = Recording(target.source())
    with pytest.raises(VerificationFailed) as caught:
        weights_store.pull(source, verifier(ca))
    assert (caught.value.reason, source.reads) == ("wrong-identity", [])

    root = author(ca, tmp_path / "good", files)
    target.publish(tmp_path / "good")  # the trusted signer's, published over the stranger's
    source = Recording(target.source())
    with pytest.raises(VerificationFailed) as caught:
        weights_store.pull(source, verifier(ca, pin="sha256:" + "0" * 64))
    assert (caught.value.reason, source.reads) == ("pin-mismatch", [])
    assert list((weights_store.root / "blobs").iterdir()) == []
    assert weights_store.pull(target.source(), verifier(ca, pin=root)).root_digest == root


def test_a_version_never_published_is_not_found(target: Target, model: tuple[dict[str, bytes], str],
                                                tmp_path: Path) -> None:
    target.publish(tmp_path / "author")
    with pytest.raises(RecipeNotFound, match=rf"{NAME}@9\.9\.9 not found.*plnt model push"):
        target.source("9.9.9").signature()


def test_names_that_leave_the_model_are_refused(target: Target, model: tuple[dict[str, bytes], str],
                                                tmp_path: Path) -> None:
    target.publish(tmp_path / "author")
    source = target.source()
    for name in ("../escape.bin", "/etc/passwd", "a/../../b", ""):
        with pytest.raises(DownloadRefused, match="refused"):
            list(source.read(name, 0))


# --- cut-off transfers, resumed ------------------------------------------------------------------


def test_a_cut_off_transfer_is_resumed_with_a_ranged_read(target: Target, model: tuple[dict[str, bytes], str],
                                                          ca: TestSigstoreAuthority, tmp_path: Path) -> None:
    files, root = model
    target.publish(tmp_path / "author")
    weights_store = store(tmp_path)
    partial = weights_store.root / "partial" / hashlib.sha256(files[BIG]).hexdigest()
    if target.kind == "file":
        with pytest.raises(RegistryUnavailable):
            cut = CutOff(tmp_path / "registry" / NAME / VERSION, after=len(files["config.json"]) + MiB + 4321)
            weights_store.pull(cut, verifier(ca))
        kept = partial.stat().st_size
        assert kept == MiB + 4321
        resumed_from = Recording(target.source())
        pulled = weights_store.pull(resumed_from, verifier(ca, pin=root))
        assert (BIG, kept) in resumed_from.reads  # a ranged read from where the cut left it
    else:
        with RangeProxy(target.upstream(), cut_after=MiB + MiB // 2) as proxy:
            with pytest.raises(RegistryUnavailable, match="broke off|unreachable"):
                weights_store.pull(target.through(proxy), verifier(ca))
            assert proxy.cuts == 1
            kept = partial.stat().st_size
            assert 0 < kept < len(files[BIG])
            pulled = weights_store.pull(target.through(proxy), verifier(ca, pin=root))
            assert f"bytes={kept}-" in proxy.ranges  # what the registry was asked for
    assert (pulled.resumed_bytes, pulled.transferred_bytes) == (kept, len(files[BIG]) - kept + len(files["tokenizer/vocab.json"]))
    assert model_dir_files(pulled.directory) == files
    assert (weights_store.root / "blobs" / hashlib.sha256(files[BIG]).hexdigest()).read_bytes() == files[BIG]


@pytest.mark.integration
def test_an_oci_registry_that_ignores_range_answers_whole_and_the_kept_bytes_are_skipped(
        request: pytest.FixtureRequest, ca: TestSigstoreAuthority, tmp_path: Path) -> None:
    target = Target(BACKENDS["oci"](request, tmp_path), request)
    files = weights(request)
    root = author(ca, tmp_path / "author", files)
    target.publish(tmp_path / "author")
    weights_store = store(tmp_path)
    with RangeProxy(target.upstream(), cut_after=MiB + MiB // 2) as proxy, pytest.raises(RegistryUnavailable):
        weights_store.pull(target.through(proxy), verifier(ca))
    kept = (weights_store.root / "partial" / hashlib.sha256(files[BIG]).hexdigest()).stat().st_size
    with RangeProxy(target.upstream(), ignore_range=True) as proxy:
        pulled = weights_store.pull(target.through(proxy), verifier(ca, pin=root))
        assert proxy.ranges == [f"bytes={kept}-"]  # asked, renamed on the way: the registry answered 200
    assert (pulled.resumed_bytes, pulled.transferred_bytes) == (kept, len(files[BIG]) - kept + len(files["tokenizer/vocab.json"]))
    assert model_dir_files(pulled.directory) == files


@pytest.mark.integration
@pytest.mark.parametrize("kind", ["s3", "oci"])
def test_an_unreachable_registry_is_registry_unavailable(kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         ca: TestSigstoreAuthority) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "x")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    port = free_port()  # nothing listens there
    url = "s3://bucket/models" if kind == "s3" else f"oci://127.0.0.1:{port}/models"
    options = RegistryOptions(s3_endpoint_url=f"http://127.0.0.1:{port}", s3_region="us-east-1", s3_max_attempts=1,
                              timeout_s=5, allow_insecure_http=(f"127.0.0.1:{port}",))
    weights_store = store(tmp_path)
    with pytest.raises(RegistryUnavailable, match="unreachable"):
        weights_store.pull(open_weights_source(url, NAME, VERSION, options), verifier(ca))


# --- file: specifics and publishing ----------------------------------------------------------------


def test_a_file_registry_is_read_only_under_the_allowed_roots(tmp_path: Path) -> None:
    with pytest.raises(InvalidSpec, match="allow-file-registry"):
        open_weights_source(f"file://{tmp_path}/registry", NAME, VERSION, RegistryOptions())
    assert open_weights_source(f"file://{tmp_path}/registry", NAME, VERSION,
                               RegistryOptions(file_roots=(str(tmp_path),))).describe().startswith(f"model {NAME}@{VERSION}")
    with pytest.raises(InvalidSpec, match="model name"):
        open_weights_source(f"file://{tmp_path}/registry", "../up", VERSION, RegistryOptions(file_roots=None))


def test_a_published_file_that_links_out_of_the_registry_is_refused(ca: TestSigstoreAuthority, tmp_path: Path,
                                                                    request: pytest.FixtureRequest) -> None:
    files = weights(request)
    author(ca, tmp_path / "author", files)
    publish_weights(tmp_path / "author", f"file://{tmp_path}/registry", NAME, VERSION, RegistryOptions(file_roots=None))
    (tmp_path / "outside").write_bytes(files[BIG])
    published = tmp_path / "registry" / NAME / VERSION / BIG
    published.unlink()
    published.symlink_to(tmp_path / "outside")  # the signed bytes, outside the registry
    source = open_weights_source(f"file://{tmp_path}/registry", NAME, VERSION, RegistryOptions(file_roots=None))
    with pytest.raises(DownloadRefused, match="leads outside"):
        store(tmp_path).pull(source, verifier(ca))


def test_publishing_needs_the_signed_files_as_signed(ca: TestSigstoreAuthority, tmp_path: Path,
                                                     request: pytest.FixtureRequest) -> None:
    files = weights(request)
    registry = f"file://{tmp_path}/registry"
    (tmp_path / "unsigned").mkdir()
    (tmp_path / "unsigned" / "model.gguf").write_bytes(b"weights")
    with pytest.raises(WeightsNotPublishable, match="no model.sig; sign the statement"):
        publish_weights(tmp_path / "unsigned", registry, NAME, VERSION, RegistryOptions(file_roots=None))
    author(ca, tmp_path / "author", files)
    (tmp_path / "author" / "unsigned-notes.txt").write_text("not in the manifest")
    publish_weights(tmp_path / "author", registry, NAME, VERSION, RegistryOptions(file_roots=None))
    assert not (tmp_path / "registry" / NAME / VERSION / "unsigned-notes.txt").exists()  # only what model.sig signs
    (tmp_path / "author" / BIG).write_bytes(b"changed after signing")
    with pytest.raises(WeightsNotPublishable, match=f"{BIG} has sha256 .* signs"):
        publish_weights(tmp_path / "author", registry, NAME, "1.0.1", RegistryOptions(file_roots=None))
    (tmp_path / "author" / BIG).unlink()
    with pytest.raises(WeightsNotPublishable, match=f"signs {BIG}, which is not a regular file"):
        publish_weights(tmp_path / "author", registry, NAME, "1.0.1", RegistryOptions(file_roots=None))
    assert not (tmp_path / "registry" / NAME / "1.0.1").exists()
