"""Status of every WorkflowRun: what `plnt status` and `GET /workflows` show.

The store is in memory, persisted to STATE/status.json on every change (`update`: before it
returns; `record`: the saga's writes, grouped, before it returns; `update_nowait`: soon after), and
logs each phase transition as one structured line (`phase-change key=... from=... to=...`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Callable
from enum import Enum
from pathlib import Path
from typing import Any

from plnt.gateway.routes import preview_of
from pydantic import BaseModel, ConfigDict, Field

from .state import atomic_write_bytes, read_json

log = logging.getLogger(__name__)


class Phase(str, Enum):
    PENDING = "Pending"
    VERIFYING = "Verifying"
    DEPLOYING = "Deploying"
    CANARY = "Canary"
    READY = "Ready"
    ROLLED_BACK = "RolledBack"
    FAILED = "Failed"
    DELETING = "Deleting"


FINAL_PHASES = {Phase.READY, Phase.ROLLED_BACK, Phase.FAILED}


class RolloutMark(BaseModel):
    """The saga's own last phase record: which commit that rollout deploys, where it stands, when.
    Written only by the saga (PhaseRecorder), so a later "in sync" or "invalid commit" update of the
    status never changes the verdict reported on the rollout's commit (plnt.reconciler.rollout_report)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    commit: str
    phase: Phase
    message: str = ""
    at: float = 0.0


