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
- `llm.generate` (prompt, system?, maxTokens?): returns `adapter.complete(...)` (str). Through
  `Tools.stream` it yields the adapter's tokens instead, passing each to the token sink.
- `rag.query` (query?, k=3, source="knowledge"): retrieval over the files of the recipe's
  `source/` directory (all files, in path order), deterministic and offline:

  1. Split every file into paragraphs (blank-line separated); paragraphs made only of
     Markdown headings are dropped.
  2. Terms: lower-cased words (`[a-z0-9']+`) minus a small English stop list, each reduced
     by a light suffix stemmer (`stem`: plurals, "-ing", "-ed", "-ation", a final "e"), so
     "cancel" finds "cancelling" and "questions" finds "question".
  3. Score each paragraph against the distinct query terms with Okapi BM25 (k1=1.2, b=0.75,
     idf = ln(1 + (N - df + 0.5) / (df + 0.5)), N paragraphs, df paragraphs containing the
     term, document length in terms against the corpus average).
  4. Return the top-k paragraphs with a score > 0 (list[str]), best first; equal scores keep
     file order. The parsed corpus and its statistics are cached per (directory, recipe digest).
- `policy.moderate` (blocked, text?): returns
  `{"approved": bool, "reasons": ["blocked word: x", ...], "text": text}`.

`input` / `query` / `text` default to the results of the step's deps (else its string
inputs), one per line.
"""

from __future__ import annotations

import functools
import hashlib
import math
import re
import string
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from plnt.runner.adapters import RuntimeAdapter


class ToolError(Exception):
    """A tool that cannot run: bad params, an unknown template field, an unknown tool."""


class MissingField(ToolError):
    """A template names `field`, which is neither an input nor a finished step."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


_WORD = re.compile(r"[a-z0-9']+")
STOPWORDS = frozenset(
    "a an and are as at be but by for from has have i in is it its me my of on or our so that the "
    "their them they this to us was we were what when which who will with you your".split()
)


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


_VOWELS = frozenset("aeiouy")


def stem(word: str) -> str:
    """A light, deterministic suffix stemmer for rag.query (not Porter; enough to join the
    usual inflections): "ies" -> "y", a plural "s" dropped (not "ss"), then one of "ation",
    "ing", "ed" (keeping at least 3 letters), a doubled final consonant undoubled, and a final
    "e" dropped. "cancellations", "cancelling", "cancel" -> "cancel"; "booked", "booking" ->
    "book"; "reserve", "reservation" -> "reserv"; "questions" -> "question"."""
    if len(word) <= 3 or not word.isalpha():
        return word
    if word.endswith("ies") and len(word) > 4:
        word = word[:-3] + "y"
    elif word.endswith("s") and not word.endswith(("ss", "us", "is")):
        word = word[:-1]
    for suffix in ("ation", "ing", "ed"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            word = word[: -len(suffix)]
            if len(word) > 3 and word[-1] == word[-2] and word[-1] not in _VOWELS:
                word = word[:-1]
            break
    if len(word) > 3 and word.endswith("e"):
        word = word[:-1]
    return word


def _term_list(text: str) -> list[str]:
    """Non-stopword words of `text` in order, stemmed (`stem`), for rag.query."""
    return [stem(w) for w in words(text) if w not in STOPWORDS]


def _terms(text: str) -> frozenset[str]:
    """Distinct terms of `text` (see `_term_list`)."""
    return frozenset(_term_list(text))


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


def template_fields(template: str) -> list[str]:
    """The names a template looks up: "{a} {b[c]} {d.e}" -> ["a", "b", "d"] (positional ones left out)."""
    names: list[str] = []
    try:
        parsed = list(_FORMATTER.parse(template))
    except ValueError:
        return names
    for _, field, _, _ in parsed:
        root = re.split(r"[.\[]", field, maxsplit=1)[0] if field else ""
        if root and not root.isdigit() and root not in names:
            names.append(root)
    return names


def render(template: str, values: Mapping[str, Any]) -> str:
    """Fill `{placeholders}` in `template` from `values`; a name missing from `values` is a
    MissingField, other unknown fields a ToolError."""
    if not isinstance(template, str):
        raise ToolError(f"template must be a string, got {type(template).__name__}")
    try:
        return _FORMATTER.vformat(template, (), values)
    except KeyError as exc:
        missing = [name for name in template_fields(template) if name not in values]
        if missing:
            raise MissingField(missing[0], f"template field {{{missing[0]}}} is neither an input nor a finished step "
                                           f"(have: {sorted(values)})") from exc
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
        sink: Callable[[str], None] | None = None,
        max_tokens_cap: int | None = None,
    ) -> None:
        self.adapter = adapter
        self.directory = directory
        self.digest = digest  # the recipe's digest: a cache key for its knowledge files
        self.values = values
        self.step_tool = step_tool
        self.step_params = dict(step_params or {})
        self.deps = list(deps)
        self.sink = sink  # where `stream` sends tokens (the client's stream), if anywhere
        self.max_tokens_cap = max_tokens_cap  # the client's max_tokens, for the output step

    def _params(self, tool: str, params: Mapping[str, Any]) -> dict[str, Any]:
        return {**self.step_params, **params} if tool == self.step_tool else dict(params)

    async def call(self, tool: str, **params: Any) -> Any:
        binding = BINDINGS.get(tool)
        if binding is None:
            if tool == "python":
                raise ToolError("tool python has no default binding: define the step's function in the recipe module")
            raise ToolError(f"unknown tool {tool!r} (known: {sorted(BINDINGS)})")
        return await binding(self, self._params(tool, params))

    async def stream(self, tool: str = "llm.generate", **params: Any) -> AsyncIterator[str]:
        """Like `call("llm.generate", ...)` but yields the completion token by token; each token
        is also passed to the sink (so it reaches a streaming client as it is produced)."""
        if tool != "llm.generate":
            raise ToolError(f"only llm.generate can stream, not {tool!r}")
        prompt, system, max_tokens = _generate_args(self, self._params(tool, params))
        async for token in self.adapter.stream(prompt, system=system, max_tokens=max_tokens):
            if token:
                if self.sink is not None:
                    self.sink(token)
                yield token

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


