"""A real llama.cpp server (SmolLM2-135M-Instruct on the CPU) behind a real gateway: the official
`openai` client gets the server's own request id and end-to-end headers through plnt, streamed and
not, as it would talking to the server directly. Nothing here is a stand-in.

Needs `make install-llm` (part of `make test`). tests/gateway/test_response_headers.py covers the
hop-by-hop and spoofing cases no real server sends on cue."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from openai import AsyncOpenAI
from openai.types.chat import ChatCompletionMessageParam
from plnt.core.routes import Backend, Route, RouteTable
from plnt.core.server import GatewayServer
from plnt.gateway.app import create_app
from plnt.gateway.router import Router
from plnt.reconciler.drivers.model_runtime import LlamaCppServer, runtime_python
from plnt.reconciler.drivers.processes import free_port

from tests.models.test_llama_runtime import LLM_VENV, smollm2_gguf  # noqa: F401 - the fixture

pytestmark = [pytest.mark.integration, pytest.mark.real_inference]

MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Say hi."}]
# What the gateway sets itself or never relays (core/upstream.py): everything else must come through.
GATEWAYS_OWN = {"content-length", "content-type", "server", "date", "transfer-encoding", "connection", "keep-alive",
                "cache-control", "x-accel-buffering"}


@pytest.fixture
async def llama(smollm2_gguf: Path, tmp_path: Path) -> AsyncIterator[LlamaCppServer]:  # noqa: F811
    server = LlamaCppServer(python=runtime_python(LLM_VENV), model_file=smollm2_gguf, port=free_port(),
                            workdir=tmp_path / "runtime", context=512, threads=2,
                            base_env={"PATH": os.environ.get("PATH", os.defpath)})
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


async def test_the_openai_client_gets_llama_cpps_request_id_through_the_gateway(llama: LlamaCppServer) -> None:
    async with httpx.AsyncClient(trust_env=False, timeout=120) as direct:
        answer = await direct.post(f"{llama.endpoint}/v1/chat/completions",
                                   json={"model": "smollm2", "messages": MESSAGES, "max_tokens": 4})
    assert answer.status_code == 200, answer.text
    direct_names = {name for name in answer.headers if name not in GATEWAYS_OWN and not name.startswith("access-control-")}
    assert "x-request-id" in direct_names, answer.headers  # what the gateway used to drop

    backend = Backend(endpoint=llama.endpoint, version="1.0.0", release_id="rel-smollm2-1.0.0")
    router = Router(RouteTable([Route("default", "smollm2", stable=backend, protocol="openai")]))
    gateway = GatewayServer(create_app(router, list_workflows=list, request_timeout_s=120), "127.0.0.1", 0)
    await gateway.start()
    try:
        async with AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0, timeout=120) as client:
            raw = await client.chat.completions.with_raw_response.create(model="smollm2", messages=MESSAGES,
                                                                         max_tokens=4)
            completion = raw.parse()
            assert completion.choices[0].message.content
            assert completion._request_id and completion._request_id == raw.headers["x-request-id"]
            assert completion._request_id != answer.headers["x-request-id"]  # the server's own, one per request
            assert direct_names <= set(raw.headers), (answer.headers, raw.headers)
            assert raw.headers["x-plnt-version"] == "1.0.0"

            stream = await client.chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=4, stream=True)
            assert "".join([chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices])
            assert stream.response.headers.get("x-request-id")
            # The server marks its streams no-store, stricter than the gateway's own no-cache: kept.
            assert stream.response.headers["cache-control"] == "no-store"
            assert direct_names <= set(stream.response.headers), stream.response.headers
    finally:
        await gateway.stop()
