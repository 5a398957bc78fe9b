"""Quotas at the gateway: a GatewayPolicy's limits per token name (core/specs/models.py), decided here
without I/O (the clocks are given), and the usage as `GET /usage` reads it from the metrics.

- `requestsPerMinute`: a token bucket per token name holding at most a minute's requests, refilled
  continuously; a request takes one or is denied with the seconds until one is back.
- `tokensPerMinute` (prompt + completion): a call's LLM tokens are known only once it answered, so
  they are charged after it (the bucket may go below zero) and the next calls are denied until the
  bucket is above zero again: the call that goes over is answered, the ones after it wait.
- `budget`: the cost (the policy's `prices`, per million input and output tokens) charged after each
  call, per UTC day or calendar month; a token whose spending reached its budget is denied until the
  period ends (Retry-After: the seconds until then).
- `models[].requestsPerMinute`: a ModelDeployment's own capacity, whoever asks (a token bucket per
  model, `admit_model`). A model with a `fallback` sends a request over it there (chat.py); a token's
  own limits above are checked first and never escaped by a fallback.

Several gateway processes (plnt up's gateway workers, `plnt gateway --workers N`): each process
enforces `share` = 1/N of every limit, so together they never let through more than the limit (a
client whose connections all land on one process gets that process's share). Replicas of `plnt
gateway` on other machines know nothing of each other: each enforces the whole limit.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from plnt.core.specs.models import GatewayPolicySpec, Limits

LimitName = Literal["requestsPerMinute", "tokensPerMinute", "budget", "modelRequestsPerMinute"]


@dataclass(frozen=True, slots=True)
class Denial:
    """Why a token's request is refused now, and when to ask again (whole seconds, at least 1)."""

    limit: LimitName
    token: str
    retry_after_s: int
    message: str


class Bucket:
    """A token bucket: `capacity` at most, refilled at `per_s`; `level` may go below zero (charged after)."""

    __slots__ = ("level", "updated")

    def __init__(self, capacity: float, now: float) -> None:
        self.level = capacity
        self.updated = now

    def refill(self, capacity: float, per_s: float, now: float) -> None:
        self.level = min(capacity, self.level + max(0.0, now - self.updated) * per_s)
        self.updated = now


def _seconds(value: float) -> int:
    return max(1, math.ceil(value - 1e-9))


def period_key(per: str, wall: float) -> str:
    """The budget period `wall` (epoch seconds) falls in: its UTC day or month."""
    at = datetime.fromtimestamp(wall, UTC)
    return at.strftime("%Y-%m-%d") if per == "day" else at.strftime("%Y-%m")


def period_end(per: str, wall: float) -> float:
    """When the budget period holding `wall` ends (epoch seconds)."""
    at = datetime.fromtimestamp(wall, UTC)
    start = at.replace(hour=0, minute=0, second=0, microsecond=0)
    if per == "day":
        return start.timestamp() + 86400
    month = start.replace(day=1)
    following = month.replace(year=month.year + 1, month=1) if month.month == 12 else month.replace(month=month.month + 1)
    return following.timestamp()


