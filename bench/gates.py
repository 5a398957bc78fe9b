"""How long each kind of Gate takes at a canary step, with the defaults, on the embedded default.

Starts plnt in this process exactly as `plnt up` does (embedded Temporal dev server, local runner
processes, gateway) on a scratch spec repository (bench/benchlib.py: a registry inside it, signed by
a throwaway authority) whose WorkflowRun goes through three steps, one Gate each:

    step 1 (10%): quality  the recipe's 4 golden cases on the canary and on the stable release
    step 2 (20%): metric   one PromQL query on a real Prometheus (Debian's) scraping plnt every second
    step 3 (30%): webhook  an HMAC-signed POST to a receiver in this process that verifies it

Each rollout publishes a recipe version plnt never pulled (fresh) and waits for Ready; each gate's
time is its own verdict's duration (check_gates measures it) and the check_gates step as Temporal's
history records it (scheduled to completed: the activity's round trip included).

    python bench/gates.py [--rollouts 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import shutil
import statistics
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

import httpx
from benchlib import BenchRepo, how_it_ran, print_json
from plnt.reconciler.app import start
from plnt.reconciler.drivers.processes import free_port
from plnt.reconciler.gates.webhook import verify
from plnt.reconciler.saga.history import saga_history
from plnt.reconciler.settings import Settings

RECIPE = "review-responder"
KEY = f"default/{RECIPE}"
SECRET = "bench-gate-secret"
STEPS = """\
    steps:
      - {weight: 10, gates: [golden-answers]}
      - {weight: 20, gates: [canary-errors]}
      - {weight: 30, gates: [qa-signoff]}
"""


def gate_specs(prometheus: str, receiver: str) -> str:
    return f"""\
apiVersion: plnt.work/v1
kind: Gate
metadata: {{name: golden-answers}}
spec:
  quality: {{}}
---
apiVersion: plnt.work/v1
kind: Gate
metadata: {{name: canary-errors}}
spec:
  metric:
    prometheus: "{prometheus}"
    query: 'sum(plnt_gateway_requests_total{{workflow="$name",version="$canary_version",code=~"5.."}}) or vector(0)'
    max: 0
---
apiVersion: plnt.work/v1
kind: Gate
metadata: {{name: qa-signoff}}
spec:
  webhook: {{url: "{receiver}/gate", secret: BENCH}}
