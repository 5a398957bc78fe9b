"""The quota decisions (gateway/quotas.py) as table tests, on a fake clock: no server, no sleep."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from plnt.core.auth import UNNAMED, TokenFileError, parse_token_file
from plnt.core.specs.models import GatewayPolicySpec
from plnt.gateway.metrics import GatewayMetrics
from plnt.gateway.quotas import Quotas, call_cost, limits_rows, period_end, period_key, usage_rows


class FakeClock:
    """A FAKE clock (monotonic and wall seconds), moved by the test."""

    def __init__(self, wall: float) -> None:
        self.now = 0.0
        self.epoch = wall

    def advance(self, seconds: float) -> None:
        self.now += seconds
        self.epoch += seconds


NOON = datetime(2026, 12, 3, 12, 0, tzinfo=UTC).timestamp()


def policy(**token: Any) -> GatewayPolicySpec:
    return GatewayPolicySpec.model_validate({
        "prices": [{"model": "smollm", "inputPerMillion": 1_000_000, "outputPerMillion": 2_000_000}],
        "tokens": [{"name": "app", **token}],
    })


def quotas(clock: FakeClock, share: float = 1.0) -> Quotas:
    return Quotas(share, clock=lambda: clock.now, wall=lambda: clock.epoch)


# (limits, share, steps) where a step is ("admit", expected limit or None, expected Retry-After or None),
# ("charge", llm tokens, cost) or ("wait", seconds)
CASES = [
    ("3 requests per minute: the 4th waits 20 s for one back",
     {"requestsPerMinute": 3}, 1.0,
     [("admit", None, None)] * 3 + [("admit", "requestsPerMinute", 20), ("wait", 20), ("admit", None, None),
                                     ("admit", "requestsPerMinute", 20)]),
    ("two processes: each lets through half of 4 per minute",
     {"requestsPerMinute": 4}, 0.5,
     [("admit", None, None)] * 2 + [("admit", "requestsPerMinute", 30)]),
    ("a share below one request still lets one through, then waits its refill",
     {"requestsPerMinute": 1}, 0.5,
     [("admit", None, None), ("admit", "requestsPerMinute", 120)]),
    ("LLM tokens are charged after: the call going over is answered, the next waits",
     {"tokensPerMinute": 600}, 1.0,
     [("admit", None, None), ("charge", 500, 0), ("admit", None, None), ("charge", 400, 0),
      ("admit", "tokensPerMinute", 31), ("wait", 31), ("admit", None, None)]),
    ("a budget spent: denied until the day ends (12 h from noon UTC)",
     {"budget": {"amount": 3, "per": "day"}}, 1.0,
     [("admit", None, None), ("charge", 0, 2.0), ("admit", None, None), ("charge", 0, 1.5),
      ("admit", "budget", 12 * 3600), ("wait", 12 * 3600), ("admit", None, None)]),
    ("a budget of 0 blocks the token",
     {"budget": {"amount": 0}}, 1.0, [("admit", "budget", 12 * 3600)]),
    ("a monthly budget split over two processes",
     {"budget": {"amount": 10, "per": "month"}}, 0.5,
     [("charge", 0, 5.0), ("admit", "budget", 28 * 86400 + 12 * 3600)]),
    ("no limits: always admitted",
     {}, 1.0, [("admit", None, None)] * 50),
]


@pytest.mark.parametrize(("limits", "share", "steps"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_quota_decisions(limits: dict[str, Any], share: float, steps: list[tuple[Any, ...]]) -> None:
    clock = FakeClock(NOON)
    q, spec = quotas(clock, share), policy(**limits)
    for number, step in enumerate(steps):
        if step[0] == "wait":
            clock.advance(step[1])
        elif step[0] == "charge":
            q.charge(spec, "app", step[1], step[2])
        else:
            denial = q.admit(spec, "app")
            got = (denial.limit, denial.retry_after_s) if denial else (None, None)
            assert got == (step[1], step[2]), f"step {number}: {denial}"
            if denial is not None:
                assert "'app'" in denial.message and denial.token == "app"


def test_tokens_are_apart_and_a_policy_change_applies_to_the_next_request() -> None:
    clock = FakeClock(NOON)
    q = quotas(clock)
    tight = policy(requestsPerMinute=1)
    assert q.admit(tight, "app") is None
    assert q.admit(tight, "app") is not None
    assert q.admit(tight, "other") is None  # not in the policy, no default: unlimited
    with_default = GatewayPolicySpec.model_validate({"tokens": [{"name": "app", "requestsPerMinute": 1}],
                                                     "default": {"requestsPerMinute": 1}})
    assert q.admit(with_default, "other") is None
    assert q.admit(with_default, "other") is not None  # the default holds for every unlisted name
    assert q.admit(None, "app") is None  # the policy removed: no limits


@pytest.mark.parametrize(("at", "per", "key", "end"), [
    (datetime(2026, 12, 31, 23, 59, tzinfo=UTC), "day", "2026-12-31", datetime(2027, 1, 1, tzinfo=UTC)),
    (datetime(2026, 12, 31, 23, 59, tzinfo=UTC), "month", "2026-12", datetime(2027, 1, 1, tzinfo=UTC)),
    (datetime(2026, 2, 10, tzinfo=UTC), "month", "2026-02", datetime(2026, 3, 1, tzinfo=UTC)),
])
def test_budget_periods(at: datetime, per: str, key: str, end: datetime) -> None:
    assert period_key(per, at.timestamp()) == key
    assert period_end(per, at.timestamp()) == end.timestamp()


@pytest.mark.parametrize(("namespace", "workflow", "prompt", "completion", "cost"), [
    ("default", "smollm", 3, 2, 3 + 4),  # by name
    ("team-a", "smollm", 1, 0, 5),  # namespace/name first
    ("default", "other", 1000, 1000, 0),  # no price: no cost
])
def test_call_cost(namespace: str, workflow: str, prompt: int, completion: int, cost: float) -> None:
    spec = GatewayPolicySpec.model_validate({"prices": [
        {"model": "smollm", "inputPerMillion": 1e6, "outputPerMillion": 2e6},
        {"model": "team-a/smollm", "inputPerMillion": 5e6, "outputPerMillion": 0}]})
    assert call_cost(spec, namespace, workflow, prompt, completion) == cost


def test_usage_rows_from_metrics_text() -> None:
    metrics = GatewayMetrics()
    metrics.used("app", "default", "smollm", 5, 7, 0.0012345678)
    metrics.used("app", "default", "smollm", 7, 0, 0.0)
    metrics.used(UNNAMED, "default", "review", 0, 0, 0.0)
    metrics.finished("invoke", ("default", "review", "1.0.0", "stable"), 200, 0.01)
    assert usage_rows(metrics.render()) == [
        {"token": "app", "namespace": "default", "workflow": "smollm", "requests": 2, "promptTokens": 12,
         "completionTokens": 7, "cost": 0.001235},
        {"token": UNNAMED, "namespace": "default", "workflow": "review", "requests": 1, "promptTokens": 0,
         "completionTokens": 0, "cost": 0.0}]
    spec = GatewayPolicySpec.model_validate({"currency": "EUR", "tokens": [{"name": "app", "requestsPerMinute": 5}],
                                             "default": {"budget": {"amount": 1}}})
    assert limits_rows(spec) == [
        {"token": "app", "requestsPerMinute": 5, "tokensPerMinute": None, "budget": None},
        {"token": "*", "requestsPerMinute": None, "tokensPerMinute": None,
         "budget": {"amount": 1.0, "per": "day", "currency": "EUR"}}]


@pytest.mark.parametrize(("line", "name"), [
    ("s3cr3t name=app scopes=invoke", "app"),
    ("s3cr3t scopes=read name=team-a.ci", "team-a.ci"),
    ("s3cr3t name=everything", "everything"),
    ("s3cr3t", None),
    ("s3cr3t summarize", None),
])
def test_token_file_names(line: str, name: str | None) -> None:
    [(_, grant)] = parse_token_file(line)
    assert grant.name == name
    assert grant.label == (name or UNNAMED)


@pytest.mark.parametrize("line", ["s3cr3t name=", "s3cr3t name=-x", "s3cr3t name=a/b", "s3cr3t name=a name=b"])
def test_token_file_bad_names(line: str) -> None:
    with pytest.raises(TokenFileError, match="token file:1"):
        parse_token_file(line)


def test_the_policy_travels_with_the_route_table_to_every_gateway_process() -> None:
    """The route watch's document carries the GatewayPolicy; a new policy is a new version."""
    from plnt.core.routes import Route, RouteTable
    from plnt.gateway.route_watch import RoutePublisher, parse_doc_and_table

    spec = policy(requestsPerMinute=3, budget={"amount": 2.5, "per": "month"})
    publisher = RoutePublisher()
    routes = [Route(namespace="default", name="smollm", stable=None)]
    first = publisher.publish(RouteTable(routes), [])
    second = publisher.publish(RouteTable(routes, spec), [])
    assert second.version == first.version + 1
    assert publisher.publish(RouteTable(routes, spec), []) is second  # the same policy: no new version
    doc, table = parse_doc_and_table(second.json)
    assert table.policy == spec and doc.policy == spec
    assert parse_doc_and_table(first.json)[1].policy is None


