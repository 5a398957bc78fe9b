"""The plan: a pure function of (desired, live) deciding what each WorkflowRun needs.

No I/O here. The reconciler builds `DesiredRun`s from the specs at a commit and `LiveRun`s from
the driver's releases and the status store; `plnt plan --base --head` builds both sides from two
commits. Every item carries the reason and, for an upgrade, the fields that changed.

A change of the replica count only (`replicas`, `autoscaling`: outside the spec fingerprint) is a
"scale": the live release runs more or fewer processes, no saga (its version is proven). With
`autoscaling` any count within [replicas.min, replicas.max] is in sync (the autoscaler moves it);
without, the count is replicas.min.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from plnt.core.specs.models import Deployable, flatten, replica_count
from plnt.core.status import Phase, Pin, WorkflowRunStatus
from plnt.reconciler.state import LiveWorkflow

IN_SYNC = "in sync"  # the reason of an unchanged item whose release runs its spec (placement may still move it)


class Action(str, Enum):
    INSTALL = "install"
    UPGRADE = "upgrade"
    UNINSTALL = "uninstall"
    SCALE = "scale"  # replicas only: the live release scaled in place, no saga
    UNCHANGED = "unchanged"


@dataclass(frozen=True)
class DesiredRun:
    namespace: str
    name: str
    version: str
    fingerprint: str
    spec: Mapping[str, Any]  # spec as camelCase JSON, for naming what changed
    self_heal: bool = True
    # The replica counts in sync with the spec: replicas.min (at least 1) up to replicas.max with
    # autoscaling (the autoscaler's range), else replicas.min only.
    replicas: int = 1
    replicas_max: int = 1

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @classmethod
    def from_spec(cls, run: Deployable) -> DesiredRun:
        return cls(
            namespace=run.metadata.namespace,
            name=run.metadata.name,
            version=run.version,
            fingerprint=run.fingerprint(),
            spec=run.spec.model_dump(mode="json", by_alias=True),
            self_heal=run.spec.self_heal,
            replicas=(low := replica_count(run.spec)),
            replicas_max=max(low, run.spec.replicas.max or low) if getattr(run.spec, "autoscaling", None) else low,
        )


@dataclass(frozen=True)
class LiveRun:
    namespace: str
    name: str
    version: str | None = None          # the stable (promoted) release, if any
    fingerprint: str | None = None
    spec: Mapping[str, Any] | None = None
    # The newest saga's spec and whether it ended in RolledBack/Failed: such a spec is held
    # until it changes, so one bad commit runs one saga, not one per poll.
    failed_fingerprint: str | None = None
    failed_reason: str | None = None
    saga_running: bool = False
    # What the running saga deploys: its spec fingerprint, or None for an uninstall saga.
    saga_fingerprint: str | None = None
    # What plnt last promoted: when the live release no longer matches it, it drifted out of band.
    deployed_fingerprint: str | None = None
    # A person's emergency pin (plnt rollback --now): this version stays until a commit naming it lands.
    pin: Pin | None = None
    replicas: int | None = None  # the stable release's replica count (None: not known)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @classmethod
    def as_deployed(cls, desired: DesiredRun) -> LiveRun:
        """A commit's spec as if it were deployed: the live side of a commit-to-commit plan."""
        return cls(namespace=desired.namespace, name=desired.name, version=desired.version,
                   fingerprint=desired.fingerprint, spec=desired.spec, replicas=desired.replicas)


@dataclass(frozen=True)
class Change:
    field: str
    old: Any
    new: Any

    def __str__(self) -> str:
        return f"{self.field}: {_show(self.old)} -> {_show(self.new)}"


