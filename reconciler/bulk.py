"""Bulk work of the control plane (parsing a commit's specs) on threads the kernel runs after
everything else on the machine.

A commit of 1,000 WorkflowRuns keeps a core busy for about a second. Run at normal priority, that
core is taken from the gateway workers and the runners that serve invocations: with the reconciler
parsing commits back to back, the gateway's added p99 at 400 requests/s went from under 1 ms to
25 ms (bench/gateway_workers.py). The parse is not latency-critical; an invocation is. Linux keeps a
nice value per thread, so only these threads are lowered (elsewhere they are ordinary threads).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

log = logging.getLogger(__name__)

BULK_NICE = 10  # added to the process's own nice value: CFS then gives such a thread ~1/10 the share
_T = TypeVar("_T")
_executor: ThreadPoolExecutor | None = None
_executor_lock = threading.Lock()


def _lower_priority() -> None:
    try:
        thread = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, thread, min(19, os.getpriority(os.PRIO_PROCESS, thread) + BULK_NICE))
    except (OSError, AttributeError) as exc:  # not Linux, or not allowed: an ordinary thread then
        log.debug("bulk-thread-priority-unchanged error=%s", exc)


def _bulk_executor() -> ThreadPoolExecutor:
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="plnt-bulk", initializer=_lower_priority)
        return _executor


async def in_bulk_thread(fn: Callable[..., _T], *args: object) -> _T:
    """`asyncio.to_thread`, on a low-priority thread."""
    call = functools.partial(contextvars.copy_context().run, fn, *args)
    return await asyncio.get_running_loop().run_in_executor(_bulk_executor(), call)
