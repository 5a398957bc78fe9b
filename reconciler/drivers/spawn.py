"""How a runner process is started: its environment, its command line, and fork or exec.

Isolation of a runner (it runs recipe code): its environment is built from an allowlist (see
`allowlisted_env`; plnt's own credentials never reach it), its cwd, HOME and TMPDIR are its own
directory STATE/runners/RELEASE_ID/, and it sets the resource limits of its backend (runnerLimits)
before it imports the recipe, and makes itself undumpable (plnt.runner.isolation) so that other
runners cannot read its memory or environment. It runs as plnt's user, so it is not a filesystem
sandbox.

How a runner starts (`runner_start`): "fork" (the default on Linux) asks one pre-imported zygote
process (plnt.runner.zygote, via zygote.py's ZygoteClient) to fork it: ~10 ms of CPU and ~11 MiB of
private memory per runner; "exec" starts `python -m plnt.runner` afresh (~0.4 s CPU, ~36 MiB). Both
run the same runner `main` with the same options, environment, directory and limits, and both
survive plnt: a forked runner is its own session leader, and the zygote exits when plnt does
without them. A model release's server is always exec'd, from the model runtime's interpreter.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Literal

from plnt.core import telemetry
from plnt.core.specs.models import RunnerLimits
from plnt.reconciler.drivers.processes import MODEL_SERVER_SCRIPT, RunnerProcess
from plnt.reconciler.drivers.zygote import ZygoteClient, ZygoteError
from plnt.reconciler.errors import DriverError, InvalidSpec
from plnt.reconciler.state import Release

# What of plnt's own environment a runner may see: nothing secret. PYTHONPATH only matters when plnt
# itself is imported through it; SSL_CERT_* let an https model server with a private CA work.
# Tracing: only where to send spans, by which protocol, under which service name and how many
# (telemetry.RUNNER_ENV_NAMES); never OTEL_EXPORTER_OTLP_HEADERS, which may hold a collector's credentials.
RUNNER_ENV_NAMES = frozenset({"PATH", "LANG", "LANGUAGE", "TZ", "PYTHONPATH", "SSL_CERT_FILE", "SSL_CERT_DIR"}
                             | telemetry.RUNNER_ENV_NAMES)
RUNNER_ENV_PREFIXES = ("LC_",)
MODEL_TOKEN_ENV = "PLNT_MODEL_TOKEN"  # a bound runner's token for the gateway (scope `models`)

RunnerStart = Literal["fork", "exec"]


def allowlisted_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables of `environ` every runner may inherit (the CLI passes os.environ)."""
    return {k: v for k, v in environ.items() if k in RUNNER_ENV_NAMES or k.startswith(RUNNER_ENV_PREFIXES)}


def runner_env(base: Mapping[str, str], runner_dir: Path, extra: Mapping[str, str]) -> dict[str, str]:
    """A runner's whole environment: the allowlisted base, its own directory as HOME and TMPDIR,
    no user site-packages from that HOME, and `extra` (the one LLM key the operator names)."""
    env = {"PATH": os.defpath, **allowlisted_env(base)}
    env.update(HOME=str(runner_dir), TMPDIR=str(runner_dir), PYTHONNOUSERSITE="1")
    env.update(extra)
    return env


