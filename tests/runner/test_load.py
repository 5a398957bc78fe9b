"""A runner's load (runner/load.py): the invocations it serves right now, on GET /load and as the
Prometheus gauge the charts' HPA scales on. On a real runner process, with a recipe step that sleeps."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
from pathlib import Path

import httpx
import pytest
from plnt.reconciler.drivers.processes import free_port
from prometheus_client.parser import text_string_to_metric_families

from tests.runner.helpers import write_recipe
from tests.runner.test_app import runner_command, wait_healthy

SLOW = ("- {id: slow, tool: python}\n",
        "import asyncio\nasync def slow(ctx):\n    await asyncio.sleep(float(ctx.inputs.get('seconds', 0.6)))\n"
        "    return 'slept'\n")


def gauges(text: str) -> dict[str, float]:
    return {sample.name: sample.value for family in text_string_to_metric_families(text) for sample in family.samples}


@pytest.mark.integration
@pytest.mark.parametrize("park", [False, True], ids=["plain", "scale-to-zero"])
async def test_load_counts_invocations_in_flight_and_nothing_else(tmp_path: Path, park: bool) -> None:
    recipe = write_recipe(tmp_path / "recipe", *SLOW)
    port = free_port()
    extra = ("--park-after-idle-s", "300") if park else ()
    process = subprocess.Popen(runner_command(recipe, port, *extra), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               cwd=tmp_path, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    base = f"http://127.0.0.1:{port}"
    try:
        await asyncio.to_thread(wait_healthy, process, port)
        async with httpx.AsyncClient(base_url=base, trust_env=False, timeout=10) as http:
            assert (await http.get("/load")).json() == {"inFlight": 0, "waiting": 0}
            calls = [asyncio.create_task(http.post("/invoke", json={"seconds": 1.0})) for _ in range(3)]
            calls.append(asyncio.create_task(http.post("/chat", json={"messages": [{"role": "user", "content": "x"}]})))
            during: dict[str, int] = {}
            for _ in range(100):  # until the four have arrived (health checks and /stats are not counted)
                await http.get("/healthz")
                during = (await http.get("/load")).json()
                if during["inFlight"] == 4:
                    break
                await asyncio.sleep(0.01)
            metrics = await http.get("/metrics")
            answers = await asyncio.gather(*calls)
            after = (await http.get("/load")).json()
            final = gauges((await http.get("/metrics")).text)
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=10)
    assert [a.status_code for a in answers] == [200] * 4
    assert during == {"inFlight": 4, "waiting": 0}
    assert metrics.headers["content-type"].startswith("text/plain")
    assert gauges(metrics.text)["plnt_runner_in_flight_requests"] == 4
    assert after == {"inFlight": 0, "waiting": 0}
    assert final == {"plnt_runner_in_flight_requests": 0, "plnt_runner_invocations_total": 4}