@dataclass(frozen=True)
class PlanItem:
    namespace: str
    name: str
    action: Action
    reason: str
    from_version: str | None = None
    to_version: str | None = None
    changes: tuple[Change, ...] = field(default_factory=tuple)
    waiting: bool = False  # a saga for this WorkflowRun is running; act when it ends
    supersedes: bool = False  # ...and it deploys something else than the newest spec: cancel it
    after: tuple[str, ...] = ()  # dependsOn: its saga waits for these to be promoted first
    # A scale: the live release's replica count and the one it gets (None for other actions).
    from_replicas: int | None = None
    to_replicas: int | None = None
    # Where each replica goes and why (reconciler/plan/placement.py), for a pool or declared capacity;
    # `unplaceable`: the capacity it lacks. Such an item starts no saga: what runs keeps serving.
    placement: tuple[str, ...] = ()
    unplaceable: str | None = None
    # A pool's replicas per backend as placed (what its saga installs, or a re-placing scale moves to).
    replicas_by_backend: tuple[tuple[str, int], ...] = ()
    # The spec in git already failed and the stable release serves the spec deployed before it: no saga
    # until a commit changes it, but a re-placement moves that stable (placed as the spec it serves).
    held: bool = False

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def needs_saga(self) -> bool:
        return self.action not in (Action.UNCHANGED, Action.SCALE) and not self.waiting and self.unplaceable is None

    def to_json(self) -> dict[str, Any]:
        return {
            "namespace": self.namespace,
            "name": self.name,
            "action": self.action.value,
            "reason": self.reason,
            "fromVersion": self.from_version,
            "toVersion": self.to_version,
            "changes": [{"field": c.field, "old": c.old, "new": c.new} for c in self.changes],
            "waiting": self.waiting,
            "supersedes": self.supersedes,
            "after": list(self.after),
            **({"fromReplicas": self.from_replicas, "toReplicas": self.to_replicas}
               if self.action is Action.SCALE else {}),
            "placement": list(self.placement),
            "unplaceable": self.unplaceable,
            **({"replicasByBackend": dict(self.replicas_by_backend)} if self.replicas_by_backend else {}),
        }


def live_from(
    releases: Mapping[str, LiveWorkflow],
    statuses: Iterable[WorkflowRunStatus],
    running_sagas: Mapping[str, str | None] | Iterable[str] = (),
) -> dict[str, LiveRun]:
    """The live side of a plan: promoted releases from the driver, the newest saga's outcome from
    status, and the running sagas (key -> the fingerprint each deploys, None for an uninstall)."""
    by_key = {status.key: status for status in statuses}
    running = dict(running_sagas) if isinstance(running_sagas, Mapping) else dict.fromkeys(running_sagas)
    return {key: live_run(key, releases.get(key), by_key.get(key), key in running, running.get(key))
            for key in set(releases) | set(by_key) | set(running)}


def live_run(key: str, release: LiveWorkflow | None, status: WorkflowRunStatus | None,
             saga_running: bool, saga_fingerprint: str | None) -> LiveRun:
    namespace, name = key.split("/", 1)
    stable = release.stable if release is not None else None
    failed = status is not None and status.phase in (Phase.ROLLED_BACK, Phase.FAILED)
    return LiveRun(
        namespace=namespace,
        name=name,
        version=stable.version if stable else None,
        fingerprint=stable.spec_fingerprint if stable else None,
        spec=status.deployed_spec if status else None,
        failed_fingerprint=status.attempted_fingerprint if failed and status else None,
        failed_reason=status.last_error if failed and status else None,
        saga_running=saga_running,
        saga_fingerprint=saga_fingerprint,
        deployed_fingerprint=status.deployed_fingerprint if status else None,
        pin=status.pin if status else None,
        replicas=stable.replicas if stable else None,
    )


class PlanMemo:
    """`plan(desired, live_from(releases, statuses, running))` for the reconciler, which asks after
    every saga's end: during a rollout of 1,000 WorkflowRuns that is every ~120 ms, and deciding all
    1,000 each time took a fifth of plnt's event loop.

    A WorkflowRun is decided again only when one of its inputs is not the very object it was last
    time: the desired side is built once per commit, and release records and statuses are immutable
    (a change replaces the object). The running saga is compared by value. `keep(key)` leaves out
    live-only WorkflowRuns (the reconciler's preview releases)."""

    def __init__(self) -> None:
        self._decided: dict[str, tuple[Any, ...]] = {}
        self.last_decided: list[str] = []  # keys the last plan decided afresh (the rest came from the memo)
        self.plans = 0  # how often it was asked: the reconciler skips it when nothing changed

    def plan(self, desired: Mapping[str, DesiredRun], releases: Mapping[str, LiveWorkflow],
             statuses: Iterable[WorkflowRunStatus], running: Mapping[str, str | None],
             keep: Callable[[str], bool] = lambda key: True) -> list[PlanItem]:
        by_key = {status.key: status for status in statuses}
        keys = set(desired) | {key for key in set(releases) | set(by_key) | set(running) if keep(key)}
        decided: dict[str, tuple[Any, ...]] = {}
        items = []
        self.last_decided = []
        self.plans += 1
        for key in sorted(keys):
            want, release, status = desired.get(key), releases.get(key), by_key.get(key)
            saga = (key in running, running.get(key))
            last = self._decided.get(key)
            if last is not None and last[0] is want and last[1] is release and last[2] is status and last[3] == saga:
                entry = last
            else:
                has_live = release is not None or status is not None or saga[0]
                have = live_run(key, release, status, *saga) if has_live else None
                entry = (want, release, status, saga, _ordered(_decide(want, have), desired))
                self.last_decided.append(key)
            decided[key] = entry
            if entry[4] is not None:
                items.append(entry[4])
        self._decided = decided  # what left the inputs is forgotten (and its objects released)
        return items


