"""What the benches share: a scratch spec repository whose registry holds freshly signed recipe
versions, memory counted for plnt's own processes (PSS), and the "how it ran" header and raw JSON
every bench prints beside its table.

Fresh versions: a bench that measures a pull must pull something plnt has never pulled. The
registry of gitops-example is signed by a demo authority whose private keys were discarded, so a
bench makes its own throwaway authority (tests/sigstore_ca.py, the one the tests use), writes its
trusted root and a RecipeTrustPolicy trusting only that authority's identity into the scratch
repository, and signs each version it publishes there (`file:registry`, read at the commit).
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from plnt.reconciler.recipes.archive import pack_recipe_to  # noqa: E402

from tests.sigstore_ca import TestSigstoreAuthority  # noqa: E402

GIT = ["git", "-c", "user.name=plnt-bench", "-c", "user.email=bench@plnt.invalid"]
IDENTITY = "recipes@bench.plnt.invalid"
ISSUER = "https://issuer.bench.plnt.invalid"
TRUSTED_ROOT = "trust/bench-trusted-root.json"
TEMPLATE = ROOT / "gitops-example" / "recipes" / "review-responder" / "1.2.0"
RUN_TEMPLATE = (ROOT / "gitops-example" / "workflowruns" / "review-responder.yaml").read_text()


def git(repo: Path, *args: str) -> str:
    return subprocess.run([*GIT, *args], cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


class BenchRepo:
    """A scratch git repository: gitops-example's backends, no WorkflowRuns, an empty registry
    signed for by a throwaway authority made for this run (its private keys die with the process)."""

    def __init__(self, prefix: str) -> None:
        self.scratch = Path(tempfile.mkdtemp(prefix=prefix))
        self.path = self.scratch / "repo"
        self.path.mkdir()
        shutil.copytree(ROOT / "gitops-example" / "backends", self.path / "backends")
        (self.path / "workflowruns").mkdir()
        (self.path / "registry").mkdir()
        (self.path / "trust").mkdir()
        self.authority = TestSigstoreAuthority(name="plnt-bench")
        self.authority.write_trusted_root(self.path / TRUSTED_ROOT)
        (self.path / "trust" / "policy.yaml").write_text(
            "apiVersion: plnt.work/v1\nkind: RecipeTrustPolicy\nmetadata:\n  name: bench-recipes\nspec:\n"
            f'  recipes: ["*"]\n  trustRoot:\n    trustedRootFile: {TRUSTED_ROOT}\n'
            f"  signers:\n    - issuer: {ISSUER}\n      identity: {IDENTITY}\n")
        self.published: set[tuple[str, str]] = set()
        git(self.path, "init", "-q", "-b", "main")

    def publish(self, name: str, version: str) -> str:
        """Pack and sign review-responder 1.2.0's code as `name@version` into registry/ (a distinct
        archive, so a distinct digest: nothing in plnt's cache can answer for it). Returns the digest."""
        source = self.scratch / "sources" / name / version
        shutil.copytree(TEMPLATE, source)
        for file in ("workflow.yaml", "golden.yaml"):
            text = (source / file).read_text().replace("name: review-responder", f"name: {name}")
            (source / file).write_text(text.replace("1.2.0", version))
        target = self.path / "registry" / name / version
        target.mkdir(parents=True)
        archive = target / "recipe.tar.gz"
        digest = pack_recipe_to(source, archive)
        (target / "recipe.tar.gz.sigstore.json").write_text(self.authority.sign(archive, IDENTITY, ISSUER))
        self.published.add((name, version))
        return digest

    def write_run(self, run: str, recipe: str, version: str, invocations: int = 10, p95_budget_ms: int = 2500,
                  min_replicas: int = 1) -> None:
        text = RUN_TEMPLATE.replace("name: review-responder\n", f"name: {run}\n")
        text = text.replace("replicas: {min: 1,", f"replicas: {{min: {min_replicas},")
        text = text.replace("p95BudgetMs: 2500", f"p95BudgetMs: {p95_budget_ms}")
        text = text.replace("ref: review-responder@1.2.0", f"ref: {recipe}@{version}")
        text = text.replace("invocations: 10", f"invocations: {invocations}")
        (self.path / "workflowruns" / f"{run}.yaml").write_text(text)

    def scale_to_zero_after(self, seconds: float) -> None:
        """The local backend's scaleToZeroAfterSeconds (for WorkflowRuns written with min_replicas=0)."""
        backend = self.path / "backends" / "local.yaml"
        backend.write_text(backend.read_text().replace("  type: local\n", f"  type: local\n  scaleToZeroAfterSeconds: {seconds:g}\n"))

    def commit(self, message: str) -> str:
        git(self.path, "add", "-A")
        git(self.path, "commit", "-q", "-m", message)
        return git(self.path, "rev-parse", "HEAD")

    def remove(self) -> None:
        shutil.rmtree(self.scratch, ignore_errors=True)


def cache_entries(state_dir: Path) -> int:
    """Recipes in plnt's pull cache (STATE/recipes/index): a fresh pull adds one, a cached one none."""
    index = state_dir / "recipes" / "index"
    return len(list(index.glob("*.json"))) if index.is_dir() else 0


