"""Loader tests: every kind of problem is reported with the exact file, line and field."""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
from plnt.core.specs.limits import SpecLimits
from plnt.core.specs.loader import (
    Problem,
    SourceFile,
    SpecError,
    decode_spec,
    load_directory,
    load_recipe,
    load_sources,
    read_directory,
    read_specs,
    read_tree,
)

RUN = """\
apiVersion: plnt.work/v1
kind: WorkflowRun
metadata: {name: review-responder, namespace: default}
spec:
  workflow: {ref: review-responder@1.2.0, registry: "file:registry"}
  backend: {cluster: local}
  canary:
    trafficPercent: 5
    smokeTest: {invocations: 10, p95BudgetMs: 2500, errorBudgetPercent: 1}
"""

BACKEND = """\
apiVersion: plnt.work/v1
kind: PlntBackend
metadata: {name: local}
spec: {type: local}
"""

RECIPE = """\
apiVersion: microagents.dev/v1
kind: Workflow
metadata: {name: review-responder, version: 1.2.0}
runtime: {entrypoint: steps.py}
steps:
  - {id: classify_intent, tool: llm.classify}
  - {id: retrieve_brand_voice, tool: rag.query, deps: [classify_intent]}
  - {id: draft_reply, tool: llm.generate, deps: [retrieve_brand_voice]}
  - {id: safety_check, tool: policy.moderate, deps: [draft_reply]}
"""


def write(root: Path, name: str, text: str) -> Path:
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def where(problems: list[Problem]) -> list[tuple[str, int, str]]:
    return [(p.file, p.line, p.field) for p in problems]


def load_one(tmp_path: Path, text: str, name: str = "specs.yaml") -> list[Problem]:
    write(tmp_path, name, text)
    _, problems = load_directory(tmp_path)
    return problems


# --- valid input ---------------------------------------------------------------------------


def test_valid_multi_document_file_loads_with_defaults(tmp_path: Path) -> None:
    minimal_run = """\
    apiVersion: plnt.work/v1
    kind: WorkflowRun
    metadata: {name: minimal}
    spec:
      workflow: {ref: review-responder@1.2.0, registry: "file:registry"}
      backend: {cluster: local}
    """
    write(tmp_path, "all.yaml", "---\n" + RUN + "---\n" + BACKEND + "---\n" + RECIPE + "---\n")
    write(tmp_path, "minimal.yml", minimal_run)

    specs, problems = load_directory(tmp_path)

    assert problems == []
    assert set(specs.workflow_runs) == {"default/review-responder", "default/minimal"}
    assert set(specs.backends) == {"local"}
    assert set(specs.recipes) == {"review-responder@1.2.0"}
    run = specs.workflow_runs["default/minimal"]
    assert run.metadata.namespace == "default"
    assert run.spec.canary.traffic_percent == 5
    assert run.spec.canary.smoke_test.invocations == 10
    assert run.spec.canary.smoke_test.error_budget_percent == 1
    assert run.spec.replicas.min == 1
    assert run.spec.self_heal is True
    assert specs.recipes["review-responder@1.2.0"].steps[3].deps == ["draft_reply"]
    # Each location is the first line of the document's content.
    assert specs.locations == {
        "WorkflowRun/default/review-responder": ("all.yaml", 2),
        "PlntBackend/local": ("all.yaml", 12),
        "Workflow/review-responder@1.2.0": ("all.yaml", 17),
        "WorkflowRun/default/minimal": ("minimal.yml", 1),
    }


def test_merge_keys_may_be_overridden(tmp_path: Path) -> None:
    text = """\
    apiVersion: plnt.work/v1
    kind: PlntBackend
    metadata: {name: local}
    spec:
      <<: {type: kubernetes, gpuClasses: [a100]}
      type: local
    """
    write(tmp_path, "b.yaml", text)
    specs, problems = load_directory(tmp_path)
    assert problems == []
    assert specs.backends["local"].spec.type == "local"
    assert specs.backends["local"].spec.gpu_classes == ["a100"]


# --- YAML-level problems -------------------------------------------------------------------


def test_malformed_yaml_keeps_earlier_documents(tmp_path: Path) -> None:
    text = BACKEND + "---\napiVersion: plnt.work/v1\nkind: PlntBackend\nmetadata: {name: broken\nspec: {}\n"
    write(tmp_path, "backends.yaml", text)

    specs, problems = load_directory(tmp_path)

    assert set(specs.backends) == {"local"}
    assert where(problems) == [("backends.yaml", 9, "document")]
    assert problems[0].message.startswith("malformed YAML: ")
    assert "started at line 8" in problems[0].message


def test_duplicate_key_in_a_mapping(tmp_path: Path) -> None:
    text = BACKEND + "---\n" + RUN + "    trafficPercent: 50\n"
    problems = load_one(tmp_path, text)
    assert where(problems) == [("specs.yaml", 15, "spec.canary.trafficPercent")]
    assert "first given at line 13" in problems[0].message


def test_document_that_is_not_a_mapping(tmp_path: Path) -> None:
    problems = load_one(tmp_path, BACKEND + "---\n- just\n- a list\n")
    assert where(problems) == [("specs.yaml", 6, "document")]
    assert "microagents.dev/v1 Workflow" in problems[0].message


def test_missing_kind(tmp_path: Path) -> None:
    problems = load_one(tmp_path, "# a comment\napiVersion: plnt.work/v1\nmetadata: {name: x}\n")
    assert where(problems) == [("specs.yaml", 2, "kind")]
    assert "plnt.work/v1 PlntBackend" in problems[0].message


def test_unknown_api_version(tmp_path: Path) -> None:
    problems = load_one(tmp_path, "kind: WorkflowRun\napiVersion: plnt.work/v2\n")
    assert where(problems) == [("specs.yaml", 2, "apiVersion")]
    assert "unknown apiVersion 'plnt.work/v2'" in problems[0].message
    assert "plnt.work/v1 WorkflowRun" in problems[0].message


