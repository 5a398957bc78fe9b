"""A reconcile pass with nothing changed skips re-planning, and anything the plan reads brings it back.

Real parts: a git repository, plnt's GitSource, the DriverSet over a LocalDriver reading real release
records, the StatusStore and the Reconciler. Stand-ins, said here: each release record's runner pid
is this test process (so the driver finds it running without starting runners), and there is no
Temporal client (nothing here starts a saga: a pass that would fails on it)."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from plnt.core.status import Phase
from plnt.reconciler.control.loop import Reconciler
from plnt.reconciler.drivers.driver_set import DriverSet
from plnt.reconciler.drivers.local import LocalDriver
from plnt.reconciler.drivers.processes import process_start_time
from plnt.reconciler.plan.diff import Action
from plnt.reconciler.settings import Settings
from plnt.reconciler.source.git import GitSource
from plnt.reconciler.state import LiveWorkflow, Release, StateDir, atomic_write_json
from plnt.reconciler.status_store import StatusStore

from tests.conftest import SpecRepo


def no_helm(backend: Any) -> Any:
    raise AssertionError("no Kubernetes backend here")


def in_sync(spec_repo: SpecRepo, tmp_path: Path) -> tuple[Reconciler, StatusStore, StateDir, DriverSet]:
    state = StateDir(tmp_path / "state").ensure()
    source = GitSource(str(spec_repo.path), state.source_clone)
    commit = source.fetch()
    specs, problems = source.load(commit)
    assert not problems
    statuses = StatusStore(state.status_file)
    pid = os.getpid()
    for port, run in enumerate(specs.workflow_runs.values(), start=20000):
        ns, name, version = run.metadata.namespace, run.metadata.name, run.spec.workflow.version
        release = Release(release_id=f"{name}-{version}", namespace=ns, name=name, track="stable", version=version,
                          spec_fingerprint=run.fingerprint(), recipe_digest="sha256:" + "0" * 64,
                          recipe_dir=str(state.recipes / name), endpoint=f"http://127.0.0.1:{port}",
                          pid=pid, pid_start=process_start_time(pid), port=port)
        atomic_write_json(state.releases / f"{ns}.{name}.json",
                          LiveWorkflow(namespace=ns, name=name, stable=release).model_dump(mode="json"))
        statuses.update(ns, name, phase=Phase.READY, version=version, observed_commit=commit,
                        message=f"{version} in sync", deployed_fingerprint=run.fingerprint(),
                        deployed_spec=run.spec.model_dump(mode="json", by_alias=True))
    driver = DriverSet(LocalDriver(state), state, make_helm=no_helm)
    reconciler = Reconciler(settings=Settings(repo=str(spec_repo.path), state_dir=state.root), source=source,
                            client=None, statuses=statuses, driver=driver, state=state)  # type: ignore[arg-type]
    return reconciler, statuses, state, driver


async def test_a_pass_with_nothing_changed_skips_the_plan_but_not_the_drift_check(
        spec_repo: SpecRepo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    reconciler, statuses, state, driver = in_sync(spec_repo, tmp_path)
    drifts = []
    real_drift = driver.drift

    async def drift() -> Any:
        drifts.append(1)
        return await real_drift()

    monkeypatch.setattr(driver, "drift", drift)

    first = await reconciler.reconcile_once()
    assert first and all(i.action is Action.UNCHANGED and not i.waiting for i in first)
    assert await reconciler.reconcile_once() == first
    assert (reconciler.plans_made, len(drifts)) == (1, 2)  # planned once, drift checked on both passes

    statuses.update("default", "review-responder", message="edited by hand")  # a status changed: plan again
    await reconciler.reconcile_once()
    assert reconciler.plans_made == 2
    assert statuses.get("default/review-responder").message == "1.2.0 in sync"  # type: ignore[union-attr]
    await reconciler.reconcile_once()
    assert reconciler.plans_made == 2

    record = state.releases / "default.review-responder.json"  # a release record changed (here: its port)
    live = LiveWorkflow.model_validate_json(record.read_text())
    assert live.stable is not None
    atomic_write_json(record, live.model_copy(update={"stable": live.stable.model_copy(update={"port": 20999})})
                      .model_dump(mode="json"))
    await reconciler.reconcile_once()
    assert reconciler.plans_made == 3

    spec_repo.write("notes.yaml.txt", "not a spec\n")  # a new commit, same specs: planned again
    spec_repo.commit("a new commit")
    await reconciler.reconcile_once()
    assert reconciler.plans_made == 4
    await reconciler.reconcile_once()
    assert (reconciler.plans_made, len(drifts)) == (4, 7)


class PassCounter:
    """Counts the loop's passes, fetches and drift checks (wrapping the real ones)."""

    def __init__(self, reconciler: Reconciler, driver: DriverSet, monkeypatch: pytest.MonkeyPatch) -> None:
        self.passes = self.fetches = self.drifts = 0
        self.ran = asyncio.Event()
        source, real_once, real_fetch, real_drift = reconciler._source, reconciler.reconcile_once, \
            reconciler._source.fetch, driver.drift

        def fetch() -> str:
            self.fetches += 1
            return real_fetch()

        async def drift() -> Any:
            self.drifts += 1
            return await real_drift()

        async def once(**kwargs: Any) -> Any:
            try:
                return await real_once(**kwargs)
            finally:
                self.passes += 1
                self.ran.set()

        monkeypatch.setattr(source, "fetch", fetch)
        monkeypatch.setattr(driver, "drift", drift)
        monkeypatch.setattr(reconciler, "reconcile_once", once)

    async def next_pass(self) -> None:
        self.ran.clear()
        await asyncio.wait_for(self.ran.wait(), 10)


