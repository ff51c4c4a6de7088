"""Per-step cost of a DFlash draft against one target decode step, and its break-even.

No trained DFlash drafter exists for the models on this machine, so this times a RANDOM
drafter of the published shape (z-lab's Qwen3 drafters: ``--draft-layers`` decoder
layers of the target's width, heads and MLP, z-lab's default taps) on the default model
(the embedded SmolLM2-135M GGUF unless ``--model``). One request, greedy, a prompt of
``--context`` tokens; after the prefill step every engine step is timed from the engine's
own ``StepTimings``:

- ``decode_ms``: the target forward of a plain decode step (speculation off);
- ``draft_ms``: dflash's propose (context K/V for the committed positions, one block
  forward over ``[anchor, MASK x (B-1)]``, the target's LM head over B-1 rows, argmax);
- ``verify_ms``: the target forward over the anchor plus B-1 drafts.

A speculative step emits ``1 + a`` tokens (``a`` accepted drafts) for ``draft + verify``;
a plain step emits 1 for ``decode``. Break-even: ``1 + a* = (draft_ms + verify_ms) /
decode_ms``, i.e. ``a*`` accepted drafts per step, ``a* / (B - 1)`` of the drafts.

    python benchmarks/dflash_step.py --blocks 8 16 --context 256 --steps 24
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch


def write_random_drafter(directory: Path, target: Any, block: int, layers: int) -> Path:
    """A z-lab-layout DFlash1 drafter with random weights for ``target``'s shape."""
    from safetensors.torch import save_file

    c = target.config
    h, d = c.hidden_size, c.head_dim
    n = c.num_hidden_layers
    taps = [n // 2] if layers == 1 else [round(1 + i * (n - 4) / (layers - 1))
                                         for i in range(layers)]
    gen = torch.Generator().manual_seed(0)

    def rnd(*shape: int, std: float = 0.02) -> torch.Tensor:
        return (std * torch.randn(shape, generator=gen)).to(torch.bfloat16)

    t = {"fc.weight": rnd(h, len(taps) * h), "hidden_norm.weight": torch.ones(h).bfloat16(),
         "norm.weight": torch.ones(h).bfloat16()}
    for i in range(layers):
        p = f"layers.{i}."
        t[p + "self_attn.q_proj.weight"] = rnd(c.num_attention_heads * d, h)
        t[p + "self_attn.k_proj.weight"] = rnd(c.num_key_value_heads * d, h)
        t[p + "self_attn.v_proj.weight"] = rnd(c.num_key_value_heads * d, h)
        t[p + "self_attn.o_proj.weight"] = rnd(h, c.num_attention_heads * d)
        t[p + "self_attn.q_norm.weight"] = torch.ones(d).bfloat16()
        t[p + "self_attn.k_norm.weight"] = torch.ones(d).bfloat16()
        t[p + "mlp.gate_proj.weight"] = rnd(c.intermediate_size, h)
        t[p + "mlp.up_proj.weight"] = rnd(c.intermediate_size, h)
        t[p + "mlp.down_proj.weight"] = rnd(h, c.intermediate_size)
        t[p + "input_layernorm.weight"] = torch.ones(h).bfloat16()
        t[p + "post_attention_layernorm.weight"] = torch.ones(h).bfloat16()
    directory.mkdir(parents=True, exist_ok=True)
    save_file(t, str(directory / "model.safetensors"), metadata={"format": "pt"})
    cfg = {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3",
        "hidden_size": h, "num_hidden_layers": layers,
        "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads, "head_dim": d,
        "intermediate_size": c.intermediate_size, "vocab_size": c.vocab_size,
        "max_position_embeddings": c.max_position_embeddings, "rms_norm_eps": c.rms_norm_eps,
        "rope_theta": c.rope_theta, "num_target_layers": n,
        "dflash_config": {"block_size": block, "mask_token_id": 0, "target_layer_ids": taps},
    }
    (directory / "config.json").write_text(json.dumps(cfg))
    return directory


def time_steps(llm: Any, prompt: list[int], steps: int) -> dict[str, list[float]]:
    """Per-step deltas of the engine's timings (ms), prefill step excluded; with a dflash
    proposer also its two passes (``context``: K/V writes, ``block``: the layers), the
    rest of propose being the target's LM head over the block and the pick."""
    from draftwise import SamplingParams

    engine = llm.engine
    phases: dict[str, float] = {"context": 0.0, "block": 0.0}
    if engine.spec is not None:
        model = engine.spec.proposers[0].model

        def timed(name: str, fn: Any) -> Any:
            def run(*a: Any, **k: Any) -> Any:
                t = time.perf_counter()
                out = fn(*a, **k)
                phases[name] += 1e3 * (time.perf_counter() - t)
                return out
            return run

        model.write_context = timed("context", model.write_context)
        model.block_hidden = timed("block", model.block_hidden)
    engine.add_request({"prompt_token_ids": prompt},
                       SamplingParams(temperature=0.0, max_tokens=steps + 2, ignore_eos=True))
    engine.step()  # prefill
    out: dict[str, list[float]] = {"propose": [], "forward": [], "step": [], "context": [],
                                   "block": []}
    for _ in range(steps):
        if not engine.has_unfinished_requests():
            break
        before = (engine.stats.timings.propose, engine.stats.timings.forward)
        ph = dict(phases)
        t0 = time.perf_counter()
        engine.step()
        out["step"].append(1e3 * (time.perf_counter() - t0))
        out["propose"].append(1e3 * (engine.stats.timings.propose - before[0]))
        out["forward"].append(1e3 * (engine.stats.timings.forward - before[1]))
        for name in ("context", "block"):
            out[name].append(phases[name] - ph[name])
    while engine.has_unfinished_requests():
        engine.step()
    return out


def main() -> None:
    from draftwise import LLM

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--blocks", type=int, nargs="+", default=[8, 16])
    ap.add_argument("--draft-layers", type=int, default=5)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--steps", type=int, default=24)
    args = ap.parse_args()
    prompt = [(i * 37) % 4000 + 100 for i in range(args.context)]
    plain = LLM(model=args.model, max_num_seqs=1)
    base = time_steps(plain, prompt, args.steps)
    decode = statistics.median(base["forward"])
    report: dict[str, Any] = {
        "model": plain.engine.loaded.path,
        "context": args.context, "threads": torch.get_num_threads(),
        "draft_layers": args.draft_layers, "decode_ms": round(decode, 3),
        "decode_step_ms": round(statistics.median(base["step"]), 3), "blocks": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        for block in args.blocks:
            d = write_random_drafter(Path(tmp) / f"b{block}", plain.engine.loaded, block,
                                     args.draft_layers)
            llm = LLM(model=args.model, max_num_seqs=1, speculative_config={
                "method": "dflash", "model": str(d), "num_speculative_tokens": block - 1})
            t = time_steps(llm, prompt, args.steps)
            draft, verify = statistics.median(t["propose"]), statistics.median(t["forward"])
            ctx, blk = statistics.median(t["context"]), statistics.median(t["block"])
            need = (draft + verify) / decode - 1
            report["blocks"][str(block)] = {
                "draft_ms": round(draft, 3), "verify_ms": round(verify, 3),
                "draft_context_ms": round(ctx, 3), "draft_layers_ms": round(blk, 3),
                "draft_head_and_pick_ms": round(draft - ctx - blk, 3),
                "draft_over_decode": round(draft / decode, 3),
                "break_even_accepted_per_step": round(need, 2),
                "break_even_acceptance_rate": round(need / (block - 1), 3),
                "accepted_random_drafter": llm.engine.spec.metrics.num_accepted_tokens,
            }
            del llm
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