def standin_python(scratch: Path) -> str:
    """An "interpreter" for the local driver that starts the STAND-IN runner (bench/standin/runner.py,
    no recipe code, milliseconds to start) instead of plnt's runner: for benches that look at the
    saga without runner start, and say so. The driver calls it as `python -m plnt.runner ARGS`; it
    drops `-m plnt.runner` and names the process plnt.runner, so plnt knows it as its runner."""
    script = scratch / "standin-python"
    script.write_text(f'#!/bin/bash\nshift 2\nexec -a plnt.runner {sys.executable} -S -I '
                      f'{ROOT / "bench" / "standin" / "runner.py"} "$@"\n')
    script.chmod(0o755)
    return str(script)


# --- memory: plnt's own processes, PSS ---------------------------------------------------------------

def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                stat = (proc / "stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])  # after the command, which may hold spaces
            tree.setdefault(ppid, []).append(int(proc.name))
    return tree


def descendants(pid: int) -> list[int]:
    tree, out, todo = _children(), [], [pid]
    while todo:
        for child in tree.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def pss_kib(pid: int) -> int | None:
    """Proportional set size: a page shared by n processes counts 1/n to each (None: gone, or not ours)."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def _kind(pid: int) -> str:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except OSError:
        return "gone"
    if b"plnt.runner" in cmdline:  # `python -m plnt.runner ...` (and anything that forks runners)
        return "runners"
    if b"start-dev" in cmdline:  # `temporal server start-dev ...`
        return "temporal"
    return "other"


def _command(pid: int) -> str:
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "?"
    return " ".join(a.decode(errors="replace") for a in args[:3])[:80]


def memory_pss(root: int | None = None, exclude: int | None = None) -> dict[str, Any]:
    """PSS of this process (plnt: reconciler, worker, gateway) and of its descendants by kind (runner
    processes, the Temporal dev server, anything else), in MiB; `exclude`: a pid left out (the
    sampler's own). Only processes plnt started count; a runner left by another program on the
    machine does not."""
    root = os.getpid() if root is None else root
    groups: dict[str, dict[str, Any]] = {k: {"processes": 0, "pss_mib": 0.0}
                                         for k in ("plnt", "runners", "temporal", "other")}
    for pid, kind in [(root, "plnt"), *((p, _kind(p)) for p in descendants(root))]:
        pss = None if pid == exclude else pss_kib(pid)
        if pss is None or kind == "gone":
            continue
        groups[kind]["processes"] += 1
        groups[kind]["pss_mib"] = round(groups[kind]["pss_mib"] + pss / 1024, 1)
        if kind == "other":  # name them: a reader should not have to guess what else plnt started
            groups[kind].setdefault("commands", []).append(_command(pid))
    groups["total_pss_mib"] = round(sum(g["pss_mib"] for g in groups.values() if isinstance(g, dict)), 1)
    return groups


def process_cpu_s(pid: int) -> float:
    """CPU time (user + system, seconds) of one process, 0.0 when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_seconds(root: int | None = None) -> dict[str, float]:
    """CPU time (user + system, seconds) of this process and of its live descendants by kind: where a
    bench's CPU went. (A child that exited is not counted: runners stopped mid-run are missed.)"""
    root = os.getpid() if root is None else root
    out = {k: 0.0 for k in ("plnt", "runners", "temporal", "other")}
    for pid, kind in [(root, "plnt"), *((p, _kind(p)) for p in descendants(root))]:
        if kind in out:
            out[kind] = round(out[kind] + process_cpu_s(pid), 2)
    return out


# 1,000 of these in a commit make plnt parse and validate 1,000 blobs and refuse the commit (no
# such backend): reconcile load without sagas (bench/split_gateway.py, bench/gateway_workers.py).
BULK_RUN = """\
apiVersion: plnt.work/v1
kind: WorkflowRun
metadata: {{name: bulk-{i:04d}, namespace: bulk}}
spec:
  workflow: {{ref: review-responder@1.2.0, registry: file:registry}}
  backend: {{cluster: no-such-backend-{round}}}
  replicas: {{min: 1, max: 2}}
  canary: {{trafficPercent: 5, smokeTest: {{invocations: 10, p95BudgetMs: 2500, errorBudgetPercent: 1}}}}
"""


def vm_hwm_mib(pid: int | str = "self") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


# --- reporting ------------------------------------------------------------------------------------------

def machine() -> dict[str, Any]:
    mem_kib = next((int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
                    if line.startswith("MemTotal:")), 0)
    return {"cores": os.cpu_count(), "memory_gib": round(mem_kib / 2**20, 1), "python": platform.python_version(),
            "platform": platform.platform()}


def how_it_ran(bench: str, args: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    """Print the command and the conditions a reader needs to rerun and judge the figures."""
    command = "python " + " ".join([f"bench/{bench}", *sys.argv[1:]])
    info = {"bench": bench, "command": command, "args": args, "machine": machine(), "notes": notes}
    print(f"# {command}")
    print(f"# machine: {info['machine']['cores']} cores, {info['machine']['memory_gib']} GiB, "
          f"Python {info['machine']['python']}")
    for note in notes:
        print(f"# {note}")
    return info


def stop_process(proc: subprocess.Popen[bytes], timeout_s: float = 60) -> None:
    """SIGTERM (plnt up stops what it started), SIGKILL after `timeout_s`; reaped either way."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def print_json(how: dict[str, Any], results: dict[str, Any]) -> None:
    """The raw numbers, one JSON document on one line after a marker (easy to grep and to parse)."""
    print("\nraw JSON:")
    print(json.dumps({"how": how, "results": results}, sort_keys=True))
