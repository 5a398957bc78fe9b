"""CPU of one reconcile pass when nothing changed, with N WorkflowRuns all deployed and in sync.

In-process: a real git repository of --runs WorkflowRuns (gitops-example's backend, trust and
registry), plnt's real GitSource (its own clone under a scratch state directory), the real
DriverSet and LocalDriver reading real release records, the real StatusStore with every WorkflowRun Ready at the
spec's fingerprint, and the real Reconciler. Stand-ins, said here: the release records' runner pid
is this bench's own process (so the driver's liveness check, /proc/PID/stat, finds it running: no
1,000 runner processes are started), and no Temporal client (a pass with nothing to do starts no
saga; the bench fails if one would). The first pass (loading the commit) is reported apart; then
--passes passes, each timed for CPU (this process and its git children) and wall, p50 reported,
and the CPU share of one core at the default poll interval (Settings.interval_s).

    python bench/reconcile_idle.py [--runs 1000] [--passes 20] [--before main]

--before REV runs the same bench on the plnt of that git revision of this checkout (extracted with
`git archive`, first on sys.path) in a child process, right after this one, for before/after ratios.

Prints how it ran, a table, and the raw figures as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from plan_scale import before_command, build_repo  # noqa: E402  (same repository as the plan bench)
from plnt.core.specs.loader import load_sources  # noqa: E402
from plnt.core.status import Phase  # noqa: E402
from plnt.reconciler.control.loop import Reconciler  # noqa: E402
from plnt.reconciler.drivers.driver_set import DriverSet  # noqa: E402
from plnt.reconciler.drivers.local import LocalDriver  # noqa: E402
from plnt.reconciler.drivers.processes import process_start_time  # noqa: E402
from plnt.reconciler.plan.diff import Action  # noqa: E402
from plnt.reconciler.settings import Settings  # noqa: E402
from plnt.reconciler.source.git import GitSource  # noqa: E402
from plnt.reconciler.state import LiveWorkflow, Release, StateDir, atomic_write_json  # noqa: E402
from plnt.reconciler.status_store import StatusStore


def no_helm(backend: Any) -> Any:
    raise AssertionError("no Kubernetes backend in this bench")


def cpu_s() -> float:
    return own_cpu_s() + git_cpu_s()


def own_cpu_s() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    return own.ru_utime + own.ru_stime


def git_cpu_s() -> float:
    """The reaped children: the pass's `git fetch` (and its upload-pack)."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return children.ru_utime + children.ru_stime


def deployed_state(state: StateDir, source: GitSource, commit: str) -> StatusStore:
    """Release records and statuses saying every WorkflowRun of the commit is deployed and Ready."""
    specs, problems = load_sources(source.spec_files(commit))  # (no GitSource.load in older plnt: --before)
    assert not problems, problems[:3]
    pid = os.getpid()
    start = process_start_time(pid)
    statuses = StatusStore(state.status_file)
    for port, (_key, run) in enumerate(sorted(specs.workflow_runs.items()), start=20000):
        ns, name, version = run.metadata.namespace, run.metadata.name, run.spec.workflow.version
        release = Release(release_id=f"{name}-{version}", namespace=ns, name=name, track="stable", version=version,
                          spec_fingerprint=run.fingerprint(), recipe_digest="sha256:" + "0" * 64,
                          recipe_dir=str(state.recipes / name), endpoint=f"http://127.0.0.1:{port}",
                          pid=pid, pid_start=start, port=port)
        atomic_write_json(state.releases / f"{ns}.{name}.json",
                          LiveWorkflow(namespace=ns, name=name, stable=release).model_dump(mode="json"))
        statuses.update(ns, name, phase=Phase.READY, version=version, endpoint=release.endpoint, observed_commit=commit,
                        message=f"{version} in sync", attempted_fingerprint=run.fingerprint(), attempted_version=version,
                        deployed_fingerprint=run.fingerprint(), deployed_spec=run.spec.model_dump(mode="json", by_alias=True))
    return StatusStore(state.status_file)  # as plnt up reads it at start


