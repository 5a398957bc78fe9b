"""`plnt up` as a user runs it: the installed console script in its own process, with its own
embedded Temporal dev server, stopped with Ctrl-C (SIGINT) or SIGTERM, and started again on the
same state directory.

The runners' model is MockBackend (`--backend mock`, the default), a STAND-IN for a model server
unless a test says otherwise; recipes are signed by test authorities (tests/sigstore_ca.py),
STAND-INS for Sigstore's public services."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from plnt.reconciler.drivers.processes import free_port, process_start_time

from tests.conftest import SpecRepo
from tests.e2e.harness import full_passes_in

pytestmark = pytest.mark.integration

REVIEW = {"review": "Great service but slow parking", "brand_voice": "warm, brief"}
CONSOLE_SCRIPT = Path(sys.executable).parent / "plnt"
PLNT = [str(CONSOLE_SCRIPT)] if CONSOLE_SCRIPT.exists() else [sys.executable, "-m", "plnt.reconciler.cli.main"]


# --- processes ----------------------------------------------------------------------------------


def gateway_port() -> int:
    """A free loopback port below Linux's ephemeral range (32768 and up, where bind(0) picks). `plnt
    up` starts its Temporal server before it binds the gateway port, and a port merely found free
    in the ephemeral range can be taken meanwhile by one of Temporal's own bind(0)s (seen in CI:
    "cannot listen ... Address already in use")."""
    import random
    import socket

    for _ in range(200):
        port = random.randint(20000, 32000)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    return free_port()


def _stat(pid: int) -> tuple[int, str] | None:
    """(parent pid, start time) of a live process; None if it is gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[1]), fields[19]


def descendants(root: int) -> dict[int, str]:
    """Every live process below root (children, their children...), pid -> start time."""
    children: dict[int, list[tuple[int, str]]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (info := _stat(int(entry.name))) is not None:
            children.setdefault(info[0], []).append((int(entry.name), info[1]))
    found: dict[int, str] = {}
    todo = [root]
    while todo:
        for pid, start in children.get(todo.pop(), []):
            if pid not in found:
                found[pid] = start
                todo.append(pid)
    return found


def alive(pid: int, start: str) -> bool:
    """The same process (not a reused pid) still runs and is not a zombie."""
    return process_start_time(pid) == start


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "(gone)"


class PlntUp:
    """One `plnt up` process, its log file and its gateway."""

    def __init__(self, repo: Path, state_dir: Path, port: int, log_file: Path, extra: tuple[str, ...] = (),
                 prefix: tuple[str, ...] = ()) -> None:
        """prefix: what starts plnt, e.g. `ip netns exec NAME` (tests/k8s/pod_network.py)."""
        self.url = f"http://127.0.0.1:{port}"
        self.log_file = log_file
        self.temporal_log = state_dir / "temporal.log"  # the embedded dev server's output
        self.seen: dict[int, str] = {}  # every descendant ever recorded
        args = [*prefix, *PLNT, "up", "--repo", str(repo), "--state-dir", str(state_dir), "--port", str(port), "--interval", "1", *extra]
        with open(log_file, "wb") as out:
            # A session of its own: like a shell's job, SIGINT to its process group is what Ctrl-C sends.
            self.process = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                            start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})

    def log(self) -> str:
        return self.log_file.read_text(errors="replace")

    def why(self, message: str) -> str:
        why = f"{message}\n--- plnt log ({self.log_file}) ---\n{self.log()}"
        if self.temporal_log.exists():
            why += f"\n--- the end of {self.temporal_log} ---\n{self.temporal_log.read_text(errors='replace')[-3000:]}"
        return why

    def record_descendants(self) -> dict[int, str]:
        now = descendants(self.process.pid)
        self.seen.update(now)
        return now

    def full_passes(self) -> int:
        """Reconcile passes with a fetch this plnt finished (its /metrics), 0 while it does not answer."""
        try:
            response = httpx.get(f"{self.url}/metrics", timeout=2, trust_env=False)
        except httpx.HTTPError:
            return 0
        return full_passes_in(response.text) if response.status_code == 200 else 0

    def workflows(self) -> list[dict[str, Any]] | None:
        try:
            response = httpx.get(f"{self.url}/workflows", timeout=2, trust_env=False)
        except httpx.HTTPError:
            return None
        return response.json() if response.status_code == 200 else None

    def wait_ready(self, name: str = "review-responder", timeout: float = 60.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        rows: list[dict[str, Any]] | None = None
        while time.monotonic() < deadline:
            assert self.process.poll() is None, self.why(f"plnt exited with code {self.process.returncode}")
            self.record_descendants()
            rows = self.workflows()
            for row in rows or []:
                if row["name"] == name and row["phase"] == "Ready":
                    return row
            time.sleep(0.2)
        raise AssertionError(self.why(f"{name} not Ready within {timeout:.0f}s; GET /workflows: {rows}"))

    def stop_and_check(self, how: signal.Signals) -> None:
        """Stop plnt as a user would; it must exit 0, say so, and leave no process behind."""
        recorded = {**self.seen, **self.record_descendants()}
        if how is signal.SIGINT:
            os.killpg(self.process.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the foreground group
        else:
            self.process.send_signal(how)  # `kill PID`, as a service manager would
        try:
            code = self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            raise AssertionError(self.why(f"plnt did not exit within 30s of {how.name}")) from None
        assert code == 0, self.why(f"plnt exited with code {code} after {how.name}")
        assert "plnt: stopped" in self.log(), self.why("the log does not say plnt stopped")
        deadline = time.monotonic() + 10
        while (left := {pid: cmdline(pid) for pid, start in recorded.items() if alive(pid, start)}) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not left, self.why(f"processes left running after plnt exited: {left}")

    def kill(self) -> None:
        """Teardown after a failed test: leave nothing running."""
        if self.process.poll() is None:
            self.record_descendants()
            self.process.kill()
            self.process.wait()
        for pid, start in self.seen.items():
            if alive(pid, start):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
def started(tmp_path: Path) -> Iterator[list[PlntUp]]:
    processes: list[PlntUp] = []
    yield processes
    for process in processes:
        process.kill()


# --- the test -------------------------------------------------------------------------------------


def test_plnt_up_serves_stops_cleanly_and_restarts_without_redeploying(
    spec_repo: SpecRepo, tmp_path: Path, started: list[PlntUp]
) -> None:
    state_dir = tmp_path / "state"
    port = gateway_port()

    first = PlntUp(spec_repo.path, state_dir, port, tmp_path / "plnt-1.log")
    started.append(first)
    ready = first.wait_ready()
    assert ready["version"] == "1.2.0" and ready["sagaId"], ready

    response = httpx.post(f"{first.url}/workflows/review-responder/invoke", json=REVIEW, timeout=30, trust_env=False)
    assert response.status_code == 200, first.why(response.text)
    body = response.json()
    assert body["version"] == "1.2.0", body
    assert "parking" in body["output"]["reply"], body

    # Everything plnt started: the Temporal dev server and the runner (each in a session of its own).
    children = {pid: cmdline(pid) for pid in first.record_descendants()}
    assert any("start-dev" in line for line in children.values()), first.why(f"no temporal server among {children}")
    assert any("plnt.runner" in line and "review-responder" in line for line in children.values()), \
        first.why(f"no runner among {children}")

    status = subprocess.run([*PLNT, "status", "--url", first.url], capture_output=True, text=True, timeout=30)
    assert status.returncode == 0, first.why(f"plnt status failed: {status.stderr}")
    rows = [line.split() for line in status.stdout.splitlines()]
    assert any(row[:3] == ["default/review-responder", "Ready", "1.2.0"] for row in rows), status.stdout
    assert "no plnt answers" not in status.stderr, status.stderr

    first.stop_and_check(signal.SIGINT)

    # Again, on the same state directory: the release is resumed, not deployed again.
    second = PlntUp(spec_repo.path, state_dir, port, tmp_path / "plnt-2.log")
    started.append(second)
    again = second.wait_ready()
    passes = second.full_passes()  # three more polls of the repository: time enough to (wrongly) start a saga
    deadline = time.monotonic() + 60
    while second.full_passes() < passes + 3:
        assert time.monotonic() < deadline, second.why("no three reconcile passes within 60 s")
        time.sleep(0.1)
    [row] = second.workflows() or [None]
    assert row is not None and row["phase"] == "Ready", second.why(f"GET /workflows: {row}")
    assert row["sagaId"] == again["sagaId"] == ready["sagaId"], second.why(f"redeployed: {ready} -> {row}")
    assert "saga-started" not in second.log(), second.why("a saga ran after the restart")
    response = httpx.post(f"{second.url}/workflows/review-responder/invoke", json=REVIEW, timeout=30, trust_env=False)
    assert response.status_code == 200 and response.json()["version"] == "1.2.0", second.why(response.text)
    second.record_descendants()

    second.stop_and_check(signal.SIGTERM)


def _runner_processes(state_dir: Path) -> dict[int, str]:
    """Live runner processes of this plnt (their recipes are in its state dir)."""
    return {int(p.name): line for p in Path("/proc").iterdir()
            if p.name.isdigit() and _stat(int(p.name)) is not None
            and "plnt.runner" in (line := cmdline(int(p.name))) and str(state_dir) in line}


def test_plnt_killed_mid_saga_resumes_the_saga_where_it_was(
    spec_repo: SpecRepo, tmp_path: Path, started: list[PlntUp]
) -> None:
    """Durability: SIGKILL (no clean-up at all) during the smoke test; a new plnt on the same state
    dir finishes the same saga, installs nothing twice and leaves exactly one runner per track."""
    state_dir = tmp_path / "state"
    port = gateway_port()
    first = PlntUp(spec_repo.path, state_dir, port, tmp_path / "plnt-1.log")
    started.append(first)
    ready = first.wait_ready()
    run_file = spec_repo.path / "workflowruns" / "review-responder.yaml"
    # 1.5.0 answers in 0.6 s: 20 smoke invocations two at a time keep the saga in Canary for ~6 s.
    run_file.write_text(run_file.read_text().replace("review-responder@1.2.0", "review-responder@1.5.0")
                        .replace("invocations: 10", "invocations: 20"))
    spec_repo.commit("1.5.0")
    httpx.post(f"{first.url}/hooks/git", trust_env=False)
    deadline = time.monotonic() + 60
    while not (canary := [r for r in first.workflows() or [] if r["phase"] == "Canary"]):
        assert time.monotonic() < deadline, first.why("never reached Canary")
        time.sleep(0.1)
    saga_id = canary[0]["sagaId"]
    before = _runner_processes(state_dir)
    assert len(before) == 2, first.why(f"expected the stable and the canary runner: {before}")
    canary_pid = next(pid for pid, line in before.items() if "review-responder.1.5.0" in line)
    first.record_descendants()
    first.process.kill()  # SIGKILL: plnt gets no chance to clean up
    first.process.wait()

    second = PlntUp(spec_repo.path, state_dir, port, tmp_path / "plnt-2.log")
    started.append(second)
    row = second.wait_ready(timeout=90)
    while row["version"] != "1.5.0":
        assert time.monotonic() < deadline + 90, second.why(f"saga did not finish: {row}")
        time.sleep(0.2)
        row = next(r for r in second.workflows() or [] if r["name"] == "review-responder")
    # The saga that was under way finished (adopted by the new reconciler, or, on a slow start, done by
    # the new worker before the reconciler's first pass): the same saga id, none started.
    assert row["sagaId"] == saga_id != ready["sagaId"], second.why(f"another saga finished: {row}")
    assert "saga-started" not in second.log(), second.why("a second saga was started instead of resuming")
    assert row["canaryPercent"] == 0
    after = _runner_processes(state_dir)
    assert list(after) == [canary_pid], second.why(f"exactly one runner, the promoted canary, must be left: {after}")
    response = httpx.post(f"{second.url}/workflows/review-responder/invoke", json=REVIEW, timeout=30, trust_env=False)
    assert response.json()["version"] == "1.5.0", second.why(response.text)
    second.stop_and_check(signal.SIGTERM)
