"""Durability: `plnt up` (the console script, its own process and embedded Temporal) is SIGKILLed at
each step of a rollout (verifying, installing the canary, smoke-testing, promoting) and started
again on the same state directory. The rollout must end right (Ready with the new version) with
exactly one runner process per live release and no runner left behind.

Each step is made wide enough to hit and is seen through the saga's own `step` query on Temporal:
the new version's archive carries 24 MiB of (seeded) random bytes to verify, its module sleeps 2.5 s
at import (a slow start) and each invocation 0.3 s (a slow smoke test); the old version's runner
takes 3 s to exit (an atexit sleep), so promoting waits for it.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import shutil
import signal
import time
from pathlib import Path

import httpx
import pytest
from temporalio.client import Client

from tests.attacks.live import AttackRepo, attack_repo  # noqa: F401 - the fixture
from tests.conftest import EXAMPLE
from tests.e2e.test_plnt_up_process import REVIEW, PlntUp, alive, cmdline, gateway_port, started  # noqa: F401 - the fixture

pytestmark = pytest.mark.integration

STEPS = ["pull_recipe", "install_release", "smoke_test", "promote_release"]
SECRET = "durability-secret-never-in-a-runner"


def old_version(tmp_path: Path) -> Path:
    """1.2.0 whose runner takes 3 s to exit after SIGTERM."""
    target = tmp_path / "old-1.2.0"
    shutil.copytree(EXAMPLE / "recipes" / "review-responder" / "1.2.0", target)
    steps = target / "steps.py"
    steps.write_text(steps.read_text() + "\n\nimport atexit as _atexit\nimport time as _time\n"
                     "_atexit.register(_time.sleep, 3)\n")
    return target


def new_version(tmp_path: Path) -> Path:
    """1.3.0, slow to verify (a big archive), to start and to answer."""
    target = tmp_path / "new-1.3.0"
    shutil.copytree(EXAMPLE / "recipes" / "review-responder" / "1.3.0", target)
    (target / "blob.bin").write_bytes(random.Random(8).randbytes(24 * 2**20))
    steps = target / "steps.py"
    steps.write_text("import time as _time\n_time.sleep(2.5)\n" + steps.read_text() + (
        "\n\nimport asyncio as _asyncio\n_safety_check = safety_check\n\n\n"
        "async def safety_check(ctx):\n    await _asyncio.sleep(0.3)\n    return await _safety_check(ctx)\n"))
    return target


def runners(state_dir: Path) -> dict[int, str]:
    """Live runner processes of this state dir: a plnt.runner whose cwd is under STATE/runners."""
    root = str((state_dir / "runners").resolve())
    found: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            cwd = str((entry / "cwd").resolve())
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if b"plnt.runner" in argv[:3] and cwd.startswith(root) and state not in ("Z", "X"):
            found[int(entry.name)] = cmdline(int(entry.name))
    return found


def environ_of(pid: int) -> str:
    return Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")


async def saga_step(plnt: PlntUp, run_id: str) -> str:
    """The saga's `step` query, on the Temporal server this plnt started."""
    address = re.search(r"temporal=(\S+)", plnt.log())
    assert address, plnt.why("no temporal address in the log")
    client = await Client.connect(address.group(1), namespace="default")
    return await client.get_workflow_handle("plnt-default-review-responder", run_id=run_id).query("step")


