"""Rollouts on a Kubernetes PlntBackend, as users run plnt: commit -> Ready of one WorkflowRun (fresh
signed versions), API requests and helm invocations per saga and per idle reconcile pass (at 1, 10
and 100 WorkflowRuns), and N WorkflowRuns committed at once until all are Ready.

The site (tests/k8s/sites.py) is a REAL control plane built from Go (etcd, kube-apiserver with an
audit log of every request, controller-manager, scheduler, kwok nodes), a real OCI registry
(docker-registry) and the node STAND-IN (tests/k8s/node_standin.py): no container runs here; it runs
each pod's init container (`plnt recipe fetch`: pulls the recipe from the OCI registry, checks its
digest and signature) and its runner (`python -m plnt.runner`, MockBackend) as processes on the pod's
IP in a network namespace (tests/k8s/pod_network.py), reports the pod Ready when its readiness probe
answers, and proxies Service cluster IPs. So the times are the control plane's and plnt's (helm,
Deployments through the real controllers, EndpointSlices, Services answering), with pods that start
as processes instead of pulled images.

plnt runs as the real `plnt up` console script inside the network namespace (embedded Temporal,
`--interval 1`, default `temporal.max_concurrent_sagas` 8), on a scratch spec repository
(bench/benchlib.py) with a PlntBackend of type kubernetes. Every recipe version is FRESH: packed and
signed for this run by a throwaway authority (the spec repository holds its trusted root and a
RecipeTrustPolicy trusting only it) and pushed to the site's OCI registry; each commit must add
exactly one entry to plnt's pull cache, and a version is never published twice (else the bench
stops: the label would be wrong). Each commit is announced with the webhook (POST /hooks/git, as a
git server sends after a push), so commit -> Ready does not include waiting for the next poll.

Counting: plnt's kubeconfig holds a client certificate of its own (user `plnt-bench`, in
system:masters), so every API request plnt (and the helm it runs) makes is found in the API server's
audit log by that user. helm runs through a counting shim first on plnt's PATH (a shell script that
appends its arguments to a file, then execs the real helm). An idle pass is measured with nothing to
do, as `passes` full reconcile passes (plnt's GET /metrics `plnt_reconcile_duration_seconds_count`,
pass="full") and the requests and helm invocations between the two readings.

    python bench/k8s_rollout.py [--commits 10] [--runs 100] [--shrink-to 10] [--idle-passes 20]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import datetime
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from benchlib import ROOT, BenchRepo, cache_entries, how_it_ran, print_json, pss_kib
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from plnt.reconciler.recipes.registries import RegistryOptions, open_registry
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.harness import full_passes_in
from tests.e2e.test_plnt_up_process import PlntUp, gateway_port
from tests.k8s.cluster import _CA, FakeNode, LocalCluster, _write_cert, _write_key
from tests.k8s.pod_network import PodNetwork
from tests.k8s.sites import HELM, VENV_BIN, ClusterSite, all_cidrs, cluster_site, site_ranges

NODES = (FakeNode("node-a", pods="250"), FakeNode("node-b", pods="250"))
NAMESPACE = "agents"
BACKEND = "bench-cluster"
PLNT_USER = "plnt-bench"
COMMIT_RUN = "rr-commits"
MIN_AVAILABLE_GIB = 1.5  # the bench stops (non-zero) when the machine's MemAvailable falls below this


def bin_dir() -> Path:
    """tools/build_k8s.sh's binaries (built once, then answered from its cache), as tests/k8s do."""
    if os.environ.get("PLNT_K8S_BIN"):
        return Path(os.environ["PLNT_K8S_BIN"])
    done = subprocess.run(["bash", str(ROOT / "tools" / "build_k8s.sh")], stdout=subprocess.PIPE, text=True)
    if done.returncode != 0:
        raise SystemExit(f"tools/build_k8s.sh failed (exit {done.returncode})")
    return Path(done.stdout.strip().splitlines()[-1])


def plnt_kubeconfig(cluster: LocalCluster) -> Path:
    """A kubeconfig with a client certificate of plnt's own (user plnt-bench, system:masters): the
    audit log tells plnt's requests from the stand-in's, the controllers' and the bench's."""
    pki = cluster.pki
    ca = _CA(serialization.load_pem_private_key((pki / "ca.key").read_bytes(), None),  # type: ignore[arg-type]
             x509.load_pem_x509_certificate((pki / "ca.crt").read_bytes()))
    key, cert = ca.issue(PLNT_USER, organizations=["system:masters"])
    _write_key(pki / "plnt.key", key)
    _write_cert(pki / "plnt.crt", cert)
    return cluster._write_kubeconfig(cluster.work_dir / "plnt.kubeconfig", "plnt")


