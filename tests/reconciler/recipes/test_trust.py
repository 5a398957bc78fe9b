"""Recipe signature verification: real Sigstore bundles from a test authority, verified offline.

The test authority (TestSigstoreAuthority, tests/sigstore_ca.py) is a STAND-IN for Sigstore's
public services (Fulcio, Rekor) and an OIDC issuer; the verifier is sigstore-python's own."""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
from typing import Any

import pytest
from plnt.core.specs.models import RecipeTrustPolicy
from plnt.reconciler.errors import VerificationFailed
from plnt.reconciler.recipes import trust
from plnt.reconciler.recipes.trust import VerifiedSignature, policies_for, verify_recipe

from tests.sigstore_ca import TestSigstoreAuthority

ARCHIVE = b"review-responder-1.2.0.tar.gz bytes"
DIGEST = hashlib.sha256(ARCHIVE).hexdigest()
EMAIL, ISSUER = "release@example.com", "https://accounts.example.com"
GH_ISSUER = "https://token.actions.githubusercontent.com"
WORKFLOW = "https://github.com/acme/recipes/.github/workflows/release.yml@refs/tags/v1"
WORKFLOW_REGEX = r"^https://github\.com/acme/recipes/\.github/workflows/release\.yml@refs/tags/v.*$"
ROOT_FILE, OTHER_ROOT_FILE = "trust/demo-trusted-root.json", "trust/other-trusted-root.json"


@pytest.fixture(scope="module")
def ca() -> TestSigstoreAuthority:
    return TestSigstoreAuthority("demo")


@pytest.fixture(scope="module")
def other_ca() -> TestSigstoreAuthority:
    return TestSigstoreAuthority("other")


@pytest.fixture(scope="module")
def roots(ca: TestSigstoreAuthority, other_ca: TestSigstoreAuthority) -> dict[str, bytes]:
    return {ROOT_FILE: ca.trusted_root_json().encode(), OTHER_ROOT_FILE: other_ca.trusted_root_json().encode()}


def policy(name: str = "demo", *, recipes: list[str] | None = None, root: dict[str, Any] | None = None,
           signers: list[dict[str, str]] | None = None) -> RecipeTrustPolicy:
    return RecipeTrustPolicy.model_validate(
        {
            "apiVersion": "plnt.work/v1",
            "kind": "RecipeTrustPolicy",
            "metadata": {"name": name},
            "spec": {
                "recipes": recipes or ["review-responder", "team-*"],
                "trustRoot": root or {"trustedRootFile": ROOT_FILE},
                "signers": signers or [{"issuer": ISSUER, "identity": EMAIL}],
            },
        }
    )


def verify(bundle: str | bytes | None, policies: list[RecipeTrustPolicy], roots: dict[str, bytes], *,
           digest: str = DIGEST, recipe: str = "review-responder") -> VerifiedSignature:
    raw = bundle.encode() if isinstance(bundle, str) else bundle
    return verify_recipe(digest, raw, recipe=recipe, policies=policies, load_trusted_root=roots.__getitem__)


def rejected(bundle: str | bytes | None, policies: list[RecipeTrustPolicy], roots: dict[str, bytes], reason: str,
             **kwargs: Any) -> str:
    with pytest.raises(VerificationFailed) as info:
        verify(bundle, policies, roots, **kwargs)
    assert info.value.reason == reason, str(info.value)
    assert not info.value.retryable
    return str(info.value)


# --- accepted ------------------------------------------------------------------------------


def test_good_signature_email_identity(ca: TestSigstoreAuthority, roots: dict[str, bytes]) -> None:
    result = verify(ca.sign(ARCHIVE, EMAIL, ISSUER), [policy()], roots)
    assert result == VerifiedSignature(
        identity=EMAIL, issuer=ISSUER, policy="demo", trust_root=f"trusted root {ROOT_FILE}"
    )


def test_good_signature_uri_identity_with_regex(ca: TestSigstoreAuthority, roots: dict[str, bytes]) -> None:
    gh = policy(signers=[{"issuer": GH_ISSUER, "identityRegex": WORKFLOW_REGEX}])
    result = verify(ca.sign(ARCHIVE, WORKFLOW, GH_ISSUER), [gh], roots, recipe="team-search")
    assert (result.identity, result.issuer) == (WORKFLOW, GH_ISSUER)


