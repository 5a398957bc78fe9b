"""Runners forked from the zygote (runner_start "fork", the default): real zygote, real runners.

Start, exit codes (2: recipe did not load, 3: limits), runners outliving the zygote and plnt, adoption
by a restarted driver, stopping unrecorded runners, and isolation between releases: recipe code of
one release cannot read another runner's memory or environment, and the zygote never holds the
LLM key."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import sys
import time
from pathlib import Path

import httpx
import pytest
from plnt.core.recipe import directory_digest
from plnt.reconciler.drivers.local import LocalDriver
from plnt.reconciler.drivers.processes import is_runner, process_start_time
from plnt.reconciler.drivers.protocol import InstallRequest
from plnt.reconciler.drivers.zygote import ZygoteClient
from plnt.reconciler.state import StateDir

from tests.conftest import EXAMPLE

pytestmark = pytest.mark.integration

RECIPES = EXAMPLE / "recipes" / "review-responder"
KEY = "llm-key-0c5e1b7a9d2f4e3b8a6c"  # distinctive: searched for in memory below


def request(name: str, version: str = "1.2.0", recipe_dir: Path | None = None) -> InstallRequest:
    directory = recipe_dir or RECIPES / version
    return InstallRequest(namespace="default", name=name, track="canary", version=version,
                          spec_fingerprint="sha256:" + "a" * 64, recipe_digest=directory_digest(directory),
                          recipe_dir=str(directory), traffic_percent=10)


def ppid_of(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[1])


def alive(pid: int | None) -> bool:
    return pid is not None and process_start_time(pid) is not None


async def healthz(endpoint: str) -> dict[str, object]:
    async with httpx.AsyncClient(trust_env=False, timeout=5) as client:
        return (await client.get(f"{endpoint}/healthz")).json()


def voluntary_switches(pid: int) -> int:
    """How often the process (its one thread) went to sleep: each wake-up ends in one."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("voluntary_ctxt_switches:"):
            return int(line.split()[1])
    raise AssertionError("no voluntary_ctxt_switches in /proc/PID/status")


async def wait_gone(pid: int) -> None:
    for _ in range(200):
        if not alive(pid):
            return
        await asyncio.sleep(0.025)
    raise AssertionError(f"pid {pid} still running")


@pytest.fixture
async def driver(tmp_path: Path):
    driver = LocalDriver(StateDir(tmp_path / "state"), secret_env={"MY_LLM_KEY": KEY})
    yield driver
    await driver.shutdown()


async def test_a_forked_runner_serves_as_the_zygotes_child(driver: LocalDriver) -> None:
    release = await driver.install(request("rr"))
    assert release.pid is not None and alive(release.pid)
    zygote = driver._zygote.pid
    assert zygote is not None and ppid_of(release.pid) == zygote, "forked by the zygote, not exec'd by plnt"
    argv = Path(f"/proc/{release.pid}/cmdline").read_bytes().split(b"\0")
    assert argv[1:3] == [b"-m", b"plnt.runner"] and release.release_id.encode() in argv, \
        "ps shows it as the runner of its release, like an exec'd one"
    assert b"plnt.runner.zygote" in Path(f"/proc/{zygote}/cmdline").read_bytes()
    assert is_runner(release.pid), "a forked runner is recognised as a runner (stop_unrecorded, adoption)"
    assert (await healthz(release.endpoint))["release"] == release.release_id
    assert os.getsid(release.pid) == release.pid, "its own session: Ctrl-C on plnt's terminal does not reach it"


