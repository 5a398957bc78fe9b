"""Local driver with real runner processes on 127.0.0.1.

The runners serve with `--backend mock` (their default): MockBackend stands in for the model server."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from plnt.core.recipe import directory_digest
from plnt.core.specs.models import RunnerLimits
from plnt.reconciler.drivers.local import LocalDriver
from plnt.reconciler.drivers.processes import process_start_time
from plnt.reconciler.drivers.protocol import InstallRequest
from plnt.reconciler.drivers.spawn import allowlisted_env
from plnt.reconciler.errors import DriverError, InvalidRecipe
from plnt.reconciler.state import Release, StateDir

from tests.conftest import EXAMPLE
from tests.hygiene import runners_under

pytestmark = pytest.mark.integration

RECIPES = EXAMPLE / "recipes" / "review-responder"


def request(version: str, track: str = "canary", fingerprint: str = "sha256:" + "a" * 64) -> InstallRequest:
    directory = RECIPES / version
    return InstallRequest(namespace="default", name="rr", track=track, version=version, spec_fingerprint=fingerprint,
                          recipe_digest=directory_digest(directory), recipe_dir=str(directory), traffic_percent=10)


def alive(pid: int | None) -> bool:
    return pid is not None and process_start_time(pid) is not None


async def version_at(endpoint: str) -> str:
    async with httpx.AsyncClient(trust_env=False) as client:
        return (await client.get(f"{endpoint}/healthz")).json()["version"]


@pytest.fixture
async def driver(tmp_path: Path):
    changes: list[int] = []
    driver = LocalDriver(StateDir(tmp_path / "state"), on_change=lambda: changes.append(1))
    driver.changes = changes  # type: ignore[attr-defined]
    yield driver
    await driver.shutdown()


async def test_install_is_healthy_and_idempotent(driver: LocalDriver) -> None:
    first = await driver.install(request("1.2.0"))
    assert alive(first.pid) and await version_at(first.endpoint) == "1.2.0"
    again = await driver.install(request("1.2.0"))
    assert again == first, "a retried install finds its own release"
    assert (await driver.live())["default/rr"].canary == first
    assert driver.changes  # type: ignore[attr-defined]


async def test_promote_swaps_records_then_stops_the_old_stable(driver: LocalDriver) -> None:
    await driver.install(request("1.2.0"))
    old = await driver.promote("default", "rr")
    canary = await driver.install(request("1.3.0", fingerprint="sha256:" + "b" * 64))
    new = await driver.promote("default", "rr")
    assert new.track == "stable" and new.pid == canary.pid and new.traffic_percent == 0
    live = (await driver.live())["default/rr"]
    assert live.stable == new and live.canary is None
    assert not alive(old.pid)
    assert await driver.promote("default", "rr") == new, "a retried promote finds its own work"


async def test_set_traffic_changes_the_canarys_record_only(driver: LocalDriver) -> None:
    await driver.install(request("1.2.0"))
    await driver.promote("default", "rr")
    canary = await driver.install(request("1.3.0", fingerprint="sha256:" + "b" * 64))
    before = len(driver.changes)  # type: ignore[attr-defined]
    moved = await driver.set_traffic("default", "rr", 60, canary_header=None)
    assert moved == canary.model_copy(update={"traffic_percent": 60}), "the same process, its share changed"
    assert (await driver.live())["default/rr"].canary == moved and alive(moved.pid)
    assert len(driver.changes) == before + 1, "the records changed: the routes are rebuilt"  # type: ignore[attr-defined]
    assert await driver.set_traffic("default", "rr", 60, canary_header=None) == moved
    assert len(driver.changes) == before + 1, "a retried step changes nothing"  # type: ignore[attr-defined]
    cohort = await driver.set_traffic("default", "rr", 60, canary_header=("x-cohort", "testers"))
    assert cohort == moved.model_copy(update={"canary_header": ("x-cohort", "testers")}), "a step's own cohort"
    assert (await driver.live())["default/rr"].canary == cohort
    await driver.remove("default", "rr", "canary")
    with pytest.raises(DriverError, match="no canary to give 60% of the traffic"):
        await driver.set_traffic("default", "rr", 60, canary_header=None)


async def test_remove_is_idempotent(driver: LocalDriver) -> None:
    release = await driver.install(request("1.2.0"))
    await driver.remove("default", "rr", "canary")
    await driver.remove("default", "rr", "canary")
    assert not alive(release.pid)
    assert await driver.live() == {}


async def test_install_replaces_a_different_release_on_the_same_track(driver: LocalDriver) -> None:
    first = await driver.install(request("1.2.0"))
    second = await driver.install(request("1.3.0", fingerprint="sha256:" + "c" * 64))
    assert not alive(first.pid) and alive(second.pid)


async def test_resume_restarts_recorded_releases_after_a_shutdown(tmp_path: Path, driver: LocalDriver) -> None:
    await driver.install(request("1.2.0"))
    stable = await driver.promote("default", "rr")
    await driver.shutdown()
    assert not alive(stable.pid)
    fresh = LocalDriver(StateDir(tmp_path / "state"))
    try:
        [resumed] = await fresh.resume()
        assert resumed.release_id == stable.release_id and alive(resumed.pid)
        assert await version_at(resumed.endpoint) == "1.2.0"
        assert await fresh.resume() == [], "running releases are left alone"
    finally:
        await fresh.shutdown()


async def test_shutdown_stops_runners_at_once_not_one_after_another(driver: LocalDriver) -> None:
    """Ctrl-C with 1,000 runners took minutes when each was drained and waited for in turn: every
    stop now starts before the first one ends, and every runner is gone afterwards."""
    releases = []
    for name in ("a", "b", "c"):
        releases.append(await driver.install(request("1.2.0").model_copy(update={"name": name})))
    spans: list[tuple[str, float, float]] = []
    stop = driver._stop_process

    async def timed(release: Release) -> None:
        began = time.monotonic()
        await stop(release)
        spans.append((release.name, began, time.monotonic()))

    driver._stop_process = timed  # type: ignore[method-assign]
    await driver.shutdown()
    assert sorted(name for name, _, _ in spans) == ["a", "b", "c"]
    assert max(began for _, began, _ in spans) < min(ended for _, _, ended in spans), spans
    assert not any(alive(release.pid) for release in releases)


async def test_resume_restarts_recorded_releases_at_once_not_one_after_another(
        tmp_path: Path, driver: LocalDriver) -> None:
    """`plnt up` serves only once resume returns: 1,000 releases restarted in turn kept it from
    serving for minutes. Every restart now starts before the first one ends."""
    for name in ("a", "b", "c"):
        await driver.install(request("1.2.0").model_copy(update={"name": name}))
    await driver.shutdown()
    fresh = LocalDriver(StateDir(tmp_path / "state"))
    spans: list[tuple[str, float, float]] = []
    start = fresh._start

    async def timed(release: Release, preferred_port: int | None = None, replica: int = 0) -> Release:
        began = time.monotonic()
        started = await start(release, preferred_port, replica)
        spans.append((release.name, began, time.monotonic()))
        return started

    fresh._start = timed  # type: ignore[method-assign]
    try:
        resumed = await fresh.resume()
        assert sorted(r.name for r in resumed) == ["a", "b", "c"] and all(alive(r.pid) for r in resumed)
        assert max(began for _, began, _ in spans) < min(ended for _, _, ended in spans), spans
    finally:
        await fresh.shutdown()


async def test_a_dead_runner_is_not_counted_as_running(driver: LocalDriver) -> None:
    release = await driver.install(request("1.2.0"))
    os.kill(release.pid, signal.SIGKILL)
    for _ in range(50):
        if not driver.is_running(release):
            break
        await asyncio.sleep(0.05)
    assert not driver.is_running(release)
    again = await driver.install(request("1.2.0"))
    assert again.pid != release.pid and alive(again.pid), "a retried install replaces a dead runner"


async def test_recipe_that_does_not_load_is_a_dead_end(tmp_path: Path, driver: LocalDriver) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(RECIPES / "1.2.0", broken)
    (broken / "steps.py").write_text("raise RuntimeError('import-time failure')\n")
    bad = request("1.2.0").model_copy(update={"recipe_dir": str(broken)})
    with pytest.raises(InvalidRecipe, match="could not load its recipe"):
        await driver.install(bad)
    assert await driver.live() == {}


# --- isolation: environment, directory, limits ------------------------------------------------------


def environ_recipe(tmp_path: Path) -> Path:
    """1.2.0 whose module writes the environment it runs with to env.json in its cwd at import. (Not
    /proc/PID/environ: a forked runner's shows the zygote's allowlisted start environment, and an
    undumpable runner's is readable only with CAP_SYS_PTRACE.)"""
    recipe = tmp_path / "environ"
    shutil.copytree(RECIPES / "1.2.0", recipe)
    steps = recipe / "steps.py"
    steps.write_text("import json as _j, os as _o\n_j.dump(dict(_o.environ), open('env.json', 'w'))\n"
                     + steps.read_text())
    return recipe


def limits_of(pid: int) -> dict[str, str]:
    """/proc/PID/limits: name -> 'soft hard'."""
    rows = Path(f"/proc/{pid}/limits").read_text().splitlines()[1:]
    return {row[:26].strip(): " ".join(row[26:].split()[:2]) for row in rows}


@pytest.mark.parametrize("runner_start", ["fork", "exec"])
async def test_runner_gets_an_allowlisted_environment_its_own_directory_and_limits(tmp_path: Path,
                                                                                   runner_start: str) -> None:
    parent_env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "TZ": "UTC",
                  "PLNT_GATEWAY_TOKENS": "gw-secret", "AWS_SECRET_ACCESS_KEY": "aws-secret",
                  "OPENAI_API_KEY": "other-llm-key", "GIT_ASKPASS": "/bin/echo", "HOME": "/root",
                  "MY_LLM_KEY": "named-llm-key"}
    limits = RunnerLimits(memory_mi_b=700, open_files=100, processes=5000)
    state = StateDir(tmp_path / "state")
    driver = LocalDriver(state, env=parent_env, secret_env={"MY_LLM_KEY": parent_env["MY_LLM_KEY"]},
                         limits_for=lambda namespace, name: limits, runner_start=runner_start)  # type: ignore[arg-type]
    try:
        release = await driver.install(request("1.2.0").model_copy(update={"recipe_dir": str(environ_recipe(tmp_path))}))
        assert release.pid is not None
        runner_dir = state.runner_logs / release.release_id
        env = json.loads((runner_dir / "env.json").read_text())
        assert env["HOME"] == env["TMPDIR"] == str(runner_dir)
        assert Path(f"/proc/{release.pid}/cwd").resolve() == runner_dir.resolve()
        assert env["MY_LLM_KEY"] == "named-llm-key", "the one LLM key the operator names reaches the runner"
        assert {"PLNT_GATEWAY_TOKENS", "AWS_SECRET_ACCESS_KEY", "OPENAI_API_KEY", "GIT_ASKPASS"}.isdisjoint(env)
        assert set(env) <= {"PATH", "LANG", "LC_ALL", "TZ", "HOME", "TMPDIR", "PYTHONNOUSERSITE", "MY_LLM_KEY"}, env
        got = limits_of(release.pid)
        assert got["Max address space"] == f"{700 * 2**20} {700 * 2**20}"
        assert got["Max open files"] == "100 100"
        assert got["Max processes"] == "5000 5000"
    finally:
        await driver.shutdown()


