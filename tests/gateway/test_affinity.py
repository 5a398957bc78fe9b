"""Cache-aware routing among a model's stable replicas (gateway/affinity.py): which conversation is
which, where it goes, how far the load bound lets it stray, and how few conversations move when the
replica set changes. Pure: no server (the router's in-flight counts are entered by hand)."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from plnt.core.routes import Backend, Route
from plnt.gateway.affinity import conversation_key, place, ranking
from plnt.gateway.router import Router

SYSTEM = {"role": "system", "content": "You are the support assistant of a bakery. " * 20}


def turns(opening: str, n: int) -> list[list[dict[str, str]]]:
    """The message lists a client sends for the first n turns of one conversation (the history grows)."""
    history = [SYSTEM, {"role": "user", "content": opening}]
    sent = [list(history)]
    for i in range(1, n):
        history += [{"role": "assistant", "content": f"answer {i}"}, {"role": "user", "content": f"question {i}"}]
        sent.append(list(history))
    return sent


def test_every_turn_of_a_conversation_has_its_key() -> None:
    keys = {conversation_key(messages) for messages in turns("Do you bake rye bread?", 5)}
    assert len(keys) == 1


@pytest.mark.parametrize("a, b, same", [
    # another first question under the same system prompt: another conversation
    ([SYSTEM, {"role": "user", "content": "rye?"}], [SYSTEM, {"role": "user", "content": "spelt?"}], False),
    # the same opening with other later turns: the same conversation
    ([SYSTEM, {"role": "user", "content": "rye?"}, {"role": "assistant", "content": "yes"}],
     [SYSTEM, {"role": "user", "content": "rye?"}, {"role": "assistant", "content": "no"}], True),
    # another system prompt: another conversation
    ([{"role": "system", "content": "A"}, {"role": "user", "content": "rye?"}],
     [{"role": "system", "content": "B"}, {"role": "user", "content": "rye?"}], False),
    # no system prompt: the first user message alone
    ([{"role": "user", "content": "rye?"}], [{"role": "user", "content": "rye?"}, {"role": "assistant", "content": "x"}],
     True),
    # the same texts in other roles
    ([{"role": "system", "content": "rye?"}, {"role": "user", "content": "x"}],
     [{"role": "developer", "content": "rye?"}, {"role": "user", "content": "x"}], False),
    # texts split differently across messages (a separator between them)
    ([{"role": "system", "content": "ab"}, {"role": "user", "content": "c"}],
     [{"role": "system", "content": "a"}, {"role": "user", "content": "bc"}], False),
    # no user message at all: every message is the opening
    ([{"role": "system", "content": "A"}], [{"role": "system", "content": "A"}, {"role": "assistant", "content": "B"}],
     False),
])
def test_which_conversations_are_one(a: list[dict[str, str]], b: list[dict[str, str]], same: bool) -> None:
    assert (conversation_key(a) == conversation_key(b)) is same


ENDPOINTS = ["http://127.0.0.1:7001", "http://127.0.0.1:7002", "http://127.0.0.1:7003"]


@pytest.mark.parametrize("loads_by_rank, max_extra, chosen_rank", [
    ((0, 0, 0), 1, 0),  # idle: its own replica
    ((1, 0, 0), 1, 0),  # its own is one request ahead: worth waiting for (the history is cached there)
    ((2, 0, 0), 1, 1),  # two ahead: the next in its ranking
    ((2, 1, 1), 1, 0),  # busy everywhere, its own only one ahead of the least
    ((3, 1, 2), 1, 1),
    ((5, 6, 4), 1, 0),  # bound 5: its own is within
    ((6, 6, 4), 1, 2),  # bound 5: both first ones over it, the third (least loaded) takes it
    ((6, 7, 4), 1, 2),
    ((0, 9, 9), 1, 0),
    ((9, 9, 0), 1, 2),  # the least loaded is always within the bound: every request is placed
    ((1, 0, 0), 0, 1),  # max_extra 0: any request ahead sends it on
    ((3, 0, 0), 3, 0),
])
def test_the_load_bound(loads_by_rank: tuple[int, int, int], max_extra: int, chosen_rank: int) -> None:
    for seed in range(20):  # conversations whose rankings differ: the rule is by rank, not by endpoint
        conversation = conversation_key([{"role": "user", "content": f"conversation {seed}"}])
        order = ranking(conversation, ENDPOINTS)
        loads = [0] * len(ENDPOINTS)
        for rank, index in enumerate(order):
            loads[index] = loads_by_rank[rank]
        placement = place(conversation, ENDPOINTS, loads, max_extra=max_extra)
        assert (placement.index, placement.spilled) == (order[chosen_rank], chosen_rank > 0), (seed, loads, order)


def test_counts_must_match_the_replicas() -> None:
    with pytest.raises(ValueError, match="2 endpoints and 1 in-flight counts"):
        place(b"k", ENDPOINTS[:2], [0])
    with pytest.raises(ValueError):
        place(b"k", [], [])


def own(conversations: list[bytes], endpoints: list[str]) -> dict[bytes, str]:
    """Each conversation's own replica, idle replicas."""
    return {c: endpoints[place(c, endpoints, [0] * len(endpoints)).index] for c in conversations}


