"""Runner pods on Kubernetes get the same filtered OTEL_* settings as local runners.

The Helm driver builds the workflow-runner chart's `tracing` values from the worker's environment
with telemetry.RUNNER_ENV_NAMES (the local driver's list); the chart puts them in the runner
container's env; its schema refuses any other name. The render tests run the REAL helm binary
(`helm template`) on exactly the values the driver hands to helm (RecordingHelm, test_helm_chart's
stand-in for helm's cluster side) and validate every object with kubernetes-validate strictly.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from plnt.core import telemetry
from plnt.reconciler.drivers.helm import (
    RUNNER_SERVICE_NAME,
    HelmChartError,
    HelmDriver,
    classify,
    render_values,
    tracing_values,
)
from plnt.reconciler.drivers.spawn import allowlisted_env

from tests.charts.chartkit import restricted_problems
from tests.reconciler.drivers.test_helm_chart import (
    BACKEND,
    CASES,
    CHART,
    HELM_CANDIDATES,
    IMAGE,
    K8S_VERSION,
    RecordingHelm,
    by_kind,
    helm_template,
    install_request,
    render,
)


@pytest.fixture(scope="module")
def helm() -> str:
    found = next((str(path) for path in HELM_CANDIDATES if path.is_file()), None)
    if found is None:
        pytest.fail("the real helm binary is missing: run tools/install_helm.sh (it installs helm into .venv/bin)")
    return found


@pytest.fixture(scope="module")
def validate() -> Any:
    try:
        import kubernetes_validate
    except ImportError:
        pytest.fail("kubernetes-validate is missing: .venv/bin/pip install -e '.[test]'")
    return kubernetes_validate.validate


ENDPOINT = "http://otel-collector.observability:4318"
# The worker's environment as the plnt chart sets it (tracing.*), plus what must never reach a pod.
WORKER_ENV = {
    "OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT,
    "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
    "OTEL_SERVICE_NAME": "plnt-worker",
    "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
    "OTEL_TRACES_SAMPLER_ARG": "0.25",
    "OTEL_BSP_SCHEDULE_DELAY": "500",
    "OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer collector-secret-token",
    "OTEL_EXPORTER_OTLP_TRACES_HEADERS": "x-api-key=collector-secret-key",
    "OTEL_EXPORTER_OTLP_CLIENT_KEY": "/etc/plnt/otel/client.key",
    "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE": "/etc/plnt/otel/client.crt",
    "OTEL_EXPORTER_OTLP_CERTIFICATE": "/etc/plnt/otel/ca.crt",
    "OTEL_RESOURCE_ATTRIBUTES": "k8s.pod.name=plnt-worker-0",
    "PLNT_POD_NAME": "plnt-worker-0",
    "AWS_SECRET_ACCESS_KEY": "registry-secret",
    "PATH": "/usr/bin",
}
SECRETS = ("collector-secret-token", "collector-secret-key", "client.key", "client.crt", "registry-secret")
EXPECTED_ENV = {
    "OTEL_BSP_SCHEDULE_DELAY": "500",
    "OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT,
    "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
    "OTEL_SERVICE_NAME": "plnt-runner",
    "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
    "OTEL_TRACES_SAMPLER_ARG": "0.25",
}


# --- the values (no helm) ----------------------------------------------------------------------


def test_tracing_values_keep_only_the_runner_allowlist_and_name_the_runner() -> None:
    values = tracing_values(WORKER_ENV)
    assert values == {"tracing": {"env": EXPECTED_ENV}}
    assert set(values["tracing"]["env"]) <= telemetry.RUNNER_ENV_NAMES
    # Exactly what a local runner inherits of the same environment (the same list), but the name.
    local = {name: value for name, value in allowlisted_env(WORKER_ENV).items() if name.startswith("OTEL_")}
    assert {**local, "OTEL_SERVICE_NAME": RUNNER_SERVICE_NAME} == values["tracing"]["env"]
    assert not any(secret in json.dumps(values) for secret in SECRETS)


def test_grpc_and_traces_specific_settings_pass_too() -> None:
    env = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4317", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc",
           "OTEL_TRACES_EXPORTER": "otlp"}
    assert tracing_values(env) == {"tracing": {"env": {**env, "OTEL_SERVICE_NAME": "plnt-runner"}}}


@pytest.mark.parametrize("env", [
    {},  # off by default
    {"OTEL_SERVICE_NAME": "plnt-worker", "OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer x"},  # no exporter
    {**WORKER_ENV, "OTEL_SDK_DISABLED": "true"},
    {**WORKER_ENV, "OTEL_TRACES_EXPORTER": "none"},
])
def test_tracing_off_adds_no_values_at_all(env: dict[str, str]) -> None:
    assert tracing_values(env) == {}
    run, track = CASES["cpu-fixed-stable"]
    request = install_request(run, track)
    values = render_values(request, run.spec, BACKEND, IMAGE, tracing=tracing_values(env))
    assert "tracing" not in values
    assert values == render_values(request, run.spec, BACKEND, IMAGE), "off renders exactly today's values"


def test_the_chart_schema_accepts_exactly_the_runner_allowlist() -> None:
    # The schema spells the names out (helm has no other way): they must stay the telemetry list.
    schema = json.loads((CHART / "values.schema.json").read_text())
    env = schema["properties"]["tracing"]["properties"]["env"]
    assert env["additionalProperties"] is False
    assert set(env["properties"]) == telemetry.RUNNER_ENV_NAMES
    assert "OTEL_EXPORTER_OTLP_HEADERS" not in env["properties"]


# --- what the driver hands helm, rendered by the real helm ---------------------------------------


async def driver_values(environ: dict[str, str], case: str = "gpu-autoscaled-canary") -> tuple[dict[str, Any], list[str]]:
    run, track = CASES[case]
    recorder = RecordingHelm()
    driver = HelmDriver(BACKEND, lambda ns, name, fp: run.spec if fp == run.fingerprint() else None,
                        image=IMAGE, runner=recorder, environ=environ)
    await driver.install(install_request(run, track))
    [(args, values)] = recorder.upgrades
    return values, args


def rendered(helm: str, values: dict[str, Any], args: list[str]) -> list[dict[str, Any]]:
    return render(helm, args[2], args[3], args[args.index("--namespace") + 1], values)


@pytest.mark.integration
@pytest.mark.parametrize("case", ["gpu-autoscaled-canary", "cpu-fixed-stable"])
async def test_tracing_on_puts_only_allowlisted_otel_env_in_the_runner_container(
        helm: str, validate: Any, case: str) -> None:
    values, args = await driver_values(WORKER_ENV, case)
    assert values["tracing"] == {"env": EXPECTED_ENV}
    docs = rendered(helm, values, args)
    for doc in docs:
        validate(doc, K8S_VERSION, strict=True)
    assert not any(secret in json.dumps(docs) for secret in SECRETS), "no header, key or secret in any manifest"

    pod = by_kind(docs)["Deployment"]["spec"]["template"]
    assert restricted_problems(pod) == []
    [container] = pod["spec"]["containers"]
    env = {entry["name"]: entry for entry in container["env"]}
    otel = {name: entry["value"] for name, entry in env.items() if name.startswith("OTEL_")}
    release = args[2]
    assert otel == {**EXPECTED_ENV, "OTEL_RESOURCE_ATTRIBUTES":
                    f"k8s.namespace.name=agents,k8s.pod.name=$(PLNT_POD_NAME),k8s.deployment.name={release}"}
    assert set(otel) - {"OTEL_RESOURCE_ATTRIBUTES"} <= telemetry.RUNNER_ENV_NAMES
    assert env["PLNT_POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    # Declared before its use: Kubernetes expands $(PLNT_POD_NAME) only from earlier entries.
    names = [entry["name"] for entry in container["env"]]
    assert names.index("PLNT_POD_NAME") < names.index("OTEL_RESOURCE_ATTRIBUTES")
    # The init container (recipe fetch) is not traced and gets none of it.
    [init] = pod["spec"]["initContainers"]
    assert not any(entry["name"].startswith("OTEL_") for entry in init.get("env", []))


@pytest.mark.integration
@pytest.mark.parametrize("environ", [{}, {"OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer collector-secret-token"},
                                     {**WORKER_ENV, "OTEL_SDK_DISABLED": "true"}])
async def test_tracing_off_renders_no_env_and_the_same_manifests(helm: str, environ: dict[str, str]) -> None:
    values, args = await driver_values(environ)
    assert "tracing" not in values
    run, track = CASES["gpu-autoscaled-canary"]
    assert values == render_values(install_request(run, track), run.spec, BACKEND, IMAGE)
    result = helm_template(helm, args[2], args[3], "agents", values)
    assert result.returncode == 0, result.stderr
    assert "OTEL_" not in result.stdout and "PLNT_POD_NAME" not in result.stdout
    [container] = by_kind(rendered(helm, values, args))["Deployment"]["spec"]["template"]["spec"]["containers"]
    assert "env" not in container
    # The chart's default `tracing: {env: {}}` given explicitly changes nothing either.
    explicit = helm_template(helm, args[2], args[3], "agents", {**values, "tracing": {"env": {}}})
    assert explicit.returncode == 0 and explicit.stdout == result.stdout


@pytest.mark.integration
@pytest.mark.parametrize("name", ["OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
                                  "OTEL_EXPORTER_OTLP_CLIENT_KEY", "OTEL_RESOURCE_ATTRIBUTES", "AWS_SECRET_ACCESS_KEY"])
def test_the_schema_refuses_any_other_variable(helm: str, name: str) -> None:
    run, track = CASES["cpu-fixed-stable"]
    values = render_values(install_request(run, track), run.spec, BACKEND, IMAGE, tracing=tracing_values(WORKER_ENV))
    values["tracing"]["env"][name] = "authorization=Bearer x"
    result = helm_template(helm, "review-responder", str(CHART), "agents", values)
    assert result.returncode != 0
    assert f"additional properties '{name}' not allowed" in result.stderr, result.stderr
    error = classify("upgrade", "review-responder", result.stderr)
    assert isinstance(error, HelmChartError) and not error.retryable


@pytest.mark.integration
def test_the_schema_refuses_a_non_string_value_and_unknown_tracing_keys(helm: str) -> None:
    run, track = CASES["cpu-fixed-stable"]
    base = render_values(install_request(run, track), run.spec, BACKEND, IMAGE, tracing=tracing_values(WORKER_ENV))
    for change, expected in [({"env": {"OTEL_BSP_SCHEDULE_DELAY": 500}}, "got number, want string"),
                             ({"env": {}, "headers": {"secretName": "otel"}}, "additional properties 'headers' not allowed")]:
        result = helm_template(helm, "review-responder", str(CHART), "agents", {**base, "tracing": change})
        assert result.returncode != 0 and expected in result.stderr, result.stderr
