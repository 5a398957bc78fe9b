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

With `--forge gitea` the forge is a real Gitea (tests/forge/gitea.py: built from its Go module by
tools/build_gitea.sh, SQLite, on 127.0.0.1) set up as tests/forge/site.py does: main protected (one
approval from the team, the plnt/plan check required, stale approvals dismissed), Gitea's signed
webhook to plnt, plnt fetching over HTTP with the bot's token, `--require-approval --write-notes`.
Each run is a pull request as users make one, untimed: a branch bumping review-responder, the PR,
`plnt review` as its CI job, the reviewer's approval. Then the merge (Gitea's API, as the button
does) is timed to:

- the merge commit's first `pending` status of plnt/default/review-responder, read from Gitea;
- review-responder Ready on the new version in plnt's `GET /workflows`;
- the `success` status on the merge commit, read from Gitea.

Gitea and plnt are polled every 20 ms (Gitea's statuses are a database query each).

    python bench/merge_to_status.py [--runs 5] [--forge standin|gitea]
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
import threading
import time
from collections.abc import Callable
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


def wait(check, what: str, proc: subprocess.Popen[bytes], log: Path, timeout: float = 120.0,  # type: ignore[no-untyped-def]
         every: float = 0.002) -> float:
    deadline = time.perf_counter() + timeout
    while time.perf_counter() < deadline:
        if check():
            return time.perf_counter()
        if proc.poll() is not None:
            raise SystemExit(f"plnt exited ({proc.returncode}) waiting for {what}:\n{log.read_text()[-3000:]}")
        time.sleep(every)
    raise SystemExit(f"timed out waiting for {what}:\n{log.read_text()[-3000:]}")


def stop(proc: subprocess.Popen[bytes]) -> None:
    """Ctrl-C to plnt's process group, as a user stops it; SIGKILL after 60 s."""
    os.killpg(proc.pid, signal.SIGINT)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--forge", choices=("standin", "gitea"), default="standin",
                        help="standin: the declared GitHub stand-in; gitea: a real Gitea (built on first use)")
    args = parser.parse_args()
    if args.forge == "gitea":
        on_gitea(args.runs)
        return

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
            stop(proc)
    notes = subprocess.run(["git", "log", "--notes=plnt", "--format=%h %N"], cwd=repo, capture_output=True,
                           text=True).stdout
    print(f"plnt up (subprocess) + GitHub forge stand-in; {args.runs} runs, webhook-triggered, polling off")
    print(f"commit+webhook -> first pending status: p50 {statistics.median(pending_ms):.0f} ms, max {max(pending_ms):.0f} ms")
    print(f"commit+webhook -> success status:       p50 {statistics.median(success_ms):.0f} ms, max {max(success_ms):.0f} ms")
    print(f"statuses per commit: {sorted(len(v) for v in per_sha.values())} (pending steps + one verdict)")
    print("notes lines written:", sum(1 for line in notes.splitlines() if "review-responder:" in line))
    print(json.dumps({"runs": args.runs, "merge_to_first_pending_ms": pending_ms, "merge_to_success_ms": success_ms}))
    shutil.rmtree(scratch, ignore_errors=True)


def p50_max(values: list[float]) -> str:
    return f"p50 {statistics.median(values):.0f} ms, max {max(values):.0f} ms"


