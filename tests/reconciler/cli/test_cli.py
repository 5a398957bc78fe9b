"""The `plnt` command line (validate, plan, status), run in-process with typer's CliRunner against
real files, real git repositories and real state directories."""

from __future__ import annotations

import contextlib
import json
import re
import textwrap
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from click.testing import Result
from plnt.core.status import Phase
from plnt.reconciler.cli.main import app
from plnt.reconciler.drivers.processes import free_port
from plnt.reconciler.status_store import StatusStore
from typer.testing import CliRunner

from tests.conftest import EXAMPLE, SpecRepo
from tests.core.test_loader import LOOSE_POLICY

RUN_FILE = "workflowruns/review-responder.yaml"
PROBLEM_LINE = re.compile(r"^(?P<file>[^:]+):(?P<line>\d+): (?P<field>[^:]+): (?P<message>.+)$")


def plnt(*args: str | Path) -> Result:
    return CliRunner().invoke(app, [str(a) for a in args], catch_exceptions=False)


def write(root: Path, relative: str, text: str) -> None:
    target = root / relative
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(textwrap.dedent(text))


# --- validate ---------------------------------------------------------------------------------


def test_validate_example_repository_prints_a_one_line_summary() -> None:
    result = plnt("validate", EXAMPLE)
    assert result.exit_code == 0, result.output
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 1, result.stdout
    assert "valid" in lines[0]
    assert "1 WorkflowRun(s)" in lines[0] and "1 PlntBackend(s)" in lines[0] and "0 recipe Workflow(s)" in lines[0]
    assert result.stderr == ""


def test_validate_counts_model_deployments_and_checks_the_example_model() -> None:
    result = plnt("validate", EXAMPLE / "models" / "smollm2.yaml")
    assert result.exit_code == 0, result.output
    assert "1 ModelDeployment(s)" in result.stdout and "backend references not checked" in result.stdout


BACKEND = """\
    apiVersion: plnt.work/v1
    kind: PlntBackend
    metadata:
      name: local
    spec:
      type: local
    """

# Two files with problems, in a subdirectory, so the printed path must be DIR/runs/FILE.
FIRST = """\
    apiVersion: plnt.work/v1
    kind: WorkflowRun
    metadata:
      name: review-responder
    spec:
      workflow:
        ref: review-responder@1.2.0
        registry: file:registry
        colour: blue
      backend:
        cluster: local
    ---
    apiVersion: plnt.work/v1
    kind: WorkflowRun
    metadata:
      name: translator
    spec:
      workflow:
        ref: translator@1.0.0
        registry: file:registry
      backend:
        cluster: gpu-farm
    """

SECOND = """\
    apiVersion: plnt.work/v1
    kind: WorkflowRun
    metadata:
      name: summarizer
    spec:
      workflow:
        ref: summarizer@1.0.0
        registry: file:registry
      backend:
        cluster: local
        gpuClass: a100
    ---
    apiVersion: plnt.work/v1
    kind: WorkflowRun
    metadata:
      name: translator
    spec:
      workflow:
        ref: translator@2.0.0
        registry: file:registry
      backend:
        cluster: local
    ---
    apiVersion: plnt.work/v1
    kind: WorkflowRun
    metadata: {name: broken
    """


def test_validate_directory_prints_one_line_per_problem_and_exits_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    specs = tmp_path / "specs"
    write(specs, "backends.yaml", BACKEND)
    write(specs, "runs/first.yaml", FIRST)
    write(specs, "runs/second.yaml", SECOND)
    monkeypatch.chdir(tmp_path)

    result = plnt("validate", "specs")

    assert result.exit_code == 1, result.output
    lines = result.stdout.strip().splitlines()
    parsed = [PROBLEM_LINE.match(line) for line in lines]
    assert all(parsed), lines
    found = [(m["file"], int(m["line"]), m["field"]) for m in parsed if m]
    assert found == [
        ("specs/runs/first.yaml", 9, "spec.workflow.colour"),      # unknown field
        ("specs/runs/first.yaml", 22, "spec.backend.cluster"),     # unknown backend
        ("specs/runs/second.yaml", 11, "spec.backend.gpuClass"),   # GPU class the backend does not offer
        ("specs/runs/second.yaml", 16, "metadata.name"),           # duplicate WorkflowRun
        ("specs/runs/second.yaml", 26, "document"),                # malformed YAML
    ], result.stdout
    messages = [m["message"] for m in parsed if m]
    assert "unknown field" in messages[0]
    assert "gpu-farm" in messages[1]
    assert "a100" in messages[2]
    assert "duplicate WorkflowRun default/translator" in messages[3]
    assert "malformed YAML" in messages[4]
    assert "5 problems found" in result.stderr


