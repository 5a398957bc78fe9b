"""A refused newest commit (invalid, untrusted, held for approval) never stops plnt from enforcing
the last one it reconciled: a stable runner killed by hand meanwhile is restarted, and the status
says both what serves and what is refused. Real git, real Temporal, real runners (mock model
backend, a STAND-IN for a model server), real SSH signatures (ssh-keygen); the held case uses the
DECLARED forge stand-in (tests/forge_standin.py, GitHub REST shapes).

The untrusted and held cases restart plnt on its state directory with the check turned on, so
the specs of the last reconciled commit are read again from the clone, as after a crash."""

from __future__ import annotations

import os
import signal
import subprocess
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from tests.conftest import SpecRepo
from tests.e2e.harness import hook, invoke, running_plnt, settings_for, status_of, wait_for, wait_phase
from tests.e2e.test_commit_to_serving import RUN_FILE, _alive
from tests.forge_standin import ForgeStandin

pytestmark = pytest.mark.integration

TOKEN = "forge-token-refused-commit"


def _refusing(kind: str, tmp_path: Path, stack: ExitStack) -> dict[str, Any]:
    """Settings that refuse an unsigned direct push of the given kind (none for "invalid": a typo is refused anyway)."""
    if kind == "untrusted":
        key = tmp_path / "signer"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "signer", "-f", str(key)], check=True)
        allowed = tmp_path / "allowed_signers"
        allowed.write_text(f"signer@example.com {key.with_suffix('.pub').read_text().strip()}\n")
        return {"verify_commits": "head", "allowed_signers": allowed}
    if kind == "held":
        standin = stack.enter_context(ForgeStandin("github", "platform/specs", TOKEN))
        return {"forge": "github", "forge_api_url": standin.api_url, "forge_project": "platform/specs",
                "forge_token": SecretStr(TOKEN), "require_approval": True}
    return {}


@pytest.mark.parametrize("kind", ["invalid", "untrusted", "held"])
async def test_a_refused_commit_keeps_the_last_good_state_healed(
    kind: str, spec_repo: SpecRepo, tmp_path: Path, temporal_address: str, temporal_namespace: str
) -> None:
    state = tmp_path / "state"
    with ExitStack() as stack:
        async with running_plnt(settings_for(spec_repo.path, state, temporal_address, temporal_namespace)) as plnt:
            await wait_phase(plnt, "Ready", version="1.2.0")
            good = plnt.reconciler.source_status["lastReconciledCommit"]
        if kind == "invalid":
            spec_repo.replace(RUN_FILE, "  replicas:", "  replicaz:")  # a typo: an unknown field
        else:  # a valid bump, refused for who pushed it (unsigned; no pull request)
            spec_repo.replace(RUN_FILE, "review-responder@1.2.0", "review-responder@1.3.0")
        bad = spec_repo.commit(f"refused: {kind}")
        settings = settings_for(spec_repo.path, state, temporal_address, temporal_namespace,
                                **_refusing(kind, tmp_path, stack))
        async with running_plnt(settings) as plnt:
            await hook(plnt)
            await wait_for(lambda: plnt.reconciler.source_status.get("newestCommit") == bad
                           and plnt.reconciler.source_status.get("problems"), what=f"the {kind} commit refused")
            assert plnt.reconciler.source_status["lastReconciledCommit"] == good
            release = plnt.driver.snapshot()["default/review-responder"].stable
            assert release.version == "1.2.0"

            os.kill(release.pid, signal.SIGKILL)
            await wait_for(lambda: not _alive(release.pid), what="runner to die")
            healed = await wait_for(
                lambda: (r := plnt.driver.snapshot()["default/review-responder"].stable).pid != release.pid
                and _alive(r.pid) and r,
                timeout=15, what="the killed runner restarted while the newest commit is refused")
            assert healed.release_id == release.release_id
            assert (await invoke(plnt)).json()["version"] == "1.2.0"

            # The status says both: what serves, and what is refused (the heal's own message is replaced).
            status = await wait_for(lambda: (s := status_of(plnt)) and bad[:12] in s["message"] and s,
                                    what="the status to name the refused commit")
            assert status["phase"] == "Ready" and status["version"] == "1.2.0"
            refused = {"invalid": "is invalid", "untrusted": "is not trusted: unsigned", "held": "is held:"}[kind]
            assert status["message"].startswith(f"Ready 1.2.0; commit {bad[:12]} {refused}"), status["message"]
            assert plnt.reconciler.running_sagas == set(), "nothing of the refused commit was deployed"
