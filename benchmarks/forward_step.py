"""Time one target forward of the default model: a decode row and a k+1-token verify row.

The engine's step is ~96% this forward, so this is the number kernel work moves. Each
figure is the mean over ``--iters`` forwards after a warm-up, at a fixed context. Switch
pieces off to compare them in the same minute::

    python benchmarks/forward_step.py --context 300
    DRAFTWISE_ATTENTION=torch python benchmarks/forward_step.py            # torch attention + ops
    DRAFTWISE_ATTENTION=torch DRAFTWISE_PACK_WEIGHTS=0 python benchmarks/forward_step.py

Writes JSON to ``--out`` when given (and prints it).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import time

import torch
from draftwise.bootstrap import apply_threads
from draftwise.models.kernels import kernel_threads
from draftwise.models.loader import load_model
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
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    loaded = load_model(args.model, dtype=args.dtype)
    apply_threads(loaded.model, args.threads)  # as the engine does
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
        "env": {k: os.environ[k] for k in ("DRAFTWISE_ATTENTION", "DRAFTWISE_PACK_WEIGHTS")
                if k in os.environ},
    }
    for name, rows in (("decode_ms", 1), ("verify_ms", args.verify_rows)):
        batch = runner.build(
            [prompt[:rows]], [args.context], [table], [list(range(rows))]
        )  # rewrites the same slots every time: the cache never grows
        for _ in range(10):
            runner.forward(batch)
        start = time.perf_counter()
        for _ in range(args.iters):
            runner.forward(batch)
        result[name] = (time.perf_counter() - start) / args.iters * 1e3
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