def test_validate_nonexistent_path_exits_2(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    result = plnt("validate", missing)
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    assert str(missing) in result.stderr and "no such file or directory" in result.stderr


def test_validate_single_file(tmp_path: Path) -> None:
    good = tmp_path / "all-in-one.yaml"
    good.write_text(textwrap.dedent(BACKEND) + "---\n" + (EXAMPLE / RUN_FILE).read_text())
    result = plnt("validate", good)
    assert result.exit_code == 0, result.output
    assert "1 WorkflowRun(s), 1 PlntBackend(s)" in result.stdout

    bad = tmp_path / "bad.yaml"
    bad.write_text(textwrap.dedent(BACKEND).replace("type: local", "type: local\n  colour: blue"))
    result = plnt("validate", bad)
    assert result.exit_code == 1, result.output
    match = PROBLEM_LINE.match(result.stdout.strip())
    assert match, result.stdout
    assert (match["file"], int(match["line"]), match["field"]) == (str(bad), 7, "spec.colour")


def test_validate_single_file_that_is_not_utf8_is_a_problem_not_a_crash(tmp_path: Path) -> None:
    latin1 = tmp_path / "latin1.yaml"
    latin1.write_bytes(textwrap.dedent(BACKEND).replace("name: local", "name: caf\xe9").encode("latin-1"))
    result = plnt("validate", latin1)
    assert result.exit_code == 1, result.output
    # The line and column of the first byte that is not UTF-8: "  name: caf\xe9" is line 4.
    assert result.stdout.startswith(f"{latin1}:4: document: not UTF-8 text: byte 0xe9 at column 12 "), result.stdout
    assert "save the file as UTF-8" in result.stdout


ALIAS_BOMB = "a0: &a0 [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n" for i in range(1, 10))  # 9**10 values once expanded


def vm_hwm_mib() -> float:
    """Peak resident memory of this process (the CLI runs in it)."""
    line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith("VmHWM:"))
    return int(line.split()[1]) / 1024


@pytest.mark.parametrize("content, expected", [
    (b"apiVersion: plnt.work/v1\nkind: Plnt\0Backend\n", ":2: document: character U+0000 at column 11 is not allowed"),
    (b"apiVersion: plnt.work/v1\nkind: caf\xe9\n", ":2: document: not UTF-8 text: byte 0xe9 at column 10"),
    (b"a: " + b"[" * 5000 + b"]" * 5000, ":1: document: nested more than 64 levels deep (max_depth)"),
    (ALIAS_BOMB.encode(), ":5: document: aliases or merge keys expand this file to more than"),
    (b"# " + b"x" * (2 * 2**20) + b"\n", ":1: document: file is 2097155 bytes, over the limit of 1048576"),
], ids=["nul", "latin1", "deep", "alias-bomb", "2MiB"])
def test_validate_refuses_hostile_files_with_one_problem_line(tmp_path: Path, content: bytes, expected: str) -> None:
    hostile = tmp_path / "hostile.yaml"
    hostile.write_bytes(content)
    before = vm_hwm_mib()
    for target in (hostile, tmp_path):  # a file, and the directory holding it
        result = plnt("validate", target)
        assert result.exit_code == 1, result.output
        assert result.stdout.startswith(f"{hostile}{expected}"), result.stdout
        assert PROBLEM_LINE.match(result.stdout.splitlines()[0])
    assert vm_hwm_mib() - before < 200  # the 537-byte bomb of the issue took the PR check out of memory


def test_validate_spec_limits_can_be_raised(tmp_path: Path) -> None:
    for i in range(3):
        write(tmp_path, f"backends/b{i}.yaml", BACKEND.replace("name: local", f"name: b{i}"))
    result = plnt("validate", tmp_path, "--max-spec-files", "2")
    assert result.exit_code == 1 and "more than 2 spec files (limit max_files)" in result.stdout, result.output
    assert plnt("validate", tmp_path, "--max-spec-files", "3").exit_code == 0
    result = plnt("validate", tmp_path / "backends" / "b0.yaml", "--max-spec-file-kb", "1")
    assert result.exit_code == 0, result.output


