"""runnerLimits on a PlntBackend: the spec field (strict, camelCase, bounded, local backends only),
`plnt validate` naming FILE:LINE, and the DriverSet lookup the local driver asks for each release;
`plnt up` refusing an LLM key variable that is not set (runners would get no key)."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml
from plnt.core.specs.loader import SpecSet
from plnt.core.specs.models import PlntBackend, RunnerLimits, WorkflowRun
from plnt.reconciler.cli.main import app
from plnt.reconciler.drivers.driver_set import DriverSet
from plnt.reconciler.drivers.local import LocalDriver
from plnt.reconciler.state import StateDir
from pydantic import ValidationError
from typer.testing import CliRunner

from tests.conftest import EXAMPLE


def backend(spec: dict[str, Any], name: str = "local") -> PlntBackend:
    return PlntBackend.model_validate({"apiVersion": "plnt.work/v1", "kind": "PlntBackend",
                                       "metadata": {"name": name}, "spec": spec})


def test_defaults_and_camel_case() -> None:
    assert backend({"type": "local"}).spec.runner_limits == RunnerLimits(memory_mi_b=2048, open_files=1024,
                                                                         processes=4096)
    limits = backend({"type": "local", "runnerLimits": {"memoryMiB": 512, "openFiles": 64}}).spec.runner_limits
    assert (limits.memory_mi_b, limits.open_files, limits.processes) == (512, 64, 4096)


@pytest.mark.parametrize(("limits", "message"), [
    ({"memoryMiB": 16}, "greater than or equal to 256"),
    ({"openFiles": "many"}, "valid integer"),
    ({"processes": 0}, "greater than or equal to 64"),
    ({"memory": 512}, "Extra inputs are not permitted"),
])
def test_bad_limits_are_refused(limits: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        backend({"type": "local", "runnerLimits": limits})


def test_kubernetes_backends_refuse_runner_limits_instead_of_ignoring_them() -> None:
    target = {"context": "kind", "namespace": "agents"}
    with pytest.raises(ValidationError, match="only allowed with type: local"):
        backend({"type": "kubernetes", "kubernetes": target, "runnerLimits": {"memoryMiB": 512}})
    dumped = backend({"type": "kubernetes", "kubernetes": target}).model_dump(mode="json", by_alias=True)
    assert PlntBackend.model_validate(dumped).spec.type == "kubernetes", "a dumped backend reads back"


def test_validate_names_the_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "local.yaml"
    path.write_text(textwrap.dedent("""\
        apiVersion: plnt.work/v1
        kind: PlntBackend
        metadata:
          name: local
        spec:
          type: local
          runnerLimits:
            memoryMiB: 512
            openFiles: 10
        """))
    result = CliRunner().invoke(app, ["validate", str(path)], catch_exceptions=False)
    assert result.exit_code == 1, result.output
    assert result.stdout.startswith(f"{path}:9: spec.runnerLimits.openFiles: "), result.stdout


def test_driver_set_looks_up_the_limits_of_the_assigned_backend(tmp_path: Path) -> None:
    """The lookup the local driver uses: the backend each WorkflowRun is assigned to, kept across a
    restart (STATE/backends.json), defaults for a WorkflowRun never seen."""
    state = StateDir(tmp_path / "state").ensure()
    run = WorkflowRun.model_validate(yaml.safe_load(
        (EXAMPLE / "workflowruns" / "review-responder.yaml").read_text()))
    small = backend({"type": "local", "runnerLimits": {"memoryMiB": 512, "openFiles": 128, "processes": 100}})

    def no_helm(*_: Any) -> Any:
        raise AssertionError("no kubernetes backend here")

    drivers = DriverSet(LocalDriver(state), state, no_helm)
    drivers.assign(SpecSet(workflow_runs={run.key: run}, backends={"local": small}))
    ns, name = run.metadata.namespace, run.metadata.name
    assert drivers.runner_limits(ns, name) == small.spec.runner_limits
    assert DriverSet(LocalDriver(state), state, no_helm).runner_limits(ns, name) == small.spec.runner_limits
    assert drivers.runner_limits("default", "never-seen") == RunnerLimits()


def test_up_refuses_an_llm_key_variable_that_is_not_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PLNT_NO_SUCH_KEY", raising=False)
    result = CliRunner().invoke(app, ["up", "--repo", str(EXAMPLE), "--state-dir", str(tmp_path / "state"),
                                      "--llm-url", "http://127.0.0.1:9", "--llm-model", "m",
                                      "--llm-api-key-env", "PLNT_NO_SUCH_KEY"], catch_exceptions=False)
    assert result.exit_code == 2, result.output
    assert "--llm-api-key-env PLNT_NO_SUCH_KEY: that environment variable is not set" in result.stderr
    assert not (tmp_path / "state").exists(), "nothing started"
