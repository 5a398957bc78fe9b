"""Loading a recipe to run it: only a runner process imports a recipe's module (recipe code is
untrusted even when signed). The recipe's format, read as data, is plnt.core.recipe.

A registry entry is immutable and self-contained: the module is imported from its file under
a module name unique to this load, so two versions of a recipe never share a module (and
the recipe directory is not put on sys.path).
"""

from __future__ import annotations

import importlib.util
import itertools
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from plnt.core.recipe import WORKFLOW_FILE, NamedRecipe, RecipeError, check_recipe_dir
from plnt.core.specs.models import Workflow

_load_counter = itertools.count(1)


@dataclass
class Recipe(NamedRecipe):
    workflow: Workflow
    directory: Path
    module: ModuleType | None
    digest: str = ""


def _import_module(path: Path, workflow: Workflow, digest: str) -> ModuleType:
    """Import `path` under a module name unique to this load (never shared between versions)."""
    slug = re.sub(r"[^0-9A-Za-z_]", "_", f"{workflow.metadata.name}_{workflow.metadata.version}")
    module_name = f"plnt_recipe_{slug}_{digest.removeprefix('sha256:')[:12]}_{next(_load_counter)}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise RecipeError(path, "cannot import as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses, pickling and typing look modules up here
    dont_write_bytecode, sys.dont_write_bytecode = sys.dont_write_bytecode, True  # leave the registry entry as it is
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[module_name]
        raise RecipeError(path, f"import failed: {type(exc).__name__}: {exc}") from exc
    finally:
        sys.dont_write_bytecode = dont_write_bytecode
    return module


def load_recipe_dir(directory: Path) -> Recipe:
    """Load a recipe directory, importing its module: only a runner process does this (it runs the
    recipe's code). Raises RecipeError naming the file and the problem."""
    checked = check_recipe_dir(directory, parse_module=False)
    workflow, entry = checked.workflow, checked.entry
    module = _import_module(entry, workflow, checked.digest) if entry is not None else None
    for step in workflow.steps:
        if step.tool == "python" and not callable(getattr(module, step.id, None)):
            name = entry.name if entry is not None else workflow.runtime.entrypoint
            raise RecipeError(checked.directory / WORKFLOW_FILE,
                              f"step {step.id} uses tool python but {name} defines no function {step.id}()")
    return Recipe(workflow=workflow, directory=checked.directory, module=module, digest=checked.digest)
