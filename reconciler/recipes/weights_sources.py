"""Published model weights in a registry: where a model NAME@VERSION lives at each of the recipe
registries' URL forms, the WeightsSource that reads it for `WeightsStore.pull`, and `publish_weights`,
which puts it there.

Layouts (the registry URL is parsed, checked and connected to exactly as for recipes:
`registries.open_registry`, its RegistryOptions, file roots, timeouts, TLS and redirect rules):

  - `file:/abs/dir`, `file:///abs/dir`, `file:rel/dir`: `<dir>/<NAME>/<VERSION>/model.sig` and each
    file at its manifest name below it (a DirectoryWeightsSource on that directory). A file, or the
    version directory, reached through a link that leaves it is refused.
  - `s3://bucket/prefix`: keys `<prefix>/<NAME>/<VERSION>/model.sig` and
    `<prefix>/<NAME>/<VERSION>/<manifest name>` (one PUT per file: at most 5 GiB a file). A resumed
    read is a GetObject with `Range: bytes=OFFSET-`.
  - `oci://host[:port]/repo`: the repository `<repo>/<NAME>`, tag `oci_tag(VERSION)`: an OCI image
    manifest with artifactType MODEL_ARTIFACT_TYPE, the empty descriptor as config, one layer per
    file (application/octet-stream, annotation `org.opencontainers.image.title` = its manifest
    name) and one for the signature (the Sigstore bundle media type, title `model.sig`). A resumed
    read GETs the layer blob with `Range: bytes=OFFSET-`: a 206 must start at OFFSET; a registry
    that ignores the header and answers 200 has the first OFFSET bytes skipped.

Nothing read here is trusted: the store verifies model.sig first (trust.verify_weights_signature),
then hashes every byte of every file against the signed manifest. A source only fetches the names
the signed manifest lists, so a file published beside them is never read.

Errors: RecipeNotFound (the version, or a file the signed manifest lists, is not published: the
message names the registry, the model, the version and the file, and says to push again),
RegistryUnavailable (unreachable, timeouts, 5xx, a transfer broken off: retried later),
RegistryAuthFailed (401/403, no credentials), DownloadRefused (a name or link that leaves the
model's directory or prefix, a signature larger than MAX_SIGNATURE_BYTES), InvalidRecipe (an OCI
artifact that is not a plnt model), DigestMismatch (a signature layer whose bytes are not the ones
announced), WeightsNotPublishable (publish: the directory is not what its model.sig signs).
"""

from __future__ import annotations

import hashlib
import http.client
import json
import re
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

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
from plnt.reconciler.recipes.registries import (
    _SHA256_DIGEST,
    BUNDLE_MEDIA_TYPE,
    CHUNK_SIZE,
    MAX_SIGNATURE_BYTES,
    OCI_MANIFEST_MEDIA_TYPE,
    TITLE_ANNOTATION,
    FileRegistry,
    OciRegistry,
    PushRejected,
    RegistryOptions,
    S3Registry,
    _copy_atomically,
    _inside,
    _Layer,
    _requests_errors,
    _s3_error_code,
    check_metadata_size,
    oci_tag,
    open_registry,
    read_bounded,
    read_chunks_bounded,
)
from plnt.reconciler.recipes.trust import _parse_bundle
from plnt.reconciler.recipes.weights import SIGNATURE_NAME, DirectoryWeightsSource, WeightsSource
from plnt.reconciler.recipes.weights_manifest import ManifestError, WeightsManifest, canonical_name, parse_statement, sha256_file

MODEL_ARTIFACT_TYPE = "application/vnd.plnt.model.v1"
FILE_MEDIA_TYPE = "application/octet-stream"
SIGNATURE_MEDIA_TYPE = BUNDLE_MEDIA_TYPE
EMPTY_MEDIA_TYPE = "application/vnd.oci.empty.v1+json"
EMPTY_BLOB = b"{}"
EMPTY_DESCRIPTOR = {"mediaType": EMPTY_MEDIA_TYPE, "digest": "sha256:" + hashlib.sha256(EMPTY_BLOB).hexdigest(),
                    "size": len(EMPTY_BLOB)}
