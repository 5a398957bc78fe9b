"""A person's emergency pin of a stable release (POST /workflows/NAME/pin, `plnt rollback --to V
--now`, admin scope): plnt deploys V again at once from the commit that last promoted it (its recipe
pin and signature checked again as in any saga, its canary promoted as soon as it is installed), and
holds it against newer commits, shown as drift, until a commit naming V lands on the tracked branch
(the rollback's pull request, merged), which releases the pin.

Only a version plnt promoted can be pinned: its commit is on the tracked branch and was trusted (and
approved, under --require-approval) when it was deployed. Its trust policies are that commit's.
"""

from __future__ import annotations

from collections.abc import Iterable

from plnt.core.specs.models import VERSION_PATTERN
from plnt.reconciler.saga.history import SagaRollout
from pydantic import BaseModel, ConfigDict, Field


class PinRequest(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    version: str = Field(pattern=VERSION_PATTERN)
    by: str = Field(default="", max_length=200, description="who, as the caller says (the token is what is checked)")
    reason: str = Field(default="", max_length=500)


class PinRefused(Exception):
    """Nothing was pinned: the reason says what to do instead (409)."""


def promoting_commit(rollouts: Iterable[SagaRollout], version: str) -> str | None:
    """The commit of the newest saga that promoted `version` (None: plnt never promoted it)."""
    for rollout in rollouts:  # newest first
        if rollout.phase == "Ready" and rollout.action != "uninstall" and rollout.version == version and rollout.commit:
            return rollout.commit
    return None
