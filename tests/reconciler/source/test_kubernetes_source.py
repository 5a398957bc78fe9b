"""The Kubernetes source's decisions, without a cluster: what a revision is, which objects a
revision refuses and why, the bounds of a listing, the platform directory, and the options that
only make sense with git. (On a real API server: tests/k8s/test_kubernetes_source.py.)

The API is a STAND-IN here: an object with CustomObjectsApi's two list calls, answering pages."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from plnt.core.specs.limits import SpecLimits
from plnt.core.specs.loader import read_tree
from plnt.reconciler.errors import DownloadRefused, RetryLater
from plnt.reconciler.settings import Settings
from plnt.reconciler.source.git import UnreadableTree
from plnt.reconciler.source.kubernetes import KubernetesSource, object_file, platform_problems, revision_of, settle
from pydantic import ValidationError

EXAMPLE = Path(__file__).resolve().parents[3] / "gitops-example"


def run(name: str, *, uid: str = "", generation: int = 1, version: str = "1.2.0", backend: str = "local",
        namespace: str = "default", kind: str = "WorkflowRun", **more: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"workflow": {"ref": f"{name}@{version}", "registry": "file:registry"},
                            "backend": {"cluster": backend}, **more}
    if kind == "ModelDeployment":  # gitops-example's, under this name
        spec = yaml.safe_load((EXAMPLE / "models" / "smollm2.yaml").read_text())["spec"]
    return {"apiVersion": "plnt.work/v1", "kind": kind,
            "metadata": {"name": name, "namespace": namespace, "uid": uid or f"uid-{name}", "generation": generation,
                         "resourceVersion": "100", "labels": {"team": "care"},
                         "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{...}"},
                         "managedFields": [{"manager": "kubectl"}]},
            "spec": spec, "status": {"phase": "Ready"}}


@pytest.fixture
def platform(tmp_path: Path) -> Path:
    root = tmp_path / "platform"
    for part in ("backends", "trust", "registry"):
        shutil.copytree(EXAMPLE / part, root / part)
    (root / ".plntignore").write_text("registry/\n")
    return root


def platform_files(root: Path) -> list[Any]:
    files, unread = read_tree(root)
    assert not unread
    return files


# --- the revision -----------------------------------------------------------------------------

BASE = [run("a"), run("b")]


@pytest.mark.parametrize(("what", "change", "new_revision"), [
    ("a status write (resourceVersion moves, generation not)",
     lambda items: [{**items[0], "status": {"phase": "Canary"}, "metadata": {**items[0]["metadata"], "resourceVersion": "101"}},
                    items[1]], False),
    ("a label or annotation change (generation not moved)",
     lambda items: [{**items[0], "metadata": {**items[0]["metadata"], "labels": {"team": "x"}, "annotations": {}}},
                    items[1]], False),
    ("the same objects listed in another order", lambda items: list(reversed(items)), False),
    ("a spec change (the server moves generation)",
     lambda items: [run("a", generation=2, version="1.3.0"), items[1]], True),
    ("an object deleted", lambda items: items[:1], True),
    ("an object created", lambda items: [*items, run("c")], True),
    ("deleted and created again under the same name (a new uid)",
     lambda items: [run("a", uid="uid-a-again"), items[1]], True),
])
def test_a_revision_moves_with_uids_and_generations_only(what: str, change: Any, new_revision: bool) -> None:
    before = revision_of([object_file(item, "WorkflowRun") for item in BASE], [])
    after = revision_of([object_file(item, "WorkflowRun") for item in change(BASE)], [])
    assert (before != after) is new_revision, what
    assert len(after) == 40 and int(after, 16) >= 0  # the shape of a commit: sagas and statuses name it


def test_a_change_of_the_platform_directory_is_a_new_revision(platform: Path) -> None:
    objects = [object_file(item, "WorkflowRun") for item in BASE]
    before = revision_of(objects, platform_files(platform))
    (platform / "backends" / "local.yaml").write_text((platform / "backends" / "local.yaml").read_text() + "\n# x\n")
    assert revision_of(objects, platform_files(platform)) != before


def test_an_object_becomes_its_spec_and_the_metadata_the_models_know() -> None:
    listed = object_file(run("a"), "WorkflowRun")
    assert listed.file.path == "default/workflowruns/a" and listed.generation == 1 and listed.uid == "uid-a"
    assert "last-applied" not in listed.file.text and "managedFields" not in listed.file.text
    assert '"status"' not in listed.file.text and '"team": "care"' in listed.file.text
    too_big = object_file(run("a"), "WorkflowRun", SpecLimits(max_file_bytes=100))
    assert too_big.file.problem is not None and "over the limit of 100" in too_big.file.problem.message


# --- which objects a revision refuses ----------------------------------------------------------


@pytest.mark.parametrize(("items", "refused"), [
    ([run("a"), run("b")], {}),
    ([run("a"), run("b", backend="gpu-pool")],
     {"default/b": r"^WorkflowRun default/b generation 1 is refused: default/workflowruns/b:\d+: "
                   r"spec.backend.cluster: unknown backend 'gpu-pool'"}),
    ([run("a", replicas={"min": 3, "max": 1}), run("b")],
     {"default/a": r"default/workflowruns/a:\d+: spec.replicas: max \(1\) must be >= min \(3\)"}),
    ([run("a"), run("a", kind="ModelDeployment", uid="uid-md")],
     {"default/a": r"^ModelDeployment default/a generation 1 is refused: default/modeldeployments/a:\d+: "
                   r"metadata.name: ModelDeployment default/a has the name of the WorkflowRun"}),
    ([run("a", namespace="team-a"), run("a")], {}),  # one name in two namespaces: two objects
])
def test_an_object_plnt_refuses_is_named_with_its_field_and_the_others_load(
        platform: Path, items: list[dict[str, Any]], refused: dict[str, str]) -> None:
    objects = [object_file(item, item["kind"]) for item in items]
    files, got = settle(platform_files(platform), objects)
    assert set(got) == set(refused)
    for key, pattern in refused.items():
        assert re.search(pattern, got[key]), got[key]
    paths = {o.file.path for o in objects}
    left_out = {o.file.path for o in objects if o.key in got and got[o.key].startswith(f"{o.kind} ")}
    assert {f.path for f in files} & paths == paths - left_out  # the refused one alone is left out


def test_the_platform_directory_holds_backends_and_trust_policies_only(platform: Path) -> None:
    assert platform_problems(platform_files(platform), [], SpecLimits()) == []
    shutil.copy(EXAMPLE / "workflowruns" / "review-responder.yaml", platform / "sneaked-in.yaml")
    [problem] = platform_problems(platform_files(platform), [], SpecLimits())
    assert problem.file == "sneaked-in.yaml" and "a WorkflowRun comes from the cluster" in problem.message


# --- the source over a stand-in API --------------------------------------------------------------


class ApiStandIn:
    """CustomObjectsApi's list calls over `items` (by plural), in pages of the `limit` asked."""

    def __init__(self) -> None:
        self.items: dict[str, list[dict[str, Any]]] = {"workflowruns": [], "modeldeployments": []}
        self.calls: list[tuple[str, str | None, int]] = []
        self.refuse: int | None = None

    def list_namespaced_custom_object(self, group: str, version: str, namespace: str, plural: str,
                                      **options: Any) -> dict[str, Any]:
        return self._page(plural, namespace, **options)

    def list_cluster_custom_object(self, group: str, version: str, plural: str, **options: Any) -> dict[str, Any]:
        return self._page(plural, None, **options)

    def _page(self, plural: str, namespace: str | None, *, limit: int, _continue: str = "0",
              _request_timeout: float = 0) -> dict[str, Any]:
        from kubernetes.client.exceptions import ApiException

        if self.refuse is not None:
            raise ApiException(status=self.refuse, reason="Forbidden")
        self.calls.append((plural, namespace, limit))
        mine = [i for i in self.items[plural] if namespace is None or i["metadata"]["namespace"] == namespace]
        start = int(_continue)
        more = start + limit < len(mine)
        return {"items": mine[start:start + limit], "metadata": {"continue": str(start + limit) if more else ""}}


