"""Placement across a pool of local backends through `plnt up` (real Temporal, git, runner processes
and gateway): a WorkflowRun with `backend: {selector}` and `replicas.min: 2` spreads one replica on
each of two PlntBackends (the release record names each process's backend); the gateway sends
requests to both; lowering one backend's `capacity.replicas` to 0 in git moves its replica to the
other in place (no saga, no failed request); asking for more replicas than the pool holds fails
with the missing capacity named while the placed release keeps serving. A held run (its newest spec
failed) is moved likewise, as the spec its stable serves.

The runners' model is MockBackend (`--backend mock`), a STAND-IN for a model server."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import httpx
import pytest
from plnt.reconciler.app import Plnt
from plnt.reconciler.settings import Settings
from plnt.reconciler.state import Release

from tests.conftest import SpecRepo
from tests.e2e.harness import REVIEW, hook, running_plnt, settings_for, status_of, wait_for, wait_phase
from tests.e2e.test_replicas import SteadyLoad, alive, invocations, stable

pytestmark = pytest.mark.integration

RUN_FILE = "workflowruns/review-responder.yaml"
POOL = """\
apiVersion: plnt.work/v1
kind: PlntBackend
metadata: {name: east, labels: {pool: agents, zone: east}}
spec: {type: local, capacity: {replicas: 2}}
---
apiVersion: plnt.work/v1
kind: PlntBackend
metadata: {name: west, labels: {pool: agents, zone: west}}
spec: {type: local, capacity: {replicas: 1}}
"""


def on_the_pool(spec_repo: SpecRepo, tmp_path: Path, temporal_address: str, temporal_namespace: str) -> Settings:
    """review-responder on the agents pool with two replicas, committed; `plnt up`'s settings."""
    spec_repo.write("backends/pool.yaml", POOL)
    spec_repo.replace(RUN_FILE, "    cluster: local", "    selector: {matchLabels: {pool: agents}}")
    spec_repo.replace(RUN_FILE, "replicas: {min: 1, max: 1}", "replicas: {min: 2, max: 2}")
    spec_repo.commit("review-responder on the agents pool, two replicas")
    return settings_for(spec_repo.path, tmp_path / "state", temporal_address, temporal_namespace)


async def west_fills_up(spec_repo: SpecRepo, plnt: Plnt, spread: Release) -> Release:
    """west's capacity lowered to 0 in git: its replica of `spread` moves to east in place (the same
    release, no saga) and the one on west stops. Returns the stable release after the move."""
    on_west = next(p for p in spread.processes() if p.backend == "west")
    spec_repo.replace("backends/pool.yaml", "capacity: {replicas: 1}", "capacity: {replicas: 0}")
    spec_repo.commit("west is full")
    await hook(plnt)
    moved = await wait_for(lambda: (r := stable(plnt)).placement == {"east": 2} and r, timeout=30,
                           what=lambda: f"the replica moved to east (now {stable(plnt).placement})")
    assert moved.release_id == spread.release_id and [p.backend for p in moved.processes()] == ["east", "east"]
    await wait_for(lambda: not alive(on_west.pid), timeout=30, what="the replica on west stopped")
    return moved


