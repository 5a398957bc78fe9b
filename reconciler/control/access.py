"""Who may call plnt's HTTP roles: the gateway's bearer tokens, from a token file and plain tokens
(PLNT_GATEWAY_TOKENS, which the CLI reads), read once and checked against the address the role
listens on; the webhook secret; the internal token the roles use with each other. `plnt up`,
`plnt reconcile` and `plnt gateway` all read them here; gateway worker processes parse the same
text (`file_text`) rather than read the file again."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from plnt.core.auth import TokenSet, WebhookSecretError, exposure_problem, load_webhook_secret
from plnt.core.server import ServerStartError

if TYPE_CHECKING:
    from plnt.reconciler.settings import Settings


class GatewayExposed(ServerStartError):
    """The tokens would leave a non-loopback address open: the role must not start (the message
    says the ways out: tokens, a loopback --host, or --insecure-no-auth)."""


@dataclass(frozen=True)
class GatewayTokens:
    tokens: TokenSet
    file_text: str | None = field(repr=False)  # the token file as read; None without one
    source: str  # the token file's name for messages ("(tokens)" without one)
    plain: tuple[str, ...] = field(repr=False)


def read_gateway_tokens(tokens_file: Path | None, plain: Iterable[str], *, host: str,
                        insecure_no_auth: bool) -> GatewayTokens:
    """The tokens of a role listening on `host`. OSError when the file cannot be read, TokenFileError
    (a ValueError naming the file and line) for a bad line, GatewayExposed (see there)."""
    plain = tuple(plain)
    text = tokens_file.read_text(encoding="utf-8") if tokens_file is not None else None
    tokens = TokenSet.parse(text, plain, source=str(tokens_file))
    problem = exposure_problem(host, tokens, insecure_no_auth=insecure_no_auth)
    if problem:
        raise GatewayExposed(problem)
    return GatewayTokens(tokens, text, str(tokens_file or "(tokens)"), plain)


def internal_token(settings: Settings) -> str | None:
    """The token the roles use with each other (the CLI read it from --internal-token-file); None:
    the internal endpoints answer 404."""
    return settings.roles.internal_token.get_secret_value() if settings.roles.internal_token else None


@dataclass(frozen=True)
class RoleAccess:
    """What an HTTP role of plnt (`plnt up`'s gateway, `plnt reconcile`'s control API) lets in."""

    tokens: GatewayTokens
    webhook_secret: bytes | None = field(repr=False)  # POST /hooks/git's signatures; None: loopback callers only
    internal_token: str | None = field(repr=False)


def load_role_access(settings: Settings) -> RoleAccess:
    """The tokens (read_gateway_tokens, its errors), the webhook secret (ServerStartError when it
    cannot be read) and the internal token of a role listening on settings.host."""
    tokens = read_gateway_tokens(settings.gateway.tokens_file, [t.get_secret_value() for t in settings.gateway.tokens],
                                 host=settings.host, insecure_no_auth=settings.gateway.insecure_no_auth)
    try:
        secret_file = settings.gateway.webhook_secret_file
        webhook_secret = load_webhook_secret(secret_file) if secret_file else None
    except WebhookSecretError as exc:
        raise ServerStartError(f"--webhook-secret-file {exc}") from None
    return RoleAccess(tokens, webhook_secret, internal_token(settings))
