"""Bearer-token authentication and authorization of the gateway.

Tokens come from a file and/or a list (the CLI reads `PLNT_GATEWAY_TOKENS`; this module never
reads the environment). File format, one token per line:

    # comment lines and blank lines are ignored; so is anything after " #"
    s3cr3t-token-for-everything                 # bare: every scope, every workflow
    token-for-two  summarize,translate          # invoke only, only these workflows
    token-for-one  team-a/translate             # a namespace/name entry pins the namespace
    dashboards     scopes=read                  # status, history, metrics, stats
    ci-deployer    scopes=admin                 # POST /hooks/git, GET /source
    app-backend    scopes=invoke,read invoke=summarize
    s3cr3t-2       name=team-a scopes=invoke     # name=: what quotas (GatewayPolicy) and usage call it

`name=` is how a GatewayPolicy's limits and the usage (`GET /usage`, `plnt usage`, /metrics) name a
token: never the secret itself. Two lines may share a name (a token being rotated): they share its
limits. A token without a name is "unnamed" in the usage and gets the policy's `default` limits.

Scopes (see docs/gateway.md, "Gateway authentication"):
- `invoke`: POST /workflows/{name}/invoke and /v1/chat/completions, optionally limited to
  workflows (`invoke=wf1,ns/wf2`, or the older bare list); `GET /v1/models` and `GET /workflows`
  show such a token only its workflows;
- `read`: `GET /workflows` (every row), `/workflows/{name}/history`, `/workflows/{name}/stats`,
  `/workflows/{name}/rollouts`, `/metrics`, `/calls`, `/plan`, `/plan/revisions`, `/usage` (an
  admin token sees every token's usage, others their own name's);
- any valid token: `GET /workflows` and `GET /workflows/events` (its rows, as for `GET /workflows`);
- `admin`: `POST /hooks/git`, `GET /source`, runner endpoints in `GET /workflows`, and any
  endpoint not listed here (fail closed);
- `models`: `POST /v1/chat/completions` to ModelDeployments only (every model, no workflow);
- `internal`: `GET /internal/routes` (the route watch `plnt gateway` follows); only the internal
  token (`--internal-token-file`) holds it, and an `admin` token is accepted there too.

Policy:
- no tokens configured: every request is allowed (the gateway then runs open; `plnt up`
  allows that only on a loopback address unless --insecure-no-auth);
- `GET /healthz` and `GET /readyz` are always open (probes carry no secrets);
- the web UI's shell (`/ui`, `/ui/...`: static files, no data) is open; its data calls carry the
  token the user enters, so the page sees what the token may see;
- every other endpoint needs a valid token: a missing or unknown token is 401 with
  `WWW-Authenticate: Bearer`; a token without the scope an endpoint needs is 403 naming it.

Every presented token is compared with *every* configured token with `hmac.compare_digest`
(no early exit), so the time taken does not reveal which token, or how much of one, matched.
The per-request cost is about 0.3 us per configured token.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class TokenFileError(ValueError):
    """A token file line that cannot be parsed."""


INVOKE, READ, ADMIN = "invoke", "read", "admin"
# /v1/chat/completions to ModelDeployments only (no workflow, no other endpoint): what the runners of
# a WorkflowRun bound to a model hold (plnt up makes that token; a token file may list such tokens too).
MODELS = "models"
# Liveness and readiness probes: open, and they reveal nothing but up or not.
OPEN_PATHS = frozenset({"/healthz", "/readyz"})
SCOPES = (INVOKE, READ, ADMIN, MODELS)
# The roles' own scope (GET /internal/routes): held by the internal token only (--internal-token-file),
# never by a token-file line; an admin token is accepted too (see Grant.has).
INTERNAL = "internal"
# How usage and quotas name a token without `name=` (and every caller of a gateway with no tokens).
UNNAMED = "unnamed"
_TOKEN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")  # as core/specs/models.py TOKEN_NAME_PATTERN


def is_ui_path(path: str) -> bool:
    """The web UI's static shell (gateway/ui.py): exactly `/ui` or under `/ui/` (not `/uix`)."""
    return path == "/ui" or path.startswith("/ui/")


