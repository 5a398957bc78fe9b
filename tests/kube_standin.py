"""A DECLARED STAND-IN for the Kubernetes API server: not Kubernetes, a small real HTTP server on
127.0.0.1 that answers just the endpoints plnt's own client code calls (plnt.reconciler.control.kube_calls),
so the real `kubernetes` Python client can be tested in corners a real API server does not produce on
demand: a server that accepts and never answers (`hang_s`), chosen error Statuses on chosen paths
(`fail`), a clock a test steers. What a real server decides (schema validation, field ownership,
RBAC, Events, the Lease) is tested on one in tests/k8s/.

Shapes follow the Kubernetes API documentation (https://kubernetes.io/docs/reference/kubernetes-api/,
https://kubernetes.io/docs/reference/using-api/api-concepts/, .../server-side-apply/):
- coordination.k8s.io/v1 Lease: GET, POST (409 AlreadyExists when it exists), PUT (409 Conflict when
  metadata.resourceVersion is not the stored one: optimistic concurrency).
- plnt.work/v1 workflowruns: server-side apply (PATCH, Content-Type application/apply-patch+yaml,
  fieldManager required, 409 Conflict on a field another manager owns unless force=true), GET,
  list with labelSelector (k=v only), DELETE, and the /status subresource (PATCH; status only, no
  generation bump). metadata.generation grows when the spec changes; uid, resourceVersion,
  creationTimestamp are set by the server.
- core/v1 events: POST.
- Errors are metav1.Status objects (kind Status, status Failure, reason, code).

What it does NOT do (so what these tests cannot prove): real field-ownership tracking (managedFields
is approximated: leaf paths of spec and metadata.labels/annotations, per manager), schema validation
against the CRD, pruning, defaulting, admission, RBAC, watch, and real timing under load.

Every request is recorded (method, path, query, content type, JSON body) for the tests to check.
`down()` stops listening (connection refused); `up()` listens again on the same port; `hang_s` makes
each request wait before answering (an API server that accepts but does not answer); `fail` answers
requests to chosen paths with an error Status (500, 422, 403, ...).
"""

from __future__ import annotations

import copy
import json
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

TOKEN = "standin-token-0123456789"  # a bearer token the stand-in requires (and tests look for in logs)


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    content_type: str
    body: Any


@dataclass
class Stored:
    obj: dict[str, Any]
    owners: dict[str, tuple[str, Any]] = field(default_factory=dict)  # leaf path -> (manager, value)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def status_error(code: int, reason: str, message: str, **details: Any) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "details": details, "code": code}


