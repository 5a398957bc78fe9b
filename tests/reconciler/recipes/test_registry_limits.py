"""What a registry may make plnt do: the download cap (counted as bytes arrive), redirects, plain
HTTP, `file:///` directories, and 401/403 as a retryable credentials problem.

OCI cases that need a registry to lie use tests/oci_liar.py, a small real HTTP server that is a
STAND-IN for a hostile registry (the real docker-registry never lies); the others run against the
real services (docker-registry, moto_server) or real directories.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from plnt.reconciler.errors import (
    DigestMismatch,
    DownloadRefused,
    InvalidSpec,
    RegistryAuthFailed,
    RegistryUnavailable,
)
from plnt.reconciler.recipes.registries import (
    FileRegistry,
    RegistryOptions,
    _refuse_foreign_redirect,
    open_registry,
)

from tests.oci_liar import LyingOci, Redirect, Serve
from tests.services import S3_REGION, OciServer, S3Bucket, _moto_server_argv, _Process, free_port

NAME = "review-responder"
MiB = 2**20
REPO = "plnt"


@pytest.fixture(scope="module")
def archive_bytes() -> bytes:
    return os.urandom(3 * MiB)  # opaque here: registries never look inside


def leftovers(dest: Path) -> list[str]:
    return sorted(p.name for p in dest.iterdir()) if dest.exists() else []


# --- the cap --------------------------------------------------------------------------------------


def test_file_registry_over_the_cap_is_refused_and_leaves_nothing(tmp_path: Path, archive_bytes: bytes) -> None:
    FileRegistry(tmp_path / "reg").push(NAME, "1.2.0", _write(tmp_path / "a", archive_bytes), None)
    registry = FileRegistry(tmp_path / "reg", max_download_bytes=2 * MiB)
    with pytest.raises(DownloadRefused, match=r"file registry .*recipe.tar.gz announces 3145728 bytes, over the "
                                              r"download cap of 2097152 bytes.*--max-download-mb") as caught:
        registry.fetch(NAME, "1.2.0", tmp_path / "out")
    assert not caught.value.retryable
    assert leftovers(tmp_path / "out") == []
    assert FileRegistry(tmp_path / "reg", max_download_bytes=4 * MiB).fetch(NAME, "1.2.0", tmp_path / "ok").archive


@pytest.mark.integration
def test_s3_object_over_the_cap_is_refused(s3_bucket: S3Bucket, tmp_path: Path, archive_bytes: bytes) -> None:
    options = RegistryOptions(s3_endpoint_url=s3_bucket.endpoint_url, s3_region=s3_bucket.region,
                              max_download_bytes=2 * MiB)
    registry = open_registry(s3_bucket.url("capped"), options)
    registry.push(NAME, "1.2.0", _write(tmp_path / "a", archive_bytes), _write(tmp_path / "b", b"{}"))
    with pytest.raises(DownloadRefused, match=r"S3 registry s3://.*/capped.*announces 3145728 bytes, over the download cap"):
        registry.fetch(NAME, "1.2.0", tmp_path / "out")
    assert leftovers(tmp_path / "out") == []


@pytest.fixture
def liar() -> Iterator[LyingOci]:
    with LyingOci() as server:
        yield server


def liar_registry(liar: LyingOci, **options: object):  # noqa: ANN201
    return open_registry(f"oci://{liar.address}/{REPO}",
                         RegistryOptions(allow_insecure_http=(liar.address,), timeout_s=10, **options))  # type: ignore[arg-type]


@pytest.mark.integration  # a real HTTP server (the lying OCI stand-in)
def test_oci_layer_announced_over_the_cap_is_refused_before_downloading(liar: LyingOci, tmp_path: Path,
                                                                        archive_bytes: bytes) -> None:
    manifest = liar.publish(f"{REPO}/{NAME}", "1.2.0", archive_bytes)
    with pytest.raises(DownloadRefused, match="announces 3145728 bytes, over the download cap of 2097152"):
        liar_registry(liar, max_download_bytes=2 * MiB).fetch(NAME, "1.2.0", tmp_path / "out")
    assert ("GET", f"/v2/{REPO}/{NAME}/blobs/{manifest['layers'][0]['digest']}") not in liar.requests
    assert leftovers(tmp_path / "out") == []


@pytest.mark.integration  # a real HTTP server (the lying OCI stand-in)
def test_oci_manifest_lying_small_is_read_no_further_than_it_says(liar: LyingOci, tmp_path: Path,
                                                                  archive_bytes: bytes) -> None:
    """The manifest announces 1000 bytes; the registry streams 64 MiB without a length."""
    manifest = liar.publish(f"{REPO}/{NAME}", "1.2.0", archive_bytes, archive_size=1000)
    digest = manifest["layers"][0]["digest"]
    liar.blob_override[digest] = Serve(chunk=b"\0" * MiB, chunks=64)
    with pytest.raises(DigestMismatch, match=r"announces .* \(1000 bytes\).*\(\d+ or more bytes\)"):
        liar_registry(liar).fetch(NAME, "1.2.0", tmp_path / "out")
    assert leftovers(tmp_path / "out") == []


@pytest.mark.integration  # a real HTTP server (the lying OCI stand-in)
def test_oci_blob_streamed_past_the_cap_is_stopped(liar: LyingOci, tmp_path: Path, archive_bytes: bytes) -> None:
    """The manifest's size is within the cap but the blob never ends: the count stops it, not the manifest."""
    manifest = liar.publish(f"{REPO}/{NAME}", "1.2.0", archive_bytes)
    liar.blob_override[manifest["layers"][0]["digest"]] = Serve(chunk=b"\0" * MiB, chunks=64)
    # The cap is exactly the announced size: the stream is cut by the cap as it passes it.
    with pytest.raises(DownloadRefused, match=f"went past {len(archive_bytes)} bytes while downloading"):
        liar_registry(liar, max_download_bytes=len(archive_bytes)).fetch(NAME, "1.2.0", tmp_path / "out")
    # A larger cap: reading stops right after the announced size.
    with pytest.raises(DigestMismatch, match="or more bytes"):
        liar_registry(liar).fetch(NAME, "1.2.0", tmp_path / "out2")
    assert leftovers(tmp_path / "out") == [] and leftovers(tmp_path / "out2") == []


