"""Spec loading cost (the reconciler's per-commit hot path): read + parse + validate.

Times, in one run, the median of --repeat loads of:
  - example: gitops-example read from a real git commit (`GitSource.spec_files` + `load_sources`);
  - 1000 runs: a generated repository of --runs WorkflowRuns (one file each), same path;
  - bombs (when the loader bounds them): a 292-byte alias bomb (9^7 references) and a 5,000-deep nesting, each
    refused; time and peak-memory growth (VmHWM) of the refusal.

    python bench/spec_load.py [--repeat 5] [--runs 1000]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from plnt.reconciler.loader import SourceFile, load_sources
from plnt.reconciler.source import GitSource

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


def time_load(repo: Path, scratch: Path, repeat: int) -> tuple[float, int]:
    source = GitSource(str(repo), scratch / f"clone-{repo.name}")
    commit = source.fetch()
    times, count = [], 0
    for _ in range(repeat):
        start = time.perf_counter()
        specs, problems = load_sources(source.spec_files(commit))
        times.append(time.perf_counter() - start)
        assert not problems, problems[:3]
        count = len(specs.workflow_runs)
    return statistics.median(times), count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--runs", type=int, default=1000)
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
        seconds, count = time_load(example, scratch, args.repeat)
        print(f"example repo ({count} WorkflowRun): median {seconds * 1000:.1f} ms over {args.repeat} loads")
        seconds, count = time_load(many, scratch, args.repeat)
        print(f"{count} WorkflowRuns: median {seconds * 1000:.1f} ms over {args.repeat} loads")
        for name, text in (("alias bomb", ALIAS_BOMB), ("5,000-deep nesting", "a: " + "[" * 5000 + "]" * 5000)):
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
