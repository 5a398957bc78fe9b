"""A throwaway Sigstore signing authority for tests and demos. NOT a production CA.

`TestSigstoreAuthority` plays every Sigstore service at once, in memory: a Fulcio-like CA that
issues short-lived signing certificates to an identity (email or URI) vouched for by an OIDC
issuer, a certificate-transparency log that embeds an SCT in them, and a Rekor-like transparency
log that records each signature and signs a checkpoint and an inclusion promise for it. What it
produces is real Sigstore material, verified by sigstore-python's ordinary `Verifier`:

    ca = TestSigstoreAuthority()
    root_json = ca.trusted_root_json()          # application/vnd.dev.sigstore.trustedroot+json
    bundle_json = ca.sign(b"archive bytes", "release@example.com", "https://accounts.example.com")
    Verifier(trusted_root=TrustedRoot.from_file(...)).verify_artifact(data, Bundle.from_json(bundle_json), policy)

Nothing here talks to a network. Keys are generated fresh for every instance (well under a second)
and are held only in memory: no private key is ever written anywhere, so the trust roots and bundles
it makes may be committed (as demo material), but a new signature for the same root can only come
from the same live instance.

Validity: the CA certificate is valid from one day ago for about ten years (bundles made now stay
verifiable, since Sigstore checks certificates at the log's integration time, not at verification
time); each signing certificate is valid for ten minutes and the log entry's integratedTime falls
inside that window.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
import os
import struct
from pathlib import Path

import rfc8785
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import Prehashed
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID, ObjectIdentifier
from sigstore.hashes import Hashed
from sigstore_models.common.v1 import HashAlgorithm

TRUSTED_ROOT_MEDIA_TYPE = "application/vnd.dev.sigstore.trustedroot+json;version=0.1"
BUNDLE_MEDIA_TYPE = "application/vnd.dev.sigstore.bundle.v0.3+json"

# Fulcio's certificate extensions (https://github.com/sigstore/fulcio/blob/main/docs/oid-info.md).
OIDC_ISSUER_OID = ObjectIdentifier("1.3.6.1.4.1.57264.1.1")  # raw bytes (deprecated form)
OIDC_ISSUER_V2_OID = ObjectIdentifier("1.3.6.1.4.1.57264.1.8")  # DER UTF8String
# RFC 6962 embedded SCT list.
SCT_LIST_OID = ObjectIdentifier("1.3.6.1.4.1.11129.2.4.2")

CA_LIFETIME = dt.timedelta(days=3650)
CA_BACKDATE = dt.timedelta(days=1)
LEAF_LIFETIME = dt.timedelta(minutes=10)
LEAF_BACKDATE = dt.timedelta(seconds=30)  # the log integrates the entry a moment after issuance


# --- small encoding helpers ----------------------------------------------------------------


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _spki_der(key: ec.EllipticCurvePrivateKey) -> bytes:
    """DER SubjectPublicKeyInfo of a key's public half (what log ids and key hashes are over)."""
    return key.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def _key_id(key: ec.EllipticCurvePrivateKey) -> bytes:
    """A Sigstore log id: sha256 of the log key's DER SubjectPublicKeyInfo."""
    return hashlib.sha256(_spki_der(key)).digest()


def _ecdsa_sign(key: ec.EllipticCurvePrivateKey, data: bytes) -> bytes:
    return key.sign(data, ec.ECDSA(hashes.SHA256()))


def _der_length(length: int) -> bytes:
    if length < 0x80:
        return bytes([length])
    encoded = length.to_bytes((length.bit_length() + 7) // 8, "big")
    return bytes([0x80 | len(encoded)]) + encoded


def _der_utf8_string(text: str) -> bytes:
    raw = text.encode()
    return b"\x0c" + _der_length(len(raw)) + raw


def _der_octet_string(raw: bytes) -> bytes:
    return b"\x04" + _der_length(len(raw)) + raw


def _rfc3339(when: dt.datetime) -> str:
    return when.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC).replace(microsecond=0)


# --- the authority -------------------------------------------------------------------------


