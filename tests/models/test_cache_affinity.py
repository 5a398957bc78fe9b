"""Cache-aware routing on a real model: two SmolLM2-135M-Instruct servers (llama.cpp, started as the local
driver starts a model release's: tests/models/model_replicas.py) behind a gateway whose route lists both
as stable replicas (built by hand: one release served twice). The turns of one conversation land on one
replica; different conversations land where their ranking says (so both replicas serve); a conversation
whose replica has two requests in flight goes to the other; with the affinity off the replicas take turns.
And through plnt itself: a ModelDeployment of `replicas: {min: 2}` served by two llama.cpp processes of the
local driver, each conversation's turns on its own replica.

The two replicas' Backends carry the versions "1.0.0-a" and "1.0.0-b" so that X-Plnt-Version says which
one answered (real replicas of one release share a version; the router never reads it).

Needs `make install-llm` (part of `make test`)."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from plnt.core.routes import Backend, Route, RouteTable
from plnt.core.server import GatewayServer
from plnt.gateway.affinity import conversation_key, ranking
from plnt.gateway.app import create_app
from plnt.gateway.router import Router

from tests.conftest import SpecRepo
from tests.e2e.harness import running_plnt, settings_for, wait_phase
from tests.models.model_replicas import ModelReplica, model_replicas
from tests.models.test_llama_runtime import LLM_VENV, smollm2_gguf  # noqa: F401 - the fixture
from tests.models.test_model_deployment import MODEL_FILE, model_repo  # noqa: F401 - the fixture
from tests.sigstore_ca import TestSigstoreAuthority

pytestmark = [pytest.mark.integration, pytest.mark.real_inference]

SYSTEM = ("You are the assistant of a small bakery in Lyon. You answer questions about bread, opening hours and "
          "orders, briefly and kindly.")


@pytest.fixture(scope="module")
async def replicas(smollm2_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[list[ModelReplica]]:  # noqa: F811
    async with model_replicas(LLM_VENV, smollm2_gguf, tmp_path_factory.mktemp("replicas"), 2, context=1024) as started:
        yield started


def route_of(replicas: list[ModelReplica]) -> tuple[Route, dict[str, str]]:
    backends = tuple(Backend(r.endpoint, f"1.0.0-{tag}", "default.smollm2.r1") for r, tag in zip(replicas, "ab", strict=True))
    route = Route("default", "smollm2", None, stable_replicas=backends, protocol="openai")
    return route, {b.version: b.endpoint for b in backends}


async def serve(router: Router) -> GatewayServer:
    server = GatewayServer(create_app(router, list_workflows=list, request_timeout_s=120), "127.0.0.1", 0)
    await server.start()
    return server


def opening(question: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]


async def turn(client: httpx.AsyncClient, url: str, messages: list[dict[str, str]], max_tokens: int = 6) -> tuple[str, str]:
    """One chat turn: (the replica's version that answered, the reply)."""
    answer = await client.post(f"{url}/v1/chat/completions", json={
        "model": "smollm2", "messages": messages, "max_tokens": max_tokens, "temperature": 0})
    assert answer.status_code == 200, answer.text
    return answer.headers["x-plnt-version"], answer.json()["choices"][0]["message"]["content"]


async def conversation(client: httpx.AsyncClient, url: str, question: str, turns: int) -> list[str]:
    """A conversation of `turns` turns (the history resent each time): which replica answered each."""
    messages, served = opening(question), []
    for i in range(turns):
        version, reply = await turn(client, url, messages)
        served.append(version)
        messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": f"And what about {i}?"}]
    return served


def placements(server: GatewayServer) -> dict[str, float]:
    metrics = server.app.state.metrics.placements  # type: ignore[attr-defined]
    return {sample.labels["placed"]: sample.value for family in metrics.collect() for sample in family.samples
            if sample.name.endswith("_total")}


async def test_a_conversation_keeps_its_replica_and_spills_when_it_is_busy(replicas: list[ModelReplica]) -> None:
    route, endpoint_of = route_of(replicas)
    router = Router(RouteTable([route]))
    server = await serve(router)
    endpoints = [b.endpoint for b in route.stable_replicas]
    try:
        async with httpx.AsyncClient(trust_env=False, timeout=120) as client:
            # Different conversations go where their ranking says: two for each replica, found by their key.
            expected: dict[str, str] = {}
            question = 0
            while sorted(expected.values()).count(endpoints[0]) < 2 or sorted(expected.values()).count(endpoints[1]) < 2:
                text = f"Do you bake bread number {question} on Sundays?"
                own = endpoints[ranking(conversation_key(opening(text)), endpoints)[0]]
                if list(expected.values()).count(own) < 2:
                    expected[text] = own
                question += 1
            for text, own in expected.items():
                served = await conversation(client, server.url, text, 3)
                assert {endpoint_of[v] for v in served} == {own}, (text, served)  # every turn on its own replica
            assert placements(server) == {"own": 12.0}

            # Its replica busy with two streams of its own: the conversation's next request goes to the other.
            text, own = next(iter(expected.items()))
            other = next(e for e in endpoints if e != own)
            own_backend = next(b for b in route.stable_replicas if b.endpoint == own)
            body: dict[str, Any] = {"model": "smollm2", "messages": opening(text), "max_tokens": 48, "temperature": 0,
                                    "stream": True}

            async def stream() -> str:
                async with client.stream("POST", f"{server.url}/v1/chat/completions", json=body) as answer:
                    assert answer.status_code == 200
                    async for _ in answer.aiter_bytes():
                        pass
                    return endpoint_of[answer.headers["x-plnt-version"]]

            first = asyncio.create_task(stream())
            second = asyncio.create_task(stream())
            for _ in range(200):
                if router.in_flight_count(own_backend) == 2:
                    break
                await asyncio.sleep(0.01)
            assert router.in_flight_count(own_backend) == 2
            version, _ = await turn(client, server.url, opening(text))
            assert endpoint_of[version] == other
            assert await first == own and await second == own
            assert placements(server) == {"own": 14.0, "spilled": 1.0}
            # Idle again: back on its own replica.
            assert endpoint_of[(await turn(client, server.url, opening(text)))[0]] == own
    finally:
        await server.stop()


async def test_with_the_affinity_off_the_replicas_take_turns(replicas: list[ModelReplica]) -> None:
    route, endpoint_of = route_of(replicas)
    server = await serve(Router(RouteTable([route]), cache_affinity=False))
    try:
        async with httpx.AsyncClient(trust_env=False, timeout=120) as client:
            served = await conversation(client, server.url, "Do you sell croissants?", 4)
        assert all(a != b for a, b in zip(served, served[1:], strict=False)), served  # turn after turn, the other replica
        assert placements(server) == {}
    finally:
        await server.stop()


async def test_plnt_up_with_two_replicas_keeps_each_conversation_on_its_own(
    model_repo: tuple[SpecRepo, Path, TestSigstoreAuthority, str], tmp_path: Path,  # noqa: F811
    temporal_address: str, temporal_namespace: str,
) -> None:
    """The way users run it: plnt (reconciler, worker, gateway in this process) deploys SmolLM2 with
    `replicas: {min: 2}`; the local driver runs two llama.cpp servers, both in the route. Each turn of a
    conversation is counted in flight on its own replica while it streams (the router's count per
    replica: what the gateway itself sent where)."""
    repo, registry, _, _ = model_repo
    text = (repo.path / MODEL_FILE).read_text()
    text = text.replace("threads: 2}", "threads: 1}").replace(
        "  backend: {cluster: local}\n", "  backend: {cluster: local}\n  replicas: {min: 2, max: 2}\n").replace(
        "ttftBudgetMs: 5000, tpotBudgetMs: 2000", "ttftBudgetMs: 60000, tpotBudgetMs: 10000")
    assert "replicas: {min: 2" in text and "threads: 1}" in text
    repo.write(MODEL_FILE, text)
    repo.commit("smollm2 on two replicas")
    settings = settings_for(repo.path, tmp_path / "state", temporal_address, temporal_namespace,
                            file_registry_roots=(registry,), llm_venv=LLM_VENV, smoke_request_timeout_s=120)
    async with running_plnt(settings) as plnt, httpx.AsyncClient(trust_env=False, timeout=120) as client:
        await wait_phase(plnt, "Ready", version="1.0.0", name="smollm2", timeout=300)
        route = plnt.router.table.lookup("smollm2", "default")
        assert route is not None and route.protocol == "openai" and len(route.stable_replicas) == 2, route
        endpoints = [b.endpoint for b in route.stable_replicas]
        # One conversation whose own replica is each of the two.
        chosen: dict[str, str] = {}
        for i in range(64):
            question = f"Do you bake bread number {i} on Sundays?"
            chosen.setdefault(endpoints[ranking(conversation_key(opening(question)), endpoints)[0]], question)
            if len(chosen) == 2:
                break
        assert len(chosen) == 2
        for own, question in chosen.items():
            messages = opening(question)
            for i in range(2):
                body = {"model": "smollm2", "messages": messages, "max_tokens": 6, "temperature": 0, "stream": True}
                async with client.stream("POST", f"{plnt.url}/v1/chat/completions", json=body) as answer:
                    assert answer.status_code == 200
                    counts = {b.endpoint: plnt.router.in_flight_count(b) for b in route.stable_replicas}
                    assert counts == {e: int(e == own) for e in endpoints}, (question, i, counts)
                    lines = [line async for line in answer.aiter_lines() if line.startswith("data: {")]
                reply = "".join((json.loads(line[6:])["choices"][0]["delta"].get("content") or "") for line in lines)
                messages = [*messages, {"role": "assistant", "content": reply}, {"role": "user", "content": "Why?"}]
        metrics = (await client.get(f"{plnt.url}/metrics")).text
        own_count = re.search(r'plnt_gateway_affinity_placements_total\{[^}]*placed="own"[^}]*workflow="smollm2"[^}]*\} '
                              r'([0-9.]+)', metrics)
        assert own_count is not None and float(own_count.group(1)) == 4.0, metrics[-2000:]
