"""Commit to saga start, and commit to Ready, on the embedded default.

Starts plnt in this process exactly as `plnt up` does (embedded Temporal dev server with its
SQLite database in the state dir, local runner processes, gateway), on a scratch copy of
gitops-example, then makes N commits that alternate review-responder between two versions.
Each commit is noticed either by polling (--interval, the default trigger) or by the git webhook
(POST /hooks/git, as a git server would send after a push). Prints the medians.

    python bench/commit_to_ready.py [--commits 5] [--interval 5]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from plnt.reconciler.app import start
from plnt.reconciler.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
RUN_FILE = "workflowruns/review-responder.yaml"
GIT = ["git", "-c", "user.name=plnt-bench", "-c", "user.email=bench@plnt.invalid"]


def git(repo: Path, *args: str) -> str:
    return subprocess.run([*GIT, *args], cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--commits", type=int, default=5, help="commits per trigger (at least 5)")
    parser.add_argument("--interval", type=float, default=5.0, help="poll interval of plnt, seconds")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING if not __import__("os").environ.get("PLNT_BENCH_LOG") else logging.INFO, format="%(asctime)s.%(msecs)03d %(name)s %(message)s", datefmt="%H:%M:%S")

    scratch = Path(tempfile.mkdtemp(prefix="plnt-bench-"))
    repo = scratch / "repo"
    shutil.copytree(ROOT / "gitops-example", repo)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "initial")

    events: list[tuple[float, str, str | None]] = []  # (time, phase, version)
    settings = Settings(repo=str(repo), state_dir=scratch / "state", port=0, interval_s=args.interval)
    t0 = time.perf_counter()
    plnt = await start(settings)
    startup_s = time.perf_counter() - t0
    refresh = plnt.statuses.on_change

    def on_change() -> None:
        status = plnt.statuses.get("default/review-responder")
        if status is not None and (not events or events[-1][1:] != (status.phase.value, status.attempted_version)):
            events.append((time.perf_counter(), status.phase.value, status.attempted_version))
        refresh()

    plnt.statuses.on_change = on_change

    async def until(phase: str, version: str, since: float, timeout: float = 120) -> float:
        deadline = time.perf_counter() + timeout
        while time.perf_counter() < deadline:
            for at, seen_phase, seen_version in events:
                if at >= since and seen_phase == phase and seen_version == version:
                    return at
            await asyncio.sleep(0.005)
        raise TimeoutError(f"{version} never reached {phase}")

    try:
        first = await until("Ready", "1.2.0", 0)
        print(f"plnt up (embedded Temporal, worker, gateway): {startup_s * 1000:.0f} ms; first install Ready after "
              f"{(first - t0) * 1000:.0f} ms from start")
        results: dict[str, tuple[list[float], list[float]]] = {}
        version = "1.2.0"
        jitter = random.Random(20251130)  # seeded: the same commit moments every run
        async with httpx.AsyncClient(trust_env=False) as client:
            for trigger in ("webhook", "poll"):
                starts, readies = [], []
                for _ in range(max(args.commits, 5)):
                    # Let the reconcile that follows the previous saga pass, then commit at a random
                    # moment of the poll cycle, as a merge would land.
                    await asyncio.sleep(jitter.uniform(0.5, 0.5 + args.interval))
                    new = "1.3.0" if version == "1.2.0" else "1.2.0"
                    text = (repo / RUN_FILE).read_text().replace(f"review-responder@{version}", f"review-responder@{new}")
                    (repo / RUN_FILE).write_text(text)
                    git(repo, "commit", "-q", "-am", f"{trigger}: {new}")
                    committed = time.perf_counter()
                    if trigger == "webhook":
                        await client.post(f"{plnt.url}/hooks/git")
                    started = await until("Verifying", new, committed)
                    ready = await until("Ready", new, committed)
                    starts.append((started - committed) * 1000)
                    readies.append((ready - committed) * 1000)
                    version = new
                results[trigger] = (starts, readies)
        print(f"\n{'trigger':<28} {'commits':>7} {'commit->saga start (median)':>28} {'commit->Ready (median)':>24}")
        for trigger, (starts, readies) in results.items():
            label = trigger if trigger == "webhook" else f"poll every {args.interval:g} s"
            print(f"{label:<28} {len(starts):>7} {statistics.median(starts):>25.0f} ms {statistics.median(readies):>21.0f} ms")
            print(f"{'':<28} {'':>7} {'min/max ' + f'{min(starts):.0f}/{max(starts):.0f} ms':>28} "
                  f"{'min/max ' + f'{min(readies):.0f}/{max(readies):.0f} ms':>24}")
        print("\nEach commit alternates review-responder between 1.2.0 and 1.3.0; every one runs the full saga "
              "(validate, pull, install canary runner, 10-invocation smoke test, promote).")
    finally:
        await plnt.stop()
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
    sys.exit(0)