def test_unknown_kind(tmp_path: Path) -> None:
    problems = load_one(tmp_path, "apiVersion: plnt.work/v1\nkind: Backend\nmetadata: {name: x}\n")
    assert where(problems) == [("specs.yaml", 2, "kind")]
    assert "unknown kind 'Backend'" in problems[0].message


# --- model validation problems -------------------------------------------------------------


def test_unknown_field_names_allowed_fields(tmp_path: Path) -> None:
    text = RUN.replace("errorBudgetPercent: 1}", "errorBudgetPercent: 1}\n    trafficPercentage: 5")
    problems = load_one(tmp_path, text)
    assert where(problems) == [("specs.yaml", 10, "spec.canary.trafficPercentage")]
    message = problems[0].message
    assert message.startswith("unknown field; did you mean 'trafficPercent'?")
    assert "(allowed: gates, headerRoute, shadowPercent, smokeTest, steps, trafficPercent)" in message


def test_missing_required_field_points_at_parent_key(tmp_path: Path) -> None:
    text = RUN.replace("{ref: review-responder@1.2.0, registry", "{registry")
    problems = load_one(tmp_path, BACKEND + "---\n" + text)
    assert where(problems) == [("specs.yaml", 10, "spec.workflow.ref")]
    assert problems[0].message == "required field is missing; add it"


def test_missing_top_level_field_points_at_document_start(tmp_path: Path) -> None:
    problems = load_one(tmp_path, "apiVersion: plnt.work/v1\nkind: PlntBackend\nspec: {type: local}\n")
    assert where(problems) == [("specs.yaml", 1, "metadata")]


def test_wrong_type_in_list_item(tmp_path: Path) -> None:
    text = RUN.replace(
        "  backend: {cluster: local}\n",
        "  backend:\n    cluster: local\n    tolerations:\n      - key: gpu\n        effect: NoPlacement\n",
    )
    problems = load_one(tmp_path, BACKEND + "---\n" + text)
    assert where(problems) == [("specs.yaml", 15, "spec.backend.tolerations[0].effect")]
    assert "'NoSchedule', 'PreferNoSchedule' or 'NoExecute'" in problems[0].message
    assert "(got 'NoPlacement')" in problems[0].message


def test_unquoted_version_is_a_float(tmp_path: Path) -> None:
    problems = load_one(tmp_path, RECIPE.replace("version: 1.2.0", "version: 1.2"), "workflow.yaml")
    assert where(problems) == [("workflow.yaml", 3, "metadata.version")]
    assert 'YAML reads 1.2 as a number; quote it, e.g. "1.2"' in problems[0].message
    assert "semantic version like 1.2.0" in problems[0].message


def test_bad_step_tool(tmp_path: Path) -> None:
    text = RECIPE.replace("tool: rag.query", "tool: rag.search")
    problems = load_one(tmp_path, text, "workflow.yaml")
    assert where(problems) == [("workflow.yaml", 7, "steps[1].tool")]


def test_model_validator_error_points_at_its_mapping(tmp_path: Path) -> None:
    text = BACKEND.replace("spec: {type: local}", "spec:\n  type: kubernetes\n")
    problems = load_one(tmp_path, text)
    assert where(problems) == [("specs.yaml", 4, "spec")]
    assert problems[0].message.startswith("type: kubernetes needs a kubernetes:")


def test_yaml_boolean_where_a_string_is_expected(tmp_path: Path) -> None:
    problems = load_one(
        tmp_path, BACKEND.replace("metadata: {name: local}", "metadata:\n  name: local\n  labels: {gpu: yes}")
    )
    assert where(problems) == [("specs.yaml", 5, "metadata.labels.gpu")]
    assert problems[0].message == 'expected a string, but YAML reads yes as true/false; quote it, e.g. "yes"'


def test_name_pattern_is_explained(tmp_path: Path) -> None:
    problems = load_one(tmp_path, BACKEND.replace("name: local", "name: Local_Box"))
    assert where(problems) == [("specs.yaml", 3, "metadata.name")]
    assert "'Local_Box' is not valid; it must be a lowercase name" in problems[0].message


# --- cross-document problems ---------------------------------------------------------------


def test_duplicate_workflow_run_in_namespace(tmp_path: Path) -> None:
    write(tmp_path, "a.yaml", BACKEND + "---\n" + RUN)
    write(tmp_path, "b.yaml", RUN)
    write(tmp_path, "c.yaml", RUN.replace("namespace: default", "namespace: staging"))

    specs, problems = load_directory(tmp_path)

    assert where(problems) == [("b.yaml", 3, "metadata.name")]
    assert "duplicate WorkflowRun default/review-responder; first declared at a.yaml:8" in problems[0].message
    assert set(specs.workflow_runs) == {"default/review-responder", "staging/review-responder"}
    assert specs.locations["WorkflowRun/default/review-responder"] == ("a.yaml", 6)


def test_duplicate_backend(tmp_path: Path) -> None:
    problems = load_one(tmp_path, BACKEND + "---\n" + BACKEND)
    assert where(problems) == [("specs.yaml", 8, "metadata.name")]
    assert "duplicate PlntBackend local; first declared at specs.yaml:3" in problems[0].message


def test_duplicate_recipe_version(tmp_path: Path) -> None:
    write(tmp_path, "recipes/one.yaml", RECIPE)
    write(tmp_path, "recipes/two.yaml", RECIPE)
    _, problems = load_directory(tmp_path)
    assert where(problems) == [("recipes/two.yaml", 3, "metadata.name")]
    assert "duplicate Workflow review-responder@1.2.0; first declared at recipes/one.yaml:3" in problems[0].message


