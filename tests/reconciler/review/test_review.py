"""`plnt review` (reconciler/review/plan_review.py, reconciler/cli/review.py): real git repositories (the
`spec_repo` fixture, pull request branches), real signed recipes from the example registry, pulled
and verified; the command run in-process through typer's CliRunner, or as its CI job runs it (the
shell step of action.yml, the GitLab job's script) in a subprocess. The forges are the DECLARED
stand-in (tests/forge_standin.py), not a live GitHub, GitLab or Gitea."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from plnt.core.specs.loader import load_sources
from plnt.reconciler.cli.main import app
from plnt.reconciler.plan.diff import Action, PlanItem, plan
from plnt.reconciler.plan.digest import PlanEvidence, RecipeEvidence, digest_of, in_description, recipe_evidence, short
from plnt.reconciler.recipes.pull import RecipeCache
from plnt.reconciler.recipes.registries import RegistryOptions
from plnt.reconciler.review.forge import marker_tag
from plnt.reconciler.review.plan_review import Review, as_live, counts, desired_runs, render_comment, status_of
from plnt.reconciler.source.git import GitSource
from typer.testing import CliRunner, Result

from tests.conftest import GIT_ENV, ROOT, SpecRepo
from tests.forge_standin import ForgeStandin

RUN_FILE = "workflowruns/review-responder.yaml"
TOKEN = "ghp_review-token-value-123456"
KINDS = ["github", "gitlab", "gitea"]
PLNT = Path(sys.executable).with_name("plnt")


# --- pure: status and counts (no I/O; a Review built by hand) ---------------------------------------


def _review(items: list[PlanItem], spec_problems: list[str] = (), recipe_problems: list[str] = ()) -> Review:  # type: ignore[assignment]
    evidence = PlanEvidence(problems=list(recipe_problems))
    return Review(base_tip="b" * 40, merge_base="m" * 40, head="h" * 40, items=items,
                  spec_problems=list(spec_problems), evidence=evidence)


UP = PlanItem("default", "app", Action.UPGRADE, "x")
NEW = PlanItem("default", "new", Action.INSTALL, "x")
SAME = PlanItem("default", "same", Action.UNCHANGED, "x")


@pytest.mark.parametrize(("items", "want"), [
    ([], "no changes"), ([SAME], "no changes"), ([UP], "1 to upgrade"), ([NEW, UP, SAME], "1 to install, 1 to upgrade"),
    ([PlanItem("d", "x", Action.UNINSTALL, "gone")] * 2, "2 to uninstall"),
])
def test_counts(items: list[PlanItem], want: str) -> None:
    assert counts(items) == want


@pytest.mark.parametrize(("review", "state", "pattern", "digest"), [
    (_review([UP]), "success", r"plan sha256:[0-9a-f]{12}: 1 to upgrade", True),
    (_review([]), "success", r"plan sha256:[0-9a-f]{12}: no changes", True),
    (_review([], spec_problems=["a.yaml:3: spec: bad", "b.yaml:1: kind: bad"]), "failure", r"plan invalid: 2 problems", False),
    (_review([UP], recipe_problems=["default/app: recipe app@1: VerificationFailed"]), "failure",
     r"plan blocked: 1 recipe problem \(default/app\)", False),
    (_review([UP, PlanItem("default", "big", Action.INSTALL, "x", unplaceable="needs 1 more GPU of class a100: a has 0 free",
                           placement=("cannot be placed: needs 1 more GPU of class a100: a has 0 free",))]),
     "failure", r"plan blocked: 1 cannot be placed \(default/big\)", False),
    # An unchanged release that would not fit any more keeps running: it blocks nothing.
    (_review([UP, PlanItem("default", "old", Action.UNCHANGED, "in sync", unplaceable="needs 1 more replica slot")]),
     "success", r"plan sha256:[0-9a-f]{12}: 1 to upgrade", True),
])
def test_status_of(review: Review, state: str, pattern: str, digest: bool) -> None:
    """A failure carries no digest: nothing may approve a plan that cannot be made."""
    got_state, description = status_of(review)
    assert got_state == state and re.fullmatch(pattern, description), description
    assert (in_description(description) is not None) is digest
    if digest:
        assert in_description(description) == short(review.digest or "")
    assert ("Approving means" in render_comment(review)) is digest
    assert ("#### Blocked: 1 cannot be placed" in render_comment(review)) is ("cannot be placed" in description)


# --- the real thing: git, recipes, the forge stand-in ---------------------------------------------


@pytest.fixture(params=KINDS)
def standin(request: pytest.FixtureRequest) -> Iterator[ForgeStandin]:
    project = "group/sub/specs" if request.param == "gitlab" else "owner/specs"
    with ForgeStandin(request.param, project, TOKEN, page_size=3) as s:
        yield s


def pr_branch(repo: SpecRepo, version: str = "1.3.0", branch: str = "pr") -> str:
    repo.git("checkout", "-q", "-b", branch)
    repo.replace(RUN_FILE, "review-responder@1.2.0", f"review-responder@{version}")
    return repo.commit(f"review-responder {version}")


def review_cli(repo: SpecRepo | Path | str, *args: Any, base: str = "main", head: str = "pr",
               forge: ForgeStandin | None = None, pr: int = 7, env: dict[str, str] | None = None) -> Result:
    argv = ["review", "--repo", str(getattr(repo, "path", repo)), "--base", base, "--head", head]
    if forge is not None:
        argv += ["--forge", forge.kind, "--api-url", forge.api_url, "--project", forge.project, "--pr", str(pr),
                 "--token-env", "PLNT_TEST_FORGE_TOKEN"]
    return CliRunner().invoke(app, argv + [str(a) for a in args], catch_exceptions=False,
                              env={"PLNT_TEST_FORGE_TOKEN": TOKEN, **(env or {})})


def comments(s: ForgeStandin, pr: int = 7) -> list[str]:
    return [c["body"] for c in s.comments.get(pr, []) if "plnt:plan" in c["body"]]


def statuses(s: ForgeStandin, sha: str) -> list[tuple[str, str]]:
    """(state, description) of every plnt/plan status posted on sha, oldest first, in plnt's state names."""
    back = {"failed": "failure"}
    return [(back.get(st.get("state") or st.get("status"), st.get("state") or st.get("status")), st["description"])
            for st in s.statuses if st["sha"] == sha and (st.get("context") or st.get("name")) == "plnt/plan"]


