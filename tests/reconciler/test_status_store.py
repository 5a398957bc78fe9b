"""The status files: a write appends what changed to STATE/status.journal (it never encodes or
writes the statuses that did not change), status.json is rewritten whole only when the journal
outgrows it, at start and at stop, and it is then byte for byte what encoding every status at once
gives (readers, the mirror and `plnt status` see no change). `read_statuses` reads both."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

import pytest
from plnt.core.status import Phase
from plnt.reconciler import status_store as status_module
from plnt.reconciler.state import append_durably as real_append_durably
from plnt.reconciler.state import atomic_write_bytes as real_atomic_write_bytes
from plnt.reconciler.state import atomic_write_json
from plnt.reconciler.status_store import StatusStore, journal_path, read_statuses


def _whole(store: StatusStore, path: Path) -> bytes:
    """What the status file held before: every status encoded at once."""
    atomic_write_json(path, {s.key: s.model_dump(mode="json") for s in store.all()})
    return path.read_bytes()


def held(store: StatusStore) -> dict:
    return {s.key: s.model_dump(mode="json") for s in store.all()}


@pytest.mark.parametrize("steps", [
    [],
    [("update", "default", "a", {"phase": Phase.PENDING})],
    [("update", "default", "b", {"phase": Phase.READY, "version": "1.0.0", "smoke_test": {"p95": 3.5, "ok": True}}),
     ("update", "default", "a", {"phase": Phase.VERIFYING, "message": "ünïcode \"quoted\"\nline\r\u2028"}),
     ("update", "prod", "a", {"phase": Phase.CANARY})],
    [("update", "default", "a", {"phase": Phase.PENDING}), ("remove", "default", "a", {})],
    [("update", "default", "a", {"phase": Phase.PENDING}), ("update", "default", "z", {"phase": Phase.READY}),
     ("remove", "default", "a", {}), ("update", "default", "z", {"phase": Phase.FAILED, "last_error": "x"})],
])
async def test_the_files_hold_every_change_and_status_json_is_whole_after_a_flush(tmp_path: Path, steps: list) -> None:
    path = tmp_path / "status.json"
    store = StatusStore(path)
    for op, namespace, name, fields in steps:
        if op == "update":
            store.update(namespace, name, **fields)
        else:
            store.remove(namespace, name)
    assert read_statuses(path) == held(store)
    # A new store reads them back (and compacts the journal into status.json).
    again = StatusStore(path)
    assert [s.model_dump() for s in again.all()] == [s.model_dump() for s in store.all()]
    assert not journal_path(path).exists()
    await store.flush()
    written = path.read_bytes() if path.exists() else b"{}\n"
    assert written == _whole(store, tmp_path / "whole.json") and not journal_path(path).exists()
    assert json.loads(written) == held(store)


def test_a_write_appends_only_what_changed(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    store = StatusStore(path)
    for i in range(200):
        store.update("default", f"run-{i:03d}", phase=Phase.READY, version="1.0.0", message="in sync")
    store._save(compact=True)
    snapshot = path.read_bytes()
    store.update("default", "run-007", phase=Phase.CANARY, message="smoke test")
    journal = journal_path(path).read_bytes()
    assert path.read_bytes() == snapshot, "status.json is not rewritten for one change"
    assert journal.count(b"\n") == 1 and b'"default/run-007"' in journal and b"run-006" not in journal
    assert len(journal) < len(snapshot) / 100
    assert read_statuses(path)["default/run-007"]["phase"] == "Canary"


def test_the_journal_is_compacted_into_status_json_once_it_outgrows_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(status_module, "JOURNAL_MIN_BYTES", 0)
    path = tmp_path / "status.json"
    store = StatusStore(path)
    store.update("default", "a", phase=Phase.PENDING)  # no status.json yet: compacted at once
    assert not journal_path(path).exists() and json.loads(path.read_bytes()) == held(store)
    sizes = []
    for i in range(10):
        store.update("default", "a", phase=Phase.PENDING, message=f"attempt {i}")
        sizes.append(journal_path(path).stat().st_size if journal_path(path).exists() else 0)
    assert 0 in sizes and max(sizes) < 2 * path.stat().st_size + 1000, sizes
    assert read_statuses(path) == held(store)


def test_a_line_cut_short_is_skipped_and_the_next_start_compacts(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    store = StatusStore(path)
    store.update("default", "a", phase=Phase.READY, version="1.0.0")
    store.update("default", "b", phase=Phase.CANARY)
    with journal_path(path).open("ab") as journal:
        journal.write(b'{"key":"default/a","status":{"namespace":"default","name":"a","pha')  # a crash mid-write
    assert read_statuses(path) == held(store)
    again = StatusStore(path)
    assert held(again) == held(store) and not journal_path(path).exists()
    again.update("default", "c", phase=Phase.PENDING)
    assert set(read_statuses(path)) == {"default/a", "default/b", "default/c"}


def test_a_crash_between_status_json_and_the_journals_removal_loses_nothing(tmp_path: Path) -> None:
    """Compaction appends what changed, renames the new status.json in, then removes the journal.
    Cut before the removal, the journal's changes replayed over the new status.json end where it does."""

    class KeptJournal(type(tmp_path)):  # type: ignore[misc]
        def unlink(self, missing_ok: bool = False) -> None:
            pass

    path = tmp_path / "status.json"
    store = StatusStore(path)
    store.update("default", "a", phase=Phase.PENDING, message="first")
    store.update("default", "b", phase=Phase.PENDING)
    store._journal = KeptJournal(journal_path(path))
    store._change("default", "a", {"phase": Phase.READY, "message": "last"})
    store._change("default", "b", {})
    store.remove("default", "b")  # (remove writes)
    store._save(compact=True)
    assert journal_path(path).exists(), "the crash: the journal was not removed"
    assert read_statuses(path) == held(store) == json.loads(path.read_bytes())
    assert read_statuses(path)["default/a"]["message"] == "last"


