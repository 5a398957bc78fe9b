"""The runner's HTTP API: `POST /invoke` runs the recipe once, `GET /healthz` says what is served."""

from __future__ import annotations

import json
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse
from plnt.runner.adapters import RuntimeAdapter
from plnt.runner.engine import StepFailed, run_workflow
from plnt.runner.recipe import Recipe

log = logging.getLogger("plnt.runner")


def _error(status: int, type_: str, message: str, **extra: Any) -> JSONResponse:
    return JSONResponse({"error": {"type": type_, "message": message, **extra}}, status_code=status)


def create_app(recipe: Recipe, adapter: RuntimeAdapter, release_id: str | None) -> FastAPI:
    workflow = recipe.workflow.metadata
    app = FastAPI(title=f"plnt runner: {workflow.name}@{workflow.version}", docs_url=None, redoc_url=None, openapi_url=None)

    health = {
        "status": "ok",
        "workflow": workflow.name,
        "version": workflow.version,
        "digest": recipe.digest,
        "release": release_id,
    }

    # Handlers return JSONResponse (no response models): nothing to build at startup.
    @app.get("/healthz")
    async def healthz() -> JSONResponse:
        return JSONResponse(health)

    @app.post("/invoke")
    async def invoke(request: Request) -> JSONResponse:
        try:
            body = json.loads(await request.body())
        except (ValueError, UnicodeDecodeError) as exc:
            return _error(422, "invalid_request", f"body is not valid JSON: {exc}")
        if not isinstance(body, dict):
            return _error(422, "invalid_request", f"body must be a JSON object, got {type(body).__name__}")
        try:
            result = await run_workflow(recipe, body, adapter)
        except StepFailed as exc:
            log.warning("%s@%s: %s", workflow.name, workflow.version, exc)
            return _error(500, "step_failed", exc.message, step=exc.step)
        except Exception as exc:  # an engine bug, not a recipe error: still answer in the same shape
            log.exception("%s@%s: invocation failed", workflow.name, workflow.version)
            return _error(500, "internal", f"{type(exc).__name__}: {exc}")
        try:
            output = jsonable_encoder(result.output)
        except (TypeError, ValueError) as exc:
            return _error(500, "internal", f"output of the workflow is not JSON-serialisable: {exc}")
        return JSONResponse(
            {
                "workflow": workflow.name,
                "version": workflow.version,
                "output": output,
                "steps": {step_id: {"ms": ms} for step_id, ms in result.timings_ms.items()},
                "release": release_id,
            }
        )

    return app