def test_digest_may_carry_the_sha256_prefix_and_signing_a_file_is_the_same(
    ca: TestSigstoreAuthority, roots: dict[str, bytes], tmp_path: Any
) -> None:
    archive = tmp_path / "recipe.tar.gz"
    archive.write_bytes(ARCHIVE)
    assert verify(ca.sign(archive, EMAIL, ISSUER), [policy()], roots, digest="sha256:" + DIGEST).identity == EMAIL


def test_old_signature_stays_valid(ca: TestSigstoreAuthority, roots: dict[str, bytes]) -> None:
    """Certificates are checked at the log's integration time: a bundle outlives its 10-minute cert."""
    bundle = ca.sign(ARCHIVE, EMAIL, ISSUER, at=dt.datetime.now(dt.UTC) - dt.timedelta(hours=5))
    assert verify(bundle, [policy()], roots).identity == EMAIL


def test_any_of_two_signers(ca: TestSigstoreAuthority, roots: dict[str, bytes]) -> None:
    both = policy(signers=[{"issuer": ISSUER, "identity": EMAIL}, {"issuer": GH_ISSUER, "identityRegex": WORKFLOW_REGEX}])
    assert verify(ca.sign(ARCHIVE, EMAIL, ISSUER), [both], roots).identity == EMAIL
    assert verify(ca.sign(ARCHIVE, WORKFLOW, GH_ISSUER), [both], roots).identity == WORKFLOW
    message = rejected(ca.sign(ARCHIVE, "attacker@example.com", ISSUER), [both], roots, "wrong-identity")
    assert EMAIL in message and WORKFLOW_REGEX in message


def test_two_policies_one_wrong_root_one_right(ca: TestSigstoreAuthority, roots: dict[str, bytes]) -> None:
    wrong = policy("a-other-root", root={"trustedRootFile": OTHER_ROOT_FILE})
    right = policy("b-demo-root")
    result = verify(ca.sign(ARCHIVE, EMAIL, ISSUER), [wrong, right], roots)
    assert result.policy == "b-demo-root"


def test_policies_that_do_not_cover_the_recipe_are_ignored(ca: TestSigstoreAuthority, roots: dict[str, bytes]) -> None:
    elsewhere = policy("elsewhere", recipes=["other-*"], signers=[{"issuer": ISSUER, "identity": "x@example.com"}])
    assert verify(ca.sign(ARCHIVE, EMAIL, ISSUER), [elsewhere, policy()], roots).policy == "demo"


# --- rejected ------------------------------------------------------------------------------


def test_no_policy_covers_the_recipe(ca: TestSigstoreAuthority, roots: dict[str, bytes]) -> None:
    message = rejected(ca.sign(ARCHIVE, EMAIL, ISSUER), [policy(recipes=["team-*"])], roots, "no-policy",
                       recipe="review-responder")
    assert "no RecipeTrustPolicy covers recipe review-responder; add one naming the signers you trust" in message
    assert rejected(None, [], roots, "no-policy")  # checked before the bundle


def test_missing_bundle_is_unsigned(roots: dict[str, bytes]) -> None:
    message = rejected(None, [policy()], roots, "unsigned")
    assert "review-responder is unsigned" in message and "demo" in message and "sigstore sign" in message


@pytest.mark.parametrize(
    "bundle",
    [b"{not json", b"[]", b'{"mediaType": "application/vnd.dev.sigstore.bundle.v0.3+json"}', b"\xff\xfe"],
)
def test_invalid_bundle(bundle: bytes, roots: dict[str, bytes]) -> None:
    message = rejected(bundle, [policy()], roots, "invalid-bundle")
    assert "not a valid Sigstore bundle" in message and "sigstore sign" in message


def test_bundle_without_message_signature_is_invalid(ca: TestSigstoreAuthority, roots: dict[str, bytes]) -> None:
    document = json.loads(ca.sign(ARCHIVE, EMAIL, ISSUER))
    document["dsseEnvelope"] = {"payload": "e30=", "payloadType": "application/vnd.in-toto+json",
                                "signatures": [{"sig": document.pop("messageSignature")["signature"]}]}
    message = rejected(json.dumps(document), [policy()], roots, "invalid-bundle")
    assert "messageSignature" in message