@pytest.mark.parametrize("runner_start", ["fork", "exec"])
async def test_an_idle_runner_is_one_task_and_sleeps(tmp_path: Path, runner_start: str) -> None:
    """Linux counts every thread against RLIMIT_NPROC per user: a runner that kept libuv's four
    resolver threads was 5 tasks, so 1,000 runners of a non-root user passed the default
    `processes: 4096` limit. Having served requests, an idle runner is its one thread, asleep."""
    driver = LocalDriver(StateDir(tmp_path / "state"), runner_start=runner_start)  # type: ignore[arg-type]
    try:
        release = await driver.install(request("rr"))
        async with httpx.AsyncClient(trust_env=False, timeout=10) as client:
            for _ in range(3):
                assert (await client.post(f"{release.endpoint}/invoke", json={"review": "great food", "brand_voice": "warm"})).status_code == 200
        threads = sorted(p.read_text().strip() for p in Path(f"/proc/{release.pid}/task").glob("*/comm"))
        assert len(threads) == 1, threads
        # And it sleeps: no housekeeping tick each second (it kept 1,000 idle runners at a quarter of a core).
        before = voluntary_switches(release.pid)
        await asyncio.sleep(3.5)
        assert voluntary_switches(release.pid) - before <= 1, "an idle runner woke up more than once in 3.5 s"
    finally:
        await driver.shutdown()


async def test_exit_codes_reach_plnt(tmp_path: Path) -> None:
    """2: the recipe did not load (the driver's InvalidRecipe); 3: a limit could not be set."""
    broken = tmp_path / "broken"
    shutil.copytree(RECIPES / "1.2.0", broken)
    (broken / "steps.py").write_text("raise RuntimeError('import-time failure')\n")
    client = ZygoteClient(sys.executable, tmp_path / "zygote", {"PATH": os.defpath})
    runner_dir = tmp_path / "runner"
    runner_dir.mkdir()
    try:
        bad_recipe = await client.spawn(["--recipe", str(broken), "--port", "1"], runner_dir,
                                        tmp_path / "bad.log", {"PATH": os.defpath})
        assert bad_recipe.wait(timeout=30) == 2
        assert "import-time failure" in (tmp_path / "bad.log").read_text()
        bad_limit = await client.spawn(["--recipe", str(RECIPES / "1.2.0"), "--limit-memory-mib", "0"], runner_dir,
                                       tmp_path / "limit.log", {"PATH": os.defpath})
        assert bad_limit.wait(timeout=30) == 3
        assert "cannot apply limits" in (tmp_path / "limit.log").read_text()
    finally:
        client.close()


async def test_runners_outlive_the_zygote_and_a_dead_zygote_is_restarted(driver: LocalDriver) -> None:
    first = await driver.install(request("one"))
    zygote = driver._zygote.pid
    assert zygote is not None
    os.kill(zygote, signal.SIGKILL)
    await wait_gone(zygote)
    assert driver.is_running(first) and (await healthz(first.endpoint))["release"] == first.release_id
    second = await driver.install(request("two"))
    assert driver._zygote.pid not in (None, zygote), "the next start restarted the zygote"
    assert alive(second.pid) and driver.is_running(first)
    # With its zygote gone nobody reports the first runner's exit: /proc must tell, or drift never sees it.
    os.kill(first.pid, signal.SIGKILL)  # type: ignore[arg-type]
    await wait_gone(first.pid)
    assert not driver.is_running(first)
    assert list(await driver.drift()) == ["default/one"]


async def test_a_restarted_plnt_adopts_forked_runners(tmp_path: Path) -> None:
    state = StateDir(tmp_path / "state")
    before = LocalDriver(state)
    release = await before.install(request("rr"))
    zygote = before._zygote.pid
    before._zygote.close()  # plnt exits without stopping its runners: the zygote follows, they do not
    assert zygote is not None
    await wait_gone(zygote)
    assert alive(release.pid)
    after = LocalDriver(state)
    try:
        assert await after.resume() == [], "the recorded runner still runs: adopted, not restarted"
        assert after.is_running(release)
        assert (await healthz(release.endpoint))["release"] == release.release_id
    finally:
        await after.shutdown()
    assert not alive(release.pid), "the adopting plnt stops it at shutdown like its own"


async def test_an_unrecorded_forked_runner_is_stopped(tmp_path: Path) -> None:
    state = StateDir(tmp_path / "state")
    before = LocalDriver(state)
    release = await before.install(request("rr"))
    before._zygote.close()
    (state.releases / "default.rr.json").unlink()  # e.g. plnt killed between start and record
    after = LocalDriver(state)
    try:
        assert await after.stop_unrecorded() == [release.pid]
        await wait_gone(release.pid)  # type: ignore[arg-type]
    finally:
        await after.shutdown()



