"""Durability: `plnt up` (the console script, its own process and embedded Temporal) is SIGKILLed at
each step of a rollout (verifying, installing the canary, smoke-testing, promoting) and started
again on the same state directory. The rollout must end right (Ready with the new version) with
exactly one runner process per live release and no runner left behind.

Each step is made wide enough to hit and is seen through the saga's own `step` query on Temporal:
the new version's archive carries 24 MiB of (seeded) random bytes to verify, its module sleeps 2.5 s
at import (a slow start) and each invocation 0.3 s (a slow smoke test); the old version's runner
takes 3 s to exit (an atexit sleep), so promoting waits for it.

The steps a stepped canary adds, each held until plnt is killed in it: a step's gates (check_gates:
a webhook Gate whose real receiver holds its answer), a dependant's wait for its dependency
(wait_for_dependencies: the dependency held by `pause: manual`), a timed and a manual pause. After
the restart the same saga goes on from there, and Temporal's history shows no step before it run
again. The runners' model is MockBackend, a STAND-IN for a model server; recipes are signed by test
authorities, STAND-INS for Sigstore's public services.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import shutil
import signal
import threading
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import httpx
import pytest
from plnt.reconciler.gates.webhook import verify
from plnt.reconciler.status_store import read_statuses
from temporalio.api.enums.v1 import PendingActivityState
from temporalio.client import Client

from tests.attacks.live import AttackRepo, attack_repo  # noqa: F401 - the fixture
from tests.conftest import EXAMPLE, SpecRepo
from tests.e2e.test_canary_steps import RUN_FILE, row, wait_row
from tests.e2e.test_depends_on import POST_FILE, ended_at, started_at
from tests.e2e.test_plnt_up_process import REVIEW, PlntUp, alive, cmdline, gateway_port, started  # noqa: F401 - the fixture
from tests.e2e.test_rollout_actions import MANUAL_STEPS, plnt
from tests.http_thread import ThreadedHttp

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


# --- the steps a stepped canary adds: its gates, dependsOn, its pauses ----------------------------
# Plain example recipes (spec_repo), each rollout held at the step under test until plnt is killed:
# a webhook Gate whose receiver holds its answer, a dependency held by `pause: manual`, a pause.

HELD_GATE = """\
apiVersion: plnt.work/v1
kind: Gate
metadata: {name: qa-signoff}
spec:
  webhook: {url: "%s/gate", secret: QA, timeout: 2m}
"""
GATE_SECRET = "qa-gate-secret-of-the-kill-test"


class HeldReceiver(BaseHTTPRequestHandler):
    """A QA service that holds its answer to call N until the test sets `release[N]`, then says yes."""

    calls: list[dict[str, Any]] = []
    arrived = threading.Semaphore(0)
    release: list[threading.Event] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers["content-length"]))
        if not verify(GATE_SECRET.encode(), self.headers.get("x-plnt-timestamp", ""),
                      self.headers.get("x-plnt-signature", ""), body):
            self.send_response(401)
            self.end_headers()
            return
        HeldReceiver.calls.append(json.loads(body))
        held = HeldReceiver.release[len(HeldReceiver.calls) - 1]
        HeldReceiver.arrived.release()
        held.wait(timeout=180)
        answer = json.dumps({"pass": True, "reason": "QA signed off"}).encode()
        try:
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)
        except OSError:  # the plnt that asked was killed meanwhile
            pass

    def log_message(self, *args: Any) -> None:
        pass


def saga_steps(up: PlntUp, name: str = "review-responder") -> dict[str, Any]:
    """The saga's history as plnt reads it from Temporal (GET /workflows/NAME/history)."""
    return httpx.get(f"{up.url}/workflows/{name}/history", timeout=10, trust_env=False).json()


ROLLOUT = ["validate", "pull_recipe", "install_release", "smoke_test"]


def assert_steps_once(saga: dict[str, Any], expected: list[str], retried: str | None) -> None:
    """The saga's activities are `expected`, each scheduled once, and only `retried` (the one plnt
    was killed in) needed more than one attempt: nothing before it ran again."""
    assert [s["step"] for s in saga["steps"]] == expected, saga["steps"]
    attempts = [(s["step"], s["attempts"]) for s in saga["steps"]]
    assert [(step, n) for step, n in attempts if step != retried and n != 1] == [], f"a step ran again: {attempts}"
    if retried is not None:
        assert dict(attempts)[retried] >= 2, f"{retried} was not run again after the kill: {attempts}"


def kill(up: PlntUp, state_dir: Path) -> None:
    """SIGKILL, no clean-up at all; plnt's status files stay as they were."""
    up.record_descendants()
    up.process.kill()
    up.process.wait()
    assert await_step_unchanged(state_dir), "status was written after the kill"


