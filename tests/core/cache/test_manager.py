"""KVCacheManager: prefix reuse, all-or-nothing allocation, truncate, free, and no leaks."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from draftwise.cache.blocks import hash_block_tokens
from draftwise.cache.errors import CacheArgumentError, DuplicateRequestError, UnknownRequestError
from draftwise.cache.manager import KVCacheManager

from .sim import Sim

BS = 4


def colliding(parent_hash: int | None, token_ids: tuple[int, ...]) -> int:
    return 7


def mod3(parent_hash: int | None, token_ids: tuple[int, ...]) -> int:
    """Collides often, but not always: exercises buckets holding several entries."""
    return sum(token_ids) % 3


def prefill(kv: KVCacheManager, rid: str, tokens: list[int]) -> int:
    """Admit and compute a whole prompt; returns the cached-token count."""
    cached = kv.get_computed_blocks(rid, tokens)
    assert kv.allocate_slots(rid, len(tokens))
    kv.cache_blocks(rid, tokens, len(tokens))
    return cached


PROMPT = list(range(10))  # 2 full blocks + 2 tokens


def test_second_request_with_the_same_prefix_reuses_blocks() -> None:
    kv = KVCacheManager(16, BS)
    assert prefill(kv, "a", PROMPT) == 0
    assert prefill(kv, "b", [*PROMPT[:8], 99, 98, 97]) == 8
    a, b = kv.block_table("a"), kv.block_table("b")
    assert a[:2] == b[:2] and a[2] != b[2]
    assert kv.pool.ref_count(a[0]) == 2
    stats = kv.prefix_cache_stats
    assert (stats.requests, stats.queries, stats.hits) == (2, 21, 8)
    assert stats.hit_rate == pytest.approx(8 / 21)
    kv.check_invariants()


def test_the_whole_prompt_is_never_served_from_cache() -> None:
    kv = KVCacheManager(16, BS)
    prefill(kv, "a", PROMPT[:8])
    assert kv.get_computed_blocks("b", PROMPT[:8]) == 4  # one token left to compute
    assert kv.get_computed_blocks("c", PROMPT[:9]) == 8
    assert kv.get_computed_blocks("d", []) == 0
    kv.check_invariants()


def test_colliding_hash_with_different_tokens_does_not_reuse(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kv = KVCacheManager(16, BS)
    monkeypatch.setattr(kv.pool, "hash_fn", colliding)
    prefill(kv, "a", PROMPT)
    assert kv.get_computed_blocks("b", [50 + t for t in PROMPT]) == 0
    assert kv.get_computed_blocks("c", PROMPT) == 8  # the real prefix still hits
    # same tokens as a's 2nd block, but under another first block: no reuse either
    assert kv.get_computed_blocks("d", [9, 9, 9, 9, *PROMPT[4:]]) == 0
    kv.check_invariants()


def test_only_verified_full_blocks_are_cached() -> None:
    kv = KVCacheManager(16, BS)
    prefill(kv, "a", [1, 2, 3])  # 3 computed; the sampled token 4 has no K/V yet
    assert kv.allocate_slots("a", 3 + 1 + 3)  # verify [4, d1, d2, d3] at positions 3..6
    kv.truncate("a", 4)  # no draft accepted: 4 tokens have K/V
    kv.cache_blocks("a", [1, 2, 3, 4, 9], 4)  # 9 is the recovered token, no K/V yet
    assert kv.pool.num_cached_blocks == 1
    assert kv.get_computed_blocks("b", [1, 2, 3, 4, 5, 6, 7, 8, 0]) == 4


def test_freed_cached_blocks_are_evicted_lru_and_tail_first() -> None:
    kv = KVCacheManager(5, BS)  # capacity 4
    prefill(kv, "a", [1] * 8)
    prefill(kv, "b", [2] * 8)
    a, b = kv.block_table("a"), kv.block_table("b")
    kv.free("a")
    kv.free("b")
    assert kv.num_free_blocks == 4
    assert kv.allocate_slots("c", 1)
    assert kv.block_table("c") == [a[1]]  # a's tail block, freed first, goes first
    assert kv.get_computed_blocks("a2", [1] * 9) == 4
    assert kv.get_computed_blocks("b2", [2] * 9) == 8
    assert kv.block_table("b2") == b
    kv.check_invariants()


def test_allocate_slots_is_all_or_nothing() -> None:
    kv = KVCacheManager(5, BS)
    assert kv.allocate_slots("a", 9)  # 3 blocks
    assert kv.num_new_blocks("b", 8) == 2
    assert not kv.allocate_slots("b", 8)
    assert "b" not in kv and kv.num_free_blocks == 1
    assert not kv.allocate_slots("a", 17)  # needs 2 more, 1 free
    assert len(kv.block_table("a")) == 3 and kv.num_free_blocks == 1
    assert kv.allocate_slots("a", 16)
    assert kv.allocate_slots("a", 1)  # smaller never shrinks
    assert len(kv.block_table("a")) == 4 and kv.usage == 1.0
    with pytest.raises(CacheArgumentError):
        kv.allocate_slots("a", -1)
    kv.check_invariants()


def test_truncate_frees_whole_blocks_only() -> None:
    kv = KVCacheManager(8, BS)
    kv.allocate_slots("a", 12)
    table = kv.block_table("a")
    assert kv.truncate("a", 9) == 0  # still needs 3 blocks
    assert kv.truncate("a", 5) == 1
    assert kv.block_table("a") == table[:2]
    assert kv.truncate("a", 8) == 0 and kv.truncate("a", 100) == 0
    assert kv.pool.ref_count(table[2]) == 0 and kv.num_free_blocks == 5
    kv.check_invariants()


def test_truncate_keeps_shared_blocks_alive_for_their_other_users() -> None:
    kv = KVCacheManager(16, BS)
    prefill(kv, "a", PROMPT)
    prefill(kv, "b", PROMPT)
    shared = kv.block_table("a")[:2]
    assert kv.truncate("b", 4) == 2  # b's private tail and one shared block
    assert kv.pool.ref_count(shared[1]) == 1 and shared[1] in kv.block_table("a")
    assert kv.truncate("b", 0) == 1
    assert kv.block_table("a") == [*shared, kv.block_table("a")[2]]
    assert kv.num_used_blocks == 3
    kv.check_invariants()


def test_truncate_never_keeps_part_of_a_cached_block() -> None:
    kv = KVCacheManager(16, BS)
    prefill(kv, "a", PROMPT)
    before = kv.block_table("a")
    with pytest.raises(CacheArgumentError):
        kv.truncate("a", 6)  # would overwrite cached block 1 from position 6
    with pytest.raises(CacheArgumentError):
        kv.truncate("a", -1)
    assert kv.block_table("a") == before
    kv.check_invariants()


def test_unknown_requests_get_typed_errors_and_free_is_idempotent() -> None:
    kv = KVCacheManager(8, BS)
    for call in (
        lambda: kv.block_table("x"),
        lambda: kv.truncate("x", 0),
        lambda: kv.cache_blocks("x", [1], 1),
    ):
        with pytest.raises(UnknownRequestError):
            call()
    assert kv.free("x") == 0
    kv.allocate_slots("a", 5)
    assert kv.free("a") == 2 and kv.free("a") == 0
    assert kv.num_requests == 0 and kv.num_free_blocks == kv.capacity == 7


def test_lookup_again_only_while_no_blocks_are_held() -> None:
    kv = KVCacheManager(8, BS)
    assert kv.get_computed_blocks("a", [1, 2]) == 0
    assert kv.get_computed_blocks("a", [1, 2]) == 0  # stalled admission retries
    kv.allocate_slots("a", 2)
    with pytest.raises(DuplicateRequestError):
        kv.get_computed_blocks("a", [1, 2])


def test_cache_blocks_checks_its_lengths() -> None:
    kv = KVCacheManager(8, BS)
    kv.allocate_slots("a", 4)
    with pytest.raises(CacheArgumentError):
        kv.cache_blocks("a", [1, 2], 3)
    with pytest.raises(CacheArgumentError):
        kv.cache_blocks("a", list(range(8)), 8)  # 2 blocks of K/V claimed, 1 held


def test_preempted_request_readmits_onto_its_own_blocks() -> None:
    kv = KVCacheManager(16, BS)
    prefill(kv, "a", PROMPT)
    table = kv.block_table("a")
    kv.free("a")
    assert kv.get_computed_blocks("a", PROMPT) == 8
    assert kv.block_table("a") == table[:2]


def test_disabled_prefix_caching_never_hits() -> None:
    kv = KVCacheManager(16, BS, enable_prefix_caching=False)
    prefill(kv, "a", PROMPT)
    assert prefill(kv, "b", PROMPT) == 0
    assert kv.pool.num_cached_blocks == 0 and kv.prefix_cache_stats.queries == 0
    kv.check_invariants()


# -- op sequences: no leaks, no wrong contents, after every operation ---------------------


@pytest.mark.parametrize("hash_fn", [hash_block_tokens, mod3, colliding])
@pytest.mark.parametrize("seed", range(3))
def test_random_op_sequences_keep_invariants(hash_fn, seed: int) -> None:
    sim = Sim(KVCacheManager(14, 2, hash_fn=hash_fn), seed=seed, as_numpy=seed == 2)
    for i in range(1500):
        sim.random_op(i)
        sim.check()
    for rid in list(sim.running):
        sim.finish(rid)
    for rid in list(sim.stalled):
        sim.abort_stalled(rid)
    sim.check()
    assert sim.kv.num_used_blocks == 0 and sim.kv.num_requests == 0
    assert sim.hits > 0  # the sequences did exercise the prefix cache


class ManagerMachine(RuleBasedStateMachine):
    """Hypothesis drives admissions, verify steps, preemptions, finishes and aborts."""

    hash_fn = staticmethod(hash_block_tokens)

    def __init__(self) -> None:
        super().__init__()
        self.sim = Sim(KVCacheManager(10, 2, hash_fn=self.hash_fn))
        self.next_id = 0

    @rule(
        prompt=st.lists(st.integers(0, 2), min_size=1, max_size=10),
        keep=st.booleans(),
    )
    def admit(self, prompt: list[int], keep: bool) -> None:
        self.sim.admit(f"r{self.next_id}", prompt, keep_on_failure=keep)
        self.next_id += 1

    @precondition(lambda self: self.sim.running)
    @rule(data=st.data())
    def decode(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.sim.running)))
        drafts = data.draw(st.lists(st.integers(0, 2), max_size=4))
        accepted = data.draw(st.integers(0, len(drafts)))
        self.sim.decode(rid, drafts, accepted, data.draw(st.integers(0, 2)))

    @precondition(lambda self: self.sim.running)
    @rule(data=st.data(), preempt=st.booleans())
    def finish_or_preempt(self, data: st.DataObject, preempt: bool) -> None:
        rid = data.draw(st.sampled_from(sorted(self.sim.running)))
        (self.sim.preempt if preempt else self.sim.finish)(rid)

    @precondition(lambda self: self.sim.waiting)
    @rule(data=st.data())
    def readmit(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.sim.waiting)))
        self.sim.admit(rid, self.sim.waiting.pop(rid))

    @precondition(lambda self: self.sim.stalled)
    @rule(data=st.data(), retry=st.booleans())
    def stalled(self, data: st.DataObject, retry: bool) -> None:
        rid = data.draw(st.sampled_from(sorted(self.sim.stalled)))
        (self.sim.retry_stalled if retry else self.sim.abort_stalled)(rid)

    @invariant()
    def no_leaks(self) -> None:
        self.sim.check()


class CollidingManagerMachine(ManagerMachine):
    hash_fn = staticmethod(mod3)


_settings = settings(
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestManagerMachine = ManagerMachine.TestCase
TestManagerMachine.settings = _settings
TestCollidingManagerMachine = CollidingManagerMachine.TestCase
TestCollidingManagerMachine.settings = _settings


def test_numpy_token_ids_are_accepted_and_stored_as_ints() -> None:
    kv = KVCacheManager(16, BS)
    tokens = np.arange(10, dtype=np.int64)
    assert kv.get_computed_blocks("a", tokens) == 0
    kv.allocate_slots("a", 10)
    kv.cache_blocks("a", tokens, 10)
    assert kv.get_computed_blocks("b", list(range(10))) == 8
    entry = kv.pool.entry(kv.block_table("b")[0])
    assert entry is not None and all(type(t) is int for t in entry.token_ids)


def test_a_hit_says_how_much_of_it_is_ready_for_drafts() -> None:
    kv = KVCacheManager(16, BS)
    prefill(kv, "a", PROMPT)
    kv.mark_drafts_ready("a", 5)  # the drafters' frontier passed the first block only
    assert prefill(kv, "b", PROMPT) == 8
    assert kv.num_drafts_ready_tokens("b") == BS
    kv.mark_drafts_ready("b", 9)  # b's draft caught up over the second (shared) block
    assert prefill(kv, "c", PROMPT) == 8 and kv.num_drafts_ready_tokens("c") == 8
    kv.check_invariants()


def test_a_hidden_state_drafter_hits_only_blocks_ready_for_drafts() -> None:
    kv = KVCacheManager(16, BS, hit_needs_drafts_ready=True)
    prefill(kv, "a", PROMPT)
    assert prefill(kv, "b", PROMPT) == 0  # nothing of a's was written by the drafters
    kv.mark_drafts_ready("a", 6)
    kv.free("b")
    assert prefill(kv, "c", PROMPT) == BS and kv.num_drafts_ready_tokens("c") == BS
    kv.check_invariants()


def test_a_reallocated_block_is_not_ready_for_drafts() -> None:
    kv = KVCacheManager(4, BS)  # three usable blocks
    prefill(kv, "a", PROMPT)
    kv.mark_drafts_ready("a", 8)
    kv.free("a")
    prefill(kv, "b", [50 + t for t in range(10)])  # evicts a's cached blocks
    kv.free("b")
    assert kv.get_computed_blocks("c", PROMPT) == 0
    assert all(not kv.pool.drafts_ready(i) for i in range(1, 4))


def test_truncate_forgets_readiness_of_dropped_blocks() -> None:
    kv = KVCacheManager(16, BS)
    assert kv.get_computed_blocks("a", PROMPT) == 0
    assert kv.allocate_slots("a", 12)
    kv.mark_drafts_ready("a", 12)
    kv.truncate("a", 4)
    assert kv.num_drafts_ready_tokens("a") == BS