async def test_a_runner_without_record_or_pid_file_is_found_by_its_directory_and_stopped(tmp_path: Path) -> None:
    """plnt SIGKILLed between the zygote's fork and the pid file: only the runner's cwd
    (STATE/runners/RELEASE_ID) says whose it is. A runner of another state dir is left alone."""
    state, other = StateDir(tmp_path / "state"), StateDir(tmp_path / "other")
    before, neighbour = LocalDriver(state), LocalDriver(other)
    try:
        release = await before.install(request("rr"))
        theirs = await neighbour.install(request("rr"))
        before._zygote.close()
        (state.releases / "default.rr.json").unlink()
        (state.root / "runner-pids" / f"{release.pid}.json").unlink()
        after = LocalDriver(state)
        try:
            assert await after.stop_unrecorded() == [release.pid]
            await wait_gone(release.pid)  # type: ignore[arg-type]
            assert alive(theirs.pid), "a runner under another state dir was stopped"
        finally:
            await after.shutdown()
    finally:
        await neighbour.shutdown()
    assert not alive(theirs.pid)


# --- isolation between releases ------------------------------------------------------------------

PRY = '''

import os as _os


def _try(path, size):
    try:
        with open(path, "rb") as handle:
            return "read " + repr(handle.read(size)[:200])
    except OSError as exc:
        return "denied " + type(exc).__name__


def _mem(pid):
    """Read the first readable bytes of the other runner's heap through /proc/PID/mem."""
    try:
        with open(f"/proc/{pid}/maps") as maps:
            start = next(int(line.split("-")[0], 16) for line in maps if "[heap]" in line or " rw" in line)
        with open(f"/proc/{pid}/mem", "rb") as mem:
            mem.seek(start)
            return "read " + str(len(mem.read(4096)))
    except OSError as exc:
        return "denied " + type(exc).__name__


async def safety_check(ctx):
    pid = int(ctx.inputs["target_pid"])
    return {"environ": _try(f"/proc/{pid}/environ", 1 << 16), "mem": _mem(pid),
            "own_environ": _try("/proc/self/environ", 64)}
'''


def prying_recipe(tmp_path: Path) -> Path:
    """1.2.0 whose output step, recipe code, reads another process's environ and memory."""
    recipe = tmp_path / "prying"
    shutil.copytree(RECIPES / "1.2.0", recipe)
    steps = recipe / "steps.py"
    steps.write_text(steps.read_text() + PRY)
    return recipe


def memory_holds(pid: int, needle: bytes) -> bool:
    """Whether any readable, writable mapping of `pid` holds `needle` (needs the right to read it)."""
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb") as mem:
        for line in maps:
            span, perms = line.split()[:2]
            if not perms.startswith("rw"):
                continue
            start, end = (int(x, 16) for x in span.split("-"))
            try:
                mem.seek(start)
                if needle in mem.read(end - start):
                    return True
            except OSError:
                continue
    return False


async def test_recipe_code_cannot_read_another_release_and_the_zygote_holds_no_key(
        tmp_path: Path, driver: LocalDriver) -> None:
    victim = await driver.install(request("victim"))
    prier = await driver.install(request("prier", recipe_dir=prying_recipe(tmp_path)))
    assert victim.pid is not None
    async with httpx.AsyncClient(trust_env=False, timeout=10) as client:
        response = await client.post(f"{prier.endpoint}/invoke", json={"review": "great", "brand_voice": "brief", "target_pid": victim.pid})
    assert response.status_code == 200, response.text
    seen = response.json()["output"]
    assert seen["own_environ"].startswith("read "), seen  # the prying code runs and can read files at all
    assert seen["environ"].startswith("denied"), seen
    assert seen["mem"].startswith("denied"), seen
    assert KEY not in response.text

    zygote = driver._zygote.pid
    assert zygote is not None
    assert not memory_holds(zygote, KEY.encode()), "the LLM key reached the zygote's memory"
    if os.geteuid() == 0:  # control: the scan finds the key where it is (reading an undumpable runner needs root)
        assert memory_holds(victim.pid, KEY.encode())


