"""CPU of `plnt up` when nothing changes: N WorkflowRuns Ready on real runners, no commits, a minute.

bench/reconcile_idle.py times one reconcile pass in-process with stand-in pids and no Temporal.
This one runs plnt the way users run it: the `plnt up` console script AS A PROCESS (embedded
Temporal dev server, worker, reconciler, gateway, one real runner process per WorkflowRun), on a
scratch spec repository (bench/benchlib.py) whose one commit adds --runs WorkflowRuns (distinct
names; they share one signed recipe, as pulls are not what this bench measures; smoke budgets are
loosened so a busy machine does not roll canaries back). Once every saga has ended (the phases are
printed: Ready, or a rolled-back few) and --settle seconds have passed, it reads /proc/PID/stat
(utime + stime) of:

- plnt's own process (its threads included; not its children),
- git, the children plnt waited for (cutime + cstime of plnt's process: the polls' `git fetch`),
- plnt's gateway worker processes, when plnt up starts them (--gateway-workers),
- the embedded Temporal dev server (its own process),
- the runner processes (all of them together),

at the start and the end of --measure seconds with no commit and no request, and prints each as a
share of one core. --profile runs plnt in this process instead (`start(settings)`, as
bench/many_workflowruns.py does) and prints a cProfile of the event loop's thread over the same
window (work plnt hands to threads, like the git fetch and the spec load, is not in it).

    python bench/reconcile_idle_up.py [--runs 100] [--measure 60] [--interval 5] [--profile]

Runners are forked from plnt's zygote (`plnt up`'s default), about 11 MiB PSS each: 1,000 need about
11 GiB, so the count is an argument and is printed with the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import os
import pstats
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchlib import BenchRepo, _kind, descendants, how_it_ran, memory_pss, print_json
from plnt.reconciler.status_store import read_statuses

TICK = os.sysconf("SC_CLK_TCK")


def cpu_ticks(pid: int) -> tuple[int, int] | None:
    """(utime + stime, cutime + cstime) of a process, in clock ticks; None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[11]) + int(fields[12]), int(fields[13]) + int(fields[14])


GROUPS = ("plnt", "gateway", "git", "temporal", "runners", "other")


def kind(pid: int) -> str:
    """benchlib's kinds, and plnt's own gateway worker processes (plnt up --gateway-workers)."""
    try:
        if b"plnt.gateway.workers" in Path(f"/proc/{pid}/cmdline").read_bytes():
            return "gateway"
    except OSError:
        return "gone"
    return _kind(pid)


def sample(plnt_pid: int) -> dict[str, Any]:
    """CPU ticks so far of plnt, its reaped children (git), its gateway workers, Temporal and the
    runners, by pid."""
    own = cpu_ticks(plnt_pid) or (0, 0)
    groups: dict[str, dict[int, int]] = {"gateway": {}, "temporal": {}, "runners": {}, "other": {}}
    for pid in descendants(plnt_pid):
        ticks = cpu_ticks(pid)
        kind_of = kind(pid)
        if ticks is not None and kind_of != "gone":
            groups[kind_of][pid] = ticks[0]
    return {"at": time.monotonic(), "plnt": own[0], "git": own[1], **groups}


def shares(first: dict[str, Any], last: dict[str, Any]) -> dict[str, Any]:
    """% of one core per group between two samples (processes present in both only: no start-up)."""
    seconds = last["at"] - first["at"]
    out: dict[str, Any] = {"seconds": round(seconds, 1)}
    for group in ("plnt", "git"):
        out[group] = {"cpu_s": (last[group] - first[group]) / TICK}
    for group in ("gateway", "temporal", "runners", "other"):
        common = set(first[group]) & set(last[group])
        out[group] = {"cpu_s": sum(last[group][p] - first[group][p] for p in common) / TICK,
                      "processes": len(common)}
    for group in GROUPS:
        out[group]["core_percent"] = round(100 * out[group]["cpu_s"] / seconds, 3)
        out[group]["cpu_s"] = round(out[group]["cpu_s"], 2)
    return out


def statuses(state_dir: Path) -> dict[str, str]:
    """WorkflowRun -> phase, from plnt's status file (read as a reader of the state would)."""
    try:
        data = read_statuses(state_dir / "status.json")
    except (OSError, ValueError):
        return {}
    return {key: value.get("phase", "") for key, value in data.items()}


ENDED = ("Ready", "Failed", "RolledBack")


def wait_ended(phases: Any, runs: int, timeout_s: float) -> float:
    """Seconds until every WorkflowRun's saga has ended (Ready, or rolled back: a smoke test over
    budget on a busy machine; its runner is gone and plnt holds it, so the rest is still idle)."""
    started = time.monotonic()
    while True:
        now = phases()
        if len(now) >= runs and all(phase in ENDED for phase in now.values()):
            return time.monotonic() - started
        if time.monotonic() - started > timeout_s:
            raise SystemExit(f"only {sum(p in ENDED for p in now.values())} of {runs} ended after {timeout_s:.0f} s")
        time.sleep(1.0)


