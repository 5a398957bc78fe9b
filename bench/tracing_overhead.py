"""What tracing costs the gateway's hot path: off, on, and a baseline build without it, in one run.

Starts on 127.0.0.1 a real runner (`python -m plnt.runner`, MockBackend, a one-step echo recipe), a
real OTLP/HTTP receiver (tools/trace_tree.py, its own process) and three gateway processes (the real
`create_app` served by uvicorn as `plnt up` serves it; bench/gateway_overhead.py's setup), all routing
to that runner:

  baseline  plnt's gateway/ copied with its tracing code cut out of gateway/forward.py (no check at all)
  off       this gateway, no OTEL_* variables (tracing not set up: one boolean checked per request)
  on        this gateway, OTEL_EXPORTER_OTLP_ENDPOINT=the receiver (a span per request, traceparent to
            the runner, batch-exported over OTLP/HTTP)

Then, per concurrency, alternating rounds of direct (load -> runner) and each gateway, and prints the
gateway process's CPU time per request (all its threads' on-CPU ns from /proc/PID/task/*/schedstat,
warm-up included) and latency, and the
ratios to the baseline. Goal: off indistinguishable from baseline. The runner does not trace (the
figures are the gateway's); it is shared by all three. Pinning as bench/gateway_overhead.py.

    python bench/tracing_overhead.py [--requests 3000] [--concurrency 1,32] [--rounds 3] [--no-pin]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import gateway_overhead as go  # noqa: E402
from plnt.reconciler.drivers.processes import free_port  # noqa: E402

_TRACING_GUARDS = ("if telemetry.ENABLED", "if outcome.span is not None")


def baseline_gateway(into: Path) -> tuple[Path, int]:
    """A copy of gateway/ whose forward.py (the hot paths' shared steps) has every tracing block removed
    (the `if telemetry.ENABLED:` and `if outcome.span is not None:` statements with their bodies); (its
    directory, blocks removed)."""
    target = into / "gateway"
    shutil.copytree(ROOT / "gateway", target, ignore=shutil.ignore_patterns("__pycache__"))
    lines = (target / "forward.py").read_text().splitlines(keepends=True)
    out: list[str] = []
    cut_indent: int | None = None
    removed = 0
    for line in lines:
        indent = len(line) - len(line.lstrip())
        if cut_indent is not None:
            if line.strip() and indent > cut_indent:
                continue
            cut_indent = None
        if line.strip().startswith(_TRACING_GUARDS):
            cut_indent, removed = indent, removed + 1
            continue
        out.append(line)
    text = "".join(out)
    compile(text, "forward.py", "exec")
    if removed < 3 or "telemetry.start_span" in text:
        raise SystemExit(f"could not cut the tracing code out of gateway/forward.py ({removed} blocks): update this bench")
    (target / "forward.py").write_text(text)
    return target, removed


def serve_gateway(args: argparse.Namespace) -> None:
    """A gateway process (gateway_overhead's, served the same way for all three): tracing set up from
    the environment first, as plnt's entry points do (GatewayRole.start, reconciler.app.start)."""
    import uvicorn

    if args.gateway_src:
        go._import_gateway_from(args.gateway_src)
    from plnt.core import telemetry
    from plnt.core.routes import Backend, Route, RouteTable
    from plnt.core.server import uvicorn_config
    from plnt.gateway.app import create_app
    from plnt.gateway.router import Router

    telemetry.setup("plnt-gateway")
    route = Route("default", "echo", stable=Backend(args.runner, "1.0.0", "rel-bench"))
    app = create_app(Router(RouteTable([route])), list_workflows=list)
    # uvicorn re-raises the SIGTERM it handled once it has stopped: leave by SystemExit instead, so that
    # the last spans are flushed (plnt's own processes exit normally).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        uvicorn.Server(uvicorn_config(app, "127.0.0.1", args.port, loop=args.loop, log_level="warning",
                                      access_log=False, lifespan="on", proxy_headers=False)).run()
    finally:
        telemetry.shutdown()


def spawn(argv: list[str], cpus: set[int] | None, env: dict[str, str]) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, *argv], cwd=ROOT, env=env)
    if cpus:
        os.sched_setaffinity(proc.pid, cpus)
    return proc