"""


class Receiver(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers["content-length"]))
        ok = verify(SECRET.encode(), self.headers.get("x-plnt-timestamp", ""), self.headers.get("x-plnt-signature", ""),
                    body)
        answer = json.dumps({"pass": ok, "reason": "signed" if ok else "bad signature"}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args: Any) -> None:
        pass


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rollouts", type=int, default=5, help="rollouts, each through the three gated steps")
    args = parser.parse_args()
    if args.rollouts < 1:
        parser.error("--rollouts at least 1")
    prometheus_bin = shutil.which("prometheus")
    if prometheus_bin is None:
        raise SystemExit("prometheus is not installed: bash tools/install_test_services.sh")
    logging.basicConfig(level=logging.WARNING)
    how = how_it_ran("gates.py", vars(args), [
        "plnt up in this process: embedded Temporal dev server (SQLite in the state dir), local runner processes",
        "three steps, one Gate each, default settings: quality (4 golden cases on canary and stable), metric (a "
        "PromQL query, real Prometheus scraping plnt every 1 s), webhook (HMAC-signed POST to a local receiver)",
        "each rollout a fresh recipe version (never pulled); no pause between steps; each gate's own duration and "
        "its check_gates step in Temporal's history"])
    os.environ["PLNT_GATE_SECRET_BENCH"] = SECRET

    repo = BenchRepo("plnt-bench-gates-")
    receiver = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    prom_port = free_port()
    versions = iter(f"3.{n}.0" for n in range(10_000))
    version = next(versions)
    repo.publish(RECIPE, version)
    repo.write_run(RECIPE, RECIPE, version)
    repo.commit(f"{RECIPE} {version}")
    settings = Settings(repo=str(repo.path), state_dir=repo.scratch / "state", port=0, interval_s=1.0)
    plnt = await start(settings)
    config = repo.scratch / "prometheus.yml"
    config.write_text("global: {scrape_interval: 1s, scrape_timeout: 1s}\nscrape_configs:\n  - job_name: plnt\n"
                      f"    static_configs: [{{targets: ['{urlsplit(plnt.url).netloc}']}}]\n")
    prometheus = subprocess.Popen([prometheus_bin, f"--config.file={config}",
                                   f"--storage.tsdb.path={repo.scratch / 'tsdb'}",
                                   f"--web.listen-address=127.0.0.1:{prom_port}"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    async def until(phase: str, wanted: str, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status = plnt.statuses.get(KEY)
            if status is not None and status.attempted_version == wanted and status.phase.value in ("Failed", "RolledBack"):
                raise SystemExit(f"{wanted} ended {status.phase.value}: {status.last_error}")
            if status is not None and status.phase.value == phase and status.version == wanted:
                return
            await asyncio.sleep(0.02)
        raise TimeoutError(f"{wanted} never reached {phase}")

    rows: list[dict[str, Any]] = []
    try:
        await until("Ready", version)
        (repo.path / "gates").mkdir()
        (repo.path / "gates" / "gates.yaml").write_text(gate_specs(f"http://127.0.0.1:{prom_port}",
                                                                   f"http://127.0.0.1:{receiver.server_address[1]}"))
        async with httpx.AsyncClient(trust_env=False) as client:
            for _ in range(args.rollouts):
                new = next(versions)
                repo.publish(RECIPE, new)
                repo.write_run(RECIPE, RECIPE, new)
                run_file = repo.path / "workflowruns" / f"{RECIPE}.yaml"
                run_file.write_text(run_file.read_text().replace("    trafficPercent: 5\n", STEPS))
                repo.commit(f"{new} through three gated steps")
                started = time.perf_counter()
                (await client.post(f"{plnt.url}/hooks/git")).raise_for_status()
                await until("Ready", new)
                ready_s = time.perf_counter() - started
                history = await saga_history(plnt.client, "default", RECIPE)
                gated = [step for step in history.steps if step.step == "check_gates"]
                if len(gated) != 3:
                    raise SystemExit(f"{new}: {len(gated)} check_gates steps, not 3: {history.steps}")
                for kind, step in zip(("quality", "metric", "webhook"), gated, strict=True):
                    detail = next(iter((step.detail or {}).values()), "")
                    own_ms = float(detail.split(" in ", 1)[1].split(" ms", 1)[0]) if " in " in detail else None
                    rows.append({"version": new, "gate": kind, "gate_ms": own_ms, "step_ms": step.duration_ms,
                                 "verdict": detail.split(" ", 1)[0]})
                rows.append({"version": new, "gate": "rollout", "commit_to_ready_ms": round(ready_s * 1000, 1)})
    finally:
        prometheus.terminate()
        prometheus.wait(timeout=10)
        receiver.shutdown()
        await plnt.stop()
        repo.remove()

    print(f"\n{'gate':<10} {'rollouts':>8} {'verdict p50':>12} {'verdict max':>12} {'check_gates step p50':>21} "
          f"{'step max':>9}")
    summary: dict[str, Any] = {}
    for kind in ("quality", "metric", "webhook"):
        mine = [r for r in rows if r["gate"] == kind]
        own = [r["gate_ms"] for r in mine if r["gate_ms"] is not None]
        steps = [r["step_ms"] for r in mine if r["step_ms"] is not None]
        summary[kind] = {"rollouts": len(mine), "verdict_p50_ms": round(statistics.median(own), 1),
                         "verdict_max_ms": max(own), "step_p50_ms": round(statistics.median(steps), 1),
                         "step_max_ms": round(max(steps), 1), "verdicts": sorted({r["verdict"] for r in mine})}
        s = summary[kind]
        print(f"{kind:<10} {len(mine):>8} {s['verdict_p50_ms']:>9.1f} ms {s['verdict_max_ms']:>9.1f} ms "
              f"{s['step_p50_ms']:>18.1f} ms {s['step_max_ms']:>6.1f} ms")
    readies = [r["commit_to_ready_ms"] for r in rows if r["gate"] == "rollout"]
    summary["commit_to_ready_p50_ms"] = round(statistics.median(readies), 1)
    print(f"\ncommit -> Ready through the three gated steps: p50 {summary['commit_to_ready_p50_ms']:.0f} ms "
          f"(min {min(readies):.0f}, max {max(readies):.0f})")
    print_json(how, {"rows": rows, "summary": summary})


if __name__ == "__main__":
    asyncio.run(main())
