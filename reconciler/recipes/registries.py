"""Recipe registries: where published recipe archives and their Sigstore bundles live.

A published recipe is two opaque files: the archive `recipe.tar.gz` and, beside it, its Sigstore
bundle `recipe.tar.gz.sigstore.json`. One small interface, `RecipeRegistry`, chosen by URL scheme:

  - `file:///abs/dir`, `file:/abs/dir`: a directory, only under one of `file_roots` (the operator's
    `--allow-file-registry DIR`; none by default), so a spec cannot make plnt read any directory of
    the host; `file:rel/dir` and `file://./rel/dir` are relative to `base_dir`. Layout
    `<dir>/<name>/<version>/recipe.tar.gz` (+ the bundle); files reached through a link that leaves
    the directory are refused.
  - `s3://bucket/prefix`: the same layout under the key prefix, through boto3 (path-style
    addressing; credentials from boto3's standard AWS chain).
  - `oci://host[:port]/repo`: the OCI artifact `<host>/<repo>/<name>:<version>` with one layer of
    media type ARCHIVE_MEDIA_TYPE and, if signed, one of BUNDLE_MEDIA_TYPE. Plain HTTP only for hosts
    the operator lists in `allow_insecure_http` (loopback included: a spec must not probe local
    services), HTTPS otherwise; `oci+http://` asks for plain HTTP explicitly (refused for any other
    host before a connection is attempted), `oci+https://` for HTTPS. Redirects are followed only to
    the same host, never from HTTPS to HTTP. A `+` in a version (semver build metadata) becomes `_` in
    the tag, as Helm does.

Every fetch counts the bytes as they arrive against one cap, `max_download_bytes` (archive and
bundle together), and stops past it: what a registry announces (Content-Length, a file's size, an
OCI layer's size) only lets plnt refuse before reading. Metadata, which plnt reads whole into
memory, has a cap of its own per kind: MAX_BUNDLE_BYTES for a recipe's bundle, MAX_MANIFEST_BYTES
for an OCI manifest, MAX_SIGNATURE_BYTES for a model's model.sig (weights_sources). Each is checked
against the announced size before reading and enforced while reading (`read_bounded`,
`read_chunks_bounded`): a file that grows during the read is stopped too.

Every fetch hashes the bytes as they arrive and writes each file to `<final>.partial`; the files are
renamed into place only when all of them are complete and verified (bundle first, archive last), so
a fetch that fails never leaves a `recipe.tar.gz` that looks complete. A fetch first removes any
earlier `recipe.tar.gz` / bundle from `dest_dir`. OCI blobs are checked against the digest and size
the manifest announces, and the manifest against the `Docker-Content-Digest` the registry sends; S3
objects against the sha256 recorded in their metadata at push (and botocore's own checksums).

Errors: RecipeNotFound (no such name@version), RegistryAuthFailed (401/403, credentials refused or
missing: retryable, since credentials get fixed without a commit), RegistryUnavailable (unreachable,
timeouts, 5xx, transfer broken off), DigestMismatch (served bytes differ from what was announced),
DownloadRefused (more bytes than the cap, a redirect to another host or to plain HTTP),
InvalidRecipe (an OCI artifact that is not a plnt recipe), InvalidSpec (a registry URL that cannot be
used, such as plain HTTP to a remote host), PushRejected (a registry refused a push).
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Protocol, runtime_checkable
from urllib.parse import urljoin, urlsplit

from plnt.core.specs.models import NAME_PATTERN, VERSION_PATTERN
from plnt.reconciler.errors import (
    DigestMismatch,
    DownloadRefused,
    InvalidRecipe,
    InvalidSpec,
    NeedsHuman,
    PlntError,
    RecipeNotFound,
    RegistryAuthFailed,
    RegistryUnavailable,
)

ARCHIVE_NAME = "recipe.tar.gz"
BUNDLE_NAME = "recipe.tar.gz.sigstore.json"
ARCHIVE_MEDIA_TYPE = "application/vnd.plnt.recipe.v1.tar+gzip"
BUNDLE_MEDIA_TYPE = "application/vnd.dev.sigstore.bundle.v0.3+json"
CONFIG_MEDIA_TYPE = "application/vnd.plnt.recipe.config.v1+json"
ARTIFACT_TYPE = CONFIG_MEDIA_TYPE
OCI_MANIFEST_MEDIA_TYPE = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX_MEDIA_TYPE = "application/vnd.oci.image.index.v1+json"
DOCKER_MANIFEST_MEDIA_TYPE = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_LIST_MEDIA_TYPE = "application/vnd.docker.distribution.manifest.list.v2+json"
TITLE_ANNOTATION = "org.opencontainers.image.title"

CHUNK_SIZE = 64 * 1024
PROGRESS_EVERY = 1024 * 1024
# Metadata plnt reads whole into memory, a cap per kind (see read_bounded): far above real sizes,
# far below what would hurt plnt's memory.
MAX_MANIFEST_BYTES = 4 * 1024 * 1024  # an OCI manifest or index (real ones: a few KiB)
MAX_BUNDLE_BYTES = 1 << 20  # a recipe's Sigstore bundle (real ones: a few KiB)
MAX_SIGNATURE_BYTES = 8 << 20  # a model's model.sig: a DSSE bundle whose manifest lists every file
MAX_TRUSTED_ROOT_BYTES = 1 << 20  # a policy's trustedRootFile (a Sigstore trusted root: some KiB)
# Recipes unpack to at most max_recipe_bytes (256 MiB by default) and gzip never makes data much
# smaller than incompressible, so a larger download cannot be a valid recipe: refuse it early.
DEFAULT_MAX_DOWNLOAD_BYTES = 256 * 2**20
PARTIAL_SUFFIX = ".partial"

_SHA256_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")

Progress = Callable[[int], None]


class PushRejected(NeedsHuman):
    """A registry refused a push for a reason retrying cannot fix (no bucket, denied, invalid)."""


@dataclass(frozen=True)
class RegistryRef:
    url: str
    name: str
    version: str


@dataclass(frozen=True)
class Fetched:
    archive: Path
    bundle: Path | None
    archive_sha256: str
    transferred_bytes: int


@runtime_checkable
class RecipeRegistry(Protocol):
    def fetch(self, name: str, version: str, dest_dir: Path, *, progress: Progress | None = None) -> Fetched: ...

    def push(self, name: str, version: str, archive: Path, bundle: Path | None) -> str: ...

    def describe(self) -> str: ...


@dataclass(frozen=True)
class RegistryOptions:
    """From settings; nothing here reads os.environ (boto3 reads its own standard AWS chain)."""

    s3_endpoint_url: str | None = None
    s3_region: str | None = None
    allow_insecure_http: tuple[str, ...] = ()  # OCI hosts ("host" or "host:port") allowed over plain HTTP
    timeout_s: float = 60.0  # connect and read timeout of every request
    s3_max_attempts: int = 3  # boto3 attempts per S3 request, the first included (1: no retries)
    max_download_bytes: int = DEFAULT_MAX_DOWNLOAD_BYTES  # per fetch: archive + bundle
    # Directories under which `file:///` registries may be read; None: any (an operator's own command,
    # such as `plnt recipe push --to file:///dir`), never for a URL that comes from a spec.
    file_roots: tuple[str, ...] | None = ()


def open_registry(url: str, options: RegistryOptions = RegistryOptions(), *, base_dir: Path | None = None) -> RecipeRegistry:
    """The registry a URL names. Raises InvalidSpec for a URL that cannot be used, ValueError for a
    relative `file:` URL without `base_dir`."""
    if url.startswith("file:"):
        root = _file_root(url, base_dir)
        if options.file_roots is not None and not (base_dir is not None and _inside(root, base_dir)):
            _check_file_root(url, root, options.file_roots)
        return FileRegistry(root, max_download_bytes=options.max_download_bytes)
    if url.startswith("s3://"):
        return S3Registry(url, options)
    if url.startswith(("oci://", "oci+http://", "oci+https://")):
        return OciRegistry(url, options)
    raise InvalidSpec(f"registry {url!r}: unsupported scheme; use file:, s3:// or oci://")


def _file_root(url: str, base_dir: Path | None) -> Path:
    if url.startswith("file://./"):
        rest, relative = url.removeprefix("file://./"), True
    elif url.startswith("file://"):
        rest = url.removeprefix("file://")
        if not rest.startswith("/"):
            raise InvalidSpec(f"registry {url!r}: a file:// URL names a local path (file:///abs/dir or file:rel/dir)")
        relative = False
    else:
        rest = url.removeprefix("file:")
        relative = not rest.startswith("/")
    if not relative:
        return Path(rest)
    if base_dir is None:
        raise ValueError(f"registry {url!r} is relative: base_dir is required")
    rest = rest.removeprefix("./")
    if Path(rest).is_absolute() or ".." in Path(rest).parts:
        raise InvalidSpec(f"registry {url!r}: a relative file registry must stay inside its base directory")
    return base_dir / rest


def _inside(path: Path, root: Path) -> bool:
    """Whether `path`, links and `..` resolved, is `root` or under it."""
    return path.resolve().is_relative_to(root.resolve())


def _check_file_root(url: str, root: Path, allowed: tuple[str, ...]) -> None:
    if any(_inside(root, Path(directory)) for directory in allowed):
        return
    where = f"allowed: {', '.join(allowed)}" if allowed else "none is allowed"
    raise InvalidSpec(
        f"registry {url!r}: plnt reads file:/// registries only under directories the operator allows "
        f"({where}); start plnt with --allow-file-registry DIR, or keep the recipes in the spec repository "
        f"(registry: file:registry)"
    )


def _check_ref(name: str, version: str) -> None:
    if not re.match(NAME_PATTERN, name):
        raise ValueError(f"recipe name {name!r} does not match {NAME_PATTERN}")
    if not re.match(VERSION_PATTERN, version):
        raise ValueError(f"recipe version {version!r} does not match {VERSION_PATTERN}")


# --- writing a fetch: partial files, hashed as they arrive, renamed when all are verified -----------


class _Staging:
    """The files of one fetch. `write` streams chunks into `<final>.partial`, hashing and counting;
    `commit` renames every partial into place (the archive last). Leaving the `with` block without a
    commit removes the partials. The bundle, read whole later, has its own cap, MAX_BUNDLE_BYTES."""

    FILE_CAPS = {BUNDLE_NAME: MAX_BUNDLE_BYTES}

    def __init__(self, dest_dir: Path, progress: Progress | None, *, cap: int, registry: str) -> None:
        self.dest_dir = dest_dir
        self.transferred = 0
        self.cap = cap
        self._registry = registry
        self._progress = progress
        self._next_report = PROGRESS_EVERY
        self._partials: list[tuple[Path, Path]] = []

    def __enter__(self) -> _Staging:
        self.dest_dir.mkdir(parents=True, exist_ok=True)
        for name in (ARCHIVE_NAME, BUNDLE_NAME):
            (self.dest_dir / name).unlink(missing_ok=True)
        return self

    def __exit__(self, *exc: object) -> None:
        for partial, _ in self._partials:
            partial.unlink(missing_ok=True)

    def write(self, final_name: str, chunks: Iterable[bytes], *, limit: int | None = None) -> tuple[str, int]:
        """Stream chunks into dest_dir/<final_name>.partial; ("sha256:<hex>", size). Stops reading
        once more than `limit` bytes arrived (the caller then reports the size mismatch)."""
        final = self.dest_dir / final_name
        partial = final.with_name(final.name + PARTIAL_SUFFIX)
        self._partials.append((partial, final))
        digest = hashlib.sha256()
        size = 0
        with open(partial, "wb") as out:
            for chunk in chunks:
                if not chunk:
                    continue
                self._count(len(chunk), final_name, size)
                out.write(chunk)
                digest.update(chunk)
                size += len(chunk)
                if limit is not None and size > limit:
                    break
        return "sha256:" + digest.hexdigest(), size

    def check_announced(self, final_name: str, size: int) -> None:
        """Refuse before downloading what the registry itself says is over the cap."""
        check_metadata_size(size, self.FILE_CAPS.get(final_name, size), what=self._what(final_name))
        if self.transferred + size > self.cap:
            raise self._too_large(final_name, f"announces {size} bytes")

    def _too_large(self, final_name: str, what: str) -> DownloadRefused:
        return DownloadRefused(
            f"{self._registry}: {final_name} {what}, over the download cap of {self.cap} bytes for one recipe "
            f"(archive and bundle); nothing was kept. If the recipe really is this large, raise "
            f"--max-download-mb (max_download_bytes)"
        )

    def _what(self, final_name: str) -> str:
        return f"{self._registry}: {final_name}"

    def _count(self, n: int, final_name: str, written: int) -> None:
        # Counted before the chunk is written: bytes past the cap never reach the disk.
        file_cap = self.FILE_CAPS.get(final_name)
        if file_cap is not None and written + n > file_cap:
            raise metadata_too_large(self._what(final_name), None, file_cap)
        if self.transferred + n > self.cap:
            raise self._too_large(final_name, f"went past {self.cap} bytes while downloading")
        self.transferred += n
        if self._progress is not None and self.transferred >= self._next_report:
            self._progress(self.transferred)
            self._next_report = (self.transferred // PROGRESS_EVERY + 1) * PROGRESS_EVERY

    def commit(self) -> None:
        if self._progress is not None:
            self._progress(self.transferred)
        for partial, final in sorted(self._partials, key=lambda pair: pair[1].name == ARCHIVE_NAME):
            os.replace(partial, final)
        self._partials.clear()

    def fetched(self, archive_sha256: str, has_bundle: bool) -> Fetched:
        return Fetched(
            archive=self.dest_dir / ARCHIVE_NAME,
            bundle=self.dest_dir / BUNDLE_NAME if has_bundle else None,
            archive_sha256=archive_sha256,
            transferred_bytes=self.transferred,
        )


def _file_chunks(handle: BinaryIO) -> Iterator[bytes]:
    while chunk := handle.read(CHUNK_SIZE):
        yield chunk


def _sha256_file(path: Path) -> tuple[str, int]:
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as handle:
        for chunk in _file_chunks(handle):
            digest.update(chunk)
            size += len(chunk)
    return "sha256:" + digest.hexdigest(), size


# --- metadata, read whole into memory: bounded ---------------------------------------------------


REPUBLISH = "publish it again as the signing or push tool wrote it"


def metadata_too_large(what: str, size: int | None, limit: int, remedy: str = REPUBLISH) -> DownloadRefused:
    """The refusal of a metadata file over its cap; `size` None: it grew past the cap while read."""
    found = f"is {size} bytes" if size is not None else f"went past {limit} bytes while being read"
    return DownloadRefused(f"{what} {found}, more than the {limit} bytes plnt reads for it (real ones are a few "
                           f"KiB); refused without reading further: {remedy}")


def check_metadata_size(size: int | None, limit: int, *, what: str, remedy: str = REPUBLISH) -> None:
    """Refuse before reading when the size a source announces (st_size, Content-Length, an OCI
    descriptor's size) is over `limit`; None: nothing announced, the read itself is bounded."""
    if size is not None and size > limit:
        raise metadata_too_large(what, size, limit, remedy)


def read_chunks_bounded(chunks: Iterable[bytes], limit: int, *, what: str) -> bytes:
    """The bytes of a stream, refused (DownloadRefused) past `limit` bytes: reading stops at the
    first chunk that passes it, and a generator is closed (its connection with it)."""
    body = bytearray()
    try:
        for chunk in chunks:
            body.extend(chunk)
            if len(body) > limit:
                raise metadata_too_large(what, None, limit)
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()
    return bytes(body)


def read_bounded(path: Path, limit: int, *, what: str, remedy: str = REPUBLISH) -> bytes:
    """The bytes of the regular file `path`, refused (DownloadRefused) when over `limit`: its size
    is checked before reading and at most limit + 1 bytes are read, so a file that grows meanwhile
    is refused too. Not a FIFO or device (it could block or never end). FileNotFoundError as open's."""
    what = f"{what} ({path})"
    # O_NONBLOCK: opening a FIFO must not wait for a writer; it is refused below
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as handle:
        status = os.fstat(handle.fileno())
        if not stat.S_ISREG(status.st_mode):
            raise DownloadRefused(f"{what} is not a regular file (a FIFO or a device); refused: {remedy}")
        check_metadata_size(status.st_size, limit, what=what, remedy=remedy)
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise metadata_too_large(what, None, limit, remedy)
    return data


# --- file: ----------------------------------------------------------------------------------------


class FileRegistry:
    """A directory: `<root>/<name>/<version>/recipe.tar.gz` and the bundle beside it."""

    def __init__(self, root: Path, *, max_download_bytes: int = DEFAULT_MAX_DOWNLOAD_BYTES) -> None:
        self.root = Path(root)
        self.max_download_bytes = max_download_bytes

    def describe(self) -> str:
        return f"file registry {self.root}"

    def _entry(self, name: str, version: str) -> Path:
        _check_ref(name, version)
        return self.root / name / version

    def fetch(self, name: str, version: str, dest_dir: Path, *, progress: Progress | None = None) -> Fetched:
        entry = self._entry(name, version)
        source_archive, source_bundle = entry / ARCHIVE_NAME, entry / BUNDLE_NAME
        with _Staging(dest_dir, progress, cap=self.max_download_bytes, registry=self.describe()) as staging:
            if not source_archive.is_file():
                raise RecipeNotFound(f"recipe {name}@{version} not found: no {source_archive} in {self.describe()}")
            for source in (source_archive, source_bundle):
                if source.exists() and not _inside(source, self.root):
                    raise InvalidSpec(f"{self.describe()}: {source} leads out of the registry directory (a link); "
                                      f"refused")
            try:
                with open(source_archive, "rb") as handle:
                    staging.check_announced(ARCHIVE_NAME, os.fstat(handle.fileno()).st_size)
                    archive_sha256, _ = staging.write(ARCHIVE_NAME, _file_chunks(handle))
                has_bundle = source_bundle.is_file()
                if has_bundle:
                    with open(source_bundle, "rb") as handle:
                        staging.check_announced(BUNDLE_NAME, os.fstat(handle.fileno()).st_size)
                        staging.write(BUNDLE_NAME, _file_chunks(handle))
            except FileNotFoundError as exc:
                raise RecipeNotFound(f"recipe {name}@{version} vanished from {self.describe()} while reading: {exc}") from exc
            staging.commit()
            return staging.fetched(archive_sha256, has_bundle)

    def push(self, name: str, version: str, archive: Path, bundle: Path | None) -> str:
        entry = self._entry(name, version)
        entry.mkdir(parents=True, exist_ok=True)
        _copy_atomically(archive, entry / ARCHIVE_NAME)
        if bundle is not None:
            _copy_atomically(bundle, entry / BUNDLE_NAME)
        else:
            (entry / BUNDLE_NAME).unlink(missing_ok=True)
        return str(entry / ARCHIVE_NAME)


def _copy_atomically(source: Path, target: Path) -> None:
    partial = target.with_name(target.name + PARTIAL_SUFFIX)
    try:
        shutil.copyfile(source, partial)
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)


