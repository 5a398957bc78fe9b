"""Bulk control-plane work (a commit's spec parse) runs on low-priority threads (reconciler/bulk.py)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from plnt.reconciler import bulk
from plnt.reconciler.bulk import BULK_NICE, in_bulk_thread
from plnt.reconciler.source.git import GitSource

from tests.conftest import SpecRepo


def nice_of_this_thread() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


async def test_bulk_threads_are_niced_and_the_loop_is_not() -> None:
    process_nice = os.getpriority(os.PRIO_PROCESS, 0)
    assert await in_bulk_thread(nice_of_this_thread) == min(19, process_nice + BULK_NICE)
    assert nice_of_this_thread() == process_nice, "only the bulk thread is lowered"


async def test_the_reconcilers_spec_parse_runs_on_a_bulk_thread(spec_repo: SpecRepo, tmp_path: Path,
                                                                monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Through CommitSpecs, as a saga step and the reconciler read a commit: the parse's thread is niced."""
    from plnt.reconciler.saga.commit_specs import CommitSpecs

    source = GitSource(str(spec_repo.path), tmp_path / "clone")
    commit = source.fetch()
    seen: list[int] = []
    load = source.load

    def recording(*args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(nice_of_this_thread())
        return load(*args, **kwargs)

    monkeypatch.setattr(source, "load", recording)
    specs = CommitSpecs(source)
    await specs._load(commit)
    assert seen == [min(19, os.getpriority(os.PRIO_PROCESS, 0) + BULK_NICE)]
    assert bulk._executor is not None