class WriteSpy:
    """Wraps the REAL file writes (atomic_write_bytes for status.json, append_durably for the
    journal: the files are written as ever) and notes each: its thread, and what it wrote.
    `fail_next` makes the next write raise before it touches a file."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.writes: list[tuple[int, bytes]] = []
        self.fail_next = False
        self.release: threading.Event | None = None  # when set, a write waits for it first
        self.held = threading.Event()  # set once a write waits for `release`
        monkeypatch.setattr(status_module, "atomic_write_bytes", lambda path, data: self(real_atomic_write_bytes, path, data))
        monkeypatch.setattr(status_module, "append_durably", lambda path, data: self(real_append_durably, path, data))

    def __call__(self, write, path: Path, data: bytes) -> None:  # type: ignore[no-untyped-def]
        if self.release is not None:
            self.held.set()
            self.release.wait(10)
        if self.fail_next:
            self.fail_next = False
            raise OSError(28, "No space left on device")
        write(path, data)
        self.writes.append((threading.get_ident(), data))


Spied = tuple[Path, StatusStore, WriteSpy]


@pytest.fixture
def spied(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Spied:
    """A status store on tmp_path/status.json, its file writes spied."""
    path = tmp_path / "status.json"
    return path, StatusStore(path), WriteSpy(monkeypatch)


async def test_saga_writes_at_once_are_grouped_into_two_file_writes_off_the_loop(spied: Spied) -> None:
    path, store, spy = spied
    changes: list[int] = []
    store.on_change = lambda: changes.append(store.revision)
    await asyncio.gather(*(store.record("default", f"run-{i:02d}", phase=Phase.CANARY, message=f"m{i}")
                           for i in range(40)))
    assert 1 <= len(spy.writes) <= 3, f"{len(spy.writes)} writes for 40 changes made at once"
    assert all(thread != threading.get_ident() for thread, _ in spy.writes), "a write ran on the event loop"
    assert read_statuses(path) == held(store)
    assert len(read_statuses(path)) == 40 and len(changes) == 40


async def test_a_record_returns_only_once_the_file_holds_it(spied: Spied) -> None:
    path, store, spy = spied
    spy.release = threading.Event()
    pending = asyncio.ensure_future(store.record("default", "a", phase=Phase.READY))
    assert await asyncio.to_thread(spy.held.wait, 10)  # the write has started and is held
    assert not pending.done() and read_statuses(path) == {}
    spy.release.set()
    await pending
    assert read_statuses(path)["default/a"]["phase"] == "Ready"


async def test_a_failed_write_fails_its_callers_and_the_next_record_writes_again(spied: Spied) -> None:
    path, store, spy = spied
    spy.fail_next = True
    with pytest.raises(OSError, match="No space left"):
        await store.record("default", "a", phase=Phase.CANARY)
    assert read_statuses(path) == {}
    await store.record("default", "b", phase=Phase.READY)
    assert set(read_statuses(path)) == {"default/a", "default/b"}


async def test_writes_from_a_thread_and_the_loop_leave_the_newest_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reconciler's synchronous updates and the sagas' grouped ones may overlap: whichever
    write ends last, the file holds every change."""
    path = tmp_path / "status.json"
    store = StatusStore(path)

    def updates() -> None:
        for i in range(60):
            store.update("default", f"t-{i % 7}", phase=Phase.PENDING, message=str(i))

    thread = asyncio.to_thread(updates)
    await asyncio.gather(thread, *(store.record("default", f"r-{i % 5}", phase=Phase.CANARY, message=str(i))
                                   for i in range(60)))
    assert read_statuses(path) == held(store)
    assert read_statuses(path)["default/t-4"]["message"] == "53"  # its last update: i = 53


