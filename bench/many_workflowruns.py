"""N WorkflowRuns with distinct recipes added in one commit, until all are Ready: wall time, and the
memory of plnt's own processes (PSS).

Runs plnt in this process as `plnt up` does (embedded Temporal, worker, reconciler, gateway, local
runner processes) on a scratch spec repository (bench/benchlib.py). The commit adds N WorkflowRuns,
each naming its own recipe (rr-000@1.0.0, rr-001@1.0.0, ...: distinct signed archives published in
the repository's registry, signed by a throwaway authority made for this run), so every saga
fetches, checks and verifies a recipe plnt never pulled; the bench checks that plnt's pull cache
gained exactly N entries.

Memory is PSS (/proc/PID/smaps_rollup: a page shared by n processes counts 1/n to each), sampled
while the sagas run and at the end, for this process (plnt: reconciler, worker, gateway) and for the
processes it started, apart: runners, the Temporal dev server, anything else. Processes plnt did
not start (another plnt, another bench's runners) are not counted.

Runners start as `plnt up` starts them: forked from the zygote (`--runner-start fork`, the default) or
exec'd (`--runner-start exec`). The zygote counts with the runners (its pages are what they share).
At 1,000 runs sample less often (`--sample-every 15`): reading 1,000 smaps_rollup files costs CPU
(the sampler runs in a process of its own, beside plnt, and its CPU is printed apart).

With `--scale-to-zero-after S` every WorkflowRun says `replicas: {min: 0}` and the local backend
`scaleToZeroAfterSeconds: S`: runners park after S idle seconds. The bench then waits for all of
them to park, and invokes `--wake-sample` of them through the gateway twice: the first request
starts the parked runner (cold), the second finds it running (warm).

    python bench/many_workflowruns.py [--runs 100] [--max-sagas 8] [--invocations 10] [--runner-start fork]
                                      [--scale-to-zero-after S] [--wake-sample 20]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import statistics
import sys
import time
from typing import Any

from benchlib import BenchRepo, cache_entries, cpu_seconds, how_it_ran, memory_pss, print_json, standin_python, vm_hwm_mib
from plnt.reconciler.app import start
from plnt.reconciler.settings import Settings

# The PSS sampler's process: plnt's process tree (argv[1]) without the sampler itself, and its own CPU.
SAMPLER = (f"import json, os, sys, time; sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r}); "
           "from benchlib import memory_pss; "
           "found = memory_pss(int(sys.argv[1]), exclude=os.getpid()); "
           "print(json.dumps({'found': found, 'cpu_s': time.process_time()}))")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--max-sagas", type=int, default=8, help="sagas running at once")
    parser.add_argument("--invocations", type=int, default=10, help="smoke-test invocations per canary")
    parser.add_argument("--standin-runners", action="store_true",
                        help="start the STAND-IN runner (bench/standin/runner.py: no recipe code, milliseconds to "
                             "start) instead of plnt's runner: the sagas without runner start")
    parser.add_argument("--sample-every", type=float, default=2.0, help="seconds between PSS samples")
    parser.add_argument("--runner-start", choices=["fork", "exec"], default="fork", help="how runners start")
    parser.add_argument("--p95-budget-ms", type=int, default=2500,
                        help="each canary's smoke-test p95 budget (gitops-example's 2500; raise it on a machine "
                             "others load, where a busy plnt would roll canaries back)")
    parser.add_argument("--scale-to-zero-after", type=float, default=None, metavar="S",
                        help="replicas.min: 0 and the backend's scaleToZeroAfterSeconds: S (runners park when idle)")
    parser.add_argument("--wake-sample", type=int, default=20,
                        help="with --scale-to-zero-after: parked WorkflowRuns invoked cold, then warm")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO if os.environ.get("PLNT_BENCH_LOG") else logging.WARNING)
    how = how_it_ran("many_workflowruns.py", vars(args), [
        "plnt up in this process: embedded Temporal dev server (SQLite in the state dir), local runner processes "
        + ("(STAND-IN runners: bench/standin/runner.py, no recipe code; not plnt's runner)" if args.standin_runners
           else f"({args.runner_start}: " + ("forked from the pre-imported zygote" if args.runner_start == "fork"
                                             else "a fresh python -m plnt.runner each") + ")"),
        f"one commit adds {args.runs} WorkflowRuns, each with its own recipe (distinct signed archives, "
        f"each pulled fresh: checked, +{args.runs} pull-cache entries)",
        "memory: PSS of this process and of the processes it started (runners, Temporal), sampled "
        f"every {args.sample_every:g} s; peak = largest sampled total",
        f"smoke test per canary: {args.invocations} invocations, p95 budget {args.p95_budget_ms} ms",
        *([f"scale to zero: replicas.min 0, runners park after {args.scale_to_zero_after:g} idle seconds; then "
           f"{args.wake_sample} parked WorkflowRuns invoked through the gateway, cold (the request starts the runner) "
           "and again warm"] if args.scale_to_zero_after else [])])

    repo = BenchRepo("plnt-bench-many-")
    if args.scale_to_zero_after:
        repo.scale_to_zero_after(args.scale_to_zero_after)
    repo.commit("no workflows")
    state_dir = repo.scratch / "state"
    settings = Settings(repo=str(repo.path), state_dir=state_dir, port=0, interval_s=2.0,
                        max_concurrent_sagas=args.max_sagas,
                        runner_start="exec" if args.standin_runners else args.runner_start)  # stand-ins are exec'd
    plnt = await start(settings)
    if args.standin_runners:
        plnt.driver._spawner._python = standin_python(repo.scratch)  # bench-only: see --standin-runners
    samples: list[dict[str, Any]] = []

    async def sample_apart() -> tuple[dict[str, Any], float]:
        """PSS of plnt's processes, read by a process of the bench's own. Read in plnt's process (a
        thread), the 1,000 smaps_rollup files held its GIL for seconds every sample and stalled the
        sagas (and the Ready times this loop records): 255 s against 225 s unsampled at 1,000."""
        child = await asyncio.create_subprocess_exec(sys.executable, "-c", SAMPLER, str(os.getpid()),
                                                     stdout=asyncio.subprocess.PIPE)
        out, _ = await child.communicate()
        if child.returncode != 0:
            raise SystemExit(f"the PSS sampler failed (exit code {child.returncode})")
        answer = json.loads(out)
        return answer["found"], answer["cpu_s"]

    try:
        idle = memory_pss()
        names = [f"rr-{i:03d}" for i in range(args.runs)]
        for name in names:
            repo.publish(name, "1.0.0")  # signing is the authors' CI: before the commit, not timed
            repo.write_run(name, name, "1.0.0", invocations=args.invocations, p95_budget_ms=args.p95_budget_ms,
                           min_replicas=0 if args.scale_to_zero_after else 1)
        entries_before = cache_entries(state_dir)
        cpu_before = cpu_seconds()
        repo.commit(f"{args.runs} WorkflowRuns")
        committed = time.perf_counter()
        plnt.reconciler.wake()
        ready_at: dict[str, float] = {}
        next_sample = committed
        sampler_cpu = 0.0
        sampling: asyncio.Task[tuple[dict[str, Any], float]] | None = None
        sample_started, ready_then = 0.0, 0

        def keep(sample: tuple[dict[str, Any], float]) -> float:
            """Notes a finished sample as of when it began; returns the sampler's CPU seconds."""
            found, spent = sample
            samples.append({"at_s": round(sample_started - committed, 1), "ready": ready_then, **found})
            return spent
        while len(ready_at) < len(names):
            now = time.perf_counter()
            for status in plnt.statuses.all():
                if status.phase.value == "Ready" and status.name not in ready_at:
                    ready_at[status.name] = now - committed
                if status.phase.value in ("Failed", "RolledBack"):
                    raise SystemExit(f"{status.name} ended {status.phase.value}: {status.last_error}")
            # Sampled beside this loop, which keeps noting Ready times meanwhile.
            if sampling is None and now >= next_sample:
                sampling = asyncio.create_task(sample_apart())
                sample_started, ready_then = now, len(ready_at)
            elif sampling is not None and sampling.done():
                sampler_cpu += keep(sampling.result())
                sampling, next_sample = None, now + args.sample_every
            if now - committed > 1800:
                raise SystemExit(f"only {len(ready_at)} of {len(names)} Ready after 30 minutes")
            await asyncio.sleep(0.2)
        wall = max(ready_at.values())
        cpu = {k: round(v - cpu_before[k], 2) for k, v in cpu_seconds().items()}
        if sampling is not None:
            sampler_cpu += keep(await sampling)  # (its process is gone: not in the CPU columns above)
        # The sampler's CPU (reading 1,000 smaps_rollup files a sample) is the bench's, in a process
        # of its own: in none of the columns above.
        cpu["bench_pss_sampling"] = round(sampler_cpu, 2)
        end = memory_pss()
        samples.append({"at_s": round(wall, 1), "ready": len(ready_at), **end})
        pulled = cache_entries(state_dir) - entries_before
        if pulled != args.runs:
            raise SystemExit(f"{pulled} pulls for {args.runs} distinct recipes: not every one was pulled fresh")
        peak = max(samples, key=lambda s: s["total_pss_mib"])
        plnt_hwm = vm_hwm_mib()
        wakes = await parked_then_woken(plnt, names, args) if args.scale_to_zero_after else None
    finally:
        await plnt.stop()
        repo.remove()

    times = sorted(ready_at.values())
    print(f"\n{args.runs} WorkflowRuns (distinct recipes, each pulled fresh) in one commit, at most "
          f"{args.max_sagas} sagas at once, on {os.cpu_count()} cores:")
    print(f"  commit -> all Ready: {wall:.1f} s  (first Ready {times[0]:.1f} s, median {statistics.median(times):.1f} s)")
    print(f"  throughput: {args.runs / wall:.2f} sagas/s")
    print(f"\n  {'PSS, MiB':<30} {'idle':>8} {'at the end':>11} {'at the peak':>12} {'processes':>10}")
    for group, label in (("plnt", "plnt (this process)"), ("runners", "runner processes"),
                         ("temporal", "Temporal dev server"), ("other", "other children")):
        print(f"  {label:<30} {idle[group]['pss_mib']:>8.0f} {end[group]['pss_mib']:>11.0f} "
              f"{peak[group]['pss_mib']:>12.0f} {end[group]['processes']:>10}")
    print(f"  {'total':<30} {idle['total_pss_mib']:>8.0f} {end['total_pss_mib']:>11.0f} {peak['total_pss_mib']:>12.0f}")
    print(f"\n  CPU seconds from commit to all Ready: plnt {cpu['plnt']:.1f}, Temporal {cpu['temporal']:.1f}, "
          f"runners (alive at the end) {cpu['runners']:.1f}, other {cpu['other']:.1f}  (wall {wall:.1f} s, "
          f"{os.cpu_count()} cores)")
    print(f"  (the bench's own PSS sampling, in a process of its own, in none of these: {cpu['bench_pss_sampling']:.1f} s)")
    runners = end["runners"]
    if runners["processes"]:
        print(f"  per runner: {runners['pss_mib'] / runners['processes']:.1f} MiB PSS")
    print(f"  plnt process peak RSS (VmHWM): {plnt_hwm:.0f} MiB")
    if wakes is not None:
        print(f"\n  scale to zero: all {args.runs} parked {wakes['all_parked_s']:.1f} s after the last Ready; then "
              f"PSS {wakes['parked_pss']['total_pss_mib']:.0f} MiB in all ({wakes['parked_pss']['runners']['processes']} "
              "runner processes: the zygote)")
        for kind in ("cold", "warm"):
            ms = sorted(wakes[f"{kind}_ms"])
            print(f"  {kind} invoke through the gateway ({len(ms)}): p50 {statistics.median(ms):.1f} ms, "
                  f"max {ms[-1]:.1f} ms")
    print_json(how, {"runs": args.runs, "all_ready_s": round(wall, 2), "first_ready_s": round(times[0], 2),
                     "median_ready_s": round(statistics.median(times), 2), "sagas_per_s": round(args.runs / wall, 3),
                     "fresh_pulls": pulled, "cpu_s": cpu, "pss_idle": idle, "pss_end": end, "pss_peak": peak,
                     "plnt_vm_hwm_mib": plnt_hwm, "pss_samples": samples,
                     "ready_s": {name: round(t, 2) for name, t in sorted(ready_at.items())}, "scale_to_zero": wakes})


