"""The route table: which runner release answers which workflow (built by the control plane,
followed by the gateway, `plnt.gateway.router.Router` chooses among it).

The reconciler builds a new `RouteTable` whenever a saga installs a canary, promotes or
rolls back, and hands it to `Router.replace`. Tables are immutable snapshots, so a request
that already looked up its route keeps a consistent view (stable, canary and percentage
from the same moment) even if the table is swapped while it is in flight.

Weighted routing: a request goes to the canary with probability `traffic_percent / 100`.
Requests that carry a session id (`X-Session-Id`) are routed deterministically instead, so
one conversation stays on one version while the canary percentage is unchanged:

    bucket = int.from_bytes(sha256(f"{namespace}/{name}\n{session_id}").digest()[:8]) % 10_000
    canary  iff  bucket < traffic_percent * 100          (buckets of 0.01 %)

The workflow is part of the hash so that one unlucky session is not on every workflow's
canary at once. Raising the percentage only moves sessions from stable to canary (a
session on the canary stays there while the canary grows); promotion or rollback moves
everyone to the one remaining version. Among several stable replicas a session also
keeps its replica (bucket modulo the replica count); other requests take them in turn; a model's
chat completions go to their conversation's replica (plnt.gateway.affinity) when the gateway's cache
affinity is on.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from plnt.core.specs.models import GatewayPolicySpec

Track = Literal["stable", "canary"]
Protocol = Literal["runner", "openai"]


class AmbiguousRoute(LookupError):
    """The workflow name exists in several namespaces and none was given."""

    def __init__(self, name: str, namespaces: Iterable[str]) -> None:
        self.name = name
        self.namespaces = sorted(namespaces)
        super().__init__(
            f"workflow {name!r} exists in namespaces {', '.join(self.namespaces)}; "
            "pick one with ?namespace="
        )


class RouteNotReady(LookupError):
    """The workflow is known but has no promoted (stable) release to send traffic to."""

    def __init__(self, route: Route) -> None:
        self.route = route
        super().__init__(f"workflow {route.namespace}/{route.name} has no promoted release yet")


@dataclass(frozen=True)
class Backend:
    """One runner release, reachable over HTTP on loopback."""

    endpoint: str  # "http://127.0.0.1:PORT", no trailing slash
    version: str
    release_id: str


@dataclass(frozen=True)
class Route:
    """How to reach one workflow.

    `stable_replicas` are interchangeable runners of the promoted release (plnt's local
    driver runs one; other drivers may run several). `stable` is the first of them, kept for
    callers that know only one: give either, the other is filled in.
    """

    namespace: str
    name: str
    stable: Backend | None  # None: known workflow, nothing promoted yet -> 503
    canary: Backend | None = None
    traffic_percent: int = 0  # share of requests sent to the canary, 0..100
    # canary.headerRoute: requests whose header (lower-case name) has this value go to the canary
    canary_header: tuple[str, str] | None = None
    shadow_percent: int = 0  # share of the stable's invocations also mirrored to the canary (answers discarded)
    stable_replicas: tuple[Backend, ...] = ()
    # "runner": a plnt runner (POST /invoke, /chat); "openai": a ModelDeployment's model server, which
    # speaks the OpenAI API itself (the gateway passes /v1/chat/completions through unchanged).
    protocol: Protocol = "runner"
    # A ModelDeployment's spec.fallback: metadata.name of another model of this namespace that answers its chat
    # when it is down or over its own limits (gateway/retry.py says when; one hop).
    fallback: str | None = None

    def __post_init__(self) -> None:
        # Reject bad percentages here, where the reconciler builds the route, rather than
        # silently clamping them on every request.
        if not 0 <= self.traffic_percent <= 100:
            raise ValueError(f"traffic_percent must be within 0..100, got {self.traffic_percent}")
        if not 0 <= self.shadow_percent <= 100:
            raise ValueError(f"shadow_percent must be within 0..100, got {self.shadow_percent}")
        replicas = tuple(self.stable_replicas)
        if self.stable is not None and not replicas:
            replicas = (self.stable,)
        elif replicas and self.stable is None:
            object.__setattr__(self, "stable", replicas[0])
        elif replicas and self.stable != replicas[0]:
            raise ValueError("stable must be the first of stable_replicas")
        object.__setattr__(self, "stable_replicas", replicas)
        if len({b.endpoint for b in replicas}) != len(replicas):
            raise ValueError(f"duplicate endpoint among the stable replicas of {self.namespace}/{self.name}")

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def session_bucket(route: Route, session_id: str) -> int:
    """Deterministic bucket in [0, 10000) for a session of one workflow (see module docstring)."""
    digest = hashlib.sha256(f"{route.namespace}/{route.name}\n{session_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % 10_000


class RouteTable:
    """Immutable snapshot of all routes, indexed by workflow name then namespace, with the quotas the
    gateway enforces (the GatewayPolicy of the reconciled commit: it travels with the routes, so every
    gateway process gets it the way it gets them)."""

    def __init__(self, routes: Iterable[Route] = (), policy: GatewayPolicySpec | None = None) -> None:
        self.policy = policy
        by_name: dict[str, dict[str, Route]] = {}
        for route in routes:
            namespaces = by_name.setdefault(route.name, {})
            if route.namespace in namespaces:
                raise ValueError(f"duplicate route {route.namespace}/{route.name}")
            namespaces[route.namespace] = route
        self._by_name = by_name

    def lookup(self, name: str, namespace: str | None = None) -> Route | None:
        """Route for `name` (in `namespace` if given); None if unknown.

        Raises AmbiguousRoute when no namespace is given and the name is not unique, rather
        than guessing: sending a request to the wrong team's workflow is worse than a 409.
        """
        namespaces = self._by_name.get(name)
        if not namespaces:
            return None
        if namespace is not None:
            return namespaces.get(namespace)
        if len(namespaces) > 1:
            raise AmbiguousRoute(name, namespaces)
        return next(iter(namespaces.values()))

    def __iter__(self) -> Iterator[Route]:
        for namespaces in self._by_name.values():
            yield from namespaces.values()

    def __len__(self) -> int:
        return sum(len(namespaces) for namespaces in self._by_name.values())

    def __repr__(self) -> str:
        return f"RouteTable({list(self)!r})"


# --- previews (reconciler/review/previews.py) ----------------------------------------------------------
# A preview of pull request N deploys WorkflowRun `name` as its own release `name--prN`: own runner,
# own route, own status. It takes no regular traffic: the gateway reaches it only for a request that
# carries `X-Plnt-Preview: N`, and a request naming `name--prN` without the header is answered 404.
PREVIEW_HEADER = "x-plnt-preview"
_PREVIEW_SUFFIX = re.compile(r"--pr([1-9][0-9]{0,8})$")
MAX_NAME = 63  # the WorkflowRun name limit (specs.NAME_PATTERN)


def preview_name(name: str, pr: int) -> str:
    """The release name of WorkflowRun `name` previewed for pull request `pr`."""
    preview = f"{name}--pr{pr}"
    if len(preview) > MAX_NAME:
        raise ValueError(f"WorkflowRun {name!r} is too long to preview as {preview!r} ({len(preview)} > {MAX_NAME} "
                         f"characters): shorten its name")
    return preview


def preview_of(name: str) -> tuple[str, int] | None:
    """(WorkflowRun name, pull request) of a preview release name; None for a regular name."""
    match = _PREVIEW_SUFFIX.search(name)
    if match is None or match.start() == 0:
        return None
    return name[: match.start()], int(match.group(1))


class PreviewNotFound(LookupError):
    pass


def preview_target(name: str, header: bytes | None) -> str:
    """The route name a request for workflow `name` goes to, given its X-Plnt-Preview header.

    Raises PreviewNotFound (the caller answers 404) for a malformed header or a preview release
    named without the header: previews take no regular traffic."""
    if header is None:
        if preview_of(name) is not None:
            raise PreviewNotFound(f"no workflow named {name}; a preview is reached as its workflow's name with "
                                  f"the header 'X-Plnt-Preview: <pull request number>'")
        return name
    value = header.decode("latin-1").strip()
    if not value.isdigit() or not value.isascii() or int(value) < 1:
        raise PreviewNotFound(f"X-Plnt-Preview must be a pull request number, not {value[:40]!r}")
    try:
        return preview_name(name, int(value))
    except ValueError as exc:
        raise PreviewNotFound(str(exc)) from None


# --- X-Plnt-Not-Started: a runner's 503 that proves nothing ran ----------------------------------
# A 503 with this header (value "1") says the invocation was refused before anything ran (a runner, or a proxy
# in front of one, that is stopping): the gateway may send the request to another runner (gateway/retry.py).
NOT_STARTED_HEADER = "x-plnt-not-started"
# X-Plnt-Fallback: on an answer the fallback model gave, its name (the model the caller named was down).
FALLBACK_HEADER = "x-plnt-fallback"


# --- X-Plnt-Track: a request that names its track (the playground's version pick) ----------------
TRACK_HEADER = "x-plnt-track"
# The gateway's mirror of a live request to a canary (canary.shadowPercent): its answer is discarded,
# and the runner does not run the recipe's sideEffects steps. Set by the gateway only (it builds the
# runner's request headers itself: a client's own never reach a runner).
SHADOW_HEADER = "x-plnt-shadow"


class NoCanary(LookupError):
    """X-Plnt-Track: canary for a workflow with no canary under test (the caller answers 409)."""

    def __init__(self, route: Route) -> None:
        self.route = route
        super().__init__(f"no canary of {route.namespace}/{route.name} is under test; send X-Plnt-Track: stable "
                         "or no X-Plnt-Track")


class BadTrack(ValueError):
    """An X-Plnt-Track value other than stable or canary (the caller answers 400)."""


def forced_track(header: bytes | None) -> Track | None:
    """The track an X-Plnt-Track header names; None without the header. Raises BadTrack."""
    if header is None:
        return None
    if header == b"stable":
        return "stable"
    if header == b"canary":
        return "canary"
    value = header.decode("latin-1").strip().lower()
    if value in ("stable", "canary"):
        return value  # type: ignore[return-value]
    raise BadTrack(f"X-Plnt-Track must be 'stable' or 'canary', not {value[:40]!r}")
