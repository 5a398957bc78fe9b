"""Local replicas through `plnt up` (real Temporal, git, runner processes and gateway): a WorkflowRun with
`replicas.min: 2` serves from two runner processes; one SIGKILLed comes back while the other serves;
commits changing only `replicas.min` (2 -> 3 -> 1) scale the live release in place, no saga; a new
version is promoted at the spec's count (a two-replica stable too, both old processes retired); a
restarted plnt resumes every replica. Clients invoke through the gateway without pause all along: no
request fails.

The runners' model is MockBackend (`--backend mock`), a STAND-IN for a model server."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import httpx
import pytest
from plnt.reconciler.drivers.processes import process_start_time
from plnt.reconciler.state import Release

from tests.conftest import SpecRepo
from tests.e2e.harness import REVIEW, hook, running_plnt, settings_for, status_of, wait_for, wait_phase

pytestmark = pytest.mark.integration

RUN_FILE = "workflowruns/review-responder.yaml"


class SteadyLoad:
    """Clients invoking through the gateway without pause; every answer that is not a 200 is a failure."""

    def __init__(self, url: str) -> None:
        self.url, self.served, self.failures = url, 0, []
        self.stop = asyncio.Event()
        self.tasks: list[asyncio.Task[None]] = []

    async def _client(self) -> None:
        async with httpx.AsyncClient(base_url=self.url, trust_env=False, timeout=30) as client:
            while not self.stop.is_set():
                try:
                    response = await client.post("/workflows/review-responder/invoke", json=REVIEW)
                except httpx.HTTPError as exc:
                    self.failures.append(f"{type(exc).__name__}: {exc}")
                    continue
                if response.status_code == 200:
                    self.served += 1
                else:
                    self.failures.append(f"{response.status_code} {response.text[:200]}")

    def __enter__(self) -> SteadyLoad:
        self.tasks = [asyncio.create_task(self._client()) for _ in range(3)]
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()

    async def done(self) -> None:
        self.stop.set()
        await asyncio.gather(*self.tasks)
        assert not self.failures, f"{len(self.failures)} failed of {self.served + len(self.failures)}: {self.failures[:5]}"
        assert self.served > 0


def alive(pid: int | None) -> bool:
    return pid is not None and process_start_time(pid) is not None


def stable(plnt) -> Release:  # type: ignore[no-untyped-def]
    """review-responder's stable release as plnt's local driver records it."""
    record = plnt.driver.record_of("default", "review-responder")
    assert record is not None and record.stable is not None
    return record.stable


async def invocations(client: httpx.AsyncClient, release: Release) -> list[int]:
    """How many invocations each replica process ran (its own /stats)."""
    return [(await client.get(f"{p.endpoint}/stats")).json()["invocations"] for p in release.processes()]


async def test_replicas_serve_heal_scale_in_place_promote_and_resume(
    spec_repo: SpecRepo, tmp_path: Path, temporal_address: str, temporal_namespace: str
) -> None:
    spec_repo.replace(RUN_FILE, "replicas: {min: 1, max: 1}", "replicas: {min: 2, max: 2}")
    spec_repo.commit("review-responder runs two replicas")
    settings = settings_for(spec_repo.path, tmp_path / "state", temporal_address, temporal_namespace)

    async with running_plnt(settings) as plnt, httpx.AsyncClient(trust_env=False, timeout=30) as client:
        await wait_phase(plnt, "Ready", version="1.2.0")
        two = stable(plnt)
        assert len(two.processes()) == 2 and two.replicas == 2 and len({p.pid for p in two.processes()}) == 2
        for _ in range(20):
            assert (await client.post(f"{plnt.url}/workflows/review-responder/invoke", json=REVIEW)).status_code == 200
        assert all(n > 0 for n in await invocations(client, two)), "the gateway sends requests to both processes"
        rows = (await client.get(f"{plnt.url}/workflows")).json()
        row = next(r for r in rows if r["name"] == "review-responder")
        assert (row["replicasLive"], row["replicasDesired"]) == (2, 2)
        saga_id = status_of(plnt)["sagaId"]  # type: ignore[index]

        with SteadyLoad(plnt.url) as load:
            # A SIGKILLed replica: the other serves (a refused connect is retried on it), heal restarts it.
            killed = two.processes()[1]
            os.kill(killed.pid, signal.SIGKILL)  # type: ignore[arg-type]
            await hook(plnt)
            healed = await wait_for(lambda: (r := stable(plnt)).processes()[1].pid != killed.pid and r,
                                    timeout=30, what="the killed replica restarted")
            assert healed.processes()[0].pid == two.pid, "the replica that ran was left alone"
            assert all(alive(p.pid) for p in healed.processes())

            # Only the count changes: scaled in place, the same release, no saga.
            for count in (3, 1):
                spec_repo.replace(RUN_FILE, "replicas: {min: 3, max: 3}" if count == 1 else "replicas: {min: 2, max: 2}",
                                  f"replicas: {{min: {count}, max: {count}}}")
                spec_repo.commit(f"review-responder runs {count} replicas")
                await hook(plnt)
                scaled = await wait_for(lambda c=count: len((r := stable(plnt)).processes()) == c and r, timeout=30,
                                        what=f"{count} replicas")
                assert scaled.release_id == two.release_id and scaled.replicas == count
                assert all(alive(p.pid) for p in scaled.processes())
                await wait_for(lambda c=count: (s := status_of(plnt)) and s["replicas"]["min"] == c, timeout=15,
                               what=lambda: f"the scale in the status (now {status_of(plnt)})")
                assert status_of(plnt)["sagaId"] == saga_id, "a scale runs no saga"  # type: ignore[index]
            stopped = [p for p in healed.processes() if p.pid != two.pid]
            assert not any(alive(p.pid) for p in stopped), "scaled down: the surplus processes stopped"

            # A real change still runs the saga; its release is promoted at the spec's count.
            spec_repo.replace(RUN_FILE, "ref: review-responder@1.2.0", "ref: review-responder@1.3.0")
            spec_repo.replace(RUN_FILE, "replicas: {min: 1, max: 1}", "replicas: {min: 2, max: 2}")
            spec_repo.commit("review-responder 1.3.0 on two replicas")
            await hook(plnt)
            await wait_phase(plnt, "Ready", version="1.3.0", timeout=60)
            new = stable(plnt)
            assert new.version == "1.3.0" and len(new.processes()) == 2 and status_of(plnt)["sagaId"] != saga_id  # type: ignore[index]
            assert not alive(two.pid), "the old stable's replicas were retired"
            await asyncio.sleep(0.5)  # the new replicas serve a while under load
        await load.done()
        print(f"served={load.served} failed=0")

    # A restarted plnt resumes every replica of the release.
    assert not any(alive(p.pid) for p in new.processes())
    async with running_plnt(settings) as plnt:
        await wait_phase(plnt, "Ready", version="1.3.0")
        resumed = stable(plnt)
        assert resumed.release_id == new.release_id and len(resumed.processes()) == 2
        assert all(alive(p.pid) for p in resumed.processes())


async def test_a_two_replica_stable_is_promoted_to_a_new_version_under_load_without_a_failed_request(
    spec_repo: SpecRepo, tmp_path: Path, temporal_address: str, temporal_namespace: str
) -> None:
    """Both old replicas serve until the new release (two replicas, started before the routes
    change) takes over; both old processes are stopped after, and not one request fails."""
    spec_repo.replace(RUN_FILE, "replicas: {min: 1, max: 1}", "replicas: {min: 2, max: 2}")
    spec_repo.commit("review-responder runs two replicas")
    settings = settings_for(spec_repo.path, tmp_path / "state", temporal_address, temporal_namespace)

    async with running_plnt(settings) as plnt, httpx.AsyncClient(trust_env=False, timeout=30) as client:
        await wait_phase(plnt, "Ready", version="1.2.0")
        old = stable(plnt)
        assert len(old.processes()) == 2
        with SteadyLoad(plnt.url) as load:
            await asyncio.sleep(0.5)
            assert all(n > 0 for n in await invocations(client, old)), "both old replicas serve"
            spec_repo.replace(RUN_FILE, "ref: review-responder@1.2.0", "ref: review-responder@1.3.0")
            spec_repo.commit("review-responder 1.3.0")
            await hook(plnt)
            await wait_phase(plnt, "Ready", version="1.3.0", timeout=90)
            new = stable(plnt)
            assert new.version == "1.3.0" and len(new.processes()) == 2
            assert not {p.pid for p in new.processes()} & {p.pid for p in old.processes()}
            await wait_for(lambda: not any(alive(p.pid) for p in old.processes()), timeout=30,
                           what="both old replicas stopped")
            served_before = load.served
            await asyncio.sleep(0.5)  # the new replicas serve a while under load
            assert load.served > served_before
        await load.done()
        assert all(n > 0 for n in await invocations(client, new)), "both new replicas serve"
        print(f"served={load.served} failed=0")