@pytest.mark.integration  # git: the reconciler reads the same spec from a real commit
@pytest.mark.parametrize("registry", ["file:../x", "file://../x", "file:///a/../b"])
def test_a_registry_path_holding_dotdot_is_the_specs_line_in_validate_and_in_the_reconciler(
        spec_repo: SpecRepo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, registry: str) -> None:
    """Not "the commit's tree holds an entry named '..'": the spec's field, at its line, and what to do."""
    from plnt.reconciler.source.git import GitSource

    spec_repo.replace(RUN_FILE, "registry: file:registry", f"registry: {registry}")
    commit = spec_repo.commit("a registry path with ..")
    monkeypatch.chdir(spec_repo.path)
    result = plnt("validate", ".")
    assert result.exit_code == 1, result.output
    [line] = result.stdout.splitlines()
    match = PROBLEM_LINE.match(line)
    assert match and (match["file"], match["line"], match["field"]) == (RUN_FILE, "13", "spec.workflow.registry"), line
    assert match["message"].startswith(f"{registry!r}: a file registry path must not contain '..': name a directory "
                                       "inside the spec repository (file:registry) or under a directory plnt is "
                                       "started with --allow-file-registry DIR"), line
    # What the reconciler refuses the commit with (Reconciler: `str(problem)` of GitSource.load): the same line.
    source = GitSource(str(spec_repo.path), tmp_path / "clone")
    assert source.fetch() == commit
    _, problems = source.load(commit)
    assert [str(p) for p in problems] == [line]
    assert "tree holds" not in line


def test_validate_warns_about_a_loose_identity_regex_without_failing(tmp_path: Path) -> None:
    policy = tmp_path / "trust.yaml"
    policy.write_text(LOOSE_POLICY)
    result = plnt("validate", policy)
    assert result.exit_code == 0, result.output
    warning, summary = result.stdout.splitlines()
    match = PROBLEM_LINE.match(warning)
    assert match and (match["file"], match["line"], match["field"]) == (str(policy), "9", "spec.signers[0].identityRegex")
    assert match["message"].startswith("warning: an unescaped '.' in 'recipes@demo.plnt.invalid'")
    assert "'recipes@demoXplnt.invalid' is accepted too" in warning
    assert summary.startswith(f"{policy}: valid: ")
    # With a problem in another document, the exit code is the problem's; the warning is still printed.
    policy.write_text(policy.read_text() + "---\n" + textwrap.dedent(BACKEND) + "  colour: blue\n")
    result = plnt("validate", policy)
    assert result.exit_code == 1 and "warning: an unescaped '.'" in result.stdout and "spec.colour" in result.stdout


# --- plan -------------------------------------------------------------------------------------


def bump(spec_repo: SpecRepo, version: str) -> str:
    spec_repo.replace(RUN_FILE, "review-responder@1.2.0", f"review-responder@{version}")
    return spec_repo.commit(f"bump to {version}")


def test_plan_text_shows_the_upgrade_and_the_changed_field(spec_repo: SpecRepo) -> None:
    base = spec_repo.git("rev-parse", "HEAD")
    head = bump(spec_repo, "1.3.0")
    result = plnt("plan", "--repo", spec_repo.path, "--base", base, "--head", head)
    assert result.exit_code == 0, result.output
    assert re.search(r"^~ default/review-responder\s+upgrade\s+1\.2\.0 -> 1\.3\.0\s*$", result.stdout, re.M), result.stdout
    assert re.search(r"^\s+workflow\.ref: review-responder@1\.2\.0 -> review-responder@1\.3\.0$", result.stdout, re.M)
    assert f"{base[:12]}..{head[:12]}" in result.stdout
    assert "Plan: 0 to install, 1 to upgrade, 0 to uninstall, 0 unchanged." in result.stdout


