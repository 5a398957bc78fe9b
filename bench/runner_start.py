"""Runner start, exec against fork: what one more WorkflowRun costs on a machine.

Through the real local driver (plnt.reconciler.drivers.local.LocalDriver.install: allowlisted
environment, own directory, runnerLimits, undumpable), each way in turn on its own scratch state:
- start: `--starts` installs one after another, each a distinct recipe directory (a copy of
  review-responder 1.2.0): ms from install() to the runner answering /healthz (as the driver polls
  it), and CPU: the runner's own (utime+stime from /proc) and plnt's (this process) per start;
- memory: `--runners` runners in all (distinct recipe copies), each then used as a client would:
  `--requests` POST /invoke and one streamed /chat; then PSS and Private_Dirty per runner
  (/proc/PID/smaps_rollup), the zygote's PSS (fork), and where one runner's private pages are.
A forked runner's CPU counts from its fork (the zygote's imports are paid once: `zygote_cpu_s`).

    python bench/runner_start.py [--starts 10] [--runners 100] [--modes fork,exec]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from benchlib import ROOT, how_it_ran, print_json
from benchlib import process_cpu_s as cpu_s
from plnt.core.recipe import directory_digest
from plnt.reconciler.drivers.local import LocalDriver
from plnt.reconciler.drivers.protocol import InstallRequest
from plnt.reconciler.state import StateDir

TEMPLATE = ROOT / "gitops-example" / "recipes" / "review-responder" / "1.2.0"


def recipe_copy(scratch: Path, index: int) -> Path:
    target = scratch / "recipes" / f"r{index:04d}"
    if not target.exists():
        shutil.copytree(TEMPLATE, target)
    return target


def request(name: str, recipe: Path) -> InstallRequest:
    return InstallRequest(namespace="bench", name=name, track="stable", version="1.2.0",
                          spec_fingerprint="sha256:" + "0" * 64, recipe_digest=directory_digest(recipe),
                          recipe_dir=str(recipe), traffic_percent=100)


def rollup(pid: int) -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            parts = line.split()
            if parts[0] in ("Pss:", "Private_Dirty:", "Private_Clean:", "Rss:"):
                out[parts[0].rstrip(":")] = int(parts[1])
    except OSError:
        pass
    return out


def private_by_mapping(pid: int, top: int = 6) -> list[tuple[str, int]]:
    dirty: collections.Counter[str] = collections.Counter()
    name = "?"
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        parts = line.split()
        if "-" in parts[0] and len(parts) >= 5:
            name = parts[5] if len(parts) > 5 else "[anon]"
            name = name.rsplit("/", 1)[-1]
        elif parts[0] == "Private_Dirty:":
            dirty[name] += int(parts[1])
    return dirty.most_common(top)


async def use(client: httpx.AsyncClient, endpoint: str, requests: int) -> None:
    body = {"review": "great food but slow service", "brand_voice": "brief"}
    for _ in range(requests):
        (await client.post(f"{endpoint}/invoke", json=body)).raise_for_status()
    chat = {"messages": [{"role": "user", "content": "great food"}], "stream": True}
    async with client.stream("POST", f"{endpoint}/chat", json=chat) as response:
        async for _ in response.aiter_bytes():
            pass


async def one_way(mode: str, args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    state = StateDir(scratch / f"state-{mode}")
    driver = LocalDriver(state, runner_start=mode, start_timeout_s=120)  # type: ignore[arg-type]
    started_ms: list[float] = []
    runner_cpu: list[float] = []
    plnt_cpu: list[float] = []
    releases = []
    try:
        for i in range(args.starts):
            recipe = recipe_copy(scratch, i)
            cpu0, t0 = time.process_time(), time.perf_counter()
            release = await driver.install(request(f"s{i:04d}", recipe))
            started_ms.append((time.perf_counter() - t0) * 1000)
            plnt_cpu.append(time.process_time() - cpu0)
            assert release.pid is not None
            runner_cpu.append(cpu_s(release.pid))
            releases.append(release)
        semaphore = asyncio.Semaphore(8)

        async def install(i: int) -> None:
            async with semaphore:
                releases.append(await driver.install(request(f"s{i:04d}", recipe_copy(scratch, i))))

        await asyncio.gather(*(install(i) for i in range(args.starts, args.runners)))
        async with httpx.AsyncClient(trust_env=False, timeout=30) as client:
            for chunk in range(0, len(releases), 16):
                await asyncio.gather(*(use(client, r.endpoint, args.requests) for r in releases[chunk:chunk + 16]))
        await asyncio.sleep(1.0)
        pids = [r.pid for r in releases if r.pid is not None]
        rollups = [rollup(pid) for pid in pids]
        zygote = driver._zygote.pid
        result = {
            "start_ms": [round(v, 1) for v in started_ms],
            "runner_cpu_s": runner_cpu,
            "plnt_cpu_s": [round(v, 3) for v in plnt_cpu],
            "runners": len(pids),
            "pss_kib": [r.get("Pss", 0) for r in rollups],
            "private_dirty_kib": [r.get("Private_Dirty", 0) for r in rollups],
            "private_clean_kib": [r.get("Private_Clean", 0) for r in rollups],
            "zygote_pss_kib": rollup(zygote).get("Pss") if zygote else None,
            "zygote_cpu_s": cpu_s(zygote) if zygote else None,
            "one_runner_private_dirty_by_mapping_kib": private_by_mapping(pids[-1]),
        }
    finally:
        await driver.shutdown()
    return result


def mib(values: list[int]) -> float:
    return round(statistics.mean(values) / 1024, 2) if values else 0.0


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--starts", type=int, default=10, help="timed starts, one after another")
    parser.add_argument("--runners", type=int, default=100, help="runners running at once for the memory figures")
    parser.add_argument("--requests", type=int, default=5, help="POST /invoke per runner before measuring")
    parser.add_argument("--modes", default="fork,exec")
    args = parser.parse_args()
    args.runners = max(args.runners, args.starts)
    modes = [m for m in args.modes.split(",") if m]
    how = how_it_ran("runner_start.py", vars(args), [
        "LocalDriver.install per runner (allowlisted env, own dir, runnerLimits, undumpable), distinct recipe copies",
        "start = install() until /healthz answers, one after another; memory after each runner served "
        f"{args.requests} /invoke and 1 streamed /chat, all {args.runners} running at once",
        "each way on its own scratch state, one after the other in this run"])
    results: dict[str, Any] = {}
    scratch = Path(tempfile.mkdtemp(prefix="plnt-bench-runner-start-"))
    try:
        for mode in modes:
            results[mode] = await one_way(mode, args, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"{'way':5s} {'start p50':>10s} {'max':>8s} {'runner CPU':>11s} {'plnt CPU':>9s} "
          f"{'PSS/runner':>11s} {'Priv.dirty':>11s} {'zygote PSS':>11s}")
    for mode, r in results.items():
        zygote = f"{r['zygote_pss_kib'] / 1024:.1f} MiB" if r["zygote_pss_kib"] else "-"
        print(f"{mode:5s} {statistics.median(r['start_ms']):8.0f} ms {max(r['start_ms']):6.0f} ms "
              f"{statistics.median(r['runner_cpu_s']) * 1000:8.0f} ms {statistics.median(r['plnt_cpu_s']) * 1000:6.0f} ms "
              f"{mib(r['pss_kib']):7.2f} MiB {mib(r['private_dirty_kib']):7.2f} MiB {zygote:>11s}")
        print(f"      one runner's private dirty pages (KiB): {r['one_runner_private_dirty_by_mapping_kib']}")
    print_json(how, results)


if __name__ == "__main__":
    asyncio.run(main())
