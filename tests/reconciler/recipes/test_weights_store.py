"""The weights store: pulls of signed weights into content-addressed blobs, resumed, deduplicated,
budgeted and collected. Real files, real Sigstore DSSE bundles from the test authority (a STAND-IN
for Fulcio, Rekor and an OIDC issuer) verified offline. `CutOff` is a FAKE transport fault: it wraps
the real directory source and stops after N bytes, as a broken connection would."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from plnt.core.specs.models import RecipeTrustPolicy
from plnt.reconciler.errors import DigestMismatch, DownloadRefused, RecipeNotFound, RegistryUnavailable, VerificationFailed
from plnt.reconciler.recipes.trust import VerifiedWeights, verify_weights_signature
from plnt.reconciler.recipes.weights import SIGNATURE_NAME, DirectoryWeightsSource, WeightsStore
from plnt.reconciler.recipes.weights_manifest import PAYLOAD_TYPE, manifest_of_directory

from tests.sigstore_ca import TestSigstoreAuthority

EMAIL, ISSUER, ROOT_FILE = "models@example.com", "https://accounts.example.com", "trust/root.json"
WEIGHTS = bytes(range(256)) * 4096  # 1 MiB


@pytest.fixture(scope="module")
def ca() -> TestSigstoreAuthority:
    return TestSigstoreAuthority("demo")


def publish(ca: TestSigstoreAuthority, directory: Path, files: dict[str, bytes], identity: str = EMAIL) -> str:
    """Weights as a publisher puts them out: the files and model.sig; returns the root digest."""
    for name, data in files.items():
        (directory / name).parent.mkdir(parents=True, exist_ok=True)
        (directory / name).write_bytes(data)
    manifest = manifest_of_directory(directory, "smollm2", ignore=(SIGNATURE_NAME,))
    (directory / SIGNATURE_NAME).write_text(ca.sign_dsse(manifest.statement(), PAYLOAD_TYPE, identity, ISSUER))
    return manifest.root_digest


def verifier(ca: TestSigstoreAuthority, pin: str | None = None) -> Any:
    policy = RecipeTrustPolicy.model_validate({
        "apiVersion": "plnt.work/v1", "kind": "RecipeTrustPolicy", "metadata": {"name": "models"},
        "spec": {"recipes": ["smollm2"], "trustRoot": {"trustedRootFile": ROOT_FILE},
                 "signers": [{"issuer": ISSUER, "identity": EMAIL}]}})
    roots = {ROOT_FILE: ca.trusted_root_json().encode()}

    def verify(bundle: bytes | None) -> VerifiedWeights:
        return verify_weights_signature(bundle, model="smollm2", policies=[policy], load_trusted_root=roots.__getitem__,
                                        pin=pin)

    return verify


class Counting(DirectoryWeightsSource):
    """The real directory source, counting what is read."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.read_bytes = 0

    def read(self, name: str, offset: int) -> Iterator[bytes]:
        for chunk in super().read(name, offset):
            self.read_bytes += len(chunk)
            yield chunk


class CutOff(DirectoryWeightsSource):
    """FAKE fault: the transfer breaks off after `after` bytes of this pull."""

    def __init__(self, root: Path, after: int) -> None:
        super().__init__(root)
        self.left = after

    def read(self, name: str, offset: int) -> Iterator[bytes]:
        for chunk in super().read(name, offset):
            if len(chunk) >= self.left:
                yield chunk[:self.left]
                raise RegistryUnavailable("connection reset by peer")
            self.left -= len(chunk)
            yield chunk


