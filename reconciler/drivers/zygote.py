"""plnt's side of the runner zygote (plnt.runner.zygote; protocol there): start it, ask it to fork
runners, learn their exit codes.

One zygote per LocalDriver, started on the first runner start and again on the next start after
it died (its runners live on without it). A reader thread takes its messages: replies complete the
request's future, exit reports are kept per pid until the runner's handle collects them.
`ForkedRunner` answers poll/wait/kill like the Popen of an exec'd runner, so the driver treats both
alike: exit 2 is still "recipe did not load", exit 3 "limits could not be set".
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import json
import logging
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from plnt.core.zygote_protocol import CMDLINE_ROOM, MAX_MESSAGE, decode, encode
from plnt.reconciler.drivers.processes import process_start_time, signal_process

log = logging.getLogger(__name__)

READY_TIMEOUT_S = 60.0
GIVE_UP_WAIT_S = 2.0  # the zygote answers in milliseconds; a SIGSTOPped one never


class ZygoteError(RuntimeError):
    """The zygote could not be started or could not fork a runner."""


class _Zygote:
    """One running zygote process and its channel."""

    def __init__(self, process: subprocess.Popen[bytes], channel: socket.socket) -> None:
        self.process = process
        self.channel = channel
        self.ready: concurrent.futures.Future[int] = concurrent.futures.Future()
        self._pending: dict[int, concurrent.futures.Future[int]] = {}
        self._exits: dict[int, int] = {}
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self.closed = False
        self._reader = threading.Thread(target=self._read, name=f"zygote-{process.pid}", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        try:
            while True:
                data = self.channel.recv(MAX_MESSAGE)
                if not data:
                    break
                self._dispatch(decode(data))
        except (OSError, ValueError) as exc:
            if not self.closed:
                log.warning("zygote-channel-failed pid=%s error=%s", self.process.pid, exc)
        finally:
            self.closed = True
            error = ZygoteError(f"the runner zygote (pid {self.process.pid}) exited; the next start restarts it")
            with self._lock:
                pending, self._pending = self._pending, {}
            for future in pending.values():
                if future.set_running_or_notify_cancel():  # (a cancelled one stays cancelled)
                    future.set_exception(error)
            if not self.ready.done():
                self.ready.set_exception(error)

    def _dispatch(self, message: dict[str, Any]) -> None:
        if "ready" in message:
            if not self.ready.done():
                self.ready.set_result(int(message["ready"]))
        elif "exit" in message:
            with self._lock:
                self._exits[int(message["exit"])] = int(message["code"])
        elif "id" in message:
            with self._lock:
                future = self._pending.pop(message["id"], None) if isinstance(message["id"], int) else None
            # Atomic against ZygoteClient.spawn giving up (future.cancel()): either the spawn gets the
            # pid and kills what it no longer wants, or this kills it; never neither.
            if future is None or not future.set_running_or_notify_cancel():
                if "pid" in message:  # its start was cancelled or timed out: nobody will record or stop it
                    log.warning("zygote-runner-abandoned pid=%s: its start was cancelled", message["pid"])
                    signal_process(int(message["pid"]), signal.SIGKILL)
                return
            if "pid" in message:
                future.set_result(int(message["pid"]))
            else:
                future.set_exception(ZygoteError(f"the runner zygote could not fork: {message.get('error')}"))

    @property
    def alive(self) -> bool:
        return not self.closed and self.process.poll() is None

    def request(self, argv: list[str], runner_dir: Path, log_path: Path,
                env: Mapping[str, str]) -> concurrent.futures.Future[int]:
        future: concurrent.futures.Future[int] = concurrent.futures.Future()
        rid = next(self._ids)
        with self._lock:
            self._pending[rid] = future
        read_fd, write_fd = os.pipe()
        try:
            # The environment (with the LLM key) goes through a pipe only the child reads. A pipe
            # holds 64 KiB; an allowlisted environment is far smaller, so this write never blocks.
            payload = json.dumps(dict(env)).encode()
            if len(payload) > 60_000:
                raise ZygoteError(f"runner environment too large for the zygote's pipe ({len(payload)} bytes)")
            os.write(write_fd, payload)
            os.close(write_fd)
            write_fd = -1
            message = encode({"id": rid, "argv": argv, "dir": str(runner_dir), "log": str(log_path)})
            socket.send_fds(self.channel, [message], [read_fd])
        except BaseException:
            with self._lock:
                self._pending.pop(rid, None)
            raise
        finally:
            os.close(read_fd)
            if write_fd >= 0:
                os.close(write_fd)
        return future

    def pop_exit(self, pid: int) -> int | None:
        with self._lock:
            return self._exits.pop(pid, None)

    def close(self, timeout_s: float = 5.0) -> None:
        """Close the channel: the zygote exits (its runners do not). Requests still unanswered (their
        starts cancelled, e.g. by plnt stopping) get their answers first, so the runners they forked
        are killed rather than left running unrecorded."""
        deadline = time.monotonic() + min(timeout_s, 2.0)
        while self._pending and not self.closed and time.monotonic() < deadline:
            time.sleep(0.01)
        self.closed = True
        try:
            self.channel.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.channel.close()
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class ForkedRunner:
    """A runner forked by the zygote, seen like a Popen: pid, poll(), wait(), kill()."""

    def __init__(self, pid: int, zygote: _Zygote, start_time: str | None) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._zygote = zygote
        self._start_time = start_time

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._zygote.pop_exit(self.pid)
        return self.returncode

    @property
    def reports_exit(self) -> bool:
        """Whether poll() will see this runner's exit: only while the zygote that reaps it lives
        (after that the runner's parent is init, and only /proc tells)."""
        return self._zygote.alive

    def _gone(self) -> bool:
        if self.poll() is not None:
            return True
        # Gone from /proc: its exit report is on its way, unless the zygote (its parent) is gone too.
        now = process_start_time(self.pid)
        return (now is None or now != self._start_time) and not self._zygote.alive

    def wait(self, timeout: float | None = None) -> int | None:
        """Until the zygote reports its exit (or, the zygote gone, the process is gone)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._gone():
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"runner pid {self.pid}", timeout or 0)
            time.sleep(0.01)
        return self.returncode

    def kill(self) -> None:
        signal_process(self.pid, signal.SIGKILL)


async def _give_up(future: concurrent.futures.Future[int], answer: asyncio.Future[int]) -> None:
    """A start abandoned while the zygote forks: the runner it forks is nobody's, so it is killed
    before the abandoning start returns (its cancellation then leaves nothing behind), or, if the
    zygote has not answered within GIVE_UP_WAIT_S, by the reader when it does."""
    try:
        async with asyncio.timeout(GIVE_UP_WAIT_S):
            await asyncio.shield(answer)
    except BaseException:
        pass
    if future.cancel():
        return
    try:
        pid = future.result(timeout=1.0)  # answered (or being answered this instant)
    except BaseException:
        return  # the fork failed, or the zygote went away: no runner
    log.warning("zygote-runner-abandoned pid=%s: its start was cancelled", pid)
    signal_process(pid, signal.SIGKILL)


class ZygoteClient:
    """Starts (and restarts) the zygote; `spawn` forks one runner from it."""

    def __init__(self, python: str, workdir: Path, env: Mapping[str, str]) -> None:
        self._python = python
        self._workdir = workdir  # its cwd, HOME and TMPDIR, and its log (zygote.log)
        self._env = dict(env)  # allowlisted: no secret ever reaches the zygote
        self._zygote: _Zygote | None = None
        self._closed = False  # by close(), for good: no zygote starts after it
        self._lock = threading.Lock()

    @property
    def pid(self) -> int | None:
        zygote = self._zygote
        return zygote.process.pid if zygote is not None and zygote.alive else None

    def _ensure(self) -> _Zygote:
        with self._lock:
            if self._closed:
                raise ZygoteError("the runner zygote was stopped (plnt is stopping)")
            if self._zygote is not None and self._zygote.alive:
                return self._zygote
            if self._zygote is not None:
                log.warning("zygote-restart old_pid=%s code=%s", self._zygote.process.pid, self._zygote.process.poll())
                self._zygote.close(timeout_s=1.0)
            self._workdir.mkdir(parents=True, exist_ok=True)
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            try:
                with open(self._workdir / "zygote.log", "ab") as log_file:
                    process = subprocess.Popen(
                        [self._python, "-m", "plnt.runner.zygote", CMDLINE_ROOM], stdin=theirs.fileno(), stdout=log_file,
                        stderr=subprocess.STDOUT, cwd=self._workdir, env=self._env,
                        start_new_session=True)  # Ctrl-C reaches plnt, which stops things in order
            except BaseException:
                ours.close()
                raise
            finally:
                theirs.close()
            zygote = _Zygote(process, ours)
            try:
                zygote.ready.result(timeout=READY_TIMEOUT_S)
            except (concurrent.futures.TimeoutError, ZygoteError) as exc:
                zygote.close(timeout_s=1.0)
                raise ZygoteError(f"the runner zygote did not start ({exc or 'no answer'}); see "
                                  f"{self._workdir / 'zygote.log'}, or start runners with --runner-start exec") from None
            log.info("zygote-started pid=%s", process.pid)
            self._zygote = zygote
            return zygote

    async def spawn(self, argv: list[str], runner_dir: Path, log_path: Path, env: Mapping[str, str],
                    timeout_s: float = 30.0) -> ForkedRunner:
        zygote = await asyncio.to_thread(self._ensure)  # the first start imports for ~1 s: not on the loop
        future = zygote.request(argv, runner_dir, log_path, env)
        answer = asyncio.wrap_future(future)
        try:
            # Not asyncio.wait_for: on 3.11 it returns the result and drops the cancellation when both
            # land in one loop turn (the install then went on for its whole start timeout), and a
            # cancelled wrap_future drops a pid that had arrived (a runner left running, unrecorded).
            async with asyncio.timeout(timeout_s):
                pid = await asyncio.shield(answer)
        except BaseException as exc:  # cancelled (a newer commit superseded the saga) or no answer in time
            await _give_up(future, answer)
            if isinstance(exc, TimeoutError):
                raise ZygoteError(f"the runner zygote did not answer within {timeout_s:.0f}s") from None
            raise
        return ForkedRunner(pid, zygote, process_start_time(pid))

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._zygote is not None:
                self._zygote.close()
                self._zygote = None
