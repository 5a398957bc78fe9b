"""Model weights on disk: a content-addressed store that canary and stable share, filled by pulls
that hash every byte as it arrives, resume where a cut-off transfer stopped, and trust nothing
until its digest matches the signed manifest.

Layout under the store's root (the state directory's `weights/`):

    blobs/<sha256 hex>            one file per distinct content, read-only once complete
    partial/<sha256 hex>          a transfer under way or cut off (resumed from its length)
    models/<root digest hex>/     one model: its files as hard links to the blobs, by their manifest
                                  names, beside `model.sig` (the signed manifest as published)

A pull: read the signature bundle, verify it (trust.verify_weights_signature: the signed manifest,
the spec's pin), then fetch only the files whose blob is missing, each into `partial/` (resumed
from its length with a ranged read, the bytes already there hashed again first), checked against
its digest before it becomes a blob. The model directory is assembled last, in a temporary
directory renamed into place, and checked file by file against the manifest: a runtime is only
ever given a complete, verified `models/<root>/`. A second pull of the same weights (canary and
stable, or a re-install) transfers nothing.

The disk budget counts blobs and partials; a transfer that would pass it stops (DownloadRefused).
`collect(keep)` removes models not in `keep`, then every blob no model links to and every partial:
what a model no release references held.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from plnt.reconciler.errors import DigestMismatch, DownloadRefused, RecipeNotFound, RegistryUnavailable
from plnt.reconciler.recipes.registries import MAX_SIGNATURE_BYTES, read_bounded
from plnt.reconciler.recipes.trust import VerifiedWeights
from plnt.reconciler.recipes.weights_manifest import ManifestError, WeightsManifest, canonical_name, check_directory, sha256_file

log = logging.getLogger(__name__)

SIGNATURE_NAME = "model.sig"
CHUNK_SIZE = 1 << 20

Progress = Callable[[int], None]  # bytes transferred so far, this pull


class WeightsSource(Protocol):
    """Where published weights are: the signature bundle and each file, read from an offset."""

    def describe(self) -> str: ...

    def signature(self) -> bytes | None: ...

    def read(self, name: str, offset: int) -> Iterator[bytes]: ...


class DirectoryWeightsSource:
    """Weights published as a directory: `<dir>/model.sig` and the files at their manifest names.
    (The registries' `file:` scheme resolves the directory and its allowed roots.)"""

    def __init__(self, root: Path) -> None:
        self._root = root

    def describe(self) -> str:
        return f"file:{self._root}"

    def _path(self, name: str) -> Path:
        path = self._root / canonical_name(name)
        resolved = path.resolve()
        if not resolved.is_relative_to(self._root.resolve()):
            raise DownloadRefused(f"{self.describe()}: {name} leads outside the weights directory")
        return path

    def signature(self) -> bytes | None:
        path = self._root / SIGNATURE_NAME
        if not path.is_file():
            return None
        try:
            return read_bounded(path, MAX_SIGNATURE_BYTES, what=f"{self.describe()}: {SIGNATURE_NAME}")
        except FileNotFoundError:
            return None  # removed meanwhile: unsigned, as if never there

    def read(self, name: str, offset: int) -> Iterator[bytes]:
        path = self._path(name)
        try:
            handle = open(path, "rb")  # noqa: SIM115 - closed by the generator
        except FileNotFoundError:
            raise RecipeNotFound(f"{self.describe()}: the signed manifest lists {name}, which is not published") from None
        except OSError as exc:
            raise RegistryUnavailable(f"{self.describe()}: cannot read {name}: {exc}") from exc
        with handle:
            handle.seek(offset)
            while chunk := handle.read(CHUNK_SIZE):
                yield chunk


@dataclass(frozen=True)
class PulledWeights:
    directory: Path  # models/<root hex>: give this to the runtime
    root_digest: str  # sha256:<hex>
    signer: str
    transferred_bytes: int  # 0 when every blob was in the store already
    resumed_bytes: int  # bytes of cut-off transfers that were not fetched again


class WeightsStore:
    def __init__(self, root: Path, *, budget_bytes: int) -> None:
        self.root = root
        self.budget_bytes = budget_bytes
        self._blobs, self._partial, self._models = root / "blobs", root / "partial", root / "models"
        for directory in (self._blobs, self._partial, self._models):
            directory.mkdir(parents=True, exist_ok=True)

    def model_dir(self, root_digest: str) -> Path:
        return self._models / root_digest.removeprefix("sha256:")

    def holds_anything(self) -> bool:
        """Whether a model, blob or partial transfer is in the store (else there is nothing to collect)."""
        for directory in (self._models, self._blobs, self._partial):
            with os.scandir(directory) as entries:
                if any(entries):
                    return True
        return False

    def used_bytes(self) -> int:
        return sum(entry.stat().st_size for directory in (self._blobs, self._partial) for entry in os.scandir(directory))

    def pull(self, source: WeightsSource, verify: Callable[[bytes | None], VerifiedWeights], *,
             progress: Progress | None = None) -> PulledWeights:
        """`verify` checks the signature bundle (trust.verify_weights_signature with the spec's
        policies and pin) and returns the signed manifest; nothing is fetched before it accepts."""
        bundle = source.signature()
        verified = verify(bundle)
        assert bundle is not None  # verify refuses an unsigned model
        manifest = verified.manifest
        target = self.model_dir(manifest.root_digest)
        signer = f"{verified.signature.identity} ({verified.signature.issuer})"
        if target.is_dir():
            try:
                check_directory(target, manifest, ignore=(SIGNATURE_NAME,))
                return PulledWeights(target, manifest.root_digest, signer, 0, 0)
            except ManifestError:
                shutil.rmtree(target)  # changed on disk since: assembled again from checked blobs
        transferred, resumed = 0, 0
        checked: set[str] = set()  # blobs hashed by this pull: fetched (hashed as they streamed) or kept
        for item in manifest.files:
            if item.sha256 in checked:
                continue
            blob = self._blobs / item.sha256
            if blob.is_file():
                # An earlier pull's blob is hashed again: it may have changed on disk since.
                if sha256_file(blob) == item.sha256:
                    checked.add(item.sha256)
                    continue
                log.warning("weights-blob-changed blob=%s file=%s: fetched again", item.sha256, item.name)
                blob.unlink()
            got, kept = self._fetch_blob(source, item.name, item.sha256, transferred, progress)
            transferred, resumed = transferred + got, resumed + kept
            checked.add(item.sha256)
        self._assemble(manifest, bundle, target, checked)
        return PulledWeights(target, manifest.root_digest, signer, transferred, resumed)

    def _fetch_blob(self, source: WeightsSource, name: str, sha256: str, transferred: int,
                    progress: Progress | None) -> tuple[int, int]:
        """Into blobs/<sha256>, resuming partial/<sha256>; returns (bytes fetched, bytes kept)."""
        partial = self._partial / sha256
        digest = hashlib.sha256()
        kept = 0
        if partial.exists():
            with open(partial, "rb") as handle:  # hashed again: what a cut-off transfer left is not trusted
                while chunk := handle.read(CHUNK_SIZE):
                    digest.update(chunk)
                    kept += len(chunk)
        fetched = 0
        budget_left = self.budget_bytes - self.used_bytes()
        with open(partial, "ab") as out:
            for chunk in source.read(name, kept):
                fetched += len(chunk)
                if fetched > budget_left:
                    out.close()
                    partial.unlink(missing_ok=True)
                    raise DownloadRefused(f"{source.describe()}: {name} passes the weights disk budget of "
                                          f"{self.budget_bytes} bytes ({self.root}); raise --weights-budget, or "
                                          "remove models nothing uses")
                digest.update(chunk)
                out.write(chunk)
                if progress is not None:
                    progress(transferred + fetched)
            out.flush()
            os.fsync(out.fileno())
        if digest.hexdigest() != sha256:
            partial.unlink(missing_ok=True)  # never resumed: its bytes are not the signed ones
            raise DigestMismatch(f"{source.describe()}: {name} has sha256 {digest.hexdigest()}; the signed manifest "
                                 f"says {sha256}: the published file is not the one that was signed")
        partial.chmod(0o444)
        os.replace(partial, self._blobs / sha256)
        return fetched, kept

    def _assemble(self, manifest: WeightsManifest, bundle: bytes, target: Path, checked: set[str]) -> None:
        staging = Path(tempfile.mkdtemp(prefix=".assembling-", dir=self._models))
        try:
            for item in manifest.files:
                path = staging / item.name
                path.parent.mkdir(parents=True, exist_ok=True)
                os.link(self._blobs / item.sha256, path)
            (staging / SIGNATURE_NAME).write_bytes(bundle)
            # The links, by name, as signed. Every blob was hashed by this pull: a link to that very
            # inode is not read again (hashing twice halved the pull's speed).
            digests = {item.name: item.sha256 for item in manifest.files}

            def hashed(name: str, path: Path) -> bool:
                return digests[name] in checked and os.path.samefile(path, self._blobs / digests[name])

            check_directory(staging, manifest, ignore=(SIGNATURE_NAME,), hashed=hashed)
            try:
                os.rename(staging, target)
            except OSError:
                if not target.is_dir():  # another pull assembled it meanwhile: the same checked files
                    raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def collect(self, keep: set[str]) -> list[str]:
        """Removes models whose root digest is not in `keep`, then blobs no model links to and
        partial transfers; returns the root digests removed. Not while a pull runs (the caller
        holds the lock its pulls take)."""
        kept = {digest.removeprefix("sha256:") for digest in keep}
        removed = []
        for entry in os.scandir(self._models):
            if entry.name not in kept:
                shutil.rmtree(entry.path, ignore_errors=True)
                if not entry.name.startswith("."):
                    removed.append(f"sha256:{entry.name}")
        for entry in os.scandir(self._blobs):
            if entry.stat().st_nlink <= 1:  # only the store's own name: no model links to it
                os.unlink(entry.path)
        for entry in os.scandir(self._partial):
            os.unlink(entry.path)
        return removed

