"""What the side-by-side peer benchmarks share (``compare_vllm.py``, ``compare_llamacpp.py``).

Both measure draftwise in this process and a peer elsewhere on the same prompt token ids,
greedy, one request at a time, best of ``--repeat`` runs per prompt, and report ratios taken
in the same run (absolute tok/s on a shared 2-core machine moves minute to minute). This
module holds the draftwise side, the conversion of a peer's raw per-prompt results into the
same records, and the ratio and identity arithmetic, so the two reports mean the same thing.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def loadavg() -> list[float] | None:
    """The 1/5/15-minute load averages, recorded beside each stage (distrust a run that moved)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:  # pragma: no cover
        return None


def log(msg: str) -> None:
    """Progress on stderr, time-stamped: stdout carries only the table."""
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# -- draftwise side ----------------------------------------------------------------------


def build_ours(
    model: str | None,
    spec: str | None,
    dtype: str,
    threads: int | None,
    max_num_seqs: int = 1,
    max_model_len: int | None = None,
) -> Any:
    """A draftwise engine as the benchmarks run it: prefix caching off, like the peers."""
    from draftwise.engine import LLMEngine
    from draftwise.engine_args import EngineArgs

    args = EngineArgs(
        model=model,
        speculative_config=spec,
        dtype=dtype,
        max_num_seqs=max_num_seqs,
        max_model_len=max_model_len,
        enable_prefix_caching=False,  # the peers run without it too: repeated runs stay fair
        num_threads=threads,
    )
    return LLMEngine(args)


def with_retries(fn: Callable[[], T], what: str, tries: int = 3, wait: float = 60.0) -> T:
    """Our engine's code may be mid-edit on a shared checkout: wait and retry a failed run."""
    for attempt in range(1, tries + 1):
        try:
            return fn()
        except Exception as exc:
            if attempt == tries:
                raise
            log(f"{what} failed ({type(exc).__name__}: {exc}); retrying in {wait:.0f}s")
            time.sleep(wait)
    raise AssertionError("unreachable")


def measure_ours(engine: Any, items: list[Any], max_tokens: int, repeat: int) -> dict[str, Any]:
    """Warm up, run the workload ``repeat`` times, keep the best run per prompt.

    The record's ``_results`` holds the PromptResults (popped by the caller before the
    report is written); everything else is JSON.
    """
    from draftwise.bench.run import run_engine, warm_up

    warm_up(engine, items)
    return record_ours(engine, [run_engine(engine, items, max_tokens, 1) for _ in range(repeat)])


def record_ours(engine: Any, runs: list[tuple[list[Any], float]]) -> dict[str, Any]:
    """The report record of ``runs`` (each ``run_engine``'s results and wall time): the best
    run per prompt, the engine's step profile and spec-decode metrics, and ``rounds``, each
    run's own total (seconds summed over its prompts, and tokens) for paired ratios."""
    from draftwise.bench import summarize, to_json
    from draftwise.bench.run import best_of, engine_profile

    results, wall = best_of(runs)
    rec: dict[str, Any] = {
        "dtype": str(next(engine.loaded.model.parameters()).dtype),
        "summary": summarize(results, wall),
        "per_prompt": to_json(results),
        "profile": engine_profile(engine),
        "rounds": [{"seconds": sum(r.seconds for r in rs),
                    "tokens": sum(r.num_output_tokens for r in rs)} for rs, _ in runs],
        "_results": results,
    }
    if engine.spec is not None:
        rec["spec_decode"] = engine.spec.metrics.summary()
    return rec


# -- a peer's raw results ----------------------------------------------------------------


def peer_results(runs: list[list[dict[str, Any]]], items: list[Any], prompts: list[dict[str, Any]]) -> list[Any]:
    """A peer's raw runs (per prompt: ``id``, ``token_ids``, ``seconds``) as draftwise
    PromptResults, the fastest run per prompt (the draftwise side is measured the same way)."""
    from draftwise.bench import PromptResult
    from draftwise.bench.run import best_of

    timed = []
    for run in runs:
        rs = []
        for item, p, r in zip(items, prompts, run, strict=True):
            if r["id"] != item.id:
                raise RuntimeError(f"peer result {r['id']!r} out of order (expected {item.id!r})")
            n = len(r["token_ids"])
            rs.append(
                PromptResult(
                    id=item.id,
                    kind=item.kind,
                    num_prompt_tokens=len(p["ids"]),
                    num_output_tokens=n,
                    seconds=r["seconds"],
                    ttft=r.get("ttft"),
                    itl=None,
                    tok_per_s=n / r["seconds"] if r["seconds"] else 0.0,
                    token_ids=list(r["token_ids"]),
                )
            )
        timed.append((rs, sum(x.seconds for x in rs)))
    return best_of(timed)[0]


# -- report arithmetic -------------------------------------------------------------------


def ratio(a: dict[str, Any], b: dict[str, Any]) -> dict[str, float]:
    """tok/s of run ``a`` over run ``b``, overall and per kind."""
    sa, sb = a["summary"], b["summary"]
    return {
        k: (sa[k]["tok_per_s"] / sb[k]["tok_per_s"]) if sb[k]["tok_per_s"] else 0.0
        for k in sa
        if k in sb
    }


def paired(a: list[dict[str, float]], b: list[dict[str, float]]) -> dict[str, float] | None:
    """tok/s of ``a``'s round i over ``b``'s round i (``rounds`` records of runs measured
    alternately, so each pair met the same minute of the machine): median, min and max, or
    None where the two did not run the same number of rounds."""
    if not a or len(a) != len(b):
        return None
    rs = sorted((x["tokens"] / x["seconds"]) / (y["tokens"] / y["seconds"])
                for x, y in zip(a, b) if x["seconds"] > 0 and y["seconds"] > 0 and y["tokens"])
    if not rs:
        return None
    return {"median": statistics.median(rs), "min": rs[0], "max": rs[-1]}


def identity(a: list[Any], b: list[Any]) -> dict[str, Any]:
    """Prompts with identical greedy tokens, per prompt, and where the others first diverge."""
    per_prompt: dict[str, bool] = {}
    diverge: dict[str, int] = {}
    for x, y in zip(a, b, strict=True):
        ta, tb = x["token_ids"], y["token_ids"]
        per_prompt[x["id"]] = ta == tb
        if ta != tb:
            n = next((i for i, (p, q) in enumerate(zip(ta, tb)) if p != q), min(len(ta), len(tb)))
            diverge[x["id"]] = n
    return {
        "identical": sum(per_prompt.values()),
        "of": len(a),
        "per_prompt": per_prompt,
        "first_divergence": diverge,
    }
