"""`plnt gateway`: the gateway as a role of its own, following the control plane's route table.

The same app as plnt up's gateway (`create_app`, same auth, limits and exposure checks), with:
- routes and `GET /workflows` from the followed `RouteTableDoc` (route_watch.RouteFollower);
- `GET /healthz` 503 until a first table arrived, then 200 with the table's version and the state
  of the control connection (a gateway that lost the control plane still serves: it stays 200);
- every other request 503 (`Retry-After`) until the first table: no table is not "no workflow";
- the control plane's own endpoints (`/hooks/git`, `/source`, history, rollouts, a rollout's state
  and actions, `/plan`,
  `/plan/revisions`) answered 404 naming it, or,
  in a gateway worker of `plnt up` (workers.py, `forward_control`), forwarded to the control plane
  together with `/internal/` (a `plnt gateway` following plnt up's public port may land on a worker).
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass, field
from typing import Any

from plnt.core import telemetry
from plnt.core.auth import TokenSet, is_loopback_host, rollout_path
from plnt.core.limits import HttpLimits
from plnt.core.server import GatewayServer
from plnt.gateway.app import GatewayApp, create_app
from plnt.gateway.calls import CallsPusher, source_name
from plnt.gateway.control_relay import ControlForwarder
from plnt.gateway.route_watch import DEFAULT_WAIT_S, ControlWaker, RouteFollower
from plnt.gateway.router import Router

log = logging.getLogger("plnt.gateway.role")


@dataclass(frozen=True)
class GatewayRoleConfig:
    control_url: str
    internal_token: str = field(repr=False)
    host: str = "127.0.0.1"
    port: int = 8000
    tokens: TokenSet = field(default_factory=TokenSet)
    max_body_bytes: int = 2**20
    request_timeout_s: float = 60.0
    max_header_bytes: int = 64 * 1024
    header_timeout_s: float = 10.0
    watch_wait_s: float = DEFAULT_WAIT_S
    watch_retry_max_s: float = 10.0
    processes: int = 1  # the processes serving this port (--workers): each enforces its share of the quotas
    cache_affinity: bool = True  # a model's conversations keep their replica (affinity.py)


def _reply(status: int, kind: str, message: str, extra: list[tuple[bytes, bytes]] | None = None) -> tuple[int, bytes, list[tuple[bytes, bytes]]]:
    body = json.dumps({"error": {"type": kind, "message": message}}).encode()
    return status, body, [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body)), *(extra or [])]


class _RoleApp:
    """ASGI in front of the gateway app: what a gateway without a table, or without a control plane's
    endpoints, answers. Everything else goes to the gateway app unchanged (the hot paths included)."""

    def __init__(self, app: GatewayApp, follower: RouteFollower, forward: ControlForwarder | None = None) -> None:
        self.app = app
        self.follower = follower
        self.forward = forward
        self.state = app.state  # tests and helpers reach the app's state through the served app

    @staticmethod
    def _control_path(method: str, path: str) -> bool:
        return (path in ("/hooks/git", "/source", "/plan", "/plan/revisions") or path.startswith("/hooks/")
                or (path.startswith("/workflows/") and path.endswith(("/history", "/rollouts", "/pin")))
                or rollout_path(path) is not None)

    def _known_caller(self, scope: dict[str, Any]) -> bool:
        tokens = self.app.gateway.tokens
        if not tokens.enabled:
            return True
        authorization = next((value for key, value in scope["headers"] if key == b"authorization"), None)
        return tokens.check_header(authorization) is not None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            path: str = scope["path"]
            answer = None
            # /metrics and /calls: plnt up's process merges every gateway process's (the workers push theirs).
            if self.forward is not None and (self._control_path(scope["method"], path) or path.startswith("/internal/")
                                             or path in ("/metrics", "/calls", "/usage")):
                await self.forward(scope, receive, send)
                return
            if self._control_path(scope["method"], path):
                # The control plane's address only for callers with a token (when tokens are configured).
                where = self.follower.control_url if self._known_caller(scope) else "the control plane's address"
                answer = _reply(404, "not_found", f"{scope['method']} {path} belongs to the control plane: send it to "
                                f"{where} (this is `plnt gateway`, which serves invoke, chat, models, workflows, "
                                "metrics and healthz)")
            elif not self.follower.has_table and path not in ("/healthz", "/metrics"):
                where = f" at {self.follower.control_url}" if self._known_caller(scope) else ""
                answer = _reply(503, "no_route_table", f"this gateway has no route table yet from the control plane"
                                f"{where}; it keeps retrying", [(b"retry-after", b"2")])
            if answer is not None:
                status, body, headers = answer
                await send({"type": "http.response.start", "status": status, "headers": headers})
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)


class GatewayRole:
    """A running `plnt gateway`: its server and its route follower."""

    def __init__(self, config: GatewayRoleConfig, *, worker_index: int = 0, reuse_port: bool = False,
                 forward_control: bool = False) -> None:
        """`worker_index`: this process among the gateway's worker processes (0: the first; shown by
        /healthz). `reuse_port`: share host:port with the other workers (SO_REUSEPORT).
        `forward_control`: forward the control plane's endpoints to control_url (plnt up's workers)."""
        self.config = config
        self.worker_index = worker_index
        self.router = Router(cache_affinity=config.cache_affinity)
        self.follower = RouteFollower(config.control_url, config.internal_token, self.router,
                                      wait_s=config.watch_wait_s, backoff_max_s=config.watch_retry_max_s)
        # A runner that parked (scale to zero) is started again by the control plane, asked here.
        self.waker = ControlWaker(config.control_url, config.internal_token, timeout_s=config.request_timeout_s)
        app = create_app(self.router, list_workflows=self.follower.workflows, on_git_hook=None, tokens=config.tokens,
                         max_body_bytes=config.max_body_bytes, request_timeout_s=config.request_timeout_s,
                         host=config.host, health=self.health, wake=self.waker,
                         gateway_processes=config.processes)
        self.forwarder = None
        if forward_control:
            self.forwarder = ControlForwarder(config.control_url, config.internal_token, config.max_body_bytes)
        # Its calls to the control plane's traffic ledger (what compare gates judge), under a name of its own.
        self.calls_pusher = CallsPusher(app.gateway.calls, config.control_url, source_name(), config.internal_token)
        self._pushing: asyncio.Task[None] | None = None
        self.app = _RoleApp(app, self.follower, self.forwarder)
        self.server = GatewayServer(self.app, host=config.host, port=config.port, reuse_port=reuse_port,
                                    joining=worker_index > 0,
                                    limits=HttpLimits(max_head_bytes=config.max_header_bytes,
                                                      head_timeout_s=config.header_timeout_s))
        self._task: asyncio.Task[None] | None = None

    def health(self) -> tuple[int, dict[str, Any]]:
        state = self.follower.state()
        if not self.follower.has_table:
            return 503, {"status": "waiting-for-routes", "worker": self.worker_index, **state}
        return 200, {"status": "ok", "worker": self.worker_index, **state}

    @property
    def url(self) -> str:
        return self.server.url

    async def start(self, *, wait_for_table_s: float | None = None) -> None:
        """Listen and follow. `wait_for_table_s`: follow first and listen once a table arrived (or
        that long passed): a gateway worker joining a port others serve has no reason to answer 503."""
        telemetry.start("plnt-gateway")  # this process's traces (plnt gateway, or one of plnt up's workers)
        url = self.config.control_url
        if url.startswith("http://") and not is_loopback_host(url.split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)[0]):
            log.warning("control-url-plaintext url=%s: the internal token travels unencrypted; use https:// "
                        "outside a trusted network", url)
        self._task = asyncio.create_task(self.follower.run(), name="route-follower")
        self._pushing = asyncio.create_task(self.calls_pusher.run(), name="calls-pusher")
        if wait_for_table_s is not None:
            deadline = asyncio.get_running_loop().time() + wait_for_table_s
            while not self.follower.has_table and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.01)
        await self.server.start()
        doc = self.follower.doc
        log.info("plnt-gateway listening=%s control=%s: %s", self.server.url, url,
                 f"serving route table version {doc.version}" if doc is not None
                 else "waiting for the first route table (503 until then)")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        await self.server.stop()
        if self._pushing is not None:  # after the server: the last calls answered are in the last push
            self._pushing.cancel()
            await asyncio.gather(self._pushing, return_exceptions=True)
            self._pushing = None
            await self.calls_pusher.leave()
        await self.waker.aclose()
        if self.forwarder is not None:
            await self.forwarder.aclose()
