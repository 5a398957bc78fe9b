"""The route watch (gateway/route_watch.py) and the gateway role's app (gateway/role.py), in process.

Stand-ins, declared: the control plane a `RouteFollower` talks to is an `httpx.MockTransport`
handler (`FakeControl`) answering the wire format by hand; `asyncio.sleep` of the follower is a
recording function (no waiting); apps are driven through `httpx.ASGITransport` (no socket).
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import threading
from typing import Any

import httpx
import pytest
from plnt.core.auth import ADMIN, INTERNAL, READ, Grant, TokenFileError, TokenSet, parse_token_file, required_scope
from plnt.core.routes import Backend, Route, RouteTable
from plnt.gateway.app import create_app
from plnt.gateway.role import GatewayRole, GatewayRoleConfig
from plnt.gateway.route_watch import (
    RouteDocError,
    RouteFollower,
    RoutePublisher,
    RouteTableDoc,
    add_control_routes,
    parse_doc,
    routes_doc,
)
from plnt.gateway.router import Router

TOKEN = "internal-s3cret-do-not-log"
A = Backend("http://127.0.0.1:9001", "1.2.0", "default.a.1.2.0.x")
A2 = Backend("http://127.0.0.1:9002", "1.2.0", "default.a.1.2.0.y")
C = Backend("http://127.0.0.1:9003", "1.3.0", "default.a.1.3.0.z")
K8S = Backend("http://wf-stable.agents.svc.cluster.local:8080", "2.0.0", "agents.b.2.0.0")


def table() -> RouteTable:
    return RouteTable([
        Route("default", "a", stable=A, canary=C, traffic_percent=5, stable_replicas=(A, A2),
              canary_header=("x-cohort", "testers"), shadow_percent=10),
        Route("agents", "b", stable=K8S),
        Route("default", "pending", stable=None),
    ])


ROWS = [{"name": "a", "namespace": "default", "phase": "Canary", "version": "1.2.0", "canaryPercent": 5,
         "endpoint": A.endpoint, "smokeTest": None}]


def doc_json(**changes: Any) -> dict[str, Any]:
    doc = json.loads(RouteTableDoc(epoch="e1", version=3, routes=routes_doc(table()), workflows=tuple(ROWS))
                     .model_dump_json())
    doc.update(changes)
    return doc


# --- the wire format -------------------------------------------------------------------------------------


def test_round_trip_is_exact() -> None:
    doc = RouteTableDoc(epoch="e1", version=7, routes=routes_doc(table()), workflows=tuple(ROWS))
    again = parse_doc(doc.model_dump_json())
    assert again == doc
    assert sorted(again.to_table(), key=lambda r: r.key) == sorted(table(), key=lambda r: r.key)
    assert [dict(r) for r in again.workflows] == ROWS
    # Equal tables give equal docs whatever order the routes were built in.
    reordered = RouteTable(reversed(list(table())))
    assert routes_doc(reordered) == routes_doc(table())


@pytest.mark.parametrize(("change", "expected"), [
    ({"version": "3"}, "version: Input should be a valid integer"),
    ({"version": -1}, "version: Input should be greater than or equal to 0"),
    ({"epoch": ""}, "epoch: String should have at least 1 character"),
    ({"extra": 1}, "extra: Extra inputs are not permitted"),
    ({"routes": [{"namespace": "default", "name": "a", "canary_percent": 101}]}, "less than or equal to 100"),
    ({"routes": [{"namespace": "default", "name": "a", "canary_percent": 5.0}]}, "valid integer"),
    ({"routes": [{"namespace": "default", "name": "a/b"}]}, "must not contain '/'"),
    ({"routes": [{"namespace": "d", "name": "a", "stable": {"endpoint": "file:///etc", "version": "1",
                                                          "release_id": "r"}}]}, "endpoint must be http(s)://"),
    ({"routes": [{"namespace": "d", "name": "a", "stable": {"endpoint": "http://u:p@h:1", "version": "1",
                                                          "release_id": "r"}}]}, "endpoint must be http(s)://"),
    ({"routes": [{"namespace": "d", "name": "a"}, {"namespace": "d", "name": "a"}]}, "duplicate route d/a"),
    ({"routes": [{"namespace": "d", "name": "a",
                  "stable": {"endpoint": "http://h:2", "version": "1", "release_id": "r2"},
                  "stable_replicas": [{"endpoint": "http://h:1", "version": "1", "release_id": "r1"}]}]},
     "stable must be the first of stable_replicas"),
    ({"workflows": [{"phase": "Ready"}]}, "workflows[0] needs string 'name' and 'namespace'"),
])
def test_malformed_docs_are_refused_with_the_reason(change: dict[str, Any], expected: str) -> None:
    with pytest.raises(RouteDocError) as caught:
        parse_doc(json.dumps(doc_json(**change)))
    assert expected in str(caught.value), caught.value


@pytest.mark.parametrize("raw", [b"", b"not json", b"[]", b'{"kind": "Other", "epoch": "e", "version": 1}'])
def test_what_is_not_a_doc_is_refused(raw: bytes) -> None:
    with pytest.raises(RouteDocError, match="malformed route table document"):
        parse_doc(raw)


# --- the publisher -------------------------------------------------------------------------------------------


async def test_version_grows_only_when_the_content_changes() -> None:
    publisher = RoutePublisher(epoch="e1")
    assert publisher.doc is None
    first = publisher.publish(table(), ROWS)
    assert (first.epoch, first.version) == ("e1", 1)
    assert publisher.publish(RouteTable(reversed(list(table()))), list(ROWS)) is first  # same content
    second = publisher.publish(table(), [{**ROWS[0], "phase": "Ready"}])  # status alone changed
    assert second.version == 2
    third = publisher.publish(RouteTable([Route("default", "a", stable=C)]), [])
    assert third.version == 3 and third.to_table().lookup("a").stable == C  # type: ignore[union-attr]
    assert RoutePublisher().epoch != RoutePublisher().epoch  # random per start


def test_the_publishers_json_is_a_valid_doc_of_the_same_table() -> None:
    published = RoutePublisher(epoch="e1").publish(table(), ROWS)
    doc = published.to_doc()
    assert (doc.epoch, doc.version) == ("e1", 1) and doc.routes == routes_doc(table())
    assert [dict(r) for r in doc.workflows] == ROWS
    assert sorted(doc.to_table(), key=lambda r: r.key) == sorted(table(), key=lambda r: r.key)
    assert published.json is published.json  # serialised once per version


async def test_wait_returns_early_on_publish_and_at_timeout_otherwise() -> None:
    publisher = RoutePublisher(epoch="e1")
    publisher.publish(table(), ROWS)
    waiter = asyncio.create_task(publisher.wait_newer(1, 60.0, epoch="e1"))
    for _ in range(5):
        await asyncio.sleep(0)
    assert not waiter.done()  # version 1 is what the follower has: it waits
    publisher.publish(RouteTable(), [])
    doc = await asyncio.wait_for(waiter, 10)  # woken by the publish, long before its 60 s
    assert doc is not None and doc.version == 2

    idle = asyncio.create_task(publisher.wait_newer(2, 0.05, epoch="e1"))
    for _ in range(5):
        await asyncio.sleep(0)
    assert not idle.done()
    doc = await idle  # nothing new: the current doc, after the wait
    assert doc is not None and doc.version == 2

    # A newer version answers at once; so does any version under another epoch (a restart).
    older = await asyncio.wait_for(publisher.wait_newer(0, 60.0, epoch="e1"), 10)
    assert older is not None and older.version == 2
    restarted = await asyncio.wait_for(publisher.wait_newer(999, 60.0, epoch="before-restart"), 10)
    assert restarted is not None and restarted.version == 2


async def test_wait_before_any_publish_gives_none_and_publish_from_a_thread_wakes_it() -> None:
    publisher = RoutePublisher()
    assert await publisher.wait_newer(-1, 0.01) is None
    waiter = asyncio.create_task(publisher.wait_newer(-1, 60.0))
    await asyncio.sleep(0)
    thread = threading.Thread(target=publisher.publish, args=(table(), ROWS))
    thread.start()
    doc = await asyncio.wait_for(waiter, 10)
    thread.join()
    assert doc is not None and doc.version == 1


async def test_close_answers_waiting_polls_at_once() -> None:
    publisher = RoutePublisher()
    publisher.publish(table(), ROWS)
    waiter = asyncio.create_task(publisher.wait_newer(1, 60.0))
    await asyncio.sleep(0)
    publisher.close()
    doc = await asyncio.wait_for(waiter, 10)
    assert doc is not None and doc.version == 1 and publisher.closed


# --- the follower ---------------------------------------------------------------------------------------------


class FakeControl:
    """STAND-IN for the control plane's GET /internal/routes: scripted answers, requests recorded."""

    def __init__(self, answers: list[Any]) -> None:
        self.answers = answers
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        answer = self.answers.pop(0) if self.answers else httpx.ConnectError("refused")
        if isinstance(answer, Exception):
            raise answer
        if isinstance(answer, RouteTableDoc):
            return httpx.Response(200, content=answer.model_dump_json())
        status, body = answer
        return httpx.Response(status, content=body if isinstance(body, bytes) else json.dumps(body).encode())