async def parked_then_woken(plnt: Any, names: list[str], args: argparse.Namespace) -> dict[str, Any]:
    """Wait until every runner parked (as GET /workflows reports it), note the memory, then invoke
    `--wake-sample` of them through the gateway: cold (the request starts the runner), then warm."""
    import httpx

    started = time.perf_counter()
    async with httpx.AsyncClient(trust_env=False, timeout=60) as client:
        while True:
            rows = (await client.get(f"{plnt.url}/workflows")).json()
            parked = sum(1 for row in rows if row.get("parked"))
            if parked == len(names):
                break
            if time.perf_counter() - started > args.scale_to_zero_after + 300:
                raise SystemExit(f"only {parked} of {len(names)} runners parked")
            await asyncio.sleep(1.0)
        all_parked = time.perf_counter() - started
        parked_pss = memory_pss()
        cold, warm = [], []
        body = {"review": "Great service but slow parking", "brand_voice": "warm, brief"}
        for name in names[:: max(1, len(names) // args.wake_sample)][: args.wake_sample]:
            for into in (cold, warm):
                t0 = time.perf_counter()
                answer = await client.post(f"{plnt.url}/workflows/{name}/invoke", json=body)
                into.append(round((time.perf_counter() - t0) * 1000, 2))
                if answer.status_code != 200:
                    raise SystemExit(f"{name}: invoke answered {answer.status_code}: {answer.text[:300]}")
    return {"all_parked_s": round(all_parked, 1), "parked_pss": parked_pss, "cold_ms": cold, "warm_ms": warm}


if __name__ == "__main__":
    asyncio.run(main())
