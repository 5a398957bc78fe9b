"""The runner's HTTP API, in process and as the real `python -m plnt.runner` process.

The model is MockBackend everywhere (in process, and `--backend mock`, the default, in the
process): a STAND-IN for a model server whose reply is the prompt's last line."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from plnt.reconciler.drivers.processes import free_port
from plnt.runner.adapters import MockBackend
from plnt.runner.app import create_app
from plnt.runner.recipe import load_recipe_dir

from tests.runner.helpers import GENERATE_STEPS, TEN_TOKENS, parse_sse, write_recipe

RECIPES = Path(__file__).resolve().parents[2] / "gitops-example" / "recipes" / "review-responder"
REVIEW = {"review": "Great service but slow parking", "brand_voice": "warm, brief"}


def client(version: str, release: str | None = "rel-7") -> httpx.AsyncClient:
    recipe = load_recipe_dir(RECIPES / version)
    app = create_app(recipe, MockBackend(), release)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://runner")


async def test_healthz_reports_what_is_served() -> None:
    async with client("1.2.0") as http:
        response = await http.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {
        "status": "ok",
        "workflow": "review-responder",
        "version": "1.2.0",
        "digest": load_recipe_dir(RECIPES / "1.2.0").digest,
        "release": "rel-7",
    }


async def test_invoke_returns_output_steps_and_release() -> None:
    async with client("1.3.0", release=None) as http:
        response = await http.post("/invoke", json=REVIEW)
    assert response.status_code == 200
    body = response.json()
    assert set(body) == {"workflow", "version", "output", "steps", "release", "cache"}
    assert (body["workflow"], body["version"], body["release"]) == ("review-responder", "1.3.0", None)
    assert body["output"]["intent"] == "mixed" and body["output"]["approved"] is True
    assert body["output"]["reply"].endswith("Warm regards, the Customer Care Team")
    assert list(body["steps"]) == ["classify_intent", "retrieve_brand_voice", "draft_reply", "safety_check"]
    assert all(isinstance(step["ms"], float) and step["cached"] is False for step in body["steps"].values())
    assert body["cache"] == {"hits": 0, "misses": 3}  # classify, rag and the moderation step; not generate


@pytest.mark.parametrize("content", [b"[1, 2]", b'"text"', b"not json", b"", b"\xff\xfe"])
async def test_invoke_rejects_a_body_that_is_not_a_json_object(content: bytes) -> None:
    async with client("1.2.0") as http:
        response = await http.post("/invoke", content=content, headers={"content-type": "application/json"})
    assert response.status_code == 422
    error = response.json()["error"]
    assert error["type"] == "invalid_request" and error["message"] and error["step"] is None


async def test_failed_step_is_a_500_naming_the_step() -> None:
    async with client("1.4.0") as http:
        response = await http.post("/invoke", json=REVIEW)
    assert response.status_code == 500
    error = response.json()["error"]
    assert error["type"] == "step_failed" and error["step"] == "safety_check"
    assert "deliberately broken" in error["message"]


async def test_missing_inputs_are_a_422_naming_the_field_before_anything_runs() -> None:
    async with client("1.2.0") as http:
        response = await http.post("/invoke", json={"brand_voice": "warm"})
        assert response.status_code == 422
        error = response.json()["error"]
        assert (error["type"], error["field"], error["step"]) == ("invalid_input", "review", None)
        assert error["message"].startswith("missing input 'review': the workflow's steps use {review}")
        response = await http.post("/invoke", json={}, headers={"accept": "text/event-stream"})
        assert response.status_code == 422 and response.headers["content-type"] == "application/json"
        assert "(missing: review, brand_voice)" in response.json()["error"]["message"]
        stats = (await http.get("/stats")).json()
    assert stats["invocations"] == 0  # refused before running


async def test_a_template_field_missing_at_run_time_is_a_422(tmp_path: Path) -> None:
    """A module step rendering a template the body cannot fill: the client's mistake, named."""
    recipe = write_recipe(tmp_path, "- {id: say, tool: python, params: {text: 'hi {who}'}}",
                          "def say(ctx):\n    return ctx.render(ctx.params['text'])\n")
    app = create_app(load_recipe_dir(recipe), MockBackend(), None)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://runner") as http:
        response = await http.post("/invoke", json={"whom": "x"})
        assert response.status_code == 422
        assert response.json()["error"] == {"type": "invalid_input", "field": "who", "step": "say", "message":
                                            "missing input 'who': step 'say' uses {who}; send it as a field of "
                                            "the JSON body"}
        assert (await http.post("/invoke", json={"who": "you"})).json()["output"] == "hi you"