CHUNKED_UPLOAD_ABOVE = 16 << 20  # larger OCI blobs go up in 16 MiB PATCHes, never whole in memory
_S3_MISSING = ("NoSuchKey", "404", "NotFound")


class WeightsNotPublishable(NeedsHuman):
    """A directory that cannot be published as it is: no model.sig, a statement that is not a
    weights manifest, or a file that is missing or differs from what model.sig signs."""


def _check_model_ref(name: str, version: str) -> None:
    if not re.match(NAME_PATTERN, name):
        raise InvalidSpec(f"model name {name!r} does not match {NAME_PATTERN}")
    if not re.match(VERSION_PATTERN, version):
        raise InvalidSpec(f"model version {version!r} does not match {VERSION_PATTERN}")


def _push_hint(name: str, version: str, again: str = "") -> str:
    return f"publish the model{again} (plnt model push DIR --to REGISTRY --name {name} --version {version})"


def _safe_name(where: str, name: str) -> str:
    """`name` if it stays inside the model's directory or prefix, else DownloadRefused."""
    try:
        return canonical_name(name)
    except ManifestError as exc:
        raise DownloadRefused(f"{where}: {exc}; refused") from None


def _not_published(where: str, name: str, version: str, file: str, detail: str = "") -> RecipeNotFound:
    return RecipeNotFound(f"{where}: the signed manifest of model {name}@{version} lists {file}, which is not "
                          f"published there{detail}; {_push_hint(name, version, ' again')}")


def _skip(chunks: Iterator[bytes], count: int) -> Iterator[bytes]:
    """`chunks` without its first `count` bytes (a server that answered a ranged read whole)."""
    for chunk in chunks:
        if count >= len(chunk):
            count -= len(chunk)
            continue
        yield chunk[count:]
        count = 0


# --- file: -----------------------------------------------------------------------------------------


class FileWeightsSource(DirectoryWeightsSource):
    """`<registry dir>/<name>/<version>/`: model.sig and the files at their manifest names."""

    def __init__(self, registry: FileRegistry, name: str, version: str) -> None:
        super().__init__(registry.root / name / version)
        self.registry, self.name, self.version = registry, name, version
        self.entry = registry.root / name / version

    def describe(self) -> str:
        return f"model {self.name}@{self.version} in {self.registry.describe()} ({self.entry})"

    def signature(self) -> bytes | None:
        if not self.entry.is_dir():
            raise RecipeNotFound(f"model {self.name}@{self.version} not found: no directory {self.entry} in "
                                 f"{self.registry.describe()}; {_push_hint(self.name, self.version)}")
        signature = self.entry / SIGNATURE_NAME
        if not _inside(self.entry, self.registry.root) or (signature.exists() and not _inside(signature, self.entry)):
            raise DownloadRefused(f"{self.describe()}: {self.entry} or its {SIGNATURE_NAME} leads out of the registry "
                                  "directory (a link); refused: publish real files there")
        return super().signature()

    def read(self, name: str, offset: int) -> Iterator[bytes]:
        path = self._path(_safe_name(self.describe(), name))  # a link out of the directory: DownloadRefused
        if not path.is_file():
            raise _not_published(self.describe(), self.name, self.version, name, f" (no file {path})")
        return super().read(name, offset)


# --- s3:// -----------------------------------------------------------------------------------------


def _s3_call(registry: S3Registry, call: Callable[[], Any], key: str, what: str, *, push: bool = False) -> Any:
    """`call()` with S3Registry's error mapping; a push turns not-found and auth failures into
    PushRejected, as `S3Registry.push` does."""
    from botocore.exceptions import BotoCoreError, ClientError

    failure: PlntError
    try:
        return call()
    except ClientError as exc:
        code, status = _s3_error_code(exc)
        failure = registry._failure(exc, code, status, what, registry._s3_url(key))
        cause: Exception = exc
    except BotoCoreError as exc:
        failure = registry._transport_failure(exc, f"{'pushing' if push else 'reading'} {registry._s3_url(key)}")
        cause = exc
    if push and isinstance(failure, RecipeNotFound | RegistryAuthFailed):
        failure = PushRejected(str(failure))
    raise failure from cause


