"""`POST /hooks/git`: a push wakes the reconciler; and the signatures of git forges' push webhooks
(with `--webhook-secret-file`).

- GitHub: `X-Hub-Signature-256: sha256=<hex HMAC-SHA256 of the body>` (Gitea sends it too);
- Gitea: `X-Gitea-Signature: <hex HMAC-SHA256 of the body>`;
- GitLab: `X-Gitlab-Token: <the secret itself>` (GitLab does not sign the body).

Every comparison is `hmac.compare_digest`. A hook is accepted when one of the headers it sends
verifies; the refusal names each header sent and why it failed.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Awaitable, Callable

from plnt.core.auth import ADMIN, TokenSet, is_loopback_host, missing_scope_message
from plnt.gateway.replies import PLNT, ASGIScope, BodyTooLarge, ClientGone, Receive, Reply, Send, plnt_error, read_body, respond

SIGNATURE_HEADERS = (b"x-hub-signature-256", b"x-gitea-signature", b"x-gitlab-token")
_NAMES = {b"x-hub-signature-256": "X-Hub-Signature-256", b"x-gitea-signature": "X-Gitea-Signature",
          b"x-gitlab-token": "X-Gitlab-Token"}


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


class GitHook:
    """`POST /hooks/git`, answered before FastAPI (it needs the raw body for the forge's signature).
    With a webhook secret: a forge signature that verifies (or an admin token) and no bearer token
    needed; without one: loopback callers only, with an admin token when tokens are configured.
    Hooks only wake: many coalesce into one fetch."""

    def __init__(self, on_git_hook: Callable[[], Awaitable[None]] | None, webhook_secret: bytes | None,
                 tokens: TokenSet, max_body_bytes: int) -> None:
        self.on_git_hook = on_git_hook
        self.webhook_secret = webhook_secret
        self.tokens = tokens
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: ASGIScope, receive: Receive, send: Send) -> None:
        try:
            await self._accept(scope, receive)
            await respond(send, 202, b'{"accepted":true}', [])
        except Reply as reply:
            await respond(send, reply.status, reply.body, reply.headers)
        except ClientGone:
            pass

    async def _accept(self, scope: ASGIScope, receive: Receive) -> None:
        headers = {key: value for key, value in scope["headers"]
                   if key in SIGNATURE_HEADERS or key in (b"authorization", b"content-length")}
        authorization = headers.get(b"authorization")
        if self.on_git_hook is None:
            raise plnt_error(404, "not_found", "git hook is not enabled on this gateway")
        if self.webhook_secret is None:
            client = scope.get("client")
            if client is None or not is_loopback_host(client[0]):
                raise plnt_error(403, "forbidden", "POST /hooks/git takes only loopback callers unless plnt up "
                                 "has --webhook-secret-file (then the forge signs each hook)")
            if self.tokens.enabled:
                self._require_admin(authorization)
        try:
            body = await read_body(receive, headers.get(b"content-length"), self.max_body_bytes)
        except BodyTooLarge as exc:
            raise PLNT.too_large(self.max_body_bytes, exc) from None
        if self.webhook_secret is not None:
            problem = verify(self.webhook_secret, headers, body)
            grant = self.tokens.check_header(authorization) if self.tokens.enabled else None
            if problem is not None and not (grant is not None and grant.has(ADMIN)):
                if grant is not None and not any(name in headers for name in SIGNATURE_HEADERS):
                    # A known token without a signature: what it lacks is the scope.
                    raise plnt_error(403, "forbidden", missing_scope_message(ADMIN, "POST /hooks/git"))
                raise plnt_error(401, "invalid_signature", problem)
        await self.on_git_hook()

    def _require_admin(self, authorization: bytes | None) -> None:
        grant = self.tokens.check_header(authorization)
        if grant is None:
            raise PLNT.unauthorized(authorization is not None)
        if not grant.has(ADMIN):
            raise plnt_error(403, "forbidden", missing_scope_message(ADMIN, "POST /hooks/git"))
