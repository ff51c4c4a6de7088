"""Build a tiny random GDN-hybrid checkpoint (Qwen3.5 or Qwen3-Next) with an MTP head.

The target is saved by transformers itself (``save_pretrained``), so its tensor names,
shapes and config keys are the real ones; every weight is re-drawn so none is a no-op.
transformers has no MTP module, so the ``mtp.*`` tensors (drafter-formats §3.1: ``fc``,
``pre_fc_norm_{embedding,hidden}``, ``norm`` and one full-attention layer) are added to
the safetensors file afterwards, and ``mtp_num_hidden_layers`` to ``config.json``.

    python3 scripts/build_tiny_hybrid.py /tmp/tiny-hybrid [--kind qwen3_next] [--no-mtp]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

TINY = {
    "hidden_size": 64,
    "num_hidden_layers": 4,  # linear, linear, linear, full
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "intermediate_size": 128,
    "vocab_size": 256,
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-6,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "linear_conv_kernel_dim": 4,
    "tie_word_embeddings": False,
}


def _draw(name: str, shape: tuple[int, ...], gen: torch.Generator, std: float) -> torch.Tensor:
    """Norms near their neutral value, GDN decay parameters in a realistic range."""
    noise = torch.randn(shape, generator=gen)
    if name.endswith("A_log"):
        return torch.rand(shape, generator=gen).mul(4).add(0.5).log()
    if name.endswith("dt_bias"):
        return 0.5 * noise
    if name.endswith("linear_attn.norm.weight"):  # plain w·x̂
        return 1.0 + 0.1 * noise
    if "norm" in name:  # zero-centred x̂·(1 + w)
        return 0.1 * noise
    return std * noise


def randomize_(model: torch.nn.Module, seed: int, std: float = 0.08) -> None:
    """Re-draw every parameter of a transformers model in place."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(_draw(name, tuple(p.shape), gen, std))


def mtp_tensors(
    hidden: int, heads: int, kv_heads: int, head_dim: int, inter: int, seed: int
) -> dict[str, torch.Tensor]:
    """The 15 tensors of a dense Qwen3.5 MTP head (one full-attention layer)."""
    gen = torch.Generator().manual_seed(seed + 1000)
    shapes = {
        "mtp.fc.weight": (hidden, 2 * hidden),
        "mtp.pre_fc_norm_embedding.weight": (hidden,),
        "mtp.pre_fc_norm_hidden.weight": (hidden,),
        "mtp.norm.weight": (hidden,),
        "mtp.layers.0.input_layernorm.weight": (hidden,),
        "mtp.layers.0.post_attention_layernorm.weight": (hidden,),
        "mtp.layers.0.self_attn.q_proj.weight": (2 * heads * head_dim, hidden),
        "mtp.layers.0.self_attn.k_proj.weight": (kv_heads * head_dim, hidden),
        "mtp.layers.0.self_attn.v_proj.weight": (kv_heads * head_dim, hidden),
        "mtp.layers.0.self_attn.o_proj.weight": (hidden, heads * head_dim),
        "mtp.layers.0.self_attn.q_norm.weight": (head_dim,),
        "mtp.layers.0.self_attn.k_norm.weight": (head_dim,),
        "mtp.layers.0.mlp.gate_proj.weight": (inter, hidden),
        "mtp.layers.0.mlp.up_proj.weight": (inter, hidden),
        "mtp.layers.0.mlp.down_proj.weight": (hidden, inter),
    }
    return {name: _draw(name, shape, gen, 0.08).contiguous() for name, shape in shapes.items()}


def build(directory: str | Path, kind: str = "qwen3_5", seed: int = 0, mtp: bool = True) -> Path:
    """Save a tiny ``kind`` (``qwen3_5`` or ``qwen3_next``) hybrid to ``directory``."""
    import transformers

    directory = Path(directory)
    if kind == "qwen3_5":
        config = transformers.Qwen3_5TextConfig(**TINY)
    elif kind == "qwen3_next":
        config = transformers.Qwen3NextConfig(**TINY, num_experts=0)
    else:
        raise ValueError(f"kind {kind!r}: use qwen3_5 or qwen3_next")
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config)
    randomize_(model, seed)
    model.save_pretrained(directory, safe_serialization=True)
    if mtp:
        file = directory / "model.safetensors"
        tensors = load_file(str(file))
        tensors.update(
            mtp_tensors(
                TINY["hidden_size"],
                TINY["num_attention_heads"],
                TINY["num_key_value_heads"],
                TINY["head_dim"],
                TINY["intermediate_size"],
                seed,
            )
        )
        save_file(tensors, str(file), metadata={"format": "pt"})
        cfg_file = directory / "config.json"
        cfg = json.loads(cfg_file.read_text())
        cfg["mtp_num_hidden_layers" if kind == "qwen3_5" else "num_nextn_predict_layers"] = 1
        cfg_file.write_text(json.dumps(cfg, indent=2))
    return directory


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory")
    parser.add_argument("--kind", default="qwen3_5", choices=("qwen3_5", "qwen3_next"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-mtp", action="store_true")
    args = parser.parse_args()
    print(build(args.directory, args.kind, args.seed, mtp=not args.no_mtp))


if __name__ == "__main__":
    main()