def helm_shim(directory: Path, log: Path) -> Path:
    """`helm` that notes each invocation (time, arguments) in `log`, then runs the real helm."""
    directory.mkdir(parents=True, exist_ok=True)
    shim = directory / "helm"
    shim.write_text(f'#!/bin/sh\nprintf "%s %s\\n" "$(date +%s.%N)" "$*" >> {log}\nexec {HELM} "$@"\n')
    shim.chmod(0o755)
    log.touch()
    return shim


class Audit:
    """plnt's requests in the API server's audit log (by its user), read on as the file grows."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.events: list[tuple[float, str, str]] = []  # (received, verb, resource) of plnt's requests
        self.agents: collections.Counter[str] = collections.Counter()

    def read(self) -> None:
        needle = f'"username":"{PLNT_USER}"'
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read()
        end = data.rfind(b"\n") + 1  # a line still being written waits for the next read
        self.offset += end
        for line in data[:end].decode(errors="replace").splitlines():
            if needle not in line:
                continue
            event = json.loads(line)
            if event.get("stage") != "ResponseComplete" or event.get("user", {}).get("username") != PLNT_USER:
                continue
            ref = event.get("objectRef") or {}
            resource = ref.get("resource", event.get("requestURI", "?").split("?")[0]) + \
                (f"/{ref['subresource']}" if ref.get("subresource") else "")
            at = datetime.datetime.fromisoformat(event["requestReceivedTimestamp"].replace("Z", "+00:00")).timestamp()
            self.events.append((at, event["verb"], resource))
            self.agents[event.get("userAgent", "?").split(" ")[0]] += 1

    def between(self, start: float, end: float) -> list[tuple[float, str, str]]:
        self.read()
        return [e for e in self.events if start <= e[0] <= end]


def canary_timeline(audit_log: Path, helm_log: HelmLog, release: str, start: float, end: float) -> dict[str, float]:
    """Where the canary install's time went, from the audit log (seconds after `helm upgrade` of
    `release` started): helm's first write, the pod bound to a node, the pod's IP (the stand-in's
    first status patch), the pod Ready (its last status patch before helm records the release
    deployed), helm's record of the release as deployed (the end of its --wait)."""
    began = helm_log.started(f"upgrade --install {release} ", start, end)
    if began is None:
        return {}
    marks: dict[str, float] = {}
    record = f"sh.helm.release.v1.{release}.v"
    with open(audit_log, errors="replace") as f:
        for line in f:
            if f'"{release}' not in line and record not in line:
                continue
            event = json.loads(line)
            at = datetime.datetime.fromisoformat(event["requestReceivedTimestamp"].replace("Z", "+00:00")).timestamp()
            if not began <= at <= end:
                continue
            ref, verb = event.get("objectRef") or {}, event["verb"]
            user = event.get("user", {}).get("username")
            what = f"{verb} {ref.get('resource')}/{ref.get('subresource', '')}"
            if user == PLNT_USER and verb in ("create", "patch", "update", "delete"):
                marks.setdefault("helm_first_write", at)
                if what == "update secrets/" and ref.get("name", "").startswith(record):
                    marks["helm_deployed"] = at
                    break
            elif what == "create pods/binding":
                marks.setdefault("pod_bound", at)
            elif what == "patch pods/status" and user != PLNT_USER:
                marks.setdefault("pod_ip", at)
                marks["pod_ready"] = at
    return {key: round(at - began, 2) for key, at in marks.items()}


def by_kind(events: list[tuple[float, str, str]]) -> dict[str, int]:
    return dict(collections.Counter(f"{verb} {resource}" for _, verb, resource in events).most_common())


