"""The options plnt's commands share, declared once.

Options that go together are an OptionGroup: a frozen dataclass whose fields are typer options. A
command takes the group as one parameter (`temporal: TemporalOptions`) and `with_option_groups`
shows typer its fields as options of their own, under one heading of --help; the command gets the
group back, and the group says what it sets in its section of Settings (`settings()`), so each
mapping is written once. A section comes back as a dict of its fields, the command's own options for
it added (`temporal.settings(max_concurrent_sagas=max_sagas)`): Settings validates every section at
once, so one error line names every problem. Where a command words an option differently (the roles'
Temporal is shared and required, say), a variant subclass redeclares that field: the same option, in
the same place, with its own help.

Imported by the command modules only when their command runs: `plnt --help` does not import it.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import enum
import functools
import inspect
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, get_args, get_type_hints

import typer
from plnt.reconciler.cli.common import env_gateway_tokens, fail, port_problem, secret, secret_from

if TYPE_CHECKING:
    from plnt.core.specs.limits import SpecLimits
    from plnt.reconciler.control.access import GatewayTokens
    from plnt.reconciler.recipes.registries import RegistryOptions


# --- the machinery -----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class OptionGroup:
    """Options that go together: one heading of --help (`panel`), one object for the command."""

    panel: ClassVar[str] = "Options"

    @classmethod
    def parameters(cls) -> list[inspect.Parameter]:
        """The group's fields as the keyword parameters typer reads, each shown under `panel`."""
        hints = get_type_hints(cls, include_extras=True)
        parameters = []
        for field in dataclasses.fields(cls):
            kind, *extras = get_args(hints[field.name])
            option = copy.copy(extras[0])  # shared by every command that takes the group
            option.rich_help_panel = cls.panel
            parameters.append(inspect.Parameter(
                field.name, inspect.Parameter.KEYWORD_ONLY, annotation=Annotated[kind, option],
                default=inspect.Parameter.empty if field.default is dataclasses.MISSING else field.default))
        return parameters

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(field.name for field in dataclasses.fields(cls))


def with_option_groups(command: Callable[..., None]) -> Callable[..., None]:
    """`command` as typer should see it: each OptionGroup parameter spread into its options (their
    names must not collide); when it runs, their values are gathered into the group again."""
    hints = get_type_hints(command, include_extras=True)
    parameters: list[inspect.Parameter] = []
    groups: dict[str, type[OptionGroup]] = {}
    for name, parameter in inspect.signature(command).parameters.items():
        hint = hints[name]
        if isinstance(hint, type) and issubclass(hint, OptionGroup):
            groups[name] = hint
            parameters.extend(hint.parameters())
        else:
            parameters.append(parameter.replace(kind=inspect.Parameter.KEYWORD_ONLY, annotation=hint))
    names = [parameter.name for parameter in parameters]
    if len(set(names)) != len(names):
        raise TypeError(f"{command.__name__}: options declared twice: {sorted({n for n in names if names.count(n) > 1})}")

    @functools.wraps(command)
    def run(**values: Any) -> None:
        for name, group in groups.items():
            values[name] = group(**{field: values.pop(field) for field in group.field_names()})
        command(**values)

    run.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
    run.__annotations__ = {parameter.name: parameter.annotation for parameter in parameters}
    return run


# --- options of one meaning everywhere -----------------------------------------------------------

Verbose = Annotated[bool, typer.Option("--verbose", "-v")]
InstallTimeout = Annotated[float, typer.Option(min=5, max=3600, help=(
    "Seconds helm waits for a runner release on a Kubernetes backend (image pull, recipe fetch, start) and for an "
    "uninstall; a WorkflowRun's saga install/promote/remove steps get at least this plus 30 s. With the roles "
    "apart: the same value for reconcile and worker."))]
ModelInstallTimeout = Annotated[float, typer.Option(min=1, help=(
    "Seconds helm waits for a model-server release (weights fetch + server start); a ModelDeployment's saga "
    "install/promote steps get this plus 300 s. With the roles apart: the same value for reconcile and worker."))]
