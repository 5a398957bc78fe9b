"""Incremental parser of server-sent events (the runner's streams), as the SSE spec reads them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Event:
    event: str  # "message" when the stream named none; "" for a comment (": ping")
    data: str


COMMENT = ""


class SSEParser:
    """Feed bytes as they arrive; get back the events they complete.

    Lines end in LF, CRLF or CR. A CR at the very end of a chunk is held until the next
    chunk shows whether an LF follows, so a CRLF split across two chunks is one line break.
    Comments come back as `Event(COMMENT, text)`, so a proxy can forward keep-alives.
    """

    def __init__(self) -> None:
        self._rest = b""
        self._event = ""
        self._data: list[str] = []

    def feed(self, chunk: bytes) -> list[Event]:
        buf = self._rest + chunk if self._rest else chunk
        lines = buf.splitlines(keepends=True)
        # Hold back an unterminated last line, or one ending in a lone CR (half of a CRLF?).
        self._rest = lines.pop() if lines and not lines[-1].endswith(b"\n") else b""
        events: list[Event] = []
        for raw in lines:
            line = raw.rstrip(b"\r\n").decode("utf-8", "replace")
            if not line:
                if self._data or self._event:
                    events.append(Event(self._event or "message", "\n".join(self._data)))
                self._event = ""
                self._data = []
                continue
            field, sep, value = line.partition(":")
            if sep and value.startswith(" "):
                value = value[1:]
            if field == "":
                events.append(Event(COMMENT, value))
            elif field == "event":
                self._event = value
            elif field == "data":
                self._data.append(value)
            # id, retry and unknown fields: ignored (nothing here resumes streams)
        return events
