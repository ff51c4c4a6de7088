"""Whole forwards of the default model on two quantized-GEMM paths, side by side.

``python benchmarks/quant_forward_ab.py --paths avx2,auto`` times one target forward per
grid point (rows x tokens: 1 x 1..5, the decode and verify of one request; 8 x 1..2, a
batch) on each path, the paths interleaved point by point (``DRAFTWISE_QUANT_SIMD``, read
by the C dispatch at every call, switches them inside the process), on one thread and the
thread's own CPU time (``time.thread_time``: a shared machine's other processes do not
count), the median over ``--reps`` passes after a warm-up. Prints the milliseconds, each
path against the other and each point against 1 x 1 and 8 x 1 (the costs speculation is
weighed by), with the load average before and after.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from draftwise import LLM
from draftwise.spec.cost_model import CONTEXT
from draftwise.models import kernels

GRID = [(1, t) for t in range(1, 6)] + [(8, 1), (8, 2)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--paths", default="avx2,auto", help="DRAFTWISE_QUANT_SIMD values")
    ap.add_argument("--reps", type=int, default=9)
    args = ap.parse_args()
    paths = args.paths.split(",")
    llm = LLM(num_threads=1)
    runner, kv = llm.engine.runner, llm.engine.kv
    ids = [f"quant-ab-{i}" for i in range(8)]
    for r in ids:
        if not kv.allocate_slots(r, CONTEXT + 5):
            raise SystemExit("the KV pool cannot hold 8 rows of the probe context")
    tables = [kv.block_table(r) for r in ids]
    times: dict[tuple[str, tuple[int, int]], list[float]] = {(p, g): [] for p in paths for g in GRID}
    load0 = os.getloadavg()
    try:
        for rep in range(args.reps + 1):  # the first pass warms the buffers
            for g in GRID:
                rows, t = g
                for p in paths:
                    os.environ["DRAFTWISE_QUANT_SIMD"] = p
                    batch = runner.build([[1] * t for _ in range(rows)], [CONTEXT] * rows,
                                         tables[:rows], [list(range(t)) for _ in range(rows)], (),
                                         ids[:rows])
                    c0 = time.thread_time()
                    runner.forward(batch)
                    if rep:
                        times[p, g].append(time.thread_time() - c0)
                    for r in ids[:rows]:
                        runner.release(r)
    finally:
        os.environ.pop("DRAFTWISE_QUANT_SIMD", None)
    names = {p: kernels.quant_simd(path="auto") if p == "auto" else p for p in paths}
    print(f"default model, 1 thread, context {CONTEXT}; load {load0} -> {os.getloadavg()}")
    med = {key: statistics.median(v) for key, v in times.items()}
    head = " ".join(f"{names[p]:>11s}" for p in paths)
    print(f"{'rows x tok':10s} {head} {'2nd/1st':>8s} " +
          " ".join(f"{names[p][:6] + ' /1x1':>11s} {names[p][:6] + ' /8x1':>11s}" for p in paths))
    for g in GRID:
        ms = " ".join(f"{med[p, g] * 1e3:11.2f}" for p in paths)
        ratio = med[paths[-1], g] / med[paths[0], g]
        rel = " ".join(f"{med[p, g] / med[p, (1, 1)]:11.2f} {med[p, g] / med[p, (8, 1)]:11.2f}"
                       for p in paths)
        print(f"{g[0]} x {g[1]:<6d} {ms} {ratio:8.3f} {rel}")


if __name__ == "__main__":
    main()
