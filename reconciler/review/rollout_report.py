"""The verdict of each rollout goes back to the commit it deploys, as a forge commit status.

Context `plnt/<namespace>/<name>` on the saga's commit (`WorkflowRunStatus.rollout.commit`, written
only by the saga, never a later commit merely observed "in sync"): pending while Verifying,
Deploying or Canary, success when Ready, failure when RolledBack or Failed, with the smoke numbers
against their budgets or the reason. `verdict` is pure and table-tested.

`StatusFollower` is the shared machinery of this reporter and of the git notes writer
(plnt.reconciler.review.notes): chained onto `StatusStore.on_change` (callable from any thread), it wakes
one asyncio task that derives what should be published from the statuses, coalesces per key (only
the newest value of a key is delivered) and delivers in order; a transient failure is retried with
backoff, never blocking a saga or the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Hashable, Mapping
from typing import Any, Generic, TypeVar

from plnt.core.routes import preview_of
from plnt.core.status import Phase, WorkflowRunStatus
from plnt.reconciler.redact import redact
from plnt.reconciler.review.forge import Forge, ForgeError, ForgeRefused, ForgeUnavailable, State
from plnt.reconciler.status_store import StatusStore

log = logging.getLogger(__name__)

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

PENDING_PHASES = {Phase.VERIFYING, Phase.DEPLOYING, Phase.CANARY}


def context_for(namespace: str, name: str) -> str:
    return f"plnt/{namespace}/{name}"


def _ms(value: float) -> str:
    return f"{value:.0f}" if value >= 10 else f"{value:.3g}"


def _num(value: Any) -> str:
    return f"{float(value):g}"


def smoke_summary(smoke: dict[str, Any] | None, budget: dict[str, Any] | None) -> str | None:
    """`p95 41 ms ≤ 2500, errors 0% ≤ 1%` from a smoke record (SmokeResult as JSON) and the
    spec's canary.smokeTest budgets (camelCase); a measure over its budget reads `>`; None without numbers."""
    metrics = (smoke or {}).get("metrics")
    if not isinstance(metrics, dict) or metrics.get("p95_ms") is None:
        return None
    budget = budget or {}

    def part(label: str, value: float | None, limit: Any, unit: str, fmt: Callable[[float], str]) -> str | None:
        if value is None:
            return None
        if limit is None:
            return f"{label} {fmt(value)}{unit}"
        return f"{label} {fmt(value)}{unit} {'≤' if value <= float(limit) else '>'} {_num(limit)}{unit.strip() if unit == '%' else ''}"

    parts = [
        part("p95", metrics.get("p95_ms"), budget.get("p95BudgetMs"), " ms", _ms),
        part("errors", metrics.get("error_percent"), budget.get("errorBudgetPercent"), "%", _num),
        part("TTFT p95", metrics.get("ttft_p95_ms"), budget.get("ttftBudgetMs"), " ms", _ms),
        part("TPOT p95", metrics.get("tpot_p95_ms"), budget.get("tpotBudgetMs"), " ms", _ms),
    ]
    return ", ".join(p for p in parts if p)


def budget_summary(budget: dict[str, Any] | None) -> str | None:
    """`p95 ≤ 2500 ms, errors ≤ 1%` (what a canary under test must meet)."""
    if not budget:
        return None
    parts = []
    if budget.get("p95BudgetMs") is not None:
        parts.append(f"p95 ≤ {_num(budget['p95BudgetMs'])} ms")
    if budget.get("errorBudgetPercent") is not None:
        parts.append(f"errors ≤ {_num(budget['errorBudgetPercent'])}%")
    if budget.get("ttftBudgetMs") is not None:
        parts.append(f"TTFT p95 ≤ {_num(budget['ttftBudgetMs'])} ms")
    if budget.get("tpotBudgetMs") is not None:
        parts.append(f"TPOT p95 ≤ {_num(budget['tpotBudgetMs'])} ms")
    return ", ".join(parts) or None


def _one_line(text: str) -> str:
    return redact(" ".join(text.split()))