def test_oversized_bundle_is_invalid(roots: dict[str, bytes]) -> None:
    assert "allowed" in rejected(b" " * (trust.MAX_BUNDLE_BYTES + 1), [policy()], roots, "invalid-bundle")


def test_tampered_archive(ca: TestSigstoreAuthority, roots: dict[str, bytes]) -> None:
    other = hashlib.sha256(ARCHIVE + b"!").hexdigest()
    message = rejected(ca.sign(ARCHIVE, EMAIL, ISSUER), [policy()], roots, "tampered", digest=other)
    assert "does not match the archive" in message and other in message


def test_tampered_without_message_digest_field(ca: TestSigstoreAuthority, roots: dict[str, bytes]) -> None:
    """Detected by the signature itself, not only by the bundle's optional messageDigest."""
    document = json.loads(ca.sign(ARCHIVE, EMAIL, ISSUER))
    del document["messageSignature"]["messageDigest"]
    other = hashlib.sha256(b"evil").hexdigest()
    rejected(json.dumps(document), [policy()], roots, "tampered", digest=other)


def test_tampering_outranks_a_wrong_identity(ca: TestSigstoreAuthority, roots: dict[str, bytes]) -> None:
    """The signer check runs before the signature check in sigstore; we still report tampering."""
    other = hashlib.sha256(b"evil").hexdigest()
    rejected(ca.sign(ARCHIVE, "attacker@example.com", ISSUER), [policy()], roots, "tampered", digest=other)


def test_altered_log_entry_is_tampered(ca: TestSigstoreAuthority, roots: dict[str, bytes]) -> None:
    document = json.loads(ca.sign(ARCHIVE, EMAIL, ISSUER))
    entry = document["verificationMaterial"]["tlogEntries"][0]
    entry["integratedTime"] = str(int(entry["integratedTime"]) + 1)  # breaks the inclusion promise
    message = rejected(json.dumps(document), [policy()], roots, "tampered")
    assert "transparency-log entry does not verify" in message


def test_wrong_identity(ca: TestSigstoreAuthority, roots: dict[str, bytes]) -> None:
    message = rejected(ca.sign(ARCHIVE, "attacker@example.com", ISSUER), [policy()], roots, "wrong-identity")
    assert "attacker@example.com" in message and f"{EMAIL} via {ISSUER}" in message
    assert "spec.signers" in message


def test_identity_regex_must_match_the_whole_san(ca: TestSigstoreAuthority, roots: dict[str, bytes]) -> None:
    partial = policy(signers=[{"issuer": GH_ISSUER, "identityRegex": r"https://github\.com/acme/recipes/"}])
    rejected(ca.sign(ARCHIVE, WORKFLOW, GH_ISSUER), [partial], roots, "wrong-identity")
    evil = WORKFLOW.replace("acme", "acme-evil")
    rejected(ca.sign(ARCHIVE, evil, GH_ISSUER), [policy(signers=[{"issuer": GH_ISSUER, "identityRegex": WORKFLOW_REGEX}])],
             roots, "wrong-identity")


def test_wrong_issuer(ca: TestSigstoreAuthority, roots: dict[str, bytes]) -> None:
    message = rejected(ca.sign(ARCHIVE, EMAIL, "https://evil.example"), [policy()], roots, "wrong-issuer")
    assert "https://evil.example" in message and ISSUER in message and EMAIL in message


def test_bundle_from_another_authority_is_untrusted(other_ca: TestSigstoreAuthority, roots: dict[str, bytes]) -> None:
    message = rejected(other_ca.sign(ARCHIVE, EMAIL, ISSUER), [policy()], roots, "untrusted-root")
    assert "does not chain to its trusted root trust/demo-trusted-root.json at signing time" in message
    assert "other-test-fulcio" in message and "spec.trustRoot" in message


def test_untrusted_root_outranks_a_wrong_identity(other_ca: TestSigstoreAuthority, roots: dict[str, bytes]) -> None:
    rejected(other_ca.sign(ARCHIVE, "attacker@example.com", ISSUER), [policy()], roots, "untrusted-root")


