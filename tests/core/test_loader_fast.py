"""The loader's libyaml fast path gives exactly what the pure-Python loader gives.

`loader._parse` reads a file with libyaml (yaml.CSafeLoader) and falls back to the pure-Python
_SpecLoader for any file libyaml cannot read as plain data within the limits. Each test here loads
the same files both ways (the slow way by switching libyaml off, as on a PyYAML built without it)
and compares every field: problems (file, line, field, message), documents (start line, the line of
every path), models, and the nodes each file spent of max_nodes. Inputs: the example repository,
generated specs valid and invalid, the hostile files of test_loader.py, and seeded random edits of
valid specs (deleted, doubled or inserted characters), which reach libyaml/PyYAML differences no
hand-written case thought of.
"""

from __future__ import annotations

import collections
import random
from pathlib import Path
from typing import Any

import pytest
from plnt.core.specs import loader
from plnt.core.specs.limits import SpecLimits
from plnt.core.specs.loader import SourceFile, _Budget, _parse_file, load_sources, read_tree

from tests.core.test_loader import BACKEND, RECIPE, RUN, merged_mappings, nested_aliases

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(loader._CLoader is None, reason="PyYAML here is built without libyaml")


def parsed_fields(source: SourceFile, limits: SpecLimits) -> Any:
    """Everything _parse_file gives for one file, as plain comparable data."""
    parsed = _parse_file(source, _Budget(limits))
    return (parsed.problems, parsed.nodes,
            [(doc.file, doc.start, doc.lines, model, problems) for doc, model, problems in parsed.documents])


def both_ways(monkeypatch: pytest.MonkeyPatch, sources: list[SourceFile],
              limits: SpecLimits = loader.DEFAULT_LIMITS) -> tuple[Any, Any]:
    """(fast, slow): per-file fields and the whole load (SpecSet and problems) of the same files."""
    def run() -> Any:
        specs, problems = load_sources(sources, limits=limits)
        return [parsed_fields(s, limits) for s in sources], (specs, problems)

    fast = run()
    with monkeypatch.context() as patched:
        patched.setattr(loader, "_CLoader", None)
        slow = run()
    return fast, slow


def spec_variants() -> list[str]:
    """Valid and invalid specs in the styles people write: block and flow, comments, quoting,
    several documents, anchors and merge keys, multi-line scalars, odd scalars, mistakes."""
    block_run = RUN.replace("metadata: {name: review-responder, namespace: default}",
                            "metadata:\n  name: review-responder  # the name\n  namespace: 'default'\n")
    return [
        RUN, BACKEND, RECIPE, block_run,
        "---\n" + BACKEND + "---\n" + RUN + "...\n",
        "# only a comment\n",
        "",
        "---\n---\n" + BACKEND,
        RUN + "  replicas: {min: 1, max: 3}\n  selfHeal: false\n",
        RUN.replace("trafficPercent: 5", "trafficPercent: \"5\""),               # a string, not a number
        RUN.replace("trafficPercent: 5", "trafficPercent: 5.5"),
        RUN.replace("trafficPercent: 5", "trafficPercent: 2024-13-45"),          # an unreadable date
        RUN.replace("trafficPercent: 5", "trafficPercent: 2024-01-02"),
        RUN.replace("trafficPercent: 5", "trafficPercent: ~"),
        RUN.replace("trafficPercent: 5", "trafficPercent: 0x1F"),
        RUN.replace("trafficPercent: 5", "trafficPercent: on"),
        RUN.replace("trafficPercent: 5", "trafficPercnt: 5"),                    # unknown field
        RUN.replace("review-responder, namespace", "Review_Responder, namespace"),  # pattern
        RUN.replace("backend: {cluster: local}", "backend: {cluster: nowhere}"),  # unknown backend
        RUN + "spec: {}\n",                                                      # duplicate key
        RUN.replace("  backend: {cluster: local}\n", "  backend: &b {cluster: local}\n  other: *b\n"),
        "base: &base {cluster: local}\n" + RUN.replace("backend: {cluster: local}", "backend: {<<: *base}"),
        RECIPE.replace("runtime: {entrypoint: steps.py}", "description: |\n  several\n  lines\nruntime:\n"
                       "  entrypoint: >-\n    steps.py"),
        RECIPE.replace("deps: [classify_intent]", "deps: [nothing]"),
        RECIPE + "output: safety_check\n",
        "apiVersion: plnt.work/v1\nkind: Nope\n",
        "- a list\n- not a mapping\n",
        "just a string\n",
        RUN.replace("kind: WorkflowRun", "kind: !Ref WorkflowRun"),              # a tag
        RUN.replace("metadata:", "metadata:\t"),
        "a: [1, 2\nb: 3\n",                                                      # syntax errors
        "a: {b: 1\n",
        "a: 'unclosed\n",
        "a: b: c\n",
        "a:\n  - 1\n - 2\n",
        "\tkey: value\n",
        "a: *missing\n",
        "a: &x 1\nb: &x 2\nc: *x\n",                                             # anchor used twice
        "x: &a [*a]\n",                                                          # recursive alias
        "? [complex, key]\n: value\n",
        "a: 1\n" * 3,
        "[" * 80 + "]" * 80 + "\n",                                              # past max_depth
        "- " * 80 + "x\n",
        "a: " + "[" * 2000 + "\n",                                               # past libyaml's own limit
        "- " * 50_000 + "x\n",
        nested_aliases(7), merged_mappings(9), nested_aliases(3),
        "caf\u00e9: \u2603\n\u00e9t\u00e9: \"\\u00e9\"\n",
        "a: 1\r\nb: 2\r\n",
        "a: 1\u2028b: 2\n",
        "a: 1\x85b: 2\n",
        "%YAML 1.1\n---\n" + BACKEND,
        "%TAG ! tag:example.com,2000:\n---\n" + BACKEND,
        # Where libyaml alone would read the text (loader._LIBYAML_DIFFERS): found by random edits.
        RUN.replace("p95BudgetMs: 2500", "p95BudgetMs: 2?500"),
        "!\n",
        "\ufeff\ufeff",
        "\ufeffa: 1\n",
        "|# a comment\n",
        "a: >-#\n  b\n",
    ]