@contextlib.asynccontextmanager
async def looping(spec_repo: SpecRepo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                  interval_s: float) -> AsyncIterator[tuple[Reconciler, PassCounter]]:
    """The reconciler's own loop, running on an in-sync repository, with its passes counted."""
    reconciler, _, _, driver = in_sync(spec_repo, tmp_path)
    reconciler._settings = reconciler._settings.model_copy(
        update={"source": reconciler._settings.source.model_copy(update={"interval_s": interval_s})})
    counter = PassCounter(reconciler, driver, monkeypatch)
    stop = asyncio.Event()
    loop = asyncio.create_task(reconciler._loop(stop))
    try:
        yield reconciler, counter
    finally:
        stop.set()
        await loop


async def test_a_pass_woken_by_a_saga_end_neither_fetches_nor_checks_drift(
        spec_repo: SpecRepo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async with looping(spec_repo, tmp_path, monkeypatch, interval_s=60.0) as (reconciler, counter):
        await counter.next_pass()
        assert (counter.fetches, counter.drifts) == (1, 1)  # the first pass is full
        reconciler._wake.set()  # what SagaLauncher does when a saga ends
        await counter.next_pass()
        assert (counter.passes, counter.fetches, counter.drifts) == (2, 1, 1)
        reconciler.wake()  # a webhook
        await counter.next_pass()
        assert (counter.passes, counter.fetches, counter.drifts) == (3, 2, 2)


async def test_saga_ends_that_keep_waking_the_loop_still_let_it_fetch_each_interval(
        spec_repo: SpecRepo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async with looping(spec_repo, tmp_path, monkeypatch, interval_s=0.4) as (reconciler, counter):
        deadline = asyncio.get_running_loop().time() + 2.0
        while asyncio.get_running_loop().time() < deadline:
            reconciler._wake.set()
            await asyncio.sleep(0.03)
    assert counter.passes > 10 and counter.fetches >= 3, vars(counter)
    assert counter.fetches < counter.passes / 2, vars(counter)


async def test_no_saga_starts_for_a_run_while_its_scale_in_place_is_under_way(
        spec_repo: SpecRepo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pass during a scale in place whose live read does not find the release (a Helm release
    mid-upgrade lists as pending) plans a self-heal, which must wait for the scale's end, not start a
    saga beside it. (No Temporal client here: a saga started would fail the pass.)"""
    reconciler, _, _, driver = in_sync(spec_repo, tmp_path)
    await reconciler.reconcile_once()
    upgrading = asyncio.Event()
    scaled: list[int] = []

    async def set_replicas(namespace: str, name: str, replicas: int) -> Release:
        await upgrading.wait()
        scaled.append(replicas)
        record = driver.local.record_of(namespace, name)
        assert record is not None and record.stable is not None
        return record.stable

    monkeypatch.setattr(driver, "set_replicas", set_replicas)
    spec_repo.replace("workflowruns/review-responder.yaml", "replicas: {min: 1, max: 1}", "replicas: {min: 2, max: 2}")
    spec_repo.commit("two replicas")
    items = {item.key: item for item in await reconciler.reconcile_once()}
    assert items["default/review-responder"].action is Action.SCALE

    real_live = driver.live

    async def mid_upgrade() -> dict[str, LiveWorkflow]:
        return {key: live for key, live in (await real_live()).items() if key != "default/review-responder"}

    monkeypatch.setattr(driver, "live", mid_upgrade)
    monkeypatch.setattr(driver, "drift", mid_upgrade)
    during = {item.key: item for item in await reconciler.reconcile_once()}
    assert during["default/review-responder"].needs_saga  # it reads as gone...
    assert reconciler.running_sagas == set()  # ...and no saga started while the scale runs
    upgrading.set()
    await asyncio.sleep(0.05)
    assert scaled == [2]
