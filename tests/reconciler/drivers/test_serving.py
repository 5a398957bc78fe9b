"""serving.py: a release counts as serving only when its endpoint answers as that release. Against
real HTTP servers on 127.0.0.1 (http.server threads), no Kubernetes here: tests/k8s shows the Helm
driver waiting for a real Service's endpoints."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from plnt.core.upstream import UpstreamClient
from plnt.reconciler.drivers.processes import free_port
from plnt.reconciler.drivers.serving import answer_of, wait_serving
from plnt.reconciler.state import ModelServing, Release

pytestmark = pytest.mark.integration  # real sockets


class Answers:
    """What the test server answers on each path: (status, body)."""

    def __init__(self) -> None:
        self.by_path: dict[str, tuple[int, bytes]] = {}


@pytest.fixture
def server() -> Iterator[tuple[str, Answers]]:
    answers = Answers()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            status, body = answers.by_path.get(self.path, (404, b"{}"))
            self.send_response(status)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", answers
    finally:
        httpd.shutdown()
        httpd.server_close()


def release(endpoint: str, model: bool = False) -> Release:
    return Release(release_id="default.review-responder.1.3.0.abc", namespace="default", name="review-responder",
                   track="canary", version="1.3.0", spec_fingerprint="sha256:" + "0" * 64, recipe_digest="sha256:1",
                   recipe_dir="/var/lib/plnt/recipe", endpoint=endpoint,
                   model=ModelServing(runtime="vllm", model_file="", alias="m", context_length=4096) if model else None)


def healthz(release_id: str) -> tuple[int, bytes]:
    return 200, json.dumps({"status": "ok", "version": "1.3.0", "release": release_id}).encode()


async def ask(r: Release) -> str | None:
    client = UpstreamClient(read_timeout_s=2, connect_timeout_s=2)
    try:
        return await answer_of(r, client)
    finally:
        await client.aclose()


@pytest.mark.parametrize(("path", "answer", "problem"), [
    ("/healthz", healthz("default.review-responder.1.3.0.abc"), None),
    ("/healthz", healthz("default.review-responder.1.2.0.old"), "answered as release 'default.review-responder.1.2.0.old'"),
    ("/healthz", (503, b"{}"), "answered 503"),
    ("/healthz", (200, b"not json"), "not JSON"),
    ("/elsewhere", (200, b"{}"), "answered 404"),
])
async def test_a_runner_serves_when_its_healthz_names_its_release(
    server: tuple[str, Answers], path: str, answer: tuple[int, bytes], problem: str | None
) -> None:
    url, answers = server
    answers.by_path[path] = answer
    got = await ask(release(url))
    assert got is None if problem is None else problem in (got or ""), got


async def test_a_model_server_serves_when_v1_models_answers(server: tuple[str, Answers]) -> None:
    url, answers = server
    assert "answered 404" in (await ask(release(url, model=True)) or "")
    answers.by_path["/v1/models"] = (200, b'{"data": []}')
    assert await ask(release(url, model=True)) is None


async def test_nothing_listening_is_not_serving_and_the_wait_says_why() -> None:
    endpoint = f"http://127.0.0.1:{free_port()}"
    problem = await wait_serving(release(endpoint), timeout_s=0.5)
    assert problem is not None and "cannot connect" in problem, problem


async def test_the_wait_ends_as_soon_as_the_release_answers(server: tuple[str, Answers]) -> None:
    url, answers = server
    answers.by_path["/healthz"] = healthz("default.review-responder.1.2.0.old")  # the Service's old pods, say
    waiting = asyncio.create_task(wait_serving(release(url), timeout_s=30))
    await asyncio.sleep(0.5)
    assert not waiting.done()
    answers.by_path["/healthz"] = healthz("default.review-responder.1.3.0.abc")
    assert await asyncio.wait_for(waiting, 5) is None
