"""A ModelDeployment's golden cases asked of a model server (the OpenAI test peer: a STAND-IN for a
model server, its reply set per test): the chat request sent, and the reply checked as text or, when
a check reads it so, as JSON."""

from __future__ import annotations

import pytest
from plnt.core.specs.models import ModelGoldenCase
from plnt.reconciler.gates.quality import model_asker, model_cases, run_cases

from tests.openai_peer import OpenAIPeer


def case(*checks: dict[str, object], system: str | None = None) -> ModelGoldenCase:
    return ModelGoldenCase.model_validate({"name": "c", "prompt": "Say it.", "system": system, "maxTokens": 9,
                                           "checks": list(checks)})


@pytest.mark.integration
@pytest.mark.parametrize(("reply", "golden", "failures"), [
    ("Paris is the capital.", case({"regex": "(?i)paris"}), ()),
    ("Lyon", case({"regex": "(?i)paris"}), ('the output: no match for /(?i)paris/: "Lyon"',)),
    ('{"ok": true}', case({"path": "ok", "equals": True}), ()),
    ('{"ok": false}', case({"path": "ok", "equals": True}), ("ok: expected true, got false",)),
    ("ok", case({"path": "ok", "equals": True}), ("the reply is not JSON, which its checks read: 'ok'",)),
    ('"a string"', case({"schema": {"type": "string"}}), ()),
])
async def test_a_models_case_is_its_reply_checked(reply: str, golden: ModelGoldenCase, failures: tuple[str, ...]) -> None:
    with OpenAIPeer() as server:
        server.configure(reply=reply)
        (outcome,) = await run_cases(model_asker(server.url, "smollm2"), model_cases([golden]), timeout_s=10)
        sent = server.requests[-1].json
    assert outcome.failures == failures
    assert (sent["model"], sent["temperature"], sent["max_tokens"], sent["stream"]) == ("smollm2", 0, 9, False)
    assert sent["messages"] == [{"role": "user", "content": "Say it."}]


@pytest.mark.integration
async def test_a_system_message_goes_first_and_a_refusal_is_named() -> None:
    with OpenAIPeer() as server:
        server.configure(fail_status=503, fail_message="loading model")
        (outcome,) = await run_cases(model_asker(server.url, "m"), model_cases([case({"contains": "x"}, system="Be brief.")]),
                                     timeout_s=10)
        sent = server.requests[-1].json
    assert sent["messages"][0] == {"role": "system", "content": "Be brief."}
    assert outcome.failures == ("HTTP 503: loading model",)
