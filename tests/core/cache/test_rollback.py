"""rollback(): KV truncation plus recurrent commit, together, for a batch of verify rows."""

from __future__ import annotations

import random

import pytest
import torch

from draftwise.cache.errors import CacheArgumentError, UnknownRequestError
from draftwise.cache.manager import KVCacheManager
from draftwise.cache.recurrent import RecurrentStatePool
from draftwise.cache.rollback import rollback

from .toy_recurrent import IN_DIM, ToyRecurrent, bitwise_equal, live_states, state_shapes

BS = 4
K = 3


def embed(token_ids: list[int]) -> torch.Tensor:
    """Deterministic toy embedding, so token streams give input rows."""
    return torch.stack(
        [torch.randn(IN_DIM, generator=torch.Generator().manual_seed(t)) for t in token_ids]
    )


def test_kv_only_rollback_truncates_each_row_to_its_accepted_length() -> None:
    kv = KVCacheManager(32, BS)
    # row a: 6 computed, verify [x, d1..d3] at 6..9 -> 3 blocks; row b: 3 computed -> 2 blocks
    kv.allocate_slots("a", 6 + 1 + K)
    kv.allocate_slots("b", 3 + 1 + K)
    freed = rollback(kv, ["a", "b"], [6 + 1 + 0, 3 + 1 + 3], [K, K], [0, 3])
    assert freed == 1
    assert len(kv.block_table("a")) == 2  # 7 tokens
    assert len(kv.block_table("b")) == 2  # 7 tokens
    kv.check_invariants()


def test_bad_rows_change_nothing() -> None:
    kv = KVCacheManager(32, BS)
    pool = RecurrentStatePool(4, state_shapes(), 1, max_spec_positions=K)
    kv.allocate_slots("a", 12)
    pool.allocate("a")
    kv.allocate_slots("b", 12)
    cases = [
        (["a", "b"], [4, 4], [K, K], [0, K + 1], CacheArgumentError),  # accepted > drafts
        (["a", "b"], [4, 4], [K, K + 1], [0, 0], UnknownRequestError),  # b has no slot
        (["a", "a"], [4, 4], [K, K], [0, 0], CacheArgumentError),
        (["a"], [4, 4], [K], [0], CacheArgumentError),
    ]
    for req_ids, computed, drafts, accepted, error in cases:
        with pytest.raises(error):
            rollback(kv, req_ids, computed, drafts, accepted, recurrent=pool)
        assert len(kv.block_table("a")) == 3 and len(kv.block_table("b")) == 3
    pool.allocate("b")
    with pytest.raises(CacheArgumentError):  # more drafts than spec positions
        rollback(kv, ["a", "b"], [4, 4], [K, K + 1], [0, 0], recurrent=pool)
    assert len(kv.block_table("a")) == 3
    with pytest.raises(UnknownRequestError):
        rollback(kv, ["zz"], [4], [0], [0])


@pytest.mark.parametrize("seed", range(4))
def test_engine_loop_with_recurrent_and_attention_state(seed: int) -> None:
    """Several requests, several verify steps: KV tables and recurrent states both exact."""
    rng = random.Random(seed)
    model = ToyRecurrent.make(num_layers=2, seed=seed)
    kv = KVCacheManager(64, BS)
    pool = RecurrentStatePool(4, state_shapes(), 2, max_spec_positions=K)
    streams: dict[str, list[int]] = {}  # verified tokens; the last one has not been fed
    for rid in ("a", "b", "c"):
        prompt = [rng.randrange(1000) for _ in range(rng.randint(1, 9))]
        pool.allocate(rid)
        assert kv.get_computed_blocks(rid, prompt) == 0
        assert kv.allocate_slots(rid, len(prompt))
        model.forward(pool, [rid], [embed(prompt)], verify=False)
        streams[rid] = [*prompt, rng.randrange(1000)]
    rids = sorted(streams)
    for _ in range(8):
        drafts = {r: [rng.randrange(1000) for _ in range(rng.randint(0, K))] for r in rids}
        accepted = {r: rng.randint(0, len(drafts[r])) for r in rids}
        computed = {r: len(streams[r]) - 1 for r in rids}
        for r in rids:
            assert kv.allocate_slots(r, computed[r] + 1 + len(drafts[r]))
        rows = [embed([streams[r][-1], *drafts[r]]) for r in rids]
        model.forward(pool, rids, rows)
        rollback(
            kv,
            rids,
            [computed[r] + 1 + accepted[r] for r in rids],
            [len(drafts[r]) for r in rids],
            [accepted[r] for r in rids],
            recurrent=pool,
        )
        for r in rids:
            streams[r] += [*drafts[r][: accepted[r]], rng.randrange(1000)]
            fed = streams[r][:-1]  # every verified token but the new bonus/recovered one
            assert len(kv.block_table(r)) == -(-len(fed) // BS)
            assert bitwise_equal(live_states(pool, r), model.reference(embed(fed)))
    kv.check_invariants()