def test_unknown_backend(tmp_path: Path) -> None:
    problems = load_one(tmp_path, BACKEND + "---\n" + RUN.replace("cluster: local", "cluster: gpu-east"))
    assert where(problems) == [("specs.yaml", 11, "spec.backend.cluster")]
    assert problems[0].message == (
        "unknown backend 'gpu-east'; declare a PlntBackend named 'gpu-east' or use one of: local"
    )


def test_backend_declared_in_a_later_file_is_found(tmp_path: Path) -> None:
    write(tmp_path, "a-runs.yaml", RUN)
    write(tmp_path, "z-backends.yaml", BACKEND)
    _, problems = load_directory(tmp_path)
    assert problems == []


def test_gpu_class_not_offered(tmp_path: Path) -> None:
    gpu_backend = (
        "apiVersion: plnt.work/v1\nkind: PlntBackend\nmetadata: {name: local}\n"
        "spec: {type: local, gpuClasses: [l4, a100]}\n"
    )
    run = RUN.replace("backend: {cluster: local}", "backend:\n    cluster: local\n    gpuClass: h100\n    gpuCount: 1")
    problems = load_one(tmp_path, gpu_backend + "---\n" + run)
    assert where(problems) == [("specs.yaml", 13, "spec.backend.gpuClass")]
    assert "no GPU class 'h100'; it offers: l4, a100" in problems[0].message


def test_gpu_class_on_backend_without_gpus(tmp_path: Path) -> None:
    run = RUN.replace("backend: {cluster: local}", "backend: {cluster: local, gpuClass: l4, gpuCount: 1}")
    problems = load_one(tmp_path, BACKEND + "---\n" + run)
    assert where(problems) == [("specs.yaml", 11, "spec.backend.gpuClass")]
    assert "offers no GPU classes" in problems[0].message


def test_step_depends_on_unknown_step(tmp_path: Path) -> None:
    text = RECIPE.replace("deps: [draft_reply]", "deps: [draft_reply, translate]")
    problems = load_one(tmp_path, text, "workflow.yaml")
    assert where(problems) == [("workflow.yaml", 9, "steps[3].deps")]
    assert "unknown step(s) 'translate'" in problems[0].message


def test_dependency_cycle(tmp_path: Path) -> None:
    text = """\
    apiVersion: microagents.dev/v1
    kind: Workflow
    metadata: {name: loop, version: 0.1.0}
    steps:
      - id: a
        tool: llm.classify
        deps: [b]
      - id: b
        tool: llm.generate
        deps:
          - a
      - id: c
        tool: python
        deps: [c]
    """
    problems = load_one(tmp_path, text, "workflow.yaml")
    assert where(problems) == [("workflow.yaml", 7, "steps[0].deps"), ("workflow.yaml", 14, "steps[2].deps")]
    assert "dependency cycle: a -> b -> a" in problems[0].message
    assert "dependency cycle: c -> c" in problems[1].message


def test_duplicate_step_id(tmp_path: Path) -> None:
    text = RECIPE + "  - {id: draft_reply, tool: python}\n"
    problems = load_one(tmp_path, text, "workflow.yaml")
    assert where(problems) == [("workflow.yaml", 10, "steps[4].id")]
    assert "duplicate step id 'draft_reply'; first used by steps[2]" in problems[0].message


def test_output_names_unknown_step(tmp_path: Path) -> None:
    text = RECIPE.replace("runtime:", "output: final_answer\nruntime:")
    problems = load_one(tmp_path, text, "workflow.yaml")
    assert where(problems) == [("workflow.yaml", 4, "output")]
    assert "unknown step 'final_answer'" in problems[0].message


# --- many problems, sources, recipes, directories ------------------------------------------


def test_all_problems_across_files_are_reported_sorted(tmp_path: Path) -> None:
    unknown_backend = RUN.replace("cluster: local", "cluster: gpu-east")
    bad_traffic = RUN.replace("name: review-responder,", "name: other,").replace(
        "trafficPercent: 5", "trafficPercent: 500"
    )
    write(tmp_path, "runs.yaml", unknown_backend + "---\n" + bad_traffic)
    write(tmp_path, "backends.yaml", BACKEND.replace("type: local", "type: cloud") + "---\nkind: PlntBackend\n")
    write(tmp_path, "recipes/review.yaml", RECIPE.replace("[classify_intent]", "[retrieve_brand_voice]"))

    specs, problems = load_directory(tmp_path)

    assert where(problems) == [
        ("backends.yaml", 4, "spec.type"),
        ("backends.yaml", 6, "apiVersion"),
        ("recipes/review.yaml", 7, "steps[1].deps"),
        ("runs.yaml", 6, "spec.backend.cluster"),
        ("runs.yaml", 18, "spec.canary.trafficPercent"),
    ]
    assert "none declared" in problems[3].message
    assert problems[4].message == "Input should be less than or equal to 100 (got 500)"
    assert specs.backends == {}


def test_load_sources_uses_display_paths_and_never_raises() -> None:
    files = [
        SourceFile("repo/a.yaml", "key: [unclosed\n"),
        SourceFile("repo/b.yaml", "!!python/object:os.system {}\n"),
        SourceFile("repo/c.yaml", ""),
        SourceFile(
            "repo/d.yaml", "apiVersion: plnt.work/v1\nkind: PlntBackend\nmetadata: {name: x}\nspec: {type: local}\n"
        ),
    ]
    specs, problems = load_sources(files)
    assert where(problems) == [("repo/a.yaml", 1, "document"), ("repo/b.yaml", 1, "document")]
    assert set(specs.backends) == {"x"}
    assert str(problems[0]).startswith("repo/a.yaml:1: document: malformed YAML: ")


def test_load_recipe_good(tmp_path: Path) -> None:
    recipe = load_recipe(write(tmp_path, "review-responder/workflow.yaml", RECIPE))
    assert recipe.metadata.version == "1.2.0"
    assert [step.id for step in recipe.steps][-1] == "safety_check"
    assert recipe.runtime.entrypoint == "steps.py"


