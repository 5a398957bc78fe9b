"""The status file: a write encodes again only the status that changed, and the file is byte for
byte what encoding every status at once gives (readers, the mirror and `plnt status` see no change)."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

import pytest
from plnt.reconciler import status as status_module
from plnt.reconciler.state import atomic_write_bytes as real_atomic_write_bytes
from plnt.reconciler.state import atomic_write_json
from plnt.reconciler.status import Phase, StatusStore


def _whole(store: StatusStore, path: Path) -> bytes:
    """What the status file held before: every status encoded at once."""
    atomic_write_json(path, {s.key: s.model_dump(mode="json") for s in store.all()})
    return path.read_bytes()


@pytest.mark.parametrize("steps", [
    [],
    [("update", "default", "a", {"phase": Phase.PENDING})],
    [("update", "default", "b", {"phase": Phase.READY, "version": "1.0.0", "smoke_test": {"p95": 3.5, "ok": True}}),
     ("update", "default", "a", {"phase": Phase.VERIFYING, "message": "ünïcode \"quoted\"\nline"}),
     ("update", "prod", "a", {"phase": Phase.CANARY})],
    [("update", "default", "a", {"phase": Phase.PENDING}), ("remove", "default", "a", {})],
    [("update", "default", "a", {"phase": Phase.PENDING}), ("update", "default", "z", {"phase": Phase.READY}),
     ("remove", "default", "a", {}), ("update", "default", "z", {"phase": Phase.FAILED, "last_error": "x"})],
])
def test_status_file_is_the_whole_encoding(tmp_path: Path, steps: list) -> None:
    path = tmp_path / "status.json"
    store = StatusStore(path)
    for op, namespace, name, fields in steps:
        if op == "update":
            store.update(namespace, name, **fields)
        else:
            store.remove(namespace, name)
    written = path.read_bytes() if path.exists() else b"{}\n"
    assert written == _whole(store, tmp_path / "whole.json")
    assert json.loads(written) == {s.key: s.model_dump(mode="json") for s in store.all()}
    # A new store reads it back, and writes the same bytes again.
    again = StatusStore(path)
    assert [s.model_dump() for s in again.all()] == [s.model_dump() for s in store.all()]
    if store.all():
        first = store.all()[0]
        again.update(first.namespace, first.name, message=first.message)
        assert json.loads(path.read_bytes()).keys() == json.loads(written).keys()


class WriteSpy:
    """Wraps the REAL atomic_write_bytes (the file is written as ever) and notes each write: its
    thread, and what it wrote. `fail_next` makes the next write raise before it touches the file."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.writes: list[tuple[int, bytes]] = []
        self.fail_next = False
        self.release: threading.Event | None = None  # when set, a write waits for it first
        monkeypatch.setattr(status_module, "atomic_write_bytes", self)

    def __call__(self, path: Path, data: bytes) -> None:
        if self.release is not None:
            self.release.wait(10)
        if self.fail_next:
            self.fail_next = False
            raise OSError(28, "No space left on device")
        real_atomic_write_bytes(path, data)
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
    assert 1 <= len(spy.writes) <= 2, f"{len(spy.writes)} writes for 40 changes made at once"
    assert all(thread != threading.get_ident() for thread, _ in spy.writes), "a write ran on the event loop"
    assert path.read_bytes() == _whole(store, path.with_name("whole.json"))
    assert len(json.loads(path.read_bytes())) == 40 and len(changes) == 40


async def test_a_record_returns_only_once_the_file_holds_it(spied: Spied) -> None:
    path, store, spy = spied
    spy.release = threading.Event()
    pending = asyncio.ensure_future(store.record("default", "a", phase=Phase.READY))
    await asyncio.sleep(0.2)
    assert not pending.done() and not path.exists()
    spy.release.set()
    await pending
    assert json.loads(path.read_bytes())["default/a"]["phase"] == "Ready"


async def test_a_failed_write_fails_its_callers_and_the_next_record_writes_again(spied: Spied) -> None:
    path, store, spy = spied
    spy.fail_next = True
    with pytest.raises(OSError, match="No space left"):
        await store.record("default", "a", phase=Phase.CANARY)
    assert not path.exists()
    await store.record("default", "b", phase=Phase.READY)
    assert set(json.loads(path.read_bytes())) == {"default/a", "default/b"}


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
    assert path.read_bytes() == _whole(store, tmp_path / "whole.json")
    assert json.loads(path.read_bytes())["default/t-4"]["message"] == "53"  # its last update: i = 53


async def test_update_nowait_changes_at_once_and_writes_soon_in_one_write(spied: Spied) -> None:
    path, store, spy = spied
    for i in range(30):
        store.update_nowait("default", f"run-{i:02d}", phase=Phase.PENDING, message=f"m{i}")
        assert store.get(f"default/run-{i:02d}") is not None  # seen at once, before any write
    assert spy.writes == []  # nothing written on the loop
    await store.flush()
    assert len(spy.writes) == 1 and spy.writes[0][0] != threading.get_ident()
    assert path.read_bytes() == _whole(store, path.with_name("whole.json"))


async def test_update_nowait_made_during_a_write_is_written_by_the_next(spied: Spied) -> None:
    path, store, spy = spied
    spy.release = threading.Event()
    store.update_nowait("default", "a", phase=Phase.PENDING)
    await asyncio.sleep(0.05)  # the write has taken its state and waits
    store.update_nowait("default", "b", phase=Phase.PENDING)
    spy.release.set()
    for _ in range(100):
        if path.exists() and "default/b" in json.loads(path.read_bytes()):
            break
        await asyncio.sleep(0.02)
    assert set(json.loads(path.read_bytes())) == {"default/a", "default/b"} and len(spy.writes) == 2


async def test_a_failed_background_write_is_logged_and_the_next_change_writes_both(
    spied: Spied, caplog: pytest.LogCaptureFixture
) -> None:
    path, store, spy = spied
    spy.fail_next = True
    store.update_nowait("default", "a", phase=Phase.PENDING)
    with pytest.raises(OSError):
        await store.flush()
    assert "status-write-failed" in caplog.text and not path.exists()
    store.update_nowait("default", "b", phase=Phase.PENDING)
    await store.flush()
    assert set(json.loads(path.read_bytes())) == {"default/a", "default/b"}
