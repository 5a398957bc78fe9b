"""What the gateway adds: the same runner, straight vs through the gateway, in one run.

Starts, on 127.0.0.1, a runner (by default a minimal stub that answers /invoke like plnt's
runner, JSON or SSE, with no workflow work, so that the figures are the gateway's and the
HTTP hops'; `--recipe DIR` runs the real `python -m plnt.runner` instead) and a gateway
process (`create_app` served by uvicorn, as `plnt up` serves it). Then, for each concurrency,
alternating short rounds of the two paths (so drift hits both alike):

  direct:   load generator -> runner          POST /invoke
  gateway:  load generator -> gateway -> runner   POST /workflows/echo/invoke

and prints latency p50/p95/p99 of each and their difference ("added"), the gateway's CPU
time per request (from /proc: user+system of the gateway process) and so the requests/s one
core of it sustains, and for SSE (`event: token` streams) the added time to first token.

On a machine with >= 2 cores the gateway is pinned to the last core and the runner and the
load generator share the others (`--no-pin` to disable), so the gateway's CPU time is its
own and its latency is not inflated by the generator competing for its core.

    python bench/gateway_overhead.py [--requests 4000] [--concurrency 1,8,32] [--stream-requests 1000]
                                     [--loop uvloop|asyncio] [--http httptools|h11] [--recipe DIR]
                                     [--baseline-gateway DIR]   # e.g. main's gateway/, measured alongside
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from plnt.core.upstream import UpstreamClient, UpstreamError  # noqa: E402
from plnt.gateway.bench import Load, percentile, run_load  # noqa: E402
from plnt.reconciler.drivers.processes import free_port  # noqa: E402

RESULT = {"workflow": "echo", "version": "1.0.0", "output": "ok", "steps": {"echo": {"ms": 0.01, "cached": False}},
          "release": "rel-bench", "cache": {"hits": 0, "misses": 1}}
PAYLOAD = json.dumps({"text": "a small invocation", "n": 1}).encode()
# --real-runner: plnt.runner (MockBackend) serving this one-step recipe; it echoes `text` in 3 tokens.
ECHO_RECIPE = """\
apiVersion: microagents.dev/v1
kind: Workflow
metadata: {name: echo, version: 1.0.0}
steps:
  - id: reply
    tool: llm.generate
    params: {prompt: "{text}", maxTokens: 50}
"""


# --- the processes -----------------------------------------------------------------------------


def stub_runner_app(tokens: int, token_delay_s: float):  # type: ignore[no-untyped-def]
    """Raw ASGI: /invoke (JSON, or SSE with `tokens` token events), /healthz. No framework cost."""
    result = json.dumps(RESULT, separators=(",", ":")).encode()
    token_events = [b'event: token\ndata: {"step":"echo","text":"t%d "}\n\n' % i for i in range(tokens)]
    result_event = b"event: result\ndata: " + result + b"\n\n"

    async def app(scope, receive, send):  # type: ignore[no-untyped-def]
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                else:
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        more = True
        while more:
            message = await receive()
            more = message.get("more_body", False)
        if scope["path"] == "/healthz":
            body = b'{"status":"ok"}'
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]})
            await send({"type": "http.response.body", "body": body})
            return
        accept = dict(scope["headers"]).get(b"accept", b"")
        if b"text/event-stream" not in accept:
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(result))]})
            await send({"type": "http.response.body", "body": result})
            return
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]})
        for event in token_events:
            await send({"type": "http.response.body", "body": event, "more_body": True})
            if token_delay_s:
                await asyncio.sleep(token_delay_s)
        await send({"type": "http.response.body", "body": result_event, "more_body": False})

    return app


def serve_runner(args: argparse.Namespace) -> None:
    import uvicorn

    uvicorn.run(stub_runner_app(args.tokens, args.token_delay_ms / 1000), host="127.0.0.1", port=args.port,
                loop=args.loop, http=args.http, log_level="warning", access_log=False, lifespan="on")


def _import_gateway_from(directory: Path) -> None:
    """Make `plnt.gateway` the package in `directory` (another version's gateway/, e.g. main's)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("plnt.gateway", directory / "__init__.py",
                                                  submodule_search_locations=[str(directory)])
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["plnt.gateway"] = module
    spec.loader.exec_module(module)