class HelmLog:
    def __init__(self, path: Path) -> None:
        self.path = path

    def started(self, prefix: str, start: float, end: float) -> float | None:
        """When the first helm run whose arguments begin with `prefix` started in [start, end]."""
        for line in self.path.read_text().splitlines():
            at, _, args = line.partition(" ")
            if start <= float(at) <= end and args.startswith(prefix):
                return float(at)
        return None

    def between(self, start: float, end: float) -> list[str]:
        """The subcommand of each helm run started in [start, end] ("list (live)": the live-state read)."""
        out = []
        for line in self.path.read_text().splitlines():
            at, _, args = line.partition(" ")
            if start <= float(at) <= end:
                words = args.split()
                out.append(f"{words[0]} (live)" if words[:1] == ["list"] and "--selector" in words else words[0])
        return out


class Memory(threading.Thread):
    """Every few seconds: PSS of every process in the pod network (plnt, Temporal, the control plane,
    the registry, the stand-in, the runners) and the machine's MemAvailable; too little stops the bench."""

    def __init__(self, net: PodNetwork, every: float = 5.0) -> None:
        super().__init__(daemon=True)
        self.net, self.every = net, every
        self.peak: dict[str, Any] = {"pss_mib": 0.0}
        self.low: float = float("inf")
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(self.every):
            pids = self.net.pids()
            runners = 0
            total = 0
            for pid in pids:
                total += pss_kib(pid) or 0
                with contextlib.suppress(OSError):
                    runners += b"plnt.runner" in Path(f"/proc/{pid}/cmdline").read_bytes()
            available = available_gib()
            self.low = min(self.low, available)
            if total / 1024 > self.peak["pss_mib"]:
                self.peak = {"pss_mib": round(total / 1024, 1), "processes": len(pids), "runner_processes": runners,
                             "mem_available_gib": available}


def available_gib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return round(int(line.split()[1]) / 2**20, 2)
    return 0.0


