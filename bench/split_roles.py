"""The roles apart vs `plnt up`, as users run them: invoke latency through each gateway, the time
from a commit to every gateway serving it, and gateway latency while the control plane is busy.

Layouts, each on the same real Temporal dev server and its own copy of gitops-example (a real git
repository; runners use the offline mock model backend):

  all-in-one:  plnt up                                   (gateway, reconciler, worker: one process)
  split:       plnt reconcile + plnt worker + 2 x plnt gateway   (four processes)

Figures:
  1. invoke p50/p99 of review-responder through each gateway at concurrency 1 and 32;
  2. commit (+ POST /hooks/git) -> every gateway serving the new version as its stable (promoted)
     release (several rounds, each after the previous saga ended; the first pull is fresh, later
     ones are cache hits: two versions alternate);
  3. the same invoke load while the control plane is busy: a commit adds 1,000 WorkflowRuns on a
     Kubernetes backend whose cluster does not exist (each gets a saga that fails at helm, at most
     --max-sagas at once) and a new commit touching one of them lands every 2 s (each is parsed
     and planned whole). The split should leave the gateways flat; plnt up shares its event loop.

    python bench/split_roles.py [--requests 2000] [--busy-requests 2000] [--rounds 5] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from plnt.gateway.bench import percentile, run_load  # noqa: E402
from plnt.reconciler.drivers.processes import free_port  # noqa: E402
from plnt.reconciler.saga.temporal_server import TemporalDevServer  # noqa: E402

PLNT = [sys.executable, "-m", "plnt.reconciler.cli.main"]
RUN_FILE = "workflowruns/review-responder.yaml"
BODY = json.dumps({"review": "Great service but slow parking", "brand_voice": "warm, brief"}).encode()
TOKEN = "bench-internal-token-0123456789abcdef"
GIT = {"GIT_AUTHOR_NAME": "bench", "GIT_AUTHOR_EMAIL": "bench@plnt.invalid",
       "GIT_COMMITTER_NAME": "bench", "GIT_COMMITTER_EMAIL": "bench@plnt.invalid"}

BUSY_BACKEND = """apiVersion: plnt.work/v1
kind: PlntBackend
metadata: {name: far-cluster}
spec:
  type: kubernetes
  kubernetes: {context: no-such-context, namespace: agents}
"""
BUSY_RUN = """apiVersion: plnt.work/v1
kind: WorkflowRun
metadata: {name: busy-%04d, namespace: default}
spec:
  workflow: {ref: review-responder@1.2.0, registry: "file:registry"}
  backend: {cluster: far-cluster}
  canary: {trafficPercent: 5, smokeTest: {invocations: 1}}
