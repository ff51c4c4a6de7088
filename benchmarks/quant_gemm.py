"""Micro-benchmark of the quantized GEMM: one weight per type, 1..8 activation rows.

``--types`` takes GGUF type names and ``NVFP4`` (the safetensors NVFP4 kernel, W4A16).

``python benchmarks/quant_gemm.py --threads 1`` prints JSON: per type and row count the
median CPU time of one call (steadier than the wall clock on a shared machine; the wall
median is beside it), GMAC per CPU second, and the CPU cost relative to one row (what a
speculative verify of ``rows - 1`` drafts costs against a decode step). Shapes default to
Qwen2.5-1.5B's MLP down projection (1536 x 8960), whose weights (7-12 MB) do not stay in
cache, as in a real forward. Row counts are interleaved round by round, so a load change
on a shared machine touches every count alike; the load average is in the report.

``--paths avx2,avx512vnni`` times each tile kernel side by side (``kernels.QUANT_PATHS``),
interleaved within every round, on the thread's own CPU time at ``--threads 1``; a path a
type does not run on this CPU is left out of that type.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import numpy as np
import torch
from draftwise.models import kernels
from draftwise.models import quant as q
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as Q

#: byte offsets of each type's fp16 scales in a GGUF block (set to a sane value: random
#: bytes would make some NaN or subnormal, which can run slower than real weights)
_FP16 = {Q.Q4_0: (0,), Q.Q4_1: (0, 2), Q.Q5_0: (0,), Q.Q5_1: (0, 2), Q.Q8_0: (0,),
         Q.Q2_K: (80, 82), Q.Q3_K: (108,), Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,)}


def _nvfp4(n: int, k: int, copies: int) -> list[q.QuantWeight]:
    """Random NVFP4 codes with finite fp8 scales (``models.quant.pack_nvfp4``)."""
    codes = torch.from_numpy(np.random.default_rng(0).integers(0, 256, (n, k // 2), dtype=np.uint8))
    scales = torch.full((n, k // 16), 0.5).to(torch.float8_e4m3fn)
    return [q.pack_nvfp4([q.NvFp4Part(codes, scales, 1e-3)], k) for _ in range(copies)]


def _weight(name: str, n: int, k: int, copies: int) -> list[q.QuantWeight]:
    """Random blocks (the kernel's speed does not depend on the values) with finite scales."""
    if name == "NVFP4":
        return _nvfp4(n, k, copies)
    qtype = Q[name]
    block, size = GGML_QUANT_SIZES[qtype]
    raw = np.random.default_rng(0).integers(0, 256, (n, k // block, size), dtype=np.uint8)
    for o in _FP16[qtype]:
        raw[:, :, o : o + 2] = np.full((n, k // block), 1e-3, np.float16).view(np.uint8).reshape(
            n, k // block, 2)
    raw = raw.reshape(n, -1)
    return [q.pack_quant([q.QuantPart(qtype, raw)], k) for _ in range(copies)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--types", default="Q4_K,Q6_K,Q8_0,Q4_1,Q4_0,Q5_0,Q5_1")
    ap.add_argument("--rows", default="1,2,3,5,8")
    ap.add_argument("--n", type=int, default=1536)
    ap.add_argument("--k", type=int, default=8960)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=31)
    ap.add_argument("--copies", type=int, default=4, help="weights cycled (defeats the cache)")
    ap.add_argument("--paths", default="auto",
                    help="tile kernels to compare, interleaved round by round (kernels.QUANT_PATHS:"
                         " e.g. avx2,avx512vnni); a type a path does not cover is skipped there")
    args = ap.parse_args()
    kernels.set_kernel_threads(args.threads)
    rows = [int(r) for r in args.rows.split(",")]
    report: dict = {"n": args.n, "k": args.k, "threads": args.threads,
                    "simd": q.quant_simd(), "loadavg_before": os.getloadavg(), "types": {}}
    for name in args.types.split(","):
        ws = _weight(name, args.n, args.k, args.copies)
        qtype = q.NVFP4 if name == "NVFP4" else Q[name]
        paths = []
        for p in args.paths.split(","):
            try:
                paths.append((p, q.quant_simd(int(qtype), p)))
            except ValueError:  # not on this CPU, or not a type the path covers
                continue
        xs = {m: torch.randn(m, args.k).bfloat16() for m in rows}
        keys = [(p, m) for p, _ in paths for m in rows]
        times: dict[tuple[str, int], list[float]] = {key: [] for key in keys}
        cpu: dict[tuple[str, int], list[float]] = {key: [] for key in keys}
        for _ in range(2):
            for p, m in keys:
                q.linear_quant(xs[m], ws[0], path=p)
        for _ in range(args.rounds):
            for p, m in keys:
                # the thread's own CPU time at one thread (a shared machine's other
                # processes do not count), the process's with more
                clock = time.thread_time if args.threads == 1 else time.process_time
                t0, c0 = time.perf_counter(), clock()
                for w in ws:
                    q.linear_quant(xs[m], w, path=p)
                times[p, m].append((time.perf_counter() - t0) / len(ws))
                cpu[p, m].append((clock() - c0) / len(ws))
        for p, ran in paths:
            wall = {m: statistics.median(times[p, m]) for m in rows}
            med = {m: statistics.median(cpu[p, m]) for m in rows}
            entry = {
                str(m): {"cpu_ms": round(med[m] * 1e3, 4), "wall_ms": round(wall[m] * 1e3, 4),
                         "gmac_per_cpu_s": round(m * args.n * args.k / med[m] / 1e9, 2),
                         "vs_1_row": round(med[m] / med[rows[0]], 3)}
                for m in rows}
            base = statistics.median(cpu[paths[0][0], rows[0]])
            for m in rows:  # against the first path's one row: what a verify costs
                entry[str(m)]["vs_first_path_1_row"] = round(med[m] / base, 3)
            report["types"].setdefault(name, {})[ran if len(paths) > 1 else "all"] = entry
            print(f"{name:6s} {ran:10s}",
                  " ".join(f"{m}:{med[m]*1e3:.3f}ms({med[m]/med[rows[0]]:.2f}x)" for m in rows),
                  flush=True)
    report["loadavg_after"] = os.getloadavg()
    print(json.dumps(report))


if __name__ == "__main__":
    main()