def test_transparency_log_not_in_the_root_is_untrusted(
    ca: TestSigstoreAuthority, other_ca: TestSigstoreAuthority, roots: dict[str, bytes]
) -> None:
    """The certificate chains to the CA, but the log entry comes from a log the root does not list."""
    mixed = ca.trusted_root()
    mixed["tlogs"] = other_ca.trusted_root()["tlogs"]
    mixed_roots = {**roots, "trust/mixed.json": json.dumps(mixed).encode()}
    message = rejected(ca.sign(ARCHIVE, EMAIL, ISSUER), [policy(root={"trustedRootFile": "trust/mixed.json"})],
                       mixed_roots, "untrusted-root")
    assert "transparency log is not one" in message


def test_public_good_root_rejects_a_test_bundle_offline(ca: TestSigstoreAuthority, roots: dict[str, bytes]) -> None:
    message = rejected(ca.sign(ARCHIVE, EMAIL, ISSUER), [policy(root={"publicGood": True})], roots, "untrusted-root")
    assert "Sigstore public-good root (offline)" in message


def test_two_policies_both_rejecting_report_each(ca: TestSigstoreAuthority, roots: dict[str, bytes]) -> None:
    wrong_root = policy("a-other-root", root={"trustedRootFile": OTHER_ROOT_FILE})
    wrong_signer = policy("b-demo-root", signers=[{"issuer": ISSUER, "identity": "someone@example.com"}])
    message = rejected(ca.sign(ARCHIVE, EMAIL, ISSUER), [wrong_root, wrong_signer], roots, "wrong-identity")
    assert "every RecipeTrustPolicy covering it" in message
    assert "[untrusted-root] policy a-other-root" in message and "[wrong-identity] policy b-demo-root" in message


def test_unreadable_or_broken_trusted_root(ca: TestSigstoreAuthority, roots: dict[str, bytes]) -> None:
    bundle = ca.sign(ARCHIVE, EMAIL, ISSUER)
    missing = policy(root={"trustedRootFile": "trust/missing.json"})
    assert "cannot read trustedRootFile trust/missing.json" in rejected(bundle, [missing], roots, "untrusted-root")
    broken = policy(root={"trustedRootFile": "trust/broken.json"})
    message = rejected(bundle, [broken], {**roots, "trust/broken.json": b'{"mediaType": "nope"}'}, "untrusted-root")
    assert "not a usable Sigstore trusted root" in message


def test_bad_digest_is_a_programming_error(ca: TestSigstoreAuthority, roots: dict[str, bytes]) -> None:
    with pytest.raises(ValueError, match="64 hex digits"):
        verify(ca.sign(ARCHIVE, EMAIL, ISSUER), [policy()], roots, digest="abc")


# --- helpers -------------------------------------------------------------------------------


def test_policies_for_matches_globs() -> None:
    a = policy("a", recipes=["review-responder"])
    b = policy("b", recipes=["team-*", "review-*"])
    c = policy("c", recipes=["other"])
    assert [p.metadata.name for p in policies_for("review-responder", [b, c, a])] == ["a", "b"]
    assert [p.metadata.name for p in policies_for("team-x", [a, b, c])] == ["b"]
    assert policies_for("Team-x", [b]) == []  # case-sensitive


def test_verifier_is_cached_by_trusted_root_content(ca: TestSigstoreAuthority, roots: dict[str, bytes]) -> None:
    trust.VERIFIERS.clear()
    built: list[bytes] = []
    original = trust._verifier_from_root_bytes

    def counting(raw: bytes) -> Any:
        built.append(raw)
        return original(raw)

    trust._verifier_from_root_bytes = counting  # type: ignore[assignment]
    try:
        bundle = ca.sign(ARCHIVE, EMAIL, ISSUER)
        same_content = {**roots, "trust/copy.json": roots[ROOT_FILE]}
        verify(bundle, [policy()], same_content)
        verify(bundle, [policy(root={"trustedRootFile": "trust/copy.json"})], same_content)
        assert len(built) == 1
    finally:
        trust._verifier_from_root_bytes = original  # type: ignore[assignment]


def test_test_authority_bundle_shape(ca: TestSigstoreAuthority) -> None:
    document = json.loads(ca.sign(ARCHIVE, EMAIL, ISSUER))
    assert document["mediaType"] == "application/vnd.dev.sigstore.bundle.v0.3+json"
    digest = base64.b64decode(document["messageSignature"]["messageDigest"]["digest"])
    assert digest.hex() == DIGEST
    root = json.loads(ca.trusted_root_json())
    assert root["mediaType"] == "application/vnd.dev.sigstore.trustedroot+json;version=0.1"
