"""What every plnt command shares: how it fails (one `error:` line and an exit code), its log lines
(credentials redacted), its secrets (from an environment variable or a file, never the command
line: `ps` shows that), the event loop it runs on, and how a server command waits for Ctrl-C.

Standard library and typer only at import: each command imports what it needs when it runs.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from plnt.reconciler.redact import redact

if TYPE_CHECKING:
    import asyncio

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"


def fail(message: str, code: int = 1) -> typer.Exit:
    """Print `error: MESSAGE` on stderr; the caller raises what this returns (exit CODE)."""
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)


class RedactingFormatter(logging.Formatter):
    """Log lines (tracebacks included) with URL credentials replaced: a last line of defence."""

    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))


def setup_logging(verbose: bool) -> None:
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, format=LOG_FORMAT, datefmt="%H:%M:%S",
                        stream=sys.stderr)
    for handler in logging.getLogger().handlers:
        handler.setFormatter(RedactingFormatter(LOG_FORMAT, "%H:%M:%S"))
    for noisy in ("temporalio", "httpx", "httpcore", "git", "uvicorn.error"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def secret(value: str | None, file: Path | None, option: str) -> str | None:
    """A secret given as a value (an environment variable, ideally) or as a file (its first line,
    which wins); exit 2 when the file cannot be read or its first line is empty."""
    if file is None:
        return value
    try:
        lines = file.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise fail(f"cannot read the secret for {option} from {file}: {exc}", 2) from exc
    if not lines or not lines[0].strip():
        raise fail(f"{file} is empty: it should hold the secret for {option} on its first line", 2)
    return lines[0].strip()


def secret_from(env_name: str | None, file: Path | None, option: str) -> str | None:
    """A secret from the environment variable named (OPTION-env) or from a file (OPTION-file), not
    both; None when neither is given. Exit 2, saying why, when the one given holds none."""
    if env_name and file:
        raise fail(f"give {option}-env or {option}-file, not both", 2)
    if env_name:
        value = os.environ.get(env_name, "").strip()
        if not value:
            raise fail(f"{option}-env {env_name}: the environment variable is not set or empty", 2)
        return value
    if file:
        try:
            value = file.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise fail(f"{option}-file {file}: cannot read it ({exc})", 2) from exc
        if not value:
            raise fail(f"{option}-file {file} is empty", 2)
        return value
    return None


def env_gateway_tokens() -> tuple[str, ...]:
    """PLNT_GATEWAY_TOKENS: comma-separated bearer tokens allowed everything."""
    return tuple(t.strip() for t in os.environ.get("PLNT_GATEWAY_TOKENS", "").split(",") if t.strip())


def port_problem(host: str, port: int) -> str | None:
    """Why HOST:PORT cannot be listened on (another plnt there, say), or None."""
    import socket

    if port == 0:
        return None
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            return f"cannot listen on {host}:{port} ({exc.strerror}); is another plnt running? choose a port with --port"
    return None


def event_loop_factory(loop: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """--loop auto|uvloop|asyncio: uvloop's loop factory when asked for (or auto and installed),
    None for asyncio's own; exit 2 for any other name or an uvloop that is not installed."""
    if loop not in ("auto", "uvloop", "asyncio"):
        raise fail(f"--loop must be auto, uvloop or asyncio, not {loop!r}", 2)
    if loop == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if loop == "uvloop":
            raise fail("--loop uvloop: uvloop is not installed", 2) from None
        return None
    return uvloop.new_event_loop


def stop_on_signals() -> asyncio.Event:
    """An event SIGINT and SIGTERM set, on the running loop: a server command's way out."""
    import asyncio
    import signal

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    return stop


def start_failure(exc: Exception, what: str, *also: type[BaseException]) -> typer.Exit:
    """A start-up failure plnt knows (it says what to fix) as one `error:` line and exit 2; any other
    exception is re-raised with its traceback. `also`: further exception types that count as known."""
    from plnt.core.server import ServerStartError

    if not isinstance(exc, (ServerStartError, OSError, *also)):
        raise exc
    return fail(f"{what} could not start: {exc}", 2)



def auth_headers(token: str | None) -> dict[str, str]:
    """The gateway's bearer token as a request header, when there is one."""
    return {"authorization": f"Bearer {token}"} if token else {}


def api_answer(response: Any) -> Any:
    """A running plnt's JSON answer; its refusals as plnt's client commands word them: 404 and 409 (not
    there, refused) exit 1, 401/403 (the token) and any other error exit 2."""
    if response.status_code in (404, 409):
        raise fail(_error_message(response), 1)
    if response.status_code in (401, 403):
        raise fail(_error_message(response) + " (--token/--token-file)", 2)
    if response.status_code >= 400:
        raise fail(f"{response.request.method} {response.request.url.path}: HTTP {response.status_code}: "
                   f"{response.text[:500]}", 2)
    return response.json()


def _error_message(response: Any) -> str:
    try:
        return str(response.json().get("error", {}).get("message") or response.text)
    except (ValueError, AttributeError):  # not plnt's JSON error (a proxy's page, say)
        return f"HTTP {response.status_code}: {response.text[:300]}"


def api_get(url: str, path: str, token: str | None, params: dict[str, str] | None = None) -> Any:
    """GET a running plnt's PATH (api_answer's exits); exit 2 when nothing answers at URL."""
    import httpx

    try:
        with httpx.Client(trust_env=False, timeout=10, headers=auth_headers(token)) as client:
            response = client.get(f"{url}{path}", params=params)
    except httpx.HTTPError as exc:
        raise fail(f"no plnt answers at {url} ({exc}); is plnt up running? (--url)", 2) from exc
    return api_answer(response)


def failure_of(exc: Exception) -> typer.Exit:
    """A PlntError as its type, its reason when it has one, and its message; exit 1."""
    reason = getattr(exc, "reason", None)
    return fail(f"{type(exc).__name__}: {reason + ': ' if reason else ''}{exc}", 1)