def recomputed_digest(repo: SpecRepo, base: str, head: str, tmp: Path) -> str:
    """The digest as the reconciler computes it for a commit: from plan_digest and plan, not review.py."""
    source = GitSource(str(repo.path), tmp / "clone")
    head_sha, base_sha = source.resolve(head), source.resolve(base)
    head_specs, problems = load_sources(source.spec_files(head_sha))
    assert not problems
    base_specs, _ = load_sources(source.spec_files(base_sha))
    desired = desired_runs(head_specs)
    items = plan(desired, as_live(desired_runs(base_specs)))
    evidence = recipe_evidence(items, head_specs, commit=head_sha, cache=RecipeCache(tmp / "cache"),
                               read_from_repo=source.read_file, export_from_repo=source.export,
                               registry_options=RegistryOptions())
    assert not evidence.problems
    return digest_of(items, desired, evidence.recipes)


@pytest.mark.integration
def test_one_comment_after_two_pushes_and_the_digest_round_trip(spec_repo: SpecRepo, standin: ForgeStandin,
                                                               tmp_path: Path) -> None:
    base = spec_repo.git("rev-parse", "main")
    standin.add_comment(7, "LGTM from a human")
    first = pr_branch(spec_repo)
    r1 = review_cli(spec_repo, forge=standin)
    assert r1.exit_code == 0, r1.output
    spec_repo.replace(RUN_FILE, "trafficPercent: 5", "trafficPercent: 10")
    second = spec_repo.commit("canary 10%")
    r2 = review_cli(spec_repo, forge=standin)
    assert r2.exit_code == 0, r2.output

    ours = comments(standin)
    assert len(ours) == 1, ours  # updated in place, never a second comment
    assert len(standin.comments[7]) == 2 and "LGTM from a human" in standin.comments[7][0]["body"]
    body = ours[0]
    assert marker_tag("plnt:plan:1") in body and second in body and first not in body
    assert "1.2.0 -> 1.3.0" in body and "`canary.trafficPercent`: 5 → 10" in body
    assert "recipes@demo.plnt.invalid (https://issuer.demo.plnt.invalid)" in body  # signer of the recipe
    assert f"`{base}` (merge base" in body

    want = recomputed_digest(spec_repo, base, second, tmp_path)
    assert f"`{want}`" in body
    [(state, description)] = statuses(standin, second)
    assert state == "success" and description == f"plan {short(want)}: 1 to upgrade"
    assert in_description(description) == short(want)  # what --require-approval reads back
    [(state1, description1)] = statuses(standin, first)
    assert state1 == "success" and in_description(description1) != short(want)  # another plan, another digest
    assert TOKEN not in r1.output + r2.output


