"""`plnt reconcile`: the reconciler role of `plnt up` in a process of its own (reconciler/roles.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from plnt.reconciler.cli import roles
from plnt.reconciler.cli.common import env_gateway_tokens, fail, setup_logging
from plnt.reconciler.cli.lazy import command_app
from plnt.reconciler.cli.options import (
    RETRY_ATTEMPTS_HELP,
    CommitTrustOptions,
    ForgeOptions,
    Identity,
    InstallTimeout,
    MaxSagas,
    ModelInstallTimeout,
    NotifyOptions,
    RoleInternalTokenFile,
    RoleSourceOptions,
    RoleStateDir,
    RoleTemporalOptions,
    SpecLimitOptions,
    Verbose,
    exit_on_invalid_settings,
    read_internal_token,
    with_option_groups,
)

app = command_app()


@app.command()
@with_option_groups
def reconcile(
    *,
    source: RoleSourceOptions,
    state_dir: RoleStateDir = Path(".plnt-reconciler"),
    host: Annotated[str, typer.Option(help="Control API address.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Control API port.")] = 8080,
    interval: Annotated[float, typer.Option(help="Seconds between polls of the repository.")] = 5.0,
    temporal: RoleTemporalOptions,
    internal_token_file: RoleInternalTokenFile = None,
    trust: CommitTrustOptions,
    mirror_status: Annotated[bool, typer.Option(
        "--mirror-status", help="Mirror each WorkflowRun and its status into the cluster as custom resources.")] = False,
    kubeconfig: Annotated[Path | None, typer.Option(help="kubeconfig for --mirror-status / --lease kubernetes / "
                                                    "--source kubernetes (default: the pod's service account).")] = None,
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
    limits: SpecLimitOptions,
    retry_attempts: Annotated[int, typer.Option(help=RETRY_ATTEMPTS_HELP, min=1)] = 3,
    retry_initial_s: Annotated[float, typer.Option(help="Seconds before a step's first retry.")] = 2.0,
    install_timeout: InstallTimeout = 150.0,
    model_install_timeout: ModelInstallTimeout = 1800.0,
    forge: ForgeOptions,
    notify: NotifyOptions,
    verbose: Verbose = False,
) -> None:
    """The reconciler role: fetch, plan, start sagas, serve the control API. One active replica (a lease)."""
    from plnt.reconciler.roles import start_reconciler
    from plnt.reconciler.settings import RetrySettings, Settings

    setup_logging(verbose)
    if lease not in ("file", "kubernetes"):
        raise fail(f"--lease must be file or kubernetes, not {lease!r}", 2)
    temporal_section = temporal.settings(max_concurrent_sagas=max_sagas)  # its API key's exit 2 comes first
    internal_token = read_internal_token(internal_token_file)
    retry = RetrySettings(maximum_attempts=retry_attempts, initial_interval_s=retry_initial_s)
    with exit_on_invalid_settings():
        settings = Settings(
            source=source.settings(interval_s=interval), state_dir=state_dir, host=host, port=port,
            temporal={**temporal_section, "retry": retry},
            roles=dict(internal_token=internal_token, lease=lease, lease_name=lease_name,
                       lease_namespace=lease_namespace, identity=identity),
            gateway=dict(tokens=env_gateway_tokens(), tokens_file=tokens_file, insecure_no_auth=insecure_no_auth,
                         webhook_secret_file=webhook_secret_file),
            trust=trust.settings(), spec_limits=limits.limits(),
            kubernetes=dict(mirror_status=mirror_status, kubeconfig=kubeconfig,
                            install_timeout_s=install_timeout, model_install_timeout_s=model_install_timeout),
            review=forge.settings(), notify=notify.settings())
    roles.run_role(start_reconciler, settings, "reconcile")
