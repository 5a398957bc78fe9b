"""RecipeTrustPolicy documents: loading, and every problem reported with its file, line and field."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from plnt.core.specs.loader import Problem, SourceFile, SpecError, load_directory, load_recipe, load_sources
from plnt.core.specs.models import KIND_MODELS, RecipeTrustPolicy

POLICY = """\
apiVersion: plnt.work/v1
kind: RecipeTrustPolicy
metadata: {name: demo}
spec:
  recipes: ["review-responder", "team-*"]
  trustRoot:
    trustedRootFile: trust/demo-trusted-root.json
  signers:
    - issuer: https://accounts.example.com
      identity: release@example.com
    - issuer: https://token.actions.githubusercontent.com
      identityRegex: ^https://github\\.com/acme/recipes/\\.github/workflows/release\\.yml@refs/tags/v.*$
"""

PUBLIC_GOOD = """\
apiVersion: plnt.work/v1
kind: RecipeTrustPolicy
metadata: {name: public}
spec:
  recipes: ["review-*"]
  trustRoot: {publicGood: true}
  signers: [{issuer: https://accounts.google.com, identity: signer-a@example.com}]
"""


def load(text: str, name: str = "trust.yaml") -> tuple[dict[str, RecipeTrustPolicy], list[Problem]]:
    specs, problems = load_sources([SourceFile(name, textwrap.dedent(text))])
    return specs.trust_policies, problems


def problems_of(text: str) -> list[tuple[int, str, str]]:
    _, problems = load(text)
    return [(p.line, p.field, p.message) for p in problems]


def edit(old: str, new: str, text: str = POLICY) -> str:
    assert old in text
    return text.replace(old, new, 1)


# --- valid ---------------------------------------------------------------------------------


def test_kind_is_registered() -> None:
    assert KIND_MODELS[("plnt.work/v1", "RecipeTrustPolicy")] is RecipeTrustPolicy


def test_valid_policy_loads() -> None:
    policies, problems = load(POLICY)
    assert problems == []
    demo = policies["demo"]
    assert demo.spec.recipes == ["review-responder", "team-*"]
    assert demo.spec.trust_root.trusted_root_file == "trust/demo-trusted-root.json"
    assert demo.spec.trust_root.public_good is None
    first, second = demo.spec.signers
    assert (first.issuer, first.identity, first.identity_regex) == (
        "https://accounts.example.com", "release@example.com", None
    )
    assert second.identity_regex == r"^https://github\.com/acme/recipes/\.github/workflows/release\.yml@refs/tags/v.*$"
    assert demo.covers("team-search") and demo.covers("review-responder") and not demo.covers("reviewer")


def test_public_good_policy_loads_with_other_kinds(tmp_path: Path) -> None:
    backend = "apiVersion: plnt.work/v1\nkind: PlntBackend\nmetadata: {name: local}\nspec: {type: local}\n"
    (tmp_path / "trust.yaml").write_text("---\n" + POLICY + "---\n" + PUBLIC_GOOD + "---\n" + backend)
    specs, problems = load_directory(tmp_path)
    assert problems == []
    assert sorted(specs.trust_policies) == ["demo", "public"]
    assert specs.trust_policies["public"].spec.trust_root.public_good is True
    assert specs.locations["RecipeTrustPolicy/public"] == ("trust.yaml", 15)  # after "---" + 12 lines + "---"
    assert list(specs.backends) == ["local"]


def test_overlapping_policies_are_allowed() -> None:
    """Two policies covering the same recipe (even the same pattern) is fine: ANY may accept it."""
    other = edit("metadata: {name: demo}", "metadata: {name: demo-ci}")
    policies, problems = load(POLICY + "---\n" + other + "---\n" + PUBLIC_GOOD)
    assert problems == []
    assert sorted(policies) == ["demo", "demo-ci", "public"]


# --- problems ------------------------------------------------------------------------------


def test_duplicate_policy_name() -> None:
    assert problems_of(POLICY + "---\n" + POLICY) == [
        (16, "metadata.name",
         "duplicate RecipeTrustPolicy demo; first declared at trust.yaml:3; rename or remove one of them"),
    ]


def test_duplicate_policy_name_across_files(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(POLICY)
    (tmp_path / "b.yaml").write_text("# the same name again\n" + POLICY)
    specs, problems = load_directory(tmp_path)
    assert [(p.file, p.line, p.field) for p in problems] == [("b.yaml", 4, "metadata.name")]
    assert "first declared at a.yaml:3" in problems[0].message
    assert list(specs.trust_policies) == ["demo"]


def test_policy_is_cluster_wide() -> None:
    [(line, field, message)] = problems_of(edit("{name: demo}", "{name: demo, namespace: default}"))
    assert (line, field) == (3, "metadata.namespace") and "unknown field" in message


@pytest.mark.parametrize(
    "old, new",
    [
        ("      identity: release@example.com\n", "      identity: release@example.com\n      identityRegex: release@.*\n"),
        ("      identity: release@example.com\n", ""),
    ],
    ids=["both", "neither"],
)
def test_signer_needs_exactly_one_identity(old: str, new: str) -> None:
    assert problems_of(edit(old, new)) == [
        (9, "spec.signers[0]", "a signer needs exactly one of identity (exact) or identityRegex (full match)"),
    ]


def test_identity_regex_must_compile() -> None:
    [(line, field, message)] = problems_of(edit("identityRegex: ^https", "identityRegex: (^https"))
    assert (line, field) == (12, "spec.signers[1].identityRegex")
    assert message.startswith("identityRegex is not a valid regular expression: missing ), unterminated subpattern")


def test_signer_needs_an_issuer() -> None:
    assert problems_of(edit("    - issuer: https://accounts.example.com\n      identity:", "    - identity:")) == [
        (9, "spec.signers[0].issuer", "required field is missing; add it"),
    ]


def test_signers_and_recipes_must_not_be_empty() -> None:
    text = PUBLIC_GOOD.replace('["review-*"]', "[]").replace(
        "[{issuer: https://accounts.google.com, identity: signer-a@example.com}]", "[]"
    )
    assert problems_of(text) == [
        (5, "spec.recipes", 'recipes needs at least one recipe name or glob, e.g. [review-responder, "team-*"]'),
        (7, "spec.signers",
         "signers needs at least one {issuer, identity or identityRegex}; without one nothing is trusted"),
    ]


def test_recipe_pattern_must_not_be_blank() -> None:
    [(line, field, message)] = problems_of(edit('["review-responder", "team-*"]', '["review-responder", ""]'))
    assert (line, field) == (5, "spec.recipes") and "non-empty name patterns" in message


@pytest.mark.parametrize(
    "trust_root, line, message",
    [
        ("{trustedRootFile: trust/demo-trusted-root.json, publicGood: true}", 6,
         "trustRoot needs exactly one of publicGood: true or trustedRootFile"),
        ("{}", 6, "trustRoot needs exactly one of publicGood: true or trustedRootFile"),
        ("{publicGood: false}", 6, "publicGood: false selects nothing; use publicGood: true or trustedRootFile"),
    ],
    ids=["both", "neither", "false"],
)
def test_trust_root_needs_exactly_one_source(trust_root: str, line: int, message: str) -> None:
    text = edit("  trustRoot:\n    trustedRootFile: trust/demo-trusted-root.json", f"  trustRoot: {trust_root}")
    assert problems_of(text) == [(line, "spec.trustRoot", message)]


@pytest.mark.parametrize("path", ["/etc/trusted_root.json", "trust/../../outside.json"])
def test_trusted_root_file_stays_inside_the_repository(path: str) -> None:
    [(line, field, message)] = problems_of(edit("trust/demo-trusted-root.json", path))
    assert (line, field) == (7, "spec.trustRoot.trustedRootFile")
    assert "relative to the spec repository root" in message


def test_public_good_must_be_a_boolean() -> None:
    [(line, field, message)] = problems_of(edit("{publicGood: true}", '{publicGood: "true"}', PUBLIC_GOOD))
    assert (line, field) == (6, "spec.trustRoot.publicGood")
    assert message.startswith("expected true or false")


def test_unknown_field_in_signer() -> None:
    problems = problems_of(edit("      identity: release@example.com", "      identty: release@example.com"))
    assert [(line, field) for line, field, _ in problems] == [(10, "spec.signers[0].identty")]
    assert "did you mean 'identity'?" in problems[0][2]


def test_load_recipe_rejects_a_trust_policy(tmp_path: Path) -> None:
    path = tmp_path / "workflow.yaml"
    path.write_text(POLICY)
    with pytest.raises(SpecError) as info:
        load_recipe(path)
    assert "found 0 Workflow and 1 other" in str(info.value)
