"""Runtime adapters: what the `llm.*` tools call.

Two implementations of the `RuntimeAdapter` protocol:

- `MockBackend`: deterministic and offline. The completion is the last non-blank line of the
  prompt, produced word by word (for tests, golden cases and demos).
- `HTTPBackend`: any OpenAI-compatible upstream (vLLM, TGI's OpenAI API, SGLang, the llama.cpp
  server, OpenAI itself) over `POST {base_url}/v1/chat/completions`, streaming or not.

Every failure of an upstream is an `UpstreamError` whose `kind` says what went wrong:

=============  ====================================================================
kind           meaning
=============  ====================================================================
unavailable    no connection: refused, DNS failure, reset before any response
timeout        connecting took longer than `connect_timeout_s`, or the upstream sent
               nothing for `timeout_s` (before the response or between two chunks)
bad_status     the upstream answered with a non-2xx status (`status` and the
               upstream's own error message are in the exception)
bad_response   a 2xx answer that is not what the wire format says: not JSON, a missing
               field, a malformed SSE stream, a stream that ends early
=============  ====================================================================
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from plnt.core import telemetry
from plnt.core.routes import SHADOW_HEADER

if TYPE_CHECKING:  # httpx is imported on first use: a MockBackend runner starts without it
    import httpx

# Set while a mirrored invocation runs (the gateway's X-Plnt-Shadow, engine.run_workflow): its LLM calls
# carry X-Plnt-Shadow back to the gateway, which then does not mirror them to a model's canary again.
SHADOW_RUN: ContextVar[bool] = ContextVar("plnt_shadow_run", default=False)


def _shadow_marked(headers: dict[str, str] | None) -> dict[str, str] | None:
    """`headers` with X-Plnt-Shadow: 1 added during a mirrored invocation (SHADOW_RUN)."""
    if not SHADOW_RUN.get():
        return headers
    return {**(headers or {}), SHADOW_HEADER: "1"}


UpstreamErrorKind = Literal["unavailable", "timeout", "bad_status", "bad_response"]
# gen_ai.provider.name of the LLM-call spans (plnt.core.telemetry): an OpenAI-compatible server
# speaks OpenAI's API; the mock is plnt's own.
OPENAI_PROVIDER = "openai"
MOCK_PROVIDER = "plnt.mock"
MOCK_MODEL = "mock"


@runtime_checkable
class RuntimeAdapter(Protocol):
    """A text-completion backend. `stream` yields text chunks whose concatenation is the completion."""

    async def complete(self, prompt: str, *, system: str | None = None, max_tokens: int = 256) -> str: ...

    def stream(self, prompt: str, *, system: str | None = None, max_tokens: int = 256) -> AsyncIterator[str]: ...


class UpstreamError(Exception):
    """The model server failed: `kind` is one of unavailable, timeout, bad_status, bad_response.

    `status` is the upstream's HTTP status for bad_status (else None). The message never
    contains the API key.
    """

    def __init__(self, message: str, kind: UpstreamErrorKind, *, status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.kind: UpstreamErrorKind = kind
        self.status = status


# --- MockBackend -------------------------------------------------------------------------------


class MockBackend:
    """Deterministic, offline backend: the completion is the last non-blank line of the prompt.

    Tokens are whitespace-separated words, each with its trailing whitespace ("Thanks ",
    "for ", "visiting."); at most `max_tokens` are produced, each after `token_delay`
    seconds. `system` is ignored. Recipes use this by ending a prompt with the line they
    want "generated".
    """

    def __init__(self, token_delay: float = 0.0) -> None:
        self.token_delay = token_delay

    @staticmethod
    def tokens(prompt: str, max_tokens: int = 256) -> list[str]:
        lines = [line for line in prompt.splitlines() if line.strip()]
        last = lines[-1].strip() if lines else ""
        return re.findall(r"\S+\s*", last)[: max(max_tokens, 0)]

    async def _stream(self, prompt: str, max_tokens: int) -> AsyncIterator[str]:
        for token in self.tokens(prompt, max_tokens):
            if self.token_delay > 0:
                await asyncio.sleep(self.token_delay)
            yield token

    async def stream(self, prompt: str, *, system: str | None = None, max_tokens: int = 256) -> AsyncIterator[str]:
        if not telemetry.ENABLED:
            async for token in self._stream(prompt, max_tokens):
                yield token
            return
        span = telemetry.start_llm_call(MOCK_PROVIDER, MOCK_MODEL, max_tokens, stream=True)
        count, error = 0, None
        try:
            async for token in self._stream(prompt, max_tokens):
                count += 1
                yield token
        except BaseException as exc:
            error = exc if isinstance(exc, Exception) else None
            raise
        finally:  # its "tokens" are words: the counts a model server would report
            telemetry.end_llm_call(span, input_tokens=len(prompt.split()), output_tokens=count, error=error)

    async def complete(self, prompt: str, *, system: str | None = None, max_tokens: int = 256) -> str:
        if not telemetry.ENABLED:
            return "".join([token async for token in self._stream(prompt, max_tokens)])
        span = telemetry.start_llm_call(MOCK_PROVIDER, MOCK_MODEL, max_tokens, stream=False)
        tokens = [token async for token in self._stream(prompt, max_tokens)]
        telemetry.end_llm_call(span, input_tokens=len(prompt.split()), output_tokens=len(tokens))
        return "".join(tokens)

    async def aclose(self) -> None:
        return None

    def __repr__(self) -> str:
        return f"MockBackend(token_delay={self.token_delay})"


# --- HTTPBackend -------------------------------------------------------------------------------


def _upstream_message(body: bytes) -> str:
    """The upstream's own error message from an error body (OpenAI, vLLM, TGI, FastAPI shapes)."""
    text = body.decode("utf-8", "replace").strip()
    try:
        data = json.loads(text)
    except ValueError:
        return text[:300] or "(empty body)"
    if isinstance(data, dict):
        error = data.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return error["message"][:300]
        for candidate in (error, data.get("message"), data.get("detail")):
            if isinstance(candidate, str):
                return candidate[:300]
    return text[:300]


