"""Runtime adapters: what the `llm.*` tools call. The runner ships one, `MockBackend`."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from typing import Protocol, runtime_checkable


@runtime_checkable
class RuntimeAdapter(Protocol):
    """A text-completion backend. `stream` yields text chunks whose concatenation is the completion."""

    async def complete(self, prompt: str, *, system: str | None = None, max_tokens: int = 256) -> str: ...

    def stream(self, prompt: str, *, system: str | None = None, max_tokens: int = 256) -> AsyncIterator[str]: ...


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

    async def stream(self, prompt: str, *, system: str | None = None, max_tokens: int = 256) -> AsyncIterator[str]:
        for token in self.tokens(prompt, max_tokens):
            if self.token_delay > 0:
                await asyncio.sleep(self.token_delay)
            yield token

    async def complete(self, prompt: str, *, system: str | None = None, max_tokens: int = 256) -> str:
        return "".join([token async for token in self.stream(prompt, system=system, max_tokens=max_tokens)])