class Stop(Exception):
    pass


def follower_with(control: FakeControl, router: Router, sleeps: list[float], stop_after: int) -> RouteFollower:
    async def sleep(seconds: float) -> None:  # STAND-IN for asyncio.sleep: records, never waits
        sleeps.append(seconds)
        if len(sleeps) >= stop_after:
            raise Stop

    client = httpx.AsyncClient(transport=httpx.MockTransport(control), base_url="http://control.test")
    return RouteFollower("http://control.test/", TOKEN, router, wait_s=25, backoff_initial_s=0.5, backoff_max_s=4.0,
                         client=client, sleep=sleep, rng=random.Random(7))


def doc(version: int, epoch: str = "e1", routes: RouteTable | None = None) -> RouteTableDoc:
    return RouteTableDoc(epoch=epoch, version=version, routes=routes_doc(routes if routes is not None else table()),
                         workflows=tuple(ROWS))


async def test_follower_swaps_tables_keeps_the_last_on_errors_and_backs_off(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    one = RouteTable([Route("default", "a", stable=A)])
    control = FakeControl([
        httpx.ConnectError("refused"),  # down at start: no table yet
        doc(1, routes=one),
        doc(2),
        httpx.ConnectError("refused"), httpx.ReadTimeout("timed out"), (500, {"error": {"message": "boom"}}),
        (200, b'{"kind": "RouteTable", "epoch": "e1", "version": 9, "routes": [{"name": "x"}]}'),  # malformed
        (401, {"error": {"message": "invalid bearer token"}}), httpx.ConnectError("refused"),
        httpx.ConnectError("refused"),
        doc(1, epoch="e2", routes=one),  # the control plane restarted: a lower version, a new epoch
    ])
    router = Router()
    sleeps: list[float] = []
    follower = follower_with(control, router, sleeps, stop_after=9)
    seen: list[tuple[int | None, str]] = []

    original_take = follower.take

    def take(d: RouteTableDoc, table: RouteTable | None = None) -> bool:
        taken = original_take(d, table)
        seen.append((follower.doc.version if follower.doc else None, follower.state()["control"]))
        return taken

    follower.take = take  # type: ignore[method-assign]
    with pytest.raises(Stop):
        await follower.run()

    # Each new doc swapped in whole; errors in between changed nothing.
    assert router.table.lookup("a", "default") == Route("default", "a", stable=A)
    assert follower.doc is not None and (follower.doc.epoch, follower.doc.version) == ("e2", 1)
    assert [v for v, _ in seen] == [1, 2, 1]
    # The watch request: after/epoch/wait and the token as a bearer header.
    first, second, third = control.requests[1:4]  # [0] was refused
    assert first.url.params["after"] == "-1" and "epoch" not in first.url.params
    assert second.url.params["after"] == "1" and second.url.params["epoch"] == "e1" and third.url.params["after"] == "2"
    assert first.url.params["wait"] == "25" and first.headers["authorization"] == f"Bearer {TOKEN}"
    # Backoff: 1 failure at start, then 7 in a row, then 1 (the script ran out); doubling from 0.5 s,
    # capped at 4 s, jittered in [step/2, step].
    failures = sleeps
    steps = [0.5] + [0.5, 1, 2, 4, 4, 4, 4] + [0.5]
    assert all(step / 2 <= s <= step for s, step in zip(failures, steps, strict=True)), failures
    assert len(set(failures)) == len(failures)  # jittered
    # One warning per outage (three outages), one recovery line each ended one; the token in no log line.
    lines = [r.getMessage() for r in caplog.records]
    assert sum(m.startswith("control-unreachable") for m in lines) == 3, lines
    assert sum(m.startswith("control-reachable") for m in lines) == 2, lines
    assert any("route table version 2" in m or "malformed route table document" in m for m in lines)
    assert not any(TOKEN in m for m in lines) and TOKEN not in caplog.text


async def test_follower_paces_answers_that_bring_nothing_new() -> None:
    """A control plane (or a proxy) answering at once with the same version must not make it spin."""
    control = FakeControl([doc(1), doc(1), doc(1)])
    sleeps: list[float] = []
    follower = follower_with(control, Router(), sleeps, stop_after=2)
    with pytest.raises(Stop):
        await follower.run()
    assert len(control.requests) == 3 and all(0 < s <= 1.0 for s in sleeps), sleeps


def test_follower_state_for_healthz() -> None:
    follower = RouteFollower("http://control.test", TOKEN, Router())
    assert follower.state()["control"] == "connecting" and not follower.has_table
    assert follower.take(doc(4))
    assert not follower.take(doc(3))  # older, same epoch: ignored
    state = follower.state()
    assert state["routes_version"] == 4 and state["routes_epoch"] == "e1" and state["routes"] == 3
    assert TOKEN not in repr(state) and TOKEN not in repr(follower.__dict__.get("control_url"))


# --- the endpoint and its auth ------------------------------------------------------------------------------------


def control_app(tokens: TokenSet, internal: str | None) -> tuple[Any, RoutePublisher]:
    app = create_app(Router(), list_workflows=list, tokens=tokens)
    publisher = RoutePublisher(epoch="e1")
    publisher.publish(table(), ROWS)
    add_control_routes(app, publisher, internal)
    return app, publisher


def token_set() -> TokenSet:
    return TokenSet.parse("admin-t scopes=admin\nread-t scopes=read\ninvoke-t a\n")


async def get(app: Any, path: str, token: str | None = None) -> httpx.Response:
    headers = {"authorization": f"Bearer {token}"} if token else {}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as client:
        return await client.get(path, headers=headers)


@pytest.mark.parametrize("tokens", [token_set(), TokenSet()], ids=["gateway-tokens", "open-gateway"])
async def test_internal_routes_takes_only_the_internal_or_an_admin_token(tokens: TokenSet) -> None:
    app, _ = control_app(tokens, TOKEN)
    path = "/internal/routes?after=-1&wait=0"
    assert (await get(app, path)).status_code == 401
    assert (await get(app, path, "wrong")).status_code == 401
    if tokens.enabled:
        for other in ("invoke-t", "read-t"):
            refused = await get(app, path, other)
            assert refused.status_code == 403 and "'internal' scope" in refused.text, refused.text
        assert (await get(app, path, "admin-t")).status_code == 200
    ok = await get(app, path, TOKEN)
    assert ok.status_code == 200
    assert parse_doc(ok.content).version == 1
    # The internal token is no gateway token: it invokes nothing and reads nothing else.
    if tokens.enabled:
        assert (await get(app, "/workflows", TOKEN)).status_code == 401
        assert (await get(app, "/metrics", TOKEN)).status_code == 401


async def test_internal_routes_without_an_internal_token_is_404_naming_the_option() -> None:
    app, _ = control_app(token_set(), None)
    response = await get(app, "/internal/routes", "admin-t")
    assert response.status_code == 404 and "--internal-token-file" in response.text


async def test_internal_routes_parameters() -> None:
    app, publisher = control_app(TokenSet(), TOKEN)
    bad = await get(app, "/internal/routes?after=x", TOKEN)
    assert bad.status_code == 400 and "after=INT" in bad.text
    assert (await get(app, "/internal/routes?wait=nan", TOKEN)).status_code == 400
    same = await get(app, "/internal/routes?after=1&epoch=e1&wait=0", TOKEN)
    assert same.status_code == 200 and parse_doc(same.content).version == 1  # nothing newer: the current doc
    publisher.close()
    stopping = await get(app, "/internal/routes?after=1&epoch=e1&wait=30", TOKEN)
    assert stopping.status_code == 503 and stopping.headers["retry-after"]
    empty = create_app(Router(), list_workflows=list)
    add_control_routes(empty, RoutePublisher(), TOKEN)
    nothing = await get(empty, "/internal/routes?wait=0", TOKEN)
    assert nothing.status_code == 503 and "no route table published yet" in nothing.text


async def test_internal_wake_takes_the_internal_token_and_a_bounded_request() -> None:
    """POST /internal/wake with a recording stand-in for the driver's wake (LocalDriver.wake is
    tested with real runners in tests/reconciler/drivers/test_scale_to_zero.py)."""
    asked: list[tuple[str, str, str]] = []

    async def wake(namespace: str, name: str, release_id: str) -> str | None:
        asked.append((namespace, name, release_id))
        return "http://127.0.0.1:4321" if release_id == "parked-one" else None

    app = create_app(Router(), list_workflows=list, tokens=token_set())
    add_control_routes(app, RoutePublisher(), TOKEN, wake=wake)

    async def post(body: Any, token: str | None = TOKEN, raw: bytes | None = None) -> httpx.Response:
        headers = {"authorization": f"Bearer {token}"} if token else {}
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as client:
            if raw is not None:
                return await client.post("/internal/wake", content=raw, headers=headers)
            return await client.post("/internal/wake", json=body, headers=headers)

    good = {"namespace": "default", "name": "rr", "release_id": "parked-one"}
    assert (await post(good, token=None)).status_code == 401
    assert (await post(good, token="invoke-t")).status_code == 403
    assert asked == [], "nothing is woken without the internal (or an admin) token"
    woken = await post(good)
    assert woken.status_code == 200 and woken.json() == {"endpoint": "http://127.0.0.1:4321"}
    not_parked = await post({**good, "release_id": "running-one"})
    assert not_parked.status_code == 404 and not_parked.json()["error"]["type"] == "not_parked"
    for bad in ({"namespace": "default", "name": "rr"}, {**good, "extra": 1}, {**good, "name": 7}, [1]):
        assert (await post(bad)).status_code == 400, bad
    assert (await post(None, raw=b"{" + b" " * 10_000)).status_code == 413
    assert asked == [("default", "rr", "parked-one"), ("default", "rr", "running-one")]
    without = create_app(Router(), list_workflows=list)
    add_control_routes(without, RoutePublisher(), TOKEN)  # a control plane that wakes nothing: 404
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=without), base_url="http://127.0.0.1") as client:
        assert (await client.post("/internal/wake", json=good, headers={"authorization": f"Bearer {TOKEN}"})).status_code == 404


