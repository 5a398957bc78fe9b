"""Parse results keyed by git blob id: a commit costs what changed, not the whole repository.

Parsing YAML (PyYAML's pure-Python scanner, with line numbers kept) is about 1.3 ms per spec file;
a repository of 1,000 WorkflowRuns would cost over a second per commit read. A git blob id names a
file's bytes, so a file whose (path, blob id) was parsed before gives the same documents, models and
problems (paths are in the problems, so the path is part of the key), under the same SpecLimits
(the per-file bounds depend on them, so they are part of the key too).

- `MemoryParseCache`: a bounded LRU in one process (the reconciler, the worker's CommitSpecs,
  both halves of a `plnt plan --base --head`). The models are frozen, so sharing them is safe.
- `DiskParseCache`: `plnt plan` is a process per run (CI on every pull request); it also keeps what
  it used in one JSON file under the cache directory, named by a key of plnt's code (the loader and
  spec models' source, pydantic's and PyYAML's versions) and the limits, so an entry is never used by
  another plnt. Models are stored as their JSON and validated again when read (cheap next to the
  YAML parse); an unreadable file or entry is a miss. Only `plnt plan` reads it, never the reconciler:
  what is deployed never depends on a file another process could have written.

max_nodes (all files of a commit together) still holds: each entry carries the nodes its parse
spent, and a cached file is used only if parsing it again could not have hit the limit; a file cut
short by the limit is never cached (its result depends on the files before it).
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections import OrderedDict
from importlib import metadata
from pathlib import Path
from typing import Any

import pydantic
import yaml
from plnt.core.specs import loader
from plnt.core.specs import models as specs
from plnt.core.specs.limits import SpecLimits
from plnt.core.specs.loader import DocPath, ParsedFile, Problem, SourceFile, _Document
from plnt.core.specs.models import KIND_MODELS
from plnt.reconciler.state import atomic_write_text

log = logging.getLogger(__name__)

# Entries kept in memory: two commits of the default max_files, about 5 KiB each.
DEFAULT_ENTRIES = 20_000
FORMAT = 1

_Key = tuple[SpecLimits, str, str]


def _key(source: SourceFile, limits: SpecLimits) -> _Key | None:
    if source.blob is None or source.problem is not None:
        return None  # text not read from git (plnt validate, a recipe file): nothing names its bytes
    return limits, source.path, source.blob


class MemoryParseCache:
    """A bounded LRU of parsed files, safe to share between threads (loads run in worker threads)."""

    def __init__(self, max_entries: int = DEFAULT_ENTRIES) -> None:
        self._max = max_entries
        self._entries: OrderedDict[_Key, ParsedFile] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def has(self, path: str, blob: str, limits: SpecLimits) -> bool:
        """Whether (path, blob) is likely a hit: its file need not be read (a miss reads it then)."""
        return (limits, path, blob) in self._entries

    def get(self, source: SourceFile, limits: SpecLimits, nodes_left: int) -> ParsedFile | None:
        key = _key(source, limits)
        with self._lock:
            parsed = self._entries.get(key) if key is not None else None
            if parsed is None or parsed.nodes > nodes_left:  # parsing again would hit max_nodes: do it
                self.misses += 1
                return None
            self._entries.move_to_end(key)  # type: ignore[arg-type]
            self.hits += 1
            return parsed

    def put(self, source: SourceFile, limits: SpecLimits, parsed: ParsedFile) -> None:
        key = _key(source, limits)
        if key is None:
            return
        with self._lock:
            self._entries[key] = parsed
            self._entries.move_to_end(key)
            while len(self._entries) > self._max:
                self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)


def code_key(limits: SpecLimits) -> str:
    """What a stored parse result depends on besides the file: plnt's loader and spec models (their
    source, so two builds of one version number differ), pydantic, PyYAML, and the limits."""
    digest = hashlib.sha256()
    for module in (loader, specs):
        digest.update(Path(module.__file__ or "").read_bytes())
    try:
        version = metadata.version("plnt")
    except metadata.PackageNotFoundError:
        version = "unknown"
    digest.update(f"\0{version}\0{pydantic.VERSION}\0{yaml.__version__}\0{FORMAT}\0".encode())
    digest.update(limits.model_dump_json().encode())
    return digest.hexdigest()


class DiskParseCache(MemoryParseCache):
    """A MemoryParseCache loaded from, and saved to, one JSON file per code key under `directory`.

    `save` writes the entries used since `open` (hits and new ones), so the file holds what the
    last plan read (two commits) and does not grow with every commit ever planned."""

    def __init__(self, directory: Path, limits: SpecLimits) -> None:
        super().__init__()
        self.key = code_key(limits)
        self.path = Path(directory) / f"parse-{self.key[:32]}.json"
        self._limits = limits
        self._stored: dict[str, Any] = {}
        self._used: dict[str, Any] = {}
        self._dirty = False
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            if isinstance(data, dict) and data.get("key") == self.key and isinstance(data.get("entries"), dict):
                self._stored = data["entries"]
        except (OSError, ValueError):  # none yet, unreadable or not JSON: start empty
            pass

    def get(self, source: SourceFile, limits: SpecLimits, nodes_left: int) -> ParsedFile | None:
        parsed = super().get(source, limits, nodes_left)
        if parsed is not None or limits != self._limits or source.blob is None or source.problem is not None:
            return parsed
        name = f"{source.path}\0{source.blob}"
        raw = self._stored.get(name)
        decoded = _decode(raw, source.path) if raw is not None else None
        if decoded is None or decoded.nodes > nodes_left:
            return None
        self._used[name] = raw
        self.misses -= 1
        self.hits += 1
        super().put(source, limits, decoded)
        return decoded

    def has(self, path: str, blob: str, limits: SpecLimits) -> bool:
        return super().has(path, blob, limits) or (limits == self._limits and f"{path}\0{blob}" in self._stored)

    def put(self, source: SourceFile, limits: SpecLimits, parsed: ParsedFile) -> None:
        super().put(source, limits, parsed)
        if limits != self._limits or source.blob is None:
            return
        raw = _encode(parsed)
        if raw is not None:
            self._used[f"{source.path}\0{source.blob}"] = raw
            self._dirty = True

    def save(self) -> None:
        """Write the entries used since opening (only when something new was parsed). A cache that
        cannot be written is a warning: the plan itself does not depend on it."""
        if not self._dirty and set(self._used) == set(self._stored):
            return
        try:
            atomic_write_text(self.path, json.dumps({"format": FORMAT, "key": self.key, "entries": self._used},
                                                    separators=(",", ":")))
        except OSError as exc:
            log.warning("parse-cache-not-saved path=%s error=%s", self.path, exc)


# --- JSON form of a ParsedFile ---------------------------------------------------------------


def _problem(p: Problem) -> list[Any]:
    return [p.file, p.line, p.field, p.message]


def _encode(parsed: ParsedFile) -> dict[str, Any] | None:
    """JSON of a parsed file, or None when its paths hold keys JSON cannot give back (dates, floats)."""
    documents = []
    for doc, model, problems in parsed.documents:
        lines = []
        if model is not None:  # a document without a model is only its problems afterwards
            for path, line in doc.lines.items():
                if any(type(part) not in (str, int) for part in path):
                    return None
                lines.append([list(path), line])
        documents.append({
            "file": doc.file, "start": doc.start, "lines": lines, "problems": [_problem(p) for p in problems],
            "model": None if model is None else [*_kind_of(model), model.model_dump_json(by_alias=True)],
        })
    return {"nodes": parsed.nodes, "problems": [_problem(p) for p in parsed.problems], "documents": documents}


def _kind_of(model: Any) -> tuple[str, str]:
    for (api, kind), cls in KIND_MODELS.items():
        if type(model) is cls:
            return api, kind
    raise TypeError(f"not a spec model: {type(model).__name__}")


def _problem_of(raw: Any) -> Problem:
    file, line, field, message = raw
    if not (isinstance(file, str) and type(line) is int and isinstance(field, str) and isinstance(message, str)):
        raise ValueError("not a problem")
    return Problem(file, line, field, message)


def _decode(raw: Any, path: str) -> ParsedFile | None:
    """The ParsedFile of a stored entry, or None when it is not one (corrupt, or another format)."""
    try:
        documents = []
        for entry in raw["documents"]:
            doc = _Document.__new__(_Document)  # a released document: file, start and lines only
            doc.file, doc.start = str(entry["file"]), int(entry["start"])
            if doc.file != path:
                return None
            lines: dict[DocPath, int] = {(): doc.start}
            for parts, line in entry["lines"]:
                if not all(type(part) in (str, int) for part in parts) or type(line) is not int:
                    return None
                lines[tuple(parts)] = line
            doc.lines, doc.problems, doc.scalars, doc.data = lines, [], {}, None
            model = None
            if entry["model"] is not None:
                api, kind, text = entry["model"]
                model = KIND_MODELS[(api, kind)].model_validate_json(text)
            documents.append((doc, model, tuple(_problem_of(p) for p in entry["problems"])))
        problems = tuple(_problem_of(p) for p in raw["problems"])
        nodes = raw["nodes"]
        if type(nodes) is not int or nodes < 0:
            return None
        return ParsedFile(problems, tuple(documents), nodes)
    except (KeyError, TypeError, ValueError, pydantic.ValidationError):
        return None
