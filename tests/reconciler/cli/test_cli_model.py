"""`plnt model manifest | push | fetch` end to end, in-process with typer's CliRunner: an author's
directory signed (by the test Sigstore authority, tests/sigstore_ca.py: a STAND-IN for Fulcio, Rekor
and an OIDC issuer) over the statement `plnt model manifest` printed, pushed to a real file registry
and a real OCI registry (CNCF distribution, tests/services.py), fetched into a model directory the
way a model pod's init container does. Exit codes 0, 1 (cannot be trusted or fetched) and 2 (bad
options), with the reason on stderr."""

from __future__ import annotations

import hashlib
import json
import os
import random
from pathlib import Path

import pytest
from click.testing import Result
from plnt.reconciler.cli.main import app
from plnt.reconciler.cli.model import TransferProgress
from plnt.reconciler.recipes.weights_manifest import PAYLOAD_TYPE, manifest_of_directory
from typer.testing import CliRunner

from tests.reconciler.recipes.test_recipe_fetch import IDENTITY, ISSUER
from tests.reconciler.recipes.test_recipe_fetch import policy_file as recipe_policy_file
from tests.reconciler.recipes.test_weights_sources import RangeProxy
from tests.services import OciServer
from tests.sigstore_ca import TestSigstoreAuthority

NAME, VERSION = "smollm2", "1.0.0"
MiB = 1 << 20


def plnt(*args: str | Path) -> Result:
    return CliRunner().invoke(app, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture(scope="module")
def ca() -> TestSigstoreAuthority:
    return TestSigstoreAuthority("cli-model")


def author_dir(directory: Path, seed: str) -> dict[str, bytes]:
    rng = random.Random(seed)
    files = {"model.gguf": rng.randbytes(2 * MiB + 777), "tokenizer/tokenizer.json": b'{"vocab": {"a": 1}}',
             "config.json": json.dumps({"seed": seed}).encode()}
    for name, data in files.items():
        (directory / name).parent.mkdir(parents=True, exist_ok=True)
        (directory / name).write_bytes(data)
    return files


def sign_with_manifest_command(ca: TestSigstoreAuthority, directory: Path, identity: str = IDENTITY) -> str:
    """What an author does: `plnt model manifest`, sign its stdout, save model.sig; the root digest."""
    result = plnt("model", "manifest", directory, "--name", NAME)
    assert result.exit_code == 0, result.stderr
    (directory / "model.sig").write_text(ca.sign_dsse(result.stdout_bytes, PAYLOAD_TYPE, identity, ISSUER))
    return result.stderr.split()[2]


def policy_file(directory: Path, ca: TestSigstoreAuthority) -> Path:
    """test_recipe_fetch's policy file (its signer, a relative trustedRootFile), covering the models."""
    path = recipe_policy_file(directory, ca)
    path.write_text(path.read_text().replace("recipes: [review-responder]", 'recipes: ["smollm*"]'))
    return path


def fetch(registry: str, root: str, policy: Path, into: Path, *extra: str | Path) -> Result:
    return plnt("model", "fetch", "--registry", registry, "--name", NAME, "--version", VERSION, "--root-digest", root,
                "--policy", policy, "--into", into, *extra)


def model_files(directory: Path) -> dict[str, bytes]:
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in sorted(directory.rglob("*"))
            if p.is_file() and p.name != "model.sig" and ".store" not in p.relative_to(directory).parts}


def test_manifest_prints_the_statement_to_sign_and_the_root_digest(tmp_path: Path) -> None:
    author_dir(tmp_path / "m", "manifest")
    (tmp_path / "m" / "model.sig").write_text("{}")  # an earlier signature is not part of the model
    result = plnt("model", "manifest", tmp_path / "m", "--name", NAME)
    assert result.exit_code == 0, result.stderr
    manifest = manifest_of_directory(tmp_path / "m", NAME, ignore=("model.sig",))
    assert result.stdout_bytes == manifest.statement() + b"\n"
    statement = json.loads(result.stdout)
    assert [r["name"] for r in statement["predicate"]["resources"]] == ["config.json", "model.gguf",
                                                                        "tokenizer/tokenizer.json"]
    assert result.stderr == f"root digest {manifest.root_digest} (3 files)\n"
    missing = plnt("model", "manifest", tmp_path / "nowhere", "--name", NAME)
    assert (missing.exit_code, missing.stderr) == (2, f"error: {tmp_path / 'nowhere'}: no such directory\n")


