"""The `plnt` command line: up, validate, plan, status."""

from __future__ import annotations

import asyncio
import contextlib
import enum
import hashlib
import json
import logging
import os
import signal
import sys
import tempfile
from collections.abc import Callable
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer
from plnt.core.specs.limits import SpecLimits
from plnt.core.specs.loader import DEFAULT_LIMITS, Problem, SourceFile, SpecSet, load_sources, read_file_spec, read_tree
from plnt.reconciler.redact import redact
from plnt.reconciler.settings import RetrySettings, Settings
from pydantic import ValidationError

app = typer.Typer(
    name="plnt",
    help="GitOps reconciler for micro-agent workflows: specs in git, signed recipes, canary sagas on Temporal.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


# Spec limits a user may need to raise (a large monorepo); the rest have defaults in SpecLimits.
MaxSpecFiles = Annotated[int, typer.Option(help="Refuse a commit with more spec files than this.", min=1)]
MaxSpecFileKb = Annotated[int, typer.Option(help="Refuse a spec file larger than this many KiB.", min=1)]
# ModelDeployments on Kubernetes backends (the Helm driver's model-server releases).
ModelInstallTimeout = Annotated[float, typer.Option(min=1, help=(
    "Seconds helm waits for a model-server release (weights fetch + server start); a ModelDeployment's saga "
    "install/promote steps get this plus 300 s. With the roles apart: the same value for reconcile and worker."))]
GpuResource = Annotated[str | None, typer.Option(help=(
    "Extended resource model servers' GPUs are counted in (e.g. amd.com/gpu); default: the GPU class when it is "
    "a device plugin's resource, else nvidia.com/gpu (the class is then the GPU pool's node label)."))]


class RunnerStart(str, enum.Enum):
    fork = "fork"
    exec = "exec"


RunnerStartOption = Annotated[RunnerStart, typer.Option(
    "--runner-start",
    help="How local runners start: fork (from one pre-imported zygote process: milliseconds and a few MiB "
         "each; Linux) or exec (a fresh Python per runner: ~0.5 s CPU and ~35 MiB each).")]


def _spec_limits(max_spec_files: int, max_spec_file_kb: int) -> SpecLimits:
    return SpecLimits(max_files=max_spec_files, max_file_bytes=max_spec_file_kb * 1024)


# The gateway's options: `plnt up` and `plnt gateway` take the same ones.
GatewayHost = Annotated[str, typer.Option(help="Gateway address.")]
GatewayPort = Annotated[int, typer.Option(help="Gateway port.")]
TokensFile = Annotated[Path | None, typer.Option(
    help="Gateway bearer tokens: one 'TOKEN' or 'TOKEN workflow1,workflow2' per line, # comments. "
         "PLNT_GATEWAY_TOKENS (comma-separated) adds unrestricted tokens.")]
InsecureNoAuth = Annotated[bool, typer.Option(
    "--insecure-no-auth", help="Serve the gateway without tokens on a non-loopback --host (refused otherwise).")]
MaxBodyBytes = Annotated[int, typer.Option(help="Gateway: larger request bodies get 413.")]
GatewayTimeout = Annotated[float, typer.Option(
    help="Gateway: 504 when a runner sends nothing for this many seconds (streams: between two chunks).")]
MaxHeaderBytes = Annotated[int, typer.Option(help="Gateway: larger request heads get 431.")]
HeaderTimeout = Annotated[float, typer.Option(
    help="Gateway: close connections whose request headers are not complete within this many seconds.")]
GatewayWorkers = Annotated[int, typer.Option(min=0, max=64, help=(
    "Processes answering on the gateway port (SO_REUSEPORT, each its own accept queue): 0 (default) is one "
    "per core, at most 4; 1 serves the gateway from one process."))]
InternalTokenFile = Annotated[Path | None, typer.Option(
    help="File whose first line is the internal token: GET /internal/routes (the route table `plnt gateway` "
         "follows) accepts it (or an admin token); without it that endpoint answers 404.")]


# Pull-request review as deploy approval: `plnt up` and `plnt reconcile` take the same options.
ForgeKind = Annotated[str | None, typer.Option(help=(
    "The spec repository's forge (github, gitlab or gitea): where --require-approval reads approvals and "
    "each rollout's verdict goes as a commit status plnt/NAMESPACE/NAME."))]
ForgeApiUrl = Annotated[str | None, typer.Option(help=(
    "The forge's REST API: https://api.github.com, https://gitlab.example/api/v4, https://gitea.example/api/v1."))]
ForgeProject = Annotated[str | None, typer.Option(help="OWNER/REPO on the forge (GitLab: the project's full path).")]
ForgeTokenEnv = Annotated[str | None, typer.Option(help="NAME of the environment variable holding the forge token.")]
ForgeTokenFile = Annotated[Path | None, typer.Option(help="File holding the forge token.")]
RequireApproval = Annotated[bool, typer.Option("--require-approval", help=(
    "Deploy a commit only when the pull request that brought it was approved on its head commit and the plan "
    "digest `plnt review` posted there equals the one computed now; otherwise hold it, with the reason in status."))]
Approvers = Annotated[list[str] | None, typer.Option("--approvers", help=(
    "With --require-approval: count approvals only from these users and teams (comma-separated or repeated: "
    "'alice,acme/deployers'; a team is ORG/TEAM_SLUG, on GitLab a group's full path), who also need write "
    "permission on the repository (GitLab: Maintainer). Default: anyone with that permission."))]
CodeOwners = Annotated[bool, typer.Option("--code-owners", help=(
    "With --require-approval: each file a pull request changes also needs an approval from one of its owners in "
    "CODEOWNERS (.github/, .gitlab/, .gitea/, the root or docs/), as the file was on the tracked branch before it."))]
ReportStatus = Annotated[bool, typer.Option("--report-status/--no-report-status", help=(
    "With --forge: report each rollout on its commit as status plnt/NAMESPACE/NAME."))]
WriteNotes = Annotated[bool, typer.Option("--write-notes", help=(
    "Record each rollout's outcome as a git note (refs/notes/plnt) on its commit and push it to the spec "
    "repository (needs push rights): git log --notes=plnt shows them."))]
Previews = Annotated[list[str] | None, typer.Option("--previews", help=(
    "Deploy the WorkflowRuns a pull request changes as previews: a ref glob such as 'refs/pull/*/head' "
    "(GitHub, Gitea) or 'refs/merge-requests/*/head' (GitLab). Repeatable."))]


def _forge_settings(forge: str | None, forge_api_url: str | None, forge_project: str | None,
                    forge_token_env: str | None, forge_token_file: Path | None, require_approval: bool,
                    report_status: bool, write_notes: bool, previews: list[str] | None,
                    approvers: list[str] | None = None, code_owners: bool = False) -> dict[str, Any]:
    try:
        token = _secret_from(forge_token_env, forge_token_file, "--forge-token")
    except ValueError as exc:
        raise _fail(str(exc), 2) from exc
    return dict(forge=forge, forge_api_url=forge_api_url, forge_project=forge_project, forge_token=token,
                require_approval=require_approval, report_status=report_status, write_notes=write_notes,
                previews=tuple(previews or ()),
                approvers=tuple(a.strip() for option in approvers or () for a in option.split(",") if a.strip()),
                code_owners=code_owners)


class Format(str, Enum):
    text = "text"
    json = "json"
    markdown = "markdown"


TOKEN_HELP = ("Gateway bearer token, when the gateway requires one. Prefer PLNT_TOKEN or --token-file: "
              "a value on the command line is visible to other users in `ps`.")
TOKEN_FILE_HELP = "File holding the gateway bearer token (or PLNT_TOKEN_FILE); wins over --token/PLNT_TOKEN."


def _secret(value: str | None, file: Path | None, option: str) -> str | None:
    """A secret given as a value (an environment variable, ideally) or as a file (first line)."""
    if file is None:
        return value
    try:
        lines = file.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise _fail(f"cannot read the secret for {option} from {file}: {exc}", 2) from exc
    if not lines or not lines[0].strip():
        raise _fail(f"{file} is empty: it should hold the secret for {option} on its first line", 2)
    return lines[0].strip()


class _RedactingFormatter(logging.Formatter):
    """Log lines (tracebacks included) with URL credentials replaced: a last line of defence."""

    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))


