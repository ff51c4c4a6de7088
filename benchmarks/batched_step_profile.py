"""Where a batched decode step's time goes: N rows of the engine, kernels timed per call.

    python benchmarks/batched_step_profile.py --model /work/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf \\
        --rows 8 --threads 2 --steps 16

Builds the engine as the benchmarks do (plain, ``max_num_seqs=N``), starts N greedy
requests of ``--prompt`` random tokens, steps until every row decodes, then times
``--steps`` engine steps of N decode rows. Reported per step: wall and CPU seconds, the
engine's own split (schedule / forward / verify / commit), and inside the forward each
kernel wrapper of ``models.kernels`` (calls, wall and process-CPU milliseconds: the CPU
the process spent during the call, every worker thread included), the rest being torch
ops and Python. On a loaded machine the CPU figures are the ones to read.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=96)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    import torch
    from draftwise.models import kernels
    from draftwise.sampling_params import SamplingParams
    from side_by_side import build_ours
    from timing import KERNEL_WRAPPERS, cpu_wall, write_report

    engine = build_ours(args.model, None, "auto", args.threads, max_num_seqs=args.rows)
    gen = torch.Generator().manual_seed(0)
    vocab = engine.loaded.model.config.vocab_size
    params = SamplingParams(temperature=0.0, max_tokens=args.steps + 64, ignore_eos=True)
    for i in range(args.rows):
        ids = torch.randint(100, min(vocab, 20000), (args.prompt,), generator=gen).tolist()
        engine.add_request({"prompt_token_ids": ids}, params, request_id=f"r{i}")
    for _ in range(args.rows * 4):  # prefill every row, then a few all-decode steps
        engine.step()

    ms: dict[str, float] = defaultdict(float)
    cpu_ms: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    for name in KERNEL_WRAPPERS:
        real = getattr(kernels, name)

        def timed(*a: Any, _real: Callable[..., Any] = real, _n: str = name, **kw: Any) -> Any:
            t0, c0 = time.perf_counter(), time.process_time()
            try:
                return _real(*a, **kw)
            finally:
                ms[_n] += 1e3 * (time.perf_counter() - t0)
                cpu_ms[_n] += 1e3 * (time.process_time() - c0)
                calls[_n] += 1

        setattr(kernels, name, timed)
    tm = engine.stats.timings
    before = {k: getattr(tm, k) for k in ("schedule", "propose", "forward", "verify", "commit")}
    with cpu_wall() as span:
        for _ in range(args.steps):
            engine.step()
    cpu, wall = span.cpu, span.wall
    n = args.steps
    split = {k: 1e3 * (getattr(tm, k) - v) / n for k, v in before.items()}
    kern = {k: {"calls": calls[k] / n, "ms": ms[k] / n, "cpu_ms": cpu_ms[k] / n}
            for k in sorted(cpu_ms, key=cpu_ms.get, reverse=True)}
    report = {
        "model": args.model, "rows": args.rows, "threads": args.threads, "prompt": args.prompt,
        "backend": engine.loaded.model.backend.line(),
        "step_wall_ms": 1e3 * wall / n, "step_cpu_ms": 1e3 * cpu / n,
        "tok_per_s": args.rows * n / wall,
        "engine_split_ms": split, "kernels_ms": kern,
        "forward_outside_kernels_ms": split["forward"] - sum(v["ms"] for v in kern.values()),
        "step_cpu_outside_kernels_ms": 1e3 * cpu / n - sum(v["cpu_ms"] for v in kern.values()),
    }  # fmt: skip
    write_report(report, args.out)


if __name__ == "__main__":
    main()
