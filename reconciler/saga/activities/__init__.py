"""Saga activities: the only code that touches the outside world during a deploy.

One module per step: validate.py, dependencies.py (wait_for_dependencies), pull.py (pull_recipe), install.py (install_release),
smoke_test.py, gates.py (check_gates), promote_remove.py (promote_release, remove_release), recorder.py (record_phase,
which runs beside the workflow), over base.py (what every step shares: the caller check, the
saga's WorkflowRun at its commit, heartbeats, the error boundary). The activity names are the
saga's contract with Temporal: recorded histories replay against them.

Each is idempotent (a retried activity finds its own earlier work) and maps plnt's errors at the
boundary: NeedsHuman becomes a non-retryable ApplicationError named after the error class.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any

from plnt.reconciler.saga.activities.dependencies import DependenciesStep
from plnt.reconciler.saga.activities.gates import GatesStep
from plnt.reconciler.saga.activities.install import InstallStep
from plnt.reconciler.saga.activities.promote_remove import PromoteRemoveSteps
from plnt.reconciler.saga.activities.pull import PullStep
from plnt.reconciler.saga.activities.recorder import PhaseRecorder
from plnt.reconciler.saga.activities.smoke_test import SmokeTestStep
from plnt.reconciler.saga.activities.validate import ValidateStep
from plnt.reconciler.saga.io import PhaseUpdate


class SagaActivities(ValidateStep, DependenciesStep, PullStep, InstallStep, SmokeTestStep, GatesStep,
                     PromoteRemoveSteps):
    """Every step of the saga in one object (constructed with SagaStep's arguments), and the status
    writes when a status store is given (`plnt up`: one worker runs the saga and all its steps)."""

    @functools.cached_property
    def _recorder(self) -> PhaseRecorder | None:
        # None on a worker of split roles: the reconciler records phases (PhaseRecorder).
        return PhaseRecorder(self._statuses) if self._statuses is not None else None

    def all(self) -> list[Callable[..., Any]]:
        """Every activity of the saga, for `plnt up` (one worker runs the saga and all its steps)."""
        if self._recorder is None:
            raise ValueError("SagaActivities without a status store has no record_phase: use remote()")
        return [self._recorder.record_phase, *self.remote()]

    def remote(self) -> list[Callable[..., Any]]:
        """The steps a `plnt worker` runs: all but record_phase (a local activity of the saga)."""
        return [self.validate, self.wait_for_dependencies, self.pull_recipe, self.install_release, self.smoke_test,
                self.set_canary_traffic, self.check_gates, self.promote_release, self.remove_release]

    @property
    def recorder(self) -> PhaseRecorder:
        if self._recorder is None:
            raise AttributeError("the status writes run beside the saga (PhaseRecorder), not on this worker")
        return self._recorder

    @property
    def record_phase(self) -> Callable[[PhaseUpdate], Awaitable[None]]:
        if self._recorder is None:
            raise AttributeError("record_phase runs beside the saga (PhaseRecorder), not on this worker")
        return self._recorder.record_phase
