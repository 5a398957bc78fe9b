"""The Prometheus rules and the Grafana dashboard in observability/, checked with the real promtool
(Debian's `prometheus` package; those tests start it, so they are marked integration) and against
the series the real registries expose."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from tests.observability.promql import (
    RULE_TESTS,
    RULES,
    SERIES_NAME,
    dashboard,
    dashboard_exprs,
    exposed_names,
    recorded_names,
    rules,
    tool,
    variable_queries,
)

ALERTS = {"PlntCanaryFailingGates", "PlntRolloutFailed", "PlntSagaStuck", "PlntGatewayErrorRate", "PlntGitUnreachable"}


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([tool("promtool"), *args], capture_output=True, text=True, timeout=60)


@pytest.mark.integration
def test_promtool_check_rules_passes() -> None:
    result = promtool("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 15 rules found" in result.stdout, result.stdout


@pytest.mark.integration
def test_promtool_rule_unit_tests_pass() -> None:
    result = promtool("test", "rules", str(RULE_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout, result.stdout


@pytest.mark.integration
def test_the_rule_unit_tests_catch_a_broken_alert(tmp_path: Path) -> None:
    """The unit tests can fail: the canary alert pointed at the wrong outcome, or the stuck-saga
    threshold raised, each fails promtool test rules."""
    text = RULES.read_text()
    for broken in (text.replace('outcome="rolled_back"', 'outcome="promoted"'), text.replace("> 30 * 60", "> 60 * 60")):
        assert broken != text
        (tmp_path / "plnt-rules.yaml").write_text(broken)
        (tmp_path / "plnt-rules.test.yaml").write_text(RULE_TESTS.read_text())
        result = promtool("test", "rules", str(tmp_path / "plnt-rules.test.yaml"))
        assert result.returncode != 0 and "FAILED" in result.stdout + result.stderr, result.stdout + result.stderr


def test_every_alert_is_tested_firing_and_silent() -> None:
    alerts = {rule["alert"]: rule for group in rules()["groups"] for rule in group["rules"] if "alert" in rule}
    assert set(alerts) == ALERTS
    for name, rule in alerts.items():
        assert {"summary", "description", "runbook"} <= set(rule["annotations"]), name
        assert rule["labels"]["severity"] in ("warning", "critical"), name
    cases = [case for test in yaml.safe_load(RULE_TESTS.read_text())["tests"] for case in test.get("alert_rule_test", [])]
    for name in ALERTS:
        assert any(c["alertname"] == name and c["exp_alerts"] for c in cases), f"{name} is never shown firing"
        assert any(c["alertname"] == name and not c["exp_alerts"] for c in cases), f"{name} is never shown silent"


def test_rules_read_only_series_plnt_exposes() -> None:
    known = exposed_names() | recorded_names()
    for group in rules()["groups"]:
        for rule in group["rules"]:
            for name in SERIES_NAME.findall(rule["expr"]):
                assert name in known, f"rule {rule.get('record') or rule.get('alert')} reads {name}, which plnt does not expose"


def test_the_registries_expose_what_the_issue_asks_for() -> None:
    names = exposed_names()
    for name in ("plnt_rollouts_total", "plnt_saga_step_duration_seconds_bucket", "plnt_smoke_gate_value",
                 "plnt_smoke_gate_budget", "plnt_smoke_gate_failures_total", "plnt_commit_to_ready_seconds_bucket",
                 "plnt_reconcile_duration_seconds_bucket", "plnt_git_fetch_errors_total",
                 "plnt_git_last_fetch_success_timestamp_seconds", "plnt_workflows", "plnt_canary_traffic_ratio",
                 "plnt_saga_start_timestamp_seconds", "plnt_gateway_request_duration_seconds_bucket",
                 "plnt_gateway_ttft_seconds_bucket"):
        assert name in names, name


def test_dashboard_queries_only_series_plnt_exposes() -> None:
    known = exposed_names() | recorded_names()
    exprs = dashboard_exprs() + variable_queries()
    assert len(exprs) > 20
    for where, expr in exprs:
        names = SERIES_NAME.findall(expr)
        assert names, f"{where} reads no plnt series: {expr}"
        for name in names:
            assert name in known, f"{where} reads {name}, which plnt does not expose"


def test_dashboard_shape() -> None:
    board = dashboard()
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert {"namespace", "workflow"} <= set(variables)
    panels = [p for p in board["panels"] if p["type"] != "row"]
    assert len({p["id"] for p in board["panels"]}) == len(board["panels"]), "panel ids must be unique"
    for panel in panels:
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]
    exprs = " ".join(expr for _, expr in dashboard_exprs())
    # what the issue names: latency and TTFT by track, canary vs stable, rollouts, gates, steps,
    # commit to Ready, reconcile duration, git fetch errors
    for needed in ("plnt_gateway_request_duration_seconds_bucket", "plnt_gateway_ttft_seconds_bucket", "by (track",
                   'track="canary"', "plnt_rollouts_total", "plnt_smoke_gate_value", "plnt_smoke_gate_budget",
                   "plnt_saga_step_duration_seconds_bucket", "plnt_commit_to_ready_seconds_bucket",
                   "plnt_reconcile_duration_seconds_bucket", "plnt_git_fetch_errors_total"):
        assert needed in exprs, needed
    for panel in panels:  # the variables filter every per-workflow panel
        for target in panel["targets"]:
            if "namespace" in target["expr"] and "plnt_gateway_in_flight" not in target["expr"]:
                assert '"$namespace"' in target["expr"], (panel["title"], target["expr"])
