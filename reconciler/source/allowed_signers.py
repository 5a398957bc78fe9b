"""Why an SSH-signed commit was refused, read from the allowed-signers file plnt gave git.

ssh-keygen answers a key whose entry excludes the signature's namespace with "Could not verify
signature", which reads like a forged commit. When verification fails, plnt reads the file itself
(ssh-keygen's ALLOWED SIGNERS format: `principals [options] keytype base64-key [comment]`, options
`cert-authority`, `namespaces="git,file"`, `valid-after="..."`, `valid-before="..."`) and, if the
commit's signing key is listed only for other namespaces, or only past its valid-before date, says so
with the entry's file and line. It decides nothing: git and ssh-keygen still do every check.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
import struct
from pathlib import Path

from pydantic import BaseModel, ConfigDict

SSH_ARMOR_BEGIN = "-----BEGIN SSH SIGNATURE-----"
SSH_ARMOR_END = "-----END SSH SIGNATURE-----"


class AllowedSigner(BaseModel):
    """One entry (line) of an allowed-signers file."""

    model_config = ConfigDict(frozen=True)

    file: str
    line: int
    principals: str
    key_type: str
    key: bytes  # the public key blob (base64-decoded)
    cert_authority: bool = False
    namespaces: str | None = None  # the option's value as written (patterns, comma-separated); None: any
    valid_before: str | None = None

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"

    def allows(self, namespace: str) -> bool:
        return self.namespaces is None or _match_list(namespace, self.namespaces)


class Explanation(BaseModel):
    """What the allowed-signers file adds to a refusal: `reason` (short, as CommitVerdict's), `detail`
    (the entry's file:line and what to change), `signer` (principals and key fingerprint)."""

    model_config = ConfigDict(frozen=True)

    reason: str
    detail: str
    signer: str


class SshSignature(BaseModel):
    """The parts of an armored SSHSIG that say who signed and for what."""

    model_config = ConfigDict(frozen=True)

    key: bytes
    namespace: str

    @property
    def fingerprint(self) -> str:
        """As ssh-keygen prints it: SHA256:<base64 of the key blob's sha256, unpadded>."""
        return "SHA256:" + base64.b64encode(hashlib.sha256(self.key).digest()).decode().rstrip("=")


def _tokens(line: str) -> list[str]:
    """Whitespace-separated fields; a double-quoted run (`namespaces="a, b"`) never splits one."""
    fields: list[str] = []
    current, quoted = "", False
    for char in line:
        if char == '"':
            quoted = not quoted
        if char.isspace() and not quoted:
            if current:
                fields.append(current)
            current = ""
            continue
        current += char
    if current:
        fields.append(current)
    return fields


def _key_blob(key_type: str, encoded: str) -> bytes | None:
    """The key blob if `encoded` is base64 of an SSH public key of `key_type` (its first field)."""
    try:
        blob = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        return None
    name = key_type.encode()
    return blob if blob[:4 + len(name)] == struct.pack(">I", len(name)) + name else None


def _options(text: str) -> dict[str, str | None]:
    """`cert-authority,namespaces="git,file"` -> {"cert-authority": None, "namespaces": "git,file"}."""
    found: dict[str, str | None] = {}
    for match in re.finditer(r'([A-Za-z-]+)(?:="([^"]*)")?(?:,|$)', text):
        found[match[1].lower()] = match[2]
    return found


def parse_allowed_signers(path: Path) -> list[AllowedSigner]:
    """The file's entries; comments, blank lines and lines that are not entries are skipped (ssh-keygen
    reports those itself)."""
    entries: list[AllowedSigner] = []
    for number, raw in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), start=1):
        fields = _tokens(raw.strip())
        if not fields or fields[0].startswith("#") or len(fields) < 3:
            continue
        # Options are optional: the key comes right after the principals, or after the options.
        for options, key_at in (("", 1), (fields[1], 2)):
            if len(fields) > key_at + 1 and (blob := _key_blob(fields[key_at], fields[key_at + 1])) is not None:
                parsed = _options(options)
                entries.append(AllowedSigner(
                    file=str(path), line=number, principals=fields[0].strip('"'), key_type=fields[key_at], key=blob,
                    cert_authority="cert-authority" in parsed, namespaces=parsed.get("namespaces"),
                    valid_before=parsed.get("valid-before")))
                break
    return entries


def _match_list(value: str, patterns: str) -> bool:
    """OpenSSH's match_pattern_list: comma-separated `*`/`?` patterns, a `!pattern` match refuses."""
    matched = False
    for pattern in (p.strip() for p in patterns.split(",")):
        negated = pattern.startswith("!")
        body = pattern.removeprefix("!")
        regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in body)
        if re.fullmatch(regex, value):
            if negated:
                return False
            matched = True
    return matched


def _string(data: bytes, at: int) -> tuple[bytes, int]:
    (size,) = struct.unpack_from(">I", data, at)
    end = at + 4 + size
    if end > len(data):
        raise ValueError("truncated")
    return data[at + 4:end], end


def read_ssh_signature(commit_object: str) -> SshSignature | None:
    """The SSH signature of a raw commit object (`git cat-file commit`), or None if it has none."""
    begin = commit_object.find(SSH_ARMOR_BEGIN)
    end = commit_object.find(SSH_ARMOR_END, begin)
    if begin < 0 or end < 0:
        return None
    body = "".join(line.strip() for line in commit_object[begin + len(SSH_ARMOR_BEGIN):end].splitlines())
    try:
        blob = base64.b64decode(body, validate=True)
        if not blob.startswith(b"SSHSIG"):
            return None
        key, at = _string(blob, 6 + 4)  # magic, then a uint32 version
        namespace, _ = _string(blob, at)
        return SshSignature(key=key, namespace=namespace.decode("utf-8", "replace"))
    except (binascii.Error, ValueError, struct.error):
        return None


def explain_refusal(allowed: Path, signature: SshSignature, reason: str | None) -> Explanation | None:
    """More than git said about a refused SSH signature whose key the allowed-signers file lists: that
    every entry of the key excludes the signature's namespace, or (when ssh-keygen said "expired key")
    which entry's valid-before ended the key's trust. None when the file says nothing more."""
    try:
        entries = [e for e in parse_allowed_signers(allowed) if e.key == signature.key and not e.cert_authority]
    except OSError:
        return None
    if not entries:
        return None
    first = entries[0]
    signer = f"{first.principals} ({first.key_type} key {signature.fingerprint})"
    namespace = signature.namespace
    allowing = [e for e in entries if e.allows(namespace)]
    if not allowing:
        lines = ", ".join(f'{e.where} (namespaces="{e.namespaces}")' for e in entries)
        return Explanation(
            reason=f"the key's namespaces do not allow {namespace}",
            detail=f'allowed-signers entry {lines} limits this key to other namespaces, and signatures of '
                   f'{namespace} commits use namespace "{namespace}": to trust it for commits, add {namespace} to '
                   f'namespaces="..." in that line (namespaces="{first.namespaces},{namespace}")',
            signer=signer)
    dated = [e for e in allowing if e.valid_before is not None]
    if reason == "expired key" and dated:
        lines = ", ".join(f'{e.where} (valid-before="{e.valid_before}")' for e in dated)
        # git verifies at the commit's date, so what has passed is valid-before, seen from the commit.
        return Explanation(
            reason=reason,
            detail=f"allowed-signers entry {lines} trusts this key only until a date before the commit's: if the "
                   "key is still trusted, move valid-before later in that line; otherwise sign the commit again "
                   "with a key that is valid now",
            signer=signer)
    return None
