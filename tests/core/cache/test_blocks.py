"""BlockPool: null block, free lists, reference counts, chained prefix cache, LRU eviction."""

from __future__ import annotations

from collections import Counter

import pytest

from draftwise.cache.blocks import BlockPool, PrefixEntry
from draftwise.cache.errors import (
    CacheArgumentError,
    CacheInvariantError,
    OutOfBlocksError,
    OutOfCapacityError,
)

BS = 2


def colliding(parent_hash: int | None, token_ids: tuple[int, ...]) -> int:
    """Every block hashes alike: only the token/parent check keeps the cache correct."""
    return 42


def check(pool: BlockPool, *held: list[int]) -> None:
    pool.check_invariants(Counter(b for blocks in held for b in blocks))


def cache_chain(pool: BlockPool, blocks: list[int], token_ids: list[int]) -> list[PrefixEntry]:
    """Register ``blocks`` as a sequence holding ``token_ids`` (full blocks only)."""
    parent: PrefixEntry | None = None
    out = []
    for i, block in enumerate(blocks):
        parent = pool.register(block, parent, tuple(token_ids[i * BS : (i + 1) * BS]))
        out.append(parent)
    return out


def test_block_zero_is_reserved_and_never_handed_out() -> None:
    pool = BlockPool(5, BS)
    assert pool.capacity == 4 and pool.num_free_blocks == 4 and pool.num_used_blocks == 0
    got = pool.allocate(4)
    assert sorted(got) == [1, 2, 3, 4]
    assert BlockPool.NULL_BLOCK_ID not in got
    with pytest.raises(OutOfBlocksError) as info:
        pool.allocate(1)
    assert isinstance(info.value, OutOfCapacityError)
    check(pool, got)
    with pytest.raises(CacheArgumentError):
        pool.incref([0])
    with pytest.raises(CacheArgumentError):
        BlockPool(1, BS)


def test_allocate_is_all_or_nothing() -> None:
    pool = BlockPool(4, BS)
    pool.allocate(2)
    with pytest.raises(OutOfBlocksError):
        pool.allocate(2)
    assert pool.num_free_blocks == 1
    assert pool.allocate(0) == []


def test_double_free_and_reviving_an_uncached_free_block_are_caught() -> None:
    pool = BlockPool(4, BS)
    (b,) = pool.allocate(1)
    pool.decref([b])
    with pytest.raises(CacheInvariantError):
        pool.decref([b])
    with pytest.raises(CacheInvariantError):
        pool.incref([b])


def test_check_invariants_catches_a_leak() -> None:
    pool = BlockPool(4, BS)
    held = pool.allocate(2)
    with pytest.raises(CacheInvariantError):
        check(pool, held[:1])  # a block with a user no table knows about


def test_hit_needs_equal_tokens_and_the_same_parent_chain() -> None:
    pool = BlockPool(8, BS)
    blocks = pool.allocate(2)
    cache_chain(pool, blocks, [1, 2, 3, 4])
    assert [e.block_id for e in pool.find_cached_prefix([1, 2, 3, 4, 5], 9)] == blocks
    assert [e.block_id for e in pool.find_cached_prefix([1, 2, 3, 9], 9)] == blocks[:1]
    assert pool.find_cached_prefix([9, 2, 3, 4], 9) == []  # same 2nd block, other prefix
    assert len(pool.find_cached_prefix([1, 2, 3, 4], 1)) == 1  # max_blocks respected


def test_colliding_hashes_never_return_wrong_blocks() -> None:
    pool = BlockPool(8, BS, hash_fn=colliding)
    a = pool.allocate(2)
    cache_chain(pool, a, [1, 2, 3, 4])
    (b0,) = pool.allocate(1)
    cache_chain(pool, [b0], [7, 7])
    # same bucket, different tokens: a miss
    assert pool.find_cached_prefix([5, 6], 9) == []
    # first block hits b0; the 2nd block's tokens match a[1] but a[1]'s parent is a[0]
    assert [e.block_id for e in pool.find_cached_prefix([7, 7, 3, 4], 9)] == [b0]
    assert [e.block_id for e in pool.find_cached_prefix([1, 2, 3, 4], 9)] == a
    check(pool, a, [b0])


def test_registering_an_identical_block_returns_the_existing_entry() -> None:
    pool = BlockPool(8, BS)
    a, b = pool.allocate(2)
    first = pool.register(a, None, (1, 2))
    again = pool.register(b, None, (1, 2))
    assert again is first and pool.entry(b) is None and pool.num_cached_blocks == 1


def test_register_refuses_partial_or_free_blocks() -> None:
    pool = BlockPool(8, BS)
    (a,) = pool.allocate(1)
    with pytest.raises(CacheArgumentError):
        pool.register(a, None, (1,))
    pool.decref([a])
    with pytest.raises(CacheArgumentError):
        pool.register(a, None, (1, 2))


def test_freed_block_keeps_its_hash_until_reused() -> None:
    pool = BlockPool(3, BS)  # capacity 2
    a, b = pool.allocate(2)
    cache_chain(pool, [a], [1, 2])
    pool.decref([a])
    (hit,) = pool.find_cached_prefix([1, 2, 3], 9)
    assert hit.block_id == a
    pool.incref([a])  # revived from the cached free list
    assert pool.ref_count(a) == 1 and pool.num_free_blocks == 0
    pool.decref([a, b])
    assert pool.allocate(1) == [b]  # the uncached free block goes first
    assert pool.find_cached_prefix([1, 2, 3], 9) != []
    assert pool.allocate(1) == [a]  # now the cached one is evicted
    assert pool.find_cached_prefix([1, 2, 3], 9) == []
    assert pool.num_cached_blocks == 0
    check(pool, [a, b])


def test_cached_free_blocks_are_evicted_least_recently_freed_first() -> None:
    pool = BlockPool(4, BS)
    blocks = pool.allocate(3)
    for i, block in enumerate(blocks):
        pool.register(block, None, (i, i))
    pool.decref([blocks[1]])
    pool.decref([blocks[2]])
    pool.decref([blocks[0]])
    assert pool.allocate(1) == [blocks[1]]
    assert pool.allocate(1) == [blocks[2]]
    assert pool.find_cached_prefix([0, 0, 0], 9)[0].block_id == blocks[0]
    check(pool, blocks[1:])


def test_reset_prefix_cache_forgets_free_blocks_only() -> None:
    pool = BlockPool(4, BS)
    a, b = pool.allocate(2)
    pool.register(a, None, (1, 1))
    pool.register(b, None, (2, 2))
    pool.decref([a])
    assert pool.reset_prefix_cache() == 1
    assert pool.find_cached_prefix([1, 1, 0], 9) == []
    assert pool.find_cached_prefix([2, 2, 0], 9)[0].block_id == b
    check(pool, [b])


def test_disabled_prefix_caching_finds_nothing_and_refuses_registration() -> None:
    pool = BlockPool(4, BS, enable_prefix_caching=False)
    (a,) = pool.allocate(1)
    assert pool.find_cached_prefix([1, 2, 3], 9) == []
    with pytest.raises(CacheArgumentError):
        pool.register(a, None, (1, 2))
