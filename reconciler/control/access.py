"""Who may call plnt's HTTP roles: the gateway's bearer tokens, from a token file and plain tokens
(PLNT_GATEWAY_TOKENS, which the CLI reads), read once and checked against the address the role
listens on. `plnt up`, `plnt reconcile` and `plnt gateway` all read them here; gateway worker
processes parse the same text (`file_text`) rather than read the file again."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from plnt.gateway.auth import TokenSet, exposure_problem
from plnt.gateway.server import ServerStartError


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