class Quotas:
    """One gateway process's quota state per token name. `admit` before forwarding a request,
    `charge` once it answered. Limits come from the policy given on each call (the route table's, so
    a commit changing them applies to the next request); the state is kept across policy changes."""

    def __init__(self, share: float = 1.0, *, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time) -> None:
        if not 0 < share <= 1:
            raise ValueError(f"share must be within (0, 1], got {share}")
        self.share = share
        self.clock = clock  # rates (monotonic seconds)
        self.wall = wall  # budget periods (epoch seconds, UTC)
        self._requests: dict[str, Bucket] = {}
        self._models: dict[str, Bucket] = {}  # "namespace/name" -> the model's requests bucket
        self._tokens: dict[str, Bucket] = {}
        self._spent: dict[str, tuple[str, float]] = {}  # token -> (period, cost spent in it)
        self._periods: dict[str, tuple[str, float, float]] = {}  # "day"/"month" -> (current period, start, end)

    def admit(self, policy: GatewayPolicySpec | None, token: str) -> Denial | None:
        """None: let the request through (one request taken from the token's rate); else why not."""
        limits = policy.limits_for(token) if policy is not None else None
        if limits is None:
            return None
        now = self.clock()
        if limits.budget is not None:
            denial = self._over_budget(limits, token, policy.currency if policy else "")
            if denial is not None:
                return denial
        if limits.tokens_per_minute is not None:
            capacity, per_s = self._rate(limits.tokens_per_minute)
            bucket = self._bucket(self._tokens, token, capacity, now)
            bucket.refill(capacity, per_s, now)
            if bucket.level <= 0:
                return Denial("tokensPerMinute", token, _seconds((1e-6 - bucket.level) / per_s),
                              f"token {token!r} used its LLM tokens per minute ({limits.tokens_per_minute:,}"
                              f"{self._share_note(limits.tokens_per_minute)})")
        if limits.requests_per_minute is not None:
            capacity, per_s = self._rate(limits.requests_per_minute)
            bucket = self._bucket(self._requests, token, capacity, now)
            bucket.refill(capacity, per_s, now)
            if bucket.level < 1:
                return Denial("requestsPerMinute", token, _seconds((1 - bucket.level) / per_s),
                              f"token {token!r} is over its {limits.requests_per_minute:,} requests per minute"
                              f"{self._share_note(limits.requests_per_minute)}")
            bucket.level -= 1
        return None

    def admit_model(self, policy: GatewayPolicySpec | None, namespace: str, name: str) -> Denial | None:
        """None: a request to model namespace/name fits its requests per minute (one taken); else why not."""
        limit = policy.model_limit(namespace, name) if policy is not None and policy.models else None
        if limit is None:
            return None
        now = self.clock()
        capacity, per_s = self._rate(limit.requests_per_minute)
        bucket = self._bucket(self._models, f"{namespace}/{name}", capacity, now)
        bucket.refill(capacity, per_s, now)
        if bucket.level < 1:
            return Denial("modelRequestsPerMinute", "", _seconds((1 - bucket.level) / per_s),
                          f"model {namespace}/{name} is at its {limit.requests_per_minute:,} requests per minute"
                          f"{self._share_note(limit.requests_per_minute)}")
        bucket.level -= 1
        return None

    def charge(self, policy: GatewayPolicySpec | None, token: str, llm_tokens: int, cost: float) -> None:
        """A call of `token` answered, having used `llm_tokens` (prompt + completion) costing `cost`."""
        limits = policy.limits_for(token) if policy is not None else None
        if limits is None:
            return
        if llm_tokens > 0 and limits.tokens_per_minute is not None:
            now = self.clock()
            capacity, per_s = self._rate(limits.tokens_per_minute)
            bucket = self._bucket(self._tokens, token, capacity, now)
            bucket.refill(capacity, per_s, now)
            bucket.level -= llm_tokens
        if cost > 0 and limits.budget is not None:
            period = self._period(limits.budget.per, self.wall())
            held, spent = self._spent.get(token, (period, 0.0))
            self._spent[token] = (period, (spent if held == period else 0.0) + cost)

    def spent(self, token: str, per: str) -> float:
        """What `token` spent in this process in the current period."""
        held, spent = self._spent.get(token, ("", 0.0))
        return spent if held == self._period(per, self.wall()) else 0.0

    def _period(self, per: str, wall: float) -> str:
        """period_key, worked out once per period (a datetime per request costs more than the rest)."""
        known = self._periods.get(per)
        if known is None or not known[1] <= wall < known[2]:
            key = period_key(per, wall)
            start = datetime.strptime(key, "%Y-%m-%d" if per == "day" else "%Y-%m").replace(tzinfo=UTC).timestamp()
            known = self._periods[per] = (key, start, period_end(per, wall))
        return known[0]

    def _over_budget(self, limits: Limits, token: str, currency: str) -> Denial | None:
        budget = limits.budget
        assert budget is not None
        allowed = budget.amount * self.share
        wall = self.wall()
        if self.spent(token, budget.per) < allowed:
            return None
        return Denial("budget", token, _seconds(period_end(budget.per, wall) - wall),
                      f"token {token!r} spent its budget of {budget.amount:g} {currency} per {budget.per}"
                      f"{self._share_note(budget.amount)}; it is renewed when the {budget.per} ends (UTC)")

    @staticmethod
    def _bucket(buckets: dict[str, Bucket], token: str, capacity: float, now: float) -> Bucket:
        bucket = buckets.get(token)
        if bucket is None:
            bucket = buckets[token] = Bucket(capacity, now)
        return bucket

    def _rate(self, per_minute: int) -> tuple[float, float]:
        """(capacity, refill per second) of this process's share of a per-minute limit; the capacity is
        at least 1 so that a small limit split over processes still lets a request through."""
        share = per_minute * self.share
        return max(1.0, share), share / 60.0

    def _share_note(self, limit: float) -> str:
        return "" if self.share == 1 else f"; this gateway process enforces its share, {limit * self.share:g}"