def _setup_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stderr,
    )
    for handler in logging.getLogger().handlers:
        handler.setFormatter(_RedactingFormatter("%(asctime)s %(levelname)s %(name)s %(message)s", "%H:%M:%S"))
    for noisy in ("temporalio", "httpx", "httpcore", "git", "uvicorn.error"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


@app.command()
def up(
    repo: Annotated[str, typer.Option(envvar="PLNT_REPO", help=(
        "Spec repository: a path, file://, https:// or ssh URL (or PLNT_REPO). Credentials in an https URL "
        "are never logged or stored; pass such a URL as PLNT_REPO, not on the command line (ps shows it).")
    )],
    path: Annotated[str, typer.Option(help="Subdirectory of the repository holding the specs.")] = "",
    branch: Annotated[str, typer.Option(help="Branch to track.")] = "main",
    git_credentials_file: Annotated[Path | None, typer.Option(help=(
        "The repository's credentials: TOKEN or USER:TOKEN on the first line (https), or an ssh private key."))] = None,
    git_known_hosts: Annotated[Path | None, typer.Option(help=(
        "ssh known_hosts for the repository's host; without it the first host key is trusted, then pinned."))] = None,
    verify_commits: Annotated[str, typer.Option(help=(
        "Deploy only signed commits: none, head (the newest commit) or all (every commit since the last "
        "reconciled one, merged branches included).") )] = "none",
    allowed_signers: Annotated[Path | None, typer.Option(
        help="Trusted SSH signers (git's allowed-signers format).")] = None,
    gpg_keys: Annotated[Path | None, typer.Option(help="Directory of trusted OpenPGP public keys (*.asc, *.gpg).")] = None,
    state_dir: Annotated[Path, typer.Option(help="Where plnt keeps its state.")] = Path(".plnt"),
    host: GatewayHost = "127.0.0.1",
    port: GatewayPort = 8000,
    interval: Annotated[float, typer.Option(help="Seconds between polls of the repository.")] = 5.0,
    temporal_address: Annotated[
        str | None, typer.Option(help="HOST:PORT of a Temporal server; without it plnt starts the embedded dev server.")
    ] = None,
    temporal_namespace: Annotated[str, typer.Option(help="Temporal namespace of plnt's sagas.")] = "default",
    task_queue: Annotated[str, typer.Option(help="Temporal task queue of plnt's sagas and activities.")] = "plnt-sagas",
    temporal_tls: Annotated[bool, typer.Option(
        "--temporal-tls", help="Connect to --temporal-address over TLS with the system's CAs.")] = False,
    temporal_tls_cert: Annotated[Path | None, typer.Option(help="Client certificate (PEM) for mutual TLS.")] = None,
    temporal_tls_key: Annotated[Path | None, typer.Option(help="Private key (PEM) of --temporal-tls-cert.")] = None,
    temporal_tls_ca: Annotated[Path | None, typer.Option(
        help="CA certificate (PEM) the Temporal server's certificate must chain to (default: the system's).")] = None,
    temporal_api_key_env: Annotated[str | None, typer.Option(
        help="NAME of the environment variable holding a Temporal API key (implies TLS).")] = None,
    temporal_api_key_file: Annotated[Path | None, typer.Option(
        help="File holding a Temporal API key (implies TLS).")] = None,
    s3_endpoint_url: Annotated[str | None, typer.Option(help="S3-compatible endpoint for s3:// registries.")] = None,
    s3_region: Annotated[str | None, typer.Option(help="Region for s3:// registries.")] = None,
    oci_insecure_host: Annotated[list[str] | None, typer.Option(
        help="OCI registry (host or host:port) allowed over plain HTTP, loopback included (nothing is by "
             "default). Repeatable.")] = None,
    allow_file_registry: Annotated[list[Path] | None, typer.Option(
        help="Directory under which file:/// registries may be read (none by default; file:rel/dir inside "
             "the spec repository always works). Repeatable.")] = None,
    llm_venv: Annotated[Path | None, typer.Option(help=(
        "The model runtime's venv for ModelDeployments (llama.cpp's server; `make install-llm`); default: "
        ".venv-llm beside plnt's code."))] = None,
    weights_budget_gb: Annotated[float, typer.Option(
        "--weights-budget", help="GiB the weights store (STATE/weights) may use; a pull past it fails.", min=0.001)] = 20,
    model_install_timeout: ModelInstallTimeout = 1800.0,
    gpu_resource: GpuResource = None,
    max_recipe_mb: Annotated[int, typer.Option(help="Refuse recipes that unpack to more than this.")] = 256,
    max_download_mb: Annotated[int, typer.Option(
        min=1, help="Stop a recipe download (archive + bundle, any registry) past this many MiB.")] = 256,
    max_sagas: Annotated[int, typer.Option(help="Sagas (deploys) running at once, across WorkflowRuns.")] = 8,
    max_spec_files: MaxSpecFiles = 10_000,
    max_spec_file_kb: MaxSpecFileKb = 1024,
    retry_attempts: Annotated[int, typer.Option(help="Attempts per saga step, the first included.")] = 3,
    retry_initial_s: Annotated[float, typer.Option(help="Seconds before a step's first retry (doubling after).")] = 2.0,
    tokens_file: TokensFile = None,
    insecure_no_auth: InsecureNoAuth = False,
    max_body_bytes: MaxBodyBytes = 2**20,
    gateway_timeout: GatewayTimeout = 60.0,
    max_header_bytes: MaxHeaderBytes = 64 * 1024,
    header_timeout: HeaderTimeout = 10.0,
    gateway_workers: GatewayWorkers = 0,
    control_plane_gateway: Annotated[bool, typer.Option(
        "--control-plane-gateway", help=(
            "With --gateway-workers N > 1: plnt up's own process is one of the N on the gateway port (default: "
            "N worker processes, and the control plane answers only them, so a busy reconcile never stalls an "
            "invocation)."))] = False,
    webhook_secret_file: Annotated[Path | None, typer.Option(
        help="POST /hooks/git then needs the forge's signature made with this secret (GitHub X-Hub-Signature-256, "
             "Gitea X-Gitea-Signature, GitLab X-Gitlab-Token), from any address; without it only loopback callers.")] = None,
    loop: Annotated[str, typer.Option(
        help="Event loop: uvloop (default when installed; ~1.5x less gateway CPU per request, "
             "see bench/gateway_overhead.py) or asyncio.")] = "auto",
    llm_url: Annotated[str | None, typer.Option(
        help="OpenAI-compatible model server for the local runners (vLLM, TGI, SGLang, llama.cpp); "
             "default: the offline mock backend.")] = None,
    llm_model: Annotated[str | None, typer.Option(help="Model name to ask the model server for.")] = None,
    llm_api_key_env: Annotated[str | None, typer.Option(
        help="NAME of the environment variable holding the model server's API key (the key is never logged).")] = None,
    runner_start: RunnerStartOption = RunnerStart.fork,
    internal_token_file: InternalTokenFile = None,
    mirror_status: Annotated[bool, typer.Option(
        "--mirror-status", help="Apply each WorkflowRun as a plnt.work/v1 custom resource and write its status there "
                                "(kubectl get wfr); needs the CRDs (plnt crds) and --kubeconfig or in-cluster config.")] = False,
    kubeconfig: Annotated[Path | None, typer.Option(help="Kubeconfig for --mirror-status (default: in-cluster).")] = None,
    forge: ForgeKind = None,
    forge_api_url: ForgeApiUrl = None,
    forge_project: ForgeProject = None,
    forge_token_env: ForgeTokenEnv = None,
    forge_token_file: ForgeTokenFile = None,
    require_approval: RequireApproval = False,
    approvers: Approvers = None,
    code_owners: CodeOwners = False,
    report_status: ReportStatus = True,
    write_notes: WriteNotes = False,
    previews: Previews = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Run plnt: Temporal, a worker, the reconciler and the gateway; deploy through local runner processes."""
    import os

    from plnt.core.auth import exposure_problem, load_tokens
    from plnt.reconciler.drivers.spawn import allowlisted_env

    _setup_logging(verbose)
    env_tokens = tuple(t.strip() for t in os.environ.get("PLNT_GATEWAY_TOKENS", "").split(",") if t.strip())
    internal_token = _secret(None, internal_token_file, "--internal-token-file")
    try:
        temporal_api_key = _secret_from(temporal_api_key_env, temporal_api_key_file, "--temporal-api-key")
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    try:
        settings = Settings(repo=repo, path=path, branch=branch, state_dir=state_dir, host=host, port=port,
                            interval_s=interval, temporal_address=temporal_address, s3_endpoint_url=s3_endpoint_url,
                            s3_region=s3_region, oci_insecure_hosts=tuple(oci_insecure_host or ()),
                            file_registry_roots=tuple(p.resolve() for p in allow_file_registry or ()),
                            max_download_bytes=max_download_mb * 2**20,
                            **({"llm_venv": llm_venv.resolve()} if llm_venv is not None else {}),
                            weights_budget_bytes=int(weights_budget_gb * 2**30),
                            model_install_timeout_s=model_install_timeout, gpu_resource=gpu_resource,
                            max_recipe_bytes=max_recipe_mb * 2**20, max_concurrent_sagas=max_sagas,
                            spec_limits=_spec_limits(max_spec_files, max_spec_file_kb),
                            retry=RetrySettings(maximum_attempts=retry_attempts, initial_interval_s=retry_initial_s),
                            gateway_tokens=env_tokens, gateway_tokens_file=tokens_file, insecure_no_auth=insecure_no_auth,
                            gateway_max_body_bytes=max_body_bytes, gateway_request_timeout_s=gateway_timeout,
                            gateway_max_header_bytes=max_header_bytes, gateway_header_timeout_s=header_timeout,
                            gateway_workers=gateway_workers, control_plane_gateway=control_plane_gateway,
                            webhook_secret_file=webhook_secret_file, internal_token=internal_token,
                            llm_url=llm_url, llm_model=llm_model, llm_api_key_env=llm_api_key_env,
                            runner_start=runner_start.value, temporal_namespace=temporal_namespace, task_queue=task_queue, temporal_tls=temporal_tls,
                            temporal_tls_cert=temporal_tls_cert, temporal_tls_key=temporal_tls_key,
                            temporal_tls_ca=temporal_tls_ca, temporal_api_key=temporal_api_key,
                            llm_api_key=(os.environ.get(llm_api_key_env) or None) if llm_api_key_env else None,
                            runner_env=allowlisted_env(os.environ), mirror_status=mirror_status, kubeconfig=kubeconfig,
                            git_credentials_file=git_credentials_file, git_known_hosts=git_known_hosts,
                            verify_commits=verify_commits, allowed_signers=allowed_signers, gpg_keys=gpg_keys,
                            **_forge_settings(forge, forge_api_url, forge_project, forge_token_env, forge_token_file,
                                              require_approval, report_status, write_notes, previews, approvers,
                                              code_owners))
    except ValidationError as exc:
        typer.echo("error: " + "; ".join(str(e["msg"]).removeprefix("Value error, ") for e in exc.errors()), err=True)
        raise typer.Exit(2) from exc
    if llm_url and not llm_model:
        typer.echo("error: --llm-url needs --llm-model (the model the server should use)", err=True)
        raise typer.Exit(2)
    if llm_api_key_env and settings.llm_api_key is None:
        typer.echo(f"error: --llm-api-key-env {llm_api_key_env}: that environment variable is not set", err=True)
        raise typer.Exit(2)
    try:
        tokens = load_tokens(tokens_file, env_tokens)
    except (OSError, ValueError) as exc:
        typer.echo(f"error: cannot read gateway tokens: {exc}", err=True)
        raise typer.Exit(2) from exc
    problem = exposure_problem(host, tokens, insecure_no_auth=insecure_no_auth) or _port_problem(host, port)
    if problem:
        typer.echo(f"error: {problem}", err=True)
        raise typer.Exit(2)
    if loop not in ("auto", "uvloop", "asyncio"):
        typer.echo(f"error: --loop must be auto, uvloop or asyncio, not {loop!r}", err=True)
        raise typer.Exit(2)
    loop_factory = None
    if loop != "asyncio":
        try:
            import uvloop

            loop_factory = uvloop.new_event_loop
        except ImportError:
            if loop == "uvloop":
                typer.echo("error: --loop uvloop: uvloop is not installed", err=True)
                raise typer.Exit(2) from None
    try:
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            runner.run(_up(settings))
    except KeyboardInterrupt:
        pass
    except Exception as exc:  # noqa: BLE001 - one clear line, not a traceback, for start-up failures
        from plnt.core.server import ServerStartError
        from plnt.reconciler.errors import PlntError

        if not isinstance(exc, (PlntError, ServerStartError, OSError)):
            raise
        typer.echo(f"error: plnt could not start: {exc}", err=True)
        raise typer.Exit(2) from exc


def _secret_from(env_name: str | None, file: Path | None, option: str) -> str | None:
    """A secret from the environment variable named, or from a file (never from the command line)."""
    import os

    if env_name and file:
        raise ValueError(f"give {option}-env or {option}-file, not both")
    if env_name:
        value = os.environ.get(env_name, "").strip()
        if not value:
            raise ValueError(f"{option}-env {env_name}: the environment variable is not set or empty")
        return value
    if file:
        try:
            value = file.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"{option}-file {file}: cannot read it ({exc})") from exc
        if not value:
            raise ValueError(f"{option}-file {file} is empty")
        return value
    return None


def _port_problem(host: str, port: int) -> str | None:
    import socket

    if port == 0:
        return None
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            return f"cannot listen on {host}:{port} ({exc.strerror}); is another plnt running? choose a port with --port"
    return None


async def _up(settings: Settings) -> None:
    from plnt.reconciler.app import start  # heavy imports only for `up`

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    plnt = await start(settings)
    typer.echo(f"plnt is up: gateway {plnt.url}  (GET /workflows, POST /workflows/NAME/invoke); "
               f"UI {plnt.url}/ui; Ctrl-C stops", err=True)
    await stop.wait()
    typer.echo("plnt: stopping (runners, worker, gateway, Temporal)...", err=True)
    await plnt.stop()
    typer.echo("plnt: stopped", err=True)


@app.command()
def validate(
    path: Annotated[Path, typer.Argument(help="A spec directory or a single YAML file.")],
    max_spec_files: MaxSpecFiles = 10_000,
    max_spec_file_kb: MaxSpecFileKb = 1024,
) -> None:
    """Check specs: exit 0 with a summary, or one FILE:LINE: field: message line per problem and exit 1.
    Warnings (FILE:LINE: field: warning: ...) do not change the exit code."""
    if not path.exists():
        typer.echo(f"{path}: no such file or directory", err=True)
        raise typer.Exit(2)
    limits = _spec_limits(max_spec_files, max_spec_file_kb)
    note = ""
    if path.is_file():
        specs, problems = load_sources([read_file_spec(path, str(path), limits)], check_references=None, limits=limits)
        if (specs.workflow_runs or specs.model_deployments) and not specs.backends:
            note = " (backend references not checked: the file declares no PlntBackend; validate the directory)"
    else:
        # Display paths include PATH, in problem lines and in messages pointing at another file.
        files, read_problems = read_tree(path, limits)
        specs, problems = load_sources([SourceFile(path=str(path / f.path), text=f.text) for f in files], limits=limits)
        problems = sorted([Problem(str(path / p.file), p.line, p.field, p.message) for p in read_problems] + problems,
                          key=lambda p: (p.file, p.line))
    for warning in specs.warnings:
        typer.echo(str(warning))
    if problems:
        for problem in problems:
            typer.echo(str(problem))
        typer.echo(f"{len(problems)} problem{'s' if len(problems) != 1 else ''} found", err=True)
        raise typer.Exit(1)
    typer.echo(f"{path}: valid: {_counts(specs)}{note}")


def _counts(specs: SpecSet) -> str:
    models = f"{len(specs.model_deployments)} ModelDeployment(s), " if specs.model_deployments else ""
    return (f"{len(specs.workflow_runs)} WorkflowRun(s), {models}{len(specs.backends)} PlntBackend(s), "
            f"{len(specs.trust_policies)} RecipeTrustPolicy(s), {len(specs.recipes)} recipe Workflow(s)")


@app.command()
def plan(
    repo: Annotated[str, typer.Option(envvar="PLNT_REPO", help="Spec repository: a path or URL (or PLNT_REPO).")],
    path: Annotated[str, typer.Option(help="Subdirectory holding the specs.")] = "",
    branch: Annotated[str, typer.Option(help="Branch (when --head is not given).")] = "main",
    base: Annotated[str | None, typer.Option(help="Base revision: plan what --head changes relative to it.")] = None,
    head: Annotated[str | None, typer.Option(help="Head revision (default: the branch).")] = None,
    state_dir: Annotated[Path, typer.Option(help="State of a plnt up, for a plan against live state.")] = Path(".plnt"),
    format: Annotated[Format, typer.Option("--format", "-f")] = Format.text,
    cache_dir: Annotated[Path | None, typer.Option(
        envvar="PLNT_CACHE_DIR", help="Where parsed spec files are kept between plans, by git blob id "
        "(default: $XDG_CACHE_HOME/plnt or ~/.cache/plnt; or PLNT_CACHE_DIR).")] = None,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Parse every spec file; read and write no cache.")] = False,
) -> None:
    """What would change: against the live state in --state-dir, or between --base and --head (a pull request)."""
    from plnt.reconciler.plan.view import InvalidRevision, InvalidSpecsAt, plan_between
    from plnt.reconciler.source.git import GitSource, SourceError
    from plnt.reconciler.source.parse_cache import DiskParseCache

    with tempfile.TemporaryDirectory(prefix="plnt-plan-") as scratch:
        source = GitSource(repo, Path(scratch) / "clone", branch=branch, path=path)
        # Files unchanged since the last plan are not parsed again (base and head share one cache anyway).
        disk = None if no_cache else DiskParseCache(cache_dir or _default_cache_dir(), DEFAULT_LIMITS)
        if disk is not None:
            source.parse_cache = disk
        try:
            # The same plan as the UI's preview (GET /plan): plan_view.plan_between.
            view = plan_between(source, head=head, base=base, live=lambda: _live_from_state(state_dir),
                                live_label=str(state_dir))
        except InvalidSpecsAt as exc:
            typer.echo(f"commit {exc.commit[:12]} has invalid specs:", err=True)
            for problem in exc.problems:
                typer.echo(str(problem), err=True)
            raise typer.Exit(1) from exc
        except (SourceError, InvalidRevision) as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from exc
        if disk is not None:
            disk.save()
    if format is Format.json:
        typer.echo(json.dumps(view.cli_json(), indent=2))
    elif format is Format.markdown:
        typer.echo(view.markdown(), nl=False)
    else:
        typer.echo(view.text(), nl=False)


def _default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "plnt"


def _live_from_state(state_dir: Path) -> dict[str, Any]:
    from plnt.core.status import WorkflowRunStatus
    from plnt.reconciler.plan.diff import live_from
    from plnt.reconciler.state import LiveWorkflow, read_json
    from plnt.reconciler.status_store import read_statuses

    statuses = [WorkflowRunStatus.model_validate(v) for v in read_statuses(state_dir / "status.json").values()]
    records = sorted((state_dir / "releases").glob("*.json")) if (state_dir / "releases").exists() else []
    releases = {item.key: item for item in (LiveWorkflow.model_validate(read_json(r)) for r in records)}
    return live_from(releases, statuses)


@app.command()
def status(
    url: Annotated[str, typer.Option(help="Gateway of a running plnt up.")] = "http://127.0.0.1:8000",
    state_dir: Annotated[Path, typer.Option(help="Read this state directory if the gateway does not answer.")] = Path(".plnt"),
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON (the shape of GET /workflows).")] = False,
    token: Annotated[str | None, typer.Option(envvar="PLNT_TOKEN", help=TOKEN_HELP)] = None,
    token_file: Annotated[Path | None, typer.Option(envvar="PLNT_TOKEN_FILE", help=TOKEN_FILE_HELP)] = None,
) -> None:
    """Each WorkflowRun's phase, version, canary share, endpoint, commit and message."""
    import httpx  # here, not at the top: it is 0.13 s of every plnt command's start (plnt plan in CI)
    token = _secret(token, token_file, "--token")
    source: dict[str, Any] = {}
    try:
        with httpx.Client(trust_env=False, timeout=5, headers=_auth(token)) as client:
            rows = client.get(f"{url}/workflows").raise_for_status().json()
            if not isinstance(rows, list):
                raise ValueError(f"GET {url}/workflows did not answer a list")
            with contextlib.suppress(httpx.HTTPError, ValueError):
                source = client.get(f"{url}/source").raise_for_status().json()
    except (httpx.HTTPError, ValueError):  # nothing there, or something that is not plnt (HTML, other JSON)
        from plnt.core.status import WorkflowRunStatus
        from plnt.reconciler.state import read_json
        from plnt.reconciler.status_store import journal_path, read_statuses

        if not (state_dir / "status.json").exists() and not journal_path(state_dir / "status.json").exists():
            typer.echo(f"error: no plnt answers at {url} and {state_dir} holds no status; is plnt up running?", err=True)
            raise typer.Exit(2) from None
        typer.echo(f"(no plnt answers at {url}; showing the last status saved in {state_dir})", err=True)
        raw = read_statuses(state_dir / "status.json")
        rows = [WorkflowRunStatus.model_validate(v).public() for _, v in sorted(raw.items())]
        source = read_json(state_dir / "source.json", {}) or {}
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    if source:
        commit = (source.get("newestCommit") or "")[:12]
        problems = source.get("problems") or []
        health = f"INVALID ({len(problems)} problem{'s' if len(problems) != 1 else ''}; serving {str(source.get('lastReconciledCommit') or '')[:12]})" if problems else "valid"
        typer.echo(f"source {source.get('repo')} branch {source.get('branch')} commit {commit}: {health}")
        for problem in problems:
            typer.echo(f"  {problem}")
    if not rows:
        typer.echo("No WorkflowRuns.")
        return
    header = f"{'NAMESPACE/NAME':<34} {'PHASE':<11} {'VERSION':<10} {'CANARY':<14} {'COMMIT':<13} {'ENDPOINT':<24} MESSAGE"
    typer.echo(header)
    for row in rows:
        canary = f"{row.get('canaryVersion') or ''} {row['canaryPercent']}%" if row.get("canaryVersion") else "-"
        # A preview (--previews) shows as its WorkflowRun and pull request: default/review-responder [PR #7].
        label = row["namespace"] + "/" + (f"{row['name'].rsplit('--pr', 1)[0]} [PR #{row['preview']}]"
                                          if row.get("preview") else row["name"])
        typer.echo(f"{label:<34} {row['phase']:<11} {row.get('version') or '-':<10} "
                   f"{canary:<14} {(row.get('observedCommit') or '-')[:12]:<13} {_endpoint(row):<24} {_message(row)}")


def _message(row: dict[str, Any]) -> str:
    message = str(row.get("message") or "")
    if row.get("parked"):  # scale to zero (replicas.min: 0)
        return "parked: the next request starts it" + (f"; {message}" if message else "")
    return message


def _endpoint(row: dict[str, Any]) -> str:
    # Runner endpoints are shown to admin tokens only; others reach a workflow through the gateway.
    if row.get("endpoint"):
        return str(row["endpoint"])
    return "-" if "endpoint" in row or not row.get("version") else "(via gateway)"


@app.command()
def history(
    name: Annotated[str, typer.Argument(help="WorkflowRun name.")],
    namespace: Annotated[str, typer.Option(help="WorkflowRun namespace.")] = "default",
    url: Annotated[str, typer.Option(help="Gateway of a running plnt up.")] = "http://127.0.0.1:8000",
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    run: Annotated[str | None, typer.Option(help="One saga run's id (GET /workflows/NAME/rollouts lists them; "
                                            "default: the newest).")] = None,
    token: Annotated[str | None, typer.Option(envvar="PLNT_TOKEN", help=TOKEN_HELP)] = None,
    token_file: Annotated[Path | None, typer.Option(envvar="PLNT_TOKEN_FILE", help=TOKEN_FILE_HELP)] = None,
) -> None:
    """The newest saga's steps for a WorkflowRun: start, duration, attempts, outcome (from Temporal's history)."""
    import httpx
    token = _secret(token, token_file, "--token")
    try:
        with httpx.Client(trust_env=False, timeout=10, headers=_auth(token)) as client:
            params = {"namespace": namespace, **({"run": run} if run else {})}
            response = client.get(f"{url}/workflows/{name}/history", params=params)
    except httpx.HTTPError as exc:
        raise _fail(f"no plnt answers at {url} ({exc}); is plnt up running?", 2) from exc
    if response.status_code == 404:
        raise _fail(response.json().get("error", {}).get("message", f"no saga for {namespace}/{name}"), 1)
    response.raise_for_status()
    data = response.json()
    if as_json:
        typer.echo(json.dumps(data, indent=2))
        return
    result = data.get("result") or {}
    typer.echo(f"saga {data['workflow_id']} run {data['run_id']}: {data['status']}"
               + (f" -> {result.get('phase')}: {result.get('reason')}" if result else ""))
    if data.get("commit"):
        signer = f", signed by {data['signer']}" if data.get("signer") else ""
        typer.echo(f"commit {data['commit'][:12]} version {data.get('version') or '-'}{signer}")
    typer.echo(f"{'STEP':<18} {'STARTED':<26} {'DURATION':>10} {'ATTEMPTS':>8}  OUTCOME")
    for step in data["steps"]:
        duration = f"{step['duration_ms']:.0f} ms" if step["duration_ms"] is not None else "-"
        line = f"{step['step']:<18} {str(step['started_at'] or '-')[:26]:<26} {duration:>10} {step['attempts']:>8}  {step['outcome']}"
        typer.echo(line + (f": {step['error']}" if step.get("error") else ""))


@app.command()
def bench(
    name: Annotated[str, typer.Argument(help="Workflow (WorkflowRun) name, as deployed.")],
    requests: Annotated[int, typer.Option("--requests", "-n", help="Invocations to send.", min=1)] = 200,
    concurrency: Annotated[int, typer.Option("--concurrency", "-c", help="Invocations in flight at once.", min=1)] = 8,
    stream: Annotated[bool, typer.Option("--stream", help="Ask for SSE; also reports TTFT and TPOT.")] = False,
    url: Annotated[str, typer.Option(help="Gateway of a running plnt up (http://).")] = "http://127.0.0.1:8000",
    namespace: Annotated[str | None, typer.Option(help="Namespace, if the name exists in several.")] = None,
    input_json: Annotated[str, typer.Option("--input", help="The invocation body (JSON object: the workflow's inputs).")] = "{}",
    input_file: Annotated[Path | None, typer.Option(help="Read the invocation body from this file instead.")] = None,
    token: Annotated[str | None, typer.Option(envvar="PLNT_TOKEN", help=TOKEN_HELP)] = None,
    token_file: Annotated[Path | None, typer.Option(envvar="PLNT_TOKEN_FILE", help=TOKEN_FILE_HELP)] = None,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for each answer.")] = 60.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print the figures as JSON.")] = False,
) -> None:
    """Load a deployed workflow through the gateway: latency p50/p95/p99, error rate, throughput,
    step-cache hit rate, and with --stream TTFT and TPOT."""
    from urllib.parse import quote

    from plnt.gateway.bench import format_summary, run_load, stats_cache_counts, summarize

    token = _secret(token, token_file, "--token")
    try:
        body = input_file.read_bytes() if input_file else input_json.encode()
        if not isinstance(json.loads(body), dict):
            raise ValueError("the invocation body must be a JSON object")
    except (OSError, ValueError) as exc:
        raise _fail(f"bad --input/--input-file: {exc}", 2) from exc
    base = url.rstrip("/")
    if not base.startswith("http://"):
        raise _fail("--url must be an http:// address (the load generator speaks plain HTTP/1.1)", 2)
    query = f"?namespace={quote(namespace)}" if namespace else ""
    headers = [("authorization", f"Bearer {token}")] if token else []
    auth = {"authorization": f"Bearer {token}"} if token else {}

    def runner_stats() -> Any:
        import httpx

        try:
            with httpx.Client(trust_env=False, timeout=10) as client:
                response = client.get(f"{base}/workflows/{quote(name)}/stats{query}", headers=auth)
        except httpx.HTTPError as exc:
            raise _fail(f"no plnt answers at {base} ({exc}); is plnt up running?", 2) from exc
        if response.status_code in (401, 403):
            raise _fail(f"the gateway refused the token ({response.status_code}); pass --token or set PLNT_TOKEN", 2)
        if response.status_code == 404:
            raise _fail(f"no workflow named {name} at {base} (plnt status lists them)", 1)
        return response.json() if response.status_code == 200 else None

    before = stats_cache_counts(runner_stats())

    async def load() -> Any:
        return await run_load(base, f"/workflows/{quote(name)}/invoke{query}", body, requests=requests,
                              concurrency=concurrency, stream=stream, headers=headers, timeout_s=timeout)

    try:
        import uvloop

        loop_factory = uvloop.new_event_loop
    except ImportError:
        loop_factory = None
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        result = runner.run(load())
    summary = summarize(result)
    after = stats_cache_counts(runner_stats())
    if before is not None and after is not None:
        hits, misses = after[0] - before[0], after[1] - before[1]
        summary["runner_step_cache"] = {"hits": hits, "lookups": hits + misses,
                                        "hit_rate": hits / (hits + misses) if hits + misses else None}
    if as_json:
        typer.echo(json.dumps(summary, indent=2))
        return
    title = (f"plnt bench {name}: {requests} requests, concurrency {concurrency}{', SSE' if stream else ''}, "
             f"through {base}")
    typer.echo(format_summary(summary, title))
    cache = summary.get("runner_step_cache")
    if cache:
        rate = "n/a (no lookups)" if cache["hit_rate"] is None else f"{cache['hit_rate']:.1%}"
        typer.echo(f"step cache hit rate {rate} ({cache['hits']} of {cache['lookups']} lookups, from the runners' /stats)")