class S3WeightsSource:
    """Keys `<prefix>/<name>/<version>/model.sig` and `.../<manifest name>` of an S3 registry."""

    def __init__(self, registry: S3Registry, name: str, version: str) -> None:
        self.registry, self.name, self.version = registry, name, version
        self.prefix = "/".join(p for p in (registry.prefix, name, version) if p)

    def describe(self) -> str:
        return f"model {self.name}@{self.version} in {self.registry.describe()}"

    def key(self, name: str) -> str:
        return f"{self.prefix}/{_safe_name(self.describe(), name)}"

    def _get(self, key: str, offset: int, what: str) -> Any:
        """The GetObject response, None for a missing key or an offset at or past its end."""
        from botocore.exceptions import ClientError

        extra = {"Range": f"bytes={offset}-"} if offset else {}
        try:
            return _s3_call(self.registry, lambda: self.registry._client.get_object(
                Bucket=self.registry.bucket, Key=key, **extra), key, what)
        except (RecipeNotFound, RegistryUnavailable) as exc:
            cause = exc.__cause__
            code = _s3_error_code(cause)[0] if isinstance(cause, ClientError) else ""
            if code in _S3_MISSING or (offset and code == "InvalidRange"):
                return None
            raise

    def _chunks(self, response: Any, key: str, offset: int) -> Iterator[bytes]:
        content_range = str(response.get("ContentRange") or "")
        chunks = self.registry._chunks(response, key)
        if offset and not content_range.startswith(f"bytes {offset}-"):
            chunks = _skip(chunks, offset)  # the whole object, not the range asked for
            expected = response.get("ContentLength")
            expected = expected - offset if isinstance(expected, int) else None
        else:
            expected = response.get("ContentLength")
        got = 0
        for chunk in chunks:
            got += len(chunk)
            yield chunk
        if isinstance(expected, int) and got < expected:
            raise RegistryUnavailable(f"{self.describe()}: transfer of {self.registry._s3_url(key)} broke off after "
                                      f"{got} of {expected} bytes")

    def signature(self) -> bytes | None:
        key = self.key(SIGNATURE_NAME)
        response = self._get(key, 0, f"the signature of model {self.name}@{self.version}")
        if response is None:
            listed = _s3_call(self.registry, lambda: self.registry._client.list_objects_v2(
                Bucket=self.registry.bucket, Prefix=self.prefix + "/", MaxKeys=1), key, f"model {self.name}@{self.version}")
            if not listed.get("KeyCount"):
                raise RecipeNotFound(f"model {self.name}@{self.version} not found: nothing under "
                                     f"{self.registry._s3_url(self.prefix)}/ in {self.registry.describe()}; "
                                     f"{_push_hint(self.name, self.version)}")
            return None  # published unsigned: verification refuses it
        what = f"{self.describe()}: {self.registry._s3_url(key)}"
        length = response.get("ContentLength")
        try:
            check_metadata_size(length if isinstance(length, int) else None, MAX_SIGNATURE_BYTES, what=what)
        except DownloadRefused:
            response["Body"].close()  # nothing of the body is read
            raise
        return read_chunks_bounded(self._chunks(response, key, 0), MAX_SIGNATURE_BYTES, what=what)

    def read(self, name: str, offset: int) -> Iterator[bytes]:
        key = self.key(name)
        response = self._get(key, offset, f"model {self.name}@{self.version} file {name}")
        if response is None:
            if offset:
                return iter(())  # nothing past what the partial holds: its digest decides
            raise _not_published(self.describe(), self.name, self.version, name,
                                 f" (no object {self.registry._s3_url(key)})")
        return self._chunks(response, key, offset)


# --- oci:// ----------------------------------------------------------------------------------------


