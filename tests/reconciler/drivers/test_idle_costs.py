"""What an idle reconcile pass skips, and that it still sees every change.

With 1,000 releases an idle pass must not cost 1,000 of anything: the local driver reuses its
snapshot of the release records while their directory is unchanged (and settled), reads a running
child's start time once, and DriverSet.assign skips the spec set it assigned last. Real files and
real processes (a `sleep` child stands in for a runner: only its pid and liveness matter here).
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
from plnt.core.specs.loader import SourceFile, load_sources
from plnt.reconciler.drivers import processes
from plnt.reconciler.drivers.driver_set import DriverSet
from plnt.reconciler.drivers.local import LocalDriver
from plnt.reconciler.drivers.processes import process_start_time
from plnt.reconciler.state import LiveWorkflow, Release, StateDir, atomic_write_json

from tests.core.test_loader import BACKEND, RUN


def record(state: StateDir, name: str, version: str = "1.0.0", pid: int | None = None,
           start: str | None = None) -> Release:
    release = Release(release_id=f"{name}-{version}", namespace="default", name=name, track="stable",
                      version=version, spec_fingerprint="sha256:" + "0" * 64, recipe_digest="sha256:" + "0" * 64,
                      recipe_dir="/nonexistent", endpoint="http://127.0.0.1:1", pid=pid, pid_start=start, port=1)
    atomic_write_json(state.releases / f"default.{name}.json",
                      LiveWorkflow(namespace="default", name=name, stable=release).model_dump(mode="json"))
    return release


def settle(directory: Path) -> None:
    """Date the directory's last change 10 s back, as if written then (the snapshot trusts it)."""
    past = time.time_ns() - 10_000_000_000
    os.utime(directory, ns=(past, past))


@pytest.fixture
def counted(tmp_path: Path) -> tuple[LocalDriver, StateDir]:
    state = StateDir(tmp_path / "state").ensure()
    return LocalDriver(state), state


def test_a_settled_release_directory_is_not_scanned_again(counted: tuple[LocalDriver, StateDir]) -> None:
    driver, state = counted
    record(state, "a")
    settle(state.releases)
    assert set(driver.snapshot()) == {"default/a"} and driver.record_scans == 1
    for _ in range(3):
        assert set(driver.snapshot()) == {"default/a"}
    assert driver.record_scans == 1, "an unchanged directory is one stat, not a scan"


def test_every_change_to_the_records_is_seen(counted: tuple[LocalDriver, StateDir]) -> None:
    driver, state = counted
    record(state, "a")
    settle(state.releases)
    driver.snapshot()
    record(state, "b")  # added
    assert set(driver.snapshot()) == {"default/a", "default/b"}
    settle(state.releases)
    driver.snapshot()
    record(state, "a", version="2.0.0")  # replaced
    assert driver.snapshot()["default/a"].stable.version == "2.0.0"  # type: ignore[union-attr]
    settle(state.releases)
    driver.snapshot()
    (state.releases / "default.b.json").unlink()  # removed
    assert set(driver.snapshot()) == {"default/a"}


def test_a_directory_changed_just_now_is_scanned_every_time(counted: tuple[LocalDriver, StateDir]) -> None:
    """A change in the same clock tick as a scan could keep the directory's mtime: not trusted yet."""
    driver, state = counted
    record(state, "a")
    driver.snapshot()
    driver.snapshot()
    assert driver.record_scans == 2


def test_a_returned_snapshot_can_be_changed_by_its_caller(counted: tuple[LocalDriver, StateDir]) -> None:
    driver, state = counted
    record(state, "a")
    settle(state.releases)
    driver.snapshot().clear()
    assert set(driver.snapshot()) == {"default/a"}


@pytest.mark.integration  # starts a process (`sleep`), standing in for a runner
def test_a_running_child_is_checked_without_reading_proc_each_time(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    state = StateDir(tmp_path / "state").ensure()
    driver = LocalDriver(state)
    child = subprocess.Popen(["sleep", "60"])
    try:
        start = process_start_time(child.pid)
        driver._processes.track(child)  # as _start registers the runners it starts
        reads: list[int] = []

        def counting(pid: int) -> str | None:
            reads.append(pid)
            return process_start_time(pid)

        monkeypatch.setattr(processes, "process_start_time", counting)
        release = record(state, "a", pid=child.pid, start=start)
        assert all(driver.is_running(release) for _ in range(5))
        assert len(reads) == 1
        assert not driver.is_running(release.model_copy(update={"pid_start": "1"})), "another process on that pid"
        child.kill()
        deadline = time.monotonic() + 30
        while driver.is_running(release) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not driver.is_running(release)
        assert [r for r in driver.snapshot().values() if not driver.is_running(r.stable)]  # type: ignore[arg-type]
    finally:
        child.kill()
        child.wait()


def test_a_stranger_process_is_still_read_from_proc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A runner left by an earlier plnt is not this driver's child: its start time is read every check."""
    driver = LocalDriver(StateDir(tmp_path / "state").ensure())
    reads: list[int] = []
    monkeypatch.setattr(processes, "process_start_time", lambda pid: reads.append(pid) or process_start_time(pid))
    release = record(driver._state, "a", pid=os.getpid(), start=process_start_time(os.getpid()))
    assert driver.is_running(release) and driver.is_running(release)
    assert len(reads) == 2


def test_assign_sets_a_run_back_after_a_saga_moved_it(tmp_path: Path) -> None:
    """assign() of the spec set it assigned last is skipped, unless remember() changed something since."""
    other = BACKEND.replace("name: local", "name: other").replace("spec: {type: local}",
                                                                  "spec: {type: local, runnerLimits: {memoryMiB: 512}}")
    specs, problems = load_sources([SourceFile("b.yaml", BACKEND), SourceFile("o.yaml", other),
                                    SourceFile("r.yaml", RUN)])
    assert problems == []
    state = StateDir(tmp_path / "state").ensure()
    drivers = DriverSet(LocalDriver(state), state, lambda backend, lookup: None)  # type: ignore[arg-type,return-value]
    run = specs.workflow_runs["default/review-responder"]
    drivers.assign(specs)
    assert drivers.runner_limits("default", "review-responder").memory_mi_b == 2048
    drivers.remember(run, specs.backends["other"])  # a saga of another commit placed it elsewhere
    assert drivers.runner_limits("default", "review-responder").memory_mi_b == 512
    drivers.assign(specs)
    assert drivers.runner_limits("default", "review-responder").memory_mi_b == 2048


async def test_a_saga_step_reads_its_own_record_not_every_record(
        counted: tuple[LocalDriver, StateDir]) -> None:
    """DriverSet.live_of with only local runners: the run's one record file, no scan; the same
    answer as live() gives (None for a run without releases)."""
    driver, state = counted
    for name in ("a", "b", "c"):
        record(state, name)
    drivers = DriverSet(driver, state, make_helm=lambda backend, specs: None)  # type: ignore[arg-type,return-value]
    one = await drivers.live_of("default", "b")
    assert driver.record_scans == 0, "no scan of the release records"
    assert one is not None and one == (await drivers.live())["default/b"]
    assert await drivers.live_of("default", "missing") is None