@pytest.mark.integration
def test_without_forge_prints_the_comment_and_the_digest(spec_repo: SpecRepo, tmp_path: Path) -> None:
    base = spec_repo.git("rev-parse", "main")
    head = pr_branch(spec_repo)
    result = review_cli(spec_repo)
    assert result.exit_code == 0, result.output
    want = recomputed_digest(spec_repo, base, head, tmp_path)
    assert result.stdout.startswith(f"### plnt plan {base[:12]}..{head[:12]}") and want in result.stdout
    assert want in result.stderr and "plnt/plan: success" in result.stderr
    as_json = json.loads(review_cli(spec_repo, "--format", "json").stdout)
    assert as_json["digest"] == want and as_json["mergeBase"] == base and as_json["head"] == head
    assert as_json["recipes"]["default/review-responder"]["ref"] == "review-responder@1.3.0"


@pytest.mark.integration
@pytest.mark.parametrize("kind", ["github", "gitea"])
def test_a_long_plan_is_split_into_parts_updated_in_place(spec_repo: SpecRepo, kind: str) -> None:
    """200 new WorkflowRuns: a plan over GitHub's 65,536-char comment limit, in parts; a shorter plan
    pushed next deletes the parts it no longer needs."""
    run = (spec_repo.path / RUN_FILE).read_text()
    spec_repo.git("checkout", "-q", "-b", "pr")
    for i in range(200):
        name = f"review-responder-for-the-{i:03d}th-storefront-of-the-brand"
        spec_repo.write(f"workflowruns/many/{i:03d}.yaml", run.replace("name: review-responder\n", f"name: {name}\n"))
    spec_repo.commit("200 storefronts")
    with ForgeStandin(kind, "owner/specs", TOKEN, page_size=50) as s:
        result = review_cli(spec_repo, forge=s)
        assert result.exit_code == 0, result.stderr
        parts = comments(s)
        assert len(parts) >= 2 and all(len(p) <= 65_536 for p in parts)
        assert parts[0].count("(part 1/") == 1 and "200 to install" in statuses(s, spec_repo.git("rev-parse", "pr"))[0][1]
        for i in range(100, 200):
            spec_repo.remove(f"workflowruns/many/{i:03d}.yaml")
        spec_repo.commit("only 100")
        assert review_cli(spec_repo, forge=s).exit_code == 0
        fewer = comments(s)
        assert 1 <= len(fewer) < len(parts)
        assert "100 to install" in "".join(fewer) and "-storefront-of-the-brand" in fewer[0]


@pytest.mark.integration
def test_invalid_spec_fails_with_the_problems(spec_repo: SpecRepo, standin: ForgeStandin) -> None:
    pr_branch(spec_repo)
    spec_repo.replace(RUN_FILE, "trafficPercent: 5", "trafficPercent: 500")
    head = spec_repo.commit("too much canary")
    result = review_cli(spec_repo, forge=standin)
    assert result.exit_code == 1, result.output
    [(state, description)] = statuses(standin, head)
    assert state == "failure" and description == "plan invalid: 1 problem" and in_description(description) is None
    [body] = comments(standin)
    assert re.search(r"workflowruns/review-responder\.yaml:\d+: spec\.canary\.trafficPercent: ", body), body
    assert "Approving means" not in body and "none: the plan cannot be made" in body