def source_over(platform: Path, api: ApiStandIn, **options: Any) -> KubernetesSource:
    return KubernetesSource(api, platform, **options)


def test_a_status_write_is_the_same_revision_and_a_spec_change_a_new_one(platform: Path) -> None:
    api = ApiStandIn()
    api.items["workflowruns"] = [run("review-responder")]
    source = source_over(platform, api, namespaces=("default",))
    first = source.fetch()
    specs, problems = source.load(first)
    assert not problems and list(specs.workflow_runs) == ["default/review-responder"]
    assert set(specs.backends) == {"local"} and specs.trust_policies
    api.items["workflowruns"][0]["status"] = {"phase": "Canary", "message": "written by plnt"}
    assert source.fetch() == first
    api.items["workflowruns"] = [run("review-responder", generation=2, version="1.3.0")]
    second = source.fetch()
    assert second != first
    assert source.load(second)[0].workflow_runs["default/review-responder"].version == "1.3.0"
    # A saga of the older revision still reads what that revision was.
    assert source.load(first)[0].workflow_runs["default/review-responder"].version == "1.2.0"


def test_a_revision_this_source_never_made_is_answered_with_the_current_one(platform: Path) -> None:
    api = ApiStandIn()
    api.items["workflowruns"] = [run("review-responder")]
    source = source_over(platform, api)
    specs, problems = source.load("f" * 40)  # a worker that started after the reconciler listed
    assert not problems and "default/review-responder" in specs.workflow_runs


def test_listing_is_paged_and_bounded(platform: Path) -> None:
    api = ApiStandIn()
    api.items["workflowruns"] = [run(f"r{i}") for i in range(600)]
    source = source_over(platform, api)
    specs, problems = source.load(source.fetch())
    assert not problems and len(specs.workflow_runs) == 600
    assert [c for c in api.calls if c[0] == "workflowruns"] == [("workflowruns", None, 250)] * 3
    bounded = source_over(platform, api, limits=SpecLimits(max_files=100))
    api.items["workflowruns"] = []
    empty = bounded.fetch()
    assert not bounded.load(empty)[1]
    api.items["workflowruns"] = [run(f"r{i}") for i in range(101)]
    refused = bounded.fetch()
    _, problems = bounded.load(refused)
    assert len(problems) == 1 and "more than 100 WorkflowRuns and ModelDeployments" in problems[0].message
    assert refused != empty  # a refused listing is never the revision of no objects (that would uninstall all)