async def test_loopback_runner_refuses_foreign_hosts_and_non_json_bodies() -> None:
    """The runner has no auth: on loopback a web page must not reach it (DNS rebinding, CSRF)."""
    app = create_app(load_recipe_dir(RECIPES / "1.2.0"), MockBackend(), None, host="127.0.0.1")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1:9") as http:
        assert (await http.post("/invoke", json=REVIEW)).status_code == 200
        response = await http.post("/invoke", json=REVIEW, headers={"host": "attacker.example"})
        assert response.status_code == 421 and response.json()["error"]["type"] == "misdirected_request"
        for path in ("/invoke", "/chat"):
            response = await http.post(path, content=b'{"review": "x"}', headers={"content-type": "text/plain"})
            assert response.status_code == 415 and response.json()["error"]["type"] == "unsupported_media_type"
        assert (await http.get("/stats")).json()["invocations"] == 1


async def test_deeply_nested_json_is_a_422_not_a_500() -> None:
    deep = b'{"a":' * 5000 + b"1" + b"}" * 5000
    async with client("1.2.0") as http:
        response = await http.post("/invoke", content=deep, headers={"content-type": "application/json"})
        assert response.status_code == 422
        assert response.json()["error"]["message"] == "body is not accepted: JSON nests deeper than 100 levels"
        chat = b'{"messages": [{"role": "user", "content": ' + deep + b"}]}"
        response = await http.post("/chat", content=chat, headers={"content-type": "application/json"})
        assert response.status_code == 422 and "nests deeper than 100" in response.json()["error"]["message"]


# --- the real process ----------------------------------------------------------------------------




def runner_command(recipe: Path, port: int, *extra: str) -> list[str]:
    return [sys.executable, "-m", "plnt.runner", "--recipe", str(recipe), "--host", "127.0.0.1", "--port", str(port), *extra]


def wait_healthy(process: subprocess.Popen[bytes], port: int, timeout: float = 20.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"runner exited with {process.returncode}: {process.stderr.read().decode()}")
        try:
            response = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1.0)
            if response.status_code == 200:
                return response.json()
        except httpx.TransportError:
            pass
        time.sleep(0.02)
    raise AssertionError("runner did not become healthy in time")


