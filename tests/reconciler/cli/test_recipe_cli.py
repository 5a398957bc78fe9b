"""`plnt recipe ...`: the recipe authors' commands, against real files, a real file registry and
real Sigstore verification with a test authority (TestSigstoreAuthority, tests/sigstore_ca.py: a
STAND-IN for Sigstore's public services)."""

from __future__ import annotations

import shutil
from pathlib import Path

from plnt.reconciler.cli.main import app
from typer.testing import CliRunner

from tests.conftest import EXAMPLE
from tests.sigstore_ca import TestSigstoreAuthority

SOURCE = EXAMPLE / "recipes" / "review-responder" / "1.2.0"
runner = CliRunner()


def test_pack_is_deterministic_and_digest_agrees(tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(SOURCE, copy)
    (copy / "steps.py").touch()  # a new mtime must not change the archive
    first = runner.invoke(app, ["recipe", "pack", str(SOURCE), "-o", str(tmp_path / "a.tar.gz")])
    second = runner.invoke(app, ["recipe", "pack", str(copy), "-o", str(tmp_path / "b.tar.gz")])
    assert first.exit_code == 0 and second.exit_code == 0, first.output + second.output
    assert (tmp_path / "a.tar.gz").read_bytes() == (tmp_path / "b.tar.gz").read_bytes()
    digest = first.output.split()[-1]
    assert "review-responder@1.2.0" in first.output and digest.startswith("sha256:")
    assert runner.invoke(app, ["recipe", "digest", str(tmp_path / "a.tar.gz")]).output.strip() == digest
    assert runner.invoke(app, ["recipe", "digest", str(SOURCE)]).output.strip() == digest


def test_pack_refuses_a_broken_recipe(tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(SOURCE, broken)
    (broken / "workflow.yaml").write_text((broken / "workflow.yaml").read_text().replace("deps: [draft_reply]", "deps: [nope]"))
    result = runner.invoke(app, ["recipe", "pack", str(broken), "-o", str(tmp_path / "x.tar.gz")])
    assert result.exit_code == 1 and "nope" in result.output
    assert not (tmp_path / "x.tar.gz").exists()


def test_push_then_verify_accepts_the_signer_and_rejects_others(tmp_path: Path) -> None:
    authority = TestSigstoreAuthority(name="cli")
    archive = tmp_path / "recipe.tar.gz"
    assert runner.invoke(app, ["recipe", "pack", str(SOURCE), "-o", str(archive)]).exit_code == 0
    missing = runner.invoke(app, ["recipe", "push", str(archive), "--to", f"file://{tmp_path / 'reg'}",
                                  "--name", "review-responder", "--version", "1.2.0"])
    assert missing.exit_code == 2 and "sign the archive first" in missing.output
    archive.with_name("recipe.tar.gz.sigstore.json").write_text(authority.sign(archive, "me@test", "https://issuer.test"))
    pushed = runner.invoke(app, ["recipe", "push", str(archive), "--to", f"file://{tmp_path / 'reg'}",
                                 "--name", "review-responder", "--version", "1.2.0"])
    assert pushed.exit_code == 0, pushed.output
    stored = tmp_path / "reg" / "review-responder" / "1.2.0"
    assert (stored / "recipe.tar.gz").read_bytes() == archive.read_bytes()
    assert (stored / "recipe.tar.gz.sigstore.json").exists()

    root = tmp_path / "root.json"
    authority.write_trusted_root(root)
    base = ["recipe", "verify", str(stored / "recipe.tar.gz"), "--trust-root", str(root)]
    ok = runner.invoke(app, [*base, "--identity", "me@test", "--issuer", "https://issuer.test"])
    assert ok.exit_code == 0 and "OK" in ok.output and "me@test" in ok.output, ok.output
    regex = runner.invoke(app, [*base, "--identity-regex", r".*@test", "--issuer", "https://issuer.test"])
    assert regex.exit_code == 0, regex.output
    wrong = runner.invoke(app, [*base, "--identity", "you@test", "--issuer", "https://issuer.test"])
    assert wrong.exit_code == 1 and "REJECTED (wrong-identity)" in wrong.output
    issuer = runner.invoke(app, [*base, "--identity", "me@test", "--issuer", "https://other.test"])
    assert issuer.exit_code == 1 and "REJECTED (wrong-issuer)" in issuer.output
    public = runner.invoke(app, ["recipe", "verify", str(stored / "recipe.tar.gz"), "--identity", "me@test",
                                 "--issuer", "https://issuer.test"])
    assert public.exit_code == 1 and "REJECTED (untrusted-root)" in public.output
    both = runner.invoke(app, [*base, "--identity", "me@test", "--identity-regex", "x", "--issuer", "https://issuer.test"])
    assert both.exit_code == 2


def test_sign_needs_an_identity_token(tmp_path: Path, monkeypatch) -> None:
    for variable in ("GITHUB_ACTIONS", "ACTIONS_ID_TOKEN_REQUEST_URL", "SIGSTORE_ID_TOKEN", "GOOGLE_SERVICE_ACCOUNT_NAME"):
        monkeypatch.delenv(variable, raising=False)
    archive = tmp_path / "recipe.tar.gz"
    archive.write_bytes(b"archive")
    result = runner.invoke(app, ["recipe", "sign", str(archive)])
    assert result.exit_code == 2 and "--identity-token" in result.output
    malformed = runner.invoke(app, ["recipe", "sign", str(archive), "--identity-token", "not-a-jwt"])
    # Refused offline, before any signing service would be contacted.
    assert malformed.exit_code == 1 and "identity token was refused" in malformed.output
    assert not archive.with_name("recipe.tar.gz.sigstore.json").exists()