def serve_gateway(args: argparse.Namespace) -> None:
    import uvicorn

    if args.gateway_src:
        _import_gateway_from(args.gateway_src)
    from plnt.core.auth import TokenSet
    from plnt.core.routes import Backend, Route, RouteTable
    from plnt.gateway.app import create_app
    from plnt.gateway.router import Router

    route = Route("default", "echo", stable=Backend(args.runner, "1.0.0", "rel-bench"))
    tokens = TokenSet.parse(plain_tokens=[args.token]) if args.token else None
    app = create_app(Router(RouteTable([route])), list_workflows=list, tokens=tokens)
    options = dict(loop=args.loop, log_level="warning", access_log=False, lifespan="on", proxy_headers=False)
    if args.http == "httptools" and not args.gateway_src:
        # As GatewayServer (what `plnt up` uses) configures uvicorn: with the HTTP limits.
        from plnt.core.server import uvicorn_config

        uvicorn.Server(uvicorn_config(app, "127.0.0.1", args.port, **options)).run()
        return
    uvicorn.run(app, host="127.0.0.1", port=args.port, http=args.http, **options)


def spawn(argv: list[str], cpus: set[int] | None) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, *argv], cwd=ROOT)
    if cpus:
        os.sched_setaffinity(proc.pid, cpus)
    return proc


async def wait_ready(url: str, path: str = "/healthz", timeout_s: float = 30) -> None:
    client = UpstreamClient(read_timeout_s=2)
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            with contextlib.suppress(UpstreamError):
                if (await client.request(url, "GET", path)).status == 200:
                    return
            await asyncio.sleep(0.05)
    finally:
        await client.aclose()
    raise SystemExit(f"{url} did not become ready")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# --- measuring ---------------------------------------------------------------------------------


def pcts(values: list[float]) -> dict[int, float]:
    ordered = sorted(values)
    return {q: percentile(ordered, q) * 1000 for q in (50, 95, 99)}


