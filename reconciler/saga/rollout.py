"""A person's hand on a running rollout: read where it is (the saga's `rollout` query) and act on it
(the saga's `act` update: pause, resume, promote, abort), for `plnt rollout`, the UI and
POST /workflows/NAME/rollout.

The saga decides: it refuses an action that names another commit or spec fingerprint than its own,
or that makes no sense where it is (resume with nothing paused, anything after promote or abort).
Errors say what happens next: NoRollout (nothing to act on: 404), RolloutActionRefused (the saga
said no: 409)."""

from __future__ import annotations

from typing import Any

from plnt.reconciler.errors import NeedsHuman
from plnt.reconciler.saga.io import RolloutAction, RolloutState, saga_workflow_id
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode


class NoRollout(LookupError):
    """No saga of this WorkflowRun is running."""


class RolloutActionRefused(NeedsHuman):
    """The saga refused the action; the message says why and what to look at."""


async def rollout_state(client: Client, namespace: str, name: str) -> RolloutState:
    """Where the running rollout of namespace/name is. Raises NoRollout."""
    handle = client.get_workflow_handle(saga_workflow_id(namespace, name))
    try:
        description = await handle.describe()
        if description.status != WorkflowExecutionStatus.RUNNING:
            raise NoRollout(f"no rollout of {namespace}/{name} is under way (its last saga is "
                            f"{description.status.name.lower() if description.status else 'unknown'}); "
                            "plnt status shows how it ended")
        return await handle.query("rollout", result_type=RolloutState)
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            raise NoRollout(f"no saga has run for {namespace}/{name}") from exc
        raise


async def act_on_rollout(client: Client, namespace: str, name: str, action: RolloutAction) -> str:
    """Sends `action` to the running saga of namespace/name; returns what the saga answered."""
    handle = client.get_workflow_handle(saga_workflow_id(namespace, name))
    try:
        return await handle.execute_update("act", action, result_type=str)
    except WorkflowUpdateFailedError as exc:
        raise RolloutActionRefused(_message(exc.cause)) from exc
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:  # none ever, or it completed meanwhile
            raise NoRollout(f"no rollout of {namespace}/{name} is under way: {exc.message}") from exc
        raise


def _message(cause: Any) -> str:
    if isinstance(cause, ApplicationError):
        return cause.message
    return str(cause) if cause is not None else "the saga refused the action"