@dataclass(frozen=True)
class Grant:
    """What one token may do: its scopes, and for `invoke` every workflow (`workflows is None`)
    or the listed ones."""

    workflows: frozenset[str] | None = None  # entries "name" or "namespace/name"
    scopes: frozenset[str] = frozenset(SCOPES)
    name: str | None = None  # the token file's `name=`: quotas and usage name the token by it

    @property
    def label(self) -> str:
        """The token as quotas and usage name it: its `name=`, else UNNAMED."""
        return self.name or UNNAMED

    def allows(self, namespace: str, name: str) -> bool:
        """May this token invoke namespace/name?"""
        if INVOKE not in self.scopes:
            return False
        if self.workflows is None:
            return True
        return name in self.workflows or f"{namespace}/{name}" in self.workflows

    def allows_name(self, name: str) -> bool:
        """Before the namespace is known: could any namespace's `name` be invoked?"""
        if INVOKE not in self.scopes:
            return False
        if self.workflows is None:
            return True
        return any(entry == name or entry.endswith(f"/{name}") for entry in self.workflows)

    def may_chat(self, namespace: str, name: str, *, is_model: bool) -> bool:
        """May this token chat with namespace/name (a model when `is_model`)?"""
        return self.allows(namespace, name) or (is_model and MODELS in self.scopes)

    def has(self, scope: str) -> bool:
        return scope in self.scopes or (scope == INTERNAL and ADMIN in self.scopes)

    def union(self, other: Grant) -> Grant:
        """Both grants together (one token listed twice)."""
        if INVOKE not in self.scopes:
            workflows = other.workflows
        elif INVOKE not in other.scopes:
            workflows = self.workflows
        elif self.workflows is None or other.workflows is None:
            workflows = None
        else:
            workflows = self.workflows | other.workflows
        return Grant(workflows, self.scopes | other.scopes, self.name or other.name)


def invoke_only(workflows: Iterable[str]) -> Grant:
    return Grant(frozenset(workflows), frozenset({INVOKE}))


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
            # The same token listed twice: the union of both grants.
            if previous is not None:
                grant = previous.union(grant)
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

    def with_token(self, token: str, grant: Grant) -> TokenSet:
        """These tokens and one more."""
        return TokenSet([*((key.decode(), value) for key, value in self._entries), (token, grant)])

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


def _workflow_list(value: str, where: str) -> frozenset[str]:
    names = [n.strip() for n in value.split(",") if n.strip()]
    if not names:
        raise TokenFileError(f"{where}: expected a list of workflows, e.g. invoke=summarize,team-a/translate")
    bad = [n for n in names if n.count("/") > 1 or n.startswith("/") or n.endswith("/") or "=" in n]
    if bad:
        raise TokenFileError(f"{where}: invalid workflow {bad[0]!r}; write NAME or NAMESPACE/NAME")
    return frozenset(names)


def _parse_fields(rest: str, where: str) -> Grant:
    """`scopes=read,admin`, `invoke=wf1,wf2` and/or `name=NAME` (any order, each at most once)."""
    # "invoke=a, b" is one field: join list items split by spaces after commas first.
    fields = re.sub(r",\s+", ",", rest).split()
    seen: dict[str, str] = {}
    for number, field in enumerate(fields, start=2):
        key, sep, value = field.partition("=")
        if not sep or key not in ("scopes", "invoke", "name"):
            # Named by position, not echoed: a misplaced secret must not reach the log.
            what = f"unknown field {key}=" if sep else f"word {number} is not a field"
            raise TokenFileError(f"{where}: {what}; write TOKEN [name=NAME] [scopes=invoke,read,admin] "
                                 "[invoke=workflow1,workflow2] (or TOKEN workflow1,workflow2 for invoke-only)")
        if key in seen:
            raise TokenFileError(f"{where}: {key}= is given twice")
        seen[key] = value
    name = seen.get("name")
    if name is not None and not _TOKEN_NAME.fullmatch(name):
        raise TokenFileError(f"{where}: name= is 1 to 63 letters, digits, '_', '.' or '-', starting with a letter "
                             "or digit")
    if set(seen) == {"name"}:  # only a name: every scope, every workflow, as a bare token
        return Grant(name=name)
    scopes: set[str] = set()
    if "scopes" in seen:
        scopes = {s.strip() for s in seen["scopes"].split(",") if s.strip()}
        unknown = sorted(scopes - set(SCOPES))
        if unknown or not scopes:
            raise TokenFileError(f"{where}: unknown scope {unknown[0] if unknown else ''!r}; "
                                 f"scopes are {', '.join(SCOPES)}")
    workflows = None
    if "invoke" in seen:
        workflows = _workflow_list(seen["invoke"], where)
        scopes.add(INVOKE)
    return Grant(workflows, frozenset(scopes), name)