GpuResource = Annotated[str | None, typer.Option(help=(
    "Extended resource model servers' GPUs are counted in (e.g. amd.com/gpu); default: the GPU class when it is "
    "a device plugin's resource, else nvidia.com/gpu (the class is then the GPU pool's node label)."))]
# `plnt up` takes these without a lower bound (Settings refuses a 0), the roles with one.
MAX_SAGAS_HELP = "Sagas (deploys) running at once, across WorkflowRuns."
RETRY_ATTEMPTS_HELP = "Attempts per saga step, the first included."
MAX_RECIPE_MB_HELP = "Refuse recipes that unpack to more than this."
MaxSagas = Annotated[int, typer.Option(help=MAX_SAGAS_HELP, min=1)]
Identity = Annotated[str, typer.Option(help="This replica's name (default: host name and process id).")]
# The roles run apart (`plnt reconcile`, `plnt worker`): each with its own state, one internal token.
RoleStateDir = Annotated[Path, typer.Option(help="This role's own state directory (roles share no disk).")]
RoleInternalTokenFile = Annotated[Path | None, typer.Option(help=(
    "File holding the internal token the roles use with each other (first line); the same file for every role."))]

# The gateway's bearer token, for the commands that call a running plnt (status, history, bench).
TOKEN_HELP = ("Gateway bearer token, when the gateway requires one. Prefer PLNT_TOKEN or --token-file: "
              "a value on the command line is visible to other users in `ps`.")
Token = Annotated[str | None, typer.Option(envvar="PLNT_TOKEN", help=TOKEN_HELP)]
TokenFile = Annotated[Path | None, typer.Option(
    envvar="PLNT_TOKEN_FILE", help="File holding the gateway bearer token (or PLNT_TOKEN_FILE); wins over --token/PLNT_TOKEN.")]

RegistryUrl = Annotated[str, typer.Option(help="s3://bucket/prefix, oci://host[:port]/repo or file:///dir")]
S3Endpoint = Annotated[str | None, typer.Option(help="S3-compatible endpoint.")]
OciInsecureHost = Annotated[list[str] | None, typer.Option(help="OCI host allowed over plain HTTP.")]
TrustRoot = Annotated[Path | None, typer.Option(help=(
    "Trusted-root JSON for the policy's trustedRootFile; default: that path, relative to the policy "
    "file's directory, then to the current directory."))]


def read_internal_token(file: Path | None) -> str | None:
    """--internal-token-file: the token the roles use with each other, the file's first line."""
    return secret(None, file, "--internal-token-file")


# The spec repository and its forge, as plnt up, plnt scale and plnt rollback name them.
SpecPath = Annotated[str, typer.Option(help="Subdirectory of the repository holding the specs.")]
GitCredentialsFile = Annotated[Path | None, typer.Option(help=(
    "The repository's credentials: TOKEN or USER:TOKEN on the first line (https), or an ssh private key."))]
GitKnownHosts = Annotated[Path | None, typer.Option(help=(
    "ssh known_hosts for the repository's host; without it the first host key is trusted, then pinned."))]
ForgeApiUrl = Annotated[str | None, typer.Option(help=(
    "The forge's REST API: https://api.github.com, https://gitlab.example/api/v4, https://gitea.example/api/v1."))]
ForgeProject = Annotated[str | None, typer.Option(help="OWNER/REPO on the forge (GitLab: the project's full path).")]
ForgeTokenEnv = Annotated[str | None, typer.Option(help="NAME of the environment variable holding the forge token.")]
ForgeTokenFile = Annotated[Path | None, typer.Option(help="File holding the forge token.")]


# --- the groups ----------------------------------------------------------------------------------


SOURCE_HELP = (
    "Where WorkflowRuns and ModelDeployments come from: git (--repo; a merged pull request is the approval) or "
    "kubernetes (their custom resources on the API server of --kubeconfig or the pod's service account, e.g. "
    "from kubectl apply, Argo CD or Flux; the cluster's RBAC on them is the approval). With kubernetes a new "
    "revision is a change of any object's uid or metadata.generation (a spec change, a new or deleted object), "
    "never a status write; PlntBackends and RecipeTrustPolicies come from --platform-dir only, and each recipe "
    "still needs its signature under them. --require-approval, --verify-commits, --previews, --write-notes "
    "and --forge are for git.")