async def measure(runs: int, passes: int, scratch: Path) -> dict[str, Any]:
    repo = build_repo(scratch / "repo", runs)
    state = StateDir(scratch / "state").ensure()
    settings = Settings(repo=str(repo), state_dir=state.root)
    source = GitSource(str(repo), state.source_clone)
    commit = source.fetch()
    statuses = deployed_state(state, GitSource(str(repo), scratch / "setup-clone"), commit)
    # As plnt up builds it (reconciler/app.py): the DriverSet over the local runners (no Kubernetes
    # backend in these specs, so no Helm driver is ever made).
    driver = DriverSet(LocalDriver(state), state, make_helm=no_helm)
    reconciler = Reconciler(settings=settings, source=source, client=None, statuses=statuses,  # type: ignore[arg-type]
                            driver=driver, state=state)
    figures: list[dict[str, float]] = []
    for index in range(passes + 1):
        own, git, wall = own_cpu_s(), git_cpu_s(), time.perf_counter()
        items = await reconciler.reconcile_once()
        own, git = own_cpu_s() - own, git_cpu_s() - git
        figures.append({"cpu_s": own + git, "plnt_cpu_s": own, "git_cpu_s": git, "wall_s": time.perf_counter() - wall})
        busy = [i for i in items if i.action is not Action.UNCHANGED or i.waiting]
        if busy:
            raise SystemExit(f"pass {index} would act on {len(busy)} WorkflowRuns (e.g. {busy[0]}): not in sync")
    writes = statuses.all()
    assert all(s.phase is Phase.READY for s in writes)
    rest = figures[1:]
    p50_cpu = statistics.median(f["cpu_s"] for f in rest)
    return {"runs": runs, "passes": passes, "interval_s": settings.source.interval_s, "first_pass": figures[0],
            "p50_cpu_s": p50_cpu, "p50_plnt_cpu_s": statistics.median(f["plnt_cpu_s"] for f in rest),
            "p50_git_cpu_s": statistics.median(f["git_cpu_s"] for f in rest), "p50_wall_s": statistics.median(f["wall_s"] for f in rest),
            "core_share_at_interval": p50_cpu / settings.source.interval_s, "raw": rest}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--passes", type=int, default=20)
    parser.add_argument("--before", help="a git revision of this checkout to compare with (e.g. main)")
    parser.add_argument("--json-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="plnt-bench-idle-"))
    try:
        result = asyncio.run(measure(args.runs, args.passes, scratch))
        if args.json_only:
            print(json.dumps(result))
            return
        before = None
        if args.before:
            command = before_command(args.before, scratch)
            code = command[2].replace("from plnt.reconciler.cli.main import main; main()",
                                      f"import runpy; sys.argv = [{__file__!r}, '--runs', '{args.runs}', '--passes', "
                                      f"'{args.passes}', '--json-only']; runpy.run_path({__file__!r}, run_name='__main__')")
            done = subprocess.run([command[0], "-c", code], capture_output=True, text=True, check=True)
            before = json.loads(done.stdout.strip().splitlines()[-1])
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"reconcile_idle: {args.runs} WorkflowRuns deployed and in sync, real GitSource/LocalDriver/StatusStore/"
          f"Reconciler in-process; stand-ins: runner pid = this process, no Temporal client; {args.passes} passes "
          f"after a first one; python {sys.version.split()[0]}, {os.cpu_count()} CPUs")
    print(f"first pass (loads the commit): {result['first_pass']['cpu_s'] * 1000:.1f} ms CPU, "
          f"{result['first_pass']['wall_s'] * 1000:.1f} ms wall")
    print(f"idle pass p50: {result['p50_cpu_s'] * 1000:.1f} ms CPU, {result['p50_wall_s'] * 1000:.1f} ms wall; "
          f"at one pass every {result['interval_s']:g} s: {result['core_share_at_interval'] * 100:.2f} % of a core "
          f"(plnt {result['p50_plnt_cpu_s'] * 1000:.1f} ms, git fetch {result['p50_git_cpu_s'] * 1000:.1f} ms)")
    if before is not None:
        print(f"before ({args.before}): idle pass p50 {before['p50_cpu_s'] * 1000:.1f} ms CPU "
              f"({before['core_share_at_interval'] * 100:.2f} % of a core); ratio before/this checkout: "
              f"x{before['p50_cpu_s'] / result['p50_cpu_s']:.1f}")
    print("raw JSON:")
    print(json.dumps({"this checkout": result, f"before ({args.before})" if args.before else "before": before}))


if __name__ == "__main__":
    main()
