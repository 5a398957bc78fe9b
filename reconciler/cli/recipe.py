"""`plnt recipe`: a recipe from its author's directory to a runner: pack, sign, push, verify, digest,
and fetch (what a runner pod's init container runs)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from plnt.reconciler.cli.common import fail, failure_of, secret
from plnt.reconciler.cli.lazy import command_app
from plnt.reconciler.cli.options import (
    OciInsecureHost,
    OperatorRegistryOptions,
    RegistryUrl,
    S3Endpoint,
    TrustRoot,
    with_option_groups,
)
from plnt.reconciler.cli.trust_files import load_trust_policies, trust_root_reader

app = command_app(help="Recipe commands: pack, sign, push, verify, digest, and fetch (for runner pods).",
                  no_args_is_help=True)


@app.command("pack")
def recipe_pack(
    directory: Annotated[Path, typer.Argument(help="A recipe directory (holding workflow.yaml).")],
    output: Annotated[Path, typer.Option("-o", "--output", help="Archive to write.")] = Path("recipe.tar.gz"),
) -> None:
    """Pack a recipe directory into a deterministic gzip tar (same content, same bytes, same sha256)."""
    from plnt.core.recipe import RecipeError, check_recipe_dir
    from plnt.reconciler.recipes.archive import pack_recipe_to

    try:
        recipe = check_recipe_dir(directory)  # as data: packing never runs the recipe's code
        digest = pack_recipe_to(directory, output)
    except RecipeError as exc:
        raise fail(f"{exc}; fix the recipe before packing it") from exc
    except (ValueError, OSError) as exc:
        raise fail(str(exc)) from exc
    typer.echo(f"{output}: {recipe.name}@{recipe.version} {digest}")


@app.command("sign")
def recipe_sign(
    artifact: Annotated[Path, typer.Argument(help="The recipe archive to sign.")],
    identity_token: Annotated[str | None, typer.Option(envvar="SIGSTORE_ID_TOKEN", help=(
        "OIDC identity token (in CI, the workflow's token); default: the ambient CI credential. Prefer "
        "SIGSTORE_ID_TOKEN or --identity-token-file: a value on the command line is visible in `ps`."))] = None,
    identity_token_file: Annotated[Path | None, typer.Option(
        help="File holding the OIDC identity token; wins over --identity-token/SIGSTORE_ID_TOKEN.")] = None,
    trust_config: Annotated[Path | None, typer.Option(
        help="Sigstore client trust config JSON (Fulcio, Rekor, trusted root) instead of the public-good instance.")] = None,
    staging: Annotated[bool, typer.Option(help="Use the Sigstore staging instance.")] = False,
) -> None:
    """Sign keylessly with Sigstore: writes ARTIFACT.sigstore.json beside the archive."""
    from plnt.reconciler.recipes.archive import archive_digest
    from sigstore.errors import Error as SigstoreError
    from sigstore.hashes import Hashed
    from sigstore.models import ClientTrustConfig
    from sigstore.oidc import IdentityError, IdentityToken, detect_credential
    from sigstore.sign import SigningContext
    from sigstore_models.common.v1 import HashAlgorithm

    if not artifact.is_file():
        raise fail(f"{artifact}: no such file", 2)
    identity_token = secret(identity_token, identity_token_file, "--identity-token")
    try:
        token = identity_token or detect_credential()
    except IdentityError as exc:
        raise fail(f"cannot detect an ambient OIDC credential: {exc}") from exc
    if not token:
        raise fail("no identity token: set SIGSTORE_ID_TOKEN or pass --identity-token-file (in CI, your workflow's OIDC token); "
                    "interactive browser sign-in is not supported by plnt", 2)
    try:
        identity = IdentityToken(token)  # checked offline, before any signing service is contacted
    except IdentityError as exc:
        raise fail(f"the identity token was refused: {exc}") from exc
    try:
        trust = (ClientTrustConfig.from_json(trust_config.read_text()) if trust_config
                 else ClientTrustConfig.staging() if staging else ClientTrustConfig.production())
        digest = bytes.fromhex(archive_digest(artifact).removeprefix("sha256:"))
        context = SigningContext.from_trust_config(trust)
        with context.signer(identity) as signer:
            bundle = signer.sign_artifact(Hashed(algorithm=HashAlgorithm.SHA2_256, digest=digest))
    except IdentityError as exc:
        raise fail(f"the identity token was refused: {exc}") from exc
    except (SigstoreError, OSError, ValueError) as exc:
        raise fail(f"signing failed: {exc}") from exc
    except Exception as exc:  # noqa: BLE001 - network errors from the signing services
        raise fail(f"signing failed ({type(exc).__name__}): {exc}") from exc
    out = artifact.with_name(artifact.name + ".sigstore.json")
    out.write_text(bundle.to_json())
    typer.echo(f"{out}: signed by {identity.identity} ({identity.issuer})")


@app.command("push")
def recipe_push(
    artifact: Annotated[Path, typer.Argument(help="The recipe archive.")],
    to: Annotated[str, typer.Option("--to", help="s3://bucket/prefix, oci://host[:port]/repo or file:///dir")],
    name: Annotated[str, typer.Option(help="Recipe name.")],
    version: Annotated[str, typer.Option(help="Recipe version.")],
    bundle: Annotated[Path | None, typer.Option(help="Sigstore bundle (default: ARTIFACT.sigstore.json).")] = None,
    s3_endpoint_url: S3Endpoint = None,
    oci_insecure_host: OciInsecureHost = None,
) -> None:
    """Publish an archive and its bundle to a registry as NAME@VERSION."""
    from plnt.reconciler.errors import PlntError
    from plnt.reconciler.recipes.registries import RegistryOptions, open_registry

    bundle = bundle or artifact.with_name(artifact.name + ".sigstore.json")
    if not artifact.is_file():
        raise fail(f"{artifact}: no such file", 2)
    if not bundle.is_file():
        raise fail(f"{bundle}: no such bundle; sign the archive first (plnt recipe sign {artifact})", 2)
    # file_roots=None: the author names the directory on their own command line (not a spec).
    options = RegistryOptions(s3_endpoint_url=s3_endpoint_url, allow_insecure_http=tuple(oci_insecure_host or ()),
                              file_roots=None)
    try:
        where = open_registry(to, options).push(name, version, artifact, bundle)
    except (PlntError, ValueError) as exc:
        raise fail(str(exc)) from exc
    typer.echo(f"pushed {name}@{version} to {where}")


@app.command("fetch")
@with_option_groups
def recipe_fetch(
    *,
    registry: RegistryUrl,
    ref: Annotated[str, typer.Option(help="Recipe NAME@VERSION.")],
    digest: Annotated[str, typer.Option(help="sha256:HEX of the archive: the pin (what the saga verified).")],
    policy: Annotated[Path, typer.Option(help="A RecipeTrustPolicy YAML file (one or more policies).")],
    into: Annotated[Path, typer.Option(help="Directory to unpack the recipe into (absent or empty).")],
    trust_root: TrustRoot = None,
    access: OperatorRegistryOptions,
    max_download_mb: Annotated[int, typer.Option(help="Refuse a download larger than this.", min=1)] = 256,
) -> None:
    """Fetch, pin-check, verify and safely unpack one recipe into DIR: the saga's pull, for a runner
    pod's init container. Exit 0 with the recipe in DIR, 1 when it cannot be trusted or fetched (the
    reason on stderr; DIR left as it was), 2 for bad options."""
    import shutil
    import tempfile

    from plnt.core.specs.models import WorkflowSource
    from plnt.reconciler.errors import PlntError
    from plnt.reconciler.recipes.pull import RecipeCache, pull_recipe, repo_subdir
    from pydantic import ValidationError

    try:
        source = WorkflowSource.model_validate({"ref": ref, "registry": registry, "integrityHash": digest})
    except ValidationError as exc:
        problem = exc.errors()[0]
        option = {"ref": "--ref", "registry": "--registry", "integrityHash": "--digest"}.get(str(problem["loc"][0]), "")
        raise fail(f"{option}: {problem['msg']} (got {problem.get('input')!r})", 2) from exc
    if repo_subdir(source.registry) is not None:
        raise fail(f"--registry {registry}: a path inside a spec repository; give file:///ABSOLUTE/DIR", 2)
    specs = load_trust_policies(policy)
    if into.exists() and (not into.is_dir() or any(into.iterdir())):
        raise fail(f"--into {into}: must be absent or an empty directory", 2)

    load_trusted_root = trust_root_reader(policy, trust_root)

    def read_trust_root(_commit: str, path: str) -> bytes:
        return load_trusted_root(path)

    def no_repo(*_args: object) -> bool:
        return False

    into.parent.mkdir(parents=True, exist_ok=True)
    # The cache and staging sit beside DIR, so the result is moved in with renames on one filesystem.
    work = Path(tempfile.mkdtemp(prefix=".plnt-fetch-", dir=into.parent))
    try:
        pulled = pull_recipe(
            source, commit="", cache=RecipeCache(work / "cache"), policies=specs.trust_policies.values(),
            read_from_repo=read_trust_root, export_from_repo=no_repo,
            registry_options=access.registry_options(max_download_bytes=max_download_mb * 2**20))
        into.mkdir(exist_ok=True)
        for item in pulled.directory.iterdir():
            item.rename(into / item.name)
    except PlntError as exc:
        raise failure_of(exc) from exc
    finally:
        shutil.rmtree(work, ignore_errors=True)
    typer.echo(f"fetched {source.ref} ({pulled.digest}) signed by {pulled.signature.identity} "
               f"({pulled.signature.issuer}) into {into}")


@app.command("verify")
def recipe_verify(
    artifact: Annotated[Path, typer.Argument(help="The recipe archive.")],
    bundle: Annotated[Path | None, typer.Option(help="Sigstore bundle (default: ARTIFACT.sigstore.json).")] = None,
    identity: Annotated[str | None, typer.Option(help="Exact signer identity (email or URI SAN).")] = None,
    identity_regex: Annotated[str | None, typer.Option(help="Regular expression over the signer's SANs.")] = None,
    issuer: Annotated[str, typer.Option(help="Exact OIDC issuer.")] = ...,  # type: ignore[assignment]
    trust_root: Annotated[Path | None, typer.Option(
        help="Trusted-root JSON; default: the Sigstore public-good root bundled with sigstore-python (offline).")] = None,
) -> None:
    """Verify an archive's signature offline, exactly as plnt does before deploying it."""
    from plnt.core.specs.models import RecipeTrustPolicy
    from plnt.reconciler.errors import DownloadRefused, VerificationFailed
    from plnt.reconciler.recipes.archive import archive_digest
    from plnt.reconciler.recipes.registries import MAX_BUNDLE_BYTES, MAX_TRUSTED_ROOT_BYTES, read_bounded
    from plnt.reconciler.recipes.trust import verify_recipe
    from pydantic import ValidationError

    bundle = bundle or artifact.with_name(artifact.name + ".sigstore.json")
    if not artifact.is_file():
        raise fail(f"{artifact}: no such file", 2)
    if (identity is None) == (identity_regex is None):
        raise fail("give exactly one of --identity or --identity-regex", 2)
    signer = {"issuer": issuer, **({"identity": identity} if identity else {"identityRegex": identity_regex})}
    root = {"trustedRootFile": trust_root.name} if trust_root else {"publicGood": True}
    try:
        policy = RecipeTrustPolicy.model_validate({
            "apiVersion": "plnt.work/v1", "kind": "RecipeTrustPolicy", "metadata": {"name": "command-line"},
            "spec": {"recipes": ["*"], "trustRoot": root, "signers": [signer]}})
    except ValidationError as exc:
        raise fail(f"invalid signer options: {exc.errors()[0]['msg']}", 2) from exc
    try:
        signature = read_bounded(bundle, MAX_BUNDLE_BYTES, what="the bundle") if bundle.is_file() else None
    except DownloadRefused as exc:
        typer.echo(f"REJECTED (invalid-bundle): {exc}")
        raise typer.Exit(1) from exc
    try:
        verified = verify_recipe(
            archive_digest(artifact), signature, recipe="*", policies=[policy],
            load_trusted_root=lambda _path: read_bounded(trust_root, MAX_TRUSTED_ROOT_BYTES, what="--trust-root")
            if trust_root else b"",
        )
    except VerificationFailed as exc:
        typer.echo(f"REJECTED ({exc.reason}): {exc}")
        raise typer.Exit(1) from exc
    typer.echo(f"OK: {artifact} signed by {verified.identity} ({verified.issuer}); {verified.trust_root}")


@app.command("digest")
def recipe_digest(path: Annotated[Path, typer.Argument(help="A recipe archive, or a recipe directory.")]) -> None:
    """Print what `spec.workflow.integrityHash` pins: the archive's sha256 (a directory is packed first)."""
    import hashlib

    from plnt.reconciler.recipes.archive import archive_digest, pack_recipe

    if path.is_file():
        typer.echo(archive_digest(path))
        return
    if not (path / "workflow.yaml").is_file():
        raise fail(f"{path}: neither an archive nor a recipe directory (no workflow.yaml)", 2)
    try:
        typer.echo("sha256:" + hashlib.sha256(pack_recipe(path)).hexdigest())
    except ValueError as exc:
        raise fail(f"{path}: {exc}") from exc
