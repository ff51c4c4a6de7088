"""The cost model's interpolation, and its measurement over a real (tiny) model."""

from __future__ import annotations

from pathlib import Path

import pytest
from tiny_checkpoints import save_tiny

from draftwise.cost_model import CostModel, monotone, rows_grid


def grid() -> CostModel:
    rows, toks = [1, 2, 4], [1, 2, 3]
    return CostModel(rows, toks, [[r * t * 1.0 for t in toks] for r in rows])


def test_measured_points_are_returned_exactly() -> None:
    cm = grid()
    assert cm.step_seconds(2, 4) == 4.0 and cm.step_seconds(4, 12) == 12.0


def test_interpolates_between_rows_and_tokens() -> None:
    cm = grid()
    assert cm.step_seconds(1, 1.5) == pytest.approx(1.5)
    assert cm.step_seconds(3, 3) == pytest.approx(3.0)  # between 2 rows (2.0) and 4 rows (4.0)


def test_extrapolates_per_row_beyond_the_grid() -> None:
    assert grid().step_seconds(8, 8) == pytest.approx(8.0)


def test_draft_cost_is_a_weighted_mean() -> None:
    cm = grid()
    cm.observe_draft(0.4, 4)
    assert cm.draft_seconds_per_token == pytest.approx(0.1)
    cm.observe_draft(0.0, 0)  # nothing asked: nothing learned
    assert cm.draft_seconds_per_token == pytest.approx(0.1)


def test_monotone_lifts_points_timed_low() -> None:
    assert monotone([[1.0, 0.5, 2.0], [0.8, 3.0, 1.0]]) == [[1.0, 1.0, 2.0], [1.0, 3.0, 3.0]]


def test_rows_grid() -> None:
    assert rows_grid(1) == [1] and rows_grid(6) == [1, 2, 4, 6] and rows_grid(8) == [1, 2, 4, 8]


def test_measured_on_a_tiny_model_and_cached(tmp_path: Path, monkeypatch) -> None:
    from draftwise import LLM

    monkeypatch.setenv("DRAFTWISE_CACHE_DIR", str(tmp_path / "cache"))
    path = save_tiny("llama", tmp_path / "m", seed=1)
    sc = {"method": "ngram", "num_speculative_tokens": 2, "draftwise": {"adaptive": True}}
    first = LLM(model=str(path), dtype="bfloat16", speculative_config=sc, max_num_seqs=2)
    cost = first.engine.spec.policy.cost
    assert cost.source == "measured" and cost.rows == [1, 2] and cost.tokens_per_row == [1, 2, 3]
    assert all(s > 0 for row in cost.seconds for s in row)
    assert first.engine.kv.num_used_blocks == 0  # the timing batch gave its blocks back
    again = LLM(model=str(path), dtype="bfloat16", speculative_config=sc, max_num_seqs=2)
    assert again.engine.spec.policy.cost.source == "cache"
    assert again.engine.spec.policy.cost.seconds == cost.seconds
    # rebuilt kernels (or another version) time again: a grid never outlives its code
    import draftwise.cost_model as cm

    real = cm.code_identity
    monkeypatch.setattr(cm, "code_identity", lambda: {**real(), "kernels": {"size": -1}})
    rebuilt = LLM(model=str(path), dtype="bfloat16", speculative_config=sc, max_num_seqs=2)
    assert rebuilt.engine.spec.policy.cost.source == "measured"


def test_pool_too_small_for_the_timing_batch_is_refused_by_name(tmp_path: Path) -> None:
    from draftwise import LLM
    from draftwise.errors import EngineConfigError

    path = save_tiny("llama", tmp_path / "m", seed=1)
    sc = {"method": "ngram", "num_speculative_tokens": 2,
          "draftwise": {"adaptive": {"cost_cache": False}}}
    with pytest.raises(EngineConfigError, match="max_measured_rows"):
        LLM(model=str(path), dtype="bfloat16", speculative_config=sc, max_num_seqs=4,
            max_model_len=64, block_size=16, num_kv_blocks=8)


def test_one_thread_is_timed_on_its_own_cpu_clock(tmp_path: Path, monkeypatch) -> None:
    """With one compute thread the grid reads the thread's CPU clock (other processes'
    load does not enter it); with several, the wall clock. A fake CPU clock that moves
    0.5 s per reading makes every point 0.5 s exactly under the first and never under
    the second."""
    import time

    from draftwise import LLM
    from draftwise.cost_model import measure_costs

    path = save_tiny("llama", tmp_path / "m", seed=1)
    llm = LLM(model=str(path), dtype="bfloat16", max_num_seqs=2)
    ticks = iter(range(10_000))
    monkeypatch.setattr(time, "thread_time", lambda: 0.5 * next(ticks))
    one = measure_costs(llm.engine.runner, llm.engine.kv, 2, 2, threads=1)
    assert all(s == 0.5 for row in one.seconds for s in row)
    wall = measure_costs(llm.engine.runner, llm.engine.kv, 2, 2, threads=2)
    assert all(s < 0.5 for row in wall.seconds for s in row)
    assert llm.engine.kv.num_used_blocks == 0


def test_drafting_is_timed_on_the_grids_clock(tmp_path: Path, monkeypatch) -> None:
    """The drafters' cost per token is set against the forward grid, so both read one
    clock: the thread's CPU clock at one thread (a wall-clock draft cost under another
    process's load read dearer than the CPU-clock forward it was weighed against)."""
    import time

    from draftwise import LLM, SamplingParams
    from draftwise.cost_model import measure_costs

    path = save_tiny("llama", tmp_path / "m", seed=1)
    llm = LLM(model=str(path), dtype="bfloat16", max_num_seqs=2)
    assert measure_costs(llm.engine.runner, llm.engine.kv, 2, 2, threads=1).clock is time.thread_time
    assert measure_costs(llm.engine.runner, llm.engine.kv, 2, 2, threads=2).clock is time.perf_counter
    sc = {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 1,
          "prompt_lookup_max": 2, "draftwise": {"adaptive": True}}
    spec_llm = LLM(model=str(path), dtype="bfloat16", max_num_seqs=2, num_threads=1,
                   speculative_config=sc)
    cost = spec_llm.engine.spec.policy.cost
    assert cost.clock is time.thread_time
    ticks = iter(range(10_000))
    cost.clock = lambda: float(next(ticks))  # every proposing call reads 1 "second"
    spec_llm.generate([{"prompt_token_ids": [5, 6, 7, 5, 6, 7, 5, 6]}],
                      SamplingParams(temperature=0, max_tokens=8))
    assert cost.draft_seconds_per_token >= 0.25  # 1 s over at most 2 + backlog tokens
