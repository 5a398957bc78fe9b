"""Load generation and latency figures, for `plnt bench` and bench/gateway_overhead.py.

The load generator uses the gateway's own upstream client (`upstream.UpstreamClient`): at
~0.1 ms of CPU per request it disturbs the measurement far less than httpx (~0.6-1.3 ms), which
matters on a 2-core machine where the generator shares the CPU with what it measures.

Closed loop: `concurrency` workers each send their next request as soon as the previous one
has been answered, until `requests` have been sent. Latency is request sent -> last byte
received. For streams, TTFT is request sent -> first chunk holding an `event: token`, and TPOT
(time per output token) is (last token - first token) / (tokens - 1), per request.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from plnt.core.upstream import UpstreamClient, UpstreamError

_TOKEN = b"event: token"
_RESULT = b"event: result"


@dataclass
class Sample:
    latency_s: float
    status: int  # 0: no HTTP answer (connection failed, timeout)
    error: str | None = None
    ttft_s: float | None = None
    tpot_s: float | None = None
    tokens: int = 0
    cache_hits: int | None = None
    cache_misses: int | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and 200 <= self.status < 300


@dataclass
class Load:
    samples: list[Sample] = field(default_factory=list)
    wall_s: float = 0.0
    stream: bool = False


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default); q in [0, 100]."""
    if not sorted_values:
        return math.nan
    if len(sorted_values) == 1:
        return sorted_values[0]
    rank = (len(sorted_values) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (rank - low)


def _cache_counts(result: Any) -> tuple[int, int] | None:
    cache = result.get("cache") if isinstance(result, dict) else None
    if isinstance(cache, dict) and isinstance(cache.get("hits"), int) and isinstance(cache.get("misses"), int):
        return cache["hits"], cache["misses"]
    return None


def _result_from_stream(body: bytes) -> Any:
    at = body.rfind(_RESULT)
    if at < 0:
        return None
    data = body.find(b"data:", at)
    if data < 0:
        return None
    end = body.find(b"\n", data)
    try:
        return json.loads(body[data + 5 : end if end >= 0 else None])
    except ValueError:
        return None


async def run_load(
    base_url: str,
    path: str,
    body: bytes,
    *,
    requests: int,
    concurrency: int,
    stream: bool = False,
    headers: Sequence[tuple[str, str]] = (),
    timeout_s: float = 60.0,
    parse_results: bool = True,
    warmup: int = 0,
    client: UpstreamClient | None = None,
) -> Load:
    """Send `requests` POSTs of `body` to base_url+path, `concurrency` at a time."""
    own = client is None
    client = client or UpstreamClient(read_timeout_s=timeout_s, max_connections=max(concurrency, 1))
    request_headers = [("content-type", "application/json"), *headers]
    if stream:
        request_headers.append(("accept", "text/event-stream"))
    perf = time.perf_counter

    async def one() -> Sample:
        t0 = perf()
        try:
            response = await client.request(base_url, "POST", path, body=body, headers=request_headers, stream=stream)
        except UpstreamError as exc:
            return Sample(perf() - t0, 0, f"{type(exc).__name__}: {exc}")
        if not stream:
            sample = Sample(perf() - t0, response.status)
            if response.status >= 300:
                sample.error = f"HTTP {response.status}"
            elif parse_results:
                try:
                    counts = _cache_counts(json.loads(response.body))
                except ValueError:
                    counts = None
                if counts:
                    sample.cache_hits, sample.cache_misses = counts
            return sample
        first = last = None
        tokens = 0
        parts: list[bytes] = []
        error = None
        try:
            async for chunk in response.chunks():
                if _TOKEN in chunk:
                    now = perf()
                    first = first or now
                    last = now
                    tokens += chunk.count(_TOKEN)
                if parse_results or response.status >= 300:
                    parts.append(chunk)
        except UpstreamError as exc:
            error = f"{type(exc).__name__}: {exc}"
        sample = Sample(perf() - t0, response.status, error, tokens=tokens)
        if first is not None:
            sample.ttft_s = first - t0
            if tokens > 1 and last is not None:
                sample.tpot_s = (last - first) / (tokens - 1)
        whole = b"".join(parts)
        if response.status >= 300:
            sample.error = sample.error or f"HTTP {response.status}"
        elif b"event: error" in whole:
            sample.error = "event: error"
        elif parse_results:
            counts = _cache_counts(_result_from_stream(whole))
            if counts:
                sample.cache_hits, sample.cache_misses = counts
        return sample

    async def worker(count: int, out: list[Sample]) -> None:
        for _ in range(count):
            out.append(await one())

    def split(total: int) -> list[int]:
        workers = max(1, min(concurrency, total))
        return [total // workers + (1 if i < total % workers else 0) for i in range(workers)]

    try:
        if warmup:
            await asyncio.gather(*(worker(n, []) for n in split(warmup)))
        load = Load(stream=stream)
        start = perf()
        await asyncio.gather(*(worker(n, load.samples) for n in split(requests)))
        load.wall_s = perf() - start
        return load
    finally:
        if own:
            await client.aclose()


def summarize(load: Load) -> dict[str, Any]:
    samples = load.samples
    n = len(samples)
    ok = [s for s in samples if s.ok]
    latencies = sorted(s.latency_s for s in ok)
    summary: dict[str, Any] = {
        "stream": load.stream,
        "requests": n,
        "errors": n - len(ok),
        "error_rate": (n - len(ok)) / n if n else 0.0,
        "wall_s": load.wall_s,
        "throughput_rps": n / load.wall_s if load.wall_s else math.nan,
        "latency_ms": {f"p{q}": percentile(latencies, q) * 1000 for q in (50, 95, 99)},
    }
    ttfts = sorted(s.ttft_s for s in ok if s.ttft_s is not None)
    if ttfts:
        summary["ttft_ms"] = {f"p{q}": percentile(ttfts, q) * 1000 for q in (50, 95, 99)}
    tpots = sorted(s.tpot_s for s in ok if s.tpot_s is not None)
    if tpots:
        summary["tpot_ms"] = {f"p{q}": percentile(tpots, q) * 1000 for q in (50, 95, 99)}
    if any(s.tokens for s in ok):
        summary["tokens_per_request"] = sum(s.tokens for s in ok) / len(ok)
    hits = sum(s.cache_hits or 0 for s in ok)
    lookups = hits + sum(s.cache_misses or 0 for s in ok)
    if any(s.cache_hits is not None for s in ok):
        summary["step_cache"] = {"hits": hits, "lookups": lookups, "hit_rate": hits / lookups if lookups else None}
    errors: dict[str, int] = {}
    for s in samples:
        if not s.ok:
            key = s.error or f"HTTP {s.status}"
            errors[key] = errors.get(key, 0) + 1
    if errors:
        summary["error_kinds"] = dict(sorted(errors.items(), key=lambda kv: -kv[1])[:5])
    return summary


def _ms(block: dict[str, float]) -> str:
    return "  ".join(f"{k} {v:8.2f} ms" for k, v in block.items())


def format_summary(summary: dict[str, Any], title: str = "") -> str:
    lines = [title] if title else []
    lines.append(
        f"requests {summary['requests']}  errors {summary['errors']} ({summary['error_rate']:.2%})  "
        f"throughput {summary['throughput_rps']:.1f} req/s  wall {summary['wall_s']:.2f} s"
    )
    lines.append(f"latency   {_ms(summary['latency_ms'])}")
    if "ttft_ms" in summary:
        lines.append(f"TTFT      {_ms(summary['ttft_ms'])}")
    elif summary.get("stream"):
        lines.append("TTFT      n/a: no `event: token` in the streams (the output step does not stream tokens)")
    if "tpot_ms" in summary:
        lines.append(f"TPOT      {_ms(summary['tpot_ms'])}   ({summary.get('tokens_per_request', 0):.1f} tokens/request)")
    cache = summary.get("step_cache")
    if cache:
        rate = "n/a" if cache["hit_rate"] is None else f"{cache['hit_rate']:.1%}"
        lines.append(f"step cache hit rate {rate} ({cache['hits']} of {cache['lookups']} lookups, from results)")
    for kind, count in (summary.get("error_kinds") or {}).items():
        lines.append(f"  error x{count}: {kind}")
    return "\n".join(lines)


def stats_cache_counts(stats: Any) -> tuple[int, int] | None:
    """Step-cache hits and misses summed over the backends of `GET /workflows/NAME/stats`."""
    if not isinstance(stats, dict):
        return None
    hits = misses = 0
    found = False
    for backend in stats.get("backends") or []:
        cache = ((backend or {}).get("stats") or {}).get("stepCache") if isinstance(backend, dict) else None
        if isinstance(cache, dict) and isinstance(cache.get("hits"), int) and isinstance(cache.get("misses"), int):
            hits += cache["hits"]
            misses += cache["misses"]
            found = True
    return (hits, misses) if found else None
