"""`--write-notes`: each rollout's outcome as a git note on the commit it deployed, under
refs/notes/plnt in the spec repository, so `git log --notes=plnt` shows it on any forge (or none).

One line per WorkflowRun deployed by that commit, updated in place when another WorkflowRun of the
same commit finishes:

    default/review-responder: Ready 1.3.0 (p95 41 ms ≤ 2500, errors 0% ≤ 1%) 2026-12-01T03:40:00Z

Written in plnt's own clone (GitSource: its credentials and known hosts): fetch
`+refs/notes/plnt:refs/notes/plnt` (absent is fine), merge our line into the note by WorkflowRun,
`git notes --ref=plnt add -f`, `git push origin refs/notes/plnt`. A rejected push (someone else wrote
notes meanwhile) fetches again and re-applies, a few times; any other failure is logged (redacted)
and retried later with backoff, never fatal. Needs push rights to refs/notes/plnt only.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from plnt.core.routes import preview_of
from plnt.core.status import FINAL_PHASES, Phase, WorkflowRunStatus
from plnt.reconciler.review.rollout_report import RetryLater, StatusFollower, smoke_summary
from plnt.reconciler.source.git import GitSource, SourceError
from plnt.reconciler.status_store import StatusStore

log = logging.getLogger(__name__)

NOTES_REF = "refs/notes/plnt"
MAX_REASON = 300
IDENTITY = ("-c", "user.name=plnt", "-c", "user.email=plnt@localhost")


def _stamp(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def note_line(status: WorkflowRunStatus) -> tuple[str, str] | None:
    """(commit, line) for a rollout that ended (Ready, RolledBack, Failed), else None. Pure."""
    mark = status.rollout
    if mark is None or mark.phase not in FINAL_PHASES:
        return None
    tried = status.attempted_version or status.version or "?"
    reason = " ".join(mark.message.split())
    if len(reason) > MAX_REASON:
        reason = reason[: MAX_REASON - 1] + "…"
    if mark.phase is Phase.READY:
        numbers = smoke_summary(status.smoke_test, status.smoke_budget)
        what = f"Ready {status.version or tried}" + (f" ({numbers})" if numbers else "")
    elif mark.phase is Phase.ROLLED_BACK:
        serving = f"; {status.version} still serving" if status.version else ""
        what = f"RolledBack {tried} ({reason.removeprefix('smoke test failed: ')}{serving})"
    else:
        what = f"Failed {tried} ({reason})"
    return mark.commit, f"{status.key}: {what} {_stamp(mark.at)}"


def merge_note(existing: str, key: str, line: str) -> str:
    """The note with `key`'s line replaced (or added); other WorkflowRuns' lines, and lines not ours,
    kept; sorted so that two writers produce the same note. Pure."""
    lines = [ln for ln in existing.splitlines() if ln.strip() and not ln.startswith(f"{key}: ")]
    return "\n".join(sorted([*lines, line])) + "\n"


class NotesWriter(StatusFollower[tuple[str, str], str]):
    """Key: (commit, WorkflowRun); value: its line in that commit's note."""

    name = "rollout-notes"

    def __init__(self, source: GitSource, statuses: StatusStore, *, push_attempts: int = 4, **options: Any) -> None:
        super().__init__(statuses, **options)
        self._source = source
        self._attempts = push_attempts
        self.pushes = 0

    def desired(self, statuses: list[WorkflowRunStatus]) -> dict[tuple[str, str], str]:
        out = {}
        for status in statuses:
            if preview_of(status.name) is not None:
                continue  # a preview is no rollout of the branch: its outcome is on its pull request
            found = note_line(status)
            if found is not None:
                out[(found[0], status.key)] = found[1]
        return out

    async def deliver(self, key: tuple[str, str], value: str) -> None:
        commit, run = key
        try:
            await asyncio.to_thread(self.write, commit, run, value)
        except SourceError as exc:
            raise RetryLater(str(exc)) from None

    def write(self, commit: str, run: str, line: str) -> bool:
        """Blocking: merge `line` into the commit's note and push it; True when the note changed."""
        git = self._source.run_git
        for attempt in range(1, self._attempts + 1):
            self._fetch()
            try:
                existing = git("notes", f"--ref={NOTES_REF}", "show", commit)
            except SourceError:
                existing = ""  # no note on that commit yet
            merged = merge_note(existing, run, line)
            if merged == existing:
                return False
            git(*IDENTITY, "notes", f"--ref={NOTES_REF}", "add", "-f", "-F", "-", commit, stdin=merged)
            try:
                git("push", "origin", f"{NOTES_REF}:{NOTES_REF}")
            except SourceError as exc:
                if not _rejected(str(exc)) or attempt == self._attempts:
                    raise
                log.info("notes-push-rejected commit=%s attempt=%d (another writer): fetching and re-applying",
                         commit[:12], attempt)
                continue
            self.pushes += 1
            log.info("notes-written commit=%s workflowrun=%s", commit[:12], run)
            return True
        return False  # not reached: the last attempt raises

    def _fetch(self) -> None:
        try:
            self._source.run_git("fetch", "--no-write-fetch-head", "origin", f"+{NOTES_REF}:{NOTES_REF}")
        except SourceError as exc:
            if "couldn't find remote ref" not in str(exc):
                raise
            # No notes on the server yet: start from none (a stale local ref from an earlier, lost
            # push would otherwise be pushed along).
            try:
                self._source.run_git("update-ref", "-d", NOTES_REF)
            except SourceError:
                pass


def _rejected(message: str) -> bool:
    return any(word in message for word in ("rejected", "non-fast-forward", "fetch first", "stale info"))


def attach_notes_writer(source: GitSource, statuses: StatusStore, **options: Any) -> Callable[[], Awaitable[None]]:
    """`--write-notes`: start writing notes; returns the cleanup."""
    writer = NotesWriter(source, statuses, **options)
    log.info("write-notes on: each rollout's outcome goes to %s on its commit (needs push rights to it)", NOTES_REF)
    return writer.attach()
