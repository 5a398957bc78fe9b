"""Autoscaling under a load step: `plnt up` as users run it (console script, embedded Temporal, its
default gateway processes) deploys review-responder 1.5.0, whose draft step sleeps 0.6 s (a
stand-in for a slow LLM call; the runners' model is the offline mock), with replicas 1-MAX and
`autoscaling: {targetInFlight: T, scaleDownAfterSeconds: W}`. Then closed-loop clients through the
gateway: concurrency 1, then 8, then 1 again (`--steps 1:10,8:25,1:30`: concurrency:seconds).

Every second it prints the clients' concurrency, the replicas running and desired and the in-flight
requests the autoscaler last read (plnt_replicas and plnt_replicas_in_flight on plnt up's
GET /metrics), the invocations answered in that second, their p50 latency and the errors. Then
the times the replicas took to follow: from the step up to the desired count and to every replica
running, and from the step down to one replica again.

    python bench/autoscale.py [--steps 1:10,8:25,1:30] [--target 2] [--max 4] [--window 5] [--keep]
"""

from __future__ import annotations

import argparse
import asyncio
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
sys.path.insert(0, str(ROOT / "bench"))

from benchlib import git, how_it_ran, print_json, stop_process  # noqa: E402
from plnt.gateway.bench import percentile  # noqa: E402
from plnt.reconciler.drivers.processes import free_port  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

PLNT = [str(Path(sys.executable).parent / "plnt")]
INVOKE = "/workflows/review-responder/invoke"
REVIEW = {"review": "Great service but slow parking", "brand_voice": "warm, brief"}
RUN_FILE = "workflowruns/review-responder.yaml"


def parse_steps(text: str) -> list[tuple[int, float]]:
    steps = []
    for part in text.split(","):
        concurrency, seconds = part.split(":")
        steps.append((int(concurrency), float(seconds)))
    return steps


