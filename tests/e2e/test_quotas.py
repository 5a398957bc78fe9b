"""Quotas and usage on the embedded default, as a user runs them: `plnt up` in its own process (its
gateway worker processes, embedded Temporal, real runner processes), a tokens file with named tokens
and a GatewayPolicy committed to the spec repository; `plnt usage` as a console command.

The runners' model is MockBackend, a STAND-IN for a model server (the LLM token counts on a real
model: tests/models/test_model_quotas.py)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import SpecRepo
from tests.e2e.test_gateway_workers import ADMIN, AuthedPlntUp
from tests.e2e.test_plnt_up_process import REVIEW, PlntUp, gateway_port
from tests.e2e.test_plnt_up_process import started as started  # noqa: F401 (the fixture: plnt processes killed after the test)
from tests.e2e.test_verbs import plnt

pytestmark = pytest.mark.integration

APP = "app-7c1e-never-in-a-log"
OTHER = "other-3f9a-never-in-a-log"
POLICY = """\
apiVersion: plnt.work/v1
kind: GatewayPolicy
metadata: {name: quotas}
spec:
  currency: EUR
  prices: [{model: review-responder, inputPerMillion: 0.5, outputPerMillion: 1.5}]
  tokens:
    - {name: app, requestsPerMinute: 4}
"""


def post(up: PlntUp, token: str) -> httpx.Response:
    """One invocation on a connection of its own: the kernel spreads them over the gateway processes."""
    return httpx.post(f"{up.url}/workflows/review-responder/invoke", json=REVIEW, timeout=30, trust_env=False,
                      headers={"authorization": f"Bearer {token}"})


def usage(token_file: Path, up: PlntUp) -> dict[str, Any]:
    shown = plnt("usage", "-o", "json", "--url", up.url, "--token-file", str(token_file))
    assert shown.returncode == 0, up.why(shown.stderr)
    return json.loads(shown.stdout)


def wait_usage(token_file: Path, up: PlntUp, want: dict[str, int], timeout: float = 15.0) -> dict[str, Any]:
    """GET /usage through `plnt usage` until its requests per token are `want` (each gateway worker
    pushes its metrics every 2 s)."""
    deadline = time.monotonic() + timeout
    while True:
        body = usage(token_file, up)
        got = {row["token"]: row["requests"] for row in body["usage"]}
        if got == want or time.monotonic() > deadline:
            assert got == want, up.why(f"plnt usage: {body}")
            return body
        time.sleep(0.5)


def test_a_token_over_its_request_rate_gets_429_another_does_not_and_usage_shows_both(
        spec_repo: SpecRepo, tmp_path: Path, started: list[PlntUp]) -> None:  # noqa: F811
    spec_repo.write("policies/quotas.yaml", POLICY)
    spec_repo.commit("quotas: app may make 4 requests a minute")
    tokens = tmp_path / "tokens"
    tokens.write_text(f"{ADMIN} name=ops\n{APP} name=app scopes=invoke,read\n{OTHER} name=other scopes=invoke,read\n")
    up = AuthedPlntUp(spec_repo.path, tmp_path / "state", gateway_port(), tmp_path / "plnt.log",
                      extra=("--tokens-file", str(tokens)))  # the default: one gateway worker per core
    started.append(up)
    up.wait_ready()

    codes = []
    refused = None
    for _ in range(12):
        answer = post(up, APP)
        codes.append(answer.status_code)
        if answer.status_code == 429 and refused is None:
            refused = answer
    served = codes.count(200)
    # Each gateway process lets through its share (4 / processes); together never more than 4.
    assert 1 <= served <= 4 and codes.count(429) == 12 - served, up.why(f"app's answers: {codes}")
    assert refused is not None
    retry_after = int(refused.headers["retry-after"])
    assert 1 <= retry_after <= 60, refused.headers
    error = refused.json()["error"]
    assert (error["type"], error["limit"], error["token"]) == ("rate_limited", "requestsPerMinute", "app"), error
    assert APP not in refused.text

    for _ in range(6):  # another token, no limit of its own: unaffected
        answer = post(up, OTHER)
        assert answer.status_code == 200, up.why(answer.text)

    admin_file, app_file = tmp_path / "admin.token", tmp_path / "app.token"
    admin_file.write_text(ADMIN)
    app_file.write_text(APP)
    body = wait_usage(admin_file, up, {"app": served, "other": 6})
    assert body["currency"] == "EUR"
    assert body["limits"] == [{"token": "app", "requestsPerMinute": 4, "tokensPerMinute": None, "budget": None}]
    own = usage(app_file, up)  # a read token: its own name only
    assert [row["token"] for row in own["usage"]] == ["app"], own
    table = plnt("usage", "--url", up.url, "--token-file", str(admin_file))
    assert table.returncode == 0 and table.stdout.split("\n")[0].split() == [
        "TOKEN", "NAMESPACE/WORKFLOW", "REQUESTS", "PROMPT", "COMPLETION", "COST"], table.stdout
    metrics = httpx.get(f"{up.url}/metrics", headers={"authorization": f"Bearer {ADMIN}"}, trust_env=False).text
    assert 'plnt_gateway_quota_denials_total{limit="requestsPerMinute",token="app"}' in metrics

    # The limits are configuration in git: a commit without app's entry lifts them in every process.
    spec_repo.write("policies/quotas.yaml", POLICY.replace("    - {name: app, requestsPerMinute: 4}\n", "  []\n")
                    .replace("  tokens:\n  []", "  tokens: []"))
    spec_repo.commit("quotas: app unlimited")
    deadline = time.monotonic() + 30
    while [post(up, APP).status_code for _ in range(4)] != [200] * 4:
        assert time.monotonic() < deadline, up.why("the commit lifting app's limit did not reach every gateway process")
        time.sleep(0.5)
