"""What --require-approval costs per new commit: forge calls and the plan digest (recipe pull and
verification), against the DECLARED forge stand-in (tests/forge_standin.py, GitHub REST shapes,
on 127.0.0.1: no network latency; a live forge adds its round trips per call).

Makes a real git repository (a copy of gitops-example, real signed recipes) with N merged pull
requests (each one review-responder version bump, merged with a merge commit, its plan digest
posted on its head and approved there), then times ApprovalGate.first_unapproved:
- fresh: a new gate and an empty recipe cache (every recipe pulled and its signature verified);
- recipes cached: a new gate, the recipe cache filled (the reconciler's usual case: the saga or
  an earlier plan already pulled the recipe);
- verdict cached: the same gate again (an approved commit is not asked about twice);
for 1 new commit and for N new commits. Forge requests per new commit: the PR of the commit, its
reviews, the `plnt/plan` status of its head, then the `plnt/approval` verdict (read back, and
written when it changed: a fresh forge gets 5, one that already shows the verdict 4).

    python bench/require_approval.py [--prs 20] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from plnt.reconciler.plan.digest import STATUS_CONTEXT, short  # noqa: E402
from plnt.reconciler.recipes.pull import RecipeCache  # noqa: E402
from plnt.reconciler.recipes.registries import RegistryOptions  # noqa: E402
from plnt.reconciler.review.approval import ApprovalGate, plan_digest_between  # noqa: E402
from plnt.reconciler.review.forge import make_forge  # noqa: E402
from plnt.reconciler.source.git import GitSource  # noqa: E402

from tests.forge_standin import ForgeStandin  # noqa: E402

GIT = {"GIT_AUTHOR_NAME": "bench", "GIT_AUTHOR_EMAIL": "bench@plnt.invalid",
       "GIT_COMMITTER_NAME": "bench", "GIT_COMMITTER_EMAIL": "bench@plnt.invalid"}
RUN_FILE = "workflowruns/review-responder.yaml"
VERSIONS = ["1.3.0", "1.4.0", "1.5.0", "1.2.0"]
TOKEN = "bench-token"


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, env={**os.environ, **GIT}, check=True, capture_output=True,
                          text=True).stdout.strip()


async def make_world(tmp: Path, standin: ForgeStandin, prs: int) -> tuple[Path, list[str]]:
    """The repo and its first-parent commits: [initial, merge 1, ..., merge N]."""
    repo = tmp / "specs"
    shutil.copytree(ROOT / "gitops-example", repo)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "initial")
    commits = [git(repo, "rev-parse", "HEAD")]
    ci = GitSource(str(repo), tmp / "ci-clone")
    ci_cache = RecipeCache(tmp / "ci-recipes")
    current = "1.2.0"
    async with make_forge("github", standin.api_url, standin.project, TOKEN) as forge:
        for n in range(1, prs + 1):
            version = VERSIONS[(n - 1) % len(VERSIONS)]
            git(repo, "checkout", "-q", "-b", f"pr-{n}")
            text = (repo / RUN_FILE).read_text().replace(f"review-responder@{current}", f"review-responder@{version}")
            (repo / RUN_FILE).write_text(text)
            git(repo, "commit", "-q", "-am", f"review-responder {version}")
            head = git(repo, "rev-parse", "HEAD")
            made = plan_digest_between(ci, ci.resolve(git(repo, "merge-base", "main", head)), ci.resolve(head),
                                       cache=ci_cache, registry_options=RegistryOptions())
            assert made.digest is not None, made.problems
            await forge.set_status(head, "success", STATUS_CONTEXT, f"plan {short(made.digest)}: 1 to upgrade")
            standin.add_review(n, "reviewer-a", "APPROVED", head)
            git(repo, "checkout", "-q", "main")
            git(repo, "merge", "--no-ff", "-q", "-m", f"Merge pull request #{n}", f"pr-{n}")
            merge = git(repo, "rev-parse", "HEAD")
            standin.pulls[n] = {"head_sha": head, "merged": True, "commits": [head, merge]}
            commits.append(merge)
            current = version
    return repo, commits


async def measure(gate: ApprovalGate, standin: ForgeStandin, head: str, last: str, new: int, case: str) -> dict:  # type: ignore[type-arg]
    before, plans = len(standin.requests), gate.counters.plans
    start = time.perf_counter()
    verdict = await gate.first_unapproved(head, last)
    seconds = time.perf_counter() - start
    assert verdict is None, verdict
    return {"case": case, "new_commits": new, "seconds": round(seconds, 4),
            "ms_per_commit": round(seconds * 1000 / new, 2),
            "forge_requests": len(standin.requests) - before, "plans": gate.counters.plans - plans}


async def main_async(prs: int) -> list[dict]:  # type: ignore[type-arg]
    rows = []
    with tempfile.TemporaryDirectory(prefix="plnt-bench-approval-") as tmp_name, \
            ForgeStandin("github", "owner/specs", TOKEN, page_size=30) as standin:
        tmp = Path(tmp_name)
        repo, commits = await make_world(tmp, standin, prs)
        source = GitSource(str(repo), tmp / "plnt-clone")
        head = source.fetch()
        cache_dir = tmp / "recipes"
        for new in (1, prs):
            last = commits[-1 - new]
            for case in ("fresh", "recipes cached", "verdict cached"):
                if case == "fresh":
                    shutil.rmtree(cache_dir, ignore_errors=True)
                if case != "verdict cached":
                    forge = make_forge("github", standin.api_url, standin.project, TOKEN)
                    gate = ApprovalGate(forge, source, cache=RecipeCache(cache_dir), registry_options=RegistryOptions())
                rows.append(await measure(gate, standin, head, last, new, case))
                if case != "recipes cached":  # that gate is measured once more: verdict cached
                    await gate.aclose()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prs", type=int, default=20)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    print(f"# bench/require_approval.py: {os.cpu_count()} cores; forge = the stand-in on 127.0.0.1 "
          "(GitHub shapes); each new commit is the merge of an approved PR", file=sys.stderr)
    rows = asyncio.run(main_async(args.prs))
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(f"{'case':<16} {'new commits':>11} {'seconds':>9} {'ms/commit':>10} {'forge requests':>15} {'plans':>6}")
    for r in rows:
        print(f"{r['case']:<16} {r['new_commits']:>11} {r['seconds']:>9} {r['ms_per_commit']:>10} "
              f"{r['forge_requests']:>15} {r['plans']:>6}")


if __name__ == "__main__":
    main()