def leaves(data: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(data, dict) and data:
        out: dict[str, Any] = {}
        for key, value in data.items():
            out.update(leaves(value, f"{prefix}.{key}"))
        return out
    return {prefix: data}


class KubeStandIn:
    """See the module docstring. Use as a context manager; `kubeconfig(tmp_path)` writes a kubeconfig."""

    def __init__(self) -> None:
        self.requests: list[Request] = []
        self.history: list[Request] = []  # every request since start (clear() empties `requests` only)
        self.objects: dict[tuple[str, str, str, str], Stored] = {}  # (group, resource, namespace, name)
        self.events: list[dict[str, Any]] = []
        self.hang_s = 0.0
        self.before: Callable[[Request], None] | None = None  # runs before each request is answered
        self.fail: dict[str, int] = {}  # path suffix -> HTTP code to answer (a metav1.Status) instead
        self._rv = 0
        self._lock = threading.RLock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    # --- lifecycle ---------------------------------------------------------------------------------

    def __enter__(self) -> KubeStandIn:
        self.up()
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()

    def up(self) -> None:
        standin = self

        class Handler(_Handler):
            api = standin

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, name="kube-standin", daemon=True)
        self._thread.start()

    def down(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            assert self._thread is not None
            self._thread.join(timeout=10)
            self._server = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def kubeconfig(self, directory: Path, namespace: str = "plnt") -> Path:
        path = directory / "kubeconfig"
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "standin",
            "clusters": [{"name": "standin", "cluster": {"server": self.url}}],
            "users": [{"name": "standin", "user": {"token": TOKEN}}],
            "contexts": [{"name": "standin", "context": {"cluster": "standin", "user": "standin",
                                                         "namespace": namespace}}],
        }))
        return path

    # --- what tests read and poke -------------------------------------------------------------------

    def get(self, group: str, resource: str, namespace: str, name: str) -> dict[str, Any] | None:
        with self._lock:
            stored = self.objects.get((group, resource, namespace, name))
            return copy.deepcopy(stored.obj) if stored else None

    def edit(self, group: str, resource: str, namespace: str, name: str, manager: str, path: str, value: Any) -> None:
        """Another field manager (say kubectl) sets one field, as `kubectl apply` would."""
        with self._lock:
            stored = self.objects[(group, resource, namespace, name)]
            node = stored.obj
            *parents, last = path.strip(".").split(".")
            for key in parents:
                node = node.setdefault(key, {})
            node[last] = value
            stored.owners["." + path.strip(".")] = (manager, value)
            self._bump(stored.obj, spec_changed=path.strip(".").startswith("spec"))

    def clear(self) -> None:
        """Forget the requests so far (`history` keeps them, for the RBAC check)."""
        with self._lock:
            self.requests.clear()

    # --- the API ---------------------------------------------------------------------------------------

    def _bump(self, obj: dict[str, Any], *, spec_changed: bool = False) -> None:
        self._rv += 1
        obj["metadata"]["resourceVersion"] = str(self._rv)
        if spec_changed:
            obj["metadata"]["generation"] = obj["metadata"].get("generation", 0) + 1

    def _new(self, body: dict[str, Any], namespace: str, generation: bool) -> dict[str, Any]:
        obj = copy.deepcopy(body)
        meta = obj.setdefault("metadata", {})
        meta.update({"namespace": namespace, "uid": str(uuid.uuid4()), "creationTimestamp": _now()})
        if generation:
            meta["generation"] = 1
        self._rv += 1
        meta["resourceVersion"] = str(self._rv)
        return obj

    def handle(self, method: str, path: str, query: dict[str, str], content_type: str,
               body: Any) -> tuple[int, dict[str, Any]]:
        parts = path.strip("/").split("/")
        # /apis/{group}/{version}/namespaces/{ns}/{resource}[/{name}[/status]] or /api/v1/namespaces/{ns}/{resource}
        if parts[0] == "api" and len(parts) >= 5 and parts[2] == "namespaces":
            group, rest = "", parts[3:]
        elif parts[0] == "apis" and len(parts) >= 6 and parts[3] == "namespaces":
            group, rest = parts[1], parts[4:]
        else:
            return 404, status_error(404, "NotFound", f"the server could not find the requested resource ({path})")
        namespace, resource, name = rest[0], rest[1], rest[2] if len(rest) > 2 else None
        sub = rest[3] if len(rest) > 3 else None
        key = (group, resource, namespace, name or "")
        with self._lock:
            if resource == "leases" and group == "coordination.k8s.io":
                return self._lease(method, key, body)
            if resource == "workflowruns" and group == "plnt.work":
                return self._workflowrun(method, key, sub, query, content_type, body)
            if resource == "events" and group == "" and method == "POST" and name is None:
                for required in ("involvedObject", "reason", "metadata"):
                    if not body.get(required):
                        return 422, status_error(422, "Invalid", f"Event is invalid: {required}: Required value")
                event = self._new(body, namespace, generation=False)
                self.events.append(event)
                return 201, event
        return 405, status_error(405, "MethodNotAllowed", f"{method} is not supported on {path}")

    def _not_found(self, key: tuple[str, str, str, str]) -> tuple[int, dict[str, Any]]:
        group, resource, _, name = key
        return 404, status_error(404, "NotFound", f'{resource}.{group} "{name}" not found', name=name, group=group,
                                 kind=resource)

    def _lease(self, method: str, key: tuple[str, str, str, str], body: Any) -> tuple[int, dict[str, Any]]:
        group, resource, namespace, name = key
        stored = self.objects.get(key)
        if method == "GET" and name:
            return (200, copy.deepcopy(stored.obj)) if stored else self._not_found(key)
        if method == "POST" and not name:
            name = body["metadata"]["name"]
            key = (group, resource, namespace, name)
            if key in self.objects:
                return 409, status_error(409, "AlreadyExists", f'{resource}.{group} "{name}" already exists',
                                         name=name, group=group, kind=resource)
            obj = self._new(body, namespace, generation=False)
            obj.update({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease"})
            self.objects[key] = Stored(obj)
            return 201, copy.deepcopy(obj)
        if method == "PUT" and name:
            if stored is None:
                return self._not_found(key)
            sent = (body.get("metadata") or {}).get("resourceVersion")
            if sent != stored.obj["metadata"]["resourceVersion"]:
                return 409, status_error(409, "Conflict", f'Operation cannot be fulfilled on {resource}.{group} '
                                         f'"{name}": the object has been modified; please apply your changes to '
                                         "the latest version and try again", name=name, group=group, kind=resource)
            stored.obj["spec"] = copy.deepcopy(body.get("spec") or {})
            self._bump(stored.obj)
            return 200, copy.deepcopy(stored.obj)
        return 405, status_error(405, "MethodNotAllowed", f"{method} leases")

    def _workflowrun(self, method: str, key: tuple[str, str, str, str], sub: str | None, query: dict[str, str],
                     content_type: str, body: Any) -> tuple[int, dict[str, Any]]:
        group, resource, namespace, name = key
        stored = self.objects.get(key)
        if method == "GET" and not name:
            selector = query.get("labelSelector", "")
            wanted = dict(part.split("=", 1) for part in selector.split(",") if part)
            items = [copy.deepcopy(s.obj) for (g, r, ns, _), s in sorted(self.objects.items())
                     if (g, r, ns) == (group, resource, namespace)
                     and all((s.obj["metadata"].get("labels") or {}).get(k) == v for k, v in wanted.items())]
            return 200, {"apiVersion": "plnt.work/v1", "kind": "WorkflowRunList",
                         "metadata": {"resourceVersion": str(self._rv)}, "items": items}
        if method == "GET":
            return (200, copy.deepcopy(stored.obj)) if stored else self._not_found(key)
        if method == "DELETE" and name and sub is None:
            if stored is None:
                return self._not_found(key)
            del self.objects[key]
            return 200, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                         "details": {"name": name, "group": group, "kind": resource, "uid": stored.obj["metadata"]["uid"]}}
        if method != "PATCH" or not name:
            return 405, status_error(405, "MethodNotAllowed", f"{method} workflowruns")
        if content_type.split(";")[0].strip() != "application/apply-patch+yaml":
            return 415, status_error(415, "UnsupportedMediaType", f"the body of the request was in an unknown format "
                                     f"- accepted media types include: application/apply-patch+yaml ({content_type})")
        manager = query.get("fieldManager")
        if not manager:
            return 400, status_error(400, "BadRequest", "PATCH, application/apply-patch: fieldManager is required")
        for top in ("apiVersion", "kind"):
            if not body.get(top):
                return 400, status_error(400, "BadRequest", f"{top} must be set in an apply patch")
        force = query.get("force") == "true"
        if sub == "status":
            if stored is None:
                return self._not_found(key)
            stored.obj["status"] = copy.deepcopy(body.get("status") or {})
            self._bump(stored.obj)
            return 200, copy.deepcopy(stored.obj)
        if sub is not None:
            return 404, status_error(404, "NotFound", f"no subresource {sub}")
        owned = {**{f".spec{k}": v for k, v in leaves(body.get("spec") or {}).items()},
                 **{f".metadata.labels.{k}": v for k, v in ((body.get("metadata") or {}).get("labels") or {}).items()},
                 **{f".metadata.annotations.{k}": v
                    for k, v in ((body.get("metadata") or {}).get("annotations") or {}).items()}}
        if stored is None:
            obj = self._new({"apiVersion": body["apiVersion"], "kind": body["kind"],
                             "metadata": {"name": name, "labels": {}, "annotations": {}}, "spec": {}}, namespace,
                            generation=True)
            stored = Stored(obj)
            self.objects[key] = stored
            created = True
        else:
            created = False
            conflicts = sorted(path for path, value in owned.items()
                               if path in stored.owners and stored.owners[path][0] != manager
                               and stored.owners[path][1] != value)
            if conflicts and not force:
                who = stored.owners[conflicts[0]][0]
                return 409, status_error(409, "Conflict", f"Apply failed with {len(conflicts)} conflict(s): conflict "
                                         f'with "{who}": {", ".join(conflicts)}', name=name, group=group, kind=resource)
        old_spec = copy.deepcopy(stored.obj.get("spec"))
        meta = stored.obj["metadata"]
        # This manager's fields are exactly what it sent: what it owned before and left out goes.
        for path in [p for p, (m, _) in stored.owners.items() if m == manager and p not in owned]:
            del stored.owners[path]
        stored.owners.update({path: (manager, value) for path, value in owned.items()})
        meta["labels"] = {**{k: v for k, v in (meta.get("labels") or {}).items()
                             if f".metadata.labels.{k}" in stored.owners}, **(body["metadata"].get("labels") or {})}
        meta["annotations"] = {**{k: v for k, v in (meta.get("annotations") or {}).items()
                                  if f".metadata.annotations.{k}" in stored.owners},
                               **(body["metadata"].get("annotations") or {})}
        stored.obj["spec"] = copy.deepcopy(body.get("spec") or {})
        for path, (m, value) in stored.owners.items():  # fields other managers still own stay theirs
            if m != manager and path.startswith(".spec.") and path not in owned:
                node = stored.obj["spec"]
                *parents, last = path.removeprefix(".spec.").split(".")
                for part in parents:
                    node = node.setdefault(part, {})
                node[last] = value
        if not created:
            self._bump(stored.obj, spec_changed=stored.obj["spec"] != old_spec)
        return (201 if created else 200), copy.deepcopy(stored.obj)


class _Handler(BaseHTTPRequestHandler):
    api: KubeStandIn

    def log_message(self, *_args: Any) -> None:  # quiet
        pass

    def _serve(self) -> None:
        if self.api.hang_s:
            time.sleep(self.api.hang_s)
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        content_type = self.headers.get("Content-Type") or ""
        try:
            body = json.loads(raw) if raw else None  # JSON is YAML: the client sends apply patches as JSON
        except ValueError:
            body = None
        request = Request(self.command, url.path, query, content_type, body)
        with self.api._lock:
            self.api.requests.append(request)
            self.api.history.append(request)
            if self.api.before is not None:
                self.api.before(request)
        failure = next((code for suffix, code in self.api.fail.items() if url.path.endswith(suffix)), None)
        if self.headers.get("Authorization") != f"Bearer {TOKEN}":
            code, payload = 401, status_error(401, "Unauthorized", "Unauthorized")
        elif failure is not None:
            reasons = {422: "Invalid", 500: "InternalError", 403: "Forbidden", 503: "ServiceUnavailable"}
            code, payload = failure, status_error(failure, reasons.get(failure, "Unknown"), f"injected {failure}")
        elif self.command in ("POST", "PUT", "PATCH") and not isinstance(body, dict):
            code, payload = 400, status_error(400, "BadRequest", "the request body is not a JSON object")
        else:
            code, payload = self.api.handle(self.command, url.path, query, content_type, body or {})
        data = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _serve


def api_call_of(request: Request) -> tuple[str, str, str, str]:
    """(group, resource, verb, namespace) of a recorded request, as RBAC sees it."""
    parts = request.path.strip("/").split("/")
    if parts[0] == "api":
        group, rest = "", parts[3:]
    else:
        group, rest = parts[1], parts[4:]
    namespace, resource = rest[0], rest[1]
    named = len(rest) > 2
    if len(rest) > 3:
        resource = f"{resource}/{rest[3]}"
    verb = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}.get(request.method)
    if verb is None:  # GET
        verb = "get" if named else ("watch" if request.query.get("watch") in ("true", "1") else "list")
    return group, resource, verb, namespace
