"""--verify-commits on a running plnt: real git, real SSH signatures (ssh-keygen), real Temporal,
real runners (mock model backend, a stand-in for a model server)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from plnt.reconciler.errors import UntrustedSagaInput
from plnt.reconciler.saga.commit_specs import CommitSpecs
from plnt.reconciler.source.commit_trust import CommitVerifier
from plnt.reconciler.source.git import GitSource

from tests.conftest import SpecRepo
from tests.e2e.harness import hook, invoke, running_plnt, settings_for, status_of, wait_for, wait_phase
from tests.reconciler.saga.test_saga import ref_at

pytestmark = pytest.mark.integration

RUN_FILE = "workflowruns/review-responder.yaml"


def signed_commit(repo: SpecRepo, key: Path, message: str) -> str:
    repo.git("add", "-A")
    repo.git("-c", "gpg.format=ssh", "-c", f"user.signingkey={key}.pub", "commit", "-q", "-S", "--allow-empty",
             "-m", message)
    return repo.git("rev-parse", "HEAD")


async def test_only_signed_commits_deploy(spec_repo: SpecRepo, tmp_path: Path, temporal_address: str,
                                          temporal_namespace: str) -> None:
    key = tmp_path / "signer-a"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "signer-a", "-f", str(key)], check=True)
    allowed = tmp_path / "allowed_signers"
    allowed.write_text(f"signer-a@example.com {key.with_suffix('.pub').read_text().strip()}\n")
    settings = settings_for(spec_repo.path, tmp_path / "state", temporal_address, temporal_namespace,
                            verify_commits="head", allowed_signers=allowed)
    first = spec_repo.git("rev-parse", "HEAD")  # the fixture's commit: unsigned
    async with running_plnt(settings) as plnt:
        source = await wait_for(lambda: plnt.reconciler.source_status.get("untrusted"), what="the unsigned head refused")
        assert source == {"commit": first, "trusted": False, "signer": None, "reason": "unsigned"}
        assert plnt.reconciler.source_status["problems"] == [f"commit {first[:12]} is not trusted: unsigned"]
        assert status_of(plnt) is None and plnt.driver.snapshot() == {}, "nothing deploys from an unsigned commit"

        signed = signed_commit(spec_repo, key, "signed by signer-a")
        await hook(plnt)
        await wait_phase(plnt, "Ready", version="1.2.0")
        assert plnt.reconciler.source_status["untrusted"] is None
        assert plnt.reconciler.source_status["lastReconciledCommit"] == signed

        # An unsigned version bump: nothing running changes; status and GET /source say why.
        spec_repo.replace(RUN_FILE, "review-responder@1.2.0", "review-responder@1.3.0")
        bad = spec_repo.commit("unsigned bump")
        await hook(plnt)
        status = await wait_for(lambda: (s := status_of(plnt)) and bad[:12] in s["message"] and s,
                                what="status to name the untrusted commit")
        assert status["message"] == f"Ready 1.2.0; commit {bad[:12]} is not trusted: unsigned"
        assert (status["phase"], status["version"]) == ("Ready", "1.2.0")
        assert (await invoke(plnt)).json()["version"] == "1.2.0"
        assert plnt.reconciler.running_sagas == set()

        # A saga naming the unsigned commit (forged on a shared Temporal) is refused by the activities.
        clone = GitSource(str(spec_repo.path), tmp_path / "forger-check")
        clone.fetch()
        specs = CommitSpecs(clone, verifier=CommitVerifier("head", home=tmp_path / "v", allowed_signers=allowed))
        with pytest.raises(UntrustedSagaInput, match="is not trusted: unsigned"):
            await specs.resolve(ref_at(spec_repo))

        # The same change, signed, deploys.
        signed_commit(spec_repo, key, "signed bump")
        await hook(plnt)
        await wait_phase(plnt, "Ready", version="1.3.0")
