"""Load spec files into validated models, reporting every problem with its file and line.

A spec repository (or a recipe's `workflow.yaml`) is read as plain YAML first, keeping the
line of every key, so that pydantic's error locations and the cross-document checks below
can point at the exact line a human has to edit. Loading never stops at the first problem:
the reconciler shows them all at once, sorted by file and line.

The returned `SpecSet` holds every document that passed its model (the first one wins when
names collide). Cross-document problems (unknown backend, bad step graph...) are reported
but do not remove documents, so callers must not apply or prune anything while problems
are non-empty.
"""

from __future__ import annotations

import collections
import difflib
import fnmatch
import itertools
import os
import re
import types
import typing
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from plnt.core.specs.limits import SpecLimits
from plnt.core.specs.models import (
    INTEGRITY_PATTERN,
    KIND_MODELS,
    LOCAL_MODEL_RUNTIMES,
    NAME_PATTERN,
    RECIPE_API_VERSION,
    REF_PATTERN,
    VERSION_PATTERN,
    Deployable,
    Gate,
    GatewayPolicy,
    ModelDeployment,
    PlntBackend,
    RecipeTrustPolicy,
    Workflow,
    WorkflowRun,
    run_key,
)
from pydantic import BaseModel, ValidationError

DEPLOYABLE_KINDS = ("WorkflowRun", "ModelDeployment")  # what a saga rolls out, keyed namespace/name

# A path into a YAML document: mapping keys and sequence indices, as pydantic's `loc`.
DocPath = tuple[Any, ...]

DEFAULT_LIMITS = SpecLimits()
# Every file may build this many nodes besides `alias_factor` per byte (small files with a few aliases).
NODE_ALLOWANCE = 10_000

KNOWN_KINDS = ", ".join(f"{api} {kind}" for api, kind in KIND_MODELS)

# Plain-language names for the regex patterns in specs/models.py (a raw regex helps nobody).
PATTERN_HINTS = {
    NAME_PATTERN: "a lowercase name of at most 63 characters: a-z, 0-9 and '-', "
    "starting and ending with a letter or digit (e.g. review-responder)",
    VERSION_PATTERN: "a semantic version like 1.2.0 or 1.3.0-rc.1",
    REF_PATTERN: "name@version, e.g. review-responder@1.2.0",
    INTEGRITY_PATTERN: "'sha256:' followed by 64 lowercase hex digits",
    r"^[A-Za-z_][A-Za-z0-9_]*$": "an identifier: letters, digits and '_', not starting with a digit",
}

# What a pydantic type error expected, in YAML terms.
EXPECTED_TYPES = {
    "string_type": "a string",
    "int_type": "a whole number",
    "float_type": "a number",
    "bool_type": "true or false",
    "dict_type": "a mapping (key: value)",
    "model_type": "a mapping (key: value)",
    "model_attributes_type": "a mapping (key: value)",
    "list_type": "a list",
}


@dataclass(frozen=True)
class Problem:
    file: str
    line: int
    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.field}: {self.message}"


@dataclass(frozen=True)
class SourceFile:
    """One spec file; `problem` set (and text empty) when it could not be read as a spec."""

    path: str
    text: str
    problem: Problem | None = None
    blob: str | None = None  # git blob id of the bytes when read from a commit: the parse cache's key
    # Set when the text was not read (a parse cache holds the blob): reads it, should the cache miss.
    unread: Callable[[], SourceFile] | None = field(default=None, compare=False, repr=False)


def unreadable(path: str, line: int, message: str) -> SourceFile:
    return SourceFile(path, "", Problem(path, line, "document", message))


@dataclass
class SpecSet:
    """Every valid document, by key; `locations` maps "Kind/key" to (file, first line);
    `warnings` are FILE:LINE notes that do not make the specs invalid (e.g. a loose identityRegex).

    trust_policies: RecipeTrustPolicy by name. Policies may overlap (two may cover the same
    recipe name or pattern): a recipe is accepted if ANY policy covering it accepts its
    signature, and rejected if none covers it (see `plnt.reconciler.recipes.trust`).
    """

    workflow_runs: dict[str, WorkflowRun] = field(default_factory=dict)
    model_deployments: dict[str, ModelDeployment] = field(default_factory=dict)
    backends: dict[str, PlntBackend] = field(default_factory=dict)
    recipes: dict[str, Workflow] = field(default_factory=dict)
    locations: dict[str, tuple[str, int]] = field(default_factory=dict)
    trust_policies: dict[str, RecipeTrustPolicy] = field(default_factory=dict)
    gates: dict[str, Gate] = field(default_factory=dict)  # by namespace/name
    # The quotas and prices the gateway enforces: at most one per repository (None: no limits).
    gateway_policy: GatewayPolicy | None = None
    warnings: list[Problem] = field(default_factory=list)

    def deployables(self) -> dict[str, Deployable]:
        """What sagas roll out, by key: WorkflowRuns and ModelDeployments (the loader keeps their
        keys apart)."""
        if not self.model_deployments:
            return self.workflow_runs  # type: ignore[return-value] - not copied: read, never changed
        return {**self.workflow_runs, **self.model_deployments}

    def deployable(self, key: str) -> Deployable | None:
        """One of deployables(), without building that mapping (a lookup per saga start)."""
        return self.workflow_runs.get(key) or self.model_deployments.get(key)


class SpecError(Exception):
    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))


# --- reading -------------------------------------------------------------------------------


IGNORE_FILE = ".plntignore"


