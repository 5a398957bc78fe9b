"""Prometheus metrics of one gateway app (its own registry: several apps in one process, as in
tests, never share or collide).

Series (labels: `api` = invoke|chat, `namespace`, `workflow`, `version`, `track` = stable|canary|shadow, the last
for the canary's answers to mirrored requests, canary.shadowPercent):
- `plnt_gateway_requests_total{api,namespace,workflow,version,track,code}`: answered requests.
- `plnt_gateway_errors_total{api,namespace,workflow,version,track,type}`: requests answered
  with an error, by error type (`not_found`, `unauthorized`, `upstream_timeout`, ..., or the
  runner's own `error.type` for its 4xx/5xx, or `stream_error` mid-stream).
- `plnt_gateway_request_duration_seconds{api,namespace,workflow,version,track}`: histogram,
  request received -> last byte sent.
- `plnt_gateway_ttft_seconds{api,namespace,workflow,version,track}`: histogram, streams only:
  request received -> first token event sent to the client.
- `plnt_gateway_in_flight_requests{api}`: requests being served now.
- `plnt_gateway_upstream_retries_total{namespace,workflow}`: refused connects retried on
  another replica.
- `plnt_gateway_runner_wakes_total{namespace,workflow}`: parked runners (scale to zero) started
  again for a request.
Requests that never reach a route (401, unknown workflow, bad body before the model is known)
carry empty workflow/version/track labels, so clients cannot inflate the label space.
"""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

_ROUTE_LABELS = ("api", "namespace", "workflow", "version", "track")


class GatewayMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter("plnt_gateway_requests", "Requests answered by the gateway.",
                                (*_ROUTE_LABELS, "code"), registry=r)
        self.errors = Counter("plnt_gateway_errors", "Requests answered with an error, by error type.",
                              (*_ROUTE_LABELS, "type"), registry=r)
        self.duration = Histogram("plnt_gateway_request_duration_seconds",
                                  "Request received to last byte sent.", _ROUTE_LABELS,
                                  buckets=LATENCY_BUCKETS, registry=r)
        self.ttft = Histogram("plnt_gateway_ttft_seconds", "Streams: request received to first token sent.",
                              _ROUTE_LABELS, buckets=LATENCY_BUCKETS, registry=r)
        self.in_flight = Gauge("plnt_gateway_in_flight_requests", "Requests being served now.", ("api",), registry=r)
        self.retries = Counter("plnt_gateway_upstream_retries", "Refused connects retried on another replica.",
                               ("namespace", "workflow"), registry=r)
        self.wakes = Counter("plnt_gateway_runner_wakes", "Parked runners started again for a request.",
                             ("namespace", "workflow"), registry=r)
        # labels() takes a lock and builds a key on every call; the children are cached here
        # (a few us per request saved on the hot path).
        self._children: dict[tuple[object, ...], object] = {}
        self._in_flight = {api: self.in_flight.labels(api) for api in ("invoke", "chat")}

    def _child(self, metric: Counter | Histogram, labels: tuple[str, ...]):  # type: ignore[no-untyped-def]
        key = (id(metric), *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def started(self, api: str) -> None:
        self._in_flight[api].inc()

    def finished(
        self,
        api: str,
        labels: tuple[str, str, str, str],  # namespace, workflow, version, track
        code: int,
        seconds: float,
        error_type: str | None = None,
        ttft_s: float | None = None,
    ) -> None:
        self._in_flight[api].dec()
        route = (api, *labels)
        self._child(self.requests, (*route, str(code))).inc()  # type: ignore[attr-defined]
        self._child(self.duration, route).observe(seconds)  # type: ignore[attr-defined]
        if error_type is not None:
            self._child(self.errors, (*route, error_type)).inc()  # type: ignore[attr-defined]
        if ttft_s is not None:
            self._child(self.ttft, route).observe(ttft_s)  # type: ignore[attr-defined]

    def retried(self, namespace: str, workflow: str) -> None:
        self._child(self.retries, (namespace, workflow)).inc()  # type: ignore[attr-defined]

    def woke(self, namespace: str, workflow: str) -> None:
        self._child(self.wakes, (namespace, workflow)).inc()  # type: ignore[attr-defined]

    def render(self) -> bytes:
        return generate_latest(self.registry)
