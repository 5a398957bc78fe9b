"""The pure parts of the GitOps verbs (reconciler/cli/listing.py, run.py, gitops.py), table-tested:
what a `plnt list` line shows, how `plnt run` builds its request body. The verbs against a running
plnt are tests/e2e/test_verbs.py and tests/forge/test_verbs_pull_requests.py."""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest
import typer
from plnt.reconciler.cli.listing import replicas_text, table
from plnt.reconciler.cli.rollback import pick_version, promoted_versions, release_fields
from plnt.reconciler.cli.run import refused, request_body


@pytest.mark.parametrize(("replicas", "shown"), [
    (None, "-"), ({"min": 1, "max": None}, "1"), ({"min": 2, "max": 2}, "2"), ({"min": 1, "max": 3}, "1-3"),
    ({"min": 0, "max": 1}, "0-1"),
])
def test_replicas_cell(replicas: dict[str, Any] | None, shown: str) -> None:
    assert replicas_text(replicas) == shown


def _row(**fields: Any) -> dict[str, Any]:
    return {"name": "review-responder", "namespace": "default", "kind": "WorkflowRun", "phase": "Ready",
            "version": "1.2.0", "canaryVersion": None, "canaryPercent": 0, "backend": "local",
            "replicas": {"min": 1, "max": 1}, "preview": None, **fields}


@pytest.mark.parametrize(("row", "cells"), [
    (_row(), ["WorkflowRun", "default/review-responder", "Ready", "1.2.0", "-", "local", "1"]),
    (_row(phase="Canary", canaryVersion="1.4.0", canaryPercent=5),
     ["WorkflowRun", "default/review-responder", "Canary", "1.2.0", "1.4.0@5%", "local", "1"]),
    (_row(phase="Deploying", version=None, backend=None, replicas=None),
     ["WorkflowRun", "default/review-responder", "Deploying", "-", "-", "-", "-"]),
    (_row(name="review-responder--pr7", preview=7),
     ["WorkflowRun", "default/review-responder[PR#7]", "Ready", "1.2.0", "-", "local", "1"]),
    (_row(pin={"version": "1.2.0", "commit": "c" * 40}),
     ["WorkflowRun", "default/review-responder", "Ready", "1.2.0(pinned)", "-", "local", "1"]),
    (_row(kind="ModelDeployment", name="smollm2", version="1.0.0", replicas={"min": 2, "max": None}),
     ["ModelDeployment", "default/smollm2", "Ready", "1.0.0", "-", "local", "2"]),
])
def test_a_list_line(row: dict[str, Any], cells: list[str]) -> None:
    header, line = table([row])
    assert header.split() == ["KIND", "NAMESPACE/NAME", "PHASE", "STABLE", "CANARY", "BACKEND", "REPLICAS"]
    assert line.split() == cells


def test_list_lines_are_sorted_and_aligned() -> None:
    lines = table([_row(name="b"), _row(kind="ModelDeployment", name="m"), _row(name="a", namespace="team-x")])
    assert [line.split()[1] for line in lines[1:]] == ["default/m", "default/b", "team-x/a"]
    assert len({line.index(line.split()[2]) for line in lines}) == 1  # the PHASE column starts at one place


@pytest.mark.parametrize(("pairs", "from_file", "body"), [
    ([], {}, {}),
    (["review=Great service"], {}, {"review": "Great service"}),
    (["a=x=y", "b="], {}, {"a": "x=y", "b": ""}),  # the first = splits; an empty value is a value
    (["brand_voice=curt"], {"review": "r", "brand_voice": "warm", "n": 3}, {"review": "r", "brand_voice": "curt", "n": 3}),
])
def test_run_request_body(pairs: list[str], from_file: dict[str, Any], body: dict[str, Any]) -> None:
    assert request_body(pairs, from_file) == body


@pytest.mark.parametrize("pair", ["review", "=value", " =x"])
def test_run_refuses_an_input_without_a_key(pair: str) -> None:
    with pytest.raises(typer.Exit) as refused:
        request_body([pair], {})
    assert refused.value.exit_code == 2


def _rollout(version: str, phase: str | None, action: str = "deploy") -> dict[str, Any]:
    return {"version": version, "phase": phase, "action": action}


def test_promoted_versions_newest_first_each_once() -> None:
    rollouts = [_rollout("1.4.0", "RolledBack"), _rollout("1.3.0", "Ready"), _rollout("1.2.0", "Ready", "uninstall"),
                _rollout("1.2.0", "Ready"), _rollout("1.3.0", "Ready"), _rollout("1.1.0", None)]
    assert promoted_versions(rollouts) == ["1.3.0", "1.2.0"]
    assert promoted_versions({"error": {}}) == []


@pytest.mark.parametrize(("current", "to", "promoted", "picked"), [
    ("1.3.0", None, ["1.3.0", "1.2.0"], "1.2.0"),            # the one before the current
    ("1.4.0", None, ["1.2.0", "1.1.0"], "1.2.0"),            # 1.4.0 failed: back to what serves
    ("1.3.0", "1.1.0", ["1.3.0", "1.2.0", "1.1.0"], "1.1.0"),
    ("1.3.0", "0.9.0", None, "0.9.0"),                       # --force: not checked
])
def test_pick_version(current: str, to: str | None, promoted: list[str] | None, picked: str) -> None:
    assert pick_version(current, to, promoted) == picked


