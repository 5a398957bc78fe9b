"""A recipe directory read as data: its `workflow.yaml`, its digest, its module checked without running
it, its golden cases. plnt checks recipes with this; only a runner imports their code
(plnt.runner.recipe).

A recipe directory (one `name/version/` entry of a registry) looks like::

    workflow.yaml        # microagents.dev/v1 Workflow
    steps.py             # runtime.entrypoint: optional functions named after step ids
    golden.yaml          # optional: cases: [{name, input: {...}, expect: {...}, checks: [...]}]
                         # (expect: a subset of the output; checks: core/expectations.py)
    knowledge/*.md       # optional: documents for rag.query

A registry entry is immutable and self-contained: the module is imported from its file under
a module name unique to this load, so two versions of a recipe never share a module (and
the recipe directory is not put on sys.path).
"""

from __future__ import annotations

import ast
import hashlib
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from plnt.core.specs.loader import SpecError, load_recipe
from plnt.core.specs.models import Workflow, output_step, step_levels
from pydantic import ValidationError

if TYPE_CHECKING:  # (imported where used: a runner loads this module and never checks a golden case)
    from plnt.core.expectations import Check

WORKFLOW_FILE = "workflow.yaml"
GOLDEN_FILE = "golden.yaml"

class RecipeError(Exception):
    """A recipe directory that cannot be served. `str()` names the file and the problem."""

    def __init__(self, path: Path, problem: str) -> None:
        # the reconciler's loader already says "<file>:<line>: <field>: <message>"
        super().__init__(problem if problem.startswith(f"{path}:") else f"{path}: {problem}")
        self.path = path
        self.problem = problem


@dataclass(frozen=True)
class GoldenCase:
    """One golden invocation: `expect` is a subset of the expected output (see `matches`), and
    `checks` what else it must satisfy (contains, regex, JSON Schema, a number's tolerance:
    core/expectations.py)."""

    name: str
    input: dict[str, Any]
    expect: Any
    checks: tuple[Check, ...] = ()

    def failures(self, output: Any) -> list[str]:
        """Why `output` fails this case's expectations (empty: it passes)."""
        from plnt.core.expectations import subset_failure

        found = [subset_failure(self.expect, output)] if self.expect is not None else []
        found += [check.failure(output) for check in self.checks]
        return [failure for failure in found if failure is not None]


class NamedRecipe:
    workflow: Workflow

    @property
    def name(self) -> str:
        return self.workflow.metadata.name

    @property
    def version(self) -> str:
        return self.workflow.metadata.version


# --- digest ----------------------------------------------------------------------------------


def directory_digest(directory: Path) -> str:
    """The canonical digest of a recipe directory, as `WorkflowRun.spec.workflow.integrityHash` pins it.

    Canonical form:

    1. Walk `directory` recursively (symlinked directories are not followed). Skip every
       directory named `__pycache__` and every file whose name ends in `.pyc`.
    2. For every remaining regular file, form the line
       ``<relative path> <sha256 hex of the file's bytes>\\n`` where the relative path is
       taken from `directory`, uses `/` as separator, and has no leading `./`.
    3. Sort the lines by relative path (Unicode code-point order, i.e. Python `sorted`),
       concatenate them, encode as UTF-8, and take its SHA-256.
    4. The digest is ``"sha256:" + <lowercase hex>``.

    Only file contents and relative paths count (not modes, times or empty directories).
    A symlink or other non-regular file is an error (ValueError): a pinned recipe must be
    self-contained.
    """
    root = Path(directory)
    if not root.is_dir():
        raise ValueError(f"{root} is not a directory")
    entries: list[tuple[str, str]] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        for name in filenames + [d for d in dirnames if (Path(dirpath) / d).is_symlink()]:
            if name.endswith(".pyc"):
                continue
            path = Path(dirpath) / name
            if path.is_symlink() or not path.is_file():
                raise ValueError(f"{path}: not a regular file (symlinks are not allowed in a recipe)")
            entries.append((path.relative_to(root).as_posix(), hashlib.sha256(path.read_bytes()).hexdigest()))
    canonical = "".join(f"{rel} {sha}\n" for rel, sha in sorted(entries))
    return "sha256:" + hashlib.sha256(canonical.encode("utf-8")).hexdigest()


