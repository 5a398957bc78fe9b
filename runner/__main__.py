"""`python -m plnt.runner --recipe DIR --host 127.0.0.1 --port PORT [--release-id ID]`

Serves one recipe directory until SIGTERM/SIGINT (then exits 0). Exits 2, with one line on
stderr naming the file and the problem, if the recipe does not load.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from pathlib import Path
from types import FrameType


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m plnt.runner", description="Serve one microagents recipe over HTTP.")
    parser.add_argument("--recipe", required=True, type=Path, help="recipe directory (holds workflow.yaml)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--release-id", default=None, help="reported by /healthz and /invoke")
    parser.add_argument("--token-delay", type=float, default=0.0, help="MockBackend delay per token, seconds")
    return parser.parse_args(argv)


def _exit_on_signal(signum: int, frame: FrameType | None) -> None:
    # Before the server runs, and again after uvicorn's graceful shutdown re-raises the
    # signal it caught: leave with a clean status instead of dying from the signal.
    raise SystemExit(0 if signum == signal.SIGTERM else 128 + signum)


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _exit_on_signal)
    signal.signal(signal.SIGINT, _exit_on_signal)
    args = _parse(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    from plnt.runner.recipe import RecipeError, load_recipe_dir

    try:
        recipe = load_recipe_dir(args.recipe)
    except RecipeError as exc:
        print(f"plnt.runner: cannot load recipe: {exc}".replace("\n", " "), file=sys.stderr)
        return 2

    import uvicorn
    from plnt.runner.adapters import MockBackend
    from plnt.runner.app import create_app

    app = create_app(recipe, MockBackend(token_delay=args.token_delay), args.release_id)
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level="warning", access_log=False)
    uvicorn.Server(config).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
