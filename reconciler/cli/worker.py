"""`plnt worker`: the worker role of `plnt up` in a process of its own (reconciler/roles.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from plnt.reconciler.cli import roles
from plnt.reconciler.cli.common import setup_logging
from plnt.reconciler.cli.lazy import command_app
from plnt.reconciler.cli.options import (
    MAX_RECIPE_MB_HELP,
    CommitTrustOptions,
    GpuResource,
    Identity,
    InstallTimeout,
    MaxSagas,
    ModelInstallTimeout,
    RoleInternalTokenFile,
    RoleSourceOptions,
    RoleStateDir,
    RoleTemporalOptions,
    SpecLimitOptions,
    Verbose,
    WorkerRegistryAccessOptions,
    WorkerRunnerOptions,
    exit_on_invalid_settings,
    read_internal_token,
    with_option_groups,
)

app = command_app()


@app.command()
@with_option_groups
def worker(
    *,
    source: RoleSourceOptions,
    control_url: Annotated[str | None, typer.Option(help="The reconciler's control API (http://HOST:PORT).")] = None,
    state_dir: RoleStateDir = Path(".plnt-worker"),
    host: Annotated[str, typer.Option(help="Address of the health endpoints (/healthz, /readyz).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port of the health endpoints.")] = 8081,
    temporal: RoleTemporalOptions,
    internal_token_file: RoleInternalTokenFile = None,
    trust: CommitTrustOptions,
    previews: Annotated[list[str] | None, typer.Option("--previews", help=(
        "The reconciler's --previews ref globs: a preview saga's commit must be on such a ref. Repeatable."))] = None,
    identity: Identity = "",
    kubeconfig: Annotated[Path | None, typer.Option(help=(
        "kubeconfig for --source kubernetes: a saga's WorkflowRun is checked against the cluster's custom "
        "resource (default: the pod's service account)."))] = None,
    registries: WorkerRegistryAccessOptions,
    max_recipe_mb: Annotated[int, typer.Option(help=MAX_RECIPE_MB_HELP, min=1)] = 256,
    install_timeout: InstallTimeout = 150.0,
    model_install_timeout: ModelInstallTimeout = 1800.0,
    gpu_resource: GpuResource = None,
    max_sagas: MaxSagas = 8,
    limits: SpecLimitOptions,
    runners: WorkerRunnerOptions,
    report_interval: Annotated[float, typer.Option(help="Seconds between reports of the local runners.")] = 2.0,
    drain_grace: Annotated[float, typer.Option(help=(
        "Seconds a retired local runner keeps serving after it left the routes when the control plane cannot "
        "confirm that every gateway let go of it (otherwise plnt waits for that, at most 10 s)."))] = 2.0,
    verbose: Verbose = False,
) -> None:
    """The worker role: run the saga's steps on Temporal; host and report the local runners they install."""
    from plnt.reconciler.roles import start_worker
    from plnt.reconciler.settings import Settings

    setup_logging(verbose)
    runners.check()
    temporal_section = temporal.settings(max_concurrent_sagas=max_sagas)  # its API key's exit 2 comes first
    internal_token = read_internal_token(internal_token_file)
    with exit_on_invalid_settings():
        settings = Settings(
            source=source.settings(), state_dir=state_dir, host=host, port=port, temporal=temporal_section,
            roles=dict(control_url=control_url, internal_token=internal_token, identity=identity,
                       report_interval_s=report_interval, drain_grace_s=drain_grace),
            trust=trust.settings(), review=dict(previews=tuple(previews or ())),
            registries=registries.settings(max_recipe_bytes=max_recipe_mb * 2**20), spec_limits=limits.limits(),
            runners=runners.settings(),
            kubernetes=dict(install_timeout_s=install_timeout, model_install_timeout_s=model_install_timeout,
                            gpu_resource=gpu_resource,
                            kubeconfig=kubeconfig))
    roles.run_role(start_worker, settings, "worker")