def test_load_recipe_bad_reports_every_problem(tmp_path: Path) -> None:
    text = RECIPE.replace("deps: [draft_reply]", "deps: [draft]") + "output: nowhere\n"
    path = write(tmp_path, "workflow.yaml", text)

    with pytest.raises(SpecError) as caught:
        load_recipe(path)

    problems = caught.value.problems
    assert where(problems) == [(str(path), 9, "steps[3].deps"), (str(path), 10, "output")]
    assert str(caught.value) == "\n".join(str(p) for p in problems)


def test_load_recipe_schema_error(tmp_path: Path) -> None:
    path = write(tmp_path, "workflow.yaml", RECIPE.replace("steps:\n", "stepz:\n"))
    with pytest.raises(SpecError) as caught:
        load_recipe(path)
    assert where(caught.value.problems) == [(str(path), 1, "steps"), (str(path), 5, "stepz")]


def test_load_recipe_rejects_other_kinds(tmp_path: Path) -> None:
    path = write(tmp_path, "workflow.yaml", BACKEND)
    with pytest.raises(SpecError, match="exactly one microagents.dev/v1 Workflow"):
        load_recipe(path)


def test_read_directory_skips_hidden_directories(tmp_path: Path) -> None:
    write(tmp_path, "runs/review.yaml", RUN)
    write(tmp_path, "backends.yml", BACKEND)
    write(tmp_path, "README.md", "# not a spec\n")
    write(tmp_path, ".git/config.yaml", "not: a spec\n")
    write(tmp_path, ".plnt/state.yaml", "also: not a spec\n")
    write(tmp_path, "runs/.hidden/old.yaml", RUN)
    write(tmp_path, ".pre-commit-config.yaml", "repos: []\n")

    files = read_directory(tmp_path)

    assert [f.path for f in files] == ["backends.yml", "runs/review.yaml"]
    assert files[1].text == RUN
    specs, problems = load_directory(tmp_path)
    assert problems == []
    assert specs.locations["WorkflowRun/default/review-responder"] == ("runs/review.yaml", 1)


@pytest.mark.parametrize(("path", "ignored"), [
    ("registry/review-responder/1.2.0/golden.yaml", True),   # directory pattern
    ("registry.yaml", False),                                # a file named like the directory is kept
    ("workflowruns/a.yaml", False),
    ("drafts/wip.tmp.yaml", True),                           # glob over the whole relative path
    ("x.tmp.yaml", True),
])
def test_plntignore_rules(path: str, ignored: bool) -> None:
    from plnt.core.specs.loader import IgnoreRules

    rules = IgnoreRules.parse("# recipes are not specs\nregistry/\n\n*.tmp.yaml\n")
    assert rules.ignores(path) is ignored


def test_read_directory_honours_plntignore(tmp_path: Path) -> None:
    (tmp_path / "registry" / "r" / "1.0.0").mkdir(parents=True)
    (tmp_path / "registry" / "r" / "1.0.0" / "golden.yaml").write_text("cases: []\n")
    (tmp_path / "run.yaml").write_text("apiVersion: plnt.work/v1\n")
    (tmp_path / ".plntignore").write_text("registry/\n")
    assert [f.path for f in read_directory(tmp_path)] == ["run.yaml"]


# --- hostile input: each a FILE:LINE problem within bounded work, never a traceback ---------


def nested_aliases(levels: int, fanout: int = 9) -> str:
    """The classic alias bomb: each anchor lists the previous one `fanout` times (fanout**levels values)."""
    lines = [f"a0: &a0 [{', '.join(['x'] * fanout)}]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * fanout)}]" for i in range(1, levels + 1)]
    return "\n".join(lines) + "\n"


def merged_mappings(levels: int, fanout: int = 9) -> str:
    """The merge-key bomb: each mapping merges the previous one `fanout` times."""
    lines = ["m0: &m0 {k0: 1, k1: 2, k2: 3}"]
    lines += [f"m{i}: &m{i} {{<<: [{', '.join([f'*m{i - 1}'] * fanout)}], own{i}: 1}}" for i in range(1, levels + 1)]
    return "\n".join(lines) + "\n"


def load_hostile(text: str, name: str = "hostile.yaml") -> list[Problem]:
    _, problems = load_sources([SourceFile(name, text)])
    return problems


def test_nul_byte_is_a_problem_at_its_line() -> None:
    problems = load_hostile(BACKEND.replace("spec: {type: local}", "spec: {type: lo\0cal}"))
    assert [str(p) for p in problems] == ["hostile.yaml:4: document: character U+0000 at column 16 is not allowed in YAML; remove it"]


def test_invalid_utf8_names_the_line_and_column_of_the_first_bad_byte() -> None:
    source = decode_spec("latin1.yaml", BACKEND.replace("name: local", "name: caf\xe9").encode("latin-1"))
    assert source.text == ""
    _, problems = load_sources([source])
    assert [str(p) for p in problems] == [
        "latin1.yaml:3: document: not UTF-8 text: byte 0xe9 at column 21 (invalid continuation byte); save the file as UTF-8"]


@pytest.mark.parametrize("text", [
    "a: " + "[" * 5000 + "]" * 5000,  # JSON-style flow nesting
    "a: " + '{"a": ' * 5000 + "1" + "}" * 5000,
    "- " * 5000 + "x\n",  # block sequences on one line
    "".join(" " * i + "a:\n" for i in range(200)) + " " * 200 + "a: 1\n",  # block mappings
], ids=["flow-sequences", "flow-mappings", "block-sequences", "block-mappings"])
def test_deep_nesting_is_refused_before_it_is_composed(text: str) -> None:
    problems = load_hostile(text)
    assert len(problems) == 1 and problems[0].field == "document", problems
    assert "nested more than 64 levels deep (max_depth)" in problems[0].message


