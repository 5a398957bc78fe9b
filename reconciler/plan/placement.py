"""Placement: which backend each replica of a WorkflowRun or ModelDeployment goes to, and why.

Pure: no I/O. `place` decides one run given what the other releases hold; `place_all` decides every
run of a commit, in a deterministic order, the capacity each takes counted against the next.

A run names one backend (`backend.cluster`) or a pool (`refs`, or a `selector` on PlntBackend
labels). Each replica needs `gpuCount` GPUs of `gpuClass` and one replica slot. What is free on a
backend is its declared capacity (`spec.capacity`: GPUs per class, replicas; unset: no limit) minus
what other releases hold there, and, for a new replica, at most the free GPUs the backend reports
(`Observed.gpus_free`, per Node: a replica's `gpuCount` GPUs must all be free on one Node, so a
backend takes as many new replicas as the sum over its Nodes of free // gpuCount; only the Nodes the
run's own `nodeSelector` matches count for it, as its pods go nowhere else). Replicas stay
where they run while that backend is still in the pool, can still run them and has room for them
(no churn); the others go, one at a time, to the backend holding the fewest replicas of this run
(spread), then the one with room for the most more replicas, then the one with the least measured
load (requests in flight and queued on its replicas), then by name (the reason names the busier
backends passed over). A backend removed from the pool, gone, unreachable, or full gives its
replicas up and they are placed again.
A run whose replicas do not all fit gets `missing`: the capacity it lacks, named.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from plnt.core.specs.loader import SpecSet
from plnt.core.specs.models import LOCAL_MODEL_RUNTIMES, Deployable, ModelDeployment, PlntBackend, replica_count
from plnt.reconciler.plan.diff import IN_SYNC, Action, PlanItem
from plnt.reconciler.state import LiveWorkflow
from pydantic import ValidationError

UNLIMITED = math.inf

@dataclass(frozen=True)
class NodeFree:
    """One Node's free GPUs of a class, as its cluster reports them, and the Node's labels: a run's own
    `nodeSelector` counts only the Nodes it matches (its pods can go nowhere else)."""

    name: str
    free: int
    labels: Mapping[str, str] = field(default_factory=dict)

    def matches(self, node_selector: Mapping[str, str]) -> bool:
        return all(self.labels.get(key) == value for key, value in node_selector.items())


# Free GPUs per class, as each Node of a backend reports them (one entry per Node matching the backend's
# nodeSelector and carrying the class).
GpusFree = Mapping[str, tuple[NodeFree, ...]]


@dataclass(frozen=True)
class Observed:
    """What plnt measured of one backend: requests in flight to its replicas and waiting in queues (as
    each replica counts them, its GET /load), the free GPUs per class on each of its Nodes (None: it
    reports none, the declared capacity alone counts; `gpus_unknown`: why they could not be read, e.g. a
    Kubernetes backend's cluster away), and whether it answers at all."""

    in_flight: int = 0
    queue_depth: int = 0
    gpus_free: GpusFree | None = None
    gpus_unknown: str | None = None
    reachable: bool = True

    @property
    def load(self) -> int:
        return self.in_flight + self.queue_depth


NOTHING_OBSERVED = Observed()


@dataclass
class Held:
    """What the releases placed so far hold on each backend: replicas, and GPUs per class; and the
    GPUs their new replicas take from each observed Node (not running yet, so not in the reading)."""

    replicas: Counter[str] = field(default_factory=Counter)
    gpus: dict[str, Counter[str]] = field(default_factory=dict)  # backend -> class -> GPUs
    nodes: dict[tuple[str, str], Counter[int]] = field(default_factory=dict)  # (backend, class) -> Node -> GPUs

    def take(self, backend: str, gpu_class: str | None, gpu_count: int, replicas: int = 1) -> None:
        self.replicas[backend] += replicas
        if gpu_class is not None and gpu_count:
            self.gpus.setdefault(backend, Counter())[gpu_class] += gpu_count * replicas

    def take_on_node(self, backend: str, gpu_class: str, node: int, gpu_count: int) -> None:
        """A new replica's GPUs on the `node`-th observed Node of the backend's class."""
        self.nodes.setdefault((backend, gpu_class), Counter())[node] += gpu_count

    def gpus_of(self, backend: str, gpu_class: str) -> int:
        return self.gpus.get(backend, Counter())[gpu_class]

    def on_node(self, backend: str, gpu_class: str, node: int) -> int:
        return self.nodes.get((backend, gpu_class), Counter())[node]


@dataclass(frozen=True)
class ReplicaPlace:
    backend: str
    reason: str
    node: int | None = None  # a new replica's observed Node (its index in the backend's reading of the class)

    def __str__(self) -> str:
        return f"{self.backend}: {self.reason}"


@dataclass(frozen=True)
class Placement:
    """Where a run's replicas go (`replicas`, in order) or, with `missing`, why not all of them can."""

    key: str
    replicas: tuple[ReplicaPlace, ...]
    missing: str | None = None
    pooled: bool = False
    capacity_declared: bool = False  # a backend it may use declares capacity (so placement can fail)

    @property
    def placed(self) -> bool:
        return self.missing is None

    @property
    def shown(self) -> bool:
        """Worth a line in a plan: a pool, a backend with declared capacity, or a failure."""
        return self.pooled or self.capacity_declared or self.missing is not None

    def counts(self) -> dict[str, int]:
        """Replicas per backend, in the order backends first appear."""
        return dict(Counter(replica.backend for replica in self.replicas))

    def lines(self) -> list[str]:
        """`replica N -> backend: why` for each replica, then the missing capacity if any."""
        out = [f"replica {i} -> {replica}" for i, replica in enumerate(self.replicas, 1)]
        if self.missing is not None:
            out.append(f"cannot be placed: {self.missing}")
        return out


def replicas_wanted(run: Deployable) -> int:
    """Replicas to place: replicas.min, and one for a run that scales to zero (where it wakes)."""
    return replica_count(run.spec)


def _unfit(run: Deployable, backend: PlntBackend | None, observed: Observed) -> str | None:
    """Why a backend cannot take any replica of `run` whatever its capacity, or None."""
    if backend is None:
        return "gone (no such PlntBackend at this commit)"
    if not observed.reachable:
        return "unreachable"
    gpu_class = run.spec.backend.gpu_class
    if gpu_class is not None and gpu_class not in backend.spec.gpu_classes:
        return f"no GPU class {gpu_class}"
    if isinstance(run, ModelDeployment) and backend.spec.type == "local" \
            and run.spec.runtime.type not in LOCAL_MODEL_RUNTIMES:
        return f"type: local cannot run {run.spec.runtime.type}"
    if run.spec.replicas.min == 0 and backend.spec.type != "local":
        return "scale to zero needs a type: local backend"
    return None


class _Backend:
    """One candidate backend while a run is placed: its room, as replicas of this run."""

    def __init__(self, name: str, backend: PlntBackend, observed: Observed, held: Held, run: Deployable) -> None:
        self.name = name
        self.observed = observed
        self.mine = 0  # replicas of this run placed here so far (kept or new)
        capacity = backend.spec.capacity
        self.slots = capacity.replicas if capacity is not None else None
        self.held_slots = held.replicas[name]
        self.gpu_class = run.spec.backend.gpu_class
        self.gpu_count = run.spec.backend.gpu_count if self.gpu_class is not None else 0
        gpus = capacity.gpus if capacity is not None else {}
        self.gpus = gpus.get(self.gpu_class) if self.gpu_count and self.gpu_class is not None else None
        self.held_gpus = held.gpus_of(name, self.gpu_class) if self.gpu_class is not None else 0
        seen = observed.gpus_free
        nodes = seen.get(self.gpu_class) if self.gpu_count and seen is not None and self.gpu_class else None
        self.node_selector = run.spec.backend.node_selector
        # Each observed Node the run's own nodeSelector matches (its index in the reading): its free GPUs,
        # less what new replicas (other runs', then this run's) took from it. The others count not at all.
        self.seen_nodes: list[int] | None = None
        self.seen_index: list[int] = []
        self.elsewhere = 0  # observed free GPUs on Nodes the run's nodeSelector leaves out
        if nodes is not None and self.gpu_class is not None:
            self.seen_nodes = []
            for i, node in enumerate(nodes):
                free = max(node.free - held.on_node(name, self.gpu_class, i), 0)
                if node.matches(self.node_selector):
                    self.seen_nodes.append(free)
                    self.seen_index.append(i)
                else:
                    self.elsewhere += free

    @property
    def declared(self) -> bool:
        return self.slots is not None or self.gpus is not None

    def free_slots(self) -> float:
        return UNLIMITED if self.slots is None else self.slots - self.held_slots - self.mine

    def seen_free(self) -> int | None:
        """The observed free GPUs left on all Nodes together (None: none observed)."""
        return sum(self.seen_nodes) if self.seen_nodes is not None else None

    def free_gpus(self, new: bool) -> float:
        """GPUs of the class free here (declared less held; for a new replica, at most what the backend
        reports free less what the new replicas placed here already took)."""
        free = UNLIMITED if self.gpus is None else self.gpus - self.held_gpus - self.mine * self.gpu_count
        seen = self.seen_free()
        if new and seen is not None:
            free = min(free, seen)
        return free

    def gpu_room(self, new: bool) -> float:
        """How many more replicas' GPUs fit here: by the declared total, and for a new replica by the
        observed Nodes, each replica's GPUs on one Node."""
        room = UNLIMITED if self.gpus is None else (self.gpus - self.held_gpus - self.mine * self.gpu_count) \
            // self.gpu_count  # (not UNLIMITED // n: that is nan)
        if new and self.seen_nodes is not None:
            room = min(room, sum(free // self.gpu_count for free in self.seen_nodes))
        return room

    def split(self) -> bool:
        """The observed free GPUs would take more replicas summed than they do Node by Node."""
        if not self.gpu_count or self.seen_nodes is None:
            return False
        free = self.free_gpus(new=True)  # (finite: at most the observed sum)
        return free // self.gpu_count > self.gpu_room(new=True)

    def split_words(self) -> str:
        """", at most 1 on one Node" when the observed GPUs are split so that fewer replicas fit."""
        return f", at most {max(self.seen_nodes or [0])} on one Node" if self.split() else ""

    def selector_words(self) -> str:
        """Which observed Nodes counted, when the run's own nodeSelector narrowed them: " on the Nodes
        matching the run's nodeSelector {gpu: a100}, 2 on other Nodes"; "" without one."""
        if not self.node_selector or self.seen_nodes is None:
            return ""
        selector = "{" + ", ".join(f"{key}: {value}" for key, value in self.node_selector.items()) + "}"
        if not self.seen_nodes:
            return f", no Node matches the run's nodeSelector {selector}"
        elsewhere = f", {self.elsewhere} on other Nodes" if self.elsewhere else ""
        return f" on the Nodes matching the run's nodeSelector {selector}{elsewhere}"

    def room(self, new: bool) -> float:
        """How many more replicas of this run fit here."""
        room = self.free_slots()
        if self.gpu_count:
            room = min(room, self.gpu_room(new))
        return max(room, 0)

    def describe(self) -> str:
        """What is free here before the next replica: "2 of 4 GPUs of class a100 free, 1 in flight"."""
        parts = []
        if self.gpu_count:
            free = self.free_gpus(new=True)
            seen = self.seen_free()
            if self.gpus is not None or seen is not None:
                total = f" of {self.gpus}" if self.gpus is not None else " (observed)"
                where = self.selector_words() if self.gpus is None else ""
                parts.append(f"{_count(free)}{total} GPUs of class {self.gpu_class} free{where}{self.split_words()}")
            if seen is not None and self.gpus is not None:
                parts.append(f"{seen} observed free{self.selector_words()}")
            elif self.observed.gpus_unknown is not None:
                parts.append(f"free GPUs unknown ({self.observed.gpus_unknown}): by declared capacity")
        if self.slots is not None:
            parts.append(f"{_count(self.free_slots())} of {self.slots} replica slots free")
        if not parts:
            parts.append("no declared capacity")
        parts.append(self.load_words())
        return ", ".join(parts)

    def load_words(self) -> str:
        """The measured load in words: "3 in flight" or "1 in flight, 2 queued"."""
        queued = f", {self.observed.queue_depth} queued" if self.observed.queue_depth else ""
        return f"{self.observed.in_flight} in flight{queued}"

    def take(self, new: bool) -> int | None:
        """One more replica here; a new one takes its GPUs from one observed Node with room (the one
        with the fewest free that still fits, then the first: larger holes stay for larger replicas of
        the runs placed next). Returns that Node (its index), None when no Node is observed."""
        self.mine += 1
        nodes = self.seen_nodes
        if not (new and self.gpu_count and nodes is not None):
            return None
        fits = [i for i, free in enumerate(nodes) if free >= self.gpu_count]
        node = min(fits, key=lambda i: (nodes[i], i))  # (room() >= 1 guarantees one)
        nodes[node] -= self.gpu_count
        return self.seen_index[node]


def place(run: Deployable, backends: Mapping[str, PlntBackend], current: Mapping[str, int] | None = None,
          observed: Mapping[str, Observed] | None = None, held: Held | None = None) -> Placement:
    """Where each replica of `run` goes. `current`: its replicas per backend now; `observed`: load
    and reported free GPUs per backend; `held`: what other releases hold (their replicas and GPUs)."""
    current = current or {}
    observed = observed or {}
    held = held or Held()
    spec = run.spec.backend
    wanted = replicas_wanted(run)
    members = spec.members(backends)
    unfit: dict[str, str] = {}
    candidates: dict[str, _Backend] = {}
    for name in members:
        seen = observed.get(name, NOTHING_OBSERVED)
        why = _unfit(run, backends[name], seen)
        if why is None:
            candidates[name] = _Backend(name, backends[name], seen, held, run)
        else:
            unfit[name] = why
    placed: list[ReplicaPlace] = []
    # Kept first: the replicas that run where they still may, least loaded backends first on a scale down.
    for name in sorted(current, key=lambda n: (observed.get(n, NOTHING_OBSERVED).load, n)):
        here = candidates.get(name)
        if here is None:
            continue
        keep = min(current[name], wanted - len(placed), int(min(here.room(new=False), wanted)))
        for _ in range(keep):
            here.take(new=False)
            placed.append(ReplicaPlace(name, f"kept: {here.describe()}"))
    while len(placed) < wanted:
        fits = [b for b in candidates.values() if b.room(new=True) >= 1]
        if not fits:
            break
        best = min(fits, key=lambda b: (b.mine, -b.room(new=True), b.observed.load, b.name))
        reason = best.describe() + _passed_over_for_load(best, fits)
        placed.append(ReplicaPlace(best.name, reason, node=best.take(new=True)))
    missing = None
    if len(placed) < wanted:
        missing = _missing(run, wanted - len(placed), spec.describe(), members, candidates, unfit)
    return Placement(key=run.key, replicas=tuple(placed), missing=missing, pooled=spec.pooled,
                     capacity_declared=any(b.declared for b in candidates.values()))


def _passed_over_for_load(best: _Backend, fits: Iterable[_Backend]) -> str:
    """The backends that were as good as `best` but for their load, named: the reason it was chosen."""
    rank = (best.mine, -best.room(new=True))
    busier = sorted((b for b in fits if b is not best and (b.mine, -b.room(new=True)) == rank
                     and b.observed.load > best.observed.load), key=lambda b: b.name)
    if not busier:
        return ""
    return "; less loaded than " + ", ".join(f"{b.name} ({b.load_words()})" for b in busier)


def _missing(run: Deployable, short: int, pool: str, members: list[str], candidates: Mapping[str, _Backend],
             unfit: Mapping[str, str]) -> str:
    """The capacity a run lacks: "needs 1 more GPU of class a100: pool has 0 free (a: 0 of 4, b: 0 of 2)";
    when the observed GPUs are there but split over Nodes: "needs 1 more replica of 2 GPUs of class
    a100 on one Node: a has 2 free (a: 2 observed, at most 1 on one Node)"."""
    replicas = f"{short} more replica{'s' if short != 1 else ''}"
    if not candidates:
        if not members:
            return f"needs {replicas}: {pool} names no PlntBackend declared at this commit"
        why = "; ".join(f"{name}: {reason}" for name, reason in sorted(unfit.items()))
        return f"needs {replicas}: no backend of {pool} can run it ({why})"
    parts = []
    spec = run.spec.backend
    if spec.gpu_count and spec.gpu_class is not None:
        gpu_bound = [b for b in candidates.values() if b.gpu_room(new=True) < 1]
        if gpu_bound:
            free = sum(max(b.free_gpus(new=True), 0) for b in candidates.values())
            need = short * spec.gpu_count
            detail = ", ".join(f"{b.name}: {_count(max(b.free_gpus(new=True), 0))}"
                               + (f" of {b.gpus}" if b.gpus is not None else "")
                               + (" observed" if b.seen_nodes is not None else "") + b.selector_words()
                               + b.split_words()
                               for b in candidates.values())
            if any(b.split() for b in candidates.values()):
                what = f"{replicas} of {spec.gpu_count} GPUs of class {spec.gpu_class} on one Node"
            else:
                each = (f" ({spec.gpu_count} on one backend for each of {short} replica{'s' if short != 1 else ''})"
                        if spec.gpu_count > 1 else "")
                what = f"{need} more GPU{'s' if need != 1 else ''} of class {spec.gpu_class}{each}"
            parts.append(f"needs {what}: {pool} has {_count(free)} free ({detail})")
    slot_bound = [b for b in candidates.values() if b.free_slots() < 1]
    if slot_bound:
        free = sum(max(b.free_slots(), 0) for b in candidates.values())
        detail = ", ".join(f"{b.name}: {_count(max(b.free_slots(), 0))}" + (f" of {b.slots}" if b.slots is not None else "")
                           for b in candidates.values())
        parts.append(f"needs {short} more replica slot{'s' if short != 1 else ''}: {pool} has {_count(free)} "
                     f"free ({detail})")
    if unfit:
        parts.append("not usable: " + "; ".join(f"{name}: {reason}" for name, reason in sorted(unfit.items())))
    return "; ".join(parts)


def _count(value: float) -> str:
    return "unlimited" if value == UNLIMITED else str(int(value))


def place_all(runs: Iterable[Deployable], backends: Mapping[str, PlntBackend],
              current: Mapping[str, Mapping[str, int]] | None = None,
              observed: Mapping[str, Observed] | None = None) -> dict[str, Placement]:
    """Every run's placement; they compete for capacity (declared, and the observed GPUs of each Node
    their new replicas take). Runs that run somewhere now go first (they keep what they hold), then
    the new ones, each group by key: the same inputs give the same result.
    A run that cannot be placed keeps holding what it runs on now (its release keeps serving)."""
    current = current or {}
    held = Held()
    out: dict[str, Placement] = {}
    for run in sorted(runs, key=lambda r: (not current.get(r.key), r.key)):
        now = current.get(run.key, {})
        placement = place(run, backends, now, observed, held)
        gpu_class, gpu_count = run.spec.backend.gpu_class, run.spec.backend.gpu_count
        if placement.placed:
            for backend, count in placement.counts().items():
                held.take(backend, gpu_class, gpu_count, count)
            for replica in placement.replicas:
                if replica.node is not None and gpu_class is not None:
                    held.take_on_node(replica.backend, gpu_class, replica.node, gpu_count)
        else:
            for backend, count in now.items():
                if backend in backends:
                    held.take(backend, gpu_class, gpu_count, count)
        out[run.key] = placement
    return out


def observed_load(in_flight: Mapping[str, int], releases: Mapping[str, LiveWorkflow],
                  current: Mapping[str, Mapping[str, int]]) -> dict[str, Observed]:
    """Requests in flight per backend, from the counts per endpoint (each replica's GET /load): each
    replica process counted on the backend it was placed on (a pool's record names it), a release on
    one backend on that one (`current`). An endpoint no release holds counts nowhere; a backend with no
    reading is left out ("unknown": placement goes by declared capacity there)."""
    load: Counter[str] = Counter()
    for key, live in releases.items():
        single = next(iter(current[key])) if len(current.get(key) or ()) == 1 else None
        for release in (live.stable, live.canary):
            for process in release.processes() if release is not None else ():
                backend = process.backend or single
                if backend is not None and in_flight.get(process.endpoint):
                    load[backend] += in_flight[process.endpoint]
    return {backend: Observed(in_flight=count) for backend, count in load.items()}


def gpu_backends(specs: SpecSet) -> dict[str, PlntBackend]:
    """The backends whose free GPUs matter at this commit: those a run asking for GPUs may use."""
    wanted = {name for run in specs.deployables().values() if run.spec.backend.gpu_count
              and run.spec.backend.gpu_class is not None for name in run.spec.backend.members(specs.backends)}
    return {name: specs.backends[name] for name in sorted(wanted) if name in specs.backends}


def with_gpu_readings(observed: Mapping[str, Observed],
                      readings: Mapping[str, GpusFree | str]) -> dict[str, Observed]:
    """`observed` with each backend's free GPUs per class and Node as read, or why they could not be (a string:
    "unknown", the declared capacity counts and the reason says so)."""
    out = dict(observed)
    for name, reading in readings.items():
        seen = out.get(name, NOTHING_OBSERVED)
        out[name] = replace(seen, gpus_unknown=reading) if isinstance(reading, str) \
            else replace(seen, gpus_free=dict(reading))
    return out


def current_of(placements: Mapping[str, Placement]) -> dict[str, dict[str, int]]:
    """Placements as the `current` of the next decision (e.g. a base commit's, for its head)."""
    return {key: p.counts() for key, p in placements.items() if p.placed}


def place_commit(specs: SpecSet, current: Mapping[str, Mapping[str, int]] | None = None,
                 observed: Mapping[str, Observed] | None = None,
                 serving: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, Placement]:
    """`place_all` over a commit's WorkflowRuns and ModelDeployments and its PlntBackends. `serving`:
    held runs (their spec in git failed) by key, each with the spec its stable release serves, which
    is what they are placed as (its pool, its replicas), not the spec in git."""
    runs = specs.deployables().values()
    if serving:
        runs = [as_serving(run, serving[run.key]) if run.key in serving else run for run in runs]
    return place_all(runs, specs.backends, current, observed)


def as_serving(run: Deployable, spec: Mapping[str, Any]) -> Deployable:
    """`run` with the spec its stable release was deployed with; `run` itself when that no longer
    reads as a spec (recorded by an older plnt)."""
    try:
        return type(run).model_validate({**run.model_dump(mode="json", by_alias=True), "spec": dict(spec)})
    except ValidationError:
        return run


def with_placements(items: Iterable[PlanItem], placements: Mapping[str, Placement],
                    current: Mapping[str, Mapping[str, int]] | None = None) -> list[PlanItem]:
    """Each plan item with where its replicas go (for a pool, declared capacity or a failure). An
    install or upgrade that cannot be placed starts no saga; an unchanged release that would not fit
    any more keeps running, and says so. A pool's release in sync whose replicas now go elsewhere than
    they run (`current`: replicas per backend now; a backend gone, full or its capacity lowered) is
    re-placed: a "scale" to the new placement, no canary (the same version). So is a held one's
    stable (its spec in git failed), placed as the spec it serves (place_commit's `serving`)."""
    current = current or {}
    out = []
    for item in items:
        placement = placements.get(item.key) if item.action is not Action.UNINSTALL else None
        if placement is not None and placement.shown:
            counts = tuple(placement.counts().items()) if placement.placed and placement.pooled else ()
            item = replace(item, placement=tuple(placement.lines()), unplaceable=placement.missing,
                           replicas_by_backend=counts)
            now = current.get(item.key)
            if (counts and now and item.action is Action.UNCHANGED and (item.reason == IN_SYNC or item.held)
                    and not item.waiting and dict(now) != dict(counts)):
                held = f"; the spec in git stays held, {item.from_version} serves on" if item.held else ""
                item = replace(item, action=Action.SCALE, from_replicas=sum(now.values()),
                               to_replicas=sum(dict(counts).values()),
                               reason=f"re-placed: {_spread(now)} -> {_spread(dict(counts))}{held}")
        out.append(item)
    return out


def _spread(counts: Mapping[str, int]) -> str:
    """Replicas per backend in a few words: "east 1, west 1"."""
    return ", ".join(f"{backend} {count}" for backend, count in sorted(counts.items()))
