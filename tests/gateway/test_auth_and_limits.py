"""Bearer tokens and their scopes (401/403, which endpoints are open), body limits (413), malformed
JSON (422). The runner behind the gateway is the stand-in of fakes.py (FakeRunner)."""

from __future__ import annotations

import hmac

import pytest
from plnt.core.auth import (
    ALL,
    INVOKE,
    READ,
    Grant,
    TokenFileError,
    TokenSet,
    exposure_problem,
    invoke_only,
    is_loopback_host,
    parse_token_file,
)
from plnt.core.routes import RouteTable
from plnt.gateway.router import Router

from tests.gateway.conftest import StartGateway, StartServer, backend, route
from tests.gateway.fakes import FakeRunner

TOKEN_FILE = """\
# gateway tokens
admin-token
two-token   summarize, translate    # two workflows, any namespace
team-token  team-b/translate
reader      scopes=read
hooker      scopes=admin
app         scopes=read invoke=summarize
"""


JSON = {"content-type": "application/json"}


# --- token parsing and policy (no servers) ---------------------------------------------------


def test_parse_token_file() -> None:
    tokens = dict(parse_token_file(TOKEN_FILE))
    assert tokens == {
        "admin-token": ALL,
        "two-token": invoke_only({"summarize", "translate"}),  # the older syntax: invoke-only
        "team-token": invoke_only({"team-b/translate"}),
        "reader": Grant(None, frozenset({READ})),
        "hooker": Grant(None, frozenset({"admin"})),
        "app": Grant(frozenset({"summarize"}), frozenset({READ, INVOKE})),
    }
    assert not tokens["reader"].allows("default", "summarize") and tokens["reader"].has(READ)
    assert not tokens["two-token"].has(READ) and not tokens["two-token"].has("admin")
    assert tokens["two-token"].allows("team-a", "translate")
    assert not tokens["two-token"].allows("team-a", "other")
    assert tokens["team-token"].allows("team-b", "translate")
    assert not tokens["team-token"].allows("team-a", "translate")
    assert tokens["team-token"].allows_name("translate") and not tokens["team-token"].allows_name("summarize")


def test_token_file_errors_name_the_line() -> None:
    with pytest.raises(TokenFileError, match="tokens.txt:2"):
        parse_token_file("ok\nbad a/b/c\n", source="tokens.txt")
    for line, message in [("t scopes=write", "unknown scope 'write'; scopes are invoke, read, admin"),
                          ("t invoke=", "expected a list of workflows"),
                          ("t scope=read", "unknown field scope="),
                          ("t scopes=read s3cret", "word 3 is not a field"),
                          ("t scopes=read scopes=admin", "scopes= is given twice"),
                          ("scopes=read", "a line starts with the token")]:
        with pytest.raises(TokenFileError) as error:
            parse_token_file(f"# c\n{line}\n", source="tokens.txt")
        assert str(error.value).startswith("tokens.txt:2: ") and message in str(error.value), error.value
        assert "s3cret" not in str(error.value)


def test_same_token_twice_gets_both_grants() -> None:
    tokens = TokenSet.parse("t scopes=read\nt a\nt b\nu c\nu scopes=invoke")
    assert tokens.check(b"t") == Grant(frozenset({"a", "b"}), frozenset({READ, INVOKE}))
    assert tokens.check(b"u") == Grant(None, frozenset({INVOKE}))


def test_token_set_from_file_and_plain_tokens() -> None:
    tokens = TokenSet.parse(TOKEN_FILE, ["env-token", " ", "two-token"])
    assert len(tokens) == 7  # "two-token" from the env as well: unrestricted wins
    assert tokens.check(b"two-token") == ALL
    assert tokens.check(b"env-token") == ALL
    assert tokens.check(b"nope") is None
    assert tokens.check_header(b"Bearer admin-token") == ALL
    assert tokens.check_header(b"bearer   admin-token ") == ALL
    assert tokens.check_header(b"Basic admin-token") is None
    assert tokens.check_header(None) is None
    assert "admin-token" not in repr(tokens)
    assert not TokenSet.parse(None, []).enabled


def test_every_configured_token_is_compared(monkeypatch: pytest.MonkeyPatch) -> None:
    """hmac.compare_digest is replaced (monkeypatch) by a wrapper that counts calls, then compares."""
    tokens = TokenSet.parse(TOKEN_FILE)
    calls: list[bytes] = []
    real = hmac.compare_digest

    def counting(a: bytes, b: bytes) -> bool:
        calls.append(a)
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", counting)
    for presented in (b"admin-token", b"team-token", b"unknown"):
        calls.clear()
        tokens.check(presented)
        # No early exit on a match: the time does not say which token matched.
        assert len(calls) == len(tokens) == 6