@pytest.mark.integration
def test_runner_process_serves_invokes_and_stops_cleanly_on_sigterm() -> None:
    port = free_port()
    process = subprocess.Popen(
        runner_command(RECIPES / "1.2.0", port, "--release-id", "rel-42"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        health = wait_healthy(process, port)
        assert health["status"] == "ok" and health["version"] == "1.2.0" and health["release"] == "rel-42"
        response = httpx.post(f"http://127.0.0.1:{port}/invoke", json=REVIEW, timeout=10.0)
        assert response.status_code == 200
        body = response.json()
        assert body["release"] == "rel-42"
        assert body["output"] == {
            "reply": "Thank you for your review! We're glad you enjoyed the great service, and we're sorry about "
            "the slow parking. — The Customer Care Team",
            "intent": "mixed",
            "approved": True,
            "reasons": [],
            "version": "1.2.0",
        }
        process.send_signal(signal.SIGTERM)
        stdout, stderr = process.communicate(timeout=10)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, stderr.decode()
    assert stdout == b""
    assert b"Traceback" not in stderr


@pytest.mark.integration
def test_a_runner_draining_on_stop_serves_on_and_closes_each_connection_after_its_answer() -> None:
    """A runner behind a Kubernetes Service (`--drain-on-stop-s`, the chart's drainOnStopSeconds): after
    SIGTERM it keeps serving, on kept-alive connections and new ones, each answer saying `connection:
    close`, then stops. (Its shutdown used to close idle kept-alive connections at once, and a request a
    gateway had just sent on one was lost: a 502 in tests/k8s/test_roles_apart_on_cluster.py.)"""
    port = free_port()
    process = subprocess.Popen(runner_command(RECIPES / "1.2.0", port, "--drain-on-stop-s", "2"),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_healthy(process, port)
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10.0, trust_env=False) as kept:
            before = kept.post("/invoke", json=REVIEW)
            assert before.status_code == 200 and "connection" not in before.headers
            stopped_at = time.monotonic()
            process.send_signal(signal.SIGTERM)
            time.sleep(0.3)
            on_kept = kept.post("/invoke", json=REVIEW)  # the connection kept alive before the signal
            assert on_kept.status_code == 200 and on_kept.headers["connection"] == "close"
        fresh = httpx.post(f"http://127.0.0.1:{port}/invoke", json=REVIEW, timeout=10.0, trust_env=False)
        assert fresh.status_code == 200 and fresh.headers["connection"] == "close"
        assert process.poll() is None
        _, stderr = process.communicate(timeout=10)
        stopped_after = time.monotonic() - stopped_at
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0 and b"Traceback" not in stderr, stderr.decode()
    assert 2.0 <= stopped_after, stopped_after


@pytest.mark.integration
def test_runner_process_refuses_oversized_heads_with_431() -> None:
    """The runner is served with the gateway's HTTP limits (core/limits.py)."""
    port = free_port()
    process = subprocess.Popen(runner_command(RECIPES / "1.2.0", port), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_healthy(process, port)
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            try:
                sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * (8 * 2**20) + b"\r\n\r\n")
            except OSError:
                pass  # the runner stopped reading after answering
            answer = sock.recv(4096)
        assert answer.startswith(b"HTTP/1.1 431 Request Header Fields Too Large"), answer[:100]
        assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code == 200
    finally:
        process.kill()
        process.wait()


@pytest.mark.integration
def test_runner_process_exits_2_when_the_recipe_does_not_load(tmp_path: Path) -> None:
    (tmp_path / "workflow.yaml").write_text("apiVersion: microagents.dev/v1\nkind: Workflow\nmetadata: {name: x}\nsteps: []\n")
    result = subprocess.run(runner_command(tmp_path, free_port()), capture_output=True, timeout=20)
    assert result.returncode == 2
    lines = result.stderr.decode().strip().splitlines()
    assert len(lines) == 1, lines
    assert str(tmp_path / "workflow.yaml") in lines[0] and "version" in lines[0]


# --- streaming, /chat, the step cache, /stats (in process) -----------------------------------------

SSE = {"accept": "text/event-stream"}


def app_client(directory: Path, adapter=None, **options) -> httpx.AsyncClient:
    app = create_app(load_recipe_dir(directory), adapter or MockBackend(), "rel-1", **options)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://runner")


async def test_invoke_streams_tokens_then_the_result_as_sse(tmp_path: Path) -> None:
    recipe = write_recipe(tmp_path, GENERATE_STEPS)
    async with app_client(recipe) as http:
        plain = (await http.post("/invoke", json={})).json()
        response = await http.post("/invoke", json={}, headers=SSE)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.headers["cache-control"] == "no-cache"
    events = parse_sse(response.text)
    tokens = [data for event, data in events if event == "token"]
    assert [t["text"] for t in tokens] == [w + " " for w in TEN_TOKENS.split()[:-1]] + ["ten"]
    assert {t["step"] for t in tokens} == {"words"}
    assert [event for event, _ in events] == ["token"] * 10 + ["result"]
    result = events[-1][1]
    assert set(result) == set(plain) and result["output"] == plain["output"] == TEN_TOKENS
    assert list(result["steps"]) == ["words"] and result["steps"]["words"]["cached"] is False


async def test_stream_of_a_recipe_whose_output_does_not_stream_is_just_the_result() -> None:
    async with app_client(RECIPES / "1.2.0") as http:
        response = await http.post("/invoke", json=REVIEW, headers=SSE)
    events = parse_sse(response.text)
    assert [event for event, _ in events] == ["result"]
    assert events[0][1]["output"]["intent"] == "mixed"


async def test_stream_failure_is_an_error_event_and_bad_json_is_still_a_422() -> None:
    async with app_client(RECIPES / "1.4.0") as http:
        response = await http.post("/invoke", json=REVIEW, headers=SSE)
        bad = await http.post("/invoke", content=b"{", headers={**SSE, "content-type": "application/json"})
    assert response.status_code == 200
    events = parse_sse(response.text)
    assert [event for event, _ in events] == ["error"]
    error = events[0][1]["error"]
    assert error["type"] == "step_failed" and error["step"] == "safety_check" and "deliberately broken" in error["message"]
    assert bad.status_code == 422 and bad.headers["content-type"] == "application/json"


async def test_silence_in_a_stream_is_filled_with_pings(tmp_path: Path) -> None:
    recipe = write_recipe(
        tmp_path,
        "- {id: slow, tool: python}\n- {id: out, tool: llm.generate, deps: [slow], params: {prompt: 'done now'}}",
        "import asyncio\nasync def slow(ctx):\n    await asyncio.sleep(0.35)\n",
    )
    async with app_client(recipe, ping_interval_s=0.1) as http:
        events = parse_sse((await http.post("/invoke", json={}, headers=SSE)).text)
    kinds = [event for event, _ in events]
    assert kinds[:3] == ["comment"] * 3 and all(data == "ping" for event, data in events if event == "comment")
    assert kinds[-3:] == ["token", "token", "result"]


async def test_chat_maps_messages_through_chat_inputs_json_and_sse() -> None:
    messages = [{"role": "system", "content": "You are helpful."}, {"role": "user", "content": "Great service but slow parking"}]
    async with app_client(RECIPES / "1.2.0") as http:
        response = await http.post("/chat", json={"model": "review-responder", "messages": messages})
        streamed = await http.post("/chat", json={"messages": messages, "stream": True})
        by_accept = await http.post("/chat", json={"messages": messages}, headers=SSE)
    assert response.status_code == 200
    body = response.json()
    assert body["output"]["reply"] == ("Thank you for your review! We're glad you enjoyed the great service, and we're sorry "
                                       "about the slow parking. — The Customer Care Team")  # "brief": the default voice
    for answer in (streamed, by_accept):
        assert answer.headers["content-type"].startswith("text/event-stream")
        assert parse_sse(answer.text)[-1] == ("result", {**body, "steps": parse_sse(answer.text)[-1][1]["steps"],
                                                          "cache": parse_sse(answer.text)[-1][1]["cache"]})


async def test_chat_without_chat_inputs_passes_message_and_messages(tmp_path: Path) -> None:
    recipe = write_recipe(
        tmp_path,
        '- {id: answer, tool: llm.generate, params: {prompt: "Answer:\\n{messages[0][content]} {message}", maxTokens: 40}}',
    )
    messages = [{"role": "user", "content": "first"}, {"role": "assistant", "content": "x"},
                {"role": "user", "content": [{"type": "text", "text": "hello "}, {"type": "image_url", "image_url": {}},
                                             {"type": "text", "text": "big world"}]}]
    async with app_client(recipe) as http:
        body = (await http.post("/chat", json={"messages": messages})).json()
        assert body["output"] == "first hello big world"
        capped = parse_sse((await http.post("/chat", json={"messages": messages, "stream": True, "max_tokens": 2})).text)
    assert [data["text"] for event, data in capped if event == "token"] == ["first ", "hello "]
    assert capped[-1][1]["output"] == "first hello "


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "messages"),
        ({"messages": []}, "messages"),
        ({"messages": "hi"}, "messages"),
        ({"messages": [{"content": "no role"}]}, "messages[0]"),
        ({"messages": [{"role": "system", "content": "no user"}]}, "messages"),
        ({"messages": [{"role": "user", "content": "x"}], "stream": "yes"}, "stream"),
        ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, "max_tokens"),
        ({"messages": [{"role": "user", "content": "x"}], "max_tokens": True}, "max_tokens"),
    ],
)
async def test_chat_rejects_bad_bodies_with_422_naming_the_field(tmp_path: Path, body: dict, field: str) -> None:
    recipe = write_recipe(tmp_path, "- {id: answer, tool: llm.generate, params: {prompt: '{message}'}}")
    async with app_client(recipe) as http:
        response = await http.post("/chat", json=body, headers=SSE)
    assert response.status_code == 422
    error = response.json()["error"]
    assert error["type"] == "invalid_request" and error["field"] == field, error


