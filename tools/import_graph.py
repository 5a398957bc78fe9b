"""The shape of plnt's code, counted from its imports: what the layering rules and the restructuring
notes quote. Reads the source as text (ast); runs nothing of plnt.

    python tools/import_graph.py            # the summary: big modules, edges between roles, circles
    python tools/import_graph.py --edges    # and every edge between packages, with one example each

Packages: plnt.reconciler's subpackages (reconciler.saga, reconciler.drivers, ...; a top-level module
such as reconciler.app counts as its own), plnt.gateway, plnt.runner, plnt.core (the shared contracts
the roles import). Edges between roles count imports from one role into another, not into core;
the composition roots (COMPOSITION_ROOTS: `plnt up` and each role's entry) are counted apart, as they
are where the roles are wired together. A circle is a set of modules
that import each other, directly or through others (a strongly connected component of more than one
module); imports under `if TYPE_CHECKING:` count too (they are read by type checkers and humans).
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ROLES = {"core": "plnt.core", "reconciler": "plnt.reconciler", "gateway": "plnt.gateway", "runner": "plnt.runner"}
# Where the roles are wired together: plnt up (app), the apart roles' entries (roles) and the CLI.
COMPOSITION_ROOTS = ("plnt.reconciler.app", "plnt.reconciler.roles", "plnt.reconciler.cli")


def is_composition_root(module: str) -> bool:
    return any(module == root or module.startswith(root + ".") for root in COMPOSITION_ROOTS)
BIG = 400  # lines


def module_name(path: Path, root: Path = ROOT) -> str:
    rel = path.relative_to(root)
    parts = list(rel.with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join([ROLES[parts[0]], *parts[1:]])


def modules(root: Path = ROOT) -> dict[str, Path]:
    found = {}
    for folder in ROLES:
        for path in sorted((root / folder).rglob("*.py")):
            if "__pycache__" not in path.parts:
                found[module_name(path, root)] = path
    return found


def imported(path: Path, name: str) -> Iterator[str]:
    """Every module (or module.attribute) the file names in an import."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            target = ".".join([*base, node.module] if node.module else base) if node.level else node.module or ""
            yield target
            yield from (f"{target}.{alias.name}" for alias in node.names)


def graph(root: Path = ROOT) -> dict[str, set[str]]:
    """module -> the plnt modules it imports."""
    known = modules(root)
    edges: dict[str, set[str]] = {}
    for name, path in known.items():
        edges[name] = {target for target in imported(path, name) if target in known and target != name}
    return edges


def package_of(module: str) -> str:
    """reconciler.saga, reconciler.app, gateway, runner."""
    parts = module.split(".")
    if parts[1] == "reconciler" and len(parts) > 2:
        return f"reconciler.{parts[2]}"
    return parts[1]


def role_of(module: str) -> str:
    return module.split(".")[1]


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]
    sys.setrecursionlimit(10_000)

    def visit(node: str) -> None:
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for nxt in edges.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return sorted(found)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--edges", action="store_true", help="list every edge between packages")
    parser.add_argument("--root", type=Path, default=ROOT, help="a checkout of plnt (default: this one)")
    args = parser.parse_args()
    root = args.root.resolve()
    known = modules(root)
    edges = graph(root)
    big = sorted(((len(path.read_text().splitlines()), name) for name, path in known.items()), reverse=True)
    big = [(lines, name) for lines, name in big if lines > BIG]
    print(f"modules: {len(known)}; over {BIG} lines: {len(big)}")
    for lines, name in big:
        print(f"  {lines:5d}  {name}")
    roles: dict[tuple[str, str], set[str]] = defaultdict(set)
    from_roots: set[str] = set()
    to_core = 0
    packages: dict[tuple[str, str], set[str]] = defaultdict(set)
    for source, targets in edges.items():
        for target in targets:
            if role_of(target) == "core" and role_of(source) != "core":
                to_core += 1
            elif role_of(source) != role_of(target):
                if is_composition_root(source):
                    from_roots.add(f"{source} -> {target}")
                else:
                    roles[(role_of(source), role_of(target))].add(f"{source} -> {target}")
            if package_of(source) != package_of(target):
                packages[(package_of(source), package_of(target))].add(f"{source} -> {target}")
    print(f"import edges between roles (module -> module; not from the composition roots, not into core): "
          f"{sum(len(v) for v in roles.values())}")
    for (a, b), why in sorted(roles.items()):
        print(f"  {a} -> {b}: {len(why)}")
        for edge in sorted(why):
            print(f"      {edge}")
    print(f"from the composition roots into other roles: {len(from_roots)}; from the roles into core: {to_core}")
    found = circles(edges)
    print(f"circles (modules importing each other): {len(found)}")
    for component in found:
        print(f"  {len(component)}: {', '.join(component)}")
    package_edges = {source: {target for (a, target) in packages if a == source} for (source, _) in packages}
    package_circles = circles(package_edges)
    print(f"circles between packages: {len(package_circles)}")
    for component in package_circles:
        print(f"  {', '.join(component)}")
    if args.edges:
        print("edges between packages:")
        for (a, b), why in sorted(packages.items()):
            print(f"  {a} -> {b}: {len(why)}, e.g. {sorted(why)[0]}")


if __name__ == "__main__":
    main()
