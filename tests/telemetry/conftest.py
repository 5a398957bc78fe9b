"""Fixtures for the tracing tests: REAL OTLP receivers (tools/trace_tree.py: an HTTP server and a gRPC
TraceService decoding the exporters' protobufs), and tracing turned on in this process for one test."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest
from plnt.core import telemetry

ROOT = Path(__file__).resolve().parents[2]


def _load_trace_tree() -> ModuleType:
    if "trace_tree" in sys.modules:
        return sys.modules["trace_tree"]
    spec = importlib.util.spec_from_file_location("trace_tree", ROOT / "tools" / "trace_tree.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["trace_tree"] = module
    spec.loader.exec_module(module)
    return module


trace_tree = _load_trace_tree()


@pytest.fixture
def http_receiver() -> Iterator[object]:
    receiver = trace_tree.HttpReceiver().start()
    try:
        yield receiver
    finally:
        receiver.stop()


@pytest.fixture
def grpc_receiver() -> Iterator[object]:
    receiver = trace_tree.GrpcReceiver().start()
    try:
        yield receiver
    finally:
        receiver.stop()


# The exporters' settings for a test: spans leave within 50 ms rather than 5 s.
FAST = {"OTEL_BSP_SCHEDULE_DELAY": "50"}


@pytest.fixture
def tracing(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., bool]]:
    """`tracing(endpoint, protocol="http/protobuf", **more_env)`: set the OTEL_* environment as a user
    would and set tracing up in this process; turned off (provider shut down) after the test."""
    for name in [n for n in list(__import__("os").environ) if n.startswith("OTEL_")]:
        monkeypatch.delenv(name)

    def turn_on(endpoint: str, protocol: str = "http/protobuf", *, setup: bool = True, **env: str) -> bool:
        """setup=False: only the environment; plnt's own entry (reconciler.app.start) sets tracing up."""
        values = {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL": protocol, **FAST, **env}
        for name, value in values.items():
            monkeypatch.setenv(name, value)
        return telemetry.setup("plnt-test") if setup else telemetry.wanted()

    assert not telemetry.ENABLED, "tracing left on by an earlier test"
    try:
        yield turn_on
    finally:
        telemetry.shutdown()
