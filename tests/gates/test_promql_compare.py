"""The metric gate's verdict (reconciler/gates/promql.py `compare`) and the URLs it refuses before
any connection: pure functions, nothing started."""

from __future__ import annotations

import math

import pytest
from plnt.reconciler.errors import GateUnusable
from plnt.reconciler.gates.promql import compare, query_value


@pytest.mark.parametrize("value, bounds, passed, reason", [
    (0.0123, {"max": 0.01}, False, "error ratio 0.0123 > max 0.01"),
    (0.005, {"max": 0.01}, True, "error ratio 0.005 <= max 0.01"),
    (0.01, {"max": 0.01}, True, "error ratio 0.01 <= max 0.01"),  # inclusive
    (0.9, {"min": 0.95}, False, "error ratio 0.9 < min 0.95"),
    (0.95, {"min": 0.95}, True, "error ratio 0.95 >= min 0.95"),  # inclusive
    (0.5, {"min": 0.1, "max": 0.9}, True, "error ratio 0.5 within [min 0.1, max 0.9]"),
    (0.05, {"min": 0.1, "max": 0.9}, False, "error ratio 0.05 < min 0.1"),
    (0.95, {"min": 0.1, "max": 0.9}, False, "error ratio 0.95 > max 0.9"),
    (math.inf, {"max": 1.0}, False, "error ratio inf > max 1"),
    (math.nan, {"max": 1.0}, False, "error ratio nan > max 1"),  # NaN never passes
    (math.nan, {"min": 0.0}, False, "error ratio nan < min 0"),
    (1234567.0, {"max": 1e6}, False, "error ratio 1.23457e+06 > max 1e+06"),
])
def test_compare(value: float, bounds: dict[str, float], passed: bool, reason: str) -> None:
    assert compare(value, what="error ratio", **bounds) == (passed, reason)


def test_compare_needs_a_bound_that_can_pass() -> None:
    with pytest.raises(ValueError, match="max, min or both"):
        compare(1.0, max=None, min=None)
    with pytest.raises(ValueError, match="no value could pass"):
        compare(1.0, min=2.0, max=1.0)


@pytest.mark.parametrize("url", ["ftp://user:pw@prometheus:9090", "http://user:pw@prometheus:port", "http://user:pw@[::1",
                                 "prometheus:9090", "http://user:pw@prometheus:9090/?token=pw", ""])
async def test_a_url_that_is_not_http_is_refused_before_connecting(url: str) -> None:
    with pytest.raises(GateUnusable) as caught:
        await query_value(url, 'sum(rate(plnt_gateway_requests_total{code="500"}[5m]))')
    message = str(caught.value)
    assert "is not http(s)://" in message and "plnt_gateway_requests_total" in message, message
    assert "pw" not in message, message
