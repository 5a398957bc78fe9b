"""`plnt gateway`: the gateway as a role of its own, following the route table a control plane
(`plnt up` or `plnt reconcile`) publishes."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from plnt.reconciler.cli.common import event_loop_factory, fail, setup_logging, start_failure, stop_on_signals
from plnt.reconciler.cli.lazy import command_app
from plnt.reconciler.cli.options import WORKERS_HELP, GatewayOptions, Verbose, read_internal_token, with_option_groups

if TYPE_CHECKING:
    from plnt.gateway.role import GatewayRoleConfig
    from plnt.reconciler.control.access import GatewayTokens

app = command_app()


@app.command()
@with_option_groups
def gateway(
    *,
    control_url: Annotated[str, typer.Option(envvar="PLNT_CONTROL_URL", help=(
        "The control plane (plnt up, or plnt reconcile) whose route table this gateway follows, e.g. "
        "http://127.0.0.1:8000 (or PLNT_CONTROL_URL)."))],
    internal_token_file: Annotated[Path, typer.Option(
        help="File whose first line is the internal token (the control plane's --internal-token-file).")],
    options: GatewayOptions,
    watch_wait: Annotated[float, typer.Option(
        min=0.1, max=30, help="Seconds the control plane may hold each route watch request (long-poll).")] = 25.0,
    watch_retry_max: Annotated[float, typer.Option(
        min=0.1, help="Longest wait between retries while the control plane is unreachable (jittered).")] = 10.0,
    workers: Annotated[int, typer.Option(min=0, max=64, help=WORKERS_HELP)] = 0,
    loop: Annotated[str, typer.Option(help="Event loop: uvloop (default when installed) or asyncio.")] = "auto",
    verbose: Verbose = False,
) -> None:
    """Serve invoke, chat, models and workflows from the route table a control plane publishes (a
    long-poll watch on its GET /internal/routes); keeps serving its last table while it is unreachable."""
    import asyncio

    from plnt.gateway.role import GatewayRoleConfig
    from plnt.gateway.workers import auto_workers

    setup_logging(verbose)
    if not control_url.startswith(("http://", "https://")):
        raise fail(f"--control-url must be an http:// or https:// address, not {control_url!r}", 2)
    internal_token = read_internal_token(internal_token_file)
    assert internal_token is not None
    tokens = options.checked_tokens()
    loop_factory = event_loop_factory(loop)
    count = workers or auto_workers()
    config = GatewayRoleConfig(
        control_url=control_url.rstrip("/"), internal_token=internal_token, host=options.host, port=options.port,
        tokens=tokens.tokens, max_body_bytes=options.max_body_bytes, request_timeout_s=options.gateway_timeout,
        max_header_bytes=options.max_header_bytes, header_timeout_s=options.header_timeout, watch_wait_s=watch_wait,
        watch_retry_max_s=watch_retry_max, processes=count, cache_affinity=options.cache_affinity)
    try:
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            runner.run(serve(config, count, tokens, loop, verbose))
    except KeyboardInterrupt:
        pass
    except Exception as exc:  # noqa: BLE001 - one clear line for start-up failures
        raise start_failure(exc, "plnt gateway") from exc


async def serve(config: GatewayRoleConfig, count: int, tokens: GatewayTokens, loop_name: str, verbose: bool) -> None:
    """The gateway role, with `count - 1` more processes on its port; until SIGINT or SIGTERM."""
    import os

    from plnt.gateway.role import GatewayRole
    from plnt.gateway.workers import WorkerConfig, WorkerSupervisor
    from pydantic import SecretStr

    stop = stop_on_signals()
    role = GatewayRole(config, reuse_port=count > 1)
    await role.start()
    supervisor = None
    if count > 1:

        def config_for(index: int) -> WorkerConfig:
            return WorkerConfig(
                index=index, parent_pid=os.getpid(), control_url=config.control_url,
                internal_token=SecretStr(config.internal_token), host=config.host, port=role.server.port,
                tokens_text=SecretStr(tokens.file_text) if tokens.file_text is not None else None,
                tokens_source=tokens.source, plain_tokens=tuple(SecretStr(t) for t in tokens.plain),
                max_body_bytes=config.max_body_bytes, request_timeout_s=config.request_timeout_s,
                max_header_bytes=config.max_header_bytes, header_timeout_s=config.header_timeout_s,
                watch_wait_s=config.watch_wait_s, watch_retry_max_s=config.watch_retry_max_s, loop=loop_name,
                verbose=verbose, processes=count, cache_affinity=config.cache_affinity)

        supervisor = WorkerSupervisor(config_for, count - 1)
        await supervisor.start()
    typer.echo(f"plnt gateway is up: {role.url} ({count} process{'es' if count > 1 else ''}), following "
               f"{config.control_url}; Ctrl-C stops", err=True)
    await stop.wait()
    typer.echo("plnt gateway: stopping...", err=True)
    if supervisor is not None:
        await supervisor.stop()
    await role.stop()
    typer.echo("plnt gateway: stopped", err=True)