def stable_record(state_dir: Path, name: str = "review-responder") -> tuple[str, str]:
    stable = json.loads((state_dir / "releases" / f"default.{name}.json").read_text())["stable"]
    return stable["version"], stable["release_id"]


def on_disk(state_dir: Path, check: Any, what: str, name: str = "review-responder") -> None:
    """Until the status file holds what the API showed (its write is behind by design: see
    reconciler/saga/progress.py), so the kill tests the saga, not that write's timing."""
    deadline = time.monotonic() + 10
    while not check(read_statuses(state_dir / "status.json").get(f"default/{name}") or {}):
        assert time.monotonic() < deadline, f"the status file never held {what}"
        time.sleep(0.05)


def stable_answers(up: PlntUp, version: str) -> None:
    answer = httpx.post(f"{up.url}/workflows/review-responder/invoke", json=REVIEW, timeout=30, trust_env=False,
                        headers={"X-Plnt-Track": "stable"})
    assert answer.status_code == 200 and answer.json()["version"] == version, up.why(answer.text)


def test_plnt_killed_while_a_gate_is_checked_checks_it_again_and_promotes(
    spec_repo: SpecRepo, tmp_path: Path, started: list[PlntUp], monkeypatch: pytest.MonkeyPatch,  # noqa: F811
) -> None:
    monkeypatch.setenv("PLNT_GATE_SECRET_QA", GATE_SECRET)  # plnt's environment: the webhook's HMAC key
    HeldReceiver.calls, HeldReceiver.release = [], [threading.Event(), threading.Event()]
    HeldReceiver.arrived = threading.Semaphore(0)
    state_dir, port = tmp_path / "state", gateway_port()
    with ThreadedHttp(HeldReceiver) as receiver:
        first = PlntUp(spec_repo.path, state_dir, port, tmp_path / "plnt-1.log")
        started.append(first)
        first.wait_ready()
        spec_repo.write("gates/gates.yaml", HELD_GATE % receiver.url)
        spec_repo.replace(RUN_FILE, "review-responder@1.2.0", "review-responder@1.3.0")
        spec_repo.replace(RUN_FILE, "    trafficPercent: 5\n", "    steps:\n      - {weight: 50, gates: [qa-signoff]}\n")
        commit = spec_repo.commit("1.3.0 behind a QA webhook")
        httpx.post(f"{first.url}/hooks/git", trust_env=False)

        # The gate asked, its answer held: plnt is killed in check_gates.
        assert HeldReceiver.arrived.acquire(timeout=120), first.why("the gate was never asked")
        checking = wait_row(first, lambda r: "checking gates qa-signoff" in r["message"], "the gate's check")
        last = saga_steps(first)["steps"][-1]
        assert (last["step"], last["outcome"]) == ("check_gates", "running"), last
        stable = stable_record(state_dir)
        kill(first, state_dir)
        HeldReceiver.release[0].set()  # (its answer goes nowhere: the plnt that asked is gone)

        second = PlntUp(spec_repo.path, state_dir, port, tmp_path / "plnt-2.log")
        started.append(second)
        # The same saga asks the gate again (after the dead worker's heartbeat timeout) and waits.
        assert HeldReceiver.arrived.acquire(timeout=120), second.why("the gate was not checked again")
        # (the restarted worker may ask before the restarted gateway answers GET /workflows)
        again = wait_row(second, lambda r: r.get("sagaId") == checking["sagaId"], "the resumed saga's row")
        assert (again["sagaId"], again["phase"], again["canaryVersion"], again["canaryPercent"]) \
            == (checking["sagaId"], "Canary", "1.3.0", 50), second.why(str(again))
        assert stable_record(state_dir) == stable, "the stable release changed"
        stable_answers(second, "1.2.0")
        assert [(c["commit"], c["step"], c["canary_version"]) for c in HeldReceiver.calls] == [(commit, 1, "1.3.0")] * 2
        HeldReceiver.release[1].set()  # QA signs off: the gate decides

        done = wait_row(second, lambda r: r["phase"] == "Ready" and r["version"] == "1.3.0", "1.3.0 promoted")
    assert done["sagaId"] == checking["sagaId"], second.why(f"another saga finished: {done}")
    assert "saga-started" not in second.log(), second.why("a second saga was started instead of resuming")
    saga = saga_steps(second)
    assert saga["run_id"] == checking["sagaId"] and saga["phase"] == "Ready", saga
    assert_steps_once(saga, [*ROLLOUT, "check_gates", "promote_release"], retried="check_gates")
    gate = next(s for s in saga["steps"] if s["step"] == "check_gates")
    assert gate["outcome"] == "completed" and gate["detail"]["qa-signoff"].startswith("passed"), gate
    second.stop_and_check(signal.SIGTERM)


