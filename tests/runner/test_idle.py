"""IdleParker (scale to zero) on its own, with a stand-in ASGI app (no sockets), and the parked
file as plnt reads it from a directory recipe code can write to."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import pytest
from plnt.core.parking import PARKED_FILE, read_parked, write_parked
from plnt.runner.idle import IdleParker


class StandInApp:
    """Answers every HTTP call after `delay` seconds (a lifespan call at once)."""

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.calls: list[str] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        self.calls.append(scope.get("path", scope["type"]))
        if scope["type"] == "http":
            await asyncio.sleep(self.delay)


async def serve(parker: IdleParker, path: str) -> None:
    await parker({"type": "http", "path": path}, None, None)


async def started(after_s: float, delay: float = 0.0) -> tuple[IdleParker, list[float]]:
    parks: list[float] = []
    loop = asyncio.get_running_loop()
    parker = IdleParker(StandInApp(delay), after_s, lambda: parks.append(loop.time()))
    await parker({"type": "lifespan"}, None, None)  # the server starts: the idle clock starts
    return parker, parks


async def parked_within(parks: list[float], seconds: float = 10.0) -> bool:
    """Waited for, not slept for: a busy machine fires timers late, never early."""
    deadline = asyncio.get_running_loop().time() + seconds
    while not parks and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.02)
    return bool(parks)


async def test_parks_after_the_idle_time_once() -> None:
    parker, parks = await started(0.1)
    t0 = asyncio.get_running_loop().time()
    assert await parked_within(parks)
    await asyncio.sleep(0.3)
    assert len(parks) == 1 and parks[0] - t0 >= 0.09 and parker.parked


async def test_health_checks_and_stats_are_not_activity() -> None:
    parker, parks = await started(0.2)
    deadline = asyncio.get_running_loop().time() + 10
    while not parks and asyncio.get_running_loop().time() < deadline:
        await serve(parker, "/healthz")
        await serve(parker, "/stats")
        await asyncio.sleep(0.02)
    assert parks, "only invocations keep a runner up"


async def test_each_invocation_restarts_the_idle_time() -> None:
    parker, parks = await started(1.0)
    for path in ("/invoke", "/chat", "/invoke", "/chat", "/invoke"):  # 0.5 s of invocations, 1 s apart at most
        await serve(parker, path)
        await asyncio.sleep(0.1)
    assert not parks
    assert await parked_within(parks)


async def test_an_invocation_in_flight_is_never_parked_under() -> None:
    parker, parks = await started(0.1, delay=0.5)
    await serve(parker, "/invoke")  # 0.5 s long: five idle times
    assert not parks and parker.in_flight == 0
    assert await parked_within(parks)


def test_the_idle_time_must_be_positive() -> None:
    with pytest.raises(ValueError):
        IdleParker(StandInApp(), 0, lambda: None)


def test_the_parked_file_names_the_process(tmp_path: Path) -> None:
    assert read_parked(tmp_path) is None
    write_parked(tmp_path, 30)
    assert read_parked(tmp_path) == os.getpid()
    assert json.loads((tmp_path / PARKED_FILE).read_text()) == {"pid": os.getpid(), "idleSeconds": 30}
    assert [p.name for p in tmp_path.iterdir()] == [PARKED_FILE], "no scratch file left"


@pytest.mark.parametrize("forge", ["symlink", "fifo", "directory", "not-json", "no-pid", "bool-pid", "huge"])
def test_a_parked_file_plnt_must_not_trust_or_block_on(tmp_path: Path, forge: str) -> None:
    target = tmp_path / PARKED_FILE
    if forge == "symlink":
        (tmp_path / "real.json").write_text(json.dumps({"pid": 1234}))
        target.symlink_to(tmp_path / "real.json")
    elif forge == "fifo":
        os.mkfifo(target)  # opened blocking, plnt would wait here forever
    elif forge == "directory":
        target.mkdir()
    elif forge == "not-json":
        target.write_text("{pid: 1234")
    elif forge == "no-pid":
        target.write_text(json.dumps({"idleSeconds": 3}))
    elif forge == "bool-pid":
        target.write_text(json.dumps({"pid": True}))
    else:
        target.write_text(" " * (1 << 20) + json.dumps({"pid": 1234}))  # read at most 4 KiB of it
    assert read_parked(tmp_path) is None
