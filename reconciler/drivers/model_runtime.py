"""The local model runtime: llama.cpp's OpenAI-compatible server, one process per model release.

Model code is treated as recipe code is: it runs in a process of its own, from a virtualenv of its
own (`tools/install_llm.sh`, default `.venv-llm`), with the runner environment (an allowlist: no
credential of plnt's, its own directory as HOME and TMPDIR), listening on 127.0.0.1 only. It reads
the weights from the store's verified model directory (`weights.WeightsStore`), never from where
they were published.

    python -m llama_cpp.server --model FILE.gguf --host 127.0.0.1 --port P --n_ctx N

serves `/v1/chat/completions` (streamed or not) and `/v1/models`; it is up when `/v1/models`
answers 200.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from plnt.reconciler.drivers.spawn import runner_env
from plnt.reconciler.errors import DriverError, InvalidSpec

DEFAULT_CONTEXT = 2048
READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 5.0


def runtime_python(venv: Path) -> Path:
    python = venv / "bin" / "python"
    if not python.exists():
        raise InvalidSpec(f"the llama.cpp runtime is not installed in {venv}: run `bash tools/install_llm.sh {venv}` "
                          "(or `make install-llm`)")
    return python


def gguf_file(model_dir: Path) -> Path:
    """The one GGUF file of a model directory (llama.cpp serves one file)."""
    found = sorted(p for p in model_dir.rglob("*.gguf") if p.is_file())
    if len(found) != 1:
        raise InvalidSpec(f"a llama.cpp model holds exactly one .gguf file; {model_dir} holds {len(found)}")
    return found[0]


@dataclass
class LlamaCppServer:
    """One llama.cpp server process: `start`, then `endpoint` answers the OpenAI API; `stop`."""

    python: Path
    model_file: Path
    port: int
    workdir: Path
    context: int = DEFAULT_CONTEXT
    threads: int | None = None
    base_env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    extra_args: Sequence[str] = ()
    process: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        args = [str(self.python), "-m", "llama_cpp.server", "--model", str(self.model_file), "--host", "127.0.0.1",
                "--port", str(self.port), "--n_ctx", str(self.context)]
        if self.threads is not None:
            args += ["--n_threads", str(self.threads)]
        return [*args, *self.extra_args]

    async def start(self, ready_timeout_s: float = READY_TIMEOUT_S) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        log = open(self.workdir / "server.log", "ab")  # noqa: SIM115 - the child holds it
        try:
            self.process = subprocess.Popen(self.command(), cwd=self.workdir, env=runner_env(self.base_env, self.workdir, {}),
                                            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True)
        finally:
            log.close()
        deadline = time.monotonic() + ready_timeout_s
        async with httpx.AsyncClient(trust_env=False, timeout=2.0) as client:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    raise DriverError(f"the llama.cpp server for {self.model_file.name} exited with "
                                      f"{self.process.returncode} before it served: {self.log_tail()}")
                try:
                    if (await client.get(f"{self.endpoint}/v1/models")).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                await asyncio.sleep(0.1)
        await self.stop()
        raise DriverError(f"the llama.cpp server for {self.model_file.name} did not answer within {ready_timeout_s:g} s: "
                          f"{self.log_tail()}")

    async def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while self.process.poll() is None and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def log_tail(self, lines: int = 5) -> str:
        try:
            text = (self.workdir / "server.log").read_text(errors="replace").strip().splitlines()
        except OSError:
            return "(no log)"
        return " | ".join(text[-lines:]) or "(empty log)"
