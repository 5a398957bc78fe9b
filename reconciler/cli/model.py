"""`plnt model`: a model's signed weights, from the author's directory to a pod's model directory.

    plnt model manifest DIR --name NAME         the in-toto statement to sign (stdout), its root digest (stderr)
    plnt model push DIR --to REGISTRY --name NAME --version VERSION
                                                DIR/model.sig and every file it signs, to file:, s3:// or oci://
    plnt model fetch --registry URL --name NAME --version VERSION --root-digest sha256:HEX
                     --policy POLICY.yaml --into DIR
                                                what a model pod's init container runs: verify, pull, place

Exit codes: 0 done; 1 the weights cannot be trusted, fetched or published (the reason on stderr);
2 bad options. Logic in recipes/weights.py and recipes/weights_sources.py; this is options, exit codes and output.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from plnt.reconciler.cli.common import fail, failure_of
from plnt.reconciler.cli.lazy import command_app
from plnt.reconciler.cli.options import OperatorRegistryOptions, RegistryUrl, TrustRoot, with_option_groups
from plnt.reconciler.cli.trust_files import load_trust_policies, trust_root_reader

if TYPE_CHECKING:
    from plnt.reconciler.recipes.weights_manifest import WeightsManifest

app = command_app(help="Model weights: manifest (what to sign), push, and fetch (for model pods).",
                  no_args_is_help=True)

ROOT_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
DEFAULT_STORE = ".store"  # under --into, unless --store is given


class TransferProgress:
    """A `progress` callback for WeightsStore.pull: prints bytes so far and the rate to stderr, at
    most once every `every_s` seconds (a pull that needs less prints nothing until `done`)."""

    def __init__(self, echo: Callable[[str], None] | None = None, *, clock: Callable[[], float] = time.monotonic,
                 every_s: float = 1.0) -> None:
        self._echo = echo or (lambda line: typer.echo(line, err=True))
        self._clock = clock
        self._every_s = every_s
        self._started = clock()
        self._last = self._started
        self.transferred = 0
        self.lines = 0

    def __call__(self, transferred: int) -> None:
        self.transferred = transferred
        now = self._clock()
        if now - self._last >= self._every_s:
            self._last = now
            self._print(now, "")

    def done(self) -> None:
        if self.lines:  # a long transfer: its last figures
            self._print(self._clock(), ", done")

    def _print(self, now: float, suffix: str) -> None:
        elapsed = max(now - self._started, 1e-9)
        self._echo(f"{self.transferred / 2**20:.1f} MiB fetched, {self.transferred / elapsed / 1e6:.1f} MB/s{suffix}")
        self.lines += 1


@app.command("manifest")
def model_manifest(
    directory: Annotated[Path, typer.Argument(help="The model's files (model.sig in it is left out).")],
    name: Annotated[str, typer.Option(help="The model's name (the statement's subject).")],
) -> None:
    """Print the statement to sign for DIR's files (stdout) and its root digest (stderr).

    The statement is an OMS v1.0 in-toto statement: sign it as a DSSE attestation and save the
    Sigstore bundle as DIR/model.sig. The root digest is what a model deployment pins."""
    from plnt.reconciler.recipes.weights import SIGNATURE_NAME
    from plnt.reconciler.recipes.weights_manifest import ManifestError, manifest_of_directory

    if not directory.is_dir():
        raise fail(f"{directory}: no such directory", 2)
    try:
        manifest = manifest_of_directory(directory, name, ignore=(SIGNATURE_NAME,))
    except (ManifestError, OSError) as exc:
        raise fail(f"{directory}: {exc}", 1) from exc
    sys.stdout.buffer.write(manifest.statement() + b"\n")
    sys.stdout.flush()
    typer.echo(f"root digest {manifest.root_digest} ({len(manifest.files)} files)", err=True)


@app.command("push")
@with_option_groups
def model_push(
    *,
    directory: Annotated[Path, typer.Argument(help="The model's files and model.sig (the signed statement).")],
    to: Annotated[str, typer.Option("--to", help="s3://bucket/prefix, oci://host[:port]/repo or file:///dir")],
    name: Annotated[str, typer.Option(help="Model name.")],
    version: Annotated[str, typer.Option(help="Model version.")],
    access: OperatorRegistryOptions,
) -> None:
    """Publish DIR/model.sig and every file it signs (nothing else in DIR) as NAME@VERSION."""
    from plnt.reconciler.errors import InvalidSpec, PlntError
    from plnt.reconciler.recipes.weights import SIGNATURE_NAME
    from plnt.reconciler.recipes.weights_sources import publish_weights

    if not directory.is_dir():
        raise fail(f"{directory}: no such directory", 2)
    if not (directory / SIGNATURE_NAME).is_file():
        raise fail(f"{directory / SIGNATURE_NAME}: no such file; sign the statement `plnt model manifest {directory} "
                    f"--name {name}` prints and save the bundle there", 2)
    try:
        where = publish_weights(directory, to, name, version, access.registry_options())
    except (InvalidSpec, ValueError) as exc:
        raise fail(str(exc), 2) from exc
    except PlntError as exc:
        raise failure_of(exc) from exc
    typer.echo(f"pushed model {name}@{version} to {where}")


@app.command("fetch")
@with_option_groups
def model_fetch(
    *,
    registry: RegistryUrl,
    name: Annotated[str, typer.Option(help="Model name.")],
    version: Annotated[str, typer.Option(help="Model version.")],
    root_digest: Annotated[str, typer.Option(help="sha256:HEX: the signed manifest's root digest (the pin).")],
    policy: Annotated[Path, typer.Option(help="A RecipeTrustPolicy YAML file; the policies whose recipes match NAME apply.")],
    into: Annotated[Path, typer.Option(help=(
        "The model directory to fill: absent, empty (but for the store), or holding this model already."))],
    trust_root: TrustRoot = None,
    store: Annotated[Path | None, typer.Option(help=(
        f"The weights store (content-addressed blobs, partial transfers); default: INTO/{DEFAULT_STORE}."))] = None,
    budget_mb: Annotated[int | None, typer.Option(help=(
        "Disk budget of the store in MiB; default: what the store's filesystem has free."), min=1)] = None,
    access: OperatorRegistryOptions,
) -> None:
    """Verify, pull and place one model's signed weights in DIR (a model pod's init container).

    The signed manifest is verified against the policies covering NAME and pinned to --root-digest;
    the files are pulled through a weights store and the verified model is left in DIR: each file at its
    manifest name as a hard link to the store's blob (a copy when the store is on another
    filesystem), and model.sig. The store keeps blobs only (its models/ entry is removed), so the
    model's files appear once under DIR, and a second fetch transfers nothing.

    Exit 0 with the model in DIR; 1 when it cannot be trusted or fetched (the reason on stderr; DIR's
    files left as they were; the store keeps a cut-off transfer so that a retry resumes it);
    2 for bad options."""
    from plnt.reconciler.errors import InvalidSpec, PlntError
    from plnt.reconciler.recipes.trust import VerifiedWeights, policies_for, verify_weights_signature
    from plnt.reconciler.recipes.weights import SIGNATURE_NAME, WeightsStore
    from plnt.reconciler.recipes.weights_manifest import ManifestError
    from plnt.reconciler.recipes.weights_sources import open_weights_source

    if not ROOT_DIGEST.fullmatch(root_digest):
        raise fail(f"--root-digest: expected sha256: and 64 lowercase hex digits (got {root_digest!r})", 2)
    specs = load_trust_policies(policy)
    load_trusted_root = trust_root_reader(policy, trust_root)
    if into.exists() and not into.is_dir():
        raise fail(f"--into {into}: not a directory", 2)
    try:
        source = open_weights_source(registry, name, version, access.registry_options(),
                                     base_dir=Path.cwd())
    except (InvalidSpec, ValueError) as exc:
        raise fail(str(exc), 2) from exc
    store_root = store if store is not None else into / DEFAULT_STORE
    in_into = store_root.resolve().parent == into.resolve()
    if not in_into and store_root.resolve().is_relative_to(into.resolve()) or into.resolve().is_relative_to(store_root.resolve()):
        raise fail(f"--store {store_root}: give a directory outside --into {into}, or a direct child of it", 2)
    ignored = (SIGNATURE_NAME, store_root.name) if in_into else (SIGNATURE_NAME,)
    # What this command creates, and removes again if it fails before keeping anything worth resuming.
    created = [path for path in (into, store_root) if not path.exists()]
    verified: list[WeightsManifest] = []

    def verify(bundle: bytes | None) -> VerifiedWeights:
        result = verify_weights_signature(bundle, model=name, policies=policies_for(name, specs.trust_policies.values()),
                                          load_trusted_root=load_trusted_root, pin=root_digest)
        verified.append(result.manifest)
        return result

    progress = TransferProgress()
    try:
        weights = WeightsStore(store_root, budget_bytes=0)
        weights.budget_bytes = (budget_mb * 2**20 if budget_mb is not None
                                else shutil.disk_usage(store_root).free + weights.used_bytes())
        pulled = weights.pull(source, verify, progress=progress)
        progress.done()
        placed = _place(pulled.directory, into, verified[-1], ignored)
        shutil.rmtree(pulled.directory, ignore_errors=True)  # the files live on under DIR (and as blobs)
    except PlntError as exc:
        _undo(created, store_root)
        raise failure_of(exc) from exc
    except ManifestError as exc:  # DIR holds files that are not this model's
        _undo(created, store_root)
        held = ", ".join(sorted(entry.name for entry in into.iterdir() if entry.name not in ignored))
        raise fail(f"--into {into} holds {held}, which is not model {name}@{version} as signed ({exc}); give an "
                    "absent or empty directory", 2) from exc
    except OSError as exc:
        _undo(created, store_root)
        raise fail(f"{type(exc).__name__}: {exc}", 1) from exc
    how = "already there" if not placed else f"{pulled.transferred_bytes} bytes transferred"
    if pulled.resumed_bytes:
        how += f", {pulled.resumed_bytes} resumed"
    typer.echo(f"fetched model {name}@{version} ({pulled.root_digest}) signed by {pulled.signer} into {into} ({how})")


def _place(model_dir: Path, into: Path, manifest: WeightsManifest, ignored: tuple[str, ...]) -> bool:
    """Put the store's verified model directory's files into `into`; False when `into` holds exactly
    this model already (a restarted init container). The files are staged in a hidden directory of
    `into`, checked against the manifest, then renamed into place; ManifestError when `into` holds
    anything else."""
    from plnt.reconciler.recipes.weights import SIGNATURE_NAME
    from plnt.reconciler.recipes.weights_manifest import check_directory

    into.mkdir(parents=True, exist_ok=True)
    if any(entry.name not in ignored for entry in into.iterdir()):
        check_directory(into, manifest, ignore=ignored)  # ManifestError: other files
        return False
    staging = Path(tempfile.mkdtemp(prefix=".plnt-model-", dir=into))
    moved: list[Path] = []
    try:
        for relative in [item.name for item in manifest.files] + [SIGNATURE_NAME]:
            target = staging / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(model_dir / relative, target)
            except OSError:  # another filesystem (--store elsewhere): a copy
                shutil.copyfile(model_dir / relative, target)
        check_directory(staging, manifest, ignore=(SIGNATURE_NAME,))
        for entry in sorted(staging.iterdir()):
            os.rename(entry, into / entry.name)
            moved.append(into / entry.name)
    except BaseException:
        for path in moved:  # DIR as it was
            shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink(missing_ok=True)
        raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return True


def _undo(created: list[Path], store_root: Path) -> None:
    """Removes what a failed fetch created, unless the store holds a partial transfer to resume."""
    partial = store_root / "partial"
    if store_root in created and not (partial.is_dir() and any(p.stat().st_size for p in partial.iterdir())):
        shutil.rmtree(store_root, ignore_errors=True)
    for path in reversed(created):
        if path != store_root and path.is_dir() and not any(path.iterdir()):
            path.rmdir()
