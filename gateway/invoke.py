"""`POST /workflows/{name}/invoke[?namespace=NS]`: JSON in, JSON out, the body passed to the runner's
`POST /invoke` byte for byte. With `Accept: text/event-stream` the runner's SSE stream is passed
through chunk by chunk as it arrives (no buffering, `X-Accel-Buffering: no`).

Errors are plnt's `{"error": {"type", "message"}}`: 422 for malformed or too deeply nested JSON
(naming line and column), 409 for a name in several namespaces; the rest as forward.py and app.py say.
"""

from __future__ import annotations

import json
from urllib.parse import parse_qs

from plnt.core import limits as json_limits
from plnt.core.routes import PREVIEW_HEADER, TRACK_HEADER, AmbiguousRoute, PreviewNotFound, preview_target
from plnt.gateway.forward import SSE, Gateway, Outcome, request_headers
from plnt.gateway.relay import RUNNER_STREAM, relay
from plnt.gateway.replies import PLNT, ASGIScope, Receive, Send, json_position, not_invocable, plnt_error


async def invoke(gateway: Gateway, scope: ASGIScope, receive: Receive, send: Send, name: str) -> None:
    await gateway.measured("invoke", PLNT, scope, send,
                           lambda outcome: _invoke(gateway, scope, receive, send, name, outcome))


async def _invoke(gateway: Gateway, scope: ASGIScope, receive: Receive, send: Send, name: str,
                  outcome: Outcome) -> None:
    headers = request_headers(scope)
    grant = gateway.grant(headers.get(b"authorization"), PLNT)
    if gateway.tokens.enabled and not grant.allows_name(name):
        raise plnt_error(403, "forbidden", not_invocable(grant, f"workflow {name}"))
    gateway.admit(grant, outcome, PLNT)
    body = await gateway.json_body(receive, headers, PLNT)
    try:
        parsed = json_limits.loads(body)
    except json_limits.JSONTooDeep as exc:
        raise plnt_error(422, "invalid_json", f"body is not accepted: {exc}") from None
    except json.JSONDecodeError as exc:
        raise plnt_error(422, "invalid_json", f"body is not valid JSON: {json_position(exc)}",
                         line=exc.lineno, column=exc.colno) from None
    except UnicodeDecodeError as exc:
        raise plnt_error(422, "invalid_json", f"body is not UTF-8 at byte {exc.start}") from None
    if not isinstance(parsed, dict):
        raise plnt_error(422, "invalid_request", f"body must be a JSON object, got {type(parsed).__name__}")

    namespace = None
    if scope["query_string"]:
        values = parse_qs(scope["query_string"].decode("latin-1")).get("namespace")
        namespace = values[0] if values else None
    try:  # X-Plnt-Preview: N goes to the preview of pull request N, and only then (routes.preview_target)
        target = preview_target(name, headers.get(PREVIEW_HEADER.encode()))
    except PreviewNotFound as exc:
        raise plnt_error(404, "not_found", str(exc)) from None
    table = gateway.router.table  # one snapshot for the whole request
    try:
        route = table.lookup(target, namespace)
    except AmbiguousRoute as exc:
        raise plnt_error(
            409, "ambiguous",
            f"workflow {name!r} exists in namespaces {', '.join(exc.namespaces)}; add ?namespace=<one of them>",
        ) from None
    if route is None:
        where = f" in namespace {namespace}" if namespace is not None else ""
        if target != name:
            raise plnt_error(404, "not_found", f"no preview of workflow {name}{where} for pull request "
                             f"{target.rsplit('--pr', 1)[1]}; GET /workflows lists the previews")
        raise plnt_error(404, "not_found", f"no workflow named {name}{where}; GET /workflows lists them")
    if not grant.allows(route.namespace, name):
        raise plnt_error(403, "forbidden", not_invocable(grant, f"workflow {route.namespace}/{name}"))
    if route.protocol == "openai":
        raise plnt_error(404, "not_found", f"{route.namespace}/{name} is a ModelDeployment, not a workflow: "
                         f"POST /v1/chat/completions with \"model\": \"{name}\"")
    chosen = gateway.choose(route, headers, PLNT, f"workflow {route.namespace}/{name}", scope["headers"])

    accept, content_type = headers.get(b"accept"), headers.get(b"content-type")
    stream = accept is not None and SSE in accept
    if route.shadow_percent:
        gateway.shadow(route, name, chosen, headers, "invoke", "/invoke", body, RUNNER_STREAM if stream else None)
    exchange = await gateway.forward(
        table, route, target, name, chosen, "/invoke", body, stream=stream, outcome=outcome, errors=PLNT,
        content_type=content_type.decode("latin-1") if content_type else "application/json",
        forced=TRACK_HEADER.encode() in headers,
    )
    try:
        await relay(exchange, receive, send, outcome, PLNT, RUNNER_STREAM if stream else None)
    finally:
        exchange.release()