class Bench:
    def __init__(self, args: argparse.Namespace, site: ClusterSite, repo: BenchRepo, scratch: Path) -> None:
        self.args, self.site, self.repo, self.scratch = args, site, repo, scratch
        self.url = f"oci://{site.registry.address}/recipes"
        self.registry = open_registry(self.url, RegistryOptions(allow_insecure_http=(site.registry.address,)))
        self.state = scratch / "state"
        self.audit = Audit(site.cluster.audit_log)
        self.helm_log = HelmLog(scratch / "helm-invocations.log")
        self.memory = Memory(site.net)
        self.up: PlntUp | None = None

    # --- the spec repository ---------------------------------------------------------------------------

    def publish(self, name: str, version: str) -> None:
        """A fresh signed archive of name@version pushed to the site's registry (the author's CI: not timed)."""
        if (name, version) in self.repo.published:
            raise SystemExit(f"{name}@{version} was published already: it would not be a fresh pull")
        self.repo.publish(name, version)
        target = self.repo.path / "registry" / name / version
        archive = target / "recipe.tar.gz"
        self.registry.push(name, version, archive, archive.with_name(archive.name + ".sigstore.json"))
        shutil.rmtree(target)  # in the OCI registry only: a pod reaches no file: registry

    def write_run(self, run: str, recipe: str, version: str) -> None:
        self.repo.write_run(run, recipe, version)
        path = self.repo.path / "workflowruns" / f"{run}.yaml"
        text = path.read_text()
        for old, new in (("registry: file:registry", f"registry: {self.url}"), ("cluster: local", f"cluster: {BACKEND}")):
            if old not in text:
                raise SystemExit(f"the WorkflowRun template lacks {old!r}")
            text = text.replace(old, new)
        path.write_text(text)

    def commit(self, message: str) -> float:
        """Commit, then announce it with the webhook; returns the moment `git commit` returned."""
        self.repo.commit(message)
        committed = time.time()
        assert self.up is not None
        httpx.post(f"{self.up.url}/hooks/git", timeout=10, trust_env=False).raise_for_status()
        return committed

    # --- plnt --------------------------------------------------------------------------------------------

    def start_plnt(self) -> PlntUp:
        shim_dir = self.scratch / "shim"
        helm_shim(shim_dir, self.helm_log.path)
        path = f"{shim_dir}:{VENV_BIN}:/usr/bin:/bin"
        self.up = PlntUp(self.repo.path, self.state, gateway_port(), self.scratch / "plnt.log",
                         extra=("--oci-insecure-host", self.site.registry.address),
                         prefix=(*self.site.net.exec_prefix(), "env", f"PATH={path}"))
        return self.up

    def stop_plnt(self) -> None:
        if self.up is None or self.up.process.poll() is not None:
            return
        self.up.process.send_signal(signal.SIGTERM)
        try:
            self.up.process.wait(60)
        except subprocess.TimeoutExpired:
            self.up.kill()

    def rows(self) -> dict[str, dict[str, Any]]:
        assert self.up is not None
        if self.up.process.poll() is not None:
            raise SystemExit(self.up.why(f"plnt exited with code {self.up.process.returncode}"))
        if self.memory.low < MIN_AVAILABLE_GIB:
            raise SystemExit(f"the machine's MemAvailable fell to {self.memory.low} GiB: stopped")
        return {r["name"]: r for r in self.up.workflows() or []}

    def until_ready(self, versions: dict[str, str], timeout: float, every: float = 0.1) -> dict[str, float]:
        """Each named WorkflowRun Ready at its version: the moment (time.time()) each was first seen so.
        A version that ends RolledBack or Failed stops the bench."""
        ready: dict[str, float] = {}
        deadline = time.time() + timeout
        rows: dict[str, dict[str, Any]] = {}
        while len(ready) < len(versions):
            if time.time() > deadline:
                missing = sorted(set(versions) - set(ready))
                raise SystemExit(self.up.why(f"{len(missing)} of {len(versions)} not Ready within {timeout:.0f} s, "  # type: ignore[union-attr]
                                             f"e.g. {[rows.get(m) for m in missing[:3]]}"))
            rows = self.rows()
            now = time.time()
            for name, version in versions.items():
                row = rows.get(name)
                if name in ready or row is None:
                    continue
                if row["phase"] == "Ready" and row["version"] == version and not row.get("canaryVersion"):
                    ready[name] = now
                elif row["phase"] in ("RolledBack", "Failed"):  # every earlier saga ended Ready: this is the new one's
                    raise SystemExit(self.up.why(f"{name}@{version} ended {row['phase']}: {row}"))  # type: ignore[union-attr]
            time.sleep(every)
        return ready

    def until_gone(self, names: set[str], timeout: float) -> float:
        deadline = time.time() + timeout
        while time.time() < deadline:
            rows = self.rows()
            releases = {r["name"] for r in self.site.helm(NAMESPACE, "list", "--max", "0")}
            if not names & set(rows) and not any(r.removesuffix("-canary") in names for r in releases):
                return time.time()
            time.sleep(0.5)
        raise SystemExit(f"{sorted(names)[:3]}... not removed within {timeout:.0f} s")

    def full_passes(self) -> int:
        return full_passes_in(self.metrics())

    def full_pass_seconds(self) -> float:
        """The summed duration of the full reconcile passes so far (plnt's histogram)."""
        return sum(sample.value for family in text_string_to_metric_families(self.metrics()) for sample in family.samples
                   if sample.name == "plnt_reconcile_duration_seconds_sum" and sample.labels.get("pass") == "full")

    def all_passes(self) -> int:
        """Full and light reconcile passes so far (a light one follows a saga's end; both read the live state)."""
        return int(sum(sample.value for family in text_string_to_metric_families(self.metrics()) for sample in family.samples
                       if sample.name == "plnt_reconcile_duration_seconds_count"))

    def metrics(self) -> str:
        assert self.up is not None
        answer = httpx.get(f"{self.up.url}/metrics", timeout=10, trust_env=False)
        answer.raise_for_status()
        return answer.text

    def steps(self, name: str) -> dict[str, float]:
        """The last saga's steps and their durations (ms), from GET /workflows/NAME/history."""
        assert self.up is not None
        answer = httpx.get(f"{self.up.url}/workflows/{name}/history", timeout=10, trust_env=False)
        answer.raise_for_status()
        return {s["step"]: round(s["duration_ms"] or 0.0) for s in answer.json()["steps"]}

    def idle(self, runs: int) -> dict[str, Any]:
        """Requests and helm invocations per full reconcile pass, nothing to do, `runs` WorkflowRuns Ready."""
        rows = self.rows()
        busy = [r for r in rows.values() if r["phase"] != "Ready" or r.get("canaryVersion")]
        if len(rows) != runs or busy:
            raise SystemExit(f"idle at {runs}: {len(rows)} WorkflowRuns, not Ready: {busy[:3]}")
        time.sleep(3)  # the passes that follow the last saga
        first, spent, start = self.full_passes(), self.full_pass_seconds(), time.time()
        while self.full_passes() < first + self.args.idle_passes:
            time.sleep(0.2)
        last, spent, end = self.full_passes(), self.full_pass_seconds() - spent, time.time()
        time.sleep(1)  # the audit log holds every request answered by `end`
        passes = last - first
        events = self.audit.between(start, end)
        helm = self.helm_log.between(start, end)
        return {"workflowruns": runs, "passes": passes, "seconds": round(end - start, 1), "api_requests": len(events),
                "api_requests_per_pass": round(len(events) / passes, 2), "by_kind": by_kind(events),
                "pass_ms": round(spent / passes * 1000, 1),
                "helm_invocations": len(helm), "helm_per_pass": round(len(helm) / passes, 2),
                "helm_by_command": dict(collections.Counter(helm))}

    # --- the figures -------------------------------------------------------------------------------------

    def commits(self) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """The first install of COMMIT_RUN, then --commits fresh versions of it, one at a time."""
        self.publish(COMMIT_RUN, "1.0.0")
        self.write_run(COMMIT_RUN, COMMIT_RUN, "1.0.0")
        self.repo.commit(f"{COMMIT_RUN} 1.0.0 on {BACKEND}")
        started = time.time()
        self.memory.start()
        self.start_plnt()
        first = self.until_ready({COMMIT_RUN: "1.0.0"}, timeout=300)[COMMIT_RUN]
        print(f"plnt up to {COMMIT_RUN} Ready (first install, plnt's start included): {first - started:.1f} s",
              flush=True)
        rows = []
        for n in range(1, self.args.commits + 1):
            version = f"1.{n}.0"
            self.publish(COMMIT_RUN, version)
            self.write_run(COMMIT_RUN, COMMIT_RUN, version)
            time.sleep(2)  # the pass that follows the previous saga, and a quiet moment
            entries, passes = cache_entries(self.state), self.all_passes()
            committed = self.commit(f"{COMMIT_RUN} {version}")
            ready = self.until_ready({COMMIT_RUN: version}, timeout=300)[COMMIT_RUN]
            passes = self.all_passes() - passes
            added = cache_entries(self.state) - entries
            if added != 1:
                raise SystemExit(f"{COMMIT_RUN}@{version} added {added} pull-cache entries, not 1: not a fresh pull")
            time.sleep(1)
            events = self.audit.between(committed, ready)
            helm = self.helm_log.between(committed, ready)
            rows.append({"version": version, "commit_to_ready_s": round(ready - committed, 2), "api_requests": len(events),
                         "api_by_kind": by_kind(events), "helm_invocations": len(helm),
                         "helm_by_command": dict(collections.Counter(helm)), "reconcile_passes": passes,
                         "steps_ms": self.steps(COMMIT_RUN),
                         "canary_install_s": canary_timeline(self.site.cluster.audit_log, self.helm_log,
                                                             f"{COMMIT_RUN}-canary", committed, ready)})
            print(f"  {version}: commit -> Ready {ready - committed:.2f} s, {len(helm)} helm invocations, "
                  f"{len(events)} API requests", flush=True)
        return {"first_install_from_plnt_start_s": round(first - started, 1)}, rows

    def many(self) -> dict[str, Any]:
        """Remove COMMIT_RUN; then one commit adds --runs WorkflowRuns, each its own fresh recipe."""
        (self.repo.path / "workflowruns" / f"{COMMIT_RUN}.yaml").unlink()
        self.commit(f"remove {COMMIT_RUN}")
        self.until_gone({COMMIT_RUN}, timeout=300)
        names = [f"rr-{i:03d}" for i in range(self.args.runs)]
        for name in names:
            self.publish(name, "1.0.0")
            self.write_run(name, name, "1.0.0")
        time.sleep(2)
        entries = cache_entries(self.state)
        committed = self.commit(f"{len(names)} WorkflowRuns on {BACKEND}")
        ready = self.until_ready({name: "1.0.0" for name in names}, timeout=3600, every=0.5)
        added = cache_entries(self.state) - entries
        if added != len(names):
            raise SystemExit(f"{len(names)} distinct recipes added {added} pull-cache entries: not every pull fresh")
        times = sorted(t - committed for t in ready.values())
        end = committed + times[-1]
        time.sleep(1)
        events = self.audit.between(committed, end)
        helm = self.helm_log.between(committed, end)
        releases = self.site.helm(NAMESPACE, "list", "--max", "0")
        if sorted(r["name"] for r in releases) != names:
            raise SystemExit(f"helm lists {len(releases)} releases, not the {len(names)} stable ones")
        return {"runs": len(names), "all_ready_s": round(times[-1], 1), "first_ready_s": round(times[0], 1),
                "median_ready_s": round(statistics.median(times), 1), "sagas_per_s": round(len(names) / times[-1], 3),
                "fresh_pulls": added, "api_requests": len(events), "api_requests_per_saga": round(len(events) / len(names), 1),
                "api_by_kind": by_kind(events), "helm_invocations": len(helm),
                "helm_per_saga": round(len(helm) / len(names), 2), "helm_by_command": dict(collections.Counter(helm)),
                "ready_s": {name: round(t - committed, 1) for name, t in sorted(ready.items())}}

    def shrink(self, keep: int) -> dict[str, Any]:
        gone = {f"rr-{i:03d}" for i in range(keep, self.args.runs)}
        for name in gone:
            (self.repo.path / "workflowruns" / f"{name}.yaml").unlink()
        committed = self.commit(f"keep {keep} WorkflowRuns")
        removed = self.until_gone(gone, timeout=1800)
        return {"removed": len(gone), "all_removed_s": round(removed - committed, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--commits", type=int, default=10, help="fresh versions of one WorkflowRun, one commit each")
    parser.add_argument("--runs", type=int, default=100, help="WorkflowRuns committed at once (each its own recipe)")
    parser.add_argument("--shrink-to", type=int, default=10,
                        help="then one commit removes all but this many, and the idle pass is counted again")
    parser.add_argument("--idle-passes", type=int, default=20, help="full reconcile passes per idle count")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs, audit log)")
    args = parser.parse_args()
    if args.commits < 1 or args.runs < 1 or args.idle_passes < 1:
        parser.error("--commits, --runs and --idle-passes take 1 or more")
    if os.geteuid() != 0:
        raise SystemExit("the pod network is a network namespace: run as root")
    how = how_it_ran("k8s_rollout.py", vars(args), [
        "REAL control plane (etcd, kube-apiserver with an audit log, controller-manager, scheduler, kwok: "
        f"{len(NODES)} nodes), OCI registry (docker-registry); STAND-IN kubelet/kube-proxy: each pod's init container "
        "(`plnt recipe fetch`) and runner (`python -m plnt.runner`, MockBackend) run as processes on the pod IP",
        "the real `plnt up` process in the pod network (embedded Temporal, --interval 1, at most 8 sagas at once); "
        "each commit announced with POST /hooks/git",
        "every recipe version fresh: signed for this run, pushed to the OCI registry, +1 pull-cache entry checked",
        "API requests: the audit log's requests by plnt's own client certificate (user plnt-bench); helm "
        "invocations: a counting shim first on plnt's PATH",
        f"load average at the start: {os.getloadavg()[0]:.1f} (other work shares these cores)"])
    scratch = Path(tempfile.mkdtemp(prefix="plnt-bench-k8s-"))
    repo = BenchRepo("plnt-bench-k8s-repo-")
    ranges = site_ranges(0)
    results: dict[str, Any] = {}
    wall = time.time()
    failed = True
    try:
        with PodNetwork(cidrs=all_cidrs([ranges])) as net, net.entered(), \
                cluster_site(net, bin_dir(), scratch / "site", ranges, nodes=NODES) as site:
            site.create_namespace(NAMESPACE)
            backend = site.backend_yaml(BACKEND, NAMESPACE).replace(str(site.cluster.kubeconfig),
                                                                     str(plnt_kubeconfig(site.cluster)))
            (repo.path / "backends" / "cluster.yaml").write_text(backend)
            bench = Bench(args, site, repo, scratch)
            try:
                results["first"], results["commits"] = bench.commits()
                results["idle"] = [bench.idle(1)]
                results["many"] = bench.many()
                results["idle"].append(bench.idle(args.runs))
                if args.shrink_to < args.runs:
                    results["shrink"] = bench.shrink(args.shrink_to)
                    results["idle"].append(bench.idle(args.shrink_to))
                results["memory_peak"] = bench.memory.peak
                results["mem_available_low_gib"] = bench.memory.low
                results["plnt_user_agents"] = dict(bench.audit.agents)
                results["bench_wall_s"] = round(time.time() - wall)
                results["load_average_end"] = os.getloadavg()[0]
                failed = False
            finally:
                bench.memory.stop.set()
                bench.stop_plnt()
    finally:
        repo.remove()
        if failed or args.keep:
            print(f"work directory kept: {scratch}", file=sys.stderr)
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    report(how, args, results)


def report(how: dict[str, Any], args: argparse.Namespace, results: dict[str, Any]) -> None:
    rows = results["commits"]
    ready = sorted(r["commit_to_ready_s"] for r in rows)
    helm = [r["helm_invocations"] for r in rows]
    api = [r["api_requests"] for r in rows]
    many = results["many"]
    print(f"\ncommit -> Ready on the Kubernetes backend, {len(rows)} commits (fresh signed versions, webhook):")
    print(f"  p50 {statistics.median(ready):.2f} s, max {ready[-1]:.2f} s, min {ready[0]:.2f} s")
    own = [r["helm_invocations"] - r["helm_by_command"].get("list (live)", 0) for r in rows]
    live = [r["helm_by_command"].get("list (live)", 0) for r in rows]
    passes = [r["reconcile_passes"] for r in rows]
    print(f"  helm invocations from commit to Ready, p50 {statistics.median(helm):g} ({min(helm)}-{max(helm)}): the saga's "
          f"own p50 {statistics.median(own):g} ({min(own)}-{max(own)}) + live-state reads (`helm list`) p50 "
          f"{statistics.median(live):g}, while plnt made p50 {statistics.median(passes):g} reconcile passes")
    print(f"  API requests from commit to Ready (plnt's user), p50 {statistics.median(api):g} ({min(api)}-{max(api)})")
    print(f"  helm by command (first commit): {rows[0]['helm_by_command']}")
    steps = {step: statistics.median(r["steps_ms"].get(step, 0) for r in rows) for step in rows[0]["steps_ms"]}
    print("  saga steps, p50: " + ", ".join(f"{step} {ms / 1000:.2f} s" for step, ms in steps.items()))
    marks = {key: statistics.median(r["canary_install_s"].get(key, 0) for r in rows)
             for key in ("helm_first_write", "pod_bound", "pod_ip", "pod_ready", "helm_deployed")}
    print("  the canary's install from `helm upgrade` (audit log), p50: "
          + ", ".join(f"{key} {at:.2f} s" for key, at in marks.items()))
    print(f"\n{many['runs']} WorkflowRuns in one commit (each its own fresh recipe), at most 8 sagas at once:")
    print(f"  commit -> all Ready {many['all_ready_s']:.1f} s (first {many['first_ready_s']:.1f} s, median "
          f"{many['median_ready_s']:.1f} s), {many['sagas_per_s']:.2f} sagas/s")
    print(f"  helm invocations per saga {many['helm_per_saga']:g}, API requests per saga {many['api_requests_per_saga']:g}")
    if "shrink" in results:
        print(f"  then one commit removing {results['shrink']['removed']}: all removed in "
              f"{results['shrink']['all_removed_s']:.1f} s")
    print(f"\n  {'idle pass, WorkflowRuns':<26} {'passes':>7} {'API requests/pass':>18} {'helm/pass':>10} "
          f"{'pass time':>10}  by kind")
    for idle in results["idle"]:
        print(f"  {idle['workflowruns']:<26} {idle['passes']:>7} {idle['api_requests_per_pass']:>18.2f} "
              f"{idle['helm_per_pass']:>10.2f} {idle['pass_ms']:>7.0f} ms  {idle['by_kind']}")
    peak = results["memory_peak"]
    print(f"\n  memory, every process in the pod network (PSS, peak sampled): {peak.get('pss_mib', 0):.0f} MiB, "
          f"{peak.get('processes', 0)} processes, {peak.get('runner_processes', 0)} runners; "
          f"MemAvailable low {results['mem_available_low_gib']} GiB")
    print_json(how, results)
    per_pass = [i["api_requests_per_pass"] for i in results["idle"]]
    if max(per_pass) > min(per_pass) + 1:
        raise SystemExit(f"API requests per idle pass grow with the WorkflowRuns: {per_pass}")


if __name__ == "__main__":
    main()
