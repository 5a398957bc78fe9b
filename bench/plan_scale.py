"""`plnt plan --base HEAD~1 --head HEAD` on a repository of N WorkflowRuns where one changed.

Builds a real git repository: gitops-example (its backend, trust policy, registry) plus --runs
WorkflowRuns (distinct names, one file each), then a second commit that changes one of them. Runs
`plnt plan --base HEAD~1 --head HEAD --format json` AS A PROCESS, as users run it, --repeat times:
wall and CPU (the process and its git children) per run, p50. With a plan cache (--cache-dir), the
first run is reported apart ("cold": nothing cached) from the others ("warm"); --no-cache runs
parse everything every time (the cold path, as the first reconcile pass after `plnt up` starts).
--before REV also runs the plnt of that git revision of this checkout (extracted with `git
archive`), with and without the plan cache, in the same run, interleaved, for before/after ratios.
Then one in-process cProfile of the same plan (this checkout), top entries by cumulative time.

    python bench/plan_scale.py [--runs 1000] [--repeat 7] [--before main] [--top 25]

Prints how it ran, a table, and the raw figures as JSON.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
GIT = ["git", "-c", "user.name=plnt-bench", "-c", "user.email=bench@plnt.invalid"]

RUN = """\
apiVersion: plnt.work/v1
kind: WorkflowRun
metadata:
  name: run-{i}
  namespace: default
spec:
  workflow:
    ref: review-responder@1.2.0
    registry: file:registry
  backend:
    cluster: local
  replicas: {{min: 1, max: 1}}
  canary:
    trafficPercent: {percent}
    smokeTest:
      invocations: 10
      p95BudgetMs: 2500
      errorBudgetPercent: 1
