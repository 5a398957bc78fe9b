"""The runner's HTTP API, in process and as the real `python -m plnt.runner` process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from plnt.reconciler.local_driver import free_port
from plnt.runner.adapters import MockBackend
from plnt.runner.app import create_app
from plnt.runner.recipe import load_recipe_dir

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
    assert set(body) == {"workflow", "version", "output", "steps", "release"}
    assert (body["workflow"], body["version"], body["release"]) == ("review-responder", "1.3.0", None)
    assert body["output"]["intent"] == "mixed" and body["output"]["approved"] is True
    assert body["output"]["reply"].endswith("Warm regards, the Customer Care Team")
    assert list(body["steps"]) == ["classify_intent", "retrieve_brand_voice", "draft_reply", "safety_check"]
    assert all(isinstance(step["ms"], float) for step in body["steps"].values())


@pytest.mark.parametrize("content", [b"[1, 2]", b'"text"', b"not json", b"", b"\xff\xfe"])
async def test_invoke_rejects_a_body_that_is_not_a_json_object(content: bytes) -> None:
    async with client("1.2.0") as http:
        response = await http.post("/invoke", content=content, headers={"content-type": "application/json"})
    assert response.status_code == 422
    error = response.json()["error"]
    assert error["type"] == "invalid_request" and error["message"]


async def test_failed_step_is_a_500_naming_the_step() -> None:
    async with client("1.4.0") as http:
        response = await http.post("/invoke", json=REVIEW)
    assert response.status_code == 500
    error = response.json()["error"]
    assert error["type"] == "step_failed" and error["step"] == "safety_check"
    assert "deliberately broken" in error["message"]


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
def test_runner_process_exits_2_when_the_recipe_does_not_load(tmp_path: Path) -> None:
    (tmp_path / "workflow.yaml").write_text("apiVersion: microagents.dev/v1\nkind: Workflow\nmetadata: {name: x}\nsteps: []\n")
    result = subprocess.run(runner_command(tmp_path, free_port()), capture_output=True, timeout=20)
    assert result.returncode == 2
    lines = result.stderr.decode().strip().splitlines()
    assert len(lines) == 1, lines
    assert str(tmp_path / "workflow.yaml") in lines[0] and "version" in lines[0]