@dataclasses.dataclass(frozen=True)
class SourceOptions(OptionGroup):
    """Where the specs come from: the spec repository and how to reach it, or the cluster."""

    panel = "Spec source"

    repo: Annotated[str | None, typer.Option(envvar="PLNT_REPO", help=(
        "Spec repository: a path, file://, https:// or ssh URL (or PLNT_REPO). Credentials in an https URL "
        "are never logged or stored; pass such a URL as PLNT_REPO, not on the command line (ps shows it)."))] = None
    path: SpecPath = ""
    branch: Annotated[str, typer.Option(help="Branch to track.")] = "main"
    git_credentials_file: GitCredentialsFile = None
    git_known_hosts: GitKnownHosts = None
    source_kind: Annotated[str, typer.Option("--source", help=SOURCE_HELP)] = "git"
    source_namespace: Annotated[list[str] | None, typer.Option("--source-namespace", help=(
        "With --source kubernetes: a namespace whose WorkflowRuns and ModelDeployments plnt reads (repeatable; "
        "default: every namespace, which needs a ClusterRole to list them)."))] = None
    platform_dir: Annotated[Path | None, typer.Option(help=(
        "With --source kubernetes (required): the directory of PlntBackend and RecipeTrustPolicy specs (and the "
        "trusted roots and file: registries they name), e.g. a ConfigMap mounted into plnt's pod. Never read "
        "from the cluster: whoever may create a WorkflowRun may not change who signs recipes."))] = None

    def settings(self, **more: Any) -> dict[str, Any]:
        """Settings.source; exit 2 for an unknown --source."""
        if self.source_kind not in ("git", "kubernetes"):
            raise fail(f"--source must be git or kubernetes, not {self.source_kind!r}", 2)
        return dict(kind=self.source_kind, repo=self.repo or "", path=self.path, branch=self.branch,
                    git_credentials_file=self.git_credentials_file, git_known_hosts=self.git_known_hosts,
                    namespaces=tuple(self.source_namespace or ()),
                    platform_dir=self.platform_dir.resolve() if self.platform_dir is not None else None, **more)


@dataclasses.dataclass(frozen=True)
class RoleSourceOptions(SourceOptions):
    """The spec source as `plnt reconcile` and `plnt worker` word it."""

    repo: Annotated[str | None, typer.Option(envvar="PLNT_REPO", help=(
        "Spec repository: a path, file://, https:// or ssh URL (or PLNT_REPO; credentials in a URL are never "
        "logged)."))] = None


@dataclasses.dataclass(frozen=True)
class CommitTrustOptions(OptionGroup):
    """--verify-commits: which commits may deploy, and whose signatures count."""

    panel = "Signed commits"

    verify_commits: Annotated[str, typer.Option(help=(
        "Deploy only signed commits: none, head (the newest commit) or all (every commit since the last "
        "reconciled one, merged branches included)."))] = "none"
    allowed_signers: Annotated[Path | None, typer.Option(
        help="Trusted SSH signers (git's allowed-signers format).")] = None
    gpg_keys: Annotated[Path | None, typer.Option(help="Directory of trusted OpenPGP public keys (*.asc, *.gpg).")] = None

    def settings(self) -> dict[str, Any]:
        """Settings.trust."""
        return dict(verify_commits=self.verify_commits, allowed_signers=self.allowed_signers, gpg_keys=self.gpg_keys)


