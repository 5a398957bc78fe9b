"""Where one saga's time goes, from a commit to Ready, step by step, on real Temporal.

Starts plnt in this process exactly as `plnt up` does (embedded Temporal dev server with its SQLite
database in the state dir, local runner processes, gateway) on a scratch spec repository
(bench/benchlib.py). Each commit publishes a recipe version plnt has never pulled (a distinct
signed archive, checked: +1 pull-cache entry) and points review-responder at it; the commit is
announced by the git webhook (POST /hooks/git), one commit at a time.

Each saga's milestones, all on this machine's wall clock:
- plnt's side, timed by wrapping (not changing) its methods in this process: the webhook answered,
  the reconcile pass entered, git fetch, spec load (parse), plan until the saga is started, the
  start_workflow call, the local driver's runner start (spawn, then its health polls);
- Temporal's side, from the saga's workflow history: each workflow task (scheduled, started,
  completed: its schedule-to-start is Temporal's latency, started-to-completed the worker's) and
  each activity (scheduled, started, completed);
- each status write (the progress from the saga's code, the outcome by the record_phase local
  activity: neither leaves a timing in the history).
Sorted by time, the gaps between consecutive milestones add up to commit -> Ready; the table gives
each gap's p50/p95 over the commits, named "previous -> this milestone".

    python bench/saga_profile.py [--commits 10] [--warmup 2]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import statistics
import sys
import time
from collections import defaultdict
from typing import Any

import httpx
from benchlib import BenchRepo, cache_entries, how_it_ran, print_json, standin_python
from plnt.reconciler.app import start
from plnt.reconciler.saga.io import saga_workflow_id
from plnt.reconciler.settings import Settings
from temporalio.api.enums.v1 import EventType

RECIPE = "review-responder"
KEY = f"default/{RECIPE}"


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))]


class Clock:
    """Milestones of the saga under way: (wall time, label)."""

    def __init__(self) -> None:
        self.marks: list[tuple[float, str]] = []
        self.counts: dict[str, int] = defaultdict(int)
        self.extra: dict[str, float] = {}

    def mark(self, label: str, at: float | None = None) -> None:
        self.counts[label] += 1
        n = self.counts[label]
        self.marks.append((time.time() if at is None else at, label if n == 1 else f"{label} #{n}"))

    def reset(self) -> None:
        self.marks, self.counts, self.extra = [], defaultdict(int), {}


def instrument(plnt: Any, clock: Clock) -> None:
    """Timing wrappers on this process's plnt objects: the code they wrap runs unchanged."""
    reconciler, source, driver = plnt.reconciler, plnt.reconciler._source, plnt.driver
    armed = {"on": False}  # only the first pass after the webhook is timed

    fetch = source.fetch

    def timed_fetch() -> str:
        if armed["on"]:
            clock.mark("git fetch start")
        out = fetch()
        if armed["on"]:
            clock.mark("git fetch done")
        return out

    source.fetch = timed_fetch
    load = reconciler._load

    async def timed_load(commit: str) -> Any:
        out = await load(commit)
        if armed["on"]:
            clock.mark("specs loaded (parse)")
        return out

    reconciler._load = timed_load
    start_saga = reconciler._start_saga

    async def timed_start_saga(*args: Any, **kwargs: Any) -> None:
        clock.mark("planned: start_workflow called")
        await start_saga(*args, **kwargs)
        clock.mark("start_workflow returned")
        armed["on"] = False

    reconciler._start_saga = timed_start_saga
    once = reconciler.reconcile_once

    async def timed_once(**kwargs: Any) -> Any:
        if armed["on"] and "reconcile pass entered" not in clock.counts:
            clock.mark("reconcile pass entered")
        return await once(**kwargs)

    reconciler.reconcile_once = timed_once
    wait_healthy, healthy = driver._processes.wait_healthy, driver._processes.healthy

    async def timed_wait_healthy(release: Any, child: Any) -> bool:
        clock.mark("runner spawned (Popen returned)")
        ok = await wait_healthy(release, child)
        clock.mark("runner healthy (poll answered)")
        return ok

    async def timed_healthy(release: Any, version: str, timeout_s: float) -> bool:
        ok = await healthy(release, version, timeout_s)
        if not ok:
            clock.extra["health_polls_failed"] = clock.extra.get("health_polls_failed", 0) + 1
            clock.extra["last_failed_poll"] = time.time()
        return ok

    driver._processes.wait_healthy, driver._processes.healthy = timed_wait_healthy, timed_healthy
    refresh = plnt.statuses.on_change

    def on_change() -> None:
        status = plnt.statuses.get(KEY)
        if status is not None and clock.marks:
            clock.mark(f"status {status.phase.value} written")
        refresh()

    plnt.statuses.on_change = on_change
    return armed  # type: ignore[return-value]


