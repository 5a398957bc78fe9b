"""Local replicas with real runner processes on 127.0.0.1: a stable release runs `replicas` processes,
each on its own port, in one record; a canary runs one; promote starts the others; a scale adds or
stops processes of the live release; repair restarts only a dead one; resume restarts them all.

The runners serve with `--backend mock` (their default): MockBackend stands in for the model server."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import httpx
import pytest
from plnt.core.recipe import directory_digest
from plnt.reconciler.drivers.local import LocalDriver
from plnt.reconciler.drivers.processes import process_start_time
from plnt.reconciler.drivers.protocol import InstallRequest
from plnt.reconciler.errors import DriverError
from plnt.reconciler.state import Release, StateDir

from tests.conftest import EXAMPLE
from tests.e2e.harness import REVIEW

pytestmark = pytest.mark.integration

RECIPES = EXAMPLE / "recipes" / "review-responder"


def request(version: str, replicas: int, track: str = "canary", fingerprint: str = "sha256:" + "a" * 64,
            replicas_max: int | None = None) -> InstallRequest:
    directory = RECIPES / version
    return InstallRequest(namespace="default", name="rr", track=track, version=version, spec_fingerprint=fingerprint,
                          recipe_digest=directory_digest(directory), recipe_dir=str(directory), replicas=replicas,
                          replicas_max=replicas_max)


def alive(pid: int | None) -> bool:
    return pid is not None and process_start_time(pid) is not None


async def answering_pids(release: Release) -> list[int]:
    """The pid each replica's /healthz answers from (each is its own process)."""
    async with httpx.AsyncClient(trust_env=False) as client:
        answers = [(await client.get(f"{p.endpoint}/healthz")).json() for p in release.processes()]
    assert all(a["release"] == release.release_id for a in answers)
    return [p.pid for p in release.processes() if p.pid is not None]


@pytest.fixture
async def driver(tmp_path: Path):
    driver = LocalDriver(StateDir(tmp_path / "state"))
    yield driver
    await driver.shutdown()


async def stable_of(driver: LocalDriver, replicas: int) -> Release:
    await driver.install(request("1.2.0", replicas))
    return await driver.promote("default", "rr")


async def test_a_canary_runs_one_process_and_promote_starts_the_others(driver: LocalDriver) -> None:
    canary = await driver.install(request("1.2.0", 3))
    assert len(canary.processes()) == 1 and canary.replicas == 3
    stable = await driver.promote("default", "rr")
    processes = stable.processes()
    assert len(processes) == 3 and stable.pid == canary.pid, "the canary's process is the first replica"
    assert len({p.port for p in processes}) == 3 and len({p.pid for p in processes}) == 3
    assert all(alive(p.pid) for p in processes)
    await answering_pids(stable)
    assert (await driver.live())["default/rr"].stable == stable, "one record holds every replica"
    assert driver.is_running(stable)


async def test_promotion_retires_every_replica_of_the_old_stable(driver: LocalDriver) -> None:
    old = await stable_of(driver, 2)
    await driver.install(request("1.3.0", 2, fingerprint="sha256:" + "b" * 64))
    new = await driver.promote("default", "rr")
    assert len(new.processes()) == 2 and new.version == "1.3.0"
    assert not any(alive(p.pid) for p in old.processes())


@pytest.mark.parametrize(("running", "replicas_max", "promoted"), [
    (3, 4, 3),  # autoscaled to 3 under load: the new stable starts at 3, not at its floor of 1
    (3, 2, 2),  # the new spec's replicas.max bounds it
])
async def test_an_autoscaled_promotion_starts_at_the_count_the_old_stable_runs(
        driver: LocalDriver, running: int, replicas_max: int, promoted: int) -> None:
    await driver.install(request("1.2.0", 1, replicas_max=4))
    await driver.promote("default", "rr")
    old = await driver.set_replicas("default", "rr", running)  # what the autoscaler did under load
    await driver.install(request("1.3.0", 1, fingerprint="sha256:" + "b" * 64, replicas_max=replicas_max))
    new = await driver.promote("default", "rr")
    assert new.version == "1.3.0" and new.replicas == promoted and len(new.processes()) == promoted
    assert all(alive(p.pid) for p in new.processes())
    await answering_pids(new)
    assert not any(alive(p.pid) for p in old.processes())


async def test_a_fixed_count_promotion_starts_at_the_spec_floor(driver: LocalDriver) -> None:
    await stable_of(driver, 1)
    await driver.set_replicas("default", "rr", 3)  # by hand (plnt scale); the spec does not autoscale
    await driver.install(request("1.3.0", 1, fingerprint="sha256:" + "b" * 64))
    new = await driver.promote("default", "rr")
    assert new.replicas == 1 and len(new.processes()) == 1


