"""When the gateway sends a request again, decided without I/O (forward.py and chat.py act on it).

A failed attempt is retried once, and only before the caller got a byte of the answer:
- Nothing reached the runner, or the runner says nothing ran: the connection was refused, the connect
  timed out, or the runner answered 503 with `X-Plnt-Not-Started: 1` (routes.NOT_STARTED_HEADER).
  Any request may be sent again: on a stable replica other than the failed one
  (a canary's request goes to the stable release, a stable replica's to another replica).
- Anything else before the first byte (the runner's 502/503/504 or other 5xx, a timeout before the
  answer, a connection reset under the request) proves nothing: the body reached a runner that may
  have started the work. A runner request (`POST /workflows/{name}/invoke`, a workflow's chat) may
  run a recipe's side-effecting steps, so it is never sent again then. A ModelDeployment's chat
  completion has no side effect: on a canary it is retried on the stable release.
- A request that named its track (X-Plnt-Track: canary) is never moved to the other track.

A ModelDeployment with `fallback: OTHER` sends the chat to OTHER when the model is down (nothing
promoted, unreachable, a 5xx or a timeout before the first byte, after the retry above) or over its
own limits (its server's 429; a 503 counts as down). One hop: the fallback's own fallback is not followed. The
caller's GatewayPolicy limits (per token) are checked before any of this and never escaped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from plnt.core.routes import Track
from plnt.core.upstream import UpstreamConnectError, UpstreamConnectTimeout, UpstreamError, UpstreamTimeout

# Why an attempt failed, as the retry and fallback decisions and the metrics (reason label) name it.
Failure = Literal[
    "connect_refused",  # no connection: nothing was sent
    "connect_timeout",  # the connect did not complete: nothing was sent
    "not_started",  # the runner answered 503 X-Plnt-Not-Started: 1
    "upstream_status",  # a 5xx answer (other than the above)
    "upstream_timeout",  # no answer within the read timeout
    "connection_broken",  # the connection broke before the answer
    "not_ready",  # the route has no promoted release (fallback only)
    "over_limit",  # the model server refused for its own limit (429; fallback only)
]

NOTHING_RAN: frozenset[Failure] = frozenset({"connect_refused", "connect_timeout", "not_started"})
MODEL_DOWN: frozenset[Failure] = frozenset({"connect_refused", "connect_timeout", "not_started", "upstream_status",
                                            "upstream_timeout", "connection_broken", "not_ready"})


@dataclass(frozen=True, slots=True)
class Attempt:
    """What one attempt's failure was, and what the request is."""

    failure: Failure
    track: Track  # of the failed backend
    side_effects: bool  # a runner's request (it may run side-effecting steps); False: a model's chat
    first_byte_sent: bool = False  # the caller already got part of the answer
    forced: bool = False  # the request named its track (X-Plnt-Track)


Retry = Literal["stable"]  # where a retry goes: a stable replica other than the failed backend


def retry_target(attempt: Attempt) -> Retry | None:
    """Where to send the request again after `attempt` failed, or None (the failure is answered)."""
    if attempt.first_byte_sent:
        return None
    if attempt.forced and attempt.track == "canary":
        return None  # the caller asked for the canary: it gets the canary's answer
    if attempt.failure in NOTHING_RAN:
        return "stable"
    if attempt.failure in ("upstream_status", "upstream_timeout", "connection_broken"):
        return "stable" if attempt.track == "canary" and not attempt.side_effects else None
    return None


def error_failure(exc: UpstreamError) -> Failure:
    """The failure an upstream client error is (core/upstream.py splits them by what reached the runner)."""
    if isinstance(exc, UpstreamConnectError):
        return "connect_refused"
    if isinstance(exc, UpstreamConnectTimeout):
        return "connect_timeout"
    if isinstance(exc, UpstreamTimeout):
        return "upstream_timeout"
    return "connection_broken"


def status_failure(status: int, not_started: bool) -> Failure | None:
    """The failure a backend's answer status is, before its first byte reached the caller (None: an answer
    to relay, a 2xx, or the caller's own 4xx)."""
    if status == 503 and not_started:
        return "not_started"
    if status >= 500:
        return "upstream_status"
    return None


def fallback_reason(failure: Failure | None, status: int | None = None, *,
                    first_byte_sent: bool = False) -> Failure | None:
    """Why a model's chat goes to its fallback model, or None: the model is down (`failure` in
    MODEL_DOWN: a 503 is one), or its server refused for its own limit (429). Never once the caller got
    a byte of the answer."""
    if first_byte_sent:
        return None
    if failure in MODEL_DOWN:
        return failure
    if status == 429:
        return "over_limit"
    return None
