"""Recipe signatures: verify a recipe archive's Sigstore bundle against the RecipeTrustPolicies.

A recipe archive is deployed only if a RecipeTrustPolicy covers its name (`spec.recipes`
globs) and accepts its signature: a Sigstore bundle (`<archive>.sigstore.json`, as written by
`python -m sigstore sign`) whose signing certificate chains to the policy's trust root and names
one of the policy's signers (exact OIDC issuer + exact identity or full-match identity regex).
Several policies may cover one recipe; ANY of them accepting is enough.

Verification is sigstore-python's `Verifier.verify_artifact` over the archive's SHA-256 digest
and runs fully offline: the trust root is either a trusted-root JSON file from the spec
repository or the public-good root bundled with sigstore-python (`Verifier.production(offline=True)`).

Everything fails closed with `VerificationFailed(message, reason)`; the reason says what to fix:

    no-policy       no RecipeTrustPolicy covers the recipe
    unsigned        no bundle was published
    invalid-bundle  the bundle does not parse, or is not a signature over an artifact
    untrusted-root  the certificate (or its CT/transparency log) is not from the policy's trust root,
                    or the trust root itself cannot be loaded
    tampered        the signature does not match the archive digest (archive or bundle altered)
    wrong-identity  a valid signature, but by nobody the policy lists
    wrong-issuer    the identity is listed, but was vouched for by another OIDC issuer

How failures are told apart: sigstore verifies with the policy's own signer check (`SignerPolicy`).
If that check is what rejected, the bundle is verified again with the identity check switched off,
only to learn whether the signature is otherwise valid: a cryptographic failure outranks an
identity mismatch (an untrusted certificate's identity means nothing). Identity and issuer are
read from the leaf certificate with `cryptography`; a chain failure is sigstore's
`CertValidationError`; tampering is confirmed by checking the signature against the digest with
the certificate's key ourselves, not by sigstore's message text.
"""

from __future__ import annotations

import base64
import fnmatch
import hashlib
import json
import re
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import Prehashed
from cryptography.x509.oid import ObjectIdentifier
from plnt.core.specs.models import RecipeTrustPolicy, SignerSpec, TrustRootSpec
from plnt.reconciler.errors import RetryLater, VerificationFailed
from plnt.reconciler.recipes.registries import MAX_BUNDLE_BYTES, MAX_SIGNATURE_BYTES
from plnt.reconciler.recipes.weights_manifest import PAYLOAD_TYPE as DSSE_STATEMENT_TYPE
from plnt.reconciler.recipes.weights_manifest import ManifestError, WeightsManifest, check_pin, parse_statement
from sigstore.errors import CertValidationError, VerificationError
from sigstore.hashes import Hashed
from sigstore.models import Bundle, TrustedRoot
from sigstore.verify import Verifier
from sigstore_models.common.v1 import HashAlgorithm

OIDC_ISSUER_OID = ObjectIdentifier("1.3.6.1.4.1.57264.1.1")  # raw UTF-8 bytes (older Fulcio)
OIDC_ISSUER_V2_OID = ObjectIdentifier("1.3.6.1.4.1.57264.1.8")  # DER UTF8String

VERIFIER_CACHE_SIZE = 16

# How far verification got, for picking the most telling reason when several policies reject.
_REASON_RANK = {"untrusted-root": 0, "invalid-bundle": 1, "tampered": 2, "wrong-identity": 3, "wrong-issuer": 4}


@dataclass(frozen=True)
class VerifiedSignature:
    """A signature that a RecipeTrustPolicy accepted."""

    identity: str  # the certificate SAN that matched a signer (email or URI)
    issuer: str  # the OIDC issuer in the certificate
    policy: str  # metadata.name of the accepting RecipeTrustPolicy
    trust_root: str  # e.g. "trusted root trust/demo-trusted-root.json" or "Sigstore public-good root (offline)"


# --- policies ------------------------------------------------------------------------------


def policies_for(recipe_name: str, policies: Iterable[RecipeTrustPolicy]) -> list[RecipeTrustPolicy]:
    """The policies whose `spec.recipes` globs (fnmatch, case-sensitive) match recipe_name, by name."""
    covering = [p for p in policies if any(fnmatch.fnmatchcase(recipe_name, g) for g in p.spec.recipes)]
    return sorted(covering, key=lambda p: p.metadata.name)