recipe_app = typer.Typer(help="Recipe commands: pack, sign, push, verify, digest, and fetch (for runner pods).",
                         no_args_is_help=True)
app.add_typer(recipe_app, name="recipe")


def _auth(token: str | None) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"} if token else {}


def _fail(message: str, code: int = 1) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)


@recipe_app.command("pack")
def recipe_pack(
    directory: Annotated[Path, typer.Argument(help="A recipe directory (holding workflow.yaml).")],
    output: Annotated[Path, typer.Option("-o", "--output", help="Archive to write.")] = Path("recipe.tar.gz"),
) -> None:
    """Pack a recipe directory into a deterministic gzip tar (same content, same bytes, same sha256)."""
    from plnt.core.recipe import RecipeError, check_recipe_dir
    from plnt.reconciler.recipes.archive import pack_recipe_to

    try:
        recipe = check_recipe_dir(directory)  # as data: packing never runs the recipe's code
        digest = pack_recipe_to(directory, output)
    except RecipeError as exc:
        raise _fail(f"{exc}; fix the recipe before packing it") from exc
    except (ValueError, OSError) as exc:
        raise _fail(str(exc)) from exc
    typer.echo(f"{output}: {recipe.name}@{recipe.version} {digest}")


@recipe_app.command("sign")
def recipe_sign(
    artifact: Annotated[Path, typer.Argument(help="The recipe archive to sign.")],
    identity_token: Annotated[str | None, typer.Option(envvar="SIGSTORE_ID_TOKEN", help=(
        "OIDC identity token (in CI, the workflow's token); default: the ambient CI credential. Prefer "
        "SIGSTORE_ID_TOKEN or --identity-token-file: a value on the command line is visible in `ps`."))] = None,
    identity_token_file: Annotated[Path | None, typer.Option(
        help="File holding the OIDC identity token; wins over --identity-token/SIGSTORE_ID_TOKEN.")] = None,
    trust_config: Annotated[Path | None, typer.Option(
        help="Sigstore client trust config JSON (Fulcio, Rekor, trusted root) instead of the public-good instance.")] = None,
    staging: Annotated[bool, typer.Option(help="Use the Sigstore staging instance.")] = False,
) -> None:
    """Sign keylessly with Sigstore: writes ARTIFACT.sigstore.json beside the archive."""
    from plnt.reconciler.recipes.archive import archive_digest
    from sigstore.errors import Error as SigstoreError
    from sigstore.hashes import Hashed
    from sigstore.models import ClientTrustConfig
    from sigstore.oidc import IdentityError, IdentityToken, detect_credential
    from sigstore.sign import SigningContext
    from sigstore_models.common.v1 import HashAlgorithm

    if not artifact.is_file():
        raise _fail(f"{artifact}: no such file", 2)
    identity_token = _secret(identity_token, identity_token_file, "--identity-token")
    try:
        token = identity_token or detect_credential()
    except IdentityError as exc:
        raise _fail(f"cannot detect an ambient OIDC credential: {exc}") from exc
    if not token:
        raise _fail("no identity token: set SIGSTORE_ID_TOKEN or pass --identity-token-file (in CI, your workflow's OIDC token); "
                    "interactive browser sign-in is not supported by plnt", 2)
    try:
        identity = IdentityToken(token)  # checked offline, before any signing service is contacted
    except IdentityError as exc:
        raise _fail(f"the identity token was refused: {exc}") from exc
    try:
        trust = (ClientTrustConfig.from_json(trust_config.read_text()) if trust_config
                 else ClientTrustConfig.staging() if staging else ClientTrustConfig.production())
        digest = bytes.fromhex(archive_digest(artifact).removeprefix("sha256:"))
        context = SigningContext.from_trust_config(trust)
        with context.signer(identity) as signer:
            bundle = signer.sign_artifact(Hashed(algorithm=HashAlgorithm.SHA2_256, digest=digest))
    except IdentityError as exc:
        raise _fail(f"the identity token was refused: {exc}") from exc
    except (SigstoreError, OSError, ValueError) as exc:
        raise _fail(f"signing failed: {exc}") from exc
    except Exception as exc:  # noqa: BLE001 - network errors from the signing services
        raise _fail(f"signing failed ({type(exc).__name__}): {exc}") from exc
    out = artifact.with_name(artifact.name + ".sigstore.json")
    out.write_text(bundle.to_json())
    typer.echo(f"{out}: signed by {identity.identity} ({identity.issuer})")