@pytest.mark.integration
def test_unsigned_recipe_blocks_the_plan_naming_it(spec_repo: SpecRepo, standin: ForgeStandin) -> None:
    """1.5.0's Sigstore bundle removed on the branch: the recipe is unsigned, as the saga would find it."""
    pr_branch(spec_repo, "1.5.0")
    spec_repo.remove("registry/review-responder/1.5.0/recipe.tar.gz.sigstore.json")
    head = spec_repo.commit("1.5.0, unsigned")
    result = review_cli(spec_repo, forge=standin)
    assert result.exit_code == 1, result.output
    [(state, description)] = statuses(standin, head)
    assert state == "failure" and description == "plan blocked: 1 recipe problem (default/review-responder)"
    [body] = comments(standin)
    assert "cannot be trusted" in body and "default/review-responder: recipe review-responder@1.5.0" in body
    assert re.search(r"unsigned|no signature|bundle", body, re.I), body
    assert "Approving means" not in body


@pytest.mark.integration
def test_recipe_under_another_signature_blocks_the_plan(spec_repo: SpecRepo) -> None:
    """1.3.0's archive with 1.2.0's bundle: a signature that does not cover the archive."""
    pr_branch(spec_repo)
    registry = spec_repo.path / "registry/review-responder"
    (registry / "1.3.0/recipe.tar.gz.sigstore.json").write_bytes((registry / "1.2.0/recipe.tar.gz.sigstore.json").read_bytes())
    spec_repo.commit("1.3.0 with another signature")
    result = review_cli(spec_repo, "--format", "json")
    assert result.exit_code == 1
    out = json.loads(result.stdout)
    assert out["digest"] is None and out["state"] == "failure"
    assert [p.split(":", 1)[0] for p in out["problems"]] == ["default/review-responder"]


@pytest.mark.integration
@pytest.mark.parametrize("deny", [None, "comment", "status"])
def test_forge_refusing_the_token_exits_3_without_the_token(spec_repo: SpecRepo, standin: ForgeStandin,
                                                           deny: str | None) -> None:
    pr_branch(spec_repo)
    if deny is None:  # a wrong token: 401
        result = review_cli(spec_repo, forge=standin, env={"PLNT_TEST_FORGE_TOKEN": TOKEN[::-1]})
        secret = TOKEN[::-1]
    else:  # the right token without the permission: 403
        standin.deny.add(deny)
        result = review_cli(spec_repo, forge=standin)
        secret = TOKEN
    assert result.exit_code == 3, result.output
    assert "ForgeRefused" in result.stderr and "the token needs" in result.stderr
    assert "check the token and its permissions" in result.stderr
    assert secret not in result.output and secret not in repr(result)


@pytest.mark.integration
@pytest.mark.parametrize(("family", "garbage"), [
    ("comments", b"\xff\xfe\x80 not utf-8 \xc3\x28"),
    ("comments", b"<html><body>Sign in to continue</body></html>"),
    ("status", "a list for a dict"),
    ("status", "a dict missing keys"),
])
def test_a_forge_answer_of_the_wrong_shape_exits_3_with_one_line(spec_repo: SpecRepo, standin: ForgeStandin,
                                                                 family: str, garbage: bytes | str) -> None:
    """Issue 24 (5): a body that is not JSON, or JSON of another shape, is "forge unavailable": exit 3
    and one line saying so (no traceback), naming the forge and the endpoint, never the token."""
    pr_branch(spec_repo)
    path = {"comments": r"/(issues/\d+/comments|merge_requests/\d+/notes)$",
            "status": r"/commits/[0-9a-f]+/status(es)?$"}[family]
    answer = (garbage if isinstance(garbage, bytes) else
              (lambda p: [p] if isinstance(p, dict) else {"items": p}) if garbage == "a list for a dict" else
              (lambda p: {"message": "ok"} if isinstance(p, dict) else [{"message": "ok"}]))
    standin.garble.append((path, answer))
    result = review_cli(spec_repo, forge=standin)
    assert result.exit_code == 3, result.output
    assert not standin.garble
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    line = lines[0]
    assert line.startswith(f"error: could not post the plan on {standin.kind} {standin.project} #7: ForgeUnavailable: "
                           f"{standin.kind} GET /"), line
    assert ("that are not JSON" if isinstance(garbage, bytes) else "JSON of an unexpected shape") in line
    assert line.endswith("re-run the job") and TOKEN not in result.output