# --- loading ---------------------------------------------------------------------------------


def _load_workflow(path: Path) -> Workflow:
    """Parse and validate `workflow.yaml` with the spec loader (problems at FILE:LINE)."""
    try:
        return load_recipe(path)
    except Exception as exc:
        problems = exc.problems if isinstance(exc, SpecError) else None
        raise RecipeError(path, "; ".join(map(str, problems)) if problems else str(exc)) from exc


MAX_CHECKED_MODULE_BYTES = 4 * 2**20  # larger modules are not parsed by plnt: the runner reports their errors


@dataclass(frozen=True)
class CheckedRecipe(NamedRecipe):
    """A recipe directory checked as data: its workflow, its module file (None if it has none), its digest."""

    workflow: Workflow
    directory: Path
    entry: Path | None
    digest: str


def check_recipe_dir(directory: Path, *, parse_module: bool = True) -> CheckedRecipe:
    """Check a recipe directory without running any of its code; raises RecipeError.

    plnt's own processes use this (they hold credentials and never import recipe code): the
    workflow.yaml through the reconciler's loader, the step graph, a self-contained directory (no
    links), an entrypoint that is a regular file inside it and, with `parse_module`, the module's
    syntax and a top-level definition for each `python` step, from its syntax tree only.
    """
    directory = Path(directory).resolve()
    workflow_path = directory / WORKFLOW_FILE
    if workflow_path.is_symlink() or not workflow_path.is_file():
        raise RecipeError(workflow_path, "not found (a recipe directory needs a workflow.yaml, a regular file)")
    workflow = _load_workflow(workflow_path)
    try:
        step_levels(workflow.steps)
    except ValueError as exc:
        raise RecipeError(workflow_path, str(exc)) from exc
    ids = [step.id for step in workflow.steps]
    if len(set(ids)) != len(ids):
        raise RecipeError(workflow_path, f"duplicate step ids in {ids}")
    if output_step(workflow) not in ids:
        raise RecipeError(workflow_path, f"output {workflow.output!r} is not a step id")
    try:
        digest = directory_digest(directory)
    except (OSError, ValueError) as exc:
        raise RecipeError(directory, str(exc)) from exc

    entry: Path | None = (directory / workflow.runtime.entrypoint).resolve()
    assert entry is not None
    if not entry.is_relative_to(directory):
        raise RecipeError(workflow_path, f"runtime.entrypoint {workflow.runtime.entrypoint!r} is outside the recipe")
    if entry.exists() and not entry.is_file():
        raise RecipeError(entry, "runtime.entrypoint is not a regular file")
    if not entry.is_file():
        if "entrypoint" in workflow.runtime.model_fields_set:
            raise RecipeError(entry, "runtime.entrypoint not found")
        entry = None
    python_steps = [step.id for step in workflow.steps if step.tool == "python"]
    if python_steps and entry is None:
        raise RecipeError(workflow_path, f"step {python_steps[0]} uses tool python but the recipe has no "
                                         f"{workflow.runtime.entrypoint} (missing)")
    if parse_module and entry is not None:
        _check_module_source(entry, python_steps, workflow_path)
    return CheckedRecipe(workflow=workflow, directory=directory, entry=entry, digest=digest)


# One ast.parse at a time in a process: CPython 3.11 keeps the AST constructor's recursion depth per
# interpreter, so parses in two threads (concurrent sagas pull recipes in threads) can fail with
# "SystemError: AST constructor recursion depth mismatch" (python/cpython#106905); seen with 1,000 sagas.
_AST_LOCK = threading.Lock()


