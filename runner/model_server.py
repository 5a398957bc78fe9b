"""A model release's server process: llama.cpp's OpenAI-compatible server, run as a plnt release.

Run by the local driver with the model runtime's own interpreter (`.venv-llm/bin/python`, see
tools/install_llm.sh), as a script: it imports nothing of plnt, so model code never shares plnt's
packages. Like a runner it is started in its own directory with the runner environment
(an allowlist: no credential of plnt's), sets its resource limits and makes itself undumpable
before the model loads, listens on 127.0.0.1, and drains on SIGTERM (uvicorn's graceful shutdown).

Besides llama.cpp's `/v1/chat/completions`, `/v1/completions` and `/v1/models` it answers
`GET /healthz` as a runner does, `{"status": "ok", "version": ..., "release": ...}`, once the
weights are loaded: how the driver knows the process on that port is this release; and `GET /load`,
`{"inFlight": n, "waiting": m}` (requests to the model running plus waiting: what autoscaling follows).

    python runner/model_server.py --model FILE.gguf --alias NAME --host 127.0.0.1 --port P
        --release-id ID --version V [--context N] [--threads N] [--limit-memory-mib M]
        [--limit-open-files F] [--limit-processes P] [-- EXTRA LLAMA.CPP SETTINGS as --key value]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import resource
import sys

PR_SET_DUMPABLE = 4
MODEL_LOAD_FAILED_EXIT = 2  # the same code as a runner whose recipe does not load
LIMITS_FAILED_EXIT = 3


def _set_limits(memory_mib: int, open_files: int, processes: int) -> None:
    for which, value in ((resource.RLIMIT_AS, memory_mib * 2**20), (resource.RLIMIT_NOFILE, open_files),
                         (resource.RLIMIT_NPROC, processes)):
        if value <= 0:
            continue
        soft, hard = resource.getrlimit(which)
        capped = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(which, (capped, capped))
    # Other processes of plnt's user (other runners) cannot read this one's memory or environment.
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)


def _extra_settings(extra: list[str]) -> dict[str, str]:
    """`--key value` pairs for llama.cpp's ModelSettings (spec.runtime.args)."""
    settings: dict[str, str] = {}
    items = list(extra)
    while items:
        key = items.pop(0)
        if not key.startswith("--"):
            raise SystemExit(f"runtime argument {key!r}: expected --name value (spec.runtime.args)")
        if "=" in key:
            key, value = key.split("=", 1)
        elif items and not items[0].startswith("--"):
            value = items.pop(0)
        else:
            value = "true"
        settings[key[2:].replace("-", "_")] = value
    return settings


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="model_server", description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--alias", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--release-id", required=True)
    parser.add_argument("--version", required=True)
    parser.add_argument("--context", type=int, default=2048)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--limit-memory-mib", type=int, default=0)
    parser.add_argument("--limit-open-files", type=int, default=0)
    parser.add_argument("--limit-processes", type=int, default=0)
    args, extra = parser.parse_known_args(argv)
    try:
        _set_limits(args.limit_memory_mib, args.limit_open_files, args.limit_processes)
    except (OSError, ValueError) as exc:
        print(f"model server: cannot set its resource limits: {exc}", file=sys.stderr)
        raise SystemExit(LIMITS_FAILED_EXIT) from None

    import uvicorn
    from llama_cpp.server.app import create_app
    from llama_cpp.server.settings import ModelSettings, ServerSettings

    try:
        model = ModelSettings(model=args.model, model_alias=args.alias, n_ctx=args.context, verbose=False,
                              **({"n_threads": args.threads, "n_threads_batch": args.threads} if args.threads else {}),
                              **_extra_settings([a for a in extra if a != "--"]))
        # interrupt_requests off: on (llama-cpp-python's default), a second request cuts the stream in
        # flight before its first token; requests wait their turn instead.
        server = ServerSettings(host=args.host, port=args.port, interrupt_requests=False)
        app = create_app(server_settings=server, model_settings=[model])
    except Exception as exc:  # noqa: BLE001 - any load failure: the driver reads the log and the exit code
        print(f"model server: the model did not load: {type(exc).__name__}: {exc}", file=sys.stderr)
        raise SystemExit(MODEL_LOAD_FAILED_EXIT) from None

    health = {"status": "ok", "version": args.version, "release": args.release_id, "model": args.alias}

    @app.get("/healthz", include_in_schema=False)
    def healthz() -> dict[str, str]:
        return health

    uvicorn.run(LoadMeter(app), host=args.host, port=args.port, log_level="warning", access_log=False,
                timeout_graceful_shutdown=10)


class LoadMeter:
    """ASGI wrapper: the requests to the model (POST /v1/...) in flight, and GET /load ->
    {"inFlight": n, "waiting": m}, what plnt's autoscaler polls. llama-cpp-python's server reports no
    queue of its own and serves one request at a time (the others wait for its lock), so of n in
    flight one runs and n - 1 wait. The runner's meter (plnt.runner.load) answers the same shape;
    this one is apart because this script imports nothing of plnt."""

    def __init__(self, app: object) -> None:
        self.app = app
        self.in_flight = 0

    async def __call__(self, scope: dict, receive: object, send: object) -> None:
        if scope["type"] == "http" and scope.get("method") == "POST" and scope["path"].startswith("/v1/"):
            self.in_flight += 1
            try:
                await self.app(scope, receive, send)  # type: ignore[operator]
            finally:
                self.in_flight -= 1
            return
        if scope["type"] == "http" and scope.get("method") == "GET" and scope["path"] == "/load":
            body = json.dumps({"inFlight": self.in_flight, "waiting": max(0, self.in_flight - 1)}).encode()
            await send({"type": "http.response.start", "status": 200,  # type: ignore[operator]
                        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})  # type: ignore[operator]
            return
        await self.app(scope, receive, send)  # type: ignore[operator]


if __name__ == "__main__":
    main()
