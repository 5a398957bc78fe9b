"""`python -m plnt.runner --recipe DIR --host 127.0.0.1 --port PORT [--release-id ID] [options]`

Serves one recipe directory until SIGTERM/SIGINT (then exits 0). Exits 2, with one line on
stderr naming the file and the problem, if the recipe does not load or the options are bad.

Backends: `--backend mock` (default; offline, deterministic, `--token-delay` per token) or
`--backend http --upstream-url URL --model NAME [--api-key-env VAR] [--upstream-timeout S]`
for any OpenAI-compatible server. The API key is read from the environment variable NAMED by
`--api-key-env` (never given on the command line, where `ps` would show it).
`--step-cache-size N` bounds the step cache (0 disables it).
`--park-after-idle-s S`: scale to zero. After S seconds without an invocation the runner writes
`parked.json` in its working directory and exits 0; plnt starts it again on the next request
(plnt.runner.idle).

`--limit-memory-mib N`, `--limit-open-files N`, `--limit-processes N` set RLIMIT_AS, RLIMIT_NOFILE
and RLIMIT_NPROC (soft and hard, so recipe code cannot raise them unless it runs as root) first
thing, before the recipe is imported. The runner sets them itself rather than plnt through
Popen's preexec_fn, which is unsafe in a parent with threads (plnt has several). A limit that
cannot be set is exit 3: the recipe never runs without the limits asked for. A recipe that cannot
be read because the open-files limit leaves no file to open is exit 3 too (the limit, not the recipe).

Then, still before the recipe, the runner makes itself undumpable (plnt.runner.isolation): another
runner of the same user cannot read its memory or environment. Failing that is exit 3 too.

The same `main` serves both ways runners start: exec'd (`python -m plnt.runner`) and forked from
the zygote (plnt.runner.zygote), which calls it in the child with the same argv.
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import resource
import signal
import socket
import sys
from pathlib import Path
from types import FrameType
from typing import Any


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m plnt.runner", description="Serve one microagents recipe over HTTP.")
    parser.add_argument("--recipe", required=True, type=Path, help="recipe directory (holds workflow.yaml)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--release-id", default=None, help="reported by /healthz and /invoke")
    parser.add_argument("--token-delay", type=float, default=0.0, help="MockBackend delay per token, seconds")
    parser.add_argument("--backend", choices=["mock", "http"], default="mock", help="runtime adapter (default: mock)")
    parser.add_argument("--upstream-url", default=None, help="http backend: OpenAI-compatible server root, e.g. http://127.0.0.1:8000")
    parser.add_argument("--model", default=None, help="http backend: the model name sent upstream")
    parser.add_argument("--api-key-env", default=None, metavar="NAME", help="http backend: environment variable holding the API key")
    parser.add_argument("--upstream-timeout", type=float, default=60.0, help="http backend: seconds to wait for the upstream")
    parser.add_argument("--step-cache-size", type=int, default=1024, help="step cache entries (0 disables the cache)")
    parser.add_argument("--limit-memory-mib", type=int, default=None, help="address-space limit (RLIMIT_AS), MiB")
    parser.add_argument("--limit-open-files", type=int, default=None, help="open file limit (RLIMIT_NOFILE)")
    parser.add_argument("--limit-processes", type=int, default=None, help="RLIMIT_NPROC (counted per user by Linux)")
    parser.add_argument("--park-after-idle-s", type=float, default=None, metavar="S",
                        help="scale to zero: exit, recorded as parked, after S seconds without an invocation")
    parser.add_argument("--drain-on-stop-s", type=float, default=0.0, metavar="S",
                        help="after SIGTERM keep serving S seconds, each answer closing its connection, then "
                             "stop (a pod behind a Service, whose clients keep connections to it; 0: stop at once)")
    return parser.parse_args(argv)


def apply_limits(args: argparse.Namespace) -> None:
    """Set each limit asked for, soft and hard; never above a hard limit already in place."""
    for value, which, name in ((args.limit_memory_mib, resource.RLIMIT_AS, "--limit-memory-mib"),
                               (args.limit_open_files, resource.RLIMIT_NOFILE, "--limit-open-files"),
                               (args.limit_processes, resource.RLIMIT_NPROC, "--limit-processes")):
        if value is None:
            continue
        if value <= 0:
            raise ValueError(f"{name} must be > 0")
        limit = value * 2**20 if which == resource.RLIMIT_AS else value
        _, hard = resource.getrlimit(which)
        if hard != resource.RLIM_INFINITY:
            limit = min(limit, hard)
        try:
            resource.setrlimit(which, (limit, limit))
        except (OSError, ValueError) as exc:
            raise ValueError(f"{name} {value}: {exc}") from exc


def _adapter(args: argparse.Namespace) -> object:
    """The runtime adapter the options ask for; ValueError says what is wrong with them."""
    if args.backend == "mock":
        from plnt.runner.adapters import MockBackend

        return MockBackend(token_delay=args.token_delay)
    missing = [flag for flag, value in (("--upstream-url", args.upstream_url), ("--model", args.model)) if not value]
    if missing:
        raise ValueError(f"--backend http needs {' and '.join(missing)}")
    if not args.upstream_url.startswith(("http://", "https://")):
        raise ValueError(f"--upstream-url must start with http:// or https://, got {args.upstream_url!r}")
    if args.upstream_timeout <= 0:
        raise ValueError("--upstream-timeout must be > 0")
    api_key = None
    if args.api_key_env:
        api_key = os.environ.get(args.api_key_env)
        if not api_key:
            raise ValueError(f"--api-key-env {args.api_key_env}: that environment variable is not set")
    from plnt.runner.adapters import HTTPBackend

    return HTTPBackend(args.upstream_url, args.model, api_key=api_key, timeout_s=args.upstream_timeout,
                       connect_timeout_s=min(5.0, args.upstream_timeout))


def _out_of_files() -> str | None:
    """The error opening one more file gives when the open-files limit is exhausted, else None."""
    try:
        os.close(os.open(os.devnull, os.O_RDONLY))
    except OSError as exc:
        if exc.errno in (errno.EMFILE, errno.ENFILE):
            return exc.strerror or str(exc)
    return None


def _exit_on_signal(signum: int, frame: FrameType | None) -> None:
    # Before the server runs, and again after uvicorn's graceful shutdown re-raises the
    # signal it caught: leave with a clean status instead of dying from the signal.
    raise SystemExit(0 if signum == signal.SIGTERM else 128 + signum)


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _exit_on_signal)
    signal.signal(signal.SIGINT, _exit_on_signal)
    args = _parse(argv)
    try:
        apply_limits(args)  # before anything of the recipe is imported
    except ValueError as exc:
        print(f"plnt.runner: cannot apply limits: {exc}", file=sys.stderr)
        return 3
    from plnt.runner.isolation import IsolationError, no_peeking

    try:
        no_peeking()  # before the recipe: its code must not read other runners, nor they it
    except IsolationError as exc:
        print(f"plnt.runner: cannot isolate this runner: {exc}", file=sys.stderr)
        return 3
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    from plnt.core.recipe import RecipeError
    from plnt.runner.recipe import load_recipe_dir

    try:
        recipe = load_recipe_dir(args.recipe)
    except RecipeError as exc:
        if (exhausted := _out_of_files()) is not None:
            # Not the recipe's fault: the limits leave no file to open (a forked runner, having every
            # module imported already, gets this far where an exec'd one fails at its imports).
            print(f"plnt.runner: cannot load recipe within its limits ({exhausted}): {exc}".replace("\n", " "),
                  file=sys.stderr)
            return 3
        print(f"plnt.runner: cannot load recipe: {exc}".replace("\n", " "), file=sys.stderr)
        return 2

    if args.step_cache_size < 0:
        print("plnt.runner: --step-cache-size must be >= 0", file=sys.stderr)
        return 2
    if not 0 <= args.drain_on_stop_s <= 600:
        print("plnt.runner: --drain-on-stop-s must be between 0 and 600", file=sys.stderr)
        return 2
    if args.park_after_idle_s is not None and not args.park_after_idle_s > 0:
        print("plnt.runner: --park-after-idle-s must be > 0", file=sys.stderr)
        return 2
    try:
        adapter = _adapter(args)
    except ValueError as exc:
        print(f"plnt.runner: {exc}", file=sys.stderr)
        return 2

    from plnt.core import telemetry
    from plnt.core.server import ClosingWhileDraining, QuietServer, uvicorn_config
    from plnt.runner.app import create_app

    try:  # here, after a zygote's fork: the span exporter's thread does not survive a fork
        telemetry.setup("plnt-runner")
    except ValueError as exc:
        print(f"plnt.runner: {exc}", file=sys.stderr)
        return 2

    app = create_app(recipe, adapter, args.release_id, step_cache_size=args.step_cache_size,  # type: ignore[arg-type]
                     host=args.host)
    from plnt.runner.load import LoadMeter

    # GET /load and /metrics: the invocations in flight, what autoscaling follows (an IdleParker is a LoadMeter)
    served: Any = LoadMeter(app)
    if args.park_after_idle_s is not None:
        from plnt.core.parking import write_parked
        from plnt.runner.idle import IdleParker

        here = Path.cwd()  # the runner's own directory: plnt starts it there and looks there
        idle_s = args.park_after_idle_s

        def park() -> None:
            write_parked(here, idle_s)
            print(f"plnt.runner: parked after {idle_s:g}s without an invocation; plnt starts it again on the "
                  "next request", file=sys.stderr)
            server.request_exit()

        served = IdleParker(app, idle_s, park)
    # The gateway's HTTP limits (header size and count, slow-client deadlines) apply here too.
    # log_config=None: the logging set up above serves; uvicorn's dictConfig would build its own
    # handlers and formatters in every runner (private memory in each forked one).
    # date_header=False: nobody reads a runner's Date header (the gateway answers with its own), and
    # keeping it fresh is the only reason for uvicorn's housekeeping tick; without it an idle runner
    # wakes once a minute instead of once a second (exit still comes at once, see QuietServer).
    if args.drain_on_stop_s > 0:
        served = ClosingWhileDraining(served, lambda: server.draining)
    config = uvicorn_config(served, args.host, args.port, log_level="warning", access_log=False, log_config=None,
                            date_header=False)
    try:
        listener = _listen_socket(args.host, args.port)
    except OSError as exc:
        print(f"plnt.runner: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 1  # plnt starts it again on another port
    server = QuietServer(config, drain_on_stop_s=args.drain_on_stop_s)
    server.TICK_S = RUNNER_TICK_S
    try:
        server.run(sockets=[listener])
    finally:
        telemetry.shutdown()  # flush: a forked runner leaves by os._exit, which skips atexit
    return 0


RUNNER_TICK_S = 60.0  # 1,000 idle runners ticking once a second cost a quarter of a core


def _listen_socket(host: str, port: int) -> socket.socket:
    """The runner's listening socket, bound here rather than by the event loop: uvloop resolves the
    host in libuv's thread pool, which starts 4 threads that stay for the runner's life. They made
    each idle runner 5 tasks, and Linux counts tasks against RLIMIT_NPROC per user: 1,000 runners of
    a non-root user passed the default `processes: 4096` limit, and runners could not start."""
    listener = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((host, port))
    except BaseException:
        listener.close()
        raise
    return listener


if __name__ == "__main__":
    sys.exit(main())