def test_nesting_through_aliases_is_bounded_too() -> None:
    # Each anchor is shallow, but referencing the previous one nests 2 levels more each time.
    text = "a0: &a0 [[1]]\n" + "".join(f"a{i}: &a{i} [[*a{i - 1}]]\n" for i in range(1, 40))
    problems = load_hostile(text)
    assert len(problems) == 1 and "levels deep through aliases (max_depth)" in problems[0].message, problems


def test_nesting_up_to_the_limit_loads() -> None:
    text = "a: " + "[" * 60 + "]" * 60 + "\n"
    assert [p.message for p in load_hostile(text) if "deep" in p.message] == []


@pytest.mark.parametrize("bomb", [nested_aliases(7), merged_mappings(9)], ids=["aliases", "merge-keys"])
def test_alias_and_merge_bombs_are_refused_after_bounded_work(bomb: str) -> None:
    problems = load_hostile(bomb)
    assert len(bomb) < 1000
    allowed = 10_000 + 10 * len(bomb)
    assert [(p.field, p.message.split(" (")[0]) for p in problems] == [
        ("document", f"aliases or merge keys expand this file to more than {allowed} values")]
    # The line of the entry whose references ran out (a4/m4: 9**4-fold), not of the anchor at line 1.
    assert problems[0].line == 5


def test_expansion_budget_counts_values_built_not_bytes() -> None:
    """The same bomb one level shallower (a3: 7,381 values) fits the budget: only expansion is refused."""
    assert [p for p in load_hostile(nested_aliases(3)) if "expand" in p.message] == []
    assert [p for p in load_hostile(nested_aliases(4)) if "expand" in p.message] != []


def test_commit_wide_node_budget() -> None:
    limits = SpecLimits(max_nodes=200)
    files = [SourceFile(f"run-{i}.yaml", RUN.replace("review-responder,", f"run-{i},")) for i in range(20)]
    _, problems = load_sources(files, limits=limits)
    refused = [p for p in problems if "max_nodes" in p.message]
    assert refused and refused[0].file == "run-10.yaml", refused  # ~19 values a file: the 11th runs out


def test_merge_keys_first_mapping_wins_and_own_keys_override() -> None:
    """The merge-key spec (yaml.org/type/merge.html): earlier mappings in `<<: [...]` win, the mapping's
    own keys win over all. (PyYAML 6.0.4's own flatten_mapping lets the later one win here.)"""
    text = BACKEND.replace("spec: {type: local}", "spec: {<<: [{type: local, gpuClasses: [a100]}, "
                                                   "{type: kubernetes, gpuClasses: [h100]}], gpuClasses: [l4]}")
    specs, problems = load_sources([SourceFile("b.yaml", text)])
    assert problems == []
    assert specs.backends["local"].spec.type == "local" and specs.backends["local"].spec.gpu_classes == ["l4"]


def test_merge_of_a_scalar_is_a_problem() -> None:
    problems = load_hostile("a: &a 1\nb: {<<: *a}\n")
    assert problems[0].line == 1 and "a merge key (<<) takes a mapping or a list of mappings" in problems[0].message


@pytest.mark.parametrize("value, message", [
    ("1" * 5000, "Exceeds the limit (4300 digits)"),
    ("2024-13-45", "month must be in 1..12"),
])
def test_scalars_python_cannot_build_are_problems(value: str, message: str) -> None:
    problems = load_hostile(BACKEND + f"extra: {value}\n")
    assert problems[0].line == 5 and message in problems[0].message and "quote it" in problems[0].message, problems


def test_file_over_the_byte_limit_is_refused_unread() -> None:
    reads: list[str] = []

    def read(path: str) -> bytes:
        reads.append(path)
        return b"a: 1\n"

    limits = SpecLimits(max_file_bytes=100)
    files = read_specs([("big.yaml", 101, lambda: read("big.yaml")), ("ok.yaml", 5, lambda: read("ok.yaml"))], limits)
    assert reads == ["ok.yaml"]
    assert [str(f.problem) for f in files if f.problem] == [
        "big.yaml:1: document: file is 101 bytes, over the limit of 100 for one spec file (max_file_bytes); "
        "split it into smaller files"]


def test_too_many_files_and_too_many_bytes_stop_reading() -> None:
    reads: list[int] = []

    def entries(count: int, size: int) -> list[tuple[str, int, Callable[[], bytes]]]:
        return [(f"f{i:03}.yaml", size, lambda i=i: reads.append(i) or b"a: 1\n") for i in range(count)]

    files = read_specs(entries(50, 5), SpecLimits(max_files=10))
    assert reads == [] and [str(f.problem) for f in files] == [
        "f010.yaml:1: document: more than 10 spec files (limit max_files); nothing of this commit was read: move "
        "what is not a spec out of the spec path or name it in .plntignore"]
    files = read_specs(entries(50, 40), SpecLimits(max_total_bytes=100))
    assert reads == [] and [str(f.problem) for f in files] == [
        "f002.yaml:1: document: spec files add up to more than 100 bytes at this file (limit max_total_bytes); "
        "nothing of this commit was read"]
    assert len(read_specs(entries(10, 10), SpecLimits(max_files=10, max_total_bytes=100))) == 10 == len(reads)


def test_read_tree_applies_the_limits(tmp_path: Path) -> None:
    write(tmp_path, "backend.yaml", BACKEND)
    (tmp_path / "huge.yaml").write_bytes(b"# " + b"x" * 2000 + b"\n")
    for i in range(5):
        write(tmp_path, f"runs/r{i}.yaml", "a: 1\n")
    files, problems = read_tree(tmp_path, SpecLimits(max_file_bytes=1000, max_files=100))
    assert [p.file for p in problems] == ["huge.yaml"] and len(files) == 6
    files, problems = read_tree(tmp_path, SpecLimits(max_files=3))
    assert files == [] and len(problems) == 1 and "more than 3 spec files" in problems[0].message