async def wait_receiver(port: int, timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            return
        except OSError:
            await asyncio.sleep(0.05)
    raise SystemExit("the OTLP receiver did not start")


def cpu_ns(pid: int) -> int:
    """On-CPU time of every thread of `pid` (the span exporter's thread included), in ns (schedstat)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, IndexError, ValueError):
            continue  # a thread that ended meanwhile
    return total


async def compare(runner_url: str, gateways: list[tuple[str, str, int]], *, requests: int, concurrency: int,
                  rounds: int) -> list[dict[str, object]]:
    """Direct and each gateway, in rounds whose order rotates (drift and warm caches hit all alike)."""
    per_round = max(1, requests // rounds)
    warmup = concurrency * 2
    loads = {label: go.Load() for label in ["direct", *(g[0] for g in gateways)]}
    cpu = dict.fromkeys(loads, 0)
    order = [("direct", runner_url, 0), *gateways]
    for index in range(rounds):
        shift = index % len(order)
        for label, url, pid in order[shift:] + order[:shift]:
            before = cpu_ns(pid) if pid else 0
            got = await go.run_load(url, "/invoke" if label == "direct" else "/workflows/echo/invoke", go.PAYLOAD,
                                    requests=per_round, concurrency=concurrency, parse_results=False, warmup=warmup)
            if pid:
                cpu[label] += cpu_ns(pid) - before
            loads[label].samples += got.samples
            loads[label].wall_s += got.wall_s
    direct = go.pcts([s.latency_s for s in loads["direct"].samples if s.ok])
    rows: list[dict[str, object]] = []
    for label, _, _ in gateways:
        load = loads[label]
        lat = go.pcts([s.latency_s for s in load.samples if s.ok])
        rows.append({"label": label, "concurrency": concurrency, "gateway_ms": lat,
                     "added_ms": {q: lat[q] - direct[q] for q in lat}, "gateway_rps": len(load.samples) / load.wall_s,
                     "errors": sum(not s.ok for s in load.samples),
                     # the warm-up's requests are in the CPU time: counted in the requests too
                     "gateway_cpu_us_per_request": cpu[label] / 1000 / (len(load.samples) + rounds * warmup)})
    return rows


async def measure(args: argparse.Namespace) -> None:
    cores = sorted(os.sched_getaffinity(0))
    pin = not args.no_pin and len(cores) >= 2
    gateway_cpus = {cores[-1]} if pin else None
    others = set(cores[:-1]) if pin else None
    if others:
        os.sched_setaffinity(0, others)
    scratch = Path(tempfile.mkdtemp(prefix="plnt-bench-tracing-"))
    recipe = scratch / "echo"
    recipe.mkdir()
    (recipe / "workflow.yaml").write_text(go.ECHO_RECIPE)
    baseline_src, removed = baseline_gateway(scratch)
    stats_file = scratch / "receiver.json"

    plain = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    runner_port, receiver_port = free_port(), free_port()
    runner_url = f"http://127.0.0.1:{runner_port}"
    traced = {**plain, "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{receiver_port}",
              "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf", "OTEL_SERVICE_NAME": "plnt-gateway-bench"}
    common = ["--loop", args.loop, "--http", args.http]
    procs = [
        spawn(["-m", "plnt.runner", "--recipe", str(recipe), "--host", "127.0.0.1", "--port", str(runner_port)],
              others, plain),
        spawn([str(ROOT / "tools" / "trace_tree.py"), "--port", str(receiver_port), "--grpc-port", "0", "--no-print",
               "--stats-file", str(stats_file)], others, plain),
    ]
    gateways: list[tuple[str, str, int]] = []
    variants = [("baseline", plain, ["--gateway-src", str(baseline_src)]), ("off", plain, []), ("on", traced, [])]
    if args.control:  # a second process of each untraced build: how far two identical processes differ
        variants += [("baseline2", plain, ["--gateway-src", str(baseline_src)]), ("off2", plain, [])]
    for label, env, extra in variants:
        port = free_port()
        proc = spawn([__file__, "--serve-gateway", "--port", str(port), "--runner", runner_url, *common, *extra],
                     gateway_cpus, env)
        procs.append(proc)
        gateways.append((label, f"http://127.0.0.1:{port}", proc.pid))
    rows: list[dict[str, object]] = []
    try:
        await go.wait_ready(runner_url)
        await wait_receiver(receiver_port)
        for _, url, _ in gateways:
            await go.wait_ready(url)
        pinned = f"gateways on cpu {cores[-1]}, runner+receiver+load on {sorted(others or [])}" if pin else "no"
        print(f"tracing overhead: loop={args.loop} http={args.http} runner=plnt.runner (MockBackend, echo recipe) "
              f"receiver=OTLP/HTTP (tools/trace_tree.py) cores={len(cores)} pinned={pinned}")
        print(f"  baseline = gateway/ with {removed} tracing blocks cut out of forward.py; off = no OTEL_*; "
              f"on = OTEL_EXPORTER_OTLP_ENDPOINT set (BatchSpanProcessor, OTLP/HTTP protobuf)")
        print(f"  {args.requests} requests per path and concurrency in {args.rounds} alternating rounds")
        for concurrency in args.concurrency:
            rows.extend(await compare(runner_url, gateways, requests=args.requests, concurrency=concurrency,
                                      rounds=args.rounds))
    finally:
        # The gateways first: the traced one flushes its last spans to the receiver as it exits.
        for group in (procs[2:], procs[:1], procs[1:2]):
            for proc in group:
                proc.send_signal(signal.SIGTERM)
            for proc in group:
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    proc.kill()
    received = json.loads(stats_file.read_text()) if stats_file.exists() else {"spans": "?", "requests": "?"}
    shutil.rmtree(scratch, ignore_errors=True)

    print(f"\n{'concurrency':>11} {'gateway':>8} {'CPU us/req':>10} {'x base':>7} {'p50 ms':>8} {'p99 ms':>8} "
          f"{'added p50':>9} {'req/s':>7} {'errors':>6}")
    summary: dict[str, dict[str, float]] = {}
    for concurrency in args.concurrency:
        block = [r for r in rows if r["concurrency"] == concurrency]
        base = next(r for r in block if r["label"] == "baseline")["gateway_cpu_us_per_request"]
        for row in block:
            cpu = row["gateway_cpu_us_per_request"]
            lat = row["gateway_ms"]
            print(f"{concurrency:>11} {row['label']:>8} {cpu:>10.0f} {cpu / base:>7.3f} {lat[50]:>8.3f} "  # type: ignore[index,operator]
                  f"{lat[99]:>8.3f} {row['added_ms'][50]:>9.3f} {row['gateway_rps']:>7.0f} {row['errors']:>6}")  # type: ignore[index]
            summary[f"c{concurrency}_{row['label']}"] = {"cpu_us": cpu, "ratio": cpu / base, "p50_ms": lat[50]}  # type: ignore[dict-item,index,operator]
    if args.control:
        for concurrency in args.concurrency:
            cpu = {k.split("_", 1)[1]: v["cpu_us"] for k, v in summary.items() if k.startswith(f"c{concurrency}_")}
            untraced = [cpu[k] for k in ("baseline", "baseline2", "off", "off2")]
            base = [cpu["baseline"], cpu["baseline2"]]
            print(f"c{concurrency}: identical baseline processes differ by {abs(base[0] - base[1]) / min(base):.1%}; "
                  f"the 4 untraced processes span {min(untraced):.0f}-{max(untraced):.0f} us/req; "
                  f"on costs {cpu['on'] - sum(untraced) / 4:+.0f} us/req over their mean")
    print(f"\nreceiver got {received['spans']} spans in {received['requests']} export requests "
          "(the 'on' gateway's requests, warm-up included)")
    print("raw: " + json.dumps(summary))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=3000, help="requests per path and concurrency")
    parser.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 32])
    parser.add_argument("--rounds", type=int, default=6, help="rounds (rotating order) per measurement")
    parser.add_argument("--loop", default="uvloop", choices=["uvloop", "asyncio"])
    parser.add_argument("--http", default="httptools", choices=["httptools", "h11"])
    parser.add_argument("--no-pin", action="store_true", help="do not pin processes to cores")
    parser.add_argument("--control", action="store_true",
                        help="also a second baseline and off process: the spread between identical processes (noise)")
    # internal: a gateway child process (gateway_overhead's options)
    parser.add_argument("--serve-gateway", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--runner", help=argparse.SUPPRESS)
    parser.add_argument("--gateway-src", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--token", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_gateway:
        serve_gateway(args)
    elif args.loop == "uvloop":
        import uvloop

        uvloop.run(measure(args))
    else:
        asyncio.run(measure(args))


if __name__ == "__main__":
    main()