def call_cost(policy: GatewayPolicySpec | None, namespace: str, workflow: str, prompt: int, completion: int) -> float:
    """What a call's tokens cost by the policy's price of its workflow or model (0 without one)."""
    price = policy.price_of(namespace, workflow) if policy is not None else None
    if price is None:
        return 0.0
    return (prompt * price.input_per_million + completion * price.output_per_million) / 1e6


# --- GET /usage: the usage series of /metrics as rows ---------------------------------------------------

USAGE_SERIES = {
    "plnt_gateway_usage_requests": "requests",
    "plnt_gateway_usage_prompt_tokens": "promptTokens",
    "plnt_gateway_usage_completion_tokens": "completionTokens",
    "plnt_gateway_usage_cost": "cost",
}


def usage_rows(metrics_text: bytes) -> list[dict[str, Any]]:
    """One row per token, namespace and workflow from a Prometheus exposition (one process's, or the
    sum over plnt up's gateway processes): requests, prompt and completion tokens and cost."""
    from prometheus_client.parser import text_string_to_metric_families

    rows: dict[tuple[str, str, str], dict[str, Any]] = {}
    for family in text_string_to_metric_families(metrics_text.decode("utf-8", "replace")):
        field = USAGE_SERIES.get(family.name.removesuffix("_total"))
        if field is None:
            continue
        for sample in family.samples:
            if not sample.name.endswith("_total"):
                continue  # *_created
            labels = sample.labels
            key = (labels.get("token", ""), labels.get("namespace", ""), labels.get("workflow", ""))
            row = rows.setdefault(key, {"token": key[0], "namespace": key[1], "workflow": key[2], "requests": 0,
                                        "promptTokens": 0, "completionTokens": 0, "cost": 0.0})
            value = float(sample.value)
            row[field] = round(value, 6) if field == "cost" else int(value)
    return [rows[key] for key in sorted(rows)]


def limits_rows(policy: GatewayPolicySpec | None) -> list[dict[str, Any]]:
    """The policy's limits per token name (and `*` for its default), as `GET /usage` shows them."""
    if policy is None:
        return []
    entries: list[tuple[str, Limits]] = [(entry.name, entry) for entry in policy.tokens]
    if policy.default is not None:
        entries.append(("*", policy.default))
    return [{"token": name, "requestsPerMinute": limits.requests_per_minute,
             "tokensPerMinute": limits.tokens_per_minute,
             "budget": None if limits.budget is None else {"amount": limits.budget.amount, "per": limits.budget.per,
                                                           "currency": policy.currency}}
            for name, limits in entries]
