"""The cost model's interpolation, and its measurement over a real (tiny) model."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from tiny_checkpoints import save_tiny

from draftwise.spec.adaptive import DepthPolicy
from draftwise.spec.depth_rule import choose_depths
from draftwise.config.adaptive import AdaptiveConfig
from draftwise.spec.cost_model import (
    MAX_STEP_CHANGE,
    MIN_STEPS,
    STEP_WEIGHT,
    CostModel,
    RunningTime,
    monotone,
    rows_grid,
)


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


def test_a_step_is_its_forward_plus_its_measured_rest() -> None:
    """The rest of a step (schedule, verify, commit) is measured online per batch size and
    added to the forward; a batch size not measured yet reads the nearest one measured."""
    cm = grid()
    assert cm.step_seconds(2, 4) == cm.forward_seconds(2, 4) == 4.0  # nothing measured yet
    cm.observe_overhead(2, 1.0)
    assert cm.step_seconds(2, 4) == pytest.approx(5.0) and cm.forward_seconds(2, 4) == 4.0
    cm.observe_overhead(2, -9.0)  # read as 0 (a step cannot take less than its forward)
    cm.observe_overhead(2, 1.5)
    assert cm.overhead_seconds(2) == 1.0  # the median of the first readings
    assert cm.overhead_seconds(3) == cm.overhead_seconds(1) == 1.0
    cm.observe_overhead(4, 2.0)
    assert cm.overhead_seconds(3) == 1.0 and cm.overhead_seconds(9) == 2.0
    assert cm.summary()["overhead_seconds"] == {"2": 1.0, "4": 2.0}


def test_a_running_time_starts_at_a_median_then_moves_by_bounded_steps() -> None:
    """A first step that faulted its pages in (50 s here) is one reading of the first
    MIN_STEPS, not the price; after them each reading moves the time by at most
    STEP_WEIGHT x MAX_STEP_CHANGE of it."""
    t = RunningTime()
    t.add(50.0)
    for _ in range(MIN_STEPS - 1):
        t.add(1.0)
    assert t.value == 1.0 and t.count == MIN_STEPS
    t.add(50.0)
    assert t.value == pytest.approx(1.0 + STEP_WEIGHT * MAX_STEP_CHANGE)
    t.add(0.9)
    assert t.value < 1.0 + STEP_WEIGHT * MAX_STEP_CHANGE and not t.first


def steps(cm: CostModel, rows: int, tokens: int, forward: float, n: int = MIN_STEPS) -> None:
    for _ in range(n):
        cm.observe_step(rows, tokens, forward, 0.0)


def test_the_engines_own_steps_replace_a_grid_point_once_there_are_enough() -> None:
    cm = CostModel([1], [1, 2, 3], [[1.0, 2.0, 3.0]])
    steps(cm, 1, 2, 1.5, MIN_STEPS - 1)
    assert cm.seconds == [[1.0, 2.0, 3.0]] and cm.version == 0  # not yet
    steps(cm, 1, 2, 1.5, 1)
    assert cm.version == 1 and cm.seconds[0][1] == pytest.approx(1.5)
    assert cm.measured == [[1.0, 2.0, 3.0]] and cm.summary()["engine_steps"] == [[0, MIN_STEPS, 0]]
    # beyond the only anchor: scaled by the start-up grid's ratio to it
    assert cm.seconds[0] == pytest.approx([0.75, 1.5, 2.25])


def test_a_bad_start_up_point_is_read_between_the_engines_anchors() -> None:
    """Start-up timed 3 tokens at 3x one (a burst of another process's load); the engine
    ran 1 and 5 tokens often: 3 tokens reads halfway between them, not the bad point,
    and no longer prices that depth out."""
    toks = [1, 2, 3, 4, 5]
    cm = CostModel([1], toks, [[1.0, 1.1, 3.0, 3.0, 3.0]])
    pol = DepthPolicy(AdaptiveConfig(), 4, cm)
    rates = [[0.5, 0.5, 0.0, 0.0]]
    assert choose_depths(rates, [[1.0] * 4], [4], pol.step_seconds(1)) == [1]
    steps(cm, 1, 1, 1.0)
    steps(cm, 1, 5, 1.4)
    assert cm.seconds[0] == pytest.approx([1.0, 1.1, 1.2, 1.3, 1.4])
    assert choose_depths(rates, [[1.0] * 4], [4], pol.step_seconds(1)) == [2]


def test_rows_the_engine_never_ran_scale_with_the_ones_it_did() -> None:
    """The start-up grid read 20% high (it was timed under load): a batch size the engine
    has not run yet is scaled by the median ratio of the points it has."""
    cm = CostModel([1, 2], [1, 2], [[1.2, 1.2], [2.4, 3.6]])
    steps(cm, 1, 1, 1.0)
    steps(cm, 1, 2, 1.0)
    assert cm.seconds == [pytest.approx([1.0, 1.0]), pytest.approx([2.0, 3.0])]


def test_steps_off_the_grid_only_time_the_rest() -> None:
    cm = CostModel([1, 2], [1, 2], [[1.0, 2.0], [2.0, 4.0]])
    for rows, tokens in ((3, 6), (2, 3), (2, 6), (1, 3)):  # rows, per-row tokens not timed
        steps(cm, rows, tokens, 9.0)
    assert cm.summary()["engine_steps"] == [[0, 0], [0, 0]] and cm.version == 0
    assert set(cm.overhead) == {1, 2, 3}


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
    import draftwise.disk_cache as disk_cache

    real = disk_cache.code_identity
    monkeypatch.setattr(disk_cache, "code_identity", lambda: {**real(), "kernels": {"size": -1}})
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
    from draftwise.spec.cost_model import measure_costs

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
    from draftwise.spec.cost_model import measure_costs

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


def test_drafting_is_priced_per_draft_made(tmp_path: Path, monkeypatch) -> None:
    """Adaptive depth prices a draft per expected draft made (``choose_depths`` multiplies
    the per-token cost by the draft rate), so the cost is measured over the drafts the
    drafters made, not the ones asked for: a draft model stopped early by its confidence
    runs only the forwards it drafted with, and over the drafts asked its cost read ~3x
    low at k = 8."""
    from draftwise import LLM, SamplingParams
    from draftwise.spec.cost_model import CostModel

    path = save_tiny("llama", tmp_path / "m", seed=1)
    sc = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1,
          "prompt_lookup_max": 2, "draftwise": {"adaptive": True}}
    llm = LLM(model=str(path), dtype="bfloat16", max_num_seqs=2, num_threads=1,
              speculative_config=sc)
    spec = llm.engine.spec
    cost, proposer = spec.policy.cost, spec.proposers[0]
    seen: list[int] = []
    made: list[int] = []
    asked: list[int] = []
    real_observe, real_propose = cost.observe_draft, proposer.propose

    def observe(self: CostModel, seconds: float, num_tokens: int) -> None:
        seen.append(num_tokens)
        real_observe(seconds, num_tokens)

    def propose(batch):  # noqa: ANN001, ANN202
        out = real_propose(batch)
        made.append(sum(out.num_draft_tokens))
        asked.append(sum(r.max_draft for r in batch.rows))
        return out

    monkeypatch.setattr(CostModel, "observe_draft", observe)
    proposer.propose = propose
    llm.generate([{"prompt_token_ids": [5, 6, 7, 5, 6, 8, 5, 6, 9, 5]}],
                 SamplingParams(temperature=0, max_tokens=24))
    # one proposing call per step here, no backlog (no own KV); a step that made no draft
    # is no price
    assert seen == [m for m in made if m]
    assert any(m < a for m, a in zip(made, asked))  # the case the rule is about


def test_rows_beyond_the_start_up_ones_are_read_off_time_against_tokens() -> None:
    """Timed: 1 and 2 rows. 4 rows x 1 token is n = 4, timed as 1 row x 4 tokens (and
    2 x 2: their mean); 4 x 2 = 8 and 4 x 3 = 12 lie past the largest n timed (2 x 3 =
    6), so they go on at the least-squares slope of the points past n = 1."""
    from draftwise.spec.cost_model import estimate_rows

    tokens = [1, 2, 3]
    timed = [[10.0, 12.0, 14.0], [11.0, 15.0, 21.0]]
    grid = estimate_rows([1, 2], tokens, timed, [1, 2, 4])
    assert grid[:2] == timed
    # n: 1 -> 10, 2 -> mean(12, 11) = 11.5, 3 -> 14, 4 -> 15, 6 -> 21; past n = 1 the
    # fitted slope is 20.375 / 8.75 per token
    slope = 20.375 / 8.75
    assert grid[2] == pytest.approx([15.0, 21.0 + slope * 2, 21.0 + slope * 6])


def test_only_the_start_up_rows_are_timed(tmp_path: Path, monkeypatch) -> None:
    """A server of 8 sequences times batches of 1 and 2 rows at start (not 4 and 8); the
    grid still has every batch size, for the engine's own steps to anchor."""
    from draftwise import LLM
    import draftwise.spec.cost_model as cm

    monkeypatch.setenv("DRAFTWISE_CACHE_DIR", str(tmp_path / "cache"))
    seen: list[list[int]] = []
    real = cm._time_grid

    def spy(runner, kv, rows, tokens, clock=time.perf_counter):  # type: ignore[no-untyped-def]
        seen.append(list(rows))
        return real(runner, kv, rows, tokens, clock)

    monkeypatch.setattr(cm, "_time_grid", spy)
    path = save_tiny("llama", tmp_path / "m", seed=1)
    sc = {"method": "ngram", "num_speculative_tokens": 2}
    llm = LLM(model=str(path), dtype="bfloat16", speculative_config=sc, max_num_seqs=8)
    cost = llm.engine.spec.policy.cost
    assert seen == [[1, 2]] and cost.rows == [1, 2, 4, 8] and cost.timed_rows == (1, 2)
    assert cost.summary()["timed_rows"] == [1, 2]
    again = LLM(model=str(path), dtype="bfloat16", speculative_config=sc, max_num_seqs=8)
    assert again.engine.spec.policy.cost.timed_rows == (1, 2) and seen == [[1, 2]]


def test_a_timed_grid_is_pulled_down_by_the_first_faster_step() -> None:
    """Load only adds time: a grid timed on a busy machine (and kept in the file cache)
    priced 2 tokens at 2.3x one; the engine's first 2-token step ran 1.2x, and that one
    reading is the price at once (a given grid waits for MIN_STEPS, above)."""
    cm = CostModel([1], [1, 2, 3], [[1.0, 2.3, 2.6]], source="cache")
    assert cm.untimed_by_steps(1, 2)
    cm.observe_step(1, 2, 1.2, 0.0)
    assert cm.seconds[0][1] == pytest.approx(1.2) and cm.version == 1
    assert not cm.untimed_by_steps(1, 2)
    cm.observe_step(1, 2, 1.9, 0.0)  # a slower reading does not raise it before MIN_STEPS
    assert cm.seconds[0][1] == pytest.approx(1.2)
    given = CostModel([1], [1, 2], [[1.0, 2.3]])
    given.observe_step(1, 2, 1.2, 0.0)
    assert given.seconds[0][1] == 2.3 and not given.untimed_by_steps(1, 2)