"""


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=repo, env={**os.environ, **GIT}, check=True, capture_output=True)


def make_repo(path: Path) -> Path:
    shutil.copytree(ROOT / "gitops-example", path)
    git(path, "init", "-q", "-b", "main")
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "gitops-example")
    return path


def commit(repo: Path, message: str) -> None:
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)


class Procs:
    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        log = open(self.logs / f"{name}.log", "wb")  # noqa: SIM115 - lives as long as the process
        proc = subprocess.Popen([*PLNT, *args], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(proc)
        return proc

    def stop(self) -> None:
        for proc in reversed(self.procs):
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
        self.procs.clear()


async def wait_ok(url: str, timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient(timeout=2) as client:
        while time.monotonic() < deadline:
            try:
                if (await client.get(url)).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.1)
    raise SystemExit(f"not ready after {timeout_s}s: {url}")


async def serving(url: str, version: str, timeout_s: float = 120) -> float:
    start = time.monotonic()
    async with httpx.AsyncClient(timeout=10) as client:
        while time.monotonic() - start < timeout_s:
            try:
                response = await client.post(f"{url}/workflows/review-responder/invoke", content=BODY,
                                             headers={"content-type": "application/json"})
                # The promoted release, not a lucky pick of the canary while it is smoke-tested.
                if response.status_code == 200 and response.json().get("version") == version \
                        and response.headers.get("x-plnt-track") == "stable":
                    return time.monotonic() - start
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.02)
    raise SystemExit(f"{url} does not serve {version} after {timeout_s}s")


async def latency(url: str, concurrency: int, requests: int) -> dict[str, Any]:
    load = await run_load(url, "/workflows/review-responder/invoke", BODY, requests=requests,
                          concurrency=concurrency, warmup=min(50, requests // 10), parse_results=False)
    ok = sorted(s.latency_s * 1000 for s in load.samples if s.ok)
    errors = sum(not s.ok for s in load.samples)
    return {"concurrency": concurrency, "requests": len(load.samples), "errors": errors,
            "p50_ms": round(percentile(ok, 50), 2) if ok else None,
            "p99_ms": round(percentile(ok, 99), 2) if ok else None,
            "rps": round(len(load.samples) / load.wall_s, 1) if load.wall_s else None}


async def commit_to_all(repo: Path, hook_url: str, gateways: list[str], version: str) -> float:
    text = (repo / RUN_FILE).read_text()
    current = text.split("review-responder@", 1)[1].split("\n", 1)[0]
    (repo / RUN_FILE).write_text(text.replace(f"review-responder@{current}", f"review-responder@{version}"))
    commit(repo, f"review-responder {version}")
    start = time.monotonic()
    async with httpx.AsyncClient(timeout=10) as client:
        await client.post(f"{hook_url}/hooks/git", headers={"Authorization": f"Bearer {TOKEN}"})
    await asyncio.gather(*(serving(url, version) for url in gateways))
    took = time.monotonic() - start
    await saga_ended(hook_url, version)  # not timed: the next round must not supersede this saga
    return took


async def saga_ended(control_url: str, version: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient(timeout=10) as client:
        while time.monotonic() < deadline:
            rows = (await client.get(f"{control_url}/workflows")).json()
            row = next((r for r in rows if r["name"] == "review-responder"), None)
            if row and row["phase"] == "Ready" and row["version"] == version:
                return
            await asyncio.sleep(0.1)
    raise SystemExit(f"review-responder not Ready {version} after {timeout_s}s")


async def churn(repo: Path, stop: asyncio.Event, hook_url: str) -> int:
    """A new commit every 2 s touching one of the 1,000 busy WorkflowRuns."""
    n = 0
    async with httpx.AsyncClient(timeout=10) as client:
        while not stop.is_set():
            n += 1
            path = repo / "busy" / f"busy-{n % 1000:04d}.yaml"
            path.write_text(path.read_text() + f"# churn {n}\n")
            await asyncio.to_thread(commit, repo, f"churn {n}")
            await client.post(f"{hook_url}/hooks/git", headers={"Authorization": f"Bearer {TOKEN}"})
            try:
                await asyncio.wait_for(stop.wait(), 2.0)
            except TimeoutError:
                pass
    return n


async def busy(repo: Path, hook_url: str, gateways: list[str], requests: int) -> list[dict[str, Any]]:
    (repo / "busy").mkdir()
    (repo / "busy" / "backend.yaml").write_text(BUSY_BACKEND)
    for i in range(1000):
        (repo / "busy" / f"busy-{i:04d}.yaml").write_text(BUSY_RUN % i)
    await asyncio.to_thread(commit, repo, "1,000 WorkflowRuns on an unreachable cluster")
    stop = asyncio.Event()
    churning = asyncio.create_task(churn(repo, stop, hook_url))
    await asyncio.sleep(3)  # the first parse and the first sagas are under way
    rows = []
    for url in gateways:
        row = await latency(url, 32, requests)
        rows.append({"gateway": url, **row})
    stop.set()
    commits = await churning
    for row in rows:
        row["churn_commits"] = commits
    return rows


async def layout_all_in_one(args: argparse.Namespace, temporal: str, work: Path) -> dict[str, Any]:
    repo = make_repo(work / "repo-up")
    (work / "internal.token").write_text(TOKEN + "\n")
    port = free_port()
    procs = Procs(work)
    procs.start("plnt-up", ["up", "--repo", str(repo), "--state-dir", str(work / "state-up"), "--port", str(port),
                            "--temporal-address", temporal, "--temporal-namespace", "bench-up", "--interval", "1"])
    url = f"http://127.0.0.1:{port}"
    try:
        await wait_ok(f"{url}/healthz")
        await serving(url, "1.2.0")
        result: dict[str, Any] = {"layout": "all-in-one (plnt up)", "gateways": {url: [
            await latency(url, c, args.requests) for c in (1, 32)]}}
        versions = ["1.3.0", "1.2.0"]  # both pass their smoke test; pulls after the first round are cache hits
        result["commit_to_served_s"] = [round(await commit_to_all(repo, url, [url], versions[i % 2]), 2)
                                        for i in range(args.rounds)]
        result["busy"] = await busy(repo, url, [url], args.busy_requests) if args.busy_requests else []
        return result
    finally:
        procs.stop()


async def layout_split(args: argparse.Namespace, temporal: str, work: Path) -> dict[str, Any]:
    repo = make_repo(work / "repo-split")
    token = work / "internal.token"
    token.write_text(TOKEN + "\n")
    control_port = free_port()
    control = f"http://127.0.0.1:{control_port}"
    common = ["--temporal-address", temporal, "--temporal-namespace", "bench-split", "--internal-token-file", str(token)]
    procs = Procs(work)
    procs.start("reconciler", ["reconcile", "--repo", str(repo), "--state-dir", str(work / "state-reconciler"),
                               "--port", str(control_port), "--interval", "1", *common])
    procs.start("worker", ["worker", "--repo", str(repo), "--state-dir", str(work / "state-worker"),
                           "--port", str(free_port()), "--control-url", control, *common])
    gateways = []
    for i in range(2):
        port = free_port()
        procs.start(f"gateway-{i}", ["gateway", "--control-url", control, "--port", str(port),
                                     "--internal-token-file", str(token)])
        gateways.append(f"http://127.0.0.1:{port}")
    try:
        await wait_ok(f"{control}/readyz")
        for url in gateways:
            await serving(url, "1.2.0")
        result: dict[str, Any] = {"layout": "split (reconcile + worker + 2 gateways)", "gateways": {
            url: [await latency(url, c, args.requests) for c in (1, 32)] for url in gateways}}
        versions = ["1.3.0", "1.2.0"]  # both pass their smoke test; pulls after the first round are cache hits
        result["commit_to_served_s"] = [round(await commit_to_all(repo, control, gateways, versions[i % 2]), 2)
                                        for i in range(args.rounds)]
        result["busy"] = await busy(repo, control, gateways, args.busy_requests) if args.busy_requests else []
        return result
    finally:
        procs.stop()


def print_table(results: list[dict[str, Any]]) -> None:
    print(f"{'layout':42} {'gateway':24} {'c':>3} {'p50 ms':>8} {'p99 ms':>8} {'req/s':>8} {'errors':>6}")
    for result in results:
        for url, rows in result["gateways"].items():
            for row in rows:
                print(f"{result['layout']:42} {url[7:]:24} {row['concurrency']:>3} {row['p50_ms']:>8} "
                      f"{row['p99_ms']:>8} {row['rps']:>8} {row['errors']:>6}")
        for row in result["busy"]:
            print(f"{result['layout'] + ' BUSY':42} {row['gateway'][7:]:24} {row['concurrency']:>3} "
                  f"{row['p50_ms']:>8} {row['p99_ms']:>8} {row['rps']:>8} {row['errors']:>6}")
        times = result["commit_to_served_s"]
        print(f"{result['layout']:42} commit -> every gateway serving: {times} s "
              f"(median {sorted(times)[len(times) // 2]} s)")


async def register_namespaces(address: str, *names: str) -> None:
    from google.protobuf.duration_pb2 import Duration
    from plnt.reconciler.saga.temporal_server import connect
    from temporalio.api.workflowservice.v1 import RegisterNamespaceRequest

    client = await connect(address)
    for name in names:
        await client.workflow_service.register_namespace(
            RegisterNamespaceRequest(namespace=name, workflow_execution_retention_period=Duration(seconds=86400)))


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=2000, help="invocations per gateway and concurrency")
    parser.add_argument("--busy-requests", type=int, default=2000, help="invocations while busy (0: skip)")
    parser.add_argument("--rounds", type=int, default=5, help="commit -> served rounds")
    parser.add_argument("--json", action="store_true", help="print only the raw JSON")
    args = parser.parse_args()
    print(f"# bench/split_roles.py: {os.cpu_count()} cores, Python {sys.version.split()[0]}; runners: mock model "
          f"backend; every layout on one real Temporal dev server; loopback HTTP, no tokens on the gateways",
          file=sys.stderr)
    server = TemporalDevServer(db_file=None)
    temporal = await server.start()
    await register_namespaces(temporal, "bench-up", "bench-split")  # no saga of one layout meets the other's
    try:
        with tempfile.TemporaryDirectory(prefix="plnt-bench-split-") as tmp:
            work = Path(tmp)
            up_dir, split_dir = work / "up", work / "split"
            up_dir.mkdir()
            split_dir.mkdir()
            results = [await layout_all_in_one(args, temporal, up_dir), await layout_split(args, temporal, split_dir)]
    finally:
        await server.stop()
    if not args.json:
        print_table(results)
    print(json.dumps(results))


if __name__ == "__main__":
    asyncio.run(main())
