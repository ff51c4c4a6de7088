"""draftwise's ``llama-bench``: pure prefill and decode tok/s of the target forward alone.

``llama-bench -p 256 -n 64`` times a 256-token prefill from an empty context (``pp256``) and
64 single-token decodes from an empty context (``tg64``), each ``-r`` times, and reports the
mean tok/s. This does the same with draftwise's ``ModelRunner`` (the engine's forward, no
scheduler, sampling or HTTP), so the two numbers compare kernel against kernel. Like
llama-bench, decode feeds fixed pseudo-random tokens rather than its own argmax.

    python benchmarks/decode_bench.py --model M.gguf --threads 2 --n-prompt 256 --n-gen 64

``compare_llamacpp.py`` calls :func:`measure` on the model its plain engine already loaded.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
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
    args = parser.parse_args()

    from draftwise.bootstrap import finish_backend
    from draftwise.models.loader import load_model

    torch.set_num_threads(args.threads)
    loaded = load_model(args.model, dtype=args.dtype)
    finish_backend(loaded, args.threads)  # as the engine does (threads and backend)
    print(json.dumps(measure(loaded, args.n_prompt, args.n_gen, args.reps), indent=2))


if __name__ == "__main__":
    main()
