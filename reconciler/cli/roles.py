"""How a role command (`plnt reconcile`, `plnt worker`) runs its role (reconciler/roles.py): until
SIGINT or SIGTERM, or until the role fails by itself (a lost lease), which exits 1 so that a
supervisor restarts it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import typer
from plnt.reconciler.cli.common import start_failure, stop_on_signals

if TYPE_CHECKING:
    from plnt.reconciler.roles import Role
    from plnt.reconciler.settings import Settings


def run_role(start: Callable[[Settings], Awaitable[Role]], settings: Settings, what: str) -> None:
    import asyncio

    from plnt.reconciler.errors import PlntError

    async def main() -> int:
        stop = stop_on_signals()
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
        raise start_failure(exc, f"plnt {what}", PlntError) from exc
    if code:
        raise typer.Exit(code)