@dataclasses.dataclass(frozen=True)
class TemporalOptions(OptionGroup):
    """Where the sagas run: `plnt up` starts an embedded dev server unless given an address."""

    panel = "Temporal"

    temporal_address: Annotated[str | None, typer.Option(
        help="HOST:PORT of a Temporal server; without it plnt starts the embedded dev server.")] = None
    temporal_namespace: Annotated[str, typer.Option(help="Temporal namespace of plnt's sagas.")] = "default"
    task_queue: Annotated[str, typer.Option(help="Temporal task queue of plnt's sagas and activities.")] = "plnt-sagas"
    temporal_tls: Annotated[bool, typer.Option(
        "--temporal-tls", help="Connect to --temporal-address over TLS with the system's CAs.")] = False
    temporal_tls_cert: Annotated[Path | None, typer.Option(help="Client certificate (PEM) for mutual TLS.")] = None
    temporal_tls_key: Annotated[Path | None, typer.Option(help="Private key (PEM) of --temporal-tls-cert.")] = None
    temporal_tls_ca: Annotated[Path | None, typer.Option(
        help="CA certificate (PEM) the Temporal server's certificate must chain to (default: the system's).")] = None
    temporal_api_key_env: Annotated[str | None, typer.Option(
        help="NAME of the environment variable holding a Temporal API key (implies TLS).")] = None
    temporal_api_key_file: Annotated[Path | None, typer.Option(
        help="File holding a Temporal API key (implies TLS).")] = None

    def settings(self, **more: Any) -> dict[str, Any]:
        """Settings.temporal; exit 2 when the API key cannot be read."""
        api_key = secret_from(self.temporal_api_key_env, self.temporal_api_key_file, "--temporal-api-key")
        return dict(address=self.temporal_address, namespace=self.temporal_namespace, task_queue=self.task_queue,
                    tls=self.temporal_tls, tls_cert=self.temporal_tls_cert, tls_key=self.temporal_tls_key,
                    tls_ca=self.temporal_tls_ca, api_key=api_key, **more)


@dataclasses.dataclass(frozen=True)
class RoleTemporalOptions(TemporalOptions):
    """The roles apart share one Temporal server: its address is required (checked as a role starts)."""

    temporal_address: Annotated[str | None, typer.Option(
        help="HOST:PORT of the Temporal server all roles share (required).")] = None
    temporal_tls: Annotated[bool, typer.Option("--temporal-tls", help="Connect over TLS with the system's CAs.")] = False
    temporal_tls_ca: Annotated[Path | None, typer.Option(
        help="CA (PEM) the Temporal server's certificate must chain to.")] = None
    temporal_api_key_env: Annotated[str | None, typer.Option(
        help="NAME of the env var holding a Temporal API key.")] = None
    temporal_api_key_file: Annotated[Path | None, typer.Option(help="File holding a Temporal API key.")] = None


@dataclasses.dataclass(frozen=True)
class ForgeOptions(OptionGroup):
    """Pull-request review as deploy approval, and each rollout's verdict back on the forge."""

    panel = "Forge: approvals, statuses, previews"

    forge: Annotated[str | None, typer.Option(help=(
        "The spec repository's forge (github, gitlab or gitea): where --require-approval reads approvals and "
        "each rollout's verdict goes as a commit status plnt/NAMESPACE/NAME."))] = None
    forge_api_url: ForgeApiUrl = None
    forge_project: ForgeProject = None
    forge_token_env: ForgeTokenEnv = None
    forge_token_file: ForgeTokenFile = None
    require_approval: Annotated[bool, typer.Option("--require-approval", help=(
        "Deploy a commit only when the pull request that brought it was approved on its head commit and the plan "
        "digest `plnt review` posted there equals the one computed now; otherwise hold it, with the reason in "
        "status."))] = False
    approvers: Annotated[list[str] | None, typer.Option("--approvers", help=(
        "With --require-approval: count approvals only from these users and teams (comma-separated or repeated: "
        "'alice,acme/deployers'; a team is ORG/TEAM_SLUG, on GitLab a group's full path), who also need write "
        "permission on the repository (GitLab: Maintainer). Default: anyone with that permission."))] = None
    code_owners: Annotated[bool, typer.Option("--code-owners", help=(
        "With --require-approval: each file a pull request changes also needs an approval from one of its owners in "
        "CODEOWNERS (.github/, .gitlab/, .gitea/, the root or docs/), as the file was on the tracked branch before "
        "it."))] = False
    report_status: Annotated[bool, typer.Option("--report-status/--no-report-status", help=(
        "With --forge: report each rollout on its commit as status plnt/NAMESPACE/NAME."))] = True
    write_notes: Annotated[bool, typer.Option("--write-notes", help=(
        "Record each rollout's outcome as a git note (refs/notes/plnt) on its commit and push it to the spec "
        "repository (needs push rights): git log --notes=plnt shows them."))] = False
    previews: Annotated[list[str] | None, typer.Option("--previews", help=(
        "Deploy the WorkflowRuns a pull request changes as previews: a ref glob such as 'refs/pull/*/head' "
        "(GitHub, Gitea) or 'refs/merge-requests/*/head' (GitLab). Repeatable."))] = None

    def settings(self) -> dict[str, Any]:
        """Settings.review; exit 2 when the forge token cannot be read."""
        token = secret_from(self.forge_token_env, self.forge_token_file, "--forge-token")
        return dict(forge=self.forge, forge_api_url=self.forge_api_url, forge_project=self.forge_project,
                    forge_token=token, require_approval=self.require_approval, report_status=self.report_status,
                    write_notes=self.write_notes, previews=tuple(self.previews or ()),
                    approvers=tuple(a.strip() for option in self.approvers or () for a in option.split(",") if a.strip()),
                    code_owners=self.code_owners)