def test_plan_json(spec_repo: SpecRepo) -> None:
    base = spec_repo.git("rev-parse", "HEAD")
    head = bump(spec_repo, "1.3.0")
    result = plnt("plan", "--repo", spec_repo.path, "--base", base, "--head", head, "--format", "json")
    assert result.exit_code == 0, result.output
    body = json.loads(result.stdout)
    assert (body["base"], body["head"]) == (base, head)
    [item] = body["items"]
    assert item["namespace"] == "default" and item["name"] == "review-responder"
    assert item["action"] == "upgrade"
    assert (item["fromVersion"], item["toVersion"]) == ("1.2.0", "1.3.0")
    assert item["changes"] == [{"field": "workflow.ref", "old": "review-responder@1.2.0", "new": "review-responder@1.3.0"}]
    assert "workflow.ref" in item["reason"]


def test_plan_markdown(spec_repo: SpecRepo) -> None:
    base = spec_repo.git("rev-parse", "HEAD")
    head = bump(spec_repo, "1.3.0")
    result = plnt("plan", "--repo", spec_repo.path, "--base", base, "--head", head, "-f", "markdown")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].startswith("### plnt plan")
    assert "Plan: 0 to install, 1 to upgrade, 0 to uninstall, 0 unchanged." in lines
    header = lines.index("| | WorkflowRun | Action | Version | Why |")
    assert lines[header + 1] == "|---|---|---|---|---|"
    row = lines[header + 2]
    assert "`default/review-responder`" in row and "**upgrade**" in row and "1.2.0 -> 1.3.0" in row
    assert "`workflow.ref`" in row


def test_plan_shows_install_for_an_added_workflowrun_and_uninstall_for_a_deleted_one(spec_repo: SpecRepo) -> None:
    original = spec_repo.git("rev-parse", "HEAD")
    text = (spec_repo.path / RUN_FILE).read_text()
    assert "name: review-responder\n" in text
    spec_repo.write("workflowruns/review-responder-eu.yaml", text.replace("name: review-responder\n", "name: review-responder-eu\n"))
    added = spec_repo.commit("add review-responder-eu")

    result = plnt("plan", "--repo", spec_repo.path, "--base", original, "--head", added, "-f", "json")
    assert result.exit_code == 0, result.output
    actions = {i["name"]: (i["action"], i["toVersion"]) for i in json.loads(result.stdout)["items"]}
    assert actions == {"review-responder": ("unchanged", "1.2.0"), "review-responder-eu": ("install", "1.2.0")}

    spec_repo.remove(RUN_FILE)
    removed = spec_repo.commit("remove review-responder")
    result = plnt("plan", "--repo", spec_repo.path, "--base", added, "--head", removed)
    assert result.exit_code == 0, result.output
    assert re.search(r"^- default/review-responder\s+uninstall\s+1\.2\.0\s*$", result.stdout, re.M), result.stdout
    assert re.search(r"^= default/review-responder-eu\s+unchanged", result.stdout, re.M), result.stdout
    assert "Plan: 0 to install, 0 to upgrade, 1 to uninstall, 1 unchanged." in result.stdout


def test_plan_shows_a_model_deployment_and_its_new_weights_pin(spec_repo: SpecRepo) -> None:
    base = spec_repo.git("rev-parse", "HEAD")
    model = (EXAMPLE / "models" / "smollm2.yaml").read_text()
    spec_repo.write("modeldeployments/smollm2.yaml", model)
    added = spec_repo.commit("smollm2")
    result = plnt("plan", "--repo", spec_repo.path, "--base", base, "--head", added, "-f", "json")
    assert result.exit_code == 0, result.output
    actions = {i["name"]: (i["action"], i["toVersion"]) for i in json.loads(result.stdout)["items"]}
    assert actions["smollm2"] == ("install", "1.0.0")

    spec_repo.write("modeldeployments/smollm2.yaml", re.sub(r'rootDigest: "sha256:[0-9a-f]{64}"',
                                                             'rootDigest: "sha256:' + "b" * 64 + '"', model))
    repinned = spec_repo.commit("smollm2 pinned to other weights")
    result = plnt("plan", "--repo", spec_repo.path, "--base", added, "--head", repinned)
    assert result.exit_code == 0, result.output
    assert re.search(r"^\s+model\.rootDigest: sha256:16399c.* -> sha256:bbbb", result.stdout, re.M), result.stdout