# --- the signing certificate ---------------------------------------------------------------


@dataclass(frozen=True)
class CertificateIdentity:
    """Who a Fulcio-style signing certificate was issued to, read with `cryptography`."""

    sans: tuple[str, ...]  # email and URI SANs
    issuers: tuple[str, ...]  # distinct OIDC issuer values (.1.8 and/or .1.1); normally exactly one

    @classmethod
    def of(cls, cert: x509.Certificate) -> CertificateIdentity:
        try:
            san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
            sans = [*san.get_values_for_type(x509.RFC822Name), *san.get_values_for_type(x509.UniformResourceIdentifier)]
        except x509.ExtensionNotFound:
            sans = []
        issuers: list[str] = []
        for oid, decode in ((OIDC_ISSUER_V2_OID, _der_utf8_string), (OIDC_ISSUER_OID, _utf8)):
            try:
                ext = cert.extensions.get_extension_for_oid(oid).value
            except x509.ExtensionNotFound:
                continue
            value = decode(getattr(ext, "value", b""))
            if value is not None and value not in issuers:
                issuers.append(value)
        return cls(tuple(sans), tuple(issuers))

    def describe(self) -> str:
        who = ", ".join(self.sans) or "no email or URI identity"
        via = " / ".join(self.issuers) or "no OIDC issuer extension"
        return f"{who} (issuer {via})"


def _utf8(raw: bytes) -> str | None:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _der_utf8_string(raw: bytes) -> str | None:
    """Decode a DER UTF8String (tag 0x0c), as Fulcio writes the .1.8 issuer; None if malformed."""
    if len(raw) < 2 or raw[0] != 0x0C:
        return None
    length, offset = raw[1], 2
    if length & 0x80:
        count = length & 0x7F
        if count == 0 or count > 4 or len(raw) < 2 + count:
            return None
        length, offset = int.from_bytes(raw[2 : 2 + count], "big"), 2 + count
    if len(raw) != offset + length:
        return None
    return _utf8(raw[offset:])


