"""Metadata plnt reads whole into memory (recipe bundles, model signatures, OCI manifests,
trusted roots) is size-checked before and bounded during the read, from every source: a `file:`
registry, a registry inside the spec repository (a real git repository), the recipe cache, an
author's directory (publish), S3 (a real moto_server) and OCI (the real CNCF distribution registry;
the lying OCI stand-in, tests/oci_liar.py, for a manifest no real registry would serve).

The huge files are sparse (`truncate`): they cost no disk. Memory is measured in this process:
tracemalloc's peak (every Python allocation, whatever ran before) and the growth of the peak
RSS (ru_maxrss), each under MEMORY_BOUND over the refusal.
"""

from __future__ import annotations

import os
import resource
import threading
import tracemalloc
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from plnt.core.specs.loader import load_sources
from plnt.core.specs.models import WorkflowSource
from plnt.reconciler.cli.main import app
from plnt.reconciler.errors import DownloadRefused, VerificationFailed
from plnt.reconciler.recipes import registries
from plnt.reconciler.recipes.pull import RecipeCache, pull_recipe
from plnt.reconciler.recipes.registries import (
    BUNDLE_NAME,
    MAX_BUNDLE_BYTES,
    MAX_MANIFEST_BYTES,
    MAX_SIGNATURE_BYTES,
    MAX_TRUSTED_ROOT_BYTES,
    RegistryOptions,
    open_registry,
    read_bounded,
)
from plnt.reconciler.recipes.weights import SIGNATURE_NAME, WeightsStore
from plnt.reconciler.recipes.weights_sources import open_weights_source, publish_weights
from plnt.reconciler.source.git import GitSource
from typer.testing import CliRunner

from tests.conftest import SpecRepo
from tests.oci_liar import LyingOci
from tests.reconciler.recipes.test_recipe_fetch import fetch, policy_file
from tests.reconciler.recipes.test_recipe_fetch import publish as publish_recipe
from tests.reconciler.recipes.test_recipes import Publisher, pull
from tests.reconciler.recipes.test_weights_store import publish as author
from tests.reconciler.recipes.test_weights_store import verifier
from tests.services import OciServer, S3Bucket
from tests.sigstore_ca import TestSigstoreAuthority

GiB, MiB = 1 << 30, 1 << 20
MEMORY_BOUND = 64 * MiB
NAME, VERSION = "smollm2", "1.0.0"
RECIPE = "review-responder"


@dataclass
class Memory:
    traced_peak: int = 0  # bytes: tracemalloc's peak over the block
    rss_growth: int = 0  # bytes: how much the process's peak RSS grew over the block

    def assert_bounded(self) -> None:
        print(f"memory: tracemalloc peak {self.traced_peak / MiB:.2f} MiB, peak RSS grew {self.rss_growth / MiB:.2f} MiB")
        assert self.traced_peak < MEMORY_BOUND, f"tracemalloc peak {self.traced_peak} bytes"
        assert self.rss_growth < MEMORY_BOUND, f"peak RSS grew by {self.rss_growth} bytes"


@contextmanager
def measured() -> Iterator[Memory]:
    memory = Memory()
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    tracemalloc.start()
    try:
        yield memory
    finally:
        memory.traced_peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        memory.rss_growth = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before) * 1024


