"""One TLS context for plnt's short-lived HTTP clients (health polls, smoke tests).

`httpx.AsyncClient()` builds a new default SSL context each time, loading the whole CA bundle:
tens of milliseconds of CPU, measured as about an eighth of plnt's CPU per saga (bench/saga_profile.py,
bench/many_workflowruns.py under py-spy) when every health poll and smoke test made its own.
An SSLContext may be shared by many connections; verification is the same (httpx's defaults).
"""

from __future__ import annotations

import functools
import ssl

import httpx


@functools.cache
def default_tls_context() -> ssl.SSLContext:
    """httpx's default verifying context (certifi's CA bundle), built once per process."""
    return httpx.create_ssl_context()
