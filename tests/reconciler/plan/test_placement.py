"""Placement is a pure function: table tests over specs built in memory, no I/O."""

from __future__ import annotations

from typing import Any

import pytest
from plnt.core.specs.loader import SpecSet
from plnt.core.specs.models import ModelDeployment, PlntBackend, WorkflowRun
from plnt.reconciler.plan.diff import IN_SYNC, Action, PlanItem
from plnt.reconciler.plan.placement import (
    Held,
    NodeFree,
    Observed,
    Placement,
    current_of,
    gpu_backends,
    observed_load,
    place,
    place_all,
    place_commit,
    with_gpu_readings,
    with_placements,
)
from plnt.reconciler.state import LiveWorkflow, Release, ReplicaProcess


def backend(name: str, *, labels: dict[str, str] | None = None, gpus: dict[str, int] | None = None,
            replicas: int | None = None, classes: list[str] | None = None, type: str = "kubernetes") -> PlntBackend:
    spec: dict[str, Any] = {"type": type, "gpuClasses": classes if classes is not None else sorted(gpus or {})}
    if type == "kubernetes":
        spec["kubernetes"] = {"namespace": "default"}
    if gpus is not None or replicas is not None:
        spec["capacity"] = {"gpus": gpus or {}, **({"replicas": replicas} if replicas is not None else {})}
    return PlntBackend.model_validate({"apiVersion": "plnt.work/v1", "kind": "PlntBackend",
                                       "metadata": {"name": name, "labels": labels or {}}, "spec": spec})


def run(name: str = "rr", *, pool: dict[str, Any] | None = None, replicas: int = 1, gpu_class: str | None = None,
        gpu_count: int = 0) -> WorkflowRun:
    where: dict[str, Any] = dict(pool or {"refs": ["a", "b"]})
    if gpu_class is not None:
        where.update(gpuClass=gpu_class, gpuCount=gpu_count)
    return WorkflowRun.model_validate({
        "apiVersion": "plnt.work/v1", "kind": "WorkflowRun", "metadata": {"name": name},
        "spec": {"workflow": {"ref": f"{name}@1.0.0", "registry": "file:registry"}, "backend": where,
                 "replicas": {"min": replicas}}})


def nodes(*free: int, labels: dict[str, str] | None = None) -> tuple[NodeFree, ...]:
    """Observed Nodes (n0, n1, ...) with these free GPUs, each with `labels`."""
    return tuple(NodeFree(f"n{i}", count, labels or {}) for i, count in enumerate(free))


def by_name(*backends: PlntBackend) -> dict[str, PlntBackend]:
    return {b.metadata.name: b for b in backends}


A100 = "nvidia.com/a100"
GPU_RUN = {"gpu_class": A100, "gpu_count": 1}