@pytest.mark.parametrize(("share", "admitted", "after_30s", "retry_after"), [
    (1.0, 3, 1, 20),  # 3 a minute: three at once, then one per 20 s
    (0.5, 1, 1, 20),  # one of two gateway processes: its 1.5 a minute (0.5 left after one: 20 s to the next)
])
def test_a_models_requests_per_minute(share: float, admitted: int, after_30s: int, retry_after: int) -> None:
    """GatewayPolicy models[]: a model's capacity, whoever asks; by NAMESPACE/NAME first, else NAME."""
    clock = FakeClock(NOON)
    limits = GatewayPolicySpec.model_validate({"models": [{"model": "smollm", "requestsPerMinute": 3},
                                                          {"model": "team-b/smollm", "requestsPerMinute": 1}]})
    q = quotas(clock, share)
    results = [q.admit_model(limits, "default", "smollm") for _ in range(4)]
    assert [r is None for r in results] == [True] * admitted + [False] * (4 - admitted)
    denial = results[-1]
    assert denial is not None and denial.limit == "modelRequestsPerMinute" and denial.retry_after_s == retry_after
    assert "model default/smollm is at its 3 requests per minute" in denial.message
    clock.advance(30)
    assert sum(q.admit_model(limits, "default", "smollm") is None for _ in range(3)) == after_30s
    assert q.admit_model(limits, "default", "other") is None  # not listed: no limit
    assert q.admit_model(None, "default", "smollm") is None
    assert [q.admit_model(limits, "team-b", "smollm") is None for _ in range(2)] == [True, False]  # its own entry
