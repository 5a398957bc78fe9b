"""Pure decisions of previews (reconciler/review/previews.py, core/routes.py): which ref is which pull
request, preview naming and routing, what a pull request changes, what the forge is told. Table
tests on values; no I/O and no fakes (the WorkflowRuns are parsed from gitops-example)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from plnt.core.routes import PreviewNotFound, preview_name, preview_of, preview_target
from plnt.core.specs.models import WorkflowRun
from plnt.core.status import Phase, WorkflowRunStatus
from plnt.reconciler.review.previews import admitted, comment_body, context_of, forge_status, pr_number, previewed
from plnt.reconciler.saga.commit_specs import as_preview
from plnt.reconciler.saga.io import SagaRef
from pydantic import ValidationError

EXAMPLE = Path(__file__).resolve().parents[3] / "gitops-example" / "workflowruns" / "review-responder.yaml"
SHA = "a" * 40


def run(version: str = "1.2.0", name: str = "review-responder") -> WorkflowRun:
    raw = yaml.safe_load(EXAMPLE.read_text())
    raw["metadata"]["name"] = name
    raw["spec"]["workflow"]["ref"] = f"review-responder@{version}"
    return WorkflowRun.model_validate(raw)


@pytest.mark.parametrize(("ref", "globs", "expected"), [
    ("refs/pull/7/head", ("refs/pull/*/head",), 7),
    ("refs/pull/123/head", ("refs/pull/*/head",), 123),
    ("refs/merge-requests/5/head", ("refs/pull/*/head", "refs/merge-requests/*/head"), 5),
    ("refs/pull/7/merge", ("refs/pull/*/head",), None),          # the merge ref is not the head
    ("refs/pull/abc/head", ("refs/pull/*/head",), None),         # `*` must be a number
    ("refs/pull/07/head", ("refs/pull/*/head",), None),          # no leading zero: one name per PR
    ("refs/pull//head", ("refs/pull/*/head",), None),
    ("refs/heads/preview-12", ("refs/heads/preview-*",), 12),    # a branch glob naming the PR
    ("refs/heads/main", ("refs/heads/preview-*",), None),
    ("refs/pull/7/head", ("refs/pull/7/head",), None),           # no `*`: no PR number
])
def test_pr_number_of_a_ref(ref: str, globs: tuple[str, ...], expected: int | None) -> None:
    assert pr_number(ref, globs) == expected


@pytest.mark.parametrize(("name", "expected"), [
    ("review-responder--pr7", ("review-responder", 7)),
    ("a--pr1", ("a", 1)),
    ("review-responder", None),
    ("review-responder-pr7", None),
    ("--pr7", None),
    ("x--pr0", None),
    ("x--pr07", None),
])
def test_preview_of_a_name(name: str, expected: tuple[str, int] | None) -> None:
    assert preview_of(name) == expected


def test_preview_name_round_trips_and_refuses_a_name_too_long() -> None:
    assert preview_name("review-responder", 7) == "review-responder--pr7"
    assert preview_of(preview_name("review-responder", 7)) == ("review-responder", 7)
    with pytest.raises(ValueError, match="too long to preview"):
        preview_name("x" * 60, 1234)


@pytest.mark.parametrize(("name", "header", "expected"), [
    ("review-responder", None, "review-responder"),
    ("review-responder", b"7", "review-responder--pr7"),
    ("review-responder", b" 12 ", "review-responder--pr12"),
    ("review-responder--pr7", None, PreviewNotFound),   # no regular traffic to a preview
    ("review-responder", b"seven", PreviewNotFound),
    ("review-responder", b"0", PreviewNotFound),
    ("review-responder", b"-3", PreviewNotFound),
    ("review-responder", "٣".encode(), PreviewNotFound),  # a non-ASCII digit
])
def test_preview_target(name: str, header: bytes | None, expected: str | type[Exception]) -> None:
    if isinstance(expected, str):
        assert preview_target(name, header) == expected
    else:
        with pytest.raises(expected):
            preview_target(name, header)


def test_what_a_pull_request_previews() -> None:
    base = {"default/review-responder": run("1.2.0"), "default/other": run("1.2.0", "other")}
    assert previewed(base, dict(base)) == []
    assert previewed(base, {**base, "default/review-responder": run("1.3.0")}) == ["default/review-responder"]
    assert previewed(base, {**base, "default/new": run("1.2.0", "new")}) == ["default/new"]
    assert previewed(base, {"default/other": run("1.2.0", "other")}) == []  # a removal previews nothing


def test_a_preview_keeps_the_spec_under_its_own_name() -> None:
    original = run("1.3.0")
    preview = as_preview(original, 7)
    assert preview.key == "default/review-responder--pr7"
    assert preview.fingerprint() == original.fingerprint()
    assert original.metadata.name == "review-responder"


def test_a_preview_saga_names_its_release() -> None:
    ref = SagaRef(action="deploy", namespace="default", name="review-responder--pr7", commit=SHA, preview=7)
    assert ref.run_name == "review-responder" and ref.key == "default/review-responder--pr7"
    assert SagaRef(action="deploy", namespace="default", name="review-responder--pr7", commit=SHA).run_name \
        == "review-responder--pr7"  # without `preview` the name is taken as it is
    for name, pr in (("review-responder", 7), ("review-responder--pr8", 7)):
        with pytest.raises(ValidationError, match="preview saga"):
            SagaRef(action="deploy", namespace="default", name=name, commit=SHA, preview=pr)


def status(phase: Phase, **fields: object) -> WorkflowRunStatus:
    return WorkflowRunStatus(namespace="default", name="review-responder--pr7", phase=phase, **fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(("row", "state", "says"), [
    (status(Phase.PENDING, message="preview of #7: install"), "pending", "Pending"),
    (status(Phase.CANARY, message="smoke-testing canary 1.3.0"), "pending", "smoke-testing"),
    (status(Phase.READY, version="1.3.0", smoke_test={"reason": "p95 120ms <= 2500ms; errors 0% <= 1%"}),
     "success", "p95 120ms"),
    (status(Phase.ROLLED_BACK, version="1.3.0", last_error="error rate 100% > 1%"), "failure",
     "error rate 100% > 1%; 1.3.0 keeps serving"),
    (status(Phase.FAILED, message="VerificationFailed: unsigned"), "failure", "unsigned"),
])
def test_forge_status_of_a_preview(row: WorkflowRunStatus, state: str, says: str) -> None:
    got_state, description = forge_status(row, 7)
    assert got_state == state and says in description


def test_comment_lists_previews_and_how_to_call_them() -> None:
    rows = [status(Phase.READY, version="1.3.0", message="1.3.0 promoted")]
    body = comment_body(7, rows, "http://gw:8000")
    assert "`default/review-responder`" in body and "**Ready**" in body
    assert "curl -H 'X-Plnt-Preview: 7'" in body and "http://gw:8000/workflows/review-responder/invoke" in body
    assert "Nothing is previewed" in comment_body(7, [], "http://gw", problem="commit abc is invalid")
    assert "changes no WorkflowRun" in comment_body(7, [], "http://gw")
    assert "removed" in comment_body(7, rows, "http://gw", removed="the pull request is closed")
    assert context_of("default", "review-responder") == "plnt/preview/default/review-responder"


@pytest.mark.parametrize(("open_pulls", "previewing", "limit", "expected"), [
    ([1, 2, 3], set(), 10, [1, 2, 3]),
    ([5, 3, 9], set(), 2, [3, 5]),            # the oldest first
    ([5, 3, 9], {9}, 2, [3, 9]),              # a running preview keeps its place
    ([5, 3, 9], {9, 5, 3}, 2, [3, 5]),
    ([4], set(), 0, []),
])
def test_pull_requests_admitted_under_the_limit(open_pulls: list[int], previewing: set[int], limit: int,
                                                expected: list[int]) -> None:
    assert admitted(open_pulls, previewing, limit) == expected
