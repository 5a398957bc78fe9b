"""Receive OTLP traces and print each as an indented tree of span names and durations.

    .venv/bin/python tools/trace_tree.py [--port 4318] [--grpc-port 4317] [--quiet-s 2]

then run plnt with `OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318` (or, for gRPC,
`OTEL_EXPORTER_OTLP_PROTOCOL=grpc OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4317`): a trace is
printed once no span of it arrived for --quiet-s seconds. A real (if tiny) OTLP receiver: it decodes
the ExportTraceServiceRequest protobufs of the OTLP/HTTP and OTLP/gRPC exporters (opentelemetry-proto);
the tests use it too (tests/telemetry/).
"""

from __future__ import annotations

import argparse
import json
import signal
import threading
import time
from collections.abc import Iterable
from concurrent import futures
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

STATUS = {0: "UNSET", 1: "OK", 2: "ERROR"}
KIND = {0: "UNSPECIFIED", 1: "INTERNAL", 2: "SERVER", 3: "CLIENT", 4: "PRODUCER", 5: "CONSUMER"}


@dataclass
class Span:
    trace_id: str
    span_id: str
    parent_id: str  # "" for a root
    name: str
    kind: str
    start_ns: int
    end_ns: int
    status: str
    status_message: str
    attributes: dict[str, Any]
    service: str
    events: list[str] = field(default_factory=list)
    resource: dict[str, Any] = field(default_factory=dict)

    @property
    def ms(self) -> float:
        return (self.end_ns - self.start_ns) / 1e6


def _value(value: AnyValue) -> Any:
    which = value.WhichOneof("value")
    if which == "array_value":
        return [_value(v) for v in value.array_value.values]
    if which == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in value.kvlist_value.values}
    return getattr(value, which) if which else None


def spans_of(request: trace_service_pb2.ExportTraceServiceRequest) -> list[Span]:
    found = []
    for resource_spans in request.resource_spans:
        resource = {kv.key: _value(kv.value) for kv in resource_spans.resource.attributes}
        for scope_spans in resource_spans.scope_spans:
            for s in scope_spans.spans:
                found.append(Span(
                    trace_id=s.trace_id.hex(), span_id=s.span_id.hex(), parent_id=s.parent_span_id.hex(), name=s.name,
                    kind=KIND.get(s.kind, str(s.kind)), start_ns=s.start_time_unix_nano, end_ns=s.end_time_unix_nano,
                    status=STATUS.get(s.status.code, str(s.status.code)), status_message=s.status.message,
                    attributes={kv.key: _value(kv.value) for kv in s.attributes},
                    service=str(resource.get("service.name", "")), events=[e.name for e in s.events], resource=resource,
                ))
    return found