def sparse(path: Path, size: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as handle:
        handle.truncate(size)
    return path


@pytest.fixture(scope="module")
def ca() -> TestSigstoreAuthority:
    return TestSigstoreAuthority("metadata-bounds")


# --- the reader ------------------------------------------------------------------------------------


def test_a_file_that_grows_while_read_is_stopped_at_the_cap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """FAKES the size: os.fstat reports 100 bytes for a file of 2 MiB, as if it grew between the
    size check and the read; the read stops one byte past the cap."""
    path = tmp_path / "grows.json"
    path.write_bytes(b"x" * (2 * MiB))
    real_fstat = os.fstat

    def small(fd: int) -> os.stat_result:
        found = list(real_fstat(fd))
        found[6] = 100  # st_size
        return os.stat_result(found)

    monkeypatch.setattr(registries.os, "fstat", small)
    with pytest.raises(DownloadRefused, match=rf"a bundle \({path}\) went past {MiB} bytes while being read, more "
                                              rf"than the {MiB} bytes plnt reads for it.*publish it again"):
        read_bounded(path, MiB, what="a bundle")
    monkeypatch.undo()
    assert read_bounded(path, 2 * MiB, what="a bundle") == b"x" * (2 * MiB)


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path: Path) -> None:
    """A FIFO could block the read, or never end: refused as not a regular file, at once."""
    fifo = tmp_path / "model.sig"
    os.mkfifo(fifo)
    outcome: list[BaseException] = []
    reader = threading.Thread(target=lambda: outcome.append(_raised(lambda: read_bounded(fifo, MiB, what="model.sig"))),
                              daemon=True)
    reader.start()
    reader.join(5)
    if reader.is_alive():  # unblock the reader before failing
        with open(fifo, "wb"):
            pass
        pytest.fail("read_bounded waited for a writer of a FIFO")
    assert isinstance(outcome[0], DownloadRefused) and "is not a regular file" in str(outcome[0])


def _raised(call: object) -> BaseException:
    try:
        call()  # type: ignore[operator]
    except BaseException as exc:  # noqa: BLE001 - returned to the test
        return exc
    return AssertionError("nothing raised")


# --- model signatures --------------------------------------------------------------------------------


def test_a_1_gib_model_sig_in_a_file_registry_is_refused_before_it_is_read(ca: TestSigstoreAuthority,
                                                                           tmp_path: Path) -> None:
    (tmp_path / "registry").mkdir()
    entry = tmp_path / "registry" / NAME / VERSION
    author(ca, entry, {"config.json": b"{}"})
    sparse(entry / SIGNATURE_NAME, GiB)
    store = WeightsStore(tmp_path / "store", budget_bytes=64 * MiB)
    source = open_weights_source("file:registry", NAME, VERSION, RegistryOptions(), base_dir=tmp_path)
    with measured() as memory, pytest.raises(DownloadRefused) as refused:
        store.pull(source, verifier(ca))
    memory.assert_bounded()
    message = str(refused.value)
    assert f"{entry / SIGNATURE_NAME}" in message and f"is {GiB} bytes" in message, message
    assert f"more than the {MAX_SIGNATURE_BYTES} bytes" in message and "publish it again" in message, message
    assert not refused.value.retryable
    assert list((tmp_path / "store" / "models").iterdir()) == []


def test_publishing_a_1_gib_model_sig_is_refused_before_it_is_read(ca: TestSigstoreAuthority, tmp_path: Path) -> None:
    author(ca, tmp_path / "author", {"config.json": b"{}"})
    sparse(tmp_path / "author" / SIGNATURE_NAME, GiB)
    (tmp_path / "registry").mkdir()
    with measured() as memory, pytest.raises(DownloadRefused, match=rf"signature of model {NAME} .*is {GiB} bytes"):
        publish_weights(tmp_path / "author", "file:registry", NAME, VERSION, base_dir=tmp_path)
    memory.assert_bounded()
    assert list((tmp_path / "registry").iterdir()) == []


@pytest.mark.integration
def test_an_s3_model_sig_over_the_cap_is_refused_by_its_length_before_its_body_is_read(
        s3_bucket: S3Bucket, tmp_path: Path) -> None:
    """moto_server holds the object; plnt's memory over the refusal stays far below the object."""
    prefix = f"models-{uuid.uuid4().hex[:8]}"
    key = f"{prefix}/{NAME}/{VERSION}/{SIGNATURE_NAME}"
    s3_bucket.client.put_object(Bucket=s3_bucket.name, Key=key, Body=b"\0" * (MAX_SIGNATURE_BYTES + MiB))
    options = RegistryOptions(s3_endpoint_url=s3_bucket.endpoint_url, s3_region=s3_bucket.region, timeout_s=10)
    source = open_weights_source(s3_bucket.url(prefix), NAME, VERSION, options)
    source.read("absent.json", 1)  # the client's first request (its lazy setup) before measuring
    with measured() as memory, pytest.raises(DownloadRefused) as refused:
        source.signature()
    memory.assert_bounded()
    assert memory.traced_peak < MiB, "the body was read"
    message = str(refused.value)
    assert f"s3://{s3_bucket.name}/{key} is {MAX_SIGNATURE_BYTES + MiB} bytes" in message, message
    assert f"more than the {MAX_SIGNATURE_BYTES} bytes" in message, message


