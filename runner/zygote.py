"""`python -m plnt.runner.zygote`: the fork server local runners start from (runner_start "fork").

Starting a fresh interpreter per runner costs ~0.4 s of CPU and ~36 MiB each. The zygote imports
everything a runner needs once (uvicorn and the loop/protocol modules it picks, fastapi, the
runner's app, engine and adapters, httpx, and what loading a recipe and a first request import
lazily), serves plnt's own warm-up workflow for one request cycle (so first-use caches are filled
in shared pages), then `gc.freeze()`s, without a collection first (that would leave holes in shared
pages for children to fill), and forks one child per runner: ~10 ms of CPU to start, ~11 MiB
private each (bench/runner_start.py). What is left private is mostly CPython's reference counts:
every object a runner touches gets its page copied.

No recipe is ever loaded in the zygote and no secret ever reaches it: its environment is plnt's
allowlisted one, and each runner's own environment (with the LLM key) travels in a pipe whose read
end is passed to the zygote (SCM_RIGHTS) and read only by the child, after the fork.

Protocol: fd 0 is an AF_UNIX SOCK_SEQPACKET socket to plnt (nothing on the filesystem); one JSON
object per message.
    zygote -> plnt  {"ready": PID}                     once, when it can fork
    plnt -> zygote  {"id": N, "argv": [...], "dir": RUNNER_DIR, "log": LOG_PATH}  + 1 fd: the pipe
                    holding the runner's whole environment as a JSON object
    zygote -> plnt  {"id": N, "pid": PID}  or  {"id": N, "error": MESSAGE}
    zygote -> plnt  {"exit": PID, "code": CODE}        each child it reaps (CODE as Popen.returncode:
                                                       -N when killed by signal N)
End of file on the socket (plnt stopped or died): the zygote exits; its runners keep running (each
is its own session leader, and the next plnt adopts or stops them like exec'd ones).

Each child rewrites its command line (/proc/PID/cmdline, what `ps` shows) to the one an exec'd runner
has, `PYTHON -m plnt.runner ARGS...`, in the room the zygote's own padded command line leaves
(CMDLINE_ROOM, blanks), so tools and plnt recognise a runner and its release either way.

Each child: setsid; drops the socket; reads its environment from the pipe and replaces os.environ;
chdir RUNNER_DIR; stdout/stderr to LOG_PATH (append), stdin /dev/null; re-enables the GC; then
`plnt.runner.__main__.main(argv)`, which applies the limits and makes the process undumpable
before loading the recipe, exactly as an exec'd runner does. Its exit code is main's.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import socket
import sys
import threading
import traceback
from typing import Any, NoReturn

from plnt.core.zygote_protocol import MAX_ENV_BYTES, MAX_MESSAGE, decode, encode


def check_request(message: dict[str, Any]) -> tuple[int, list[str], str, str]:
    """(id, argv, runner dir, log path) of a start request; ValueError names what is wrong."""
    rid, argv, rdir, log = message.get("id"), message.get("argv"), message.get("dir"), message.get("log")
    if not isinstance(rid, int) or isinstance(rid, bool):
        raise ValueError("request needs an integer id")
    if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
        raise ValueError("request argv must be a list of strings")
    if not isinstance(rdir, str) or not os.path.isabs(rdir):
        raise ValueError("request dir must be an absolute path")
    if not isinstance(log, str) or not os.path.isabs(log):
        raise ValueError("request log must be an absolute path")
    return rid, argv, rdir, log


def exit_code(status: int) -> int:
    """A wait status as Popen.returncode has it."""
    return os.waitstatus_to_exitcode(status)


def read_env(fd: int) -> dict[str, str]:
    """The environment plnt wrote into the pipe `fd` (closed here), as a dict of strings."""
    chunks: list[bytes] = []
    size = 0
    try:
        while chunk := os.read(fd, 65536):
            size += len(chunk)
            if size > MAX_ENV_BYTES:
                raise ValueError("runner environment larger than 1 MiB")
            chunks.append(chunk)
    finally:
        os.close(fd)
    env = json.loads(b"".join(chunks))
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise ValueError("runner environment must be a JSON object of strings")
    return env


# plnt's own warm-up workflow (no user code): served once in the zygote before it forks, so the
# first-use work of a request cycle (caches filled, lazy imports, pydantic and starlette paths) is
# done in shared pages instead of again in each runner's private ones.
WARMUP_WORKFLOW = """\
apiVersion: microagents.dev/v1
kind: Workflow
metadata: {name: plnt-zygote-warmup, version: 0.0.0}
runtime: {entrypoint: steps.py}
steps:
  - {id: intent, tool: llm.classify, params: {input: "{review}", labels: [praise, complaint]}}
  - {id: voice, tool: rag.query, deps: [intent], params: {query: "{intent} {review}", k: 1}}
  - {id: reply, tool: llm.generate, deps: [intent, voice], params: {prompt: "{review} {voice}", maxTokens: 8}}
  - {id: checked, tool: policy.moderate, deps: [reply], params: {blocked: [refund]}}