def test_internal_scope_is_not_a_token_file_scope() -> None:
    assert required_scope("/internal/routes") == INTERNAL
    assert Grant(scopes=frozenset({ADMIN})).has(INTERNAL) and not Grant(scopes=frozenset({READ})).has(INTERNAL)
    with pytest.raises(TokenFileError, match="unknown scope 'internal'"):
        parse_token_file("t scopes=internal\n")


# --- the gateway role's app ----------------------------------------------------------------------------------------


async def test_role_answers_503_until_its_first_table_then_serves_it() -> None:
    role = GatewayRole(GatewayRoleConfig(control_url="http://control.test:8000", internal_token=TOKEN, port=0))
    health = await get(role.app, "/healthz")
    assert health.status_code == 503 and health.json()["status"] == "waiting-for-routes"
    waiting = await get(role.app, "/workflows")
    assert waiting.status_code == 503 and "no route table yet" in waiting.text and waiting.headers["retry-after"]
    role.follower.take(doc(5))
    health = await get(role.app, "/healthz")
    assert health.status_code == 200 and health.json()["routes_version"] == 5
    assert (await get(role.app, "/workflows")).json()[0]["name"] == "a"
    assert role.router.table.lookup("a", "default").canary == C  # type: ignore[union-attr]
    models = (await get(role.app, "/v1/models")).json()
    assert sorted(m["id"] for m in models["data"]) == ["a", "b"]
    assert TOKEN not in repr(role.config)