def processes_with(marker: bytes) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and process_start_time(int(entry.name)) is not None:
            try:
                if marker in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


async def start_on_a_stopped_zygote(client: ZygoteClient, runner_dir: Path,
                                    marker: str) -> tuple[int, asyncio.Task[object]]:
    """Start the zygote, SIGSTOP it, then ask it for a runner (its argv carries `marker`): returns
    the zygote's pid and the start, waiting for an answer that comes only after SIGCONT."""
    first = await client.spawn(["--recipe", str(RECIPES / "1.2.0"), "--limit-memory-mib", "0"], runner_dir,
                               runner_dir / "first.log", {"PATH": os.defpath})  # the zygote is up
    assert first.wait(timeout=30) == 3
    zygote_pid = client.pid
    assert zygote_pid is not None and client._zygote is not None
    os.kill(zygote_pid, signal.SIGSTOP)
    task: asyncio.Task[object] = asyncio.create_task(client.spawn(
        ["--recipe", str(RECIPES / "1.2.0"), "--port", "0", "--release-id", marker], runner_dir,
        runner_dir / f"{marker}.log", {"PATH": os.defpath}))
    # The request is sent from a thread: on a busy machine it can take a while to be pending.
    deadline = time.monotonic() + 30
    while not (client._zygote._pending or task.done()) and time.monotonic() < deadline:
        await asyncio.sleep(0.005)
    assert client._zygote._pending, "the start never reached the (stopped) zygote"
    return zygote_pid, task


async def test_a_start_cancelled_before_the_zygote_answers_leaves_no_runner(tmp_path: Path) -> None:
    """The saga is cancelled between the fork request and the zygote's answer: the runner it forked
    anyway is nobody's (no pid file, no record), so the client kills it when the answer comes."""
    client = ZygoteClient(sys.executable, tmp_path / "zygote", {"PATH": os.defpath})
    runner_dir = tmp_path / "runner"
    runner_dir.mkdir()
    marker = f"cancelled-{os.getpid()}-{id(tmp_path)}"
    try:
        zygote_pid, task = await start_on_a_stopped_zygote(client, runner_dir, marker)  # answers after the cancel
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        os.kill(zygote_pid, signal.SIGCONT)
        for _ in range(100):  # it forks now, answers, and the client kills what nobody awaits
            if processes_with(marker.encode()):
                break
            await asyncio.sleep(0.01)
        for _ in range(200):
            if not processes_with(marker.encode()):
                break
            await asyncio.sleep(0.025)
        assert processes_with(marker.encode()) == []
    finally:
        for pid in processes_with(marker.encode()):
            os.kill(pid, signal.SIGKILL)
        client.close()


async def test_a_start_cancelled_as_the_zygote_answers_is_cancelled_and_leaves_no_runner(tmp_path: Path) -> None:
    """The answer and the cancellation land in one event-loop turn (the race that hung an install for
    its whole start timeout, and once left a runner running): the start still ends cancelled, and the
    runner forked for it is already killed when the cancellation returns."""
    client = ZygoteClient(sys.executable, tmp_path / "zygote", {"PATH": os.defpath})
    runner_dir = tmp_path / "runner"
    runner_dir.mkdir()
    marker = f"raced-{os.getpid()}-{id(tmp_path)}"
    try:
        zygote_pid, task = await start_on_a_stopped_zygote(client, runner_dir, marker)
        assert client._zygote is not None
        (future,) = client._zygote._pending.values()
        os.kill(zygote_pid, signal.SIGCONT)
        # Without yielding to the loop: the answer's hand-over to the loop is queued, then the cancel.
        deadline = time.monotonic() + 30
        while not future.done() and time.monotonic() < deadline:
            time.sleep(0.001)
        assert future.done() and future.exception() is None, "the zygote answered with a pid"
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        pid = future.result()
        for _ in range(40):  # SIGKILLed already; only its reaping by the zygote may lag
            if not alive(pid):
                break
            await asyncio.sleep(0.025)
        assert not alive(pid), "the runner forked for the cancelled start was killed"
    finally:
        for pid in processes_with(marker.encode()):
            os.kill(pid, signal.SIGKILL)
        client.close()
