"""A model server's load (runner/model_server.py, GET /load): requests to the model running plus
waiting, what the autoscaler follows. Real SmolLM2 on llama.cpp (llama-cpp-python's server serves one
request at a time: of three chats at once, one runs and two wait)."""

from __future__ import annotations

import asyncio
import signal
import subprocess
from pathlib import Path

import httpx
import pytest
from plnt.reconciler.drivers.processes import free_port

from tests.models.test_llama_runtime import CHAT, LLM_VENV, smollm2_gguf  # noqa: F401 - the fixture

pytestmark = [pytest.mark.integration, pytest.mark.real_inference]

MODEL_SERVER = Path(__file__).resolve().parents[2] / "runner" / "model_server.py"


async def test_load_is_running_plus_waiting_chats(smollm2_gguf: Path, tmp_path: Path) -> None:  # noqa: F811
    port = free_port()
    process = subprocess.Popen([str(LLM_VENV / "bin" / "python"), str(MODEL_SERVER), "--model", str(smollm2_gguf),
                                "--alias", "smollm2", "--port", str(port), "--release-id", "r1", "--version", "1.0.0",
                                "--context", "512", "--threads", "2"],
                               cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    base = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient(base_url=base, trust_env=False, timeout=120) as http:
            for _ in range(600):
                assert process.poll() is None, process.stderr.read().decode()[-2000:]  # type: ignore[union-attr]
                try:
                    if (await http.get("/healthz")).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                await asyncio.sleep(0.1)
            assert (await http.get("/load")).json() == {"inFlight": 0, "waiting": 0}
            chats = [asyncio.create_task(http.post("/v1/chat/completions", json={**CHAT, "max_tokens": 24}))
                     for _ in range(3)]
            seen: list[dict[str, int]] = []
            while not all(chat.done() for chat in chats):
                seen.append((await http.get("/load")).json())
                await asyncio.sleep(0.02)
            answers = [chat.result() for chat in chats]
            assert (await http.get("/models")).status_code in (200, 404)  # (a GET is never counted)
            after = (await http.get("/load")).json()
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=20)
    assert [a.status_code for a in answers] == [200] * 3
    assert {"inFlight": 3, "waiting": 2} in seen, seen[:20]
    assert all(s["waiting"] == max(0, s["inFlight"] - 1) for s in seen)
    assert after == {"inFlight": 0, "waiting": 0}
