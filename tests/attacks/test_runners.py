"""Attacks from inside a runner: recipe code signed by the test's trust root that looks for plnt's
secrets in its environment, or tries to exhaust memory and file descriptors. Each goes through a
live `plnt up` (tests/attacks/live.py) and asserts what the recipe saw or could do, that nothing was
written outside the state directory, and that the version already serving keeps answering."""

from __future__ import annotations

import asyncio
import os
import shutil
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from plnt.reconciler.drivers.spawn import RUNNER_ENV_NAMES, allowlisted_env
from pydantic import SecretStr

from tests.attacks.live import AttackRepo, OutsideWrites, assert_still_serving, live_plnt
from tests.conftest import EXAMPLE
from tests.e2e.harness import hook, invoke, wait_phase

pytestmark = pytest.mark.integration

SECRETS = {
    "PLNT_GATEWAY_TOKENS": "gateway-token-secret",
    "AWS_SECRET_ACCESS_KEY": "aws-secret",
    "AWS_ACCESS_KEY_ID": "AKIAATTACK",
    "OPENAI_API_KEY": "sk-an-llm-key-of-another-name",
    "GIT_PASSWORD": "git-secret",
}
LLM_KEY_ENV = "PLNT_ATTACK_LLM_KEY"  # the one variable the operator names (--llm-api-key-env)
LLM_KEY = "the-named-llm-key"

# Appended to 1.3.0's steps.py: safety_check also reports what the runner sees and can do.
PROBE = '''

import os as _os
import resource as _resource

HOG = {hog!r}  # "report": try past the limits and report; "crash": try past them and fail the step


def _limits():
    return {{name: list(_resource.getrlimit(getattr(_resource, name)))
            for name in ("RLIMIT_AS", "RLIMIT_NOFILE", "RLIMIT_NPROC")}}


def _try_limits():
    seen = {{}}
    try:
        block = bytearray(1024 * 2**20)  # 1 GiB, past a 512 MiB address-space limit
        seen["memory"] = "allocated %d bytes" % len(block)
        del block
    except MemoryError:
        if HOG == "crash":
            raise
        seen["memory"] = "MemoryError"
    files = []
    try:
        while len(files) < 100_000:
            files.append(open(_os.devnull))
    except OSError as exc:
        seen["open_files"] = len(files)
        seen["open_error"] = exc.strerror
    if HOG != "crash":  # "crash" leaks them, so the runner cannot accept connections any more
        for handle in files:
            handle.close()
    try:
        _resource.setrlimit(_resource.RLIMIT_AS, (_resource.RLIM_INFINITY, _resource.RLIM_INFINITY))
        seen["raise_limit"] = "raised"
    except (OSError, ValueError) as exc:
        seen["raise_limit"] = str(exc)
    return seen


_safety_check = safety_check


async def safety_check(ctx):
    out = await _safety_check(ctx)
    out["probe"] = {{
        "env": dict(_os.environ), "cwd": _os.getcwd(), "limits": _limits(),
        "tried": _try_limits() if HOG else None,
    }}
    return out
'''

LIMITED_BACKEND = """\
apiVersion: plnt.work/v1
kind: PlntBackend
metadata:
  name: local
spec:
  type: local
  runnerLimits:
    memoryMiB: 512
    openFiles: 64
    processes: 20000
"""


def probe_recipe(tmp_path: Path, version: str = "1.3.0", hog: str = "") -> Path:
    """1.3.0's sources, as `version`, with the probe in steps.py."""
    target = tmp_path / f"probe-{version}-{hog or 'env'}"
    shutil.copytree(EXAMPLE / "recipes" / "review-responder" / "1.3.0", target)
    workflow = target / "workflow.yaml"
    workflow.write_text(workflow.read_text().replace("version: 1.3.0", f"version: {version}"))
    steps = target / "steps.py"
    steps.write_text(steps.read_text() + textwrap.dedent(PROBE.format(hog=hog)))
    return target


