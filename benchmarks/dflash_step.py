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

Plain and speculative steps are interleaved (one of each in turn), so both see the same
load from other programs on the machine; ``draft_over_decode`` is the median of the
per-pair ratios, and the load average is reported at the start and the end.
``--format gguf-q8_0`` writes the same drafter as a Q8_0 ``dflash`` GGUF (its layers on
the quantized kernels).

A speculative step emits ``1 + a`` tokens (``a`` accepted drafts) for ``draft + verify``;
a plain step emits 1 for ``decode``. Break-even: ``1 + a* = (draft_ms + verify_ms) /
decode_ms``, i.e. ``a*`` accepted drafts per step, ``a* / (B - 1)`` of the drafts.

    python benchmarks/dflash_step.py --blocks 8 16 --context 256 --steps 24 [--format gguf-q8_0]
"""

from __future__ import annotations

import argparse
import json
import os
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


def write_q8_0_gguf(src: Path, out: Path, target: Any) -> Path:
    """``src`` as a llama.cpp ``dflash`` GGUF, matrices Q8_0 (the converter's type rules:
    1-D tensors F32), so the drafter's layers run on the quantized kernels."""
    import gguf
    from safetensors.torch import load_file

    from draftwise_dflash.gguf_drafter import _gguf

    cfg = json.loads((src / "config.json").read_text())
    w = gguf.GGUFWriter(str(out), "dflash")
    for key in ("block_count", "embedding_length", "feed_forward_length"):
        w.add_uint32(f"dflash.{key}", {"block_count": cfg["num_hidden_layers"],
                                       "embedding_length": cfg["hidden_size"],
                                       "feed_forward_length": cfg["intermediate_size"]}[key])
    w.add_uint32("dflash.attention.head_count", cfg["num_attention_heads"])
    w.add_uint32("dflash.attention.head_count_kv", cfg["num_key_value_heads"])
    w.add_uint32("dflash.attention.key_length", cfg["head_dim"])
    w.add_uint32("dflash.context_length", cfg["max_position_embeddings"])
    w.add_uint32("dflash.block_size", cfg["dflash_config"]["block_size"])
    w.add_float32("dflash.rope.freq_base", float(cfg["rope_theta"]))
    w.add_float32("dflash.attention.layer_norm_rms_epsilon", float(cfg["rms_norm_eps"]))
    w.add_array("dflash.target_layers", [i + 1 for i in cfg["dflash_config"]["target_layer_ids"]])
    w.add_uint32("tokenizer.ggml.mask_token_id", cfg["dflash_config"]["mask_token_id"])
    for name, t in load_file(str(src / "model.safetensors")).items():
        arr = t.float().numpy()
        if arr.ndim == 1:
            w.add_tensor(_gguf(name), arr)
        else:
            q = gguf.GGMLQuantizationType.Q8_0
            w.add_tensor(_gguf(name), gguf.quants.quantize(arr, q), raw_dtype=q)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


class Timed:
    """One engine with one greedy request, stepped on demand; per step the engine's own
    timings (ms) and, with a dflash proposer, its two passes (``context``: K/V writes,
    ``block``: the layers; the rest of propose is the target's LM head and the pick)."""

    def __init__(self, llm: Any, prompt: list[int], steps: int) -> None:
        from draftwise import SamplingParams

        self.engine = engine = llm.engine
        self.phases: dict[str, float] = {"context": 0.0, "block": 0.0}
        if engine.spec is not None:
            model = engine.spec.proposers[0].model
            model.write_context = self._timed("context", model.write_context)
            model.block_hidden = self._timed("block", model.block_hidden)
        engine.add_request({"prompt_token_ids": prompt}, SamplingParams(
            temperature=0.0, max_tokens=steps + 2, ignore_eos=True))
        engine.step()  # prefill
        self.out: dict[str, list[float]] = {k: [] for k in ("propose", "forward", "step",
                                                             "context", "block")}

    def _timed(self, name: str, fn: Any) -> Any:
        def run(*a: Any, **k: Any) -> Any:
            t = time.perf_counter()
            out = fn(*a, **k)
            self.phases[name] += 1e3 * (time.perf_counter() - t)
            return out
        return run

    def step(self) -> None:
        """One decode (or speculative) step, recorded."""
        engine, out = self.engine, self.out
        before = (engine.stats.timings.propose, engine.stats.timings.forward)
        ph = dict(self.phases)
        t0 = time.perf_counter()
        engine.step()
        out["step"].append(1e3 * (time.perf_counter() - t0))
        out["propose"].append(1e3 * (engine.stats.timings.propose - before[0]))
        out["forward"].append(1e3 * (engine.stats.timings.forward - before[1]))
        for name in ("context", "block"):
            out[name].append(self.phases[name] - ph[name])

    def finish(self) -> None:
        while self.engine.has_unfinished_requests():
            self.engine.step()


def main() -> None:
    from draftwise import LLM
    from draftwise.models.kernels import kernel_threads

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--blocks", type=int, nargs="+", default=[8, 16])
    ap.add_argument("--draft-layers", type=int, default=5)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--format", choices=("bf16", "gguf-q8_0"), default="bf16",
                    help="the drafter as a bf16 safetensors dir or a Q8_0 dflash GGUF")
    args = ap.parse_args()
    prompt = [(i * 37) % 4000 + 100 for i in range(args.context)]
    plain = LLM(model=args.model, max_num_seqs=1)
    report: dict[str, Any] = {
        "model": plain.engine.loaded.path, "format": args.format,
        "context": args.context, "kernel_threads": kernel_threads(),
        "draft_layers": args.draft_layers, "load_avg_start": os.getloadavg()[0],
        "blocks": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        for block in args.blocks:
            d = write_random_drafter(Path(tmp) / f"b{block}", plain.engine.loaded, block,
                                     args.draft_layers)
            if args.format == "gguf-q8_0":
                d = write_q8_0_gguf(d, Path(tmp) / f"b{block}.gguf", plain.engine.loaded)
            llm = LLM(model=args.model, max_num_seqs=1, speculative_config={
                "method": "dflash", "model": str(d), "num_speculative_tokens": block - 1})
            # interleaved: a plain decode step, then a speculative step, so both see the
            # same machine load (other programs share these cores)
            base, spec = Timed(plain, prompt, args.steps), Timed(llm, prompt, args.steps)
            for _ in range(args.steps):
                base.step()
                spec.step()
            base.finish()
            spec.finish()
            b, t = base.out, spec.out
            decode = statistics.median(b["forward"])
            draft, verify = statistics.median(t["propose"]), statistics.median(t["forward"])
            ctx, blk = statistics.median(t["context"]), statistics.median(t["block"])
            ratio = statistics.median(p / f for p, f in zip(t["propose"], b["forward"]))
            need = (draft + verify) / decode - 1
            report["blocks"][str(block)] = {
                "decode_ms": round(decode, 3), "draft_ms": round(draft, 3),
                "verify_ms": round(verify, 3),
                "draft_context_ms": round(ctx, 3), "draft_layers_ms": round(blk, 3),
                "draft_head_and_pick_ms": round(draft - ctx - blk, 3),
                "draft_over_decode": round(ratio, 3),
                "break_even_accepted_per_step": round(need, 2),
                "break_even_acceptance_rate": round(need / (block - 1), 3),
                "accepted_random_drafter": llm.engine.spec.metrics.num_accepted_tokens,
            }
            del llm
    report["load_avg_end"] = os.getloadavg()[0]
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
