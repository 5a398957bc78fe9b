"""plnt's embedded Temporal dev server (the real one) is started again when it exits under plnt.

Found in CI: a dev server answered, then exited within a second (`start-dev` picks free ports for its
internal services after plnt's check; another process can take one first) and `plnt up` waited on a
dead address. Here the server is SIGKILLed, as anything killing it would: it must come back on the
same address and database, and the client made before must work again without being rebuilt."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest
from plnt.reconciler.saga.temporal_server import TemporalDevServer, connect
from temporalio.client import WorkflowExecutionStatus

pytestmark = pytest.mark.integration


async def wait_for(condition: object, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"{what} within {timeout_s:.0f}s")


async def test_a_killed_dev_server_comes_back_on_its_address_with_its_history(tmp_path: Path) -> None:
    log_file = tmp_path / "temporal.log"
    server = TemporalDevServer(tmp_path / "temporal.db", log_file=log_file)
    address = await server.start()
    try:
        client = await connect(address)
        # A workflow no worker runs: it stays Running, in the database, for the server after the kill.
        handle = await client.start_workflow("NoSuchWorkflow", id="survives-restart", task_queue="nobody-polls")
        first_pid = server.pid
        assert first_pid is not None

        os.killpg(first_pid, signal.SIGKILL)
        await wait_for(lambda: server.restarts == 1 and server.pid not in (None, first_pid), 60,
                       f"the dev server not restarted (log: {log_file.read_text(errors='replace')[-800:]!r})")

        assert server.address == address
        description = await asyncio.wait_for(handle.describe(), 30)  # the same client, the same database
        assert description.status == WorkflowExecutionStatus.RUNNING
        assert (tmp_path / "temporal.pid").read_text().strip() == str(server.pid)
    finally:
        await server.stop()
    assert server.pid is None


async def test_stop_does_not_restart_it(tmp_path: Path) -> None:
    server = TemporalDevServer(tmp_path / "temporal.db", log_file=tmp_path / "temporal.log")
    await server.start()
    pid = server.pid
    assert pid is not None
    await server.stop()
    await asyncio.sleep(1.0)  # longer than the first backoff: a watcher still running would have spawned
    assert server.restarts == 0 and server.pid is None
    assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split(")")[-1][:3]
