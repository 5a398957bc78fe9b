"""How long `plnt` takes to start and answer, run AS A PROCESS as a user runs it.

Each command is a fresh process of the console script (`.venv/bin/plnt`, or `python -m
plnt.reconciler.cli.main` without one), --repeat times, interleaved with the other commands so a
busy moment of the machine hits them alike; the median and fastest wall time and the median CPU
time (the process and its git children) are printed. The
repository is plan_scale.py's: gitops-example plus --runs WorkflowRuns, a second commit changing one.

    plnt --help                       the table of commands (no command module is imported for it)
    plnt up --help                    one command's options (that command's module only)
    plnt validate DIR                 the repository's spec directory, offline
    plnt plan --base HEAD~1 --head HEAD --format json     with the plan cache warm, and --no-cache

--before REV also runs the plnt of that git revision of this checkout (plan_scale.before_command:
its tree on sys.path, this virtualenv's packages), for before/after figures from the same run.

    python bench/cli_startup.py [--runs 1000] [--repeat 7] [--before main]

Prints how it ran, a table, and the raw figures as JSON.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchlib import how_it_ran, print_json
from plan_scale import before_command, build_repo, children_cpu

CONSOLE_SCRIPT = Path(sys.executable).parent / "plnt"


def this_command() -> list[str]:
    return [str(CONSOLE_SCRIPT)] if CONSOLE_SCRIPT.exists() else [sys.executable, "-m", "plnt.reconciler.cli.main"]


def run(command: list[str], env: dict[str, str]) -> tuple[float, float]:
    """One process: its wall seconds, and the CPU seconds it and its children (git) used."""
    cpu, started = children_cpu(), time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    wall, cpu = time.perf_counter() - started, children_cpu() - cpu
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({done.returncode}): {done.stderr[-2000:]}")
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=1000, help="WorkflowRuns in the repository")
    parser.add_argument("--repeat", type=int, default=7, help="processes per command and variant")
    parser.add_argument("--before", help="a git revision of this checkout to compare with (e.g. main)")
    args = parser.parse_args()
    how = how_it_ran("cli_startup.py", vars(args), [
        f"each figure: one fresh process; wall seconds (median, fastest) and CPU seconds of it and its git "
        f"children (median) over {args.repeat}, commands interleaved",
        f"repository: gitops-example + {args.runs} WorkflowRuns, 2 commits; plan cache in a scratch PLNT_CACHE_DIR "
        "(warmed by one plan before timing)"])
    scratch = Path(tempfile.mkdtemp(prefix="plnt-bench-cli-"))
    try:
        repo = build_repo(scratch / "repo", args.runs)
        env = {**os.environ, "PLNT_CACHE_DIR": str(scratch / "cache"), "COLUMNS": "120", "NO_COLOR": "1"}
        plnt = {"this checkout": this_command()}
        if args.before:
            plnt[f"before ({args.before})"] = before_command(args.before, scratch)
        plan = ["plan", "--repo", str(repo), "--base", "HEAD~1", "--head", "HEAD", "--format", "json"]
        commands = {
            "plnt --help": ["--help"],
            "plnt up --help": ["up", "--help"],
            f"plnt validate ({args.runs} runs)": ["validate", str(repo)],
            f"plnt plan ({args.runs} runs, warm cache)": plan,
            f"plnt plan ({args.runs} runs, --no-cache)": [*plan, "--no-cache"],
        }
        for prefix in plnt.values():  # warm the plan cache, and the file system's cache
            run([*prefix, *plan], env)
        raw: dict[str, dict[str, list[tuple[float, float]]]] = {variant: {name: [] for name in commands} for variant in plnt}
        for _ in range(args.repeat):
            for name, words in commands.items():
                for variant, prefix in plnt.items():
                    wall, cpu = run([*prefix, *words], env)
                    raw[variant][name].append((round(wall, 4), round(cpu, 4)))
        width = max(len(name) for name in commands)
        print(f"\n{'':<{width}}  " + "  ".join(f"{variant:^30}" for variant in plnt))
        print(f"{'command':<{width}}  " + "  ".join(f"{'wall median / fastest, CPU s':>30}" for _ in plnt))
        summary: dict[str, dict[str, dict[str, float]]] = {variant: {} for variant in plnt}
        for name in commands:
            cells = []
            for variant in plnt:
                walls, cpus = [w for w, _ in raw[variant][name]], [c for _, c in raw[variant][name]]
                figures = {"median_wall_s": statistics.median(walls), "fastest_wall_s": min(walls),
                           "median_cpu_s": statistics.median(cpus)}
                summary[variant][name] = figures
                cells.append(f"{figures['median_wall_s']:>14.3f} / {figures['fastest_wall_s']:.3f}, {figures['median_cpu_s']:.3f}")
            print(f"{name:<{width}}  " + "  ".join(cells))
        print_json(how, {"summary": summary, "raw": raw})
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
