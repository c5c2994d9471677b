"""The replica router's policy and routing key, without HTTP: what it decides for given loads."""

from __future__ import annotations

import json

import pytest

from slotserver.replicas.affinity import AffinityTable
from slotserver.replicas.config import RouterConfig, RouterConfigError
from slotserver.replicas.policy import Policy, rendezvous
from slotserver.replicas.prefix import PromptKey, block_hashes, canonical_text
from slotserver.replicas.replica import Replica

SYSTEM = {"role": "system", "content": "You are an agent with tools. " * 10}


def key(body: dict) -> PromptKey:
    return PromptKey.of(canonical_text(body), 64, 4)


def fleet(n: int, slots: int = 2) -> list[Replica]:
    return [Replica(f"http://10.0.0.{i}:8080", healthy=True, n_slots=slots) for i in range(n)]


def route(policy: Policy, replicas: list[Replica], body: dict):
    d = policy.choose(replicas, key(body))
    policy.sent(d, key(body))
    d.replica.inflight += 1
    return d


def test_next_turn_text_extends_the_previous_one():
    turn1 = {"messages": [SYSTEM, {"role": "user", "content": "task"}]}
    turn2 = {"messages": turn1["messages"] + [{"role": "assistant", "content": "ok"},
                                              {"role": "user", "content": "more"}]}
    assert canonical_text(turn2).startswith(canonical_text(turn1))
    h1, h2 = key(turn1).blocks, key(turn2).blocks
    assert h2[:len(h1)] == h1 and len(h2) > len(h1)
    assert canonical_text({"prompt": [1, 2, 3]}) == "prompt:[1,2,3]\n" and canonical_text({}) == ""


def test_a_burst_of_new_conversations_with_one_system_prompt_is_spread():
    policy, replicas = Policy("prefix", AffinityTable(1000), 2), fleet(3)
    for i in range(6):
        route(policy, replicas, {"messages": [SYSTEM, {"role": "user", "content": f"task {i}"}]})
    assert [r.inflight for r in replicas] == [2, 2, 2]   # every slot used before any queue


def test_conversation_follows_its_prefix_until_its_replica_is_overloaded():
    policy, replicas = Policy("prefix", AffinityTable(1000), 2), fleet(3)
    msgs = [SYSTEM, {"role": "user", "content": "task A " * 20}]
    first = route(policy, replicas, {"messages": msgs}).replica
    first.inflight = 0
    msgs += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "next"}]
    d = route(policy, replicas, {"messages": msgs})
    assert (d.replica, d.reason) == (first, "prefix_hit") and d.matched_blocks > 0
    first.inflight = 5                                  # 3 queued beyond its 2 slots, the others idle
    d = route(policy, replicas, {"messages": msgs})
    assert d.replica is not first and d.reason == "least_loaded"
    first.inflight = 0
    assert route(policy, replicas, {"messages": msgs}).replica is d.replica   # the conversation moved


def test_round_robin_and_least_loaded_ignore_prefixes():
    replicas = fleet(3)
    rr = Policy("round-robin", AffinityTable(10), 2)
    body = {"prompt": "same " * 50}
    assert len({rr.choose(replicas, key(body)).replica.url for _ in range(3)}) == 3
    replicas[0].inflight, replicas[1].inflight = 3, 1
    assert Policy("least-loaded", AffinityTable(10), 2).choose(replicas, key(body)).replica is replicas[2]


def test_rendezvous_moves_only_the_keys_of_a_removed_replica():
    replicas = fleet(4)
    keys = [json.dumps(i).encode() for i in range(400)]
    before = {k: rendezvous(k, replicas).url for k in keys}
    after = {k: rendezvous(k, replicas[1:]).url for k in keys}
    moved = [k for k in keys if before[k] != after[k]]
    assert moved and all(before[k] == replicas[0].url for k in moved)
    assert 60 < len(moved) < 140                         # about a quarter


def test_affinity_table_is_bounded_and_forgets_a_replica():
    table = AffinityTable(16)
    long = PromptKey.of("x" * 64 * 40, 64, 4)
    table.record(long, "a")
    assert len(table) == 16 and table.longest_match(long) == (40, "a", True)   # the very prompt again
    assert table.longest_match(PromptKey.of("x" * 64 * 41, 64, 4)) == (0, None, False)  # its head was evicted
    table.record(PromptKey.of("x" * 64 * 8 + "tail", 64, 4), "b")
    assert table.longest_match(PromptKey.of("x" * 64 * 12, 64, 4)) == (8, "b", True)   # goes on past where it ended
    assert table.longest_match(PromptKey.of("x" * 64 * 8 + "tall", 64, 4)) == (8, "b", False)  # a fork in the tail
    assert table.longest_match(PromptKey.of("x" * 64 * 4 + "y" * 64 * 8, 64, 4)) == (4, "b", False)  # a fork inside
    assert table.forget("b") == 9 and table.longest_match(PromptKey.of("x" * 64 * 12, 64, 4))[0] == 0


@pytest.mark.parametrize("kw, words", [({"upstreams": ("ftp://x",)}, "not an http"), ({}, "no replica"),
                                       ({"upstreams": ("http://a:1",), "policy": "random"}, "--policy"),
                                       ({"upstreams": ("http://a:1",), "balance_slack": -1}, "--balance-slack")])
def test_bad_config_is_one_clear_error(kw, words):
    with pytest.raises(RouterConfigError, match=words):
        RouterConfig(**kw)


@pytest.mark.parametrize("argv, words", [(["router"], "no replica"),
                                         (["router", "--upstream", "localhost:8080"], "not an http"),
                                         (["router", "--upstream", "http://a:1", "--block-bytes", "2"],
                                          "--block-bytes")])
def test_router_command_refuses_bad_flags_in_one_line(argv, words, capsys):
    from slotserver.cli.main import main

    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and words in err and err.startswith("slotserver: error:")


def test_router_command_refuses_an_unknown_flag_pointing_to_its_own_help(capsys):
    from slotserver.cli.main import main

    with pytest.raises(SystemExit) as e:
        main(["router", "--foo"])
    lines = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(lines) == 1
    assert lines[0].startswith("slotserver router: error: ") and lines[0].endswith("(see slotserver router --help)")