def test_allowlist_drops_everything_not_named() -> None:
    env = allowlisted_env({"PATH": "/bin", "LC_TIME": "C", "LANG": "C", "AWS_ACCESS_KEY_ID": "x",
                           "PLNT_GATEWAY_TOKENS": "t", "ANTHROPIC_API_KEY": "k", "SSH_AUTH_SOCK": "/s",
                           "PYTHONSTARTUP": "/evil.py", "LD_PRELOAD": "/evil.so"})
    assert env == {"PATH": "/bin", "LC_TIME": "C", "LANG": "C"}


async def test_limits_hold_from_the_start_and_a_runner_they_stop_is_a_start_failure(tmp_path: Path) -> None:
    """The limits are in force before plnt.runner imports its own modules: with 3 open files (below
    runnerLimits' floor of 64, so built past validation) the runner cannot even import them. That is
    a start failure (retryable DriverError naming the log), not an invalid recipe."""
    too_low = RunnerLimits.model_construct(memory_mi_b=2048, open_files=3, processes=4096)
    driver = LocalDriver(StateDir(tmp_path / "state"), start_timeout_s=5,
                         limits_for=lambda namespace, name: too_low)
    try:
        with pytest.raises(DriverError, match="Too many open files") as caught:
            await driver.install(request("1.2.0"))
        assert not isinstance(caught.value, InvalidRecipe)
        assert runners_of(tmp_path / "state") == {}
    finally:
        await driver.shutdown()