def test_plan_head_defaults_to_the_branch(spec_repo: SpecRepo) -> None:
    base = spec_repo.git("rev-parse", "HEAD")
    main = bump(spec_repo, "1.3.0")
    # The work tree moves to another branch with another commit: the plan still follows main.
    spec_repo.git("checkout", "-q", "-b", "feature")
    spec_repo.replace(RUN_FILE, "review-responder@1.3.0", "review-responder@1.4.0")
    spec_repo.commit("try 1.4.0 on a branch")

    result = plnt("plan", "--repo", spec_repo.path, "--base", base, "-f", "json")
    assert result.exit_code == 0, result.output
    body = json.loads(result.stdout)
    assert body["head"] == main
    assert [(i["action"], i["toVersion"]) for i in body["items"]] == [("upgrade", "1.3.0")]

    result = plnt("plan", "--repo", spec_repo.path, "--branch", "feature", "--base", base, "-f", "json")
    assert result.exit_code == 0, result.output
    assert [(i["action"], i["toVersion"]) for i in json.loads(result.stdout)["items"]] == [("upgrade", "1.4.0")]


def test_plan_invalid_head_exits_1_listing_the_problems(spec_repo: SpecRepo) -> None:
    base = spec_repo.git("rev-parse", "HEAD")
    spec_repo.replace(RUN_FILE, "cluster: local", "cluster: gpu-farm")
    spec_repo.replace(RUN_FILE, "trafficPercent: 5", "trafficPercent: 5\n    trafficPercnt: 6")
    head = spec_repo.commit("break the spec")

    result = plnt("plan", "--repo", spec_repo.path, "--base", base, "--head", head)

    assert result.exit_code == 1, result.output
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert f"commit {head[:12]} has invalid specs" in lines[0]
    problems = [PROBLEM_LINE.match(line) for line in lines[1:]]
    assert all(problems), lines
    assert [(m["file"], m["field"]) for m in problems if m] == [
        (RUN_FILE, "spec.canary.trafficPercnt"),
    ], lines
    # The unknown backend is only checked once the document is valid; fix the typo and it shows.
    spec_repo.replace(RUN_FILE, "\n    trafficPercnt: 6", "")
    head = spec_repo.commit("fix the typo")
    result = plnt("plan", "--repo", spec_repo.path, "--base", base, "--head", head)
    assert result.exit_code == 1, result.output
    assert f"{RUN_FILE}:15: spec.backend.cluster: unknown backend 'gpu-farm'" in result.stderr


def test_plan_bad_base_revision_exits_2(spec_repo: SpecRepo) -> None:
    result = plnt("plan", "--repo", spec_repo.path, "--base", "no-such-revision")
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    assert "no revision 'no-such-revision'" in result.stderr


def test_plan_against_an_empty_state_dir_installs(spec_repo: SpecRepo, tmp_path: Path) -> None:
    empty = tmp_path / "empty-state"
    empty.mkdir()
    result = plnt("plan", "--repo", spec_repo.path, "--state-dir", empty)
    assert result.exit_code == 0, result.output
    assert re.search(r"^\+ default/review-responder\s+install\s+1\.2\.0\s*$", result.stdout, re.M), result.stdout
    assert "Plan: 1 to install, 0 to upgrade, 0 to uninstall, 0 unchanged." in result.stdout


# --- status -----------------------------------------------------------------------------------


def unused_url() -> str:
    return f"http://127.0.0.1:{free_port()}"


def test_status_without_plnt_or_saved_status_exits_2(tmp_path: Path) -> None:
    url = unused_url()
    result = plnt("status", "--url", url, "--state-dir", tmp_path)
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    assert f"no plnt answers at {url}" in result.stderr and "is plnt up running?" in result.stderr


@pytest.fixture
def saved_state(tmp_path: Path) -> tuple[Path, dict]:
    state = tmp_path / "state"
    store = StatusStore(state / "status.json")
    status = store.update(
        "default", "review-responder", phase=Phase.READY, version="1.2.0", endpoint="http://127.0.0.1:40123",
        observed_commit="0123456789abcdef" * 2 + "01234567", message="serving 1.2.0", saga_id="saga-42",
    )
    return state, status.public()


