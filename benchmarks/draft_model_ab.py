"""Several draft_model settings against speculation off, interleaved prompt by prompt.

    python benchmarks/draft_model_ab.py --threads 1 --clock cpu --repeat 2 \\
        'k4={"num_speculative_tokens":4}' \\
        'k8c8={"num_speculative_tokens":8,"min_draft_confidence":0.8}'

Every engine (plain, then one per ``LABEL=JSON`` draft_model setting; ``model`` defaults
to ``--draft``) is built and warmed first; then each prompt of the workload runs on every
engine in turn, ``--repeat`` times, so the machine's load moves all modes alike (what
``draftwise bench --compare-k`` does for one config at several k). Per mode: tok/s over
the best run per prompt, its ratio to plain, the ratio per repeat (the spread is the
noise), per-prompt ratios, greedy identity with plain, acceptance and the proposer's
counters. ``--clock cpu`` times each request on this thread's CPU clock (one thread only:
another process's load then mostly stays out of the numbers, though memory contention
does not). Prints JSON with the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("modes", nargs="+", metavar="LABEL=JSON")
    ap.add_argument("--model", default="/work/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")
    ap.add_argument("--draft", default="/work/models/qwen2.5-coder-0.5b-instruct.gguf")
    ap.add_argument("--workload", default=str(HERE / "workloads" / "llamacpp-6.jsonl"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=96)
    args = ap.parse_args()
    if args.clock == "cpu" and args.threads != 1:
        raise SystemExit("--clock cpu times this thread only: use it with --threads 1")

    from draftwise.bench import load_workload
    from draftwise.bench.run import run_engine, warm_up
    from side_by_side import build_ours, loadavg

    modes: dict[str, str | None] = {"plain": None}
    for text in args.modes:
        label, sep, cfg = text.partition("=")
        if not sep or label in modes:
            raise SystemExit(f"modes are LABEL=JSON with unique labels (not 'plain'): {text!r}")
        modes[label] = json.dumps({"method": "draft_model", "model": args.draft,
                                   **json.loads(cfg)})
    items = load_workload(args.workload)
    engines = {k: build_ours(args.model, v, "auto", args.threads) for k, v in modes.items()}
    for engine in engines.values():
        warm_up(engine, items)
    clock = time.thread_time if args.clock == "cpu" else time.perf_counter
    load0 = loadavg()
    best: dict[str, list[float]] = {k: [float("inf")] * len(items) for k in modes}
    tokens: dict[str, list[list[int]]] = {k: [[] for _ in items] for k in modes}
    totals: dict[str, list[float]] = {k: [] for k in modes}
    for _ in range(args.repeat):
        run = dict.fromkeys(modes, 0.0)
        for i, item in enumerate(items):
            for k, engine in engines.items():
                r = run_engine(engine, [item], args.max_tokens, 1, clock)[0][0]
                run[k] += r.seconds
                best[k][i] = min(best[k][i], r.seconds)
                tokens[k][i] = r.token_ids
        for k in modes:
            totals[k].append(run[k])
    n = sum(len(t) for t in tokens["plain"])
    out: dict[str, Any] = {"loadavg_before": load0, "loadavg_after": loadavg(),
                           "threads": args.threads, "clock": args.clock, "repeat": args.repeat}
    for k, engine in engines.items():
        rec: dict[str, Any] = {
            "config": json.loads(modes[k]) if modes[k] else None,
            "tok_per_s": round(n / sum(best[k]), 2),
            "x_plain": round(sum(best["plain"]) / sum(best[k]), 3),
            "x_plain_per_repeat": [round(a / b, 3) for a, b in zip(totals["plain"], totals[k])],
            "x_plain_per_prompt": [round(a / b, 2) for a, b in zip(best["plain"], best[k])],
            "identical_to_plain": f"{sum(a == b for a, b in zip(tokens[k], tokens['plain']))}"
                                  f"/{len(items)}",
        }
        if engine.spec is not None:
            m = engine.spec.metrics.summary()
            rec["acceptance"] = round(m["draft_acceptance_rate"], 3)
            rec["mean_acceptance_length"] = round(m["mean_acceptance_length"], 3)
            rec["proposer"] = engine.spec.proposer_stats()[0]
        out[k] = rec
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
