"""plnt's tracing setup exporting through the REAL OTLP exporters (HTTP/protobuf and gRPC) to REAL
receivers that decode ExportTraceServiceRequest protobufs (tools/trace_tree.py)."""

from __future__ import annotations

import time

import pytest
from plnt.core import telemetry

pytestmark = pytest.mark.integration


def _wait(predicate, timeout: float = 5.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.02)
    raise AssertionError("timed out waiting for spans at the receiver")


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_spans_reach_a_real_receiver_with_the_standard_settings(tracing, http_receiver, grpc_receiver, protocol) -> None:  # type: ignore[no-untyped-def]
    receiver = http_receiver if protocol == "http/protobuf" else grpc_receiver
    assert tracing(receiver.endpoint, protocol, OTEL_SERVICE_NAME="plnt-a", OTEL_RESOURCE_ATTRIBUTES="deployment.environment=test",
                   OTEL_EXPORTER_OTLP_HEADERS="authorization=Bearer collector-token")
    with telemetry.span("outer", {"plnt.workflow": "w", "plnt.none": None}):
        child = telemetry.start_llm_call("openai", "m", 64, stream=False, server="http://127.0.0.1:9")
        telemetry.end_llm_call(child, input_tokens=3, output_tokens=5)
    telemetry.force_flush()
    spans = _wait(lambda: receiver.collected.snapshot() if len(receiver.collected.snapshot()) >= 2 else None)
    outer, llm = sorted(spans, key=lambda s: s.name != "outer")
    assert (outer.name, llm.name) == ("outer", "chat m")
    assert llm.parent_id == outer.span_id and llm.trace_id == outer.trace_id and llm.kind == "CLIENT"
    assert outer.service == "plnt-a" and outer.attributes == {"plnt.workflow": "w"}
    assert outer.resource["deployment.environment"] == "test"  # OTEL_RESOURCE_ATTRIBUTES
    assert llm.attributes["gen_ai.operation.name"] == "chat" and llm.attributes["gen_ai.request.model"] == "m"
    assert (llm.attributes["gen_ai.usage.input_tokens"], llm.attributes["gen_ai.usage.output_tokens"]) == (3, 5)
    assert llm.attributes["server.port"] == 9
    protocol_key = "http" if protocol == "http/protobuf" else "grpc"
    assert receiver.collected.requests[protocol_key] >= 1
    # OTEL_EXPORTER_OTLP_HEADERS reaches the collector (and only the collector: see test_config).
    assert receiver.collected.headers[0]["authorization"] == "Bearer collector-token"
    other = grpc_receiver if receiver is http_receiver else http_receiver
    assert other.collected.snapshot() == []


def test_the_sampler_setting_is_honoured(tracing, http_receiver) -> None:  # type: ignore[no-untyped-def]
    assert tracing(http_receiver.endpoint, OTEL_TRACES_SAMPLER="always_off")
    with telemetry.span("dropped"):
        pass
    telemetry.force_flush()
    time.sleep(0.2)
    assert http_receiver.collected.requests["http"] == 0


def test_an_exception_ends_a_span_with_status_error(tracing, http_receiver) -> None:  # type: ignore[no-untyped-def]
    assert tracing(http_receiver.endpoint)
    with pytest.raises(RuntimeError), telemetry.span("boom"):
        raise RuntimeError("the step broke")
    telemetry.force_flush()
    [span] = _wait(lambda: http_receiver.collected.named("boom"))
    assert span.status == "ERROR" and "the step broke" in span.status_message
