"""Prefill speed at short and long context, alone: prompt tokens per second.

Loads the default model (or ``--model``) in process and times prompts of random token ids
(``max_tokens`` 1, prefix caching off) at each ``--lengths``, best of ``--repeats``. Next
to wall time it reports the process's CPU time divided by the compute threads: on a
machine shared with other work, the wall rate says what this machine gave, the CPU rate
about what a quiet one would. Compare with llama.cpp's ``llama-bench -p N -n 0`` in the
same sitting (issue 40: long-context prefill should run at short-context speed within
what attention's cost allows).

    python3 benchmarks/prefill_speed.py --lengths 500 6500 [--out report.json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from pathlib import Path
from typing import Any


def main(argv: list[str] | None = None) -> None:
    """Parse flags, time each length, print (and write) the report."""
    from draftwise.engine import LLMEngine
    from draftwise.engine_args import EngineArgs
    from draftwise.models.kernels import kernel_threads
    from draftwise.sampling_params import SamplingParams

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--lengths", type=int, nargs="+", default=[500, 6500])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--max-num-batched-tokens", type=int, default=2048)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)

    engine = LLMEngine(EngineArgs(model=args.model, max_num_seqs=1, enable_prefix_caching=False,
                                  max_num_batched_tokens=args.max_num_batched_tokens))
    threads = kernel_threads()
    vocab = engine.loaded.config.vocab_size
    rng = random.Random(0)
    greedy = SamplingParams(max_tokens=1, temperature=0.0)
    engine.add_request({"prompt_token_ids": [rng.randrange(100, vocab) for _ in range(64)]},
                       greedy)  # warm-up
    while engine.has_unfinished_requests():
        engine.step()
    rows: list[dict[str, Any]] = []
    for n in args.lengths:
        best: dict[str, Any] | None = None
        for _ in range(args.repeats):
            ids = [rng.randrange(100, vocab) for _ in range(n)]
            engine.add_request({"prompt_token_ids": ids}, greedy)
            w0, c0 = time.perf_counter(), time.process_time()
            while engine.has_unfinished_requests():
                engine.step()
            wall, cpu = time.perf_counter() - w0, (time.process_time() - c0) / threads
            if best is None or wall < best["wall_s"]:
                best = {"prompt_tokens": n, "wall_s": round(wall, 3),
                        "tokens_per_s": round(n / wall, 1), "cpu_s_per_thread": round(cpu, 3),
                        "tokens_per_cpu_s": round(n / cpu, 1)}
        assert best is not None
        rows.append(best)
        print(json.dumps(best), flush=True)
    report = {"model": str(engine.loaded.path), "threads": threads,
              "load_avg": os.getloadavg(), "runs": rows}
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
