"""dependsOn between WorkflowRuns and ModelDeployments of a namespace: what loads, and each mistake at
its file, line and field."""

from __future__ import annotations

from pathlib import Path

from plnt.core.specs.loader import load_directory

from tests.core.test_loader import BACKEND, RUN, write


def run(name: str, depends_on: str = "", namespace: str = "default") -> str:
    text = RUN.replace("name: review-responder, namespace: default", f"name: {name}, namespace: {namespace}")
    return text + (f"  dependsOn: [{depends_on}]\n" if depends_on else "")


def load(tmp_path: Path, **files: str) -> list[tuple[str, int, str, str]]:
    write(tmp_path, "backend.yaml", BACKEND)
    for name, text in files.items():
        write(tmp_path, f"{name}.yaml", text)
    _, problems = load_directory(tmp_path)
    return [(p.file, p.line, p.field, p.message) for p in problems]


def test_dependencies_load(tmp_path: Path) -> None:
    assert load(tmp_path, a=run("a", "b, c"), b=run("b", "c"), c=run("c")) == []
    specs, _ = load_directory(tmp_path)
    assert specs.workflow_runs["default/a"].spec.depends_on == ["b", "c"]


def test_an_unknown_or_other_namespaces_name(tmp_path: Path) -> None:
    found = load(tmp_path, a=run("a", "b, nope"), b=run("b", namespace="team-b"))
    assert found == [("a.yaml", 10, "spec.dependsOn[0]", "no WorkflowRun or ModelDeployment named 'b' in namespace "
                      "default (known: none); declare it or remove it from dependsOn"),
                     ("a.yaml", 10, "spec.dependsOn[1]", "no WorkflowRun or ModelDeployment named 'nope' in namespace "
                      "default (known: none); declare it or remove it from dependsOn")]


def test_itself_and_a_cycle(tmp_path: Path) -> None:
    found = load(tmp_path, a=run("a", "a"), b=run("b", "c"), c=run("c", "d"), d=run("d", "b"))
    assert ("a.yaml", 10, "spec.dependsOn[0]", "a depends on itself; remove it from dependsOn") in found
    cycles = [f for f in found if f[3].startswith("dependency cycle")]
    assert [(f[0], f[2]) for f in cycles] == [("b.yaml", "spec.dependsOn"), ("c.yaml", "spec.dependsOn"),
                                              ("d.yaml", "spec.dependsOn")]
    assert cycles[0][3] == "dependency cycle: b -> c -> d -> b; remove one of these dependencies"
