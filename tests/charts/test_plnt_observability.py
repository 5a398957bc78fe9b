"""charts/plnt's observability, rendered with the REAL helm binary (no cluster): scraping of all three
roles (ServiceMonitors for the gateway and the reconciler, a PodMonitor for the workers), the
PrometheusRule and the Grafana dashboard ConfigMap (copies of observability/**, kept in sync here),
and OpenTelemetry's OTEL_* variables on the three roles. Kubernetes objects pass kubernetes-validate
strictly; the monitoring.coreos.com/v1 objects (CRDs it has no schema for) are checked by hand.

The copy tests compare files only (no helm): they run in the fast suite too.
"""

from __future__ import annotations

import json
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.charts.chartkit import (
    BASE,
    FULLNAME,
    NAMESPACE,
    PLNT_CHART,
    ROOT,
    check_labels,
    helm_template,
    merged,
    render,
    validate_strictly,
)
from tests.charts.test_plnt_chart import MONITOR_KINDS, check_service_monitor, container, objects, one

RULES = ROOT / "observability" / "prometheus" / "plnt-rules.yaml"
DASHBOARD = ROOT / "observability" / "grafana" / "plnt-dashboard.json"
ROLES = ("reconciler", "worker", "gateway")
MONITORING = MONITOR_KINDS | {"PrometheusRule"}

ENABLED: dict[str, Any] = merged(BASE, {
    "serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"},
                       "tokenSecret": {"secretName": "plnt-metrics-token"}},
    "prometheusRule": {"enabled": True, "labels": {"release": "prometheus"}},
    "grafanaDashboard": {"enabled": True, "annotations": {"grafana_folder": "plnt"}},
    "tracing": {"endpoint": "http://otel-collector.observability:4318", "sampler": "parentbased_traceidratio",
                "samplerArg": "0.25", "headers": {"secretName": "otel-headers"},
                "resourceAttributes": {"deployment.environment.name": "prod"}},
    "reconciler": {"replicas": 2},  # a standby too: scraped like the leader
})


def env_of(c: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in c["env"]}