# --- redirects and plain HTTP ---------------------------------------------------------------------


@pytest.mark.integration  # a real HTTP server (the lying OCI stand-in)
def test_oci_redirect_to_another_host_is_refused_and_not_followed(liar: LyingOci, tmp_path: Path,
                                                                  archive_bytes: bytes) -> None:
    manifest = liar.publish(f"{REPO}/{NAME}", "1.2.0", archive_bytes)
    digest = manifest["layers"][0]["digest"]
    with LyingOci() as elsewhere:
        # "localhost" is another host name than 127.0.0.1, even if it lands on the same machine.
        liar.blob_override[digest] = Redirect(f"http://localhost:{elsewhere.address.split(':')[1]}/v2/x")
        with pytest.raises(DownloadRefused, match=rf"redirected /v2/{REPO}/{NAME}/blobs/{digest} to "
                                                  rf"http://localhost:\d+/v2/x.*only to the same host"):
            liar_registry(liar).fetch(NAME, "1.2.0", tmp_path / "out")
        assert elsewhere.requests == []
    assert leftovers(tmp_path / "out") == []


@pytest.mark.integration  # a real HTTP server (the lying OCI stand-in)
def test_oci_redirect_on_the_same_host_is_followed(liar: LyingOci, tmp_path: Path, archive_bytes: bytes) -> None:
    manifest = liar.publish(f"{REPO}/{NAME}", "1.2.0", archive_bytes)
    digest = manifest["layers"][0]["digest"]
    liar.blob_override[digest] = Redirect(f"/v2/{REPO}/{NAME}/blobs/{digest}-moved")
    liar.blobs[f"{digest}-moved"] = archive_bytes
    fetched = liar_registry(liar).fetch(NAME, "1.2.0", tmp_path / "out")
    assert fetched.archive.read_bytes() == archive_bytes
    assert ("GET", f"/v2/{REPO}/{NAME}/blobs/{digest}-moved") in liar.requests


def test_https_to_http_redirect_is_refused() -> None:
    """The hook alone, on a response built here (no TLS server on these machines)."""
    response = requests.Response()
    response.raw = io.BytesIO(b"")
    response.status_code, response.url = 302, "https://registry.example.com/v2/r/blobs/sha256:x"
    response.headers["Location"] = "http://registry.example.com/v2/r/blobs/sha256:x"
    with pytest.raises(DownloadRefused, match="never from HTTPS to HTTP"):
        _refuse_foreign_redirect(response)
    response.headers["Location"] = "/v2/r/blobs/sha256:x?signed=1"
    assert _refuse_foreign_redirect(response) is response


@pytest.mark.integration
def test_loopback_oci_is_not_plain_http_unless_the_operator_names_it(oci_registry: OciServer, tmp_path: Path) -> None:
    with pytest.raises(InvalidSpec, match=rf"plain HTTP to {oci_registry.address} refused.*--oci-insecure-host"):
        open_registry(f"oci+http://{oci_registry.address}/plnt")
    with pytest.raises(RegistryUnavailable, match=rf"TLS failed.*--oci-insecure-host {oci_registry.address}"):
        open_registry(f"oci://{oci_registry.address}/plnt", RegistryOptions(timeout_s=5)).fetch(NAME, "1.2.0",
                                                                                               tmp_path / "out")
    named = RegistryOptions(allow_insecure_http=(oci_registry.address,), timeout_s=5)
    assert open_registry(f"oci://{oci_registry.address}/plnt", named).plain_http is True  # type: ignore[attr-defined]


# --- file:/// -------------------------------------------------------------------------------------


