"""The attack suite's ground truth: the re-signed example deploys and serves, and an attack that
changes nothing is seen to change nothing (so the checks in live.py can fail).

The recipes are signed by a test authority (tests/sigstore_ca.py), a STAND-IN for Sigstore's
public services; the runners' model is MockBackend, a stand-in for a model server."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.attacks.live import AttackRepo, OutsideWrites, assert_still_serving, live_plnt

pytestmark = pytest.mark.integration


async def test_resigned_example_serves_and_outside_writes_are_seen(
    attack_repo: AttackRepo, tmp_path: Path, temporal_address: str, temporal_namespace: str
) -> None:
    async with live_plnt(attack_repo, tmp_path, temporal_address, temporal_namespace) as plnt:
        outside = OutsideWrites([tmp_path], ignore=[plnt.state.root])
        await assert_still_serving(plnt)
        outside.assert_none()
        (tmp_path / "planted").write_text("x")
        assert outside.changes() == [f"+ {tmp_path.resolve() / 'planted'}"]