def on_gitea(runs: int) -> None:
    from tests.forge.gitea import GiteaServer
    from tests.forge.site import make_org, new_site

    scratch = Path(tempfile.mkdtemp(prefix="plnt-bench-gitea-"))
    log = scratch / "plnt.log"
    plnt = [str(CONSOLE_SCRIPT)] if CONSOLE_SCRIPT.exists() else [sys.executable, "-m", "plnt.reconciler.cli.main"]
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with GiteaServer(scratch / "gitea") as server, open(log, "wb") as out, \
            httpx.Client(trust_env=False, timeout=10) as client:
        org = make_org(server)
        site = new_site(org, scratch / "author-clone")
        site.protect_main(dismiss_stale_approvals=True)
        options = site.plnt_up_options(scratch / "secrets", port)
        proc = subprocess.Popen(
            [*plnt, "up", *options, "--state-dir", str(scratch / "state"), "--port", str(port), "--interval", "600",
             "--require-approval", "--write-notes"],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})

        def version_ready() -> str | None:
            try:
                rows = client.get(f"{url}/workflows").json()
            except (httpx.HTTPError, ValueError):
                return None
            return next((r["version"] for r in rows if r["name"] == "review-responder" and r["phase"] == "Ready"), None)

        def poll(check: Callable[[], bool], what: str) -> float:
            return wait(check, what, proc, log, every=0.02)

        def state_on(sha: str, state: str) -> bool:
            return any(s["context"] == CONTEXT and s["status"] == state for s in site.statuses(sha))

        def main_states(before: str) -> set[str]:
            """The states of plnt/default/review-responder on main's head, once main moved past `before`."""
            combined = site.api("GET", "/commits/main/status")
            if combined["sha"] == before:
                return set()
            return {s["status"] for s in combined["statuses"] or () if s["context"] == CONTEXT}

        try:
            first = site.merge(site.approved_pull(plnt, "add-specs", site.add_specs, scratch)[0])
            poll(lambda: state_on(first, "success"), "the first install's success status")
            figures: dict[str, list[float]] = {"merge_api_ms": [], "merge_to_first_pending_ms": [],
                                               "merge_to_ready_ms": [], "merge_to_success_status_ms": []}
            version = "1.2.0"
            for run in range(runs):
                new = "1.3.0" if version == "1.2.0" else "1.2.0"
                pr, _ = site.approved_pull(plnt, f"bump-{run}", lambda v=version, n=new: site.replace(  # type: ignore[misc]
                    RUN_FILE, f"review-responder@{v}", f"review-responder@{n}"), scratch)
                before = site.api("GET", "/commits/main/status")["sha"]
                # The merge call returns only after Gitea's git hooks ran, and its webhook may already have
                # been delivered by then: it runs in a thread while main's head is polled from its start.
                marks: dict[str, float] = {}
                merging = threading.Thread(target=lambda pr=pr, marks=marks: (  # type: ignore[misc]
                    site.merge(pr), marks.setdefault("merged", time.perf_counter())))
                started = time.perf_counter()
                merging.start()

                def seen(before: str = before, new: str = new, marks: dict[str, float] = marks) -> bool:
                    now = time.perf_counter()
                    states = main_states(before)
                    if "pending" not in marks and states:
                        marks["pending"] = now  # (seen first as success: its pending was shorter than a poll)
                    if "ready" not in marks and version_ready() == new:
                        marks["ready"] = now
                    if "success" not in marks and "success" in states:
                        marks["success"] = now
                    return len(marks) == 4

                poll(seen, f"run {run}: the merge of PR #{pr} Ready with its success status")
                merging.join()
                figures["merge_api_ms"].append(round((marks["merged"] - started) * 1000, 1))
                for key, mark in (("merge_to_first_pending_ms", "pending"), ("merge_to_ready_ms", "ready"),
                                  ("merge_to_success_status_ms", "success")):
                    figures[key].append(round((marks[mark] - started) * 1000, 1))
                version = new
            site.git("fetch", "-q", "origin", "+refs/notes/plnt:refs/notes/plnt")
            notes = site.git("log", "--notes=plnt", "--format=%h %N", "origin/main")
        finally:
            stop(proc)
    print(f"plnt up (subprocess, --require-approval --write-notes) + a real Gitea {server.api_url} (SQLite); "
          f"{runs} merges of approved pull requests, webhook-triggered, polling every 600 s; Gitea and plnt "
          "polled every 20 ms")
    print(f"merge (Gitea's API call)              {p50_max(figures['merge_api_ms'])}")
    print(f"merge -> first pending status (Gitea) {p50_max(figures['merge_to_first_pending_ms'])}")
    print(f"merge -> Ready in plnt                {p50_max(figures['merge_to_ready_ms'])}")
    print(f"merge -> success status (Gitea)       {p50_max(figures['merge_to_success_status_ms'])}")
    print("notes lines written:", sum(1 for line in notes.splitlines() if "review-responder:" in line))
    print(json.dumps({"runs": runs, "forge": "gitea", **figures}))
    shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
