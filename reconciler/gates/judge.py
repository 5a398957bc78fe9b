"""An LLM as judge for the quality gate: a ModelDeployment of the namespace (its promoted model
server, called directly with the OpenAI chat API) scores each golden case's answer 1-5 against the
gate's rubric, at temperature 0 (the same answer, the same score). A reply with no digit 1-5 is no
score: the case fails, saying what the judge replied."""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
from plnt.core.recipe import GoldenCase
from plnt.reconciler.errors import GateUnavailable
from plnt.reconciler.tls_context import default_tls_context

Judge = Callable[[GoldenCase, Any], Awaitable["int | str"]]  # a score 1-5, or why there is none
MAX_SHOWN = 2000  # characters of the case's input and answer in the prompt
_SCORE = re.compile(r"[1-5]")

SYSTEM = ("You grade an answer to a request against a rubric. Reply with one digit from 1 (fails the rubric) "
          "to 5 (meets it fully), and nothing else.")


def prompt(rubric: str, case: GoldenCase, output: Any) -> list[dict[str, str]]:
    shown_input = json.dumps(case.input, ensure_ascii=False)[:MAX_SHOWN]
    shown_output = json.dumps(output, ensure_ascii=False)[:MAX_SHOWN]
    return [{"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"Rubric: {rubric}\nRequest: {shown_input}\nAnswer: {shown_output}\nScore:"}]


def score_of(reply: str) -> int | str:
    """The first digit 1-5 of the judge's reply, or why there is none."""
    found = _SCORE.search(reply)
    return int(found.group()) if found else f"the judge gave no score (it replied {reply[:80]!r})"


def constrained(runtime: str | None) -> dict[str, Any]:
    """What makes the model server answer with one digit 1-5 and nothing else: a small model follows
    the instruction alone poorly (SmolLM2-135M replies prose). llama.cpp takes a GBNF grammar, vLLM a
    guided choice; another server gets the instruction only."""
    if runtime == "llama.cpp":
        return {"grammar": "root ::= [1-5]"}
    if runtime == "vllm":
        return {"guided_choice": ["1", "2", "3", "4", "5"]}
    return {}


def model_judge(endpoint: str, model: str, rubric: str, *, runtime: str | None = None,
                timeout_s: float = 60.0) -> Judge:
    async def judge(case: GoldenCase, output: Any) -> int | str:
        body = {"model": model, "messages": prompt(rubric, case, output), "temperature": 0, "max_tokens": 4,
                "stream": False, **constrained(runtime)}
        try:
            async with httpx.AsyncClient(trust_env=False, timeout=timeout_s, verify=default_tls_context()) as client:
                response = await client.post(f"{endpoint}/v1/chat/completions", json=body)
        except httpx.HTTPError as exc:
            raise GateUnavailable(f"judge model {model} did not answer: {type(exc).__name__}") from None
        if response.status_code != 200:
            raise GateUnavailable(f"judge model {model} answered HTTP {response.status_code}")
        try:
            reply = response.json()["choices"][0]["message"]["content"] or ""
        except (ValueError, LookupError, TypeError):
            return "the judge's answer is not an OpenAI chat completion"
        return score_of(str(reply))

    return judge
