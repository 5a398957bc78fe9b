"""ModelDeployment.spec.fallback: what loads, each mistake at its file, line and field, and a fallback change
that rolls nothing out (it is not part of the release's fingerprint)."""

from __future__ import annotations

from pathlib import Path

from plnt.core.specs.loader import load_directory

from tests.core.test_loader import BACKEND, MODEL, POLICY, write


def model(name: str, fallback: str | None = None, namespace: str = "default") -> str:
    text = MODEL.replace("metadata: {name: smollm2}", f"metadata: {{name: {name}, namespace: {namespace}}}")
    return text + (f"  fallback: {fallback}\n" if fallback else "")


def load(tmp_path: Path, **files: str) -> list[tuple[str, int, str, str]]:
    write(tmp_path, "backend.yaml", BACKEND + "---\n" + POLICY)
    for name, text in files.items():
        write(tmp_path, f"{name}.yaml", text)
    _, problems = load_directory(tmp_path)
    return [(p.file, p.line, p.field, p.message) for p in problems]


def test_a_fallback_loads(tmp_path: Path) -> None:
    assert load(tmp_path, big=model("big", "small"), small=model("small")) == []
    specs, _ = load_directory(tmp_path)
    assert specs.model_deployments["default/big"].spec.fallback == "small"
    assert specs.model_deployments["default/small"].spec.fallback is None


def test_itself_unknown_another_namespace_and_a_cycle(tmp_path: Path) -> None:
    found = load(tmp_path, a=model("a", "a"), b=model("b", "nope"), c=model("c", "other"),
                 other=model("other", namespace="team-b"), x=model("x", "y"), y=model("y", "z"), z=model("z", "x"))
    assert ("a.yaml", 8, "spec.fallback",
            "a names itself as its fallback; name another ModelDeployment or remove spec.fallback") in found
    assert ("b.yaml", 8, "spec.fallback", "no ModelDeployment named 'nope' in namespace default (known: a, c, x, y, "
            "z); declare it or remove spec.fallback") in found
    assert any(f[0] == "c.yaml" and "no ModelDeployment named 'other' in namespace default" in f[3] for f in found)
    cycles = [f for f in found if f[3].startswith("fallback cycle")]
    assert [(f[0], f[2]) for f in cycles] == [("x.yaml", "spec.fallback"), ("y.yaml", "spec.fallback"),
                                              ("z.yaml", "spec.fallback")]
    assert cycles[0][3] == "fallback cycle: x -> y -> z -> x; remove one of these fallbacks"
    assert len(found) == 6


def test_a_fallback_is_no_workflow_run(tmp_path: Path) -> None:
    from tests.core.test_loader import RUN

    found = load(tmp_path, a=model("a", "review-responder"), run=RUN)
    assert [(f[0], f[2]) for f in found] == [("a.yaml", "spec.fallback")]
    assert "no ModelDeployment named 'review-responder'" in found[0][3]


def test_changing_the_fallback_changes_no_release(tmp_path: Path) -> None:
    """The fingerprint (what the plan compares with the live release) leaves the fallback out: a commit that
    only adds or changes it rolls nothing out; the routes carry it to the gateways."""
    load(tmp_path, big=model("big"), small=model("small"), other=model("other"))
    before = load_directory(tmp_path)[0].model_deployments["default/big"]
    write(tmp_path, "big.yaml", model("big", "small"))
    after = load_directory(tmp_path)[0].model_deployments["default/big"]
    write(tmp_path, "big.yaml", model("big", "other"))
    changed = load_directory(tmp_path)[0].model_deployments["default/big"]
    assert before.fingerprint() == after.fingerprint() == changed.fingerprint()
    write(tmp_path, "big.yaml", model("big", "small").replace("contextLength: 1024", "contextLength: 2048"))
    assert load_directory(tmp_path)[0].model_deployments["default/big"].fingerprint() != before.fingerprint()
