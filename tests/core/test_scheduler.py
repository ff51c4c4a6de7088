"""The scheduler alone: queues, the token budget, chunked prefill, draft slots, preemption.

No model runs: each test drives ``Scheduler.schedule`` over a real ``KVCacheManager`` with
a small pool and plays the engine's part by hand (``commit`` the fed tokens, ``append`` a
sampled one), so every rule of the module doc is checked on its own.
"""

from __future__ import annotations

import pytest
from draftwise.cache.manager import KVCacheManager
from draftwise.request import Request, RequestStatus
from draftwise.sampling_params import SamplingParams
from draftwise.scheduler import Scheduler

BLOCK = 4
MAX_LEN = 64


def request(rid: str, n_prompt: int, max_tokens: int = 8, base: int = 0) -> Request:
    return Request(rid, None, [base + i + 1 for i in range(n_prompt)],
                   SamplingParams(temperature=0.0, max_tokens=max_tokens), frozenset({0}),
                   MAX_LEN)


def scheduler(num_blocks: int = 64, budget: int = 32, seqs: int = 4, k: int = 0,
              chunked: bool = True, prefix: bool = True) -> Scheduler:
    kv = KVCacheManager(num_blocks, BLOCK, enable_prefix_caching=prefix)
    return Scheduler(kv, max_num_seqs=seqs, max_num_batched_tokens=budget,
                     max_model_len=MAX_LEN, num_spec_tokens=k, enable_chunked_prefill=chunked)


def run_step(s: Scheduler, sampled: int = 7) -> list[tuple[str, int, int]]:
    """One step as the engine would: feed the rows, commit, sample a token where due."""
    out = s.schedule()
    rows = [(r.request.req_id, r.num_new_tokens, r.max_draft) for r in out.rows]
    for row in out.rows:
        req = row.request
        samples = row.samples
        s.commit(req, req.num_computed_tokens + row.num_new_tokens, 0)
        if samples:
            req.append(sampled)
    return rows


def test_prompts_prefill_then_decode_one_token_a_step() -> None:
    s = scheduler()
    s.add(request("a", 5))
    s.add(request("b", 3))
    assert run_step(s) == [("a", 5, 0), ("b", 3, 0)]
    assert run_step(s) == [("a", 1, 0), ("b", 1, 0)]
    assert all(r.is_decoding for r in s.running)


def test_the_budget_chunks_a_long_prompt_and_running_rows_go_first() -> None:
    s = scheduler(budget=8)
    s.add(request("long", 20))
    assert run_step(s) == [("long", 8, 0)]
    s.add(request("late", 2))
    assert run_step(s) == [("long", 8, 0)]  # running work first: nothing left for late
    assert run_step(s) == [("long", 4, 0), ("late", 2, 0)]
    assert run_step(s) == [("long", 1, 0), ("late", 1, 0)]


def test_without_chunked_prefill_a_prompt_waits_for_room() -> None:
    s = scheduler(budget=8, chunked=False)
    s.add(request("long", 20))
    assert run_step(s) == []
    assert s.waiting[0].req_id == "long" and s.kv.num_used_blocks == 0


def test_max_num_seqs_caps_the_running_batch() -> None:
    s = scheduler(seqs=2)
    for rid in "abc":
        s.add(request(rid, 2))
    assert [r for r, _, _ in run_step(s)] == ["a", "b"]
    assert [r.req_id for r in s.waiting] == ["c"]
    s.finish(s.requests["a"], RequestStatus.FINISHED_STOPPED)
    assert [r for r, _, _ in run_step(s)] == ["b", "c"]


def test_draft_slots_are_k_cut_by_output_left_context_and_budget() -> None:
    s = scheduler(k=4, budget=64)
    s.add(request("a", 3, max_tokens=20))
    s.add(request("short", 3, max_tokens=3))  # 2 more tokens after the first: 1 draft
    s.add(request("edge", MAX_LEN - 3, max_tokens=20))  # 2 positions of context left
    run_step(s)
    rows = {rid: drafts for rid, _, drafts in run_step(s)}
    assert rows == {"a": 4, "short": 1, "edge": 0}
    tight = scheduler(k=4, budget=3)
    tight.add(request("a", 1))
    run_step(tight)
    assert run_step(tight) == [("a", 1, 2)]  # one fed token, two draft slots in budget


def test_out_of_blocks_preempts_the_newest_running_request() -> None:
    s = scheduler(num_blocks=5, budget=64)  # 4 usable blocks (one is the null block): 16 slots
    assert s.kv.pool.capacity == 4
    s.add(request("old", 7, max_tokens=30))
    s.add(request("new", 7, max_tokens=30, base=100))
    run_step(s)  # 2 blocks each
    for _ in range(2):  # old grows into a third block: the pool is full, new goes
        rows = run_step(s)
    assert [r for r, _, _ in rows] == ["old"]
    new = s.requests["new"]
    assert new not in s.running and new.num_computed_tokens == 0
    assert s.waiting[0] is new and new.num_preemptions == 1
    assert s.kv.num_used_blocks == 3  # old's three; new's freed (its full block stays cached)


def test_a_newcomer_never_preempts_and_gives_back_what_it_took() -> None:
    s = scheduler(num_blocks=4, budget=64)  # 3 usable blocks
    s.add(request("run", 8, max_tokens=30))
    run_step(s)
    s.add(request("big", 8))
    assert [r for r, _, _ in run_step(s)] == ["run"]
    assert s.waiting[0].req_id == "big" and s.waiting[0].num_computed_tokens == 0
    assert s.kv.num_used_blocks == 3  # run's blocks only


def test_finish_and_abort_return_every_block() -> None:
    s = scheduler()
    s.add(request("a", 9))
    s.add(request("b", 5))
    s.add(request("queued", 3))
    run_step(s)
    s.finish(s.requests["a"], RequestStatus.FINISHED_STOPPED)
    assert s.abort("b") is not None and s.abort("queued") is not None
    assert s.abort("missing") is None
    assert s.kv.num_used_blocks == 0 and not s.has_unfinished()


def test_a_repeated_prompt_starts_from_its_cached_blocks() -> None:
    s = scheduler()
    first = request("first", 9)
    s.add(first)
    run_step(s)
    s.finish(first, RequestStatus.FINISHED_STOPPED, num_cacheable=9)
    s.add(request("again", 9))
    rows = run_step(s)
    assert rows == [("again", 1, 0)]  # two full blocks cached, the last token recomputed
    assert s.requests["again"].num_cached_tokens == 8


@pytest.mark.parametrize("prefix", [True, False])
def test_restart_recomputes_a_row_from_its_cached_prefix(prefix: bool) -> None:
    s = scheduler(prefix=prefix)
    s.add(request("a", 9, max_tokens=20))
    run_step(s)
    run_step(s)
    req = s.requests["a"]
    row = s.restart(req)
    assert row is not None and row.max_draft == 0
    assert row.num_new_tokens == req.num_tokens - (8 if prefix else 0)
