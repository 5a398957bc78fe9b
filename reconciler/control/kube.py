"""plnt's own calls to the Kubernetes API, through the official `kubernetes` client (its sync API,
run in threads): the reconciler's leader Lease, and the WorkflowRun custom resources of
`--mirror-status`. Every call made here is listed in plnt.reconciler.control.kube_calls (the chart's RBAC).

Neither ever crashes its caller on an API error: the lease treats an error as "unknown" (lost only
once a whole lease duration passes without a successful renew), the mirror logs it and tries again
on the next change (and on a backoff timer), so a dead API server never stalls reconciling.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import hashlib
import json
import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import urllib3
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from plnt.core.status import Phase, WorkflowRunStatus
from plnt.reconciler.control.crds import GROUP, MANAGED_BY, MANAGED_BY_LABEL, VERSION, cr_status
from plnt.reconciler.errors import PlntError
from plnt.reconciler.redact import redact
from plnt.reconciler.status_store import StatusStore

if TYPE_CHECKING:
    from collections.abc import Mapping

    from plnt.core.specs.loader import SpecSet
    from plnt.core.specs.models import WorkflowRun
    from plnt.reconciler.settings import Settings
    from plnt.reconciler.source.kubernetes import KubernetesSource, ListedObject

log = logging.getLogger(__name__)

FIELD_MANAGER = "plnt"
PLURAL = "workflowruns"
APPLY_PATCH = "application/apply-patch+yaml"


class KubeConfigError(PlntError):
    """No way to reach the Kubernetes API: neither --kubeconfig nor an in-cluster service account."""


def api_client(kubeconfig: Path | None = None, context: str | None = None) -> k8s.ApiClient:
    """A client from a kubeconfig file, else from the pod's service account (in-cluster)."""
    from kubernetes import config
    from kubernetes.config.config_exception import ConfigException

    try:
        if kubeconfig is not None:
            return config.new_client_from_config(config_file=str(kubeconfig), context=context)
        configuration = k8s.Configuration()
        config.load_incluster_config(client_configuration=configuration)
        return k8s.ApiClient(configuration)
    except (ConfigException, OSError) as exc:
        where = f"--kubeconfig {kubeconfig}" if kubeconfig else "in-cluster config (no service account mounted?)"
        raise KubeConfigError(f"cannot reach Kubernetes through {where}: {exc}; run plnt in a pod with a "
                              "service account, or pass --kubeconfig FILE") from None


def api_error(exc: BaseException) -> str:
    """A short, secret-free description of a failed call (never the request, never headers)."""
    if isinstance(exc, ApiException):
        return f"HTTP {exc.status} {exc.reason or ''}".strip()
    return redact(f"{type(exc).__name__}: {str(exc)[:200]}")


def _status_of(exc: BaseException) -> int | None:
    return exc.status if isinstance(exc, ApiException) and exc.status else None


def _micro_time(when: datetime) -> datetime:
    # The client writes datetimes with isoformat(), which leaves out ".000000" when the microseconds
    # are 0; the API server parses Lease times as RFC3339Micro and would refuse that one in a million.
    return when if when.microsecond else when.replace(microsecond=1)