@pytest.mark.integration
def test_main_moved_on_only_the_pull_requests_change_shows(spec_repo: SpecRepo, standin: ForgeStandin) -> None:
    branch_point = spec_repo.git("rev-parse", "main")
    head = pr_branch(spec_repo)
    spec_repo.git("checkout", "-q", "main")
    spec_repo.replace(RUN_FILE, "invocations: 10", "invocations: 20")
    spec_repo.write("workflowruns/other.yaml", (spec_repo.path / RUN_FILE).read_text().replace(
        "name: review-responder\n", "name: landed-meanwhile\n"))
    moved = spec_repo.commit("meanwhile on main")
    result = review_cli(spec_repo, forge=standin, base="main", head=head)
    assert result.exit_code == 0, result.output
    [body] = comments(standin)
    assert "0 to install, 1 to upgrade, 0 to uninstall" in body, body
    assert "landed-meanwhile" not in body and "invocations" not in body
    assert f"`{branch_point}` (merge base of `{moved[:12]}`" in body


@pytest.mark.integration
def test_base_as_the_ci_checkout_reads_it(spec_repo: SpecRepo, tmp_path: Path) -> None:
    """A CI job's checkout whose local main is stale (cloned before main moved, fetched since): there
    `--base origin/main` is the remote's main as last fetched, which plnt plans from, not the checkout's
    local `main` that `origin/main` would name in plnt's own clone of the checkout (found against a
    real Gitea). A revision the checkout does not know is left to plnt's clone, unchanged."""
    from plnt.reconciler.cli.review import _as_in_checkout

    env = {**os.environ, **GIT_ENV}
    branch_point = spec_repo.git("rev-parse", "main")
    head = pr_branch(spec_repo)
    checkout = tmp_path / "checkout"
    subprocess.run(["git", "clone", "-q", "--branch", "main", str(spec_repo.path), str(checkout)], check=True, env=env)
    spec_repo.git("checkout", "-q", "main")
    spec_repo.write("workflowruns/other.yaml", (spec_repo.path / RUN_FILE).read_text().replace(
        "name: review-responder\n", "name: landed-meanwhile\n"))
    moved = spec_repo.commit("meanwhile on main")
    subprocess.run(["git", "fetch", "-q", "origin"], cwd=checkout, check=True, env=env)

    def rev(name: str) -> str:
        return subprocess.run(["git", "rev-parse", name], cwd=checkout, check=True, capture_output=True,
                              text=True).stdout.strip()

    assert (rev("main"), rev("origin/main"), rev("origin/pr")) == (branch_point, moved, head)  # local main is stale
    result = review_cli(checkout, "--format", "json", base="origin/main", head="origin/pr")
    assert result.exit_code == 0, result.output
    planned = json.loads(result.stdout)
    assert (planned["base"], planned["mergeBase"], planned["head"]) == (moved, branch_point, head)

    assert _as_in_checkout(str(checkout), "origin/main") == moved
    assert _as_in_checkout(str(checkout), "main") == branch_point
    assert _as_in_checkout(str(checkout), head[:12]) == head
    for unknown in ("no-such-branch", "refs/pull/7/head", "f" * 40):
        assert _as_in_checkout(str(checkout), unknown) == unknown
    assert _as_in_checkout(f"file://{checkout}", "origin/main") == "origin/main"  # a URL, not a checkout


@pytest.mark.parametrize(("args", "message"), [
    (["--forge", "github"], "--forge github needs --api-url, --project, --pr"),
    (["--forge", "bitbucket"], "--forge must be one of github, gitlab, gitea"),
    (["--pr", "3"], "--pr needs --forge"),
    (["--forge", "gitea", "--api-url", "http://127.0.0.1:9/api/v1", "--project", "o/r", "--pr", "3"], "needs a token"),
    (["--format", "yaml"], "--format must be markdown or json"),
])
def test_bad_options_exit_2(args: list[str], message: str) -> None:
    result = CliRunner().invoke(app, ["review", "--repo", ".", "--base", "a", "--head", "b", *args])
    assert result.exit_code == 2 and message in result.stderr, result.output