# (name, backends, run, current, observed, held, expected replicas per backend (in order), missing contains)
CASES: list[tuple[str, dict[str, PlntBackend], WorkflowRun, dict[str, int], dict[str, Observed], Held | None,
                  dict[str, int], str | None]] = [
    ("one backend, no capacity declared", by_name(backend("a")), run(pool={"cluster": "a"}), {}, {}, None,
     {"a": 1}, None),
    ("two replicas spread 1+1 over equal backends", by_name(backend("a"), backend("b")), run(replicas=2), {}, {},
     None, {"a": 1, "b": 1}, None),
    ("more free GPUs first", by_name(backend("a", gpus={A100: 2}), backend("b", gpus={A100: 4})),
     run(replicas=1, **GPU_RUN), {}, {}, None, {"b": 1}, None),
    ("spread by free capacity: 4 free and 2 free take 3 replicas 2+1",
     by_name(backend("a", gpus={A100: 2}), backend("b", gpus={A100: 4})), run(replicas=3, **GPU_RUN), {}, {}, None,
     {"b": 2, "a": 1}, None),
    ("GPUs held by other releases are not free", by_name(backend("a", gpus={A100: 4}), backend("b", gpus={A100: 4})),
     run(replicas=1, **GPU_RUN), {}, {}, Held(gpus={"b": __import__("collections").Counter({A100: 3})}),
     {"a": 1}, None),
    ("equal capacity: the less loaded backend", by_name(backend("a"), backend("b")), run(replicas=1), {},
     {"a": Observed(in_flight=5), "b": Observed(in_flight=1)}, None, {"b": 1}, None),
    ("queue depth counts as load", by_name(backend("a"), backend("b")), run(replicas=1), {},
     {"a": Observed(in_flight=0, queue_depth=3), "b": Observed(in_flight=1)}, None, {"b": 1}, None),
    ("equal everything: by name", by_name(backend("b"), backend("a")), run(replicas=1), {}, {}, None, {"a": 1}, None),
    ("no churn: replicas stay where they run", by_name(backend("a"), backend("b")), run(replicas=2), {"a": 2},
     {"a": Observed(in_flight=9)}, None, {"a": 2}, None),
    ("scale up: the new replica goes where there is most room", by_name(backend("a", replicas=2), backend("b",
     replicas=4)), run(replicas=3), {"a": 2}, {}, None, {"a": 2, "b": 1}, None),
    ("scale down: the least loaded backend keeps its replica", by_name(backend("a"), backend("b")), run(replicas=1),
     {"a": 1, "b": 1}, {"a": Observed(in_flight=4)}, None, {"b": 1}, None),
    ("backend gone from the commit: re-placed", by_name(backend("b")), run(replicas=1), {"a": 1}, {}, None,
     {"b": 1}, None),
    ("backend removed from the refs: re-placed", by_name(backend("a"), backend("b"), backend("c")),
     run(pool={"refs": ["b", "c"]}, replicas=1), {"a": 1}, {}, None, {"b": 1}, None),
    ("backend full after its capacity was lowered: the replicas that fit stay, the rest move",
     by_name(backend("a", replicas=1), backend("b")), run(replicas=2), {"a": 2}, {}, None, {"a": 1, "b": 1}, None),
    ("unreachable backend: re-placed", by_name(backend("a"), backend("b")), run(replicas=1), {"a": 1},
     {"a": Observed(reachable=False)}, None, {"b": 1}, None),
    ("a member without the GPU class is skipped", by_name(backend("a", classes=["nvidia.com/h100"]),
     backend("b", gpus={A100: 1})), run(replicas=1, **GPU_RUN), {}, {}, None, {"b": 1}, None),
    ("selector picks the labelled backends", by_name(backend("a", labels={"pool": "x"}),
     backend("b", labels={"pool": "y"}), backend("c", labels={"pool": "x"})),
     run(pool={"selector": {"matchLabels": {"pool": "x"}}}, replicas=2), {}, {}, None, {"a": 1, "c": 1}, None),
    ("reported free GPUs bound a new replica", by_name(backend("a", gpus={A100: 8}), backend("b", gpus={A100: 2})),
     run(replicas=1, **GPU_RUN), {}, {"a": Observed(gpus_free={A100: nodes(0)})}, None, {"b": 1}, None),
    ("reported free GPUs do not evict a running replica", by_name(backend("a", gpus={A100: 1})),
     run(pool={"cluster": "a"}, replicas=1, **GPU_RUN), {"a": 1}, {"a": Observed(gpus_free={A100: nodes(0)})}, None,
     {"a": 1}, None),
    ("two GPUs each must fit on one backend", by_name(backend("a", gpus={A100: 1}), backend("b", gpus={A100: 1})),
     run(replicas=1, gpu_class=A100, gpu_count=2), {}, {}, None, {},
     "needs 2 more GPUs of class nvidia.com/a100 (2 on one backend for each of 1 replica): refs [a, b] has 2 free "
     "(a: 1 of 1, b: 1 of 1)"),
    ("no GPU free: the missing GPU named", by_name(backend("a", gpus={A100: 0}), backend("b", gpus={A100: 0})),
     run(replicas=1, **GPU_RUN), {}, {}, None, {},
     "needs 1 more GPU of class nvidia.com/a100: refs [a, b] has 0 free (a: 0 of 0, b: 0 of 0)"),
    ("partly placed: the rest named", by_name(backend("a", gpus={A100: 1}), backend("b", gpus={A100: 1})),
     run(replicas=3, **GPU_RUN), {}, {}, None, {"a": 1, "b": 1},
     "needs 1 more GPU of class nvidia.com/a100: refs [a, b] has 0 free"),
    ("replica slots full", by_name(backend("a", replicas=0), backend("b", replicas=1)), run(replicas=2), {}, {}, None,
     {"b": 1}, "needs 1 more replica slot: refs [a, b] has 0 free (a: 0 of 0, b: 0 of 1)"),
    ("every member gone", by_name(backend("c")), run(replicas=1), {"a": 1}, {}, None, {},
     "needs 1 more replica: refs [a, b] names no PlntBackend declared at this commit"),
    ("no member can run it", by_name(backend("a"), backend("b")), run(replicas=1), {},
     {"a": Observed(reachable=False), "b": Observed(reachable=False)}, None, {},
     "no backend of refs [a, b] can run it (a: unreachable; b: unreachable)"),
    ("scale to zero still places one replica (where it wakes)", by_name(backend("a", type="local"),
     backend("b", type="local")), run(replicas=0), {}, {}, None, {"a": 1}, None),
]