def test_push_then_fetch_through_a_file_registry(ca: TestSigstoreAuthority, tmp_path: Path) -> None:
    files = author_dir(tmp_path / "author", "file")
    root = sign_with_manifest_command(ca, tmp_path / "author")
    (tmp_path / "author" / "notes.txt").write_text("unsigned: never published")
    registry = f"file://{tmp_path / 'registry'}"
    pushed = plnt("model", "push", tmp_path / "author", "--to", registry, "--name", NAME, "--version", VERSION)
    assert pushed.exit_code == 0, pushed.stderr
    assert pushed.stdout == f"pushed model {NAME}@{VERSION} to {tmp_path / 'registry' / NAME / VERSION}\n"
    assert not (tmp_path / "registry" / NAME / VERSION / "notes.txt").exists()

    into = tmp_path / "pod" / "model"
    result = fetch(registry, root, policy_file(tmp_path, ca), into)
    assert result.exit_code == 0, result.stderr
    assert result.stdout == (f"fetched model {NAME}@{VERSION} ({root}) signed by {IDENTITY} ({ISSUER}) into {into} "
                             f"({sum(map(len, files.values()))} bytes transferred)\n")
    assert model_files(into) == files
    assert (into / "model.sig").read_bytes() == (tmp_path / "author" / "model.sig").read_bytes()
    blob = into / ".store" / "blobs" / hashlib.sha256(files["model.gguf"]).hexdigest()
    assert os.stat(into / "model.gguf").st_ino == os.stat(blob).st_ino  # a hard link to the store's blob
    assert list((into / ".store" / "models").iterdir()) == []  # the model's files appear once under DIR
    assert sorted(p.name for p in into.iterdir()) == [".store", "config.json", "model.gguf", "model.sig", "tokenizer"]

    again = fetch(registry, root, policy_file(tmp_path, ca), into)  # a restarted init container
    assert again.exit_code == 0, again.stderr
    assert again.stdout.endswith("(already there)\n") and model_files(into) == files


@pytest.mark.parametrize("attack", ["other-pin", "wrong-identity", "not-published"])
def test_fetch_refuses_with_exit_1_and_leaves_the_directory_as_it_was(ca: TestSigstoreAuthority, tmp_path: Path,
                                                                      attack: str) -> None:
    author_dir(tmp_path / "author", attack)
    root = sign_with_manifest_command(ca, tmp_path / "author",
                                      identity="mallory@fetch.plnt.invalid" if attack == "wrong-identity" else IDENTITY)
    registry = f"file://{tmp_path / 'registry'}"
    if attack != "not-published":
        assert plnt("model", "push", tmp_path / "author", "--to", registry, "--name", NAME,
                    "--version", VERSION).exit_code == 0
    pin = "sha256:" + "0" * 64 if attack == "other-pin" else root
    (tmp_path / "empty").mkdir()  # an emptyDir volume, as in a pod
    for into in (tmp_path / "absent", tmp_path / "empty"):
        result = fetch(registry, pin, policy_file(tmp_path, ca), into)
        assert result.exit_code == 1, result.output
        expected = {"other-pin": "error: VerificationFailed: pin-mismatch: model smollm2: the signed weights manifest",
                    "wrong-identity": "error: VerificationFailed: wrong-identity: model smollm2",
                    "not-published": f"error: RecipeNotFound: model {NAME}@{VERSION} not found"}[attack]
        assert result.stderr.startswith(expected), result.stderr
        assert result.stdout == ""
    assert not (tmp_path / "absent").exists()
    assert list((tmp_path / "empty").iterdir()) == []


