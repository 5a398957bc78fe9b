"""README.md and docs/*.md say what the code does: their specs validate, their links resolve.

Real, no stand-ins: every check reads the documents as they are and runs the real `plnt` as a
subprocess.

1. Every ```yaml block that holds a plnt resource is checked with `plnt validate`. A block holds a
   resource when it has a top-level `apiVersion: plnt.work/v1` line and a top-level `kind:` line
   naming WorkflowRun, ModelDeployment, PlntBackend, RecipeTrustPolicy or GatewayPolicy. Every other block is a
   fragment (a recipe's workflow.yaml, part of a spec, a values file) and is skipped: that is the
   whole rule. The block goes into a copy of gitops-example: it replaces the file holding a spec
   of the same kind, name and namespace, or else is added as a new file, so that the names it
   refers to (the `local` backend, the example's registry and trust policies) resolve. An elided
   digest in a block (`sha256:9a1b...`) is padded with zeros to a full one first: the documents
   shorten digests for reading. A block marked with an HTML comment just before it,
   `<!-- invalid: WHAT IT SHOWS -->`, is a deliberate error and must make `plnt validate` exit 1;
   every other one must make it exit 0.
2. Every relative link points to a file that exists, and every `#anchor` to a heading of the
   target (GitHub's slugs: lower case, punctuation other than '-' and '_' dropped, spaces to '-',
   a repeated heading gets -1, -2, ...).
3. README.md stays short: at most 200 lines.
4. `plnt --help` lists every command that the CLI reference in docs/operations.md names, and
   `plnt COMMAND --help` every option its rows give that command.
5. Every `plnt` command line in a ```sh block (the commands the documents tell you to run) names a
   real command, and every `--option` on it is one that command's `--help` lists.
"""
import functools
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
EXAMPLE = ROOT / "gitops-example"
PLNT = [sys.executable, "-m", "plnt.reconciler.cli"]

