"""Status of every WorkflowRun: what `plnt status` and `GET /workflows` show.

The store is in memory, persisted on every change (`update`: before it returns; `record`: the
saga's writes, grouped, before it returns; `update_nowait`: soon after), and logs each phase
transition as one structured line (`phase-change key=... from=... to=...`).

On disk (read with `read_statuses`): STATE/status.json, every status as of its last compaction
(`{key: status}`, indented, sorted), and STATE/status.journal, one JSON line per change since
(`{"key", "status"}` or `{"key", "removed": true}`), appended and fsync'd per group of writes. A
write costs what changed, not what exists: rewriting status.json whole, 1.9 MB at 1,000
WorkflowRuns, on every saga step was a third of a core during a rollout of 1,000
(bench/many_workflowruns.py, py-spy). status.json is written whole again once the journal grows
past it, when plnt starts and when it stops (`flush`), so after a clean stop it alone holds every
status, as before.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from plnt.core.status import WorkflowRunStatus
from plnt.reconciler.state import append_durably, atomic_write_bytes, read_json

log = logging.getLogger(__name__)

JOURNAL_MIN_BYTES = 256 * 1024  # below this, the journal is not compacted into status.json


def journal_path(path: Path) -> Path:
    return path.with_suffix(".journal")


def read_statuses(path: Path) -> dict[str, Any]:
    """Every status on disk as JSON: status.json with status.journal's changes applied in order.
    A line that does not parse (the last one of a write cut short) is skipped: its change was never
    acknowledged."""
    statuses: dict[str, Any] = dict(read_json(path, default={}) or {})
    try:
        journal = journal_path(path).read_bytes()
    except FileNotFoundError:
        return statuses
    for line in journal.splitlines():
        try:
            change = json.loads(line)
        except ValueError:
            continue
        if not isinstance(change, dict) or not isinstance(change.get("key"), str):
            continue
        if change.get("removed") is True:
            statuses.pop(change["key"], None)
        elif isinstance(change.get("status"), dict):
            statuses[change["key"]] = change["status"]
    return statuses


class StatusStore:
    def __init__(self, path: Path) -> None:
        self._path = path
        self.on_change: Callable[[], None] = lambda: None  # e.g. rebuild the gateway's routes
        # Each change with what it changed from (notifications: reconciler/review/notify.py).
        self.on_transition: list[Callable[[WorkflowRunStatus | None, WorkflowRunStatus], None]] = []
        self._lock = threading.Lock()  # the statuses in memory
        self._file_lock = threading.Lock()  # one write of the file at a time, each of a newer state
        self._flushing: asyncio.Future[None] | None = None  # the background write, while one runs
        self.revision = 0  # counts changes: the reconciler skips re-planning a pass when nothing changed
        self._journal = journal_path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        raw = read_statuses(path)
        self._items: dict[str, WorkflowRunStatus] = {
            key: WorkflowRunStatus.model_validate(value) for key, value in raw.items()
        }
        self._dirty: set[str] = set()  # changed (or removed) since the last write: the journal's next lines
        # Each status as status.json holds it (the writer's own): a compaction encodes again only the
        # statuses changed since the last one (`_stale`).
        self._encoded: dict[str, bytes] = {}
        self._stale: set[str] = set(self._items)
        self._journal_bytes = self._journal.stat().st_size if self._journal.exists() else 0
        self._snapshot_bytes = path.stat().st_size if path.exists() else 0
        self._written = 0  # the revision the files hold
        self._compact_next = False  # a failed write may have left half a line in the journal
        if self._journal_bytes:
            self._save(compact=True)  # a journal a write was cut short in is appended to no more

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
        """Until the files hold every change (at shutdown: update_nowait's writes included), then
        status.json alone: the journal compacted into it."""
        while self._written < self.revision:
            await asyncio.shield(self._writing())
        if self._journal_bytes:
            await asyncio.to_thread(self._save, compact=True)

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
            self._dirty.add(key)
            self._stale.add(key)
            self.revision += 1
        return existing, new

    def _announce(self, existing: WorkflowRunStatus | None, new: WorkflowRunStatus) -> None:
        self.on_change()
        for listener in self.on_transition:
            try:
                listener(existing, new)
            except Exception:  # noqa: BLE001 - a follower's bug must not stop a status write
                log.exception("status-transition-listener-failed")
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
                self._dirty.add(key)
                self._stale.add(key)
                self.revision += 1
        if removed:
            self._save()
        self.on_change()
        log.info("phase-change workflowrun=%s from=Deleting to=Deleted", key)

    def _save(self, compact: bool = False) -> None:
        """Write the changes made so far, unless the files already hold them: as lines appended to
        the journal, and when the journal has grown past status.json (or `compact`), status.json
        whole after them, and no journal. The state is taken under the file lock, so writes land in
        the order of the states they hold: a slow write never replaces a newer one."""
        with self._file_lock:
            with self._lock:
                revision = self.revision
                if revision <= self._written and not (compact and self._journal_bytes):
                    return
                changed = {key: self._items.get(key) for key in sorted(self._dirty)}
                self._dirty = set()
                compact = (compact or self._compact_next
                           or self._journal_bytes >= max(JOURNAL_MIN_BYTES, self._snapshot_bytes))
                if compact:
                    stale = {key: self._items.get(key) for key in self._stale}
                    self._stale = set()
                    order = sorted(self._items)
            try:
                # Appended even before a compaction: a crash between status.json's rename and the
                # journal's removal then replays, over status.json, changes that end where it does.
                lines = b"".join(_journal_line(key, status) for key, status in changed.items())
                if lines:
                    append_durably(self._journal, lines)
                    self._journal_bytes += len(lines)
                if compact:
                    for key, status in stale.items():
                        if status is None:
                            self._encoded.pop(key, None)
                        else:
                            self._encoded[key] = _entry(key, status)
                    entries = [self._encoded[key] for key in order]
                    # Byte for byte what atomic_write_json(path, {key: status}) writes (indent 2, sorted keys).
                    data = b"".join((b"{\n", b",\n".join(entries), b"\n}\n")) if entries else b"{}\n"
                    atomic_write_bytes(self._path, data)
                    self._journal.unlink(missing_ok=True)
                    self._snapshot_bytes, self._journal_bytes = len(data), 0
                    self._compact_next = False
            except BaseException:
                with self._lock:  # written again by the next write, whole
                    self._dirty.update(changed)
                    if compact:
                        self._stale.update(stale)
                    self._compact_next = True
                raise
            self._written = max(self._written, revision)


def _journal_line(key: str, status: WorkflowRunStatus | None) -> bytes:
    change = {"key": key, "removed": True} if status is None else {"key": key, "status": status.model_dump(mode="json")}
    return json.dumps(change, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"


def _entry(key: str, status: WorkflowRunStatus) -> bytes:
    """One status as it sits inside the status file: its key, and its JSON indented one level."""
    body = json.dumps(status.model_dump(mode="json"), indent=2, sort_keys=True).replace("\n", "\n  ")
    return f"  {json.dumps(key)}: {body}".encode()
