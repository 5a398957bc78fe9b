"""The autoscaler's loop (reconciler/control/autoscaler.py) against real runner processes: it reads
their GET /load, decides and calls the driver's replica count. The driver here is a stand-in (a list
of endpoints the test grows and shrinks): the local driver's replicas are tested end to end on plnt up
(tests/e2e/test_autoscale.py)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from plnt.reconciler.control.autoscaler import Autoscaler, ScaleTarget
from plnt.reconciler.drivers.processes import free_port, parse_load
from plnt.reconciler.plan.autoscale import ScalePolicy
from prometheus_client import CollectorRegistry

from tests.runner.helpers import write_recipe
from tests.runner.test_app import runner_command, wait_healthy
from tests.runner.test_load import SLOW


@pytest.mark.parametrize(("body", "load"), [
    (b'{"inFlight": 3, "waiting": 2}', 3), (b'{"inFlight": 0}', 0), (b'{"inFlight": -1}', None),
    (b'{"inFlight": true}', None), (b'{"inFlight": "3"}', None), (b"[3]", None), (b"not json", None), (b"", None),
])
def test_parse_load_takes_only_a_count(body: bytes, load: int | None) -> None:
    assert parse_load(body) == load


@pytest.fixture
def runners(tmp_path: Path) -> Iterator[list[str]]:
    recipe = write_recipe(tmp_path / "recipe", *SLOW)
    processes, endpoints = [], []
    try:
        for _ in range(3):
            port = free_port()
            processes.append((subprocess.Popen(runner_command(recipe, port), stdout=subprocess.DEVNULL,
                                               stderr=subprocess.PIPE, env={**os.environ, "PYTHONUNBUFFERED": "1"}), port))
            endpoints.append(f"http://127.0.0.1:{port}")
        for process, port in processes:
            wait_healthy(process, port)
        yield endpoints
    finally:
        for process, _ in processes:
            process.send_signal(signal.SIGTERM)
        for process, _ in processes:
            process.wait(timeout=10)


@pytest.mark.integration
async def test_the_loop_scales_up_on_real_load_and_down_after_the_window(runners: list[str]) -> None:
    running = runners[:1]
    calls: list[int] = []
    clock = [0.0]

    async def set_count(namespace: str, name: str, count: int) -> None:  # the stand-in driver
        calls.append(count)
        running[:] = runners[:count]

    policy = ScalePolicy(target_in_flight=2, min=1, max=3, scale_down_after_s=5)
    scaler = Autoscaler(lambda: [ScaleTarget("default", "slow", "r1", policy, tuple(running))], set_count,
                        clock=lambda: clock[0])
    registry = CollectorRegistry()
    scaler.register(registry)
    async with httpx.AsyncClient(trust_env=False, timeout=10) as http:
        load = [asyncio.create_task(http.post(f"{runners[0]}/invoke", json={"seconds": 1.5})) for _ in range(5)]
        for _ in range(100):
            if (await http.get(f"{runners[0]}/load")).json()["inFlight"] == 5:
                break
            await asyncio.sleep(0.01)
        [(_, up)] = await scaler.pass_once(http)
        assert (up.desired, calls, len(running)) == (3, [3], 3), up.reason  # ceil(5 / 2), at once
        assert registry.get_sample_value("plnt_replicas", {"namespace": "default", "name": "slow", "state": "desired"}) == 3
        assert registry.get_sample_value("plnt_replicas_in_flight", {"namespace": "default", "name": "slow"}) == 5
        assert registry.get_sample_value("plnt_autoscale_changes_total",
                                         {"namespace": "default", "name": "slow", "direction": "up"}) == 1
        assert [r.status_code for r in await asyncio.gather(*load)] == [200] * 5
        clock[0] = 1.0
        [(_, low)] = await scaler.pass_once(http)
        assert (low.desired, calls) == (3, [3]) and "down in" in low.reason  # the window starts
        clock[0] = 6.0
        [(_, down)] = await scaler.pass_once(http)
        assert (down.desired, calls) == (2, [3, 2])
        assert scaler.view("default/slow").public() == {"running": 2, "desired": 2, "inFlight": 0,
                                                        "reason": down.reason}
        # A replica that does not answer: its load is unknown, and nothing scales down.
        running[:] = [runners[0], f"http://127.0.0.1:{free_port()}"]  # nothing listens there
        clock[0] = 100.0
        [(_, unknown)] = await scaler.pass_once(http)
        assert (unknown.desired, calls) == (2, [3, 2]) and "unknown" in unknown.reason