CONVERSATIONS = [conversation_key([SYSTEM, {"role": "user", "content": f"question {i}"}]) for i in range(2000)]
FOUR = [f"http://127.0.0.1:{port}" for port in (41001, 41002, 41003, 41004)]


def test_conversations_spread_over_the_replicas() -> None:
    counts = Counter(own(CONVERSATIONS, FOUR).values())
    assert set(counts) == set(FOUR)
    # 2000 over 4: 500 each expected, sigma ~19.4 (binomial); 4 sigma either way.
    assert all(420 <= n <= 580 for n in counts.values()), counts


def test_a_replica_added_takes_only_its_share() -> None:
    before = own(CONVERSATIONS, FOUR)
    fifth = "http://127.0.0.1:41005"
    after = own(CONVERSATIONS, [*FOUR, fifth])
    moved = [c for c in CONVERSATIONS if after[c] != before[c]]
    assert all(after[c] == fifth for c in moved)  # none moved between the old replicas
    assert 300 <= len(moved) <= 500, len(moved)  # about 1/5 of 2000 (sigma ~18)


def test_a_replica_gone_moves_only_its_conversations() -> None:
    before = own(CONVERSATIONS, FOUR)
    gone = FOUR[1]
    after = own(CONVERSATIONS, [e for e in FOUR if e != gone])
    assert all(after[c] == before[c] for c in CONVERSATIONS if before[c] != gone)
    assert all(after[c] != gone for c in CONVERSATIONS)


def test_the_order_of_the_replicas_does_not_matter() -> None:
    shuffled = list(FOUR)
    random.Random(7).shuffle(shuffled)
    assert own(CONVERSATIONS[:200], FOUR) == own(CONVERSATIONS[:200], shuffled)


# --- the router: the affinity among stable replicas, the canary split as before -----------------------

def replicas(n: int) -> tuple[Backend, ...]:
    return tuple(Backend(f"http://127.0.0.1:{42000 + i}", "1.0.0", "default.smollm2.r1") for i in range(n))


def test_the_router_keeps_a_conversation_on_its_replica_until_it_is_busy() -> None:
    route = Route("default", "smollm2", None, stable_replicas=replicas(2), protocol="openai")
    router = Router()
    placed: list[bool] = []
    router.placed = lambda _route, spilled: placed.append(spilled)
    conversation = conversation_key(turns("rye?", 1)[0])
    first, track = router.choose(route, conversation=conversation)
    assert track == "stable"
    assert {router.choose(route, conversation=conversation)[0] for _ in range(10)} == {first}  # no round robin
    router.enter(first)
    assert router.choose(route, conversation=conversation)[0] == first  # one ahead: it waits
    router.enter(first)
    other, _ = router.choose(route, conversation=conversation)  # two ahead: the other replica
    assert other != first and placed[-1] is True and placed[:-1] == [False] * 12
    router.leave(first)
    assert router.choose(route, conversation=conversation)[0] == first
    # Named track stable (the playground): the same affinity.
    assert router.choose_track(route, "stable", conversation=conversation)[0] == first
    router.leave(first)