def verdict(status: WorkflowRunStatus) -> tuple[State, str] | None:
    """(state, description) of the rollout this status records, or None when there is none to report
    (no saga yet, Pending, Deleting). The forge client truncates the description to its limit."""
    mark = status.rollout
    if mark is None:
        return None
    tried = status.attempted_version or status.version or "?"
    if mark.phase is Phase.CANARY:
        where = f"Canary {tried}" + (f" step {status.canary_step}/{status.canary_steps}" if status.canary_step else "")
        where += f" at {status.traffic_percent}%"
        # A step's pause, or a hold for a person (saga/workflow.py): "step 2/3 passed at 25%; pausing 5m ...".
        passed, sep, waiting = mark.message.partition("; ")
        if sep and (" passed at " in passed or passed == "the canary passed"):
            return "pending", _one_line(f"{where}: passed, {waiting}")
        progress = status.smoke_progress or {}
        so_far = smoke_summary(progress, status.smoke_budget)
        if so_far:  # the running smoke test's numbers so far (reconciler/saga/smoke_progress.py)
            return "pending", _one_line(f"{where}: {progress.get('done')}/{progress.get('of')} calls, {so_far}")
        budgets = budget_summary(status.smoke_budget)
        return "pending", _one_line(f"{where}: smoke test" + (f" against {budgets}" if budgets else " under way"))
    if mark.phase in PENDING_PHASES:
        return "pending", _one_line(f"{mark.phase.value}: {mark.message}" if mark.message else mark.phase.value)
    if mark.phase is Phase.READY:
        by_hand = mark.message.partition("; ")[2]
        if by_hand.startswith("promoted by "):  # a person promoted it (plnt rollout promote)
            return "success", _one_line(f"Ready {status.version or tried}: {by_hand}")
        numbers = smoke_summary(status.smoke_test, status.smoke_budget)
        return "success", _one_line(f"Ready {status.version or tried}: {numbers}" if numbers else
                                    f"Ready {status.version or tried}: {mark.message}")
    if mark.phase is Phase.ROLLED_BACK:
        serving = f" ({status.version} serving)" if status.version else ""
        # "smoke test failed: " says nothing the status does not; a stepped canary's place stays.
        place, sep, rest = mark.message.partition(": smoke test failed: ")
        reason = f"{place}: {rest}" if sep and place.startswith("step ") else mark.message.removeprefix("smoke test failed: ")
        return "failure", _one_line(f"RolledBack {tried}{serving}: {reason}")
    if mark.phase is Phase.FAILED:
        return "failure", _one_line(f"Failed {tried}: {mark.message or status.last_error or 'no reason recorded'}")
    return None


def rollout_reports(statuses: list[WorkflowRunStatus]) -> dict[tuple[str, str], tuple[State, str]]:
    """(commit, context) -> (state, description) for every status with a rollout to report."""
    out: dict[tuple[str, str], tuple[State, str]] = {}
    for status in statuses:
        if preview_of(status.name) is not None:
            continue  # a preview's verdict goes to its pull request as plnt/preview/... (reconciler/review/previews.py)
        found = verdict(status)
        if found is not None and status.rollout is not None:
            out[(status.rollout.commit, context_for(status.namespace, status.name))] = found
    return out


