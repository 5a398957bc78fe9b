"""The `integration` marker check, hooked in by tests/conftest.py (see README.md, "Tests").

`integration` means: the test starts a real service or process. `pytest -m "not integration"`
must start none, so:

1. At collection, a test that requests a service fixture (`SERVICE_FIXTURES`: the Temporal dev
   server, the OCI registry, the S3 emulator, the gateway tests' uvicorn servers, ...) is marked
   `integration`, whatever its module says.
2. While a test runs (setup, call and teardown), every socket put to listen in this process and
   every subprocess started is recorded (`git`, which builds the test repositories, excepted),
   as is every service fixture obtained on the fly (`request.getfixturevalue`). A test NOT marked
   `integration` that did any of it FAILS, naming what it started and how to fix it.

tests/test_hygiene.py runs this check against tests written to break it.
"""

from __future__ import annotations

import os
import socket
import subprocess
import threading
from collections.abc import Generator
from typing import Any

import pytest

# Fixtures that start (or hand out) a real service. Requesting one makes a test `integration`.
SERVICE_FIXTURES = frozenset({
    "temporal_address", "temporal_namespace",  # Temporal dev server (tests/conftest.py)
    "oci_registry", "s3_server", "s3_bucket",  # docker-registry, moto_server (tests/services.py)
    "start_server", "start_gateway", "make_gateway",  # uvicorn servers (tests/gateway/conftest.py)
    "raw_server",  # asyncio servers (tests/gateway/test_upstream.py)
    "peer_server",  # the OpenAI-wire test peer (tests/openai_peer.py), uvicorn in a thread
    "helm",  # the real helm binary (tests/reconciler/test_helm_chart.py)
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
               + ". Mark it @pytest.mark.integration (README.md, Tests), or test the code without starting it.")
    if report.passed:
        report.outcome = "failed"
        report.longrepr = message
    else:
        report.sections.append(("integration check", message))
    return report