class HTTPBackend:
    """An OpenAI-compatible chat-completions upstream.

    `base_url` is the server's root (``http://127.0.0.1:8000``); a trailing ``/v1`` is accepted
    too, as OpenAI clients spell it. `complete` POSTs ``/v1/chat/completions`` with
    ``{"model", "messages": [system?, user], "max_tokens"}`` and returns
    ``choices[0].message.content``; `stream` adds ``"stream": true`` and yields each
    ``choices[0].delta.content`` of the SSE ``data:`` chunks until ``data: [DONE]``.

    `api_key`, if any, is sent as ``Authorization: Bearer`` and appears nowhere else (not in
    errors, logs or repr). `timeout_s` bounds every wait for the upstream (the response
    headers, and each chunk of a body or stream: a stream that keeps producing tokens may
    run longer); `connect_timeout_s` bounds connecting. One `httpx.AsyncClient` per backend,
    created on first use (with `trust_env=False`: no proxy from the environment) and closed
    by `aclose()`.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        timeout_s: float = 60.0,
        connect_timeout_s: float = 5.0,
    ) -> None:
        root = base_url.rstrip("/")
        root = root.removesuffix("/v1")
        self.base_url = root
        self.url = f"{root}/v1/chat/completions"
        self.model = model
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.__api_key = api_key
        self._client: httpx.AsyncClient | None = None

    def __repr__(self) -> str:
        return f"HTTPBackend(base_url={self.base_url!r}, model={self.model!r}, api_key={'set' if self.__api_key else None})"

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            import httpx

            headers = {"accept": "application/json"}
            if self.__api_key:
                headers["authorization"] = f"Bearer {self.__api_key}"
            self._client = httpx.AsyncClient(
                timeout=httpx.Timeout(self.timeout_s, connect=self.connect_timeout_s),
                headers=headers,
                trust_env=False,
                limits=httpx.Limits(max_connections=256, max_keepalive_connections=64, keepalive_expiry=30.0),
            )
        return self._client

    async def aclose(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            await client.aclose()

    def _body(self, prompt: str, system: str | None, max_tokens: int, stream: bool) -> dict[str, Any]:
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
        body: dict[str, Any] = {"model": self.model, "messages": messages, "max_tokens": max_tokens}
        if stream:
            body["stream"] = True
        return body

    def _transport_error(self, exc: Exception, *, reading: bool) -> UpstreamError:
        import httpx

        where = f"{self.base_url} (model {self.model})"
        if isinstance(exc, httpx.TimeoutException):
            what = "connecting" if isinstance(exc, httpx.ConnectTimeout) else "waiting for an answer"
            limit = self.connect_timeout_s if isinstance(exc, httpx.ConnectTimeout) else self.timeout_s
            return UpstreamError(f"upstream {where} timed out {what} (after {limit:g}s)", "timeout")
        if reading:  # the response had started: the body or stream broke off
            return UpstreamError(f"upstream {where} broke off its response: {type(exc).__name__}: {exc}", "bad_response")
        return UpstreamError(f"upstream {where} is unavailable: {type(exc).__name__}: {exc}", "unavailable")

    def _bad_status(self, status: int, body: bytes) -> UpstreamError:
        return UpstreamError(
            f"upstream {self.base_url} answered HTTP {status}: {_upstream_message(body)}", "bad_status", status=status
        )

    def _bad_response(self, problem: str) -> UpstreamError:
        return UpstreamError(f"upstream {self.base_url} sent a bad response: {problem}", "bad_response")

    def _content(self, data: Any) -> str:
        """`choices[0].message.content` of a chat.completion object."""
        try:
            message = data["choices"][0]["message"]
            content = message["content"]
        except (KeyError, IndexError, TypeError):
            raise self._bad_response("no choices[0].message.content in the completion") from None
        if content is None:  # e.g. a refusal or tool call: no text
            return ""
        if not isinstance(content, str):
            raise self._bad_response(f"choices[0].message.content is a {type(content).__name__}, not a string")
        return content

    async def complete(self, prompt: str, *, system: str | None = None, max_tokens: int = 256) -> str:
        if not telemetry.ENABLED:
            return await self._complete(prompt, system, max_tokens, None)
        span = telemetry.start_llm_call(OPENAI_PROVIDER, self.model, max_tokens, stream=False, server=self.base_url)
        usage: dict[str, Any] = {}
        try:
            text = await self._complete(prompt, system, max_tokens, usage, telemetry.inject({}, span))
        except Exception as exc:
            telemetry.end_llm_call(span, error=exc)
            raise
        telemetry.end_llm_call(span, **usage)
        return text

    async def _complete(self, prompt: str, system: str | None, max_tokens: int, usage: dict[str, Any] | None,
                        trace_headers: dict[str, str] | None = None) -> str:
        import httpx

        client = self._http()
        try:
            response = await client.post(self.url, json=self._body(prompt, system, max_tokens, stream=False),
                                         headers=_shadow_marked(trace_headers))
        except httpx.TransportError as exc:
            raise self._transport_error(exc, reading=False) from None
        if not 200 <= response.status_code < 300:
            raise self._bad_status(response.status_code, response.content)
        try:
            data = json.loads(response.content)
        except ValueError:
            raise self._bad_response(f"body is not JSON: {response.text[:120]!r}") from None
        if usage is not None:
            _usage_of(data, usage)
        return self._content(data)

    async def stream(self, prompt: str, *, system: str | None = None, max_tokens: int = 256) -> AsyncIterator[str]:
        if not telemetry.ENABLED:
            async for token in self._stream(prompt, system, max_tokens, None, {}):
                yield token
            return
        span = telemetry.start_llm_call(OPENAI_PROVIDER, self.model, max_tokens, stream=True, server=self.base_url)
        usage: dict[str, Any] = {}
        error = None
        try:
            async for token in self._stream(prompt, system, max_tokens, usage, telemetry.inject({}, span)):
                yield token
        except BaseException as exc:
            error = exc if isinstance(exc, Exception) else None
            raise
        finally:
            telemetry.end_llm_call(span, error=error, **usage)

    async def _stream(self, prompt: str, system: str | None, max_tokens: int, usage: dict[str, Any] | None,
                      trace_headers: dict[str, str]) -> AsyncIterator[str]:
        import httpx

        client = self._http()
        request = client.build_request("POST", self.url, json=self._body(prompt, system, max_tokens, stream=True),
                                       headers=_shadow_marked({"accept": "text/event-stream", **trace_headers}))
        try:
            response = await client.send(request, stream=True)
        except httpx.TransportError as exc:
            raise self._transport_error(exc, reading=False) from None
        try:
            if not 200 <= response.status_code < 300:
                try:
                    body = await response.aread()
                except httpx.TransportError:
                    body = b""
                raise self._bad_status(response.status_code, body)
            if response.headers.get("content-type", "").startswith("application/json"):
                # An upstream that ignores "stream": a whole completion in one piece.
                try:
                    data = json.loads(await response.aread())
                except ValueError:
                    raise self._bad_response("body is not JSON") from None
                content = self._content(data)
                if usage is not None:
                    _usage_of(data, usage)
                if content:
                    yield content
                return
            async for token in self._sse_tokens(response, usage):
                yield token
        except httpx.TransportError as exc:
            raise self._transport_error(exc, reading=True) from None
        finally:
            await response.aclose()

    async def _sse_tokens(self, response: httpx.Response, usage: dict[str, Any] | None = None) -> AsyncIterator[str]:
        """The `delta.content` of each SSE event; ends at `data: [DONE]`.

        Events follow the SSE format: `data:` lines (several are joined with "\\n"), ended by
        a blank line; comments (`:`) and other fields are ignored. A stream that closes
        without `[DONE]` is accepted only if a chunk carried a `finish_reason`.
        """
        data_lines: list[str] = []
        finished = False

        def chunk_tokens(payload: str) -> str | None:
            nonlocal finished
            try:
                chunk = json.loads(payload)
            except ValueError:
                raise self._bad_response(f"SSE data is not JSON: {payload[:120]!r}") from None
            if not isinstance(chunk, dict):
                raise self._bad_response(f"SSE data is not a JSON object: {payload[:120]!r}")
            if usage is not None and chunk.get("usage"):  # servers asked for stream usage send it last
                _usage_of(chunk, usage)
            if "error" in chunk or chunk.get("object") == "error":
                error = chunk.get("error", chunk)
                message = error.get("message") if isinstance(error, dict) else error
                raise self._bad_response(f"upstream reported an error mid-stream: {str(message)[:300]}")
            choices = chunk.get("choices")
            if not isinstance(choices, list):
                raise self._bad_response(f"SSE chunk has no choices: {payload[:120]!r}")
            if not choices:  # e.g. a usage-only chunk
                return None
            choice = choices[0]
            if not isinstance(choice, dict):
                raise self._bad_response("SSE chunk choices[0] is not an object")
            if choice.get("finish_reason"):
                finished = True
            delta = choice.get("delta")
            if delta is None:
                if "finish_reason" in choice:
                    return None
                raise self._bad_response("SSE chunk has no choices[0].delta")
            if not isinstance(delta, dict):
                raise self._bad_response("SSE chunk choices[0].delta is not an object")
            content = delta.get("content")
            if content is not None and not isinstance(content, str):
                raise self._bad_response("SSE chunk delta.content is not a string")
            return content or None

        async for line in response.aiter_lines():
            if line == "":
                if data_lines:
                    payload, data_lines = "\n".join(data_lines), []
                    if payload.strip() == "[DONE]":
                        return
                    token = chunk_tokens(payload)
                    if token:
                        yield token
                continue
            if line.startswith(":"):
                continue
            field, _, value = line.partition(":")
            if field == "data":
                data_lines.append(value[1:] if value.startswith(" ") else value)
        if data_lines:  # the last event without its blank line
            payload = "\n".join(data_lines)
            if payload.strip() == "[DONE]":
                return
            token = chunk_tokens(payload)
            if token:
                yield token
        if not finished:
            raise self._bad_response("the stream ended without data: [DONE]")


def _usage_of(data: Any, usage: dict[str, Any]) -> None:
    """The token counts of an OpenAI `usage` object, as end_llm_call's keywords (for the LLM-call span)."""
    found = data.get("usage") if isinstance(data, dict) else None
    if isinstance(found, dict):
        for ours, theirs in (("input_tokens", "prompt_tokens"), ("output_tokens", "completion_tokens")):
            if isinstance(found.get(theirs), int):
                usage[ours] = found[theirs]
    if isinstance(data, dict) and isinstance(data.get("model"), str):
        usage["response_model"] = data["model"]
