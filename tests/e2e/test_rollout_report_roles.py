"""The rollout verdict with the roles apart: `plnt reconcile --forge ... --write-notes` (its own
process; the saga's phase records are written there) and `plnt worker`, on a real Temporal and a
real git repository, reporting to the DECLARED forge stand-in (tests/forge_standin.py, GitLab's
documented shapes; not a live forge)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import SpecRepo
from tests.e2e.test_split_roles import Roles, wait_phase
from tests.forge_standin import ForgeStandin
from tests.services import _Process

pytestmark = pytest.mark.integration

FORGE_TOKEN = "roles-forge-token-123"
CONTEXT = "plnt/default/review-responder"


class ForgeRoles(Roles):
    """Roles whose reconciler reports to the forge stand-in and writes notes."""

    forge: ForgeStandin

    def _start(self, name: str, args: list[str], ready: str) -> _Process:
        if args[0] == "reconcile":
            token_file = self.tmp / "forge.token"
            token_file.write_text(FORGE_TOKEN + "\n")
            args = [*args, "--forge", "gitlab", "--forge-api-url", self.forge.api_url, "--forge-project",
                    self.forge.project, "--forge-token-file", str(token_file), "--write-notes"]
        return super()._start(name, args, ready)


async def test_the_reconciler_role_reports_statuses_and_writes_notes(
        tmp_path: Path, spec_repo: SpecRepo, temporal_address: str, temporal_namespace: str) -> None:
    commit = spec_repo.git("rev-parse", "HEAD")
    with ForgeStandin("gitlab", "platform/specs", FORGE_TOKEN) as forge:
        roles = ForgeRoles(tmp_path, spec_repo, temporal_address, temporal_namespace)
        roles.forge = forge
        try:
            reconciler = roles.reconciler()
            roles.worker()
            async with httpx.AsyncClient(trust_env=False, timeout=10) as client:
                await wait_phase(client, roles.control_url, "Ready", "1.2.0")

            def mine() -> list[tuple[str, str]]:
                return [(s["status"], s["description"]) for s in forge.statuses
                        if s["sha"] == commit and s["name"] == CONTEXT]

            deadline = time.monotonic() + 30
            while not (mine() and mine()[-1][0] == "success") and time.monotonic() < deadline:
                time.sleep(0.1)
            notes = ""
            while "review-responder: Ready 1.2.0" not in notes and time.monotonic() < deadline:
                notes = subprocess.run(["git", "log", "--notes=plnt", "--format=%H%n%N"], cwd=spec_repo.path,
                                       capture_output=True, text=True).stdout
                time.sleep(0.1)
        finally:
            roles.stop_all()
    seen = mine()
    assert seen and seen[-1][0] == "success" and seen[-1][1].startswith("Ready 1.2.0: p95 "), seen
    # GitLab refuses pending -> pending: one pending, then the verdict.
    assert [s for s, _ in seen] == ["pending", "success"], seen
    assert f"{commit}\ndefault/review-responder: Ready 1.2.0 (p95 " in notes
    assert FORGE_TOKEN not in reconciler.tail()