# --- s3:// ----------------------------------------------------------------------------------------


_S3_TRANSIENT_CODES = {
    "SlowDown", "Throttling", "ThrottlingException", "RequestTimeout", "RequestTimeTooSkewed",
    "InternalError", "ServiceUnavailable", "503", "500", "502", "504",
}


class S3Registry:
    """`s3://bucket/prefix`: keys `<prefix>/<name>/<version>/recipe.tar.gz` and the bundle's.
    At push the archive's sha256 is stored in the object metadata (`x-amz-meta-sha256`); a fetch
    checks it when present."""

    def __init__(self, url: str, options: RegistryOptions = RegistryOptions(), *, client: Any = None) -> None:
        parts = urlsplit(url)
        if parts.scheme != "s3" or not parts.netloc:
            raise InvalidSpec(f"registry {url!r}: expected s3://bucket/prefix")
        self.url = url.rstrip("/")
        self.bucket = parts.netloc
        self.prefix = parts.path.strip("/")
        self.options = options
        self._client = client if client is not None else self._make_client(options)

    @staticmethod
    def _make_client(options: RegistryOptions) -> Any:
        import boto3
        from botocore.config import Config

        config = Config(
            s3={"addressing_style": "path"},
            retries={"total_max_attempts": max(1, options.s3_max_attempts), "mode": "standard"},
            connect_timeout=options.timeout_s,
            read_timeout=options.timeout_s,
        )
        return boto3.session.Session().client(
            "s3", endpoint_url=options.s3_endpoint_url, region_name=options.s3_region, config=config
        )

    def describe(self) -> str:
        location = f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"
        where = f" at {self.options.s3_endpoint_url}" if self.options.s3_endpoint_url else ""
        return f"S3 registry {location}{where}"

    def _key(self, name: str, version: str, filename: str) -> str:
        _check_ref(name, version)
        return "/".join(p for p in (self.prefix, name, version, filename) if p)

    def _s3_url(self, key: str) -> str:
        return f"s3://{self.bucket}/{key}"

    def fetch(self, name: str, version: str, dest_dir: Path, *, progress: Progress | None = None) -> Fetched:
        archive_key = self._key(name, version, ARCHIVE_NAME)
        bundle_key = self._key(name, version, BUNDLE_NAME)
        with _Staging(dest_dir, progress, cap=self.options.max_download_bytes, registry=self.describe()) as staging:
            response = self._get(archive_key, ref=f"{name}@{version}", missing_ok=False)
            self._announced(staging, response, ARCHIVE_NAME)
            archive_sha256, size = staging.write(ARCHIVE_NAME, self._chunks(response, archive_key))
            self._check_object(response, archive_key, archive_sha256, size)
            bundle_response = self._get(bundle_key, ref=f"{name}@{version}", missing_ok=True)
            if bundle_response is not None:
                self._announced(staging, bundle_response, BUNDLE_NAME)
                bundle_sha256, bundle_size = staging.write(BUNDLE_NAME, self._chunks(bundle_response, bundle_key))
                self._check_object(bundle_response, bundle_key, bundle_sha256, bundle_size)
            staging.commit()
            return staging.fetched(archive_sha256, bundle_response is not None)

    @staticmethod
    def _announced(staging: _Staging, response: Any, final_name: str) -> None:
        length = response.get("ContentLength")
        if isinstance(length, int):
            try:
                staging.check_announced(final_name, length)
            except DownloadRefused:
                response["Body"].close()
                raise

    def _get(self, key: str, *, ref: str, missing_ok: bool) -> Any:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return self._client.get_object(Bucket=self.bucket, Key=key)
        except ClientError as exc:
            code, status = _s3_error_code(exc)
            if missing_ok and code in ("NoSuchKey", "404", "NotFound"):
                return None
            raise self._failure(exc, code, status, f"recipe {ref}", self._s3_url(key)) from exc
        except BotoCoreError as exc:
            raise self._transport_failure(exc, f"reading {self._s3_url(key)}") from exc

    def _chunks(self, response: Any, key: str) -> Iterator[bytes]:
        from botocore.exceptions import BotoCoreError, FlexibleChecksumError
        from urllib3.exceptions import HTTPError as Urllib3Error

        body = response["Body"]
        try:
            while True:
                try:
                    chunk = body.read(CHUNK_SIZE)
                except FlexibleChecksumError as exc:
                    raise DigestMismatch(f"{self._s3_url(key)}: the object's bytes do not match its S3 checksum: {exc}") from exc
                except (BotoCoreError, Urllib3Error, http.client.HTTPException, ConnectionError, TimeoutError) as exc:
                    raise RegistryUnavailable(f"{self.describe()}: transfer of {self._s3_url(key)} broke off: {exc}") from exc
                if not chunk:
                    return
                yield chunk
        finally:
            body.close()

    def _check_object(self, response: Any, key: str, sha256: str, size: int) -> None:
        expected_size = response.get("ContentLength")
        if expected_size is not None and expected_size != size:
            raise RegistryUnavailable(
                f"{self.describe()}: transfer of {self._s3_url(key)} broke off after {size} of {expected_size} bytes"
            )
        announced = (response.get("Metadata") or {}).get("sha256")
        if announced and "sha256:" + announced.removeprefix("sha256:") != sha256:
            raise DigestMismatch(
                f"{self._s3_url(key)}: the object's metadata announces sha256:{announced.removeprefix('sha256:')}, "
                f"the bytes served hash to {sha256} ({size} bytes)"
            )

    def push(self, name: str, version: str, archive: Path, bundle: Path | None) -> str:
        from botocore.exceptions import BotoCoreError, ClientError

        archive_key = self._key(name, version, ARCHIVE_NAME)
        bundle_key = self._key(name, version, BUNDLE_NAME)
        try:
            self._put(archive_key, archive, "application/gzip")
            if bundle is not None:
                self._put(bundle_key, bundle, "application/json")
            else:
                self._client.delete_object(Bucket=self.bucket, Key=bundle_key)
        except ClientError as exc:
            code, status = _s3_error_code(exc)
            failure = self._failure(exc, code, status, f"push of {name}@{version}", self._s3_url(archive_key))
            if isinstance(failure, RecipeNotFound | RegistryAuthFailed):
                raise PushRejected(str(failure)) from exc
            raise failure from exc
        except BotoCoreError as exc:
            failure = self._transport_failure(exc, f"pushing {self._s3_url(archive_key)}")
            raise (PushRejected(str(failure)) if isinstance(failure, RegistryAuthFailed) else failure) from exc
        return self._s3_url(archive_key)

    def _put(self, key: str, path: Path, content_type: str) -> None:
        sha256, _ = _sha256_file(path)
        with open(path, "rb") as body:
            self._client.put_object(
                Bucket=self.bucket, Key=key, Body=body, ContentType=content_type,
                Metadata={"sha256": sha256.removeprefix("sha256:")},
            )

    def _failure(self, exc: Exception, code: str, status: int | None, what: str, s3_url: str) -> PlntError:
        if code in ("NoSuchKey", "404", "NotFound"):
            return RecipeNotFound(f"{what} not found: no object {s3_url} in {self.describe()}")
        if code == "NoSuchBucket":
            return RecipeNotFound(f"{what} not found: no bucket {self.bucket!r} ({s3_url}) in {self.describe()}")
        if code in _S3_TRANSIENT_CODES or (status is not None and (status >= 500 or status == 429)):
            return RegistryUnavailable(f"{self.describe()} failed on {s3_url}: {code}: {exc}")
        if status in (401, 403) or code in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
            return RegistryAuthFailed(
                f"{what}: {self.describe()} denied access to {s3_url} ({code}); check the AWS credentials plnt runs "
                f"with (AWS_PROFILE / AWS_ACCESS_KEY_ID, or the instance role) and the bucket policy; plnt retries"
            )
        return RecipeNotFound(f"{what}: {s3_url} cannot be read ({code}): {exc}")

    def _transport_failure(self, exc: Exception, doing: str) -> PlntError:
        from botocore.exceptions import NoCredentialsError, PartialCredentialsError

        if isinstance(exc, NoCredentialsError | PartialCredentialsError):
            return RegistryAuthFailed(f"{self.describe()}: no usable AWS credentials for {doing} ({exc}); give plnt "
                                      f"credentials through AWS's standard chain (AWS_PROFILE, AWS_ACCESS_KEY_ID, role)")
        return RegistryUnavailable(f"{self.describe()} unreachable while {doing}: {exc}")


