"""Which OTEL_* settings turn tracing on, and what of them a runner may see (no sockets)."""

from __future__ import annotations

from pathlib import Path

import pytest
from plnt.core import telemetry
from plnt.reconciler.drivers.spawn import allowlisted_env, runner_env

ENDPOINT = "http://127.0.0.1:4318"


@pytest.mark.parametrize(
    ("env", "on"),
    [
        ({}, False),  # off by default
        ({"OTEL_SERVICE_NAME": "plnt", "OTEL_TRACES_SAMPLER": "always_on"}, False),  # no exporter asked for
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"{ENDPOINT}/v1/traces"}, True),
        ({"OTEL_TRACES_EXPORTER": "console"}, True),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT, "OTEL_TRACES_EXPORTER": "none"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT, "OTEL_SDK_DISABLED": "true"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT, "OTEL_SDK_DISABLED": "false"}, True),
    ],
)
def test_tracing_is_on_only_when_an_exporter_is_asked_for(env: dict[str, str], on: bool) -> None:
    assert telemetry.wanted(env) is on


def test_bad_settings_are_refused_with_what_to_set() -> None:
    with pytest.raises(ValueError, match="http/protobuf or grpc"):
        telemetry.setup("plnt", {"OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT, "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"})
    with pytest.raises(ValueError, match="otlp, console and none"):
        telemetry.wanted({"OTEL_TRACES_EXPORTER": "zipkin"})
    assert not telemetry.ENABLED


def test_runners_get_where_to_send_spans_but_never_the_collectors_credentials(tmp_path: Path) -> None:
    plnt_env = {
        "PATH": "/usr/bin",
        "OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT,
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"{ENDPOINT}/v1/traces",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc",
        "OTEL_SERVICE_NAME": "plnt-prod",
        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": "0.1",
        # Credentials for the collector: plnt's, never a runner's (recipe code runs there).
        "OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer collector-secret",
        "OTEL_EXPORTER_OTLP_TRACES_HEADERS": "x-api-key=collector-secret",
        "OTEL_EXPORTER_OTLP_CLIENT_KEY": "/etc/plnt/otlp-client.key",
        "OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY": "/etc/plnt/otlp-client.key",
        "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=prod",
    }
    env = runner_env(allowlisted_env(plnt_env), tmp_path, {})
    assert {k for k in env if k.startswith("OTEL_")} == {
        "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL",
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_SERVICE_NAME", "OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG",
    }
    assert "collector-secret" not in repr(env) and "client.key" not in repr(env)
    assert not any("HEADERS" in name or "KEY" in name or "CERTIFICATE" in name for name in telemetry.RUNNER_ENV_NAMES)


def test_a_server_refuses_to_start_on_a_bad_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    from plnt.core.server import ServerStartError

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", ENDPOINT)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/json")
    with pytest.raises(ServerStartError, match="tracing: .*http/protobuf or grpc"):
        telemetry.start("plnt")
    assert not telemetry.ENABLED