@pytest.mark.parametrize("path", ["/source", "/workflows/a/history", "/hooks/git"])
async def test_role_sends_control_plane_endpoints_to_the_control_url(path: str) -> None:
    role = GatewayRole(GatewayRoleConfig(control_url="http://control.test:8000", internal_token=TOKEN, port=0))
    role.follower.take(doc(1))
    response = await get(role.app, path)
    assert response.status_code == 404 and "http://control.test:8000" in response.text, response.text
    closed = GatewayRole(GatewayRoleConfig(control_url="http://control.test:8000", internal_token=TOKEN, port=0,
                                           tokens=token_set()))
    closed.follower.take(doc(1))
    anonymous = await get(closed.app, path)
    assert anonymous.status_code == 404 and "control.test" not in anonymous.text
    assert "control.test" in (await get(closed.app, path, "read-t")).text


# --- the command line ---------------------------------------------------------------------------------------------


def test_plnt_gateway_refuses_bad_options_with_exit_2(tmp_path: Any) -> None:
    from plnt.reconciler.cli.main import app
    from typer.testing import CliRunner

    token = tmp_path / "internal.token"
    token.write_text(TOKEN + "\n")
    empty = tmp_path / "empty.token"
    empty.write_text("\n")
    runner = CliRunner()
    cases = [
        (["--control-url", "ftp://x", "--internal-token-file", str(token)], "--control-url must be an http://"),
        (["--control-url", "http://127.0.0.1:1", "--internal-token-file", str(empty)], "is empty"),
        (["--control-url", "http://127.0.0.1:1", "--internal-token-file", str(tmp_path / "nope")], "cannot read"),
        (["--control-url", "http://127.0.0.1:1", "--internal-token-file", str(token), "--host", "0.0.0.0"],
         "refusing to serve the gateway on 0.0.0.0 without authentication"),
    ]
    for args, message in cases:
        result = runner.invoke(app, ["gateway", *args])
        assert result.exit_code == 2 and message in result.output, (args, result.output)
        assert TOKEN not in result.output


