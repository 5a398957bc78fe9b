"""Default bindings of the step tools, over a RuntimeAdapter.

Every binding is `async def tool(tools: Tools, params: Mapping) -> result`. Text params
are templates: `{name}` is filled from the step's values (the invocation inputs and the
results of finished steps, by step id; `{step[key]}` reaches into a mapping result; a list
result is rendered one item per line).

- `llm.classify` (labels, keywords?, input?): returns one label (str). Deterministic and
  offline: the text is lower-cased and split into words; a label scores one point per
  occurrence of each of its keywords (whole words or phrases; a label's keywords default to
  the label itself). The highest score wins, ties go to the label listed first. If nothing
  matches, the label is `labels[int(sha256(text), 16) % len(labels)]`.
- `llm.generate` (prompt, system?, maxTokens?): returns `adapter.complete(...)` (str).
- `rag.query` (query?, k=3, source="knowledge"): splits every file under the recipe's
  `source/` directory into paragraphs (blank-line separated; heading-only paragraphs are
  dropped), scores each by how many distinct non-stopword query words it contains (a
  trailing plural "s" is ignored: "questions" matches "question"), and
  returns the top-k paragraphs with a score > 0 (list[str], best first, ties in file order).
- `policy.moderate` (blocked, text?): returns
  `{"approved": bool, "reasons": ["blocked word: x", ...], "text": text}`.

`input` / `query` / `text` default to the results of the step's deps (else its string
inputs), one per line.
"""

from __future__ import annotations

import functools
import hashlib
import re
import string
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from plnt.runner.adapters import RuntimeAdapter


class ToolError(Exception):
    """A tool that cannot run: bad params, an unknown template field, an unknown tool."""


_WORD = re.compile(r"[a-z0-9']+")
STOPWORDS = frozenset(
    "a an and are as at be but by for from has have i in is it its me my of on or our so that the "
    "their them they this to us was we were what when which who will with you your".split()
)


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def _terms(text: str) -> frozenset[str]:
    """Distinct non-stopword words of `text`, with a plural "s" dropped, for rag.query."""
    return frozenset(
        w[:-1] if len(w) > 3 and w.endswith("s") and not w.endswith("ss") else w
        for w in words(text)
        if w not in STOPWORDS
    )


def _count_phrase(phrase: str, text_words: list[str]) -> int:
    needle = words(phrase)
    if not needle:
        return 0
    n = len(needle)
    return sum(1 for i in range(len(text_words) - n + 1) if text_words[i : i + n] == needle)


class _Formatter(string.Formatter):
    def format_field(self, value: Any, format_spec: str) -> str:
        if isinstance(value, (list, tuple)) and not format_spec:
            return "\n".join(str(item) for item in value)
        return super().format_field(value, format_spec)


_FORMATTER = _Formatter()


def render(template: str, values: Mapping[str, Any]) -> str:
    """Fill `{placeholders}` in `template` from `values`; unknown fields are a ToolError."""
    if not isinstance(template, str):
        raise ToolError(f"template must be a string, got {type(template).__name__}")
    try:
        return _FORMATTER.vformat(template, (), values)
    except KeyError as exc:
        raise ToolError(
            f"template field {{{exc.args[0]}}} is neither an input nor a finished step (have: {sorted(values)})"
        ) from exc
    except (IndexError, ValueError, AttributeError, TypeError) as exc:
        raise ToolError(f"cannot render template {template!r}: {exc}") from exc


class Tools:
    """The tool bindings as one step sees them: `await tools.call("llm.generate", prompt=...)`.

    When `tool` is the step's own tool, `call` starts from the step's params and keyword
    arguments override them; for any other tool only the keyword arguments count.
    """

    def __init__(
        self,
        adapter: RuntimeAdapter,
        directory: Path,
        values: Mapping[str, Any],
        *,
        digest: str = "",
        step_tool: str = "",
        step_params: Mapping[str, Any] | None = None,
        deps: Sequence[str] = (),
    ) -> None:
        self.adapter = adapter
        self.directory = directory
        self.digest = digest  # the recipe's digest: a cache key for its knowledge files
        self.values = values
        self.step_tool = step_tool
        self.step_params = dict(step_params or {})
        self.deps = list(deps)

    async def call(self, tool: str, **params: Any) -> Any:
        binding = BINDINGS.get(tool)
        if binding is None:
            if tool == "python":
                raise ToolError("tool python has no default binding: define the step's function in the recipe module")
            raise ToolError(f"unknown tool {tool!r} (known: {sorted(BINDINGS)})")
        merged = {**self.step_params, **params} if tool == self.step_tool else params
        return await binding(self, merged)

    def render(self, template: str) -> str:
        return render(template, self.values)

    def text(self, template: str | None) -> str:
        """A rendered template, or by default the deps' results (else the string inputs)."""
        if template is not None:
            return self.render(template)
        if self.deps:
            return "\n".join(str(self.values[dep]) for dep in self.deps if dep in self.values)
        return "\n".join(str(v) for v in self.values.values() if isinstance(v, str))


