"""The wire of the runner zygote (plnt.runner.zygote) and plnt's client of it
(plnt.reconciler.drivers.zygote): one JSON object per SOCK_SEQPACKET message (the protocol is
described in plnt.runner.zygote)."""

from __future__ import annotations

import json
from typing import Any

MAX_MESSAGE = 1 << 16
CMDLINE_ROOM = " " * 4096  # the zygote's last argument: room for each child's own command line
MAX_ENV_BYTES = 1 << 20


def encode(message: dict[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode()


def decode(data: bytes) -> dict[str, Any]:
    message = json.loads(data)
    if not isinstance(message, dict):
        raise ValueError(f"zygote message must be a JSON object, got {type(message).__name__}")
    return message