def test_plnt_up_refuses_an_empty_internal_token_file(tmp_path: Any) -> None:
    from plnt.reconciler.cli.main import app
    from typer.testing import CliRunner

    empty = tmp_path / "empty.token"
    empty.write_text("")
    result = CliRunner().invoke(app, ["up", "--repo", str(tmp_path), "--internal-token-file", str(empty)])
    assert result.exit_code == 2 and "--internal-token-file" in result.output, result.output


# --- letting go of a runner: followers' marks and POST /internal/drain ---------------------------------------


def without_canary() -> RouteTable:
    """table() after the canary C left it (a rollback; a promotion drops a stable the same way)."""
    return RouteTable([Route("default", "a", stable=A, stable_replicas=(A, A2)), Route("agents", "b", stable=K8S)])


async def test_a_runner_is_released_once_every_live_follower_drained_a_version_without_it() -> None:
    publisher = RoutePublisher(epoch="e1")
    publisher.publish(table(), ROWS)
    publisher.poll_began("gw-1", epoch="e1", applied=1, drained=1)
    publisher.poll_began("gw-2", epoch="e1", applied=1, drained=1)
    waiting = asyncio.ensure_future(publisher.wait_released(C.endpoint, timeout_s=10))
    await asyncio.sleep(0.05)
    assert not waiting.done(), "the routes still name the canary"
    publisher.publish(without_canary(), ROWS)  # version 2; each follower's poll ends, and the next begins
    for follower in ("gw-1", "gw-2"):
        publisher.poll_ended(follower)
    publisher.poll_began("gw-1", epoch="e1", applied=2, drained=2)
    publisher.poll_began("gw-2", epoch="e1", applied=2, drained=1)  # a request of gw-2 is still on C
    await asyncio.sleep(0.05)
    assert not waiting.done(), "gw-2 has not let go of C"
    publisher.poll_began("gw-2", epoch="e1", applied=2, drained=2)  # its request ended: it polls again
    outcome = await asyncio.wait_for(waiting, 5)
    assert outcome.drained and outcome.version == 2 and outcome.followers == 2, outcome
    # A runner the routes never named is released at once.
    assert (await publisher.wait_released("http://127.0.0.1:1", timeout_s=0)).drained