class SignerMismatch(VerificationError):
    """The certificate names none of the policy's signers (reason wrong-identity or wrong-issuer)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


def match_signer(signers: Iterable[SignerSpec], found: CertificateIdentity) -> tuple[SignerSpec, str]:
    """The first signer the certificate satisfies and the SAN that matched, or SignerMismatch.

    A signer is satisfied when one SAN matches its identity (exact, or re.fullmatch of
    identityRegex) and every OIDC issuer value in the certificate equals its issuer.
    """
    signers = list(signers)
    allowed = "; ".join(s.describe() for s in signers)
    identity_matches = [s for s in signers if s.matches_identity(list(found.sans))]
    for signer in identity_matches:
        if found.issuers and all(issuer == signer.issuer for issuer in found.issuers):
            return signer, next(san for san in found.sans if signer.matches_identity([san]))
    if identity_matches:
        expected = " or ".join(sorted({s.issuer for s in identity_matches}))
        got = " / ".join(found.issuers) or "no OIDC issuer extension"
        raise SignerMismatch(
            "wrong-issuer",
            f"signer {', '.join(found.sans)} is trusted only via OIDC issuer {expected}, "
            f"but its certificate was issued via {got}",
        )
    raise SignerMismatch(
        "wrong-identity",
        f"signed by {found.describe()}, which matches none of the allowed signers: {allowed}",
    )


class SignerPolicy:
    """A sigstore `VerificationPolicy`: the certificate must satisfy ANY of the signers.

    Equivalent to `AnyOf([AllOf([Identity-or-regex, OIDCIssuer/OIDCIssuerV2]), ...])`, but raises
    `SignerMismatch` saying whether the identity or the issuer was wrong.
    """

    def __init__(self, signers: Iterable[SignerSpec]) -> None:
        self.signers = list(signers)

    def verify(self, cert: x509.Certificate) -> None:
        match_signer(self.signers, CertificateIdentity.of(cert))


class _IdentityNotChecked:
    """A policy that checks no identity. Used ONLY to classify a rejection by `SignerPolicy`
    (is the signature otherwise valid?); a signature is never accepted with it."""

    def verify(self, cert: x509.Certificate) -> None:
        return None


# --- trust roots ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Anchor:
    """A ready Verifier for one trust root, and the ids of the transparency logs it trusts."""

    verifier: Verifier
    log_ids: frozenset[bytes] | None  # None if they could not be read


class _VerifierCache:
    """Verifiers by trust-root content (sha256), least recently used dropped beyond `size`."""

    def __init__(self, size: int = VERIFIER_CACHE_SIZE) -> None:
        self.size = size
        self._entries: OrderedDict[str, _Anchor] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str, build: Callable[[], _Anchor]) -> _Anchor:
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                return self._entries[key]
        anchor = build()  # outside the lock: building may take a while
        with self._lock:
            self._entries[key] = anchor
            self._entries.move_to_end(key)
            while len(self._entries) > self.size:
                self._entries.popitem(last=False)
        return anchor

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


VERIFIERS = _VerifierCache()


def _anchor(verifier: Verifier) -> _Anchor:
    try:  # sigstore has no public accessor; used only to classify log-entry failures
        log_ids = frozenset(bytes(t.log_id.key_id) for t in verifier._trusted_root._inner.tlogs)
    except Exception:  # noqa: BLE001 - classification degrades gracefully
        log_ids = None
    return _Anchor(verifier, log_ids)


def _verifier_from_root_bytes(raw: bytes) -> _Anchor:
    with tempfile.TemporaryDirectory(prefix="plnt-trusted-root-") as tmp:
        path = Path(tmp) / "trusted_root.json"
        path.write_bytes(raw)
        return _anchor(Verifier(trusted_root=TrustedRoot.from_file(str(path))))


def _anchor_for(policy: RecipeTrustPolicy, load_trusted_root: Callable[[str], bytes]) -> _Anchor:
    """The cached Verifier for the policy's trust root; _Rejected(untrusted-root) if unusable."""
    root: TrustRootSpec = policy.spec.trust_root
    name = policy.metadata.name
    if root.public_good:
        try:
            return VERIFIERS.get("public-good", lambda: _anchor(Verifier.production(offline=True)))
        except Exception as exc:  # noqa: BLE001 - fail closed
            raise _Rejected(
                "untrusted-root",
                f"policy {name}: cannot load the Sigstore public-good trust root bundled with sigstore-python "
                f"({type(exc).__name__}: {exc}); check the installation (and that its cache directory is writable)",
            ) from exc
    path = root.trusted_root_file
    assert path is not None
    try:
        raw = load_trusted_root(path)
    except RetryLater:
        raise
    except Exception as exc:  # noqa: BLE001 - fail closed
        raise _Rejected(
            "untrusted-root",
            f"policy {name}: cannot read trustedRootFile {path} ({type(exc).__name__}: {exc}); "
            "commit the trusted-root JSON at that path of the spec repository",
        ) from exc
    key = hashlib.sha256(raw).hexdigest()
    try:
        return VERIFIERS.get(key, lambda: _verifier_from_root_bytes(raw))
    except Exception as exc:  # noqa: BLE001 - fail closed
        raise _Rejected(
            "untrusted-root",
            f"policy {name}: trustedRootFile {path} is not a usable Sigstore trusted root "
            f"({type(exc).__name__}: {exc}); it must be an "
            "application/vnd.dev.sigstore.trustedroot+json;version=0.1 document with a CA, a CT log and a Rekor log",
        ) from exc


# --- bundles -------------------------------------------------------------------------------


@dataclass(frozen=True)
class _ParsedBundle:
    bundle: Bundle
    signature: bytes
    message_digest: bytes | None
    log_id: bytes | None
    identity: CertificateIdentity
    dsse_payload: bytes | None = None  # a DSSE bundle's payload (a weights manifest), as signed