class OciWeightsSource:
    """The OCI artifact `<repo>/<name>:<oci_tag(version)>` of artifactType MODEL_ARTIFACT_TYPE."""

    def __init__(self, registry: OciRegistry, name: str, version: str) -> None:
        self.registry, self.name, self.version = registry, name, version
        self.reference = registry.reference(name, version)
        self._files: dict[str, _Layer] | None = None
        self._signature: _Layer | None = None

    def describe(self) -> str:
        return f"model {self.name}@{self.version} ({self.reference}) in {self.registry.describe()}"

    def _layers(self) -> dict[str, _Layer]:
        if self._files is not None:
            return self._files
        self.registry.client.auth.load_configs(self.registry._container(self.name, self.version))
        try:
            manifest = self.registry._manifest(self.name, self.version, self.reference)
        except RecipeNotFound as exc:  # worded for recipes by OciRegistry: "recipe N@V (REF) not found in ..."
            detail = str(exc).removeprefix(f"recipe {self.name}@{self.version} ({self.reference}) not found in ")
            raise RecipeNotFound(f"model {self.name}@{self.version} not found: no manifest {self.reference} in {detail}; "
                                 f"{_push_hint(self.name, self.version)}") from exc
        if manifest.get("artifactType") != MODEL_ARTIFACT_TYPE:
            raise InvalidRecipe(f"{self.reference} is not a plnt model: its artifactType is "
                                f"{manifest.get('artifactType')!r}, not {MODEL_ARTIFACT_TYPE!r}")
        layers = manifest.get("layers")
        if not isinstance(layers, list):
            raise InvalidRecipe(f"{self.reference}: the manifest has no layers list")
        files: dict[str, _Layer] = {}
        for layer in layers:
            if not isinstance(layer, dict) or layer.get("mediaType") not in (FILE_MEDIA_TYPE, SIGNATURE_MEDIA_TYPE):
                continue
            title = (layer.get("annotations") or {}).get(TITLE_ANNOTATION)
            digest, size = layer.get("digest"), layer.get("size")
            if not isinstance(title, str) or not isinstance(digest, str) or not _SHA256_DIGEST.match(digest) \
                    or not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise InvalidRecipe(f"{self.reference}: a {layer.get('mediaType')} layer needs a {TITLE_ANNOTATION} "
                                    f"annotation, a sha256 digest and a size (got {title!r}, {digest!r}, {size!r})")
            found = _Layer(layer["mediaType"], digest, size)
            if found.media_type == SIGNATURE_MEDIA_TYPE and title == SIGNATURE_NAME:
                if self._signature is not None:
                    raise InvalidRecipe(f"{self.reference}: two {SIGNATURE_NAME} layers")
                self._signature = found
            elif found.media_type == FILE_MEDIA_TYPE:
                if title in files:
                    raise InvalidRecipe(f"{self.reference}: two layers titled {title!r}")
                files[title] = found
        self._files = files
        return files

    def _blob(self, layer: _Layer, offset: int, what: str) -> Iterator[bytes]:
        url = self.registry._url(f"{self.registry._repo_path(self.name)}/blobs/{layer.digest}")
        headers = {"Range": f"bytes={offset}-"} if offset else {}
        response = self.registry._request("GET", url, doing=f"getting {what}", headers=headers, stream=True)
        status = response.status_code
        if offset and status == 416:
            response.close()
            return iter(())  # nothing past what the partial holds: its digest decides
        if status not in (200, 206):
            failure = self.registry._status_failure(response, what)
            response.close()
            raise failure
        skip = 0
        if offset and status == 206:
            content_range = response.headers.get("Content-Range", "")
            if not content_range.startswith(f"bytes {offset}-"):
                response.close()
                raise RegistryUnavailable(f"{self.describe()}: asked for {what} from byte {offset}, the registry "
                                          f"answered 206 with Content-Range {content_range!r}")
        elif offset:
            skip = offset  # 200: the registry ignored Range and sends the whole blob
        return self._chunks(response, what, skip, layer.size - offset)

    def _chunks(self, response: Any, what: str, skip: int, expected: int) -> Iterator[bytes]:
        got = 0
        with response:
            try:
                for chunk in _skip(response.iter_content(CHUNK_SIZE), skip):
                    chunk = chunk[:expected - got]  # never more than the manifest announces
                    got += len(chunk)
                    if chunk:
                        yield chunk
                    if got >= expected:
                        break
            except (OSError, http.client.HTTPException, _requests_errors()) as exc:
                raise RegistryUnavailable(f"{self.describe()}: transfer of {what} broke off: {exc}") from exc
        if got < expected:
            raise RegistryUnavailable(f"{self.describe()}: transfer of {what} broke off after {got} of {expected} bytes")

    def signature(self) -> bytes | None:
        self._layers()
        layer = self._signature
        if layer is None:
            return None  # published unsigned: verification refuses it
        what = f"{SIGNATURE_NAME} ({layer.digest}) of {self.reference}"
        check_metadata_size(layer.size, MAX_SIGNATURE_BYTES, what=what)
        body = read_chunks_bounded(self._blob(layer, 0, what), MAX_SIGNATURE_BYTES, what=what)
        actual = "sha256:" + hashlib.sha256(body).hexdigest()
        if actual != layer.digest:
            raise DigestMismatch(f"{what}: the manifest announces {layer.digest}, the registry served bytes hashing "
                                 f"to {actual}")
        return body

    def read(self, name: str, offset: int) -> Iterator[bytes]:
        _safe_name(self.describe(), name)
        layer = self._layers().get(name)
        if layer is None:
            raise _not_published(self.describe(), self.name, self.version, name,
                                 f" (no {FILE_MEDIA_TYPE} layer titled {name!r})")
        if offset >= layer.size:
            return iter(())
        return self._blob(layer, offset, f"{name} ({layer.digest}) of {self.reference}")


