"""`plnt reconcile` and `plnt worker`: the roles of `plnt up`, each in its own process (see roles.py)."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Annotated, Any

import typer
from plnt.reconciler.cli.main import (
    Approvers,
    CodeOwners,
    ForgeApiUrl,
    ForgeKind,
    ForgeProject,
    ForgeTokenEnv,
    ForgeTokenFile,
    GpuResource,
    MaxSpecFileKb,
    MaxSpecFiles,
    ModelInstallTimeout,
    Previews,
    ReportStatus,
    RequireApproval,
    RunnerStart,
    RunnerStartOption,
    WriteNotes,
    _fail,
    _forge_settings,
    _secret,
    _secret_from,
    _setup_logging,
    _spec_limits,
    app,
)
from plnt.reconciler.settings import RetrySettings, Settings
from pydantic import ValidationError

Repo = Annotated[str, typer.Option(envvar="PLNT_REPO", help=(
    "Spec repository: a path, file://, https:// or ssh URL (or PLNT_REPO; credentials in a URL are never logged)."))]
SpecPath = Annotated[str, typer.Option("--path", help="Subdirectory of the repository holding the specs.")]
Branch = Annotated[str, typer.Option(help="Branch to track.")]
StateDirOpt = Annotated[Path, typer.Option(help="This role's own state directory (roles share no disk).")]
TemporalAddress = Annotated[str | None, typer.Option(help="HOST:PORT of the Temporal server all roles share (required).")]
TemporalNamespace = Annotated[str, typer.Option(help="Temporal namespace of plnt's sagas.")]
TaskQueue = Annotated[str, typer.Option(help="Temporal task queue of plnt's sagas and activities.")]
TemporalTls = Annotated[bool, typer.Option("--temporal-tls", help="Connect over TLS with the system's CAs.")]
TemporalCert = Annotated[Path | None, typer.Option(help="Client certificate (PEM) for mutual TLS.")]
TemporalKey = Annotated[Path | None, typer.Option(help="Private key (PEM) of --temporal-tls-cert.")]
TemporalCa = Annotated[Path | None, typer.Option(help="CA (PEM) the Temporal server's certificate must chain to.")]
TemporalKeyEnv = Annotated[str | None, typer.Option(help="NAME of the env var holding a Temporal API key.")]
TemporalKeyFile = Annotated[Path | None, typer.Option(help="File holding a Temporal API key.")]
InternalTokenFile = Annotated[Path | None, typer.Option(help=(
    "File holding the internal token the roles use with each other (first line); the same file for every role."))]
GitCredentialsFile = Annotated[Path | None, typer.Option(help=(
    "The repository's credentials: TOKEN or USER:TOKEN on the first line (https), or an ssh private key."))]
GitKnownHosts = Annotated[Path | None, typer.Option(help=(
    "ssh known_hosts for the repository's host; without it the first host key is trusted, then pinned."))]
VerifyCommits = Annotated[str, typer.Option(help=(
    "Deploy only signed commits: none, head (the newest commit) or all (every commit since the last "
    "reconciled one, merged branches included)."))]
AllowedSigners = Annotated[Path | None, typer.Option(help="Trusted SSH signers (git's allowed-signers format).")]
GpgKeys = Annotated[Path | None, typer.Option(help="Directory of trusted OpenPGP public keys (*.asc, *.gpg).")]
Identity = Annotated[str, typer.Option(help="This replica's name (default: host name and process id).")]
MaxSagas = Annotated[int, typer.Option(help="Sagas (deploys) running at once, across WorkflowRuns.", min=1)]
Verbose = Annotated[bool, typer.Option("--verbose", "-v")]


def _temporal(temporal_address: str | None, temporal_namespace: str, task_queue: str, temporal_tls: bool,
              temporal_tls_cert: Path | None, temporal_tls_key: Path | None, temporal_tls_ca: Path | None,
              temporal_api_key_env: str | None, temporal_api_key_file: Path | None) -> dict[str, Any]:
    try:
        api_key = _secret_from(temporal_api_key_env, temporal_api_key_file, "--temporal-api-key")
    except ValueError as exc:
        raise _fail(str(exc), 2) from exc
    return dict(temporal_address=temporal_address, temporal_namespace=temporal_namespace, task_queue=task_queue,
                temporal_tls=temporal_tls, temporal_tls_cert=temporal_tls_cert, temporal_tls_key=temporal_tls_key,
                temporal_tls_ca=temporal_tls_ca, temporal_api_key=api_key)


def _settings(**fields: Any) -> Settings:
    try:
        return Settings(**fields)
    except ValidationError as exc:
        raise _fail("; ".join(str(e["msg"]).removeprefix("Value error, ") for e in exc.errors()), 2) from exc


def _run_role(start: Any, settings: Settings, what: str) -> None:
    from plnt.core.server import ServerStartError
    from plnt.reconciler.errors import PlntError

    async def main() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        role = await start(settings)
        typer.echo(f"plnt {what} is up: {role.url}; Ctrl-C stops", err=True)
        failed = asyncio.ensure_future(role.failed.wait())
        stopped = asyncio.ensure_future(stop.wait())
        await asyncio.wait({failed, stopped}, return_when=asyncio.FIRST_COMPLETED)
        failed.cancel()
        stopped.cancel()
        await role.stop()
        return 1 if role.failed.is_set() else 0

    try:
        code = asyncio.run(main())
    except KeyboardInterrupt:
        code = 0
    except Exception as exc:  # noqa: BLE001 - one clear line for start-up failures
        if not isinstance(exc, (PlntError, ServerStartError, OSError)):
            raise
        typer.echo(f"error: plnt {what} could not start: {exc}", err=True)
        raise typer.Exit(2) from exc
    if code:
        raise typer.Exit(code)


@app.command()
def reconcile(
    repo: Repo,
    path: SpecPath = "",
    branch: Branch = "main",
    state_dir: StateDirOpt = Path(".plnt-reconciler"),
    host: Annotated[str, typer.Option(help="Control API address.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Control API port.")] = 8080,
    interval: Annotated[float, typer.Option(help="Seconds between polls of the repository.")] = 5.0,
    temporal_address: TemporalAddress = None,
    temporal_namespace: TemporalNamespace = "default",
    task_queue: TaskQueue = "plnt-sagas",
    temporal_tls: TemporalTls = False,
    temporal_tls_cert: TemporalCert = None,
    temporal_tls_key: TemporalKey = None,
    temporal_tls_ca: TemporalCa = None,
    temporal_api_key_env: TemporalKeyEnv = None,
    temporal_api_key_file: TemporalKeyFile = None,
    internal_token_file: InternalTokenFile = None,
    git_credentials_file: GitCredentialsFile = None,
    git_known_hosts: GitKnownHosts = None,
    verify_commits: VerifyCommits = "none",
    allowed_signers: AllowedSigners = None,
    gpg_keys: GpgKeys = None,
    mirror_status: Annotated[bool, typer.Option(
        "--mirror-status", help="Mirror each WorkflowRun and its status into the cluster as custom resources.")] = False,
    kubeconfig: Annotated[Path | None, typer.Option(help="kubeconfig for --mirror-status / --lease kubernetes "
                                                    "(default: the pod's service account).")] = None,
    tokens_file: Annotated[Path | None, typer.Option(help=(
        "Bearer tokens of the control API's users (the gateway's token file format: scopes read, admin).")
    )] = None,
    insecure_no_auth: Annotated[bool, typer.Option(
        "--insecure-no-auth", help="Serve the control API without tokens on a non-loopback --host.")] = False,
    webhook_secret_file: Annotated[Path | None, typer.Option(
        help="POST /hooks/git then needs the forge's signature made with this secret.")] = None,
    lease: Annotated[str, typer.Option(help=(
        "Leader election among replicas: 'file' (a lock in --state-dir, replicas on one machine) or "
        "'kubernetes' (a coordination.k8s.io Lease)."))] = "file",
    lease_name: Annotated[str, typer.Option(help="Name of the Kubernetes Lease.")] = "plnt-reconciler",
    lease_namespace: Annotated[str | None, typer.Option(help="Namespace of the Lease (default: the pod's).")] = None,
    identity: Identity = "",
    max_sagas: MaxSagas = 8,
    max_spec_files: MaxSpecFiles = 10_000,
    max_spec_file_kb: MaxSpecFileKb = 1024,
    retry_attempts: Annotated[int, typer.Option(help="Attempts per saga step, the first included.", min=1)] = 3,
    retry_initial_s: Annotated[float, typer.Option(help="Seconds before a step's first retry.")] = 2.0,
    model_install_timeout: ModelInstallTimeout = 1800.0,
    forge: ForgeKind = None,
    forge_api_url: ForgeApiUrl = None,
    forge_project: ForgeProject = None,
    forge_token_env: ForgeTokenEnv = None,
    forge_token_file: ForgeTokenFile = None,
    require_approval: RequireApproval = False,
    approvers: Approvers = None,
    code_owners: CodeOwners = False,
    report_status: ReportStatus = True,
    write_notes: WriteNotes = False,
    previews: Previews = None,
    verbose: Verbose = False,
) -> None:
    """The reconciler role: fetch, plan, start sagas, serve the control API. One active replica (a lease)."""
    from plnt.reconciler.roles import start_reconciler

    _setup_logging(verbose)
    if lease not in ("file", "kubernetes"):
        raise _fail(f"--lease must be file or kubernetes, not {lease!r}", 2)
    env_tokens = tuple(t.strip() for t in os.environ.get("PLNT_GATEWAY_TOKENS", "").split(",") if t.strip())
    settings = _settings(
        repo=repo, path=path, branch=branch, state_dir=state_dir, host=host, port=port, interval_s=interval,
        **_temporal(temporal_address, temporal_namespace, task_queue, temporal_tls, temporal_tls_cert,
                    temporal_tls_key, temporal_tls_ca, temporal_api_key_env, temporal_api_key_file),
        internal_token=_secret(None, internal_token_file, "--internal-token-file"),
        gateway_tokens=env_tokens, gateway_tokens_file=tokens_file, insecure_no_auth=insecure_no_auth,
        webhook_secret_file=webhook_secret_file, git_credentials_file=git_credentials_file,
        git_known_hosts=git_known_hosts, mirror_status=mirror_status, verify_commits=verify_commits,
        allowed_signers=allowed_signers, gpg_keys=gpg_keys, kubeconfig=kubeconfig, lease=lease, lease_name=lease_name, lease_namespace=lease_namespace,
        identity=identity, max_concurrent_sagas=max_sagas, spec_limits=_spec_limits(max_spec_files, max_spec_file_kb),
        retry=RetrySettings(maximum_attempts=retry_attempts, initial_interval_s=retry_initial_s),
        model_install_timeout_s=model_install_timeout,
        **_forge_settings(forge, forge_api_url, forge_project, forge_token_env, forge_token_file,
                          require_approval, report_status, write_notes, previews, approvers, code_owners),
    )
    _run_role(start_reconciler, settings, "reconcile")


@app.command()
def worker(
    repo: Repo,
    control_url: Annotated[str | None, typer.Option(help="The reconciler's control API (http://HOST:PORT).")] = None,
    path: SpecPath = "",
    branch: Branch = "main",
    state_dir: StateDirOpt = Path(".plnt-worker"),
    host: Annotated[str, typer.Option(help="Address of the health endpoints (/healthz, /readyz).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port of the health endpoints.")] = 8081,
    temporal_address: TemporalAddress = None,
    temporal_namespace: TemporalNamespace = "default",
    task_queue: TaskQueue = "plnt-sagas",
    temporal_tls: TemporalTls = False,
    temporal_tls_cert: TemporalCert = None,
    temporal_tls_key: TemporalKey = None,
    temporal_tls_ca: TemporalCa = None,
    temporal_api_key_env: TemporalKeyEnv = None,
    temporal_api_key_file: TemporalKeyFile = None,
    internal_token_file: InternalTokenFile = None,
    git_credentials_file: GitCredentialsFile = None,
    git_known_hosts: GitKnownHosts = None,
    verify_commits: VerifyCommits = "none",
    allowed_signers: AllowedSigners = None,
    gpg_keys: GpgKeys = None,
    previews: Annotated[list[str] | None, typer.Option("--previews", help=(
        "The reconciler's --previews ref globs: a preview saga's commit must be on such a ref. Repeatable."))] = None,
    identity: Identity = "",
    s3_endpoint_url: Annotated[str | None, typer.Option(help="S3-compatible endpoint for s3:// registries.")] = None,
    s3_region: Annotated[str | None, typer.Option(help="Region for s3:// registries.")] = None,
    oci_insecure_host: Annotated[list[str] | None, typer.Option(
        help="OCI registry (host or host:port) allowed over plain HTTP. Repeatable.")] = None,
    allow_file_registry: Annotated[list[Path] | None, typer.Option(
        help="Directory under which file:/// registries may be read. Repeatable.")] = None,
    max_recipe_mb: Annotated[int, typer.Option(help="Refuse recipes that unpack to more than this.", min=1)] = 256,
    max_download_mb: Annotated[int, typer.Option(help="Stop a recipe download past this many MiB.", min=1)] = 256,
    model_install_timeout: ModelInstallTimeout = 1800.0,
    gpu_resource: GpuResource = None,
    max_sagas: MaxSagas = 8,
    max_spec_files: MaxSpecFiles = 10_000,
    max_spec_file_kb: MaxSpecFileKb = 1024,
    llm_url: Annotated[str | None, typer.Option(help="OpenAI-compatible model server for local runners.")] = None,
    llm_model: Annotated[str | None, typer.Option(help="Model name to ask the model server for.")] = None,
    llm_api_key_env: Annotated[str | None, typer.Option(
        help="NAME of the environment variable holding the model server's API key.")] = None,
    runner_start: RunnerStartOption = RunnerStart.fork,
    report_interval: Annotated[float, typer.Option(help="Seconds between reports of the local runners.")] = 2.0,
    drain_grace: Annotated[float, typer.Option(help=(
        "Seconds a retired local runner keeps serving after it left the routes when the control plane cannot "
        "confirm that every gateway let go of it (otherwise plnt waits for that, at most 10 s)."))] = 2.0,
    verbose: Verbose = False,
) -> None:
    """The worker role: run the saga's steps on Temporal; host and report the local runners they install."""
    from plnt.reconciler.drivers.spawn import allowlisted_env
    from plnt.reconciler.roles import start_worker

    _setup_logging(verbose)
    if llm_url and not llm_model:
        raise _fail("--llm-url needs --llm-model (the model the server should use)", 2)
    llm_api_key = (os.environ.get(llm_api_key_env) or None) if llm_api_key_env else None
    if llm_api_key_env and llm_api_key is None:
        raise _fail(f"--llm-api-key-env {llm_api_key_env}: that environment variable is not set", 2)
    settings = _settings(
        repo=repo, path=path, branch=branch, state_dir=state_dir, host=host, port=port, control_url=control_url,
        **_temporal(temporal_address, temporal_namespace, task_queue, temporal_tls, temporal_tls_cert,
                    temporal_tls_key, temporal_tls_ca, temporal_api_key_env, temporal_api_key_file),
        internal_token=_secret(None, internal_token_file, "--internal-token-file"), identity=identity,
        git_credentials_file=git_credentials_file, git_known_hosts=git_known_hosts, verify_commits=verify_commits,
        allowed_signers=allowed_signers, gpg_keys=gpg_keys, s3_endpoint_url=s3_endpoint_url, s3_region=s3_region, oci_insecure_hosts=tuple(oci_insecure_host or ()),
        previews=tuple(previews or ()),
        file_registry_roots=tuple(p.resolve() for p in allow_file_registry or ()),
        max_download_bytes=max_download_mb * 2**20, max_recipe_bytes=max_recipe_mb * 2**20,
        max_concurrent_sagas=max_sagas, spec_limits=_spec_limits(max_spec_files, max_spec_file_kb),
        llm_url=llm_url, llm_model=llm_model, llm_api_key_env=llm_api_key_env, llm_api_key=llm_api_key,
        runner_env=allowlisted_env(os.environ), report_interval_s=report_interval, drain_grace_s=drain_grace,
        runner_start=runner_start.value, model_install_timeout_s=model_install_timeout, gpu_resource=gpu_resource,
    )
    _run_role(start_worker, settings, "worker")
