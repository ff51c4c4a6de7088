"""Interleaved A/B of whole waves: several engines, one workload at one concurrency, in turn.

``draftwise bench`` runs each engine's repeats together, so at concurrency 8, where one
wave of the 8-prompt workload lasts ~1.5 s, a minute's drift on a shared VM (the plain
engine alone read 1.29-1.53 s for the same wave here) moves a ratio by more than the
effect measured. This builds every engine first, then runs the whole workload on each in
turn, ``--rounds`` times (the order reversed every other round), and reports per round the
plain engine's makespan over each other engine's (its throughput ratio: the same tokens in
less time) and the median. Each engine's step profile and, for adaptive depth, the cost
model's 8-row grid are printed after::

    python benchmarks/wave_ab.py --workload benchmarks/workloads/cpu-smoke-8.jsonl \\
        --concurrency 8 --threads 1 --rounds 5 \\
        'auto={"method":"ngram","num_speculative_tokens":4,"draftwise":{"adaptive":true}}' \\
        'throughput={"method":"ngram","num_speculative_tokens":4,"draftwise":{"adaptive":{"objective":"throughput"}}}'

Greedy, ``--max-tokens`` each; every engine must produce the same number of tokens (the
plain engine's: a lossless engine makes the same tokens), or the run stops. Per prompt, the
median over rounds of plain's seconds over each engine's (at concurrency 1: each prompt's
speed-up) is reported too, with the minimum over prompts, and each prompt's draft tokens
(a prompt a config drafted nothing on can differ from plain only by noise). ``--clock cpu``
times on this process's CPU seconds (meaningful with ``--threads 1`` on a machine shared
with other work). ``--noise-floor`` adds a second plain engine (``plain-again``), measured
like the others: its per-prompt ratios are this run's noise, the band any other ratio is
read against (on the 2-core VM a per-prompt median of 3 rounds moved 0.92-1.09 this way).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from draftwise.bench import load_workload
from draftwise.bench.run import engine_profile, run_engine, warm_up
from draftwise.cli.common import build_engine


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("modes", nargs="+", help="LABEL=JSON speculative configs")
    parser.add_argument("--workload", required=True)
    parser.add_argument("--model", default=None)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    parser.add_argument("--out", default=None)
    parser.add_argument("--noise-floor", action="store_true",
                        help="Add a second plain engine, plain-again: the run's noise band.")
    args = parser.parse_args()
    clock = time.process_time if args.clock == "cpu" else time.perf_counter

    items = load_workload(args.workload)
    specs: dict[str, str | None] = {"plain": None}
    if args.noise_floor:
        specs["plain-again"] = None
    for mode in args.modes:
        label, _, spec = mode.partition("=")
        specs[label] = json.dumps(json.loads(spec))
    engines = {}
    for label, spec in specs.items():
        engine = build_engine(args.model, spec, "auto", max_num_seqs=args.concurrency,
                              num_threads=args.threads)
        warm_up(engine, items)
        engines[label] = engine
    seconds: dict[str, list[float]] = {label: [] for label in specs}
    per_prompt: dict[str, dict[str, list[float]]] = {label: {} for label in specs}
    drafted: dict[str, dict[str, int]] = {label: {} for label in specs}
    tokens: int | None = None
    for r in range(args.rounds):
        for label in list(specs) if r % 2 == 0 else list(reversed(specs)):
            t0 = clock()
            results, _ = run_engine(engines[label], items, args.max_tokens, args.concurrency,
                                    clock=clock)
            seconds[label].append(clock() - t0)
            for res in results:
                per_prompt[label].setdefault(res.id, []).append(res.seconds)
                sd = res.speculative_decoding or {}
                drafted[label][res.id] = (drafted[label].get(res.id, 0)
                                          + int(sd.get("num_draft_tokens", 0)))
            made = sum(x.num_output_tokens for x in results)
            if tokens is not None and made != tokens:
                raise SystemExit(f"{label} made {made} tokens, plain {tokens}")
            tokens = made
    report: dict[str, object] = {"workload": args.workload, "concurrency": args.concurrency,
                                 "threads": args.threads, "tokens": tokens, "modes": {}}
    for label, engine in engines.items():
        ratios = [p / s for p, s in zip(seconds["plain"], seconds[label])]
        prompts = {pid: statistics.median(p / s for p, s in zip(per_prompt["plain"][pid], got))
                   for pid, got in per_prompt[label].items()}
        entry: dict[str, object] = {
            "per_prompt_median_vs_plain": prompts,
            "per_prompt_draft_tokens": drafted[label],
            "seconds": seconds[label], "vs_plain": ratios,
            "median_vs_plain": statistics.median(ratios), "profile": engine_profile(engine),
        }
        policy = engine.spec.policy if engine.spec is not None else None
        if policy is not None:
            entry["forward_ms_at_max_rows"] = [x * 1e3 for x in policy.cost.seconds[-1]]
        report["modes"][label] = entry  # type: ignore[index]
        print(f"{label:>12}: makespan {[round(s, 3) for s in seconds[label]]} s, "
              f"throughput vs plain {[round(x, 3) for x in ratios]}, median "
              f"{statistics.median(ratios):.3f}")
        if label != "plain":
            low = min(prompts, key=prompts.__getitem__)
            print(f"{'':>14}per prompt (median over rounds): "
                  + ", ".join(f"{pid} {r:.2f}" for pid, r in prompts.items())
                  + f"; min {prompts[low]:.2f} ({low})")
            if engine.spec is not None:
                print(f"{'':>14}draft tokens per prompt (all rounds): "
                      + ", ".join(f"{pid} {n}" for pid, n in drafted[label].items()))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