class RetryLater(Exception):
    """A delivery failed for a while (the forge or the git server is unreachable): retry later."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class StatusFollower(Generic[K, V]):
    """Derives {key: value} from the statuses on every change and delivers each new value once, the
    newest value of a key only (coalesced), in order, from one task. `deliver` raises RetryLater for
    a transient failure (kept, retried with backoff); any other error is logged once and the value
    dropped (retrying the same request will not help)."""

    name = "status-follower"

    def __init__(self, statuses: StatusStore, *, initial_backoff_s: float = 1.0, max_backoff_s: float = 60.0,
                 drain_s: float = 5.0) -> None:
        self._statuses = statuses
        self._drain_s = drain_s
        self._initial_backoff_s = initial_backoff_s
        self._max_backoff_s = max_backoff_s
        self._wake = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._done: dict[K, V] = {}
        self._pending: dict[K, V] = {}
        self._logged: set[str] = set()
        self.delivered = 0  # counts for tests and benches

    # --- what subclasses say --------------------------------------------------------------------

    def desired(self, statuses: list[WorkflowRunStatus]) -> dict[K, V]:
        raise NotImplementedError

    async def deliver(self, key: K, value: V) -> None:
        raise NotImplementedError

    # --- hooks (any thread) ---------------------------------------------------------------------

    def changed(self) -> None:
        """StatusStore.on_change: wake the task (it reads the statuses itself, so no change is lost
        and none arrives out of order, whichever thread called)."""
        loop = self._loop
        if loop is None:
            self._wake.set()
            return
        with contextlib.suppress(RuntimeError):  # the loop is closing: nothing left to wake
            loop.call_soon_threadsafe(self._wake.set)

    def attach(self) -> Callable[[], Awaitable[None]]:
        """Chain onto statuses.on_change (what is set there keeps running first), start the task;
        returns the cleanup that stops it (what is still pending then is delivered by the next start)."""
        previous = self._statuses.on_change

        def on_change() -> None:
            previous()
            self.changed()

        self._statuses.on_change = on_change
        stop = asyncio.Event()
        task = asyncio.create_task(self.run(stop), name=self.name)

        async def cleanup() -> None:
            stop.set()
            self._wake.set()
            try:
                async with asyncio.timeout(self._drain_s + 10):
                    await task
            except (TimeoutError, asyncio.CancelledError):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

        return cleanup

    # --- the task -------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        self._loop = asyncio.get_running_loop()
        backoff = self._initial_backoff_s
        self._wake.set()  # a first pass at start: what a previous run left undelivered goes now
        while not stop.is_set():
            self._wake.clear()
            self._collect()
            delay = await self._flush(stop)
            if delay is None:
                backoff = self._initial_backoff_s
                timeout = None
            else:
                timeout = max(delay, backoff) if delay > 0 else backoff
                backoff = min(backoff * 2, self._max_backoff_s)
            waits = [asyncio.ensure_future(self._wake.wait()), asyncio.ensure_future(stop.wait())]
            try:
                await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waits:
                    w.cancel()
        # Stopping: what the last changes asked for still goes out, within a bound (the rest is sent
        # by the next start: every start delivers what the statuses say).
        self._collect()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self._drain_s):
                await self._flush(None)

    def _collect(self) -> None:
        try:
            desired = self.desired(self._statuses.all())
        except Exception:  # noqa: BLE001 - a bug here must not stop the follower
            log.exception("%s-failed", self.name)
            return
        for key, value in desired.items():
            if self._done.get(key) != value and self._pending.get(key) != value:
                self._pending.pop(key, None)  # re-inserted last: keeps the order of changes
                self._pending[key] = value
        # Keys no longer derived are over (a rollout moved to a newer commit): forget what was sent.
        for key in [k for k in self._done if k not in desired]:
            del self._done[key]

    async def _flush(self, stop: asyncio.Event | None) -> float | None:
        """Deliver what is pending, in order; None when all went, else seconds to wait (0: backoff)."""
        while self._pending and not (stop is not None and stop.is_set()):
            key, value = next(iter(self._pending.items()))
            try:
                await self.deliver(key, value)
            except RetryLater as exc:
                self._log_once(f"{self.name}-retry {key}: {exc}", logging.WARNING)
                return exc.retry_after or 0.0
            except Exception as exc:  # noqa: BLE001 - dropped: the same request would fail the same way
                # Once per distinct message: a token without the permission fails every key the same way.
                self._log_once(f"{self.name}-dropped: {type(exc).__name__}: {exc}", logging.ERROR)
            else:
                self.delivered += 1
            if self._pending.get(key) == value:
                del self._pending[key]
            self._done[key] = value
        return None

    def _log_once(self, message: str, level: int) -> None:
        message = redact(message)
        if message not in self._logged:
            if len(self._logged) > 1000:
                self._logged.clear()
            self._logged.add(message)
            log.log(level, "%s", message)


class RolloutReporter(StatusFollower[tuple[str, str], tuple[State, str]]):
    """Each rollout's verdict as a commit status through the forge client (which posts nothing when
    the context's latest status already says the same: one status per change, never a flood)."""

    name = "rollout-status"

    def __init__(self, forge: Forge, statuses: StatusStore, *, target_url: str | None = None, **options: Any) -> None:
        super().__init__(statuses, **options)
        self._forge = forge
        self._target_url = target_url
        self.posted: list[tuple[str, str, State, str]] = []  # (commit, context, state, description) sent

    def desired(self, statuses: list[WorkflowRunStatus]) -> dict[tuple[str, str], tuple[State, str]]:
        return rollout_reports(statuses)

    async def deliver(self, key: tuple[str, str], value: tuple[State, str]) -> None:
        commit, context = key
        state, description = value
        try:
            if await self._forge.set_status(commit, state, context, description, self._target_url):
                self.posted.append((commit, context, state, description))
                log.info("rollout-status commit=%s context=%s state=%s", commit[:12], context, state)
        except ForgeUnavailable as exc:
            raise RetryLater(str(exc), exc.retry_after) from None
        except ForgeRefused as exc:  # names the permission the token needs
            raise ForgeError(f"commit statuses are refused: {exc}") from None