async def test_chat_inputs_that_rejects_the_messages_is_a_422() -> None:
    async with app_client(RECIPES / "1.2.0") as http:
        response = await http.post("/chat", json={"messages": [{"role": "user", "content": "   "}]})
    assert response.status_code == 422
    assert "chat_inputs" in response.json()["error"]["message"]


async def test_step_cache_hits_on_repeat_and_stats_report_it() -> None:
    async with app_client(RECIPES / "1.2.0") as http:
        first = (await http.post("/invoke", json=REVIEW)).json()
        second = (await http.post("/invoke", json=REVIEW)).json()
        stats = (await http.get("/stats")).json()
    assert first["cache"] == {"hits": 0, "misses": 3} and second["cache"] == {"hits": 3, "misses": 0}
    assert {step for step, info in second["steps"].items() if info["cached"]} == {
        "classify_intent", "retrieve_brand_voice", "safety_check"}
    assert second["steps"]["draft_reply"]["cached"] is False  # llm.generate: not cached
    assert second["output"] == first["output"]
    assert stats == {"stepCache": {"hits": 3, "misses": 3, "hitRate": 0.5, "size": 3, "capacity": 1024}, "invocations": 2}


async def test_streamed_output_step_is_not_cached_but_the_steps_before_it_are() -> None:
    post_generator = RECIPES.parent / "post-generator" / "1.0.0"
    payload = {"topic": "remote work", "audience": "new managers"}
    async with app_client(post_generator) as http:
        runs = [parse_sse((await http.post("/invoke", json=payload, headers=SSE)).text) for _ in range(2)]
    for events in runs:
        assert len([e for e, _ in events if e == "token"]) > 10
    first, second = runs[0][-1][1], runs[1][-1][1]
    assert first["cache"] == {"hits": 0, "misses": 2}  # style (rag), moderation; outline and post generate
    assert second["cache"] == {"hits": 2, "misses": 0}
    assert second["steps"]["post"]["cached"] is False and second["output"] == first["output"]


async def test_step_cache_is_bounded_and_can_be_disabled() -> None:
    reviews = [{**REVIEW, "review": f"Great service but slow parking {n}"} for n in range(3)]
    async with app_client(RECIPES / "1.2.0", step_cache_size=2) as http:
        for payload in reviews:
            await http.post("/invoke", json=payload)
        again = (await http.post("/invoke", json=reviews[0])).json()
        stats = (await http.get("/stats")).json()["stepCache"]
    assert stats["size"] == 2 and stats["capacity"] == 2
    assert again["cache"]["hits"] == 0, "evicted entries must be gone"
    async with app_client(RECIPES / "1.2.0", step_cache_size=0) as http:
        for _ in range(2):
            body = (await http.post("/invoke", json=REVIEW)).json()
            assert body["cache"] == {"hits": 0, "misses": 0}
            assert not any(info["cached"] for info in body["steps"].values())
        stats = (await http.get("/stats")).json()
    assert stats == {"stepCache": {"hits": 0, "misses": 0, "hitRate": 0.0, "size": 0, "capacity": 0}, "invocations": 2}