async def history_marks(plnt: Any, clock: Clock) -> dict[str, float]:
    """The saga's workflow task and activity events, as milestones; returns Temporal's own latencies."""
    handle = plnt.client.get_workflow_handle(saga_workflow_id("default", RECIPE))
    history = await handle.fetch_history()
    activities: dict[int, str] = {}
    wft = 0
    temporal = {"wft_schedule_to_start_ms": 0.0, "wft_run_ms": 0.0, "activity_schedule_to_start_ms": 0.0,
                "workflow_tasks": 0}
    scheduled_at: dict[int, float] = {}
    for event in history.events:
        at = event.event_time.seconds + event.event_time.nanos / 1e9
        kind = event.event_type
        if kind == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
            clock.mark("temporal: workflow started", at)
        elif kind == EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED:
            wft += 1
            scheduled_at[-event.event_id] = at
            clock.mark("temporal: workflow task scheduled", at)
        elif kind == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED:
            temporal["wft_schedule_to_start_ms"] += (at - scheduled_at[-event.workflow_task_started_event_attributes.scheduled_event_id]) * 1000
            scheduled_at[event.event_id] = at
            clock.mark("temporal: workflow task started", at)
        elif kind == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
            temporal["wft_run_ms"] += (at - scheduled_at[event.workflow_task_completed_event_attributes.started_event_id]) * 1000
            temporal["workflow_tasks"] += 1
            clock.mark("temporal: workflow task completed", at)
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            name = event.activity_task_scheduled_event_attributes.activity_type.name
            activities[event.event_id] = name
            scheduled_at[event.event_id] = at
            clock.mark(f"{name} scheduled", at)
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            sid = event.activity_task_started_event_attributes.scheduled_event_id
            temporal["activity_schedule_to_start_ms"] += (at - scheduled_at[sid]) * 1000
            # A started event is written when the activity ends (its time is the start, though).
            clock.mark(f"{activities[sid]} started", at)
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            clock.mark(f"{activities[event.activity_task_completed_event_attributes.scheduled_event_id]} completed", at)
    return {k: round(v, 1) for k, v in temporal.items()}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--commits", type=int, default=10, help="timed commits (each a fresh recipe version)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed commits first (imports, first connections)")
    parser.add_argument("--standin-runners", action="store_true",
                        help="start the STAND-IN runner (bench/standin/runner.py: no recipe code, milliseconds to "
                             "start) instead of plnt's runner: the saga without runner start")
    parser.add_argument("--runner-start", choices=["fork", "exec"], default="fork", help="how real runners start")
    parser.add_argument("--label", default="", help="a name for this run in the output (e.g. before/after)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO if os.environ.get("PLNT_BENCH_LOG") else logging.WARNING,
                        format="%(asctime)s.%(msecs)03d %(name)s %(message)s", datefmt="%H:%M:%S")
    how = how_it_ran("saga_profile.py", vars(args), [
        "plnt up in this process: embedded Temporal dev server (SQLite in the state dir), local runner processes "
        + ("(STAND-IN runners: bench/standin/runner.py, no recipe code; not plnt's runner)" if args.standin_runners
           else f"(real runners, {args.runner_start}: " + ("forked from the pre-imported zygote)" if args.runner_start == "fork"
                                                           else "a fresh interpreter each)")),
        "each commit: a recipe version never pulled (distinct signed archive, checked: +1 pull-cache entry), "
        "announced by POST /hooks/git; one saga at a time",
        "each saga: validate, pull and verify, canary runner, 10-invocation smoke test, promote",
        "plnt's steps timed by wrappers in this process; Temporal's from the workflow history; "
        "status writes by the status store's change hook"])

    repo = BenchRepo("plnt-bench-profile-")
    versions = iter(f"3.{n}.0" for n in range(10_000))
    version = next(versions)
    repo.publish(RECIPE, version)
    repo.write_run(RECIPE, RECIPE, version)
    repo.commit(f"{RECIPE} {version}")
    state_dir = repo.scratch / "state"
    # A long poll interval: every timed pass is the webhook's.
    settings = Settings(repo=str(repo.path), state_dir=state_dir, port=0, interval_s=600,
                        runner_start="exec" if args.standin_runners else args.runner_start)  # stand-ins are exec'd
    plnt = await start(settings)
    if args.standin_runners:
        plnt.driver._spawner._python = standin_python(repo.scratch)  # bench-only: see --standin-runners
    clock = Clock()
    armed = instrument(plnt, clock)
    profiles: list[dict[str, Any]] = []

    async def until_ready(version: str, timeout: float = 120) -> None:
        deadline = time.perf_counter() + timeout
        while time.perf_counter() < deadline:
            status = plnt.statuses.get(KEY)
            if status is not None and status.version == version and status.phase.value == "Ready":
                return
            if status is not None and status.attempted_version == version and status.phase.value in ("Failed", "RolledBack"):
                raise SystemExit(f"{version} ended {status.phase.value}: {status.last_error}")
            await asyncio.sleep(0.002)
        raise TimeoutError(f"{version} never reached Ready")

    try:
        await until_ready(version, 180)
        async with httpx.AsyncClient(trust_env=False) as client:
            for n in range(args.warmup + args.commits):
                await asyncio.sleep(1.0)  # the pass after the previous saga's end is over
                new = next(versions)
                repo.publish(RECIPE, new)  # signing is the author's CI: before the commit, not timed
                repo.write_run(RECIPE, RECIPE, new)
                before = cache_entries(state_dir)
                repo.commit(f"fresh {new}")
                clock.reset()
                armed["on"] = True
                clock.mark("commit made; POST /hooks/git sent")
                (await client.post(f"{plnt.url}/hooks/git")).raise_for_status()
                clock.mark("webhook answered")
                await until_ready(new)
                ready = time.time()
                if cache_entries(state_dir) - before != 1:
                    raise SystemExit(f"{new} was not a fresh pull: the label would be wrong")
                temporal = await history_marks(plnt, clock)
                marks = sorted(m for m in clock.marks if m[0] <= ready + 0.0005)
                steps = [(f"{a[1]} -> {b[1]}", (b[0] - a[0]) * 1000) for a, b in zip(marks, marks[1:], strict=False)]
                install = {label: at for at, label in clock.marks}
                health_wait = (install["runner healthy (poll answered)"] - install["runner spawned (Popen returned)"]) * 1000
                overshoot = (install["runner healthy (poll answered)"] - clock.extra.get("last_failed_poll", 0)) * 1000 \
                    if "last_failed_poll" in clock.extra else None
                if n >= args.warmup:
                    profiles.append({"version": new, "commit_to_ready_ms": round((marks[-1][0] - marks[0][0]) * 1000, 1),
                                     "steps": [(label, round(ms, 2)) for label, ms in steps], "temporal": temporal,
                                     "runner_spawn_to_healthy_ms": round(health_wait, 1),
                                     "health_polls_failed": int(clock.extra.get("health_polls_failed", 0)),
                                     "last_failed_poll_to_healthy_ms": round(overshoot, 1) if overshoot else None})
    finally:
        await plnt.stop()
        repo.remove()

    # Steps in the order they happen (by their median end), named by the milestone pair.
    by_step: dict[str, list[float]] = defaultdict(list)
    order: dict[str, list[int]] = defaultdict(list)
    for profile in profiles:
        for i, (label, ms) in enumerate(profile["steps"]):
            by_step[label].append(ms)
            order[label].append(i)
    print(f"\n{args.label + ': ' if args.label else ''}one saga, commit -> Ready, {len(profiles)} fresh commits "
          f"(webhook), steps seen in at least half of them:")
    print(f"{'step (previous milestone -> this one)':<100} {'n':>3} {'p50 ms':>8} {'p95 ms':>8}")
    for label in sorted(by_step, key=lambda k: statistics.median(order[k])):
        values = by_step[label]
        if len(values) * 2 < len(profiles):
            continue
        print(f"{label[:100]:<100} {len(values):>3} {statistics.median(values):>8.1f} {pct(values, 95):>8.1f}")
    totals = [p["commit_to_ready_ms"] for p in profiles]
    print(f"{'commit -> Ready':<100} {len(totals):>3} {statistics.median(totals):>8.1f} {pct(totals, 95):>8.1f}")
    summary: dict[str, Any] = {"commit_to_ready_p50_ms": round(statistics.median(totals), 1),
                               "commit_to_ready_p95_ms": round(pct(totals, 95), 1)}
    for key in ("wft_schedule_to_start_ms", "wft_run_ms", "activity_schedule_to_start_ms", "workflow_tasks"):
        values = [p["temporal"][key] for p in profiles]
        summary[f"temporal_{key}_p50"] = round(statistics.median(values), 1)
    for key in ("runner_spawn_to_healthy_ms", "health_polls_failed"):
        summary[f"{key}_p50"] = statistics.median(p[key] for p in profiles)
    print("\nTemporal's own share per saga (p50 of the sums): "
          f"workflow tasks {summary['temporal_workflow_tasks_p50']:.0f}, their schedule-to-start "
          f"{summary['temporal_wft_schedule_to_start_ms_p50']:.1f} ms, their run on the worker "
          f"{summary['temporal_wft_run_ms_p50']:.1f} ms; activities' schedule-to-start "
          f"{summary['temporal_activity_schedule_to_start_ms_p50']:.1f} ms")
    print(f"runner spawn -> healthy p50 {summary['runner_spawn_to_healthy_ms_p50']:.0f} ms "
          f"({summary['health_polls_failed_p50']:.0f} failed health polls first)")
    print_json(how, {"summary": summary, "profiles": profiles})


if __name__ == "__main__":
    asyncio.run(main())
    sys.exit(0)