def test_file_registries_only_under_allowed_directories(tmp_path: Path) -> None:
    allowed = tmp_path / "allowed"
    (allowed / "recipes").mkdir(parents=True)
    options = RegistryOptions(file_roots=(str(allowed),))
    for url in ("file:///etc", f"file://{allowed}/../elsewhere", f"file:{tmp_path}"):
        with pytest.raises(InvalidSpec, match=r"only under directories the operator allows \(allowed: .*allowed\); "
                                              r"start plnt with --allow-file-registry DIR") as caught:
            open_registry(url, options)
        assert not caught.value.retryable
    with pytest.raises(InvalidSpec, match=r"\(none is allowed\).*--allow-file-registry"):
        open_registry("file:///etc")
    assert isinstance(open_registry(f"file://{allowed}/recipes", options), FileRegistry)
    # Inside the spec repository (a base directory) a relative registry needs no flag.
    assert isinstance(open_registry("file:registry", base_dir=tmp_path), FileRegistry)


def test_a_link_out_of_an_allowed_directory_is_refused(tmp_path: Path, archive_bytes: bytes) -> None:
    outside = tmp_path / "outside"
    FileRegistry(outside).push(NAME, "1.2.0", _write(tmp_path / "a", archive_bytes), None)
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    (allowed / NAME).symlink_to(outside / NAME)
    registry = open_registry(f"file://{allowed}", RegistryOptions(file_roots=(str(allowed),)))
    with pytest.raises(InvalidSpec, match="leads out of the registry directory"):
        registry.fetch(NAME, "1.2.0", tmp_path / "out")
    assert leftovers(tmp_path / "out") == []


# --- 401 / 403 ------------------------------------------------------------------------------------


@pytest.mark.integration  # a real HTTP server (the lying OCI stand-in)
@pytest.mark.parametrize("status", [401, 403])
def test_oci_401_403_is_a_retryable_credentials_error(liar: LyingOci, tmp_path: Path, status: int) -> None:
    liar.status = status
    with pytest.raises(RegistryAuthFailed) as caught:
        liar_registry(liar).fetch(NAME, "1.2.0", tmp_path / "out")
    message = str(caught.value)
    assert f"OCI registry oci://{liar.address}/{REPO}" in message and "refused access" in message
    assert f"docker login {liar.address}" in message and "plnt retries" in message
    assert caught.value.retryable


@pytest.fixture(scope="module")
def s3_with_auth(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real moto_server that checks credentials (INITIAL_NO_AUTH_ACTION_COUNT=0): unknown keys get 403."""
    base = tmp_path_factory.mktemp("moto-auth")
    port = free_port()
    env_argv = ["env", "INITIAL_NO_AUTH_ACTION_COUNT=0", *_moto_server_argv(), "-H", "127.0.0.1", "-p", str(port)]
    process = _Process(env_argv, base / "moto.log", cwd=base)
    try:
        process.wait_ready(f"http://127.0.0.1:{port}/moto-api/", ok=(200,))
        yield f"http://127.0.0.1:{port}"
    finally:
        process.stop()


@pytest.mark.integration
def test_s3_access_denied_is_a_retryable_credentials_error(s3_with_auth: str, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAUNKNOWNKEY000000")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-a-real-secret")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    registry = open_registry("s3://recipes/team", RegistryOptions(s3_endpoint_url=s3_with_auth, s3_region=S3_REGION,
                                                                  s3_max_attempts=1, timeout_s=10))
    with pytest.raises(RegistryAuthFailed, match=r"S3 registry s3://recipes/team.*denied access.*"
                                                 r"\((InvalidAccessKeyId|AccessDenied)\).*AWS credentials") as caught:
        registry.fetch(NAME, "1.2.0", tmp_path / "out")
    assert caught.value.retryable
    assert "not-a-real-secret" not in str(caught.value)


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path



@pytest.mark.integration  # a real HTTP server (the lying OCI stand-in)
def test_oci_basic_auth_uses_docker_config_and_a_wrong_password_is_retryable(
    liar: LyingOci, tmp_path: Path, archive_bytes: bytes, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An htpasswd-style registry (Basic challenge): the credentials `docker login` stored are sent."""
    import base64
    import json

    liar.publish(f"{REPO}/{NAME}", "1.2.0", archive_bytes)
    liar.basic_auth = "robot:correct-horse"
    home = tmp_path / "home"
    (home / ".docker").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))

    def login(password: str) -> None:
        auth = base64.b64encode(f"robot:{password}".encode()).decode()
        (home / ".docker" / "config.json").write_text(json.dumps({"auths": {liar.address: {"auth": auth}}}))

    login("wrong")
    with pytest.raises(RegistryAuthFailed, match=r"refused access \(401\).*docker login") as caught:
        liar_registry(liar).fetch(NAME, "1.2.0", tmp_path / "out")
    assert "wrong" not in str(caught.value) and "correct-horse" not in str(caught.value)
    login("correct-horse")
    assert liar_registry(liar).fetch(NAME, "1.2.0", tmp_path / "out").archive.read_bytes() == archive_bytes
