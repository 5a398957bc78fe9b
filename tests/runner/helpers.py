"""Helpers shared by the runner tests: tiny recipes on disk, and an SSE parser."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

EXAMPLE_RECIPES = Path(__file__).resolve().parents[2] / "gitops-example" / "recipes"


def write_recipe(root: Path, steps_yaml: str, module: str | None = None, *, extra: str = "", files: dict[str, str] | None = None) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "workflow.yaml").write_text(
        "apiVersion: microagents.dev/v1\nkind: Workflow\nmetadata: {name: tiny, version: 0.1.0}\n"
        + extra
        + "steps:\n"
        + textwrap.indent(textwrap.dedent(steps_yaml).strip() + "\n", "  ")
    )
    if module is not None:
        (root / "steps.py").write_text(textwrap.dedent(module))
    for name, text in (files or {}).items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def parse_sse(text: str) -> list[tuple[str, Any]]:
    """[(event, data)] of an SSE body; data is parsed JSON; comments come as ("comment", text).

    Strict about the runner's framing: every event is `event:` + one `data:` line + a blank line."""
    out: list[tuple[str, Any]] = []
    assert text.endswith("\n\n"), f"stream does not end with a blank line: {text[-40:]!r}"
    for block in text.split("\n\n")[:-1]:
        lines = block.split("\n")
        if lines[0].startswith(":"):
            assert len(lines) == 1, block
            out.append(("comment", lines[0][1:].strip()))
            continue
        assert len(lines) == 2 and lines[0].startswith("event: ") and lines[1].startswith("data: "), block
        out.append((lines[0][len("event: "):], json.loads(lines[1][len("data: "):])))
    return out


# A one-step recipe whose output step generates the ten words of its prompt's last line.
TEN_TOKENS = "one two three four five six seven eight nine ten"
GENERATE_STEPS = f"""
- id: words
  tool: llm.generate
  params: {{prompt: "Say it:\\n{TEN_TOKENS}", maxTokens: 50}}
"""