# --- opening and publishing ------------------------------------------------------------------------


def open_weights_source(registry_url: str, name: str, version: str, options: RegistryOptions = RegistryOptions(),
                        *, base_dir: Path | None = None) -> WeightsSource:
    """The published weights of model NAME@VERSION at a registry URL (file:, s3://, oci://). Raises
    InvalidSpec for a URL or name that cannot be used; connects to nothing until read."""
    _check_model_ref(name, version)
    registry = open_registry(registry_url, options, base_dir=base_dir)
    if isinstance(registry, FileRegistry):
        return FileWeightsSource(registry, name, version)
    if isinstance(registry, S3Registry):
        return S3WeightsSource(registry, name, version)
    assert isinstance(registry, OciRegistry)
    return OciWeightsSource(registry, name, version)


def signed_manifest(directory: Path, name: str) -> tuple[bytes, WeightsManifest]:
    """`directory/model.sig` and the manifest its DSSE payload holds, read WITHOUT verifying the
    signature (publishing is the author's act; every pull verifies), and every file it lists checked
    in `directory`: present, a regular file inside it, with the signed digest."""
    signature = directory / SIGNATURE_NAME
    if not signature.is_file():
        raise WeightsNotPublishable(f"{directory}: no {SIGNATURE_NAME}; sign the statement `plnt model manifest "
                                    f"{directory} --name {name}` prints (an OMS model signature) and save the bundle "
                                    f"as {signature}")
    bundle = read_bounded(signature, MAX_SIGNATURE_BYTES, what=f"the signature of model {name}")
    payload = _parse_bundle(f"model {name}", bundle, dsse=True).dsse_payload
    assert payload is not None
    try:
        manifest = parse_statement(payload)
    except ManifestError as exc:
        raise WeightsNotPublishable(f"{signature}: {exc}") from exc
    for item in manifest.files:
        path = directory / item.name
        if not path.is_file() or path.is_symlink() or not _inside(path, directory):
            raise WeightsNotPublishable(f"{signature} signs {item.name}, which is not a regular file in {directory}")
        actual = sha256_file(path)
        if actual != item.sha256:
            raise WeightsNotPublishable(f"{path} has sha256 {actual}; {signature} signs {item.sha256}: restore the "
                                        f"signed file, or sign the directory again (plnt model manifest)")
    return bundle, manifest


def publish_weights(directory: Path, registry_url: str, name: str, version: str,
                    options: RegistryOptions = RegistryOptions(), *, base_dir: Path | None = None) -> str:
    """Push `directory/model.sig` and every file its signed manifest lists (nothing else) as model
    NAME@VERSION; model.sig goes last, so a reader that sees it sees every file. Returns where it went."""
    _check_model_ref(name, version)
    bundle, manifest = signed_manifest(directory, name)
    registry = open_registry(registry_url, options, base_dir=base_dir)
    if isinstance(registry, FileRegistry):
        return _publish_file(registry, directory, name, version, manifest)
    if isinstance(registry, S3Registry):
        return _publish_s3(registry, directory, name, version, manifest)
    assert isinstance(registry, OciRegistry)
    return _publish_oci(registry, directory, name, version, manifest, bundle)