# --- every runner is recorded before its health check, and stopped if the install does not complete --


def slow_recipe(tmp_path: Path) -> Path:
    """1.2.0 whose module sleeps at import: its runner runs but never answers /healthz in time."""
    slow = tmp_path / "slow"
    shutil.copytree(RECIPES / "1.2.0", slow)
    steps = slow / "steps.py"
    steps.write_text("import time\ntime.sleep(600)\n" + steps.read_text())
    return slow


def runners_of(state_dir: Path) -> dict[int, str]:
    """Live runner processes started for this state dir (their cwd is under STATE/runners)."""
    found: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or process_start_time(int(entry.name)) is None:
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            cwd = (entry / "cwd").resolve()
        except OSError:
            continue
        if b"plnt.runner" in argv[:3] and str(cwd).startswith(str((state_dir / "runners").resolve())):
            found[int(entry.name)] = b" ".join(argv).decode()
    return found


async def wait_for_pid_file(state_dir: Path) -> dict[str, object]:
    for _ in range(400):
        files = list((state_dir / "runner-pids").glob("*.json"))
        if files:
            return json.loads(files[0].read_text())
        await asyncio.sleep(0.05)
    raise AssertionError("no runner was recorded in STATE/runner-pids")


async def test_a_cancelled_install_stops_its_runner(tmp_path: Path) -> None:
    """A newer commit supersedes the saga: Temporal cancels the install activity mid health check."""
    state_dir = tmp_path / "state"
    driver = LocalDriver(StateDir(state_dir), start_timeout_s=300)
    slow = request("1.2.0").model_copy(update={"recipe_dir": str(slow_recipe(tmp_path))})
    task = asyncio.create_task(driver.install(slow))
    entry = await wait_for_pid_file(state_dir)
    assert process_start_time(int(entry["pid"])) == entry["pid_start"], "recorded while it runs, before healthy"
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert process_start_time(int(entry["pid"])) is None
    assert runners_of(state_dir) == {} and list((state_dir / "runner-pids").iterdir()) == []
    assert await driver.live() == {}