def otel_env(c: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {name: e for name, e in env_of(c).items() if name.startswith("OTEL_")}


def check_prometheus_rule(doc: dict[str, Any]) -> None:
    """By hand, as the Prometheus Operator's API reference gives PrometheusRuleSpec/RuleGroup/Rule."""
    assert doc["apiVersion"] == "monitoring.coreos.com/v1" and doc["kind"] == "PrometheusRule"
    assert set(doc) == {"apiVersion", "kind", "metadata", "spec"}
    assert set(doc["metadata"]) == {"name", "namespace", "labels"}
    assert set(doc["spec"]) == {"groups"} and doc["spec"]["groups"]
    names = [group["name"] for group in doc["spec"]["groups"]]
    assert len(names) == len(set(names)), "group names are unique in a PrometheusRule"
    for group in doc["spec"]["groups"]:
        assert set(group) <= {"name", "interval", "rules", "limit", "partial_response_strategy"}, group.keys()
        assert group["rules"]
        for rule in group["rules"]:
            assert ("record" in rule) != ("alert" in rule), rule
            assert set(rule) <= {"record", "alert", "expr", "for", "keep_firing_for", "labels", "annotations"}, rule
            assert isinstance(rule["expr"], str) and rule["expr"].strip()
            for field in ("labels", "annotations"):
                assert all(isinstance(v, str) for v in rule.get(field, {}).values()), (rule, field)


# --- the copies in files/ (plain file comparisons, no helm) -------------------------------------


def test_the_chart_ships_the_rules_as_in_observability() -> None:
    copy = PLNT_CHART / "files" / "plnt-rules.yaml"
    assert copy.read_text() == RULES.read_text(), (
        f"{copy.relative_to(ROOT)} differs from {RULES.relative_to(ROOT)}: the chart cannot read files outside "
        f"its folder, so it ships a copy. Run: cp {RULES.relative_to(ROOT)} {copy.relative_to(ROOT)}")


def test_the_chart_ships_the_dashboard_as_in_observability() -> None:
    copy = PLNT_CHART / "files" / "plnt-dashboard.json"
    assert copy.read_text() == DASHBOARD.read_text(), (
        f"{copy.relative_to(ROOT)} differs from {DASHBOARD.relative_to(ROOT)}: the chart ships a copy. "
        f"Run: cp {DASHBOARD.relative_to(ROOT)} {copy.relative_to(ROOT)}")


# --- defaults: nothing new ------------------------------------------------------------------------


@pytest.mark.integration
def test_defaults_render_no_monitoring_objects_and_no_otel_variables(helm: str) -> None:
    docs = render(helm, PLNT_CHART, BASE)
    assert not [d for d in docs if d["kind"] in MONITORING or d["kind"] == "ConfigMap"]
    for role in ROLES:
        assert not otel_env(container(docs, role)), role
        assert "PLNT_POD_NAME" not in env_of(container(docs, role))
    for policy in (d for d in docs if d["kind"] == "NetworkPolicy"):
        ports = {p["port"] for rule in policy["spec"].get("egress", []) for p in rule["ports"]}
        assert not ports & {4317, 4318}, policy["metadata"]["name"]
    worker_policy = one(docs, "NetworkPolicy", f"{FULLNAME}-worker")
    assert "ingress" not in worker_policy["spec"]


# --- everything on ---------------------------------------------------------------------------------


@pytest.mark.integration
def test_enabled_objects_validate(helm: str, tmp_path: Path) -> None:
    docs = render(helm, PLNT_CHART, ENABLED)
    kinds = [d["kind"] for d in docs]
    assert kinds.count("ServiceMonitor") == 2 and kinds.count("PodMonitor") == 1 and kinds.count("PrometheusRule") == 1
    for doc in docs:
        if doc["kind"] in MONITOR_KINDS:
            check_service_monitor(doc, docs)
        elif doc["kind"] == "PrometheusRule":
            check_prometheus_rule(doc)
        else:
            validate_strictly(doc, "observability-on")
        check_labels(doc["metadata"]["labels"])
    values = tmp_path / "values.json"
    values.write_text(json.dumps(ENABLED))
    lint = subprocess.run([helm, "lint", "--strict", str(PLNT_CHART), "--namespace", NAMESPACE, "--values", str(values)],
                          capture_output=True, text=True, check=False)
    assert lint.returncode == 0 and "0 chart(s) failed" in lint.stdout, lint.stdout + lint.stderr


@pytest.mark.integration
def test_every_role_is_scraped_on_its_metrics_port(helm: str) -> None:
    docs = render(helm, PLNT_CHART, ENABLED)
    by_key = objects(docs)
    monitors = {d["metadata"]["name"]: d for d in docs if d["kind"] in MONITOR_KINDS}
    assert {name: d["kind"] for name, d in monitors.items()} == {
        f"{FULLNAME}-gateway": "ServiceMonitor", f"{FULLNAME}-reconciler": "ServiceMonitor", f"{FULLNAME}-worker": "PodMonitor"}
    for role, port in (("reconciler", 8080), ("worker", 8081), ("gateway", 8000)):
        monitor = monitors[f"{FULLNAME}-{role}"]
        assert monitor["metadata"]["labels"]["release"] == "prometheus"
        assert monitor["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] == role
        [endpoint] = monitor["spec"].get("endpoints") or monitor["spec"]["podMetricsEndpoints"]
        assert (endpoint["port"], endpoint["path"], endpoint["interval"]) == ("http", "/metrics", "30s")
        # The named port is the role's container port (and its Service's target).
        [named] = [p for p in container(docs, role)["ports"] if p["name"] == endpoint["port"]]
        assert named["containerPort"] == port, role
        if monitor["kind"] == "ServiceMonitor":
            service = by_key[("Service", NAMESPACE, f"{FULLNAME}-{role}")]
            assert [p["targetPort"] for p in service["spec"]["ports"] if p["name"] == "http"] == ["http"]
        # The token where /metrics sits behind the caller tokens; the worker's health listener has none.
        auth = endpoint.get("authorization")
        if role == "worker":
            assert auth is None
        else:
            assert auth == {"type": "Bearer", "credentials": {"name": "plnt-metrics-token", "key": "token"}}, role


@pytest.mark.integration
def test_prometheus_may_reach_every_scraped_port_through_the_network_policies(helm: str) -> None:
    narrowed = merged(ENABLED, {"networkPolicy": {"gatewayFrom": [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ingress-nginx"}}}]}})
    prometheus = [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}]
    for values in (ENABLED, narrowed):
        docs = render(helm, PLNT_CHART, values)
        for role, port in (("reconciler", 8080), ("worker", 8081), ("gateway", 8000)):
            ingress = one(docs, "NetworkPolicy", f"{FULLNAME}-{role}")["spec"]["ingress"]
            allowed = [rule for rule in ingress if {"port": port, "protocol": "TCP"} in rule["ports"]]
            if role == "gateway" and values is ENABLED:
                assert allowed == [{"ports": [{"port": 8000, "protocol": "TCP"}]}], "anyone: no extra rule needed"
            else:
                assert {"from": prometheus, "ports": [{"port": port, "protocol": "TCP"}]} in allowed, (role, ingress)
    custom = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
               "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}]
    docs = render(helm, PLNT_CHART, merged(ENABLED, {"networkPolicy": {"prometheusFrom": custom}}))
    assert one(docs, "NetworkPolicy", f"{FULLNAME}-worker")["spec"]["ingress"] == [
        {"from": custom, "ports": [{"port": 8081, "protocol": "TCP"}]}]


@pytest.mark.integration
def test_the_prometheus_rule_holds_exactly_the_repository_groups(helm: str) -> None:
    [rule] = [d for d in render(helm, PLNT_CHART, ENABLED) if d["kind"] == "PrometheusRule"]
    check_prometheus_rule(rule)
    assert rule["metadata"]["name"] == f"{FULLNAME}-rules" and rule["metadata"]["namespace"] == NAMESPACE
    assert rule["metadata"]["labels"]["release"] == "prometheus"
    assert rule["spec"]["groups"] == yaml.safe_load(RULES.read_text())["groups"]
    alerts = {r["alert"] for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r}
    assert {"PlntCanaryFailingGates", "PlntSagaStuck", "PlntGatewayErrorRate", "PlntGitUnreachable"} <= alerts


@pytest.mark.integration
def test_the_dashboard_config_map_for_grafanas_sidecar(helm: str) -> None:
    docs = render(helm, PLNT_CHART, ENABLED)
    board = one(docs, "ConfigMap", f"{FULLNAME}-dashboard")
    assert board["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert board["metadata"]["annotations"] == {"grafana_folder": "plnt"}
    [(key, text)] = board["data"].items()
    assert key.endswith(".json")
    assert json.loads(text) == json.loads(DASHBOARD.read_text()) and text == DASHBOARD.read_text()
    # Fits a ConfigMap (1 MiB) and kubectl apply's last-applied annotation (256 KiB).
    assert len(text.encode()) < 256 * 1024

    custom = merged(ENABLED, {"grafanaDashboard": {"label": "grafana.example.com/dashboard", "labelValue": "plnt",
                                                   "labels": {"team": "platform"}, "namespace": "monitoring"}})
    board = one(render(helm, PLNT_CHART, custom), "ConfigMap", f"{FULLNAME}-dashboard", namespace="monitoring")
    labels = board["metadata"]["labels"]
    assert labels["grafana.example.com/dashboard"] == "plnt" and labels["team"] == "platform"
    assert "grafana_dashboard" not in labels
    validate_strictly(board, "dashboard-custom")


@pytest.mark.integration
def test_tracing_variables_on_all_three_roles_and_headers_from_the_secret(helm: str) -> None:
    docs = render(helm, PLNT_CHART, ENABLED)
    for role in ROLES:
        c = container(docs, role)
        env = otel_env(c)
        assert set(env) == {"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_SERVICE_NAME",
                            "OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG", "OTEL_EXPORTER_OTLP_HEADERS",
                            "OTEL_RESOURCE_ATTRIBUTES"}, role
        values = {name: e.get("value") for name, e in env.items()}
        assert values["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://otel-collector.observability:4318"
        assert values["OTEL_EXPORTER_OTLP_PROTOCOL"] == "http/protobuf"
        assert values["OTEL_SERVICE_NAME"] == f"plnt-{role}"
        assert (values["OTEL_TRACES_SAMPLER"], values["OTEL_TRACES_SAMPLER_ARG"]) == ("parentbased_traceidratio", "0.25")
        # The collector's credentials only by reference: never a value in the manifest.
        assert env["OTEL_EXPORTER_OTLP_HEADERS"] == {"name": "OTEL_EXPORTER_OTLP_HEADERS", "valueFrom": {
            "secretKeyRef": {"name": "otel-headers", "key": "headers"}}}
        attributes = dict(pair.split("=", 1) for pair in values["OTEL_RESOURCE_ATTRIBUTES"].split(","))
        assert attributes == {"k8s.namespace.name": NAMESPACE, "k8s.pod.name": "$(PLNT_POD_NAME)",
                              "k8s.deployment.name": f"{FULLNAME}-{role}", "deployment.environment.name": "prod"}
        # $(PLNT_POD_NAME) expands only when that variable comes earlier in the list.
        names = [e["name"] for e in c["env"]]
        assert names.index("PLNT_POD_NAME") < names.index("OTEL_RESOURCE_ATTRIBUTES")
        assert env_of(c)["PLNT_POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
        # The collector is reachable through the role's NetworkPolicy.
        egress = one(docs, "NetworkPolicy", f"{FULLNAME}-{role}")["spec"]["egress"]
        assert {"ports": [{"port": 4318, "protocol": "TCP"}, {"port": 4317, "protocol": "TCP"}]} in egress, role
    # Runner pods export their spans too (the Helm driver gives them the filtered OTEL_*).
    runner_policies = [d for d in docs if d["kind"] == "NetworkPolicy" and d["metadata"]["name"].endswith("-runners")]
    assert runner_policies
    for policy in runner_policies:
        assert {"ports": [{"port": 4318, "protocol": "TCP"}, {"port": 4317, "protocol": "TCP"}]} in policy["spec"]["egress"]

    plain = render(helm, PLNT_CHART, merged(BASE, {"tracing": {"endpoint": "http://collector:4317", "protocol": "grpc"}}))
    for role in ROLES:
        env = otel_env(container(plain, role))
        assert set(env) == {"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_SERVICE_NAME",
                            "OTEL_RESOURCE_ATTRIBUTES"}, role
        assert env["OTEL_EXPORTER_OTLP_PROTOCOL"]["value"] == "grpc"


@pytest.mark.integration
def test_the_packaged_chart_carries_the_copies(helm: str, tmp_path: Path) -> None:
    result = subprocess.run([helm, "package", str(PLNT_CHART), "--destination", str(tmp_path)],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    [package] = tmp_path.glob("plnt-*.tgz")
    with tarfile.open(package) as tar:
        names = set(tar.getnames())
    assert {"plnt/files/plnt-rules.yaml", "plnt/files/plnt-dashboard.json"} <= names, sorted(names)


# --- values.schema.json: the new keys are as strict as the rest -------------------------------------


@pytest.mark.integration
@pytest.mark.parametrize(("change", "expected"), [
    ({"tracing": {"endpont": "http://collector:4318"}}, "additional properties 'endpont' not allowed"),
    ({"tracing": {"protocol": "http"}}, "protocol"),
    ({"tracing": {"endpoint": "collector:4318"}}, "endpoint"),
    ({"tracing": {"sampler": "sometimes"}}, "sampler"),
    ({"tracing": {"samplerArg": 0.1}}, "got number, want string"),
    ({"tracing": {"headers": {"secretName": "otel", "key": "headers", "value": "authorization=Bearer x"}}},
     "additional properties 'value' not allowed"),
    ({"tracing": {"resourceAttributes": {"team": "a,b"}}}, "resourceAttributes"),
    ({"prometheusRule": {"enable": True}}, "additional properties 'enable' not allowed"),
    ({"prometheusRule": {"labels": {"release": 1}}}, "got number, want string"),
    ({"grafanaDashboard": {"labelValue": 1}}, "got number, want string"),
    ({"grafanaDashboard": {"namespace": "Monitoring"}}, "namespace"),
    ({"grafanaDashboard": {"folder": "plnt"}}, "additional properties 'folder' not allowed"),
    ({"networkPolicy": {"prometheusFrom": [{"podSelektor": {}}]}}, "additional properties 'podSelektor' not allowed"),
    ({"networkPolicy": {"otelCollector": {"ports": [{"port": 70000}]}}}, "otelCollector"),
])
def test_schema_rejects_typos_in_the_new_keys(helm: str, change: dict[str, Any], expected: str) -> None:
    result = helm_template(helm, PLNT_CHART, merged(BASE, change))
    assert result.returncode != 0
    assert "values don't meet the specifications of the schema" in result.stderr and expected in result.stderr, result.stderr
