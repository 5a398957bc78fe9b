"""Backend pools in specs: `backend: {refs: [...]}` or `{selector: {matchLabels: ...}}` instead of one
`cluster`, and a PlntBackend's declared `capacity`; each problem names its file, line and field."""

from __future__ import annotations

from pathlib import Path

from plnt.core.specs.loader import Problem, load_directory
from plnt.core.specs.models import BackendPlacement, WorkflowRun

BACKENDS = """\
apiVersion: plnt.work/v1
kind: PlntBackend
metadata: {name: east, labels: {pool: agents, region: east}}
spec:
  type: local
  capacity: {replicas: 2}
---
apiVersion: plnt.work/v1
kind: PlntBackend
metadata: {name: west, labels: {pool: agents, region: west}}
spec:
  type: local
  capacity: {replicas: 1}
"""

RUN = """\
apiVersion: plnt.work/v1
kind: WorkflowRun
metadata: {name: review-responder}
spec:
  workflow: {ref: review-responder@1.2.0, registry: "file:registry"}
  backend: BACKEND
"""


def load(tmp_path: Path, backend: str, backends: str = BACKENDS) -> tuple[dict[str, WorkflowRun], list[Problem]]:
    (tmp_path / "backends.yaml").write_text(backends)
    (tmp_path / "runs.yaml").write_text(RUN.replace("BACKEND", backend))
    specs, problems = load_directory(tmp_path)
    return specs.workflow_runs, problems


def test_a_pool_by_refs_loads(tmp_path: Path) -> None:
    runs, problems = load(tmp_path, "{refs: [east, west]}")
    assert problems == []
    assert runs["default/review-responder"].spec.backend.refs == ["east", "west"]


def test_a_pool_by_selector_loads_and_names_its_members(tmp_path: Path) -> None:
    runs, problems = load(tmp_path, "{selector: {matchLabels: {pool: agents}}}")
    assert problems == []
    placement = runs["default/review-responder"].spec.backend
    assert placement.pooled
    specs, _ = load_directory(tmp_path)
    assert placement.members(specs.backends) == ["east", "west"]


def test_exactly_one_of_cluster_refs_selector(tmp_path: Path) -> None:
    _, problems = load(tmp_path, "{cluster: east, refs: [west]}")
    assert [(p.file, p.line, p.field) for p in problems] == [("runs.yaml", 6, "spec.backend")]
    assert "give exactly one of cluster (one PlntBackend), refs (a list of them) or selector" in problems[0].message
    assert "this gives cluster and refs" in problems[0].message
    _, problems = load(tmp_path, "{gpuCount: 0}")
    assert "this gives none" in problems[0].message


def test_a_ref_to_a_missing_backend_names_its_index(tmp_path: Path) -> None:
    _, problems = load(tmp_path, "\n    refs: [east, north]")
    assert [(p.file, p.line, p.field) for p in problems] == [("runs.yaml", 7, "spec.backend.refs[1]")]
    assert problems[0].message == ("unknown backend 'north'; declare a PlntBackend named 'north' or use one of: "
                                   "east, west")


def test_a_selector_matching_none_lists_the_labels_there_are(tmp_path: Path) -> None:
    _, problems = load(tmp_path, "\n    selector:\n      matchLabels: {pool: gpus}")
    assert [(p.file, p.line, p.field) for p in problems] == [("runs.yaml", 8, "spec.backend.selector.matchLabels")]
    assert problems[0].message == (
        "selects no PlntBackend (backends and their labels: east {pool: agents, region: east}; west {pool: agents, "
        "region: west}); label a backend with these labels (metadata.labels) or change the selector")


def test_a_ref_listed_twice(tmp_path: Path) -> None:
    _, problems = load(tmp_path, "{refs: [east, east]}")
    assert "refs names east more than once" in problems[0].message


def test_a_pool_none_of_whose_members_offers_the_gpu_class(tmp_path: Path) -> None:
    _, problems = load(tmp_path, "{refs: [east, west], gpuClass: a100, gpuCount: 1}")
    assert [p.field for p in problems] == ["spec.backend.gpuClass"]
    assert problems[0].message.startswith("no backend of the pool (refs [east, west]) can run it: backend 'east' has "
                                          "no GPU class 'a100'")


def test_a_pool_where_one_member_offers_the_gpu_class_loads(tmp_path: Path) -> None:
    backends = BACKENDS.replace("type: local\n  capacity: {replicas: 2}",
                                "type: local\n  gpuClasses: [a100]\n  capacity: {gpus: {a100: 1}}")
    _, problems = load(tmp_path, "{refs: [east, west], gpuClass: a100, gpuCount: 1}", backends)
    assert problems == []


def test_capacity_gpus_of_a_class_the_backend_does_not_offer(tmp_path: Path) -> None:
    backends = BACKENDS.replace("capacity: {replicas: 2}", "capacity: {gpus: {h100: 4}}")
    _, problems = load(tmp_path, "{cluster: east}", backends)
    assert (problems[0].file, problems[0].field) == ("backends.yaml", "spec")
    assert "capacity.gpus names h100, which spec.gpuClasses does not list" in problems[0].message


def test_one_backend_keeps_the_fingerprint_it_had_before_pools() -> None:
    """The pool fields are left out of the dump when unset: a fingerprint is a digest of the dump."""
    dumped = BackendPlacement(cluster="local").model_dump(mode="json", by_alias=True)
    assert dumped == {"cluster": "local", "gpuClass": None, "gpuCount": 0, "nodeSelector": {}, "tolerations": []}
    assert BackendPlacement.model_validate(dumped) == BackendPlacement(cluster="local")


def test_autoscaling_on_a_pool_is_refused_naming_the_field(tmp_path: Path) -> None:
    """Placement spreads a fixed count over a pool; an autoscaler under it would fight it, so the loader
    refuses the pair until they share one count."""
    (tmp_path / "backends.yaml").write_text(BACKENDS)
    (tmp_path / "runs.yaml").write_text(RUN.replace("BACKEND", "{refs: [east, west]}")
                                        + "  replicas: {min: 1, max: 3}\n  autoscaling: {targetInFlight: 2}\n")
    _, problems = load_directory(tmp_path)
    assert [(p.field, p.line) for p in problems] == [("spec.autoscaling", 8)]
    assert "not available on a pool" in problems[0].message and "cluster" in problems[0].message