@pytest.mark.parametrize(("backends", "the_run", "current", "observed", "held", "expected", "missing"),
                         [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_place(backends: dict[str, PlntBackend], the_run: WorkflowRun, current: dict[str, int],
               observed: dict[str, Observed], held: Held | None, expected: dict[str, int], missing: str | None) -> None:
    placement = place(the_run, backends, current, observed, held)
    assert placement.counts() == expected
    assert list(placement.counts()) == list(expected)  # and in that order (kept first, then by room)
    if missing is None:
        assert placement.missing is None and placement.placed
    else:
        assert placement.missing is not None and missing in placement.missing, placement.missing
        assert not placement.placed


def test_reasons_say_what_is_free_and_the_load() -> None:
    backends = by_name(backend("a", gpus={A100: 4}), backend("b", gpus={A100: 1}))
    held = Held()
    held.take("a", A100, 1, 2)
    placement = place(run(replicas=1, **GPU_RUN), backends, {}, {"a": Observed(in_flight=1)}, held)
    assert placement.lines() == ["replica 1 -> a: 2 of 4 GPUs of class nvidia.com/a100 free, 1 in flight"]


@pytest.mark.parametrize(("observed", "line"), [
    ({"a": Observed(in_flight=3)}, "replica 1 -> b: no declared capacity, 0 in flight; less loaded than a (3 in flight)"),
    ({"a": Observed(in_flight=1, queue_depth=2), "c": Observed(in_flight=5)},
     "replica 1 -> b: no declared capacity, 0 in flight; less loaded than a (1 in flight, 2 queued), c (5 in flight)"),
    ({}, "replica 1 -> a: no declared capacity, 0 in flight"),  # a tie: by name, nothing passed over
])
def test_a_choice_made_by_load_names_the_busier_backends(observed: dict[str, Observed], line: str) -> None:
    placement = place(run(replicas=1, pool={"refs": ["a", "b", "c"]}), by_name(backend("a"), backend("b"), backend("c")),
                      {}, observed)
    assert placement.lines() == [line]


def test_a_busier_backend_with_more_room_is_not_passed_over_for_load() -> None:
    """Room comes before load: the reason names no backend that lost on room."""
    placement = place(run(replicas=1), by_name(backend("a", replicas=1), backend("b", replicas=4)), {},
                      {"b": Observed(in_flight=9)})
    assert placement.lines() == ["replica 1 -> b: 4 of 4 replica slots free, 9 in flight"]


def test_kept_replicas_say_so() -> None:
    placement = place(run(replicas=1), by_name(backend("a", replicas=3), backend("b")), {"a": 1})
    assert placement.lines() == ["replica 1 -> a: kept: 2 of 3 replica slots free, 0 in flight"]


def test_a_placement_that_fails_lists_what_fits_and_what_is_missing() -> None:
    placement = place(run(replicas=2), by_name(backend("a", replicas=1), backend("b", replicas=0)))
    assert placement.lines() == ["replica 1 -> a: 1 of 1 replica slots free, 0 in flight",
                                 "cannot be placed: needs 1 more replica slot: refs [a, b] has 0 free "
                                 "(a: 0 of 1, b: 0 of 0)"]


def test_place_all_runs_compete_in_key_order() -> None:
    """Two new runs, one GPU: the first by key gets it, the second names what it misses."""
    backends = by_name(backend("a", gpus={A100: 1}), backend("b", gpus={A100: 0}))
    placements = place_all([run("zz", **GPU_RUN), run("aa", **GPU_RUN)], backends)
    assert placements["default/aa"].counts() == {"a": 1}
    assert placements["default/zz"].missing is not None
    assert "needs 1 more GPU of class nvidia.com/a100" in placements["default/zz"].missing


def test_place_all_running_releases_keep_their_capacity_before_new_ones() -> None:
    backends = by_name(backend("a", gpus={A100: 1}), backend("b", gpus={A100: 0}))
    placements = place_all([run("aa", **GPU_RUN), run("zz", **GPU_RUN)], backends, current={"default/zz": {"a": 1}})
    assert placements["default/zz"].counts() == {"a": 1}
    assert placements["default/aa"].missing is not None


def test_place_all_a_run_that_cannot_be_placed_keeps_holding_what_it_runs_on() -> None:
    """zz runs 1 on a and now wants 3 (only 2 fit): it fails and still holds a's slot, so aa goes to b."""
    backends = by_name(backend("a", replicas=1), backend("b", replicas=1))
    placements = place_all([run("zz", replicas=3), run("aa")], backends, current={"default/zz": {"a": 1}})
    assert placements["default/zz"].missing is not None
    assert placements["default/aa"].counts() == {"b": 1}


def test_place_all_is_deterministic_whatever_the_input_order() -> None:
    backends = by_name(backend("a", replicas=3), backend("b", replicas=2), backend("c"))
    runs = [run(name, pool={"refs": ["a", "b", "c"]}, replicas=2) for name in ("p", "q", "r", "s")]
    first = place_all(runs, backends)
    assert all(p.placed for p in first.values())
    assert place_all(list(reversed(runs)), backends) == first
    # and a second decision from the first's result churns nothing
    assert {k: p.counts() for k, p in place_all(runs, backends, current_of(first)).items()} == current_of(first)


def test_model_deployments_are_placed_only_where_their_runtime_runs() -> None:
    model = ModelDeployment.model_validate({
        "apiVersion": "plnt.work/v1", "kind": "ModelDeployment", "metadata": {"name": "m"},
        "spec": {"model": {"registry": "file:models", "name": "m", "version": "1.0.0", "rootDigest": "sha256:" + "0" * 64},
                 "runtime": {"type": "vllm"}, "backend": {"refs": ["laptop", "gpu"]}}})
    placement = place(model, by_name(backend("laptop", type="local"), backend("gpu")))
    assert placement.counts() == {"gpu": 1}
    assert isinstance(placement, Placement) and placement.pooled and placement.shown


# --- the plan's re-place: a pool's release in sync whose replicas now go elsewhere -----------------

def _item(action: Action = Action.UNCHANGED, reason: str = IN_SYNC, waiting: bool = False,
          held: bool = False) -> PlanItem:
    return PlanItem("default", "rr", action, reason, from_version="1.0.0", to_version="1.0.0", waiting=waiting,
                    held=held)


POOL = by_name(backend("a", replicas=2), backend("b", replicas=1))
FULL_B = by_name(backend("a", replicas=2), backend("b", replicas=0))

# (name, backends, plan item, where it runs now, expected action, reason, replicas by backend)
REPLACE_CASES: list[tuple[str, dict[str, PlntBackend], PlanItem, dict[str, int] | None, Action, str,
                          tuple[tuple[str, int], ...]]] = [
    ("in sync and where placed: unchanged", POOL, _item(), {"a": 1, "b": 1}, Action.UNCHANGED, IN_SYNC,
     (("a", 1), ("b", 1))),
    ("b full: its replica moves to a, a scale in place", FULL_B, _item(), {"a": 1, "b": 1}, Action.SCALE,
     "re-placed: a 1, b 1 -> a 2", (("a", 2),)),
    ("b gone from the commit: moved likewise", by_name(backend("a", replicas=2)), _item(), {"a": 1, "b": 1},
     Action.SCALE, "re-placed: a 1, b 1 -> a 2", (("a", 2),)),
    ("a saga runs: wait for it", FULL_B, _item(waiting=True), {"a": 1, "b": 1}, Action.UNCHANGED, IN_SYNC,
     (("a", 2),)),
    ("held, its stable serving: the stable moves, the spec in git stays held", FULL_B,
     _item(reason="held: this spec already failed", held=True), {"a": 1, "b": 1}, Action.SCALE,
     "re-placed: a 1, b 1 -> a 2; the spec in git stays held, 1.0.0 serves on", (("a", 2),)),
    ("held and where placed: unchanged", POOL, _item(reason="held: this spec already failed", held=True),
     {"a": 1, "b": 1}, Action.UNCHANGED, "held: this spec already failed", (("a", 1), ("b", 1))),
    ("another UNCHANGED (a drift only reported): not moved", FULL_B, _item(reason="drift: selfHeal: false"),
     {"a": 1, "b": 1}, Action.UNCHANGED, "drift: selfHeal: false", (("a", 2),)),
    ("not running yet (no current): the install places it", FULL_B, _item(Action.INSTALL, "new WorkflowRun"), None,
     Action.INSTALL, "new WorkflowRun", (("a", 2),)),
]


@pytest.mark.parametrize(("backends", "item", "now", "action", "reason", "counts"),
                         [case[1:] for case in REPLACE_CASES], ids=[case[0] for case in REPLACE_CASES])
def test_with_placements_re_places_a_pool_in_sync(backends: dict[str, PlntBackend], item: PlanItem,
                                                  now: dict[str, int] | None, action: Action, reason: str,
                                                  counts: tuple[tuple[str, int], ...]) -> None:
    current = {"default/rr": now} if now is not None else {}
    placements = place_all([run(replicas=2)], backends, current)
    [out] = with_placements([item], placements, current)
    assert (out.action, out.reason, out.replicas_by_backend) == (action, reason, counts)
    assert not out.needs_saga or action is Action.INSTALL


def test_a_held_run_is_placed_as_the_spec_its_stable_serves() -> None:
    """`serving`: the spec in git failed (it asks for 3 replicas on a and c); the stable serves the spec
    deployed before (2 on a and b), and that is what is placed and what capacity it holds. A recorded
    spec that no longer reads as one places the spec in git instead."""
    backends = by_name(backend("a", replicas=1), backend("b", replicas=2), backend("c", replicas=3))
    in_git = run(pool={"refs": ["a", "c"]}, replicas=3)
    other = run("other", pool={"refs": ["b", "c"]}, replicas=3)
    specs = SpecSet(workflow_runs={in_git.key: in_git, other.key: other}, backends=backends)
    serves = run(pool={"refs": ["a", "b"]}, replicas=2).spec.model_dump(mode="json", by_alias=True)
    current = {in_git.key: {"a": 1, "b": 1}}
    placed = place_commit(specs, current, serving={in_git.key: serves})
    assert placed[in_git.key].counts() == {"a": 1, "b": 1}
    assert placed[other.key].counts() == {"b": 1, "c": 2}  # b's other slot; c untouched by the held run
    assert place_commit(specs, current)[in_git.key].counts() == {"a": 1, "c": 2}  # as git has it
    broken = {**serves, "replicas": "many"}
    assert place_commit(specs, current, serving={in_git.key: broken})[in_git.key].counts() == {"a": 1, "c": 2}


def test_one_backend_gets_no_replicas_by_backend() -> None:
    """A run on one backend is scaled by a count (set_replicas), not by a placement."""
    backends = by_name(backend("a", replicas=2))
    placements = place_all([run(pool={"cluster": "a"}, replicas=2)], backends)
    [out] = with_placements([_item()], placements, {"default/rr": {"a": 1}})
    assert out.action is Action.UNCHANGED and out.replicas_by_backend == () and out.placement


def _release(endpoint: str, backend: str | None, more: tuple[tuple[str, str | None], ...] = ()) -> Release:
    return Release(release_id="r", namespace="default", name="rr", track="stable", version="1.0.0",
                   spec_fingerprint="sha256:" + "0" * 64, recipe_digest="d", recipe_dir="/r", endpoint=endpoint,
                   backend=backend, replicas=1 + len(more),
                   more_replicas=tuple(ReplicaProcess(endpoint=e, backend=b) for e, b in more))


def test_observed_load_counts_each_replica_on_its_backend() -> None:
    """The gateway's in-flight counts per endpoint, summed per backend: a pool's processes by their
    recorded backend, a one-backend release's on its backend; unknown endpoints and idle backends are
    left out (unknown, not zero)."""
    releases = {
        "default/rr": LiveWorkflow(namespace="default", name="rr", stable=_release("e1", "a", (("e2", "b"),)),
                                   canary=_release("e3", "a")),
        "default/one": LiveWorkflow(namespace="default", name="one", stable=_release("e4", None)),
        "default/idle": LiveWorkflow(namespace="default", name="idle", stable=_release("e5", None)),
    }
    current = {"default/rr": {"a": 1, "b": 1}, "default/one": {"c": 1}, "default/idle": {"d": 1}}
    in_flight = {"e1": 2, "e2": 1, "e3": 4, "e4": 3, "stranger": 9}
    load = observed_load(in_flight, releases, current)
    assert load == {"a": Observed(in_flight=6), "b": Observed(in_flight=1), "c": Observed(in_flight=3)}
    # Fed to placement: the less loaded of two equal backends takes a new replica.
    assert place(run(replicas=1), by_name(backend("a"), backend("b")), observed=load).counts() == {"b": 1}


@pytest.mark.parametrize(("declared", "observed", "line"), [
    ({A100: 4}, Observed(gpus_free={A100: nodes(3)}),
     "replica 1 -> a: 3 of 4 GPUs of class nvidia.com/a100 free, 3 observed free, 0 in flight"),
    (None, Observed(gpus_free={A100: nodes(2)}), "replica 1 -> a: 2 (observed) GPUs of class nvidia.com/a100 free, 0 in flight"),
    ({A100: 4}, Observed(gpus_unknown="ApiException 403"),
     "replica 1 -> a: 4 of 4 GPUs of class nvidia.com/a100 free, free GPUs unknown (ApiException 403): by declared "
     "capacity, 0 in flight"),
], ids=["declared and observed", "observed alone", "observation failed"])
def test_reasons_say_the_observed_free_gpus_or_that_they_are_unknown(declared: dict[str, int] | None,
                                                                      observed: Observed, line: str) -> None:
    backends = by_name(backend("a", gpus=declared, classes=[A100]))
    placement = place(run(pool={"cluster": "a"}, replicas=1, **GPU_RUN), backends, {}, {"a": observed})
    assert placement.lines() == [line]


def test_observed_free_gpus_move_a_replica_and_name_the_observed_count_when_none_fit() -> None:
    backends = by_name(backend("a", classes=[A100]), backend("b", classes=[A100]))
    moved = place(run(replicas=1, **GPU_RUN), backends, {}, {"a": Observed(gpus_free={A100: nodes(0)}),
                                                            "b": Observed(gpus_free={A100: nodes(1)})})
    assert moved.lines() == ["replica 1 -> b: 1 (observed) GPUs of class nvidia.com/a100 free, 0 in flight"]
    full = place(run(replicas=2, **GPU_RUN), backends, {}, {"a": Observed(gpus_free={A100: nodes(0)}),
                                                           "b": Observed(gpus_free={A100: nodes(1)})})
    assert full.missing == ("needs 1 more GPU of class nvidia.com/a100: refs [a, b] has 0 free (a: 0 observed, "
                            "b: 0 observed)")


# --- observed free GPUs per Node: a replica's gpuCount GPUs must all be free on one Node ---------------

OBSERVED_AB = by_name(backend("a", classes=[A100]), backend("b", classes=[A100]))
ON_A = {"cluster": "a"}
SPLIT = "needs 1 more replica of 2 GPUs of class nvidia.com/a100 on one Node: a has 2 free "

# (name, backends, run, observed, expected replicas per backend, missing: the whole message or None)
NODE_CASES: list[tuple[str, dict[str, PlntBackend], WorkflowRun, dict[str, Observed], dict[str, int], str | None]] = [
    ("split: 1 free on each of two Nodes takes no 2-GPU replica", OBSERVED_AB,
     run(pool=ON_A, replicas=1, gpu_class=A100, gpu_count=2), {"a": Observed(gpus_free={A100: nodes(1, 1)})}, {},
     SPLIT + "(a: 2 observed, at most 1 on one Node)"),
    ("split on one backend, 2 on one Node on the other: it goes there", OBSERVED_AB,
     run(replicas=1, gpu_class=A100, gpu_count=2),
     {"a": Observed(gpus_free={A100: nodes(1, 1)}), "b": Observed(gpus_free={A100: nodes(2)})}, {"b": 1}, None),
    ("split on both: named for each, the run asks for replicas on one Node", OBSERVED_AB,
     run(replicas=1, gpu_class=A100, gpu_count=2),
     {"a": Observed(gpus_free={A100: nodes(1, 1)}), "b": Observed(gpus_free={A100: nodes(1, 0, 1)})}, {},
     "needs 1 more replica of 2 GPUs of class nvidia.com/a100 on one Node: refs [a, b] has 4 free "
     "(a: 2 observed, at most 1 on one Node, b: 2 observed, at most 1 on one Node)"),
    ("mixed: Nodes of 2, 1 and 1 free take four 1-GPU replicas", OBSERVED_AB,
     run(pool=ON_A, replicas=4, **GPU_RUN), {"a": Observed(gpus_free={A100: nodes(2, 1, 1)})}, {"a": 4}, None),
    ("mixed: Nodes of 2, 1 and 1 free take one 2-GPU replica, not two", OBSERVED_AB,
     run(pool=ON_A, replicas=2, gpu_class=A100, gpu_count=2), {"a": Observed(gpus_free={A100: nodes(1, 2, 1)})},
     {"a": 1}, SPLIT + "(a: 2 observed, at most 1 on one Node)"),
    ("a replica takes its GPUs from one Node: 3 and 1 free take one 2-GPU replica, not two", OBSERVED_AB,
     run(pool=ON_A, replicas=2, gpu_class=A100, gpu_count=2), {"a": Observed(gpus_free={A100: nodes(3, 1)})},
     {"a": 1}, SPLIT + "(a: 2 observed, at most 1 on one Node)"),
    ("3 and 2 free take two 2-GPU replicas, one on each Node", OBSERVED_AB,
     run(pool=ON_A, replicas=2, gpu_class=A100, gpu_count=2), {"a": Observed(gpus_free={A100: nodes(3, 2)})},
     {"a": 2}, None),
    ("declared room but split observed GPUs: split named", by_name(backend("a", gpus={A100: 8})),
     run(pool=ON_A, replicas=1, gpu_class=A100, gpu_count=2), {"a": Observed(gpus_free={A100: nodes(1, 1)})}, {},
     SPLIT + "(a: 2 of 8 observed, at most 1 on one Node)"),
    ("none free on any Node: the wording of a plain shortage", OBSERVED_AB,
     run(pool=ON_A, replicas=1, gpu_class=A100, gpu_count=2), {"a": Observed(gpus_free={A100: nodes(0, 0)})}, {},
     "needs 2 more GPUs of class nvidia.com/a100 (2 on one backend for each of 1 replica): a has 0 free "
     "(a: 0 observed)"),
    ("no Node at all: the same", OBSERVED_AB, run(pool=ON_A, replicas=1, **GPU_RUN),
     {"a": Observed(gpus_free={A100: nodes()})}, {}, "needs 1 more GPU of class nvidia.com/a100: a has 0 free (a: 0 observed)"),
]


@pytest.mark.parametrize(("backends", "the_run", "observed", "expected", "missing"),
                         [case[1:] for case in NODE_CASES], ids=[case[0] for case in NODE_CASES])
def test_place_by_the_free_gpus_of_each_node(backends: dict[str, PlntBackend], the_run: WorkflowRun,
                                             observed: dict[str, Observed], expected: dict[str, int],
                                             missing: str | None) -> None:
    placement = place(the_run, backends, {}, observed)
    assert placement.counts() == expected
    assert placement.missing == missing


def test_a_replica_s_reason_says_when_the_observed_gpus_are_split() -> None:
    """3 and 1 free: 4 summed, but a 2-GPU replica fits on one Node only; after it, 1 and 1 are left."""
    placement = place(run(pool=ON_A, replicas=2, gpu_class=A100, gpu_count=2), OBSERVED_AB, {},
                      {"a": Observed(gpus_free={A100: nodes(3, 1)})})
    assert placement.lines() == [
        "replica 1 -> a: 4 (observed) GPUs of class nvidia.com/a100 free, at most 3 on one Node, 0 in flight",
        "cannot be placed: " + SPLIT + "(a: 2 observed, at most 1 on one Node)"]
    assert [replica.node for replica in placement.replicas] == [0]


def test_place_all_new_replicas_of_runs_placed_before_take_their_nodes_gpus() -> None:
    """The reading counts running pods only: the GPUs the new replicas of a run placed earlier in the
    same decision take from a Node are not free for the next run."""
    observed = {"a": Observed(gpus_free={A100: nodes(2, 1)}), "b": Observed(gpus_free={A100: nodes(1, 1)})}
    two = {"gpu_class": A100, "gpu_count": 2}
    placements = place_all([run("aa", **two), run("zz", **two)], OBSERVED_AB, {}, observed)
    assert placements["default/aa"].counts() == {"a": 1}
    assert placements["default/zz"].missing == (
        "needs 1 more replica of 2 GPUs of class nvidia.com/a100 on one Node: refs [a, b] has 3 free "
        "(a: 1 observed, b: 2 observed, at most 1 on one Node)")


def test_place_all_a_small_replica_takes_the_smallest_hole_so_a_larger_one_still_fits() -> None:
    """Nodes of 2 and 1 free: the 1-GPU run (first by key) takes the Node of 1, the 2-GPU run the
    Node of 2. Taking the first Node with room would leave 1 and 1, and the 2-GPU run unplaced."""
    observed = {"a": Observed(gpus_free={A100: nodes(2, 1)})}
    placements = place_all([run("aa", pool=ON_A, **GPU_RUN), run("zz", pool=ON_A, gpu_class=A100, gpu_count=2)],
                           OBSERVED_AB, {}, observed)
    assert [r.node for r in placements["default/aa"].replicas] == [1]
    assert [r.node for r in placements["default/zz"].replicas] == [0]
    assert placements["default/zz"].placed


def test_kept_replicas_take_no_node_their_pods_are_in_the_reading() -> None:
    """A running replica's GPUs are already subtracted from the reading: kept, it takes none again."""
    observed = {"a": Observed(gpus_free={A100: nodes(1)})}
    placements = place_all([run("aa", pool=ON_A, **GPU_RUN), run("zz", pool=ON_A, **GPU_RUN)], OBSERVED_AB,
                           {"default/aa": {"a": 1}}, observed)
    assert [r.node for r in placements["default/aa"].replicas] == [None]
    assert placements["default/zz"].counts() == {"a": 1}


# --- a run's own nodeSelector: only the observed Nodes it matches count for it ---------------------------

FAST, SLOW = {"gpu": "fast"}, {"gpu": "slow"}
# a: its fast Node full, 1 free on its slow Node; b: 1 free on its fast Node
FAST_FULL_ON_A = {"a": Observed(gpus_free={A100: (NodeFree("a-fast", 0, FAST), NodeFree("a-slow", 1, SLOW))}),
                  "b": Observed(gpus_free={A100: (NodeFree("b-fast", 1, FAST),)})}
ON_FAST = {"nodeSelector": FAST}

# (name, run, observed, expected replicas per backend, the reason of replica 1 or the whole missing message)
SELECTOR_CASES: list[tuple[str, WorkflowRun, dict[str, Observed], dict[str, int], str]] = [
    ("its selector matches only the full Node: not placed there, the free GPUs elsewhere named",
     run(pool={**ON_A, **ON_FAST}, **GPU_RUN), FAST_FULL_ON_A, {},
     "needs 1 more GPU of class nvidia.com/a100: a has 0 free (a: 0 observed on the Nodes matching the run's "
     "nodeSelector {gpu: fast}, 1 on other Nodes)"),
    ("the same run on a pool: it goes to the backend whose matching Node has room",
     run(pool={"refs": ["a", "b"], **ON_FAST}, **GPU_RUN), FAST_FULL_ON_A, {"b": 1},
     "b: 1 (observed) GPUs of class nvidia.com/a100 free on the Nodes matching the run's nodeSelector "
     "{gpu: fast}, 0 in flight"),
    ("without a selector the free GPU on a's other Node counts", run(pool=ON_A, **GPU_RUN), FAST_FULL_ON_A,
     {"a": 1}, "a: 1 (observed) GPUs of class nvidia.com/a100 free, 0 in flight"),
    ("a selector matching no Node: none free, said so",
     run(pool={**ON_A, "nodeSelector": {"gpu": "tpu"}}, **GPU_RUN), FAST_FULL_ON_A, {},
     "needs 1 more GPU of class nvidia.com/a100: a has 0 free (a: 0 observed, no Node matches the run's "
     "nodeSelector {gpu: tpu})"),
    ("two labels: a Node must carry both",
     run(pool={**ON_A, "nodeSelector": {"gpu": "slow", "zone": "z1"}}, **GPU_RUN),
     {"a": Observed(gpus_free={A100: (NodeFree("a-z1", 0, {"gpu": "slow", "zone": "z1"}),
                                     NodeFree("a-z2", 2, {"gpu": "slow", "zone": "z2"}))})}, {},
     "needs 1 more GPU of class nvidia.com/a100: a has 0 free (a: 0 observed on the Nodes matching the run's "
     "nodeSelector {gpu: slow, zone: z1}, 2 on other Nodes)"),
    ("declared capacity and observed: the observed part names the selector",
     run(pool={"refs": ["c"], **ON_FAST}, **GPU_RUN),
     {"c": Observed(gpus_free={A100: (NodeFree("c-fast", 2, FAST), NodeFree("c-slow", 3, SLOW))})}, {"c": 1},
     "c: 2 of 4 GPUs of class nvidia.com/a100 free, 2 observed free on the Nodes matching the run's nodeSelector "
     "{gpu: fast}, 3 on other Nodes, 0 in flight"),
]
SELECTOR_BACKENDS = by_name(backend("a", classes=[A100]), backend("b", classes=[A100]), backend("c", gpus={A100: 4}))


@pytest.mark.parametrize(("the_run", "observed", "expected", "words"), [case[1:] for case in SELECTOR_CASES],
                         ids=[case[0] for case in SELECTOR_CASES])
def test_a_run_s_node_selector_narrows_the_observed_nodes(the_run: WorkflowRun, observed: dict[str, Observed],
                                                          expected: dict[str, int], words: str) -> None:
    placement = place(the_run, SELECTOR_BACKENDS, {}, observed)
    assert placement.counts() == expected
    assert (str(placement.replicas[0]) if expected else placement.missing) == words


def test_place_all_runs_with_different_selectors_on_one_backend_each_take_their_own_node() -> None:
    """One free GPU on each of a's Nodes: the fast run takes the fast Node's, the slow run the slow
    Node's (its index in the reading, as Held counts it), and a third run of neither is left none."""
    observed = {"a": Observed(gpus_free={A100: (NodeFree("a-fast", 1, FAST), NodeFree("a-slow", 1, SLOW))})}
    placements = place_all([run("aa", pool={**ON_A, "nodeSelector": SLOW}, **GPU_RUN),
                            run("bb", pool={**ON_A, **ON_FAST}, **GPU_RUN), run("cc", pool=ON_A, **GPU_RUN)],
                           OBSERVED_AB, {}, observed)
    assert [r.node for r in placements["default/aa"].replicas] == [1]
    assert [r.node for r in placements["default/bb"].replicas] == [0]
    assert placements["default/cc"].missing == "needs 1 more GPU of class nvidia.com/a100: a has 0 free (a: 0 observed)"
    # Held counts each Node apart: the slow run placed first does not use up the fast Node.
    only_slow = place_all([run("aa", pool={**ON_A, "nodeSelector": SLOW}, **GPU_RUN),
                           run("bb", pool={**ON_A, "nodeSelector": SLOW}, **GPU_RUN)], OBSERVED_AB, {}, observed)
    assert only_slow["default/bb"].missing == (
        "needs 1 more GPU of class nvidia.com/a100: a has 0 free (a: 0 observed on the Nodes matching the run's "
        "nodeSelector {gpu: slow}, 1 on other Nodes)")


def test_gpu_backends_are_the_members_of_pools_of_runs_asking_for_gpus() -> None:
    backends = by_name(backend("a", classes=[A100]), backend("b", classes=[A100]), backend("c", classes=[A100]))
    gpu = run("gpu", pool={"refs": ["a", "b"]}, **GPU_RUN)
    cpu = run("cpu", pool={"refs": ["c"]})
    assert list(gpu_backends(SpecSet(workflow_runs={gpu.key: gpu, cpu.key: cpu}, backends=backends))) == ["a", "b"]
    assert gpu_backends(SpecSet(workflow_runs={cpu.key: cpu}, backends=backends)) == {}


def test_with_gpu_readings_keeps_the_load_and_marks_an_unknown_reading() -> None:
    merged = with_gpu_readings({"a": Observed(in_flight=3)}, {"a": {A100: nodes(2, 0)}, "b": "no answer within 15s"})
    assert merged == {"a": Observed(in_flight=3, gpus_free={A100: nodes(2, 0)}),
                      "b": Observed(gpus_unknown="no answer within 15s")}
