"""Without OTEL_* settings: no tracer provider, no SDK imported, nothing exported (a process of its own,
as plnt runs: this test process has the SDK loaded already)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]

RECIPE = """\
apiVersion: microagents.dev/v1
kind: Workflow
metadata: {name: echo, version: 1.0.0}
steps:
  - id: reply
    tool: llm.generate
    params: {prompt: "{text}", maxTokens: 50}
"""

# A real runner app (MockBackend) answers an invocation that carries a traceparent, then the process
# reports what tracing left behind.
PROGRAM = textwrap.dedent("""
    import asyncio, json, sys
    from pathlib import Path
    import httpx
    from plnt.core import telemetry
    import plnt.gateway.app, plnt.reconciler.app  # everything plnt up imports
    from plnt.runner.adapters import MockBackend
    from plnt.runner.app import create_app
    from plnt.runner.recipe import load_recipe_dir
    from opentelemetry import trace

    async def main():
        on = telemetry.setup("plnt")
        app = create_app(load_recipe_dir(Path(sys.argv[1])), MockBackend(), "rel-1")
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            response = await client.post("/invoke", json={"text": "hello there"},
                headers={"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"})
        print(json.dumps({"on": on, "status": response.status_code, "enabled": telemetry.ENABLED,
                          "provider": type(trace.get_tracer_provider()).__name__,
                          "sdk": sorted(m for m in sys.modules if m.startswith("opentelemetry.sdk"))}))
    asyncio.run(main())
""")


TRACE_ID = "0af7651916cd43dd8448eb211c80319c"


def _run(recipe_parent: Path, extra_env: dict[str, str]) -> dict[str, object]:
    recipe = recipe_parent / "echo"
    recipe.mkdir(exist_ok=True)
    (recipe / "workflow.yaml").write_text(RECIPE)
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(extra_env)
    done = subprocess.run([sys.executable, "-c", PROGRAM, str(recipe)], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("extra", [{}, {"OTEL_SERVICE_NAME": "plnt"}, {"OTEL_TRACES_EXPORTER": "none"},
                                   {"OTEL_SDK_DISABLED": "true"}], ids=["no-env", "service-only", "exporter-none", "sdk-disabled"])
def test_off_no_provider_no_sdk_nothing_exported(tmp_path: Path, http_receiver, extra: dict[str, str]) -> None:  # type: ignore[no-untyped-def]
    if extra and "OTEL_SERVICE_NAME" not in extra:  # an endpoint is set too: these settings must still win
        extra = {**extra, "OTEL_EXPORTER_OTLP_ENDPOINT": http_receiver.endpoint}
    report = _run(tmp_path, extra)
    assert report == {"on": False, "status": 200, "enabled": False, "provider": "ProxyTracerProvider", "sdk": []}
    assert http_receiver.collected.requests == {"http": 0, "grpc": 0}


def test_on_the_runner_continues_the_callers_trace(tmp_path: Path, http_receiver) -> None:  # type: ignore[no-untyped-def]
    """The control: the same program with an endpoint exports the runner's spans in the caller's trace."""
    report = _run(tmp_path, {"OTEL_EXPORTER_OTLP_ENDPOINT": http_receiver.endpoint})
    assert report["on"] is True and report["status"] == 200 and report["sdk"]
    spans = {s.name: s for s in http_receiver.collected.snapshot()}  # flushed at exit (atexit)
    assert set(spans) == {"runner invoke", "step reply", "chat mock"}, spans
    assert {s.trace_id for s in spans.values()} == {TRACE_ID}
    assert spans["runner invoke"].parent_id == "b7ad6b7169203331"
    assert spans["step reply"].parent_id == spans["runner invoke"].span_id
    assert spans["chat mock"].parent_id == spans["step reply"].span_id
    assert spans["chat mock"].attributes["gen_ai.usage.output_tokens"] == 2  # "hello ", "there"