output: checked
"""
WARMUP_STEPS = """\
async def checked(ctx):
    verdict = await ctx.tools.call("policy.moderate", text=ctx.results["reply"])
    return {"reply": ctx.results["reply"], "approved": verdict["approved"]}
"""


def warm_up() -> None:
    """Serve the warm-up workflow on a loopback port for one request cycle: /healthz, /invoke as
    JSON and as a stream, /chat streamed, /stats, a bad request. Best effort: a failure only costs
    memory (logged), never a runner."""
    import asyncio
    import shutil
    import tempfile

    import httpx
    from plnt.core.server import QuietServer, uvicorn_config
    from plnt.runner.adapters import MockBackend
    from plnt.runner.app import create_app
    from plnt.runner.recipe import load_recipe_dir

    scratch = tempfile.mkdtemp(prefix="plnt-zygote-warmup-")
    modules = set(sys.modules)
    try:
        with open(os.path.join(scratch, "workflow.yaml"), "w") as handle:
            handle.write(WARMUP_WORKFLOW)
        with open(os.path.join(scratch, "steps.py"), "w") as handle:
            handle.write(WARMUP_STEPS)
        os.mkdir(os.path.join(scratch, "knowledge"))
        with open(os.path.join(scratch, "knowledge", "voice.md"), "w") as handle:
            handle.write("# warm-up\nBe brief.\n")
        app = create_app(load_recipe_dir(scratch), MockBackend(), "warmup", host="127.0.0.1")
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        port = listener.getsockname()[1]
        listener.close()
        server = QuietServer(uvicorn_config(app, "127.0.0.1", port, log_level="warning", access_log=False,
                                            log_config=None))
        body = {"review": "great food"}
        chat = {"messages": [{"role": "user", "content": "great food"}], "stream": True}

        async def cycle() -> None:
            serving = asyncio.create_task(server.serve())
            try:
                while not server.started:
                    if serving.done():
                        return
                    await asyncio.sleep(0.005)
                base = f"http://127.0.0.1:{port}"
                async with httpx.AsyncClient(trust_env=False, timeout=10) as client:
                    for _ in range(3):
                        await client.get(f"{base}/healthz")
                        await client.post(f"{base}/invoke", json=body)
                    async with client.stream("POST", f"{base}/invoke", json=body,
                                             headers={"accept": "text/event-stream"}) as response:
                        async for _chunk in response.aiter_bytes():
                            pass
                    async with client.stream("POST", f"{base}/chat", json=chat) as response:
                        async for _chunk in response.aiter_bytes():
                            pass
                    await client.get(f"{base}/stats")
                    await client.post(f"{base}/invoke", content=b"{not json", headers={"content-type": "application/json"})
            finally:
                server.request_exit()
                await serving

        asyncio.run(cycle())  # closes its loop and joins the default executor's threads
    except Exception:  # noqa: BLE001 - see the docstring
        traceback.print_exc()
    finally:
        for name in set(sys.modules) - modules:
            if name.startswith("plnt_recipe_"):
                del sys.modules[name]
        shutil.rmtree(scratch, ignore_errors=True)


def retitle(args: list[str]) -> bool:
    """Overwrite this process's command line (the argv strings the kernel shows as
    /proc/self/cmdline) with `args`, truncated to the room there is; False if it cannot."""
    import ctypes

    try:
        with open("/proc/self/stat", "rb") as handle:
            stat = handle.read()
        fields = stat[stat.rindex(b")") + 2:].split()
        start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end (stat fields 48 and 49)
    except (OSError, ValueError, IndexError):
        return False
    room = end - start
    if room <= 0:
        return False
    data = b"\0".join(a.encode(errors="replace") for a in args)[: room - 1]
    ctypes.memmove(start, data.ljust(room, b"\0"), room)  # our own stack page, copy-on-write
    return True


def preload() -> None:
    """Import what every runner imports (and what uvicorn picks by name at start), so children share it."""
    import asyncio  # noqa: F401
    import logging.config  # noqa: F401

    import fastapi  # noqa: F401
    import httpx  # noqa: F401  (the http backend imports it on first use)
    import plnt.core.server  # noqa: F401
    import plnt.runner.__main__  # noqa: F401
    import plnt.runner.adapters  # noqa: F401
    import plnt.runner.app  # noqa: F401
    import plnt.runner.engine  # noqa: F401
    import plnt.runner.idle  # noqa: F401
    import plnt.runner.isolation  # noqa: F401
    import plnt.runner.recipe  # noqa: F401
    import uvicorn
    import uvicorn.lifespan.off  # noqa: F401
    import uvicorn.lifespan.on  # noqa: F401
    import uvicorn.loops.asyncio  # noqa: F401
    import uvicorn.loops.auto  # noqa: F401
    import uvicorn.protocols.http.auto  # noqa: F401
    import uvicorn.protocols.http.h11_impl  # noqa: F401
    import uvicorn.protocols.websockets.auto  # noqa: F401

    # Imported on first use, in every runner: loading a recipe (the spec models), the first request
    # (anyio's backend, starlette's streams).
    for lazy in ("difflib", "plnt.core.specs.loader", "plnt.reconciler.settings", "anyio._backends._asyncio",
                 "anyio.streams.memory", "anyio.streams.stapled", "fastapi.telemetry._runtime", "importlib.readers",
                 "importlib.resources.readers"):
        try:
            __import__(lazy)
        except ImportError:  # another version of a library: nothing to share, nothing broken
            pass
    for optional in ("uvloop", "httptools", "uvicorn.loops.uvloop", "uvicorn.protocols.http.httptools_impl"):
        try:
            __import__(optional)
        except ImportError:
            pass
    del uvicorn


class Zygote:
    def __init__(self, channel: socket.socket) -> None:
        self.channel = channel
        self.pid = os.getpid()

    def send(self, message: dict[str, Any]) -> None:
        try:
            self.channel.send(encode(message))
        except OSError:  # plnt is gone: the next recv sees EOF
            pass

    def on_sigchld(self, signum: int, frame: object) -> None:
        if os.getpid() != self.pid:  # a child between fork and resetting its handlers
            return
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self.send({"exit": pid, "code": exit_code(status)})

    def serve(self) -> None:
        signal.signal(signal.SIGCHLD, self.on_sigchld)
        self.send({"ready": self.pid})
        while True:
            try:
                data, fds, _flags, _addr = socket.recv_fds(self.channel, MAX_MESSAGE, 1)
            except ConnectionError:
                return
            if not data:
                for fd in fds:
                    os.close(fd)
                return  # plnt closed the channel
            self.handle(data, fds)

    def handle(self, data: bytes, fds: list[int]) -> None:
        rid: Any = None
        try:
            message = decode(data)
            rid = message.get("id")
            rid, argv, rdir, log = check_request(message)
            if len(fds) != 1:
                raise ValueError("request needs exactly one fd: the pipe holding the runner's environment")
            pid = os.fork()
            if pid == 0:
                run_child(self.channel, argv, rdir, log, fds[0])
            self.send({"id": rid, "pid": pid})
        except (ValueError, OSError) as exc:
            self.send({"id": rid, "error": f"{type(exc).__name__}: {exc}"})
        finally:
            for fd in fds:  # the child has its copy; the zygote never reads it
                try:
                    os.close(fd)
                except OSError:
                    pass


def run_child(channel: socket.socket, argv: list[str], runner_dir: str, log_path: str, env_fd: int) -> NoReturn:
    """In the forked child: become the runner, never return to the zygote's loop."""
    code = 1
    try:
        os.setsid()
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        # Opened while the channel still holds fd 0, so neither lands on 0-2 before the dup2s.
        log_fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        null_fd = os.open(os.devnull, os.O_RDONLY)
        channel.close()
        env = read_env(env_fd)
        os.environ.clear()
        os.environ.update(env)
        import tempfile

        tempfile.tempdir = None  # TMPDIR is the runner's own directory now
        os.chdir(runner_dir)
        with open("/proc/self/cmdline", "rb") as handle:
            python = handle.read().split(b"\0", 1)[0].decode(errors="replace")
        retitle([python, "-m", "plnt.runner", *argv])
        os.dup2(null_fd, 0)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.close(log_fd)
        os.close(null_fd)
        os.closerange(3, 1 << 16)  # nothing of the zygote's stays open in a runner (an exec'd one has 0-2 only)
        gc.enable()
        from plnt.runner.__main__ import main

        code = main(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 - whatever happens, the child must not return to the zygote
        traceback.print_exc()
        code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001, S110
                pass
        os._exit(code)


def _no_huge_pages() -> None:
    """prctl(PR_SET_THP_DISABLE): on a host with transparent huge pages "always", one refcount
    write in a runner would copy a whole 2 MiB page of the zygote's heap instead of 4 KiB.
    Inherited by every child."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(41, 1, 0, 0, 0)  # PR_SET_THP_DISABLE; best effort


def main() -> int:
    gc.disable()  # no collections while importing: nothing moves between pages before the freeze
    try:
        channel = socket.socket(fileno=0)
    except OSError:
        print("plnt.runner.zygote: fd 0 must be the AF_UNIX socket plnt passes; it is started by plnt's "
              "local driver (runner_start fork), not by hand", file=sys.stderr)
        return 2
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # plnt stops it by closing the channel
    _no_huge_pages()
    preload()
    warm_up()
    if threading.active_count() != 1:  # fork copies only the calling thread: a lock held elsewhere stays held
        print(f"plnt.runner.zygote: {threading.active_count()} threads before forking; refusing to serve",
              file=sys.stderr)
        return 2
    # No gc.collect() first (the gc docs' advice, and measured: ~0.9 MiB less per runner): a collection
    # would free objects in the middle of shared pages, and each child's first allocations would
    # fill those holes, copying the pages.
    gc.freeze()  # every object so far stays in the shared pages for good: children's GC never touches them
    Zygote(channel).serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