@recipe_app.command("push")
def recipe_push(
    artifact: Annotated[Path, typer.Argument(help="The recipe archive.")],
    to: Annotated[str, typer.Option("--to", help="s3://bucket/prefix, oci://host[:port]/repo or file:///dir")],
    name: Annotated[str, typer.Option(help="Recipe name.")],
    version: Annotated[str, typer.Option(help="Recipe version.")],
    bundle: Annotated[Path | None, typer.Option(help="Sigstore bundle (default: ARTIFACT.sigstore.json).")] = None,
    s3_endpoint_url: Annotated[str | None, typer.Option(help="S3-compatible endpoint.")] = None,
    oci_insecure_host: Annotated[list[str] | None, typer.Option(help="OCI host allowed over plain HTTP.")] = None,
) -> None:
    """Publish an archive and its bundle to a registry as NAME@VERSION."""
    from plnt.reconciler.errors import PlntError
    from plnt.reconciler.recipes.registries import RegistryOptions, open_registry

    bundle = bundle or artifact.with_name(artifact.name + ".sigstore.json")
    if not artifact.is_file():
        raise _fail(f"{artifact}: no such file", 2)
    if not bundle.is_file():
        raise _fail(f"{bundle}: no such bundle; sign the archive first (plnt recipe sign {artifact})", 2)
    # file_roots=None: the author names the directory on their own command line (not a spec).
    options = RegistryOptions(s3_endpoint_url=s3_endpoint_url, allow_insecure_http=tuple(oci_insecure_host or ()),
                              file_roots=None)
    try:
        where = open_registry(to, options).push(name, version, artifact, bundle)
    except (PlntError, ValueError) as exc:
        raise _fail(str(exc)) from exc
    typer.echo(f"pushed {name}@{version} to {where}")