def _publish_file(registry: FileRegistry, directory: Path, name: str, version: str, manifest: WeightsManifest) -> str:
    entry = registry.root / name / version
    for item in [*manifest.files, None]:
        relative = item.name if item else SIGNATURE_NAME
        target = entry / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        _copy_atomically(directory / relative, target)
    return str(entry)


def _publish_s3(registry: S3Registry, directory: Path, name: str, version: str, manifest: WeightsManifest) -> str:
    source = S3WeightsSource(registry, name, version)
    for item in [*manifest.files, None]:
        relative = item.name if item else SIGNATURE_NAME
        key = source.key(relative)
        content_type = "application/json" if item is None else FILE_MEDIA_TYPE
        _s3_call(registry, lambda k=key, r=relative, c=content_type: registry._put(k, directory / r, c), key,
                 f"push of model {name}@{version} file {relative}", push=True)
    return registry._s3_url(source.prefix + "/")


def _publish_oci(registry: OciRegistry, directory: Path, name: str, version: str, manifest: WeightsManifest,
                 bundle: bytes) -> str:
    reference = registry.reference(name, version)
    container = registry._container(name, version)
    registry.client.auth.load_configs(container)

    def layer(media_type: str, digest: str, size: int, title: str) -> dict:
        return {"mediaType": media_type, "digest": digest, "size": size, "annotations": {TITLE_ANNOTATION: title}}

    with tempfile.TemporaryDirectory(prefix="plnt-oci-model-") as scratch:
        config = Path(scratch) / "config.json"
        config.write_bytes(EMPTY_BLOB)
        blobs = [(config, dict(EMPTY_DESCRIPTOR), "config")]
        for item in manifest.files:  # digests checked against the files by signed_manifest
            path = directory / item.name
            blobs.append((path, layer(FILE_MEDIA_TYPE, "sha256:" + item.sha256, path.stat().st_size, item.name), item.name))
        signature = Path(scratch) / SIGNATURE_NAME
        signature.write_bytes(bundle)
        blobs.append((signature, layer(SIGNATURE_MEDIA_TYPE, "sha256:" + hashlib.sha256(bundle).hexdigest(), len(bundle),
                                       SIGNATURE_NAME), SIGNATURE_NAME))
        for path, descriptor, title in blobs:
            what = f"blob {title} ({descriptor['digest']}) of {reference}"
            chunked = descriptor["size"] > CHUNKED_UPLOAD_ABOVE
            response = registry._push_call(
                lambda p=path, d=descriptor, c=chunked: registry.client.upload_blob(str(p), container, d, do_chunked=c),
                f"uploading {what}")
            registry._check_pushed(response, f"upload of {what}")
    document = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST_MEDIA_TYPE,
        "artifactType": MODEL_ARTIFACT_TYPE,
        "config": EMPTY_DESCRIPTOR,
        "layers": [descriptor for _, descriptor, _ in blobs[1:]],
        "annotations": {"dev.plnt.model.name": name, "dev.plnt.model.version": version,
                        "dev.plnt.model.root-digest": manifest.root_digest},
    }
    body = json.dumps(document, separators=(",", ":")).encode()
    digest = "sha256:" + hashlib.sha256(body).hexdigest()
    url = registry._url(f"{registry._repo_path(name)}/manifests/{oci_tag(version)}")
    response = registry._push_call(
        lambda: registry.client.do_request(url, "PUT", data=body, headers={"Content-Type": OCI_MANIFEST_MEDIA_TYPE}),
        f"putting the manifest of {reference}")
    registry._check_pushed(response, f"manifest of {reference}")
    stored = response.headers.get("Docker-Content-Digest")
    if stored and stored != digest:
        raise DigestMismatch(f"{reference}: pushed manifest {digest}, the registry stored {stored}")
    return f"{reference}@{digest}"

