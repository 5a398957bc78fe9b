"""100 WorkflowRuns added in one commit, until all are Ready: wall time and peak memory.

Runs plnt in this process as `plnt up` does (embedded Temporal, worker, reconciler, gateway,
local runner processes) on a scratch copy of gitops-example, then commits N WorkflowRuns at once
(all review-responder@1.2.0 under different names) and waits until every one is Ready.
Peak memory is this process's VmHWM (plnt itself); the runners and the Temporal server are
separate processes and are reported separately (RSS at the end).

    python bench/many_workflowruns.py [--runs 100] [--max-sagas 8]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from plnt.reconciler.app import start
from plnt.reconciler.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
GIT = ["git", "-c", "user.name=plnt-bench", "-c", "user.email=bench@plnt.invalid"]


def git(repo: Path, *args: str) -> None:
    subprocess.run([*GIT, *args], cwd=repo, check=True, capture_output=True)


def status_kb(pid: int | str, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def rss_of(match: str) -> tuple[int, int]:
    """(count, total RSS in KiB) of processes whose command line contains `match`."""
    count = total = 0
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if match.encode() in (proc / "cmdline").read_bytes():
                    count += 1
                    total += status_kb(proc.name, "VmRSS")
            except OSError:
                continue
    return count, total


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--max-sagas", type=int, default=8, help="sagas running at once")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    scratch = Path(tempfile.mkdtemp(prefix="plnt-bench-many-"))
    repo = scratch / "repo"
    shutil.copytree(ROOT / "gitops-example", repo)
    (repo / "workflowruns" / "review-responder.yaml").unlink()
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "no workflows")

    settings = Settings(repo=str(repo), state_dir=scratch / "state", port=0, interval_s=2.0,
                        max_concurrent_sagas=args.max_sagas)
    plnt = await start(settings)
    try:
        template = (ROOT / "gitops-example" / "workflowruns" / "review-responder.yaml").read_text()
        names = [f"rr-{i:03d}" for i in range(args.runs)]
        for name in names:
            (repo / "workflowruns" / f"{name}.yaml").write_text(
                template.replace("name: review-responder\n", f"name: {name}\n"))
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", f"{args.runs} WorkflowRuns")
        committed = time.perf_counter()
        plnt.reconciler.wake()
        ready_at: dict[str, float] = {}
        while len(ready_at) < len(names):
            for status in plnt.statuses.all():
                if status.phase.value == "Ready" and status.name not in ready_at:
                    ready_at[status.name] = time.perf_counter() - committed
                if status.phase.value in ("Failed", "RolledBack"):
                    raise SystemExit(f"{status.name} ended {status.phase.value}: {status.last_error}")
            if time.perf_counter() - committed > 1800:
                raise SystemExit(f"only {len(ready_at)} of {len(names)} Ready after 30 minutes")
            await asyncio.sleep(0.2)
        wall = max(ready_at.values())
        times = sorted(ready_at.values())
        runners, runners_kb = rss_of("plnt.runner")
        temporal, temporal_kb = rss_of("start-dev")
        print(f"{args.runs} WorkflowRuns in one commit, at most {args.max_sagas} sagas at once, on {__import__('os').cpu_count()} cores:")
        print(f"  commit -> all Ready: {wall:.1f} s  (first Ready {times[0]:.1f} s, median {times[len(times) // 2]:.1f} s)")
        print(f"  throughput: {args.runs / wall:.2f} sagas/s")
        print(f"  plnt process (reconciler, worker, gateway) peak RSS: {status_kb('self', 'VmHWM') / 1024:.0f} MiB")
        print(f"  runner processes: {runners}, total RSS {runners_kb / 1024:.0f} MiB ({runners_kb / 1024 / max(runners, 1):.0f} MiB each)")
        print(f"  Temporal dev server RSS: {temporal_kb / 1024:.0f} MiB ({temporal} process)")
    finally:
        await plnt.stop()
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