def _load_trust_policies(policy: Path) -> SpecSet:
    """The specs of a --policy file holding one or more RecipeTrustPolicy documents; exit 2 when it
    cannot be read, is invalid, or holds no policy."""
    try:
        text = policy.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise _fail(f"--policy {policy}: {exc}", 2) from exc
    specs, problems = load_sources([SourceFile(str(policy), text)], check_references=False)
    if problems:
        raise _fail("\n".join(str(p) for p in problems), 2)
    if not specs.trust_policies:
        raise _fail(f"--policy {policy}: no RecipeTrustPolicy in it", 2)
    return specs


def _trust_root_reader(policy: Path, trust_root: Path | None) -> Callable[[str], bytes]:
    """Reads a policy's trustedRootFile: --trust-root when given, else that path relative to the
    policy file's directory, then to the current directory."""

    from plnt.reconciler.recipes.registries import MAX_TRUSTED_ROOT_BYTES, read_bounded

    def read(path: str) -> bytes:
        if trust_root is not None:
            return read_bounded(trust_root, MAX_TRUSTED_ROOT_BYTES, what="--trust-root")
        for candidate in (policy.parent / path, Path(path)):
            if candidate.is_file():
                return read_bounded(candidate, MAX_TRUSTED_ROOT_BYTES, what=f"trustedRootFile {path}")
        raise FileNotFoundError(f"{path} (relative to {policy.parent} or the current directory); pass --trust-root FILE")

    return read


