"""The pieces of the split roles, one at a time: the file lease, the workers' runner reports on the
reconciler's side, and the DriverSet holding plans while no worker has reported."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from plnt.reconciler.control.lease import FileLease
from plnt.reconciler.drivers.driver_set import DriverSet
from plnt.reconciler.drivers.reported import ReportedRunners, RunnerReport, RunnerReporter, RunnerReportReply
from plnt.reconciler.errors import DriverError
from plnt.reconciler.state import LiveWorkflow, Release, StateDir

from tests.fake_driver import FakeDriver


def release(track: str = "stable", version: str = "1.0.0") -> Release:
    return Release(release_id=f"default.wf.{version}.abc", namespace="default", name="wf", track=track,
                   version=version, spec_fingerprint="sha256:" + "0" * 64, recipe_digest="sha256:" + "1" * 64,
                   recipe_dir="/r", endpoint="http://127.0.0.1:9", pid=1)


def live(*releases: Release) -> dict[str, LiveWorkflow]:
    return {"default/wf": LiveWorkflow(namespace="default", name="wf",
                                       **{r.track: r for r in releases})}


# --- FileLease -----------------------------------------------------------------------------------


async def test_file_lease_second_replica_waits_until_the_first_releases(tmp_path: Path) -> None:
    path = tmp_path / "reconciler.lease"
    first, second = FileLease(path, identity="a", poll_s=0.05), FileLease(path, identity="b", poll_s=0.05)
    stop = asyncio.Event()
    assert await first.acquire(stop)
    assert path.read_text().strip() == "a"
    waiting = asyncio.create_task(second.acquire(stop))
    await asyncio.sleep(0.3)
    assert not waiting.done(), "the second replica must wait while the first holds the lease"
    await first.release()
    assert await asyncio.wait_for(waiting, 5)
    assert second.held and path.read_text().strip() == "b"
    await second.release()


async def test_file_lease_acquire_returns_false_when_stopped(tmp_path: Path) -> None:
    path = tmp_path / "reconciler.lease"
    holder = FileLease(path, identity="a")
    assert await holder.acquire(asyncio.Event())
    stop = asyncio.Event()
    waiting = asyncio.create_task(FileLease(path, identity="b", poll_s=0.05).acquire(stop))
    await asyncio.sleep(0.1)
    stop.set()
    assert await asyncio.wait_for(waiting, 5) is False
    await holder.release()


@pytest.mark.integration
async def test_file_lease_is_freed_when_its_holder_is_killed(tmp_path: Path) -> None:
    """A reconciler killed with SIGKILL never blocks the next one: the kernel drops its lock."""
    path = tmp_path / "reconciler.lease"
    code = ("import asyncio, sys; from pathlib import Path; from plnt.reconciler.control.lease import FileLease\n"
            "async def main():\n"
            f"    assert await FileLease(Path({str(path)!r}), identity='doomed').acquire(asyncio.Event())\n"
            "    print('held', flush=True); await asyncio.sleep(60)\n"
            "asyncio.run(main())\n")
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == b"held"
        lease = FileLease(path, identity="next", poll_s=0.05)
        stop = asyncio.Event()
        waiting = asyncio.create_task(lease.acquire(stop))
        await asyncio.sleep(0.2)
        assert not waiting.done()
        holder.kill()
        assert await asyncio.wait_for(waiting, 5)
        await lease.release()
    finally:
        holder.kill()
        holder.wait()


# --- ReportedRunners (the reconciler's side) ------------------------------------------------------


async def test_reported_runners_are_unknown_until_a_worker_reports_then_hold_its_releases() -> None:
    changes: list[int] = []
    runners = ReportedRunners(on_change=lambda: changes.append(1))
    assert runners.unknown_reason() is not None and await runners.live() == {}
    runners.accept(RunnerReport(worker="w1", live=live(release())))
    assert runners.unknown_reason() is None
    assert (await runners.live())["default/wf"].stable == release()
    runners.accept(RunnerReport(worker="w1", live=live(release())))
    assert changes == [1], "an identical report is not a change"
    runners.accept(RunnerReport(worker="w1", live={}))
    assert await runners.live() == {} and changes == [1, 1]


async def test_drift_repair_is_asked_once_and_answered_in_the_next_report_reply() -> None:
    runners = ReportedRunners()
    gone = release()
    runners.accept(RunnerReport(worker="w1", live=live(gone), drift={"default/wf": [gone]}))
    assert await runners.drift() == {"default/wf": [gone]}
    assert await runners.repair("default", "wf") == [gone]
    assert await runners.repair("default", "wf") == [], "asked already: not asked twice"
    reply = runners.accept(RunnerReport(worker="w1", live=live(gone), drift={"default/wf": [gone]}))
    assert reply == RunnerReportReply(repair=["default/wf"])
    assert runners.accept(RunnerReport(worker="w1", live=live(gone))) == RunnerReportReply()


async def test_a_placement_is_asked_in_each_reply_until_the_workers_report_shows_it() -> None:
    runners = ReportedRunners()
    spread = release().model_copy(update={"placement": {"east": 1, "west": 1}, "replicas": 2, "backend": "east"})
    spread = spread.with_processes([spread, spread.model_copy(update={"pid": 2, "backend": "west"})])
    runners.accept(RunnerReport(worker="w1", live=live(spread)))
    assert await runners.place_replicas("default", "wf", {"east": 2, "west": 0}) == spread
    asked = RunnerReportReply(place={"default/wf": {"east": 2}})
    assert runners.accept(RunnerReport(worker="w1", live=live(spread))) == asked
    assert runners.accept(RunnerReport(worker="w1", live=live(spread))) == asked, "asked again until it shows"
    moved = spread.model_copy(update={"placement": {"east": 2}}).with_processes(
        [spread, spread.model_copy(update={"pid": 3, "backend": "east"})])
    assert runners.accept(RunnerReport(worker="w1", live=live(moved))) == RunnerReportReply(), "shown: asked no more"
    with pytest.raises(DriverError, match="no stable release reported"):
        await ReportedRunners().place_replicas("default", "wf", {"east": 1})


async def test_reconciler_side_refuses_to_install_local_runners() -> None:
    from plnt.reconciler.errors import DriverError

    with pytest.raises(DriverError, match="plnt worker"):
        await ReportedRunners().promote("default", "wf")


def test_driver_set_holds_plans_for_local_workflowruns_until_a_worker_reports(tmp_path: Path) -> None:
    runners = ReportedRunners()
    drivers = DriverSet(runners, StateDir(tmp_path).ensure(), make_helm=lambda backend, specs: None)  # type: ignore[arg-type,return-value]
    why = drivers.live_unknown("default/wf")
    assert why is not None and "no worker has reported" in why
    runners.accept(RunnerReport(worker="w1"))
    assert drivers.live_unknown("default/wf") is None


# --- RunnerReporter (the worker's side), against an httpx MockTransport stand-in -------------------


async def test_reporter_sends_the_token_and_heals_what_the_reply_asks_against_a_fake_control_api() -> None:
    seen: list[httpx.Request] = []

    def control(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        report = RunnerReport.model_validate_json(request.content)
        return httpx.Response(200, json={"repair": sorted(report.drift)})

    local = FakeDriver(records=live(release()), drifted={"default/wf": [release()]})  # drifted until repaired
    reporter = RunnerReporter(worker="w1", control_url="http://control.test", token="s3cret", local=local,
                              interval_s=0.05, transport=httpx.MockTransport(control))
    stop = asyncio.Event()
    task = asyncio.create_task(reporter.run(stop))
    deadline = time.monotonic() + 5
    while not local.called("repair") or len(seen) < 3:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)
    stop.set()
    await asyncio.wait_for(task, 5)
    assert local.called("repair") == [("default", "wf")]
    assert seen[0].method == "PUT" and seen[0].url.path == "/internal/runners"
    assert seen[0].headers["authorization"] == "Bearer s3cret"
    assert RunnerReport.model_validate_json(seen[-1].content).drift == {}


async def test_reporter_backs_off_when_the_control_api_is_down_and_recovers(caplog: pytest.LogCaptureFixture) -> None:
    """Against a fake control API (httpx MockTransport) that refuses, then answers."""
    caplog.set_level(logging.INFO)
    calls: list[float] = []
    up = False

    def control(request: httpx.Request) -> httpx.Response:
        calls.append(time.monotonic())
        if not up:
            raise httpx.ConnectError("refused")
        return httpx.Response(200, json={"repair": []})

    reporter = RunnerReporter(worker="w1", control_url="http://control.test", token="s3cret", local=FakeDriver(records=live(release())),
                              interval_s=0.05, transport=httpx.MockTransport(control))
    stop = asyncio.Event()
    task = asyncio.create_task(reporter.run(stop))
    deadline = time.monotonic() + 30  # give up waiting only
    while len(calls) < 4:
        assert time.monotonic() < deadline, f"{len(calls)} attempts: the reporter stopped retrying"
        await asyncio.sleep(0.02)
    # A backoff: after the k-th failure it waits at least interval * 2**k / 2 (doubling, jitter 0.5..1).
    # Lower bounds only (a wait is never shorter on a busy machine); without a backoff gap 3 is 0.05 s.
    gaps = [b - a for a, b in zip(calls, calls[1:4], strict=False)]
    assert all(gap >= 0.05 * 2**k - 0.01 for k, gap in enumerate(gaps)), f"not a backoff: gaps {gaps}"
    assert reporter.unreachable_since is not None
    up = True
    deadline = time.monotonic() + 10
    while reporter.unreachable_since is not None:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)
    stop.set()
    await asyncio.wait_for(task, 5)
    logged = caplog.text
    assert logged.count("control-unreachable") == 1 and "control-reachable" in logged
    assert "s3cret" not in logged


async def test_a_workers_drain_of_a_helm_release_asks_the_control_plane_to_take_it_out_of_the_routes() -> None:
    """The worker's request (RunnerReporter.drain with `leaving`) against the control plane's real
    POST /internal/drain (add_control_routes, in process through httpx's ASGI transport): the endpoint
    reaches the control plane's `leaving` hook before its drain waits, and the answer says drained once
    the published routes no longer name it (no gateway follows here). A drain of a local runner the
    worker stops does not ask that (its reports already left it out)."""
    from plnt.core.auth import TokenSet
    from plnt.core.routes import Backend, Route, RouteTable
    from plnt.gateway.app import create_app
    from plnt.gateway.route_watch import RoutePublisher, add_control_routes
    from plnt.gateway.router import Router

    canary = release("canary", "1.1.0").model_copy(update={"endpoint": "http://wf-canary.agents.svc.cluster.local",
                                                          "pid": None})
    publisher = RoutePublisher(epoch="e1")

    def routes(*canaries: Release) -> RouteTable:
        stable = Backend("http://wf.agents.svc.cluster.local", "1.0.0", "default.wf.1.0.0.abc")
        return RouteTable([Route(namespace="default", name="wf", stable_replicas=(stable,), stable=None,
                                 canary=next((Backend(c.endpoint, c.version, c.release_id) for c in canaries), None),
                                 traffic_percent=10 if canaries else 0)])

    publisher.publish(routes(canary), [])
    taken_out: list[tuple[str, str | None]] = []

    def leaving(endpoint: str, release_id: str | None) -> None:
        taken_out.append((endpoint, release_id))
        publisher.publish(routes(), [])

    app = create_app(Router(), list_workflows=list, tokens=TokenSet.parse("admin-t scopes=admin\n"))
    add_control_routes(app, publisher, "s3cret", leaving=leaving)
    reporter = RunnerReporter(worker="w1", control_url="http://control.test", token="s3cret",
                              local=FakeDriver(records={}), transport=httpx.ASGITransport(app=app))
    assert await reporter.drain(canary, timeout_s=5, grace_s=0, leaving=True)
    assert taken_out == [(canary.endpoint, canary.release_id)]  # (the release named: plnt may not have read it)
    assert await reporter.drain(canary, timeout_s=0.2, grace_s=0)  # (no longer routed: at once)
    assert len(taken_out) == 1


# --- the role commands refuse what cannot work, with a clear line ----------------------------------


def test_role_commands_need_a_shared_temporal_and_a_control_url(tmp_path: Path) -> None:
    from plnt.reconciler.cli.main import app
    from typer.testing import CliRunner

    runner = CliRunner()
    result = runner.invoke(app, ["reconcile", "--repo", str(tmp_path), "--state-dir", str(tmp_path / "s")])
    assert result.exit_code == 2
    assert "plnt reconcile needs --temporal-address HOST:PORT" in result.output
    result = runner.invoke(app, ["worker", "--repo", str(tmp_path), "--state-dir", str(tmp_path / "s"),
                                 "--temporal-address", "127.0.0.1:1"])
    assert result.exit_code == 2 and "plnt worker needs --control-url URL" in result.output
    result = runner.invoke(app, ["reconcile", "--repo", str(tmp_path), "--lease", "zookeeper"])
    assert result.exit_code == 2 and "--lease must be file or kubernetes" in result.output
    empty = tmp_path / "empty.token"
    empty.write_text("\n")
    result = runner.invoke(app, ["worker", "--repo", str(tmp_path), "--internal-token-file", str(empty)])
    assert result.exit_code == 2 and "empty" in result.output


# --- an uninstall on a worker that never saw the install --------------------------------------------


async def test_remove_anywhere_uninstalls_the_owned_release_and_leaves_another_runs_alone(tmp_path: Path) -> None:
    """Against the FAKE helm of test_helm_driver (canned `helm status`, recorded argv): a new worker
    (empty state dir) uninstalls team-a/review-responder's canary from the commit's backends, and
    does not touch a release of the same name that belongs to team-b."""
    from plnt.core.specs.models import PlntBackend
    from plnt.reconciler.drivers.helm import HelmDriver
    from plnt.reconciler.drivers.local import LocalDriver

    from tests.reconciler.drivers.test_helm_driver import BACKEND, CANARY, IMAGE, TARGET, FakeHelm, run, status_json, values

    other_backend = PlntBackend.model_validate({**BACKEND.model_dump(mode="json", by_alias=True),
                                                "metadata": {"name": "eu-cluster"}})
    fakes = {
        "gpu-cluster-01": FakeHelm().expect("status", CANARY, stdout=status_json(CANARY, "deployed", 1, values()))
                                    .expect("uninstall"),
        "eu-cluster": FakeHelm().expect("status", CANARY, stdout=status_json(
            CANARY, "deployed", 1, values(run(namespace="team-b")))),
    }
    state = StateDir(tmp_path / "worker").ensure()
    drivers = DriverSet(LocalDriver(state), state, lambda backend, specs: HelmDriver(
        backend, specs, image=IMAGE, runner=fakes[backend.metadata.name]))
    assert not drivers.knows("team-a", "review-responder")
    await drivers.remove_anywhere("team-a", "review-responder", "canary", [BACKEND, other_backend])
    for fake in fakes.values():
        fake.done()
    assert fakes["gpu-cluster-01"].calls[1][:2] == ["uninstall", CANARY] and TARGET[1] in fakes["gpu-cluster-01"].calls[1]
    assert [c[0] for c in fakes["eu-cluster"].calls] == ["status"], "team-b's release is not uninstalled"
