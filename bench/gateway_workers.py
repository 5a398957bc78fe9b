"""The gateway as `plnt up` serves it, with 1 and more gateway worker processes: what it adds to an
invocation against the same runner called direct, idle and while plnt up reconciles 1,000 specs.

For each --workers value W, starts on 127.0.0.1 a real `plnt up --gateway-workers W` (console
script: embedded Temporal, reconciler, Temporal worker, gateway in plnt up's process plus W-1
gateway worker processes on the same port; review-responder from a scratch git copy of
gitops-example; its runner a real `plnt.runner` process with the offline mock model), waits for
Ready, reads the runner's address from GET /workflows, then for each concurrency (default 1, 32):

  direct:   load generator -> runner                        POST /invoke
  gateway:  load generator -> plnt up's port -> runner      POST /workflows/review-responder/invoke

in alternating rounds (so drift hits both alike), same body (layout "roleN": through a separate
`plnt gateway --workers N` that follows a plnt up of one gateway process); p50/p95/p99 of each and the
difference ("added" = gateway - direct, per percentile). Then the same again while plnt up
reconciles: a background task commits, again and again, 1,000 WorkflowRuns (bulk/bulk-NNNN,
each naming a backend that does not exist, its name changed in every file at every commit, so
every commit's 1,000 files are new blobs that plnt up parses and validates, then refuses whole:
no saga, no runner; the load is the reconciler's own) and posts POST /hooks/git after each.
The CPU seconds of every plnt process (plnt up, its gateway workers, the runner, Temporal) in
each phase, and the commits plnt up took in the busy phase, are reported beside the latencies.

The load generator runs in this process (asyncio, the gateway's own upstream client, ~0.1 ms
CPU per request) on the same 2 cores as everything else: as a user's client on this machine
would. Nothing is pinned.

    python bench/gateway_workers.py [--workers 1,2+cp,2,3,role2] [--requests 3000] [--concurrency 1,32]
                                    [--rate 400] [--rounds 3] [--busy-runs 1000] [--keep]

Closed loops (c clients, each sending as soon as answered) saturate 2 cores at c=32, and there the
"added" latency is mostly queueing for the CPU the extra hop costs; `--rate R` also measures c=32
paced to R requests/s in all, a load this machine carries.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
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

from benchlib import BULK_RUN, descendants, git, how_it_ran, print_json, pss_kib  # noqa: E402
from benchlib import process_cpu_s as cpu_s  # noqa: E402
from plnt.core.upstream import UpstreamClient, UpstreamError  # noqa: E402
from plnt.gateway.bench import Load, Sample, percentile, run_load  # noqa: E402
from plnt.reconciler.drivers.processes import free_port  # noqa: E402

PLNT = [str(Path(sys.executable).parent / "plnt")]
PAYLOAD = json.dumps({"review": "Great service but slow parking", "brand_voice": "warm, brief"}).encode()
INVOKE = "/workflows/review-responder/invoke"


def kind(pid: int) -> str:
    try:
        line = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "gone"
    if "plnt.gateway.workers" in line:
        return "gateway worker"
    if "plnt.runner" in line:
        return "runner"
    if "temporal" in line:
        return "temporal"
    return "other"


class CpuMeter:
    """CPU seconds of plnt up and each kind of process below it, over one phase."""

    def __init__(self, root: int) -> None:
        self.root = root
        self.start = self._now()

    def _now(self) -> dict[str, float]:
        totals: dict[str, float] = {"plnt up": cpu_s(self.root)}
        for pid in descendants(self.root):
            name = kind(pid)
            totals[name] = totals.get(name, 0.0) + cpu_s(pid)
        return totals

    def read(self) -> dict[str, float]:
        now = self._now()
        return {name: round(now[name] - self.start.get(name, 0.0), 2) for name in now}


def pss_mib(root: int) -> dict[str, Any]:
    """PSS (MiB) of plnt up and of each kind of process below it, with their counts."""
    out: dict[str, Any] = {"plnt up": round((pss_kib(root) or 0) / 1024, 1)}
    for pid in descendants(root):
        name = kind(pid)
        out[name] = round(out.get(name, 0.0) + (pss_kib(pid) or 0) / 1024, 1)
        out[f"{name} processes"] = out.get(f"{name} processes", 0) + 1
    return out


def pcts(load: Load) -> dict[str, float]:
    ordered = sorted(s.latency_s for s in load.samples if s.ok)
    return {f"p{q}": round(percentile(ordered, q) * 1000, 3) for q in (50, 95, 99)}


async def paced_load(url: str, path: str, *, requests: int, concurrency: int, rate: float) -> Load:
    """`concurrency` clients, each sending on a fixed schedule so that together they offer `rate`
    requests/s (a client whose answer comes late sends its next at once): latency at a load the
    machine can carry, not the queueing of a saturated closed loop."""
    client = UpstreamClient(read_timeout_s=60, max_connections=concurrency)
    headers = [("content-type", "application/json")]
    interval = concurrency / rate
    per_client = max(1, requests // concurrency)
    load = Load()
    perf = time.perf_counter

    async def one_client(offset: float) -> None:
        next_at = perf() + offset
        for _ in range(per_client):
            delay = next_at - perf()
            if delay > 0:
                await asyncio.sleep(delay)
            next_at += interval
            t0 = perf()
            try:
                response = await client.request(url, "POST", path, body=PAYLOAD, headers=headers)
                load.samples.append(Sample(perf() - t0, response.status,
                                           None if response.status < 300 else f"HTTP {response.status}"))
            except UpstreamError as exc:
                load.samples.append(Sample(perf() - t0, 0, str(exc)))

    try:
        start = perf()
        await asyncio.gather(*(one_client(i * interval / concurrency) for i in range(concurrency)))
        load.wall_s = perf() - start
    finally:
        await client.aclose()
    return load


async def compare(paths: dict[str, tuple[str, str]], concurrency: int, requests: int, rounds: int,
                  rate: float | None = None) -> dict[str, Any]:
    loads = {label: Load() for label in paths}
    per_round = max(1, requests // rounds)
    for round_ in range(rounds):
        order = list(paths.items()) if round_ % 2 == 0 else list(reversed(paths.items()))
        for label, (url, path) in order:
            if rate:
                got = await paced_load(url, path, requests=per_round, concurrency=concurrency, rate=rate)
            else:
                got = await run_load(url, path, PAYLOAD, requests=per_round, concurrency=concurrency,
                                     parse_results=False, warmup=concurrency * 2)
            loads[label].samples += got.samples
            loads[label].wall_s += got.wall_s
    rows: dict[str, Any] = {label: {"requests": len(load.samples), "errors": sum(not s.ok for s in load.samples),
                                    "latency_ms": pcts(load), "rps": round(len(load.samples) / load.wall_s, 1)}
                            for label, load in loads.items()}
    rows["added_ms"] = {q: round(rows["gateway"]["latency_ms"][q] - rows["direct"]["latency_ms"][q], 3)
                        for q in ("p50", "p95", "p99")}
    return rows


async def keep_committing(repo: Path, up_url: str, runs: int, stop: asyncio.Event, commits: list[float]) -> None:
    """Commit all `runs` bulk WorkflowRuns again (new blobs) + hook, until stopped; paced so that
    plnt up has one commit to take at a time (a new one as soon as it took the last)."""
    bulk = repo / "workflowruns" / "bulk"
    bulk.mkdir(exist_ok=True)
    round_ = 0
    async with httpx.AsyncClient(trust_env=False, timeout=30) as client:
        while not stop.is_set():
            round_ += 1

            def write(n: int = round_) -> str:
                for i in range(runs):
                    (bulk / f"bulk-{i:04d}.yaml").write_text(BULK_RUN.format(i=i, round=n))
                git(repo, "add", "-A")
                git(repo, "commit", "-qm", f"{runs} WorkflowRuns, round {n}")
                return git(repo, "rev-parse", "HEAD")

            head = await asyncio.to_thread(write)
            started = time.monotonic()
            (await client.post(f"{up_url}/hooks/git")).raise_for_status()
            # Until plnt up has looked at this commit (it refuses it: GET /source names it as seen).
            while not stop.is_set() and time.monotonic() - started < 60:
                source = (await client.get(f"{up_url}/source")).json()
                if head in json.dumps(source):
                    commits.append(round(time.monotonic() - started, 3))
                    break
                await asyncio.sleep(0.05)


async def one_layout(layout: str, args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    """`layout`: "N" (N worker processes on the port, the default layout), "N+cp" (plnt up's own
    process is one of the N: --control-plane-gateway) or "roleN" (plnt up with one gateway process,
    measured through a separate `plnt gateway --workers N` following it)."""
    role = layout.startswith("role")
    workers = int(layout.removeprefix("role").split("+")[0])
    extra = ["--control-plane-gateway"] if layout.endswith("+cp") else []
    if role:
        token_file = scratch / f"internal-{layout}"
        token_file.write_text(os.urandom(16).hex() + "\n")
        extra = ["--internal-token-file", str(token_file)]
    tag = layout.replace("+", "-")
    repo = scratch / f"repo-{tag}"
    shutil.copytree(ROOT / "gitops-example", repo)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "initial")
    port = free_port()
    up_url = f"http://127.0.0.1:{port}"
    log = scratch / f"plnt-up-{tag}.log"
    with open(log, "wb") as out:
        up = subprocess.Popen([*PLNT, "up", "--repo", str(repo), "--state-dir", str(scratch / f"state-{tag}"),
                               "--port", str(port), "--interval", "5", "--gateway-workers", "1" if role else str(workers),
                               *extra],
                              stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                              env={**os.environ, "PYTHONUNBUFFERED": "1"})
    gateway_proc = None
    gateway_url = up_url
    if role:
        gateway_port = free_port()
        gateway_url = f"http://127.0.0.1:{gateway_port}"
        with open(scratch / f"plnt-gateway-{tag}.log", "wb") as out:
            gateway_proc = subprocess.Popen(
                [*PLNT, "gateway", "--control-url", up_url, "--internal-token-file", str(token_file), "--port",
                 str(gateway_port), "--workers", str(workers)], stdin=subprocess.DEVNULL, stdout=out,
                stderr=subprocess.STDOUT, start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        endpoint = None
        deadline = time.monotonic() + 120
        async with httpx.AsyncClient(trust_env=False, timeout=5) as client:
            while endpoint is None:
                if time.monotonic() > deadline or up.poll() is not None:
                    raise RuntimeError(f"review-responder not Ready; see {log}")
                try:
                    rows = (await client.get(f"{up_url}/workflows")).json()
                    endpoint = next((r["endpoint"] for r in rows if r.get("phase") == "Ready"), None)
                except (httpx.HTTPError, ValueError):
                    pass
                await asyncio.sleep(0.2)
            seen: set[int] = set()
            while len(seen) < min(workers, 2) and time.monotonic() < deadline:  # more than one answering
                async with httpx.AsyncClient(trust_env=False, timeout=5) as fresh:
                    try:
                        answer = await fresh.get(f"{gateway_url}/healthz")
                        if answer.status_code == 200:
                            seen.add(answer.json()["worker"])
                    except httpx.HTTPError:
                        await asyncio.sleep(0.1)
        paths = {"direct": (endpoint, "/invoke"), "gateway": (gateway_url, INVOKE)}
        result: dict[str, Any] = {"workers": layout, "idle": {}, "busy": {}}
        meter = CpuMeter(up.pid)
        role_meter = CpuMeter(gateway_proc.pid) if gateway_proc else None
        result["loadavg_before"] = os.getloadavg()
        for key, concurrency, rate in loads(args):
            result["idle"][key] = await compare(paths, concurrency, args.requests, args.rounds, rate)
        result["idle_cpu_s"] = meter.read()
        result["pss_mib"] = pss_mib(up.pid)
        if gateway_proc is not None and role_meter is not None:
            result["idle_cpu_s"]["plnt gateway role"] = role_meter.read()
            result["pss_mib"]["plnt gateway role"] = pss_mib(gateway_proc.pid)
        if args.profile:
            result["profile"] = await profile_gateway(gateway_proc.pid if gateway_proc else up.pid, gateway_url, args, scratch / f"profile-{tag}.txt")
        if args.busy_runs:
            stop = asyncio.Event()
            commits: list[float] = []
            committer = asyncio.create_task(keep_committing(repo, up_url, args.busy_runs, stop, commits))
            await asyncio.sleep(3)  # the first commits under way
            meter = CpuMeter(up.pid)
            started = time.monotonic()
            for key, concurrency, rate in loads(args):
                result["busy"][key] = await compare(paths, concurrency, args.requests, args.rounds, rate)
            result["busy_wall_s"] = round(time.monotonic() - started, 1)
            result["busy_cpu_s"] = meter.read()
            stop.set()
            await committer
            result["busy_commits_taken"] = len(commits)
            result["busy_commit_to_seen_s"] = commits
        result["loadavg_after"] = os.getloadavg()
        return result
    finally:
        for proc in (gateway_proc, up):
            if proc is None:
                continue
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


async def profile_gateway(root: int, url: str, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """py-spy (raw collapsed stacks, 500 Hz) on one process serving the gateway port during a closed
    loop at the largest concurrency; where its samples go, by leaf function and by module."""
    workers = [pid for pid in descendants(root) if kind(pid) == "gateway worker"]
    target = workers[0] if workers else root
    spy = subprocess.Popen([str(Path(sys.executable).parent / "py-spy"), "record", "--pid", str(target), "--duration",
                            str(args.profile_seconds), "--rate", "500", "--format", "raw", "--output", str(out),
                            "--nonblocking"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + args.profile_seconds
    while time.monotonic() < deadline:
        await run_load(url, INVOKE, PAYLOAD, requests=500, concurrency=max(args.concurrency), parse_results=False)
    await asyncio.to_thread(spy.wait)
    leaves: dict[str, int] = {}
    modules: dict[str, int] = {}
    total = 0
    for line in out.read_text().splitlines() if out.exists() else []:
        stack, _, count_text = line.rpartition(" ")
        count = int(count_text)
        frames = stack.split(";")
        total += count
        leaf = frames[-1] if frames else "?"
        leaves[leaf] = leaves.get(leaf, 0) + count
        seen = set()
        for frame in frames:
            where = frame.rsplit("(", 1)[-1].split(":")[0].rstrip(")")
            module = "/".join(Path(where).parts[-2:])
            if module not in seen:
                seen.add(module)
                modules[module] = modules.get(module, 0) + count

    def top(counts: dict[str, int], n: int) -> list[tuple[str, float]]:
        return [(k, round(100 * v / total, 1)) for k, v in sorted(counts.items(), key=lambda kv: -kv[1])[:n]] if total else []

    return {"pid_kind": "gateway worker" if workers else "plnt up", "samples": total, "file": str(out),
            "leaf_percent": top(leaves, 15), "module_inclusive_percent": top(modules, 20)}


def loads(args: argparse.Namespace) -> list[tuple[str, int, float | None]]:
    """(label, concurrency, offered rate or None for closed loop) of each measured load."""
    out: list[tuple[str, int, float | None]] = [(str(c), c, None) for c in args.concurrency]
    out += [(f"{c}@{args.rate:g}/s", c, args.rate) for c in args.concurrency if args.rate and c > 1]
    return out


def table(results: list[dict[str, Any]]) -> None:
    print("\n| workers | load | c | direct p50/p95/p99 ms | gateway p50/p95/p99 ms | added p50/p95/p99 ms | gateway req/s |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        for phase in ("idle", "busy"):
            for c, row in r.get(phase, {}).items():
                d, g, a = row["direct"]["latency_ms"], row["gateway"]["latency_ms"], row["added_ms"]
                errors = row["direct"]["errors"] + row["gateway"]["errors"]
                print(f"| {r['workers']} | {phase} | {c} | {d['p50']:.2f} / {d['p95']:.2f} / {d['p99']:.2f} | "
                      f"{g['p50']:.2f} / {g['p95']:.2f} / {g['p99']:.2f} | {a['p50']:+.2f} / {a['p95']:+.2f} / "
                      f"{a['p99']:+.2f} | {row['gateway']['rps']:.0f}{f' ({errors} errors)' if errors else ''} |")
    for r in results:
        print(f"\nworkers {r['workers']}: load average before {r.get('loadavg_before')} after "
              f"{r.get('loadavg_after')}; PSS MiB {r.get('pss_mib')}; CPU s idle phase {r.get('idle_cpu_s')}; busy phase {r.get('busy_cpu_s')} "
              f"over {r.get('busy_wall_s')} s, {r.get('busy_commits_taken')} commits of 1,000 specs taken")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", default="1,2+cp,2,3", help=(
        "gateway process counts, one plnt up each: N (N worker processes on the port, plnt up's default "
        "layout), N+cp (--control-plane-gateway: plnt up's own process is one of the N) or roleN (through a "
        "`plnt gateway --workers N` following a plnt up of one process)"))
    parser.add_argument("--requests", type=int, default=3000, help="requests per path, concurrency and phase")
    parser.add_argument("--concurrency", default="1,32")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rate", type=float, default=400.0, help=(
        "also measure each concurrency > 1 paced to this many requests/s in all (0: only closed loops)"))
    parser.add_argument("--busy-runs", type=int, default=1000, help="WorkflowRuns per busy commit (0: no busy phase)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory (logs, profiles)")
    parser.add_argument("--profile", action="store_true", help=(
        "py-spy one gateway process under a closed loop after the idle phase (needs py-spy in the venv)"))
    parser.add_argument("--profile-seconds", type=int, default=10)
    args = parser.parse_args()
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    how = how_it_ran("gateway_workers.py", {k: v for k, v in vars(args).items()}, [
        "real plnt up (console script, embedded Temporal), one real runner (mock model), nothing pinned",
        "load generator in this process on the same cores; alternating direct/gateway rounds",
        f"busy: commits of {args.busy_runs} WorkflowRuns (unknown backend: parsed, validated, refused) + hook, "
        "back to back",
    ])
    scratch = Path(tempfile.mkdtemp(prefix="plnt-bench-gw-workers-"))
    results = []
    try:
        for layout in args.workers.split(","):
            results.append(await one_layout(layout, args, scratch))
            print(f"# workers {layout} done", flush=True)
        table(results)
        for r in results:
            if "profile" in r:
                prof = r["profile"]
                print(f"\nprofile, workers {r['workers']} ({prof['pid_kind']}, {prof['samples']} samples): "
                      f"by module (inclusive %) {prof['module_inclusive_percent']}\n  by leaf (self %) "
                      f"{prof['leaf_percent']}")
        print_json(how, {"layouts": results})
    finally:
        if args.keep:
            print(f"# scratch kept: {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
