"""The layering rules of docs/architecture.md, kept by reading the imports (tools/import_graph.py,
ast only: nothing of plnt is run). Each rule fails on a forbidden import, naming it.

Where today's code still breaks a rule, the exceptions are listed here by name (KNOWN_*): a new
one fails the test, and one that is gone must be taken off the list (the test says so), so the
lists only shrink. They are the work left of the restructuring (issue "One house that shows the
data flow"): the shared contracts move into one package under the roles.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load_graph_tool():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("import_graph", ROOT / "tools" / "import_graph.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["import_graph"] = module
    spec.loader.exec_module(module)
    return module


graph_tool = _load_graph_tool()
EDGES: dict[str, set[str]] = graph_tool.graph(ROOT)

# The runner (the isolation boundary for recipe code) takes the recipe's spec models from the
# control plane's package: to move into the shared contracts.
KNOWN_RUNNER_TO_CONTROL_PLANE = {
    ("plnt.runner.cache", "plnt.reconciler.specs.models"),
    ("plnt.runner.engine", "plnt.reconciler.specs.models"),
    ("plnt.runner.recipe", "plnt.reconciler.specs.models"),
    ("plnt.runner.recipe", "plnt.reconciler.specs.loader"),
}
# The plan's status types live beside the status store (which persists): to be split apart.
KNOWN_PLAN_IMPORTS = {"plnt.reconciler.control.status"}
PURE_FOR_THE_PLAN = {"plnt.reconciler.specs.models", "plnt.reconciler.state"}
KNOWN_CIRCLES = [
    ["plnt.gateway.role", "plnt.gateway.workers"],
    ["plnt.gateway.telemetry", "plnt.gateway.telemetry_temporal"],
    ["plnt.reconciler.drivers.local", "plnt.reconciler.drivers.zygote"],
]


def edges_from(prefix: str) -> set[tuple[str, str]]:
    return {(source, target) for source, targets in EDGES.items() if source == prefix or source.startswith(prefix + ".")
            for target in targets}


def test_the_graph_is_read() -> None:
    """A guard for the rules below: an empty graph would pass them all."""
    assert len(EDGES) > 80 and sum(len(t) for t in EDGES.values()) > 300
    assert "plnt.reconciler.saga.workflow" in EDGES["plnt.reconciler.saga.activities"] or \
        "plnt.reconciler.saga.io" in EDGES["plnt.reconciler.saga.activities"]


def test_the_gateway_imports_nothing_of_the_control_plane_or_the_runner() -> None:
    forbidden = sorted(f"{s} -> {t}" for s, t in edges_from("plnt.gateway")
                       if t.startswith(("plnt.reconciler", "plnt.runner")))
    assert not forbidden, "the gateway depends on shared contracts only: " + "; ".join(forbidden)


def test_the_runner_imports_no_control_plane_code() -> None:
    found = {(s, t) for s, t in edges_from("plnt.runner") if t.startswith("plnt.reconciler")}
    new = sorted(found - KNOWN_RUNNER_TO_CONTROL_PLANE)
    assert not new, f"the runner (recipe code's process) must not import control-plane code: {new}"
    gone = sorted(KNOWN_RUNNER_TO_CONTROL_PLANE - found)
    assert not gone, f"no longer imported: take {gone} off KNOWN_RUNNER_TO_CONTROL_PLANE"


def test_the_plan_is_pure() -> None:
    """The decision (plan/diff.py) imports data types only: no driver, no Temporal, no HTTP, no git."""
    imported = {t for s, t in edges_from("plnt.reconciler.plan.diff")}
    new = sorted(imported - PURE_FOR_THE_PLAN - KNOWN_PLAN_IMPORTS)
    assert not new, f"plan/diff.py must stay a pure function of data: it imports {new}"
    source = (ROOT / "reconciler" / "plan" / "diff.py").read_text()
    for module in ("asyncio", "httpx", "subprocess", "socket", "temporalio", "git", "boto3", "kubernetes"):
        assert f"import {module}" not in source and f"from {module} " not in source, module


def test_no_new_circles() -> None:
    found = graph_tool.circles(EDGES)
    new = [c for c in found if c not in KNOWN_CIRCLES]
    assert not new, f"modules that import each other (break the circle, or share a contract below both): {new}"
    gone = [c for c in KNOWN_CIRCLES if c not in found]
    assert not gone, f"these circles are gone: take them off KNOWN_CIRCLES: {gone}"


@pytest.mark.parametrize("folder", ["source", "specs", "recipes", "plan", "saga", "drivers", "control", "review", "cli"])
def test_each_step_of_the_data_flow_is_a_package_that_says_what_it_is(folder: str) -> None:
    init = ROOT / "reconciler" / folder / "__init__.py"
    assert init.is_file() and init.read_text().startswith('"""'), f"reconciler/{folder}/__init__.py says what it holds"
    flat = sorted(p.name for p in (ROOT / "reconciler").glob("*.py"))
    assert len(flat) <= 10, f"reconciler/ holds composition roots and small shared modules only, not {flat}"
