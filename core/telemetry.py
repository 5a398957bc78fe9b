"""OpenTelemetry traces for plnt: off unless the standard `OTEL_*` variables ask for them.

What is traced (one trace per rollout, one per request):

    reconcile (plnt.commit)                       plnt's reconciler, a pass that starts sagas
      saga <ns>/<name> (plnt.* attributes)        the start of one saga
        StartWorkflow:DeploySaga                  temporalio.contrib.opentelemetry.TracingInterceptor
          RunWorkflow:DeploySaga                  (zero-length: Temporal's legacy interceptor)
            StartActivity:X / RunActivity:X       each saga step (validate, pull_recipe, install_release, ...)
          CompleteWorkflow:DeploySaga             status ERROR when the saga failed or rolled back

    POST /workflows/{name}/invoke | POST /v1/chat/completions    the gateway (plnt.* attributes, track)
      runner invoke                               the runner (W3C traceparent from the gateway)
        step <id>                                 each step of the recipe
          chat <model>                            each LLM call (GenAI semantic conventions), and the
                                                  traceparent goes on to an OpenAI-compatible backend

Configuration (the SDK's own variables): on when OTEL_TRACES_EXPORTER names otlp or console, or
(unset) when OTEL_EXPORTER_OTLP_ENDPOINT / OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set; off when
OTEL_SDK_DISABLED=true or OTEL_TRACES_EXPORTER=none. OTEL_EXPORTER_OTLP(_TRACES)_PROTOCOL picks
http/protobuf (default) or grpc; OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES, OTEL_TRACES_SAMPLER(_ARG),
OTEL_EXPORTER_OTLP(_TRACES)_HEADERS/_TIMEOUT/_CERTIFICATE are read by the SDK and its exporters.

Off costs nothing: no SDK is imported or set up, and the hot paths test `ENABLED` (one module global)
before doing anything else (bench/tracing_overhead.py measures it).
"""

from __future__ import annotations

import atexit
import logging
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span, Tracer

log = logging.getLogger("plnt.telemetry")

ENABLED: bool = False
"""True once `setup` installed a tracer provider in this process: the one check the hot paths make."""

_provider: TracerProvider | None = None
_tracer: Tracer | None = None

# The OTEL_* variables a runner may inherit. Runners run untrusted recipe code, so never
# OTEL_EXPORTER_OTLP_HEADERS / _TRACES_HEADERS (they carry collector credentials, e.g. an API key),
# nor client keys or certificates: only where to send, how, under which name and how much.
RUNNER_ENV_NAMES = frozenset({
    "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    "OTEL_SERVICE_NAME", "OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG",
    "OTEL_SDK_DISABLED", "OTEL_TRACES_EXPORTER",  # the on/off switches: nothing secret
    "OTEL_BSP_SCHEDULE_DELAY",  # how often spans are sent: nothing secret either
})

_TRUE = frozenset({"true", "1", "yes", "on"})