def test_duplicate_keys_are_still_reported_with_both_lines() -> None:
    problems = load_hostile(BACKEND + "metadata: {name: other}\n")
    assert [str(p) for p in problems] == [
        "hostile.yaml:5: metadata: duplicate key 'metadata'; first given at line 3, remove one of them"]


# Signers: a regex with unescaped dots (line 9), one with dots escaped, one without anchors.
LOOSE_POLICY = """\
apiVersion: plnt.work/v1
kind: RecipeTrustPolicy
metadata: {name: demo}
spec:
  recipes: ["review-responder"]
  trustRoot: {publicGood: true}
  signers:
    - issuer: https://issuer.example
      identityRegex: recipes@demo.plnt.invalid
    - issuer: https://issuer.example
      identityRegex: ^https://github\\.com/acme/.*$
    - issuer: https://issuer.example
      identityRegex: release@acme\\.example
"""


def test_identity_regex_with_unescaped_dots_is_a_warning_not_a_problem() -> None:
    specs, problems = load_sources([SourceFile("trust.yaml", LOOSE_POLICY)])
    assert problems == [] and set(specs.trust_policies) == {"demo"}
    # re.fullmatch applies the regex (anchored both ends), so the unanchored third signer is no warning.
    assert [str(w) for w in specs.warnings] == [
        "trust.yaml:9: spec.signers[0].identityRegex: warning: an unescaped '.' in 'recipes@demo.plnt.invalid' "
        "matches any character, not only a dot ('recipes@demoXplnt.invalid' is accepted too); write '\\.' for a "
        "literal dot"]
    signer = specs.trust_policies["demo"].spec.signers[0]
    assert signer.matches_identity(["recipes@demoXplnt.invalid"])  # what the warning is about
    assert not specs.trust_policies["demo"].spec.signers[2].matches_identity(["x-release@acme.example"])


# --- scale to zero (replicas.min: 0) -------------------------------------------------------


def test_scale_to_zero_on_a_local_backend_is_valid(tmp_path: Path) -> None:
    backend = BACKEND.replace("spec: {type: local}", "spec: {type: local, scaleToZeroAfterSeconds: 30}")
    run = RUN + "  replicas: {min: 0}\n"
    write(tmp_path, "specs.yaml", backend + "---\n" + run)
    specs, problems = load_directory(tmp_path)
    assert problems == []
    assert specs.workflow_runs["default/review-responder"].spec.replicas.min == 0
    assert specs.backends["local"].spec.scale_to_zero_after_seconds == 30


def test_scale_to_zero_needs_a_local_backend(tmp_path: Path) -> None:
    backend = ("apiVersion: plnt.work/v1\nkind: PlntBackend\nmetadata: {name: local}\n"
               "spec: {type: kubernetes, kubernetes: {context: kind}}\n")
    problems = load_one(tmp_path, backend + "---\n" + RUN + "  replicas: {min: 0}\n")
    assert where(problems) == [("specs.yaml", 15, "spec.replicas.min")]
    assert "needs a type: local backend; backend 'local' is type: kubernetes" in problems[0].message


def test_scale_to_zero_seconds_only_on_local_backends(tmp_path: Path) -> None:
    backend = ("apiVersion: plnt.work/v1\nkind: PlntBackend\nmetadata: {name: local}\n"
               "spec: {type: kubernetes, kubernetes: {context: kind}, scaleToZeroAfterSeconds: 60}\n")
    problems = load_one(tmp_path, backend + "---\n" + RUN)
    assert problems[0].line == 4 and "scaleToZeroAfterSeconds: is only allowed with type: local" in problems[0].message
    too_short = BACKEND.replace("spec: {type: local}", "spec: {type: local, scaleToZeroAfterSeconds: 0.5}")
    problems = load_one(tmp_path, too_short + "---\n" + RUN)
    assert problems[0].field == "spec.scaleToZeroAfterSeconds" and "greater than or equal to 1" in problems[0].message


# --- autoscaling -----------------------------------------------------------------------------


def test_autoscaling_on_in_flight_requests_loads_with_its_window(tmp_path: Path) -> None:
    run = RUN + "  replicas: {min: 1, max: 3}\n  autoscaling: {targetInFlight: 4, scaleDownAfterSeconds: 20}\n"
    write(tmp_path, "specs.yaml", BACKEND + "---\n" + run)
    specs, problems = load_directory(tmp_path)
    assert problems == []
    scaling = specs.workflow_runs["default/review-responder"].spec.autoscaling
    assert scaling is not None and (scaling.target_in_flight, scaling.scale_down_after_seconds) == (4, 20)


K8S_BACKEND = ("apiVersion: plnt.work/v1\nkind: PlntBackend\nmetadata: {name: local}\n"
               "spec: {type: kubernetes, kubernetes: {context: kind}}\n")


@pytest.mark.parametrize(("backend", "tail", "line", "field", "message"), [
    (BACKEND, "  replicas: {min: 2, max: 2}\n  autoscaling: {targetInFlight: 4}\n", 15, "spec.replicas.max",
     "autoscaling needs replicas.max above replicas.min (2)"),
    (BACKEND, "  autoscaling: {targetInFlight: 4}\n", 15, "spec.replicas.max",
     "autoscaling needs replicas.max above replicas.min (1)"),
    (BACKEND, "  replicas: {min: 1, max: 3}\n  autoscaling: {scaleDownAfterSeconds: 30}\n", 16, "spec.autoscaling",
     "autoscaling needs a target: targetInFlight"),
    (BACKEND, "  replicas: {min: 1, max: 3}\n  autoscaling: {targetInFlight: 0}\n", 16,
     "spec.autoscaling.targetInFlight", "greater than 0"),
    (BACKEND, "  replicas: {min: 1, max: 3}\n  autoscaling: {targetInvocationsPerSecond: 5}\n", 16,
     "spec.autoscaling.targetInFlight", "is type: local, where plnt scales on in-flight requests"),
], ids=["max-not-above-min", "no-max", "no-target", "zero-target", "rate-on-local"])
def test_autoscaling_problems_name_file_line_and_field(tmp_path: Path, backend: str, tail: str, line: int,
                                                      field: str, message: str) -> None:
    problems = load_one(tmp_path, backend + "---\n" + RUN + tail)
    assert where(problems) == [("specs.yaml", line, field)], problems
    assert message in problems[0].message, problems[0].message


