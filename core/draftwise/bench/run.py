"""Drive the engine over a workload at a given concurrency and time every request."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from draftwise.bench import PromptResult, WorkloadItem, now, prompt_ids
from draftwise.sampling_params import SamplingParams

if TYPE_CHECKING:
    from draftwise.engine import LLMEngine


def greedy_params(max_tokens: int) -> SamplingParams:
    """The benchmark's sampling settings: greedy, fixed length cap."""
    return SamplingParams(temperature=0.0, max_tokens=max_tokens)


def warm_up(engine: LLMEngine, items: list[WorkloadItem], max_tokens: int = 16) -> None:
    """One short request so first-call costs (allocations, kernels) stay out of the numbers."""
    engine.add_request({"prompt_token_ids": prompt_ids(engine, items[0])}, greedy_params(max_tokens))
    while engine.has_unfinished_requests():
        engine.step()


def run_engine(
    engine: LLMEngine,
    items: list[WorkloadItem],
    max_tokens: int,
    concurrency: int = 1,
    clock: Callable[[], float] = now,
) -> tuple[list[PromptResult], float]:
    """Run every item, at most ``concurrency`` in flight; returns per-prompt results and
    the run's time, both on ``clock`` (wall by default; ``time.process_time`` counts only
    this process's CPU seconds, which another process's load on a shared machine leaves
    mostly alone when the engine computes on one thread)."""
    queue = deque(items)
    started: dict[str, tuple[WorkloadItem, float, int]] = {}
    first: dict[str, float] = {}
    results: dict[str, PromptResult] = {}
    params = greedy_params(max_tokens)
    t_start = clock()
    while queue or started:
        while queue and len(started) < concurrency:
            item = queue.popleft()
            ids = prompt_ids(engine, item)
            rid = engine.add_request({"prompt_token_ids": ids}, params, request_id=item.id)
            started[rid] = (item, clock(), len(ids))
        for out in engine.step():
            rid = out.request_id
            if rid not in first and out.outputs[0].token_ids:
                first[rid] = clock()
            if out.finished:
                item, t0, n_prompt = started.pop(rid)
                t_end = clock()
                n_out = len(out.outputs[0].token_ids)
                ttft = first.get(rid, t_end) - t0
                itl = (t_end - first[rid]) / (n_out - 1) if n_out > 1 and rid in first else None
                results[rid] = PromptResult(
                    id=item.id,
                    kind=item.kind,
                    num_prompt_tokens=n_prompt,
                    num_output_tokens=n_out,
                    seconds=t_end - t0,
                    ttft=ttft,
                    itl=itl,
                    tok_per_s=n_out / (t_end - t0),
                    token_ids=list(out.outputs[0].token_ids),
                    speculative_decoding=out.metrics.get("speculative_decoding"),
                )
    wall = clock() - t_start
    return [results[i.id] for i in items], wall


def best_of(runs: list[tuple[list[PromptResult], float]]) -> tuple[list[PromptResult], float]:
    """Per prompt, the fastest of repeated runs (the peers were measured the same way)."""
    if len(runs) == 1:
        return runs[0]
    per_prompt = [min(group, key=lambda r: r.seconds) for group in zip(*(r for r, _ in runs))]
    return per_prompt, min(w for _, w in runs)


def engine_profile(engine: LLMEngine) -> dict[str, Any]:
    """Cumulative step timings, to show where the time goes."""
    tm = engine.stats.timings
    total = tm.schedule + tm.propose + tm.forward + tm.verify + tm.commit
    parts = {
        "schedule": tm.schedule,
        "propose": tm.propose,
        "forward": tm.forward,
        "verify": tm.verify,
        "commit": tm.commit,
    }
    return {
        "steps": engine.stats.num_steps,
        "seconds": parts,
        "share": {k: (v / total if total else 0.0) for k, v in parts.items()},
        "preemptions": engine.stats.num_preemptions,
    }


def sleep_settle(seconds: float = 0.0) -> None:
    """Optional pause between runs (lets the other core's noise settle)."""
    if seconds:
        time.sleep(seconds)