# --- bindings --------------------------------------------------------------------------------


def _str_list(params: Mapping[str, Any], key: str, tool: str, *, required: bool = True) -> list[str]:
    value = params.get(key, [] if not required else None)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value) or (required and not value):
        raise ToolError(f"{tool}: params.{key} must be a{' non-empty' if required else ''} list of strings")
    return value


async def llm_classify(tools: Tools, params: Mapping[str, Any]) -> str:
    labels = _str_list(params, "labels", "llm.classify")
    keywords = params.get("keywords", {})
    if not isinstance(keywords, dict):
        raise ToolError("llm.classify: params.keywords must map labels to lists of words")
    text = tools.text(params.get("input"))
    text_words = words(text)
    scores = {label: sum(_count_phrase(k, text_words) for k in keywords.get(label, [label])) for label in labels}
    best = max(scores.values())
    if best > 0:
        return next(label for label in labels if scores[label] == best)
    return labels[int(hashlib.sha256(text.encode()).hexdigest(), 16) % len(labels)]


async def llm_generate(tools: Tools, params: Mapping[str, Any]) -> str:
    if "prompt" not in params:
        raise ToolError("llm.generate: params.prompt (a template) is required")
    prompt = tools.render(params["prompt"])
    system = tools.render(params["system"]) if params.get("system") is not None else None
    max_tokens = params.get("maxTokens", 256)
    if not isinstance(max_tokens, int) or max_tokens < 1:
        raise ToolError("llm.generate: params.maxTokens must be a positive integer")
    return await tools.adapter.complete(prompt, system=system, max_tokens=max_tokens)


@functools.lru_cache(maxsize=64)
def _paragraphs(source: Path, digest: str) -> tuple[tuple[str, frozenset[str]], ...]:
    """(paragraph, its words) for every file under `source`, files in path order.

    Cached per (source, recipe digest): a recipe directory with the same digest has the same files."""
    out: list[tuple[str, frozenset[str]]] = []
    for path in sorted(p for p in source.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        for para in re.split(r"\n\s*\n", path.read_text(encoding="utf-8")):
            para = para.strip()
            if para and not all(line.lstrip().startswith("#") for line in para.splitlines()):
                out.append((para, _terms(para)))
    return tuple(out)


async def rag_query(tools: Tools, params: Mapping[str, Any]) -> list[str]:
    k = params.get("k", 3)
    if not isinstance(k, int) or k < 1:
        raise ToolError("rag.query: params.k must be a positive integer")
    source = (tools.directory / str(params.get("source", "knowledge"))).resolve()
    if not source.is_relative_to(tools.directory) or not source.is_dir():
        raise ToolError(f"rag.query: no {params.get('source', 'knowledge')}/ directory in the recipe")
    query = _terms(tools.text(params.get("query")))
    corpus = _paragraphs(source, tools.digest) if tools.digest else _paragraphs.__wrapped__(source, "")
    scored = [(len(query & para_words), -index, para) for index, (para, para_words) in enumerate(corpus)]
    return [para for score, _, para in sorted(scored, reverse=True)[:k] if score > 0]


async def policy_moderate(tools: Tools, params: Mapping[str, Any]) -> dict[str, Any]:
    blocked = _str_list(params, "blocked", "policy.moderate", required=False)
    text = tools.text(params.get("text"))
    text_words = words(text)
    reasons = [f"blocked word: {word}" for word in blocked if _count_phrase(word, text_words)]
    return {"approved": not reasons, "reasons": reasons, "text": text}


ToolBinding = Callable[[Tools, Mapping[str, Any]], Awaitable[Any]]

BINDINGS: dict[str, ToolBinding] = {
    "llm.classify": llm_classify,
    "llm.generate": llm_generate,
    "rag.query": rag_query,
    "policy.moderate": policy_moderate,
}