def test_bad_options_exit_2(ca: TestSigstoreAuthority, tmp_path: Path) -> None:
    author_dir(tmp_path / "author", "options")
    root = sign_with_manifest_command(ca, tmp_path / "author")
    registry = f"file://{tmp_path / 'registry'}"
    assert plnt("model", "push", tmp_path / "author", "--to", registry, "--name", NAME, "--version", VERSION).exit_code == 0
    policy = policy_file(tmp_path, ca)
    (tmp_path / "a-file").write_text("")
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "other.bin").write_text("someone else's")
    (tmp_path / "no-policy.yaml").write_text("# no policy here\n")
    cases = {
        "--root-digest: expected sha256:": fetch(registry, "sha256:ABC", policy, tmp_path / "m"),
        "--policy": fetch(registry, root, tmp_path / "missing.yaml", tmp_path / "m"),
        "no RecipeTrustPolicy": fetch(registry, root, tmp_path / "no-policy.yaml", tmp_path / "m"),
        "not a directory": fetch(registry, root, policy, tmp_path / "a-file"),
        "unsupported scheme": fetch("ftp://example.com/models", root, policy, tmp_path / "m"),
        "holds other.bin, which is not model smollm2@1.0.0 as signed": fetch(registry, root, policy, tmp_path / "busy"),
        "model version": plnt("model", "fetch", "--registry", registry, "--name", NAME, "--version", "latest",
                              "--root-digest", root, "--policy", policy, "--into", tmp_path / "m"),
        "no such file; sign the statement": plnt("model", "push", tmp_path / "busy", "--to", registry, "--name", NAME,
                                                 "--version", VERSION),
    }
    for expected, result in cases.items():
        assert result.exit_code == 2, (expected, result.output)
        assert expected in result.stderr, (expected, result.stderr)
    assert not (tmp_path / "m").exists()
    assert sorted(p.name for p in (tmp_path / "busy").iterdir()) == ["other.bin"]  # as it was, store removed


@pytest.mark.integration
def test_push_and_fetch_through_an_oci_registry_and_a_cut_off_fetch_resumes(ca: TestSigstoreAuthority, tmp_path: Path,
                                                                           oci_registry: OciServer) -> None:
    """The cut: RangeProxy (test_weights_sources.py), a TCP proxy in front of the real registry that
    closes the connection midway through the large file."""
    files = author_dir(tmp_path / "author", "oci")
    root = sign_with_manifest_command(ca, tmp_path / "author")
    repo = f"cli/t{os.urandom(4).hex()}"
    pushed = plnt("model", "push", tmp_path / "author", "--to", f"oci://{oci_registry.address}/{repo}", "--name", NAME,
                  "--version", VERSION, "--oci-insecure-host", oci_registry.address)
    assert pushed.exit_code == 0, pushed.stderr
    assert pushed.stdout.startswith(f"pushed model {NAME}@{VERSION} to {oci_registry.address}/{repo}/{NAME}:{VERSION}@sha256:")
    policy = policy_file(tmp_path, ca)
    refused = fetch(f"oci://{oci_registry.address}/{repo}", root, policy, tmp_path / "plain")  # not named insecure
    assert refused.exit_code == 1 and "RegistryUnavailable" in refused.stderr and "--oci-insecure-host" in refused.stderr

    into = tmp_path / "model"
    with RangeProxy(oci_registry.address, cut_after=MiB) as proxy:
        via_proxy = (f"oci://127.0.0.1:{proxy.port}/{repo}", "--oci-insecure-host", f"127.0.0.1:{proxy.port}")
        cut = fetch(via_proxy[0], root, policy, into, *via_proxy[1:])
        assert cut.exit_code == 1 and cut.stderr.startswith("error: RegistryUnavailable: "), cut.stderr
        assert model_files(into) == {}  # no model file; the store keeps the partial transfer
        (partial,) = (into / ".store" / "partial").iterdir()
        kept = partial.stat().st_size
        resumed = fetch(via_proxy[0], root, policy, into, *via_proxy[1:])
        assert resumed.exit_code == 0, resumed.stderr
        assert f"bytes={kept}-" in proxy.ranges
    before_cut = len(files["config.json"])  # first in manifest order: complete before the cut
    transferred = sum(map(len, files.values())) - before_cut - kept
    assert resumed.stdout.endswith(f"({transferred} bytes transferred, {kept} resumed)\n")
    assert model_files(into) == files


def test_progress_is_printed_at_most_once_a_second() -> None:
    lines: list[str] = []
    now = [100.0]
    progress = TransferProgress(lines.append, clock=lambda: now[0])
    for step in range(1, 26):  # 3.125 s of 125 ms steps, 10 MB each
        now[0] += 0.125
        progress(step * 10_000_000)
    progress.done()
    assert len(lines) == 4  # at 1 s, 2 s, 3 s, and the last figures
    assert lines[0] == f"{80_000_000 / 2**20:.1f} MiB fetched, 80.0 MB/s"
    assert lines[-1] == f"{250_000_000 / 2**20:.1f} MiB fetched, 80.0 MB/s, done"
    assert lines[-1].endswith(", done")
    quiet: list[str] = []
    short = TransferProgress(quiet.append, clock=lambda: 5.0)
    short(1000)
    short.done()
    assert quiet == []  # a transfer shorter than a second prints nothing
