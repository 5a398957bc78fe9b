"""core/specs/edit.py: the minimal textual edits of plnt scale and plnt rollback, table-tested on spec
texts as people write them (comments, flow and block style, quoting, several documents a file). Each
case states the whole expected text: anything else changed is a failure."""

from __future__ import annotations

import pytest
from plnt.core.specs.edit import REMOVE, EditRefused, edit_resource, find_resource, render

HEAD = """\
# Answers customer reviews.
apiVersion: plnt.work/v1
kind: WorkflowRun
metadata:
  name: review-responder
  namespace: default
spec:
  workflow:
    ref: review-responder@1.2.0   # the version
    # pinned
    integrityHash: "sha256:%s"
    registry: file:registry
  backend:
    cluster: local
""" % ("a" * 64)

MIN = ("spec", "replicas", "min")
MAX = ("spec", "replicas", "max")
REF = ("spec", "workflow", "ref")
HASH = ("spec", "workflow", "integrityHash")

CASES = {
    "block replicas: one value": (
        HEAD + "  replicas:\n    min: 1  # keep one warm\n    max: 4\n",
        {MIN: 2},
        HEAD + "  replicas:\n    min: 2  # keep one warm\n    max: 4\n"),
    "flow replicas: both values": (
        HEAD + "  replicas: {min: 1, max: 1}\n",
        {MIN: 3, MAX: 3},
        HEAD + "  replicas: {min: 3, max: 3}\n"),
    "flow replicas without min: added first": (
        HEAD + "  replicas: {max: 3}\n",
        {MIN: 2},
        HEAD + "  replicas: {min: 2, max: 3}\n"),
    "block replicas without min: added on a line of its own": (
        HEAD + "  replicas:\n    max: 5\n",
        {MIN: 2},
        HEAD + "  replicas:\n    min: 2\n    max: 5\n"),
    "no replicas: added to spec, in flow style": (
        HEAD,
        {MIN: 2},
        HEAD.replace("spec:\n  workflow:", "spec:\n  replicas: {min: 2}\n  workflow:")),
    "a new version, its pin kept quoted, comments kept": (
        HEAD,
        {REF: "review-responder@1.1.0", HASH: "sha256:" + "b" * 64},
        HEAD.replace("@1.2.0", "@1.1.0").replace("a" * 64, "b" * 64)),
    "a pin removed with its line": (
        HEAD,
        {REF: "review-responder@1.1.0", HASH: REMOVE},
        HEAD.replace("@1.2.0", "@1.1.0").replace('    integrityHash: "sha256:%s"\n' % ("a" * 64), "")),
    "a value that is already so: nothing changes": (
        HEAD,
        {REF: "review-responder@1.2.0"},
        HEAD),
}


@pytest.mark.parametrize("case", CASES)
def test_an_edit_changes_only_its_values(case: str) -> None:
    before, changes, after = CASES[case]
    assert edit_resource(before, "run.yaml", "WorkflowRun", "default", "review-responder", changes) == after


def test_the_right_document_of_several_and_a_namespace_by_default() -> None:
    other = HEAD.replace("review-responder", "other").replace("  namespace: default\n", "")
    text = other + "---\n" + HEAD.replace("  namespace: default\n", "")
    edited = edit_resource(text, "runs.yaml", "WorkflowRun", "default", "review-responder", {MIN: 2})
    first, second = edited.split("---\n")
    assert first == other
    assert second == HEAD.replace("  namespace: default\n", "").replace("spec:\n  workflow:",
                                                                      "spec:\n  replicas: {min: 2}\n  workflow:")
    assert find_resource(text, "runs.yaml", "WorkflowRun", "default", "other")
    assert not find_resource(text, "runs.yaml", "WorkflowRun", "team-a", "other")
    assert not find_resource(text, "runs.yaml", "ModelDeployment", "default", "other")


REFUSED = {
    "no such resource": (HEAD, "missing", {MIN: 2}, "holds no WorkflowRun default/missing"),
    "an invalid result": (HEAD + "  replicas: {min: 1, max: 2}\n", "review-responder", {MIN: 3},
                          "leaves run.yaml invalid"),
    "not a single value": (HEAD + "  replicas: {min: [1], max: 2}\n", "review-responder", {MIN: 3},
                           "spec.replicas.min is not a single value"),
}


@pytest.mark.parametrize("case", REFUSED)
def test_edits_that_are_refused_say_why(case: str) -> None:
    before, name, changes, message = REFUSED[case]
    with pytest.raises(EditRefused) as refused:
        edit_resource(before, "run.yaml", "WorkflowRun", "default", name, changes)
    assert message in str(refused.value)


def test_removing_a_required_field_is_refused_by_the_loader() -> None:
    with pytest.raises(EditRefused, match="leaves run.yaml invalid"):
        edit_resource(HEAD, "run.yaml", "WorkflowRun", "default", "review-responder",
                      {("spec", "workflow", "registry"): REMOVE})


@pytest.mark.parametrize(("value", "style", "text"), [
    ("review-responder@1.1.0", None, "review-responder@1.1.0"), ("sha256:" + "c" * 64, '"', '"sha256:' + "c" * 64 + '"'),
    ("1.0", None, '"1.0"'), ("yes", None, '"yes"'), ("a # b", None, '"a # b"'), ("x", "'", "'x'"), (3, None, "3"),
])
def test_render_reads_back_as_the_value(value: str | int, style: str | None, text: str) -> None:
    assert render(value, style) == text