@recipe_app.command("fetch")
def recipe_fetch(
    registry: Annotated[str, typer.Option(help="s3://bucket/prefix, oci://host[:port]/repo or file:///dir")],
    ref: Annotated[str, typer.Option(help="Recipe NAME@VERSION.")],
    digest: Annotated[str, typer.Option(help="sha256:HEX of the archive: the pin (what the saga verified).")],
    policy: Annotated[Path, typer.Option(help="A RecipeTrustPolicy YAML file (one or more policies).")],
    into: Annotated[Path, typer.Option(help="Directory to unpack the recipe into (absent or empty).")],
    trust_root: Annotated[Path | None, typer.Option(help=(
        "Trusted-root JSON for the policy's trustedRootFile; default: that path, relative to the policy "
        "file's directory, then to the current directory."))] = None,
    s3_endpoint_url: Annotated[str | None, typer.Option(help="S3-compatible endpoint.")] = None,
    s3_region: Annotated[str | None, typer.Option(help="S3 region.")] = None,
    oci_insecure_host: Annotated[list[str] | None, typer.Option(help="OCI host allowed over plain HTTP.")] = None,
    max_download_mb: Annotated[int, typer.Option(help="Refuse a download larger than this.", min=1)] = 256,
) -> None:
    """Fetch, pin-check, verify and safely unpack one recipe into DIR: the saga's pull, for a runner
    pod's init container. Exit 0 with the recipe in DIR, 1 when it cannot be trusted or fetched (the
    reason on stderr; DIR left as it was), 2 for bad options."""
    import shutil
    import tempfile

    from plnt.core.specs.models import WorkflowSource
    from plnt.reconciler.errors import PlntError
    from plnt.reconciler.recipes.pull import RecipeCache, pull_recipe, repo_subdir
    from plnt.reconciler.recipes.registries import RegistryOptions
    from pydantic import ValidationError

    try:
        source = WorkflowSource.model_validate({"ref": ref, "registry": registry, "integrityHash": digest})
    except ValidationError as exc:
        problem = exc.errors()[0]
        option = {"ref": "--ref", "registry": "--registry", "integrityHash": "--digest"}.get(str(problem["loc"][0]), "")
        raise _fail(f"{option}: {problem['msg']} (got {problem.get('input')!r})", 2) from exc
    if repo_subdir(source.registry) is not None:
        raise _fail(f"--registry {registry}: a path inside a spec repository; give file:///ABSOLUTE/DIR", 2)
    specs = _load_trust_policies(policy)
    if into.exists() and (not into.is_dir() or any(into.iterdir())):
        raise _fail(f"--into {into}: must be absent or an empty directory", 2)

    load_trusted_root = _trust_root_reader(policy, trust_root)

    def read_trust_root(_commit: str, path: str) -> bytes:
        return load_trusted_root(path)

    def no_repo(*_args: object) -> bool:
        return False

    into.parent.mkdir(parents=True, exist_ok=True)
    # The cache and staging sit beside DIR, so the result is moved in with renames on one filesystem.
    work = Path(tempfile.mkdtemp(prefix=".plnt-fetch-", dir=into.parent))
    try:
        pulled = pull_recipe(
            source, commit="", cache=RecipeCache(work / "cache"), policies=specs.trust_policies.values(),
            read_from_repo=read_trust_root, export_from_repo=no_repo,
            registry_options=RegistryOptions(  # the operator's own command line: any file:/// directory
                s3_endpoint_url=s3_endpoint_url, s3_region=s3_region, allow_insecure_http=tuple(oci_insecure_host or ()),
                max_download_bytes=max_download_mb * 2**20, file_roots=None))
        into.mkdir(exist_ok=True)
        for item in pulled.directory.iterdir():
            item.rename(into / item.name)
    except PlntError as exc:
        reason = getattr(exc, "reason", None)
        raise _fail(f"{type(exc).__name__}: {reason + ': ' if reason else ''}{exc}", 1) from exc
    finally:
        shutil.rmtree(work, ignore_errors=True)
    typer.echo(f"fetched {source.ref} ({pulled.digest}) signed by {pulled.signature.identity} "
               f"({pulled.signature.issuer}) into {into}")


