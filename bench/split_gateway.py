"""The gateway as its own role: invoke latency through `plnt gateway` vs through plnt up's own gateway,
and the time from a commit to the new version being served by both followers.

Starts, on 127.0.0.1, a real `plnt up` (console script: embedded Temporal, reconciler, worker, its own
gateway; review-responder from a scratch git copy of gitops-example, runner with the offline mock
model) with `--internal-token-file`, and two `plnt gateway` processes following it. All three
gateways route to the same runner process. Then:

1. for each concurrency (default 1 and 32): alternating rounds of the same load through plnt up's
   gateway, gateway A and gateway B (so drift hits all alike); p50/p95/p99 and throughput of each;
2. N commits alternating review-responder 1.3.0 / 1.2.0, each followed by POST /hooks/git to plnt up:
   time from the commit to each of the three gateways answering with the new version (polled every
   20 ms through each).

Prints how it ran, a table, and the raw JSON.

    python bench/split_gateway.py [--requests 1500] [--concurrency 1,32] [--rounds 3] [--commits 4]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from benchlib import BULK_RUN, git  # noqa: E402
from plnt.gateway.bench import Load, percentile, run_load  # noqa: E402
from plnt.reconciler.drivers.processes import free_port  # noqa: E402

PLNT = [str(Path(sys.executable).parent / "plnt")]
RUN_FILE = "workflowruns/review-responder.yaml"
PAYLOAD = json.dumps({"review": "Great service but slow parking", "brand_voice": "warm, brief"}).encode()


def spawn(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})


async def wait_until(check: Any, what: str, timeout: float = 90.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = await check()
        if value:
            return value
        await asyncio.sleep(0.1)
    raise TimeoutError(f"{what} not within {timeout:.0f}s")


async def version_at(client: httpx.AsyncClient, url: str) -> str | None:
    try:
        response = await client.post(f"{url}/workflows/review-responder/invoke", content=PAYLOAD,
                                     headers={"content-type": "application/json"})
    except httpx.HTTPError:
        return None
    return response.json().get("version") if response.status_code == 200 else None


def pcts(load: Load) -> dict[str, float]:
    ordered = sorted(s.latency_s for s in load.samples if s.ok)
    return {f"p{q}": round(percentile(ordered, q) * 1000, 3) for q in (50, 95, 99)}


async def latency(paths: dict[str, str], concurrency: int, requests: int, rounds: int) -> dict[str, Any]:
    loads = {label: Load() for label in paths}
    per_round = max(1, requests // rounds)
    for _ in range(rounds):
        for label, url in paths.items():
            got = await run_load(url, "/workflows/review-responder/invoke", PAYLOAD, requests=per_round,
                                 concurrency=concurrency, parse_results=False, warmup=concurrency * 2)
            loads[label].samples += got.samples
            loads[label].wall_s += got.wall_s
    return {label: {"requests": len(load.samples), "errors": sum(not s.ok for s in load.samples),
                    "latency_ms": pcts(load), "rps": round(len(load.samples) / load.wall_s, 1)}
            for label, load in loads.items()}


async def commit_to_served(repo: Path, up_url: str, paths: dict[str, str], commits: int) -> list[dict[str, float]]:
    rows: list[dict[str, float]] = []
    async with httpx.AsyncClient(trust_env=False, timeout=30) as client:
        for i in range(commits):
            version = "1.3.0" if i % 2 == 0 else "1.2.0"
            other = "1.2.0" if version == "1.3.0" else "1.3.0"
            text = (repo / RUN_FILE).read_text()
            (repo / RUN_FILE).write_text(text.replace(f"review-responder@{other}", f"review-responder@{version}"))
            git(repo, "commit", "-qam", f"review-responder {version}")
            t0 = time.monotonic()
            (await client.post(f"{up_url}/hooks/git")).raise_for_status()
            seen: dict[str, float] = {}
            deadline = t0 + 120
            while len(seen) < len(paths) and time.monotonic() < deadline:
                for label, url in paths.items():
                    if label not in seen and await version_at(client, url) == version:
                        seen[label] = round((time.monotonic() - t0) * 1000, 1)
                await asyncio.sleep(0.02)
            if len(seen) < len(paths):
                raise TimeoutError(f"{version} not served by all within 120 s: {seen}")
            rows.append({"version": version, **seen})  # type: ignore[dict-item]
            await asyncio.sleep(1.0)  # let the old runner drain and stop before the next commit
    return rows




async def busy_latency(repo: Path, up_url: str, paths: dict[str, str], runs: int, rounds: int,
                       requests: int) -> dict[str, Any]:
    """Invoke latency (concurrency 1) while plnt up reads and validates commits of `runs` WorkflowRuns.

    Each WorkflowRun names a backend that does not exist, so every commit is refused whole after
    all its files are parsed and checked (no saga, no runner: the load is the reconciler's own);
    each round commits again (the backend name changes in every file) and hooks, then measures."""
    loads = {label: Load() for label in paths}
    bulk = repo / "workflowruns" / "bulk"
    bulk.mkdir(exist_ok=True)
    async with httpx.AsyncClient(trust_env=False, timeout=30) as client:
        for round_ in range(rounds):
            for i in range(runs):
                (bulk / f"bulk-{i:04d}.yaml").write_text(BULK_RUN.format(i=i, round=round_))
            git(repo, "add", "-A")
            git(repo, "commit", "-qm", f"{runs} WorkflowRuns, round {round_}")
            (await client.post(f"{up_url}/hooks/git")).raise_for_status()
            await asyncio.sleep(0.05)
            order = list(paths.items())
            for label, url in order if round_ % 2 == 0 else reversed(order):
                got = await run_load(url, "/workflows/review-responder/invoke", PAYLOAD, requests=requests,
                                     concurrency=1, parse_results=False)
                loads[label].samples += got.samples
                loads[label].wall_s += got.wall_s
    # Leave the repository as it was (the commit-to-served phase runs after this one).
    for item in bulk.iterdir():
        item.unlink()
    bulk.rmdir()
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "bulk WorkflowRuns removed")
    return {label: {"requests": len(load.samples), "errors": sum(not s.ok for s in load.samples),
                    "latency_ms": pcts(load)} for label, load in loads.items()}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=1500, help="requests per path and concurrency")
    parser.add_argument("--concurrency", default="1,32")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--commits", type=int, default=4)
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory (logs)")
    parser.add_argument("--busy-runs", type=int, default=0, help=(
        "also measure invoke latency (concurrency 1) while plnt up reads commits of this many WorkflowRuns "
        "(e.g. 1000; each commit refused for an unknown backend, so no saga runs)"))
    parser.add_argument("--busy-rounds", type=int, default=6)
    args = parser.parse_args()

    scratch = Path(tempfile.mkdtemp(prefix="plnt-bench-split-"))
    repo = scratch / "repo"
    shutil.copytree(ROOT / "gitops-example", repo)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "initial")
    token_file = scratch / "internal-token"
    token_file.write_text(os.urandom(16).hex() + "\n")
    up_port = free_port()
    up_url = f"http://127.0.0.1:{up_port}"
    procs: list[subprocess.Popen[bytes]] = []
    try:
        procs.append(spawn([*PLNT, "up", "--repo", str(repo), "--state-dir", str(scratch / "state"), "--port",
                            str(up_port), "--interval", "5", "--internal-token-file", str(token_file)],
                           scratch / "plnt-up.log"))
        paths = {"plnt up": up_url}
        for name in ("gateway A", "gateway B"):
            port = free_port()
            procs.append(spawn([*PLNT, "gateway", "--control-url", up_url, "--internal-token-file", str(token_file),
                                "--port", str(port)], scratch / f"{name.replace(' ', '-')}.log"))
            paths[name] = f"http://127.0.0.1:{port}"
        async with httpx.AsyncClient(trust_env=False, timeout=10) as client:
            async def all_serving() -> bool:
                return all([await version_at(client, url) == "1.2.0" for url in paths.values()])

            await wait_until(all_serving, "review-responder 1.2.0 through all three gateways")
        cores = len(os.sched_getaffinity(0))
        print(f"split gateway bench: {platform.machine()} {cores} cores, python {platform.python_version()}; "
              f"plnt up (embedded Temporal, mock model) + 2 plnt gateway processes, one runner; load generator in "
              f"this process (uvloop: no); {args.requests} requests per path and concurrency in {args.rounds} "
              f"alternating rounds; {args.commits} commits, each + POST /hooks/git; scratch {scratch}")
        results: dict[str, Any] = {"cores": cores, "requests": args.requests, "rounds": args.rounds, "latency": {}}
        for concurrency in (int(c) for c in args.concurrency.split(",")):
            rows = await latency(paths, concurrency, args.requests, args.rounds)
            results["latency"][str(concurrency)] = rows
            print(f"\nconcurrency {concurrency}")
            for label, row in rows.items():
                ms = row["latency_ms"]
                print(f"  {label:<10} p50 {ms['p50']:7.3f} ms  p95 {ms['p95']:7.3f} ms  p99 {ms['p99']:7.3f} ms  "
                      f"{row['rps']:7.1f} req/s  errors {row['errors']}")
        if args.busy_runs:
            rows = await busy_latency(repo, up_url, paths, args.busy_runs, args.busy_rounds, 200)
            results["busy_reconciler"] = {"workflowruns": args.busy_runs, "rounds": args.busy_rounds, **rows}
            print(f"\nconcurrency 1 while plnt up reads commits of {args.busy_runs} WorkflowRuns "
                  f"({args.busy_rounds} commits, 200 requests per path after each)")
            for label, row in rows.items():
                ms = row["latency_ms"]
                print(f"  {label:<10} p50 {ms['p50']:7.3f} ms  p95 {ms['p95']:7.3f} ms  p99 {ms['p99']:7.3f} ms  "
                      f"errors {row['errors']}")
        commits = await commit_to_served(repo, up_url, paths, args.commits)
        results["commit_to_served_ms"] = commits
        print("\ncommit (+ hook) -> new version served, ms (each commit runs the whole saga)")
        for label in paths:
            values = [row[label] for row in commits]
            print(f"  {label:<10} median {statistics.median(values):8.1f}   all {values}")
        lag = [max(row["gateway A"], row["gateway B"]) - row["plnt up"] for row in commits]
        results["followers_lag_behind_plnt_up_ms"] = lag
        print(f"  both followers after plnt up's own gateway: {[round(x, 1) for x in lag]} ms "
              "(includes the 20 ms polling of this bench)")
        print("\nraw JSON:")
        print(json.dumps(results, indent=2))
    finally:
        for proc in reversed(procs):
            proc.send_signal(signal.SIGTERM)
        for proc in reversed(procs):
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        if not args.keep:
            shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
