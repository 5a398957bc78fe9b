"""`plnt bench`: load a deployed workflow through a running plnt's gateway and report the figures."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from plnt.reconciler.cli.common import auth_headers, event_loop_factory, fail, secret
from plnt.reconciler.cli.lazy import command_app
from plnt.reconciler.cli.options import Token, TokenFile

app = command_app()


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
    token: Token = None,
    token_file: TokenFile = None,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for each answer.")] = 60.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print the figures as JSON.")] = False,
) -> None:
    """Load a deployed workflow through the gateway: latency p50/p95/p99, error rate, throughput,
    step-cache hit rate, and with --stream TTFT and TPOT."""
    import asyncio
    import json
    from urllib.parse import quote

    from plnt.gateway.bench import format_summary, run_load, stats_cache_counts, summarize

    token = secret(token, token_file, "--token")
    try:
        body = input_file.read_bytes() if input_file else input_json.encode()
        if not isinstance(json.loads(body), dict):
            raise ValueError("the invocation body must be a JSON object")
    except (OSError, ValueError) as exc:
        raise fail(f"bad --input/--input-file: {exc}", 2) from exc
    base = url.rstrip("/")
    if not base.startswith("http://"):
        raise fail("--url must be an http:// address (the load generator speaks plain HTTP/1.1)", 2)
    query = f"?namespace={quote(namespace)}" if namespace else ""
    headers = [("authorization", f"Bearer {token}")] if token else []
    auth = auth_headers(token)

    def runner_stats() -> Any:
        import httpx

        try:
            with httpx.Client(trust_env=False, timeout=10) as client:
                response = client.get(f"{base}/workflows/{quote(name)}/stats{query}", headers=auth)
        except httpx.HTTPError as exc:
            raise fail(f"no plnt answers at {base} ({exc}); is plnt up running?", 2) from exc
        if response.status_code in (401, 403):
            raise fail(f"the gateway refused the token ({response.status_code}); pass --token or set PLNT_TOKEN", 2)
        if response.status_code == 404:
            raise fail(f"no workflow named {name} at {base} (plnt status lists them)", 1)
        return response.json() if response.status_code == 200 else None

    before = stats_cache_counts(runner_stats())

    async def load() -> Any:
        return await run_load(base, f"/workflows/{quote(name)}/invoke{query}", body, requests=requests,
                              concurrency=concurrency, stream=stream, headers=headers, timeout_s=timeout)

    with asyncio.Runner(loop_factory=event_loop_factory("auto")) as runner:
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