def wanted(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the environment asks for traces (see the module doc)."""
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() in _TRUE:
        return False
    exporters = _exporters(env)
    if exporters is not None:
        return bool(exporters)
    return bool(env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT"))


def _exporters(env: Mapping[str, str]) -> list[str] | None:
    """OTEL_TRACES_EXPORTER's names (otlp, console), [] for none, None when unset."""
    raw = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if not raw:
        return None
    names = [name.strip() for name in raw.split(",") if name.strip()]
    unknown = [name for name in names if name not in ("otlp", "console", "none")]
    if unknown:
        raise ValueError(f"OTEL_TRACES_EXPORTER={raw}: plnt knows otlp, console and none, not {', '.join(unknown)}")
    return [name for name in names if name != "none"]


def _protocol(env: Mapping[str, str]) -> str:
    protocol = (env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
                or "http/protobuf").strip().lower()
    if protocol not in ("http/protobuf", "grpc"):
        raise ValueError(f"OTLP protocol {protocol!r} is not supported: set OTEL_EXPORTER_OTLP_PROTOCOL to "
                         "http/protobuf or grpc")
    return protocol


def setup(default_service: str, environ: Mapping[str, str] | None = None) -> bool:
    """Install the tracer provider the environment asks for, once per process; True when tracing is on.

    Call at each process's entry (plnt up, a role, a gateway worker, a runner): after a fork, as the
    span processor's thread does not survive one. Raises ValueError naming a bad variable."""
    global ENABLED, _provider, _tracer
    if ENABLED:
        return True
    env = os.environ if environ is None else environ
    if not wanted(env):
        return False
    exporters = _exporters(env) or ["otlp"]
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    # Resource.create reads OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME (which win over the default).
    resource = Resource.create({SERVICE_NAME: default_service, **_service_from(env)})
    provider = TracerProvider(resource=resource, shutdown_on_exit=False)  # sampler: OTEL_TRACES_SAMPLER
    for name in exporters:
        if name == "console":
            provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
        elif _protocol(env) == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

            provider.add_span_processor(BatchSpanProcessor(GrpcExporter()))
        else:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

            provider.add_span_processor(BatchSpanProcessor(HttpExporter()))
    # Not installed as the global provider: libraries that trace through it (FastAPI's own spans for
    # every route, ...) would add spans and cost to every request; plnt's spans use this provider.
    _provider, _tracer = provider, provider.get_tracer("plnt")
    ENABLED = True
    atexit.register(shutdown)
    log.info("tracing-on service=%s exporters=%s", resource.attributes.get(SERVICE_NAME), ",".join(exporters))
    return True


def start(default_service: str) -> bool:
    """`setup` at a server's entry (plnt up, the roles): a bad OTEL_* setting is a ServerStartError, which
    the CLI reports in one line."""
    try:
        return setup(default_service)
    except ValueError as exc:
        from plnt.core.server import ServerStartError

        raise ServerStartError(f"tracing: {exc}") from None


def _service_from(env: Mapping[str, str]) -> dict[str, str]:
    name = env.get("OTEL_SERVICE_NAME", "").strip()
    return {"service.name": name} if name else {}


def force_flush(timeout_ms: int = 5000) -> None:
    if _provider is not None:
        _provider.force_flush(timeout_ms)


def shutdown() -> None:
    """Flush and stop exporting (at exit; tests call it to turn tracing off again)."""
    global ENABLED, _provider, _tracer
    provider, _provider = _provider, None
    ENABLED, _tracer = False, None
    if provider is not None:
        provider.shutdown()


def tracer() -> Tracer:
    assert _tracer is not None, "telemetry.setup() first (and only when ENABLED)"
    return _tracer


# --- spans ---------------------------------------------------------------------------------------------


@contextmanager
def span(name: str, attributes: Mapping[str, Any] | None = None, *, parent: Context | None = None,
         kind: str = "internal", start_time: int | None = None) -> Iterator[Span]:
    """A current span (children started inside it, tasks included, are its children). Only when ENABLED.
    An exception ends it with status ERROR."""
    from opentelemetry.trace import SpanKind

    with tracer().start_as_current_span(name, context=parent, kind=SpanKind[kind.upper()],
                                        attributes=_clean(attributes), start_time=start_time) as current:
        yield current


def start_span(name: str, attributes: Mapping[str, Any] | None = None, *, parent: Context | None = None,
               kind: str = "internal") -> Span:
    """A span that is not made current (for async generators and the gateway); the caller ends it."""
    from opentelemetry.trace import SpanKind

    return tracer().start_span(name, context=parent, kind=SpanKind[kind.upper()], attributes=_clean(attributes))


def fail(span_: Span, description: str) -> None:
    from opentelemetry.trace import Status, StatusCode

    span_.set_status(Status(StatusCode.ERROR, description))


def _clean(attributes: Mapping[str, Any] | None) -> dict[str, Any] | None:
    return None if attributes is None else {k: v for k, v in attributes.items() if v is not None}


def extract(headers: Mapping[str, str]) -> Context:
    """The trace context a request carries (W3C traceparent/tracestate), for a server span's parent."""
    from opentelemetry.propagate import extract as _extract

    return _extract(headers)


def inject(headers: dict[str, str], span_: Span | None = None) -> dict[str, str]:
    """Add traceparent (and tracestate) for `span_` (default: the current span) to `headers`."""
    from opentelemetry.propagate import inject as _inject
    from opentelemetry.trace import set_span_in_context

    _inject(headers, context=set_span_in_context(span_) if span_ is not None else None)
    return headers


def scope_parent(scope_headers: list[tuple[bytes, bytes]]) -> Context | None:
    """The trace context of an ASGI request (its traceparent), or None."""
    carrier = {key.decode("latin-1"): value.decode("latin-1") for key, value in scope_headers
               if key in (b"traceparent", b"tracestate")}
    return extract(carrier) if carrier else None


def end_request(span_: Span, code: int, error_type: str | None, labels: tuple[str, str, str, str],
                ttft: float | None) -> None:
    """End a gateway request's span with what the metrics record about it."""
    namespace, name, version, track = labels
    if name:
        span_.set_attributes({"plnt.namespace": namespace, "plnt.workflow": name, "plnt.version": version,
                              "plnt.track": track})
    span_.set_attribute("http.response.status_code", code)
    if ttft is not None:
        span_.set_attribute("plnt.ttft_s", ttft)
    if code >= 500 or error_type is not None and code >= 400:
        if error_type:
            span_.set_attribute("error.type", error_type)
        if code >= 500:
            fail(span_, error_type or f"HTTP {code}")
    span_.end()


# --- GenAI (https://opentelemetry.io/docs/specs/semconv/gen-ai/gen-ai-spans/) ------------------------


def start_llm_call(provider: str, model: str, max_tokens: int, *, stream: bool, server: str | None = None) -> Span:
    """A CLIENT span for one chat call to a model; end it with `end_llm_call`."""
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "chat",
        "gen_ai.system": provider,
        "gen_ai.provider.name": provider,
        "gen_ai.request.model": model,
        "gen_ai.request.max_tokens": max_tokens,
        "plnt.stream": stream,
    }
    if server:
        from urllib.parse import urlsplit

        parts = urlsplit(server)
        attributes["server.address"] = parts.hostname
        attributes["server.port"] = parts.port or (443 if parts.scheme == "https" else 80)
    return start_span(f"chat {model}", attributes, kind="client")


def end_llm_call(span_: Span, *, input_tokens: int | None = None, output_tokens: int | None = None,
                 response_model: str | None = None, error: BaseException | None = None) -> None:
    if input_tokens is not None:
        span_.set_attribute("gen_ai.usage.input_tokens", input_tokens)
    if output_tokens is not None:
        span_.set_attribute("gen_ai.usage.output_tokens", output_tokens)
    if response_model:
        span_.set_attribute("gen_ai.response.model", response_model)
    if error is not None:
        span_.set_attribute("error.type", getattr(error, "kind", None) or type(error).__name__)
        span_.record_exception(error)
        fail(span_, str(error)[:300])
    span_.end()
