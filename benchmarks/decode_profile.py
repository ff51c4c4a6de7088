"""Where one plain decode step's time goes: every kernel call timed, each GEMM by its weight.

    python benchmarks/decode_profile.py --model /work/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf \\
        --threads 2 --n-gen 64 --reps 3

Runs ``decode_bench.py``'s decode (fixed tokens from position 0, one ``ModelRunner.forward``
per token, no sampling) with every kernel wrapper of ``models.kernels`` timed per call.
GEMMs are split by the weight they ran (``qkv``, ``o``, ``gate_up``, ``down``, ``lm_head``)
with the bytes that weight streams, so each line reads as GB/s against the machine's
bandwidth. ``build`` is ``ModelRunner.build`` (the batch), ``python`` the rest of the
forward outside any kernel (torch ops, wrappers' checks, the layer loop). Per-token
milliseconds are from the median pass of ``--reps`` passes of ``--n-gen`` tokens.
``gemv_only`` is the step's GEMMs alone, back to back: the bound with nothing between them.

Where the decoder stack runs (``models.stack``) the layers are one ``decoder_layers`` call;
``DRAFTWISE_DECODER_STACK=per-op`` splits them into their kernels again.
"""

from __future__ import annotations

import argparse
import statistics
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
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-gen", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    import torch
    from draftwise.bootstrap import finish_backend
    from draftwise.models import kernels
    from draftwise.models.loader import load_model
    from draftwise.runner import ModelRunner
    from timing import KERNEL_WRAPPERS, write_report

    torch.set_num_threads(args.threads)
    loaded = load_model(args.model, dtype="auto")
    finish_backend(loaded, args.threads)
    model = loaded.model
    names: dict[int, tuple[str, int]] = {}  # id(weight) -> (kind, bytes)
    for layer in model.decoder_layers():
        for attr in layer._LINEARS:
            w = getattr(layer, attr)
            kind = attr.removesuffix("_weight")
            names[id(w)] = (f"{kind} {'+'.join(getattr(w, 'qtypes', ()))}",
                            int(getattr(w, "nbytes", 0)))
    head = model._lm_head_packed or model.lm_head_weight
    names[id(head)] = (f"lm_head {'+'.join(getattr(head, 'qtypes', ()))}",
                       int(getattr(head, "nbytes", 0)))

    ms: dict[str, float] = defaultdict(float)
    cpu_ms: dict[str, float] = defaultdict(float)  # the calling thread's CPU
    calls: dict[str, int] = defaultdict(int)
    nbytes: dict[str, int] = defaultdict(int)
    real_linear_quant = kernels.linear_quant
    for name in KERNEL_WRAPPERS:
        if not hasattr(kernels, name):
            continue
        real = getattr(kernels, name)

        def timed(*a: Any, _real: Callable[..., Any] = real, _n: str = name, **kw: Any) -> Any:
            key = _n
            if _n in ("linear_quant", "linear_bf16"):
                key, size = names.get(id(a[1]), (f"{_n} ?", 0))
                nbytes[key] += size
            t0, c0 = time.perf_counter(), time.thread_time()
            try:
                return _real(*a, **kw)
            finally:
                ms[key] += 1e3 * (time.perf_counter() - t0)
                cpu_ms[key] += 1e3 * (time.thread_time() - c0)
                calls[key] += 1

        setattr(kernels, name, timed)

    block = 16
    blocks = args.n_gen // block + 2
    runner = ModelRunner(loaded, num_blocks=blocks + 1, block_size=block)
    table = list(range(1, blocks + 1))
    vocab = loaded.config.vocab_size
    gen = [(13 * i + 5) % vocab for i in range(args.n_gen)]

    def decode() -> tuple[float, float, float, float]:
        build = fwd = 0.0
        t0, c0 = time.perf_counter(), time.thread_time()
        for pos, tok in enumerate(gen):
            a = time.perf_counter()
            batch = runner.build([[tok]], [pos], [table], [[0]], req_ids=["bench"])
            b = time.perf_counter()
            runner.forward(batch)
            fwd += time.perf_counter() - b
            build += b - a
        return time.perf_counter() - t0, build, fwd, time.thread_time() - c0

    def gemv_only() -> float:
        """The step's GEMMs alone, back to back in forward order: the bound with no
        Python, attention or elementwise work between them."""
        seq = [getattr(layer, a) for layer in model.decoder_layers() for a in layer._LINEARS]
        seq.append(head)
        xs = {w.in_features: torch.randn(1, w.in_features).bfloat16() for w in seq}
        t0 = time.perf_counter()
        for _ in gen:
            for w in seq:
                real_linear_quant(xs[w.in_features], w, out_f32=w is head)
        return (time.perf_counter() - t0) / len(gen)

    decode()  # warm-up
    per_rep = []
    for _ in range(args.reps):
        ms.clear(), cpu_ms.clear(), calls.clear(), nbytes.clear()
        total, build, fwd, cpu = decode()
        n = args.n_gen
        kern = {k: {"calls": calls[k] / n, "ms": ms[k] / n, "thread_cpu_ms": cpu_ms[k] / n,
                    **({"gb_per_s": nbytes[k] / (ms[k] * 1e-3) / 1e9} if nbytes[k] else {})}
                for k in ms}
        per_rep.append({"tok_per_s": n / total, "step_ms": 1e3 * total / n,
                        "step_thread_cpu_ms": 1e3 * cpu / n,
                        "build_ms": 1e3 * build / n, "forward_ms": 1e3 * fwd / n,
                        "kernels": kern})
    gemv_s = statistics.median(gemv_only() for _ in range(args.reps + 1))
    best = statistics.median_low([r["tok_per_s"] for r in per_rep])
    rep = next(r for r in per_rep if r["tok_per_s"] == best)
    kern_ms = sum(v["ms"] for v in rep["kernels"].values())
    rep["python_ms"] = rep["forward_ms"] - kern_ms
    rep["python_thread_cpu_ms"] = rep["step_thread_cpu_ms"] - rep["build_ms"] - sum(
        v["thread_cpu_ms"] for v in rep["kernels"].values())
    rep["kernels"] = dict(sorted(rep["kernels"].items(), key=lambda kv: -kv[1]["ms"]))
    gemm_bytes = sum(size for _, size in names.values())
    report = {"model": args.model, "threads": args.threads, "n_gen": args.n_gen,
              "backend": model.backend.line(), "weight_bytes": model.weight_bytes,
              "weights_gb_per_s": gemm_bytes / (rep["step_ms"] * 1e-3) / 1e9,
              "gemv_only_ms": 1e3 * gemv_s, "gemv_only_gb_per_s": gemm_bytes / gemv_s / 1e9,
              "tok_per_s_reps": [r["tok_per_s"] for r in per_rep], "median_rep": rep}
    write_report(report, args.out)


if __name__ == "__main__":
    main()
