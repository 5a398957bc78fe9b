"""The state directory: what plnt remembers across restarts.

    STATE/
      source/               clone of the spec repository (no work tree)
      source.json           repository, branch, last reconciled commit, problems of the newest commit
      status.json           status of every WorkflowRun (as of its last compaction)
      status.journal        the changes since, one JSON line each (reconciler/status_store.py)
      releases/NS.NAME.json live releases of one WorkflowRun (stable and canary), local driver
      recipes/HEX/          pulled recipes, by content digest
      runners/RELEASE.log   output of each runner process
      temporal.db           the embedded Temporal server's database

Every file is written atomically (temporary file, fsync, rename), so a crash never leaves half a file;
the status journal is appended to (fsync'd), and a line a crash cut short is skipped when read.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Track = Literal["stable", "canary"]


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def append_durably(path: Path, data: bytes) -> None:
    """Append `data` to `path` (created if missing), on disk when this returns (fsync)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_json(path: Path, data: Any) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def read_json(path: Path, default: Any = None) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return default


class ModelServing(BaseModel):
    """How a ModelDeployment's release serves its weights: the runtime, the file it loads (relative
    to the release's verified model directory, `recipe_dir`) and the runtime's settings.

    `registry` and `model_name` say where the weights come from (`spec.model`): a Kubernetes pod
    fetches them itself (the chart's init container, pinned to the release's `recipe_digest`), so
    its release is made from them, not from a directory of plnt's. Empty in records made before
    they were recorded. `model_file` is empty for runtimes that serve the whole directory (vLLM,
    TGI, SGLang)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    runtime: str
    model_file: str
    alias: str
    context_length: int
    threads: int | None = None
    args: tuple[str, ...] = ()
    memory_mib: int | None = None  # spec.runtime.resources.memoryMiB; None: the backend's runnerLimits
    registry: str = ""
    model_name: str = ""


class ReplicaProcess(BaseModel):
    """One more process of a local release (a replica past its first): where it listens and which
    process it is. The first replica's are the release's own `pid`, `pid_start`, `port`, `endpoint`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    pid: int | None = None
    pid_start: str | None = None
    port: int | None = None
    endpoint: str = ""
    backend: str | None = None  # the PlntBackend of a pool it was placed on (see Release.placement)


class Release(BaseModel):
    """One installed release of a WorkflowRun (a runner serving one recipe version) or of a
    ModelDeployment (`model` set: a model server; `recipe_digest`/`recipe_dir` are then the root
    digest and the verified model directory).

    Replicas: a stable release runs `replicas` interchangeable processes (the spec's `replicas.min`,
    or what a scale set since), a canary one. On the local driver, the first is the release's own
    `pid`/`port`/`endpoint` and the others are `more_replicas`; `processes()` gives each as a release
    of its own, which is what starts, stops, drains and health checks work on. On Kubernetes the
    release's endpoint is its Service and `replicas` the Deployment's count (no `more_replicas`).

    Placement across a pool of local backends (`spec.backend.refs` or `selector`): `placement` is the
    replicas per backend (in order; the canary runs on the first) and each process names its
    `backend`; `replicas` is their sum."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    release_id: str
    namespace: str
    name: str
    track: Track
    version: str
    spec_fingerprint: str
    recipe_digest: str
    recipe_dir: str
    endpoint: str
    traffic_percent: int = 0
    # canary.headerRoute: requests whose header (lower-case name) has this value go to this canary
    canary_header: tuple[str, str] | None = None
    shadow_percent: int = 0  # canary.shadowPercent: share of the stable's invocations mirrored to this canary
    pid: int | None = None
    pid_start: str | None = None  # /proc start time: tells our process from a reused pid
    port: int | None = None
    # Scale to zero (local runners of `replicas.min: 0`): the runner exits after this many idle
    # seconds, and is then recorded `parked` (no process, same port) until a request wakes it.
    park_after_s: float | None = None
    parked: bool = False
    model: ModelServing | None = None
    # A WorkflowRun bound to a ModelDeployment (spec.model): "namespace/name" its runner's LLM calls go to.
    llm_model: str | None = None
    replicas: int = Field(default=1, ge=1)  # processes it runs as the stable release (a canary runs one)
    replicas_max: int | None = None  # an autoscaled spec's replicas.max (see InstallRequest.replicas_max)
    more_replicas: tuple[ReplicaProcess, ...] = ()  # local: the processes past the first (see the class doc)
    placement: dict[str, int] | None = None  # a pool's: replicas per backend (None: one backend, the assigned one)
    backend: str | None = None  # a pool's: the backend the first process was placed on

    def processes(self) -> list[Release]:
        """Each replica process as a release of its own (the first is this one, without `more_replicas`)."""
        first = self.model_copy(update={"more_replicas": ()}) if self.more_replicas else self
        return [first, *(first.model_copy(update=extra.model_dump()) for extra in self.more_replicas)]

    def with_processes(self, processes: list[Release]) -> Release:
        """This release running `processes` (as `processes()` gives them; the first is its own)."""
        first, *rest = processes
        return first.model_copy(update={
            "replicas": self.replicas,
            "placement": self.placement,
            "more_replicas": tuple(ReplicaProcess(pid=p.pid, pid_start=p.pid_start, port=p.port, endpoint=p.endpoint,
                                                  backend=p.backend) for p in rest)})

    def placed_backends(self) -> list[str | None]:
        """The backend of each replica it is to run, in order (None for each without a placement)."""
        if self.placement is None:
            return [None] * self.replicas
        return [backend for backend, count in self.placement.items() for _ in range(count)]

    def replicas_by_backend(self) -> dict[str, int]:
        """The processes it runs per backend (a pool's; empty without a placement). On Kubernetes (no
        pid, not parked) each backend's process is its Helm release's Service: the placement's count
        of pods each."""
        if self.placement is not None and self.pid is None and not self.parked and self.backend is not None:
            return dict(self.placement)
        counts: dict[str, int] = {}
        for process in self.processes():
            if process.backend is not None:
                counts[process.backend] = counts.get(process.backend, 0) + 1
        return counts

    @property
    def endpoints(self) -> tuple[str, ...]:
        """Where its replicas listen, the first first."""
        return (self.endpoint, *(extra.endpoint for extra in self.more_replicas))


class LiveWorkflow(BaseModel):
    """What is running for one WorkflowRun."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    namespace: str
    name: str
    stable: Release | None = None
    canary: Release | None = None

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def empty(self) -> bool:
        return self.stable is None and self.canary is None


class StateDir:
    """Paths inside the state directory."""

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()

    def ensure(self) -> StateDir:
        for sub in ("releases", "recipes", "runners"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        return self

    @property
    def source_clone(self) -> Path:
        return self.root / "source"

    @property
    def source_file(self) -> Path:
        return self.root / "source.json"

    @property
    def status_file(self) -> Path:
        return self.root / "status.json"

    @property
    def releases(self) -> Path:
        return self.root / "releases"

    @property
    def recipes(self) -> Path:
        return self.root / "recipes"

    @property
    def runner_logs(self) -> Path:
        return self.root / "runners"

    @property
    def temporal_db(self) -> Path:
        return self.root / "temporal.db"
