"""The parse cache (plnt.reconciler.source.parse_cache) against real git repositories: files at an unchanged
blob id are neither read nor parsed again, a changed file, limit or plnt build is a miss, a corrupt
disk cache is ignored, and the problems and specs are exactly those of a load without a cache."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from plnt.core.specs.limits import SpecLimits
from plnt.core.specs.loader import DEFAULT_LIMITS, SpecSet, load_sources
from plnt.reconciler.cli.main import app
from plnt.reconciler.source import parse_cache
from plnt.reconciler.source.git import GitSource
from plnt.reconciler.source.parse_cache import DiskParseCache, MemoryParseCache
from typer.testing import CliRunner

from tests.conftest import SpecRepo

RUN = """\
apiVersion: plnt.work/v1
kind: WorkflowRun
metadata:
  name: run-{i}
  namespace: default
spec:
  workflow: {{ref: review-responder@1.2.0, registry: "file:registry"}}
  backend: {{cluster: {cluster}}}
"""

# Problems of every kind the loader finds: per file (syntax, model, duplicate key, alias bomb) and
# across files (a duplicate name in two files, an unknown backend), so a cache must keep them all.
BAD = {
    "bad/syntax.yaml": "apiVersion: plnt.work/v1\nkind: [unclosed\n",
    "bad/model.yaml": RUN.format(i="m", cluster="local").replace("namespace: default", "namespace: default\n  colour: red"),
    "bad/dupkey.yaml": RUN.format(i="d", cluster="local") + "metadata: {name: again}\n",
    "bad/unknown-backend.yaml": RUN.format(i="u", cluster="nowhere"),
    "bad/same-name.yaml": RUN.format(i="0", cluster="local"),
    "bad/bomb.yaml": "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 9)}]\n" for i in range(6)),
    "bad/date-key.yaml": RUN.format(i="k", cluster="local") + "  2024-01-01: x\n",
}


def many_runs(spec_repo: SpecRepo, count: int = 20) -> str:
    for i in range(count):
        spec_repo.write(f"workflowruns/run-{i}.yaml", RUN.format(i=i, cluster="local"))
    return spec_repo.commit(f"{count} runs")


def uncached(source: GitSource, commit: str, limits: SpecLimits = DEFAULT_LIMITS) -> tuple[SpecSet, list]:
    return load_sources(source.spec_files(commit, limits), limits=limits)


def same(a: tuple[SpecSet, list], b: tuple[SpecSet, list]) -> None:
    assert a[1] == b[1]
    assert a[0] == b[0]  # every model, location and warning


def test_unchanged_blobs_are_hits_and_a_changed_one_a_miss(spec_repo: SpecRepo, tmp_path: Path) -> None:
    first = many_runs(spec_repo)
    source = GitSource(str(spec_repo.path), tmp_path / "clone")
    source.fetch()
    cache = source.parse_cache
    assert isinstance(cache, MemoryParseCache)
    same(source.load(first), uncached(source, first))
    files = len(source.spec_files(first))
    assert (cache.hits, cache.misses) == (0, files)

    spec_repo.replace("workflowruns/run-7.yaml", "cluster: local", "cluster: nowhere")
    second = spec_repo.commit("one changed")
    source.fetch()
    loaded = source.load(second)
    assert (cache.hits, cache.misses) == (files - 1, files + 1)  # only run-7 was parsed again
    same(loaded, uncached(source, second))
    assert loaded[1] and loaded[1][0].file == "workflowruns/run-7.yaml"  # its unknown backend, found again


def test_unchanged_files_are_not_read_again(spec_repo: SpecRepo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    commit = many_runs(spec_repo, 5)
    source = GitSource(str(spec_repo.path), tmp_path / "clone")
    source.fetch()
    source.load(commit)
    files = source.spec_files(commit, known=lambda path, blob: source.parse_cache.has(path, blob, SpecLimits()))
    assert all(f.text == "" and f.unread is not None and f.blob for f in files)
    assert files[0].unread is not None and files[0].unread().text  # read when a cache misses after all


def test_a_changed_limit_is_a_miss(spec_repo: SpecRepo, tmp_path: Path) -> None:
    commit = many_runs(spec_repo, 5)
    source = GitSource(str(spec_repo.path), tmp_path / "clone")
    source.fetch()
    source.load(commit)
    misses = source.parse_cache.misses  # type: ignore[attr-defined]
    deep = SpecLimits(max_depth=3)  # every WorkflowRun is nested deeper than this
    loaded = source.load(commit, deep)
    assert source.parse_cache.hits == 0  # type: ignore[attr-defined]
    assert source.parse_cache.misses == 2 * misses  # type: ignore[attr-defined]
    assert loaded[1] and all("max_depth" in p.message for p in loaded[1])
    same(loaded, uncached(source, commit, deep))


def test_problems_are_identical_with_and_without_the_cache(spec_repo: SpecRepo, tmp_path: Path) -> None:
    many_runs(spec_repo, 3)
    for path, text in BAD.items():
        spec_repo.write(path, text)
    commit = spec_repo.commit("bad files")
    source = GitSource(str(spec_repo.path), tmp_path / "clone")
    source.fetch()
    expected = uncached(source, commit)
    assert {p.file for p in expected[1]} >= set(BAD) - {"bad/same-name.yaml"}  # the duplicate is on the later file
    same(source.load(commit), expected)  # cold
    same(source.load(commit), expected)  # every file from memory
    disk = DiskParseCache(tmp_path / "cache", SpecLimits())
    source.parse_cache = disk
    same(source.load(commit), expected)
    disk.save()
    again = DiskParseCache(tmp_path / "cache", SpecLimits())
    source.parse_cache = again
    same(source.load(commit), expected)  # every file decoded from disk
    assert (again.hits, again.misses) == (len(source.spec_files(commit)), 0)
    # Duplicates across files are still found among cached files, at the same lines.
    assert any(p.file == "workflowruns/run-0.yaml" and "duplicate WorkflowRun default/run-0" in p.message
               for p in expected[1])


def test_max_nodes_holds_for_cached_files(spec_repo: SpecRepo, tmp_path: Path) -> None:
    commit = many_runs(spec_repo, 10)
    source = GitSource(str(spec_repo.path), tmp_path / "clone")
    source.fetch()
    roomy = source.load(commit)  # every file cached
    assert roomy[1] == []
    nodes = sum(parsed.nodes for parsed in source.parse_cache._entries.values())  # type: ignore[attr-defined]
    tight = SpecLimits(max_nodes=nodes // 2)
    source.parse_cache = MemoryParseCache()
    source.load(commit, tight)  # cold: the files past the limit are cut short, and not cached
    hits = source.parse_cache.hits  # type: ignore[attr-defined]
    warm = source.load(commit, tight)
    assert any("max_nodes" in p.message for p in warm[1])
    same(warm, uncached(source, commit, tight))
    assert source.parse_cache.hits > hits  # the files before the limit came from the cache


def test_disk_cache_is_a_miss_for_another_plnt_build_and_ignores_corrupt_entries(
        spec_repo: SpecRepo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    commit = many_runs(spec_repo, 4)
    source = GitSource(str(spec_repo.path), tmp_path / "clone")
    source.fetch()
    expected = uncached(source, commit)
    files = len(source.spec_files(commit))
    cache_dir = tmp_path / "cache"
    disk = DiskParseCache(cache_dir, SpecLimits())
    source.parse_cache = disk
    source.load(commit)
    disk.save()
    assert disk.path.stat().st_mode & 0o077 == 0  # the user's alone

    monkeypatch.setattr(parse_cache.metadata, "version", lambda name: "99.0.0")
    other = DiskParseCache(cache_dir, SpecLimits())
    assert other.path != disk.path
    source.parse_cache = other
    same(source.load(commit), expected)
    assert (other.hits, other.misses) == (0, files)
    monkeypatch.undo()

    data = json.loads(disk.path.read_text())
    broken = sorted(data["entries"])
    data["entries"][broken[0]]["documents"][0]["model"][2] = '{"apiVersion": 7}'  # no longer a model
    data["entries"][broken[1]]["problems"] = [["x", "not a line", "f", "m"]]
    data["entries"][broken[2]] = "garbage"
    disk.path.write_text(json.dumps(data))
    partly = DiskParseCache(cache_dir, SpecLimits())
    source.parse_cache = partly
    same(source.load(commit), expected)
    assert (partly.hits, partly.misses) == (files - 3, 3)

    disk.path.write_text("{not json")
    corrupt = DiskParseCache(cache_dir, SpecLimits())
    source.parse_cache = corrupt
    same(source.load(commit), expected)
    assert (corrupt.hits, corrupt.misses) == (0, files)
    corrupt.save()
    assert json.loads(disk.path.read_text())["key"] == corrupt.key  # rewritten whole


def test_plnt_plan_with_a_disk_cache_gives_the_same_plan(spec_repo: SpecRepo, tmp_path: Path) -> None:
    many_runs(spec_repo, 6)
    spec_repo.replace("workflowruns/run-3.yaml", "@1.2.0", "@1.3.0")
    spec_repo.commit("bump run-3")
    args = ["plan", "--repo", str(spec_repo.path), "--base", "HEAD~1", "--head", "HEAD", "--format", "json"]
    runner = CliRunner()
    plain = runner.invoke(app, [*args, "--no-cache", "--cache-dir", str(tmp_path / "unused")])
    assert plain.exit_code == 0, plain.output
    assert not (tmp_path / "unused").exists()
    cold = runner.invoke(app, [*args, "--cache-dir", str(tmp_path / "cache")])
    warm = runner.invoke(app, [*args, "--cache-dir", str(tmp_path / "cache")])
    assert cold.exit_code == warm.exit_code == 0
    assert json.loads(plain.output) == json.loads(cold.output) == json.loads(warm.output)
    changed = [i["name"] for i in json.loads(warm.output)["items"] if i["action"] != "unchanged"]
    assert changed == ["run-3"]
    assert len(list((tmp_path / "cache").glob("parse-*.json"))) == 1