class RunnerSpawner:
    """Starts one runner (or model server) process for a release, on a given port."""

    def __init__(
        self,
        zygote: ZygoteClient,
        *,
        python: str,
        host: str,
        runner_start: RunnerStart,
        runner_args: tuple[str, ...],
        env: Mapping[str, str],
        secret_env: Mapping[str, str],
        model_python: str | None,
        gateway_url: Callable[[], str] | None,
        model_token: str | None,
    ) -> None:
        self._zygote = zygote
        self._python = python
        self._host = host
        # fork needs Linux (fork of a single-threaded zygote, prctl); elsewhere runners are exec'd.
        self.runner_start: RunnerStart = runner_start if sys.platform.startswith("linux") else "exec"
        # Extra runner options for every release, e.g. the model backend (--backend http --upstream-url ...).
        self._runner_args = runner_args
        # The allowlisted part of plnt's environment, and the LLM key (name -> value) runners get.
        self._env = allowlisted_env(env)
        self._secret_env = dict(secret_env)
        # The model runtime's interpreter (its own venv: tools/install_llm.sh); None: no model releases.
        self._model_python = model_python
        # Runners of a WorkflowRun bound to a ModelDeployment call it through this gateway, with this
        # token (scope `models` only) when the gateway requires one.
        self._gateway_url = gateway_url
        self._model_token = model_token

    def env_for(self, release: Release, runner_dir: Path) -> dict[str, str]:
        """The release's process environment. A model server needs no LLM key: it is the model. A
        runner bound to one gets the models token. Any other runner gets the operator's LLM key."""
        if release.model is not None:
            secrets_given: Mapping[str, str] = {}
        elif release.llm_model is not None:
            secrets_given = {MODEL_TOKEN_ENV: self._model_token} if self._model_token else {}
        else:
            secrets_given = self._secret_env
        return runner_env(self._env, runner_dir, secrets_given)

    def argv(self, release: Release, port: int, limits: RunnerLimits) -> list[str]:
        if release.model is not None:
            return self.model_argv(release, port, limits)
        return self.runner_argv(release, port, limits)

    def runner_argv(self, release: Release, port: int, limits: RunnerLimits) -> list[str]:
        """The options of `python -m plnt.runner` (a forked runner's main gets the same)."""
        return [
            "--recipe", str(Path(release.recipe_dir).resolve()),
            "--host", self._host,
            "--port", str(port),
            "--release-id", release.release_id,
            "--limit-memory-mib", str(limits.memory_mi_b),
            "--limit-open-files", str(limits.open_files),
            "--limit-processes", str(limits.processes),
            *(["--park-after-idle-s", f"{release.park_after_s:g}"] if release.park_after_s else []),
            *(self._model_backend_args(release.llm_model) if release.llm_model else self._runner_args),
        ]

    def _model_backend_args(self, model: str) -> list[str]:
        if self._gateway_url is None:
            raise DriverError(f"runner bound to model {model}: this plnt has no gateway for its runners to call "
                              "models through")
        return ["--backend", "http", "--upstream-url", self._gateway_url(), "--model", model,
                *(["--api-key-env", MODEL_TOKEN_ENV] if self._model_token else [])]

    def model_argv(self, release: Release, port: int, limits: RunnerLimits) -> list[str]:
        """The whole command line of a model release's server."""
        model = release.model
        assert model is not None
        if self._model_python is None or not Path(self._model_python).exists():
            raise InvalidSpec(f"{release.namespace}/{release.name}: the {model.runtime} runtime is not installed "
                              f"({self._model_python or 'no --llm-venv'}): run `make install-llm` (or "
                              "`bash tools/install_llm.sh .venv-llm`), then push again")
        return [
            self._model_python, str(MODEL_SERVER_SCRIPT),
            "--model", str(Path(release.recipe_dir).resolve() / model.model_file),
            "--alias", model.alias,
            "--host", self._host,
            "--port", str(port),
            "--release-id", release.release_id,
            "--version", release.version,
            "--context", str(model.context_length),
            *(["--threads", str(model.threads)] if model.threads else []),
            "--limit-memory-mib", str(model.memory_mib or limits.memory_mi_b),
            "--limit-open-files", str(limits.open_files),
            "--limit-processes", str(limits.processes),
            "--", *model.args,
        ]

    async def spawn(self, release: Release, argv: list[str], runner_dir: Path, log_path: Path,
                    env: dict[str, str]) -> RunnerProcess:
        """Start the process `argv` describes, in `runner_dir`, its output appended to `log_path`."""
        if release.model is not None:
            return self._exec_model_server(argv, runner_dir, log_path, env)
        if self.runner_start == "fork":
            try:
                return await self._zygote.spawn(argv, runner_dir.resolve(), log_path.resolve(), env)
            except (ZygoteError, OSError) as exc:
                raise DriverError(f"runner could not be forked: {exc}") from None
        with open(log_path, "ab") as log_file:
            return subprocess.Popen(
                [self._python, "-m", "plnt.runner", *argv],
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                cwd=runner_dir,
                env=env,
                start_new_session=True,  # Ctrl-C in the terminal reaches plnt, which stops runners in order
            )

    @staticmethod
    def _exec_model_server(argv: list[str], runner_dir: Path, log_path: Path, env: dict[str, str]) -> RunnerProcess:
        """A model server is exec'd from the runtime's own interpreter (never forked from plnt's zygote)."""
        with open(log_path, "ab") as log_file:
            try:
                return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
                                        cwd=runner_dir, env=env, start_new_session=True)
            except OSError as exc:
                raise DriverError(f"model server could not be started: {exc}") from None
