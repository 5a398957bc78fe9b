"""Cache-aware routing among a model's stable replicas: the turns of one conversation go to the
replica that served its earlier turns, unless that replica is much busier than the others.

Why: a llama.cpp server keeps the KV cache of the prompts it read (llama-cpp-python: the last
prompt, or many with its RAM cache; llama.cpp's own server: one per slot). A conversation's next
turn repeats the whole history, so on the replica that read it the first token only waits for the
new message; on another it waits for the whole history to be read again.

The conversation is known by its opening (`conversation_key`): every message up to and including
the first user message, the part every later turn repeats unchanged. Not the first K characters of
the prompt: a window shorter than a long system prompt puts every conversation under that system
prompt on one replica, and a window longer than the first turn changes between turn 1 and turn 2
(the conversation would move). The opening is hashed (BLAKE2b, 16 bytes); the request body it comes
from is already bounded by the gateway's body limit.

Which replica (`place`): rendezvous hashing (highest random weight). Each replica scores
hash(conversation, replica endpoint); the replicas in score order are the conversation's ranking,
and it goes to the first one that is not overloaded. Adding a replica moves only the conversations
whose top score it takes (about 1/n of them); removing one moves only its own. No state is kept:
every gateway process computes the same ranking for the same conversation.

Overloaded (bounded load): a replica with more than `max_extra` requests in flight beyond the least
loaded replica. A llama.cpp server answers one request at a time, so a request in flight beyond the
first is a whole answer to wait for: waiting behind one is about what reading the history again
costs; waiting behind two is more. The least loaded replica is never overloaded, so a request is
always placed. The loads are the in-flight counts this gateway process keeps per endpoint (for
drains); with several gateway processes each bounds its own share.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

MAX_EXTRA = 1  # requests in flight beyond the least loaded replica a conversation's own replica may have


def conversation_key(messages: Sequence[Mapping[str, Any]]) -> bytes:
    """The conversation's opening (roles and texts up to and including the first user message; all
    of them when there is none), hashed: the same on every turn of one conversation."""
    digest = hashlib.blake2b(digest_size=16)
    for message in messages:
        role = str(message.get("role", ""))
        digest.update(role.encode())
        digest.update(b"\0")
        digest.update(str(message.get("content") or "").encode("utf-8", "surrogatepass"))
        digest.update(b"\x1e")  # record separator: ("ab", "c") and ("a", "bc") differ
        if role == "user":
            break
    return digest.digest()


def ranking(conversation: bytes, endpoints: Sequence[str]) -> list[int]:
    """The replicas (indexes into `endpoints`) in the conversation's rendezvous order, best first."""

    def score(i: int) -> tuple[int, str]:
        weight = hashlib.blake2b(conversation + endpoints[i].encode(), digest_size=8).digest()
        return int.from_bytes(weight, "big"), endpoints[i]  # the endpoint breaks a (2^-64) tie the same everywhere

    return sorted(range(len(endpoints)), key=score, reverse=True)


@dataclass(frozen=True, slots=True)
class Placement:
    index: int  # into the endpoints given
    spilled: bool  # the conversation's own replica was overloaded: it went further down its ranking


def place(conversation: bytes, endpoints: Sequence[str], in_flight: Sequence[int], *,
          max_extra: int = MAX_EXTRA) -> Placement:
    """The replica for a conversation's next request: the first in its ranking with at most
    `max_extra` requests in flight beyond the least loaded one (`in_flight[i]` for `endpoints[i]`)."""
    if not endpoints or len(endpoints) != len(in_flight):
        raise ValueError(f"{len(endpoints)} endpoints and {len(in_flight)} in-flight counts")
    bound = min(in_flight) + max_extra
    order = ranking(conversation, endpoints)
    rank = next(rank for rank, index in enumerate(order) if in_flight[index] <= bound)  # the least loaded is
    return Placement(order[rank], rank > 0)