def phase_counts(phases: dict[str, str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for phase in phases.values():
        counts[phase] = counts.get(phase, 0) + 1
    return counts


def as_process(repo: BenchRepo, args: argparse.Namespace) -> dict[str, Any]:
    state_dir = repo.scratch / "state"
    plnt = Path(sys.executable).parent / "plnt"
    log = (repo.scratch / "plnt.log").open("wb")
    process = subprocess.Popen([str(plnt), "up", "--repo", str(repo.path), "--state-dir", str(state_dir),
                                "--port", "0", "--interval", str(args.interval), "--max-sagas", str(args.max_sagas)],
                               stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        to_ready = wait_ended(lambda: statuses(state_dir), args.runs, args.timeout)
        time.sleep(args.settle)
        first = sample(process.pid)
        time.sleep(args.measure)
        last = sample(process.pid)
        if process.poll() is not None:
            raise SystemExit(f"plnt exited ({process.returncode}): see {repo.scratch / 'plnt.log'}")
        memory = memory_pss(process.pid)
        return {"ready_after_s": round(to_ready, 1), "cpu": shares(first, last), "memory": memory,
                "phases": phase_counts(statuses(state_dir))}
    finally:
        runners = [pid for pid in descendants(process.pid) if kind(pid) == "runners"]
        process.send_signal(signal.SIGINT)  # plnt up stops its runners and Temporal on SIGINT
        try:
            process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        log.close()
        stop_leftovers(runners, repo.scratch)


def stop_leftovers(pids: list[int], scratch: Path) -> None:
    """Runners a plnt killed mid-deploy left behind (their own sessions): only those of this run."""
    for pid in pids:
        try:
            if str(scratch).encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


async def in_process(repo: BenchRepo, args: argparse.Namespace) -> dict[str, Any]:
    from plnt.reconciler.app import start
    from plnt.reconciler.settings import Settings

    settings = Settings(repo=str(repo.path), state_dir=repo.scratch / "state", port=0, interval_s=args.interval,
                        max_concurrent_sagas=args.max_sagas)
    plnt = await start(settings)
    try:
        def phases() -> dict[str, str]:
            return {s.key: s.phase.value for s in plnt.statuses.all()}

        to_ready = await asyncio.to_thread(wait_ended, phases, args.runs, args.timeout)
        await asyncio.sleep(args.settle)
        first = sample(os.getpid())
        profiler = cProfile.Profile()
        profiler.enable()
        await asyncio.sleep(args.measure)
        profiler.disable()
        last = sample(os.getpid())
        out = io.StringIO()
        stats = pstats.Stats(profiler, stream=out)
        stats.sort_stats("tottime").print_stats(args.top)
        stats.sort_stats("cumulative").print_stats(args.top)
        return {"ready_after_s": round(to_ready, 1), "cpu": shares(first, last), "profile": out.getvalue(),
                "phases": phase_counts(phases())}
    finally:
        runners = [pid for pid in descendants(os.getpid()) if kind(pid) == "runners"]
        await plnt.stop()
        stop_leftovers(runners, repo.scratch)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=100, help="WorkflowRuns, each with a real runner process")
    parser.add_argument("--measure", type=float, default=60.0, help="seconds measured with nothing changing")
    parser.add_argument("--settle", type=float, default=15.0, help="seconds waited after all are Ready")
    parser.add_argument("--interval", type=float, default=5.0, help="plnt up --interval (its default: 5)")
    parser.add_argument("--max-sagas", type=int, default=8)
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds allowed to get all Ready")
    parser.add_argument("--profile", action="store_true", help="plnt in this process, with a cProfile")
    parser.add_argument("--top", type=int, default=30, help="profile entries shown")
    args = parser.parse_args()
    how = how_it_ran("reconcile_idle_up.py", vars(args), [
        ("plnt in this process (start(settings)), cProfile of the event loop thread over the window"
         if args.profile else "`plnt up` console script as a process: embedded Temporal, worker, reconciler, gateway"),
        f"{args.runs} WorkflowRuns in one commit, one real runner process each (one shared signed recipe), "
        f"every saga ended (Ready, or rolled back: counted), then {args.settle:g} s settle and {args.measure:g} s measured with no commit and no request",
        "CPU from /proc/PID/stat utime+stime: plnt's own process; git = plnt's reaped children (cutime+cstime); "
        "the Temporal dev server; the runners together; % of one core"])
    repo = BenchRepo("plnt-bench-idle-up-")
    try:
        repo.publish("rr", "1.0.0")
        for i in range(args.runs):
            repo.write_run(f"rr-{i:04d}", "rr", "1.0.0", invocations=2)
            run = repo.path / "workflowruns" / f"rr-{i:04d}.yaml"  # a busy machine must not fail the canaries
            run.write_text(run.read_text().replace("p95BudgetMs: 2500", "p95BudgetMs: 20000"))
        repo.commit(f"{args.runs} WorkflowRuns")
        result = asyncio.run(in_process(repo, args)) if args.profile else as_process(repo, args)
    finally:
        repo.remove()
    cpu = result["cpu"]
    print(f"\n{args.runs} WorkflowRuns, sagas ended after {result['ready_after_s']} s ({result['phases']}); "
          f"then {cpu['seconds']} s idle:")
    print(f"{'process':<10} {'processes':>9} {'CPU s':>7} {'% of a core':>12}")
    for group in GROUPS:
        count = cpu[group].get("processes", 1)
        print(f"{group:<10} {count:>9} {cpu[group]['cpu_s']:>7.2f} {cpu[group]['core_percent']:>12.3f}")
    if "profile" in result:
        print("\ncProfile of the event loop thread over the window (tottime, then cumulative):")
        print(result["profile"])
    print_json(how, {k: v for k, v in result.items() if k != "profile"})


if __name__ == "__main__":
    main()
