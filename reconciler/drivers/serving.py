"""Whether a release's endpoint serves it, as the gateway and the smoke test will dial it.

On Kubernetes, `helm --wait` returns once the pods are Ready; the Service's endpoints are programmed
a moment later (EndpointSlice controller, then kube-proxy or the CNI), and until then a connection to
the Service is refused or reset. A canary handed to the smoke test and the route table in that moment
fails requests that a second later would pass (seen on a real API server: a good canary rolled back
with "connection reset by peer" ten times out of ten). So the Helm driver counts a release as
installed only once its Service answers as that release: a runner's /healthz names its release id,
a model server's /v1/models answers.
"""

from __future__ import annotations

import asyncio
import json
import time

from plnt.core.upstream import UpstreamClient, UpstreamError
from plnt.reconciler.state import Release

SERVING_POLL_S = 0.2


async def answer_of(release: Release, client: UpstreamClient) -> str | None:
    """None when `release.endpoint` serves this release; else what it did instead, for an error."""
    path = "/v1/models" if release.model is not None else "/healthz"
    try:
        response = await client.request(release.endpoint, "GET", path)
    except UpstreamError as exc:
        return str(exc)
    if response.status != 200:
        return f"GET {path} answered {response.status}"
    if release.model is not None:
        return None
    try:
        body = json.loads(response.body)
    except ValueError:
        return f"GET {path} answered something that is not JSON"
    if not isinstance(body, dict) or body.get("release") != release.release_id:
        other = body.get("release") if isinstance(body, dict) else None
        return f"GET {path} answered as release {other!r}"
    return None


async def wait_serving(release: Release, timeout_s: float) -> str | None:
    """Polls until the endpoint serves `release` (None) or `timeout_s` passes (the last answer)."""
    client = UpstreamClient(read_timeout_s=2.0, connect_timeout_s=2.0)
    deadline = time.monotonic() + timeout_s
    try:
        while (problem := await answer_of(release, client)) is not None and time.monotonic() < deadline:
            await asyncio.sleep(SERVING_POLL_S)
        return problem
    finally:
        await client.aclose()
