"""Bearer-token authentication of the gateway.

Tokens come from a file and/or a list (the CLI reads `PLNT_GATEWAY_TOKENS`; this module never
reads the environment). File format, one token per line:

    # comment lines and blank lines are ignored; so is anything after " #"
    s3cr3t-token-for-everything
    token-for-two  summarize,translate          # only these workflows
    token-for-one  team-a/translate             # a namespace/name entry pins the namespace

Policy (see README "Gateway authentication"):
- no tokens configured: every request is allowed (the gateway then runs open; `plnt up`
  allows that only on a loopback address unless --insecure-no-auth);
- `GET /healthz` is always open (liveness probes carry no secrets);
- every other endpoint, `/metrics`, `/hooks/git` and `/workflows` included, needs a valid
  token: a missing or unknown token is 401 with `WWW-Authenticate: Bearer`;
- a token restricted to some workflows gets 403 when invoking any other workflow (invoke
  and chat completions), and `GET /v1/models` lists only its workflows.

Every presented token is compared with *every* configured token with `hmac.compare_digest`
(no early exit), so the time taken does not reveal which token, or how much of one, matched.
The per-request cost is about 0.3 us per configured token.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path


class TokenFileError(ValueError):
    """A token file line that cannot be parsed."""


@dataclass(frozen=True)
class Grant:
    """What one token may invoke: everything (`workflows is None`) or the listed workflows."""

    workflows: frozenset[str] | None = None  # entries "name" or "namespace/name"

    def allows(self, namespace: str, name: str) -> bool:
        if self.workflows is None:
            return True
        return name in self.workflows or f"{namespace}/{name}" in self.workflows

    def allows_name(self, name: str) -> bool:
        """Before the namespace is known: could any namespace's `name` be allowed?"""
        if self.workflows is None:
            return True
        return any(entry == name or entry.endswith(f"/{name}") for entry in self.workflows)


ALL = Grant()


class TokenSet:
    """The configured tokens; `check` maps a presented token to its Grant (or None)."""

    def __init__(self, tokens: Iterable[tuple[str, Grant]] = ()) -> None:
        entries: dict[bytes, Grant] = {}
        for token, grant in tokens:
            if not token:
                raise ValueError("empty token")
            key = token.encode()
            previous = entries.get(key)
            # The same token listed twice: the broader grant wins (union of workflows).
            if previous is not None:
                if previous.workflows is None or grant.workflows is None:
                    grant = ALL
                else:
                    grant = Grant(previous.workflows | grant.workflows)
            entries[key] = grant
        self._entries = list(entries.items())

    @classmethod
    def parse(cls, file_text: str | None = None, plain_tokens: Iterable[str] = (), *, source: str = "token file") -> TokenSet:
        """Tokens from a token file's text and from plain (unrestricted) tokens."""
        tokens: list[tuple[str, Grant]] = []
        if file_text is not None:
            tokens.extend(parse_token_file(file_text, source=source))
        for token in plain_tokens:
            token = token.strip()
            if token:
                tokens.append((token, ALL))
        return cls(tokens)

    @property
    def enabled(self) -> bool:
        return bool(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:  # never the tokens themselves
        return f"TokenSet({len(self._entries)} tokens)"

    def check(self, presented: bytes | None) -> Grant | None:
        """The grant of `presented`, or None if it matches no configured token."""
        if presented is None:
            return None
        found: Grant | None = None
        for token, grant in self._entries:
            # compare_digest on every entry, no break: constant time in the match position.
            if hmac.compare_digest(token, presented):
                found = grant
        return found

    def check_header(self, authorization: bytes | None) -> Grant | None:
        """The grant for an `Authorization` header value ("Bearer TOKEN"), or None."""
        return self.check(bearer_token(authorization))


def bearer_token(authorization: bytes | None) -> bytes | None:
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(b" ")
    if scheme.lower() != b"bearer":
        return None
    token = token.strip()
    return token or None


def parse_token_file(text: str, *, source: str = "token file") -> list[tuple[str, Grant]]:
    tokens: list[tuple[str, Grant]] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split(" #", 1)[0].split("\t#", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split(None, 1)
        token = parts[0]
        if len(parts) == 1:
            tokens.append((token, ALL))
            continue
        names = [n.strip() for n in parts[1].replace(" ", ",").split(",") if n.strip()]
        bad = [n for n in names if n.count("/") > 1 or n.startswith("/") or n.endswith("/")]
        if bad:
            raise TokenFileError(f"{source}:{number}: invalid workflow {bad[0]!r}; write NAME or NAMESPACE/NAME")
        if not names:
            raise TokenFileError(f"{source}:{number}: expected TOKEN [workflow1,workflow2]")
        tokens.append((token, Grant(frozenset(names))))
    return tokens


def load_tokens(tokens_file: Path | None, plain_tokens: Iterable[str] = ()) -> TokenSet:
    """Tokens from a token file (if any) and plain tokens. Raises TokenFileError (a ValueError)
    naming the file and line for a bad line, OSError if the file cannot be read."""
    text = tokens_file.read_text(encoding="utf-8") if tokens_file is not None else None
    return TokenSet.parse(text, plain_tokens, source=str(tokens_file))


def is_loopback_host(host: str) -> bool:
    """True for addresses only this machine can reach: 127.0.0.0/8, ::1, "localhost"."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def exposure_problem(host: str, tokens: TokenSet, *, insecure_no_auth: bool) -> str | None:
    """Why the gateway must not start on `host` with these tokens, or None if it may."""
    if tokens.enabled or insecure_no_auth or is_loopback_host(host):
        return None
    return (
        f"refusing to serve the gateway on {host} without authentication: configure tokens "
        "(--tokens-file FILE or PLNT_GATEWAY_TOKENS), bind a loopback address (--host 127.0.0.1), "
        "or pass --insecure-no-auth to run it open anyway"
    )