async def test_a_runner_that_never_gets_healthy_is_stopped_each_attempt(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    driver = LocalDriver(StateDir(state_dir), start_timeout_s=1.5)
    slow = request("1.2.0").model_copy(update={"recipe_dir": str(slow_recipe(tmp_path))})
    with pytest.raises(DriverError, match="not healthy within"):
        await driver.install(slow)
    assert runners_of(state_dir) == {} and list((state_dir / "runner-pids").iterdir()) == []


async def test_a_runner_left_by_a_killed_plnt_is_stopped_at_the_next_start(tmp_path: Path) -> None:
    """The first driver stands for a plnt SIGKILLed mid-install: its install never finishes or cleans
    up. A fresh driver on the same state dir (the next `plnt up`) stops that runner and keeps the
    recorded release running."""
    state_dir = tmp_path / "state"
    first = LocalDriver(StateDir(state_dir), start_timeout_s=300)
    stable = await first.install(request("1.2.0"))
    await first.promote("default", "rr")
    canary = request("1.2.0", fingerprint="sha256:" + "d" * 64).model_copy(
        update={"recipe_dir": str(slow_recipe(tmp_path))})
    task = asyncio.create_task(first.install(canary))
    try:
        entry = await wait_for_pid_file_of(state_dir, canary.release_id)
        second = LocalDriver(StateDir(state_dir))
        assert await second.resume() == [], "the recorded stable release still runs: nothing to restart"
        assert process_start_time(int(entry["pid"])) is None, "the unrecorded runner was stopped"
        # A killed plnt's install does nothing more; this one is alive (same process) and would retry
        # the start it saw fail: end it the way the kill did, then only the recorded release is left.
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert list(runners_of(state_dir)) == [stable.pid]
        assert sorted(p.name for p in (state_dir / "runner-pids").iterdir()) == [f"{stable.pid}.json"]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await first.shutdown()
    assert runners_of(state_dir) == {}


async def wait_for_pid_file_of(state_dir: Path, release_id: str) -> dict[str, object]:
    for _ in range(400):
        for path in (state_dir / "runner-pids").glob("*.json"):
            entry = json.loads(path.read_text())
            if entry["release_id"] == release_id:
                return entry
        await asyncio.sleep(0.05)
    raise AssertionError(f"{release_id} was not recorded in STATE/runner-pids")


async def test_a_forged_pid_file_does_not_make_plnt_kill_another_process(tmp_path: Path) -> None:
    """STATE/runner-pids is checked against the process: only a plnt runner is ever signalled, and a
    file that is not what plnt writes does not stop plnt from starting."""
    state_dir = tmp_path / "state"
    bystander = subprocess.Popen(["sleep", "300"])
    try:
        driver = LocalDriver(StateDir(state_dir))
        (state_dir / "runner-pids" / f"{bystander.pid}.json").write_text(json.dumps(
            {"pid": bystander.pid, "pid_start": process_start_time(bystander.pid), "release_id": "forged"}))
        (state_dir / "runner-pids" / "1.json").write_text("{not json")
        (state_dir / "runner-pids" / "2.json").write_text("[2]")
        assert await driver.stop_unrecorded() == []
        assert bystander.poll() is None
        assert list((state_dir / "runner-pids").iterdir()) == [], "unreadable and stale pid files are dropped"
    finally:
        bystander.kill()
        bystander.wait()


@pytest.mark.integration
async def test_a_runner_is_healthy_only_when_it_answers_as_its_release(tmp_path: Path) -> None:
    """Real HTTP, a STAND-IN /healthz (a small Starlette app on uvicorn): the answer must name the
    release and the version; an error status, a body that is not JSON, or no listener is not healthy."""
    from plnt.core.server import GatewayServer
    from plnt.reconciler.drivers.processes import free_port
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, PlainTextResponse, Response
    from starlette.routing import Route

    answer: dict[str, Response] = {}

    async def healthz(request: object) -> Response:
        return answer["now"]

    server = GatewayServer(Starlette(routes=[Route("/healthz", healthz)]), "127.0.0.1", 0)
    await server.start()
    driver = LocalDriver(StateDir(tmp_path / "state").ensure())
    release = Release(release_id="rr-1.0.0-abc", namespace="default", name="rr", track="canary", version="1.0.0",
                      spec_fingerprint="sha256:" + "a" * 64, recipe_digest="sha256:" + "0" * 64,
                      recipe_dir=str(tmp_path), endpoint=server.url)
    try:
        cases = [
            (JSONResponse({"version": "1.0.0", "release": "rr-1.0.0-abc"}), True),
            (JSONResponse({"version": "1.0.0", "release": "rr-1.0.0-other"}), False),
            (JSONResponse({"version": "0.9.0", "release": "rr-1.0.0-abc"}), False),
            (JSONResponse({"version": "1.0.0", "release": "rr-1.0.0-abc"}, status_code=500), False),
            (PlainTextResponse("ok"), False),
            (JSONResponse(["1.0.0"]), False),
        ]
        for response, healthy in cases:
            answer["now"] = response
            assert await driver._processes.healthy(release, "1.0.0") is healthy, response.body
    finally:
        await server.stop()
    gone = release.model_copy(update={"endpoint": f"http://127.0.0.1:{free_port()}"})
    assert await driver._processes.healthy(gone, "1.0.0") is False


@pytest.mark.parametrize(("runner_start", "held_step"), [("fork", "_spawner.spawn"), ("exec", "_spawner.spawn"),
                                                    ("fork", "_processes.healthy")])
async def test_a_start_in_flight_when_the_driver_shuts_down_leaves_no_runner(tmp_path: Path, runner_start: str,
                                                                            held_step: str) -> None:
    """plnt's stop can find a runner start in flight (an install, or the reconciler's last drift heal).
    A fork after shutdown's sweep, or a retry after the sweep killed the starting runner (and, forked,
    from a zygote started again), left a runner running after plnt stopped. Here the step is held (a
    test hook around the real one) until shutdown has returned: the start fails saying why, and no
    runner and no zygote is left."""
    driver = LocalDriver(StateDir(tmp_path / "state"), runner_start=runner_start)  # type: ignore[arg-type]
    reached, held = asyncio.Event(), asyncio.Event()
    part, step = held_step.split(".")  # the driver's part whose step is held, and that step
    real_step = getattr(getattr(driver, part), step)

    async def step_held(*args: object, **kwargs: object) -> object:
        reached.set()
        await held.wait()
        return await real_step(*args, **kwargs)

    setattr(getattr(driver, part), step, step_held)
    install = asyncio.create_task(driver.install(request("1.2.0")))
    await asyncio.wait_for(reached.wait(), timeout=60)
    await driver.shutdown()
    held.set()
    with pytest.raises(DriverError, match="plnt is stopping"):
        await asyncio.wait_for(install, timeout=60)
    assert runners_under(tmp_path) == {}
    assert driver._zygote.pid is None, "a zygote was started after shutdown"
    assert driver.snapshot() == {}, "a release was recorded after shutdown"


def test_a_model_servers_memory_limit_is_its_specs_else_the_backends(tmp_path: Path) -> None:
    """The command line a model release starts with (nothing is started here)."""
    import sys

    from plnt.reconciler.drivers.processes import MODEL_SERVER_SCRIPT
    from plnt.reconciler.state import ModelServing

    driver = LocalDriver(StateDir(tmp_path / "state"), model_python=sys.executable,
                         limits_for=lambda namespace, name: RunnerLimits(memory_mi_b=2048))
    serving = ModelServing(runtime="llama.cpp", model_file="m.gguf", alias="smollm2", context_length=1024,
                           args=("--n_batch", "64"))
    release = Release(release_id="default.smollm2.1.0.0.abc", namespace="default", name="smollm2", track="canary",
                      version="1.0.0", spec_fingerprint="sha256:" + "a" * 64, recipe_digest="sha256:" + "b" * 64,
                      recipe_dir=str(tmp_path / "model"), endpoint="", model=serving)
    limits = RunnerLimits(memory_mi_b=2048)
    argv = driver._spawner.model_argv(release, 8123, limits)
    assert argv[:2] == [sys.executable, str(MODEL_SERVER_SCRIPT)]
    assert argv[argv.index("--limit-memory-mib") + 1] == "2048" and argv[-3:] == ["--", "--n_batch", "64"]
    bigger = release.model_copy(update={"model": serving.model_copy(update={"memory_mib": 16384})})
    assert driver._spawner.model_argv(bigger, 8123, limits)[argv.index("--limit-memory-mib") + 1] == "16384"
