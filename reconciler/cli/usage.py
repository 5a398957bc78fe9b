"""`plnt usage`: what each gateway token used, per workflow or model (GET /usage): requests, prompt and
completion tokens and cost (the GatewayPolicy's prices), and each token's limits. An admin token sees
every token; a read token its own name's.

Exit 0 shown, 2 plnt cannot be reached, the token is refused, or bad options."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from plnt.reconciler.cli.common import api_get, fail, secret
from plnt.reconciler.cli.lazy import command_app
from plnt.reconciler.cli.options import Token, TokenFile

app = command_app()

OUTPUTS = ("table", "json")
COLUMNS = ("TOKEN", "NAMESPACE/WORKFLOW", "REQUESTS", "PROMPT", "COMPLETION", "COST")
LIMIT_COLUMNS = ("TOKEN", "REQUESTS/MIN", "TOKENS/MIN", "BUDGET")


@app.command("usage")
def usage(
    output: Annotated[str, typer.Option("--output", "-o", help="table or json (GET /usage's answer).")] = "table",
    url: Annotated[str, typer.Option(help="Gateway of a running plnt up (or a plnt gateway).")] = "http://127.0.0.1:8000",
    token: Token = None,
    token_file: TokenFile = None,
) -> None:
    """Per gateway token and workflow: requests, prompt and completion tokens, cost; and each token's limits."""
    import json

    if output not in OUTPUTS:
        raise fail(f"--output must be {' or '.join(OUTPUTS)}, not {output!r}", 2)
    body = api_get(url, "/usage", secret(token, token_file, "--token"))
    if not isinstance(body, dict) or not isinstance(body.get("usage"), list):
        raise fail(f"GET {url}/usage did not answer the usage: is that plnt, of this version? (--url)", 2)
    if output == "json":
        typer.echo(json.dumps(body, indent=2))
        return
    for line in table(body):
        typer.echo(line)


def table(body: dict[str, Any]) -> list[str]:
    """The usage rows, then the limits (when a GatewayPolicy sets any), columns as wide as their cells."""
    currency = body.get("currency") or ""
    lines = ["No usage yet."] if not body["usage"] else _columns(COLUMNS, [
        (row["token"], f"{row['namespace']}/{row['workflow']}", str(row["requests"]), str(row["promptTokens"]),
         str(row["completionTokens"]), f"{row['cost']:.6g} {currency}".rstrip()) for row in body["usage"]])
    limits = body.get("limits") or []
    if limits:
        lines += ["", *_columns(LIMIT_COLUMNS, [
            (row["token"], _limit(row["requestsPerMinute"]), _limit(row["tokensPerMinute"]), _budget(row["budget"]))
            for row in limits])]
    return lines


def _limit(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


def _budget(budget: dict[str, Any] | None) -> str:
    return "-" if budget is None else f"{budget['amount']:g} {budget['currency']}/{budget['per']}"


def _columns(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    cells = [header, *rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(header))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip() for line in cells]