def _check_module_source(entry: Path, python_steps: list[str], workflow_path: Path) -> None:
    """Syntax, and a top-level name per python step, from the syntax tree: nothing is executed."""
    if entry.stat().st_size > MAX_CHECKED_MODULE_BYTES:
        return  # not worth the memory here; the runner still refuses a broken module at its start
    source = entry.read_bytes()
    try:
        with _AST_LOCK:
            tree = ast.parse(source, filename=entry.name)
    except (SyntaxError, ValueError) as exc:  # ValueError: NUL bytes
        raise RecipeError(entry, f"not valid Python: {exc}") from exc
    except (RecursionError, MemoryError) as exc:
        raise RecipeError(entry, f"not valid Python: too deeply nested ({type(exc).__name__})") from exc
    defined: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            if any(alias.name == "*" for alias in node.names):
                return  # names only known when run: the runner checks them
            defined.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        else:  # assignments, and defs inside if/try at the top level
            defined.update(n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store))
            defined.update(n.name for n in ast.walk(node) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))
    for step_id in python_steps:
        if step_id not in defined:
            raise RecipeError(workflow_path, f"step {step_id} uses tool python but {entry.name} defines no "
                                             f"function {step_id}()")


# --- golden cases ----------------------------------------------------------------------------


MAX_GOLDEN_BYTES = 2**20


class _NoAliasLoader(yaml.SafeLoader):
    """Golden cases are sent as JSON: an alias would be expanded there (a few bytes, gigabytes sent)."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            mark = self.peek_event().start_mark
            raise yaml.YAMLError(f"line {mark.line + 1}: aliases (*name) are not allowed in {GOLDEN_FILE}")
        return super().compose_node(parent, index)


def load_golden(directory: Path) -> list[GoldenCase]:
    """Golden cases from the optional `golden.yaml`: `cases: [{name, input: {...}, expect: ...}]`.

    Read as data, bounded (plnt's smoke test reads it too): at most 1 MiB, no aliases.
    """
    path = Path(directory) / GOLDEN_FILE
    if not path.is_file():
        return []
    if path.stat().st_size > MAX_GOLDEN_BYTES:
        raise RecipeError(path, f"larger than {MAX_GOLDEN_BYTES} bytes")
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=_NoAliasLoader) or {}  # noqa: S506 - a SafeLoader
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise RecipeError(path, f"invalid YAML: {exc}") from exc
    except RecursionError as exc:
        raise RecipeError(path, "invalid YAML: nested too deeply") from exc
    cases = data.get("cases") if isinstance(data, dict) else None
    if not isinstance(cases, list):
        raise RecipeError(path, "expected a mapping with a list `cases`")
    out: list[GoldenCase] = []
    for index, case in enumerate(cases):
        if not (isinstance(case, dict) and isinstance(case.get("input"), dict) and ("expect" in case or "checks" in case)):
            raise RecipeError(path, f"cases[{index}]: needs `input` (a mapping) and `expect` or `checks`")
        raw_checks = case.get("checks") or []
        if not isinstance(raw_checks, list):
            raise RecipeError(path, f"cases[{index}].checks: expected a list of checks")
        from plnt.core.expectations import Check

        checks = []
        for at, raw in enumerate(raw_checks):
            try:
                checks.append(Check.model_validate(raw))
            except ValidationError as exc:
                problem = exc.errors()[0]
                where = ".".join(str(part) for part in problem["loc"])
                raise RecipeError(path, f"cases[{index}].checks[{at}]{'.' + where if where else ''}: "
                                        f"{problem['msg'].removeprefix('Value error, ')}") from None
        out.append(GoldenCase(name=str(case.get("name", f"case-{index}")), input=case["input"],
                              expect=case.get("expect"), checks=tuple(checks)))
    return out


def matches(expect: Any, actual: Any) -> bool:
    """Subset match: every key of an expected mapping must match in `actual` (recursively);
    anything else (lists, strings, numbers) must be equal."""
    if isinstance(expect, dict):
        return isinstance(actual, dict) and all(k in actual and matches(v, actual[k]) for k, v in expect.items())
    return bool(expect == actual)