class IgnoreRules:
    """Paths under the spec root that are not specs, from `.plntignore` (like Flux's .sourceignore).

    One glob pattern per line, relative to the spec root; `#` starts a comment; a pattern
    ending in `/` names a directory and everything under it (e.g. `registry/` for a recipe
    registry kept in the spec repository, whose golden files are not plnt resources).
    """

    def __init__(self, patterns: Iterable[str] = ()) -> None:
        self.patterns = [p.strip() for p in patterns if p.strip() and not p.strip().startswith("#")]

    @classmethod
    def parse(cls, text: str) -> IgnoreRules:
        return cls(text.splitlines())

    def ignores(self, relative_path: str) -> bool:
        parts = relative_path.split("/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        for pattern in self.patterns:
            if pattern.endswith("/"):
                if any(fnmatch.fnmatchcase(prefix, pattern.rstrip("/")) for prefix in prefixes[:-1]):
                    return True
            elif any(fnmatch.fnmatchcase(prefix, pattern.lstrip("/")) for prefix in prefixes):
                return True
        return False


def decode_spec(path: str, data: bytes) -> SourceFile:
    """A spec file's bytes as text; one that is not UTF-8 carries a problem at its first bad byte."""
    try:
        return SourceFile(path, data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - data.rfind(b"\n", 0, exc.start)
        return unreadable(path, line, f"not UTF-8 text: byte 0x{data[exc.start]:02x} at column {column} "
                                      f"({exc.reason}); save the file as UTF-8")


# (path, size in bytes, read the bytes): what a spec reader knows of a file before reading it.
SpecEntry = tuple[str, int, Callable[[], bytes]]


def read_specs(entries: Iterable[SpecEntry], limits: SpecLimits = DEFAULT_LIMITS) -> list[SourceFile]:
    """The files of `entries` (in path order), reading only what the limits admit. Too many files,
    or too many bytes in all, is one problem and nothing is read (callers list at most max_files + 1
    entries); a file over max_file_bytes is a problem without being read."""
    listed = list(itertools.islice(entries, limits.max_files + 1))
    if len(listed) > limits.max_files:
        return [unreadable(listed[-1][0], 1, f"more than {limits.max_files} spec files (limit max_files); nothing "
                                             "of this commit was read: move what is not a spec out of the spec "
                                             f"path or name it in {IGNORE_FILE}")]
    total = 0
    for path, size, _ in listed:
        total += min(size, limits.max_file_bytes + 1)  # a file too large is refused on its own below
        if total > limits.max_total_bytes:
            return [unreadable(path, 1, f"spec files add up to more than {limits.max_total_bytes} bytes at this file "
                                        "(limit max_total_bytes); nothing of this commit was read")]
    files: list[SourceFile] = []
    for path, size, read in listed:
        if size > limits.max_file_bytes:
            files.append(unreadable(path, 1, f"file is {size} bytes, over the limit of {limits.max_file_bytes} for "
                                             "one spec file (max_file_bytes); split it into smaller files"))
            continue
        try:
            data = read()
        except OSError as exc:
            files.append(unreadable(path, 1, f"cannot read file: {exc}"))
            continue
        if len(data) > limits.max_file_bytes:  # grew since its size was taken
            files.append(unreadable(path, 1, f"file is over the limit of {limits.max_file_bytes} bytes for one "
                                             "spec file (max_file_bytes); split it into smaller files"))
            continue
        files.append(decode_spec(path, data))
    return files


def read_tree(root: Path, limits: SpecLimits = DEFAULT_LIMITS) -> tuple[list[SourceFile], list[Problem]]:
    """Every *.yaml/*.yml under root, skipping hidden dirs and files (.git, .plnt, .gitlab-ci.yml)
    and whatever `.plntignore` names: the files read, and the problems of those that could not be."""
    ignore_file = root / IGNORE_FILE
    rules = IgnoreRules()
    if ignore_file.is_file():
        with ignore_file.open("rb") as stream:  # patterns only: a bounded read, odd bytes replaced
            rules = IgnoreRules.parse(stream.read(limits.max_file_bytes).decode("utf-8", "replace"))
    found: list[tuple[str, Path]] = []
    for dirpath, dirnames, filenames in os.walk(root):
        # Prune in place so os.walk never descends into .git and friends.
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        for name in filenames:
            if name.startswith(".") or not name.endswith((".yaml", ".yml")):
                continue
            full = Path(dirpath) / name
            rel = full.relative_to(root).as_posix()
            if not rules.ignores(rel):
                found.append((rel, full))
        if len(found) > limits.max_files:
            break  # read_specs reports it; walking the rest of a huge tree would only cost time

    def entry(rel: str, full: Path) -> SpecEntry:
        try:
            size = full.stat().st_size
        except OSError:
            size = 0  # read() reports why
        return rel, size, full.read_bytes

    files = read_specs((entry(rel, full) for rel, full in sorted(found)), limits)
    return [f for f in files if f.problem is None], [f.problem for f in files if f.problem is not None]


def read_file_spec(path: Path, display: str, limits: SpecLimits = DEFAULT_LIMITS) -> SourceFile:
    """One spec file named on its own (`plnt validate FILE`, a recipe's workflow.yaml)."""
    try:
        size = path.stat().st_size
    except OSError as exc:
        return unreadable(display, 1, f"cannot read file: {exc}")
    return read_specs([(display, size, path.read_bytes)], limits)[0]


def read_directory(root: Path) -> list[SourceFile]:
    """The spec files under root, sorted by path; raises SpecError if one cannot be read."""
    files, problems = read_tree(Path(root))
    if problems:
        raise SpecError(problems)
    return files


# --- YAML with line numbers ----------------------------------------------------------------


_SEQ_TAG = "tag:yaml.org,2002:seq"
_MAP_TAG = "tag:yaml.org,2002:map"
_MERGE_TAG = "tag:yaml.org,2002:merge"
# What PyYAML's reader refuses (NUL and other control characters); it would raise before any line is known.
_NON_PRINTABLE = yaml.reader.Reader.NON_PRINTABLE


class _TooCostly(Exception):
    """A file would cost more than the limits allow to read (nesting, alias expansion): it is refused."""

    def __init__(self, mark: yaml.Mark, message: str) -> None:
        super().__init__(message)
        self.line = mark.line + 1
        self.message = message


class _Budget:
    """Nodes the documents of one load may still build, aliases and merge keys counted at every use
    (so a small file whose aliases expand a billion-fold is refused after a bounded amount of work)."""

    def __init__(self, limits: SpecLimits) -> None:
        self.limits = limits
        self.left = limits.max_nodes
        self.file_allowed = self.file_left = 0

    def start_file(self, size: int) -> None:
        self.file_allowed = self.file_left = NODE_ALLOWANCE + self.limits.alias_factor * size

    def spend(self, node: yaml.Node) -> None:
        self.left -= 1
        self.file_left -= 1
        if self.file_left < 0:
            raise _TooCostly(node.start_mark, f"aliases or merge keys expand this file to more than "
                             f"{self.file_allowed} values ({self.limits.alias_factor} per byte + {NODE_ALLOWANCE}, "
                             "alias_factor); an alias bomb? write the values out or use fewer nested aliases")
        if self.left < 0:
            raise _TooCostly(node.start_mark, f"the spec files hold more than {self.limits.max_nodes} values in all, "
                             "aliases expanded (max_nodes); split the repository or raise the limit")


class _SpecLoader(yaml.SafeLoader):
    """SafeLoader whose composer (recursive, one Python frame per level) stops at max_depth levels,
    before a deep document can exhaust the stack."""

    def __init__(self, text: str, max_depth: int) -> None:
        super().__init__(text)
        self.max_depth = max_depth
        self._depth = 0

    def fetch_flow_collection_start(self, TokenClass: Any) -> None:  # noqa: N803 - PyYAML's name
        # The scanner reads ahead of the composer, and each open '[' or '{' costs it a scan of every
        # open one before it: stop JSON-style nesting here, where it is cheap.
        if self.flow_level >= self.max_depth:
            raise _TooCostly(self.get_mark(), f"nested more than {self.max_depth} levels deep (max_depth); "
                             "specs are shallow: flatten this document")
        super().fetch_flow_collection_start(TokenClass)

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        if self._depth >= self.max_depth:
            raise _TooCostly(self.peek_event().start_mark, f"nested more than {self.max_depth} levels deep "
                             "(max_depth); specs are shallow: flatten this document")
        self._depth += 1
        try:
            return super().compose_node(parent, index)  # type: ignore[no-any-return]
        finally:
            self._depth -= 1


# libyaml (C) scans, parses and composes about 10x faster than PyYAML's pure-Python loader; see
# `_parse` for how it is used without giving up a bound or a message of the pure-Python loader.
def _bounded_libyaml() -> type[Any] | None:
    """yaml.CSafeLoader if this PyYAML has libyaml and libyaml refuses deep nesting itself (0.2.5 and
    later stop at 1,000 levels): PyYAML composes libyaml's nodes recursively in C, where a document
    nested 100,000 levels deep would overflow the stack instead of raising."""
    loader_class = getattr(yaml, "CSafeLoader", None) if yaml.__with_libyaml__ else None
    if loader_class is None:
        return None
    probe = loader_class("[" * 5000)
    try:
        while probe.check_event():
            probe.get_event()
    except yaml.YAMLError as exc:
        return loader_class if "nesting depth" in str(exc) else None
    finally:
        probe.dispose()
    return None


_CLoader: type[Any] | None = _bounded_libyaml()


# Where libyaml and PyYAML's own scanner read the same text differently (tabs as separators, `?`
# inside a flow plain scalar, an empty `!` tag, a byte order mark past the start, `|#`): a file holding
# one of these is read by the pure-Python loader only, so a result never depends on whether
# PyYAML was built with libyaml. test_loader_fast.py looks for more such cases by random edits.
_LIBYAML_DIFFERS = re.compile("[\t?!\ufeff]|[|>][-+0-9]*#")


class _FastSpecLoader(_CLoader or yaml.SafeLoader):  # type: ignore[misc]
    """libyaml's SafeLoader, for files the pure-Python _SpecLoader would read without a problem.

    libyaml composes in C, without our depth check; it refuses nesting past its own limit (1,000
    levels) while scanning, and `_Document._build` refuses paths deeper than max_depth. A file it
    cannot read as plain data within the limits is read again by _SpecLoader (see `_parse`)."""

    def __init__(self, text: str, max_depth: int) -> None:
        super().__init__(text)
        self.max_depth = max_depth


_PLAIN_SCALARS: dict[str, Callable[[Any, yaml.ScalarNode], Any]] = {
    tag: yaml.SafeLoader.yaml_constructors[tag]
    for tag in (f"tag:yaml.org,2002:{name}" for name in ("str", "int", "float", "bool", "null", "timestamp"))
}


class _Document:
    """One YAML document as plain data, plus the 1-based line of every path in it."""

    def __init__(self, loader: _SpecLoader | _FastSpecLoader, node: yaml.Node, file: str, budget: _Budget) -> None:
        self.file = file
        self.start: int = node.start_mark.line + 1
        self.lines: dict[DocPath, int] = {(): self.start}
        self.scalars: dict[DocPath, str] = {}
        self.problems: list[Problem] = []
        self._loader = loader
        self._budget = budget
        self._active: set[int] = set()
        self._entry_line = 0  # line of the top-level entry being built: where a runaway alias is referenced
        try:
            self.data = self._build(node, ())
        except _TooCostly as exc:
            exc.line = self._entry_line or exc.line  # an alias node's own mark is its anchor's, not the reference
            raise

    def _scalar(self, node: yaml.ScalarNode) -> Any:
        try:
            # The SafeLoader resolves scalar tags (int, float, bool, null, timestamps...). The plain
            # ones are built by their constructor directly: construct_object's bookkeeping (a cache
            # of every node built, recursion checks) costs more than the value, and a scalar needs none.
            plain = _PLAIN_SCALARS.get(node.tag)
            if plain is not None:
                return plain(self._loader, node)
            return self._loader.construct_object(node, deep=True)
        except (ValueError, OverflowError) as exc:  # `2024-13-45`, an int of 5,000 digits
            self.problems.append(Problem(self.file, node.start_mark.line + 1, "document",
                                         f"cannot read {_short(node.value)}: {exc}; quote it to keep it text"))
            return node.value

    def _build(self, node: yaml.Node, path: DocPath) -> Any:
        self._budget.spend(node)
        if len(path) > self._loader.max_depth:  # aliases can nest what the composer saw as shallow
            raise _TooCostly(node.start_mark, f"nested more than {self._loader.max_depth} levels deep through "
                             "aliases (max_depth); flatten this document")
        if isinstance(node, yaml.ScalarNode):
            self.scalars[path] = node.value  # the text as written, for "quote it" advice
            return self._scalar(node)
        if id(node) in self._active:  # an alias inside its own anchor: `&a [*a]`
            raise yaml.constructor.ConstructorError(None, None, "recursive alias", node.start_mark)
        if node.tag not in (_SEQ_TAG, _MAP_TAG):  # e.g. `!Ref {...}`: not plain data
            raise yaml.constructor.ConstructorError(None, None, f"unsupported tag {node.tag!r}", node.start_mark)
        self._active.add(id(node))
        try:
            if isinstance(node, yaml.SequenceNode):
                items = []
                for index, item in enumerate(node.value):
                    self.lines[path + (index,)] = item.start_mark.line + 1
                    if not path:
                        self._entry_line = item.start_mark.line + 1
                    items.append(self._build(item, path + (index,)))
                return items
            assert isinstance(node, yaml.MappingNode)
            return self._mapping(node, path)
        finally:
            self._active.discard(id(node))

    def _mapping(self, node: yaml.MappingNode, path: DocPath) -> dict[Any, Any]:
        mapping: dict[Any, Any] = {}
        merged: set[Any] = set()  # keys that came from a merge; the mapping's own keys override them
        # `<<: *a` or `<<: [*a, *b]`: built here (not by PyYAML's flatten_mapping, which copies every
        # merged key list unbounded), each key from the first mapping that has it, as YAML says.
        for key_node, value_node in node.value:
            if key_node.tag != _MERGE_TAG:
                continue
            sources = value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
            for source in sources:
                if not isinstance(source, yaml.MappingNode):
                    raise yaml.constructor.ConstructorError(
                        None, None, "a merge key (<<) takes a mapping or a list of mappings", source.start_mark)
                for key, value in self._build(source, path).items():
                    if key not in mapping:
                        mapping[key] = value
                        merged.add(key)
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE_TAG:
                continue
            if not isinstance(key_node, yaml.ScalarNode):
                raise yaml.constructor.ConstructorError(
                    None, None, "a mapping key must be a plain value", key_node.start_mark
                )
            self._budget.spend(key_node)
            key = self._scalar(key_node)
            if key in mapping and key not in merged:
                # PyYAML would silently keep the last value; that hides editing mistakes.
                first = self.lines[path + (key,)]
                self.problems.append(
                    Problem(
                        self.file,
                        key_node.start_mark.line + 1,
                        _render(path + (key,)),
                        f"duplicate key {key!r}; first given at line {first}, remove one of them",
                    )
                )
                continue
            merged.discard(key)  # an own key overriding a merged one, as YAML intends
            self.lines[path + (key,)] = key_node.start_mark.line + 1
            if not path:
                self._entry_line = key_node.start_mark.line + 1
            mapping[key] = self._build(value_node, path + (key,))
        return mapping

    def release(self) -> None:
        """Drop what only parsing and validating needed (the loader, the raw data and scalars): a
        cached document keeps its file, start and lines, for the cross-document checks."""
        self._loader = self._budget = None  # type: ignore[assignment]
        self.data = None
        self.scalars = {}
        self._active = set()

    def line(self, path: DocPath) -> int:
        """Line of the longest prefix of path that exists in the document."""
        for end in range(len(path), -1, -1):
            if path[:end] in self.lines:
                return self.lines[path[:end]]
        return self.start


def _render(path: Iterable[Any]) -> str:
    """('steps', 2, 'deps') -> 'steps[2].deps'; odd mapping keys are quoted."""
    out = ""
    for part in path:
        if isinstance(part, int) and not isinstance(part, bool):
            out += f"[{part}]"
        elif isinstance(part, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_-]*", part):
            out += f".{part}" if out else part
        else:
            out += f"[{part!r}]"
    return out or "document"


# Files read by each parser since start: libyaml ("fast") for valid plain files, PyYAML's pure-Python
# loader ("checked") for the rest. A cost the tests observe (a valid file must take the fast path).
parser_reads: collections.Counter[str] = collections.Counter()


def _parse(source: SourceFile, budget: _Budget) -> tuple[list[_Document], list[Problem]]:
    """Documents of one file, in order; a syntax error ends the file but keeps earlier documents."""
    if source.problem is not None:
        return [], [source.problem]
    text, limits = source.text, budget.limits
    if len(text) > limits.max_file_bytes:  # text handed over directly, not through read_specs
        return [], [Problem(source.path, 1, "document", f"file is over the limit of {limits.max_file_bytes} bytes "
                                                         "for one spec file (max_file_bytes); split it")]
    bad = _NON_PRINTABLE.search(text)
    if bad is not None:
        line, column = text.count("\n", 0, bad.start()) + 1, bad.start() - text.rfind("\n", 0, bad.start())
        return [], [Problem(source.path, line, "document", f"character U+{ord(bad.group()):04X} at column {column} "
                                                             "is not allowed in YAML; remove it")]
    if _CLoader is not None and _LIBYAML_DIFFERS.search(text, 1 if text.startswith("\ufeff") else 0) is None:
        before = budget.left
        budget.start_file(len(text))
        fast = _parse_fast(source, budget)
        parser_reads["fast"] += 1
        if fast is not None:
            return fast, []
        budget.left = before  # read again below, spending as if the fast attempt had not happened
    budget.start_file(len(text))
    documents: list[_Document] = []
    problems: list[Problem] = []
    loader = _SpecLoader(text, limits.max_depth)
    parser_reads["checked"] += 1
    try:
        while loader.check_node():
            node = loader.get_node()
            if node is None:
                continue
            try:
                document = _Document(loader, node, source.path, budget)
                if document.data is not None:  # `---` followed by nothing (or only comments)
                    documents.append(document)
            except yaml.YAMLError as exc:  # bad tag, recursive alias: this document only
                problems.append(
                    _yaml_problem(
                        source, exc, "unsupported YAML", "specs must be plain data: no tags or recursive aliases"
                    )
                )
    except _TooCostly as exc:  # the rest of the file is not read
        problems.append(Problem(source.path, exc.line, "document", exc.message))
    except yaml.YAMLError as exc:
        problems.append(
            _yaml_problem(source, exc, "malformed YAML", "fix the syntax here (indentation, quotes, brackets)")
        )
    finally:
        loader.dispose()
    return documents, problems


def _parse_fast(source: SourceFile, budget: _Budget) -> list[_Document] | None:
    """The documents of a file libyaml reads as plain data within the limits, or None: then the
    pure-Python loader reads it again, for its bounds and its messages (syntax errors with their
    lines, tags, aliases, depth, budget). A file it reads gives the same nodes, so the same documents,
    lines and per-document problems (duplicate keys, unreadable scalars); tests/reconciler/
    test_loader_fast.py compares both paths field by field."""
    documents: list[_Document] = []
    loader = _FastSpecLoader(source.text, budget.limits.max_depth)
    try:
        while loader.check_node():
            node = loader.get_node()
            if node is None:
                continue
            document = _Document(loader, node, source.path, budget)
            if document.data is not None:
                documents.append(document)
    except (yaml.YAMLError, _TooCostly, RecursionError):
        return None
    finally:
        loader.dispose()
    return documents


def _yaml_problem(source: SourceFile, exc: yaml.YAMLError, what: str, advice: str) -> Problem:
    problem_mark = getattr(exc, "problem_mark", None)
    context_mark = getattr(exc, "context_mark", None)
    mark = problem_mark or context_mark
    # At end of input the mark is one past the last line; point at a line the file has.
    last_line = max(1, len(source.text.splitlines()))
    line = min(mark.line + 1, last_line) if mark is not None else 1
    context, problem = getattr(exc, "context", None), getattr(exc, "problem", None)
    reason = ": ".join(str(part) for part in (context, problem) if part) or str(exc)
    if context_mark is not None and context_mark.line + 1 != line:
        reason += f" (started at line {context_mark.line + 1})"
    return Problem(source.path, line, "document", f"{what}: {reason}; {advice}")


# --- model validation ----------------------------------------------------------------------


def _unwrap(annotation: Any) -> Any:
    """`X | None` -> X, so optional sub-models can be followed."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return annotation


def _field_info(model: Any, name: Any) -> Any:
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        return None
    for attr, info in model.model_fields.items():
        if name in (info.alias, attr):
            return info
    return None


def _type_at(model: type[BaseModel], loc: DocPath) -> Any:
    """The annotation at loc inside model (through fields, lists, dicts), or None."""
    current: Any = model
    for part in loc:
        current = _unwrap(current)
        origin = typing.get_origin(current)
        if origin is list:
            current = typing.get_args(current)[0]
        elif origin is dict:
            current = typing.get_args(current)[1]
        else:
            info = _field_info(current, part)
            if info is None:
                return None
            current = info.annotation
    return _unwrap(current)


def _pattern_of(model: type[BaseModel], loc: DocPath) -> str | None:
    if not loc:
        return None
    info = _field_info(_type_at(model, loc[:-1]), loc[-1])
    for meta in getattr(info, "metadata", []):
        if getattr(meta, "pattern", None):
            return str(meta.pattern)
    return None


def _short(value: Any) -> str:
    # repr shows quotes around strings; str keeps dates and numbers as YAML wrote them.
    text = repr(value) if isinstance(value, str) else str(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _validation_problem(doc: _Document, model: type[BaseModel], error: Any) -> Problem:
    # Walk the loc through the data: keeps real keys/indices, drops pydantic tags like '[key]'.
    loc: DocPath = ()
    data: Any = doc.data
    is_key = False
    raw = tuple(error["loc"])
    for i, part in enumerate(raw):
        if isinstance(data, dict) and part in data:
            data = data[part]
        elif isinstance(data, list) and isinstance(part, int) and 0 <= part < len(data):
            data = data[part]
        elif part == "[key]":
            is_key = True
            continue
        elif i == len(raw) - 1:
            data = None  # a missing field: keep its name in the path
        else:
            continue
        loc += (part,)

    kind = error["type"]
    value = error.get("input")
    if kind == "extra_forbidden":
        parent = _type_at(model, loc[:-1])
        is_model = isinstance(parent, type) and issubclass(parent, BaseModel)
        allowed = sorted(info.alias or name for name, info in parent.model_fields.items()) if is_model else []
        guess = difflib.get_close_matches(str(loc[-1]), allowed, n=1)
        hint = f"did you mean '{guess[0]}'? " if guess else ""
        listing = f" (allowed: {', '.join(allowed)})" if allowed else ""
        message = f"unknown field; {hint}remove it or check its spelling{listing}"
    elif kind == "missing":
        message = "required field is missing; add it"
    elif kind in EXPECTED_TYPES:
        written = None if is_key else doc.scalars.get(loc)
        got = "an empty value (null)" if value is None else f"{type(value).__name__} {_short(value)}"
        message = f"expected {EXPECTED_TYPES[kind]}, got {got}"
        if kind == "string_type" and value is not None and not isinstance(value, (dict, list)):
            # YAML read `1.2`, `on` or `2024-01-01` as a non-string; quoting keeps it text.
            text = str(value) if written is None else written
            if written is not None:
                read_as = {"bool": "true/false", "int": "a number", "float": "a number", "date": "a date"}
                as_what = read_as.get(type(value).__name__, f"a {type(value).__name__}")
                message = f"expected a string, but YAML reads {written} as {as_what}"
            message += f'; quote it, e.g. "{text}"'
            pattern = _pattern_of(model, loc)
            if pattern and not re.match(pattern, text):
                message += f" (it must be {PATTERN_HINTS.get(pattern, f'matching {pattern}')})"
    elif kind == "string_pattern_mismatch":
        pattern = str(error.get("ctx", {}).get("pattern", ""))
        message = f"{_short(value)} is not valid; it must be {PATTERN_HINTS.get(pattern, f'matching {pattern}')}"
    elif kind == "value_error":
        message = error["msg"].removeprefix("Value error, ")
    else:
        message = f"{error['msg']} (got {_short(value)})" if not isinstance(value, (dict, list)) else error["msg"]
    if is_key:
        message = f"the key itself: {message}"
    return Problem(doc.file, doc.line(loc), _render(loc), message)


def _validate(doc: _Document) -> tuple[BaseModel | None, list[Problem]]:
    """Pick the model from apiVersion/kind and validate; problems instead of exceptions."""
    data = doc.data
    if not isinstance(data, dict):
        return None, [
            Problem(
                doc.file,
                doc.start,
                "document",
                f"expected a mapping with apiVersion and kind, got {type(data).__name__}; known kinds: {KNOWN_KINDS}",
            )
        ]
    api_version, kind = data.get("apiVersion"), data.get("kind")
    known_apis = {api for api, _ in KIND_MODELS}
    for name, value in (("apiVersion", api_version), ("kind", kind)):
        if value is None:
            return None, [
                Problem(
                    doc.file,
                    doc.start,
                    name,
                    f"{name} is missing; every document needs apiVersion and kind, known kinds: {KNOWN_KINDS}",
                )
            ]
    if not isinstance(api_version, str) or api_version not in known_apis:
        return None, [
            Problem(
                doc.file,
                doc.line(("apiVersion",)),
                "apiVersion",
                f"unknown apiVersion {_short(api_version)}; known kinds: {KNOWN_KINDS}",
            )
        ]
    model = KIND_MODELS.get((api_version, kind)) if isinstance(kind, str) else None
    if model is None:
        return None, [
            Problem(
                doc.file,
                doc.line(("kind",)),
                "kind",
                f"unknown kind {_short(kind)} for apiVersion {api_version}; known kinds: {KNOWN_KINDS}",
            )
        ]
    try:
        return model.model_validate(data), []
    except ValidationError as exc:
        return None, [_validation_problem(doc, model, error) for error in exc.errors()]


# --- cross-document checks -----------------------------------------------------------------


def _step_problems(doc: _Document, recipe: Workflow) -> list[Problem]:
    problems: list[Problem] = []
    index_of: dict[str, int] = {}
    for i, step in enumerate(recipe.steps):
        if step.id in index_of:
            problems.append(
                Problem(
                    doc.file,
                    doc.line(("steps", i, "id")),
                    f"steps[{i}].id",
                    f"duplicate step id '{step.id}'; first used by steps[{index_of[step.id]}], rename one",
                )
            )
        else:
            index_of[step.id] = i
    known = ", ".join(index_of)
    for i, step in enumerate(recipe.steps):
        unknown = [dep for dep in step.deps if dep not in index_of]
        if unknown:
            problems.append(
                Problem(
                    doc.file,
                    doc.line(("steps", i, "deps")),
                    f"steps[{i}].deps",
                    f"step '{step.id}' depends on unknown step(s) {', '.join(map(repr, unknown))}; known steps: {known}",
                )
            )
    problems += _cycle_problems(doc, recipe, index_of)
    if recipe.output is not None and recipe.output not in index_of:
        problems.append(
            Problem(
                doc.file,
                doc.line(("output",)),
                "output",
                f"output names unknown step '{recipe.output}'; use one of: {known}",
            )
        )
    return problems


def _cycle_problems(doc: _Document, recipe: Workflow, index_of: dict[str, int]) -> list[Problem]:
    """One problem per dependency cycle, on the first step (in file order) that is part of it."""
    deps = {step.id: [d for d in step.deps if d in index_of] for step in recipe.steps}
    state: dict[str, int] = {}  # 1 = on the DFS stack, 2 = finished
    cycles: list[list[str]] = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        stack.append(node)
        for dep in deps[node]:
            if state.get(dep) == 1:
                cycles.append(stack[stack.index(dep) :] + [dep])
            elif dep not in state:
                visit(dep, stack)
        stack.pop()
        state[node] = 2

    for step in recipe.steps:
        if step.id not in state:
            visit(step.id, [])
    problems = []
    for cycle in cycles:
        # Start the cycle at the step declared first, and walk it in dependency direction.
        first = min(cycle[:-1], key=index_of.__getitem__)
        at = cycle.index(first)
        ordered = cycle[at:-1] + cycle[:at] + [first]
        i = index_of[first]
        problems.append(
            Problem(
                doc.file,
                doc.line(("steps", i, "deps")),
                f"steps[{i}].deps",
                f"dependency cycle: {' -> '.join(ordered)}; remove one of these dependencies",
            )
        )
    return problems


def _autoscaling_problems(doc: _Document, run: Deployable) -> list[Problem]:
    """autoscaling needs room to scale (replicas.max above min); a ModelDeployment scales on in-flight
    requests only (model servers report no invocation rate)."""
    scaling, replicas = run.spec.autoscaling, run.spec.replicas
    if scaling is None:
        return []
    if replicas.max is None or replicas.max <= replicas.min:
        return [Problem(doc.file, doc.line(("spec", "replicas", "max") if ("spec", "replicas") in doc.lines
                                             else ("spec", "autoscaling")), "spec.replicas.max",
                        f"autoscaling needs replicas.max above replicas.min ({replicas.min}), e.g. replicas: "
                        f"{{min: {replicas.min}, max: {max(replicas.min, 1) + 2}}}; or remove spec.autoscaling")]
    if isinstance(run, ModelDeployment) and scaling.target_in_flight is None:
        return [Problem(doc.file, doc.line(("spec", "autoscaling")), "spec.autoscaling.targetInFlight",
                        "a ModelDeployment scales on in-flight requests (running plus waiting): give "
                        "autoscaling.targetInFlight (e.g. 2); targetInvocationsPerSecond is for WorkflowRuns on Kubernetes")]
    if run.spec.backend.pooled:
        # Placement spreads replicas.min over the pool; an autoscaler changing the count under it would be
        # placed back (no shared count yet), so the two are not combined rather than fight.
        return [Problem(doc.file, doc.line(("spec", "autoscaling")), "spec.autoscaling",
                        "autoscaling is not available on a pool of backends (backend: refs or selector) yet: "
                        "name one backend (backend: {cluster: NAME}) or set a fixed replicas.min and remove "
                        "spec.autoscaling")]
    return []


def _backend_problems(doc: _Document, run: Deployable, backends: dict[str, PlntBackend]) -> list[Problem]:
    placement = run.spec.backend
    if placement.pooled:
        return _pool_problems(doc, run, backends)
    assert placement.cluster is not None
    backend = backends.get(placement.cluster)
    if backend is None:
        known = ", ".join(sorted(backends)) or "none declared"
        return [
            Problem(
                doc.file,
                doc.line(("spec", "backend", "cluster")),
                "spec.backend.cluster",
                f"unknown backend '{placement.cluster}'; declare a PlntBackend named "
                f"'{placement.cluster}' or use one of: {known}",
            )
        ]
    why = _unfit(run, backend)
    return [Problem(doc.file, doc.line(why[0]), _render(why[0]), why[1])] if why is not None else []


def _unfit(run: Deployable, backend: PlntBackend) -> tuple[DocPath, str] | None:
    """Why `run` cannot run on `backend` at all (the field to fix, and the message), or None."""
    placement = run.spec.backend
    if run.spec.replicas.min == 0 and backend.spec.type != "local":
        return (("spec", "replicas", "min"),
                f"replicas.min: 0 (scale to zero) needs a type: local backend; backend '{backend.metadata.name}' is "
                f"type: {backend.spec.type} (use min: 1 or more there)")
    if isinstance(run, ModelDeployment) and backend.spec.type == "local" \
            and run.spec.runtime.type not in LOCAL_MODEL_RUNTIMES:
        return (("spec", "runtime", "type"),
                f"runtime {run.spec.runtime.type} runs on Kubernetes backends (GPU servers); backend "
                f"'{backend.metadata.name}' is type: local, which runs {', '.join(LOCAL_MODEL_RUNTIMES)} on its CPU "
                "(use runtime type llama.cpp with a GGUF model, or a kubernetes backend)")
    scaling = run.spec.autoscaling
    # (a ModelDeployment without targetInFlight is refused whatever its backend: _autoscaling_problems)
    if isinstance(run, WorkflowRun) and scaling is not None and scaling.target_in_flight is None \
            and backend.spec.type == "local":
        return (("spec", "autoscaling", "targetInFlight"),
                f"backend '{backend.metadata.name}' is type: local, where plnt scales on in-flight requests: give "
                "autoscaling.targetInFlight (e.g. 4); targetInvocationsPerSecond is for Kubernetes backends' HPA")
    offered = backend.spec.gpu_classes
    if placement.gpu_class is not None and placement.gpu_class not in offered:
        what = f"offers: {', '.join(offered)}" if offered else "offers no GPU classes"
        return (("spec", "backend", "gpuClass"),
                f"backend '{backend.metadata.name}' has no GPU class '{placement.gpu_class}'; it {what} "
                "(add it to the backend's spec.gpuClasses or pick another backend)")
    return None


def _pool_problems(doc: _Document, run: Deployable, backends: dict[str, PlntBackend]) -> list[Problem]:
    """A pool (refs or selector) names backends that exist, and at least one of them can run `run`
    (placement uses only those; a member that cannot is reported when none can, with each reason)."""
    placement = run.spec.backend
    known = ", ".join(sorted(backends)) or "none declared"
    if placement.refs is not None:
        problems = []
        for i, name in enumerate(placement.refs):
            if name not in backends:
                path = ("spec", "backend", "refs", i)
                problems.append(Problem(doc.file, doc.line(path), _render(path),
                                        f"unknown backend '{name}'; declare a PlntBackend named '{name}' or use one "
                                        f"of: {known}"))
        if problems:
            return problems
    members = placement.members(backends)
    if not members:
        path = ("spec", "backend", "selector", "matchLabels")
        labelled = "; ".join(f"{name} {_labels(backend.metadata.labels)}" for name, backend in sorted(backends.items()))
        return [Problem(doc.file, doc.line(path), _render(path),
                        f"selects no PlntBackend (backends and their labels: {labelled or 'none declared'}); label a "
                        "backend with these labels (metadata.labels) or change the selector")]
    unfit = [(name, why) for name in members if (why := _unfit(run, backends[name])) is not None]
    if run.spec.replicas.min == 0 and unfit and unfit[0][1][0] == ("spec", "replicas", "min"):
        path, message = unfit[0][1]  # scale to zero: every member must be local, or the replica could not park
        return [Problem(doc.file, doc.line(path), _render(path), message.replace("needs a type: local backend",
                                                                                  "needs every backend of the pool local"))]
    if len(unfit) == len(members):
        path = unfit[0][1][0]
        reasons = "; ".join(why for _, (_, why) in unfit)
        return [Problem(doc.file, doc.line(path), _render(path),
                        f"no backend of the pool ({placement.describe()}) can run it: {reasons}")]
    return []


def _labels(labels: dict[str, str]) -> str:
    return "{" + ", ".join(f"{key}: {value}" for key, value in sorted(labels.items())) + "}"


# --- loading -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ParsedFile:
    """What one file gives before the cross-document checks: its own problems (in the order the
    loader reports them), each document with its model (None when invalid) and that document's own
    problems, and the nodes it spent of max_nodes (replayed when the result comes from a cache)."""

    problems: tuple[Problem, ...]
    documents: tuple[tuple[_Document, BaseModel | None, tuple[Problem, ...]], ...]
    nodes: int


def _parse_file(source: SourceFile, budget: _Budget) -> ParsedFile:
    before = budget.left
    documents, parse_problems = _parse(source, budget)
    parsed = []
    for doc in documents:
        model, model_problems = _validate(doc)
        parsed.append((doc, model, (*doc.problems, *model_problems)))
        doc.release()
    return ParsedFile(tuple(parse_problems), tuple(parsed), before - budget.left)


class ParseCache(typing.Protocol):
    """Parsed files by (spec limits, path, git blob id); see plnt.reconciler.source.parse_cache."""

    def has(self, path: str, blob: str, limits: SpecLimits) -> bool: ...

    def get(self, source: SourceFile, limits: SpecLimits, nodes_left: int) -> ParsedFile | None: ...

    def put(self, source: SourceFile, limits: SpecLimits, parsed: ParsedFile) -> None: ...



def load_sources(files: Iterable[SourceFile], *, check_references: bool | None = True,
                 limits: SpecLimits = DEFAULT_LIMITS, cache: ParseCache | None = None) -> tuple[SpecSet, list[Problem]]:
    """Parse, validate and cross-check all files; never raises for bad input, and bounded by limits.

    check_references=None checks WorkflowRuns' backend references only if the files declare any
    PlntBackend: validating one WorkflowRun file alone should not claim its backend is unknown.
    `cache` (plnt.reconciler.source.parse_cache): each file's parse and model validation, reused for a file
    whose path and git blob id were seen before; the cross-document checks always run on the whole set.
    """
    specs = SpecSet()
    problems: list[Problem] = []
    docs: dict[str, _Document] = {}  # location key -> its document, for cross-document lines
    runs: list[tuple[_Document, Deployable]] = []
    budget = _Budget(limits)

    for source in files:
        parsed = cache.get(source, limits, budget.left) if cache is not None else None
        if parsed is None:
            if source.unread is not None:
                source = source.unread()
            parsed = _parse_file(source, budget)
            if cache is not None and budget.left >= 0:  # a file cut short by max_nodes depends on the others
                cache.put(source, limits, parsed)
        else:
            budget.left -= parsed.nodes  # what parsing it again would spend: max_nodes holds as without a cache
        problems += parsed.problems
        for doc, model, doc_problems in parsed.documents:
            problems += doc_problems
            if model is None:
                continue
            if isinstance(model, WorkflowRun):
                key, label = model.key, "WorkflowRun"
            elif isinstance(model, ModelDeployment):
                key, label = model.key, "ModelDeployment"
            elif isinstance(model, PlntBackend):
                key, label = model.metadata.name, "PlntBackend"
            elif isinstance(model, RecipeTrustPolicy):
                key, label = model.metadata.name, "RecipeTrustPolicy"
            elif isinstance(model, Gate):
                key, label = model.key, "Gate"
            elif isinstance(model, GatewayPolicy):
                key, label = model.metadata.name, "GatewayPolicy"
            else:
                assert isinstance(model, Workflow)
                key, label = f"{model.metadata.name}@{model.metadata.version}", "Workflow"
            where = f"{label}/{key}"
            # WorkflowRuns and ModelDeployments share a namespace's names: one saga, status row and
            # gateway name each.
            other = f"{'ModelDeployment' if label == 'WorkflowRun' else 'WorkflowRun'}/{key}"
            taken_by = where if where in docs else other if label in DEPLOYABLE_KINDS and other in docs else None
            if taken_by is not None:
                first = docs[taken_by]
                name_path = ("metadata", "name")
                earlier = f"{first.file}:{first.line(name_path)}"
                message = (f"duplicate {label} {key}; first declared at {earlier}; rename or remove one of them"
                           if taken_by == where else
                           f"{label} {key} has the name of the {taken_by.split('/')[0]} declared at {earlier}; "
                           "WorkflowRuns and ModelDeployments share a namespace's names (one rollout, one status and "
                           "one gateway name each): rename one")
                problems.append(Problem(doc.file, doc.line(name_path), "metadata.name", message))
                continue
            docs[where] = doc
            specs.locations[where] = (doc.file, doc.start)
            if isinstance(model, WorkflowRun):
                specs.workflow_runs[key] = model
                runs.append((doc, model))
                problems += _autoscaling_problems(doc, model)
            elif isinstance(model, ModelDeployment):
                specs.model_deployments[key] = model
                runs.append((doc, model))
                problems += _autoscaling_problems(doc, model)
            elif isinstance(model, PlntBackend):
                specs.backends[key] = model
            elif isinstance(model, Gate):
                specs.gates[key] = model
            elif isinstance(model, GatewayPolicy):
                problems += _policy_problems(doc, model, docs, specs)
            elif isinstance(model, RecipeTrustPolicy):
                # Overlapping policies are allowed on purpose (any-of), so no cross-check here.
                specs.trust_policies[key] = model
                specs.warnings += _signer_warnings(doc, model)
            else:
                specs.recipes[key] = model
                problems += _step_problems(doc, model)

    # Backends may be declared in any file, so references are checked once all are loaded.
    if check_references or (check_references is None and specs.backends):
        for doc, run in runs:
            problems += _backend_problems(doc, run, specs.backends)
    if check_references or (check_references is None and specs.model_deployments):
        for doc, run in runs:
            bound = run.spec.model if isinstance(run, WorkflowRun) else None
            if bound is not None and run_key(run.metadata.namespace, bound) not in specs.model_deployments:
                known = ", ".join(sorted(k for k in specs.model_deployments
                                         if k.startswith(f"{run.metadata.namespace}/"))) or "none in this namespace"
                problems.append(Problem(doc.file, doc.line(("spec", "model")), "spec.model",
                                        f"no ModelDeployment named '{bound}' in namespace {run.metadata.namespace} "
                                        f"(known: {known}); declare it or remove spec.model"))
    if any(isinstance(run, ModelDeployment) and run.spec.fallback for _, run in runs):
        problems += _fallback_problems(runs, specs.model_deployments)
    if check_references or (check_references is None and specs.trust_policies):
        for doc, run in runs:
            named = run.spec.model.trust_policy if isinstance(run, ModelDeployment) else None
            if named is not None and named not in specs.trust_policies:
                known = ", ".join(sorted(specs.trust_policies)) or "none declared"
                problems.append(Problem(doc.file, doc.line(("spec", "model", "trustPolicy")), "spec.model.trustPolicy",
                                        f"unknown RecipeTrustPolicy '{named}'; declare it or use one of: {known}"))

    if check_references or (check_references is None and specs.gates):
        for doc, run in runs:
            problems += _gate_problems(doc, run, specs.gates, specs.model_deployments)
    if specs.gateway_policy is not None and (check_references or (check_references is None and runs)):
        specs.warnings += _price_warnings(docs[f"GatewayPolicy/{specs.gateway_policy.metadata.name}"],
                                          specs.gateway_policy, specs.deployables())
    if any(run.spec.depends_on for _, run in runs):
        problems += _dependency_problems(runs, specs.deployables())

    problems.sort(key=lambda p: (p.file, p.line))
    specs.warnings.sort(key=lambda p: (p.file, p.line))
    return specs, problems


def _fallback_problems(runs: list[tuple[_Document, Deployable]], models: dict[str, ModelDeployment]) -> list[Problem]:
    """spec.fallback names another ModelDeployment of the same namespace, and no chain of fallbacks comes back
    to where it started (the gateway follows one hop; a cycle says the repository means something else)."""
    problems = []
    path = ("spec", "fallback")
    for doc, run in runs:
        if not isinstance(run, ModelDeployment) or run.spec.fallback is None:
            continue
        namespace, name, fallback = run.metadata.namespace, run.metadata.name, run.spec.fallback
        if fallback == name:
            problems.append(Problem(doc.file, doc.line(path), _render(path),
                                    f"{name} names itself as its fallback; name another ModelDeployment or remove "
                                    "spec.fallback"))
            continue
        if run_key(namespace, fallback) not in models:
            known = ", ".join(sorted(k.split("/", 1)[1] for k in models if k.startswith(f"{namespace}/")
                                     and k != run.key)) or "none"
            problems.append(Problem(doc.file, doc.line(path), _render(path),
                                    f"no ModelDeployment named '{fallback}' in namespace {namespace} (known: {known}); "
                                    "declare it or remove spec.fallback"))
            continue
        chain, at = [name], fallback
        while at not in chain:
            chain.append(at)
            nxt = models.get(run_key(namespace, at))
            if nxt is None or nxt.spec.fallback is None:
                break
            at = nxt.spec.fallback
        else:
            if at == name:
                problems.append(Problem(doc.file, doc.line(path), _render(path),
                                        f"fallback cycle: {' -> '.join([*chain, name])}; remove one of these "
                                        "fallbacks"))
    return problems


def _dependency_problems(runs: list[tuple[_Document, Deployable]], deployables: dict[str, Deployable]) -> list[Problem]:
    """dependsOn names WorkflowRuns or ModelDeployments of the same namespace, never itself, and no
    chain of them comes back to where it started (the sagas would wait on each other for ever)."""
    problems = []
    for doc, run in runs:
        namespace = run.metadata.namespace
        for i, name in enumerate(run.spec.depends_on):
            path = ("spec", "dependsOn", i)
            if name == run.metadata.name:
                problems.append(Problem(doc.file, doc.line(path), _render(path),
                                        f"{run.metadata.name} depends on itself; remove it from dependsOn"))
            elif run_key(namespace, name) not in deployables:
                known = ", ".join(sorted(k.split("/", 1)[1] for k in deployables if k.startswith(f"{namespace}/")
                                         and k != run.key)) or "none"
                problems.append(Problem(doc.file, doc.line(path), _render(path),
                                        f"no WorkflowRun or ModelDeployment named '{name}' in namespace {namespace} "
                                        f"(known: {known}); declare it or remove it from dependsOn"))
    for doc, run in runs:
        cycle = _cycle_from(run.key, deployables)
        if cycle is not None and cycle[0] == run.key:
            path = ("spec", "dependsOn")
            problems.append(Problem(doc.file, doc.line(path), _render(path),
                                    f"dependency cycle: {' -> '.join(k.split('/', 1)[1] for k in cycle)}; remove one "
                                    "of these dependencies"))
    return problems


def _cycle_from(start: str, deployables: dict[str, Deployable]) -> list[str] | None:
    """A dependency path from `start` back to it, or None."""
    namespace = start.split("/", 1)[0]
    stack: list[tuple[str, list[str]]] = [(start, [start])]
    seen: set[str] = set()
    while stack:
        key, path = stack.pop()
        run = deployables.get(key)
        for name in run.spec.depends_on if run is not None else ():
            after = run_key(namespace, name)
            if after == start and len(path) > 1:
                return [*path, start]
            if after != key and after not in seen and after in deployables:
                seen.add(after)
                stack.append((after, [*path, after]))
    return None


def _is_model(namespace: str, name: str, models: dict[str, ModelDeployment]) -> bool:
    return run_key(namespace, name) in models


def _gate_problems(doc: _Document, run: Deployable, gates: dict[str, Gate],
                   models: dict[str, ModelDeployment]) -> list[Problem]:
    """Every Gate a canary names must be declared in its namespace (and a quality gate on a
    ModelDeployment needs its canary.golden cases)."""
    namespace = run.metadata.namespace
    canary = run.spec.canary
    named = [(("spec", "canary", "gates", i), name) for i, name in enumerate(canary.gates)]
    named += [(("spec", "canary", "steps", s, "gates", i), name)
              for s, step in enumerate(canary.steps) for i, name in enumerate(step.gates)]
    problems = []
    for path, name in named:
        gate = gates.get(run_key(namespace, name))
        if gate is None:
            known = ", ".join(sorted(k.split("/", 1)[1] for k in gates if k.startswith(f"{namespace}/"))) \
                or "none in this namespace"
            problems.append(Problem(doc.file, doc.line(path), _render(path),
                                    f"no Gate named '{name}' in namespace {namespace} (known: {known}); declare it "
                                    "(kind: Gate) or remove the name"))
        elif gate.spec.quality is not None and gate.spec.quality.judge is not None \
                and (judge := gate.spec.quality.judge.model) is not None and not _is_model(namespace, judge, models):
            problems.append(Problem(doc.file, doc.line(path), _render(path),
                                    f"Gate '{name}' is judged by '{judge}', which is no ModelDeployment of namespace "
                                    f"{namespace}; declare it, or fix spec.quality.judge.model"))
        elif isinstance(run, ModelDeployment) and gate.spec.quality is not None and not canary.golden:  # type: ignore[union-attr]
            problems.append(Problem(doc.file, doc.line(path), _render(path),
                                    f"Gate '{name}' is a quality gate, which checks a model's golden cases: give "
                                    "spec.canary.golden (prompts with checks), or use another kind of gate"))
    return problems


def _policy_problems(doc: _Document, policy: GatewayPolicy, docs: dict[str, _Document], specs: SpecSet) -> list[Problem]:
    """A GatewayPolicy's own checks: the only one of its repository, each token and price named once."""
    problems = []
    if specs.gateway_policy is not None:
        first = docs[f"GatewayPolicy/{specs.gateway_policy.metadata.name}"]
        name_path = ("metadata", "name")
        problems.append(Problem(doc.file, doc.line(name_path), "metadata.name",
                                f"a second GatewayPolicy; the first is declared at {first.file}:{first.line(name_path)}; "
                                "the gateway enforces one policy: merge them into one"))
        return problems
    problems += _listed_twice(doc, [entry.name for entry in policy.spec.tokens], ("spec", "tokens"), "name",
                              "token {!r} is listed twice (first as spec.tokens[{}]); give each token name one entry")
    problems += _listed_twice(doc, [price.model for price in policy.spec.prices], ("spec", "prices"), "model",
                              "model {!r} is priced twice (first as spec.prices[{}]); give each model one price")
    if not problems:
        specs.gateway_policy = policy
    return problems


def _listed_twice(doc: _Document, names: list[str], where: DocPath, field: str, message: str) -> list[Problem]:
    """A problem at each entry of a list whose `field` repeats an earlier entry's (`message`: name, first index)."""
    problems, first = [], {}
    for i, name in enumerate(names):
        path = (*where, i, field)
        if name in first:
            problems.append(Problem(doc.file, doc.line(path), _render(path), message.format(name, first[name])))
        first.setdefault(name, i)
    return problems


def _price_warnings(doc: _Document, policy: GatewayPolicy, deployables: dict[str, Deployable]) -> list[Problem]:
    """A price naming no WorkflowRun or ModelDeployment (a typo costs nothing: its calls count no cost)."""
    names = {key.split("/", 1)[1] for key in deployables} | set(deployables)
    warnings = []
    for i, price in enumerate(policy.spec.prices):
        if price.model not in names:
            path = ("spec", "prices", i, "model")
            warnings.append(Problem(doc.file, doc.line(path), _render(path),
                                    f"warning: no WorkflowRun or ModelDeployment named {price.model!r}; its calls "
                                    "would cost nothing: check the name (NAME or NAMESPACE/NAME)"))
    return warnings


def _signer_warnings(doc: _Document, policy: RecipeTrustPolicy) -> list[Problem]:
    warnings = []
    for i, signer in enumerate(policy.spec.signers):
        for message in signer.regex_warnings():
            path = ("spec", "signers", i, "identityRegex")
            warnings.append(Problem(doc.file, doc.line(path), _render(path), f"warning: {message}"))
    return warnings


def load_directory(root: Path) -> tuple[SpecSet, list[Problem]]:
    files, read_problems = read_tree(Path(root))
    specs, problems = load_sources(files)
    problems = sorted(read_problems + problems, key=lambda p: (p.file, p.line))
    return specs, problems


def load_recipe(path: Path) -> Workflow:
    """A recipe's workflow.yaml: exactly one valid Workflow document, or SpecError."""
    path = Path(path)
    display = str(path)
    specs, problems = load_sources([read_file_spec(path, display)])
    if not problems:
        other = [*specs.workflow_runs, *specs.model_deployments, *specs.backends, *specs.trust_policies]
        if other or len(specs.recipes) != 1:
            problems = [
                Problem(
                    display,
                    1,
                    "document",
                    f"a recipe file must hold exactly one {RECIPE_API_VERSION} Workflow document, "
                    f"found {len(specs.recipes)} Workflow and {len(other)} other",
                )
            ]
    if problems:
        raise SpecError(problems)
    return next(iter(specs.recipes.values()))