@pytest.mark.parametrize(("mark", "drained"), [
    ({"epoch": "e1", "applied": 2, "drained": 2}, True),
    ({"epoch": "e1", "applied": 2, "drained": 1}, False),  # serves 2, still has a request on the runner
    ({"epoch": "e1", "applied": 1, "drained": 1}, False),  # still serves the version naming the runner
    ({"epoch": "e1", "applied": 1, "drained": 5}, False),  # claims more than it serves: taken as `applied`
    ({"epoch": "e0", "applied": 9, "drained": 9}, False),  # versions of an earlier publisher say nothing
    ({"epoch": None, "applied": 9, "drained": 9}, False),
])
async def test_what_a_follower_said_decides_whether_it_let_go(mark: dict[str, Any], drained: bool) -> None:
    publisher = RoutePublisher(epoch="e1")
    publisher.publish(table(), ROWS)
    publisher.publish(without_canary(), ROWS)
    publisher.poll_began("gw", **mark)
    outcome = await publisher.wait_released(C.endpoint, timeout_s=0.3)
    assert outcome.drained is drained, outcome
    if not drained:
        assert outcome.lagging and "gateway gw" in outcome.lagging[0], outcome


async def test_a_gone_follower_is_not_waited_for_and_the_bound_holds(monkeypatch: pytest.MonkeyPatch) -> None:
    import plnt.gateway.route_watch as route_watch

    monkeypatch.setattr(route_watch, "FOLLOWER_GONE_S", 0.3)
    publisher = RoutePublisher(epoch="e1")
    publisher.publish(table(), ROWS)
    publisher.publish(without_canary(), ROWS)
    publisher.poll_began("killed", epoch="e1", applied=1, drained=1)
    publisher.poll_ended("killed")  # and never polls again
    outcome = await asyncio.wait_for(publisher.wait_released(C.endpoint, timeout_s=10), 5)
    assert outcome.drained and outcome.waited_s < 3, outcome
    assert "killed" not in publisher.followers()
    # One with a poll open is live however long ago it began: waited for, up to the bound.
    publisher.poll_began("stuck", epoch="e1", applied=1, drained=1)
    outcome = await publisher.wait_released(C.endpoint, timeout_s=0.5)
    assert not outcome.drained and 0.5 <= outcome.waited_s < 3 and "stuck" in outcome.describe(), outcome
    # Routes that keep naming the runner: refused at the bound, saying so.
    outcome = await publisher.wait_released(A.endpoint, timeout_s=0.2)
    assert not outcome.drained and outcome.version is None and "still name" in outcome.describe(), outcome


