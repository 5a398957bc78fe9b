"""The quality gate's LLM judge (reconciler/gates/judge.py): the score read from a reply, the prompt
it sends, and a judged case through run_cases. The judge model here is tests/openai_peer.py, a
STAND-IN for a model server (its reply is set per test); the runner answering the golden case is a
real HTTP server in a thread (tests/http_thread.py) giving a fixed output. The real SmolLM2 judge:
tests/models (real_inference)."""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest
from plnt.core.recipe import GoldenCase
from plnt.reconciler.gates.judge import model_judge, score_of
from plnt.reconciler.gates.quality import run_cases, runner_asker

from tests.http_thread import ThreadedHttp
from tests.openai_peer import OpenAIPeer

CASE = GoldenCase(name="praise", input={"review": "Loved it"}, expect={"intent": "praise"})


@pytest.mark.parametrize(("reply", "score"), [
    ("4", 4), (" 5.", 5), ("Score: 2", 2), ("0 or 9", "the judge gave no score (it replied '0 or 9')"),
    ("", "the judge gave no score (it replied '')"),
])
def test_the_score_is_the_first_digit_1_to_5(reply: str, score: int | str) -> None:
    assert score_of(reply) == score


class Runner(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers["content-length"]))
        body = json.dumps({"output": {"intent": "praise", "reply": "Thanks!"}}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.mark.integration
@pytest.mark.parametrize(("reply", "failures"), [
    ("4", ()), ("3", ()), ("2", ("the judge scored it 2/5, under 3",)),
    ("no idea", ("the judge gave no score (it replied 'no idea')",)),
])
async def test_a_case_passes_with_its_expectations_and_the_judges_score(reply: str, failures: tuple[str, ...]) -> None:
    with ThreadedHttp(Runner) as runner, OpenAIPeer() as judge_model:
        judge_model.configure(reply=reply)
        judge = model_judge(judge_model.url, "smollm2", "A warm, specific thank-you.")
        (outcome,) = await run_cases(runner_asker(runner.url), [CASE], timeout_s=10, judge=judge, min_score=3)
        sent = judge_model.requests[-1].json
    assert outcome.failures == failures
    assert (sent["model"], sent["temperature"], sent["max_tokens"]) == ("smollm2", 0, 4)
    assert "Rubric: A warm, specific thank-you." in sent["messages"][1]["content"]
    assert '"reply": "Thanks!"' in sent["messages"][1]["content"]
