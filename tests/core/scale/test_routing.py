"""The routing policies on plain lists (no Ray): draftwise.scale.routing."""

from __future__ import annotations

import pytest
from draftwise.cache.blocks import BlockPool
from draftwise.scale.routing import (
    PowerOfTwoPolicy,
    PrefixPolicy,
    RoundRobinPolicy,
    RouteKey,
    block_hashes,
    make_policy,
)

SYSTEM = list(range(100, 132))  # 8 blocks of 4


def key(tokens: list[int], iso: str | None = None) -> RouteKey:
    return RouteKey(tuple(block_hashes(tokens, 4)), iso)


def test_block_hashes_are_the_prefix_caches_own() -> None:
    pool = BlockPool(num_blocks=8, block_size=4)
    tokens = SYSTEM[:12] + [1, 2]
    [b] = pool.allocate(1)
    entry = pool.register(b, None, tuple(tokens[:4]))
    assert block_hashes(tokens, 4)[0] == entry.block_hash
    assert len(block_hashes(tokens, 4)) == 3  # the partial block is not hashed


def test_a_prefix_goes_where_it_went_before() -> None:
    policy = PrefixPolicy()
    replicas = ["a", "b", "c"]
    policy.routed("b", key(SYSTEM + [1]))
    assert policy.rank(replicas, {}, key(SYSTEM + [2, 3]))[0] == "b"
    # the longest match wins over a shorter one
    policy.routed("c", key(SYSTEM[:8]))
    assert policy.rank(replicas, {}, key(SYSTEM + [9]))[0] == "b"


def test_a_miss_goes_to_the_least_loaded() -> None:
    policy = PrefixPolicy()
    policy.routed("a", key(SYSTEM))
    assert policy.rank(["a", "b"], {"a": 0, "b": 0}, key([7] * 8))[0] == "b"  # fewer held
    assert policy.rank(["a", "b"], {"a": 0, "b": 3}, key([7] * 8))[0] == "a"


def test_a_request_with_nothing_to_place_takes_idle_replicas_in_turn() -> None:
    """A GET (/metrics) or a prompt under one block has no blocks: equally loaded replicas
    answer in turn, so a scraper through the endpoint sees each (the fewest-held tie-break
    sent every one to the same replica); the least loaded still comes first."""
    policy = PrefixPolicy()
    policy.routed("a", key(SYSTEM))
    firsts = {policy.rank(["a", "b"], {}, RouteKey())[0] for _ in range(4)}
    assert firsts == {"a", "b"}
    assert {policy.rank(["a", "b"], {"a": 2}, key([1, 2]))[0] for _ in range(4)} == {"b"}


def test_a_hot_prefix_is_bounded_by_imbalance() -> None:
    policy = PrefixPolicy(max_imbalance=2)
    policy.routed("a", key(SYSTEM))
    assert policy.rank(["a", "b"], {"a": 2, "b": 0}, key(SYSTEM))[0] == "a"
    assert policy.rank(["a", "b"], {"a": 3, "b": 0}, key(SYSTEM))[0] == "b"


def test_an_isolation_key_sticks_until_its_replica_goes() -> None:
    policy = PrefixPolicy(max_imbalance=0)
    policy.routed("a", key([1, 2, 3, 4], "user:x"))
    assert policy.rank(["a", "b"], {"a": 9, "b": 0}, key([5] * 8, "user:x"))[0] == "a"
    policy.removed("a")
    assert policy.rank(["b", "c"], {}, key([5] * 8, "user:x"))[0] in ("b", "c")
    assert policy.matched("a", key(SYSTEM)) == 0


def test_a_removed_replica_is_forgotten() -> None:
    policy = PrefixPolicy()
    policy.routed("a", key(SYSTEM))
    policy.removed("a")
    assert policy.matched("a", key(SYSTEM)) == 0


def test_the_view_is_bounded_like_the_replicas_cache() -> None:
    """Past the capacity a prefix loses its tail first, as the pool evicts it (the
    engine frees a request's blocks last first): the head keeps matching."""
    policy = PrefixPolicy(capacity_blocks=8)
    policy.routed("a", key(SYSTEM))            # 8 blocks: full
    policy.routed("a", key(list(range(4))))   # one more: SYSTEM's last block falls out
    assert policy.matched("a", key(SYSTEM)) == 7
    policy.routed("a", key(list(range(200, 228))))  # 7 more: all of SYSTEM is gone
    assert policy.matched("a", key(SYSTEM)) == 0


def test_the_view_evicts_what_the_pool_evicts() -> None:
    """The same prompts through a real pool and through the view: after eviction both
    hold the same leading blocks of every prompt."""
    from draftwise.cache.manager import KVCacheManager

    prompts = [[p * 1000 + t for t in range(24)] for p in range(4)]  # 6 blocks of 4 each
    kv = KVCacheManager(num_blocks=17, block_size=4)  # 16 usable: holds 2.67 prompts
    policy = PrefixPolicy(capacity_blocks=16)
    for i, prompt in enumerate(prompts):
        kv.get_computed_blocks(f"r{i}", prompt)
        assert kv.allocate_slots(f"r{i}", len(prompt))
        kv.cache_blocks(f"r{i}", prompt, len(prompt))
        kv.free(f"r{i}")
        policy.routed("a", key(prompt))
    held = [len(kv.pool.find_cached_prefix(p, 6)) for p in prompts]
    assert held == [0, 4, 6, 6]  # the oldest lost all, the next its tail: 16 blocks
    assert [policy.matched("a", key(p)) for p in prompts] == held


def test_round_robin_and_power_of_two_ignore_prefixes() -> None:
    rr = RoundRobinPolicy()
    firsts = [rr.rank(["a", "b"], {}, key(SYSTEM))[0] for _ in range(4)]
    assert firsts == ["a", "b", "a", "b"]
    p2 = PowerOfTwoPolicy(seed=0)
    ranked = p2.rank(["a", "b"], {"a": 5, "b": 1}, key(SYSTEM))
    assert ranked[0] == "b"


def test_unknown_policy_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="round-robin"):
        make_policy("random")
