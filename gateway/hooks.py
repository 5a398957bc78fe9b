"""Signatures of git forges' push webhooks (`POST /hooks/git` with `--webhook-secret-file`).

- GitHub: `X-Hub-Signature-256: sha256=<hex HMAC-SHA256 of the body>` (Gitea sends it too);
- Gitea: `X-Gitea-Signature: <hex HMAC-SHA256 of the body>`;
- GitLab: `X-Gitlab-Token: <the secret itself>` (GitLab does not sign the body).

Every comparison is `hmac.compare_digest`. A hook is accepted when one of the headers it sends
verifies; the refusal names each header sent and why it failed.
"""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path

SIGNATURE_HEADERS = (b"x-hub-signature-256", b"x-gitea-signature", b"x-gitlab-token")
_NAMES = {b"x-hub-signature-256": "X-Hub-Signature-256", b"x-gitea-signature": "X-Gitea-Signature",
          b"x-gitlab-token": "X-Gitlab-Token"}


class WebhookSecretError(ValueError):
    """The webhook secret file cannot be used."""


def load_webhook_secret(path: Path) -> bytes:
    """The secret in `path` (one line; surrounding whitespace dropped). Raises WebhookSecretError."""
    try:
        secret = path.read_bytes().strip()
    except OSError as exc:
        raise WebhookSecretError(f"{path}: cannot read the webhook secret: {exc.strerror or exc}") from exc
    if not secret:
        raise WebhookSecretError(f"{path}: the webhook secret file is empty")
    if b"\n" in secret:
        raise WebhookSecretError(f"{path}: the webhook secret must be one line")
    return secret


def verify(secret: bytes, headers: dict[bytes, bytes], body: bytes) -> str | None:
    """None if a forge signature header verifies `body`, else why not (naming the headers)."""
    sent = [name for name in SIGNATURE_HEADERS if name in headers]
    if not sent:
        return ("missing webhook signature: send X-Hub-Signature-256 (GitHub), X-Gitea-Signature (Gitea) "
                "or X-Gitlab-Token (GitLab), made with the secret in --webhook-secret-file")
    digest = hmac.new(secret, body, hashlib.sha256).hexdigest().encode()
    for name in sent:
        value = headers[name].strip()
        if name == b"x-hub-signature-256":
            expected, value = b"sha256=" + digest, value.lower()
        elif name == b"x-gitea-signature":
            expected, value = digest, value.lower()
        else:
            expected = secret
        if hmac.compare_digest(value, expected):
            return None
    names = ", ".join(_NAMES[name] for name in sent)
    return f"webhook signature does not verify: {names} does not match the body signed with the webhook secret"
