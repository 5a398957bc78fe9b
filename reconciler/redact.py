"""Credentials out of text: the one redaction every log line, error and state file goes through.

Standard library only, and imported up front: the log formatter calls it for every record, also
inside Temporal's workflow sandbox, where importing anything (git, say) on first use fails the
workflow task.
"""

from __future__ import annotations

import re

# scheme://userinfo@ : any user:password, and a lone user name (often a token itself) in http(s) URLs.
_CREDENTIALS = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)([^/@\s:]*:[^/@\s]*|(?<=https://)[^/@\s:]+|(?<=http://)[^/@\s:]+)@")


def redact(text: str, *secrets: str) -> str:
    """`text` with URL credentials (`scheme://user:pass@`) and each of `secrets` replaced by `***`."""
    text = _CREDENTIALS.sub(r"\1***@", text)
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return text
