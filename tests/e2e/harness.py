"""Helpers for end-to-end tests: a real `plnt` (Temporal worker, reconciler, gateway, runner
processes) started in the test's event loop against a real git repository. The runners' model is
MockBackend (`--backend mock`), a stand-in for a model server, unless the settings name one."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import httpx
from plnt.reconciler.app import Plnt, start
from plnt.reconciler.settings import RetrySettings, Settings

T = TypeVar("T")

REVIEW = {"review": "Great service but slow parking", "brand_voice": "warm, brief"}


def settings_for(repo: Path, state_dir: Path, temporal_address: str, namespace: str, **overrides: Any) -> Settings:
    values: dict[str, Any] = dict(
        repo=str(repo), state_dir=state_dir, port=0, interval_s=0.5,
        temporal_address=temporal_address, temporal_namespace=namespace,
        retry=RetrySettings(initial_interval_s=0.2, maximum_interval_s=1.0),
    )
    values.update(overrides)
    return Settings(**values)


@asynccontextmanager
async def running_plnt(settings: Settings) -> AsyncIterator[Plnt]:
    plnt = await start(settings)
    try:
        yield plnt
    finally:
        await plnt.stop()


async def wait_for(check: Callable[[], Awaitable[T | None]] | Callable[[], T | None], *, timeout: float = 30.0,
                   what: str | Callable[[], str] = "condition", interval: float = 0.1) -> T:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if asyncio.iscoroutine(last):
            last = await last
        if last:
            return last
        await asyncio.sleep(interval)
    described = what() if callable(what) else what  # e.g. the status as it is at the timeout, not as it was
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {described}; last value: {last!r}")


PASS_OUTCOMES = ("ok", "skipped", "error")


def full_passes(plnt: Plnt) -> int:
    """Reconcile passes with a fetch that plnt has finished, from its own metric: a test that asserts
    nothing happened waits for passes, not for seconds."""
    registry = plnt.reconciler.metrics.registry
    return int(sum(registry.get_sample_value("plnt_reconcile_duration_seconds_count", {"pass": "full", "outcome": o})
                   or 0 for o in PASS_OUTCOMES))


def full_passes_in(metrics_text: str) -> int:
    """The same, read from a `GET /metrics` answer (a plnt in a process of its own)."""
    from prometheus_client.parser import text_string_to_metric_families

    return int(sum(sample.value for family in text_string_to_metric_families(metrics_text)
                   for sample in family.samples
                   if sample.name == "plnt_reconcile_duration_seconds_count" and sample.labels.get("pass") == "full"))


def status_of(plnt: Plnt, name: str = "review-responder", namespace: str = "default") -> dict[str, Any] | None:
    status = plnt.statuses.get(f"{namespace}/{name}")
    return status.public() if status else None


async def wait_phase(plnt: Plnt, phase: str, *, version: str | None = None, name: str = "review-responder",
                     timeout: float = 45.0) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        status = status_of(plnt, name)
        if status and status["phase"] == phase and (version is None or status["version"] == version):
            return status
        return None

    return await wait_for(check, timeout=timeout,
                          what=lambda: f"{name} {phase} {version or ''} (now: {status_of(plnt, name)})")


async def invoke(plnt: Plnt, payload: dict[str, Any] | None = None, name: str = "review-responder") -> httpx.Response:
    async with httpx.AsyncClient(trust_env=False, timeout=30) as client:
        return await client.post(f"{plnt.url}/workflows/{name}/invoke", json=payload or REVIEW)


async def hook(plnt: Plnt) -> None:
    """What a git server's webhook does after a push: ask for an immediate fetch."""
    async with httpx.AsyncClient(trust_env=False) as client:
        (await client.post(f"{plnt.url}/hooks/git")).raise_for_status()