"""


def build_repo(where: Path, runs: int) -> Path:
    shutil.copytree(ROOT / "gitops-example", where)
    for i in range(runs):
        (where / "workflowruns" / f"run-{i}.yaml").write_text(RUN.format(i=i, percent=5))
    subprocess.run([*GIT, "init", "-q", "-b", "main"], cwd=where, check=True)
    subprocess.run([*GIT, "add", "-A"], cwd=where, check=True)
    subprocess.run([*GIT, "commit", "-q", "-m", f"{runs} WorkflowRuns"], cwd=where, check=True)
    changed = where / "workflowruns" / f"run-{runs // 2}.yaml"
    changed.write_text(RUN.format(i=runs // 2, percent=10))
    subprocess.run([*GIT, "commit", "-q", "-am", "one WorkflowRun changed"], cwd=where, check=True)
    return where


def before_command(rev: str, scratch: Path) -> list[str]:
    """The plnt of another revision of this checkout, run with this checkout's virtualenv (same
    dependencies): its tree extracted and put first on sys.path as the package `plnt`."""
    tree = scratch / "before-tree"
    tree.mkdir()
    archive = subprocess.run(["git", "archive", rev], cwd=ROOT, check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    package = scratch / "before-path" / "plnt"
    package.mkdir(parents=True)
    for name in ("reconciler", "gateway", "runner"):
        (package / name).symlink_to(tree / name)
    code = f"import sys; sys.path.insert(0, {str(package.parent)!r}); from plnt.reconciler.cli.main import main; main()"
    return [sys.executable, "-c", code]


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_plan(command: list[str], repo: Path, extra: list[str], env: dict[str, str]) -> dict[str, Any]:
    """One `plnt plan` process: wall seconds, CPU seconds (it and its git children), the plan."""
    cpu, wall = children_cpu(), time.perf_counter()
    done = subprocess.run([*command, "plan", "--repo", str(repo), "--base", "HEAD~1", "--head", "HEAD",
                           "--format", "json", *extra], capture_output=True, text=True, env=env, check=False)
    wall = time.perf_counter() - wall
    cpu = children_cpu() - cpu
    if done.returncode != 0:
        raise SystemExit(f"plan failed ({done.returncode}): {done.stderr[-2000:]}")
    items = json.loads(done.stdout)["items"]
    return {"wall_s": round(wall, 4), "cpu_s": round(cpu, 4),
            "changed": sorted(f"{i['namespace']}/{i['name']}" for i in items if i["action"] != "unchanged")}


def profile(repo: Path, top: int, cache: list[str], sort: str = "cumulative") -> str:
    """cProfile of this checkout's plan, in this process (`cache`: --no-cache, or a --cache-dir)."""
    from plnt.reconciler.cli.main import app
    from typer.testing import CliRunner

    profiler = cProfile.Profile()
    profiler.enable()
    result = CliRunner().invoke(app, ["plan", "--repo", str(repo), "--base", "HEAD~1", "--head", "HEAD",
                                      "--format", "json", *cache])
    profiler.disable()
    if result.exit_code != 0:
        return f"(profile run failed: {result.output[-500:]})"
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats(sort).print_stats(top)
    return out.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=1000, help="WorkflowRuns in the repository")
    parser.add_argument("--repeat", type=int, default=7, help="plan processes per variant")
    parser.add_argument("--before", help="a git revision of this checkout to compare with (e.g. main)")
    parser.add_argument("--top", type=int, default=25, help="cProfile entries shown (0: no profile)")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="plnt-bench-plan-"))
    try:
        repo = build_repo(scratch / "repo", args.runs)
        env = {**os.environ, "PLNT_CACHE_DIR": str(scratch / "cache")}
        this = [str(Path(sys.executable).parent / "plnt")]
        variants: dict[str, tuple[list[str], list[str]]] = {
            "this checkout, plan cache": (this, []),
            "this checkout, --no-cache": (this, ["--no-cache"]),
        }
        if args.before:
            old = before_command(args.before, scratch)
            variants[f"before ({args.before}), plan cache"] = (old, [])
            variants[f"before ({args.before}), --no-cache"] = (old, ["--no-cache"])
        raw: dict[str, list[dict[str, Any]]] = {name: [] for name in variants}
        for _ in range(args.repeat):  # interleaved: a busy moment of the machine hits every variant alike
            for name, (command, extra) in variants.items():
                raw[name].append(run_plan(command, repo, extra, env))
        expected = [f"default/run-{args.runs // 2}"]
        for name, figures in raw.items():
            for figure in figures:
                if figure["changed"] != expected:
                    raise SystemExit(f"{name}: the plan changed {figure['changed']}, expected {expected}")
        print(f"plan_scale: {args.runs} WorkflowRuns + gitops-example, 2 commits (one WorkflowRun changed); "
              f"`plnt plan --base HEAD~1 --head HEAD --format json` as a process, {args.repeat} runs per variant "
              f"interleaved; python {sys.version.split()[0]}, {os.cpu_count()} CPUs")
        print(f"{'variant':<34} {'first wall s':>12} {'p50 wall s':>11} {'p50 CPU s':>10}   (p50 over runs 2..{args.repeat})")
        summary: dict[str, dict[str, float]] = {}
        for name, figures in raw.items():
            rest = figures[1:] or figures
            summary[name] = {"first_wall_s": figures[0]["wall_s"], "first_cpu_s": figures[0]["cpu_s"],
                             "p50_wall_s": statistics.median(f["wall_s"] for f in rest),
                             "p50_cpu_s": statistics.median(f["cpu_s"] for f in rest)}
            s = summary[name]
            print(f"{name:<34} {s['first_wall_s']:>12.3f} {s['p50_wall_s']:>11.3f} {s['p50_cpu_s']:>10.3f}")
        if args.before:
            for kind in ("plan cache", "--no-cache"):
                old, new = summary[f"before ({args.before}), {kind}"], summary[f"this checkout, {kind}"]
                print(f"ratio before/this checkout, {kind}: p50 wall x{old['p50_wall_s'] / new['p50_wall_s']:.1f}, "
                      f"p50 CPU x{old['p50_cpu_s'] / new['p50_cpu_s']:.1f}")
        if args.top:
            print(f"\ncProfile of one plan in-process (this checkout, --no-cache), top {args.top} by cumulative time:")
            print(profile(repo, args.top, ["--no-cache"]))
            print(f"\ncProfile of one plan in-process (this checkout, the warm plan cache), top {args.top} by internal time:")
            print(profile(repo, args.top, ["--cache-dir", str(scratch / "cache")], sort="tottime"))
        print("raw JSON:")
        print(json.dumps({"runs": args.runs, "repeat": args.repeat, "before": args.before, "summary": summary,
                          "raw": {k: [{x: y for x, y in f.items() if x != "changed"} for f in v] for k, v in raw.items()}}))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
