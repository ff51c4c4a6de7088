"""RecurrentStatePool: slots, spec-position commit (bitwise vs replay), snapshot/restore."""

from __future__ import annotations

import random

import pytest
import torch

from draftwise.cache.errors import (
    CacheArgumentError,
    DuplicateRequestError,
    OutOfCapacityError,
    OutOfSlotsError,
    UnknownRequestError,
)
from draftwise.cache.recurrent import RecurrentStatePool

from .toy_recurrent import IN_DIM, ToyRecurrent, bitwise_equal, live_states, state_shapes

K = 4  # draft length
LAYERS = 2


def make_pool(num_slots: int = 8, k: int = K) -> RecurrentStatePool:
    return RecurrentStatePool(num_slots, state_shapes(), LAYERS, max_spec_positions=k)


def tokens(n: int, seed: int) -> torch.Tensor:
    return torch.randn(n, IN_DIM, generator=torch.Generator().manual_seed(seed))


# -- slots ---------------------------------------------------------------------------------


def test_allocate_gives_zeroed_slots_even_when_reused() -> None:
    pool = make_pool(num_slots=1)
    slot = pool.allocate("a")
    pool.state("h", 1)[slot] = 7.0
    pool.free("a")
    assert pool.allocate("b") == slot
    assert all(torch.count_nonzero(v) == 0 for v in live_states(pool, "b").values())


def test_out_of_slots_is_a_capacity_error_and_free_returns_the_slot() -> None:
    pool = make_pool(num_slots=2)
    pool.allocate("a")
    pool.allocate("b")
    assert pool.num_free_slots == 0 and pool.num_used_slots == 2
    with pytest.raises(OutOfSlotsError) as info:
        pool.allocate("c")
    assert isinstance(info.value, OutOfCapacityError)
    assert pool.free("a") is True
    assert pool.free("a") is False  # unknown ids are a no-op
    assert pool.allocate("c") in range(2)


def test_typed_errors_for_duplicates_and_unknown_requests() -> None:
    pool = make_pool()
    pool.allocate("a")
    with pytest.raises(DuplicateRequestError):
        pool.allocate("a")
    with pytest.raises(UnknownRequestError):
        pool.slot("nope")
    with pytest.raises(UnknownRequestError):
        pool.commit(["nope"], [0], [1])


def test_state_views_alias_storage_and_shapes() -> None:
    pool = make_pool(num_slots=3)
    assert pool.state("h", 0).shape == (3, 6)
    assert pool.state("conv", 1).shape == (3, IN_DIM, 3)
    assert pool.spec_states("h", 0).shape == (3, K, 6)
    slot = pool.allocate("a")
    pool.state("h", 1)[slot, 0] = 3.0
    assert pool.state("h", 1)[slot, 0] == 3.0
    assert pool.state("h", 0)[slot, 0] == 0.0  # layers are separate


def test_memory_accounting_and_dtype_per_state() -> None:
    pool = RecurrentStatePool(
        4,
        {"conv": (10, 3), "ssm": (2, 4, 4)},
        num_layers=3,
        dtype={"conv": torch.bfloat16, "ssm": torch.float32},
        max_spec_positions=2,
    )
    per_layer = 10 * 3 * 2 + 2 * 4 * 4 * 4
    assert pool.bytes_per_slot == 3 * per_layer
    assert pool.spec_bytes_per_slot == 2 * pool.bytes_per_slot
    assert pool.state("conv", 0).dtype == torch.bfloat16
    assert pool.state("ssm", 2).dtype == torch.float32
    plain = RecurrentStatePool(4, {"ssm": (2, 4, 4)}, num_layers=1)
    assert plain.spec_bytes_per_slot == 0 and plain.spec_states("ssm", 0).numel() == 0


def test_bad_construction_is_refused() -> None:
    with pytest.raises(CacheArgumentError):
        RecurrentStatePool(0, state_shapes(), 1)
    with pytest.raises(CacheArgumentError):
        RecurrentStatePool(1, {}, 1)
    with pytest.raises(CacheArgumentError):
        RecurrentStatePool(1, {"h": (0,)}, 1)
    with pytest.raises(CacheArgumentError):
        RecurrentStatePool(1, {"h": (2,)}, 1, dtype={"other": torch.float32})


