"""The `integration` marker check, hooked in by tests/conftest.py (see docs/development.md, "Tests").

`integration` means: the test starts a real service or process. `pytest -m "not integration"`
must start none, so:

1. At collection, a test that requests a service fixture (`SERVICE_FIXTURES`: the Temporal dev
   server, the OCI registry, the S3 emulator, the gateway tests' uvicorn servers, ...) is marked
   `integration`, whatever its module says.
2. While a test runs (setup, call and teardown), every socket put to listen in this process and
   every subprocess started is recorded (`git`, which builds the test repositories, excepted),
   as is every service fixture obtained on the fly (`request.getfixturevalue`). A test NOT marked
   `integration` that did any of it FAILS, naming what it started and how to fix it.

3. After an integration test that used `tmp_path`, no runner process naming a path under it, or
   working in it, is still running (`no_runner_outlives_its_test`): a clean stop of plnt stops
   every runner it started, so a leftover one FAILS the test, named, and is killed.

tests/test_hygiene.py runs these checks against tests written to break them.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import pytest

# Fixtures that start (or hand out) a real service. Requesting one makes a test `integration`.
SERVICE_FIXTURES = frozenset({
    "temporal_address", "temporal_namespace",  # Temporal dev server (tests/conftest.py)
    "oci_registry", "s3_server", "s3_bucket",  # docker-registry, moto_server (tests/services.py)
    "start_server", "start_gateway", "make_gateway",  # uvicorn servers (tests/gateway/conftest.py)
    "raw_server",  # asyncio servers (tests/core/test_upstream.py)
    "peer_server",  # the OpenAI-wire test peer (tests/openai_peer.py), uvicorn in a thread
    "helm",  # the real helm binary (tests/reconciler/drivers/test_helm_chart.py)
})

# Programs a unit test may run: git builds the throwaway repositories tests read.
UNIT_SAFE_PROGRAMS = frozenset({"git"})

_lock = threading.Lock()
_started: list[str] = []
_recording = False
_installed = False


def _note(what: str) -> None:
    if _recording:
        with _lock:
            _started.append(what)


def _program(args: Any) -> str:
    if isinstance(args, (str, bytes, os.PathLike)):
        first = os.fsdecode(args).split()[0] if os.fsdecode(args).split() else ""
    else:
        first = os.fsdecode(list(args)[0]) if args else ""
    return os.path.basename(first)


def _install() -> None:
    """Wrap socket.listen and subprocess.Popen once per session; they only record, never refuse."""
    global _installed
    if _installed:
        return
    _installed = True
    real_listen = socket.socket.listen
    real_popen_init = subprocess.Popen.__init__

    def listen(self: socket.socket, *args: Any) -> None:
        try:
            where = self.getsockname()
        except OSError:
            where = "?"
        _note(f"a listening socket on {where}")
        return real_listen(self, *args)

    def popen_init(self: subprocess.Popen, args: Any, *rest: Any, **kwargs: Any) -> None:  # type: ignore[type-arg]
        real_popen_init(self, args, *rest, **kwargs)  # a program that cannot start raises: nothing started
        if _program(args) not in UNIT_SAFE_PROGRAMS:
            shown = args if isinstance(args, (str, bytes)) else " ".join(os.fsdecode(a) for a in args)
            _note(f"the process {str(shown)[:200]!r}")

    socket.socket.listen = listen  # type: ignore[method-assign]
    subprocess.Popen.__init__ = popen_init  # type: ignore[method-assign]


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects: the mark must be there by then
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if SERVICE_FIXTURES.intersection(getattr(item, "fixturenames", ())) and item.get_closest_marker("integration") is None:
            item.add_marker(pytest.mark.integration)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, object, object]:
    global _recording
    _install()
    with _lock:
        _started.clear()
    _recording = True
    try:
        return (yield)
    finally:
        _recording = False


def _services_used(item: pytest.Item) -> list[str]:
    request = getattr(item, "_request", None)
    names = set(getattr(request, "_fixture_defs", {}) or {}) | set(getattr(item, "fixturenames", ()))
    return sorted(SERVICE_FIXTURES & names)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item,
                               call: pytest.CallInfo[None]) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if call.when != "call" or item.get_closest_marker("integration") is not None:
        return report
    with _lock:
        started = list(dict.fromkeys(_started))
    started += [f"the service fixture {name!r}" for name in _services_used(item)]
    if not started:
        return report
    message = (f"{item.nodeid} is not marked integration, but it started: " + "; ".join(started[:10])
               + ". Mark it @pytest.mark.integration (docs/development.md, Tests), or test the code without starting it.")
    if report.passed:
        report.outcome = "failed"
        report.longrepr = message
    else:
        report.sections.append(("integration check", message))
    return report


def runners_under(root: Path) -> dict[int, str]:
    """Runner processes (exec'd or forked: both show `-m plnt.runner` in their command line) whose
    command line names a path under `root`, or whose working directory is under it (a runner's is
    STATE/runners/RELEASE, also when its recipe lies elsewhere)."""
    needle = os.fsencode(str(root))
    found: dict[int, str] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            argv = Path(entry.path, "cmdline").read_bytes()
            if b"\0plnt.runner\0" not in argv:  # (the zygote is plnt.runner.zygote)
                continue
            cwd = os.fsencode(os.readlink(Path(entry.path, "cwd")))
        except OSError:
            continue
        if needle in argv or cwd.startswith(needle + b"/"):
            found[int(entry.name)] = argv.replace(b"\0", b" ").decode(errors="replace").strip()[:300]
    return found


@pytest.fixture(autouse=True)
def no_runner_outlives_its_test(request: pytest.FixtureRequest) -> Iterator[None]:
    """After an integration test (its plnt stopped), no runner it started is still running: a clean
    stop stops every runner plnt started. A leftover one fails the test, named, and is killed."""
    yield
    tmp = request.node.funcargs.get("tmp_path") if hasattr(request.node, "funcargs") else None
    if tmp is None or request.node.get_closest_marker("integration") is None:
        return
    deadline = time.monotonic() + 10  # a runner told to stop may still be exiting
    left = runners_under(tmp)
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = runners_under(tmp)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    if left:
        shown = "; ".join(f"pid {pid}: {argv}" for pid, argv in left.items())
        pytest.fail(f"{len(left)} runner process(es) outlived the test (killed now): {shown}", pytrace=False)
