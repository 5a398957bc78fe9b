"""What one route rebuild costs at N WorkflowRuns while releases keep changing: the scan of the
release records (`LocalDriver.snapshot` when the directory changed) and the route table built from
them, from scratch and reusing the routes of unchanged records (what `plnt up` does).

Real release records in a scratch state directory (N files, as the local driver writes them) and a
real StatusStore; no runner processes (nothing here reads them). CPU time per call, best of
--rounds rounds of --repeat calls each.

    python bench/route_rebuild.py [--runs 1000] [--repeat 30] [--rounds 5]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchlib import how_it_ran, print_json
from plnt.core.status import Phase
from plnt.reconciler.app import build_route_table
from plnt.reconciler.drivers.local import LocalDriver
from plnt.reconciler.state import LiveWorkflow, Release, StateDir, atomic_write_json
from plnt.reconciler.status_store import StatusStore


def best_ms(call: Callable[[], Any], repeat: int, rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        started = time.process_time()
        for _ in range(repeat):
            call()
        best = min(best, (time.process_time() - started) / repeat)
    return round(best * 1000, 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    how = how_it_ran("route_rebuild.py", vars(args), [
        f"{args.runs} release records (stable + canary) in a scratch state dir and {args.runs} statuses; "
        f"CPU ms per call, best of {args.rounds} rounds of {args.repeat}"])
    with tempfile.TemporaryDirectory() as scratch:
        state = StateDir(Path(scratch)).ensure()
        statuses = StatusStore(state.status_file)
        for i in range(args.runs):
            name = f"rr-{i:04d}"

            def release(track: str, port: int, name: str = name) -> Release:
                return Release(release_id=f"{name}-{track}", namespace="default", name=name, track=track,
                               version="1.0.0", spec_fingerprint="sha256:" + "a" * 64,
                               recipe_digest="sha256:" + "0" * 64, recipe_dir=scratch,
                               endpoint=f"http://127.0.0.1:{port}", pid=1, port=port,
                               traffic_percent=10 if track == "canary" else 0)

            live = LiveWorkflow(namespace="default", name=name, stable=release("stable", 20000 + i),
                                canary=release("canary", 40000 + i))
            atomic_write_json(state.releases / f"default.{name}.json", live.model_dump(mode="json"))
            statuses.update("default", name, phase=Phase.CANARY, version="1.0.0")
        driver = LocalDriver(state)
        snapshot = driver._records._scan()
        built: dict[str, Any] = {}
        build_route_table(snapshot, statuses, built)
        results = {
            "scan_ms": best_ms(driver._records._scan, args.repeat, args.rounds),
            "route_table_from_scratch_ms": best_ms(lambda: build_route_table(snapshot, statuses), args.repeat,
                                                   args.rounds),
            "route_table_reusing_ms": best_ms(lambda: build_route_table(snapshot, statuses, built), args.repeat,
                                              args.rounds),
        }
    print(f"\n{args.runs} WorkflowRuns, CPU per call:")
    print(f"  scan of the release records (directory changed):  {results['scan_ms']:.2f} ms")
    print(f"  route table, from scratch:                        {results['route_table_from_scratch_ms']:.2f} ms")
    print(f"  route table, unchanged records' routes reused:    {results['route_table_reusing_ms']:.2f} ms")
    print_json(how, results)


if __name__ == "__main__":
    main()