def parse_token_file(text: str, *, source: str = "token file") -> list[tuple[str, Grant]]:
    tokens: list[tuple[str, Grant]] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split(" #", 1)[0].split("\t#", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split(None, 1)
        token = parts[0]
        where = f"{source}:{number}"
        if "=" in token:
            raise TokenFileError(f"{where}: a line starts with the token, then its fields: TOKEN scopes=...")
        if len(parts) == 1:
            tokens.append((token, ALL))
        elif "=" in parts[1]:
            tokens.append((token, _parse_fields(parts[1], where)))
        else:  # the older syntax: TOKEN wf1,wf2 (or "wf1 wf2") is invoke-only for those
            tokens.append((token, invoke_only(_workflow_list(parts[1].replace(" ", ","), where))))
    return tokens


def load_tokens(tokens_file: Path | None, plain_tokens: Iterable[str] = ()) -> TokenSet:
    """Tokens from a token file (if any) and plain tokens. Raises TokenFileError (a ValueError)
    naming the file and line for a bad line, OSError if the file cannot be read."""
    text = tokens_file.read_text(encoding="utf-8") if tokens_file is not None else None
    return TokenSet.parse(text, plain_tokens, source=str(tokens_file))


def is_loopback_host(host: str) -> bool:
    """True for addresses only this machine can reach: 127.0.0.0/8, ::1, "localhost", and 127.x
    written as IPv4-mapped IPv6 (::ffff:127.0.0.1, how a dual-stack socket reports an IPv4 peer)."""
    if host == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return (mapped or address).is_loopback


def exposure_problem(host: str, tokens: TokenSet, *, insecure_no_auth: bool) -> str | None:
    """Why the gateway must not start on `host` with these tokens, or None if it may."""
    if tokens.enabled or insecure_no_auth or is_loopback_host(host):
        return None
    return (
        f"refusing to serve the gateway on {host} without authentication: configure tokens "
        "(--tokens-file FILE or PLNT_GATEWAY_TOKENS), bind a loopback address (--host 127.0.0.1), "
        "or pass --insecure-no-auth to run it open anyway"
    )


def required_scope(path: str) -> str | None:
    """The scope a non-invoke endpoint needs; None: any valid token (the handler filters what it
    shows). Anything not listed needs `admin`, so a new endpoint is closed until it is listed."""
    if path in ("/workflows", "/workflows/events") or path == "/v1/models" or path.startswith("/v1/models/"):
        return None
    if path in ("/metrics", "/calls", "/plan", "/plan/revisions", "/usage") or (
            path.startswith("/workflows/") and path.endswith(("/history", "/stats", "/rollouts"))) or (
            rollout_path(path) == "state"):
        return READ
    if path.startswith("/internal/"):
        return INTERNAL
    return ADMIN


def rollout_path(path: str) -> str | None:
    """"state" for GET /workflows/NAME/rollout, "act" for POST /workflows/NAME/rollout/VERB, else None
    (by segments: a workflow may be named `rollout`)."""
    parts = path.split("/")
    if len(parts) in (4, 5) and parts[0] == "" and parts[1] == "workflows" and parts[3] == "rollout" and parts[2]:
        return "state" if len(parts) == 4 else "act"
    return None


def missing_scope_message(scope: str, what: str) -> str:
    return (f"this token lacks the {scope!r} scope that {what} needs; give it `scopes={scope}` "
            "(with its other scopes) in the token file")


# Names a browser on this machine uses for a loopback gateway. Any other Host on an open
# gateway is a page from elsewhere reaching it through DNS rebinding.
_LOOPBACK_NAMES = frozenset({b"localhost", b"127.0.0.1", b"[::1]"})


def open_gateway_hosts(host: str, tokens: TokenSet) -> frozenset[bytes] | None:
    """The Host names an open loopback gateway answers; None: no Host check (tokens guard the
    gateway, or it was opened on a non-loopback address on purpose with --insecure-no-auth)."""
    if tokens.enabled or not is_loopback_host(host):
        return None
    bound = host.lower()
    if ":" in bound and not bound.startswith("["):
        bound = f"[{bound}]"
    return _LOOPBACK_NAMES | {bound.encode()}


def host_name(header: bytes) -> bytes:
    """The Host header without its port, lower-case ("[::1]:8000" -> "[::1]")."""
    value = header.strip().lower()
    if value.startswith(b"["):
        return value[: value.find(b"]") + 1]
    return value.partition(b":")[0]


def is_json_media(content_type: bytes | None) -> bool:
    """application/json or any application/*+json, parameters (charset) allowed. A browser sends
    a cross-site POST without a CORS preflight only as text/plain, a form, multipart, or untyped."""
    if content_type is None:
        return False
    media = content_type.partition(b";")[0].strip().lower()
    return media == b"application/json" or (media.startswith(b"application/") and media.endswith(b"+json"))


def host_allowed(headers: list[tuple[bytes, bytes]], allowed: frozenset[bytes]) -> bool:
    """Does the request's Host name one of `allowed`? (ASGI headers; no Host: HTTP/1.0, not a
    browser, which always sends one.)"""
    for key, value in headers:
        if key == b"host":
            return host_name(value) in allowed
    return True


FOREIGN_HOST_MESSAGE = (
    "this unauthenticated loopback server answers only Host localhost, 127.0.0.1, [::1] or the address it "
    "listens on (a foreign Host is how DNS rebinding reaches a loopback service)")


class LoopbackHostGuard:
    """ASGI middleware for an unauthenticated server on a loopback address (a runner): 421 for a
    request whose Host is not a loopback name, i.e. a web page reaching it via DNS rebinding."""

    def __init__(self, app: Any, allowed: frozenset[bytes]) -> None:
        self.app = app
        self.allowed = allowed

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and not host_allowed(scope["headers"], self.allowed):
            body = json.dumps({"error": {"type": "misdirected_request", "message": FOREIGN_HOST_MESSAGE,
                                         "step": None}}).encode()
            await send({"type": "http.response.start", "status": 421,
                        "headers": [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]})
            await send({"type": "http.response.body", "body": body})
            return
        await self.app(scope, receive, send)


# --- the git webhook's shared secret (POST /hooks/git, gateway/hooks.py) ---------------------------


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