# --- recipe bundles ---------------------------------------------------------------------------------


def test_a_large_bundle_in_a_file_registry_is_refused_before_it_is_copied_or_read(
        ca: TestSigstoreAuthority, tmp_path: Path) -> None:
    """128 MiB: under the download cap of a whole recipe (256 MiB), far over a bundle's."""
    publisher = Publisher(tmp_path, ca)
    archive, _, _ = publisher.build(sign=False)
    registry = tmp_path / "registry"
    open_registry(f"file://{registry}", RegistryOptions(file_roots=None)).push(RECIPE, "1.2.0", archive, None)
    bundle = sparse(registry / RECIPE / "1.2.0" / BUNDLE_NAME, 128 * MiB)
    with measured() as memory, pytest.raises(DownloadRefused) as refused:
        pull(f"file://{registry}", ca, tmp_path / "cache")
    memory.assert_bounded()
    message = str(refused.value)
    assert f"file registry {registry}: {BUNDLE_NAME} is {128 * MiB} bytes" in message, message
    assert f"more than the {MAX_BUNDLE_BYTES} bytes" in message and bundle.stat().st_size == 128 * MiB, message
    assert [p.name for p in (tmp_path / "cache").iterdir()] == ["index"]  # no entry, no staging left


def test_a_bundle_that_grows_while_fetched_from_a_file_registry_is_stopped_at_its_cap(
        ca: TestSigstoreAuthority, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """FAKES the size: os.fstat reports 100 bytes for the 2 MiB bundle, as if it grew after the
    size check; the copy stops at the bundle's cap, not at the recipe's download cap."""
    archive, _, _ = Publisher(tmp_path, ca).build(sign=False)
    big = tmp_path / "big.sigstore.json"
    big.write_bytes(b" " * (2 * MiB))
    registry = open_registry(f"file://{tmp_path / 'registry'}", RegistryOptions(file_roots=None))
    registry.push(RECIPE, "1.2.0", archive, big)
    real_fstat = os.fstat

    def small(fd: int) -> os.stat_result:
        found = list(real_fstat(fd))
        found[6] = min(found[6], 100)  # st_size
        return os.stat_result(found)

    monkeypatch.setattr(registries.os, "fstat", small)
    with pytest.raises(DownloadRefused, match=rf"file registry .*: {BUNDLE_NAME} went past {MAX_BUNDLE_BYTES} bytes "
                                              rf"while being read"):
        registry.fetch(RECIPE, "1.2.0", tmp_path / "out")
    monkeypatch.undo()
    assert list((tmp_path / "out").iterdir()) == []


def test_a_bundle_grown_in_the_recipe_cache_is_refused_before_it_is_read(ca: TestSigstoreAuthority,
                                                                         tmp_path: Path) -> None:
    publisher = Publisher(tmp_path, ca)
    archive, bundle, digest = publisher.build()
    registry = tmp_path / "registry"
    open_registry(f"file://{registry}", RegistryOptions(file_roots=None)).push(RECIPE, "1.2.0", archive, bundle)
    pulled = pull(f"file://{registry}", ca, tmp_path / "cache")
    cached = pulled.directory.parent
    sparse(cached / BUNDLE_NAME, GiB)
    with measured() as memory, pytest.raises(DownloadRefused) as refused:
        pull(f"file://{registry}", ca, tmp_path / "cache")
    memory.assert_bounded()
    message = str(refused.value)
    assert f"bundle of recipe {RECIPE}@1.2.0 in the cache ({cached / BUNDLE_NAME}) is {GiB} bytes" in message, message
    assert f"remove {cached} and plnt fetches the recipe again" in message, message


def _fill(path: Path, size: int) -> None:
    """`size` real bytes (git stores what is committed), written a MiB at a time."""
    with open(path, "wb") as out:
        for _ in range(size // MiB):
            out.write(b" " * MiB)


def test_a_large_bundle_in_the_spec_repository_is_refused_and_never_whole_in_memory(spec_repo: SpecRepo,
                                                                                     tmp_path: Path) -> None:
    """A `file:registry` inside the spec repository: the export copies blobs in chunks, the bundle
    is refused by its size when read."""
    _fill(spec_repo.path / "registry/review-responder/1.3.0" / BUNDLE_NAME, 96 * MiB)
    git = GitSource(str(spec_repo.path), tmp_path / "clone")
    spec_repo.commit("a bundle of 96 MiB")
    commit = git.fetch()
    specs, _ = load_sources(git.spec_files(commit))
    with measured() as memory, pytest.raises(DownloadRefused) as refused:
        pull_recipe(WorkflowSource(ref="review-responder@1.3.0", registry="file:registry"), commit=commit,
                    cache=RecipeCache(tmp_path / "cache"), policies=specs.trust_policies.values(),
                    read_from_repo=git.read_file, export_from_repo=git.export)
    memory.assert_bounded()
    message = str(refused.value)
    assert f"bundle of recipe review-responder@1.3.0 from file:registry in the spec repository at {commit[:12]}" \
           in message and f"is {96 * MiB} bytes, more than the {MAX_BUNDLE_BYTES} bytes" in message, message


def test_a_large_trusted_root_in_the_spec_repository_is_refused_before_it_is_read(spec_repo: SpecRepo,
                                                                                  tmp_path: Path) -> None:
    _fill(spec_repo.path / "trust/demo-trusted-root.json", 2 * MiB)
    git = GitSource(str(spec_repo.path), tmp_path / "clone")
    spec_repo.commit("a trusted root of 2 MiB")
    commit = git.fetch()
    with measured() as memory, pytest.raises(DownloadRefused) as refused:
        git.read_file(commit, "trust/demo-trusted-root.json")
    memory.assert_bounded()
    assert memory.traced_peak < MiB, "the blob was read"
    assert str(refused.value).startswith(
        f"trust/demo-trusted-root.json in the spec repository at {commit[:12]} is {2 * MiB} bytes, more than the "
        f"{MAX_TRUSTED_ROOT_BYTES} bytes"), refused.value
    # Verification fails closed and says why.
    specs, _ = load_sources(git.spec_files(commit))
    with pytest.raises(VerificationFailed, match=rf"cannot read trustedRootFile trust/demo-trusted-root.json "
                                                 rf"\(DownloadRefused: .* is {2 * MiB} bytes") as failed:
        pull_recipe(WorkflowSource(ref="review-responder@1.3.0", registry="file:registry"), commit=commit,
                    cache=RecipeCache(tmp_path / "cache"), policies=specs.trust_policies.values(),
                    read_from_repo=git.read_file, export_from_repo=git.export)
    assert failed.value.reason == "untrusted-root"


def _opaque_archive(tmp_path: Path) -> Path:
    """Random bytes (registries never look inside): a blob no other test of the session's shared
    registries has, or swaps in their storage."""
    archive = tmp_path / "recipe.tar.gz"
    archive.write_bytes(os.urandom(64 * 1024))
    return archive


@pytest.mark.integration
def test_an_s3_bundle_over_its_cap_is_refused_before_it_is_fetched(s3_bucket: S3Bucket, tmp_path: Path) -> None:
    archive = _opaque_archive(tmp_path)
    big = tmp_path / "big.sigstore.json"
    big.write_bytes(b" " * (2 * MiB))
    options = RegistryOptions(s3_endpoint_url=s3_bucket.endpoint_url, s3_region=s3_bucket.region, timeout_s=10)
    registry = open_registry(s3_bucket.url(f"recipes-{uuid.uuid4().hex[:8]}"), options)
    registry.push(RECIPE, "1.2.0", archive, big)
    with pytest.raises(DownloadRefused, match=rf"S3 registry .*: {BUNDLE_NAME} is {2 * MiB} bytes, more than the "
                                              rf"{MAX_BUNDLE_BYTES} bytes"):
        registry.fetch(RECIPE, "1.2.0", tmp_path / "out")
    assert list((tmp_path / "out").iterdir()) == []


@pytest.mark.integration
def test_an_oci_bundle_layer_over_its_cap_is_refused_before_anything_is_fetched(oci_registry: OciServer,
                                                                                tmp_path: Path) -> None:
    archive = _opaque_archive(tmp_path)
    big = tmp_path / "big.sigstore.json"
    big.write_bytes(b" " * (2 * MiB))
    options = RegistryOptions(allow_insecure_http=(oci_registry.address,), timeout_s=10)
    registry = open_registry(f"oci://{oci_registry.address}/plnt-tests/{uuid.uuid4().hex[:12]}", options)
    registry.push(RECIPE, "1.2.0", archive, big)
    with pytest.raises(DownloadRefused, match=rf"OCI registry .*: {BUNDLE_NAME} is {2 * MiB} bytes, more than the "
                                              rf"{MAX_BUNDLE_BYTES} bytes"):
        registry.fetch(RECIPE, "1.2.0", tmp_path / "out")
    assert list((tmp_path / "out").iterdir()) == []


# --- the operator's command line: plnt recipe fetch / verify -------------------------------------


def test_plnt_recipe_fetch_refuses_a_1_gib_trusted_root_before_reading_it(ca: TestSigstoreAuthority,
                                                                          tmp_path: Path) -> None:
    digest = publish_recipe(tmp_path / "reg", ca)
    policy = policy_file(tmp_path, ca)
    root = sparse(tmp_path / "huge-root.json", GiB)
    with measured() as memory:
        code, output = fetch(f"file://{tmp_path / 'reg'}", digest, policy, tmp_path / "recipe", "--trust-root", str(root))
    memory.assert_bounded()
    assert code == 1, output
    assert "VerificationFailed: untrusted-root" in output and f"--trust-root ({root}) is {GiB} bytes" in output, output


def test_plnt_recipe_verify_refuses_a_1_gib_bundle_before_reading_it(ca: TestSigstoreAuthority, tmp_path: Path) -> None:
    archive, _, _ = Publisher(tmp_path, ca).build(sign=False)
    bundle = sparse(tmp_path / "huge.sigstore.json", GiB)
    ca.write_trusted_root(tmp_path / "root.json")
    with measured() as memory:
        result = CliRunner().invoke(app, ["recipe", "verify", str(archive), "--bundle", str(bundle), "--identity", "a@b",
                                          "--issuer", "https://issuer.test", "--trust-root", str(tmp_path / "root.json")])
    memory.assert_bounded()
    assert result.exit_code == 1, result.output
    assert result.output.startswith(f"REJECTED (invalid-bundle): the bundle ({bundle}) is {GiB} bytes, more than the "
                                    f"{MAX_BUNDLE_BYTES} bytes plnt reads for it"), result.output


# --- OCI manifests ----------------------------------------------------------------------------------


@pytest.mark.integration  # a real HTTP server (the lying OCI stand-in)
def test_an_oci_manifest_announced_over_its_cap_is_refused_by_its_length(tmp_path: Path) -> None:
    with LyingOci() as liar:
        liar.manifests[("plnt/" + RECIPE, "1.2.0")] = b"{" + b" " * MAX_MANIFEST_BYTES + b"}"
        registry = open_registry(f"oci://{liar.address}/plnt",
                                 RegistryOptions(allow_insecure_http=(liar.address,), timeout_s=10))
        with pytest.raises(DownloadRefused, match=rf"the manifest of .*{RECIPE}:1.2.0 is {MAX_MANIFEST_BYTES + 2} "
                                                  rf"bytes, more than the {MAX_MANIFEST_BYTES} bytes"):
            registry.fetch(RECIPE, "1.2.0", tmp_path / "out")


def test_the_caps_fit_real_metadata() -> None:
    """Verification's own bounds are the same constants: nothing a fetch accepts is refused there for size."""
    from plnt.reconciler.recipes import trust

    assert trust.MAX_BUNDLE_BYTES == MAX_BUNDLE_BYTES and MAX_BUNDLE_BYTES <= MAX_SIGNATURE_BYTES
    with pytest.raises(VerificationFailed, match=f"more than the {MAX_BUNDLE_BYTES} allowed"):
        trust._parse_bundle("recipe x", b" " * (MAX_BUNDLE_BYTES + 1))