@pytest.fixture
def secrets_in_env() -> Iterator[None]:
    """plnt's own environment holds credentials (as a real deployment's does)."""
    saved = {name: os.environ.get(name) for name in [*SECRETS, LLM_KEY_ENV]}
    os.environ.update(SECRETS)
    os.environ[LLM_KEY_ENV] = LLM_KEY
    yield
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def cli_environment() -> dict[str, Any]:
    """The settings `plnt up` builds from its environment (cli/options.py RunnerOptions does the same)."""
    return {"runner_env": allowlisted_env(os.environ), "llm_api_key_env": LLM_KEY_ENV,
            "llm_api_key": SecretStr(os.environ[LLM_KEY_ENV])}


async def probe(plnt: Any) -> dict[str, Any]:
    response = await invoke(plnt)
    assert response.status_code == 200, response.text
    return response.json()["output"]["probe"]


async def test_recipe_code_sees_no_secret_of_plnt_only_the_named_llm_key_in_its_own_directory(
    attack_repo: AttackRepo, tmp_path: Path, temporal_address: str, temporal_namespace: str,
    secrets_in_env: None,
) -> None:
    async with live_plnt(attack_repo, tmp_path, temporal_address, temporal_namespace, **cli_environment()) as plnt:
        attack_repo.publish("review-responder", "1.3.0", source=probe_recipe(tmp_path / "src"))
        attack_repo.deploy("review-responder@1.3.0")
        outside = OutsideWrites([tmp_path], ignore=[plnt.state.root])
        await hook(plnt)
        await wait_phase(plnt, "Ready", version="1.3.0", timeout=60)
        seen = await probe(plnt)

        env = seen["env"]
        assert not set(SECRETS) & set(env), f"plnt's secrets reached recipe code: {set(SECRETS) & set(env)}"
        assert not [v for v in env.values() if v in SECRETS.values()]
        assert env[LLM_KEY_ENV] == LLM_KEY, "the one LLM key the operator named does reach the runner"
        allowed = RUNNER_ENV_NAMES | {"HOME", "TMPDIR", "PYTHONNOUSERSITE", LLM_KEY_ENV}
        assert {k for k in env if not k.startswith("LC_")} <= allowed, env
        # (c) its working directory, HOME and TMPDIR are its own directory inside the state dir
        assert seen["cwd"] == env["HOME"] == env["TMPDIR"], seen
        assert Path(seen["cwd"]).parent == plnt.state.runner_logs and Path(seen["cwd"]).name.startswith(
            "default.review-responder.1.3.0."), seen["cwd"]
        await assert_still_serving(plnt, "1.3.0")
        outside.assert_none()


async def test_memory_and_open_files_limits_hold_and_a_release_that_hits_them_fails_alone(
    attack_repo: AttackRepo, tmp_path: Path, temporal_address: str, temporal_namespace: str,
) -> None:
    (attack_repo.path / "backends" / "local.yaml").write_text(LIMITED_BACKEND)
    attack_repo.repo.commit("runner limits: 512 MiB, 64 open files")
    async with live_plnt(attack_repo, tmp_path, temporal_address, temporal_namespace) as plnt:
        # A recipe that tries past both limits, catches the errors and reports them.
        attack_repo.publish("review-responder", "1.3.0", source=probe_recipe(tmp_path / "src", hog="report"))
        attack_repo.deploy("review-responder@1.3.0")
        outside = OutsideWrites([tmp_path], ignore=[plnt.state.root])
        await hook(plnt)
        await wait_phase(plnt, "Ready", version="1.3.0", timeout=60)
        seen = await probe(plnt)
        assert seen["limits"]["RLIMIT_AS"] == [512 * 2**20, 512 * 2**20], seen["limits"]
        assert seen["limits"]["RLIMIT_NOFILE"] == [64, 64], seen["limits"]
        assert seen["limits"]["RLIMIT_NPROC"] == [20000, 20000], seen["limits"]
        assert seen["tried"]["memory"] == "MemoryError", seen["tried"]
        assert seen["tried"]["open_files"] < 64 and seen["tried"]["open_error"] == "Too many open files", seen
        if os.geteuid() != 0:  # root holds CAP_SYS_RESOURCE and may raise its own hard limits
            assert seen["tried"]["raise_limit"] != "raised", seen["tried"]
        await assert_still_serving(plnt, "1.3.0")

        # A release that hits the limits and does not cope: its smoke test fails, it is rolled back,
        # and 1.3.0 (another runner, another process) keeps serving; plnt is not touched.
        outside.assert_none()
        attack_repo.publish("review-responder", "1.4.0", source=probe_recipe(tmp_path / "src", "1.4.0", hog="crash"))
        attack_repo.deploy("review-responder@1.4.0")
        outside = OutsideWrites([tmp_path], ignore=[plnt.state.root])
        await hook(plnt)
        status = await wait_phase(plnt, "RolledBack", version="1.3.0", timeout=90)  # version: what serves
        assert "smoke test failed" in status["message"] and "MemoryError" in status["message"], status
        await assert_still_serving(plnt, "1.3.0")
        async with httpx.AsyncClient(trust_env=False) as client:
            assert (await client.get(f"{plnt.url}/healthz")).status_code == 200
        outside.assert_none()


