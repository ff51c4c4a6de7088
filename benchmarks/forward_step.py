"""Time one target forward of the default model: a decode row and a k+1-token verify row.

The engine's step is ~96% this forward, so this is the number kernel work moves. Each
figure is the mean over ``--iters`` forwards after a warm-up, at a fixed context. Switch
pieces off to compare them in the same minute::

    python benchmarks/forward_step.py --context 300
    DRAFTWISE_ATTENTION=torch python benchmarks/forward_step.py            # torch attention + ops
    DRAFTWISE_ATTENTION=torch DRAFTWISE_PACK_WEIGHTS=0 python benchmarks/forward_step.py
    DRAFTWISE_QUANT=0 python benchmarks/forward_step.py          # GGUF widened to bf16 (old)
    DRAFTWISE_QUANT_SIMD=avx2 python benchmarks/forward_step.py  # the AVX2 GEMM, not VNNI
    python benchmarks/forward_step.py --model qwen-1.5b-q4_k_m.gguf --threads 2 \
        --llama-bench /path/to/llama-bench        # llama.cpp's tg on the same file, same run

``weights_gb_per_s`` is the bytes of every projection and the LM head (what a decode step
streams) over the decode time: the number to hold against the machine's bandwidth.
``cpu_*`` are the process's CPU seconds per forward: on a machine shared with other work
they move less than the wall clock. Writes JSON to ``--out`` when given (and prints it).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import time

import torch
from draftwise.bootstrap import finish_backend
from draftwise.models.kernels import kernel_threads
from draftwise.models.loader import load_model
from draftwise.models.quant import quant_simd
from draftwise.runner import ModelRunner


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None, help="checkpoint (default: the embedded model)")
    parser.add_argument("--context", type=int, default=300, help="tokens already in the cache")
    parser.add_argument("--verify-rows", type=int, default=5, help="1 + k tokens of a verify row")
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--out", default=None)
    parser.add_argument("--llama-bench", default=None,
                        help="llama.cpp's llama-bench: also run its tg on the same file")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    loaded = load_model(args.model, dtype=args.dtype)
    load_seconds = time.perf_counter() - start
    finish_backend(loaded, args.threads)  # as the engine does (threads and backend)
    block = 16
    blocks = (args.context + args.verify_rows) // block + 2
    runner = ModelRunner(loaded, num_blocks=blocks + 1, block_size=block)
    table = list(range(1, blocks + 1))
    prompt = [(7 * i + 11) % loaded.config.vocab_size for i in range(args.context)]
    runner.forward(runner.build([prompt], [0], [table], [[args.context - 1]]))
    gc.collect()
    gc.freeze()

    result: dict[str, object] = {
        "context": args.context,
        "threads": kernel_threads(),
        "dtype": str(loaded.model.dtype),
        "attention_backend": getattr(loaded.model, "attention_backend", "torch"),
        "packed_weights": bool(getattr(loaded.model, "packed", False)),
        "weight_backend": getattr(loaded.model, "weight_backend", "dense"),
        "quant_kernel": quant_simd(),
        "env": {k: os.environ[k] for k in
                ("DRAFTWISE_ATTENTION", "DRAFTWISE_PACK_WEIGHTS", "DRAFTWISE_QUANT")
                if k in os.environ},
        "load_seconds": load_seconds,
        "weight_bytes": getattr(loaded.model, "weight_bytes", None),
    }
    for name, rows in (("decode_ms", 1), ("verify_ms", args.verify_rows)):
        batch = runner.build(
            [prompt[:rows]], [args.context], [table], [list(range(rows))]
        )  # rewrites the same slots every time: the cache never grows
        for _ in range(10):
            runner.forward(batch)
        start, cpu = time.perf_counter(), time.process_time()
        for _ in range(args.iters):
            runner.forward(batch)
        result[name] = (time.perf_counter() - start) / args.iters * 1e3
        result["cpu_" + name] = (time.process_time() - cpu) / args.iters * 1e3
    if result["weight_bytes"]:
        result["weights_gb_per_s"] = result["weight_bytes"] / result["decode_ms"] / 1e6
    if args.llama_bench and args.model:
        result["llama_bench_tg_tok_per_s"] = llama_bench_tg(args.llama_bench, args.model,
                                                            args.threads)
        result["decode_tok_per_s"] = 1e3 / result["decode_ms"]
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


def llama_bench_tg(binary: str, model: str, threads: int, tokens: int = 32) -> float:
    """llama.cpp's pure decode rate (``llama-bench -p 0 -n N``) on the same file."""
    out = subprocess.run(
        [binary, "-m", model, "-p", "0", "-n", str(tokens), "-t", str(threads), "-r", "3",
         "-o", "json"], capture_output=True, text=True, check=True).stdout
    runs = json.loads(out[out.index("["):])
    return float(runs[0]["avg_ts"]) if runs else float("nan")


if __name__ == "__main__":
    main()
