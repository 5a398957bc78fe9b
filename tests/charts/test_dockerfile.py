"""The Dockerfile, checked without building it (there is no Docker engine on these machines).

What is checked: the final stage is a slim Python image, runs as a numeric non-root USER that
matches the charts' runAsUser, keeps HOME/TMPDIR on /tmp (read-only root), installs the checkout
with pip and the real helm CLI, places the workflow-runner and model-server charts where the Helm
driver looks for them (DEFAULT_CHART, DEFAULT_MODEL_CHART), and its ENTRYPOINT is the console script
pyproject declares; every COPY source exists and is not excluded by .dockerignore. And every `plnt`
subcommand and flag the three charts call (the model-server chart: its init container's `plnt model
fetch`; its servers run the runtimes' own images) exists in the REAL CLI (`plnt --help` as a process, and the CLI's own option table), except the commands
listed in PENDING, which are being built on other branches of issue 9 (reconcile, worker,
gateway): those are reported as skipped, never passed.

What is NOT checked: that the image builds, its size, that the commands run inside it.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.charts.chartkit import (
    MODEL_SERVER_CASES,
    PLNT_CASES,
    PLNT_CHART,
    ROOT,
    RUNNER_CASES,
    pod_templates,
    render,
    render_model_server,
    render_runner,
)

DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
PLNT = Path(sys.executable).parent / "plnt"
# Role commands being merged from other branches of issue 9; until they are, the flag check skips them.
PENDING = frozenset({"reconcile", "worker", "gateway"})


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        pending = f"{pending} {line}" if pending else line
        if pending.endswith("\\"):
            pending = pending[:-1].rstrip()
            continue
        word, _, rest = pending.partition(" ")
        out.append((word.upper(), rest.strip()))
        pending = ""
    return out


def final_stage() -> list[tuple[str, str]]:
    steps = instructions()
    last_from = max(i for i, (word, _) in enumerate(steps) if word == "FROM")
    return steps[last_from:]


def test_final_stage_is_slim_python_non_root_read_only_friendly() -> None:
    steps = instructions()
    args = dict(re.match(r"(\w+)=(\S+)", rest).groups() for word, rest in steps if word == "ARG" and "=" in rest)
    base = final_stage()[0][1]
    base = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], base)
    assert re.fullmatch(r"python:3\.1[1-9][.\d]*-slim(-\w+)?", base), base

    stage = final_stage()
    [user] = [rest for word, rest in stage if word == "USER"][-1:]
    uid, _, gid = user.partition(":")
    assert uid.isdigit() and int(uid) != 0, f"USER {user!r} must be a numeric non-root uid (runAsNonRoot checks it)"
    assert not gid or (gid.isdigit() and int(gid) != 0)
    # The charts run the image as the same uid.
    plnt_values = yaml.safe_load((PLNT_CHART / "values.yaml").read_text())
    assert plnt_values["podSecurity"]["runAsUser"] == int(uid)
    runner_deployment = (ROOT / "charts" / "workflow-runner" / "templates" / "deployment.yaml").read_text()
    assert f"runAsUser: {uid}" in runner_deployment

    env = " ".join(rest for word, rest in stage if word == "ENV")
    for setting in ("HOME=/tmp", "TMPDIR=/tmp", "HELM_CACHE_HOME=/tmp/", "HELM_CONFIG_HOME=/tmp/", "HELM_DATA_HOME=/tmp/"):
        assert setting in env, f"{setting}: nothing may write outside /tmp on a read-only root"


def test_entrypoint_is_the_console_script() -> None:
    [entrypoint] = [rest for word, rest in final_stage() if word == "ENTRYPOINT"]
    assert json.loads(entrypoint) == ["plnt"], "exec form, the console script only: the charts pass the subcommand as args"
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"plnt": "plnt.reconciler.cli.main:main"}
    from plnt.reconciler.cli import main as cli

    assert callable(cli.main)


def test_install_steps() -> None:
    runs = " ".join(rest for word, rest in instructions() if word == "RUN")
    assert re.search(r"pip install [^&]*\.(\s|$)", runs), "pip install . from the checkout"
    assert "tools/install_helm.sh" in runs, "the real helm CLI, as make install gets it"
    assert "git" in runs and "openssh-client" in runs
    # The charts land where the Helm driver looks for them, beside the installed package, and the
    # build fails unless both are there.
    import plnt.reconciler
    from plnt.reconciler.drivers import helm as helm_driver

    # (what the Dockerfile computes: the folder holding the plnt.reconciler package)
    package_parent = Path(plnt.reconciler.__file__).resolve().parent.parent
    assert Path(helm_driver.DEFAULT_CHART) == package_parent / "charts" / "workflow-runner"
    assert Path(helm_driver.DEFAULT_MODEL_CHART) == package_parent / "charts" / "model-server"
    copies = {rest for word, rest in instructions() if word == "COPY"}
    for chart in ("workflow-runner", "model-server"):
        assert f"charts/{chart} ./charts/{chart}" in copies, chart
        assert f'cp -r charts/{chart} "$site/charts/{chart}"' in runs, chart
    [check] = [line for line in runs.split("&&") if "assert" in line and "Chart.yaml" in line]
    assert "h.DEFAULT_CHART" in check and "h.DEFAULT_MODEL_CHART" in check, check


def ignored(path: str, patterns: list[str]) -> bool:
    result = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!").rstrip("/")
        if fnmatch.fnmatch(path, pattern) or fnmatch.fnmatch(path, pattern.removeprefix("**/")) or path.startswith(pattern + "/"):
            result = not negate
    return result


def test_copy_sources_exist_and_are_not_ignored() -> None:
    patterns = [line.strip() for line in DOCKERIGNORE.read_text().splitlines() if line.strip() and not line.startswith("#")]
    for pattern in (".git", ".venv", "tests", ".plnt-demo"):
        assert pattern in patterns, f".dockerignore keeps {pattern} out of the build context"
    copies = [rest for word, rest in instructions() if word == "COPY" and not rest.startswith("--from")]
    assert copies
    for rest in copies:
        *sources, _dest = rest.split()
        for source in sources:
            assert (ROOT / source).exists(), f"COPY {source}: no such file in the checkout"
            assert not ignored(source, patterns), f"COPY {source}: excluded by .dockerignore"


# --- the commands the charts run exist in the real CLI ------------------------------------------


def chart_commands(helm: str) -> list[list[str]]:
    """Every command line the plnt image runs in the three charts, as its ENTRYPOINT (plnt) makes it:
    every container of charts/plnt and charts/workflow-runner, the init container of charts/model-server
    (its server containers run the runtimes' images, not plnt's)."""
    lines: list[list[str]] = []
    docs = [doc for case in PLNT_CASES for doc in render(helm, PLNT_CHART, PLNT_CASES[case])]
    docs += [doc for case in RUNNER_CASES for doc in render_runner(helm, case)]
    containers = [c for _, template in pod_templates(docs)
                  for c in template["spec"].get("initContainers", []) + template["spec"]["containers"]]
    models = [doc for case in MODEL_SERVER_CASES for doc in render_model_server(helm, case)]
    containers += [c for _, template in pod_templates(models) for c in template["spec"]["initContainers"]]
    assert any(c.get("args", [])[:2] == ["model", "fetch"] for c in containers), "the model-server init container"
    for c in containers:
        lines.append(list(c.get("command", ["plnt"])) + list(c.get("args", [])))
    return lines


def subcommand(line: list[str]) -> tuple[str, ...]:
    """("reconcile",), ("recipe", "fetch") or ("model", "fetch") for a plnt line; ("python", "-m",
    MODULE) otherwise."""
    if line[0] == "plnt":
        words = [w for w in line[1:3] if not w.startswith("-")]
        return tuple(words[:2]) if words[:1] in (["recipe"], ["model"]) else tuple(words[:1])
    assert line[:2] == ["python", "-m"], f"a chart runs {line[0]!r}: only plnt and python -m are in the image"
    return ("python", "-m", line[2])


def help_commands(*group: str) -> set[str]:
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"}
    result = subprocess.run([str(PLNT), *group, "--help"], capture_output=True, text=True, env=env, check=False)
    assert result.returncode == 0, result.stderr
    text = result.stdout
    body = text[text.index("Commands"):]
    return set(re.findall(r"^\W\s+([a-z][-a-z]*)\s{2,}", body, flags=re.M))


@pytest.mark.integration  # runs helm and the plnt console script
def test_every_command_the_charts_call_exists(helm: str) -> None:
    assert PLNT.is_file(), f"the plnt console script is missing at {PLNT}: make install"
    top, recipe, model = help_commands(), help_commands("recipe"), help_commands("model")
    assert {"up", "recipe", "model"} <= top and "fetch" in recipe and "fetch" in model, (top, recipe, model)
    missing_pending: set[str] = set()
    for line in chart_commands(helm):
        command = subcommand(line)
        if command[0] == "python":
            result = subprocess.run([sys.executable, "-m", command[2], "--help"], capture_output=True, text=True, check=False)
            assert result.returncode == 0 and "--recipe" in result.stdout, result.stderr
        elif command[0] in ("recipe", "model"):
            assert command[1] in (recipe if command[0] == "recipe" else model), line
        elif command[0] not in top:
            assert command[0] in PENDING, f"the charts run `plnt {command[0]}`, which the CLI does not have"
            missing_pending.add(command[0])
    if missing_pending:
        pytest.skip(f"pending on other branches of issue 9, not in `plnt --help` yet: {sorted(missing_pending)} "
                    "(every other command the charts run exists)")


def cli_options() -> dict[tuple[str, ...], set[str]]:
    import typer
    from plnt.reconciler.cli.main import app

    root = typer.main.get_command(app)
    out: dict[tuple[str, ...], set[str]] = {}

    def walk(command: Any, path: tuple[str, ...]) -> None:
        for name in getattr(command, "commands", {}):  # get_command: the command itself, loaded (cli/lazy.py)
            walk(command.get_command(typer.core._click.Context(command), name), (*path, name))
        out[path] = {opt for param in command.params for opt in (*param.opts, *param.secondary_opts)}

    walk(root, ())
    return out


@pytest.mark.integration  # runs helm
def test_every_flag_the_charts_pass_exists(helm: str) -> None:
    options = cli_options()
    unchecked: set[str] = set()
    for line in chart_commands(helm):
        command = subcommand(line)
        if command[0] == "python":
            continue  # checked by test_every_command_the_charts_call_exists
        if command not in options:
            assert command[0] in PENDING, command
            unchecked.add(command[0])
            continue
        flags = {word.split("=", 1)[0] for word in line if word.startswith("--")}
        assert flags <= options[command], f"plnt {' '.join(command)} has no {sorted(flags - options[command])}"
    if unchecked:
        pytest.skip(f"flags of {sorted(unchecked)} unchecked: those commands are pending on other branches of issue 9")
