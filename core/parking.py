"""The file a runner that parks (scale to zero, plnt.runner.idle) leaves for plnt's local driver:
PARKED_FILE ({"pid", "idleSeconds"}) in its working directory, so plnt tells a parked runner from
one that died. Written by the runner, read by plnt: recipe code can write there too, so the read
is bounded and refuses anything but a regular file."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

PARKED_FILE = "parked.json"


def write_parked(directory: Path, idle_s: float) -> None:
    """Record, atomically, that this process parks (read by plnt's local driver, `read_parked`)."""
    final = directory / PARKED_FILE
    scratch = directory / f".{PARKED_FILE}.{os.getpid()}"
    scratch.write_text(json.dumps({"pid": os.getpid(), "idleSeconds": idle_s}))
    os.replace(scratch, final)


def read_parked(directory: Path) -> int | None:
    """The pid that parked in `directory`, or None (no file, or not one plnt can read).

    plnt reads it, and recipe code can write there: only a regular file, not through a symlink,
    without blocking (a FIFO), at most 4 KiB."""
    try:
        fd = os.open(directory / PARKED_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        raw = json.loads(os.read(fd, 4096))
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)
    pid = raw.get("pid") if isinstance(raw, dict) else None
    return pid if isinstance(pid, int) and not isinstance(pid, bool) else None