def test_exposure_rules() -> None:
    none, some = TokenSet(), TokenSet.parse(None, ["t"])
    for host in ("127.0.0.1", "127.0.0.2", "::1", "localhost", "::ffff:127.0.0.1", "[::ffff:127.0.0.9]"):
        assert is_loopback_host(host)
        assert exposure_problem(host, none, insecure_no_auth=False) is None
    for host in ("0.0.0.0", "::", "192.168.1.10", "example.org", "::ffff:192.168.1.10"):
        assert not is_loopback_host(host)
        problem = exposure_problem(host, none, insecure_no_auth=False)
        assert problem is not None and "--insecure-no-auth" in problem
        assert exposure_problem(host, none, insecure_no_auth=True) is None
        assert exposure_problem(host, some, insecure_no_auth=False) is None


# --- over HTTP -------------------------------------------------------------------------------


@pytest.mark.integration
async def test_auth_statuses(start_server: StartServer, start_gateway: StartGateway) -> None:
    """The runner is a fake runner (FakeRunner, tests/gateway/fakes.py), standing in for plnt.runner.
    `on_git_hook` is a recording function standing in for the reconciler."""
    server = await start_server(FakeRunner("v1").app())
    table = RouteTable([route("summarize", backend(server, "v1")), route("review", backend(server, "v1"))])
    hooks: list[str] = []

    async def on_git_hook() -> None:
        hooks.append("wake")

    gw = await start_gateway(Router(table), tokens=TokenSet.parse(TOKEN_FILE), on_git_hook=on_git_hook)
    c = gw.client

    def auth(token: str) -> dict[str, str]:
        return {"authorization": f"Bearer {token}"}

    # Missing and unknown tokens: 401 with a Bearer challenge.
    resp = await c.post("/workflows/summarize/invoke", json={})
    assert resp.status_code == 401
    assert resp.headers["www-authenticate"] == 'Bearer realm="plnt"'
    assert resp.json()["error"]["type"] == "unauthorized"
    resp = await c.post("/workflows/summarize/invoke", json={}, headers=auth("wrong"))
    assert resp.status_code == 401
    assert resp.headers["www-authenticate"] == 'Bearer realm="plnt", error="invalid_token"'

    # Known tokens: allowed workflows 200, others 403 (whether the workflow exists or not).
    assert (await c.post("/workflows/summarize/invoke", json={}, headers=auth("admin-token"))).status_code == 200
    assert (await c.post("/workflows/review/invoke", json={}, headers=auth("admin-token"))).status_code == 200
    assert (await c.post("/workflows/summarize/invoke", json={}, headers=auth("two-token"))).status_code == 200
    resp = await c.post("/workflows/review/invoke", json={}, headers=auth("two-token"))
    assert resp.status_code == 403 and resp.json()["error"]["type"] == "forbidden"
    assert (await c.post("/workflows/nope/invoke", json={}, headers=auth("two-token"))).status_code == 403
    assert (await c.post("/workflows/nope/invoke", json={}, headers=auth("admin-token"))).status_code == 404
    # A namespace-pinned entry: translate exists only in "default" here, not team-b.
    assert (await c.post("/workflows/summarize/invoke", json={}, headers=auth("team-token"))).status_code == 403

    # /healthz is open; everything else needs a token.
    assert (await c.get("/healthz")).status_code == 200
    endpoints = [("GET", "/metrics"), ("GET", "/workflows"), ("POST", "/hooks/git"), ("GET", "/v1/models"),
                 ("GET", "/workflows/summarize/stats"), ("GET", "/source"), ("GET", "/docs")]
    for method, path in endpoints:
        resp = await c.request(method, path)
        assert resp.status_code == 401, path
        assert resp.headers["www-authenticate"].startswith("Bearer")
    # Scopes: an invoke-only token lists and invokes, nothing else; read reads; admin hooks.
    allowed = {
        "two-token": {"/workflows", "/v1/models"},
        "reader": {"/workflows", "/v1/models", "/metrics", "/workflows/summarize/stats"},
        "hooker": {"/workflows", "/v1/models", "/hooks/git", "/source", "/docs"},
    }
    for token, paths in allowed.items():
        for method, path in endpoints:
            resp = await c.request(method, path, headers=auth(token))
            if path in paths:
                assert resp.status_code in (200, 202, 404), (token, path)  # /source: not served by this app
            else:
                assert resp.status_code == 403, (token, path, resp.text)
                scope = "read" if path in allowed["reader"] else "admin"
                assert resp.json()["error"]["message"].startswith(f"this token lacks the '{scope}' scope that "
                                                                  f"{method} {path} needs"), resp.text
    resp = await c.post("/workflows/summarize/invoke", json={}, headers=auth("reader"))
    assert resp.status_code == 403 and "lacks the 'invoke' scope" in resp.json()["error"]["message"]
    assert (await c.post("/workflows/summarize/invoke", json={}, headers=auth("app"))).status_code == 200
    assert hooks == ["wake"]