@dataclasses.dataclass(frozen=True)
class NotifyOptions(OptionGroup):
    """Each rollout transition (started, step, paused, promoted, rolled back, aborted, failed) to receivers."""

    panel = "Notifications"

    notify_webhook: Annotated[list[str] | None, typer.Option("--notify-webhook", help=(
        "A URL that gets each rollout transition as JSON, HMAC-signed (X-Plnt-Signature, as a webhook gate's "
        "call; docs/operations.md). Repeatable."))] = None
    notify_webhook_secret_file: Annotated[Path | None, typer.Option(help=(
        "File whose first line is the --notify-webhook HMAC key."))] = None
    notify_slack_url_file: Annotated[Path | None, typer.Option(help=(
        "File whose first line is a Slack-compatible incoming webhook URL (the URL is the secret); each "
        "transition is one line of text there."))] = None

    def settings(self) -> dict[str, Any]:
        """Settings.notify; exit 2 when a secret file cannot be read."""
        return dict(webhooks=tuple(self.notify_webhook or ()),
                    webhook_secret=secret(None, self.notify_webhook_secret_file, "--notify-webhook-secret-file"),
                    slack_url=secret(None, self.notify_slack_url_file, "--notify-slack-url-file"))


@dataclasses.dataclass(frozen=True)
class GatewayOptions(OptionGroup):
    """The gateway's address, its bearer tokens and its HTTP limits: `plnt up` and `plnt gateway`."""

    panel = "Gateway"

    host: Annotated[str, typer.Option(help="Gateway address.")] = "127.0.0.1"
    port: Annotated[int, typer.Option(help="Gateway port.")] = 8000
    tokens_file: Annotated[Path | None, typer.Option(
        help="Gateway bearer tokens: one 'TOKEN' or 'TOKEN workflow1,workflow2' per line, # comments. "
             "PLNT_GATEWAY_TOKENS (comma-separated) adds unrestricted tokens.")] = None
    insecure_no_auth: Annotated[bool, typer.Option(
        "--insecure-no-auth", help="Serve the gateway without tokens on a non-loopback --host (refused otherwise).")] = False
    max_body_bytes: Annotated[int, typer.Option(help="Gateway: larger request bodies get 413.")] = 2**20
    gateway_timeout: Annotated[float, typer.Option(
        help="Gateway: 504 when a runner sends nothing for this many seconds (streams: between two chunks).")] = 60.0
    max_header_bytes: Annotated[int, typer.Option(help="Gateway: larger request heads get 431.")] = 64 * 1024
    header_timeout: Annotated[float, typer.Option(
        help="Gateway: close connections whose request headers are not complete within this many seconds.")] = 10.0
    cache_affinity: Annotated[bool, typer.Option(
        "--cache-affinity/--no-cache-affinity", help=(
            "Gateway: a model's chat goes to the replica that served the conversation before (its KV cache), "
            "unless that one is busier; --no-cache-affinity: the replicas take turns."))] = True

    def settings(self, **more: Any) -> dict[str, Any]:
        """Settings.gateway (--host and --port are Settings.host and Settings.port)."""
        return dict(tokens=env_gateway_tokens(), tokens_file=self.tokens_file, insecure_no_auth=self.insecure_no_auth,
                    max_body_bytes=self.max_body_bytes, request_timeout_s=self.gateway_timeout,
                    max_header_bytes=self.max_header_bytes, header_timeout_s=self.header_timeout,
                    cache_affinity=self.cache_affinity, **more)

    def checked_tokens(self) -> GatewayTokens:
        """The tokens (--tokens-file and PLNT_GATEWAY_TOKENS), read once; exit 2 when they cannot be
        read, when they leave a non-loopback --host open, or when --host:--port is taken."""
        from plnt.reconciler.control.access import GatewayExposed, read_gateway_tokens

        try:
            tokens = read_gateway_tokens(self.tokens_file, env_gateway_tokens(), host=self.host,
                                         insecure_no_auth=self.insecure_no_auth)
        except GatewayExposed as exc:
            raise fail(str(exc), 2) from exc
        except (OSError, ValueError) as exc:
            raise fail(f"cannot read gateway tokens: {exc}", 2) from exc
        problem = port_problem(self.host, self.port)
        if problem:
            raise fail(problem, 2)
        return tokens


