"""CODEOWNERS for `--require-approval --code-owners`: which owners must approve the files a pull
request changes. Pure: parsing and matching only (approval.py reads the file and the changed paths).

The file is read from the tracked branch as it was before the pull request (the first parent of
the commit judged), as GitHub reads it from the base branch: a pull request that edits CODEOWNERS
does not choose its own owners. Places looked at, first found wins: .github/, .gitlab/, .gitea/,
the root, docs/.

Syntax (GitHub's, with GitLab's sections):
- one rule a line: a pattern, then owners (`@user`, `@org/team` or `@group/subgroup`, an e-mail);
  `#` starts a comment; a pattern with no owners makes its files need no owner;
- patterns as in .gitignore: `*` within a path segment, `**` across, `?` one character; a leading
  `/` or a `/` inside anchors the pattern at the root; `dir/` is every file under dir; `docs/*` the
  files directly in docs only (GitHub);
- the LAST matching rule wins;
- GitLab `[Section]` headers: the last matching rule of each section applies, and each section with
  one needs its own owner's approval; an optional section (`^[Section]`) needs none; an approval
  count (`[Section][2]`) is read as one.

Refused (the commit is held, naming the line): negation (`!`), character classes (`[...]`), which
GitHub does not support either; an owner plnt cannot check (an e-mail) never matches a reviewer.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict

# Where each forge looks, first found wins.
LOCATIONS = (".github/CODEOWNERS", ".gitlab/CODEOWNERS", ".gitea/CODEOWNERS", "CODEOWNERS", "docs/CODEOWNERS")
# GitHub ignores a CODEOWNERS file over 3 MB; plnt refuses to read one (the commit is held).
MAX_BYTES = 3 * 2**20

_SECTION = re.compile(r"^(\^)?\[([^\]]+)\](?:\[(\d+)\])?(?:\s+(.*))?$")


class CodeOwnersError(ValueError):
    """A CODEOWNERS line plnt cannot read the way the forge would: it is not guessed at."""


class Rule(BaseModel):
    model_config = ConfigDict(frozen=True)

    line: int
    pattern: str
    owners: tuple[str, ...]  # without the "@": "alice", "acme/deployers"; e-mails as written
    section: str = ""        # GitLab section ("" outside any)
    regex: str


class Owners(BaseModel):
    """The owners one file needs in one section, and the rule that says so."""

    model_config = ConfigDict(frozen=True)

    path: str
    owners: tuple[str, ...]
    rule: Rule


def _regex(pattern: str, line: int) -> str:
    if pattern.startswith("!") or "[" in pattern or "]" in pattern:
        raise CodeOwnersError(f"CODEOWNERS line {line}: {pattern!r}: negation and character classes are not "
                              "supported (GitHub does not support them either); write the paths out")
    anchored = pattern.startswith("/") or "/" in pattern.rstrip("/")
    directory = pattern.endswith("/")
    body = pattern.strip("/")
    out = ""
    i = 0
    while i < len(body):
        if body.startswith("**/", i):
            out += "(?:.*/)?"
            i += 3
        elif body.startswith("**", i):
            out += ".*"
            i += 2
        elif body[i] == "*":
            out += "[^/]*"
            i += 1
        elif body[i] == "?":
            out += "[^/]"
            i += 1
        else:
            out += re.escape(body[i])
            i += 1
    # A name matches the file or the directory of that name (everything under it), except
    # `dir/*`: the files directly in dir only, as GitHub documents.
    under = "" if (body.endswith("/*") or body == "*") and not directory else "(?:/.*)?"
    return ("" if anchored else "(?:.*/)?") + out + under


def _owners(words: Iterable[str]) -> tuple[str, ...]:
    return tuple(w.removeprefix("@") for w in words)


def parse(text: str) -> list[Rule]:
    """The rules of a CODEOWNERS file, in order. Raises CodeOwnersError for a line plnt would read
    otherwise than the forge."""
    rules: list[Rule] = []
    section, optional = "", False
    section_owners: tuple[str, ...] = ()  # GitLab: a section header's owners, for its rules that name none
    for number, raw in enumerate(text.splitlines(), 1):
        line = re.sub(r"(?<!\\)#.*$", "", raw).strip()
        if not line:
            continue
        header = _SECTION.match(line)
        if header is not None:
            optional, section = bool(header.group(1)), header.group(2).strip()
            section_owners = _owners((header.group(4) or "").split())
            continue
        if optional:
            continue  # GitLab: an optional section's owners need not approve
        pattern, *owners = line.split()
        pattern = pattern.replace("\\#", "#").replace("\\ ", " ")
        rules.append(Rule(line=number, pattern=pattern, owners=_owners(owners) or (section_owners if section else ()),
                          section=section, regex=_regex(pattern, number)))
    return rules


def owners_of(rules: list[Rule], paths: Iterable[str]) -> list[Owners]:
    """For each path and section, the owners of the last matching rule (none when it names none)."""
    compiled = [(rule, re.compile(rule.regex)) for rule in rules]
    out: list[Owners] = []
    for path in sorted(set(paths)):
        last: dict[str, Rule] = {}
        for rule, regex in compiled:
            if regex.fullmatch(path):
                last[rule.section] = rule
        out += [Owners(path=path, owners=rule.owners, rule=rule) for rule in last.values() if rule.owners]
    return out
