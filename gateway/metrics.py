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
- `plnt_gateway_retries_total{namespace,workflow,reason}`: failed attempts sent once more to a
  stable replica (gateway/retry.py: `connect_refused`, `connect_timeout`, `not_started`, and for a
  model's canary `upstream_status`, `upstream_timeout`, `connection_broken`). The failed attempt is
  also counted in the request series of the release that failed.
- `plnt_gateway_fallbacks_total{namespace,model,fallback,reason}`: chat completions a ModelDeployment's
  fallback model answered because `model` was down or over its own limit (`reason` as above, or
  `not_ready`, `over_limit`).
- `plnt_gateway_runner_wakes_total{namespace,workflow}`: parked runners (scale to zero) started
  again for a request.
- `plnt_gateway_affinity_placements_total{namespace,workflow,placed}`: a model's chat requests placed
  on a stable replica by their conversation (affinity.py): `placed="own"` on the conversation's own
  replica, `"spilled"` on another because its own had too many requests in flight.
- `plnt_gateway_usage_requests_total{token,namespace,workflow}`, `plnt_gateway_usage_prompt_tokens_total`,
  `plnt_gateway_usage_completion_tokens_total` and `plnt_gateway_usage_cost_total` (same labels; the
  GatewayPolicy's currency): what each token used, by its name in the token file (`unnamed` without
  one), for the requests that reached a workflow or model; tokens where the answer says them.
- `plnt_gateway_quota_denials_total{token,limit}`: requests refused with 429 by a GatewayPolicy limit
  (`requestsPerMinute`, `tokensPerMinute`, `budget`).
The token label holds names from the token file only (never a secret): a bounded set.
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
        self.retries = Counter("plnt_gateway_retries", "Failed attempts sent once more, to a stable replica.",
                               ("namespace", "workflow", "reason"), registry=r)
        self.fallbacks = Counter("plnt_gateway_fallbacks", "Chat completions a model's fallback model answered.",
                                 ("namespace", "model", "fallback", "reason"), registry=r)
        self.wakes = Counter("plnt_gateway_runner_wakes", "Parked runners started again for a request.",
                             ("namespace", "workflow"), registry=r)
        self.placements = Counter("plnt_gateway_affinity_placements",
                                  "Model chats placed on a replica by conversation: own, or spilled (it was busy).",
                                  ("namespace", "workflow", "placed"), registry=r)
        usage = ("token", "namespace", "workflow")
        self.usage_requests = Counter("plnt_gateway_usage_requests", "Requests per token name and workflow.",
                                      usage, registry=r)
        self.usage_prompt = Counter("plnt_gateway_usage_prompt_tokens", "Prompt tokens per token name and workflow.",
                                    usage, registry=r)
        self.usage_completion = Counter("plnt_gateway_usage_completion_tokens",
                                        "Completion tokens per token name and workflow.", usage, registry=r)
        self.usage_cost = Counter("plnt_gateway_usage_cost", "Cost per token name and workflow (GatewayPolicy prices).",
                                  usage, registry=r)
        self.denials = Counter("plnt_gateway_quota_denials", "Requests refused by a GatewayPolicy limit.",
                               ("token", "limit"), registry=r)
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

    def used(self, token: str, namespace: str, workflow: str, prompt: int, completion: int, cost: float) -> None:
        """One call of `token` to namespace/workflow answered (usage)."""
        key = (token, namespace, workflow)
        self._child(self.usage_requests, key).inc()  # type: ignore[attr-defined]
        if prompt:
            self._child(self.usage_prompt, key).inc(prompt)  # type: ignore[attr-defined]
        if completion:
            self._child(self.usage_completion, key).inc(completion)  # type: ignore[attr-defined]
        if cost:
            self._child(self.usage_cost, key).inc(cost)  # type: ignore[attr-defined]

    def denied(self, token: str, limit: str) -> None:
        self._child(self.denials, (token, limit)).inc()  # type: ignore[attr-defined]

    def retried(self, namespace: str, workflow: str, reason: str) -> None:
        self._child(self.retries, (namespace, workflow, reason)).inc()  # type: ignore[attr-defined]

    def fell_back(self, namespace: str, model: str, fallback: str, reason: str) -> None:
        self._child(self.fallbacks, (namespace, model, fallback, reason)).inc()  # type: ignore[attr-defined]

    def woke(self, namespace: str, workflow: str) -> None:
        self._child(self.wakes, (namespace, workflow)).inc()  # type: ignore[attr-defined]

    def placed(self, namespace: str, workflow: str, spilled: bool) -> None:
        self._child(self.placements, (namespace, workflow, "spilled" if spilled else "own")).inc()  # type: ignore[attr-defined]

    def render(self) -> bytes:
        return generate_latest(self.registry)