async def test_scale_adds_and_stops_replicas_of_the_live_release(driver: LocalDriver) -> None:
    stable = await stable_of(driver, 1)
    up = await driver.set_replicas("default", "rr", 3)
    assert up.release_id == stable.release_id and up.replicas == 3 and up.pid == stable.pid
    assert len(up.processes()) == 3 and all(alive(p.pid) for p in up.processes())
    await answering_pids(up)
    assert await driver.set_replicas("default", "rr", 3) == up, "the same count again changes nothing"
    down = await driver.set_replicas("default", "rr", 1)
    assert [(p.pid, p.port) for p in down.processes()] == [(up.pid, up.port)], "the first stays, the others stop"
    assert not any(alive(p.pid) for p in up.processes()[1:])
    assert (await driver.live())["default/rr"].stable == down
    with pytest.raises(DriverError):
        await driver.set_replicas("default", "rr", 0)


async def test_a_scale_down_stops_the_idle_replica_not_the_busy_one(driver: LocalDriver) -> None:
    """review-responder 1.5.0 sleeps 0.6 s per invocation: the last of three replicas is kept busy
    (its GET /load says so) while the stable scales to two; the idle middle one is stopped, and
    every invocation on the busy one succeeds."""
    await driver.install(request("1.5.0", 3))
    stable = await driver.promote("default", "rr")
    first, idle, busy = stable.processes()
    answers: list[int] = []
    stop = asyncio.Event()
    async with httpx.AsyncClient(trust_env=False, timeout=30) as client:

        async def caller() -> None:
            while not stop.is_set():
                answers.append((await client.post(f"{busy.endpoint}/invoke", json=REVIEW)).status_code)

        callers = [asyncio.create_task(caller()) for _ in range(3)]
        try:
            async with asyncio.timeout(20):
                while (await client.get(f"{busy.endpoint}/load")).json()["inFlight"] < 3:
                    assert not answers or set(answers) == {200}, answers
                    await asyncio.sleep(0.02)
            down = await driver.set_replicas("default", "rr", 2)
        finally:
            stop.set()
            await asyncio.gather(*callers)
    assert [p.pid for p in down.processes()] == [first.pid, busy.pid], "the busy replica stays"
    assert not alive(idle.pid) and alive(busy.pid) and alive(first.pid)
    assert answers and set(answers) == {200}, answers


async def test_a_scale_needs_a_stable_release(driver: LocalDriver) -> None:
    await driver.install(request("1.2.0", 2))
    with pytest.raises(DriverError, match="no stable release"):
        await driver.set_replicas("default", "rr", 2)


async def test_repair_restarts_only_the_dead_replica(driver: LocalDriver) -> None:
    stable = await stable_of(driver, 3)
    first, second, third = stable.processes()
    os.kill(second.pid, signal.SIGKILL)  # type: ignore[arg-type]
    for _ in range(200):
        if not alive(second.pid):
            break
        await asyncio.sleep(0.01)
    drifted = await driver.drift()
    assert [r.release_id for r in drifted["default/rr"]] == [stable.release_id]
    [restored] = await driver.repair("default", "rr")
    again = restored.processes()
    assert again[0] == first and again[2] == third, "the replicas that ran were left alone"
    assert again[1].pid != second.pid and alive(again[1].pid) and again[1].port == second.port
    await answering_pids(restored)
    assert await driver.drift() == {}


async def test_resume_restarts_every_replica(tmp_path: Path, driver: LocalDriver) -> None:
    stable = await stable_of(driver, 2)
    await driver.shutdown()
    assert not any(alive(p.pid) for p in stable.processes())
    fresh = LocalDriver(StateDir(tmp_path / "state"))
    try:
        [resumed] = await fresh.resume()
        assert len(resumed.processes()) == 2 and all(alive(p.pid) for p in resumed.processes())
        await answering_pids(resumed)
        assert await fresh.stop_unrecorded() == [], "every replica is recorded"
    finally:
        await fresh.shutdown()


async def test_a_failed_replica_start_stops_the_ones_that_started(driver: LocalDriver, tmp_path: Path) -> None:
    stable = await stable_of(driver, 1)
    # Another process holds no port here; the replica fails on its recipe: the directory is gone.
    broken = stable.model_copy(update={"recipe_dir": str(tmp_path / "missing")})
    with pytest.raises(Exception):  # noqa: B017 (InvalidRecipe or DriverError: either way nothing is left)
        await driver._start_replicas(broken, range(1, 3))
    assert (await driver.live())["default/rr"].stable == stable
    assert await driver.stop_unrecorded() == []