@pytest.mark.integration
async def test_workflow_list_by_scope(start_server: StartServer, start_gateway: StartGateway) -> None:
    """Runner endpoints only for admin; an invoke-only token sees only its workflows."""
    server = await start_server(FakeRunner("v1").app())
    rows = [{"namespace": "default", "name": name, "endpoint": server.url, "version": "v1",
             "message": f"runner at {server.url} failed its health check", "lastError": None}
            for name in ("summarize", "review")]
    table = RouteTable([route("summarize", backend(server, "v1")), route("review", backend(server, "v1"))])
    gw = await start_gateway(Router(table), tokens=TokenSet.parse(TOKEN_FILE), list_workflows=lambda: rows)

    async def listed(token: str) -> list[dict[str, object]]:
        resp = await gw.client.get("/workflows", headers={"authorization": f"Bearer {token}"})
        assert resp.status_code == 200
        return resp.json()

    assert await listed("admin-token") == rows
    for token, names in [("two-token", ["summarize"]), ("reader", ["summarize", "review"])]:
        shown = await listed(token)
        assert [row["name"] for row in shown] == names
        assert all("endpoint" not in row and server.url not in str(row) for row in shown), shown
        assert shown[0]["message"] == "runner at <runner> failed its health check"
    stats = (await gw.client.get("/workflows/summarize/stats", headers={"authorization": "Bearer reader"})).json()
    assert stats["backends"][0]["status"] == 200 and "endpoint" not in stats["backends"][0]


@pytest.mark.integration
async def test_body_limit_and_malformed_json(start_server: StartServer, start_gateway: StartGateway) -> None:
    """The runner is a fake runner (FakeRunner, tests/gateway/fakes.py), standing in for plnt.runner."""
    runner = FakeRunner("v1")
    server = await start_server(runner.app())
    gw = await start_gateway(Router(RouteTable([route("summarize", backend(server, "v1"))])), max_body_bytes=1000)
    c = gw.client

    ok = b'{"text": "' + b"x" * 900 + b'"}'
    assert (await c.post("/workflows/summarize/invoke", content=ok, headers=JSON)).status_code == 200

    too_big = b'{"text": "' + b"x" * 1000 + b'"}'
    resp = await c.post("/workflows/summarize/invoke", content=too_big, headers=JSON)  # with Content-Length
    assert resp.status_code == 413
    assert resp.json()["error"] == {"type": "body_too_large", "message": "request body is over the 1000 byte limit"}

    async def chunked():  # type: ignore[no-untyped-def]
        for _ in range(20):
            yield b"x" * 100

    resp = await c.post("/workflows/summarize/invoke", content=chunked(), headers=JSON)  # no Content-Length
    assert resp.status_code == 413

    resp = await c.post("/workflows/summarize/invoke", content=b'{"a": 1,\n "b": }', headers=JSON)
    assert resp.status_code == 422
    error = resp.json()["error"]
    assert error["type"] == "invalid_json"
    assert (error["line"], error["column"]) == (2, 7)
    assert "line 2 column 7" in error["message"]

    resp = await c.post("/workflows/summarize/invoke", content=b"[1, 2]", headers=JSON)
    assert resp.status_code == 422
    assert resp.json()["error"]["message"] == "body must be a JSON object, got list"

    resp = await c.post("/workflows/summarize/invoke", content=b"\xff\xfe", headers=JSON)
    assert resp.status_code == 422
    assert len(runner.requests) == 1  # none of the refused bodies reached the runner


@pytest.mark.integration
async def test_default_limit_is_one_mebibyte(start_server: StartServer, start_gateway: StartGateway) -> None:
    """The runner is a fake runner (FakeRunner, tests/gateway/fakes.py), standing in for plnt.runner."""
    server = await start_server(FakeRunner("v1").app())
    gw = await start_gateway(Router(RouteTable([route("summarize", backend(server, "v1"))])))
    just_under = b'{"t": "' + b"x" * (2**20 - 10) + b'"}'
    assert (await gw.client.post("/workflows/summarize/invoke", content=just_under, headers=JSON)).status_code == 200
    over = b'{"t": "' + b"x" * 2**20 + b'"}'
    assert (await gw.client.post("/workflows/summarize/invoke", content=over, headers=JSON)).status_code == 413
