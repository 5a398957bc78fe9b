"""The `plnt` command line: its table of commands. Each command lives in a module of its own beside
this one, imported only when it runs or its --help is asked for (lazy.py): `plnt --help` and a
command's start pay for that command's imports alone."""

from __future__ import annotations

import typer
from plnt.reconciler.cli.lazy import LazyCommand, LazyGroup


def _here(module: str, help: str) -> LazyCommand:
    return LazyCommand(f"plnt.reconciler.cli.{module}", help)


# In the order `plnt --help` lists them; each help is the first paragraph of the command's own
# (tests/reconciler/cli/test_cli_lazy.py keeps the two the same).
COMMANDS = {
    "up": _here("up", "Run plnt: Temporal, a worker, the reconciler and the gateway; deploy through local runner processes."),
    "validate": _here("validate", (
        "Check specs: exit 0 with a summary, or one FILE:LINE: field: message line per problem and exit 1.\n"
        "Warnings (FILE:LINE: field: warning: ...) do not change the exit code.")),
    "plan": _here("plan", "What would change: against the live state in --state-dir, or between --base and --head (a pull request)."),
    "status": _here("status", "Each WorkflowRun's phase, version, canary share, endpoint, commit and message."),
    "list": _here("listing", (
        "Every WorkflowRun and ModelDeployment, one line each: kind, name, phase, versions, backend, replicas.")),
    "history": _here("history", (
        "The newest saga's steps for a WorkflowRun: start, duration, attempts, outcome (from Temporal's history).")),
    "usage": _here("usage", "Per gateway token and workflow: requests, prompt and completion tokens, cost; and each token's limits."),
    "rollout": _here("rollout", "A running rollout: show, pause, resume, promote or abort it (admin scope for actions)."),
    "run": _here("run", (
        "Invoke a workflow through the gateway: its answer on stdout, streamed tokens and the version that served "
        "it on stderr.")),
    "scale": _here("scale", (
        "Change a WorkflowRun's or ModelDeployment's replicas in git: a commit on a new branch and a pull request\n"
        "(or, with --commit-to-branch, a commit on the tracked branch). Prints the pull request's URL.")),
    "rollback": _here("rollback", (
        "Roll a WorkflowRun or ModelDeployment back to an earlier promoted version in git: a commit on a new\n"
        "branch and a pull request (or, with --commit-to-branch, on the tracked branch). Prints its URL.")),
    "bench": _here("bench", (
        "Load a deployed workflow through the gateway: latency p50/p95/p99, error rate, throughput,\n"
        "step-cache hit rate, and with --stream TTFT and TPOT.")),
    "gateway": _here("gateway", (
        "Serve invoke, chat, models and workflows from the route table a control plane publishes (a\n"
        "long-poll watch on its GET /internal/routes); keeps serving its last table while it is unreachable.")),
    "review": _here("review", (
        "The plan of a pull request (BASE...HEAD) with its recipes verified, as one comment on the PR and\n"
        "a commit status plnt/plan carrying the plan digest that --require-approval binds approvals to.\n"
        "Exit 0 plan made, 1 plan cannot be made (invalid specs, untrusted recipe), 2 bad options, 3 forge error.")),
    "reconcile": _here("reconcile", (
        "The reconciler role: fetch, plan, start sagas, serve the control API. One active replica (a lease).")),
    "worker": _here("worker", (
        "The worker role: run the saga's steps on Temporal; host and report the local runners they install.")),
    "crds": _here("crds", (
        "The CustomResourceDefinitions of WorkflowRun, ModelDeployment, PlntBackend and RecipeTrustPolicy, "
        "generated from the models.")),
    "recipe": _here("recipe", "Recipe commands: pack, sign, push, verify, digest, and fetch (for runner pods)."),
    "model": _here("model", "Model weights: manifest (what to sign), push, and fetch (for model pods)."),
}


class PlntCommands(LazyGroup):
    lazy_commands = COMMANDS


app = typer.Typer(
    name="plnt",
    help="GitOps reconciler for micro-agent workflows: specs in git, signed recipes, canary sagas on Temporal.",
    cls=PlntCommands,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def plnt() -> None:
    # typer makes a group only of an app with a callback or commands of its own: here all are lazy.
    pass


def main() -> None:
    app()


if __name__ == "__main__":
    main()