async def test_update_nowait_changes_at_once_and_writes_soon_in_one_write(spied: Spied) -> None:
    path, store, spy = spied
    for i in range(30):
        store.update_nowait("default", f"run-{i:02d}", phase=Phase.PENDING, message=f"m{i}")
        assert store.get(f"default/run-{i:02d}") is not None  # seen at once, before any write
    assert spy.writes == []  # nothing written on the loop
    await store.flush()
    # One append of the 30 changes, then (flush) status.json whole: neither on the loop.
    assert len(spy.writes) == 2 and all(thread != threading.get_ident() for thread, _ in spy.writes)
    assert spy.writes[0][1].count(b"\n") == 30
    assert path.read_bytes() == _whole(store, path.with_name("whole.json"))


async def test_update_nowait_made_during_a_write_is_written_by_the_next(spied: Spied) -> None:
    path, store, spy = spied
    spy.release = threading.Event()
    store.update_nowait("default", "a", phase=Phase.PENDING)
    assert await asyncio.to_thread(spy.held.wait, 10)  # the write has taken its state and waits
    store.update_nowait("default", "b", phase=Phase.PENDING)
    spy.release.set()
    for _ in range(100):
        if "default/b" in read_statuses(path):
            break
        await asyncio.sleep(0.02)
    assert set(read_statuses(path)) == {"default/a", "default/b"} and len(spy.writes) == 2


async def test_a_failed_background_write_is_logged_and_the_next_change_writes_both(
    spied: Spied, caplog: pytest.LogCaptureFixture
) -> None:
    path, store, spy = spied
    spy.fail_next = True
    store.update_nowait("default", "a", phase=Phase.PENDING)
    with pytest.raises(OSError):
        await store.flush()
    assert "status-write-failed" in caplog.text and read_statuses(path) == {}
    store.update_nowait("default", "b", phase=Phase.PENDING)
    await store.flush()
    assert set(json.loads(path.read_bytes())) == {"default/a", "default/b"} and not journal_path(path).exists()
