"""The runner's step cache: a bounded LRU of step results, shared by all invocations of one runner.

Key: ``(recipe digest, step id, canonical JSON of {"inputs": <invocation inputs>, "deps":
{<dep id>: <its result>}})`` (plus the client's `max_tokens` for the output step of a /chat
call). Canonical JSON is `json.dumps(sort_keys=True, separators=(",", ":"))`; a step whose
inputs or deps' results are not JSON-serialisable is simply not cached for that call. So a
cached step must be a function of the invocation inputs and the results of its declared
`deps` (any step that reads other finished results must list them in `deps`).

Which steps are cached (`is_cacheable`): a step's ``params.cache: true|false`` decides if
present; otherwise steps whose tool is `llm.classify`, `rag.query`, `policy.moderate` or
`python` (a module step) are cached, and `llm.generate` steps are not (generation is sampled,
and it is what streams). The output step of a streaming invocation is never cached (it must
produce its tokens). A module function that overrides a tool's step follows that tool's rule.

Values are deep-copied on the way in and out, so a step that mutates a result it was given
never changes the cache. Only successful results are stored. Hits and misses count lookups of
cacheable steps; `size` 0 disables the cache (no lookups, nothing counted).
"""

from __future__ import annotations

import copy
import json
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from plnt.core.specs.models import Step

DEFAULT_CAPACITY = 1024
CACHEABLE_TOOLS = frozenset({"llm.classify", "rag.query", "policy.moderate", "python"})

_MISSING = object()


def is_cacheable(step: Step) -> bool:
    """Whether `step`'s results may be cached: `params.cache` if it is a bool, else by tool."""
    explicit = step.params.get("cache")
    if isinstance(explicit, bool):
        return explicit
    return step.tool in CACHEABLE_TOOLS


def cache_key(digest: str, step_id: str, inputs: Mapping[str, Any], deps: Mapping[str, Any], extra: Any = None) -> tuple[str, str, str] | None:
    """The key of one step call, or None if its inputs are not JSON-serialisable."""
    payload: dict[str, Any] = {"inputs": inputs, "deps": deps}
    if extra is not None:
        payload["extra"] = extra
    try:
        canonical = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=_mapping)
    except (TypeError, ValueError):
        return None
    return (digest, step_id, canonical)


def _mapping(value: Any) -> Any:
    if isinstance(value, Mapping):  # MappingProxyType and friends: as the dict they show
        return dict(value)
    raise TypeError(f"{type(value).__name__} is not JSON-serialisable")


class StepCache:
    """A bounded LRU of step results with hit/miss counters (one event loop: no locking)."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 0:
            raise ValueError("step cache capacity must be >= 0")
        self.capacity = capacity
        self.hits = 0
        self.misses = 0
        self._entries: OrderedDict[tuple[str, str, str], Any] = OrderedDict()

    @property
    def enabled(self) -> bool:
        return self.capacity > 0

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: tuple[str, str, str]) -> Any:
        """The cached value (a copy) or the `MISSING` sentinel; counts a hit or a miss."""
        value = self._entries.get(key, _MISSING)
        if value is _MISSING:
            self.misses += 1
            return _MISSING
        self._entries.move_to_end(key)
        self.hits += 1
        return copy.deepcopy(value)

    def put(self, key: tuple[str, str, str], value: Any) -> None:
        if not self.enabled:
            return
        try:
            stored = copy.deepcopy(value)
        except Exception:  # an uncopyable result (a lock, a generator): do not cache it
            return
        self._entries[key] = stored
        self._entries.move_to_end(key)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)

    def clear(self) -> None:
        self._entries.clear()

    def stats(self) -> dict[str, Any]:
        lookups = self.hits + self.misses
        return {
            "hits": self.hits,
            "misses": self.misses,
            "hitRate": round(self.hits / lookups, 6) if lookups else 0.0,
            "size": len(self._entries),
            "capacity": self.capacity,
        }


MISSING = _MISSING