def hanging_recipe(tmp_path: Path, version: str) -> Path:
    """1.3.0's sources as `version`, whose module never finishes importing in a runner, so the runner
    never answers. (Only in a runner: whether plnt itself imports recipes is not this test's subject.)"""
    target = tmp_path / f"hang-{version}"
    shutil.copytree(EXAMPLE / "recipes" / "review-responder" / "1.3.0", target)
    workflow = target / "workflow.yaml"
    workflow.write_text(workflow.read_text().replace("version: 1.3.0", f"version: {version}"))
    steps = target / "steps.py"
    # A runner's command line names its release, exec'd or forked from the zygote (which rewrites
    # its children's to the exec'd form); sys.argv[0] would be the zygote's in a forked one.
    steps.write_text("import time\n\nif b'--release-id' in open('/proc/self/cmdline', 'rb').read():\n"
                     "    time.sleep(3600)\n" + steps.read_text())
    return target


def runner_pids_of(plnt: Any, version: str) -> list[int]:
    """Live runner processes of this plnt serving `version` (their --release-id names it)."""
    marker = f"default.review-responder.{version}.".encode()
    found = []
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0") if entry.name.isdigit() else []
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] if argv else "X"
        except OSError:
            continue
        if b"plnt.runner" in argv[:3] and any(a.startswith(marker) for a in argv) and state not in ("Z", "X") \
                and str(plnt.state.root).encode() in b" ".join(argv):
            found.append(int(entry.name))
    return found


async def test_a_runner_that_never_answers_is_stopped_when_a_newer_commit_supersedes_its_install(
    attack_repo: AttackRepo, tmp_path: Path, temporal_address: str, temporal_namespace: str,
) -> None:
    """The install activity is cancelled mid health check (the saga is superseded): its runner is
    stopped at once, not left running unrecorded, and the newer commit deploys."""
    async with live_plnt(attack_repo, tmp_path, temporal_address, temporal_namespace) as plnt:
        attack_repo.publish("review-responder", "1.6.0", source=hanging_recipe(tmp_path / "src", "1.6.0"))
        attack_repo.deploy("review-responder@1.6.0")
        outside = OutsideWrites([tmp_path], ignore=[plnt.state.root])
        await hook(plnt)
        # The hanging runner has started and is recorded in STATE/runner-pids. (Recorded just after
        # the zygote forks it, before its health check: a busy machine can show the process first.)
        for _ in range(600):
            pids = runner_pids_of(plnt, "1.6.0")
            if pids and (plnt.state.root / "runner-pids" / f"{pids[0]}.json").exists():
                break
            await asyncio.sleep(0.05)
        [hanging] = runner_pids_of(plnt, "1.6.0")
        assert (plnt.state.root / "runner-pids" / f"{hanging}.json").exists()
        await assert_still_serving(plnt)

        attack_repo.deploy("review-responder@1.3.0")  # a newer commit: the 1.6.0 saga is superseded
        outside = OutsideWrites([tmp_path], ignore=[plnt.state.root])
        await hook(plnt)
        await wait_phase(plnt, "Ready", version="1.3.0", timeout=90)
        assert runner_pids_of(plnt, "1.6.0") == [], "the superseded install's runner is still running"
        assert not (plnt.state.root / "runner-pids" / f"{hanging}.json").exists()
        assert len(runner_pids_of(plnt, "1.3.0")) == 1 and runner_pids_of(plnt, "1.2.0") == []
        await assert_still_serving(plnt, "1.3.0")
        outside.assert_none()