def test_invocation_rate_autoscaling_stays_valid_on_kubernetes(tmp_path: Path) -> None:
    run = RUN + "  replicas: {min: 1, max: 4}\n  autoscaling: {targetInvocationsPerSecond: 25}\n"
    assert load_one(tmp_path, K8S_BACKEND + "---\n" + run) == []


def keda_backend(autoscaler: str) -> str:
    return ("apiVersion: plnt.work/v1\nkind: PlntBackend\nmetadata: {name: local}\nspec:\n  type: kubernetes\n"
            "  kubernetes:\n    context: kind\n" + autoscaler)


def test_a_keda_autoscaler_with_its_prometheus_loads(tmp_path: Path) -> None:
    write(tmp_path, "specs.yaml", keda_backend("    autoscaler: {kind: keda, prometheusAddress: http://prometheus.monitoring:9090}\n"))
    specs, problems = load_directory(tmp_path)
    assert problems == []
    autoscaler = specs.backends["local"].spec.kubernetes.autoscaler  # type: ignore[union-attr]
    assert (autoscaler.kind, autoscaler.prometheus_address) == ("keda", "http://prometheus.monitoring:9090")
    write(tmp_path, "specs.yaml", K8S_BACKEND)
    specs, _ = load_directory(tmp_path)
    assert specs.backends["local"].spec.kubernetes.autoscaler.kind == "hpa"  # type: ignore[union-attr]


@pytest.mark.parametrize(("autoscaler", "field", "message"), [
    ("    autoscaler: {kind: keda}\n", "spec.kubernetes.autoscaler", "autoscaler kind keda needs prometheusAddress"),
    ("    autoscaler: {prometheusAddress: http://prometheus:9090}\n", "spec.kubernetes.autoscaler",
     "prometheusAddress is only used with autoscaler kind keda"),
    ("    autoscaler: {kind: keda, prometheusAddress: prometheus:9090}\n",
     "spec.kubernetes.autoscaler.prometheusAddress", "'prometheus:9090' is not an http:// or https:// URL"),
    ("    autoscaler: {kind: adapter}\n", "spec.kubernetes.autoscaler.kind", "'hpa' or 'keda'"),
], ids=["keda-without-prometheus", "prometheus-without-keda", "address-without-scheme", "unknown-kind"])
def test_autoscaler_problems_name_file_line_and_field(tmp_path: Path, autoscaler: str, field: str, message: str) -> None:
    problems = load_one(tmp_path, keda_backend(autoscaler))
    assert where(problems) == [("specs.yaml", 8, field)], problems
    assert message in problems[0].message, problems[0].message


# --- ModelDeployment -------------------------------------------------------------------------

MODEL = """\
apiVersion: plnt.work/v1
kind: ModelDeployment
metadata: {name: smollm2}
spec:
  model: {registry: "file:///srv/models", name: smollm2, version: 1.0.0, rootDigest: "sha256:%s", trustPolicy: models}
  runtime: {type: llama.cpp, contextLength: 1024}
  backend: {cluster: local}
""" % ("a" * 64)

POLICY = """\
apiVersion: plnt.work/v1
kind: RecipeTrustPolicy
metadata: {name: models}
spec:
  recipes: [smollm2]
  trustRoot: {publicGood: true}
  signers: [{issuer: "https://token.actions.githubusercontent.com", identity: "https://github.com/acme/models/.github/workflows/release.yml@refs/heads/main"}]
"""


def test_a_model_deployment_loads_beside_workflow_runs_and_is_deployable(tmp_path: Path) -> None:
    write(tmp_path, "specs.yaml", BACKEND + "---\n" + RUN + "---\n" + POLICY + "---\n" + MODEL)
    specs, problems = load_directory(tmp_path)
    assert problems == []
    model = specs.model_deployments["default/smollm2"]
    assert model.version == "1.0.0" and model.spec.canary.prompts and model.spec.replicas.min == 1
    assert set(specs.deployables()) == {"default/review-responder", "default/smollm2"}
    assert specs.locations["ModelDeployment/default/smollm2"] == ("specs.yaml", 24)


@pytest.mark.parametrize(("change", "line", "field", "message"), [
    (("name: smollm2}\n", "name: review-responder}\n"), 3, "metadata.name",
     "has the name of the WorkflowRun declared at specs.yaml:8"),
    (("type: llama.cpp", "type: vllm"), 6, "spec.runtime.type", "runtime vllm runs on Kubernetes backends"),
    (("trustPolicy: models", "trustPolicy: nobody"), 5, "spec.model.trustPolicy", "unknown RecipeTrustPolicy 'nobody'"),
    (("contextLength: 1024}", "contextLength: 1024, args: [--port, '9']}"), 6, "spec.runtime.args",
     "--port is set by plnt"),
    (("rootDigest: \"sha256:", "rootDigest: \"md5:"), 5, "spec.model.rootDigest", "'sha256:' followed by 64"),
    (("backend: {cluster: local}", "backend: {cluster: local}\n  replicas: {min: 0}"), 8, "spec.replicas.min",
     "greater than or equal to 1"),
    (("backend: {cluster: local}", "backend: {cluster: local}\n  replicas: {min: 1, max: 2}\n"
      "  autoscaling: {targetInvocationsPerSecond: 3}"), 9, "spec.autoscaling.targetInFlight",
     "a ModelDeployment scales on in-flight requests"),
], ids=["name-taken-by-a-workflowrun", "gpu-runtime-on-local", "unknown-policy", "reserved-arg", "digest", "no-scale-to-zero",
        "model-scales-on-in-flight"])
