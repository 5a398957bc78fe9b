"""Scale to zero with the local driver and real runner processes: an idle runner parks, plnt
records it parked (not drift), and `wake` starts the same release again on its port."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path

import httpx
import pytest
from plnt.core.parking import PARKED_FILE
from plnt.reconciler.drivers.local import LocalDriver
from plnt.reconciler.drivers.processes import process_start_time
from plnt.reconciler.state import Release, StateDir

from tests.reconciler.drivers.test_local_driver import request

pytestmark = pytest.mark.integration

PARK_S = 0.6
REVIEW = {"review": "great food", "brand_voice": "warm"}


def alive(pid: int | None) -> bool:
    return pid is not None and process_start_time(pid) is not None


def parking_driver(state: Path, after_s: float | None = PARK_S) -> LocalDriver:
    return LocalDriver(StateDir(state), park_after_for=lambda namespace, name, fingerprint: after_s)


async def gone(pid: int | None, within_s: float = 15.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        await asyncio.sleep(0.05)
    return False


@pytest.fixture
async def driver(tmp_path: Path):
    driver = parking_driver(tmp_path / "state")
    yield driver
    await driver.shutdown()


async def test_an_idle_runner_parks_is_not_drift_and_wakes_on_its_port(driver: LocalDriver, tmp_path: Path) -> None:
    release = await driver.install(request("1.2.0"))
    assert release.park_after_s == PARK_S and not release.parked
    async with httpx.AsyncClient(trust_env=False) as client:
        # Health checks (plnt's own, the gateway's stats) keep no runner up.
        deadline = time.monotonic() + 15
        while alive(release.pid) and time.monotonic() < deadline:
            try:
                await client.get(f"{release.endpoint}/healthz")
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.1)
    assert await gone(release.pid), "the runner did not park"
    log = (tmp_path / "state" / "runners" / f"{release.release_id}.log").read_text()
    assert "parked after 0.6s without an invocation" in log

    assert await driver.drift() == {}, "a parked runner is not drift"
    parked = (await driver.live())["default/rr"].canary
    assert parked is not None and parked.parked and parked.pid is None and parked.port == release.port
    assert await driver.repair("default", "rr") == [], "the heal leaves a parked runner parked"

    woken = await driver.wake("default", "rr", release.release_id)
    assert woken is not None and alive(woken.pid) and woken.pid != release.pid
    assert woken.port == release.port and woken.endpoint == release.endpoint and not woken.parked
    assert (await driver.live())["default/rr"].canary == woken
    async with httpx.AsyncClient(trust_env=False) as client:
        answer = await client.post(f"{woken.endpoint}/invoke", json=REVIEW)
    assert answer.status_code == 200 and answer.json()["release"] == release.release_id
    assert await driver.wake("default", "rr", release.release_id) == woken, "a running release is woken once"


async def test_invocations_keep_a_runner_up(tmp_path: Path) -> None:
    driver = parking_driver(tmp_path / "state", after_s=2.0)  # 1.8 s of slack on a busy machine
    try:
        release = await driver.install(request("1.2.0"))
        async with httpx.AsyncClient(trust_env=False) as client:
            deadline = time.monotonic() + 5.0
            while time.monotonic() < deadline:
                answer = await client.post(f"{release.endpoint}/invoke", json=REVIEW)
                assert answer.status_code == 200
                await asyncio.sleep(0.2)
        assert alive(release.pid), "a runner with an invocation every 0.2 s parked"
        assert await gone(release.pid), "then idle, it did not park"
    finally:
        await driver.shutdown()


async def test_concurrent_wakes_start_one_runner(driver: LocalDriver) -> None:
    release = await driver.install(request("1.2.0"))
    assert await gone(release.pid)
    woken = await asyncio.gather(*(driver.wake("default", "rr", release.release_id) for _ in range(6)))
    assert len({w.pid for w in woken if w is not None}) == 1 and all(w is not None for w in woken)


async def test_a_runner_that_died_is_drift_and_no_request_restarts_it(driver: LocalDriver) -> None:
    release = await driver.install(request("1.2.0"))
    os.kill(release.pid, signal.SIGKILL)
    assert await gone(release.pid)
    assert [r.release_id for r in (await driver.drift())["default/rr"]] == [release.release_id]
    assert await driver.wake("default", "rr", release.release_id) is None
    assert await driver.wake("default", "rr", "default.rr.9.9.9.nothing") is None, "an unknown release"


async def test_a_parked_file_naming_another_process_is_not_parking(driver: LocalDriver, tmp_path: Path) -> None:
    """Recipe code can write in its runner's directory: a file that names another pid, a symlink or
    a FIFO makes a dead runner drift as before (and never blocks plnt)."""
    release = await driver.install(request("1.2.0"))
    directory = tmp_path / "state" / "runners" / release.release_id
    os.kill(release.pid, signal.SIGSTOP)  # no parking of its own meanwhile
    try:
        for forge in ("other-pid", "symlink", "fifo"):
            (directory / PARKED_FILE).unlink(missing_ok=True)
            if forge == "other-pid":
                (directory / PARKED_FILE).write_text(json.dumps({"pid": release.pid + 1}))
            elif forge == "symlink":
                (tmp_path / "elsewhere.json").write_text(json.dumps({"pid": release.pid}))
                (directory / PARKED_FILE).symlink_to(tmp_path / "elsewhere.json")
            else:
                os.mkfifo(directory / PARKED_FILE)
            assert not driver._parking.parked_itself(release, alive_too=True), forge
    finally:
        os.kill(release.pid, signal.SIGKILL)
    assert await gone(release.pid)
    assert "default/rr" in await driver.drift()


async def test_a_parked_release_stays_parked_across_a_restart_of_plnt(tmp_path: Path) -> None:
    first = parking_driver(tmp_path / "state")
    try:
        release = await first.install(request("1.2.0"))
        assert await gone(release.pid)
        await first.drift()
    finally:
        await first.shutdown()
    again = parking_driver(tmp_path / "state")
    try:
        assert await again.resume() == []
        record = (await again.live())["default/rr"].canary
        assert record is not None and record.parked
        woken = await again.wake("default", "rr", release.release_id)
        assert woken is not None and alive(woken.pid) and woken.park_after_s == PARK_S
    finally:
        await again.shutdown()


async def test_no_runner_parks_unless_its_release_asks(tmp_path: Path) -> None:
    for driver in (LocalDriver(StateDir(tmp_path / "a")), parking_driver(tmp_path / "b", after_s=None)):
        try:
            release: Release = await driver.install(request("1.2.0"))
            argv = Path(f"/proc/{release.pid}/cmdline").read_bytes().split(b"\0")
            assert b"--park-after-idle-s" not in argv and release.park_after_s is None
        finally:
            await driver.shutdown()
