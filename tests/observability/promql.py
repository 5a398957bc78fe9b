"""What the observability tests share: where the rules and dashboard live, the series a running
plnt can expose (read from the real registries, not listed by hand), and the dashboard's PromQL."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from plnt.gateway.metrics import GatewayMetrics
from plnt.reconciler.control.metrics import ControlPlaneMetrics

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "observability" / "prometheus" / "plnt-rules.yaml"
RULE_TESTS = ROOT / "observability" / "prometheus" / "plnt-rules.test.yaml"
DASHBOARD = ROOT / "observability" / "grafana" / "plnt-dashboard.json"
INSTALL = "bash tools/install_test_services.sh (Debian package prometheus: sudo apt-get install -y prometheus)"

# plnt's own series and recording rules (level:plnt_metric:operations)
SERIES_NAME = re.compile(r"\b(?:[a-z_]+:)?plnt_[a-z0-9_]+(?::[a-z0-9_]+)?\b")

# Grafana's variables, as a query of the whole range would see them
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$__interval": "15s", "$__range": "5m", "$namespace": ".*",
                     "$workflow": ".*"}


def tool(name: str) -> str:
    """The path of a Prometheus binary; a missing one FAILS the test with the command that installs it."""
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed: run `{INSTALL}`")
    return path


def exposed_names() -> set[str]:
    """Every sample name the registries of a running plnt can expose (gateway and control plane)."""
    names: set[str] = set()
    for registry in (GatewayMetrics().registry, ControlPlaneMetrics().registry):
        for family in registry.collect():
            if family.type == "counter":
                names |= {family.name + "_total", family.name + "_created"}
            elif family.type == "histogram":
                names |= {family.name + suffix for suffix in ("_bucket", "_count", "_sum", "_created")}
            else:
                names.add(family.name)
    return names


def rules() -> dict[str, Any]:
    return yaml.safe_load(RULES.read_text())


def recorded_names() -> set[str]:
    return {rule["record"] for group in rules()["groups"] for rule in group["rules"] if "record" in rule}


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def dashboard_exprs() -> list[tuple[str, str]]:
    """(where, PromQL) of every panel target and annotation of the dashboard."""
    board = dashboard()
    found = []
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            found.append((f"panel {panel['title']!r} {target['refId']}", target["expr"]))
    for annotation in board["annotations"]["list"]:
        if "expr" in annotation:
            found.append((f"annotation {annotation['name']!r}", annotation["expr"]))
    return found


def variable_queries() -> list[tuple[str, str]]:
    """(variable, its label_values() query) of the dashboard's query variables."""
    return [(v["name"], v["query"]["query"]) for v in dashboard()["templating"]["list"] if v["type"] == "query"]


def substitute(expr: str) -> str:
    # longest first: $__rate_interval before $__range / $__interval
    for name in sorted(GRAFANA_VARIABLES, key=len, reverse=True):
        expr = expr.replace(name, GRAFANA_VARIABLES[name])
    assert "$" not in expr, f"a Grafana variable this test does not know: {expr}"
    return expr
