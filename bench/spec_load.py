"""Spec loading cost (the reconciler's per-commit hot path): read + parse + validate.

Times, in one run, the median of --repeat loads of:
  - example: gitops-example read from a real git commit (`GitSource.spec_files` + `load_sources`);
  - 1000 runs: a generated repository of --runs WorkflowRuns (one file each), same path;
  - bombs (when the loader bounds them): a 292-byte alias bomb (9^7 references) and a 5,000-deep nesting, each
    refused; time and peak-memory growth (VmHWM) of the refusal.

    python bench/spec_load.py [--repeat 5] [--runs 1000] [--no-bombs] [--before OTHER_CHECKOUT]
"""

from __future__ import annotations

import argparse
import importlib
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from plnt.core.specs import loader
from plnt.core.specs.loader import SourceFile, load_sources
from plnt.reconciler.source import git as source

ROOT = Path(__file__).resolve().parent.parent
GIT = ["git", "-c", "user.name=plnt-bench", "-c", "user.email=bench@plnt.invalid"]

RUN = """\
apiVersion: plnt.work/v1
kind: WorkflowRun
metadata: {{name: run-{i}, namespace: default}}
spec:
  workflow: {{ref: review-responder@1.2.0, registry: "file:registry"}}
  backend: {{cluster: local}}
  canary:
    trafficPercent: 5
    smokeTest: {{invocations: 10, p95BudgetMs: 2500, errorBudgetPercent: 1}}
"""

ALIAS_BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 9)}]\n" for i in range(6))


def vm_hwm_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


def commit_repo(files: dict[str, str], where: Path) -> Path:
    where.mkdir(parents=True)
    subprocess.run([*GIT, "init", "-q", "-b", "main"], cwd=where, check=True)
    for name, text in files.items():
        (where / name).parent.mkdir(parents=True, exist_ok=True)
        (where / name).write_text(text)
    subprocess.run([*GIT, "add", "-A"], cwd=where, check=True)
    subprocess.run([*GIT, "commit", "-q", "-m", "bench"], cwd=where, check=True)
    return where


def cpu_s() -> float:
    """CPU seconds of this process and its reaped children (git ls-tree and friends)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def time_load(impls: dict[str, Any], repo: Path, scratch: Path, repeat: int) -> tuple[list[str], int]:
    """Per implementation (interleaved, same files): median wall and CPU ms of reading the commit's
    spec files (git), and median CPU ms of parsing + validating them."""
    figures: dict[str, dict[str, list[float]]] = {name: {"read": [], "read_cpu": [], "parse_cpu": []} for name in impls}
    sources = {name: mods.source.GitSource(str(repo), scratch / f"clone-{repo.name}-{name}") for name, mods in impls.items()}
    count = 0
    for _ in range(repeat):
        for name, mods in impls.items():
            source = sources[name]
            commit = source.fetch()
            wall, cpu = time.perf_counter(), cpu_s()
            files = source.spec_files(commit)
            figures[name]["read"].append(time.perf_counter() - wall)
            figures[name]["read_cpu"].append(cpu_s() - cpu)
            cpu = time.process_time()
            specs, problems = mods.loader.load_sources(files)
            figures[name]["parse_cpu"].append(time.process_time() - cpu)
            assert not problems, problems[:3]
            count = len(specs.workflow_runs)

    def ms(values: list[float]) -> str:
        return f"{statistics.median(values) * 1000:.1f}"

    return [f"  {name}: read {ms(f['read'])} ms wall / {ms(f['read_cpu'])} ms CPU, parse+validate "
            f"{ms(f['parse_cpu'])} ms CPU" for name, f in figures.items()], count


def implementations(before: Path | None, scratch: Path) -> dict[str, Any]:
    """This checkout's loader and source, and (--before) those of another checkout, imported as
    the package `plnt_before` so both run in this process on the same files."""
    impls: dict[str, Any] = {"this checkout": SimpleNamespace(loader=loader, source=source)}
    if before is not None:
        package = scratch / "before" / "plnt_before"
        package.mkdir(parents=True)
        for name in ("reconciler", "gateway", "runner"):
            (package / name).symlink_to(before.resolve() / name)
        sys.path.insert(0, str(package.parent))
        impls[f"before ({before})"] = SimpleNamespace(loader=importlib.import_module("plnt_before.reconciler.loader"),
                                                      source=importlib.import_module("plnt_before.reconciler.source"))
    return impls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--no-bombs", action="store_true", help="skip the bombs (an unbounded loader takes GiBs)")
    parser.add_argument("--before", type=Path, help="another checkout (e.g. `git worktree add /tmp/main main`) "
                                                    "to compare with, in the same run")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="plnt-bench-specs-"))
    try:
        example = scratch / "example"
        shutil.copytree(ROOT / "gitops-example", example)
        subprocess.run([*GIT, "init", "-q", "-b", "main"], cwd=example, check=True)
        subprocess.run([*GIT, "add", "-A"], cwd=example, check=True)
        subprocess.run([*GIT, "commit", "-q", "-m", "bench"], cwd=example, check=True)
        files = {f"workflowruns/run-{i}.yaml": RUN.format(i=i) for i in range(args.runs)}
        files["backends/local.yaml"] = "apiVersion: plnt.work/v1\nkind: PlntBackend\nmetadata: {name: local}\nspec: {type: local}\n"
        many = commit_repo(files, scratch / "many")
        impls = implementations(args.before, scratch)
        for repo in (example, many):
            lines, count = time_load(impls, repo, scratch, args.repeat)
            print(f"{repo.name} repo ({count} WorkflowRuns), median of {args.repeat}:", *lines, sep="\n")
        bombs = () if args.no_bombs else (("alias bomb", ALIAS_BOMB), ("5,000-deep nesting", "a: " + "[" * 5000 + "]" * 5000))
        for name, text in bombs:
            before = vm_hwm_kib()
            start = time.perf_counter()
            try:
                _, problems = load_sources([SourceFile("bomb.yaml", text)])
                outcome = str(problems[0]) if problems else "no problem"
            except Exception as exc:  # noqa: BLE001 - the "before" loader raises on some of these
                outcome = f"raised {type(exc).__name__}"
            elapsed = time.perf_counter() - start
            print(f"{name} ({len(text)} bytes): {elapsed * 1000:.1f} ms, VmHWM +{(vm_hwm_kib() - before) / 1024:.1f} MiB:"
                  f" {outcome[:160]}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