async def test_a_pool_spreads_serves_moves_and_refuses_what_does_not_fit(
    spec_repo: SpecRepo, tmp_path: Path, temporal_address: str, temporal_namespace: str
) -> None:
    settings = on_the_pool(spec_repo, tmp_path, temporal_address, temporal_namespace)

    async with running_plnt(settings) as plnt, httpx.AsyncClient(trust_env=False, timeout=30) as client:
        await wait_phase(plnt, "Ready", version="1.2.0", timeout=60)
        spread = stable(plnt)
        processes = spread.processes()
        assert spread.placement == {"east": 1, "west": 1} and spread.replicas == 2
        assert sorted(p.backend for p in processes) == ["east", "west"]
        assert len({p.port for p in processes}) == 2 and all(alive(p.pid) for p in processes)
        saga_id = status_of(plnt)["sagaId"]  # type: ignore[index]
        for _ in range(20):
            response = await client.post(f"{plnt.url}/workflows/review-responder/invoke", json=REVIEW)
            assert response.status_code == 200, response.text
        assert all(n > 0 for n in await invocations(client, spread)), "both backends' replicas serve"

        with SteadyLoad(plnt.url) as load:
            # west's capacity lowered to 0 in git: its replica moves to east (started there before the
            # one on west leaves the routes and drains), the same release, no saga.
            moved = await west_fills_up(spec_repo, plnt, spread)
            assert all(alive(p.pid) for p in moved.processes())
            assert status_of(plnt)["sagaId"] == saga_id, "a move runs no saga"  # type: ignore[index]

            # Three replicas do not fit in 2 + 0: nothing is deployed, the missing capacity is named,
            # and the two replicas on east keep serving.
            spec_repo.replace(RUN_FILE, "replicas: {min: 2, max: 2}", "replicas: {min: 3, max: 3}")
            spec_repo.commit("three replicas")
            await hook(plnt)
            missing = "needs 1 more replica slot: selector pool=agents has 0 free (east: 0 of 2, west: 0 of 0)"
            await wait_for(lambda: (status_of(plnt) or {}).get("lastError") == f"cannot be placed: {missing}",
                           timeout=30, what=lambda: f"the missing capacity in the status (now {status_of(plnt)})")
            row = status_of(plnt)
            assert row is not None and row["phase"] == "Ready" and row["version"] == "1.2.0"
            assert stable(plnt).placement == {"east": 2} and len(stable(plnt).processes()) == 2
            await asyncio.sleep(0.5)  # the placed replicas serve a while under load
        await load.done()
        print(f"served={load.served} failed=0")


async def test_a_held_runs_stable_is_re_placed_as_the_spec_it_serves(
    spec_repo: SpecRepo, tmp_path: Path, temporal_address: str, temporal_namespace: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A pool's run whose newest spec failed (1.4.0 rolled back: held until a commit changes it) keeps its
    stable 1.2.0 on the pool; when west fills up, that stable moves to east in place, placed as the spec
    it serves, while the spec in git stays held (no saga, the status RolledBack with 1.4.0's error).
    Before, a held run was not moved at all; and recording the held spec as deployed would have made
    the next pass take 1.2.0 for drift and "restore" it to 1.4.0."""
    caplog.set_level(logging.INFO, logger="plnt.reconciler.control.loop")
    settings = on_the_pool(spec_repo, tmp_path, temporal_address, temporal_namespace)

    async with running_plnt(settings) as plnt, httpx.AsyncClient(trust_env=False, timeout=30) as client:
        await wait_phase(plnt, "Ready", version="1.2.0", timeout=60)
        spread = stable(plnt)
        assert spread.placement == {"east": 1, "west": 1}
        spec_repo.replace(RUN_FILE, "review-responder@1.2.0", "review-responder@1.4.0")
        spec_repo.commit("try 1.4.0")
        await hook(plnt)
        rolled = await wait_phase(plnt, "RolledBack", timeout=90)
        saga_id, error = rolled["sagaId"], rolled["lastError"]
        assert rolled["version"] == "1.2.0" and error

        await west_fills_up(spec_repo, plnt, spread)
        for _ in range(10):
            response = await client.post(f"{plnt.url}/workflows/review-responder/invoke", json=REVIEW)
            assert response.status_code == 200, response.text
        # Several passes later the spec in git is still held: no saga restored 1.4.0 as "drift".
        for _ in range(3):
            await hook(plnt)
            await asyncio.sleep(0.5)
        row = status_of(plnt)
        assert row is not None and (row["phase"], row["version"], row["sagaId"], row["lastError"]) == (
            "RolledBack", "1.2.0", saga_id, error), row
        assert row["message"].startswith("held: this spec already failed"), row
        assert "re-placed: east 1, west 1 -> east 2; the spec in git stays held, 1.2.0 serves on" in caplog.text
        assert stable(plnt).release_id == spread.release_id

        # A commit that changes the spec is rolled out as ever, where the pool has room now.
        spec_repo.replace(RUN_FILE, "review-responder@1.4.0", "review-responder@1.3.0")
        spec_repo.commit("1.3.0 instead")
        await hook(plnt)
        await wait_phase(plnt, "Ready", version="1.3.0", timeout=90)
        assert stable(plnt).placement == {"east": 2}
