"""`plnt recipe fetch`: the saga's pull (pin, signature against a policy file, safe extraction) for a
runner pod's init container, against a real file registry and a real OCI registry, with real Sigstore
verification by a test authority (TestSigstoreAuthority, tests/sigstore_ca.py: a STAND-IN for
Sigstore's public services)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from plnt.reconciler.cli.main import app
from plnt.reconciler.recipes.archive import pack_recipe_to
from plnt.reconciler.recipes.registries import RegistryOptions, open_registry
from typer.testing import CliRunner

from tests.conftest import EXAMPLE
from tests.services import OciServer
from tests.sigstore_ca import TestSigstoreAuthority

SOURCE = EXAMPLE / "recipes" / "review-responder" / "1.3.0"
IDENTITY, ISSUER = "recipes@fetch.plnt.invalid", "https://issuer.fetch.plnt.invalid"
runner = CliRunner()


def policy_file(directory: Path, authority: TestSigstoreAuthority, identity: str = IDENTITY) -> Path:
    """A policy whose trustedRootFile is relative, as in a spec repository; the root JSON beside it."""
    authority.write_trusted_root(directory / "trust" / "root.json")
    path = directory / "policy.yaml"
    path.write_text(f"""\
apiVersion: plnt.work/v1
kind: RecipeTrustPolicy
metadata: {{name: fetch}}
spec:
  recipes: [review-responder]
  trustRoot: {{trustedRootFile: trust/root.json}}
  signers: [{{issuer: "{ISSUER}", identity: "{identity}"}}]
""")
    return path


def publish(registry: Path, authority: TestSigstoreAuthority | None) -> str:
    entry = registry / "review-responder" / "1.3.0"
    entry.mkdir(parents=True)
    digest = pack_recipe_to(SOURCE, entry / "recipe.tar.gz")
    if authority is not None:
        (entry / "recipe.tar.gz.sigstore.json").write_text(authority.sign(entry / "recipe.tar.gz", IDENTITY, ISSUER))
    return digest


def fetch(registry: str, digest: str, policy: Path, into: Path, *extra: str) -> tuple[int, str]:
    result = runner.invoke(app, ["recipe", "fetch", "--registry", registry, "--ref", "review-responder@1.3.0",
                                 "--digest", digest, "--policy", str(policy), "--into", str(into), *extra])
    return result.exit_code, result.output


def test_fetch_unpacks_the_pinned_signed_recipe_and_nothing_else(tmp_path: Path) -> None:
    authority = TestSigstoreAuthority(name="fetch")
    digest = publish(tmp_path / "reg", authority)
    code, output = fetch(f"file://{tmp_path / 'reg'}", digest, policy_file(tmp_path, authority), tmp_path / "recipe")
    assert code == 0, output
    assert f"fetched review-responder@1.3.0 ({digest}) signed by {IDENTITY}" in output
    assert sorted(p.name for p in (tmp_path / "recipe").iterdir()) == sorted(p.name for p in SOURCE.iterdir())
    assert (tmp_path / "recipe" / "workflow.yaml").read_bytes() == (SOURCE / "workflow.yaml").read_bytes()
    assert not list(tmp_path.glob(".plnt-fetch-*")), "the work directory is removed"


@pytest.mark.parametrize("attack", ["other-digest", "unsigned", "wrong-identity", "untrusted-root"])
def test_fetch_refuses_what_the_saga_refuses_and_leaves_the_directory_empty(tmp_path: Path, attack: str) -> None:
    authority = TestSigstoreAuthority(name="fetch")
    digest = publish(tmp_path / "reg", None if attack == "unsigned" else authority)
    policy_authority = TestSigstoreAuthority(name="other") if attack == "untrusted-root" else authority
    policy = policy_file(tmp_path, policy_authority, identity="someone-else@fetch.plnt.invalid"
                         if attack == "wrong-identity" else IDENTITY)
    pin = "sha256:" + "0" * 64 if attack == "other-digest" else digest
    (tmp_path / "recipe").mkdir()  # an emptyDir volume, as in a pod
    code, output = fetch(f"file://{tmp_path / 'reg'}", pin, policy, tmp_path / "recipe")
    expected = {"other-digest": "IntegrityMismatch", "unsigned": "VerificationFailed: unsigned",
                "wrong-identity": "VerificationFailed: wrong-identity",
                "untrusted-root": "VerificationFailed: untrusted-root"}[attack]
    assert code == 1 and f"error: {expected}" in output, output
    assert list((tmp_path / "recipe").iterdir()) == []
    assert not list(tmp_path.glob(".plnt-fetch-*"))


def test_fetch_options_are_checked_before_anything_is_fetched(tmp_path: Path) -> None:
    authority = TestSigstoreAuthority(name="fetch")
    digest = publish(tmp_path / "reg", authority)
    policy = policy_file(tmp_path, authority)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    cases = [
        (["--registry", "file:registry"], "a path inside a spec repository"),
        (["--digest", "md5:abc"], "--digest: String should match pattern"),
        (["--registry", "ftp://x"], "--registry: Value error"),
        (["--into", str(tmp_path / "full")], "must be absent or an empty directory"),
        (["--policy", str(tmp_path / "reg" / "review-responder" / "1.3.0" / "recipe.tar.gz")], "--policy"),
    ]
    for change, message in cases:
        args = {"--registry": f"file://{tmp_path / 'reg'}", "--digest": digest, "--policy": str(policy),
                "--into": str(tmp_path / "recipe")}
        args[change[0]] = change[1]
        code, output = fetch(args["--registry"], args["--digest"], Path(args["--policy"]), Path(args["--into"]))
        assert code == 2 and message in output, (change, output)
    assert not (tmp_path / "recipe").exists()


def test_an_explicit_trust_root_replaces_the_policy_path(tmp_path: Path) -> None:
    authority = TestSigstoreAuthority(name="fetch")
    digest = publish(tmp_path / "reg", authority)
    policy = policy_file(tmp_path, authority)
    moved = tmp_path / "mounted-root.json"
    (tmp_path / "trust" / "root.json").rename(moved)  # e.g. a ConfigMap key mounted elsewhere
    code, output = fetch(f"file://{tmp_path / 'reg'}", digest, policy, tmp_path / "a")
    assert code == 1 and "untrusted-root" in output and "--trust-root" in output, output
    code, output = fetch(f"file://{tmp_path / 'reg'}", digest, policy, tmp_path / "b", "--trust-root", str(moved))
    assert code == 0, output


@pytest.mark.integration
def test_fetch_from_a_real_oci_registry(tmp_path: Path, oci_registry: OciServer) -> None:
    authority = TestSigstoreAuthority(name="fetch")
    digest = publish(tmp_path / "reg", authority)
    entry = tmp_path / "reg" / "review-responder" / "1.3.0"
    url = f"oci://{oci_registry.address}/fetch-{uuid.uuid4().hex[:8]}"
    open_registry(url, RegistryOptions(allow_insecure_http=(oci_registry.address,))).push(
        "review-responder", "1.3.0", entry / "recipe.tar.gz", entry / "recipe.tar.gz.sigstore.json")
    policy = policy_file(tmp_path, authority)
    code, output = fetch(url, digest, policy, tmp_path / "plain")
    assert code == 1 and "--oci-insecure-host" in output, output  # plain HTTP only where the operator says
    code, output = fetch(url, digest, policy, tmp_path / "recipe", "--oci-insecure-host", oci_registry.address)
    assert code == 0, output
    assert (tmp_path / "recipe" / "workflow.yaml").is_file()
