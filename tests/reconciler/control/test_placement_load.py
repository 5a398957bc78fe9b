"""Placement's measured load: each local replica's own count (GET /load), read at once and summed per
backend. The replicas here are STAND-INS (asyncio servers answering /load as a runner does); the real
runners' /load is tested in tests/runner/test_load.py."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest
from plnt.reconciler.app import observe_replica_load
from plnt.reconciler.plan.placement import Observed
from plnt.reconciler.state import LiveWorkflow, Release, ReplicaProcess

pytestmark = pytest.mark.integration


async def _serve(body: bytes) -> asyncio.Server:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body))
        await writer.drain()
        writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0)


@pytest.fixture
async def replicas() -> AsyncIterator[list[str]]:
    servers = [await _serve(json.dumps({"inFlight": 3, "waiting": 1}).encode()),
               await _serve(json.dumps({"inFlight": 1, "waiting": 0}).encode()),
               await _serve(b"not a load"),
               await _serve(json.dumps({"inFlight": 7, "waiting": 0}).encode())]
    yield [f"http://127.0.0.1:{s.sockets[0].getsockname()[1]}" for s in servers]
    for server in servers:
        server.close()


def _release(endpoint: str, backend: str | None, more: tuple[tuple[str, str], ...] = (), pid: int | None = 1) -> Release:
    return Release(release_id="r", namespace="default", name="rr", track="stable", version="1.0.0",
                   spec_fingerprint="sha256:" + "0" * 64, recipe_digest="d", recipe_dir="/r", endpoint=endpoint,
                   backend=backend, replicas=1 + len(more), pid=pid,
                   more_replicas=tuple(ReplicaProcess(endpoint=e, backend=b, pid=pid) for e, b in more))


async def test_each_replica_is_read_and_counted_on_its_backend(replicas: list[str]) -> None:
    busy, light, nonsense, service = replicas
    releases = {
        # a pool's release: one replica on east (3 in flight), one on west (1)
        "default/rr": LiveWorkflow(namespace="default", name="rr", stable=_release(busy, "east", ((light, "west"),))),
        # a replica answering nonsense is unknown, not idle: its backend gets no reading
        "default/odd": LiveWorkflow(namespace="default", name="odd", stable=_release(nonsense, None)),
        # a Kubernetes release (no process of plnt's: a Service) is not read, even if it would answer
        "default/kube": LiveWorkflow(namespace="default", name="kube", stable=_release(service, None, pid=None)),
        # a replica that does not answer at all
        "default/gone": LiveWorkflow(namespace="default", name="gone", stable=_release("http://127.0.0.1:9", None)),
    }
    current = {"default/rr": {"east": 1, "west": 1}, "default/odd": {"north": 1}, "default/kube": {"k8s": 1},
               "default/gone": {"south": 1}}
    assert await observe_replica_load(releases, current) == {"east": Observed(in_flight=3),
                                                             "west": Observed(in_flight=1)}
