"""A model's weights manifest, in the OpenSSF model-signing (OMS) format, v1.0.

A model is a directory of files. Its publisher signs a manifest of them: an in-toto Statement v1
whose predicate lists every file with its SHA-256 (`resources`, sorted by name) and whose single
subject carries the root digest (SHA-256 over the resources' digests, as raw bytes, in order).
The statement travels as the DSSE payload of a Sigstore bundle; `trust.verify_weights_signature`
checks that signature. This module is the format only: building a statement, reading one
strictly, and checking a directory of weights against it. No I/O beyond reading the files.

Stricter than the format requires, where plnt gains from it: only the `files` serialization with
SHA-256 and no symlinks; names canonical (relative, `/`-separated, no `.` or `..`, no empty
component), unique and sorted; the subject's root digest must be the one the resources give (an
inconsistent statement is refused, not trusted for either half). The root digest is what a
ModelDeployment pins (`sha256:<hex>`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://model_signing/signature/v1.0"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
# Never part of a model (OMS default exclusions, matched as top-level components).
DEFAULT_IGNORED = frozenset({".git", ".gitignore", ".gitattributes", ".github"})
MAX_FILES = 10_000
MAX_STATEMENT_BYTES = 4 << 20
HASH_CHUNK = 1 << 20
_HEX64 = re.compile(r"[0-9a-f]{64}")


class ManifestError(ValueError):
    """A statement that is not a usable OMS v1.0 manifest, or weights that do not match one.
    `reason` names the check: invalid-manifest, missing-file, extra-file, digest-mismatch,
    pin-mismatch, unsafe-path."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class WeightsFile:
    name: str  # relative, "/"-separated
    sha256: str  # lowercase hex


@dataclass(frozen=True)
class WeightsManifest:
    model: str  # subject name: informational only (OMS)
    files: tuple[WeightsFile, ...]  # sorted by name

    @property
    def root_digest(self) -> str:
        """`sha256:<hex>`: what a ModelDeployment pins."""
        return "sha256:" + root_digest_of(self.files)

    def statement(self) -> bytes:
        """The in-toto statement to sign (the DSSE payload)."""
        return json.dumps({
            "_type": STATEMENT_TYPE,
            "subject": [{"name": self.model, "digest": {"sha256": root_digest_of(self.files)}}],
            "predicateType": PREDICATE_TYPE,
            "predicate": {
                "serialization": {"method": "files", "hash_type": "sha256", "allow_symlinks": False,
                                  "ignore_paths": sorted(DEFAULT_IGNORED)},
                "resources": [{"name": f.name, "algorithm": "sha256", "digest": f.sha256} for f in self.files],
            },
        }, indent=2).encode()


def root_digest_of(files: Iterable[WeightsFile]) -> str:
    digest = hashlib.sha256()
    for item in sorted(files, key=lambda f: f.name):
        digest.update(bytes.fromhex(item.sha256))
    return digest.hexdigest()


def canonical_name(name: str) -> str:
    """`name` if it is a canonical relative path, else ManifestError(unsafe-path)."""
    parts = name.split("/")
    if (not name or name.startswith("/") or "\\" in name or "\x00" in name
            or any(part in ("", ".", "..") for part in parts)):
        raise ManifestError(f"file name {name!r} in the manifest is not a relative path inside the model "
                            "(no leading /, no . or .. components, no empty components)", "unsafe-path")
    return name


def parse_statement(payload: bytes) -> WeightsManifest:
    """The manifest a signed OMS v1.0 statement holds; ManifestError(invalid-manifest) otherwise."""

    def invalid(detail: str) -> ManifestError:
        return ManifestError(f"the weights manifest is not an OMS v1.0 in-toto statement: {detail}", "invalid-manifest")

    if len(payload) > MAX_STATEMENT_BYTES:
        raise invalid(f"{len(payload)} bytes, more than {MAX_STATEMENT_BYTES}")
    try:
        statement = json.loads(payload, object_pairs_hook=_no_duplicate_keys)
    except ValueError as exc:
        raise invalid(f"not JSON ({exc})") from None
    if not isinstance(statement, dict):
        raise invalid("not a JSON object")
    if statement.get("_type") != STATEMENT_TYPE:
        raise invalid(f"_type is {statement.get('_type')!r}, not {STATEMENT_TYPE!r}")
    if statement.get("predicateType") != PREDICATE_TYPE:
        raise invalid(f"predicateType is {statement.get('predicateType')!r}, not {PREDICATE_TYPE!r}")
    subjects = statement.get("subject")
    if not isinstance(subjects, list) or len(subjects) != 1 or not isinstance(subjects[0], dict):
        raise invalid("subject must hold exactly one entry: the model and its root digest")
    model, root = subjects[0].get("name"), (subjects[0].get("digest") or {}).get("sha256")
    if not isinstance(model, str) or not model:
        raise invalid("subject[0].name must be a non-empty string")
    if not isinstance(root, str) or not _HEX64.fullmatch(root):
        raise invalid("subject[0].digest.sha256 must be 64 lowercase hex digits")
    predicate = statement.get("predicate")
    if not isinstance(predicate, dict):
        raise invalid("predicate must be an object")
    serialization = predicate.get("serialization")
    if not isinstance(serialization, dict) or serialization.get("method") != "files" \
            or serialization.get("hash_type") != "sha256" or serialization.get("allow_symlinks") is not False:
        raise invalid("predicate.serialization must be method \"files\", hash_type \"sha256\", allow_symlinks false "
                      "(the only serialization plnt accepts)")
    resources = predicate.get("resources")
    if not isinstance(resources, list) or not resources:
        raise invalid("predicate.resources must list at least one file")
    if len(resources) > MAX_FILES:
        raise invalid(f"{len(resources)} files, more than {MAX_FILES}")
    files = []
    for index, resource in enumerate(resources):
        if not isinstance(resource, dict) or resource.get("algorithm") != "sha256":
            raise invalid(f"predicate.resources[{index}] must be an object with algorithm \"sha256\"")
        name, digest = resource.get("name"), resource.get("digest")
        if not isinstance(name, str) or not isinstance(digest, str) or not _HEX64.fullmatch(digest):
            raise invalid(f"predicate.resources[{index}] needs a name and a digest of 64 lowercase hex digits")
        files.append(WeightsFile(canonical_name(name), digest))
    names = [f.name for f in files]
    if len(set(names)) != len(names):
        raise invalid("a file is listed twice in predicate.resources")
    if names != sorted(names):
        raise invalid("predicate.resources must be sorted by name")
    if root_digest_of(files) != root:
        raise invalid("subject[0].digest.sha256 is not the root digest of predicate.resources "
                      "(sha256 over the listed digests, in order): the statement contradicts itself")
    return WeightsManifest(model=model, files=tuple(files))