def scaling_of(metrics: str) -> dict[str, float]:
    """review-responder's plnt_replicas (running, desired) and plnt_replicas_in_flight from GET /metrics."""
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(metrics):
        for sample in family.samples:
            if sample.labels.get("name") != "review-responder":
                continue
            if sample.name == "plnt_replicas":
                found[sample.labels["state"]] = sample.value
            elif sample.name == "plnt_replicas_in_flight":
                found["in_flight"] = sample.value
    return found


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", default="1:10,8:25,1:30", help="concurrency:seconds, in order")
    parser.add_argument("--target", type=float, default=2, help="autoscaling.targetInFlight")
    parser.add_argument("--max", type=int, default=4, help="replicas.max")
    parser.add_argument("--window", type=float, default=5, help="autoscaling.scaleDownAfterSeconds")
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory (state, logs)")
    args = parser.parse_args()
    steps = parse_steps(args.steps)
    how = how_it_ran("autoscale.py", vars(args), [
        "plnt up (console script, default gateway processes) on 127.0.0.1, review-responder 1.5.0 (0.6 s sleep per "
        "invocation, offline mock model), replicas 1-MAX, autoscaling targetInFlight T, scaleDownAfterSeconds W",
        "closed-loop clients through the gateway (POST /workflows/review-responder/invoke), in this process",
        "replicas, desired and in flight: plnt_replicas / plnt_replicas_in_flight on plnt up's GET /metrics, read once a second",
    ])
    scratch = Path(tempfile.mkdtemp(prefix="plnt-bench-autoscale-"))
    repo = scratch / "repo"
    shutil.copytree(ROOT / "gitops-example", repo)
    run = (repo / RUN_FILE).read_text()
    run = run.replace("ref: review-responder@1.2.0", "ref: review-responder@1.5.0")
    run = run.replace("replicas: {min: 1, max: 1}", f"replicas: {{min: 1, max: {args.max}}}\n  autoscaling: "
                      f"{{targetInFlight: {args.target:g}, scaleDownAfterSeconds: {args.window:g}}}")
    (repo / RUN_FILE).write_text(run)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "review-responder 1.5.0, autoscaled")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = scratch / "plnt-up.log"
    with open(log, "wb") as out:
        up = subprocess.Popen([*PLNT, "up", "--repo", str(repo), "--state-dir", str(scratch / "state"), "--port",
                               str(port)], stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                              start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    seconds: list[dict[str, Any]] = []
    try:
        async with httpx.AsyncClient(trust_env=False, timeout=60,
                                     limits=httpx.Limits(max_connections=64)) as client:
            deadline = time.monotonic() + 180
            while True:
                if time.monotonic() > deadline or up.poll() is not None:
                    raise RuntimeError(f"review-responder not Ready; see {log}")
                try:
                    rows = (await client.get(f"{url}/workflows")).json()
                    if any(r.get("phase") == "Ready" and r["name"] == "review-responder" for r in rows):
                        break
                except (httpx.HTTPError, ValueError):
                    pass
                await asyncio.sleep(0.2)
            done: list[tuple[float, float, int]] = []  # (answered at, seconds, status)
            wanted = [0]

            async def client_loop(index: int) -> None:
                while True:
                    if index >= wanted[0]:
                        await asyncio.sleep(0.05)
                        continue
                    started = time.monotonic()
                    try:
                        status = (await client.post(f"{url}{INVOKE}", json=REVIEW)).status_code
                    except httpx.HTTPError:
                        status = 0
                    done.append((time.monotonic(), time.monotonic() - started, status))

            clients = [asyncio.create_task(client_loop(i)) for i in range(max(c for c, _ in steps))]
            t0 = time.monotonic()
            step_at: list[float] = []
            try:
                elapsed = 0.0
                for concurrency, duration in steps:
                    wanted[0] = concurrency
                    step_at.append(elapsed)
                    end = elapsed + duration
                    while elapsed < end:
                        await asyncio.sleep(max(0.0, t0 + elapsed + 1 - time.monotonic()))
                        elapsed = round(time.monotonic() - t0)
                        scaling = scaling_of((await client.get(f"{url}/metrics")).text)
                        window = [(s, code) for at, s, code in done if t0 + elapsed - 1 <= at < t0 + elapsed]
                        latencies = sorted(s for s, _ in window)
                        seconds.append({
                            "t": elapsed, "concurrency": concurrency,
                            "running": scaling.get("running"), "desired": scaling.get("desired"),
                            "in_flight": scaling.get("in_flight"), "answered": len(window),
                            "p50_ms": round(percentile(latencies, 50) * 1000, 1) if latencies else None,
                            "errors": sum(1 for _, code in window if code != 200)})
                        row = seconds[-1]
                        print(f"t={row['t']:>4}s  clients {concurrency:>2}  replicas {row['running']!s:>4} "
                              f"(desired {row['desired']!s:>4})  in flight {row['in_flight']!s:>4}  "
                              f"answered {row['answered']:>3}  p50 {row['p50_ms']!s:>7} ms  errors {row['errors']}",
                              flush=True)
            finally:
                for task in clients:
                    task.cancel()
                await asyncio.gather(*clients, return_exceptions=True)
    finally:
        stop_process(up)
        if not args.keep:
            shutil.rmtree(scratch, ignore_errors=True)
        else:
            print(f"# kept {scratch}")

    results = summarise(seconds, step_at, steps)
    print()
    for key, value in results["summary"].items():
        print(f"{key}: {value}")
    print_json(how, results)


def summarise(seconds: list[dict[str, Any]], step_at: list[float], steps: list[tuple[int, float]]) -> dict[str, Any]:
    """Seconds from the step up to the desired peak and to it running, and from the step down to 1 replica."""
    summary: dict[str, Any] = {"errors": sum(s["errors"] for s in seconds), "answered": sum(s["answered"] for s in seconds)}
    if len(steps) >= 3:
        up_at, down_at = step_at[1], step_at[2]
        during = [s for s in seconds if up_at < s["t"] <= down_at]
        after = [s for s in seconds if s["t"] > down_at]
        peak = max((s["desired"] or 0) for s in during) if during else None
        summary["peak_replicas"] = peak
        summary["step_up_to_desired_s"] = next((s["t"] - up_at for s in during if s["desired"] == peak), None)
        summary["step_up_to_running_s"] = next((s["t"] - up_at for s in during if s["running"] == peak), None)
        summary["step_down_to_1_s"] = next((s["t"] - down_at for s in after if s["running"] == 1), None)
        settled = [s for s in during if s["running"] == peak and s["p50_ms"] is not None]
        summary["p50_ms_at_peak"] = settled[-1]["p50_ms"] if settled else None
        first = [s for s in during[:2] if s["p50_ms"] is not None]
        summary["p50_ms_first_second_of_step"] = first[0]["p50_ms"] if first else None
    return {"per_second": seconds, "summary": summary}


if __name__ == "__main__":
    asyncio.run(main())