def test_the_example_repository_loads_the_same_both_ways(monkeypatch: pytest.MonkeyPatch) -> None:
    sources: list[SourceFile] = []
    for root in (ROOT / "gitops-example", ROOT / "examples"):
        if root.is_dir():
            files, problems = read_tree(root)
            assert problems == []
            sources += files
    assert len(sources) >= 5
    fast, slow = both_ways(monkeypatch, sources)
    assert fast == slow
    # gitops-example is valid (examples/ also holds CI files, not specs): a real comparison
    assert fast[1][0].workflow_runs and fast[1][0].backends and fast[1][0].trust_policies


@pytest.mark.parametrize("index", range(len(spec_variants())))
def test_generated_specs_load_the_same_both_ways(monkeypatch: pytest.MonkeyPatch, index: int) -> None:
    text = spec_variants()[index]
    sources = [SourceFile("backend.yaml", BACKEND), SourceFile("spec.yaml", text)]
    fast, slow = both_ways(monkeypatch, sources)
    assert fast == slow


def test_limits_hold_the_same_both_ways(monkeypatch: pytest.MonkeyPatch) -> None:
    """Small limits: depth, per-file alias expansion and max_nodes across files cut at the same place."""
    sources = [SourceFile(f"f{i:02}.yaml", text) for i, text in enumerate(spec_variants()[:12] + [RUN] * 5)]
    for limits, expected in ((SpecLimits(max_depth=3), "max_depth"), (SpecLimits(max_nodes=150), "max_nodes"),
                             (SpecLimits(alias_factor=1), "alias_factor")):
        both = [*sources, SourceFile("bomb.yaml", nested_aliases(4))]
        fast, slow = both_ways(monkeypatch, both, limits)
        assert fast == slow
        assert any(expected in p.message for p in fast[1][1]), (expected, fast[1][1])


def test_random_edits_of_valid_specs_load_the_same_both_ways(monkeypatch: pytest.MonkeyPatch) -> None:
    """Seeded random damage to valid specs: whatever the result, both ways agree on it."""
    rng = random.Random(11)
    alphabet = " \t\n\n:-[]{},|>+~=$(/;'\"#&*!|>?%@`\\0aZ9.\r\x85\u2028\ufeff"
    bases = [RUN, BACKEND, RECIPE, "---\n" + BACKEND + "---\n" + RUN]
    sources = []
    for i in range(400):
        chars = list(rng.choice(bases))
        for _ in range(rng.randint(1, 3)):
            at = rng.randrange(len(chars))
            action = rng.randrange(3)
            if action == 0:
                del chars[at]
            elif action == 1:
                chars.insert(at, chars[at])
            else:
                chars.insert(at, rng.choice(alphabet))
        sources.append(SourceFile(f"edit-{i:03}.yaml", "".join(chars)))
    fast, slow = both_ways(monkeypatch, sources)
    for source, fast_file, slow_file in zip(sources, fast[0], slow[0], strict=True):
        assert fast_file == slow_file, source.text
    assert fast[1] == slow[1]


def test_valid_files_take_the_fast_path_and_broken_ones_the_slow() -> None:
    """Without this, the comparisons above would also pass if libyaml were never used."""
    before = loader.parser_reads.copy()
    specs, problems = load_sources([SourceFile("backend.yaml", BACKEND), SourceFile("run.yaml", RUN)])
    assert problems == [] and len(specs.workflow_runs) == 1
    assert loader.parser_reads - before == collections.Counter(fast=2)
    before = loader.parser_reads.copy()
    _, problems = load_sources([SourceFile("bad.yaml", "a: [1, 2\nb: 3\n")])
    assert loader.parser_reads - before == collections.Counter(fast=1, checked=1)  # tried fast, read again
    assert [(p.line, p.message.split(":")[0]) for p in problems] == [(2, "malformed YAML")]


def test_libyaml_is_used_only_where_it_bounds_nesting_itself() -> None:
    """PyYAML composes libyaml's nodes recursively in C: without libyaml's own depth limit a deep
    document would overflow the stack, so such a libyaml is not used (loader._bounded_libyaml)."""
    assert loader._bounded_libyaml() is loader._CLoader is not None
    _, problems = load_sources([SourceFile("deep.yaml", "- " * 100_000 + "x\n")])
    assert [(p.line, "nested more than 64 levels deep (max_depth)" in p.message) for p in problems] == [(1, True)]