def test_an_unreadable_listing_is_tried_again_later(platform: Path) -> None:
    api = ApiStandIn()
    api.refuse = 403
    with pytest.raises(RetryLater, match="cannot list workflowruns.plnt.work in namespace default: HTTP 403"):
        source_over(platform, api, namespaces=("default",)).fetch()


def test_a_refused_object_is_reported_and_the_revision_still_loads(platform: Path) -> None:
    api = ApiStandIn()
    api.items["workflowruns"] = [run("review-responder"), run("bad", backend="nope")]
    source = source_over(platform, api)
    revision = source.fetch()
    specs, problems = source.load(revision)
    assert not problems and list(specs.workflow_runs) == ["default/review-responder"]
    snapshot = source.snapshot(revision)
    assert list(snapshot.refused) == ["default/bad"] and "unknown backend 'nope'" in snapshot.refused["default/bad"]
    assert set(snapshot.objects) == {"default/review-responder", "default/bad"}  # both get a status


def test_the_platform_directory_is_read_inside_its_bounds(platform: Path, tmp_path: Path) -> None:
    source = source_over(platform, ApiStandIn())
    assert source.read_file("0" * 40, "trust/demo-trusted-root.json").startswith(b"{")
    with pytest.raises(UnreadableTree):
        source.read_file("0" * 40, "../outside")
    (tmp_path / "secret").write_text("not for recipes")
    (platform / "link").symlink_to(tmp_path / "secret")
    with pytest.raises(FileNotFoundError, match="outside the platform directory"):
        source.read_file("0" * 40, "link")
    with pytest.raises(DownloadRefused):
        source.read_file("0" * 40, "trust/demo-trusted-root.json", limit=10)
    dest = tmp_path / "export"
    assert source.export("0" * 40, "registry/review-responder", dest)
    assert (dest / "1.2.0" / "recipe.tar.gz").is_file()
    assert not source.export("0" * 40, "no-such-dir", tmp_path / "none")


# --- options that only make sense with git -------------------------------------------------------


@pytest.mark.parametrize(("more", "named"), [
    ({"require_approval": True, "forge": "github", "forge_api_url": "https://api.github.com", "forge_project": "o/r",
      "forge_token": "t"}, "--require-approval"),
    ({"verify_commits": "head"}, "--verify-commits"),
    ({"write_notes": True}, "--write-notes"),
    ({"branch": "release"}, "--branch"),
])
def test_git_only_options_are_refused_with_the_kubernetes_source(tmp_path: Path, more: dict[str, Any], named: str) -> None:
    with pytest.raises(ValidationError, match=f"{named}.*for --source git"):
        Settings(source={"kind": "kubernetes", "platform_dir": tmp_path}, **more)


def test_the_kubernetes_source_needs_a_platform_directory_and_no_repository(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="needs --platform-dir"):
        Settings(source={"kind": "kubernetes"})
    with pytest.raises(ValidationError, match="drop --repo"):
        Settings(source={"kind": "kubernetes", "platform_dir": tmp_path, "repo": "r"})
    with pytest.raises(ValidationError, match="--repo is required"):
        Settings(source={"kind": "git"})
    with pytest.raises(ValidationError, match="are for --source kubernetes"):
        Settings(source={"repo": "r", "namespaces": ("default",)})
    assert Settings(source={"kind": "kubernetes", "platform_dir": tmp_path}).source.namespaces == ()


FORGE = ["--forge", "github", "--forge-api-url", "https://api.github.com", "--forge-project", "o/r",
         "--forge-token-env", "HOME"]
REFUSED_OPTIONS = [
    (["--verify-commits", "all"], "--verify-commits is for --source git"),
    (["--repo", "."], "drop --repo"),
    (["--source", "svn"], "--source must be git or kubernetes"),
]


@pytest.mark.parametrize(("command", "options", "said"), [
    *((command, options, said) for command in ("up", "reconcile", "worker") for options, said in REFUSED_OPTIONS),
    *((command, ["--require-approval", *FORGE], "--require-approval, --forge are for --source git")
      for command in ("up", "reconcile")),  # (a worker takes no forge options)
])
def test_the_command_line_refuses_git_options_with_the_kubernetes_source(
        tmp_path: Path, command: str, options: list[str], said: str) -> None:
    from plnt.reconciler.cli.main import app
    from typer.testing import CliRunner

    args = [command, "--source", "kubernetes", "--platform-dir", str(tmp_path), *options]
    if command != "up":
        args += ["--temporal-address", "127.0.0.1:1"]
    result = CliRunner().invoke(app, args, catch_exceptions=False)
    assert result.exit_code == 2 and said in result.output, result.output