WORKERS_HELP = ("Processes answering on the gateway port (SO_REUSEPORT, each its own accept queue): 0 (default) is one "
                "per core, at most 4; 1 serves the gateway from one process.")


@dataclasses.dataclass(frozen=True)
class RegistryAccessOptions(OptionGroup):
    """How recipes and weights are fetched from s3://, oci:// and file:/// registries, and how much."""

    panel = "Registries"

    s3_endpoint_url: Annotated[str | None, typer.Option(help="S3-compatible endpoint for s3:// registries.")] = None
    s3_region: Annotated[str | None, typer.Option(help="Region for s3:// registries.")] = None
    oci_insecure_host: Annotated[list[str] | None, typer.Option(
        help="OCI registry (host or host:port) allowed over plain HTTP, loopback included (nothing is by "
             "default). Repeatable.")] = None
    allow_file_registry: Annotated[list[Path] | None, typer.Option(
        help="Directory under which file:/// registries may be read (none by default; file:rel/dir inside "
             "the spec repository always works). Repeatable.")] = None
    max_download_mb: Annotated[int, typer.Option(
        min=1, help="Stop a recipe download (archive + bundle, any registry) past this many MiB.")] = 256

    def settings(self, **more: Any) -> dict[str, Any]:
        """Settings.registries."""
        return dict(s3_endpoint_url=self.s3_endpoint_url, s3_region=self.s3_region,
                    oci_insecure_hosts=tuple(self.oci_insecure_host or ()),
                    file_registry_roots=tuple(p.resolve() for p in self.allow_file_registry or ()),
                    max_download_bytes=self.max_download_mb * 2**20, **more)

    def registry_options(self) -> RegistryOptions:
        from plnt.reconciler.recipes.registries import RegistryOptions

        return RegistryOptions(s3_endpoint_url=self.s3_endpoint_url, s3_region=self.s3_region,
                               allow_insecure_http=tuple(self.oci_insecure_host or ()),
                               max_download_bytes=self.max_download_mb * 2**20,
                               file_roots=tuple(str(p.resolve()) for p in self.allow_file_registry or ()))


@dataclasses.dataclass(frozen=True)
class WorkerRegistryAccessOptions(RegistryAccessOptions):
    """The registries as `plnt worker` (and `plnt review`) word them."""

    oci_insecure_host: Annotated[list[str] | None, typer.Option(
        help="OCI registry (host or host:port) allowed over plain HTTP. Repeatable.")] = None
    allow_file_registry: Annotated[list[Path] | None, typer.Option(
        help="Directory under which file:/// registries may be read. Repeatable.")] = None
    max_download_mb: Annotated[int, typer.Option(help="Stop a recipe download past this many MiB.", min=1)] = 256


@dataclasses.dataclass(frozen=True)
class ReviewRegistryAccessOptions(WorkerRegistryAccessOptions):
    """The registries as `plnt review` words them: file:rel/dir inside the repository always works."""

    allow_file_registry: Annotated[list[Path] | None, typer.Option(
        help="Directory under which file:/// registries may be read (file:rel/dir inside the repository always "
             "works). Repeatable.")] = None


