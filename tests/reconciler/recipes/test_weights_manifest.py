"""Model weights manifests (OpenSSF model-signing v1.0) and their signatures.

The format checks are pure (real files in a temporary directory). The signatures are real Sigstore
DSSE bundles made by the test authority (tests/sigstore_ca.py: a STAND-IN for Fulcio, Rekor and an
OIDC issuer) and verified offline by sigstore-python's own `Verifier.verify_dsse`."""

from __future__ import annotations

import base64
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytest
from plnt.core.specs.models import RecipeTrustPolicy
from plnt.reconciler.errors import VerificationFailed
from plnt.reconciler.recipes.trust import VerifiedWeights, verify_weights_signature
from plnt.reconciler.recipes.weights_manifest import (
    PAYLOAD_TYPE,
    ManifestError,
    WeightsFile,
    WeightsManifest,
    check_directory,
    check_pin,
    manifest_of_directory,
    parse_statement,
)

from tests.sigstore_ca import TestSigstoreAuthority

EMAIL, ISSUER = "models@example.com", "https://accounts.example.com"
ROOT_FILE, OTHER_ROOT_FILE = "trust/demo-trusted-root.json", "trust/other-trusted-root.json"


def write_model(root: Path) -> Path:
    (root / "tokenizer").mkdir(parents=True)
    (root / "model.gguf").write_bytes(b"GGUF" + bytes(range(256)) * 64)
    (root / "config.json").write_text('{"n_ctx": 2048}')
    (root / "tokenizer" / "vocab.json").write_text('{"a": 1}')
    (root / ".gitattributes").write_text("*.gguf filter=lfs")  # never part of a model (OMS default)
    return root


def statement(files: list[dict[str, Any]] | None = None, **overrides: Any) -> dict[str, Any]:
    files = files if files is not None else [{"name": "a.bin", "algorithm": "sha256", "digest": "ab" * 32},
                                             {"name": "b/c.bin", "algorithm": "sha256", "digest": "cd" * 32}]
    root = hashlib.sha256(b"".join(bytes.fromhex(f["digest"]) for f in files if isinstance(f.get("digest"), str)
                                   and len(f["digest"]) == 64)).hexdigest()
    document = {
        "_type": "https://in-toto.io/Statement/v1",
        "subject": [{"name": "smollm2", "digest": {"sha256": root}}],
        "predicateType": "https://model_signing/signature/v1.0",
        "predicate": {"serialization": {"method": "files", "hash_type": "sha256", "allow_symlinks": False,
                                        "ignore_paths": []},
                      "resources": files},
    }
    document.update(overrides)
    return document


# --- the format ----------------------------------------------------------------------------


def test_a_directory_s_manifest_round_trips_and_its_root_digest_is_the_oms_one(tmp_path: Path) -> None:
    model = write_model(tmp_path / "smollm2")
    manifest = manifest_of_directory(model)
    assert [f.name for f in manifest.files] == ["config.json", "model.gguf", "tokenizer/vocab.json"]
    assert manifest.files[1].sha256 == hashlib.sha256((model / "model.gguf").read_bytes()).hexdigest()
    # OMS 6.5.1: sha256 over the raw digests, in name order.
    expected = hashlib.sha256(b"".join(bytes.fromhex(f.sha256) for f in manifest.files)).hexdigest()
    assert manifest.root_digest == f"sha256:{expected}"
    assert parse_statement(manifest.statement()) == manifest
    check_directory(model, manifest)  # the weights as published


