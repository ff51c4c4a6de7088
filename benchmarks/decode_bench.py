"""draftwise's ``llama-bench``: pure prefill and decode tok/s of the target forward alone.

``llama-bench -p 256 -n 64`` times a 256-token prefill from an empty context (``pp256``) and
64 single-token decodes from an empty context (``tg64``), each ``-r`` times, and reports the
mean tok/s. This does the same with draftwise's ``ModelRunner`` (the engine's forward, no
scheduler, sampling or HTTP), so the two numbers compare kernel against kernel. Like
llama-bench, decode feeds fixed pseudo-random tokens rather than its own argmax.

    python benchmarks/decode_bench.py --model M.gguf --threads 2 --n-prompt 256 --n-gen 64

``compare_llamacpp.py`` calls :func:`measure` on the model its plain engine already loaded.

On a shared VM the memory bandwidth a decode gets moves by 20-40% within minutes (the same
2-thread tg64 read 26 and 49 tok/s ten minutes apart here), so one llama-bench run beside
one of ours says little. ``--llama-bench PATH --rounds N`` alternates the two N times
(llama-bench in a fresh process each round, ours on the model loaded once) and reports the
ratio per round and its median::

    python benchmarks/decode_bench.py --model M.gguf --threads 2 --rounds 5 \
        --llama-bench /work/peers/llama.cpp-build/bin/llama-bench
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch


def _rate(samples: list[float], n: int) -> dict[str, Any]:
    """llama-bench's figures: mean and stddev of per-rep tok/s."""
    rates = [n / s for s in samples]
    return {
        "n_tokens": n,
        "tok_per_s": statistics.fmean(rates),
        "stddev_tok_per_s": statistics.stdev(rates) if len(rates) > 1 else 0.0,
        "samples_tok_per_s": rates,
    }


@torch.inference_mode()
def measure(loaded: Any, n_prompt: int = 256, n_gen: int = 64, reps: int = 3) -> dict[str, Any]:
    """Prefill ``n_prompt`` and decode ``n_gen`` tokens from position 0, ``reps`` times each.

    Threads are whatever the caller set (``bootstrap.apply_threads``, as the engine does).
    The runner owns a private KV cache just big enough, so an engine sharing ``loaded`` is
    not disturbed.
    """
    from draftwise.models.kernels import kernel_threads
    from draftwise.runner import ModelRunner

    if n_prompt < 1 or n_gen < 1 or reps < 1:
        raise ValueError(f"n_prompt, n_gen and reps must be >= 1, got {n_prompt}, {n_gen}, {reps}")
    block = 16
    blocks = max(n_prompt, n_gen) // block + 2
    runner = ModelRunner(loaded, num_blocks=blocks + 1, block_size=block)  # block 0: null
    table = list(range(1, blocks + 1))
    vocab = loaded.config.vocab_size
    prompt = [(7 * i + 11) % vocab for i in range(n_prompt)]
    gen = [(13 * i + 5) % vocab for i in range(n_gen)]

    def prefill() -> float:
        batch = runner.build([prompt], [0], [table], [[n_prompt - 1]], req_ids=["bench"])
        t0 = time.perf_counter()
        runner.forward(batch)
        return time.perf_counter() - t0

    def decode() -> float:
        t0 = time.perf_counter()
        for pos, tok in enumerate(gen):
            runner.forward(runner.build([[tok]], [pos], [table], [[0]], req_ids=["bench"]))
        return time.perf_counter() - t0

    prefill()  # warm-up, as llama-bench does one run before its reps
    decode()
    gc.collect()
    pp = [prefill() for _ in range(reps)]
    tg = [decode() for _ in range(reps)]
    model = loaded.model
    return {
        "prefill": _rate(pp, n_prompt),
        "decode": _rate(tg, n_gen),
        "threads": kernel_threads(),
        "dtype": str(next(model.parameters()).dtype),
        "attention_backend": getattr(model, "attention_backend", "torch"),
        "weight_backend": getattr(model, "weight_backend", "dense"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None, help="checkpoint (default: the embedded model)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--n-prompt", type=int, default=256)
    parser.add_argument("--n-gen", type=int, default=64)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--llama-bench", default=None,
                        help="llama.cpp's llama-bench: alternate with it, round by round")
    parser.add_argument("--rounds", type=int, default=1, help="rounds (with --llama-bench)")
    args = parser.parse_args()

    from draftwise.bootstrap import finish_backend
    from draftwise.formats.default_model import default_model_path
    from draftwise.models.loader import load_model

    # the embedded model by path: llama-bench needs the file (it was handed None)
    args.model = args.model or default_model_path()
    torch.set_num_threads(args.threads)
    loaded = load_model(args.model, dtype=args.dtype)
    finish_backend(loaded, args.threads)  # as the engine does (threads and backend)
    if not args.llama_bench:
        print(json.dumps(measure(loaded, args.n_prompt, args.n_gen, args.reps), indent=2))
        return
    print(json.dumps(alternate(loaded, args), indent=2))


def alternate(loaded: Any, args: argparse.Namespace) -> dict[str, Any]:
    """``--rounds`` rounds of llama-bench then ours, each its own ``-r``/``--reps``
    repetitions; per round the ratio of the means, and the median ratio over rounds."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from llamacpp import run_llama_bench  # (a sibling script's helper)

    rounds: list[dict[str, Any]] = []
    for _ in range(args.rounds):
        peer = run_llama_bench(Path(args.llama_bench), args.model, args.threads,
                               args.n_prompt, args.n_gen, args.reps)
        ours = measure(loaded, args.n_prompt, args.n_gen, args.reps)
        row = {"loadavg": os.getloadavg()[0]}
        for key in ("prefill", "decode"):
            row[key] = {"llama_cpp": peer[key]["tok_per_s"], "draftwise": ours[key]["tok_per_s"]}
            row[key]["ratio"] = row[key]["draftwise"] / row[key]["llama_cpp"]
        rounds.append(row)
        print(f"round {len(rounds)}: decode {row['decode']['draftwise']:.1f} vs "
              f"{row['decode']['llama_cpp']:.1f} tok/s ({row['decode']['ratio']:.2f}x), "
              f"prefill {row['prefill']['ratio']:.2f}x", file=sys.stderr)
    return {
        "model": args.model,
        "threads": args.threads,
        "n_prompt": args.n_prompt,
        "n_gen": args.n_gen,
        "reps": args.reps,
        "rounds": rounds,
        "median_ratio": {key: statistics.median(r[key]["ratio"] for r in rounds)
                         for key in ("prefill", "decode")},
    }


if __name__ == "__main__":
    main()
