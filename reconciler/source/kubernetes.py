"""Kubernetes source (`--source kubernetes`): WorkflowRuns and ModelDeployments read from the
custom resources of an API server (what `kubectl apply`, Argo CD or Flux create), beside the
PlntBackends and RecipeTrustPolicies of a platform directory the operator gives.

It stands where GitSource stands for the reconcile loop and the saga: `fetch()` names a revision,
`load(revision)` gives its specs, `read_file`/`export` read the platform directory (trusted roots,
a `file:` registry in it).

What a revision is: a digest of every listed object's (kind, namespace, name, uid, generation) and
of the platform directory's spec files. A status write (the status subresource) or a label change
moves neither generation nor uid, so it never makes a new revision; a `kubectl apply` that changes a
spec does (the API server bumps `metadata.generation`), and so does deleting and creating an object
again (a new uid).

Trust: backends, trust policies and Gates come from the platform directory only; the cluster gives
WorkflowRuns and ModelDeployments, never what decides who may sign a recipe, where it runs or what a
canary must pass.

Invalid objects: plnt's own checks beyond the CRD schema refuse one object, not the revision: it is
left out of the revision's specs and its refusal (namespace/name, field) is in `Snapshot.refused`;
the reconcile loop plans nothing for it, so what it runs keeps running. Problems of the platform
directory, or a listing over the limits, refuse the whole revision, as an invalid commit does in git.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from plnt.core.specs.limits import SpecLimits
from plnt.core.specs.loader import (
    DEFAULT_LIMITS,
    Problem,
    SourceFile,
    SpecSet,
    load_sources,
    read_tree,
    unreadable,
)
from plnt.core.specs.models import run_key
from plnt.reconciler.errors import RetryLater
from plnt.reconciler.recipes.registries import CHUNK_SIZE, MAX_TRUSTED_ROOT_BYTES, metadata_too_large
from plnt.reconciler.source.git import UnreadableTree, refused_name

log = logging.getLogger(__name__)

GROUP, VERSION = "plnt.work", "v1"
# The kinds a cluster may give, by plural. Backends and trust policies are the platform directory's.
PLURALS = {"WorkflowRun": "workflowruns", "ModelDeployment": "modeldeployments"}
PLATFORM_KINDS = ("PlntBackend", "RecipeTrustPolicy", "Gate")  # a Gate is rollout policy: the operator's too
PAGE_SIZE = 250
KEEP_REVISIONS = 16


class KubernetesSourceError(RetryLater):
    """The API server could not be listed (unreachable, forbidden, CRDs missing): try again next poll."""


@dataclass(frozen=True)
class ListedObject:
    """One custom resource as listed: what the revision is made of, and its spec as a spec file."""

    kind: str
    namespace: str
    name: str
    uid: str
    generation: int
    file: SourceFile  # {apiVersion, kind, metadata: {name, namespace, labels}, spec} as JSON text
    status: Mapping[str, Any] = field(default_factory=dict, compare=False)  # as listed (plnt's own last write)

    @property
    def key(self) -> str:
        return run_key(self.namespace, self.name)


@dataclass
class Snapshot:
    """One revision: the files its specs are loaded from, and what it refused."""

    revision: str
    files: list[SourceFile]
    problems: list[Problem]  # of the platform directory or of the listing itself: the revision is refused
    objects: dict[str, ListedObject] = field(default_factory=dict)  # every listed object (a status goes onto it)
    refused: dict[str, str] = field(default_factory=dict)  # key -> why its spec is not in the revision


# --- the pure part ------------------------------------------------------------------------------


def object_path(kind: str, namespace: str, name: str) -> str:
    """How an object is named in problems: `NAMESPACE/PLURAL/NAME` (FILE:LINE becomes OBJECT:LINE)."""
    return f"{namespace}/{PLURALS[kind]}/{name}"


def object_file(item: Mapping[str, Any], kind: str, limits: SpecLimits = DEFAULT_LIMITS) -> ListedObject:
    """A listed custom resource as a spec file: its spec and the metadata the spec models know
    (name, namespace, labels). Annotations (kubectl's last-applied copy among them), status and the
    server's fields are left out: they do not say what to deploy."""
    meta = item.get("metadata") or {}
    namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    document = {"apiVersion": f"{GROUP}/{VERSION}", "kind": kind,
                "metadata": {"name": name, "namespace": namespace, **({"labels": meta["labels"]} if meta.get("labels") else {})},
                "spec": item.get("spec")}
    path = object_path(kind, namespace, name)
    text = json.dumps(document, indent=2, sort_keys=False)  # JSON is YAML: the loader gives lines and fields
    size = len(text.encode())
    file = SourceFile(path, text) if size <= limits.max_file_bytes else unreadable(
        path, 1, f"the object is {size} bytes, over the limit of {limits.max_file_bytes} for one spec (max_file_bytes)")
    return ListedObject(kind, namespace, name, str(meta.get("uid") or ""), int(meta.get("generation") or 0), file,
                        item.get("status") or {})


def revision_of(objects: Iterable[ListedObject], platform: Iterable[SourceFile], refusal: str = "") -> str:
    """The revision: a digest of each object's identity and generation and of the platform files.
    40 hex digits, the shape of a commit (sagas and statuses name it where git names a commit).
    `refusal`: why nothing could be read (a listing over its bounds, an unreadable platform file),
    so that such a revision is never taken for a valid one with the same objects (none, say)."""
    digest = hashlib.sha256(refusal.encode() + b"\n")
    for line in sorted(f"{o.kind}\0{o.namespace}\0{o.name}\0{o.uid}\0{o.generation}" for o in objects):
        digest.update(line.encode() + b"\n")
    digest.update(b"--platform--\n")
    for file in sorted(platform, key=lambda f: f.path):
        digest.update(f"{file.path}\0{hashlib.sha256(file.text.encode()).hexdigest()}\n".encode())
    return digest.hexdigest()[:40]


def platform_problems(files: Sequence[SourceFile], unread: Sequence[Problem], limits: SpecLimits) -> list[Problem]:
    """What makes the platform directory unusable: its own problems, and any kind it may not hold."""
    specs, problems = load_sources(files, check_references=False, limits=limits)
    problems = [*unread, *problems]
    for where, (path, line) in specs.locations.items():
        kind = where.split("/", 1)[0]
        if kind not in PLATFORM_KINDS:
            problems.append(Problem(path, line, "kind", f"a platform directory holds {', '.join(PLATFORM_KINDS)} "
                                    f"only; a {kind} comes from the cluster (or name the file in .plntignore)"))
    return problems


def settle(platform: Sequence[SourceFile], objects: Sequence[ListedObject], limits: SpecLimits = DEFAULT_LIMITS,
           ) -> tuple[list[SourceFile], dict[str, str]]:
    """The files a revision loads, and the objects refused (key -> why, naming the object and field).

    An object plnt refuses (its own problem, or one it makes with the rest, such as an unknown
    backend or a name already taken) is left out and the others are loaded as they are; leaving one
    out may refuse another (a WorkflowRun bound to a refused ModelDeployment), hence the rounds.
    Pure: no I/O."""
    use = {o.file.path: o for o in objects}
    refused: dict[str, str] = {}
    while True:
        _, problems = load_sources([*platform, *(o.file for o in use.values())], limits=limits)
        first: dict[str, Problem] = {}
        for problem in problems:
            if problem.file in use:
                first.setdefault(problem.file, problem)
        if not first:
            break
        for path, problem in first.items():
            listed = use.pop(path)
            refused[listed.key] = f"{listed.kind} {listed.key} generation {listed.generation} is refused: {problem}"
    return [*platform, *(use[path].file for path in sorted(use))], refused


# --- the source ---------------------------------------------------------------------------------


class KubernetesSource:
    """WorkflowRuns and ModelDeployments listed from `namespaces` (all, when empty), backends and
    trust policies from `platform_dir`; see the module's docstring."""

    def __init__(self, api: Any, platform_dir: Path, *, namespaces: tuple[str, ...] = (),
                 limits: SpecLimits = DEFAULT_LIMITS, request_timeout_s: float = 15.0,
                 keep: int = KEEP_REVISIONS, server: str = "") -> None:
        """`api`: a kubernetes ApiClient, or anything with CustomObjectsApi's two list calls (tests)."""
        from kubernetes import client as k8s  # only where this source is used

        self._api = k8s.CustomObjectsApi(api) if isinstance(api, k8s.ApiClient) else api
        self.platform_dir = platform_dir.resolve()
        self.namespaces = namespaces
        self._limits = limits
        self._timeout = request_timeout_s
        self._keep = keep
        self._lock = threading.Lock()
        self._snapshots: OrderedDict[str, Snapshot] = OrderedDict()
        self._newest: str | None = None
        # What GET /source shows where git shows the repository, branch and spec path.
        self.url = f"kubernetes {server}".strip()
        self.branch = ",".join(namespaces) or "*"
        self.path = str(self.platform_dir)
        self.previews: tuple[str, ...] = ()
        self.lists = 0  # listings made (tests count them)

    # --- what the loop and the saga ask -------------------------------------------------------

    def fetch(self) -> str:
        """List the objects and read the platform directory; return the revision they make."""
        listed = self._list()
        platform, unread = read_tree(self.platform_dir, self._limits) if self.platform_dir.is_dir() else \
            ([], [Problem(str(self.platform_dir), 1, "platform", "the platform directory does not exist")])
        refusal = "\n".join(str(p) for p in ([] if isinstance(listed, list) else [listed]) + list(unread))
        revision = revision_of(listed if isinstance(listed, list) else [], platform, refusal)
        with self._lock:
            known = self._snapshots.get(revision)
            if known is not None:
                self._snapshots.move_to_end(revision)
                self._newest = revision
                return revision
        if not isinstance(listed, list):  # the listing itself was refused (too many objects or bytes)
            snapshot = Snapshot(revision, [], [listed])
        else:
            problems = platform_problems(platform, unread, self._limits)
            if problems:
                snapshot = Snapshot(revision, [], problems)
            else:
                files, refused = settle(platform, listed, self._limits)
                snapshot = Snapshot(revision, files, [], {o.key: o for o in listed}, refused)
        for key, why in snapshot.refused.items():
            log.warning("object-refused revision=%s object=%s %s", revision[:12], key, why)
        with self._lock:
            self._snapshots[revision] = snapshot
            while len(self._snapshots) > self._keep:
                self._snapshots.popitem(last=False)
            self._newest = revision
        return revision

    def snapshot(self, revision: str) -> Snapshot:
        """A revision this source made; one it does not hold (a worker that started after it, or
        one dropped from the bounded history) is answered with the cluster's current revision:
        a saga's input is then checked against what the cluster asks for now."""
        with self._lock:
            known = self._snapshots.get(revision)
        if known is not None:
            return known
        current = self.fetch()
        with self._lock:
            return self._snapshots[current]

    def load(self, revision: str, limits: SpecLimits = DEFAULT_LIMITS) -> tuple[SpecSet, list[Problem]]:
        snapshot = self.snapshot(revision)
        if snapshot.problems:
            return SpecSet(), snapshot.problems
        return load_sources(snapshot.files, limits=limits)

    def is_on_branch(self, revision: str) -> bool:
        """Always: in the cluster there is no history to be on. What a saga's input is checked
        against is the revision's (or the current) spec of its object: its fingerprint and version."""
        return True

    def branch_head(self) -> str:
        return self._newest or self.fetch()

    @property
    def git_dir(self) -> Path:
        raise TypeError("a Kubernetes source has no git clone (--verify-commits needs --source git)")

    # --- the platform directory (trusted roots, `file:` registries in it) ------------------------

    def _inside(self, path: str) -> Path:
        rel = path.strip("/")
        what = refused_name(rel) if rel else None
        if what is not None:
            raise UnreadableTree(rel, what)
        target = (self.platform_dir / rel).resolve()
        if not target.is_relative_to(self.platform_dir):
            raise FileNotFoundError(f"{rel} leads outside the platform directory")
        return target

    def read_file(self, revision: str, path: str, limit: int = MAX_TRUSTED_ROOT_BYTES) -> bytes:
        """A file of the platform directory (path relative to it), as it is now; over `limit` refused."""
        target = self._inside(path)
        if not target.is_file():
            raise FileNotFoundError(f"{path} is not a file of the platform directory {self.platform_dir}")
        size = target.stat().st_size
        if size > limit:
            raise metadata_too_large(f"{path} in the platform directory", size, limit,
                                     "write the file as the tool that made it did")
        with target.open("rb") as stream:
            data = stream.read(limit + 1)
        if len(data) > limit:
            raise metadata_too_large(f"{path} in the platform directory", None, limit)
        return data

    def export(self, revision: str, subdir: str, dest: Path) -> bool:
        """Copy the platform directory's `subdir` into dest (regular files whose real path stays in
        the platform directory; a ConfigMap mount's links inside it are followed). False when absent."""
        root = self._inside(subdir)
        if not root.is_dir():
            return False
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = [d for d in dirnames if not d.startswith("..")]  # a ConfigMap's ..data and versions
            here = Path(dirpath)
            for name in filenames:
                source = (here / name).resolve()
                if not source.is_relative_to(self.platform_dir) or not source.is_file():
                    continue
                target = dest / here.relative_to(root) / name
                target.parent.mkdir(parents=True, exist_ok=True)
                with source.open("rb") as read, target.open("wb") as write:
                    while chunk := read.read(CHUNK_SIZE):
                        write.write(chunk)
        return True

    # --- listing --------------------------------------------------------------------------------

    def _list(self) -> list[ListedObject] | Problem:
        """Every WorkflowRun and ModelDeployment, page by page: at most max_files objects and
        max_total_bytes of specs, else one problem and nothing of this listing is used."""
        from kubernetes.client.exceptions import ApiException

        found: list[ListedObject] = []
        total = 0
        self.lists += 1
        for kind, plural in PLURALS.items():
            for namespace in self.namespaces or (None,):
                token: str | None = None
                while True:
                    try:
                        page = self._page(plural, namespace, token)
                    except ApiException as exc:
                        where = f"namespace {namespace}" if namespace else "all namespaces"
                        hint = {403: " (plnt's account may not list them there: see docs/kubernetes.md)",
                                404: " (are plnt's CRDs installed? plnt crds | kubectl apply --server-side -f -)"}
                        raise KubernetesSourceError(f"cannot list {plural}.{GROUP} in {where}: HTTP {exc.status} "
                                                    f"{exc.reason or ''}{hint.get(exc.status or 0, '')}") from None
                    except Exception as exc:  # noqa: BLE001 - refused, reset, timed out: the next poll tries again
                        raise KubernetesSourceError(f"cannot list {plural}.{GROUP}: {type(exc).__name__}: "
                                                    f"{str(exc)[:200]}") from None
                    for item in page.get("items") or []:
                        listed = object_file(item, kind, self._limits)
                        found.append(listed)
                        total += min(len(listed.file.text.encode()), self._limits.max_file_bytes + 1)
                        if len(found) > self._limits.max_files:
                            return Problem(listed.file.path, 1, "listing", f"more than {self._limits.max_files} "
                                           "WorkflowRuns and ModelDeployments (limit --max-spec-files); nothing of "
                                           "this listing was used")
                        if total > self._limits.max_total_bytes:
                            return Problem(listed.file.path, 1, "listing", f"the listed specs add up to more than "
                                           f"{self._limits.max_total_bytes} bytes (limit max_total_bytes); nothing "
                                           "of this listing was used")
                    token = (page.get("metadata") or {}).get("continue") or None
                    if token is None:
                        break
        return found

    def _page(self, plural: str, namespace: str | None, token: str | None) -> dict[str, Any]:
        options: dict[str, Any] = dict(limit=PAGE_SIZE, _request_timeout=self._timeout)
        if token:
            options["_continue"] = token
        if namespace is None:
            return self._api.list_cluster_custom_object(GROUP, VERSION, plural, **options)
        return self._api.list_namespaced_custom_object(GROUP, VERSION, namespace, plural, **options)

    # --- waking the loop early ------------------------------------------------------------------

    def watch(self, wake: Callable[[], None], stop: threading.Event) -> None:
        """Blocking (a thread): watch the objects and call `wake` when one is added, deleted or its
        generation moves (status writes are ignored). The poll stays the authority: a watch that
        breaks is started again after a pause, and whatever it missed the next poll finds."""
        from kubernetes import watch

        seen: dict[tuple[str, str], int] = {}
        primed = False  # after one round every object was seen once: from then on a new one wakes too
        while not stop.is_set():
            for kind, plural in PLURALS.items():
                for namespace in self.namespaces or (None,):
                    if stop.is_set():
                        return
                    stream = watch.Watch()
                    call = (self._api.list_namespaced_custom_object if namespace else self._api.list_cluster_custom_object)
                    args = (GROUP, VERSION, namespace, plural) if namespace else (GROUP, VERSION, plural)
                    try:
                        for event in stream.stream(call, *args, timeout_seconds=2, _request_timeout=10):
                            meta = (event.get("object") or {}).get("metadata") or {}
                            key = (kind, f"{meta.get('namespace')}/{meta.get('name')}")
                            generation = -1 if event.get("type") == "DELETED" else int(meta.get("generation") or 0)
                            if seen.get(key) != generation:
                                seen[key] = generation
                                if primed:
                                    wake()
                            if stop.is_set():
                                stream.stop()
                    except Exception:  # noqa: BLE001 - the poll covers what a broken watch misses
                        stop.wait(2.0)
            primed = True