@recipe_app.command("verify")
def recipe_verify(
    artifact: Annotated[Path, typer.Argument(help="The recipe archive.")],
    bundle: Annotated[Path | None, typer.Option(help="Sigstore bundle (default: ARTIFACT.sigstore.json).")] = None,
    identity: Annotated[str | None, typer.Option(help="Exact signer identity (email or URI SAN).")] = None,
    identity_regex: Annotated[str | None, typer.Option(help="Regular expression over the signer's SANs.")] = None,
    issuer: Annotated[str, typer.Option(help="Exact OIDC issuer.")] = ...,  # type: ignore[assignment]
    trust_root: Annotated[Path | None, typer.Option(
        help="Trusted-root JSON; default: the Sigstore public-good root bundled with sigstore-python (offline).")] = None,
) -> None:
    """Verify an archive's signature offline, exactly as plnt does before deploying it."""
    from plnt.core.specs.models import RecipeTrustPolicy
    from plnt.reconciler.errors import DownloadRefused, VerificationFailed
    from plnt.reconciler.recipes.archive import archive_digest
    from plnt.reconciler.recipes.registries import MAX_BUNDLE_BYTES, MAX_TRUSTED_ROOT_BYTES, read_bounded
    from plnt.reconciler.recipes.trust import verify_recipe
    from pydantic import ValidationError

    bundle = bundle or artifact.with_name(artifact.name + ".sigstore.json")
    if not artifact.is_file():
        raise _fail(f"{artifact}: no such file", 2)
    if (identity is None) == (identity_regex is None):
        raise _fail("give exactly one of --identity or --identity-regex", 2)
    signer = {"issuer": issuer, **({"identity": identity} if identity else {"identityRegex": identity_regex})}
    root = {"trustedRootFile": trust_root.name} if trust_root else {"publicGood": True}
    try:
        policy = RecipeTrustPolicy.model_validate({
            "apiVersion": "plnt.work/v1", "kind": "RecipeTrustPolicy", "metadata": {"name": "command-line"},
            "spec": {"recipes": ["*"], "trustRoot": root, "signers": [signer]}})
    except ValidationError as exc:
        raise _fail(f"invalid signer options: {exc.errors()[0]['msg']}", 2) from exc
    try:
        signature = read_bounded(bundle, MAX_BUNDLE_BYTES, what="the bundle") if bundle.is_file() else None
    except DownloadRefused as exc:
        typer.echo(f"REJECTED (invalid-bundle): {exc}")
        raise typer.Exit(1) from exc
    try:
        verified = verify_recipe(
            archive_digest(artifact), signature, recipe="*", policies=[policy],
            load_trusted_root=lambda _path: read_bounded(trust_root, MAX_TRUSTED_ROOT_BYTES, what="--trust-root")
            if trust_root else b"",
        )
    except VerificationFailed as exc:
        typer.echo(f"REJECTED ({exc.reason}): {exc}")
        raise typer.Exit(1) from exc
    typer.echo(f"OK: {artifact} signed by {verified.identity} ({verified.issuer}); {verified.trust_root}")