@pytest.mark.integration
def test_unknown_revision_exits_2(spec_repo: SpecRepo) -> None:
    result = review_cli(spec_repo, head="no-such-branch")
    assert result.exit_code == 2 and "no revision 'no-such-branch'" in result.stderr


# --- the CI integrations, run as the CI runs them ---------------------------------------------------


def ci_checkout(spec_repo: SpecRepo, tmp_path: Path, base: str, head: str) -> Path:
    """What actions/checkout (fetch-depth: 0) leaves for a pull_request event: a clone with the branches
    as refs/remotes/origin/*, and the PR's merge commit checked out, detached."""
    work = tmp_path / "checkout"
    env = {**os.environ, **GIT_ENV}
    subprocess.run(["git", "clone", "-q", str(spec_repo.path), str(work)], check=True, env=env)
    for args in (["checkout", "-q", "--detach", base], ["merge", "-q", "--no-ff", "-m", "merge", head]):
        subprocess.run(["git", *args], cwd=work, check=True, env=env, capture_output=True)
    return work


_EXPR = re.compile(r"\$\{\{\s*(.*?)\s*\}\}")


def evaluate(text: str, context: dict[str, Any]) -> str:
    """The few GitHub expressions the action uses: dotted lookups (inputs.api-url, github.event...)
    and `a || b`. A name that does not exist raises, so a misspelt variable fails the test (GitHub
    would silently give '')."""

    def lookup(expr: str) -> str:
        for term in (t.strip() for t in expr.split("||")):
            root, *rest = term.split(".")
            value: Any = context[root]  # KeyError: unknown context
            for part in rest:
                if root == "secrets" and part not in value:
                    value = ""
                    break
                value = value[part]  # KeyError: a misspelt name
            if value not in ("", None):
                return str(evaluate(str(value), context))
        return ""

    return _EXPR.sub(lambda m: lookup(m.group(1)), text)


def run_action(workflow: Path, kind: str, s: ForgeStandin, checkout: Path, event: dict[str, Any],
               tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """The action's `review` step from action.yml, with the inputs the example workflow passes, in
    bash as a runner starts it, with the GITHUB_* variables of a pull_request event."""
    action = yaml.safe_load((ROOT / "action.yml").read_text())
    example = yaml.safe_load(workflow.read_text())
    [use] = [step for job in example["jobs"].values() for step in job["steps"]
             if "plnt" in str(step.get("uses", "")) and "checkout" not in step["uses"]]
    server = s.api_url.removesuffix("/api/v1")
    github = {"event": event, "token": TOKEN, "api_url": s.api_url if kind == "github" else "https://api.github.invalid",
              "server_url": server, "repository": s.project, "run_id": "4242", "action_path": str(ROOT)}
    context: dict[str, Any] = {"github": github, "secrets": {}}
    inputs = {name: str(spec.get("default", "")) for name, spec in action["inputs"].items()}
    unknown = set(use.get("with") or {}) - set(inputs)
    assert not unknown, f"the example passes inputs the action does not declare: {unknown}"
    inputs.update({k: str(v) for k, v in (use.get("with") or {}).items()})
    context["inputs"] = {k: evaluate(v, context) for k, v in inputs.items()}
    [install] = [step for step in action["runs"]["steps"] if step.get("id") == "install"]
    assert '"$GITHUB_ACTION_PATH"' in install["run"]  # plnt from the action's own checkout
    [step] = [step for step in action["runs"]["steps"] if step.get("id") == "review"]
    env = {k: evaluate(str(v), context) for k, v in step["env"].items()}
    summary = tmp_path / "step-summary.md"
    event_file = tmp_path / "event.json"
    event_file.write_text(json.dumps(event))
    runner_env = {"PATH": f"{PLNT.parent}:{os.environ['PATH']}", "HOME": str(tmp_path), "GITHUB_ACTIONS": "true",
                  "GITHUB_WORKSPACE": str(checkout), "GITHUB_REPOSITORY": s.project, "GITHUB_EVENT_NAME": "pull_request",
                  "GITHUB_EVENT_PATH": str(event_file), "GITHUB_API_URL": github["api_url"],
                  "GITHUB_SERVER_URL": server, "GITHUB_ACTION_PATH": str(ROOT), "GITHUB_STEP_SUMMARY": str(summary)}
    return subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", step["run"]], cwd=checkout,
                          env={**runner_env, **env}, capture_output=True, text=True, timeout=120)


