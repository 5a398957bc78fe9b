"""Commit to saga start, and commit to Ready, on the embedded default, fresh pulls apart from cached.

Starts plnt in this process exactly as `plnt up` does (embedded Temporal dev server with its
SQLite database in the state dir, local runner processes, gateway) on a scratch spec repository
(bench/benchlib.py: gitops-example's backend, a registry inside the repository signed by a
throwaway authority made for this run, a RecipeTrustPolicy trusting only it). Each "fresh" commit
publishes a recipe version plnt has never pulled (a distinct signed archive) and points
review-responder at it, so every such saga fetches, checks and verifies the recipe for real. The
"cached" commits then switch back and forth between two versions plnt already pulled (its cache
answers). Each commit is noticed either by the git webhook (POST /hooks/git, as a git server sends
after a push) or by polling (--interval). Every row checks plnt's pull cache: a fresh commit must
add exactly one entry, a cached one none (else the bench stops: the label would be a lie).

    python bench/commit_to_ready.py [--commits 5] [--interval 5] [--triggers webhook,poll]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import random
import statistics
import sys
import time
from typing import Any

import httpx
from benchlib import BenchRepo, cache_entries, how_it_ran, print_json
from plnt.reconciler.app import start
from plnt.reconciler.settings import Settings

RECIPE = "review-responder"
KEY = f"default/{RECIPE}"


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--commits", type=int, default=5, help="commits per trigger and per kind (fresh, cached)")
    parser.add_argument("--interval", type=float, default=5.0, help="poll interval of plnt, seconds")
    parser.add_argument("--triggers", default="webhook,poll", help="webhook, poll or both")
    args = parser.parse_args()
    triggers = [t for t in args.triggers.split(",") if t]
    if not set(triggers) <= {"webhook", "poll"} or args.commits < 1:
        parser.error("--triggers takes webhook and/or poll; --commits at least 1")
    logging.basicConfig(level=logging.INFO if os.environ.get("PLNT_BENCH_LOG") else logging.WARNING,
                        format="%(asctime)s.%(msecs)03d %(name)s %(message)s", datefmt="%H:%M:%S")
    how = how_it_ran("commit_to_ready.py", vars(args), [
        "plnt up in this process: embedded Temporal dev server (SQLite in the state dir), local runner processes",
        "fresh: a recipe version never pulled (distinct signed archive, checked: +1 pull-cache entry); "
        "cached: a version already pulled (checked: +0 entries)",
        "each saga: validate, pull and verify, canary runner, 10-invocation smoke test, promote",
        f"commits land at a random moment of the poll cycle (seeded); {args.commits} per trigger and kind"])

    repo = BenchRepo("plnt-bench-ready-")
    versions = iter(f"2.{n}.0" for n in range(10_000))
    version = next(versions)
    repo.publish(RECIPE, version)
    repo.write_run(RECIPE, RECIPE, version)
    repo.commit(f"{RECIPE} {version}")

    state_dir = repo.scratch / "state"
    events: list[tuple[float, str, str | None]] = []  # (time, phase, version)
    settings = Settings(repo=str(repo.path), state_dir=state_dir, port=0, interval_s=args.interval)
    t0 = time.perf_counter()
    plnt = await start(settings)
    startup_s = time.perf_counter() - t0
    refresh = plnt.statuses.on_change

    def on_change() -> None:
        status = plnt.statuses.get(KEY)
        if status is not None and (not events or events[-1][1:] != (status.phase.value, status.attempted_version)):
            events.append((time.perf_counter(), status.phase.value, status.attempted_version))
        refresh()

    plnt.statuses.on_change = on_change

    async def until(phase: str, version: str, since: float, timeout: float = 180) -> float:
        deadline = time.perf_counter() + timeout
        while time.perf_counter() < deadline:
            for at, seen_phase, seen_version in events:
                if at >= since and seen_phase == phase and seen_version == version:
                    return at
            for at, seen_phase, seen_version in events:
                if at >= since and seen_version == version and seen_phase in ("Failed", "RolledBack"):
                    raise SystemExit(f"{version} ended {seen_phase}: {plnt.statuses.get(KEY)}")
            await asyncio.sleep(0.005)
        raise TimeoutError(f"{version} never reached {phase}")

    rows: list[dict[str, Any]] = []
    try:
        first = await until("Ready", version, 0)
        print(f"\nplnt up (embedded Temporal, worker, gateway): {startup_s * 1000:.0f} ms; first install Ready after "
              f"{(first - t0) * 1000:.0f} ms from start")
        pulled = [version]  # versions in plnt's cache, in the order they were deployed
        jitter = random.Random(20251130)  # seeded: the same commit moments every run
        async with httpx.AsyncClient(trust_env=False) as client:
            for trigger in triggers:
                for kind in ("fresh", "cached"):
                    for _ in range(args.commits):
                        # Let the reconcile that follows the previous saga pass, then commit at a random
                        # moment of the poll cycle, as a merge would land.
                        await asyncio.sleep(jitter.uniform(0.5, 0.5 + args.interval))
                        if kind == "fresh":
                            new = next(versions)
                            repo.publish(RECIPE, new)  # signing is the author's CI: before the commit, not timed
                        else:
                            new = pulled[-2]  # the one before the running one: in the cache
                        repo.write_run(RECIPE, RECIPE, new)
                        entries_before = cache_entries(state_dir)
                        repo.commit(f"{trigger} {kind}: {new}")
                        committed = time.perf_counter()
                        if trigger == "webhook":
                            (await client.post(f"{plnt.url}/hooks/git")).raise_for_status()
                        started = await until("Verifying", new, committed)
                        ready = await until("Ready", new, committed)
                        added = cache_entries(state_dir) - entries_before
                        if added != (1 if kind == "fresh" else 0):
                            raise SystemExit(f"{new} ({kind}) added {added} pull-cache entries: the label would be wrong")
                        pulled.append(new)
                        rows.append({"trigger": trigger, "pull": kind, "version": new, "cache_entries_added": added,
                                     "commit_to_saga_start_ms": round((started - committed) * 1000, 1),
                                     "commit_to_ready_ms": round((ready - committed) * 1000, 1)})
    finally:
        await plnt.stop()
        repo.remove()

    print(f"\n{'trigger':<18} {'pull':<7} {'commits':>7} {'commit->saga start p50':>23} {'commit->Ready p50':>18}"
          f" {'Ready min/max':>16}")
    summary: dict[str, Any] = {}
    for trigger in triggers:
        for kind in ("fresh", "cached"):
            mine = [r for r in rows if r["trigger"] == trigger and r["pull"] == kind]
            starts = [r["commit_to_saga_start_ms"] for r in mine]
            readies = [r["commit_to_ready_ms"] for r in mine]
            label = trigger if trigger == "webhook" else f"poll every {args.interval:g} s"
            summary[f"{trigger}/{kind}"] = {"commits": len(mine), "saga_start_p50_ms": round(statistics.median(starts), 1),
                                            "ready_p50_ms": round(statistics.median(readies), 1),
                                            "ready_min_ms": min(readies), "ready_max_ms": max(readies)}
            print(f"{label:<18} {kind:<7} {len(mine):>7} {statistics.median(starts):>20.0f} ms "
                  f"{statistics.median(readies):>15.0f} ms {min(readies):>7.0f}/{max(readies):.0f} ms")
    print_json(how, {"startup_ms": round(startup_s * 1000, 1), "first_ready_ms": round((first - t0) * 1000, 1),
                     "summary": summary, "commits": rows})


if __name__ == "__main__":
    asyncio.run(main())
    sys.exit(0)
