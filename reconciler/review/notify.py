"""Notifications: each rollout transition (started, a step reached, paused for a person, promoted,
rolled back, aborted, failed) sent to the receivers the operator configured: generic webhooks,
HMAC-signed as a webhook gate's call is (reconciler/gates/webhook.py: X-Plnt-Timestamp,
X-Plnt-Signature), and a Slack-compatible incoming webhook ({"text": ...}). The forge's commit
status and pull-request comment are the other receivers (reconciler/review).

`events_of(old, new)` is pure (table-tested): the transitions one status change makes. The
Notifier hears every change (StatusStore.on_transition), queues its events (bounded), and one task
delivers them in order, each to every receiver, retrying a receiver that did not answer (3 attempts,
1 s then 2 s apart) and dropping, with one log line, what a receiver refuses. A slow or dead receiver
never holds a rollout."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Literal

import httpx
from plnt.core.status import Phase, WorkflowRunStatus
from plnt.reconciler.errors import GateUnavailable, GateUnusable
from plnt.reconciler.gates.webhook import display_url, post_signed
from plnt.reconciler.settings import NotifySettings
from plnt.reconciler.status_store import StatusStore
from plnt.reconciler.tls_context import default_tls_context
from pydantic import BaseModel

log = logging.getLogger(__name__)

EventKind = Literal["started", "step", "paused", "promoted", "rolled_back", "aborted", "failed"]
MAX_QUEUED = 1000
ATTEMPTS = 3


class RolloutEvent(BaseModel):
    """One transition of one rollout, as a receiver gets it (the webhook's JSON body)."""

    kind: EventKind
    namespace: str
    name: str
    version: str | None  # the version rolled out (the canary's)
    serving: str | None  # the stable version serving now
    commit: str | None
    step: int | None = None
    steps: int | None = None
    weight: int | None = None
    message: str
    at: float

    def text(self) -> str:
        """One line for a chat (Slack): what happened, to what, where."""
        what = {"started": "rollout started", "step": f"step {self.step}/{self.steps} at {self.weight}%",
                "paused": "paused", "promoted": "promoted", "rolled_back": "rolled back", "aborted": "aborted",
                "failed": "failed"}[self.kind]
        commit = f" (commit {self.commit[:12]})" if self.commit else ""
        return f"plnt: {self.namespace}/{self.name} {self.version or '?'} {what}{commit}: {self.message}"[:3000]


def events_of(old: WorkflowRunStatus | None, new: WorkflowRunStatus) -> list[RolloutEvent]:
    """The transitions from `old` to `new` (none for a change within one, e.g. smoke-test progress)."""
    before = old.phase if old is not None else None
    version = new.attempted_version or new.canary_version or new.version
    commit = new.rollout.commit if new.rollout is not None else new.observed_commit

    def event(kind: EventKind, **place: int | None) -> RolloutEvent:
        return RolloutEvent(kind=kind, namespace=new.namespace, name=new.name, version=version, serving=new.version,
                            commit=commit, message=new.last_error or new.message, at=time.time(), **place)

    started = new.phase is Phase.VERIFYING and (before is not Phase.VERIFYING or old is None
                                                or old.saga_id != new.saga_id)
    if started:
        return [event("started")]
    if new.phase is Phase.CANARY:
        found = []
        if new.canary_step is not None and (old is None or old.canary_step != new.canary_step
                                            or before is not Phase.CANARY):
            found.append(event("step", step=new.canary_step, steps=new.canary_steps, weight=new.traffic_percent))
        waiting = _waits_for_a_person(new.message)
        if waiting and not (old is not None and before is Phase.CANARY and _waits_for_a_person(old.message)):
            found.append(event("paused", step=new.canary_step, steps=new.canary_steps, weight=new.traffic_percent))
        return found
    if new.phase is before:
        return []
    if new.phase is Phase.READY and before in (Phase.CANARY, Phase.DEPLOYING, Phase.VERIFYING):
        return [event("promoted")]
    if new.phase is Phase.ROLLED_BACK:
        return [event("aborted" if (new.last_error or "").startswith("aborted by ") else "rolled_back")]
    if new.phase is Phase.FAILED:
        return [event("failed")]
    return []


def _waits_for_a_person(message: str) -> bool:
    return "; waiting for a person" in message or "; paused by " in message


Send = Callable[[RolloutEvent], Awaitable[None]]


class Notifier:
    def __init__(self, receivers: list[tuple[str, Send]], *, retry_s: float = 1.0) -> None:
        self.receivers = receivers  # (what to call it in logs, how to send)
        self._queue: deque[RolloutEvent] = deque(maxlen=MAX_QUEUED)
        self._wake = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._retry_s = retry_s
        self.sent = 0  # deliveries that a receiver accepted (tests, benches)

    def observe(self, old: WorkflowRunStatus | None, new: WorkflowRunStatus) -> None:
        """StatusStore.on_transition (any thread): queue the change's events."""
        found = events_of(old, new)
        if not found:
            return
        loop = self._loop

        def put() -> None:
            if len(self._queue) + len(found) > MAX_QUEUED:
                log.warning("notify-queue-full: the oldest notifications are dropped (receivers too slow)")
            self._queue.extend(found)
            self._wake.set()

        if loop is None:
            put()
            return
        with contextlib.suppress(RuntimeError):  # the loop is closing
            if _in(loop):
                put()
            else:
                loop.call_soon_threadsafe(put)

    def attach(self, statuses: StatusStore, drain_s: float = 5.0) -> Callable[[], Awaitable[None]]:
        """Hear every status change, start delivering; returns the cleanup (what is queued then gets
        `drain_s` to go out)."""
        statuses.on_transition.append(self.observe)
        stop = asyncio.Event()
        task = asyncio.create_task(self.run(stop), name="notify")

        async def cleanup() -> None:
            statuses.on_transition.remove(self.observe)
            stop.set()
            self._wake.set()
            try:
                async with asyncio.timeout(drain_s):
                    await asyncio.shield(task)
            except TimeoutError:
                log.warning("notify-stopped with %d notification(s) not sent", len(self._queue))
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

        return cleanup

    async def run(self, stop: asyncio.Event) -> None:
        self._loop = asyncio.get_running_loop()
        while not (stop.is_set() and not self._queue):
            if not self._queue:
                self._wake.clear()
                waiter = asyncio.create_task(self._wake.wait())
                stopper = asyncio.create_task(stop.wait())
                await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
                waiter.cancel()
                stopper.cancel()
                continue
            event = self._queue.popleft()
            for name, send in self.receivers:
                await self._deliver(name, send, event)

    async def _deliver(self, name: str, send: Send, event: RolloutEvent) -> None:
        for attempt in range(1, ATTEMPTS + 1):
            try:
                await send(event)
                self.sent += 1
                return
            except GateUnavailable as exc:
                if attempt == ATTEMPTS:
                    log.warning("notify-dropped receiver=%s event=%s %s: %s", name, event.kind, event.name, exc)
                    return
                await asyncio.sleep(self._retry_s * 2 ** (attempt - 1))
            except GateUnusable as exc:
                log.warning("notify-refused receiver=%s event=%s %s: %s", name, event.kind, event.name, exc)
                return


def _in(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


def webhook_sender(url: str, secret: bytes, timeout_s: float) -> Send:
    async def send(event: RolloutEvent) -> None:
        response = await post_signed(url, secret, event.model_dump(mode="json"), timeout_s=timeout_s)
        _accepted(response.status, display_url(url))

    return send


def slack_sender(url: str, timeout_s: float) -> Send:
    """A Slack-compatible incoming webhook: POST {"text": ...}; the URL is the secret (never logged)."""
    shown = display_url(url)

    async def send(event: RolloutEvent) -> None:
        try:
            async with httpx.AsyncClient(trust_env=False, timeout=timeout_s, verify=default_tls_context(),
                                         follow_redirects=False) as client:
                response = await client.post(url, json={"text": event.text()})
        except httpx.HTTPError as exc:
            raise GateUnavailable(f"chat webhook {shown} did not answer: {type(exc).__name__}") from None
        _accepted(response.status_code, shown)

    return send


def _accepted(status: int, shown: str) -> None:
    if status == 429 or status >= 500:
        raise GateUnavailable(f"{shown} answered HTTP {status}")
    if not 200 <= status < 300:
        raise GateUnusable(f"{shown} answered HTTP {status}")


def make_notifier(notify: NotifySettings) -> Notifier | None:
    receivers: list[tuple[str, Send]] = []
    if notify.webhooks:
        assert notify.webhook_secret is not None  # Settings refuses unsigned webhooks
        secret = notify.webhook_secret.get_secret_value().encode()
        receivers += [(display_url(url), webhook_sender(url, secret, notify.timeout_s)) for url in notify.webhooks]
    if notify.slack_url is not None:
        url = notify.slack_url.get_secret_value()
        receivers.append((f"chat {display_url(url)}", slack_sender(url, notify.timeout_s)))
    return Notifier(receivers) if receivers else None