class Collected:
    """Every span received, thread-safe; `requests` counts the export requests per protocol."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.spans: list[Span] = []
        self.requests = {"http": 0, "grpc": 0}
        self.headers: list[dict[str, str]] = []  # each export request's headers (lower-case names)
        self.exports: list[tuple[frozenset[str], dict[str, str]]] = []  # (its spans' services, its headers)
        self.last_at = 0.0

    def add(self, spans: Iterable[Span], protocol: str, headers: dict[str, str]) -> None:
        with self._lock:
            spans = list(spans)
            self.spans.extend(spans)
            self.requests[protocol] += 1
            self.headers.append(headers)
            self.exports.append((frozenset(s.service for s in spans), headers))
            self.last_at = time.monotonic()

    def snapshot(self) -> list[Span]:
        with self._lock:
            return list(self.spans)

    def trace(self, trace_id: str) -> list[Span]:
        return [s for s in self.snapshot() if s.trace_id == trace_id]

    def named(self, name: str) -> list[Span]:
        return [s for s in self.snapshot() if s.name == name]


class HttpReceiver:
    """OTLP/HTTP (protobuf) on 127.0.0.1: POST /v1/traces."""

    def __init__(self, collected: Collected | None = None, port: int = 0) -> None:
        self.collected = collected or Collected()
        collected_ = self.collected

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                if self.path != "/v1/traces" or self.headers.get("content-type") != "application/x-protobuf":
                    self.send_response(404 if self.path != "/v1/traces" else 415)
                    self.end_headers()
                    return
                request = trace_service_pb2.ExportTraceServiceRequest()
                request.ParseFromString(body)
                collected_.add(spans_of(request), "http", {k.lower(): v for k, v in self.headers.items()})
                reply = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: Any) -> None:
                return None

        self._server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> HttpReceiver:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class GrpcReceiver:
    """OTLP/gRPC on 127.0.0.1: opentelemetry.proto.collector.trace.v1.TraceService/Export."""

    def __init__(self, collected: Collected | None = None, port: int = 0) -> None:
        import grpc

        self.collected = collected or Collected()
        collected_ = self.collected

        class Service(trace_service_pb2_grpc.TraceServiceServicer):
            def Export(self, request: Any, context: Any) -> Any:  # noqa: N802 - the service's name
                metadata = {k.lower(): v for k, v in context.invocation_metadata()}
                collected_.add(spans_of(request), "grpc", metadata)
                return trace_service_pb2.ExportTraceServiceResponse()

        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Service(), self._server)
        self.port = self._server.add_insecure_port(f"127.0.0.1:{port}")

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> GrpcReceiver:
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop(grace=None)


def render(spans: list[Span], *, attributes: tuple[str, ...] = ()) -> str:
    """One trace (or several) as indented trees: name, duration, service, status when not UNSET, and the
    `attributes` named (when a span has them). Children in start order."""
    by_id = {s.span_id: s for s in spans}
    children: dict[str, list[Span]] = {}
    roots = []
    for s in spans:
        if s.parent_id and s.parent_id in by_id:
            children.setdefault(s.parent_id, []).append(s)
        else:
            roots.append(s)
    lines: list[str] = []

    def walk(s: Span, depth: int) -> None:
        extra = [f"{key}={s.attributes[key]}" for key in attributes if key in s.attributes]
        status = f"  {s.status}" + (f" ({s.status_message[:80]})" if s.status_message else "") if s.status != "UNSET" else ""
        lines.append(f"{'  ' * depth}{s.name}  {s.ms:.1f} ms  [{s.service}]{status}"
                     + (f"  {' '.join(extra)}" if extra else ""))
        for child in sorted(children.get(s.span_id, []), key=lambda c: (c.start_ns, c.name)):
            walk(child, depth + 1)

    for root in sorted(roots, key=lambda r: r.start_ns):
        walk(root, 0)
    return "\n".join(lines)


ATTRIBUTES = ("plnt.commit", "plnt.workflow", "plnt.version", "plnt.track", "plnt.phase", "gen_ai.request.model",
              "gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens")


def _interrupt(*_: Any) -> None:
    raise KeyboardInterrupt  # SIGTERM ends the receiver as Ctrl-C does (and writes --stats-file)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=4318, help="OTLP/HTTP port (0: none)")
    parser.add_argument("--grpc-port", type=int, default=4317, help="OTLP/gRPC port (0: none)")
    parser.add_argument("--quiet-s", type=float, default=2.0, help="print a trace after this long without a new span")
    parser.add_argument("--no-print", action="store_true", help="only receive (a sink for benches)")
    parser.add_argument("--stats-file", type=Path, help="on exit (SIGINT/SIGTERM), write the counts received here as JSON")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, _interrupt)
    collected = Collected()
    servers: list[Any] = []
    if args.port:
        servers.append(HttpReceiver(collected, args.port).start())
    if args.grpc_port:
        servers.append(GrpcReceiver(collected, args.grpc_port).start())
    if not args.no_print:
        print("listening: " + ", ".join(s.endpoint for s in servers), flush=True)
    printed: set[str] = set()
    try:
        while True:
            time.sleep(0.5)
            if not args.no_print and collected.last_at and time.monotonic() - collected.last_at >= args.quiet_s:
                for trace_id in dict.fromkeys(s.trace_id for s in collected.snapshot()):
                    if trace_id not in printed:
                        printed.add(trace_id)
                        print(f"trace {trace_id}\n{render(collected.trace(trace_id), attributes=ATTRIBUTES)}\n",
                              flush=True)
    except KeyboardInterrupt:
        pass
    finally:
        for server in servers:
            server.stop()
        if args.stats_file:
            args.stats_file.write_text(json.dumps({"spans": len(collected.snapshot()), "requests": collected.requests}))


if __name__ == "__main__":
    main()
