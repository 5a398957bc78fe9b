"""The layering rules of docs/architecture.md, kept by reading the imports (tools/import_graph.py,
ast only: nothing of plnt is run). Each rule fails on a forbidden import, naming it.

Where today's code still breaks a rule, the exceptions are listed here by name (KNOWN_*): a new
one fails the test, and one that is gone must be taken off the list (the test says so), so the
lists only shrink.
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

PURE_FOR_THE_PLAN = {"plnt.core.specs.models", "plnt.core.status", "plnt.reconciler.state"}
ROLES = ("plnt.reconciler", "plnt.gateway", "plnt.runner")
KNOWN_CIRCLES = [
]


def edges_from(prefix: str) -> set[tuple[str, str]]:
    return {(source, target) for source, targets in EDGES.items() if source == prefix or source.startswith(prefix + ".")
            for target in targets}


def test_the_graph_is_read() -> None:
    """A guard for the rules below: an empty graph would pass them all."""
    assert len(EDGES) > 80 and sum(len(t) for t in EDGES.values()) > 300
    assert "plnt.reconciler.saga.workflow" in EDGES["plnt.reconciler.saga.activities"] or \
        "plnt.reconciler.saga.io" in EDGES["plnt.reconciler.saga.activities"]


def test_core_imports_no_role() -> None:
    """plnt.core holds the contracts under the roles: it depends on none of them."""
    forbidden = sorted(f"{s} -> {t}" for s, t in edges_from("plnt.core") if t.startswith(ROLES))
    assert not forbidden, "plnt.core must not import the roles: " + "; ".join(forbidden)


@pytest.mark.parametrize("role", ROLES)
def test_roles_import_the_core_not_each_other(role: str) -> None:
    """The gateway, the runner and the control plane share contracts (plnt.core), not internals; only
    the composition roots (plnt up, each role's entry, the CLI) wire roles together."""
    others = tuple(r for r in ROLES if r != role)
    forbidden = sorted(f"{s} -> {t}" for s, t in edges_from(role)
                       if t.startswith(others) and not graph_tool.is_composition_root(s))
    assert not forbidden, f"{role} imports another role outside the composition roots: " + "; ".join(forbidden)


def test_the_runner_imports_no_control_plane_code() -> None:
    """The runner is the isolation boundary for recipe code: not even its entry imports the control plane."""
    found = sorted(f"{s} -> {t}" for s, t in edges_from("plnt.runner") if t.startswith("plnt.reconciler"))
    assert not found, f"the runner (recipe code's process) must not import control-plane code: {found}"


def test_the_composition_roots_are_where_they_are_said_to_be() -> None:
    """A guard for the rule above: every root it exempts exists (a renamed root would exempt nothing, or a
    module that is no root)."""
    for root in graph_tool.COMPOSITION_ROOTS:
        assert any(m == root or m.startswith(root + ".") for m in EDGES), root


def test_the_plan_is_pure() -> None:
    """The decision (plan/diff.py) imports data types only: no driver, no Temporal, no HTTP, no git."""
    imported = {t for s, t in edges_from("plnt.reconciler.plan.diff")}
    new = sorted(imported - PURE_FOR_THE_PLAN)
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


@pytest.mark.parametrize("folder", ["source", "recipes", "plan", "saga", "drivers", "control", "review", "cli"])
def test_each_step_of_the_data_flow_is_a_package_that_says_what_it_is(folder: str) -> None:
    init = ROOT / "reconciler" / folder / "__init__.py"
    assert init.is_file() and init.read_text().startswith('"""'), f"reconciler/{folder}/__init__.py says what it holds"
    flat = sorted(p.name for p in (ROOT / "reconciler").glob("*.py"))
    assert len(flat) <= 10, f"reconciler/ holds composition roots and small shared modules only, not {flat}"
