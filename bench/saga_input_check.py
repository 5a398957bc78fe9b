"""What checking a saga's input against its commit costs, before and after, in one run.

Before: the saga's input carried the WorkflowRun, the PlntBackends and the RecipeTrustPolicies as
JSON and each activity validated them (pydantic). After: the input names a commit; each activity
checks the commit is on the tracked branch (`git merge-base --is-ancestor`) and reads the specs at
that commit from plnt's own clone, parsed once per commit (`CommitSpecs`).

    python bench/saga_input_check.py [--rounds 50] [--workflowruns 1]

Prints medians: per activity (before / after with the commit's specs cached) and per saga (the
first activity of a new commit: one parse of the commit); the check of which workflow scheduled an
activity (one DescribeWorkflowExecution on the embedded dev server); and the recipe check of a fresh
pull, before (load_recipe_dir: parse and import the module) and after (check_recipe_dir: no import).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from plnt.core.recipe import check_recipe_dir
from plnt.core.specs.loader import load_directory
from plnt.core.specs.models import PlntBackend, RecipeTrustPolicy, WorkflowRun
from plnt.reconciler.saga.commit_specs import CommitSpecs
from plnt.reconciler.saga.io import SagaRef
from plnt.reconciler.saga.temporal_server import TemporalDevServer, connect
from plnt.reconciler.source.git import GitSource
from plnt.runner.recipe import load_recipe_dir
from temporalio import workflow
from temporalio.worker import Worker

ROOT = Path(__file__).resolve().parent.parent
GIT = ["git", "-c", "user.name=bench", "-c", "user.email=bench@plnt.invalid"]


def scratch_repo(directory: Path, workflowruns: int) -> Path:
    repo = directory / "specs"
    shutil.copytree(ROOT / "gitops-example", repo)
    text = (repo / "workflowruns" / "review-responder.yaml").read_text()
    for index in range(1, workflowruns):
        (repo / "workflowruns" / f"rr-{index}.yaml").write_text(text.replace("name: review-responder\n", f"name: rr-{index}\n", 1))
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=repo, check=True)
    subprocess.run([*GIT, "add", "-A"], cwd=repo, check=True)
    subprocess.run([*GIT, "commit", "-q", "-m", "specs"], cwd=repo, check=True)
    return repo


@workflow.defn(name="Idle", sandboxed=False)
class Idle:
    @workflow.run
    async def run(self) -> None:
        await workflow.wait_condition(lambda: False)


async def describe_ms(rounds: int) -> float:
    """What SagaActivities._check_caller adds per activity: describing the calling workflow."""
    server = TemporalDevServer(None)
    client = await connect(await server.start())
    try:
        async with Worker(client, task_queue="bench", workflows=[Idle]):
            handle = await client.start_workflow("Idle", id="bench-idle", task_queue="bench")
            samples = []
            for _ in range(rounds):
                start = time.perf_counter()
                await client.get_workflow_handle(handle.id, run_id=handle.result_run_id).describe()
                samples.append(time.perf_counter() - start)
            await handle.terminate()
        return median_ms(samples)
    finally:
        await server.stop()


def median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


async def main(rounds: int, workflowruns: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        repo = scratch_repo(Path(tmp), workflowruns)
        source = GitSource(str(repo), Path(tmp) / "clone")
        commit = source.fetch()
        specs, _ = load_directory(repo)
        run = specs.workflow_runs["default/review-responder"]
        ref = SagaRef(action="deploy", namespace="default", name="review-responder", commit=commit,
                      fingerprint=run.fingerprint(), version=run.spec.workflow.version)
        # What the old input carried, as JSON.
        spec = run.model_dump(mode="json", by_alias=True)
        backends = {n: b.model_dump(mode="json", by_alias=True) for n, b in specs.backends.items()}
        policies = {n: p.model_dump(mode="json", by_alias=True) for n, p in specs.trust_policies.items()}

        before, cold, warm = [], [], []
        for _ in range(rounds):
            start = time.perf_counter()
            WorkflowRun.model_validate(spec)
            [PlntBackend.model_validate(doc) for doc in backends.values()]
            [RecipeTrustPolicy.model_validate(doc) for doc in policies.values()]
            before.append(time.perf_counter() - start)

            commit_specs = CommitSpecs(source)
            start = time.perf_counter()
            await commit_specs.resolve(ref)
            cold.append(time.perf_counter() - start)
            start = time.perf_counter()
            await commit_specs.resolve(ref)
            warm.append(time.perf_counter() - start)
        print(f"{workflowruns} WorkflowRun(s), {len(specs.workflow_runs)} loaded, {rounds} rounds (medians):")
        print(f"  before, per activity (validate the specs carried in the input): {median_ms(before):8.3f} ms")
        print(f"  after,  per activity (branch check + cached specs of the commit): {median_ms(warm):8.3f} ms")
        print(f"  after,  per saga     (first activity: branch check + parse of the commit): {median_ms(cold):8.3f} ms")

        print(f"  after,  per activity (which workflow called: describe it on Temporal): {await describe_ms(rounds):8.3f} ms")

        recipe = repo / "recipes" / "review-responder" / "1.3.0"
        imported, checked = [], []
        for _ in range(rounds):
            start = time.perf_counter()
            load_recipe_dir(recipe)
            imported.append(time.perf_counter() - start)
            start = time.perf_counter()
            check_recipe_dir(recipe)
            checked.append(time.perf_counter() - start)
        print(f"  recipe check of a fresh pull: before (import) {median_ms(imported):.3f} ms, "
              f"after (data only) {median_ms(checked):.3f} ms")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--workflowruns", type=int, default=1)
    args = parser.parse_args()
    asyncio.run(main(args.rounds, args.workflowruns))
