"""How far the quantized-weight model's logits are from the fp32 model's (same file).

``python benchmarks/quant_accuracy.py --model FILE.gguf`` prefills the first prompts of a
workload through the model as it runs by default (weights kept quantized, bf16, int8
activations) and through the fp32 oracle (``--dtype float32``: the same file dequantized,
what the tests hold against transformers), and prints JSON: relative RMS error of the
logits, the largest absolute error, and how often the top-1 token agrees. With
``DRAFTWISE_QUANT=0`` in the environment the first model is the widened bf16 one instead.
The numbers in docs/quantized-weights.md come from here.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
from draftwise.models.batch import KVCache, build_forward_batch
from draftwise.models.loader import load_model

WORKLOAD = Path(__file__).parent / "workloads" / "cpu-smoke-8.jsonl"


def _logits(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    block = 16
    blocks = -(-len(ids) // block)
    kv = KVCache.allocate(model.num_layers, blocks, block, model.num_kv_heads, model.head_dim,
                          model.dtype)
    batch = build_forward_batch([ids], [0], [list(range(blocks))], block, [list(range(len(ids)))])
    return model(batch, kv).logits.float()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=160, help="prompt tokens kept per prompt")
    args = ap.parse_args()
    rows = [json.loads(line) for line in WORKLOAD.read_text().splitlines() if line.strip()]
    test = load_model(args.model)
    prompts = [test.encode_chat(r["messages"])[: args.max_tokens] for r in rows[: args.prompts]]
    got = [_logits(test.model, p) for p in prompts]
    backend = test.model.weight_backend
    del test
    oracle = load_model(args.model, dtype="float32")
    ref = [_logits(oracle.model, p) for p in prompts]
    g, r = torch.cat(got), torch.cat(ref)
    report = {
        "model": os.path.basename(args.model), "weight_backend": backend,
        "quant_env": os.environ.get("DRAFTWISE_QUANT", "auto"), "positions": int(g.shape[0]),
        "rel_rms_error": float((g - r).norm() / r.norm()),
        "max_abs_error": float((g - r).abs().max()),
        "top1_agreement": float((g.argmax(-1) == r.argmax(-1)).float().mean()),
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