def test_a_conversation_retried_goes_where_its_turns_go_while_its_replica_is_away() -> None:
    """The retry of a failed replica's request is the replica the conversation's next turns take with
    that one gone (the next in its ranking), every time; without a conversation, the others in turn."""
    three = replicas(3)
    route = Route("default", "smollm2", None, stable_replicas=three, protocol="openai")
    without = {failed.endpoint: Route("default", "smollm2", None, protocol="openai",
                                      stable_replicas=tuple(b for b in three if b != failed)) for failed in three}
    router = Router()
    for opening in ("rye?", "spelt?", "brioche?", "gluten?", "sunday?", "discount?"):
        conversation = conversation_key(turns(opening, 1)[0])
        own = router.by_conversation(route, conversation)
        next_turns = router.by_conversation(without[own.endpoint], conversation)
        assert {router.other_replica(route, own, conversation=conversation) for _ in range(4)} == {next_turns}
    assert len({router.other_replica(route, three[0]) for _ in range(4)}) == 2  # no conversation: in turn
    busy = router.other_replica(route, three[0], conversation=conversation)
    router.enter(busy)
    router.enter(busy)
    assert router.other_replica(route, three[0], conversation=conversation) not in (busy, three[0])  # the load bound


def test_without_a_conversation_the_replicas_take_turns() -> None:
    route = Route("default", "smollm2", None, stable_replicas=replicas(2), protocol="openai")
    router = Router()
    assert len({router.choose(route)[0] for _ in range(4)}) == 2


def test_the_canary_split_comes_before_the_affinity() -> None:
    canary = Backend("http://127.0.0.1:42100", "1.1.0", "default.smollm2.r2")
    all_canary = Route("default", "smollm2", None, canary=canary, traffic_percent=100, stable_replicas=replicas(2),
                       protocol="openai")
    conversation = conversation_key(turns("rye?", 1)[0])
    assert Router().choose(all_canary, conversation=conversation) == (canary, "canary")
    # A session on the stable side of the split stays there; among the stable replicas the conversation decides.
    half = Route("default", "smollm2", None, canary=canary, traffic_percent=50, stable_replicas=replicas(2),
                 protocol="openai")
    router = Router()
    stable_sessions = [s for s in (f"user-{i}" for i in range(40)) if router.choose(half, session=s)[1] == "stable"]
    assert stable_sessions
    for session in stable_sessions:
        chosen = {router.choose(half, session=session, conversation=conversation) for _ in range(3)}
        assert chosen == {(router.by_conversation(half, conversation), "stable")}


# --- the setting: from the command line to every gateway process's router --------------------------

def test_no_cache_affinity_reaches_every_gateway_process() -> None:
    import json

    from plnt.gateway.role import GatewayRole, GatewayRoleConfig
    from plnt.gateway.workers import WorkerConfig
    from plnt.reconciler.cli.options import GatewayOptions
    from plnt.reconciler.settings import GatewaySettings

    assert GatewaySettings().cache_affinity is True and GatewayOptions().cache_affinity is True
    off = GatewaySettings(**GatewayOptions(cache_affinity=False).settings())
    assert off.cache_affinity is False
    # plnt up's gateway workers get it in the JSON line on their stdin.
    line = WorkerConfig(index=1, parent_pid=1, control_url="http://127.0.0.1:1", internal_token="t", port=1,
                        cache_affinity=off.cache_affinity).wire()
    config = WorkerConfig.model_validate(json.loads(line))
    assert config.cache_affinity is False
    role = GatewayRole(GatewayRoleConfig(control_url=config.control_url, internal_token="t",
                                         cache_affinity=config.cache_affinity))
    assert role.router.cache_affinity is False
    assert GatewayRole(GatewayRoleConfig(control_url="http://127.0.0.1:1", internal_token="t")).router.cache_affinity
