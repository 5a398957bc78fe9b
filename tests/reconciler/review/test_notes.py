"""Rollout outcomes as git notes under refs/notes/plnt (reconciler/review/notes.py), with real git: a bare
origin (file://), plnt's own clone (GitSource), another writer's clone. No fakes; the one test hook
makes the other writer push at the exact moment that forces plnt's push to be rejected."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from plnt.core.status import Phase, RolloutMark, WorkflowRunStatus
from plnt.reconciler.review.notes import NOTES_REF, NotesWriter, merge_note, note_line
from plnt.reconciler.source.git import GitSource
from plnt.reconciler.status_store import StatusStore

from tests.conftest import GIT_ENV

AT = 1796096400.0  # 2026-12-01T03:40:00Z
PASSED = {"passed": True, "reason": "ok", "metrics": {"invocations": 10, "errors": 0, "error_percent": 0.0,
                                                      "p50_ms": 30.0, "p95_ms": 41.0, "max_ms": 50.0}}
BUDGET = {"p95BudgetMs": 2500.0, "errorBudgetPercent": 1.0}


def git(cwd: Path, *args: str, stdin: str | None = None) -> str:
    return subprocess.run(["git", *args], cwd=cwd, env={**os.environ, **GIT_ENV}, input=stdin, check=True,
                          capture_output=True, text=True).stdout


def status(name: str, phase: Phase, commit: str, message: str = "", **fields: Any) -> WorkflowRunStatus:
    return WorkflowRunStatus(namespace="default", name=name, phase=phase, message=message,
                             rollout=RolloutMark(commit=commit, phase=phase, message=message, at=AT), **fields)


@pytest.mark.parametrize(("st", "expected"), [
    (status("a", Phase.CANARY, "c"), None),
    (status("a", Phase.READY, "c", version="1.3.0", attempted_version="1.3.0", smoke_test=PASSED, smoke_budget=BUDGET),
     ("c", "default/a: Ready 1.3.0 (p95 41 ms ≤ 2500, errors 0% ≤ 1%) 2026-12-01T03:40:00Z")),
    (status("a", Phase.READY, "c", version="1.3.0"), ("c", "default/a: Ready 1.3.0 2026-12-01T03:40:00Z")),
    (status("a", Phase.ROLLED_BACK, "c", "smoke test failed: error rate 100% over budget 1%", version="1.2.0",
            attempted_version="1.4.0"),
     ("c", "default/a: RolledBack 1.4.0 (error rate 100% over budget 1%; 1.2.0 still serving) 2026-12-01T03:40:00Z")),
    (status("a", Phase.FAILED, "c", "RecipeUntrusted:\n" + "z" * 400, attempted_version="1.4.0"),
     ("c", "default/a: Failed 1.4.0 (RecipeUntrusted: " + "z" * 282 + "…) 2026-12-01T03:40:00Z")),
])
def test_note_line_table(st: WorkflowRunStatus, expected: tuple[str, str] | None) -> None:
    assert note_line(st) == expected


def test_merge_note_replaces_our_line_and_keeps_the_others() -> None:
    assert merge_note("", "default/a", "default/a: Ready 1") == "default/a: Ready 1\n"
    existing = "default/b: Ready 2\ndefault/a: Failed 1\nwritten by hand\n"
    assert merge_note(existing, "default/a", "default/a: Ready 1") == \
        "default/a: Ready 1\ndefault/b: Ready 2\nwritten by hand\n"
    # default/ab is not default/a
    assert merge_note("default/ab: Ready 3\n", "default/a", "default/a: Ready 1") == \
        "default/a: Ready 1\ndefault/ab: Ready 3\n"


@pytest.fixture
def origin(tmp_path: Path) -> tuple[Path, Path, list[str]]:
    """A bare origin with two commits on main, and the work clone they were made in."""
    work = tmp_path / "work"
    work.mkdir()
    git(work, "init", "-q", "-b", "main")
    commits = []
    for i in range(2):
        (work / "f.txt").write_text(f"{i}\n")
        git(work, "add", "-A")
        git(work, "commit", "-q", "-m", f"commit {i}")
        commits.append(git(work, "rev-parse", "HEAD").strip())
    bare = tmp_path / "origin.git"
    git(tmp_path, "clone", "-q", "--bare", str(work), str(bare))
    return bare, work, commits


def notes_in_fresh_clone(bare: Path, where: Path) -> str:
    git(where.parent, "clone", "-q", f"file://{bare}", str(where))
    git(where, "fetch", "-q", "origin", f"{NOTES_REF}:{NOTES_REF}")
    return git(where, "log", "--notes=plnt", "--format=%H %s%n%N")


def plnt_clone(bare: Path, tmp_path: Path) -> GitSource:
    source = GitSource(f"file://{bare}", tmp_path / "state" / "source")
    source.fetch()
    return source


def test_notes_written_then_updated_for_a_second_workflowrun(origin: tuple[Path, Path, list[str]], tmp_path: Path) -> None:
    bare, _, (first, second) = origin
    writer = NotesWriter(plnt_clone(bare, tmp_path), StatusStore(tmp_path / "status.json"))
    assert writer.write(second, "default/a", "default/a: Ready 1.3.0 T1")
    assert writer.write(second, "default/b", "default/b: RolledBack 2.0.0 (slow) T2")
    assert not writer.write(second, "default/b", "default/b: RolledBack 2.0.0 (slow) T2")  # unchanged: no push
    assert writer.write(first, "default/a", "default/a: Ready 1.2.0 T0")
    assert writer.write(second, "default/a", "default/a: Ready 1.3.1 T3")  # in place
    assert writer.pushes == 4
    log = notes_in_fresh_clone(bare, tmp_path / "fresh")
    assert f"{second} commit 1\ndefault/a: Ready 1.3.1 T3\ndefault/b: RolledBack 2.0.0 (slow) T2\n" in log
    assert f"{first} commit 0\ndefault/a: Ready 1.2.0 T0\n" in log
    assert "1.3.0" not in log


def test_a_concurrent_writers_note_is_merged_by_the_retry(origin: tuple[Path, Path, list[str]], tmp_path: Path,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    bare, _, (_, second) = origin
    other = tmp_path / "other"
    git(tmp_path, "clone", "-q", f"file://{bare}", str(other))
    source = plnt_clone(bare, tmp_path)
    real = source.run_git
    raced: list[bool] = []

    def run_git(*args: str, **kwargs: Any) -> str:
        if args[0] == "push" and not raced:  # another plnt (or a human) pushes a note first
            raced.append(True)
            git(other, "notes", f"--ref={NOTES_REF}", "add", "-f", "-m", "other/x: Ready 9.9.9 T9", second)
            git(other, "push", "-q", "origin", NOTES_REF)
        return real(*args, **kwargs)

    source.run_git = run_git  # type: ignore[method-assign]
    writer = NotesWriter(source, StatusStore(tmp_path / "status.json"))
    assert writer.write(second, "default/a", "default/a: Ready 1.3.0 T1")
    assert raced and "notes-push-rejected" in caplog.text
    log = notes_in_fresh_clone(bare, tmp_path / "fresh")
    assert f"{second} commit 1\ndefault/a: Ready 1.3.0 T1\nother/x: Ready 9.9.9 T9\n" in log


async def test_the_writer_follows_status_changes_and_retries_an_unreachable_origin(
        origin: tuple[Path, Path, list[str]], tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    bare, _, (first, second) = origin
    source = plnt_clone(bare, tmp_path)
    store = StatusStore(tmp_path / "status.json")
    writer = NotesWriter(source, store, initial_backoff_s=0.05, max_backoff_s=0.2)
    stop = writer.attach()
    moved = bare.with_name("moved.git")
    try:
        store.update("default", "a", phase=Phase.CANARY, rollout=RolloutMark(commit=first, phase=Phase.CANARY, at=AT))
        await asyncio.sleep(0.2)
        assert writer.pushes == 0  # not over yet: no note
        bare.rename(moved)  # the git server goes away
        store.update("default", "a", phase=Phase.READY, version="1.2.0",
                     rollout=RolloutMark(commit=first, phase=Phase.READY, at=AT))
        await asyncio.sleep(0.5)
        assert writer.pushes == 0 and "rollout-notes-retry" in caplog.text
        moved.rename(bare)  # back: the note goes without any new status change
        deadline = time.monotonic() + 10
        while writer.pushes == 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        store.update("default", "b", phase=Phase.FAILED, attempted_version="2.0.0",
                     rollout=RolloutMark(commit=first, phase=Phase.FAILED, message="boom", at=AT))
        while writer.pushes < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
    finally:
        await stop()
    log = notes_in_fresh_clone(bare, tmp_path / "fresh")
    assert (f"{first} commit 0\ndefault/a: Ready 1.2.0 2026-12-01T03:40:00Z\n"
            f"default/b: Failed 2.0.0 (boom) 2026-12-01T03:40:00Z\n") in log
    assert second in log and writer.pushes == 2