def _generate_args(tools: Tools, params: Mapping[str, Any]) -> tuple[str, str | None, int]:
    if "prompt" not in params:
        raise ToolError("llm.generate: params.prompt (a template) is required")
    prompt = tools.render(params["prompt"])
    system = tools.render(params["system"]) if params.get("system") is not None else None
    max_tokens = params.get("maxTokens", 256)
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise ToolError("llm.generate: params.maxTokens must be a positive integer")
    if tools.max_tokens_cap is not None:
        max_tokens = min(max_tokens, tools.max_tokens_cap)
    return prompt, system, max_tokens


async def llm_generate(tools: Tools, params: Mapping[str, Any]) -> str:
    prompt, system, max_tokens = _generate_args(tools, params)
    return await tools.adapter.complete(prompt, system=system, max_tokens=max_tokens)


BM25_K1 = 1.2
BM25_B = 0.75


@dataclass(frozen=True)
class _Corpus:
    """Paragraphs of a knowledge directory with what BM25 needs about them."""

    paragraphs: tuple[str, ...]
    term_counts: tuple[Counter[str], ...]
    lengths: tuple[int, ...]
    document_frequency: Mapping[str, int]
    average_length: float

    def idf(self, term: str) -> float:
        n, df = len(self.paragraphs), self.document_frequency.get(term, 0)
        return math.log(1.0 + (n - df + 0.5) / (df + 0.5))

    def scores(self, query_terms: frozenset[str]) -> list[float]:
        idf = {term: self.idf(term) for term in query_terms if term in self.document_frequency}
        out = []
        for counts, length in zip(self.term_counts, self.lengths, strict=True):
            norm = BM25_K1 * (1 - BM25_B + BM25_B * length / (self.average_length or 1.0))
            out.append(sum(w * counts[t] * (BM25_K1 + 1) / (counts[t] + norm) for t, w in idf.items() if counts[t]))
        return out


@functools.lru_cache(maxsize=64)
def _corpus(source: Path, digest: str) -> _Corpus:
    """The paragraphs of every file under `source` (files in path order) and their statistics.

    Cached per (source, recipe digest): a recipe directory with the same digest has the same files."""
    paragraphs: list[str] = []
    for path in sorted(p for p in source.rglob("*") if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"):
        for para in re.split(r"\n\s*\n", path.read_text(encoding="utf-8")):
            para = para.strip()
            if para and not all(line.lstrip().startswith("#") for line in para.splitlines()):
                paragraphs.append(para)
    term_counts = tuple(Counter(_term_list(para)) for para in paragraphs)
    lengths = tuple(sum(counts.values()) for counts in term_counts)
    df: Counter[str] = Counter()
    for counts in term_counts:
        df.update(counts.keys())
    return _Corpus(
        paragraphs=tuple(paragraphs),
        term_counts=term_counts,
        lengths=lengths,
        document_frequency=dict(df),
        average_length=(sum(lengths) / len(lengths)) if lengths else 0.0,
    )


async def rag_query(tools: Tools, params: Mapping[str, Any]) -> list[str]:
    k = params.get("k", 3)
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ToolError("rag.query: params.k must be a positive integer")
    source = (tools.directory / str(params.get("source", "knowledge"))).resolve()
    if not source.is_relative_to(tools.directory) or not source.is_dir():
        raise ToolError(f"rag.query: no {params.get('source', 'knowledge')}/ directory in the recipe")
    query = _terms(tools.text(params.get("query")))
    corpus = _corpus(source, tools.digest) if tools.digest else _corpus.__wrapped__(source, "")
    ranked = sorted(enumerate(corpus.scores(query)), key=lambda item: (-item[1], item[0]))
    return [corpus.paragraphs[index] for index, score in ranked[:k] if score > 0]


async def policy_moderate(tools: Tools, params: Mapping[str, Any]) -> dict[str, Any]:
    blocked = _str_list(params, "blocked", "policy.moderate", required=False)
    text = tools.text(params.get("text"))
    text_words = words(text)
    reasons = [f"blocked word: {word}" for word in blocked if _count_phrase(word, text_words)]
    return {"approved": not reasons, "reasons": reasons, "text": text}


ToolBinding = Callable[[Tools, Mapping[str, Any]], Awaitable[Any]]

# The params each binding renders as a template (what an invocation's inputs must fill).
RENDERED_PARAMS: dict[str, tuple[str, ...]] = {
    "llm.classify": ("input",),
    "llm.generate": ("prompt", "system"),
    "rag.query": ("query",),
    "policy.moderate": ("text",),
}

BINDINGS: dict[str, ToolBinding] = {
    "llm.classify": llm_classify,
    "llm.generate": llm_generate,
    "rag.query": rag_query,
    "policy.moderate": policy_moderate,
}