BAD_STATEMENTS = [
    ("another statement type", statement(_type="https://in-toto.io/Statement/v0.1"), "_type"),
    ("the deprecated v0.1 predicate", statement(predicateType="https://model_signing/Digests/v0.1"), "predicateType"),
    ("two subjects", statement(subject=[{"name": "a", "digest": {"sha256": "00" * 32}}] * 2), "exactly one"),
    ("a root digest the files do not give", statement(subject=[{"name": "m", "digest": {"sha256": "00" * 32}}]),
     "contradicts itself"),
    ("unsorted files", statement([{"name": "b", "algorithm": "sha256", "digest": "ab" * 32},
                                  {"name": "a", "algorithm": "sha256", "digest": "cd" * 32}]), "sorted"),
    ("a file twice", statement([{"name": "a", "algorithm": "sha256", "digest": "ab" * 32}] * 2), "twice"),
    ("a parent path", statement([{"name": "../etc/passwd", "algorithm": "sha256", "digest": "ab" * 32}]), "relative"),
    ("an absolute path", statement([{"name": "/etc/passwd", "algorithm": "sha256", "digest": "ab" * 32}]), "relative"),
    ("a dot component", statement([{"name": "./a", "algorithm": "sha256", "digest": "ab" * 32}]), "relative"),
    ("an uppercase digest", statement([{"name": "a", "algorithm": "sha256", "digest": "AB" * 32}]), "lowercase hex"),
    ("another algorithm", statement([{"name": "a", "algorithm": "blake3", "digest": "ab" * 32}]), "sha256"),
    ("no file", statement([]), "at least one file"),
    ("shard serialization", statement(predicate={"serialization": {"method": "file-shard-1048576", "hash_type":
                                      "sha256", "allow_symlinks": False}, "resources": []}), "serialization"),
]


@pytest.mark.parametrize(("case", "document", "says"), BAD_STATEMENTS, ids=[c[0] for c in BAD_STATEMENTS])
def test_a_statement_that_is_not_a_usable_manifest_is_refused(case: str, document: dict[str, Any], says: str) -> None:
    with pytest.raises(ManifestError) as info:
        parse_statement(json.dumps(document).encode())
    assert says in str(info.value)
    assert info.value.reason in ("invalid-manifest", "unsafe-path")


def test_a_key_given_twice_is_refused() -> None:
    text = json.dumps(statement())
    with pytest.raises(ManifestError, match="not JSON"):
        parse_statement(text.replace('"_type"', '"predicateType": "x", "_type"', 1).encode())


def test_weights_that_differ_from_the_manifest_are_refused_by_name(tmp_path: Path) -> None:
    model = write_model(tmp_path / "smollm2")
    manifest = manifest_of_directory(model)

    def refused(reason: str, says: str) -> None:
        with pytest.raises(ManifestError) as info:
            check_directory(model, manifest)
        assert (info.value.reason, says in str(info.value)) == (reason, True), str(info.value)

    original = (model / "model.gguf").read_bytes()
    (model / "model.gguf").write_bytes(original[:-1] + b"\x00")  # tampered: same size, one byte
    refused("digest-mismatch", "weights file model.gguf has sha256")
    (model / "model.gguf").write_bytes(original)
    (model / "extra.bin").write_bytes(b"not signed")
    refused("extra-file", "weights file extra.bin is not in the signed manifest")
    (model / "extra.bin").unlink()
    (model / "config.json").unlink()
    refused("missing-file", "weights file config.json is listed in the signed manifest but missing")
    (model / "config.json").symlink_to(model / "model.gguf")
    refused("unsafe-path", "config.json in the model is not a regular file")
    (model / "config.json").unlink()
    os.mkfifo(model / "config.json")
    refused("unsafe-path", "config.json in the model is not a regular file")


def test_the_pin_is_the_root_digest() -> None:
    manifest = WeightsManifest("m", (WeightsFile("a", "ab" * 32),))
    check_pin(manifest, manifest.root_digest)
    check_pin(manifest, None)
    with pytest.raises(ManifestError, match="the spec pins sha256:00") as info:
        check_pin(manifest, "sha256:" + "00" * 32)
    assert info.value.reason == "pin-mismatch"


# --- the signature -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ca() -> TestSigstoreAuthority:
    return TestSigstoreAuthority("demo")


@pytest.fixture(scope="module")
def roots(ca: TestSigstoreAuthority) -> dict[str, bytes]:
    return {ROOT_FILE: ca.trusted_root_json().encode(),
            OTHER_ROOT_FILE: TestSigstoreAuthority("other").trusted_root_json().encode()}


def policy(root: str = ROOT_FILE, identity: str = EMAIL) -> RecipeTrustPolicy:
    return RecipeTrustPolicy.model_validate({
        "apiVersion": "plnt.work/v1", "kind": "RecipeTrustPolicy", "metadata": {"name": "models"},
        "spec": {"recipes": ["smollm2"], "trustRoot": {"trustedRootFile": root},
                 "signers": [{"issuer": ISSUER, "identity": identity}]},
    })