def test_plnt_killed_while_a_dependant_waits_resumes_the_wait_until_its_dependency_is_promoted(
    spec_repo: SpecRepo, tmp_path: Path, started: list[PlntUp],  # noqa: F811
) -> None:
    text = (spec_repo.path / RUN_FILE).read_text()
    spec_repo.write(POST_FILE, text.replace("name: review-responder", "name: post-generator")
                    .replace("review-responder@1.2.0", "post-generator@1.0.0") + "  dependsOn: [review-responder]\n")
    spec_repo.commit("post-generator, after review-responder")
    state_dir, port = tmp_path / "state", gateway_port()
    first = PlntUp(spec_repo.path, state_dir, port, tmp_path / "plnt-1.log")
    started.append(first)
    first.wait_ready("post-generator", timeout=90)
    first.wait_ready()

    # One commit: review-responder 1.3.0 held by a person at its first step; post-generator waits for it.
    spec_repo.replace(RUN_FILE, "review-responder@1.2.0", "review-responder@1.3.0")
    spec_repo.replace(RUN_FILE, "    trafficPercent: 5\n", MANUAL_STEPS % 20)
    spec_repo.replace(POST_FILE, "invocations: 10", "invocations: 12")
    spec_repo.commit("review-responder 1.3.0 held by a person; post-generator after it")
    httpx.post(f"{first.url}/hooks/git", trust_env=False)
    wait_row(first, lambda r: "waiting for a person" in r["message"], "review-responder held")
    waiting = wait_dependant(first, lambda r: "waiting for review-responder to be promoted" in r["message"],
                             "post-generator waiting")
    assert saga_steps(first, "post-generator")["steps"][-1]["step"] == "wait_for_dependencies"
    on_disk(state_dir, lambda s: "waiting for review-responder" in s.get("message", ""), "the wait",
            name="post-generator")
    kill(first, state_dir)

    second = PlntUp(spec_repo.path, state_dir, port, tmp_path / "plnt-2.log")
    started.append(second)
    # The same saga waits again (the activity retried on the new worker); nothing of it installed.
    deadline = time.monotonic() + 90
    while (retried := pending_activity(second, "post-generator")) is None or retried[1] < 2:
        assert time.monotonic() < deadline, second.why(f"wait_for_dependencies was not retried: {retried}")
        time.sleep(0.2)
    assert retried[0] == "wait_for_dependencies", retried
    still = wait_dependant(second, lambda r: r["sagaId"] == waiting["sagaId"], "post-generator's saga")
    assert (still["phase"], still["version"]) == ("Verifying", "1.0.0"), still
    answer = httpx.post(f"{second.url}/workflows/post-generator/invoke", timeout=30, trust_env=False,
                        json={"topic": "parking", "audience": "drivers"})
    assert answer.status_code == 200 and answer.json()["version"] == "1.0.0", second.why(answer.text)
    shown = plnt("rollout", "show", "review-responder", "--url", second.url)
    assert "step 1/2, waiting for a person" in shown.stdout, shown.stdout + shown.stderr

    promoted = plnt("rollout", "promote", "review-responder", "--url", second.url, "--by", "ops")
    assert promoted.returncode == 0, promoted.stderr
    wait_row(second, lambda r: r["phase"] == "Ready" and r["version"] == "1.3.0", "review-responder promoted")
    done = wait_dependant(second, lambda r: r["phase"] == "Ready" and r["sagaId"] == waiting["sagaId"],
                          "post-generator promoted")
    assert "saga-started" not in second.log(), second.why("a second saga was started instead of resuming")
    post, review = saga_steps(second, "post-generator"), saga_steps(second, "review-responder")
    assert_steps_once(post, ["validate", "wait_for_dependencies", *ROLLOUT[1:], "promote_release"],
                      retried="wait_for_dependencies")
    assert_steps_once(review, [*ROLLOUT, "promote_release"], retried=None)
    assert started_at(post, "pull_recipe") >= ended_at(review, "promote_release"), (post, review)
    assert done["version"] == "1.0.0" and post["phase"] == "Ready", done
    second.stop_and_check(signal.SIGTERM)