@pytest.mark.parametrize(("current", "to", "promoted", "why"), [
    ("1.3.0", None, ["1.3.0"], "no promoted version other than 1.3.0"),
    ("1.3.0", "1.5.0", ["1.3.0", "1.2.0"], "plnt never promoted 1.5.0 (promoted, newest first: 1.3.0, 1.2.0)"),
    ("1.3.0", "1.3.0", ["1.3.0"], "names 1.3.0 already"),
])
def test_pick_version_refusals(current: str, to: str | None, promoted: list[str], why: str) -> None:
    with pytest.raises(ValueError, match=re.escape(why)):
        pick_version(current, to, promoted)


def test_release_fields_from_the_files_history() -> None:
    from plnt.core.specs.models import WorkflowRun

    def run(ref: str, pin: str | None) -> WorkflowRun:
        return WorkflowRun.model_validate({
            "apiVersion": "plnt.work/v1", "kind": "WorkflowRun", "metadata": {"name": "r"},
            "spec": {"workflow": {"ref": ref, "registry": "file:registry", **({"integrityHash": pin} if pin else {})},
                     "backend": {"cluster": "local"}}}, by_alias=True, strict=False)

    pinned = run("r@1.3.0", "sha256:" + "a" * 64)
    assert release_fields("WorkflowRun", pinned, run("r@1.2.0", "sha256:" + "b" * 64), "1.2.0") == {
        ("spec", "workflow", "ref"): "r@1.2.0", ("spec", "workflow", "registry"): "file:registry",
        ("spec", "workflow", "integrityHash"): "sha256:" + "b" * 64}
    assert release_fields("WorkflowRun", run("r@1.3.0", None), None, "1.2.0") == {("spec", "workflow", "ref"): "r@1.2.0"}
    with pytest.raises(ValueError, match="integrityHash is unknown"):
        release_fields("WorkflowRun", pinned, None, "1.2.0")
    with pytest.raises(ValueError, match="rootDigest is unknown"):
        release_fields("ModelDeployment", None, None, "1.0.0")


def _answer(status: int, error: dict[str, Any], **headers: str) -> httpx.Response:
    return httpx.Response(status, json={"error": error}, headers=headers,
                          request=httpx.Request("POST", "http://plnt/workflows/w/invoke"))


@pytest.mark.parametrize(("response", "code", "message"), [
    (_answer(404, {"type": "not_found", "message": "unknown workflow 'w'"}), 1, "w: not_found: unknown workflow 'w'"),
    (_answer(503, {"type": "not_ready", "message": "w has no promoted release yet"}, **{"retry-after": "5"}), 1,
     "not_ready: w has no promoted release yet (retry in 5 s)"),
    (_answer(409, {"type": "ambiguous", "message": "workflow 'w' exists in namespaces a, b; pick one with ?namespace="}),
     1, "pick one with --namespace"),
    (_answer(500, {"type": "step_failed", "step": "draft", "message": "boom"}), 1, "step_failed at step draft: boom"),
    (_answer(401, {"type": "unauthorized", "message": "a token is required"}), 2, "(--token/--token-file)"),
    (_answer(502, {"type": "runner_unreachable", "message": "no runner"}), 3, "runner_unreachable: no runner"),
    (_answer(504, {"type": "timeout", "message": "slow"}), 3, "timeout: slow"),
])
def test_run_says_why_not_and_what_next(response: httpx.Response, code: int, message: str,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    assert refused(response, "w").exit_code == code
    assert message in capsys.readouterr().err


def test_the_commit_a_pin_deploys_is_the_newest_that_promoted_its_version() -> None:
    from datetime import datetime

    from plnt.reconciler.control.pins import promoting_commit
    from plnt.reconciler.saga.history import SagaRollout

    def rollout(version: str, phase: str | None, commit: str, action: str = "deploy") -> SagaRollout:
        return SagaRollout(runId=commit, status="COMPLETED", startedAt=datetime(2026, 1, 1), closedAt=None,
                           durationMs=None, commit=commit * 40, version=version, phase=phase, action=action)

    newest_first = [rollout("1.3.0", "Ready", "d"), rollout("1.2.0", "RolledBack", "c"), rollout("1.2.0", "Ready", "b"),
                    rollout("1.2.0", "Ready", "a")]
    assert promoting_commit(newest_first, "1.2.0") == "b" * 40
    assert promoting_commit(newest_first, "1.1.0") is None
    assert promoting_commit([rollout("1.2.0", "Ready", "e", "uninstall")], "1.2.0") is None


def test_an_emergency_pin_needs_the_admin_scope() -> None:
    from plnt.core.auth import ADMIN, required_scope

    assert required_scope("/workflows/review-responder/pin") == ADMIN
