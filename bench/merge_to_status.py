"""From a merge (a commit on the tracked branch + the git webhook) to the first commit status on it.

Runs `plnt up` as users run it: the console script in its own process (embedded Temporal dev server,
local runner processes, gateway), with `--forge github` pointing at the DECLARED forge stand-in
(tests/forge_standin.py, GitHub's documented REST shapes: no forge server runs on these machines)
and `--write-notes`, on a scratch copy of gitops-example. Polling is set to 600 s so the webhook
(POST /hooks/git, what a git server sends after a push) is the only trigger. Each run commits a
version bump (alternating review-responder 1.2.0 / 1.3.0), posts the webhook, and times:

- commit + webhook -> the first `pending` status of plnt/default/review-responder on that commit;
- commit + webhook -> its `success` status (the whole saga: validate, pull + verify, canary runner,
  10-invocation smoke test, promote).

The stand-in is polled every 2 ms from this process. Prints p50/max and the raw figures as JSON.

    python bench/merge_to_status.py [--runs 5]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.forge_standin import ForgeStandin  # noqa: E402  (the declared stand-in, see its docstring)

RUN_FILE = "workflowruns/review-responder.yaml"
CONTEXT = "plnt/default/review-responder"
GIT = ["git", "-c", "user.name=plnt-bench", "-c", "user.email=bench@plnt.invalid"]
TOKEN = "bench-forge-token"
CONSOLE_SCRIPT = Path(sys.executable).parent / "plnt"


def git(repo: Path, *args: str) -> str:
    return subprocess.run([*GIT, *args], cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def first_state(forge: ForgeStandin, sha: str, state: str) -> bool:
    return any(s["sha"] == sha and s["context"] == CONTEXT and s["state"] == state for s in list(forge.statuses))


def wait(check, what: str, proc: subprocess.Popen[bytes], log: Path, timeout: float = 120.0) -> float:  # type: ignore[no-untyped-def]
    deadline = time.perf_counter() + timeout
    while time.perf_counter() < deadline:
        if check():
            return time.perf_counter()
        if proc.poll() is not None:
            raise SystemExit(f"plnt exited ({proc.returncode}) waiting for {what}:\n{log.read_text()[-3000:]}")
        time.sleep(0.002)
    raise SystemExit(f"timed out waiting for {what}:\n{log.read_text()[-3000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()

    scratch = Path(tempfile.mkdtemp(prefix="plnt-bench-status-"))
    repo = scratch / "repo"
    shutil.copytree(ROOT / "gitops-example", repo)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "initial")
    first = git(repo, "rev-parse", "HEAD")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = scratch / "plnt.log"
    plnt = [str(CONSOLE_SCRIPT)] if CONSOLE_SCRIPT.exists() else [sys.executable, "-m", "plnt.reconciler.cli.main"]
    with ForgeStandin("github", "owner/specs", TOKEN, page_size=30) as forge, open(log, "wb") as out:
        proc = subprocess.Popen(
            [*plnt, "up", "--repo", str(repo), "--state-dir", str(scratch / "state"), "--port", str(port),
             "--interval", "600", "--forge", "github", "--forge-api-url", forge.api_url, "--forge-project", "owner/specs",
             "--forge-token-env", "PLNT_BENCH_FORGE_TOKEN", "--write-notes"],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "PLNT_BENCH_FORGE_TOKEN": TOKEN, "PYTHONUNBUFFERED": "1"})
        try:
            wait(lambda: first_state(forge, first, "success"), "the first install's success status", proc, log)
            pending_ms: list[float] = []
            success_ms: list[float] = []
            version = "1.2.0"
            with httpx.Client(trust_env=False, timeout=10) as client:
                for _ in range(args.runs):
                    new = "1.3.0" if version == "1.2.0" else "1.2.0"
                    path = repo / RUN_FILE
                    path.write_text(path.read_text().replace(f"review-responder@{version}", f"review-responder@{new}"))
                    git(repo, "commit", "-q", "-am", f"bump to {new}")
                    sha = git(repo, "rev-parse", "HEAD")
                    committed = time.perf_counter()
                    client.post(f"{url}/hooks/git").raise_for_status()
                    pending = wait(lambda sha=sha: first_state(forge, sha, "pending"), f"pending on {sha[:12]}", proc, log)
                    done = wait(lambda sha=sha: first_state(forge, sha, "success"), f"success on {sha[:12]}", proc, log)
                    pending_ms.append(round((pending - committed) * 1000, 1))
                    success_ms.append(round((done - committed) * 1000, 1))
                    version = new
            per_sha = {}
            for s in forge.statuses:
                per_sha.setdefault(s["sha"], []).append(s["state"])
        finally:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
    notes = subprocess.run(["git", "log", "--notes=plnt", "--format=%h %N"], cwd=repo, capture_output=True,
                           text=True).stdout
    print(f"plnt up (subprocess) + GitHub forge stand-in; {args.runs} runs, webhook-triggered, polling off")
    print(f"commit+webhook -> first pending status: p50 {statistics.median(pending_ms):.0f} ms, max {max(pending_ms):.0f} ms")
    print(f"commit+webhook -> success status:       p50 {statistics.median(success_ms):.0f} ms, max {max(success_ms):.0f} ms")
    print(f"statuses per commit: {sorted(len(v) for v in per_sha.values())} (pending steps + one verdict)")
    print("notes lines written:", sum(1 for line in notes.splitlines() if "review-responder:" in line))
    print(json.dumps({"runs": args.runs, "merge_to_first_pending_ms": pending_ms, "merge_to_success_ms": success_ms}))
    shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