async def compare(
    direct_url: str, gateways: list[tuple[str, str, int]], *, requests: int, concurrency: int, stream: bool,
    rounds: int, headers: list[tuple[str, str]], invoke_path: str, payload: bytes,
) -> list[dict[str, object]]:
    """Direct vs each gateway (label, url, pid), alternating in every round."""
    per_round = max(1, requests // rounds)
    direct = Load()
    via = {label: Load() for label, _, _ in gateways}
    gateway_cpu = dict.fromkeys(via, 0.0)
    for _ in range(rounds):
        got = await run_load(direct_url, invoke_path, payload, requests=per_round, concurrency=concurrency,
                             stream=stream, parse_results=False, warmup=concurrency * 2)
        direct.samples += got.samples
        direct.wall_s += got.wall_s
        for label, gateway_url, gateway_pid in gateways:
            before = cpu_seconds(gateway_pid)
            got = await run_load(gateway_url, "/workflows/echo/invoke", payload, requests=per_round,
                                 concurrency=concurrency, stream=stream, parse_results=False, headers=headers,
                                 warmup=concurrency * 2)
            # The warm-up's CPU is included; it is counted in the request total below too.
            gateway_cpu[label] += cpu_seconds(gateway_pid) - before
            via[label].samples += got.samples
            via[label].wall_s += got.wall_s
    lat_d = pcts([s.latency_s for s in direct.samples if s.ok])
    rows: list[dict[str, object]] = []
    for label, load in via.items():
        errors = sum(not s.ok for s in direct.samples + load.samples)
        lat_g = pcts([s.latency_s for s in load.samples if s.ok])
        out: dict[str, object] = {
            "label": label, "concurrency": concurrency, "stream": stream, "requests_each": len(load.samples),
            "errors": errors, "direct_ms": lat_d, "gateway_ms": lat_g, "added_ms": {q: lat_g[q] - lat_d[q] for q in lat_d},
            "direct_rps": len(direct.samples) / direct.wall_s, "gateway_rps": len(load.samples) / load.wall_s,
            "gateway_cpu_us_per_request": gateway_cpu[label] / (len(load.samples) + rounds * concurrency * 2) * 1e6,
        }
        if stream:
            ttft_d = pcts([s.ttft_s for s in direct.samples if s.ok and s.ttft_s is not None])
            ttft_g = pcts([s.ttft_s for s in load.samples if s.ok and s.ttft_s is not None])
            out.update(direct_ttft_ms=ttft_d, gateway_ttft_ms=ttft_g,
                       added_ttft_ms={q: ttft_g[q] - ttft_d[q] for q in ttft_d})
        rows.append(out)
    return rows


def fmt(block: dict[int, float]) -> str:
    return "  ".join(f"p{q} {v:7.3f}" for q, v in block.items())


def report(row: dict[str, object]) -> None:
    kind = "SSE " if row["stream"] else "JSON"
    cpu = row["gateway_cpu_us_per_request"]
    print(f"\n[{kind}] {row['label']} gateway, concurrency {row['concurrency']}, {row['requests_each']} requests per "
          f"path, errors {row['errors']}")
    print(f"  direct   latency ms  {fmt(row['direct_ms'])}   ({row['direct_rps']:.0f} req/s)")  # type: ignore[arg-type]
    print(f"  gateway  latency ms  {fmt(row['gateway_ms'])}   ({row['gateway_rps']:.0f} req/s)")  # type: ignore[arg-type]
    print(f"  ADDED    latency ms  {fmt(row['added_ms'])}")  # type: ignore[arg-type]
    if row["stream"]:
        print(f"  direct   TTFT ms     {fmt(row['direct_ttft_ms'])}")  # type: ignore[arg-type]
        print(f"  gateway  TTFT ms     {fmt(row['gateway_ttft_ms'])}")  # type: ignore[arg-type]
        print(f"  ADDED    TTFT ms     {fmt(row['added_ttft_ms'])}")  # type: ignore[arg-type]
    print(f"  gateway CPU {cpu:.0f} us/request -> {1e6 / cpu:.0f} requests/s per core")  # type: ignore[operator]


async def measure(args: argparse.Namespace) -> None:
    cores = sorted(os.sched_getaffinity(0))
    pin = not args.no_pin and len(cores) >= 2
    gateway_cpus = {cores[-1]} if pin else None
    others = set(cores[:-1]) if pin else None
    if others:
        os.sched_setaffinity(0, others)
    runner_port, gateway_port = free_port(), free_port()
    runner_url, gateway_url = f"http://127.0.0.1:{runner_port}", f"http://127.0.0.1:{gateway_port}"
    common = ["--loop", args.loop, "--http", args.http]
    if args.real_runner and not args.recipe:
        args.recipe = Path(tempfile.mkdtemp(prefix="plnt-bench-echo-"))
        (args.recipe / "workflow.yaml").write_text(ECHO_RECIPE)
    if args.recipe:
        runner_argv = ["-m", "plnt.runner", "--recipe", str(args.recipe), "--host", "127.0.0.1", "--port", str(runner_port)]
    else:
        runner_argv = [__file__, "--serve-runner", "--port", str(runner_port), "--tokens", str(args.tokens),
                       "--token-delay-ms", str(args.token_delay_ms), *common]
    gateway_argv = [__file__, "--serve-gateway", "--port", str(gateway_port), "--runner", runner_url, *common]
    if args.token:
        gateway_argv += ["--token", args.token]
    procs = [spawn(runner_argv, others), spawn(gateway_argv, gateway_cpus)]
    gateways = [("this", gateway_url, procs[1].pid)]
    if args.baseline_gateway:
        # The same measurement of another version's gateway package (e.g. main's), in the same run.
        baseline_port = free_port()
        baseline_argv = [*gateway_argv, "--gateway-src", str(args.baseline_gateway)]
        baseline_argv[baseline_argv.index("--port") + 1] = str(baseline_port)
        procs.append(spawn(baseline_argv, gateway_cpus))
        gateways.insert(0, ("baseline", f"http://127.0.0.1:{baseline_port}", procs[2].pid))
    try:
        await wait_ready(runner_url)
        for _, url, _ in gateways:
            await wait_ready(url)
        runner = f"plnt.runner {args.recipe}" if args.recipe else "stub"
        pinned = f"gateway on cpu {cores[-1]}, runner+load on {sorted(others or [])}" if pin else "no"
        print(f"gateway overhead: loop={args.loop} http={args.http} runner={runner} cores={len(cores)} pinned={pinned}")
        headers = [("authorization", f"Bearer {args.token}")] if args.token else []
        payload = args.input.encode() if args.input else PAYLOAD
        for concurrency in args.concurrency:
            for row in await compare(runner_url, gateways, requests=args.requests, concurrency=concurrency,
                                     stream=False, rounds=args.rounds, headers=headers, invoke_path="/invoke",
                                     payload=payload):
                report(row)
        if args.stream_requests:
            for concurrency in args.stream_concurrency:
                for row in await compare(runner_url, gateways, requests=args.stream_requests, concurrency=concurrency,
                                         stream=True, rounds=args.rounds, headers=headers, invoke_path="/invoke",
                                         payload=payload):
                    report(row)
        if args.profile:
            await profile(args, gateway_url, procs[1].pid, headers, payload)
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()


async def profile(args: argparse.Namespace, gateway_url: str, pid: int, headers: list[tuple[str, str]], payload: bytes) -> None:
    """py-spy the gateway under load (needs `pip install py-spy`): .svg flamegraph, .json speedscope,
    .txt collapsed stacks."""
    fmt_ = {".json": "speedscope", ".txt": "raw"}.get(Path(args.profile).suffix, "flamegraph")
    beside = Path(sys.executable).with_name("py-spy")
    spy = subprocess.Popen([str(beside) if beside.exists() else "py-spy", "record", "--pid", str(pid), "--duration", str(args.profile_seconds), "--rate", "500",
                            "--format", fmt_, "--output", args.profile, "--nonblocking"])
    deadline = time.monotonic() + args.profile_seconds
    while time.monotonic() < deadline:
        await run_load(gateway_url, "/workflows/echo/invoke", payload, requests=2000, concurrency=max(args.concurrency),
                       parse_results=False, headers=headers)
    spy.wait(60)
    print(f"\nprofile of the gateway under load: {args.profile}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=6000, help="JSON requests per path and concurrency")
    parser.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8, 32])
    parser.add_argument("--stream-requests", type=int, default=1500, help="SSE requests per path (0: skip)")
    parser.add_argument("--stream-concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8])
    parser.add_argument("--tokens", type=int, default=8, help="stub runner: token events per SSE answer")
    parser.add_argument("--token-delay-ms", type=float, default=1.0, help="stub runner: delay between tokens")
    parser.add_argument("--rounds", type=int, default=6, help="alternations of direct/gateway per measurement")
    parser.add_argument("--loop", default="uvloop", choices=["uvloop", "asyncio"])
    parser.add_argument("--http", default="httptools", choices=["httptools", "h11"])
    parser.add_argument("--real-runner", action="store_true",
                        help="serve a one-step echo recipe with the real plnt runner (MockBackend) instead of the stub")
    parser.add_argument("--recipe", type=Path, help="serve this recipe with the real plnt runner (with --input)")
    parser.add_argument("--input", help="invocation body (JSON) for --recipe")
    parser.add_argument("--token", help="configure the gateway with this bearer token (auth on the hot path)")
    parser.add_argument("--baseline-gateway", type=Path, metavar="DIR",
                        help="also measure this gateway/ package (e.g. main's: git archive main gateway), same run")
    parser.add_argument("--no-pin", action="store_true", help="do not pin processes to cores")
    parser.add_argument("--profile", help="py-spy the gateway under load into this file (.svg, .json or .txt)")
    parser.add_argument("--profile-seconds", type=int, default=10)
    # internal: the child processes
    parser.add_argument("--serve-runner", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--serve-gateway", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--runner", help=argparse.SUPPRESS)
    parser.add_argument("--gateway-src", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_runner:
        serve_runner(args)
    elif args.serve_gateway:
        serve_gateway(args)
    elif args.loop == "uvloop":
        import uvloop

        uvloop.run(measure(args))
    else:
        asyncio.run(measure(args))


if __name__ == "__main__":
    main()