def check_pin(manifest: WeightsManifest, pin: str | None) -> None:
    if pin is not None and manifest.root_digest != pin:
        raise ManifestError(f"the signed weights manifest has root digest {manifest.root_digest}; the spec pins "
                            f"{pin}: publish the pinned weights, or pin {manifest.root_digest} if that is the model "
                            "you meant", "pin-mismatch")


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def model_files(root: Path, ignore: Iterable[str] = ()) -> Iterator[tuple[str, Path]]:
    """(name, path) of each regular file under `root`, by name, leaving out the OMS default
    exclusions and `ignore` (top-level names, e.g. the signature file); ManifestError(unsafe-path)
    on a symlink or anything that is neither a file nor a directory (the manifest lists files only)."""
    ignored = DEFAULT_IGNORED | set(ignore)
    found: list[tuple[str, Path]] = []
    for directory, subdirs, names in os.walk(root, followlinks=False):
        relative = Path(directory).relative_to(root)
        if relative == Path("."):
            subdirs[:] = [d for d in subdirs if d not in ignored]
            names = [n for n in names if n not in ignored]
        for name in [*names, *subdirs]:
            path = Path(directory) / name
            mode = os.lstat(path).st_mode
            label = (relative / name).as_posix()
            if stat.S_ISLNK(mode) or not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                raise ManifestError(f"{label} in the model is not a regular file (a symlink, device or FIFO): "
                                    "the weights are files only", "unsafe-path")
            if stat.S_ISREG(mode):
                found.append((label, path))
    yield from sorted(found)


def manifest_of_directory(root: Path, model: str | None = None, ignore: Iterable[str] = ()) -> WeightsManifest:
    """The manifest of the weights in `root` (what a publisher signs)."""
    files = tuple(WeightsFile(name, sha256_file(path)) for name, path in model_files(root, ignore))
    if not files:
        raise ManifestError(f"{root} holds no file: a model is at least one file", "invalid-manifest")
    return WeightsManifest(model=model or root.name, files=files)


def check_directory(root: Path, manifest: WeightsManifest, ignore: Iterable[str] = (),
                    hashed: Callable[[str, Path], bool] = lambda name, path: False) -> None:
    """Every file the manifest lists is in `root` with its digest, and nothing else is.
    `hashed(name, path)`: True when that file's digest is known already (the store's blob it links
    to was hashed as it streamed, moments ago): it is not read again."""
    present = dict(model_files(root, ignore))
    listed = {f.name: f.sha256 for f in manifest.files}
    missing = sorted(set(listed) - set(present))
    if missing:
        raise ManifestError(f"weights file {missing[0]} is listed in the signed manifest but missing"
                            + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""), "missing-file")
    extra = sorted(set(present) - set(listed))
    if extra:
        raise ManifestError(f"weights file {extra[0]} is not in the signed manifest"
                            + (f" (and {len(extra) - 1} more)" if len(extra) > 1 else "")
                            + ": only signed files may reach a runtime", "extra-file")
    for name, expected in listed.items():
        if hashed(name, present[name]):
            continue
        actual = sha256_file(present[name])
        if actual != expected:
            raise ManifestError(f"weights file {name} has sha256 {actual}; the signed manifest says {expected}",
                                "digest-mismatch")


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [key for key, _ in pairs]
    if len(set(keys)) != len(keys):
        raise ValueError("a key appears twice in one object")
    return dict(pairs)