def plan(desired: Mapping[str, DesiredRun], live: Mapping[str, LiveRun]) -> list[PlanItem]:
    items = [_ordered(_decide(desired.get(key), live.get(key)), desired) for key in sorted(set(desired) | set(live))]
    return [item for item in items if item is not None]


def _ordered(item: PlanItem | None, desired: Mapping[str, DesiredRun]) -> PlanItem | None:
    """An install or upgrade names the dependencies (dependsOn) its saga waits for."""
    if item is None or item.action not in (Action.INSTALL, Action.UPGRADE):
        return item
    want = desired.get(item.key)
    names = tuple(want.spec.get("dependsOn") or ()) if want is not None else ()
    return dataclasses.replace(item, after=names) if names else item


def _decide(want: DesiredRun | None, have: LiveRun | None) -> PlanItem | None:
    waiting = have is not None and have.saga_running
    # The newest spec wins: a running saga for anything else is cancelled (it compensates).
    supersedes = waiting and have is not None and have.saga_fingerprint != (want.fingerprint if want else None)
    if want is None:
        assert have is not None
        if have.version is None and not have.saga_running:
            return None  # never deployed, now gone from the repo: nothing to remove
        return PlanItem(have.namespace, have.name, Action.UNINSTALL, "removed from the repository",
                        from_version=have.version, waiting=waiting, supersedes=supersedes)

    if have is not None and have.pin is not None and have.pin.version != want.version:
        # Pinned by a person: what runs stays (the pin's own saga included) until the commit lands.
        return PlanItem(want.namespace, want.name, Action.UNCHANGED, f"drift: {have.pin.drift()}; the spec names "
                        f"{want.version}", from_version=have.version, to_version=want.version, waiting=waiting)
    base = dict(namespace=want.namespace, name=want.name, to_version=want.version, waiting=waiting,
                supersedes=supersedes)
    # Drift: the spec is what plnt last deployed, but the live release is gone or changed out of band
    # (e.g. a Helm release removed or upgraded by hand). Restored by the saga below, or only reported.
    drifted = (have is not None and not waiting and have.deployed_fingerprint == want.fingerprint
               and have.fingerprint != want.fingerprint)
    if drifted:
        assert have is not None
        what = "is gone" if have.version is None else f"runs {have.version} with another spec"
        if not want.self_heal:
            return PlanItem(action=Action.UNCHANGED, from_version=have.version,
                            reason=f"drift: the release plnt deployed {what} (selfHeal: false, so only reported)", **base)
        action = Action.INSTALL if have.version is None else Action.UPGRADE
        return PlanItem(action=action, from_version=have.version,
                        reason=f"drift: the release plnt deployed {what}; restoring it (selfHeal)", **base)
    if have is None or have.version is None:
        if have is not None and have.failed_fingerprint == want.fingerprint:
            return PlanItem(action=Action.UNCHANGED, reason=_held(have), **base)
        return PlanItem(action=Action.INSTALL, reason="new WorkflowRun", **base)

    if have.fingerprint == want.fingerprint:
        if supersedes:  # back to what runs: stop the saga that would replace it
            return PlanItem(action=Action.UNCHANGED, reason="in sync; the running saga is superseded",
                            from_version=have.version, **base)
        scale = _scale(want, have)
        if scale is not None and not waiting:
            return PlanItem(action=Action.SCALE, reason=f"replicas {have.replicas} -> {scale}", from_version=have.version,
                            from_replicas=have.replicas, to_replicas=scale, **base)
        return PlanItem(action=Action.UNCHANGED, reason=IN_SYNC, from_version=have.version, **base)
    if have.failed_fingerprint == want.fingerprint:
        return PlanItem(action=Action.UNCHANGED, reason=_held(have), from_version=have.version, held=True, **base)

    changes = diff_specs(have.spec or {}, want.spec)
    reason = "; ".join(str(change) for change in changes) or "spec changed"
    return PlanItem(action=Action.UPGRADE, reason=reason, from_version=have.version, changes=tuple(changes), **base)


