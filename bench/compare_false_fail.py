"""How often the live comparison gate fails a GOOD release: the same recipe code as the stable one,
published again as a new version, rolled out N times under real traffic, with the gate's defaults.

Starts plnt in this process exactly as `plnt up` does (embedded Temporal dev server, its gateway
worker processes pushing each call to plnt's ledger, local runner processes) on a scratch spec
repository (bench/benchlib.py). A load process (a separate Python, 2 clients) invokes the workflow
through the gateway the whole time. Each rollout: one step at 50% with a 5 s pause (the soak) and
the Gate `compare` with its defaults (minRequests 50 each, p95Ratio 1.2, p95SlackMs 10,
errorRatePoints 1). A rollback here is a false fail: both releases run the same code. The traffic is
invocations, so only the latency and error rules are exercised (the TTFT, TPOT and tokens rules need
streamed chat; tests/models/test_compare_gate_model.py runs them on a real model).

    python bench/compare_false_fail.py [--rollouts 20] [--slack-ms 10]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import subprocess
import sys
import time
from typing import Any

from benchlib import BenchRepo, how_it_ran, print_json
from plnt.reconciler.app import start
from plnt.reconciler.saga.history import saga_history
from plnt.reconciler.settings import Settings

RECIPE = "review-responder"
KEY = f"default/{RECIPE}"
LOAD = """
import sys, httpx
url = sys.argv[1]
body = {"review": "Great service but slow parking", "brand_voice": "warm, brief"}
with httpx.Client(trust_env=False, timeout=30) as client:
    while True:
        try:
            client.post(url, json=body)
        except httpx.HTTPError:
            pass
"""


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rollouts", type=int, default=20)
    parser.add_argument("--slack-ms", type=float, default=10.0, help="the gate's p95SlackMs (default: its default)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    how = how_it_ran("compare_false_fail.py", vars(args), [
        "plnt up in this process: embedded Temporal dev server, gateway worker processes, local runner processes",
        "load: a separate Python process, 2 clients in a loop through the gateway, the whole time",
        "each rollout: the SAME code as stable under a new version, one step at 50% with a 5 s pause, then the "
        f"compare gate (minRequests 50, p95Ratio 1.2, p95SlackMs {args.slack_ms:g}, errorRatePoints 1)",
        "a rollback is a false fail"])
    repo = BenchRepo("plnt-bench-compare-")
    versions = iter(f"4.{n}.0" for n in range(10_000))
    version = next(versions)
    repo.publish(RECIPE, version)
    repo.write_run(RECIPE, RECIPE, version)
    (repo.path / "gates").mkdir()
    (repo.path / "gates" / "compare.yaml").write_text(
        "apiVersion: plnt.work/v1\nkind: Gate\nmetadata: {name: live}\nspec:\n"
        f"  compare: {{p95SlackMs: {args.slack_ms:g}}}\n")
    repo.commit(f"{RECIPE} {version}")
    settings = Settings(repo=str(repo.path), state_dir=repo.scratch / "state", port=0, interval_s=1.0)
    plnt = await start(settings)
    load = subprocess.Popen([sys.executable, "-c", LOAD, f"{plnt.url}/workflows/{RECIPE}/invoke"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    async def ended(wanted: str, timeout: float = 600) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status = plnt.statuses.get(KEY)
            if status is not None and status.attempted_version == wanted and status.phase.value in ("Failed", "RolledBack"):
                return status.phase.value
            if status is not None and status.phase.value == "Ready" and status.version == wanted:
                return "Ready"
            await asyncio.sleep(0.05)
        raise TimeoutError(f"{wanted} did not end")

    rows: list[dict[str, Any]] = []
    try:
        await ended(version)
        for _ in range(args.rollouts):
            new = next(versions)
            repo.publish(RECIPE, new)
            repo.write_run(RECIPE, RECIPE, new)
            run_file = repo.path / "workflowruns" / f"{RECIPE}.yaml"
            run_file.write_text(run_file.read_text().replace(
                "    trafficPercent: 5\n", "    steps:\n      - {weight: 50, pause: 5s, gates: [live]}\n"))
            repo.commit(f"{new}: the same code")
            plnt.reconciler.wake()
            outcome = await ended(new)
            history = await saga_history(plnt.client, "default", RECIPE)
            verdict = next((str(next(iter((s.detail or {}).values()), "")) for s in history.steps
                            if s.step == "check_gates"), "")
            rows.append({"version": new, "outcome": outcome, "verdict": verdict})
            print(f"{new:<8} {outcome:<11} {verdict[:150]}", flush=True)
    finally:
        load.terminate()
        load.wait(timeout=10)
        await plnt.stop()
        repo.remove()
    fails = sum(1 for r in rows if r["outcome"] != "Ready")
    print(f"\nfalse fails: {fails} of {len(rows)} rollouts of a good release ({100 * fails / len(rows):.0f}%)")
    print_json(how, {"rows": rows, "false_fails": fails, "rollouts": len(rows)})


if __name__ == "__main__":
    asyncio.run(main())
