"""CODEOWNERS parsing and matching (reconciler/review/codeowners.py): pure, table-tested against the
examples of GitHub's documentation and GitLab's sections."""

from __future__ import annotations

import pytest
from plnt.reconciler.review.codeowners import CodeOwnersError, owners_of, parse

# GitHub's documented example, abridged (the owners of the last matching line win).
GITHUB = """\
# This is a comment.
*       @global-owner1 @global-owner2
*.js    @js-owner #This is an inline comment.
*.go docs@example.com
/build/logs/ @doctocat
docs/*  docs@example.com
apps/ @octocat
/docs/ @doctocat
/scripts/ @doctocat @octocat
**/logs @octocat
/apps/ @octocat
/apps/github
"""


@pytest.mark.parametrize(("path", "owners", "line"), [
    ("README.md", ("global-owner1", "global-owner2"), 2),
    ("src/app.js", ("js-owner",), 3),
    ("main.go", ("docs@example.com",), 4),
    ("build/logs/today.txt", ("octocat",), 10),       # `**/logs` comes later than `/build/logs/`
    ("docs/getting-started.md", ("doctocat",), 8),   # `/docs/` comes later than `docs/*`
    ("scripts/run.sh", ("doctocat", "octocat"), 9),
    ("deep/down/logs/x", ("octocat",), 10),
    ("apps/web/index.html", ("octocat",), 11),
    ("apps/github/anything", None, None),            # a rule with no owners: nobody needs to approve
])
def test_last_matching_rule_wins(path: str, owners: tuple[str, ...] | None, line: int | None) -> None:
    found = owners_of(parse(GITHUB), [path])
    if owners is None:
        assert found == []
    else:
        assert [(o.path, o.owners, o.rule.line) for o in found] == [(path, owners, line)]


def test_dir_star_is_the_files_directly_in_it_only() -> None:
    rules = parse("docs/*  @docs-team\n")
    assert [o.path for o in owners_of(rules, ["docs/a.md", "docs/sub/b.md", "x/docs/c.md"])] == ["docs/a.md"]


def test_a_name_without_slash_matches_anywhere_and_everything_under_it() -> None:
    rules = parse("workflowruns @runs\n/specs/prod/ @prod\n")
    paths = ["workflowruns/a.yaml", "team/workflowruns/b.yaml", "specs/prod/c.yaml", "other/specs/prod/d.yaml"]
    assert [(o.path, o.owners) for o in owners_of(rules, paths)] == [
        ("specs/prod/c.yaml", ("prod",)), ("team/workflowruns/b.yaml", ("runs",)), ("workflowruns/a.yaml", ("runs",))]


def test_gitlab_sections_each_need_their_owner_and_optional_ones_none() -> None:
    rules = parse("""\
* @maintainers
[Deploy] @acme/deployers
workflowruns/
[Docs]
*.md @writers
^[Nice to have]
* @someone
""")
    got = [(o.path, o.owners, o.rule.section) for o in owners_of(rules, ["workflowruns/r.yaml", "README.md"])]
    assert got == [("README.md", ("maintainers",), ""), ("README.md", ("writers",), "Docs"),
                   ("workflowruns/r.yaml", ("maintainers",), ""), ("workflowruns/r.yaml", ("acme/deployers",), "Deploy")]


@pytest.mark.parametrize("line", ["!secret.txt @a", "file[0-9].txt @a"])
def test_what_github_does_not_support_is_refused_not_guessed(line: str) -> None:
    with pytest.raises(CodeOwnersError, match="CODEOWNERS line 2: .*not supported"):
        parse(f"* @a\n{line}\n")


def test_escaped_hash_is_part_of_the_pattern() -> None:
    rules = parse("\\#notes.txt @a # comment\n")
    assert [(o.path, o.owners) for o in owners_of(rules, ["#notes.txt"])] == [("#notes.txt", ("a",))]
