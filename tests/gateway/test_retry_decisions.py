"""gateway/retry.py's decisions as tables: what failed, on which track, for which request, whether the caller
already got a byte -> retried on stable or not; which failures send a model's chat to its fallback."""

from __future__ import annotations

import pytest
from plnt.core.upstream import (
    UpstreamBroken,
    UpstreamConnectError,
    UpstreamConnectTimeout,
    UpstreamTimeout,
)
from plnt.gateway.retry import Attempt, error_failure, fallback_reason, retry_target, status_failure

RUNNER, MODEL = True, False  # side_effects: a runner's invoke or chat may run side-effecting steps

RETRY_TABLE = [
    # failure,             track,    request, first byte, forced -> retried on stable?
    ("connect_refused",    "canary", RUNNER, False, False, True),   # nothing reached the runner
    ("connect_timeout",    "canary", RUNNER, False, False, True),
    ("not_started",        "canary", RUNNER, False, False, True),   # the runner says nothing ran
    ("upstream_status",    "canary", RUNNER, False, False, False),  # a 502/503/504: it may have run a step
    ("upstream_timeout",   "canary", RUNNER, False, False, False),
    ("connection_broken",  "canary", RUNNER, False, False, False),  # the body reached it
    ("upstream_status",    "canary", MODEL, False, False, True),    # a model's chat has no side effect
    ("upstream_timeout",   "canary", MODEL, False, False, True),
    ("connection_broken",  "canary", MODEL, False, False, True),
    ("connect_refused",    "stable", RUNNER, False, False, True),   # another stable replica
    ("not_started",        "stable", RUNNER, False, False, True),
    ("upstream_status",    "stable", MODEL, False, False, False),   # a stable's failure: its fallback, not a retry
    ("connection_broken",  "stable", RUNNER, False, False, False),
    ("connection_broken",  "canary", MODEL, True, False, False),    # the caller has bytes: never
    ("connect_refused",    "canary", RUNNER, True, False, False),
    ("connect_refused",    "canary", RUNNER, False, True, False),   # X-Plnt-Track: canary gets the canary's answer
    ("upstream_status",    "canary", MODEL, False, True, False),
    ("connect_refused",    "stable", RUNNER, False, True, True),    # X-Plnt-Track: stable, another stable replica
    ("not_ready",          "canary", MODEL, False, False, False),   # fallback-only failures
    ("over_limit",         "canary", MODEL, False, False, False),
]


@pytest.mark.parametrize(("failure", "track", "side_effects", "first_byte", "forced", "retried"), RETRY_TABLE)
def test_retry_target(failure: str, track: str, side_effects: bool, first_byte: bool, forced: bool,
                      retried: bool) -> None:
    attempt = Attempt(failure, track, side_effects, first_byte_sent=first_byte, forced=forced)  # type: ignore[arg-type]
    assert retry_target(attempt) == ("stable" if retried else None)


@pytest.mark.parametrize(("status", "not_started", "failure"), [
    (200, False, None), (201, False, None), (400, False, None), (404, False, None), (422, False, None),
    (429, False, None),  # the model's own limit: its fallback's business, not a retry's
    (500, False, "upstream_status"), (502, False, "upstream_status"), (503, False, "upstream_status"),
    (504, False, "upstream_status"), (503, True, "not_started"),
    (502, True, "upstream_status"),  # only a 503 says "not started"
])
def test_status_failure(status: int, not_started: bool, failure: str | None) -> None:
    assert status_failure(status, not_started) == failure


@pytest.mark.parametrize(("error", "failure"), [
    (UpstreamConnectError("refused"), "connect_refused"),
    (UpstreamConnectTimeout("slow connect"), "connect_timeout"),
    (UpstreamTimeout("silent"), "upstream_timeout"),
    (UpstreamBroken("reset"), "connection_broken"),
])
def test_error_failure(error: Exception, failure: str) -> None:
    assert error_failure(error) == failure  # type: ignore[arg-type]


@pytest.mark.parametrize(("failure", "status", "first_byte", "reason"), [
    ("not_ready", None, False, "not_ready"),  # nothing promoted
    ("connect_refused", None, False, "connect_refused"),  # SIGKILLed server
    ("connect_timeout", None, False, "connect_timeout"),
    ("connection_broken", None, False, "connection_broken"),
    ("upstream_timeout", None, False, "upstream_timeout"),
    ("upstream_status", 500, False, "upstream_status"),
    ("upstream_status", 503, False, "upstream_status"),  # busy: down for this request
    ("not_started", 503, False, "not_started"),
    (None, 429, False, "over_limit"),  # the model server's own limit
    (None, 200, False, None),
    (None, 400, False, None),  # the caller's mistake goes back to the caller
    (None, 404, False, None),
    ("connection_broken", None, True, None),  # mid-stream: the caller has bytes
    (None, 429, True, None),
])
def test_fallback_reason(failure: str | None, status: int | None, first_byte: bool, reason: str | None) -> None:
    assert fallback_reason(failure, status, first_byte_sent=first_byte) == reason  # type: ignore[arg-type]