def _scale(want: DesiredRun, have: LiveRun) -> int | None:
    """The replica count the live release must get, or None when its count is in sync."""
    if have.replicas is None or want.replicas <= have.replicas <= want.replicas_max:
        return None
    return min(max(have.replicas, want.replicas), want.replicas_max)


def diff_specs(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[Change]:
    before, after = flatten(dict(old)), flatten(dict(new))
    return [
        Change(key, before.get(key), after.get(key))
        for key in sorted(set(before) | set(after))
        if before.get(key) != after.get(key)
    ]


def _held(have: LiveRun) -> str:
    serving = f"; {have.version} keeps serving" if have.version else ""
    return f"held: this spec already failed ({have.failed_reason or 'see status'}){serving}; commit a change to try again"


def _show(value: Any) -> str:
    return "(unset)" if value is None else json.dumps(value) if not isinstance(value, str) else value


# --- rendering --------------------------------------------------------------------------------

_SYMBOL = {Action.INSTALL: "+", Action.UPGRADE: "~", Action.UNINSTALL: "-", Action.SCALE: "^", Action.UNCHANGED: "="}


def render_text(items: list[PlanItem]) -> str:
    if not items:
        return "No WorkflowRuns.\n"
    lines = []
    for item in items:
        versions = _versions(item)
        wait = (" (supersedes the running saga)" if item.supersedes
                else " (waiting for the running saga)" if item.waiting else "")
        wait += f" (after {', '.join(item.after)})" if item.after else ""
        lines.append(f"{_SYMBOL[item.action]} {item.key:<40} {item.action.value:<9} {versions}{wait}")
        if item.action is Action.UPGRADE and item.changes:
            lines.extend(f"    {change}" for change in item.changes)
        else:
            lines.append(f"    {item.reason}")
        lines.extend(f"    {line}" for line in item.placement)
    lines.append(summary(items))
    return "\n".join(lines) + "\n"


def render_markdown(items: list[PlanItem], title: str = "plnt plan") -> str:
    out = [f"### {title}", "", summary(items), ""]
    if items:
        out += ["| | WorkflowRun | Action | Version | Why |", "|---|---|---|---|---|"]
        for item in items:
            why = "<br>".join(f"`{c.field}`: {_md(_show(c.old))} → {_md(_show(c.new))}" for c in item.changes) or _md(item.reason)
            after = f" (after {', '.join(item.after)})" if item.after else ""
            out.append(f"| {_SYMBOL[item.action]} | `{item.key}` | **{item.action.value}**{_md(after)} | "
                       f"{_md(_versions(item))} | {why} |")
    placed = [item for item in items if item.placement]
    if placed:
        out += ["", "#### Where the replicas go", ""]
        for item in placed:
            out.append(f"- `{item.key}`" + (" **cannot be placed**: nothing of it is deployed, what runs keeps serving"
                                            if item.unplaceable else ""))
            out.extend(f"  - {_md(line)}" for line in item.placement)
    return "\n".join(out) + "\n"


def summary(items: list[PlanItem]) -> str:
    counts = {action: sum(1 for i in items if i.action is action) for action in Action}
    scales = f"{counts[Action.SCALE]} to scale, " if counts[Action.SCALE] else ""
    unplaceable = sum(1 for i in items if i.unplaceable)
    return (f"Plan: {counts[Action.INSTALL]} to install, {counts[Action.UPGRADE]} to upgrade, {scales}"
            f"{counts[Action.UNINSTALL]} to uninstall, {counts[Action.UNCHANGED]} unchanged"
            + (f"; {unplaceable} cannot be placed." if unplaceable else "."))


def _versions(item: PlanItem) -> str:
    if item.action is Action.SCALE:
        return f"{item.to_version or ''} replicas {item.from_replicas} -> {item.to_replicas}".strip()
    if item.action is Action.INSTALL:
        return item.to_version or ""
    if item.action is Action.UNINSTALL:
        return item.from_version or ""
    if item.from_version and item.to_version and item.from_version != item.to_version:
        return f"{item.from_version} -> {item.to_version}"
    return item.to_version or item.from_version or ""


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")
