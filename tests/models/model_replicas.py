"""Replicas of one model release without a plnt: llama.cpp server processes started as the local driver
starts a model release's (reconciler/drivers/spawn.py, `model_argv`): the runtime's interpreter running
runner/model_server.py, in a directory of its own, with the runner environment allowlist, on 127.0.0.1.
Used by tests/models/test_cache_affinity.py and bench/cache_affinity.py to put a gateway in front of
several replicas of one model."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
from plnt.reconciler.drivers.model_runtime import runtime_python
from plnt.reconciler.drivers.processes import MODEL_SERVER_SCRIPT, free_port, log_tail
from plnt.reconciler.drivers.spawn import runner_env

START_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class ModelReplica:
    endpoint: str
    process: subprocess.Popen[bytes]
    log: Path


def replica_argv(python: Path, gguf: Path, port: int, *, release_id: str, version: str, context: int,
                 threads: int | None, memory_mib: int, args: Sequence[str]) -> list[str]:
    """The command line the local driver gives a model release's server (spawn.RunnerSpawner.model_argv)."""
    return [str(python), str(MODEL_SERVER_SCRIPT), "--model", str(gguf), "--alias", "smollm2", "--host", "127.0.0.1",
            "--port", str(port), "--release-id", release_id, "--version", version, "--context", str(context),
            *(["--threads", str(threads)] if threads else []), "--limit-memory-mib", str(memory_mib),
            "--limit-open-files", "1024", "--limit-processes", "4096", "--", *args]


@asynccontextmanager
async def model_replicas(venv: Path, gguf: Path, workdir: Path, count: int, *, context: int = 2048,
                         threads: int | None = 1, memory_mib: int = 4096,
                         args: Sequence[str] = ()) -> AsyncIterator[list[ModelReplica]]:
    """`count` servers of SmolLM2 (`gguf`), each answering /healthz; every one stopped (SIGTERM, then SIGKILL
    after 10 s) on the way out."""
    python = runtime_python(venv)
    replicas: list[ModelReplica] = []
    try:
        for i in range(count):
            directory = workdir / f"replica-{i}"
            directory.mkdir(parents=True, exist_ok=True)
            log = directory / "server.log"
            port = free_port()
            argv = replica_argv(python, gguf, port, release_id="default.smollm2.bench", version="1.0.0",
                                context=context, threads=threads, memory_mib=memory_mib, args=args)
            with open(log, "ab") as out:
                process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                           cwd=directory, env=runner_env(os.environ, directory, {}),
                                           start_new_session=True)
            replicas.append(ModelReplica(f"http://127.0.0.1:{port}", process, log))
        deadline = time.monotonic() + START_TIMEOUT_S
        async with httpx.AsyncClient(trust_env=False, timeout=2.0) as client:
            for replica in replicas:
                while True:
                    if replica.process.poll() is not None:
                        raise RuntimeError(f"model server exited {replica.process.returncode}: {log_tail(replica.log)}")
                    try:
                        if (await client.get(f"{replica.endpoint}/healthz")).status_code == 200:
                            break
                    except httpx.HTTPError:
                        pass
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"model server at {replica.endpoint} not up in {START_TIMEOUT_S:g} s: "
                                           f"{log_tail(replica.log)}")
                    await asyncio.sleep(0.2)
        yield replicas
    finally:
        for replica in replicas:
            if replica.process.poll() is None:
                os.killpg(replica.process.pid, signal.SIGTERM)
        for replica in replicas:
            try:
                replica.process.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(replica.process.pid, signal.SIGKILL)
                replica.process.wait()