class WorkflowRunStatus(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    namespace: str
    name: str
    phase: Phase = Phase.PENDING
    version: str | None = Field(default=None, description="version serving as stable")
    canary_version: str | None = None
    canary_percent: int = 0
    endpoint: str | None = None
    observed_commit: str | None = None
    message: str = ""
    last_error: str | None = None
    saga_id: str | None = None
    # The spec the newest saga tried and how it ended: a failed spec is not retried until it changes.
    attempted_fingerprint: str | None = None
    attempted_version: str | None = None
    smoke_test: dict[str, Any] | None = None
    # A running smoke test's numbers so far ({done, of, metrics}), read from its heartbeats while Canary.
    smoke_progress: dict[str, Any] | None = None
    # The spec of the promoted release, so a plan can name what a new commit changes.
    deployed_spec: dict[str, Any] | None = None
    deployed_fingerprint: str | None = None
    # The budgets of the smoke test under way or last run (the spec's canary.smokeTest, camelCase).
    smoke_budget: dict[str, Any] | None = None
    rollout: RolloutMark | None = None
    updated_at: float = 0.0

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def public(self) -> dict[str, Any]:
        """The shape of `GET /workflows` and `plnt status --json`."""
        return {
            "name": self.name,
            "namespace": self.namespace,
            "phase": self.phase.value,
            "version": self.version,
            "canaryVersion": self.canary_version,
            "canaryPercent": self.canary_percent,
            "endpoint": self.endpoint,
            "observedCommit": self.observed_commit,
            "message": self.message,
            "lastError": self.last_error,
            "sagaId": self.saga_id,
            "smokeTest": self.smoke_test,
            "smokeProgress": self.smoke_progress,
            # A preview release (reconciler/previews.py): the pull request number, reached with X-Plnt-Preview.
            "preview": of[1] if (of := preview_of(self.name)) is not None else None,
        }


class StatusStore:
    def __init__(self, path: Path) -> None:
        self._path = path
        self.on_change: Callable[[], None] = lambda: None  # e.g. rebuild the gateway's routes
        self._lock = threading.Lock()  # the statuses in memory
        self._file_lock = threading.Lock()  # one write of the file at a time, each of a newer state
        self._flushing: asyncio.Future[None] | None = None  # the background write, while one runs
        self.revision = 0  # counts changes: the reconciler skips re-planning a pass when nothing changed
        raw = read_json(path, default={}) or {}
        self._items: dict[str, WorkflowRunStatus] = {
            key: WorkflowRunStatus.model_validate(value) for key, value in raw.items()
        }
        # Each status as the file holds it: a write encodes again only the status that changed (a
        # saga writes 7 times; encoding all of 1,000 statuses each time was most of a write's cost).
        self._encoded: dict[str, bytes] = {key: _entry(key, value) for key, value in self._items.items()}
        self._order: list[str] | None = None  # the keys sorted, kept until one is added or removed
        self._written = 0  # the revision the file holds

    def get(self, key: str) -> WorkflowRunStatus | None:
        return self._items.get(key)

    def all(self) -> list[WorkflowRunStatus]:
        return [self._items[key] for key in sorted(self._items)]

    def update(self, namespace: str, name: str, **fields: Any) -> WorkflowRunStatus:
        """Change one status; the file holds it when this returns."""
        old, new = self._change(namespace, name, fields)
        self._save()
        self._announce(old, new)
        return new

    async def record(self, namespace: str, name: str, **fields: Any) -> WorkflowRunStatus:
        """`update` for callers on the event loop (the saga's status writes). The file is written in
        a thread, so the loop never waits on fsync, and every change made while one write is in
        flight goes into the next (a group commit): sixteen sagas writing at once cost two writes of
        the file, not sixteen. Returns once the file holds the change."""
        old, new = self._change(namespace, name, fields)
        revision = self.revision
        while self._written < revision:
            # Shielded: a caller cancelled while it waits must not cancel the write others wait on.
            await asyncio.shield(self._writing())
        self._announce(old, new)
        return new

    def update_nowait(self, namespace: str, name: str, **fields: Any) -> WorkflowRunStatus:
        """Change one status now and write it soon, with the changes made meanwhile (on the event
        loop only). For writes nothing waits on, which the next pass or poll makes again if plnt
        dies first: a Pending before its saga starts, "in sync", smoke progress."""
        old, new = self._change(namespace, name, fields)
        self._writing()
        self._announce(old, new)
        return new

    async def flush(self) -> None:
        """Until the file holds every change (at shutdown: update_nowait's writes included)."""
        while self._written < self.revision:
            await asyncio.shield(self._writing())

    def _writing(self) -> asyncio.Future[None]:
        """The background write, started if none runs: it writes until the file holds every change
        made meanwhile. A failed write ends it; the next change starts another."""
        if self._flushing is None or self._flushing.done():
            self._flushing = asyncio.ensure_future(self._write_behind())
            self._flushing.add_done_callback(self._report_failure)
        return self._flushing

    async def _write_behind(self) -> None:
        while self._written < self.revision:
            await asyncio.to_thread(self._save)

    def _report_failure(self, write: asyncio.Future[None]) -> None:
        if not write.cancelled() and write.exception() is not None:
            log.error("status-write-failed path=%s error=%s (written again at the next change)",
                      self._path, write.exception())

    def _change(self, namespace: str, name: str, fields: dict[str, Any]) -> tuple[WorkflowRunStatus | None, WorkflowRunStatus]:
        key = f"{namespace}/{name}"
        with self._lock:
            existing = self._items.get(key)
            old = existing or WorkflowRunStatus(namespace=namespace, name=name)
            new = old.model_copy(update={**fields, "updated_at": time.time()})
            self._items[key] = new
            if existing is None:
                self._order = None
            self._encoded[key] = _entry(key, new)
            self.revision += 1
        return existing, new

    def _announce(self, existing: WorkflowRunStatus | None, new: WorkflowRunStatus) -> None:
        self.on_change()
        if existing is None or existing.phase != new.phase:
            old = existing or WorkflowRunStatus(namespace=new.namespace, name=new.name)
            log.info(
                "phase-change workflowrun=%s from=%s to=%s version=%s commit=%s message=%r",
                new.key, old.phase.value, new.phase.value, new.version or new.attempted_version,
                (new.observed_commit or "")[:12], new.message,
            )

    def remove(self, namespace: str, name: str) -> None:
        key = f"{namespace}/{name}"
        with self._lock:
            removed = self._items.pop(key, None) is not None
            if removed:
                self._encoded.pop(key, None)
                self._order = None
                self.revision += 1
        if removed:
            self._save()
        self.on_change()
        log.info("phase-change workflowrun=%s from=Deleting to=Deleted", key)

    def _save(self) -> None:
        """Write the statuses as they are now, unless the file already holds them. The state is
        taken under the file lock, so writes land in the order of the states they hold: a slow
        write never replaces a newer one."""
        with self._file_lock:
            with self._lock:
                revision = self.revision
                if revision <= self._written:
                    return
                if self._order is None:
                    self._order = sorted(self._encoded)
                entries = [self._encoded[key] for key in self._order]
            # Byte for byte what atomic_write_json(path, {key: status}) writes (indent 2, sorted keys).
            atomic_write_bytes(self._path, b"".join((b"{\n", b",\n".join(entries), b"\n}\n")) if entries else b"{}\n")
            self._written = revision


def _entry(key: str, status: WorkflowRunStatus) -> bytes:
    """One status as it sits inside the status file: its key, and its JSON indented one level."""
    body = json.dumps(status.model_dump(mode="json"), indent=2, sort_keys=True).replace("\n", "\n  ")
    return f"  {json.dumps(key)}: {body}".encode()
