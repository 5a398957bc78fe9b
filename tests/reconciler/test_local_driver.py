"""Local driver with real runner processes on 127.0.0.1.

The runners serve with `--backend mock` (their default): MockBackend stands in for the model server."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
from pathlib import Path

import httpx
import pytest
from plnt.reconciler.driver import InstallRequest
from plnt.reconciler.errors import InvalidRecipe
from plnt.reconciler.local_driver import LocalDriver, process_start_time
from plnt.reconciler.state import StateDir
from plnt.runner.recipe import directory_digest

from ..conftest import EXAMPLE

pytestmark = pytest.mark.integration

RECIPES = EXAMPLE / "recipes" / "review-responder"


def request(version: str, track: str = "canary", fingerprint: str = "sha256:" + "a" * 64) -> InstallRequest:
    directory = RECIPES / version
    return InstallRequest(namespace="default", name="rr", track=track, version=version, spec_fingerprint=fingerprint,
                          recipe_digest=directory_digest(directory), recipe_dir=str(directory), traffic_percent=10)


def alive(pid: int | None) -> bool:
    return pid is not None and process_start_time(pid) is not None


async def version_at(endpoint: str) -> str:
    async with httpx.AsyncClient(trust_env=False) as client:
        return (await client.get(f"{endpoint}/healthz")).json()["version"]


@pytest.fixture
async def driver(tmp_path: Path):
    changes: list[int] = []
    driver = LocalDriver(StateDir(tmp_path / "state"), on_change=lambda: changes.append(1))
    driver.changes = changes  # type: ignore[attr-defined]
    yield driver
    await driver.shutdown()


async def test_install_is_healthy_and_idempotent(driver: LocalDriver) -> None:
    first = await driver.install(request("1.2.0"))
    assert alive(first.pid) and await version_at(first.endpoint) == "1.2.0"
    again = await driver.install(request("1.2.0"))
    assert again == first, "a retried install finds its own release"
    assert (await driver.live())["default/rr"].canary == first
    assert driver.changes  # type: ignore[attr-defined]


async def test_promote_swaps_records_then_stops_the_old_stable(driver: LocalDriver) -> None:
    await driver.install(request("1.2.0"))
    old = await driver.promote("default", "rr")
    canary = await driver.install(request("1.3.0", fingerprint="sha256:" + "b" * 64))
    new = await driver.promote("default", "rr")
    assert new.track == "stable" and new.pid == canary.pid and new.traffic_percent == 0
    live = (await driver.live())["default/rr"]
    assert live.stable == new and live.canary is None
    assert not alive(old.pid)
    assert await driver.promote("default", "rr") == new, "a retried promote finds its own work"


async def test_remove_is_idempotent(driver: LocalDriver) -> None:
    release = await driver.install(request("1.2.0"))
    await driver.remove("default", "rr", "canary")
    await driver.remove("default", "rr", "canary")
    assert not alive(release.pid)
    assert await driver.live() == {}


async def test_install_replaces_a_different_release_on_the_same_track(driver: LocalDriver) -> None:
    first = await driver.install(request("1.2.0"))
    second = await driver.install(request("1.3.0", fingerprint="sha256:" + "c" * 64))
    assert not alive(first.pid) and alive(second.pid)


async def test_resume_restarts_recorded_releases_after_a_shutdown(tmp_path: Path, driver: LocalDriver) -> None:
    await driver.install(request("1.2.0"))
    stable = await driver.promote("default", "rr")
    await driver.shutdown()
    assert not alive(stable.pid)
    fresh = LocalDriver(StateDir(tmp_path / "state"))
    try:
        [resumed] = await fresh.resume()
        assert resumed.release_id == stable.release_id and alive(resumed.pid)
        assert await version_at(resumed.endpoint) == "1.2.0"
        assert await fresh.resume() == [], "running releases are left alone"
    finally:
        await fresh.shutdown()


async def test_a_dead_runner_is_not_counted_as_running(driver: LocalDriver) -> None:
    release = await driver.install(request("1.2.0"))
    os.kill(release.pid, signal.SIGKILL)
    for _ in range(50):
        if not driver.is_running(release):
            break
        await asyncio.sleep(0.05)
    assert not driver.is_running(release)
    again = await driver.install(request("1.2.0"))
    assert again.pid != release.pid and alive(again.pid), "a retried install replaces a dead runner"


async def test_recipe_that_does_not_load_is_a_dead_end(tmp_path: Path, driver: LocalDriver) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(RECIPES / "1.2.0", broken)
    (broken / "steps.py").write_text("raise RuntimeError('import-time failure')\n")
    bad = request("1.2.0").model_copy(update={"recipe_dir": str(broken)})
    with pytest.raises(InvalidRecipe, match="could not load its recipe"):
        await driver.install(bad)
    assert await driver.live() == {}
