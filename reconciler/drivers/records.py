"""What the local driver keeps on disk: the release records (STATE/releases) and the runner pid
files (STATE/runner-pids).

A release record says what is live for one WorkflowRun (its stable and canary release, each with
its runner's pid and port), so a restarted `plnt up` knows what to resume. Records are replaced
whole (an atomic rename), which is what lets `snapshot` trust a file's stamp.

No runner is lost: each runner process is written to STATE/runner-pids/PID.json (pid and start
time) right after it starts, before its health check, and that entry goes only when the process
is gone. A runner that no release record names is one plnt must stop (see
RunnerProcesses.stop_unrecorded).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from plnt.reconciler.state import LiveWorkflow, Release, atomic_write_json, read_json
from pydantic import BaseModel, ConfigDict, StrictInt

# A directory changed less than this long ago may change again within the same mtime tick.
SETTLED_NS = 2_000_000_000
Stamp = tuple[int, int, int]


class ReleaseRecords:
    """STATE/releases/NAMESPACE.NAME.json: one LiveWorkflow per WorkflowRun with a release."""

    def __init__(self, directory: Path, on_change: Callable[[], None]) -> None:
        self._directory = directory
        self._on_change = on_change  # told after every write (the gateway's routes follow the records)
        self._parsed: dict[str, tuple[Stamp, LiveWorkflow]] = {}  # the last scan's records, by file name
        # The directory's stamp when the last snapshot may be reused whole (see snapshot), and that snapshot.
        self._listing: tuple[Stamp, dict[str, LiveWorkflow]] | None = None
        self.scans = 0  # directory scans so far: what an idle pass must not cost (read by tests)

    def read(self, namespace: str, name: str) -> LiveWorkflow:
        raw = read_json(self._path(namespace, name))
        return LiveWorkflow.model_validate(raw) if raw else LiveWorkflow(namespace=namespace, name=name)

    def write(self, live: LiveWorkflow) -> None:
        path = self._path(live.namespace, live.name)
        if live.empty:
            path.unlink(missing_ok=True)
        else:
            atomic_write_json(path, live.model_dump(mode="json"))
        self._on_change()

    def snapshot(self) -> dict[str, LiveWorkflow]:
        """The records as they are now. A record is parsed again only when its file changed (a write
        is a new inode): a poll of 1,000 records costs 1,000 stats, not 1,000 JSON reads. And while
        the directory itself is unchanged (a record written, added or removed is a rename or unlink
        in it, which moves its mtime), the last snapshot is the answer: an idle poll costs one stat."""
        try:
            directory = os.stat(self._directory)
        except FileNotFoundError:
            directory = None
        stamp = (directory.st_ino, directory.st_mtime_ns, directory.st_ctime_ns) if directory else None
        if stamp is not None and self._listing is not None and self._listing[0] == stamp:
            return dict(self._listing[1])
        self.scans += 1
        result = self._scan()
        # Trusted only once the directory's mtime is safely in the past: a change in the same clock
        # tick as the scan could keep the same mtime (file timestamps are coarse), so a directory
        # changed under 2 s ago is scanned again next time (git's "racily clean" rule).
        settled = directory is not None and time.time_ns() - directory.st_mtime_ns > SETTLED_NS
        self._listing = (stamp, result) if settled and stamp is not None else None
        return dict(result)

    def _scan(self) -> dict[str, LiveWorkflow]:
        known = self._parsed
        seen: dict[str, tuple[Stamp, LiveWorkflow]] = {}
        result: dict[str, LiveWorkflow] = {}
        with os.scandir(self._directory) as listing:
            entries = sorted((e for e in listing if e.name.endswith(".json")), key=lambda e: e.name)
        for entry in entries:
            try:
                stat = entry.stat()
            except FileNotFoundError:  # removed since the listing
                continue
            stamp = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
            hit = known.get(entry.name)
            if hit is not None and hit[0] == stamp:
                live = hit[1]
            else:
                raw = read_json(Path(entry.path))
                if raw is None:
                    continue
                live = LiveWorkflow.model_validate(raw)
            seen[entry.name] = (stamp, live)
            if not live.empty:
                result[live.key] = live
        self._parsed = seen  # replaced whole: a snapshot in another thread reads one or the other
        return result

    def _path(self, namespace: str, name: str) -> Path:
        return self._directory / f"{namespace}.{name}.json"


class PidFile(BaseModel):
    """One STATE/runner-pids/PID.json. A pid file alone is not trusted: the process must still have
    that start time, and be a runner, before plnt signals it."""

    model_config = ConfigDict(frozen=True)

    pid: StrictInt
    pid_start: str | None = None
    release_id: str | None = None


class RunnerPidFiles:
    """STATE/runner-pids: every runner process this plnt (or one before it) started and that may
    still run."""

    def __init__(self, directory: Path) -> None:
        self._directory = directory
        directory.mkdir(exist_ok=True)

    def remember(self, release: Release) -> None:
        atomic_write_json(self._path(release.pid),
                          {"pid": release.pid, "pid_start": release.pid_start, "release_id": release.release_id})

    def start_of(self, pid: int) -> str | None:
        """The start time the pid file of `pid` names (None: no such file, or not one plnt wrote)."""
        entry = self._load(self._path(pid))
        return entry.pid_start if entry is not None else None

    def forget(self, pid: int) -> None:
        self._path(pid).unlink(missing_ok=True)

    def entries(self) -> Iterator[tuple[Path, PidFile | None]]:
        """Each pid file in name order, with what it says (None: unreadable, not what plnt writes)."""
        for path in sorted(self._directory.glob("*.json")):
            yield path, self._load(path)

    @staticmethod
    def _load(path: Path) -> PidFile | None:
        try:
            return PidFile.model_validate(read_json(path))
        except (OSError, ValueError):  # (a pydantic ValidationError is a ValueError)
            return None

    def _path(self, pid: int | None) -> Path:
        return self._directory / f"{pid}.json"
