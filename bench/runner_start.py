"""Runner start time (spawn to a healthy /healthz), with plnt's whole environment and no limits
(how runners started before) against an allowlisted environment, its own directory and limits
(how the local driver starts them now). Interleaved in one run on the same machine; prints medians.

    python bench/runner_start.py [--runs 10]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from benchlib import how_it_ran, print_json
from plnt.reconciler.local_driver import free_port, runner_env
from plnt.reconciler.specs import RunnerLimits

RECIPE = Path(__file__).resolve().parent.parent / "gitops-example" / "recipes" / "review-responder" / "1.3.0"


def start_once(isolated: bool, scratch: Path) -> float:
    port = free_port()
    args = [sys.executable, "-m", "plnt.runner", "--recipe", str(RECIPE), "--port", str(port), "--release-id", "b"]
    env: dict[str, str] | None = None
    cwd: Path | None = None
    if isolated:
        limits = RunnerLimits()
        args += ["--limit-memory-mib", str(limits.memory_mi_b), "--limit-open-files", str(limits.open_files),
                 "--limit-processes", str(limits.processes)]
        cwd = scratch / f"runner-{port}"
        cwd.mkdir()
        env = runner_env(os.environ, cwd, {})
    began = time.perf_counter()
    child = subprocess.Popen(args, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        with httpx.Client(trust_env=False, timeout=1) as client:
            while True:
                try:
                    if client.get(f"http://127.0.0.1:{port}/healthz").status_code == 200:
                        return time.perf_counter() - began
                except httpx.HTTPError:
                    time.sleep(0.01)
    finally:
        child.terminate()
        child.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    runs = args.runs
    how = how_it_ran("runner_start.py", vars(args), [
        "a fresh `python -m plnt.runner` per start (review-responder 1.3.0), spawn to a 200 from /healthz",
        "the two ways interleaved in one run"])
    times: dict[bool, list[float]] = {False: [], True: []}
    with tempfile.TemporaryDirectory() as scratch:
        for _ in range(runs):
            for isolated in (False, True):
                times[isolated].append(start_once(isolated, Path(scratch)))
    for isolated, label in ((False, "inherited env, no limits"), (True, "allowlisted env, own dir, limits")):
        values = sorted(times[isolated])
        print(f"{label:34s} median {statistics.median(values) * 1000:7.0f} ms  "
              f"min {values[0] * 1000:6.0f} ms  max {values[-1] * 1000:6.0f} ms  (n={runs})")
    print_json(how, {"inherited_env_no_limits_ms": [round(t * 1000, 1) for t in times[False]],
                     "allowlisted_env_own_dir_limits_ms": [round(t * 1000, 1) for t in times[True]]})


if __name__ == "__main__":
    main()