def pending_activity(up: PlntUp, name: str) -> tuple[str, int] | None:
    """The saga's activity under way, started on a worker, and its attempt (Temporal's pending
    activity: the history records an attempt only once the activity ends)."""
    async def describe() -> tuple[str, int] | None:
        address = re.search(r"temporal=(\S+)", up.log())
        if address is None:
            return None
        client = await Client.connect(address.group(1), namespace="default")
        described = await client.get_workflow_handle(f"plnt-default-{name}").describe()
        return next(((p.activity_type.name, p.attempt) for p in described.raw_description.pending_activities
                     if p.state == PendingActivityState.PENDING_ACTIVITY_STATE_STARTED), None)

    return asyncio.run(describe())


def wait_dependant(up: PlntUp, check: Any, what: str) -> dict[str, Any]:
    deadline = time.monotonic() + 90
    last = None
    while time.monotonic() < deadline:
        assert up.process.poll() is None, up.why(f"plnt exited waiting for {what}")
        last = next((r for r in up.workflows() or [] if r["name"] == "post-generator"), None)
        if last is not None and check(last):
            return last
        time.sleep(0.1)
    raise AssertionError(up.why(f"timed out waiting for {what}; last row: {last}"))


PAUSES = {"10m": ("pausing 10m before step 2", "resume"), "manual": ("waiting for a person before step 2", "promote")}


@pytest.mark.parametrize("pause", list(PAUSES))
def test_plnt_killed_in_a_pause_keeps_the_step_and_weight_until_a_person_acts(
    pause: str, spec_repo: SpecRepo, tmp_path: Path, started: list[PlntUp],  # noqa: F811
) -> None:
    said, verb = PAUSES[pause]
    state_dir, port = tmp_path / "state", gateway_port()
    first = PlntUp(spec_repo.path, state_dir, port, tmp_path / "plnt-1.log")
    started.append(first)
    first.wait_ready()
    spec_repo.replace(RUN_FILE, "review-responder@1.2.0", "review-responder@1.3.0")
    spec_repo.replace(RUN_FILE, "    trafficPercent: 5\n", f"    steps:\n      - {{weight: 30, pause: {pause}}}\n"
                      "      - {weight: 60}\n")
    spec_repo.commit(f"1.3.0: 30% with a {pause} pause, then 60%")
    httpx.post(f"{first.url}/hooks/git", trust_env=False)
    paused = wait_row(first, lambda r: said in r["message"], f"step 1's {pause} pause")
    on_disk(state_dir, lambda s: said in s.get("message", ""), "the pause")
    stable = stable_record(state_dir)
    kill(first, state_dir)

    second = PlntUp(spec_repo.path, state_dir, port, tmp_path / "plnt-2.log")
    started.append(second)
    again = wait_row(second, lambda r: r["phase"] == "Canary", "the rollout after the restart")
    assert (again["sagaId"], again["canaryVersion"], again["canaryStep"], again["canarySteps"], again["canaryPercent"]) \
        == (paused["sagaId"], "1.3.0", 1, 2, 30) and said in again["message"], again
    # The saga itself (its `rollout` query, replayed on the new worker) is where it was.
    shown = plnt("rollout", "show", "review-responder", "--url", second.url)
    held = ", waiting for a person" if pause == "manual" else ""
    assert shown.returncode == 0 and f"step 1/2{held}" in shown.stdout, shown.stdout + shown.stderr
    if pause != "manual":
        assert "waiting for a person" not in shown.stdout, shown.stdout
    versions = [httpx.post(f"{second.url}/workflows/review-responder/invoke", json=REVIEW, timeout=30,
                           trust_env=False).json()["version"] for _ in range(30)]
    assert 1 <= versions.count("1.3.0") <= 20, f"30% of 30 calls to the canary, give or take: {versions}"
    assert stable_record(state_dir) == stable, "the stable release changed"
    time.sleep(3)  # (a pause that did not hold would have moved on by now)
    assert row(second)["canaryStep"] == 1, second.why("the pause did not hold after the restart")

    acted = plnt("rollout", verb, "review-responder", "--url", second.url, "--by", "ops")
    assert acted.returncode == 0, acted.stderr
    done = wait_row(second, lambda r: r["phase"] == "Ready" and r["version"] == "1.3.0", "1.3.0 promoted")
    assert done["sagaId"] == paused["sagaId"], second.why(f"another saga finished: {done}")
    assert "saga-started" not in second.log(), second.why("a second saga was started instead of resuming")
    saga = saga_steps(second)
    # Resumed: step 2 takes its 60% and is smoke-tested; promoted by hand: what was left is skipped.
    step_2 = ["set_canary_traffic", "smoke_test"] if verb == "resume" else []
    assert_steps_once(saga, [*ROLLOUT, *step_2, "promote_release"], retried=None)
    assert [(a["verb"], a["by"]) for a in saga["actions"]] == [(verb, "ops")], saga["actions"]
    second.stop_and_check(signal.SIGTERM)