def _s3_error_code(exc: Any) -> tuple[str, int | None]:
    response = getattr(exc, "response", None) or {}
    return str(response.get("Error", {}).get("Code", "")), response.get("ResponseMetadata", {}).get("HTTPStatusCode")


# --- oci:// ---------------------------------------------------------------------------------------


def oci_tag(version: str) -> str:
    """The OCI tag of a recipe version: OCI tags allow no `+`, so build metadata uses `_` (as Helm does)."""
    return version.replace("+", "_")


def _oras_client_class() -> type:
    import oras.provider
    import requests
    from requests.adapters import HTTPAdapter

    class _TimeoutAdapter(HTTPAdapter):
        def __init__(self, timeout_s: float) -> None:
            super().__init__()
            self._timeout_s = timeout_s

        def send(self, request: Any, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
            if kwargs.get("timeout") is None:
                kwargs["timeout"] = self._timeout_s
            return super().send(request, *args, **kwargs)

    class OrasClient(oras.provider.Registry):  # type: ignore[misc]
        """oras-py's client with a timeout on every request, no proxy/netrc from the environment, and
        without its retry decorator (which sleeps 3, 5, 11, 29 and 83 s on any error): Temporal retries."""

        def __init__(self, hostname: str, *, plain_http: bool, timeout_s: float) -> None:
            super().__init__(hostname=hostname, insecure=plain_http)
            self.session.trust_env = False
            adapter = _TimeoutAdapter(timeout_s)
            self.session.mount("http://", adapter)
            self.session.mount("https://", adapter)
            self.session.hooks["response"].append(_refuse_foreign_redirect)

        def do_request(self, url: str, method: str = "GET", data: Any = None, headers: dict | None = None,
                       json: dict | None = None, stream: bool = False) -> requests.Response:
            headers = dict(headers or {})
            challenge = ""
            if not getattr(self.auth, "token", None):  # oras answers a Bearer challenge with a token it then keeps
                response = self.session.request(method, url, data=data, json=json, headers=headers, stream=stream,
                                                verify=self._tls_verify)
                if response.status_code not in (401, 403):
                    return response
                challenge = response.headers.get("Www-Authenticate", "").strip().lower()
                basic = getattr(self.auth, "_basic_auth", None)
                if not challenge.startswith("bearer "):
                    # Basic (htpasswd) or nothing: oras would fetch the "realm" as a URL. Answer Basic
                    # with the credentials docker's config holds for this host, else report the refusal.
                    if not (challenge.startswith("basic") and basic):
                        return response
                    response.close()
                    headers["Authorization"] = f"Basic {basic}"
                    return self.session.request(method, url, data=data, json=json, headers=headers, stream=stream,
                                                verify=self._tls_verify)
                response.close()
            unwrapped = oras.provider.Registry.do_request.__wrapped__
            return unwrapped(self, url, method, data, headers, json, stream)

    return OrasClient


def _refuse_foreign_redirect(response: Any, *args: Any, **kwargs: Any) -> Any:
    """A session hook, run on every response before requests follows a redirect: only to the same
    host, never from HTTPS to HTTP (a registry must not send plnt's credentials or requests on)."""
    if not response.is_redirect:
        return response
    here = urlsplit(response.url)
    there = urlsplit(urljoin(response.url, response.headers.get("location", "")))
    if (there.hostname or "").lower() != (here.hostname or "").lower() or (here.scheme == "https" and there.scheme != "https"):
        response.close()
        raise DownloadRefused(
            f"OCI registry {here.netloc} redirected {here.path} to {there.scheme}://{there.netloc}{there.path}: plnt "
            f"follows redirects only to the same host and never from HTTPS to HTTP; refused (nothing was fetched "
            f"from there)"
        )
    return response


@dataclass(frozen=True)
class _Layer:
    media_type: str
    digest: str
    size: int


class OciRegistry:
    """`oci://host[:port]/repo`: artifact `<host>/<repo>/<name>:<tag>` with plnt's media types.
    Pushes go through oras-py; pulls use its HTTP session (auth, TLS) but check every digest here."""

    def __init__(self, url: str, options: RegistryOptions = RegistryOptions(), *, plain_http: bool | None = None) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("oci", "oci+http", "oci+https") or not parts.netloc or parts.query or parts.fragment:
            raise InvalidSpec(f"registry {url!r}: expected oci://host[:port]/repository")
        if parts.scheme == "oci+http":
            plain_http = True if plain_http is None else plain_http
        elif parts.scheme == "oci+https":
            plain_http = False if plain_http is None else plain_http
        self.host = (parts.hostname or "").lower()
        self.netloc = parts.netloc.lower()
        self.repository = parts.path.strip("/")
        if "@" in self.netloc or not self.host:
            raise InvalidSpec(f"registry {url!r}: expected oci://host[:port]/repository (no credentials in the URL)")
        # Loopback is not special: a spec must not make plnt talk plain HTTP to local services.
        insecure_ok = any(allowed.lower() in (self.host, self.netloc) for allowed in options.allow_insecure_http)
        if plain_http is None:
            plain_http = insecure_ok
        elif plain_http and not insecure_ok:
            raise InvalidSpec(
                f"registry {url!r}: plain HTTP to {self.netloc} refused: only hosts the operator lists "
                f"(plnt up --oci-insecure-host {self.netloc}; allow_insecure_http) may be reached without TLS "
                f"(nothing was sent)"
            )
        self.plain_http = plain_http
        self.options = options
        self._scheme = "http" if plain_http else "https"
        self._client: Any = None

    def describe(self) -> str:
        transport = "plain HTTP" if self.plain_http else "HTTPS"
        location = f"{self.netloc}/{self.repository}" if self.repository else self.netloc
        return f"OCI registry oci://{location} ({transport})"

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = _oras_client_class()(self.netloc, plain_http=self.plain_http, timeout_s=self.options.timeout_s)
        return self._client

    def reference(self, name: str, version: str) -> str:
        _check_ref(name, version)
        return f"{self.netloc}/{self._repo_path(name)}:{oci_tag(version)}"

    def _repo_path(self, name: str) -> str:
        return f"{self.repository}/{name}" if self.repository else name

    def _container(self, name: str, version: str) -> Any:
        import oras.container

        container = oras.container.Container(f"{self._repo_path(name)}:{oci_tag(version)}", registry=self.netloc)
        # set the parts outright: oras's parser would read a dotted first path segment as a host
        namespace, _, repository = self._repo_path(name).rpartition("/")
        container.registry, container.namespace, container.repository = self.netloc, namespace or None, repository
        container.tag, container.digest = oci_tag(version), None
        return container

    def _url(self, path: str) -> str:
        return f"{self._scheme}://{self.netloc}/v2/{path}"

    def _request(self, method: str, url: str, *, doing: str, **kwargs: Any) -> Any:
        import requests

        try:
            return self.client.do_request(url, method, **kwargs)
        except requests.exceptions.SSLError as exc:
            raise RegistryUnavailable(
                f"{self.describe()}: TLS failed while {doing}: {exc} (a registry without TLS must be listed by "
                f"the operator: plnt up --oci-insecure-host {self.netloc})"
            ) from exc
        except (requests.exceptions.RequestException, http.client.HTTPException, OSError) as exc:
            raise RegistryUnavailable(f"{self.describe()} unreachable while {doing}: {exc}") from exc
        except ValueError as exc:  # oras-py: a 401/403 it could not answer with credentials
            raise self._auth_failure(f"{doing}", str(exc)) from exc

    def _auth_failure(self, what: str, detail: str, status: int | None = None) -> RegistryAuthFailed:
        code = f" ({status})" if status else ""
        return RegistryAuthFailed(
            f"{self.describe()} refused access{code} while {what}: {detail}; check the registry credentials plnt "
            f"runs with (`docker login {self.netloc}`: $HOME/.docker/config.json of the user running plnt); plnt retries"
        )

    def _status_failure(self, response: Any, what: str) -> PlntError:
        status = response.status_code
        detail = _oci_error_text(response)
        if status in (408, 429) or status >= 500:
            return RegistryUnavailable(f"{self.describe()} answered {status} for {what}: {detail}")
        if status in (401, 403):
            return self._auth_failure(f"reading {what}", detail, status)
        if status == 404:
            return RecipeNotFound(f"{what} not found in {self.describe()}: {detail}")
        return RecipeNotFound(f"{what}: {self.describe()} answered {status}: {detail}")

    # fetch

    def fetch(self, name: str, version: str, dest_dir: Path, *, progress: Progress | None = None) -> Fetched:
        reference = self.reference(name, version)
        container = self._container(name, version)
        with _Staging(dest_dir, progress, cap=self.options.max_download_bytes, registry=self.describe()) as staging:
            self.client.auth.load_configs(container)
            manifest = self._manifest(name, version, reference)
            archive_layer, bundle_layer = self._recipe_layers(manifest, reference)
            if bundle_layer is not None:  # an oversized bundle is refused before the archive is fetched
                staging.check_announced(BUNDLE_NAME, bundle_layer.size)
            archive_sha256 = self._download(staging, name, archive_layer, ARCHIVE_NAME, reference)
            if bundle_layer is not None:
                self._download(staging, name, bundle_layer, BUNDLE_NAME, reference)
            staging.commit()
            return staging.fetched(archive_sha256, bundle_layer is not None)

    def _manifest(self, name: str, version: str, reference: str) -> dict:
        url = self._url(f"{self._repo_path(name)}/manifests/{oci_tag(version)}")
        accept = ", ".join([OCI_MANIFEST_MEDIA_TYPE, DOCKER_MANIFEST_MEDIA_TYPE, OCI_INDEX_MEDIA_TYPE, DOCKER_LIST_MEDIA_TYPE])
        what = f"recipe {name}@{version} ({reference})"
        with self._request("GET", url, doing=f"getting the manifest of {reference}", headers={"Accept": accept},
                           stream=True) as response:
            if response.status_code != 200:
                raise self._status_failure(response, what)
            where = f"{self.describe()}: the manifest of {reference}"
            check_metadata_size(_content_length(response), MAX_MANIFEST_BYTES, what=where)
            try:
                body = read_chunks_bounded(response.iter_content(CHUNK_SIZE), MAX_MANIFEST_BYTES, what=where)
            except (OSError, http.client.HTTPException, _requests_errors()) as exc:
                raise RegistryUnavailable(f"{self.describe()}: transfer of the manifest of {reference} broke off: {exc}") from exc
            announced = response.headers.get("Docker-Content-Digest")
            content_type = response.headers.get("Content-Type", "").split(";")[0].strip()
        if announced:
            algorithm, _, expected_hex = announced.partition(":")
            if algorithm in ("sha256", "sha384", "sha512"):
                actual = f"{algorithm}:{hashlib.new(algorithm, body).hexdigest()}"
                if actual != announced:
                    raise DigestMismatch(
                        f"{reference}: the registry announced manifest digest {announced} (Docker-Content-Digest) but "
                        f"the manifest served hashes to {actual} ({len(body)} bytes)"
                    )
        try:
            manifest = json.loads(body)
        except ValueError as exc:
            raise InvalidRecipe(f"{reference}: the manifest is not JSON: {exc}") from exc
        if not isinstance(manifest, dict):
            raise InvalidRecipe(f"{reference}: the manifest is not a JSON object")
        media_type = manifest.get("mediaType") or content_type
        if media_type in (OCI_INDEX_MEDIA_TYPE, DOCKER_LIST_MEDIA_TYPE) or "manifests" in manifest:
            raise InvalidRecipe(f"{reference} is an image index, not a plnt recipe artifact")
        if media_type not in (OCI_MANIFEST_MEDIA_TYPE, DOCKER_MANIFEST_MEDIA_TYPE, ""):
            raise InvalidRecipe(f"{reference}: unexpected manifest media type {media_type!r}")
        return manifest

    def _recipe_layers(self, manifest: dict, reference: str) -> tuple[_Layer, _Layer | None]:
        found: dict[str, list[_Layer]] = {ARCHIVE_MEDIA_TYPE: [], BUNDLE_MEDIA_TYPE: []}
        layers = manifest.get("layers")
        if not isinstance(layers, list):
            raise InvalidRecipe(f"{reference}: the manifest has no layers list")
        for layer in layers:
            if not isinstance(layer, dict) or layer.get("mediaType") not in found:
                continue
            digest, size = layer.get("digest"), layer.get("size")
            if not isinstance(digest, str) or not _SHA256_DIGEST.match(digest):
                raise InvalidRecipe(f"{reference}: layer {layer.get('mediaType')} has digest {digest!r}; plnt needs sha256")
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise InvalidRecipe(f"{reference}: layer {layer.get('mediaType')} has invalid size {size!r}")
            found[layer["mediaType"]].append(_Layer(layer["mediaType"], digest, size))
        for media_type, matches in found.items():
            if len(matches) > 1:
                raise InvalidRecipe(f"{reference}: {len(matches)} layers of media type {media_type}; expected one")
        if not found[ARCHIVE_MEDIA_TYPE]:
            raise InvalidRecipe(f"{reference} is not a plnt recipe: no layer of media type {ARCHIVE_MEDIA_TYPE}")
        bundles = found[BUNDLE_MEDIA_TYPE]
        return found[ARCHIVE_MEDIA_TYPE][0], (bundles[0] if bundles else None)

    def _download(self, staging: _Staging, name: str, layer: _Layer, filename: str, reference: str) -> str:
        url = self._url(f"{self._repo_path(name)}/blobs/{layer.digest}")
        what = f"blob {layer.digest} ({filename}, {layer.media_type}) of {reference}"
        staging.check_announced(filename, layer.size)  # and the bytes are counted as they arrive
        with self._request("GET", url, doing=f"getting {what}", stream=True) as response:
            if response.status_code != 200:
                raise self._status_failure(response, what)

            def chunks() -> Iterator[bytes]:
                try:
                    yield from response.iter_content(CHUNK_SIZE)
                except (OSError, http.client.HTTPException, _requests_errors()) as exc:
                    raise RegistryUnavailable(f"{self.describe()}: transfer of {what} broke off: {exc}") from exc

            actual, size = staging.write(filename, chunks(), limit=layer.size)
        if actual != layer.digest or size != layer.size:
            more = " or more" if size > layer.size else ""
            raise DigestMismatch(
                f"{what}: the manifest announces {layer.digest} ({layer.size} bytes), the registry served bytes "
                f"hashing to {actual} ({size}{more} bytes)"
            )
        return actual

    # push

    def push(self, name: str, version: str, archive: Path, bundle: Path | None) -> str:
        reference = self.reference(name, version)
        container = self._container(name, version)
        self.client.auth.load_configs(container)
        layers = [self._layer(archive, ARCHIVE_MEDIA_TYPE, ARCHIVE_NAME)]
        if bundle is not None:
            layers.append(self._layer(bundle, BUNDLE_MEDIA_TYPE, BUNDLE_NAME))
        config_bytes = json.dumps({"name": name, "version": version}, sort_keys=True, separators=(",", ":")).encode()
        with tempfile.TemporaryDirectory(prefix="plnt-oci-push-") as scratch:
            config_path = Path(scratch) / "config.json"
            config_path.write_bytes(config_bytes)
            config = {"mediaType": CONFIG_MEDIA_TYPE, "digest": "sha256:" + hashlib.sha256(config_bytes).hexdigest(),
                      "size": len(config_bytes)}
            blobs = [(archive, layers[0]), (config_path, config)]
            if bundle is not None:
                blobs.insert(1, (bundle, layers[1]))
            for path, descriptor in blobs:
                what = f"blob {_descriptor_name(descriptor)} of {reference}"
                response = self._push_call(lambda p=path, d=descriptor: self.client.upload_blob(str(p), container, d),
                                           f"uploading {what}")
                self._check_pushed(response, f"upload of {what}")
        manifest = {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST_MEDIA_TYPE,
            "artifactType": ARTIFACT_TYPE,
            "config": config,
            "layers": layers,
            "annotations": {"dev.plnt.recipe.name": name, "dev.plnt.recipe.version": version},
        }
        body = json.dumps(manifest, separators=(",", ":")).encode()
        digest = "sha256:" + hashlib.sha256(body).hexdigest()
        url = self._url(f"{self._repo_path(name)}/manifests/{oci_tag(version)}")
        response = self._push_call(
            lambda: self.client.do_request(url, "PUT", data=body, headers={"Content-Type": OCI_MANIFEST_MEDIA_TYPE}),
            f"putting the manifest of {reference}",
        )
        self._check_pushed(response, f"manifest of {reference}")
        stored = response.headers.get("Docker-Content-Digest")
        if stored and stored != digest:
            raise DigestMismatch(f"{reference}: pushed manifest {digest}, the registry stored {stored}")
        return f"{reference}@{digest}"

    @staticmethod
    def _layer(path: Path, media_type: str, title: str) -> dict:
        digest, size = _sha256_file(path)
        return {"mediaType": media_type, "digest": digest, "size": size, "annotations": {TITLE_ANNOTATION: title}}

    def _push_call(self, call: Callable[[], Any], doing: str) -> Any:
        import requests

        try:
            return call()
        except requests.exceptions.SSLError as exc:
            raise RegistryUnavailable(f"{self.describe()}: TLS failed while {doing}: {exc}") from exc
        except (requests.exceptions.RequestException, http.client.HTTPException, OSError) as exc:
            raise RegistryUnavailable(f"{self.describe()} unreachable while {doing}: {exc}") from exc
        except ValueError as exc:  # oras-py raises ValueError when an upload session cannot be opened
            raise PushRejected(f"{self.describe()} refused {doing}: {exc}") from exc

    def _check_pushed(self, response: Any, what: str) -> None:
        status = response.status_code
        if status in (200, 201, 202):
            return
        detail = _oci_error_text(response)
        if status in (408, 429) or status >= 500:
            raise RegistryUnavailable(f"{self.describe()} answered {status} to the {what}: {detail}")
        raise PushRejected(f"{self.describe()} refused the {what} ({status}): {detail}")


def _descriptor_name(descriptor: dict) -> str:
    title = (descriptor.get("annotations") or {}).get(TITLE_ANNOTATION, "config")
    return f"{title} ({descriptor['digest']})"


def _requests_errors() -> type[Exception]:
    import requests

    return requests.exceptions.RequestException


def _content_length(response: Any) -> int | None:
    """An HTTP answer's Content-Length, None when absent or not a number."""
    value = response.headers.get("Content-Length", "")
    return int(value) if value.strip().isdigit() else None


def _oci_error_text(response: Any) -> str:
    try:
        errors = response.json().get("errors") or []
        text = "; ".join(f"{e.get('code')}: {e.get('message')}" for e in errors if isinstance(e, dict))
        if text:
            return text
    except Exception:  # noqa: BLE001 - a body that is not the OCI error JSON
        pass
    return (getattr(response, "reason", "") or "").strip() or f"HTTP {response.status_code}"