class LongPollControl(FakeControl):
    """STAND-IN for the control plane, as FakeControl, but with nothing scripted a poll stays open
    (as a real long-poll does while nothing changes) instead of failing."""

    async def __call__(self, request: httpx.Request) -> httpx.Response:  # type: ignore[override]
        if not self.answers:
            self.requests.append(request)
            await asyncio.Event().wait()  # until the follower gives up on this poll
        return super().__call__(request)


async def test_follower_reports_what_it_drained_and_polls_again_when_its_requests_end() -> None:
    """Against the LongPollControl stand-in: the polls carry follower= and drained=; a request on a
    runner the new table dropped holds `drained` back, and its end starts a poll saying so."""
    router = Router()
    control = LongPollControl([doc(1), doc(2, routes=without_canary())])
    follower = follower_with(control, router, [], stop_after=99)
    assert await follower.poll_once()
    router.enter(C)  # a request chose the canary under table 1
    assert await follower.poll_once()  # table 2 drops C: that request is now behind
    assert follower.drained_version() == 1
    task = asyncio.ensure_future(follower.run())
    try:
        await asyncio.sleep(0.1)
        asked = [dict(r.url.params) for r in control.requests]
        assert [(a["after"], a["drained"]) for a in asked] == [("-1", "-1"), ("1", "1"), ("2", "1")], asked  # (open)
        assert len({a["follower"] for a in asked}) == 1
        router.leave(C)  # the request ended: a poll says drained=2 at once (not at the next answer)
        await asyncio.sleep(0.1)
        asked = [dict(r.url.params) for r in control.requests]
        assert [(a["after"], a["drained"]) for a in asked[3:]] == [("2", "2")], asked
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_internal_drain_takes_the_internal_token_and_a_bounded_request() -> None:
    app = create_app(Router(), list_workflows=list, tokens=token_set())
    publisher = RoutePublisher(epoch="e1")
    publisher.publish(table(), ROWS)
    add_control_routes(app, publisher, TOKEN)

    async def post(body: Any, token: str | None = TOKEN, raw: bytes | None = None) -> httpx.Response:
        headers = {"authorization": f"Bearer {token}"} if token else {}
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as client:
            if raw is not None:
                return await client.post("/internal/drain", content=raw, headers=headers)
            return await client.post("/internal/drain", json=body, headers=headers)

    asked = {"endpoint": C.endpoint, "timeout_s": 0.3}
    assert (await post(asked, token=None)).status_code == 401
    assert (await post(asked, token="invoke-t")).status_code == 403
    held = await post(asked)  # the routes still name C
    assert held.status_code == 200 and held.json()["drained"] is False and "still name" in held.json()["lagging"][0]
    publisher.publish(without_canary(), ROWS)
    done = await post(asked)
    assert done.status_code == 200 and done.json()["drained"] is True and done.json()["version"] == 2, done.text
    for bad in ({"endpoint": "file:///etc"}, {**asked, "timeout_s": 0}, {**asked, "timeout_s": 601}, {**asked, "x": 1}, [1]):
        assert (await post(bad)).status_code == 400, bad
    assert (await post(None, raw=b"{" + b" " * 10_000)).status_code == 413
    follower = await get(app, "/internal/routes?wait=0&follower=bad%20id", TOKEN)
    assert follower.status_code == 400 and "follower must be" in follower.text