# The commit status plnt sets on a commit --verify-commits refuses (and on the untrusted commit itself).
VERIFY_CONTEXT = "plnt/verify-commits"


def refusal_reports(source_status: Mapping[str, Any]) -> dict[tuple[str, str], tuple[State, str]]:
    """{(commit, plnt/verify-commits): (failure, "refused: commit X is not trusted: WHY")} for the
    newest commit of the branch when --verify-commits refused it, on it and on the commit that is not
    trusted (a pull request's own commit: its page then shows why). Pure."""
    untrusted = source_status.get("untrusted")
    newest = source_status.get("newestCommit")
    if not isinstance(untrusted, dict) or not isinstance(newest, str):
        return {}
    problems = source_status.get("problems") or []
    description = f"refused: {problems[0]}" if problems else f"refused: commit {untrusted['commit'][:12]} is not trusted"
    return {(commit, VERIFY_CONTEXT): ("failure", description) for commit in dict.fromkeys((newest, untrusted["commit"]))}


class RefusalReporter(RolloutReporter):
    """What --verify-commits refused, as a failing `plnt/verify-commits` status (woken by the
    reconciler's source_listeners: a refusal changes no WorkflowRun status when nothing runs yet)."""

    name = "verify-commits-status"

    def __init__(self, forge: Forge, statuses: StatusStore, source_status: Callable[[], Mapping[str, Any]],
                 **options: Any) -> None:
        super().__init__(forge, statuses, **options)
        self._source_status = source_status

    def desired(self, statuses: list[WorkflowRunStatus]) -> dict[tuple[str, str], tuple[State, str]]:
        return refusal_reports(self._source_status())


def attach_refusal_reporter(forge: Forge, statuses: StatusStore, source_status: Callable[[], Mapping[str, Any]],
                            source_listeners: list[Callable[[], None]], **options: Any) -> Callable[[], Awaitable[None]]:
    """`--verify-commits` with `--forge` and `--report-status`: start reporting refusals; returns the cleanup."""
    reporter = RefusalReporter(forge, statuses, source_status, **options)
    source_listeners.append(reporter.changed)
    return reporter.attach()


def attach_rollout_reporter(forge: Forge, statuses: StatusStore, **options: Any) -> Callable[[], Awaitable[None]]:
    """`--forge` with `--report-status` (the default): start reporting; returns the cleanup."""
    reporter = RolloutReporter(forge, statuses, **options)
    log.info("rollout-status on: each rollout's verdict goes to its commit as status plnt/NAMESPACE/NAME")
    return reporter.attach()