def test_status_reads_the_state_dir_when_plnt_is_not_running(saved_state: tuple[Path, dict]) -> None:
    state, _ = saved_state
    result = plnt("status", "--url", unused_url(), "--state-dir", state)
    assert result.exit_code == 0, result.output
    assert f"showing the last status saved in {state}" in result.stderr
    header, row = result.stdout.strip().splitlines()
    assert header.split() == ["NAMESPACE/NAME", "PHASE", "VERSION", "CANARY", "COMMIT", "ENDPOINT", "MESSAGE"]
    assert row.split() == ["default/review-responder", "Ready", "1.2.0", "-", "0123456789ab", "http://127.0.0.1:40123",
                           "serving", "1.2.0"]


def test_status_json_has_the_shape_of_get_workflows(saved_state: tuple[Path, dict]) -> None:
    state, public = saved_state
    result = plnt("status", "--url", unused_url(), "--state-dir", state, "--json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert rows == [public]
    assert rows[0]["sagaId"] == "saga-42" and rows[0]["phase"] == "Ready"


@contextlib.contextmanager
def serve(body: bytes, content_type: str) -> Iterator[str]:
    """An HTTP server on 127.0.0.1 answering GET /workflows with body (404 elsewhere); yields its URL."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            if self.path != "/workflows":
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.mark.integration
def test_status_asks_the_gateway_first(saved_state: tuple[Path, dict]) -> None:
    """`serve` (an http.server thread on 127.0.0.1) stands in for a running plnt's gateway."""
    state, public = saved_state
    live = {**public, "phase": "Canary", "canaryVersion": "1.3.0", "canaryPercent": 5, "message": "smoke test"}
    with serve(json.dumps([live]).encode(), "application/json") as url:
        result = plnt("status", "--url", url, "--state-dir", state)
    assert result.exit_code == 0, result.output
    assert "no plnt answers" not in result.stderr
    [row] = [line.split() for line in result.stdout.splitlines() if line.startswith("default/")]
    assert row[:5] == ["default/review-responder", "Canary", "1.2.0", "1.3.0", "5%"], result.stdout


@pytest.mark.integration
def test_status_shows_a_stepped_canarys_step(saved_state: tuple[Path, dict]) -> None:
    state, public = saved_state
    live = {**public, "phase": "Canary", "canaryVersion": "1.3.0", "canaryPercent": 25, "canaryStep": 2,
            "canarySteps": 3, "message": "step 2/3: smoke-testing canary 1.3.0 with 25% of traffic"}
    with serve(json.dumps([live]).encode(), "application/json") as url:
        result = plnt("status", "--url", url, "--state-dir", state)
    assert result.exit_code == 0, result.output
    [row] = [line.split() for line in result.stdout.splitlines() if line.startswith("default/")]
    assert row[:6] == ["default/review-responder", "Canary", "1.2.0", "1.3.0", "25%", "2/3"], result.stdout


@pytest.mark.integration
def test_status_says_when_a_runner_is_parked(saved_state: tuple[Path, dict]) -> None:
    """Scale to zero: a Ready WorkflowRun whose runner parked (GET /workflows `parked: true`)."""
    state, public = saved_state
    live = {**public, "phase": "Ready", "message": "in sync", "parked": True}
    with serve(json.dumps([live]).encode(), "application/json") as url:
        result = plnt("status", "--url", url, "--state-dir", state)
    assert result.exit_code == 0, result.output
    [line] = [line for line in result.stdout.splitlines() if line.startswith("default/")]
    assert line.endswith("parked: the next request starts it; in sync"), result.stdout


@pytest.mark.integration
@pytest.mark.parametrize(("body", "content_type"), [(b"<html>not plnt</html>", "text/html"),
                                                    (b'{"detail": "Not Found"}', "application/json")],
                         ids=["html", "other-json"])
def test_status_falls_back_to_the_state_dir_when_something_else_answers(
    saved_state: tuple[Path, dict], body: bytes, content_type: str
) -> None:
    """`serve` (an http.server thread on 127.0.0.1) stands in for some other HTTP service on plnt's port."""
    state, _ = saved_state
    with serve(body, content_type) as url:
        result = plnt("status", "--url", url, "--state-dir", state)
    assert result.exit_code == 0, result.output
    assert f"no plnt answers at {url}; showing the last status saved in {state}" in result.stderr
    assert any(line.split()[:3] == ["default/review-responder", "Ready", "1.2.0"] for line in result.stdout.splitlines())