def model_files(directory: Path) -> dict[str, bytes]:
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def test_a_pull_assembles_the_signed_files_and_a_second_transfers_nothing(ca: TestSigstoreAuthority,
                                                                          tmp_path: Path) -> None:
    files = {"model.gguf": WEIGHTS, "tokenizer/vocab.json": b'{"a": 1}'}
    root = publish(ca, tmp_path / "published", files)
    (tmp_path / "published" / "unsigned-extra.bin").write_bytes(b"never signed")  # published, not in the manifest
    store = WeightsStore(tmp_path / "store", budget_bytes=10 << 20)
    source = Counting(tmp_path / "published")
    pulled = store.pull(source, verifier(ca, pin=root))
    assert pulled.root_digest == root and pulled.directory == store.model_dir(root)
    assert {k: v for k, v in model_files(pulled.directory).items() if k != SIGNATURE_NAME} == files
    assert (pulled.transferred_bytes, source.read_bytes) == (len(WEIGHTS) + 8, len(WEIGHTS) + 8)
    assert pulled.signer == f"{EMAIL} ({ISSUER})"

    again = store.pull(source, verifier(ca, pin=root))  # the canary's weights, then the stable's
    assert (again.transferred_bytes, source.read_bytes) == (0, len(WEIGHTS) + 8)

    # Another model sharing the weights file: only its new file is transferred.
    publish(ca, tmp_path / "other", {"model.gguf": WEIGHTS, "config.json": b"{}"})
    other = store.pull(Counting(tmp_path / "other"), verifier(ca))
    assert other.transferred_bytes == 2
    assert os.stat(other.directory / "model.gguf").st_ino == os.stat(pulled.directory / "model.gguf").st_ino


def test_a_tampered_or_missing_file_never_reaches_a_model_directory(ca: TestSigstoreAuthority, tmp_path: Path) -> None:
    publish(ca, tmp_path / "published", {"a.bin": b"first", "model.gguf": WEIGHTS})
    store = WeightsStore(tmp_path / "store", budget_bytes=10 << 20)
    (tmp_path / "published" / "model.gguf").write_bytes(WEIGHTS[:-1] + b"\x00")  # after signing
    with pytest.raises(DigestMismatch, match="model.gguf has sha256 .* the signed manifest says"):
        store.pull(DirectoryWeightsSource(tmp_path / "published"), verifier(ca))
    assert list((store.root / "models").iterdir()) == [] and list((store.root / "partial").iterdir()) == []
    (tmp_path / "published" / "model.gguf").unlink()
    with pytest.raises(RecipeNotFound, match="lists model.gguf, which is not published"):
        store.pull(DirectoryWeightsSource(tmp_path / "published"), verifier(ca))
    assert list((store.root / "models").iterdir()) == []


def test_nothing_is_fetched_before_the_signature_is_accepted(ca: TestSigstoreAuthority, tmp_path: Path) -> None:
    root = publish(ca, tmp_path / "stranger", {"model.gguf": WEIGHTS}, identity="someone@example.com")
    store = WeightsStore(tmp_path / "store", budget_bytes=10 << 20)
    source = Counting(tmp_path / "stranger")
    with pytest.raises(VerificationFailed) as info:
        store.pull(source, verifier(ca))
    assert (info.value.reason, source.read_bytes) == ("wrong-identity", 0)
    publish(ca, tmp_path / "good", {"model.gguf": WEIGHTS[::-1]})  # other weights than the pin names
    with pytest.raises(VerificationFailed) as info:
        store.pull(Counting(tmp_path / "good"), verifier(ca, pin=root))  # signed, but not the pinned weights
    assert info.value.reason == "pin-mismatch"
    assert list((store.root / "blobs").iterdir()) == []


def test_a_cut_off_transfer_resumes_and_its_kept_bytes_are_hashed_again(ca: TestSigstoreAuthority,
                                                                       tmp_path: Path) -> None:
    publish(ca, tmp_path / "published", {"model.gguf": WEIGHTS})
    store = WeightsStore(tmp_path / "store", budget_bytes=10 << 20)
    with pytest.raises(RegistryUnavailable):
        store.pull(CutOff(tmp_path / "published", after=300_000), verifier(ca))
    assert list((store.root / "models").iterdir()) == []
    source = Counting(tmp_path / "published")
    pulled = store.pull(source, verifier(ca))
    assert (pulled.resumed_bytes, pulled.transferred_bytes) == (300_000, len(WEIGHTS) - 300_000)
    assert source.read_bytes == len(WEIGHTS) - 300_000  # a ranged read from where it stopped
    assert (pulled.directory / "model.gguf").read_bytes() == WEIGHTS

    # A partial changed while plnt was down is not trusted: the whole file fails its digest, is
    # dropped, and the next pull fetches it whole.
    other = WeightsStore(tmp_path / "store2", budget_bytes=10 << 20)
    with pytest.raises(RegistryUnavailable):
        other.pull(CutOff(tmp_path / "published", after=300_000), verifier(ca))
    (partial,) = (other.root / "partial").iterdir()
    partial.write_bytes(b"\xff" * 300_000)
    with pytest.raises(DigestMismatch):
        other.pull(DirectoryWeightsSource(tmp_path / "published"), verifier(ca))
    assert other.pull(DirectoryWeightsSource(tmp_path / "published"), verifier(ca)).transferred_bytes == len(WEIGHTS)


