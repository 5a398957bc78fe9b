"""What a preview saga may deploy (CommitSpecs with `preview`): a commit of that pull request's ref
as plnt fetched it, never another pull request's, and the branch check kept for every other saga.
Real git repositories (the origin's refs/pull/N/head made with `git update-ref`, as a forge makes
them) and real SSH signatures (ssh-keygen) for --verify-commits."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from plnt.reconciler.errors import UntrustedSagaInput
from plnt.reconciler.saga.commit_specs import CommitSpecs
from plnt.reconciler.source.commit_trust import CommitVerifier
from plnt.reconciler.source.git import GitSource

from tests.conftest import SpecRepo
from tests.reconciler.saga.test_saga import ref_at

pytestmark = pytest.mark.integration

RUN_FILE = "workflowruns/review-responder.yaml"
GLOBS = ("refs/pull/*/head",)


def pr_commit(repo: SpecRepo, pr: int, version: str) -> str:
    repo.git("checkout", "-q", "-B", f"pr-{pr}", "main")
    repo.replace(RUN_FILE, "review-responder@1.2.0", f"review-responder@{version}")
    sha = repo.commit(f"pr {pr}: {version}")
    repo.git("update-ref", f"refs/pull/{pr}/head", sha)
    return sha


async def test_a_preview_saga_deploys_only_its_pull_requests_commits(spec_repo: SpecRepo, tmp_path: Path) -> None:
    main = spec_repo.git("rev-parse", "main")
    source = GitSource(str(spec_repo.path), tmp_path / "clone", previews=GLOBS)
    source.fetch()
    head = pr_commit(spec_repo, 7, "1.3.0")  # pushed after plnt's last fetch: resolve fetches once
    preview = ref_at(spec_repo, name="review-responder--pr7", preview=7)
    spec_repo.git("checkout", "-q", "main")
    specs = CommitSpecs(source)

    trusted = await specs.resolve(preview)
    assert trusted.run is not None and trusted.run.key == "default/review-responder--pr7"
    assert trusted.run.spec.workflow.version == "1.3.0"
    assert source.fetch_previews() == {"refs/pull/7/head": head}
    assert source.is_in_preview(main, 7), "the PR's base is reachable from its head"

    # The branch check stays for every saga that is not a preview.
    with pytest.raises(UntrustedSagaInput, match="is not on branch 'main'"):
        await specs.resolve(preview.model_copy(update={"name": "review-responder", "preview": None}))
    # Another pull request's preview may not name this one's commit.
    with pytest.raises(UntrustedSagaInput, match="not on the preview ref of pull request 8"):
        await specs.resolve(preview.model_copy(update={"name": "review-responder--pr8", "preview": 8}))
    # The fingerprint must be the commit's.
    with pytest.raises(UntrustedSagaInput, match="gives version 1.3.0"):
        await specs.resolve(preview.model_copy(update={"version": "1.4.0"}))

    # The ref disappears at the origin (the PR closed): plnt's fetch prunes it, and the commit is refused.
    spec_repo.git("update-ref", "-d", "refs/pull/7/head")
    assert source.fetch_previews() == {}
    with pytest.raises(UntrustedSagaInput, match="not on the preview ref of pull request 7"):
        await CommitSpecs(source).resolve(preview)

    # A source without --previews knows no preview ref at all.
    bare = GitSource(str(spec_repo.path), tmp_path / "bare")
    bare.fetch()
    with pytest.raises(UntrustedSagaInput, match="no --previews"):
        await CommitSpecs(bare).resolve(preview)


async def test_verify_commits_applies_to_preview_commits(spec_repo: SpecRepo, tmp_path: Path) -> None:
    key = tmp_path / "signer-a"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "signer-a", "-f", str(key)], check=True)
    allowed = tmp_path / "allowed_signers"
    allowed.write_text(f"signer-a@example.com {key.with_suffix('.pub').read_text().strip()}\n")
    verifier = CommitVerifier("head", home=tmp_path / "v", allowed_signers=allowed)
    source = GitSource(str(spec_repo.path), tmp_path / "clone", previews=GLOBS)
    pr_commit(spec_repo, 7, "1.3.0")  # unsigned
    unsigned = ref_at(spec_repo, name="review-responder--pr7", preview=7)
    source.fetch()
    source.fetch_previews()
    with pytest.raises(UntrustedSagaInput, match="is not trusted: unsigned"):
        await CommitSpecs(source, verifier=verifier).resolve(unsigned)

    def sign(message: str) -> None:
        spec_repo.git("-c", "gpg.format=ssh", "-c", f"user.signingkey={key}.pub", "commit", "-q", "-S",
                      "--allow-empty", "-m", message)

    sign("signed by signer-a")
    spec_repo.git("update-ref", "refs/pull/7/head", "HEAD")
    signed = ref_at(spec_repo, name="review-responder--pr7", preview=7)
    source.fetch_previews()
    # A signed pull request on an unsigned branch head: the branch's trust policies are not trusted either.
    with pytest.raises(UntrustedSagaInput, match="tracked branch's head.*unsigned"):
        await CommitSpecs(source, verifier=verifier).resolve(signed)

    spec_repo.git("checkout", "-q", "main")
    sign("main signed by signer-a")
    source.fetch()
    trusted = await CommitSpecs(source, verifier=verifier).resolve(signed)
    assert trusted.run is not None and trusted.run.key == "default/review-responder--pr7"


async def test_a_preview_verifies_with_the_branchs_trust_policies_not_the_pull_requests(
        spec_repo: SpecRepo, tmp_path: Path) -> None:
    main = spec_repo.git("rev-parse", "main")
    spec_repo.git("checkout", "-q", "-b", "pr-9")
    # The pull request trusts its own signer and brings its own trusted root (an attacker's move).
    spec_repo.replace("trust/policy.yaml", "identity: recipes@demo.plnt.invalid", "identity: attacker@evil.invalid")
    spec_repo.write("trust/demo-trusted-root.json", "{}")
    spec_repo.replace(RUN_FILE, "review-responder@1.2.0", "review-responder@1.3.0")
    head = spec_repo.commit("trust my own signer")
    spec_repo.git("update-ref", "refs/pull/9/head", head)
    preview = ref_at(spec_repo, name="review-responder--pr9", preview=9)
    spec_repo.git("checkout", "-q", "main")
    source = GitSource(str(spec_repo.path), tmp_path / "clone", previews=GLOBS)
    source.fetch()

    trusted = await CommitSpecs(source).resolve(preview)
    assert trusted.policy_commit == main
    assert [s.identity for p in trusted.policies if p.metadata.name == "demo-recipes" for s in p.spec.signers] == [
        "recipes@demo.plnt.invalid"]
    assert trusted.backend is not None and trusted.run is not None and trusted.run.spec.workflow.version == "1.3.0"
    assert source.read_file(trusted.policy_commit, "trust/demo-trusted-root.json") != b"{}"


async def test_a_preview_uses_the_policies_of_the_commit_the_reconciler_names(spec_repo: SpecRepo, tmp_path: Path) -> None:
    """policy_commit: the branch commit the reconciler last reconciled (trusted, approved), not a newer
    head it holds; a commit off the branch is refused."""
    reconciled = spec_repo.git("rev-parse", "main")
    # A newer head on main (e.g. a direct push held by --require-approval) that trusts another signer.
    spec_repo.replace("trust/policy.yaml", "identity: recipes@demo.plnt.invalid", "identity: attacker@evil.invalid")
    held = spec_repo.commit("held: trust another signer")
    pr_commit(spec_repo, 7, "1.3.0")
    preview = ref_at(spec_repo, name="review-responder--pr7", preview=7)
    spec_repo.git("checkout", "-q", "main")
    source = GitSource(str(spec_repo.path), tmp_path / "clone", previews=GLOBS)
    source.fetch()
    specs = CommitSpecs(source)

    assert (await specs.resolve(preview)).policy_commit == held  # without a name: the fetched head
    trusted = await specs.resolve(preview.model_copy(update={"policy_commit": reconciled}))
    assert trusted.policy_commit == reconciled
    assert [s.identity for p in trusted.policies if p.metadata.name == "demo-recipes" for s in p.spec.signers] == [
        "recipes@demo.plnt.invalid"]

    off_branch = spec_repo.git("rev-parse", "pr-7")
    with pytest.raises(UntrustedSagaInput, match="a preview trusts only the tracked branch"):
        await specs.resolve(preview.model_copy(update={"policy_commit": off_branch}))


def test_policy_commit_is_for_previews_only() -> None:
    from plnt.reconciler.saga.io import SagaRef
    from pydantic import ValidationError

    commit = "a" * 40
    with pytest.raises(ValidationError, match="policy_commit is for preview sagas only"):
        SagaRef(action="deploy", namespace="default", name="review-responder", commit=commit, policy_commit=commit)
    assert SagaRef(action="deploy", namespace="default", name="review-responder--pr7", commit=commit, preview=7,
                   policy_commit=commit).policy_commit == commit