def test_commit_validation() -> None:
    pool = make_pool()
    pool.allocate("a")
    with pytest.raises(CacheArgumentError):
        pool.commit(["a"], [2], [1])  # more accepted than drafted
    with pytest.raises(CacheArgumentError):
        pool.commit(["a"], [0], [K + 1])  # more drafts than spec positions
    with pytest.raises(CacheArgumentError):
        pool.commit(["a"], [0, 0], [1])
    with pytest.raises(CacheArgumentError):
        pool.commit_positions([0, 0], [1, 2])
    with pytest.raises(CacheArgumentError):
        pool.commit_positions([0], [K])


# -- speculative commit: the live state equals a replay of the accepted tokens -------------


def test_partial_accept_equals_replay_for_every_j_in_one_batch() -> None:
    """Rows with j = 0..K accepted in the same batch; each committed state is bitwise exact."""
    model = ToyRecurrent.make(LAYERS, seed=1)
    pool = make_pool()
    req_ids = [f"r{j}" for j in range(K + 1)]
    prompts = {r: tokens(3 + i, seed=i) for i, r in enumerate(req_ids)}
    for r in req_ids:
        pool.allocate(r)
    model.forward(pool, req_ids, [prompts[r] for r in req_ids], verify=False)
    verify_rows = {r: tokens(1 + K, seed=100 + i) for i, r in enumerate(req_ids)}
    model.forward(pool, req_ids, [verify_rows[r] for r in req_ids])

    accepted = list(range(K + 1))
    wrong_before_commit = [
        not bitwise_equal(
            live_states(pool, r),
            model.reference(torch.cat([prompts[r], verify_rows[r][: j + 1]])),
        )
        for r, j in zip(req_ids, accepted, strict=True)
    ]
    assert wrong_before_commit == [True] * K + [False]  # the test can tell right from wrong

    pool.commit(req_ids, accepted, [K] * len(req_ids))
    for r, j in zip(req_ids, accepted, strict=True):
        want = model.reference(torch.cat([prompts[r], verify_rows[r][: j + 1]]))
        assert bitwise_equal(live_states(pool, r), want), f"j={j}"


@pytest.mark.parametrize("seed", range(5))
def test_many_steps_of_random_accepts_and_draft_lengths_match_replay(seed: int) -> None:
    """Several requests, several verify steps, per-row draft counts below K, random accepts."""
    rng = random.Random(seed)
    model = ToyRecurrent.make(LAYERS, seed=seed)
    pool = make_pool()
    req_ids = ["a", "b", "c"]
    streams: dict[str, torch.Tensor] = {}
    for i, r in enumerate(req_ids):
        pool.allocate(r)
        streams[r] = tokens(rng.randint(1, 6), seed=1000 * seed + i)
    model.forward(pool, req_ids, [streams[r] for r in req_ids], verify=False)
    for step in range(6):
        drafts = [rng.randint(0, K) for _ in req_ids]
        accepted = [rng.randint(0, n) for n in drafts]
        rows = [tokens(1 + n, seed=10_000 * seed + 10 * step + i) for i, n in enumerate(drafts)]
        model.forward(pool, req_ids, rows)
        pool.commit(req_ids, accepted, drafts)
        for r, row, j in zip(req_ids, rows, accepted, strict=True):
            streams[r] = torch.cat([streams[r], row[: j + 1]])
            assert bitwise_equal(live_states(pool, r), model.reference(streams[r]))


def test_snapshot_restore_and_replay_give_the_same_state_as_commit() -> None:
    model = ToyRecurrent.make(LAYERS, seed=3)
    spec = make_pool()
    replay = make_pool(k=0)  # the replay path needs no spec memory
    prompt, row = tokens(5, seed=1), tokens(1 + K, seed=2)
    for pool in (spec, replay):
        pool.allocate("a")
        model.forward(pool, ["a"], [prompt], verify=False)
    j = 1
    model.forward(spec, ["a"], [row])
    spec.commit(["a"], [j], [K])

    snap = replay.snapshot(["a"])
    model.forward(replay, ["a"], [row], verify=False)
    replay.restore(snap)
    model.forward(replay, ["a"], [row[: j + 1]], verify=False)
    assert bitwise_equal(live_states(spec, "a"), live_states(replay, "a"))


def test_restore_refuses_a_slot_that_changed_hands() -> None:
    pool = make_pool(num_slots=1)
    pool.allocate("a")
    snap = pool.snapshot(["a"])
    pool.free("a")
    pool.allocate("b")
    with pytest.raises(UnknownRequestError):
        pool.restore(snap)