@recipe_app.command("digest")
def recipe_digest(path: Annotated[Path, typer.Argument(help="A recipe archive, or a recipe directory.")]) -> None:
    """Print what `spec.workflow.integrityHash` pins: the archive's sha256 (a directory is packed first)."""
    from plnt.reconciler.recipes.archive import archive_digest, pack_recipe

    if path.is_file():
        typer.echo(archive_digest(path))
        return
    if not (path / "workflow.yaml").is_file():
        raise _fail(f"{path}: neither an archive nor a recipe directory (no workflow.yaml)", 2)
    try:
        typer.echo("sha256:" + hashlib.sha256(pack_recipe(path)).hexdigest())
    except ValueError as exc:
        raise _fail(f"{path}: {exc}") from exc


# --- plnt gateway: the gateway as a role of its own --------------------------------------------------


@app.command()
def gateway(
    control_url: Annotated[str, typer.Option(envvar="PLNT_CONTROL_URL", help=(
        "The control plane (plnt up, or plnt reconcile) whose route table this gateway follows, e.g. "
        "http://127.0.0.1:8000 (or PLNT_CONTROL_URL)."))],
    internal_token_file: Annotated[Path, typer.Option(
        help="File whose first line is the internal token (the control plane's --internal-token-file).")],
    host: GatewayHost = "127.0.0.1",
    port: GatewayPort = 8000,
    tokens_file: TokensFile = None,
    insecure_no_auth: InsecureNoAuth = False,
    max_body_bytes: MaxBodyBytes = 2**20,
    gateway_timeout: GatewayTimeout = 60.0,
    max_header_bytes: MaxHeaderBytes = 64 * 1024,
    header_timeout: HeaderTimeout = 10.0,
    watch_wait: Annotated[float, typer.Option(
        min=0.1, max=30, help="Seconds the control plane may hold each route watch request (long-poll).")] = 25.0,
    watch_retry_max: Annotated[float, typer.Option(
        min=0.1, help="Longest wait between retries while the control plane is unreachable (jittered).")] = 10.0,
    workers: GatewayWorkers = 0,
    loop: Annotated[str, typer.Option(help="Event loop: uvloop (default when installed) or asyncio.")] = "auto",
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Serve invoke, chat, models and workflows from the route table a control plane publishes (a
    long-poll watch on its GET /internal/routes); keeps serving its last table while it is unreachable."""
    import os

    from plnt.core.auth import exposure_problem, load_tokens
    from plnt.gateway.role import GatewayRoleConfig

    _setup_logging(verbose)
    if not control_url.startswith(("http://", "https://")):
        raise _fail(f"--control-url must be an http:// or https:// address, not {control_url!r}", 2)
    internal_token = _secret(None, internal_token_file, "--internal-token-file")
    assert internal_token is not None
    env_tokens = tuple(t.strip() for t in os.environ.get("PLNT_GATEWAY_TOKENS", "").split(",") if t.strip())
    try:
        tokens = load_tokens(tokens_file, env_tokens)
    except (OSError, ValueError) as exc:
        raise _fail(f"cannot read gateway tokens: {exc}", 2) from exc
    problem = exposure_problem(host, tokens, insecure_no_auth=insecure_no_auth) or _port_problem(host, port)
    if problem:
        raise _fail(problem, 2)
    if loop not in ("auto", "uvloop", "asyncio"):
        raise _fail(f"--loop must be auto, uvloop or asyncio, not {loop!r}", 2)
    loop_factory = None
    if loop != "asyncio":
        try:
            import uvloop

            loop_factory = uvloop.new_event_loop
        except ImportError:
            if loop == "uvloop":
                raise _fail("--loop uvloop: uvloop is not installed", 2) from None
    config = GatewayRoleConfig(
        control_url=control_url.rstrip("/"), internal_token=internal_token, host=host, port=port, tokens=tokens,
        max_body_bytes=max_body_bytes, request_timeout_s=gateway_timeout, max_header_bytes=max_header_bytes,
        header_timeout_s=header_timeout, watch_wait_s=watch_wait, watch_retry_max_s=watch_retry_max)
    from plnt.gateway.workers import auto_workers

    count = workers or auto_workers()
    worker_tokens = (tokens_file.read_text(encoding="utf-8") if tokens_file else None, str(tokens_file or "(tokens)"),
                     env_tokens)
    try:
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            runner.run(_gateway_role(config, count, worker_tokens, loop, verbose))
    except KeyboardInterrupt:
        pass
    except Exception as exc:  # noqa: BLE001 - one clear line for start-up failures
        from plnt.core.server import ServerStartError

        if not isinstance(exc, (ServerStartError, OSError)):
            raise
        raise _fail(f"plnt gateway could not start: {exc}", 2) from exc


async def _gateway_role(config: Any, count: int = 1, worker_tokens: tuple[str | None, str, tuple[str, ...]] = (None, "", ()),
                        loop_name: str = "auto", verbose: bool = False) -> None:
    import os

    from plnt.gateway.role import GatewayRole
    from plnt.gateway.workers import WorkerConfig, WorkerSupervisor
    from pydantic import SecretStr

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    role = GatewayRole(config, reuse_port=count > 1)
    await role.start()
    supervisor = None
    if count > 1:
        text, source, plain = worker_tokens

        def config_for(index: int) -> WorkerConfig:
            return WorkerConfig(
                index=index, parent_pid=os.getpid(), control_url=config.control_url,
                internal_token=SecretStr(config.internal_token), host=config.host, port=role.server.port,
                tokens_text=SecretStr(text) if text is not None else None, tokens_source=source,
                plain_tokens=tuple(SecretStr(t) for t in plain), max_body_bytes=config.max_body_bytes,
                request_timeout_s=config.request_timeout_s, max_header_bytes=config.max_header_bytes,
                header_timeout_s=config.header_timeout_s, watch_wait_s=config.watch_wait_s,
                watch_retry_max_s=config.watch_retry_max_s, loop=loop_name, verbose=verbose)

        supervisor = WorkerSupervisor(config_for, count - 1)
        await supervisor.start()
    typer.echo(f"plnt gateway is up: {role.url} ({count} process{'es' if count > 1 else ''}), following "
               f"{config.control_url}; Ctrl-C stops", err=True)
    await stop.wait()
    typer.echo("plnt gateway: stopping...", err=True)
    if supervisor is not None:
        await supervisor.stop()
    await role.stop()
    typer.echo("plnt gateway: stopped", err=True)


# The role commands (`plnt reconcile`, `plnt worker`) and `plnt review` live beside this module and register on `app`.
from plnt.reconciler.cli import review as cli_review  # noqa: E402, F401
from plnt.reconciler.cli import roles as cli_roles  # noqa: E402, F401
from plnt.reconciler.cli.model import model_app  # noqa: E402

app.add_typer(model_app, name="model")


@app.command()
def crds(
    out: Annotated[Path | None, typer.Option(
        help="Write one file per CRD into this directory (charts/plnt/crds); default: one YAML stream on stdout.")] = None,
) -> None:
    """The CustomResourceDefinitions of WorkflowRun, ModelDeployment, PlntBackend and RecipeTrustPolicy, generated from the models."""
    from plnt.reconciler.control.crds import crd_files, crds_yaml

    if out is None:
        typer.echo(crds_yaml(), nl=False)
        return
    out.mkdir(parents=True, exist_ok=True)
    for name, text in crd_files().items():
        (out / name).write_text(text, encoding="utf-8")
        typer.echo(f"wrote {out / name}", err=True)


def main() -> None:
    app()


if __name__ == "__main__":
    # `python -m plnt.reconciler.cli.main`: run the package's module, where cli_roles registered its commands.
    from plnt.reconciler.cli.main import main as package_main

    package_main()