def test_the_disk_budget_and_collecting_what_no_release_uses(ca: TestSigstoreAuthority, tmp_path: Path) -> None:
    first = publish(ca, tmp_path / "first", {"model.gguf": WEIGHTS, "shared.json": b"{}"})
    second = publish(ca, tmp_path / "second", {"other.gguf": WEIGHTS[::-1], "shared.json": b"{}"})
    small = WeightsStore(tmp_path / "small", budget_bytes=len(WEIGHTS) // 2)
    with pytest.raises(DownloadRefused, match="disk budget"):
        small.pull(DirectoryWeightsSource(tmp_path / "first"), verifier(ca))
    assert small.used_bytes() == 0

    store = WeightsStore(tmp_path / "store", budget_bytes=10 << 20)
    store.pull(DirectoryWeightsSource(tmp_path / "first"), verifier(ca))
    store.pull(DirectoryWeightsSource(tmp_path / "second"), verifier(ca))
    assert len(list((store.root / "blobs").iterdir())) == 3
    assert store.collect(keep={second}) == [first]
    assert not store.model_dir(first).exists() and store.model_dir(second).is_dir()
    assert len(list((store.root / "blobs").iterdir())) == 2  # model.gguf went; the shared file stays
    assert store.collect(keep=set()) == [second]
    assert store.used_bytes() == 0


def test_a_published_name_that_leads_outside_its_directory_is_refused(ca: TestSigstoreAuthority,
                                                                      tmp_path: Path) -> None:
    (tmp_path / "secret").write_bytes(b"plnt's own file")
    published = tmp_path / "published"
    publish(ca, published, {"model.gguf": b"plnt's own file"})
    (published / "model.gguf").unlink()
    (published / "model.gguf").symlink_to(tmp_path / "secret")  # same bytes as signed, outside the directory
    store = WeightsStore(tmp_path / "store", budget_bytes=10 << 20)
    with pytest.raises(DownloadRefused, match="leads outside the weights directory"):
        store.pull(DirectoryWeightsSource(published), verifier(ca))


def test_a_blob_from_an_earlier_pull_is_hashed_again_and_fetched_again_if_it_changed_on_disk(
        ca: TestSigstoreAuthority, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Blobs this pull fetched were hashed as they streamed and are not read again; a blob an earlier
    pull left (which may have changed on disk since) is hashed again, and a changed one is fetched again."""
    from plnt.reconciler.recipes import weights, weights_manifest

    store = WeightsStore(tmp_path / "store", budget_bytes=10 << 20)
    publish(ca, tmp_path / "first", {"model.gguf": WEIGHTS})
    hashed: list[str] = []
    real = weights_manifest.sha256_file

    def counting(path: Path) -> str:
        hashed.append(Path(path).name)
        return real(path)

    monkeypatch.setattr(weights_manifest, "sha256_file", counting)
    monkeypatch.setattr(weights, "sha256_file", counting)
    store.pull(DirectoryWeightsSource(tmp_path / "first"), verifier(ca))
    assert hashed == [], "a blob fetched by this very pull was hashed a second time"

    blob = next((tmp_path / "store" / "blobs").iterdir())
    blob.chmod(0o644)
    blob.write_bytes(b"changed on disk" + WEIGHTS[15:])
    publish(ca, tmp_path / "second", {"model.gguf": WEIGHTS, "config.json": b"{}"})
    second = store.pull(Counting(tmp_path / "second"), verifier(ca))
    assert blob.name in hashed
    assert second.transferred_bytes == len(WEIGHTS) + 2  # the changed blob again, and the new file
    assert (second.directory / "model.gguf").read_bytes() == WEIGHTS


def test_a_store_says_whether_it_holds_anything_to_collect(ca: TestSigstoreAuthority, tmp_path: Path) -> None:
    store = WeightsStore(tmp_path / "store", budget_bytes=10 << 20)
    assert not store.holds_anything()
    publish(ca, tmp_path / "published", {"model.gguf": WEIGHTS})
    pulled = store.pull(DirectoryWeightsSource(tmp_path / "published"), verifier(ca))
    assert store.holds_anything()
    assert store.collect(set()) == [pulled.root_digest] and not store.holds_anything()