@dataclasses.dataclass(frozen=True)
class OperatorRegistryOptions(OptionGroup):
    """The registry options of the recipe and model commands, on an operator's own command line."""

    panel = "Registry"

    s3_endpoint_url: S3Endpoint = None
    s3_region: Annotated[str | None, typer.Option(help="S3 region.")] = None
    oci_insecure_host: OciInsecureHost = None

    def registry_options(self, **limits: int) -> RegistryOptions:
        from plnt.reconciler.recipes.registries import RegistryOptions

        # file_roots=None: any file:/// directory, which the operator names themselves (not a spec).
        return RegistryOptions(s3_endpoint_url=self.s3_endpoint_url, s3_region=self.s3_region,
                               allow_insecure_http=tuple(self.oci_insecure_host or ()), file_roots=None, **limits)


class RunnerStart(str, enum.Enum):
    fork = "fork"
    exec = "exec"


@dataclasses.dataclass(frozen=True)
class RunnerOptions(OptionGroup):
    """The local runners: their model server, and how they start."""

    panel = "Local runners"

    llm_url: Annotated[str | None, typer.Option(
        help="OpenAI-compatible model server for the local runners (vLLM, TGI, SGLang, llama.cpp); "
             "default: the offline mock backend.")] = None
    llm_model: Annotated[str | None, typer.Option(help="Model name to ask the model server for.")] = None
    llm_api_key_env: Annotated[str | None, typer.Option(
        help="NAME of the environment variable holding the model server's API key (the key is never logged).")] = None
    runner_start: Annotated[RunnerStart, typer.Option(
        "--runner-start",
        help="How local runners start: fork (from one pre-imported zygote process: milliseconds and a few MiB "
             "each; Linux) or exec (a fresh Python per runner: ~0.5 s CPU and ~35 MiB each).")] = RunnerStart.fork

    @property
    def llm_api_key(self) -> str | None:
        return (os.environ.get(self.llm_api_key_env) or None) if self.llm_api_key_env else None

    def check(self) -> None:
        """Exit 2 for a model server without a model, or an API key variable that is not set."""
        if self.llm_url and not self.llm_model:
            raise fail("--llm-url needs --llm-model (the model the server should use)", 2)
        if self.llm_api_key_env and self.llm_api_key is None:
            raise fail(f"--llm-api-key-env {self.llm_api_key_env}: that environment variable is not set", 2)

    def settings(self, **more: Any) -> dict[str, Any]:
        """Settings.runners."""
        from plnt.reconciler.drivers.local import allowlisted_env

        return dict(llm_url=self.llm_url, llm_model=self.llm_model, llm_api_key_env=self.llm_api_key_env,
                    llm_api_key=self.llm_api_key, start=self.runner_start.value, env=allowlisted_env(os.environ), **more)


@dataclasses.dataclass(frozen=True)
class WorkerRunnerOptions(RunnerOptions):
    """The local runners as `plnt worker` words them."""

    llm_url: Annotated[str | None, typer.Option(help="OpenAI-compatible model server for local runners.")] = None
    llm_api_key_env: Annotated[str | None, typer.Option(
        help="NAME of the environment variable holding the model server's API key.")] = None


@dataclasses.dataclass(frozen=True)
class SpecLimitOptions(OptionGroup):
    """What one commit's specs may be (a large monorepo may need more); the rest have defaults in SpecLimits."""

    panel = "Spec limits"

    max_spec_files: Annotated[int, typer.Option(help="Refuse a commit with more spec files than this.", min=1)] = 10_000
    max_spec_file_kb: Annotated[int, typer.Option(help="Refuse a spec file larger than this many KiB.", min=1)] = 1024

    def limits(self) -> SpecLimits:
        from plnt.core.specs.limits import SpecLimits

        return SpecLimits(max_files=self.max_spec_files, max_file_bytes=self.max_spec_file_kb * 1024)


@contextlib.contextmanager
def exit_on_invalid_settings() -> Iterator[None]:
    """Settings (or a part of them) built in this block that do not validate: their messages on one
    `error:` line, exit 2."""
    from pydantic import ValidationError

    try:
        yield
    except ValidationError as exc:
        raise fail("; ".join(str(e["msg"]).removeprefix("Value error, ") for e in exc.errors()), 2) from exc