RESOURCE_KINDS = ("WorkflowRun", "ModelDeployment", "PlntBackend", "RecipeTrustPolicy", "GatewayPolicy")
INVALID_MARK = re.compile(r"^<!--\s*invalid:.*-->\s*$")
FENCE = re.compile(r"^(\s*)(```+|~~~+)\s*([\w+-]*)")


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def code_blocks(text: str):
    """(info string, first line number, body, the non-blank line before the fence) of each fenced block."""
    lines = text.split("\n")
    blocks, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, info = m.groups()
        before = next((lines[j].strip() for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        body, j = [], i + 1
        while j < len(lines) and not lines[j].strip().startswith(fence[:3]):
            body.append(lines[j][len(indent):] if lines[j].startswith(indent) else lines[j])
            j += 1
        blocks.append((info.lower(), i + 1, "\n".join(body) + "\n", before))
        i = j + 1
    return blocks


def prose_lines(text: str):
    """(line number, line) of every line outside fenced blocks."""
    fence = None
    for n, line in enumerate(text.split("\n"), 1):
        m = FENCE.match(line)
        if m and fence is None:
            fence = m.group(2)[:3]
        elif fence is not None and line.strip().startswith(fence):
            fence = None
        elif fence is None:
            yield n, line


def is_resource(body: str) -> bool:
    return (re.search(r"^apiVersion:\s*plnt\.work/v1\s*$", body, re.M) is not None
            and re.search(rf"^kind:\s*({'|'.join(RESOURCE_KINDS)})\s*(#.*)?$", body, re.M) is not None)


def yaml_resources():
    found = []
    for doc in DOCS:
        for info, line, body, before in code_blocks(doc.read_text()):
            if info in ("yaml", "yml") and is_resource(body):
                found.append(pytest.param(body, bool(INVALID_MARK.match(before)), id=f"{rel(doc)}:{line}"))
    return found


def full_digests(body: str) -> str:
    return re.sub(r"sha256:([0-9a-f]+)\.\.\.", lambda m: "sha256:" + m.group(1).ljust(64, "0"), body)


def identity(doc: dict):
    meta = doc.get("metadata") or {}
    return doc.get("kind"), meta.get("name"), meta.get("namespace")


def put_into(repo: Path, body: str) -> Path:
    """Write body into the copy of the example: over the file of the same spec, else as a new file."""
    wanted = {identity(d) for d in yaml.safe_load_all(body) if isinstance(d, dict)}
    for path in sorted(repo.rglob("*.yaml")):
        try:
            docs = [d for d in yaml.safe_load_all(path.read_text()) if isinstance(d, dict)]
        except yaml.YAMLError:
            continue
        if any(identity(d) in wanted for d in docs):
            path.write_text(body)
            return path
    path = repo / "from-docs.yaml"
    path.write_text(body)
    return path


def plnt(*args, cwd=ROOT):
    return subprocess.run([*PLNT, *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_the_docs_hold_yaml_resources():
    """The rule of test 1 finds the resources the documents show (a broken rule would skip them all)."""
    assert len(yaml_resources()) >= 4


@pytest.mark.integration
@pytest.mark.parametrize(("body", "invalid"), yaml_resources())
def test_yaml_resource_validates(tmp_path, body, invalid):
    repo = tmp_path / "repo"
    shutil.copytree(EXAMPLE, repo)
    path = put_into(repo, full_digests(body))
    result = plnt("validate", str(repo))
    shown = f"{path.relative_to(repo)}:\n{body}\nplnt validate said:\n{result.stdout}{result.stderr}"
    if invalid:
        assert result.returncode == 1, "marked invalid, but " + shown
        assert re.search(r"^\S+:\d+: ", result.stdout + result.stderr, re.M), shown
    else:
        assert result.returncode == 0, shown


def slug(heading: str) -> str:
    text = re.sub(r"<[^>]+>", "", heading.strip().lower())
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set:
    seen, found = {}, set()
    for _, line in prose_lines(path.read_text()):
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        base = slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


LINK = re.compile(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def links():
    found = []
    for doc in DOCS:
        for n, line in prose_lines(doc.read_text()):
            for target in LINK.findall(re.sub(r"`[^`]*`", "", line)):
                if not re.match(r"[a-z][a-z0-9+.-]*:", target):
                    found.append(pytest.param(doc, target, id=f"{rel(doc)}:{n}:{target}"))
    return found


@pytest.mark.parametrize(("doc", "target"), links())
def test_relative_link_resolves(doc, target):
    file, _, anchor = target.partition("#")
    path = (doc.parent / file).resolve() if file else doc
    assert path.exists(), f"{rel(doc)} links to {target}: no such file"
    if anchor:
        assert path.suffix == ".md", f"{rel(doc)} links to an anchor in {file}, not a markdown file"
        assert anchor in anchors(path), f"{rel(doc)} links to {target}: {rel(path)} has no heading with that slug"


def test_readme_is_short():
    lines = (ROOT / "README.md").read_text().count("\n")
    assert lines <= 200, f"README.md has {lines} lines; move the detail to docs/"


@pytest.mark.integration
def test_every_command_of_the_cli_reference_is_in_plnt_help():
    text = (ROOT / "docs" / "operations.md").read_text()
    section = text.split("## CLI reference", 1)[1].split("\n## ", 1)[0]
    named = set()
    for row in re.findall(r"^\| `plnt ([^`]+)`", section, re.M):
        for word in re.match(r"([a-z/]+)", row).group(1).split("/"):
            named.add(word)
    assert {"up", "validate", "plan", "gateway", "reconcile", "worker"} <= named, named
    result = plnt("--help")
    assert result.returncode == 0, result.stderr
    listed = set(re.findall(r"^\W*([a-z][a-z-]*)\s{2,}", result.stdout, re.M))
    assert named <= listed, f"named in docs/operations.md but not in plnt --help: {sorted(named - listed)}"


HELP_ENV = {"COLUMNS": "300", "PATH": "/usr/bin:/bin", "NO_COLOR": "1"}


@functools.cache
def options_of(command: tuple) -> frozenset:
    """The --options that `plnt COMMAND --help` lists (empty when the command does not exist)."""
    result = subprocess.run([*PLNT, *command, "--help"], cwd=ROOT, capture_output=True, text=True,
                            timeout=60, env=HELP_ENV)
    return frozenset(re.findall(r"--[a-z][a-z0-9-]*", result.stdout)) if result.returncode == 0 else frozenset()


def command_key(words: str) -> list:
    """`up/reconcile ...` -> [("up",), ("reconcile",)]; `recipe pack ...` -> [("recipe", "pack")];
    `rollout pause\\|resume ...` -> [("rollout", "pause")] (the commands of a group share their options)."""
    m = re.match(r"([a-z/]+)(?:\s+([a-z]+))?", words)
    return [(name, m.group(2)) if name in ("recipe", "model", "rollout") and m.group(2) else (name,)
            for name in m.group(1).split("/")]


def option_words(text: str) -> list:
    return re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", text)


@pytest.mark.integration
def test_every_option_of_the_cli_reference_is_in_its_command_help():
    text = (ROOT / "docs" / "operations.md").read_text()
    section = text.split("## CLI reference", 1)[1].split("\n## ", 1)[0]
    wrong, checked = [], 0
    for row in re.findall(r"^\| (`plnt .*?) \| ", section, re.M):
        for cell in re.findall(r"`plnt ([^`]+)`", row):
            for command in command_key(cell):
                known = options_of(command)
                for option in option_words(cell):
                    checked += 1
                    if option not in known:
                        wrong.append(f"plnt {' '.join(command)} {option}")
    assert checked > 100, checked
    assert not wrong, f"docs/operations.md names options that plnt's --help does not list: {wrong}"


def shell_commands():
    found = []
    for doc in DOCS:
        for info, line, body, _ in code_blocks(doc.read_text()):
            if info not in ("sh", "bash", "shell", "console"):
                continue
            for command in re.sub(r"\\\n", " ", body).split("\n"):
                command = command.split(" #")[0]
                m = re.match(r"^\s*(?:\$ )?(?:[A-Z_]+=\S+\s+)*(?:\.venv/bin/)?plnt\s+(.*)", command)
                if m:
                    found.append(pytest.param(m.group(1), id=f"{rel(doc)}:{line}:plnt {m.group(1)[:40]}"))
    return found


@pytest.mark.integration
@pytest.mark.parametrize("words", shell_commands())
def test_shell_command_names_real_options(words):
    for command in command_key(words):
        known = options_of(command)
        assert known, f"plnt {' '.join(command)}: no such command"
        unknown = [option for option in option_words(words) if option not in known]
        assert not unknown, f"plnt {words}: plnt {' '.join(command)} --help does not list {unknown}"