@pytest.mark.integration
@pytest.mark.parametrize(("kind", "workflow"), [("github", "github-plnt-review.yml"), ("gitea", "gitea-plnt-review.yml")])
def test_the_action_step_posts_the_plan(spec_repo: SpecRepo, tmp_path: Path, kind: str, workflow: str) -> None:
    base = spec_repo.git("rev-parse", "main")
    head = pr_branch(spec_repo)
    checkout = ci_checkout(spec_repo, tmp_path, base, head)
    event = {"number": 7, "pull_request": {"number": 7, "base": {"sha": base, "ref": "main"},
                                           "head": {"sha": head, "ref": "pr"}}}
    with ForgeStandin(kind, "owner/specs", TOKEN) as s:
        done = run_action(ROOT / "examples/ci" / workflow, kind, s, checkout, event, tmp_path)
        assert done.returncode == 0, done.stderr
        [(state, description)] = statuses(s, head)
        [status] = [st for st in s.statuses if st["sha"] == head]
        assert status["target_url"] == f"{s.api_url.removesuffix('/api/v1')}/owner/specs/actions/runs/4242"
        assert len(comments(s)) == 1 and head in comments(s)[0]
    assert state == "success" and description.endswith(": 1 to upgrade")
    assert in_description(description) == short(recomputed_digest(spec_repo, base, head, tmp_path / "again"))
    assert "1.2.0 -> 1.3.0" in (tmp_path / "step-summary.md").read_text()  # the job's summary page
    assert TOKEN not in done.stdout + done.stderr


@pytest.mark.integration
def test_the_action_step_fails_the_job_when_the_plan_cannot_be_made(spec_repo: SpecRepo, tmp_path: Path) -> None:
    base = spec_repo.git("rev-parse", "main")
    pr_branch(spec_repo)
    spec_repo.replace(RUN_FILE, "trafficPercent: 5", "trafficPercent: 500")
    head = spec_repo.commit("bad")
    checkout = ci_checkout(spec_repo, tmp_path, base, head)
    event = {"pull_request": {"number": 7, "base": {"sha": base}, "head": {"sha": head}}}
    with ForgeStandin("github", "owner/specs", TOKEN) as s:
        done = run_action(ROOT / "examples/ci/github-plnt-review.yml", "github", s, checkout, event, tmp_path)
        assert done.returncode == 1, done.stderr  # the exit code of plnt, not of tee
        assert statuses(s, head) == [("failure", "plan invalid: 1 problem")]


