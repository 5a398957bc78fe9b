"""The quality gate: the recipe's golden cases run on the canary and on the stable release, each
output held to its case's expectations (core/expectations.py). A release that is fast and answers
200 but answers wrong fails here, with the failing cases named.

Outputs are data to plnt: it reads the runners' JSON answers (bounded by the gateway's client) and
never runs recipe code."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
from plnt.core.expectations import Check
from plnt.core.recipe import GoldenCase
from plnt.core.specs.models import ModelGoldenCase, QualityGate
from plnt.reconciler.errors import GateUnusable
from plnt.reconciler.gates.judge import Judge
from plnt.reconciler.tls_context import default_tls_context

MAX_FAILING_SHOWN = 20
CONCURRENCY = 2


@dataclass(frozen=True)
class CaseOutcome:
    name: str
    failures: tuple[str, ...]  # empty: the case passed
    score: int | None = None  # the judge's, when the gate has one and the case met its expectations

    @property
    def passed(self) -> bool:
        return not self.failures


@dataclass(frozen=True)
class QualityVerdict:
    passed: bool
    reason: str
    failing: list[str]  # "CASE: why" of the canary's failing cases


@dataclass(frozen=True)
class NoOutput:
    why: str


# What one case's request gave: the output its expectations check, or why there is none.
Ask = Callable[[httpx.AsyncClient, GoldenCase], Awaitable[Any]]


def runner_asker(endpoint: str) -> Ask:
    """A recipe's case, invoked on the runner at `endpoint` (POST /invoke): its JSON answer's output."""
    async def ask(client: httpx.AsyncClient, case: GoldenCase) -> Any:
        try:
            response = await client.post(f"{endpoint}/invoke", json=case.input)
        except httpx.HTTPError as exc:
            return NoOutput(f"no answer: {type(exc).__name__}: {exc}"[:200])
        if response.status_code != 200:
            return NoOutput(f"HTTP {response.status_code}: {_error_of(response)}")
        try:
            answer: Any = response.json()
        except ValueError:
            return NoOutput("the answer is not JSON")
        if not isinstance(answer, dict) or "output" not in answer:  # a runner answers {"output": ..., ...}
            return NoOutput("the answer has no output")
        return answer["output"]

    return ask


def model_cases(golden: Sequence[ModelGoldenCase]) -> list[GoldenCase]:
    """A ModelDeployment's canary.golden as golden cases: the chat request in `input` (what the judge
    is shown as the request), the checks parsed."""
    cases = []
    for case in golden:
        messages = ([{"role": "system", "content": case.system}] if case.system else []) \
            + [{"role": "user", "content": case.prompt}]
        cases.append(GoldenCase(name=case.name, input={"messages": messages, "max_tokens": case.max_tokens}, expect=None,
                                checks=tuple(Check.model_validate(check) for check in case.checks)))
    return cases


def model_asker(endpoint: str, model: str) -> Ask:
    """A model's case (ModelGoldenCase.as_golden: its chat messages and max_tokens in `input`), sent
    to the model server at `endpoint` at temperature 0: the reply's text, or its JSON when the case's
    checks read it as JSON."""
    async def ask(client: httpx.AsyncClient, case: GoldenCase) -> Any:
        body = {"model": model, **case.input, "temperature": 0, "stream": False}
        try:
            response = await client.post(f"{endpoint}/v1/chat/completions", json=body)
        except httpx.HTTPError as exc:
            return NoOutput(f"no answer: {type(exc).__name__}: {exc}"[:200])
        if response.status_code != 200:
            return NoOutput(f"HTTP {response.status_code}: {_error_of(response)}")
        try:
            text = response.json()["choices"][0]["message"]["content"] or ""
        except (ValueError, LookupError, TypeError):
            return NoOutput("the answer is not an OpenAI chat completion")
        if not any(check.path or check.kind == "schema" for check in case.checks):
            return str(text)
        try:
            return json.loads(text)
        except ValueError:
            return NoOutput(f"the reply is not JSON, which its checks read: {str(text)[:80]!r}")

    return ask


async def run_cases(ask: Ask, cases: Sequence[GoldenCase], *, timeout_s: float, judge: Judge | None = None,
                    min_score: int = 3) -> list[CaseOutcome]:
    """Each case asked once (`runner_asker`, `model_asker`), its output checked, then, with a
    `judge`, scored (a case meeting its expectations passes only with `min_score` or more)."""
    gate = asyncio.Semaphore(CONCURRENCY)

    async def one(client: httpx.AsyncClient, case: GoldenCase) -> CaseOutcome:
        async with gate:
            output = await ask(client, case)
        if isinstance(output, NoOutput):
            return CaseOutcome(case.name, (output.why,))
        failures = case.failures(output)
        score = None
        if judge is not None and not failures:
            judged = await judge(case, output)
            if isinstance(judged, str):
                failures = [judged]
            else:
                score = judged
                if score < min_score:
                    failures = [f"the judge scored it {score}/5, under {min_score}"]
        return CaseOutcome(case.name, tuple(failures), score)

    async with httpx.AsyncClient(trust_env=False, timeout=timeout_s, verify=default_tls_context()) as client:
        return list(await asyncio.gather(*(one(client, case) for case in cases)))


def judge_quality(gate: QualityGate, canary: Sequence[CaseOutcome], stable: Sequence[CaseOutcome] | None) -> QualityVerdict:
    """The verdict: the canary's pass rate against minPassRate, and against the stable release's on
    the same cases (maxDropVsStable), with the canary's failing cases named."""
    if not canary:
        raise GateUnusable("there are no golden cases to check (a recipe's golden.yaml: cases with expect or checks; "
                           "a ModelDeployment's canary.golden)")
    rate = _rate(canary)
    said = f"canary {sum(c.passed for c in canary)}/{len(canary)} golden cases passed ({rate:.0%})"
    problems = []
    if rate < gate.min_pass_rate:
        problems.append(f"below minPassRate {gate.min_pass_rate:.0%}")
    if stable is not None and gate.max_drop_vs_stable is not None:
        stable_rate = _rate(stable)
        said += f", stable {sum(s.passed for s in stable)}/{len(stable)} ({stable_rate:.0%})"
        if rate < stable_rate - gate.max_drop_vs_stable - 1e-9:
            problems.append(f"more than {gate.max_drop_vs_stable:.0%} below the stable release")
    scores = [f"{c.name} {c.score}/5" for c in canary if c.score is not None]
    if scores:
        said += f"; judge: {', '.join(scores)}"
    failing = [f"{c.name}: {'; '.join(c.failures)}" for c in canary if not c.passed]
    shown = failing[:MAX_FAILING_SHOWN]
    if problems:
        reason = f"{said}: {', '.join(problems)}; failing: " + " | ".join(shown)
    else:
        reason = said
    return QualityVerdict(passed=not problems, reason=reason[:2000], failing=shown)


def _rate(outcomes: Sequence[CaseOutcome]) -> float:
    return sum(o.passed for o in outcomes) / len(outcomes) if outcomes else 0.0


def _error_of(response: httpx.Response) -> str:
    try:
        message = response.json().get("error", {}).get("message", "")
    except (ValueError, AttributeError):
        message = response.text[:200]
    return str(message)[:200]