async def test_a_drain_of_a_leaving_release_takes_it_out_of_the_routes_before_it_waits() -> None:
    """`leaving`: a Helm release a worker uninstalls next is only in the routes because the control
    plane has not read its cluster since; the drain request takes it out (the `leaving` callback
    publishes a table without it) and then waits for the gateways. Without the flag nothing changes
    the routes, and the wait runs out while they still name it."""
    app = create_app(Router(), list_workflows=list, tokens=token_set())
    publisher = RoutePublisher(epoch="e1")
    publisher.publish(table(), ROWS)
    taken_out: list[str] = []

    def leaving(endpoint: str, release_id: str | None) -> None:
        taken_out.append(endpoint)
        publisher.publish(without_canary(), ROWS)

    add_control_routes(app, publisher, TOKEN, leaving=leaving)
    headers = {"authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as client:
        plain = await client.post("/internal/drain", json={"endpoint": C.endpoint, "timeout_s": 0.3}, headers=headers)
        assert plain.json()["drained"] is False and taken_out == [], plain.text
        left = await client.post("/internal/drain", json={"endpoint": C.endpoint, "timeout_s": 5, "leaving": True},
                                 headers=headers)
    assert left.status_code == 200 and left.json()["drained"] is True and left.json()["version"] == 2, left.text
    assert taken_out == [C.endpoint]