@pytest.mark.integration
def test_the_gitlab_job_posts_the_plan(spec_repo: SpecRepo, tmp_path: Path) -> None:
    """The job's `script` lines, run by bash in the project directory with the CI_* variables of a
    merge request pipeline and the job's own variables (its before_script installs plnt: skipped)."""
    base = spec_repo.git("rev-parse", "main")
    head = pr_branch(spec_repo)
    work = tmp_path / "checkout"
    subprocess.run(["git", "clone", "-q", str(spec_repo.path), str(work)], check=True)
    subprocess.run(["git", "checkout", "-q", "--detach", head], cwd=work, check=True)
    job = yaml.safe_load((ROOT / "examples/ci/gitlab-plnt-review.yml").read_text())["plnt-review"]
    assert job["rules"] == [{"if": '$CI_PIPELINE_SOURCE == "merge_request_event"'}]
    with ForgeStandin("gitlab", "group/sub/specs", TOKEN) as s:
        env = {"PATH": f"{PLNT.parent}:{os.environ['PATH']}", "HOME": str(tmp_path),
               **{k: str(v) for k, v in job["variables"].items()},
               "CI": "true", "CI_PIPELINE_SOURCE": "merge_request_event", "CI_PROJECT_DIR": str(work),
               "CI_API_V4_URL": s.api_url, "CI_PROJECT_PATH": s.project, "CI_MERGE_REQUEST_IID": "7",
               "CI_MERGE_REQUEST_DIFF_BASE_SHA": base, "CI_COMMIT_SHA": head,
               "CI_MERGE_REQUEST_TARGET_BRANCH_NAME": "main", "CI_JOB_URL": "https://gitlab.example/jobs/1",
               "PLNT_FORGE_TOKEN": TOKEN}
        script = "\n".join(job["script"])
        done = subprocess.run(["bash", "-e", "-c", script], cwd=work, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        [(state, description)] = statuses(s, head)
        assert state == "success" and description.endswith(": 1 to upgrade")
        assert len(comments(s)) == 1
        assert all(r.headers.get("PRIVATE-TOKEN") == TOKEN for r in s.requests)
    assert TOKEN not in done.stdout + done.stderr


def test_examples_and_action_parse() -> None:
    action = yaml.safe_load((ROOT / "action.yml").read_text())
    assert action["runs"]["using"] == "composite" and {"path", "token", "python-version", "args"} <= set(action["inputs"])
    assert action["inputs"]["token"]["default"] == "${{ github.token }}"
    github = yaml.safe_load((ROOT / "examples/ci/github-plnt-review.yml").read_text())
    assert github["permissions"] == {"contents": "read", "pull-requests": "write", "statuses": "write"}
    assert "pull_request" in github[True]  # YAML 1.1 reads the key `on` as True
    gitea = yaml.safe_load((ROOT / "examples/ci/gitea-plnt-review.yml").read_text())
    assert "${{ github.server_url }}/api/v1" in str(gitea)


def test_recipe_evidence_keys_match_the_comment_table() -> None:
    """Pure: the comment lists each verified recipe with its signer (a Review built by hand)."""
    review = _review([UP])
    review.evidence.recipes["default/app"] = RecipeEvidence("app@1.0.0", "sha256:" + "a" * 64, "ci@x (https://iss)")
    body = render_comment(review)
    assert "| `default/app` | `app@1.0.0` | `sha256:" + "a" * 64 + "` | ci@x (https://iss) |" in body


@pytest.mark.integration
def test_a_head_on_no_branch_is_fetched_by_sha(spec_repo: SpecRepo, tmp_path: Path) -> None:
    """A repository reached by URL where the PR head is on no branch (here only refs/remotes/origin/pr;
    on a forge refs/pull/N/head): a clone of its branches lacks it; plnt fetches that commit by its sha."""
    base = spec_repo.git("rev-parse", "main")
    head = pr_branch(spec_repo)
    checkout = ci_checkout(spec_repo, tmp_path, base, head)
    subprocess.run(["git", "checkout", "-q", "--detach", base], cwd=checkout, check=True)  # HEAD lacks it too
    subprocess.run(["git", "branch", "-q", "-D", "pr"], cwd=checkout, check=True)  # the clone's default branch
    assert subprocess.run(["git", "for-each-ref", "--contains", head, "refs/heads"], cwd=checkout, capture_output=True,
                          text=True).stdout.strip() == ""
    result = review_cli(f"file://{checkout}", "--format", "json", base=base, head=head)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["head"] == head


@pytest.mark.integration
def test_a_pull_request_creating_the_spec_directory_installs_everything(spec_repo: SpecRepo, tmp_path: Path) -> None:
    """--path deploy/: absent at the base, created by the pull request (token read from --token-file)."""
    spec_repo.git("checkout", "-q", "-b", "pr")
    (spec_repo.path / "deploy").mkdir()
    for entry in ("workflowruns", "backends", "trust/policy.yaml"):  # registry and trusted root stay at the root
        spec_repo.git("mv", entry, f"deploy/{entry.split('/')[-1]}")
    head = spec_repo.commit("specs under deploy/")
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    with ForgeStandin("gitea", "owner/specs", TOKEN) as s:
        argv = ["review", "--repo", str(spec_repo.path), "--base", "main", "--head", "pr", "--path", "deploy",
                "--forge", "gitea", "--api-url", s.api_url, "--project", s.project, "--pr", "7",
                "--token-file", str(token_file)]
        result = CliRunner().invoke(app, argv, catch_exceptions=False)
        assert result.exit_code == 0, result.output
        [(state, description)] = statuses(s, head)
    assert state == "success" and description.endswith(": 1 to install")
    assert "has no directory 'deploy'" in result.stdout
