"""The trust files of the fetch commands (`plnt recipe fetch`, `plnt model fetch`): a --policy file
of RecipeTrustPolicy documents, and the trusted root its trustedRootFile names."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from plnt.reconciler.cli.common import fail

if TYPE_CHECKING:
    from plnt.core.specs.loader import SpecSet


def load_trust_policies(policy: Path) -> SpecSet:
    """The specs of a --policy file holding one or more RecipeTrustPolicy documents; exit 2 when it
    cannot be read, is invalid, or holds no policy."""
    from plnt.core.specs.loader import SourceFile, load_sources

    try:
        text = policy.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise fail(f"--policy {policy}: {exc}", 2) from exc
    specs, problems = load_sources([SourceFile(str(policy), text)], check_references=False)
    if problems:
        raise fail("\n".join(str(p) for p in problems), 2)
    if not specs.trust_policies:
        raise fail(f"--policy {policy}: no RecipeTrustPolicy in it", 2)
    return specs


def trust_root_reader(policy: Path, trust_root: Path | None) -> Callable[[str], bytes]:
    """Reads a policy's trustedRootFile: --trust-root when given, else that path relative to the
    policy file's directory, then to the current directory."""
    from plnt.reconciler.recipes.registries import MAX_TRUSTED_ROOT_BYTES, read_bounded

    def read(path: str) -> bytes:
        if trust_root is not None:
            return read_bounded(trust_root, MAX_TRUSTED_ROOT_BYTES, what="--trust-root")
        for candidate in (policy.parent / path, Path(path)):
            if candidate.is_file():
                return read_bounded(candidate, MAX_TRUSTED_ROOT_BYTES, what=f"trustedRootFile {path}")
        raise FileNotFoundError(f"{path} (relative to {policy.parent} or the current directory); pass --trust-root FILE")

    return read