@pytest.mark.parametrize("step", STEPS)
async def test_plnt_killed_at_each_rollout_step_finishes_the_rollout_with_one_runner_per_release(
    step: str, attack_repo: AttackRepo, tmp_path: Path, started: list[PlntUp],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)  # plnt holds it; no runner may
    attack_repo.publish("review-responder", "1.2.0", source=old_version(tmp_path))
    attack_repo.repo.commit("1.2.0, slow to exit")
    state_dir = tmp_path / "state"
    port = gateway_port()
    first = PlntUp(attack_repo.path, state_dir, port, tmp_path / "plnt-1.log")
    started.append(first)
    ready = first.wait_ready(timeout=90)
    assert ready["version"] == "1.2.0"

    attack_repo.publish("review-responder", "1.3.0", source=new_version(tmp_path))
    attack_repo.deploy("review-responder@1.3.0")
    httpx.post(f"{first.url}/hooks/git", trust_env=False)

    # The new saga (its run id is the status' sagaId), then its step, polled until it is `step`.
    deadline = time.monotonic() + 60
    run_id = ready["sagaId"]
    while run_id == ready["sagaId"]:
        assert time.monotonic() < deadline, first.why("the upgrade saga did not start")
        rows = first.workflows() or []
        run_id = next((r["sagaId"] for r in rows if r["name"] == "review-responder"), run_id)
        await asyncio.sleep(0.02)
    seen: list[str] = []
    while True:
        assert time.monotonic() < deadline, first.why(f"never saw step {step}; steps seen: {seen}")
        now = await saga_step(first, run_id)
        if not seen or seen[-1] != now:
            seen.append(now)
        assert STEPS.index(now) <= STEPS.index(step) if now in STEPS else True, \
            first.why(f"step {step} was missed; steps seen: {seen}")
        # Installing: wait for the canary's runner to exist (started, not yet healthy).
        if now == step and (step != "install_release" or any("1.3.0" in c for c in runners(state_dir).values())):
            break
        await asyncio.sleep(0.02)
    first.record_descendants()
    first.process.kill()  # SIGKILL: no clean-up at all
    first.process.wait()
    assert await_step_unchanged(state_dir), "status was written after the kill"

    second = PlntUp(attack_repo.path, state_dir, port, tmp_path / "plnt-2.log")
    started.append(second)
    deadline = time.monotonic() + 150
    row: dict[str, object] = {}
    while row.get("phase") != "Ready" or row.get("version") != "1.3.0":
        assert time.monotonic() < deadline, second.why(f"the rollout did not end Ready 1.3.0 (killed at {step}): {row}")
        assert row.get("phase") not in ("Failed", "RolledBack"), second.why(f"rollout ended wrong: {row}")
        second.record_descendants()
        row = next((r for r in second.workflows() or [] if r["name"] == "review-responder"), {})
        await asyncio.sleep(0.2)

    # Exactly one runner per live release: the stable 1.3.0 the record names, and nothing else.
    record = json.loads((state_dir / "releases" / "default.review-responder.json").read_text())
    assert record["canary"] is None and record["stable"]["version"] == "1.3.0", record
    stable_pid = record["stable"]["pid"]
    settle = time.monotonic() + 15  # the old 1.2.0 runner may still be draining its 3 s exit
    while (now := runners(state_dir)) != {stable_pid: now.get(stable_pid)} and time.monotonic() < settle:
        await asyncio.sleep(0.1)
    assert list(now) == [stable_pid], second.why(f"killed at {step}: runners left {now}, record names {stable_pid}")
    assert sorted(p.name for p in (state_dir / "runner-pids").iterdir()) == [f"{stable_pid}.json"]
    assert SECRET not in environ_of(stable_pid), "plnt's AWS secret reached a runner"
    response = httpx.post(f"{second.url}/workflows/review-responder/invoke", json=REVIEW, timeout=30, trust_env=False)
    assert response.status_code == 200 and response.json()["version"] == "1.3.0", second.why(response.text)

    second.stop_and_check(signal.SIGTERM)
    leftover = runners(state_dir)
    assert leftover == {}, f"runners left after plnt stopped: {leftover}"
    left = {pid: cmdline(pid) for pid, start in {**first.seen, **second.seen}.items() if alive(pid, start)}
    assert left == {}, f"processes of either plnt remain: {left}"


def await_step_unchanged(state_dir: Path) -> bool:
    """The status files (status.json and its journal) are plnt's to write; after SIGKILL they must not
    change (checked twice, 0.3 s apart)."""
    def status_files() -> list[bytes | None]:
        return [(state_dir / name).read_bytes() if (state_dir / name).exists() else None
                for name in ("status.json", "status.journal")]

    before = status_files()
    time.sleep(0.3)
    return status_files() == before

