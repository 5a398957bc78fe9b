"""Traces of a real plnt (tests/e2e/harness.py: real Temporal, git repository, runner processes and
gateway) exported over OTLP/HTTP to a REAL receiver (tools/trace_tree.py):

- one commit's rollout is one trace: reconcile (plnt.commit) -> saga -> Temporal's workflow and
  activity spans;
- an invocation through the gateway is one trace: gateway -> runner -> steps -> LLM call (GenAI
  attributes), and the LLM backend (tests/openai_peer.py, a STAND-IN for a model server) receives its
  traceparent;
- a saga that rolls back (review-responder 1.4.0: its smoke test fails) ends with status ERROR;
- runners export too, without plnt's OTEL_EXPORTER_OTLP_HEADERS.

plnt runs in this process (the harness), so the test sets the OTEL_* environment and hands the
allowlisted part to the runners as the CLI does (Settings.runners.env)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from plnt.core import telemetry
from plnt.reconciler.drivers.spawn import allowlisted_env

from tests.conftest import SpecRepo
from tests.e2e.harness import hook, invoke, running_plnt, settings_for, wait_for, wait_phase
from tests.telemetry.conftest import trace_tree

pytestmark = pytest.mark.integration

RUN_FILE = "workflowruns/review-responder.yaml"
SECRET_HEADER = "authorization=Bearer otlp-collector-secret"
SAGA_STEPS = ["validate", "pull_recipe", "install_release", "smoke_test", "promote_release"]


def _children(spans: list, parent) -> list:  # type: ignore[no-untyped-def,type-arg]
    return [s for s in spans if s.parent_id == parent.span_id]


def _one(spans: list, name: str):  # type: ignore[no-untyped-def,type-arg]
    found = [s for s in spans if s.name == name]
    assert len(found) == 1, (name, [s.name for s in spans])
    return found[0]


async def _rollout_trace(receiver, commit: str, *, needs: str) -> list:  # type: ignore[no-untyped-def,type-arg]
    """The spans of the trace whose reconcile span names `commit`, once the span `needs` is in it."""
    def found() -> list | None:  # type: ignore[type-arg]
        telemetry.force_flush()
        roots = [s for s in receiver.collected.named("reconcile") if s.attributes.get("plnt.commit") == commit]
        if not roots:
            return None
        spans = receiver.collected.trace(roots[0].trace_id)
        return spans if any(s.name == needs for s in spans) else None

    return await wait_for(found, timeout=30, what=f"the trace of commit {commit[:12]} with {needs}")


async def test_a_rollout_and_an_invocation_are_each_one_trace(
    spec_repo: SpecRepo, tmp_path: Path, temporal_address: str, temporal_namespace: str, tracing, http_receiver,
) -> None:
    from tests.openai_peer import OpenAIPeer

    assert tracing(http_receiver.endpoint, setup=False, OTEL_EXPORTER_OTLP_HEADERS=SECRET_HEADER)
    spec_repo.remove(RUN_FILE)
    spec_repo.commit("no workflows yet")
    with OpenAIPeer() as peer:
        settings = settings_for(spec_repo.path, tmp_path / "state", temporal_address, temporal_namespace,
                                llm_url=peer.url, llm_model="test-model", runner_env=allowlisted_env(os.environ))
        async with running_plnt(settings) as plnt:
            spec_repo.git("checkout", "-q", "HEAD~1", "--", RUN_FILE)
            commit = spec_repo.commit("add review-responder")
            await hook(plnt)
            await wait_phase(plnt, "Ready", version="1.2.0")
            rollout = await _rollout_trace(http_receiver, commit, needs="CompleteWorkflow:DeploySaga")

            # commit seen -> reconcile -> saga -> StartWorkflow -> RunWorkflow -> each step's activity
            reconcile = _one(rollout, "reconcile")
            assert reconcile.parent_id == "" and reconcile.attributes["plnt.sagas"] == 1
            saga = _one(rollout, "saga default/review-responder")
            assert saga.parent_id == reconcile.span_id
            assert {k: saga.attributes[k] for k in ("plnt.workflow", "plnt.namespace", "plnt.version", "plnt.commit")} \
                == {"plnt.workflow": "review-responder", "plnt.namespace": "default", "plnt.version": "1.2.0",
                    "plnt.commit": commit}
            start = _one(_children(rollout, saga), "StartWorkflow:DeploySaga")
            # Temporal's interceptor: the workflow's spans (zero-length RunWorkflow and CompleteWorkflow, and each
            # activity's StartActivity) are children of StartWorkflow; RunActivity has the step's duration.
            assert telemetry.ENABLED  # set up by plnt's own start, from the environment
            _one(_children(rollout, start), "RunWorkflow:DeploySaga")
            under_run = _children(rollout, start)
            started = [s.name.removeprefix("StartActivity:") for s in sorted(under_run, key=lambda s: s.start_ns)
                       if s.name.startswith("StartActivity:")]
            assert [step for step in started if step in SAGA_STEPS] == SAGA_STEPS, started
            for step in SAGA_STEPS:
                [starts] = [s for s in under_run if s.name == f"StartActivity:{step}"]
                ran = [s for s in _children(rollout, starts) if s.name == f"RunActivity:{step}"]
                assert ran and ran[0].end_ns > ran[0].start_ns, step  # the step's own span, with its duration
            done = _one(under_run, "CompleteWorkflow:DeploySaga")
            assert done.status == "UNSET" and done.attributes["plnt.phase"] == "Ready"
            # The smoke test's calls continue its activity's span: the canary runner's spans are in this trace.
            rollout = await _rollout_trace(http_receiver, commit, needs="runner invoke")
            [smoke] = [s for s in rollout if s.name == "RunActivity:smoke_test"]
            canary_calls = [s for s in rollout if s.name == "runner invoke"]
            assert canary_calls and all(s.parent_id == smoke.span_id for s in canary_calls), \
                [(s.name, s.parent_id) for s in canary_calls]
            print("\nrollout trace:\n" + trace_tree.render(rollout, attributes=trace_tree.ATTRIBUTES))

            # An invocation: gateway -> runner -> steps -> LLM call, one trace.
            response = await invoke(plnt)
            assert response.status_code == 200, response.text

            def request_trace() -> list | None:  # type: ignore[type-arg]
                telemetry.force_flush()
                gateways = http_receiver.collected.named("POST /workflows/{name}/invoke")
                if not gateways:
                    return None
                spans = http_receiver.collected.trace(gateways[-1].trace_id)
                return spans if sum(s.name.startswith("chat ") for s in spans) >= 1 and \
                    any(s.name == "runner invoke" for s in spans) else None

            spans = await wait_for(request_trace, timeout=30, what="the invocation's trace with the runner's spans")
            gateway = _one(spans, "POST /workflows/{name}/invoke")
            assert gateway.parent_id == "" and gateway.kind == "SERVER" and gateway.service == "plnt"
            assert {k: gateway.attributes[k] for k in ("plnt.workflow", "plnt.namespace", "plnt.version", "plnt.track",
                                                        "http.response.status_code")} == {
                "plnt.workflow": "review-responder", "plnt.namespace": "default", "plnt.version": "1.2.0",
                "plnt.track": "stable", "http.response.status_code": 200}
            runner = _one(spans, "runner invoke")
            assert runner.parent_id == gateway.span_id and runner.service == "plnt-runner"
            steps = [s for s in spans if s.name.startswith("step ")]
            assert steps and all(s.parent_id == runner.span_id for s in steps)
            llm_calls = [s for s in spans if s.name == "chat test-model"]
            assert llm_calls and all(any(c.parent_id == s.span_id for s in steps) for c in llm_calls)
            call = llm_calls[0]
            assert call.kind == "CLIENT"
            assert {k: call.attributes[k] for k in ("gen_ai.operation.name", "gen_ai.request.model", "gen_ai.system")} \
                == {"gen_ai.operation.name": "chat", "gen_ai.request.model": "test-model", "gen_ai.system": "openai"}
            assert call.attributes["gen_ai.usage.input_tokens"] > 0 and call.attributes["gen_ai.usage.output_tokens"] > 0
            # The model server got the trace too: its traceparent names the LLM-call span.
            traceparents = {r.headers.get("traceparent") for r in peer.requests}
            assert any(tp and tp.split("-")[1:3] == [call.trace_id, call.span_id] for tp in traceparents), traceparents
            print("\ninvocation trace:\n" + trace_tree.render(spans, attributes=trace_tree.ATTRIBUTES))

    # The runners exported their spans themselves, without plnt's collector credentials.
    runner_exports = [headers for services, headers in http_receiver.collected.exports if "plnt-runner" in services]
    plnt_exports = [headers for services, headers in http_receiver.collected.exports if "plnt" in services]
    assert runner_exports and plnt_exports
    assert all(h.get("authorization") == "Bearer otlp-collector-secret" for h in plnt_exports)
    assert all("authorization" not in h and "otlp-collector-secret" not in repr(h) for h in runner_exports)


async def test_a_saga_that_rolls_back_ends_with_status_error(
    spec_repo: SpecRepo, tmp_path: Path, temporal_address: str, temporal_namespace: str, tracing, http_receiver,
) -> None:
    assert tracing(http_receiver.endpoint, setup=False)
    settings = settings_for(spec_repo.path, tmp_path / "state", temporal_address, temporal_namespace,
                            runner_env=allowlisted_env(os.environ))
    async with running_plnt(settings) as plnt:
        await wait_phase(plnt, "Ready", version="1.2.0")
        spec_repo.replace(RUN_FILE, "review-responder@1.2.0", "review-responder@1.4.0")  # its smoke test fails
        commit = spec_repo.commit("try 1.4.0")
        await hook(plnt)
        await wait_phase(plnt, "RolledBack", version="1.2.0")
        spans = await _rollout_trace(http_receiver, commit, needs="CompleteWorkflow:DeploySaga")
        done = _one(spans, "CompleteWorkflow:DeploySaga")
        assert done.status == "ERROR" and "error rate 100%" in done.status_message, done
        assert done.attributes["plnt.phase"] == "RolledBack"
        assert _one(spans, "saga default/review-responder").attributes["plnt.version"] == "1.4.0"
        assert any(s.name == "RunActivity:smoke_test" for s in spans)
        print("\nrolled-back trace:\n" + trace_tree.render(spans, attributes=trace_tree.ATTRIBUTES))