async def _sleep(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(max(0.0, seconds)):
            await stop.wait()


# --- leader election -----------------------------------------------------------------------------

class _Try(enum.Enum):
    HOLDING = "holding"  # created, taken over or renewed: this replica holds the lease
    HELD = "held"  # another replica holds an unexpired lease
    CONFLICT = "conflict"  # someone else wrote the Lease first (409): try again later
    ERROR = "error"  # the API did not answer usefully: unknown


class KubernetesLease:
    """A coordination.k8s.io/v1 Lease, as client-go's leaderelection uses one.

    holderIdentity names the leader; it renews renewTime every `renew_every_s`. Another replica takes
    over only a lease it has seen unchanged for leaseDurationSeconds (measured on its own clock from
    when it observed the record, as client-go does: no trust in other machines' clocks), or one whose
    holderIdentity is empty (released). Every write carries the resourceVersion it read, so of two
    replicas taking over at once one gets 409 Conflict and keeps waiting.
    """

    def __init__(self, name: str, namespace: str, identity: str, lease_duration_s: int = 15,
                 renew_every_s: float = 5, api: k8s.CoordinationV1Api | k8s.ApiClient | None = None,
                 request_timeout_s: float = 5.0, clock: Callable[[], float] = time.monotonic) -> None:
        if renew_every_s >= lease_duration_s:
            raise ValueError("renew_every_s must be shorter than lease_duration_s, or the lease lapses between renewals")
        self.name, self.namespace, self.identity = name, namespace, identity
        self.lease_duration_s = lease_duration_s
        self.renew_every_s = renew_every_s
        self._api = k8s.CoordinationV1Api(api) if isinstance(api, k8s.ApiClient) else api or k8s.CoordinationV1Api()
        self._timeout = request_timeout_s
        self._clock = clock
        self._observed: tuple[Any, ...] | None = None
        self._observed_at = 0.0
        self._renewed_at: float | None = None  # clock() before the request of the newest successful write

    @property
    def held(self) -> bool:
        return self._renewed_at is not None

    async def acquire(self, stop: asyncio.Event) -> bool:
        waiting_logged = False
        while not stop.is_set():
            outcome = await self._attempt()
            if outcome is _Try.HOLDING:
                log.info("lease-acquired lease=%s/%s identity=%s", self.namespace, self.name, self.identity)
                return True
            if not waiting_logged and outcome is _Try.HELD:
                holder = self._observed[0] if self._observed else "?"
                log.info("lease-standby lease=%s/%s holder=%s (another reconciler is active; waiting)",
                         self.namespace, self.name, holder)
                waiting_logged = True
            await _sleep(stop, self.renew_every_s)
        return False

    async def hold(self, stop: asyncio.Event) -> None:
        while self._renewed_at is not None:
            await _sleep(stop, self.renew_every_s)
            if stop.is_set():
                return
            outcome = await self._attempt()
            if outcome is _Try.HELD:
                log.error("lease-lost lease=%s/%s identity=%s: %s holds it now", self.namespace, self.name,
                          self.identity, self._observed[0] if self._observed else "another replica")
                self._renewed_at = None
                return
            assert self._renewed_at is not None
            if outcome is not _Try.HOLDING and self._clock() - self._renewed_at >= self.lease_duration_s:
                log.error("lease-lost lease=%s/%s identity=%s: not renewed for %ss (the API server did not "
                          "answer); another replica may take over", self.namespace, self.name, self.identity,
                          self.lease_duration_s)
                self._renewed_at = None
                return

    async def release(self) -> None:
        if self._renewed_at is None:
            return
        self._renewed_at = None
        try:
            await asyncio.to_thread(self._release)
            log.info("lease-released lease=%s/%s identity=%s", self.namespace, self.name, self.identity)
        except Exception as exc:  # noqa: BLE001 - the lease then expires by itself
            log.warning("lease-release-failed lease=%s/%s error=%s (it expires after %ss)", self.namespace,
                        self.name, api_error(exc), self.lease_duration_s)

    # --- one attempt (in a thread) ---------------------------------------------------------------

    async def _attempt(self) -> _Try:
        started = self._clock()
        try:
            outcome = await asyncio.to_thread(self._try_acquire_or_renew)
        except Exception as exc:  # noqa: BLE001 - unknown, not lost
            log.warning("lease-api-error lease=%s/%s error=%s", self.namespace, self.name, api_error(exc))
            return _Try.ERROR
        if outcome is _Try.HOLDING:
            self._renewed_at = started  # conservative: the others observe the write later than this
        return outcome

    def _observe(self, spec: Any) -> None:
        record = (spec.holder_identity or "", spec.lease_duration_seconds, spec.acquire_time, spec.renew_time,
                  spec.lease_transitions)
        if record != self._observed:
            self._observed, self._observed_at = record, self._clock()

    def _try_acquire_or_renew(self) -> _Try:
        now = _micro_time(datetime.now(UTC))
        try:
            lease = self._api.read_namespaced_lease(self.name, self.namespace, _request_timeout=self._timeout)
        except ApiException as exc:
            if exc.status != 404:
                raise
            spec = k8s.V1LeaseSpec(holder_identity=self.identity, lease_duration_seconds=self.lease_duration_s,
                                   acquire_time=now, renew_time=now, lease_transitions=0)
            body = k8s.V1Lease(metadata=k8s.V1ObjectMeta(name=self.name, namespace=self.namespace), spec=spec)
            try:
                created = self._api.create_namespaced_lease(self.namespace, body, _request_timeout=self._timeout)
            except ApiException as create_exc:
                if create_exc.status == 409:  # another replica created it first
                    return _Try.CONFLICT
                raise
            self._observe(created.spec)
            return _Try.HOLDING
        old = lease.spec or k8s.V1LeaseSpec()
        self._observe(old)
        holder = old.holder_identity or ""
        duration = old.lease_duration_seconds or self.lease_duration_s
        if holder and holder != self.identity and self._observed_at + duration > self._clock():
            return _Try.HELD
        ours = holder == self.identity
        spec = k8s.V1LeaseSpec(
            holder_identity=self.identity, lease_duration_seconds=self.lease_duration_s,
            acquire_time=old.acquire_time if ours and old.acquire_time else now, renew_time=now,
            lease_transitions=(old.lease_transitions or 0) + (0 if ours else 1))
        meta = k8s.V1ObjectMeta(name=self.name, namespace=self.namespace,
                                resource_version=lease.metadata.resource_version if lease.metadata else None)
        try:
            updated = self._api.replace_namespaced_lease(self.name, self.namespace, k8s.V1Lease(metadata=meta, spec=spec),
                                                         _request_timeout=self._timeout)
        except ApiException as exc:
            if exc.status == 409:  # written by someone else since our read: they won this round
                return _Try.CONFLICT
            raise
        if not ours:
            log.info("lease-taken-over lease=%s/%s from=%s transitions=%s", self.namespace, self.name,
                     holder or "(released)", spec.lease_transitions)
        self._observe(updated.spec)
        return _Try.HOLDING

    def _release(self) -> None:
        lease = self._api.read_namespaced_lease(self.name, self.namespace, _request_timeout=self._timeout)
        if lease.spec is None or lease.spec.holder_identity != self.identity:
            return
        now = _micro_time(datetime.now(UTC))
        # As client-go: holder cleared, 1 s duration, so a waiting replica takes over at its next try.
        spec = k8s.V1LeaseSpec(holder_identity="", lease_duration_seconds=1, acquire_time=now, renew_time=now,
                               lease_transitions=lease.spec.lease_transitions or 0)
        meta = k8s.V1ObjectMeta(name=self.name, namespace=self.namespace,
                                resource_version=lease.metadata.resource_version if lease.metadata else None)
        self._api.replace_namespaced_lease(self.name, self.namespace, k8s.V1Lease(metadata=meta, spec=spec),
                                           _request_timeout=self._timeout)


# --- --mirror-status -------------------------------------------------------------------------------

@dataclass
class _Object:
    """What plnt knows of one WorkflowRun custom resource, from the API server's answers."""

    namespace: str
    name: str
    uid: str | None = None
    resource_version: str | None = None
    generation: int | None = None
    status: dict[str, Any] = field(default_factory=dict)
    generations: dict[str, int] = field(default_factory=dict)  # spec fingerprint -> generation

    def update(self, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        self.uid = meta.get("uid", self.uid)
        self.resource_version = meta.get("resourceVersion", self.resource_version)
        self.generation = meta.get("generation", self.generation)
        self.status = obj.get("status") or {}


class _ApiDown(Exception):
    """The API server did not answer at all: stop this pass, try again later."""


def cr_body(run: WorkflowRun) -> dict[str, Any]:
    """The server-side apply body of a WorkflowRun read from git: plnt's fields only."""
    labels = {**run.metadata.labels, MANAGED_BY_LABEL: MANAGED_BY}
    meta: dict[str, Any] = {"name": run.metadata.name, "namespace": run.metadata.namespace, "labels": labels}
    if run.metadata.annotations:
        meta["annotations"] = dict(run.metadata.annotations)
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "WorkflowRun", "metadata": meta,
            "spec": run.spec.model_dump(mode="json", by_alias=True, exclude_none=True)}


def _digest(body: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


class StatusMirror:
    """Mirrors plnt's WorkflowRuns into custom resources: spec by server-side apply (fieldManager
    "plnt"), status through the status subresource, an Event per phase change, and deletion of the
    CRs (with plnt's managed-by label) whose WorkflowRun left git.

    `specs_changed` and `status_changed` are the hooks: cheap, thread-safe, no I/O. `run` does the
    writing in one task, coalescing changes; what fails is tried again on the next change and on a
    backoff timer (1 s doubling to `max_backoff_s`).
    """

    def __init__(self, api: k8s.ApiClient, statuses: StatusStore, *, identity: str = "plnt",
                 request_timeout_s: float = 10.0, max_backoff_s: float = 30.0, max_events: int = 1000,
                 owns_specs: bool = True) -> None:
        """`owns_specs` False (--source kubernetes): the CRs are the source, written by their users;
        plnt writes their status and Events only, never their spec, and deletes none of them."""
        self._owns_specs = owns_specs
        self._listed: dict[str, tuple[ListedObject, str | None]] | None = None  # owns_specs False: the newest listing
        self._objects_api = k8s.CustomObjectsApi(api)
        self._core = k8s.CoreV1Api(api)
        self._statuses = statuses
        self._identity = identity
        self._timeout = request_timeout_s
        self._max_backoff_s = max_backoff_s
        self._wake = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()
        self._desired: dict[str, tuple[dict[str, Any], str]] | None = None  # key -> (apply body, fingerprint)
        self._desired_version = 0
        self._commit: str | None = None
        self._pruned_version = 0
        self._deferred: set[str] = set()  # gone from git, still being uninstalled: deleted once its status goes
        self._applied: dict[str, str] = {}  # key -> digest of the body applied last
        self._objects: dict[str, _Object] = {}
        self._namespaces: set[str] = set()
        self._written: dict[str, dict[str, Any]] = {}
        self._seen_phase = {s.key: s.phase for s in statuses.all()}
        self._events: deque[tuple[str, Phase | None, Phase, str]] = deque(maxlen=max_events)
        self._errors: dict[str, str] = {}
        self.passes = 0

    # --- hooks (any thread) -----------------------------------------------------------------------

    def specs_changed(self, commit: str, specs: SpecSet) -> None:
        """The reconciler loaded a valid commit: these WorkflowRuns should exist as CRs."""
        if commit == self._commit:
            return  # every reconcile pass calls this; one commit always has the same specs
        desired = {key: (cr_body(run), run.fingerprint()) for key, run in specs.workflow_runs.items()}
        with self._lock:
            self._commit = commit
            if self._desired is not None and {k: v[0] for k, v in desired.items()} == \
                    {k: v[0] for k, v in self._desired.items()}:
                return  # the same specs (every reconcile pass calls this)
            self._desired = desired
            self._desired_version += 1
        self._poke()

    def objects_listed(self, revision: str, objects: Mapping[str, ListedObject], fingerprints: Mapping[str, str]) -> None:
        """(--source kubernetes) The reconciler loaded a revision: its objects are where statuses go.
        `fingerprints`: the spec fingerprint of each accepted object at its listed generation."""
        if revision == self._commit:
            return
        listed = {key: (o, fingerprints.get(key)) for key, o in objects.items() if o.kind == "WorkflowRun"}
        with self._lock:
            self._commit = revision
            self._listed = listed
        self._poke()

    def status_changed(self) -> None:
        """StatusStore.on_change: note phase changes (each gets its Event) and wake the writer."""
        with self._lock:
            for status in self._statuses.all():
                before = self._seen_phase.get(status.key)
                if before != status.phase:
                    self._seen_phase[status.key] = status.phase
                    self._events.append((status.key, before, status.phase, status.message))
        self._poke()

    def _poke(self) -> None:
        loop = self._loop
        if loop is None:
            self._wake.set()
            return
        with contextlib.suppress(RuntimeError):  # the loop is closing: nothing left to wake
            loop.call_soon_threadsafe(self._wake.set)

    # --- the writer -------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        self._loop = asyncio.get_running_loop()
        backoff = 1.0
        while not stop.is_set():
            self._wake.clear()
            try:
                # A snapshot taken here, on the loop's thread: the store is written from this loop.
                done = await asyncio.to_thread(self.sync_once, self._statuses.all())
            except Exception:  # noqa: BLE001 - never let the mirror die; it only mirrors
                log.exception("mirror-failed")
                done = False
            if done:
                backoff = 1.0
                waits = [self._wake.wait(), stop.wait()]
                timeout = None
            else:
                waits = [self._wake.wait(), stop.wait()]
                timeout = backoff
                backoff = min(backoff * 2, self._max_backoff_s)
            tasks = [asyncio.ensure_future(w) for w in waits]
            try:
                await asyncio.wait(tasks, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in tasks:
                    task.cancel()

    def sync_once(self, statuses: list[WorkflowRunStatus] | None = None) -> bool:
        """One pass (blocking; run in a thread): apply, prune, write status, emit Events.
        True when everything is written; False when something is left for the next pass."""
        self.passes += 1
        statuses = self._statuses.all() if statuses is None else statuses
        if not self._owns_specs:
            self._take_listing()
        try:
            ok = self._apply_and_prune(statuses)
            ok = self._write_statuses(statuses) and ok
            return self._emit_events() and ok
        except _ApiDown as exc:
            self._note("api", f"the Kubernetes API did not answer ({exc}); retrying")
            return False

    def _call(self, what: str, key: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """One API call; raises _ApiDown when the server did not answer, ApiException for HTTP errors."""
        try:
            result = fn(*args, _request_timeout=self._timeout, **kwargs)
        except ApiException as exc:
            if exc.status in (0, None) or exc.status >= 500 and exc.status != 501:
                raise _ApiDown(api_error(exc)) from None
            raise
        except (urllib3.exceptions.HTTPError, OSError) as exc:  # refused, reset, timed out
            raise _ApiDown(api_error(exc)) from None
        self._errors.pop(f"{what} {key}", None)
        self._errors.pop("api", None)
        return result

    def _note(self, where: str, message: str) -> None:
        """Log a failure once per distinct message (a CR that keeps failing does not flood the log)."""
        if self._errors.get(where) != message:
            self._errors[where] = message
            log.warning("mirror-error %s: %s", where, message)

    def _take_listing(self) -> None:
        """The objects of the newest listing become the known ones (the ones a status is written to)."""
        with self._lock:
            listed, self._listed = self._listed, None
        if listed is None:
            return
        for key in set(self._objects) - set(listed):  # deleted: nothing to write onto any more
            for known in (self._objects, self._written):
                known.pop(key, None)
        for key, (obj, fingerprint) in listed.items():
            known = self._objects.get(key)
            if known is None or known.uid != obj.uid:
                known = self._objects[key] = _Object(obj.namespace, obj.name)
                known.status = dict(obj.status)
                self._written.pop(key, None)
            known.uid, known.generation = obj.uid, obj.generation
            if fingerprint is not None:
                known.generations[fingerprint] = obj.generation
                while len(known.generations) > 32:
                    known.generations.pop(next(iter(known.generations)))

    def _apply_and_prune(self, statuses: list[WorkflowRunStatus]) -> bool:
        if not self._owns_specs:
            return True  # the CRs are the source: never applied, never pruned
        with self._lock:
            desired, version = (dict(self._desired) if self._desired is not None else None), self._desired_version
        if desired is None:
            return True  # nothing reconciled yet: nothing to apply, and nothing known to delete
        ok = True
        for key, (body, fingerprint) in desired.items():
            digest = _digest(body)
            if self._applied.get(key) == digest:
                continue
            if self._apply(key, body, fingerprint):
                self._applied[key] = digest
            else:
                ok = False
        known = {s.key for s in statuses}
        if version != self._pruned_version or self._deferred - known:
            if self._prune(set(desired), known, {s.namespace for s in statuses}):
                self._pruned_version = version
            else:
                ok = False
        return ok

    def _apply(self, key: str, body: dict[str, Any], fingerprint: str) -> bool:
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        self._namespaces.add(namespace)
        args = (GROUP, VERSION, namespace, PLURAL, name, body)
        try:
            try:
                obj = self._call("apply", key, self._objects_api.patch_namespaced_custom_object, *args,
                                 field_manager=FIELD_MANAGER, field_validation="Strict", _content_type=APPLY_PATCH)
            except ApiException as exc:
                if exc.status != 409:
                    raise
                # A field conflict: another manager set one of plnt's fields. Forced only on plnt's own object.
                current = self._call("get", key, self._objects_api.get_namespaced_custom_object,
                                     GROUP, VERSION, namespace, PLURAL, name)
                if ((current.get("metadata") or {}).get("labels") or {}).get(MANAGED_BY_LABEL) != MANAGED_BY:
                    self._note(f"apply {key}", f"a WorkflowRun {key} exists that plnt does not manage (no "
                               f"{MANAGED_BY_LABEL}={MANAGED_BY} label); delete it to let plnt mirror this one")
                    self._objects.pop(key, None)
                    return False
                obj = self._call("apply", key, self._objects_api.patch_namespaced_custom_object, *args,
                                 field_manager=FIELD_MANAGER, field_validation="Strict", force=True,
                                 _content_type=APPLY_PATCH)
        except ApiException as exc:
            hint = {403: " (plnt's service account may not write WorkflowRuns in this namespace: add it to the "
                         "namespaces the plnt chart's RBAC grants)"}.get(
                exc.status or 0, " (are the CRDs installed and current? helm installs charts/plnt/crds only on first "
                                 "install: plnt crds | kubectl apply --server-side -f -)" if exc.status in (400, 404, 422) else "")
            self._note(f"apply {key}", f"{api_error(exc)}{hint}")
            return False
        if obj is None:  # 201 Created: the client only reads the body of a 200 for this call
            obj = self._call("get", key, self._objects_api.get_namespaced_custom_object, GROUP, VERSION, namespace,
                             PLURAL, name)
        known = self._objects.setdefault(key, _Object(namespace, name))
        known.update(obj)
        if known.generation is not None:
            known.generations[fingerprint] = known.generation
            while len(known.generations) > 32:
                known.generations.pop(next(iter(known.generations)))
        # The CR may carry the status an earlier plnt wrote: the baseline for what to write next.
        self._written.pop(key, None)
        return True

    def _prune(self, desired: set[str], in_status: set[str], more_namespaces: set[str]) -> bool:
        ok = True
        self._deferred = set()
        # Namespaces plnt mirrored into (RBAC is per namespace: plnt lists no namespace it was not given).
        for namespace in sorted(self._namespaces | more_namespaces):
            try:
                listed = self._call("list", namespace, self._objects_api.list_namespaced_custom_object, GROUP,
                                    VERSION, namespace, PLURAL, label_selector=f"{MANAGED_BY_LABEL}={MANAGED_BY}")
            except ApiException as exc:
                self._note(f"list {namespace}", api_error(exc))
                ok = False
                continue
            for item in listed.get("items") or []:
                meta = item.get("metadata") or {}
                key = f"{namespace}/{meta.get('name')}"
                if key in desired or (meta.get("labels") or {}).get(MANAGED_BY_LABEL) != MANAGED_BY:
                    continue
                if key in in_status:  # its uninstall saga runs: the CR shows Deleting until plnt drops it
                    self._deferred.add(key)
                    continue
                try:
                    self._call("delete", key, self._objects_api.delete_namespaced_custom_object, GROUP, VERSION,
                               namespace, PLURAL, meta["name"])
                    log.info("mirror-deleted workflowrun=%s (gone from git)", key)
                except ApiException as exc:
                    if exc.status != 404:
                        self._note(f"delete {key}", api_error(exc))
                        ok = False
                        continue
                for known in (self._objects, self._applied, self._written):
                    known.pop(key, None)
        return ok

    def _write_statuses(self, statuses: list[WorkflowRunStatus]) -> bool:
        ok = True
        now = datetime.now(UTC)
        for status in statuses:
            known = self._objects.get(status.key)
            if known is None:
                continue
            fingerprint = status.attempted_fingerprint or status.deployed_fingerprint
            generation = known.generations.get(fingerprint) if fingerprint else known.generation
            if generation is None:  # a spec applied before this plnt started: keep what the CR says
                generation = known.status.get("observedGeneration", known.generation)
            body = cr_status(status, generation, known.status.get("conditions") or [], now).model_dump(
                mode="json", by_alias=True, exclude_none=True)
            if self._written.get(status.key) == body or _same_status(known.status, body):
                self._written[status.key] = body
                continue
            try:
                obj = self._call("status", status.key, self._objects_api.patch_namespaced_custom_object_status,
                                 GROUP, VERSION, known.namespace, PLURAL, known.name,
                                 {"apiVersion": f"{GROUP}/{VERSION}", "kind": "WorkflowRun",
                                  "metadata": {"name": known.name, "namespace": known.namespace}, "status": body},
                                 field_manager=FIELD_MANAGER, force=True, _content_type=APPLY_PATCH)
            except ApiException as exc:
                self._note(f"status {status.key}", api_error(exc))
                if exc.status == 404:  # deleted behind plnt's back: apply it again
                    self._applied.pop(status.key, None)
                    self._objects.pop(status.key, None)
                ok = False
                continue
            if obj:
                known.update(obj)
            self._written[status.key] = body
        return ok

    def _emit_events(self) -> bool:
        with self._lock:
            pending = list(self._events)
            self._events.clear()
            desired = set(self._desired or {}) | set(self._objects)
        left: list[tuple[str, Phase | None, Phase, str]] = []
        failed = False
        try:
            while pending:
                key, before, after, message = event = pending[0]
                known = self._objects.get(key)
                if known is None:
                    if key in desired:
                        left.append(event)  # its CR is not applied yet: emitted once it is
                elif failed:
                    left.append(event)  # keep the order of one WorkflowRun's Events
                else:
                    try:
                        self._call("event", key, self._core.create_namespaced_event, known.namespace,
                                   self._event(known, before, after, message))
                    except ApiException as exc:
                        self._note(f"event {key}", api_error(exc))
                        left.append(event)
                        failed = True
                pending.pop(0)
        finally:  # also when the API went away mid-pass (_ApiDown): nothing is lost, nothing sent twice
            with self._lock:
                self._events.extendleft(reversed(left + pending))
        return not failed

    def _event(self, known: _Object, before: Phase | None, after: Phase, message: str) -> k8s.CoreV1Event:
        when = datetime.now(UTC)
        now = when.replace(microsecond=0)  # first/lastTimestamp are whole seconds: eventTime orders events
        text = f"{before.value if before else 'New'} -> {after.value}" + (f": {message}" if message else "")
        return k8s.CoreV1Event(
            metadata=k8s.V1ObjectMeta(name=f"{known.name}.{uuid.uuid4().hex[:16]}", namespace=known.namespace),
            involved_object=k8s.V1ObjectReference(api_version=f"{GROUP}/{VERSION}", kind="WorkflowRun",
                                                  name=known.name, namespace=known.namespace, uid=known.uid,
                                                  resource_version=known.resource_version),
            reason=after.value, message=redact(text)[:1024],
            type="Warning" if after in (Phase.ROLLED_BACK, Phase.FAILED) else "Normal",
            source=k8s.V1EventSource(component=FIELD_MANAGER), reporting_component=FIELD_MANAGER,
            reporting_instance=self._identity, first_timestamp=now, last_timestamp=now, count=1,
            event_time=_micro_time(when), action=_EVENT_ACTION)


_EVENT_ACTION = "Reconcile"  # the server requires an action on an Event with an eventTime


def _same_status(current: dict[str, Any], body: dict[str, Any]) -> bool:
    return {k: v for k, v in current.items() if v is not None} == body


# --- wiring: `plnt up --mirror-status` --------------------------------------------------------------

def attach_status_mirror(settings: Settings, statuses: StatusStore, reconciler: Any,
                         source: KubernetesSource | None = None) -> Callable[[], Awaitable[None]]:
    """Start mirroring into WorkflowRun CRs: chains StatusStore.on_change (whatever is set there keeps
    running first), subscribes to each reconciled commit's specs, starts the writer task. Returns the
    cleanup that stops it. With `source` (--source kubernetes) the CRs are the source: only their
    status is written, onto the objects the source listed."""
    mirror = StatusMirror(api_client(settings.kubernetes.kubeconfig), statuses, identity=f"plnt-{uuid.uuid4().hex[:8]}",
                          owns_specs=source is None)
    previous = statuses.on_change

    def on_change() -> None:
        previous()
        mirror.status_changed()

    statuses.on_change = on_change
    if source is None:
        reconciler.spec_listeners.append(mirror.specs_changed)
    else:
        seen: list[str] = []

        def listed(revision: str, specs: SpecSet) -> None:
            if seen == [revision]:
                return  # every pass calls this; a revision always lists the same objects
            seen[:] = [revision]
            snapshot = source.snapshot(revision)
            fingerprints = {key: run.fingerprint() for key in snapshot.objects
                            if key not in snapshot.refused and (run := specs.deployable(key)) is not None}
            mirror.objects_listed(revision, snapshot.objects, fingerprints)

        reconciler.spec_listeners.append(listed)
    stop = asyncio.Event()
    task = asyncio.create_task(mirror.run(stop), name="status-mirror")
    if source is None:
        log.info("mirror-status on: WorkflowRuns are applied as plnt.work/v1 custom resources (field manager %s)",
                 FIELD_MANAGER)
    else:
        log.info("mirror-status on: the status of each WorkflowRun custom resource is written there (field manager %s)",
                 FIELD_MANAGER)

    async def cleanup() -> None:
        stop.set()
        with contextlib.suppress(TimeoutError, asyncio.CancelledError):
            async with asyncio.timeout(15):
                await task

    return cleanup