MANIFEST = WeightsManifest("smollm2", (WeightsFile("config.json", "ab" * 32), WeightsFile("model.gguf", "cd" * 32)))


def verify(bundle: str | bytes | None, roots: dict[str, bytes], *, policies: list[RecipeTrustPolicy] | None = None,
           pin: str | None = None) -> VerifiedWeights:
    raw = bundle.encode() if isinstance(bundle, str) else bundle
    return verify_weights_signature(raw, model="smollm2", policies=[policy()] if policies is None else policies,
                                    load_trusted_root=roots.__getitem__, pin=pin)


def rejected(bundle: str | bytes | None, roots: dict[str, bytes], reason: str, **kwargs: Any) -> str:
    with pytest.raises(VerificationFailed) as info:
        verify(bundle, roots, **kwargs)
    assert info.value.reason == reason, str(info.value)
    return str(info.value)


def test_a_signed_manifest_is_accepted_and_read_from_the_signed_payload(ca: TestSigstoreAuthority,
                                                                        roots: dict[str, bytes]) -> None:
    bundle = ca.sign_dsse(MANIFEST.statement(), PAYLOAD_TYPE, EMAIL, ISSUER)
    verified = verify(bundle, roots, pin=MANIFEST.root_digest)
    assert verified.manifest == MANIFEST
    assert (verified.signature.identity, verified.signature.issuer) == (EMAIL, ISSUER)


def test_a_manifest_changed_after_signing_is_tampered(ca: TestSigstoreAuthority, roots: dict[str, bytes]) -> None:
    document = json.loads(ca.sign_dsse(MANIFEST.statement(), PAYLOAD_TYPE, EMAIL, ISSUER))
    swapped = WeightsManifest("smollm2", (WeightsFile("config.json", "ab" * 32), WeightsFile("model.gguf", "ee" * 32)))
    document["dsseEnvelope"]["payload"] = base64.b64encode(swapped.statement()).decode()  # the attacker's weights
    assert "does not match the weights manifest" in rejected(json.dumps(document), roots, "tampered")


def test_a_manifest_signed_by_someone_else_or_elsewhere_is_refused(ca: TestSigstoreAuthority,
                                                                   roots: dict[str, bytes]) -> None:
    stranger = ca.sign_dsse(MANIFEST.statement(), PAYLOAD_TYPE, "someone@example.com", ISSUER)
    assert "someone@example.com" in rejected(stranger, roots, "wrong-identity")
    other_authority = TestSigstoreAuthority("other").sign_dsse(MANIFEST.statement(), PAYLOAD_TYPE, EMAIL, ISSUER)
    rejected(other_authority, roots, "untrusted-root")  # the policy trusts the demo root only
    rejected(ca.sign_dsse(MANIFEST.statement(), PAYLOAD_TYPE, EMAIL, ISSUER), roots, "untrusted-root",
             policies=[policy(root=OTHER_ROOT_FILE)])


def test_what_is_not_a_signed_manifest_never_verifies(ca: TestSigstoreAuthority, roots: dict[str, bytes]) -> None:
    assert "unsigned" in rejected(None, roots, "unsigned")
    rejected(ca.sign_dsse(MANIFEST.statement(), PAYLOAD_TYPE, EMAIL, ISSUER), roots, "no-policy", policies=[])
    blob = ca.sign(MANIFEST.statement(), EMAIL, ISSUER)  # a signature over a file, not a DSSE manifest
    assert "no dsseEnvelope" in rejected(blob, roots, "invalid-bundle")
    other_type = ca.sign_dsse(MANIFEST.statement(), "application/json", EMAIL, ISSUER)
    assert "payloadType" in rejected(other_type, roots, "invalid-bundle")
    inconsistent = json.dumps(statement(subject=[{"name": "m", "digest": {"sha256": "00" * 32}}])).encode()
    signed_but_wrong = ca.sign_dsse(inconsistent, PAYLOAD_TYPE, EMAIL, ISSUER)  # a valid signature over nonsense
    assert "contradicts itself" in rejected(signed_but_wrong, roots, "invalid-manifest")
    good = ca.sign_dsse(MANIFEST.statement(), PAYLOAD_TYPE, EMAIL, ISSUER)
    assert "the spec pins sha256:00" in rejected(good, roots, "pin-mismatch", pin="sha256:" + "00" * 32)
