"""Attacks through registries and the repository URL, each against a live `plnt up` serving
review-responder 1.2.0 (tests/attacks/live.py): a commit points the WorkflowRun at 1.3.0 in a hostile
registry, and each test asserts the refusal and its message, that nothing was installed or kept
(no canary, no cache entry, no staging), that nothing was written outside the state directory, and
that 1.2.0 keeps answering.

Registries: the real S3 emulator (moto_server), the real OCI registry (docker-registry), real
directories, and, where a registry has to lie, redirect or refuse credentials, tests/oci_liar.py: a
small real HTTP server that is a STAND-IN for a hostile OCI registry. The repository-credentials
test serves the spec repository through a real `git http-backend` with basic auth (tests/git_http.py).
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from plnt.reconciler.app import Plnt
from plnt.reconciler.cli.main import app as cli
from plnt.reconciler.recipes.archive import pack_recipe_to
from plnt.reconciler.recipes.registries import RegistryOptions, open_registry
from typer.testing import CliRunner

from tests.attacks.live import IDENTITY, ISSUER, AttackRepo, OutsideWrites, assert_still_serving, live_plnt
from tests.conftest import EXAMPLE
from tests.e2e.harness import hook, running_plnt, settings_for, status_of, wait_for, wait_phase
from tests.git_http import GitHttpServer
from tests.oci_liar import LyingOci, Redirect, Serve

pytestmark = pytest.mark.integration

NAME = "review-responder"
CAP = 2**20  # the download cap these attacks run with: 1 MiB
KEY = f"default/{NAME}"


@dataclass
class Signed:
    """review-responder 1.3.0 with a 3 MiB knowledge file (over CAP), signed by the attack authority."""

    archive: Path
    bundle: Path

    def push(self, url: str, options: RegistryOptions) -> None:
        open_registry(url, options).push(NAME, "1.3.0", self.archive, self.bundle)


@pytest.fixture
def big(attack_repo: AttackRepo, tmp_path: Path) -> Signed:
    source = tmp_path / "big-src"
    shutil.copytree(EXAMPLE / "recipes" / NAME / "1.3.0", source)
    (source / "knowledge" / "padding.bin").write_bytes(os.urandom(3 * 2**20))
    archive = tmp_path / "big" / "recipe.tar.gz"
    archive.parent.mkdir()
    pack_recipe_to(source, archive)
    bundle = archive.with_name("recipe.tar.gz.sigstore.json")
    bundle.write_text(attack_repo.authority.sign(archive, IDENTITY, ISSUER))
    return Signed(archive, bundle)


@dataclass
class Attack:
    registry: str                       # what the commit puts in spec.workflow.registry
    error: str                          # the error type the saga fails with
    message: list[str]                  # fragments the status' lastError must hold
    settings: dict[str, Any] = field(default_factory=dict)
    after: Callable[[], None] = lambda: None  # the attack's own checks once refused


async def refused(plnt: Plnt, attack_repo: AttackRepo, tmp_path: Path, attack: Attack) -> dict[str, Any]:
    """Commit the attack, wait for the saga to fail, and run every common check."""
    attack_repo.deploy(f"{NAME}@1.3.0", registry=attack.registry)
    outside = OutsideWrites([tmp_path], ignore=[plnt.state.root])
    await hook(plnt)

    def failed() -> dict[str, Any] | None:
        status = status_of(plnt)
        return status if status and status["phase"] == "Failed" and status["lastError"] else None

    status = await wait_for(failed, timeout=60, what=f"the saga to fail (now: {status_of(plnt)})")
    error = status["lastError"]
    assert error.startswith(f"{attack.error}: "), error
    for fragment in attack.message:
        assert fragment in error, f"{fragment!r} not in {error!r}"
    # Nothing installed or kept: 1.2.0 is the only release, no canary, no 1.3.0 in the cache, no staging.
    live = plnt.driver.snapshot()[KEY]
    assert live.stable is not None and live.stable.version == "1.2.0" and live.canary is None
    recipes = plnt.state.root / "recipes"
    assert [p.name for p in recipes.glob(".staging-*")] == []
    assert [str(p) for p in plnt.state.root.rglob("*.partial")] == []
    assert not [p for p in recipes.glob("*/recipe/workflow.yaml") if "version: 1.3.0" in p.read_text()]
    outside.assert_none()
    await assert_still_serving(plnt)
    attack.after()
    return status


async def run_attack(attack_repo: AttackRepo, tmp_path: Path, temporal_address: str, temporal_namespace: str,
                     attack: Attack) -> dict[str, Any]:
    async with live_plnt(attack_repo, tmp_path, temporal_address, temporal_namespace,
                         max_download_bytes=CAP, **attack.settings) as plnt:
        return await refused(plnt, attack_repo, tmp_path, attack)


# --- more bytes than the cap ------------------------------------------------------------------------


async def test_s3_registry_serving_more_than_the_cap(attack_repo: AttackRepo, big: Signed, s3_bucket: Any,
                                                     tmp_path: Path, temporal_address: str,
                                                     temporal_namespace: str) -> None:
    big.push(s3_bucket.url("recipes"), RegistryOptions(s3_endpoint_url=s3_bucket.endpoint_url))
    await run_attack(attack_repo, tmp_path, temporal_address, temporal_namespace, Attack(
        registry=s3_bucket.url("recipes"), settings={"s3_endpoint_url": s3_bucket.endpoint_url},
        error="DownloadRefused",
        message=[f"S3 registry {s3_bucket.url('recipes')}", f"over the download cap of {CAP} bytes",
                 "--max-download-mb"]))


async def test_oci_registry_serving_more_than_the_cap(attack_repo: AttackRepo, big: Signed, oci_registry: Any,
                                                      tmp_path: Path, temporal_address: str,
                                                      temporal_namespace: str) -> None:
    url = f"oci://{oci_registry.address}/attacks/{temporal_namespace}"
    big.push(url, RegistryOptions(allow_insecure_http=(oci_registry.address,)))
    await run_attack(attack_repo, tmp_path, temporal_address, temporal_namespace, Attack(
        registry=url, settings={"oci_insecure_hosts": (oci_registry.address,)}, error="DownloadRefused",
        message=[f"OCI registry {url} (plain HTTP)", "recipe.tar.gz announces",
                 f"over the download cap of {CAP} bytes"]))


async def test_file_registry_serving_more_than_the_cap(attack_repo: AttackRepo, big: Signed, tmp_path: Path,
                                                       temporal_address: str, temporal_namespace: str) -> None:
    allowed = tmp_path / "shared-recipes"
    big.push(f"file://{allowed}", RegistryOptions(file_roots=None))
    await run_attack(attack_repo, tmp_path, temporal_address, temporal_namespace, Attack(
        registry=f"file://{allowed}", settings={"file_registry_roots": (allowed,)}, error="DownloadRefused",
        message=[f"file registry {allowed}", f"over the download cap of {CAP} bytes"]))


async def test_oci_manifest_lying_about_the_size(attack_repo: AttackRepo, big: Signed, tmp_path: Path,
                                                 temporal_address: str, temporal_namespace: str) -> None:
    """The manifest announces 4 KiB; the blob streams 64 MiB: plnt reads no further than announced."""
    with LyingOci() as liar:
        manifest = liar.publish(f"plnt/{NAME}", "1.3.0", big.archive.read_bytes(), big.bundle.read_bytes(),
                                archive_size=4096)
        digest = manifest["layers"][0]["digest"]
        liar.blob_override[digest] = Serve(chunk=b"\0" * 2**20, chunks=64)
        await run_attack(attack_repo, tmp_path, temporal_address, temporal_namespace, Attack(
            registry=f"oci://{liar.address}/plnt", settings={"oci_insecure_hosts": (liar.address,)},
            error="DigestMismatch", message=[f"the manifest announces {digest} (4096 bytes)", "or more bytes"],
            after=lambda: _assert_stopped_early(liar, digest)))


def _assert_stopped_early(liar: LyingOci, digest: str) -> None:
    # The liar could write what the socket buffers hold, not the 64 MiB it tried.
    assert liar.sent.get(digest, 0) < 32 * 2**20, liar.sent


# --- where a registry may send plnt ---------------------------------------------------------------


async def test_oci_redirect_to_another_host(attack_repo: AttackRepo, big: Signed, tmp_path: Path,
                                            temporal_address: str, temporal_namespace: str) -> None:
    with LyingOci() as liar, LyingOci() as elsewhere:
        manifest = liar.publish(f"plnt/{NAME}", "1.3.0", big.archive.read_bytes()[:1000])
        digest = manifest["layers"][0]["digest"]
        port = elsewhere.address.split(":")[1]
        liar.blob_override[digest] = Redirect(f"http://localhost:{port}/v2/internal/blobs/{digest}")
        await run_attack(attack_repo, tmp_path, temporal_address, temporal_namespace, Attack(
            registry=f"oci://{liar.address}/plnt", settings={"oci_insecure_hosts": (liar.address,)},
            error="DownloadRefused",
            message=[f"redirected /v2/plnt/{NAME}/blobs/{digest} to http://localhost:{port}/v2/internal",
                     "only to the same host"],
            after=lambda: _assert_no_requests(elsewhere)))


def _assert_no_requests(server: LyingOci) -> None:
    assert server.requests == [], server.requests


async def test_loopback_oci_host_is_https_unless_named(attack_repo: AttackRepo, tmp_path: Path,
                                                       temporal_address: str, temporal_namespace: str) -> None:
    """`oci://127.0.0.1:PORT` naming a plain-HTTP local service: only TLS is tried, so no HTTP request
    reaches it (a spec cannot ask for `oci+http://`: validation allows oci://, s3:// and file: only)."""
    with LyingOci() as local_service:
        await run_attack(attack_repo, tmp_path, temporal_address, temporal_namespace, Attack(
            registry=f"oci://{local_service.address}/plnt", error="RegistryUnavailable",
            message=["TLS failed", f"plnt up --oci-insecure-host {local_service.address}"],
            after=lambda: _assert_no_requests(local_service)))


@pytest.mark.parametrize("where", ["etc", "a directory not allowed"])
async def test_file_registry_outside_the_allowed_directories(where: str, attack_repo: AttackRepo, big: Signed,
                                                             tmp_path: Path, temporal_address: str,
                                                             temporal_namespace: str) -> None:
    if where == "etc":
        registry = "file:///etc"
    else:
        elsewhere = tmp_path / "not-allowed"
        big.push(f"file://{elsewhere}", RegistryOptions(file_roots=None))  # a valid signed recipe, even
        registry = f"file://{elsewhere}"
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    await run_attack(attack_repo, tmp_path, temporal_address, temporal_namespace, Attack(
        registry=registry, settings={"file_registry_roots": (allowed,)}, error="InvalidSpec",
        message=[f"registry '{registry}'", "only under directories the operator allows", f"allowed: {allowed}",
                 "--allow-file-registry DIR"]))


async def test_registry_answering_401_is_retried_with_a_clear_message(attack_repo: AttackRepo, tmp_path: Path,
                                                                      temporal_address: str,
                                                                      temporal_namespace: str) -> None:
    with LyingOci() as liar:
        liar.status = 401
        status = await run_attack(attack_repo, tmp_path, temporal_address, temporal_namespace, Attack(
            registry=f"oci://{liar.address}/plnt", settings={"oci_insecure_hosts": (liar.address,)},
            error="RegistryAuthFailed",
            message=[f"OCI registry oci://{liar.address}/plnt (plain HTTP) refused access (401)",
                     f"docker login {liar.address}", "plnt retries"]))
        manifest_reads = [path for _, path in liar.requests if "/manifests/" in path]
        assert len(manifest_reads) == 3, f"one read per attempt (retry policy: 3 attempts): {liar.requests}"
        assert status["version"] == "1.2.0"


# --- credentials in the repository URL ------------------------------------------------------------

TOKEN = "glpat-attackSuiteTOKEN-9f8e7d"


async def test_repository_token_appears_nowhere(attack_repo: AttackRepo, tmp_path: Path, temporal_address: str,
                                                temporal_namespace: str, caplog: pytest.LogCaptureFixture,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """plnt up --repo http://oauth2:TOKEN@HOST/specs.git, served with basic auth; then the token is
    rotated on the server so every fetch fails: the token is in no log line, source.json, GET /source,
    GET /workflows, `plnt status`, error text, the clone, or any command line git ran."""
    caplog.set_level(logging.DEBUG)
    trace = tmp_path / "trace" / "git.log"
    trace.parent.mkdir()
    monkeypatch.setenv("GIT_TRACE", str(trace))  # every command line git runs
    served = tmp_path / "served"
    served.mkdir()
    subprocess.run(["git", "clone", "-q", "--bare", str(attack_repo.path), str(served / "specs.git")], check=True)
    with GitHttpServer(served, user="oauth2", password=TOKEN) as server:
        settings = settings_for(attack_repo.path, tmp_path / "state", temporal_address, temporal_namespace)
        settings = settings.model_copy(
            update={"source": settings.source.model_copy(update={"repo": server.url("specs.git")})})
        assert TOKEN in settings.source.repo
        async with running_plnt(settings) as plnt:
            await wait_phase(plnt, "Ready", version="1.2.0")
            outside = OutsideWrites([tmp_path], ignore=[plnt.state.root, trace.parent])
            server.password = "rotated"  # the token plnt holds no longer works
            await hook(plnt)

            async def fetch_error() -> dict[str, Any] | None:
                async with httpx.AsyncClient(trust_env=False) as client:
                    source = (await client.get(f"{plnt.url}/source")).json()
                return source if source.get("fetchError") else None

            source = await wait_for(fetch_error, timeout=30, what="the failed fetch in GET /source")
            async with httpx.AsyncClient(trust_env=False) as client:
                workflows = (await client.get(f"{plnt.url}/workflows")).text
            # In a thread: `plnt status` asks this event loop's gateway.
            status_cli = (await asyncio.to_thread(CliRunner().invoke, cli, ["status", "--url", plnt.url])).output
            await assert_still_serving(plnt)
            outside.assert_none()
        source_json = (tmp_path / "state" / "source.json").read_text()

    clean_url = server.url("specs.git", with_credentials=False)
    assert source["repo"] == clean_url
    assert f"cannot fetch branch 'main' of {clean_url}" in source["fetchError"]
    assert "check the credentials in the repository URL" in source["fetchError"]
    assert f"source {clean_url} branch main" in status_cli
    places = {"log": caplog.text, "source.json": source_json, "GET /source": str(source),
              "GET /workflows": workflows, "plnt status": status_cli,
              "git command lines": trace.read_text()}
    assert {where: TOKEN in text for where, text in places.items()} == dict.fromkeys(places, False)
    holding = [str(p) for p in (tmp_path / "state").rglob("*") if p.is_file() and TOKEN.encode() in p.read_bytes()]
    assert holding == [], "the clone's config and every state file are free of the token"