class TestSigstoreAuthority:
    """An in-memory test CA + CT log + transparency log producing real Sigstore bundles.

    For tests, demos and benchmarks only: it signs whatever it is asked to, for any identity.
    """

    __test__ = False  # a fixture, not a pytest test class (its name starts with "Test")

    def __init__(self, name: str = "test") -> None:
        self.name = name
        self.created = _now()
        self._ca_key = ec.generate_private_key(ec.SECP256R1())
        self._ct_key = ec.generate_private_key(ec.SECP256R1())
        self._rekor_key = ec.generate_private_key(ec.SECP256R1())
        self._ca_name = x509.Name(
            [
                x509.NameAttribute(NameOID.ORGANIZATION_NAME, f"plnt {name} authority"),
                x509.NameAttribute(NameOID.COMMON_NAME, f"{name}-test-fulcio"),
            ]
        )
        self.ca_certificate = self._build_ca_certificate()

    # -- trust root ------------------------------------------------------------------------

    def _build_ca_certificate(self) -> x509.Certificate:
        public = self._ca_key.public_key()
        not_before = self.created - CA_BACKDATE
        return (
            x509.CertificateBuilder()
            .subject_name(self._ca_name)
            .issuer_name(self._ca_name)
            .public_key(public)
            .serial_number(x509.random_serial_number())
            .not_valid_before(not_before)
            .not_valid_after(not_before + CA_LIFETIME)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=False, content_commitment=False, key_encipherment=False,
                    data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
                    encipher_only=False, decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
            .sign(self._ca_key, hashes.SHA256())
        )

    def _log_instance(self, key: ec.EllipticCurvePrivateKey, kind: str) -> dict:
        return {
            "baseUrl": f"https://{kind}.{self.name}.test",
            "hashAlgorithm": "SHA2_256",
            "publicKey": {
                "rawBytes": _b64(_spki_der(key)),
                "keyDetails": "PKIX_ECDSA_P256_SHA_256",
                "validFor": {"start": _rfc3339(self.ca_certificate.not_valid_before_utc)},
            },
            "logId": {"keyId": _b64(_key_id(key))},
        }

    def trusted_root(self) -> dict:
        """The trusted root as a JSON-ready dict: this CA, its CT log and its transparency log."""
        return {
            "mediaType": TRUSTED_ROOT_MEDIA_TYPE,
            "tlogs": [self._log_instance(self._rekor_key, "rekor")],
            "certificateAuthorities": [
                {
                    "subject": {"organization": f"plnt {self.name} authority", "commonName": f"{self.name}-test-fulcio"},
                    "uri": f"https://fulcio.{self.name}.test",
                    "certChain": {
                        "certificates": [{"rawBytes": _b64(self.ca_certificate.public_bytes(serialization.Encoding.DER))}]
                    },
                    "validFor": {"start": _rfc3339(self.ca_certificate.not_valid_before_utc)},
                }
            ],
            "ctlogs": [self._log_instance(self._ct_key, "ctfe")],
            "timestampAuthorities": [],
        }

    def trusted_root_json(self) -> str:
        """The trusted root document (`application/vnd.dev.sigstore.trustedroot+json;version=0.1`)."""
        return json.dumps(self.trusted_root(), indent=2) + "\n"

    def write_trusted_root(self, path: str | os.PathLike[str]) -> Path:
        """Write `trusted_root_json()` to path (public material only) and return the path."""
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(self.trusted_root_json(), encoding="utf-8")
        return target

    # -- signing certificates --------------------------------------------------------------

    def _embedded_sct(self, tbs_precertificate: bytes | None, timestamp_ms: int) -> x509.UnrecognizedExtension:
        """An RFC 6962 SCT list extension, signed by the CT log over the precertificate TBS.

        With `tbs_precertificate=None` the signature is a placeholder: that certificate is only
        built to learn its TBS bytes (which exclude this very extension).
        """
        if tbs_precertificate is None:
            signature = b"\x00" * 72
        else:
            signed = (
                struct.pack("!BBQH", 0, 0, timestamp_ms, 1)  # v1, certificate_timestamp, time, precert_entry
                + hashlib.sha256(_spki_der(self._ca_key)).digest()  # issuer_key_hash
                + len(tbs_precertificate).to_bytes(3, "big")
                + tbs_precertificate
                + b"\x00\x00"  # no CT extensions
            )
            signature = _ecdsa_sign(self._ct_key, signed)
        sct = (
            b"\x00"  # v1
            + _key_id(self._ct_key)
            + struct.pack("!QH", timestamp_ms, 0)  # timestamp, no extensions
            + b"\x04\x03"  # sha256, ecdsa
            + struct.pack("!H", len(signature))
            + signature
        )
        sct_list = struct.pack("!H", len(sct) + 2) + struct.pack("!H", len(sct)) + sct
        return x509.UnrecognizedExtension(SCT_LIST_OID, _der_octet_string(sct_list))

    def _leaf_certificate(
        self, public_key: ec.EllipticCurvePublicKey, identity: str, issuer: str, issued: dt.datetime
    ) -> x509.Certificate:
        """A Fulcio-style signing certificate for identity, with an embedded SCT."""
        san: x509.GeneralName = (
            x509.UniformResourceIdentifier(identity) if "://" in identity else x509.RFC822Name(identity)
        )
        serial = x509.random_serial_number()
        not_before = issued - LEAF_BACKDATE

        def build(sct: x509.UnrecognizedExtension) -> x509.Certificate:
            return (
                x509.CertificateBuilder()
                .subject_name(x509.Name([]))
                .issuer_name(self._ca_name)
                .public_key(public_key)
                .serial_number(serial)
                .not_valid_before(not_before)
                .not_valid_after(not_before + LEAF_LIFETIME)
                .add_extension(
                    x509.KeyUsage(
                        digital_signature=True, content_commitment=False, key_encipherment=False,
                        data_encipherment=False, key_agreement=False, key_cert_sign=False, crl_sign=False,
                        encipher_only=False, decipher_only=False,
                    ),
                    critical=True,
                )
                .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CODE_SIGNING]), critical=False)
                .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
                .add_extension(
                    x509.AuthorityKeyIdentifier.from_issuer_public_key(self._ca_key.public_key()), critical=False
                )
                # Critical because the subject is empty (RFC 5280 4.2.1.6), as Fulcio does.
                .add_extension(x509.SubjectAlternativeName([san]), critical=True)
                .add_extension(x509.UnrecognizedExtension(OIDC_ISSUER_OID, issuer.encode()), critical=False)
                .add_extension(
                    x509.UnrecognizedExtension(OIDC_ISSUER_V2_OID, _der_utf8_string(issuer)), critical=False
                )
                .add_extension(sct, critical=False)
                .sign(self._ca_key, hashes.SHA256())
            )

        timestamp_ms = int(issued.timestamp() * 1000)
        precertificate = build(self._embedded_sct(None, timestamp_ms))
        return build(self._embedded_sct(precertificate.tbs_precertificate_bytes, timestamp_ms))

    # -- transparency log ------------------------------------------------------------------

    def _log_entry(self, body: bytes, integrated_time: int, kind: str = "hashedrekord") -> dict:
        """A Rekor v1 entry for body: a one-leaf tree, its signed checkpoint and inclusion promise."""
        log_id = _key_id(self._rekor_key)
        leaf_hash = hashlib.sha256(b"\x00" + body).digest()  # RFC 6962 leaf; a 1-leaf tree's root
        origin = f"rekor.{self.name}.test"
        note = f"{origin} - 1\n1\n{_b64(leaf_hash)}\n"
        note_signature = _ecdsa_sign(self._rekor_key, note.encode())
        checkpoint = note + f"\n\u2014 {origin} {_b64(log_id[:4] + note_signature)}\n"
        promise = rfc8785.dumps(
            {"body": _b64(body), "integratedTime": integrated_time, "logID": log_id.hex(), "logIndex": 0}
        )
        return {
            "logIndex": "0",
            "logId": {"keyId": _b64(log_id)},
            "kindVersion": {"kind": kind, "version": "0.0.1"},
            "integratedTime": str(integrated_time),
            "inclusionPromise": {"signedEntryTimestamp": _b64(_ecdsa_sign(self._rekor_key, promise))},
            "inclusionProof": {
                "logIndex": "0",
                "rootHash": _b64(leaf_hash),
                "treeSize": "1",
                "hashes": [],
                "checkpoint": {"envelope": checkpoint},
            },
            "canonicalizedBody": _b64(body),
        }

    # -- signing ---------------------------------------------------------------------------

    def sign(
        self,
        artifact: bytes | str | os.PathLike[str] | Hashed,
        identity: str,
        issuer: str,
        *,
        at: dt.datetime | None = None,
    ) -> str:
        """Sign artifact keyless-style for identity (as vouched by issuer); return bundle v0.3 JSON.

        artifact: the bytes themselves, a file path (hashed in chunks, never read whole), or a
        `sigstore.hashes.Hashed` SHA-256 digest. As in hashedrekord, the signature is over the
        SHA-256 digest, so `Verifier.verify_artifact(Hashed(...))` and `verify_artifact(bytes)`
        both accept the result. identity containing "://" becomes a URI SAN (e.g. a CI workflow
        identity), anything else an email SAN. `at` backdates the signing (default: now).
        """
        return self.sign_digest(_sha256_of(artifact), identity, issuer, at=at)

    def sign_digest(self, digest: bytes | str, identity: str, issuer: str, *, at: dt.datetime | None = None) -> str:
        """`sign` for a SHA-256 digest given as 32 bytes or 64 hex digits."""
        digest = bytes.fromhex(digest) if isinstance(digest, str) else bytes(digest)
        if len(digest) != 32:
            raise ValueError(f"expected a SHA-256 digest (32 bytes), got {len(digest)} bytes")
        issued = (at or _now()).astimezone(dt.UTC).replace(microsecond=0)
        signing_key = ec.generate_private_key(ec.SECP256R1())  # ephemeral, like a keyless client
        certificate = self._leaf_certificate(signing_key.public_key(), identity, issuer, issued)
        signature = signing_key.sign(digest, ec.ECDSA(Prehashed(hashes.SHA256())))
        body = rfc8785.dumps(
            {
                "apiVersion": "0.0.1",
                "kind": "hashedrekord",
                "spec": {
                    "data": {"hash": {"algorithm": "sha256", "value": digest.hex()}},
                    "signature": {
                        "content": _b64(signature),
                        "publicKey": {"content": _b64(certificate.public_bytes(serialization.Encoding.PEM))},
                    },
                },
            }
        )
        integrated_time = int(issued.timestamp())  # inside [issued - 30s, issued + 9.5min]
        bundle = {
            "mediaType": BUNDLE_MEDIA_TYPE,
            "verificationMaterial": {
                "certificate": {"rawBytes": _b64(certificate.public_bytes(serialization.Encoding.DER))},
                "tlogEntries": [self._log_entry(body, integrated_time)],
            },
            "messageSignature": {
                "messageDigest": {"algorithm": "SHA2_256", "digest": _b64(digest)},
                "signature": _b64(signature),
            },
        }
        return json.dumps(bundle, indent=2) + "\n"

    def sign_dsse(self, payload: bytes, payload_type: str, identity: str, issuer: str, *,
                  at: dt.datetime | None = None) -> str:
        """A DSSE envelope over `payload` (e.g. an in-toto statement), keyless-style, in a bundle v0.3
        with a Rekor v1 `dsse` 0.0.1 entry: what `sigstore sign` makes for an attestation, and what
        `Verifier.verify_dsse` accepts."""
        issued = (at or _now()).astimezone(dt.UTC).replace(microsecond=0)
        signing_key = ec.generate_private_key(ec.SECP256R1())
        certificate = self._leaf_certificate(signing_key.public_key(), identity, issuer, issued)
        signature = signing_key.sign(_dsse_pae(payload_type, payload), ec.ECDSA(hashes.SHA256()))
        envelope = {"payload": _b64(payload), "payloadType": payload_type, "signatures": [{"sig": _b64(signature)}]}
        body = rfc8785.dumps(
            {
                "apiVersion": "0.0.1",
                "kind": "dsse",
                "spec": {
                    "envelopeHash": {"algorithm": "sha256",
                                     "value": hashlib.sha256(json.dumps(envelope).encode()).hexdigest()},
                    "payloadHash": {"algorithm": "sha256", "value": hashlib.sha256(payload).hexdigest()},
                    "signatures": [{"signature": _b64(signature),
                                    "verifier": _b64(certificate.public_bytes(serialization.Encoding.PEM))}],
                },
            }
        )
        bundle = {
            "mediaType": BUNDLE_MEDIA_TYPE,
            "verificationMaterial": {
                "certificate": {"rawBytes": _b64(certificate.public_bytes(serialization.Encoding.DER))},
                "tlogEntries": [self._log_entry(body, int(issued.timestamp()), kind="dsse")],
            },
            "dsseEnvelope": envelope,
        }
        return json.dumps(bundle, indent=2) + "\n"


def _dsse_pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE's pre-authentication encoding: what the signature covers."""
    kind = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(payload), payload)


def _sha256_of(artifact: bytes | str | os.PathLike[str] | Hashed) -> bytes:
    if isinstance(artifact, Hashed):
        if artifact.algorithm != HashAlgorithm.SHA2_256:
            raise ValueError(f"only SHA-256 digests can be signed, got {artifact.algorithm}")
        return artifact.digest
    if isinstance(artifact, (bytes, bytearray, memoryview)):
        return hashlib.sha256(artifact).digest()
    digest = hashlib.sha256()
    with open(artifact, "rb") as file:
        for chunk in iter(lambda: file.read(1 << 20), b""):
            digest.update(chunk)
    return digest.digest()