def test_model_deployment_problems_name_file_line_and_field(
        tmp_path: Path, change: tuple[str, str], line: int, field: str, message: str) -> None:
    model = MODEL.replace(*change)
    assert model != MODEL
    write(tmp_path, "specs.yaml", BACKEND + "---\n" + RUN + "---\n" + POLICY)
    write(tmp_path, "z-model.yaml", model)
    specs, problems = load_directory(tmp_path)
    assert [(p.file, p.line, p.field) for p in problems] == [("z-model.yaml", line, field)], problems
    assert message in problems[0].message, problems[0].message


# --- a file registry path holding '..' ----------------------------------------------------------

DOTDOT_MESSAGE = ("a file registry path must not contain '..': name a directory inside the spec repository "
                  "(file:registry) or under a directory plnt is started with --allow-file-registry DIR")


@pytest.mark.parametrize("registry", ["file:../x", "file://../x", "file:///a/../b", "file://./registry/../..",
                                      "file:registry/.."])
def test_a_file_registry_path_holding_dotdot_is_the_specs_problem(tmp_path: Path, registry: str) -> None:
    """Named at the spec's own line and field, not later as a refused name in the commit's tree."""
    problems = load_one(tmp_path, BACKEND + "---\n" + RUN.replace('"file:registry"', f'"{registry}"'))
    assert where(problems) == [("specs.yaml", 10, "spec.workflow.registry")]
    assert problems[0].message.startswith(f"{registry!r}: {DOTDOT_MESSAGE}"), problems[0].message


def test_a_name_that_only_starts_with_dots_passes_and_a_models_registry_is_checked_too(tmp_path: Path) -> None:
    assert load_one(tmp_path, BACKEND + "---\n" + RUN.replace('"file:registry"', '"file:registry/..v2"')) == []
    problems = load_one(tmp_path, BACKEND + "---\n" + POLICY + "---\n" + MODEL.replace("file:///srv/models",
                                                                                        "file:///srv/../models"))
    assert where(problems) == [("specs.yaml", 18, "spec.model.registry")]
    assert DOTDOT_MESSAGE in problems[0].message


# --- GatewayPolicy: quotas and prices at the gateway ------------------------------------------

GATEWAY_POLICY = """\
apiVersion: plnt.work/v1
kind: GatewayPolicy
metadata: {name: quotas}
spec:
  currency: EUR
  prices:
    - {model: review-responder, inputPerMillion: 0.5, outputPerMillion: 1.5}
  tokens:
    - name: app-backend
      requestsPerMinute: 60
      tokensPerMinute: 20000
      budget: {amount: 5, per: day}
  default: {requestsPerMinute: 10}
"""


def test_a_gateway_policy_loads() -> None:
    specs, problems = load_sources([SourceFile("policy.yaml", GATEWAY_POLICY), SourceFile("run.yaml", BACKEND + "---\n" + RUN)])
    assert problems == [] and specs.warnings == []
    assert specs.gateway_policy is not None
    spec = specs.gateway_policy.spec
    assert spec.limits_for("app-backend").budget.amount == 5  # type: ignore[union-attr]
    assert spec.limits_for("someone-else") == spec.default
    assert spec.price_of("default", "review-responder").output_per_million == 1.5  # type: ignore[union-attr]


@pytest.mark.parametrize(("text", "problem"), [
    (GATEWAY_POLICY + "---\n" + GATEWAY_POLICY.replace("name: quotas", "name: more"),
     ("policy.yaml", 17, "metadata.name", "a second GatewayPolicy; the first is declared at policy.yaml:3")),
    (GATEWAY_POLICY.replace("  default:", "    - {name: app-backend, requestsPerMinute: 1}\n  default:"),
     ("policy.yaml", 13, "spec.tokens[1].name", "token 'app-backend' is listed twice")),
    (GATEWAY_POLICY.replace("  tokens:", "    - {model: review-responder, inputPerMillion: 1, outputPerMillion: 1}\n  tokens:"),
     ("policy.yaml", 8, "spec.prices[1].model", "model 'review-responder' is priced twice")),
    (GATEWAY_POLICY.replace("requestsPerMinute: 60", "requestsPerMinute: 0"),
     ("policy.yaml", 10, "spec.tokens[0].requestsPerMinute", "greater than or equal to 1")),
    (GATEWAY_POLICY.replace("per: day", "per: week"), ("policy.yaml", 12, "spec.tokens[0].budget.per", "'day' or 'month'")),
    (GATEWAY_POLICY.replace("name: app-backend", "name: 'app backend'"), ("policy.yaml", 9, "spec.tokens[0].name", "")),
    (GATEWAY_POLICY.replace("currency: EUR", "currency: euro"), ("policy.yaml", 5, "spec.currency", "")),
])
def test_gateway_policy_problems_name_file_line_and_field(text: str, problem: tuple[str, int, str, str]) -> None:
    specs, problems = load_sources([SourceFile("policy.yaml", text)], check_references=None)
    assert [(p.file, p.line, p.field) for p in problems] == [problem[:3]], problems
    assert problem[3] in problems[0].message


def test_a_price_naming_no_workflow_is_a_warning() -> None:
    text = GATEWAY_POLICY.replace("model: review-responder", "model: review-respnder")
    specs, problems = load_sources([SourceFile("policy.yaml", text), SourceFile("run.yaml", BACKEND + "---\n" + RUN)])
    assert problems == []
    assert [str(w) for w in specs.warnings] == [
        "policy.yaml:7: spec.prices[0].model: warning: no WorkflowRun or ModelDeployment named 'review-respnder'; "
        "its calls would cost nothing: check the name (NAME or NAMESPACE/NAME)"]