def _parse_bundle(subject: str, bundle_json: bytes, *, dsse: bool = False) -> _ParsedBundle:
    """A recipe archive's bundle (a message signature over its digest), or with `dsse` a weights
    manifest's (a DSSE envelope whose payload is the in-toto statement)."""
    def invalid(detail: str) -> VerificationFailed:
        how = ("sign the manifest as an OMS model signature (a DSSE in-toto statement, `model_signing sign`)"
               if dsse else "re-create it with `python -m sigstore sign <archive>` and publish the .sigstore.json it writes")
        return VerificationFailed(f"{subject}: the signature bundle is not a valid Sigstore bundle ({detail}); {how}",
                                  "invalid-bundle")

    limit = MAX_SIGNATURE_BYTES if dsse else MAX_BUNDLE_BYTES  # a manifest lists every file
    if len(bundle_json) > limit:
        raise invalid(f"{len(bundle_json)} bytes, more than the {limit} allowed")
    try:
        document = json.loads(bundle_json)
        if not isinstance(document, dict):
            raise ValueError("not a JSON object")
        bundle = Bundle.from_json(bundle_json)
    except Exception as exc:  # noqa: BLE001 - anything unparsable fails closed
        raise invalid(f"{type(exc).__name__}: {exc}") from exc
    entries = document.get("verificationMaterial", {}).get("tlogEntries", [])
    if dsse:
        envelope = document.get("dsseEnvelope")
        if not isinstance(envelope, dict):
            raise invalid("it holds no dsseEnvelope: a signature over one file is not a signed weights manifest")
        if envelope.get("payloadType") != DSSE_STATEMENT_TYPE:
            raise invalid(f"its payloadType is {envelope.get('payloadType')!r}, not {DSSE_STATEMENT_TYPE!r}")
        try:
            payload = base64.b64decode(envelope["payload"], validate=True)
            (only,) = envelope["signatures"]
            signature = base64.b64decode(only["sig"], validate=True)
            log_id = base64.b64decode(entries[0]["logId"]["keyId"]) if entries else None
            identity = CertificateIdentity.of(bundle.signing_certificate)
        except Exception as exc:  # noqa: BLE001
            raise invalid(f"malformed envelope (one signature expected), log entry or certificate: "
                          f"{type(exc).__name__}: {exc}") from exc
        return _ParsedBundle(bundle, signature, None, log_id, identity, dsse_payload=payload)
    message_signature = document.get("messageSignature")
    if not isinstance(message_signature, dict):
        raise invalid("it holds no messageSignature: a DSSE attestation is not a signature over the archive")
    try:
        signature = base64.b64decode(message_signature["signature"], validate=True)
        digest_field = message_signature.get("messageDigest")
        message_digest = base64.b64decode(digest_field["digest"], validate=True) if digest_field else None
        log_id = base64.b64decode(entries[0]["logId"]["keyId"]) if entries else None
        identity = CertificateIdentity.of(bundle.signing_certificate)
    except Exception as exc:  # noqa: BLE001
        raise invalid(f"malformed messageSignature, log entry or certificate: {type(exc).__name__}: {exc}") from exc
    return _ParsedBundle(bundle, signature, message_digest, log_id, identity)


def _signature_matches(parsed: _ParsedBundle, digest: bytes | None) -> bool | None:
    """Does the bundle's signature verify (over the archive digest, or over its DSSE payload) with
    the certificate's key? None: can't tell."""
    key = parsed.bundle.signing_certificate.public_key()
    if not isinstance(key, ec.EllipticCurvePublicKey):
        return None
    try:
        if parsed.dsse_payload is not None:
            kind = DSSE_STATEMENT_TYPE.encode()
            pae = b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(parsed.dsse_payload), parsed.dsse_payload)
            key.verify(parsed.signature, pae, ec.ECDSA(hashes.SHA256()))
            return True
        assert digest is not None
        if parsed.message_digest is not None and parsed.message_digest != digest:
            return False
        key.verify(parsed.signature, digest, ec.ECDSA(Prehashed(hashes.SHA256())))
    except InvalidSignature:
        return False
    return True


# --- verification --------------------------------------------------------------------------


