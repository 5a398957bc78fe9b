"""The status file: a write encodes again only the status that changed, and the file is byte for
byte what encoding every status at once gives (readers, the mirror and `plnt status` see no change)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
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
