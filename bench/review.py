"""Push on a pull request branch -> plan comment posted: `plnt review` as a CI job runs it.

Makes a real git repository from gitops-example with a pull request branch (review-responder
1.2.0 -> 1.3.0), then runs `plnt review` as a subprocess (process start, imports, clone, specs at
both commits, the plan, the recipe pulled from the repository's registry and its Sigstore signature
verified, one comment upserted and the plnt/plan status set) against the DECLARED forge stand-in
(tests/forge_standin.py, an HTTP server on 127.0.0.1: no network latency to a real forge is in the
figures). Each run is a new push (a new head commit). "fresh" runs get an empty recipe cache, as a CI
job without a cache does; "cached" runs share one --cache-dir (entries are re-verified on use).

    python bench/review.py [--runs 10] [--forge github|gitlab|gitea] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.forge_standin import ForgeStandin  # noqa: E402

GIT = {"GIT_AUTHOR_NAME": "bench", "GIT_AUTHOR_EMAIL": "bench@plnt.invalid",
       "GIT_COMMITTER_NAME": "bench", "GIT_COMMITTER_EMAIL": "bench@plnt.invalid"}
TOKEN = "bench-forge-token"
RUN_FILE = "workflowruns/review-responder.yaml"


def git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", *args], cwd=cwd, env={**os.environ, **GIT}, check=True, capture_output=True,
                          text=True).stdout.strip()


def make_repo(root: Path) -> Path:
    repo = root / "specs"
    shutil.copytree(ROOT / "gitops-example", repo)
    git("init", "-q", "-b", "main", cwd=repo)
    git("add", "-A", cwd=repo)
    git("commit", "-q", "-m", "specs", cwd=repo)
    git("checkout", "-q", "-b", "pr", cwd=repo)
    run = repo / RUN_FILE
    run.write_text(run.read_text().replace("review-responder@1.2.0", "review-responder@1.3.0"))
    git("commit", "-q", "-am", "1.3.0", cwd=repo)
    return repo


def push(repo: Path, i: int) -> str:
    """A new head on the PR branch: another canary share each push."""
    run = repo / RUN_FILE
    lines = [line if "trafficPercent" not in line else f"    trafficPercent: {5 + i % 20}" for line in
             run.read_text().splitlines()]
    run.write_text("\n".join(lines) + "\n")
    git("commit", "-q", "--allow-empty", "-am", f"push {i}", cwd=repo)
    return git("rev-parse", "HEAD", cwd=repo)


def one(plnt: str, repo: Path, forge: ForgeStandin, cache: Path | None) -> float:
    argv = [plnt, "review", "--repo", str(repo), "--base", "main", "--head", "pr", "--forge", forge.kind,
            "--api-url", forge.api_url, "--project", forge.project, "--pr", "7", "--token-env", "BENCH_TOKEN"]
    if cache is not None:
        argv += ["--cache-dir", str(cache)]
    start = time.perf_counter()
    done = subprocess.run(argv, env={**os.environ, "BENCH_TOKEN": TOKEN}, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"plnt review failed ({done.returncode}): {done.stderr}")
    return elapsed


def stats(samples: list[float]) -> dict[str, float]:
    return {"n": len(samples), "p50_ms": statistics.median(samples) * 1000, "max_ms": max(samples) * 1000,
            "min_ms": min(samples) * 1000}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--forge", choices=["github", "gitlab", "gitea"], default="github")
    parser.add_argument("--json", action="store_true", help="only the raw JSON")
    args = parser.parse_args()
    plnt = str(Path(sys.executable).with_name("plnt"))
    results: dict[str, list[float]] = {"fresh": [], "cached": [], "startup": []}
    with tempfile.TemporaryDirectory(prefix="plnt-bench-review-") as scratch:
        root = Path(scratch)
        repo = make_repo(root)
        project = "group/specs" if args.forge == "gitlab" else "owner/specs"
        with ForgeStandin(args.forge, project, TOKEN, page_size=100) as forge:
            one(plnt, repo, forge, root / "warm-cache")  # fills the shared cache; not counted
            for i in range(args.runs):
                for label in ("fresh", "cached"):
                    push(repo, 2 * i + (label == "cached"))
                    results[label].append(one(plnt, repo, forge, None if label == "fresh" else root / "warm-cache"))
            for _ in range(args.runs):  # the floor: process start and imports of `plnt review --help`
                start = time.perf_counter()
                subprocess.run([plnt, "review", "--help"], check=True, capture_output=True)
                results["startup"].append(time.perf_counter() - start)
            ours = [c for c in forge.comments.get(7, []) if "plnt:plan" in c["body"]]
            assert len(ours) == 1, f"expected one plan comment, found {len(ours)}"
            requests = len(forge.requests)
    summary = {label: stats(samples) for label, samples in results.items()}
    raw = {"bench": "review", "forge": args.forge, "runs": args.runs, "python": platform.python_version(),
           "machine": platform.machine(), "cpus": os.cpu_count(), "forge_requests": requests,
           "summary": summary, "samples_s": results}
    if not args.json:
        print(f"plnt review as a CI step: push on a PR branch -> plan comment + plnt/plan status posted\n"
              f"  subprocess per run (python {raw['python']}, {raw['cpus']} CPUs), {args.forge} forge stand-in on "
              f"127.0.0.1, {args.runs} runs each, a new head commit per run\n"
              f"  fresh: empty recipe cache (pull + verify); cached: shared --cache-dir (re-verified on use);\n"
              f"  startup: `plnt review --help` alone (process start and imports: the floor)\n")
        print(f"{'run':<8} {'n':>3} {'p50 ms':>9} {'max ms':>9} {'min ms':>9}")
        for label, s in summary.items():
            print(f"{label:<8} {s['n']:>3} {s['p50_ms']:>9.0f} {s['max_ms']:>9.0f} {s['min_ms']:>9.0f}")
        print()
    print(json.dumps(raw))


if __name__ == "__main__":
    main()