class _Rejected(Exception):
    """One policy's rejection, before it is combined with the other policies' into VerificationFailed."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def _classify(exc: Exception, parsed: _ParsedBundle, digest: bytes | None, anchor: _Anchor,
              policy: RecipeTrustPolicy) -> _Rejected:
    """Turn a non-identity verification failure into a reason and advice."""
    name = policy.metadata.name
    root = policy.spec.trust_root.describe()
    detail = f"{type(exc).__name__}: {exc}"
    cert = parsed.bundle.signing_certificate
    if isinstance(exc, CertValidationError):
        return _Rejected(
            "untrusted-root",
            f"policy {name}: the signing certificate for {parsed.identity.describe()}, issued by "
            f"{cert.issuer.rfc4514_string() or 'an unnamed CA'}, does not chain to its {root} at signing time ({detail}); "
            "the bundle was made by another Sigstore instance (or with a certificate not valid when it was logged): "
            "re-sign with the instance this root describes, or point spec.trustRoot at the root of the instance "
            "that signed it",
        )
    if _signature_matches(parsed, digest) is False or "inconsistent" in str(exc) or "do not match" in str(exc):
        what, fix = (("the weights manifest it carries", "the manifest or its bundle changed after signing: "
                      "publish the bundle that was signed, or re-sign the weights") if digest is None else
                     (f"the archive (sha256:{digest.hex()})", "the archive or its bundle changed after signing: "
                      "publish the archive that was signed, or re-sign it"))
        return _Rejected("tampered", f"policy {name}: the signature does not match {what} ({detail}); {fix}")
    message = str(exc)
    if "SCT" in message:
        return _Rejected(
            "untrusted-root",
            f"policy {name}: the certificate's CT log (SCT) is not one its {root} trusts ({detail}); "
            "re-sign with the Sigstore instance this root describes, or fix spec.trustRoot",
        )
    if "log entry" in message:
        if anchor.log_ids is None or parsed.log_id not in anchor.log_ids:
            return _Rejected(
                "untrusted-root",
                f"policy {name}: the bundle's transparency log is not one its {root} trusts ({detail}); "
                "re-sign with the Sigstore instance this root describes, or fix spec.trustRoot",
            )
        return _Rejected(
            "tampered",
            f"policy {name}: the bundle's transparency-log entry does not verify ({detail}); "
            "the bundle was altered or corrupted: publish the bundle `sigstore sign` wrote, or re-sign",
        )
    return _Rejected(
        "invalid-bundle",
        f"policy {name}: the bundle does not verify ({detail}); re-create it with `python -m sigstore sign <archive>`",
    )


def _verify_with(policy: RecipeTrustPolicy, parsed: _ParsedBundle, digest: bytes | None,
                 load_trusted_root: Callable[[str], bytes]) -> VerifiedSignature:
    """One policy's verdict on a recipe archive's digest, or (digest None) on a DSSE bundle."""
    anchor = _anchor_for(policy, load_trusted_root)

    def verify(with_policy: Any) -> None:
        if digest is None:
            anchor.verifier.verify_dsse(parsed.bundle, with_policy)
        else:
            anchor.verifier.verify_artifact(Hashed(algorithm=HashAlgorithm.SHA2_256, digest=digest), parsed.bundle,
                                            with_policy)

    try:
        verify(SignerPolicy(policy.spec.signers))
    except SignerMismatch as mismatch:
        # Only an otherwise valid signature may be reported as a wrong identity or issuer.
        try:
            verify(_IdentityNotChecked())
        except Exception as exc:  # noqa: BLE001 - fail closed
            raise _classify(exc, parsed, digest, anchor, policy) from exc
        advice = (
            "add that signer to the policy's spec.signers if you trust it, or publish "
            f"{'weights' if digest is None else 'a recipe'} signed by an allowed signer"
            if mismatch.reason == "wrong-identity"
            else "fix the signer's issuer in the policy if that issuer is trusted, or re-sign through the expected issuer"
        )
        raise _Rejected(mismatch.reason, f"policy {policy.metadata.name}: {mismatch.detail}; {advice}") from mismatch
    except Exception as exc:  # noqa: BLE001 - fail closed
        raise _classify(exc, parsed, digest, anchor, policy) from exc
    # verify_artifact ran SignerPolicy on this very certificate, so this cannot fail.
    signer, san = match_signer(policy.spec.signers, parsed.identity)
    return VerifiedSignature(
        identity=san,
        issuer=signer.issuer,
        policy=policy.metadata.name,
        trust_root=policy.spec.trust_root.describe(),
    )


def _digest_bytes(archive_sha256_hex: str) -> bytes:
    text = archive_sha256_hex.removeprefix("sha256:")
    if not re.fullmatch(r"[0-9a-fA-F]{64}", text):
        raise ValueError(f"expected a SHA-256 digest as 64 hex digits, got {archive_sha256_hex!r}")
    return bytes.fromhex(text)


def verify_recipe(
    archive_sha256_hex: str,
    bundle_json: bytes | None,
    *,
    recipe: str,
    policies: list[RecipeTrustPolicy],
    load_trusted_root: Callable[[str], bytes],
) -> VerifiedSignature:
    """Verify a recipe archive's Sigstore bundle against the policies covering `recipe`, offline.

    archive_sha256_hex: the archive's SHA-256 (64 hex digits, optionally prefixed "sha256:").
    bundle_json: the `.sigstore.json` bundle's bytes, or None if none was published.
    policies: all RecipeTrustPolicies (those not covering `recipe` are ignored).
    load_trusted_root: returns the bytes of a `trustedRootFile` path (read from the spec
    repository at the reconciled commit).

    Returns the accepted signature (from the first policy, by name, that accepts it); raises
    `VerificationFailed` otherwise, with the most telling reason across the covering policies and
    every policy's verdict in the message.
    """
    digest = _digest_bytes(archive_sha256_hex)
    covering = policies_for(recipe, policies)
    if not covering:
        raise VerificationFailed(
            f"no RecipeTrustPolicy covers recipe {recipe}; add one naming the signers you trust "
            f"(spec.recipes: [\"{recipe}\"], spec.trustRoot, spec.signers)",
            "no-policy",
        )
    names = ", ".join(p.metadata.name for p in covering)
    if bundle_json is None:
        raise VerificationFailed(
            f"recipe {recipe} is unsigned: no Sigstore bundle was published with it, and RecipeTrustPolicy {names} "
            "requires one; sign the archive (`python -m sigstore sign <archive>`) and publish "
            "<archive>.sigstore.json next to it",
            "unsigned",
        )
    parsed = _parse_bundle(f"recipe {recipe}", bundle_json)
    return _first_accepting(covering, parsed, digest, load_trusted_root, f"recipe {recipe}", "RecipeTrustPolicy")


def _first_accepting(policies: list[RecipeTrustPolicy], parsed: _ParsedBundle, digest: bytes | None,
                     load_trusted_root: Callable[[str], bytes], subject: str, kind: str) -> VerifiedSignature:
    rejections: list[_Rejected] = []
    retry: RetryLater | None = None
    for policy in policies:
        try:
            return _verify_with(policy, parsed, digest, load_trusted_root)
        except _Rejected as rejected:
            rejections.append(rejected)
        except RetryLater as exc:  # e.g. the trusted root could not be read just now
            retry = retry or exc
    if retry is not None:
        raise retry
    best = max(rejections, key=lambda r: _REASON_RANK.get(r.reason, -1))
    if len(rejections) == 1:
        message = f"{subject}: signature rejected by {best.message}"
    else:
        verdicts = "; ".join(f"[{r.reason}] {r.message}" for r in rejections)
        message = f"{subject}: signature rejected by every {kind} covering it: {verdicts}"
    raise VerificationFailed(message, best.reason)


@dataclass(frozen=True)
class VerifiedWeights:
    signature: VerifiedSignature
    manifest: WeightsManifest


def verify_weights_signature(
    bundle_json: bytes | None,
    *,
    model: str,
    policies: list[RecipeTrustPolicy],
    load_trusted_root: Callable[[str], bytes],
    pin: str | None = None,
) -> VerifiedWeights:
    """Verify a model's signed weights manifest (an OMS v1.0 in-toto statement in a Sigstore DSSE
    bundle) against `policies` (those the ModelDeployment names: ANY accepting is enough), offline,
    then read the manifest from the verified payload and check it against the spec's root-digest pin.

    Fails closed with VerificationFailed: the reasons of `verify_recipe`, and invalid-manifest or
    pin-mismatch for a statement that verifies but is not a usable manifest, or not the pinned one.
    The files themselves are checked against the manifest as they are fetched
    (`weights_manifest.check_directory`)."""
    subject = f"model {model}"
    if not policies:
        raise VerificationFailed(f"{subject}: no trust policy is named for its weights; name one that lists the "
                                 "signers you trust", "no-policy")
    if bundle_json is None:
        raise VerificationFailed(f"{subject}: its weights are unsigned: no signed manifest (model.sig) was published "
                                 "with them; sign them as an OMS model signature and publish model.sig beside them",
                                 "unsigned")
    parsed = _parse_bundle(subject, bundle_json, dsse=True)
    signature = _first_accepting(policies, parsed, None, load_trusted_root, subject, "trust policy")
    assert parsed.dsse_payload is not None
    try:
        manifest = parse_statement(parsed.dsse_payload)
        check_pin(manifest, pin)
    except ManifestError as exc:
        raise VerificationFailed(f"{subject}: {exc}", exc.reason) from exc
    return VerifiedWeights(signature=signature, manifest=manifest)
