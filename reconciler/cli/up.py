"""`plnt up`: every role in one process (reconciler/app.py): Temporal, a worker, the reconciler and
the gateway, deploying through local runner processes."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from plnt.reconciler.cli.common import event_loop_factory, setup_logging, start_failure, stop_on_signals
from plnt.reconciler.cli.lazy import command_app
from plnt.reconciler.cli.options import (
    MAX_RECIPE_MB_HELP,
    MAX_SAGAS_HELP,
    RETRY_ATTEMPTS_HELP,
    WORKERS_HELP,
    CommitTrustOptions,
    ForgeOptions,
    GatewayOptions,
    GpuResource,
    InstallTimeout,
    ModelInstallTimeout,
    NotifyOptions,
    RegistryAccessOptions,
    RunnerOptions,
    SourceOptions,
    SpecLimitOptions,
    TemporalOptions,
    Verbose,
    exit_on_invalid_settings,
    read_internal_token,
    with_option_groups,
)

if TYPE_CHECKING:
    from plnt.reconciler.settings import Settings

app = command_app()


@app.command()
@with_option_groups
def up(
    *,
    source: SourceOptions,
    trust: CommitTrustOptions,
    state_dir: Annotated[Path, typer.Option(help="Where plnt keeps its state.")] = Path(".plnt"),
    gateway: GatewayOptions,
    interval: Annotated[float, typer.Option(help="Seconds between polls of the repository.")] = 5.0,
    temporal: TemporalOptions,
    registries: RegistryAccessOptions,
    llm_venv: Annotated[Path | None, typer.Option(help=(
        "The model runtime's venv for ModelDeployments (llama.cpp's server; `make install-llm`); default: "
        ".venv-llm beside plnt's code."))] = None,
    weights_budget_gb: Annotated[float, typer.Option(
        "--weights-budget", help="GiB the weights store (STATE/weights) may use; a pull past it fails.", min=0.001)] = 20,
    install_timeout: InstallTimeout = 150.0,
    model_install_timeout: ModelInstallTimeout = 1800.0,
    gpu_resource: GpuResource = None,
    max_recipe_mb: Annotated[int, typer.Option(help=MAX_RECIPE_MB_HELP)] = 256,
    max_sagas: Annotated[int, typer.Option(help=MAX_SAGAS_HELP)] = 8,
    limits: SpecLimitOptions,
    retry_attempts: Annotated[int, typer.Option(help=RETRY_ATTEMPTS_HELP)] = 3,
    retry_initial_s: Annotated[float, typer.Option(help="Seconds before a step's first retry (doubling after).")] = 2.0,
    gateway_workers: Annotated[int, typer.Option(min=0, max=64, help=WORKERS_HELP)] = 0,
    control_plane_gateway: Annotated[bool, typer.Option(
        "--control-plane-gateway", help=(
            "With --gateway-workers N > 1: plnt up's own process is one of the N on the gateway port (default: "
            "N worker processes, and the control plane answers only them, so a busy reconcile never stalls an "
            "invocation)."))] = False,
    webhook_secret_file: Annotated[Path | None, typer.Option(
        help="POST /hooks/git then needs the forge's signature made with this secret (GitHub X-Hub-Signature-256, "
             "Gitea X-Gitea-Signature, GitLab X-Gitlab-Token), from any address; without it only loopback callers.")] = None,
    loop: Annotated[str, typer.Option(
        help="Event loop: uvloop (default when installed; ~1.5x less gateway CPU per request, "
             "see bench/gateway_overhead.py) or asyncio.")] = "auto",
    runners: RunnerOptions,
    internal_token_file: Annotated[Path | None, typer.Option(
        help="File whose first line is the internal token: GET /internal/routes (the route table `plnt gateway` "
             "follows) accepts it (or an admin token); without it that endpoint answers 404.")] = None,
    mirror_status: Annotated[bool, typer.Option(
        "--mirror-status", help="Apply each WorkflowRun as a plnt.work/v1 custom resource and write its status there "
                                "(kubectl get wfr); needs the CRDs (plnt crds) and --kubeconfig or in-cluster config.")] = False,
    kubeconfig: Annotated[Path | None, typer.Option(
        help="Kubeconfig for --mirror-status and --source kubernetes (default: in-cluster).")] = None,
    forge: ForgeOptions,
    notify: NotifyOptions,
    verbose: Verbose = False,
) -> None:
    """Run plnt: Temporal, a worker, the reconciler and the gateway; deploy through local runner processes."""
    import asyncio

    from plnt.reconciler.errors import PlntError
    from plnt.reconciler.settings import RetrySettings, Settings

    setup_logging(verbose)
    internal_token = read_internal_token(internal_token_file)
    with exit_on_invalid_settings():
        settings = Settings(
            source=source.settings(interval_s=interval), trust=trust.settings(), state_dir=state_dir,
            host=gateway.host, port=gateway.port,
            gateway=gateway.settings(workers=gateway_workers, control_plane_gateway=control_plane_gateway,
                                     webhook_secret_file=webhook_secret_file),
            temporal=temporal.settings(max_concurrent_sagas=max_sagas, retry=RetrySettings(
                maximum_attempts=retry_attempts, initial_interval_s=retry_initial_s)),
            registries=registries.settings(max_recipe_bytes=max_recipe_mb * 2**20),
            kubernetes=dict(install_timeout_s=install_timeout, model_install_timeout_s=model_install_timeout,
                            gpu_resource=gpu_resource,
                            mirror_status=mirror_status, kubeconfig=kubeconfig),
            spec_limits=limits.limits(), roles=dict(internal_token=internal_token),
            runners=runners.settings(weights_budget_bytes=int(weights_budget_gb * 2**30),
                                     **({"llm_venv": llm_venv.resolve()} if llm_venv is not None else {})),
            review=forge.settings(), notify=notify.settings())
    runners.check()
    gateway.checked_tokens()  # here, for one clear line; the gateway reads them again as it starts
    loop_factory = event_loop_factory(loop)
    try:
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            runner.run(serve(settings))
    except KeyboardInterrupt:
        pass
    except Exception as exc:  # noqa: BLE001 - one clear line, not a traceback, for start-up failures
        raise start_failure(exc, "plnt", PlntError) from exc


async def serve(settings: Settings) -> None:
    """Start plnt, and stop it on SIGINT or SIGTERM."""
    from plnt.reconciler.app import start

    stop = stop_on_signals()
    plnt = await start(settings)
    typer.echo(f"plnt is up: gateway {plnt.url}  (GET /workflows, POST /workflows/NAME/invoke); "
               f"UI {plnt.url}/ui; Ctrl-C stops", err=True)
    await stop.wait()
    typer.echo("plnt: stopping (runners, worker, gateway, Temporal)...", err=True)
    await plnt.stop()
    typer.echo("plnt: stopped", err=True)
