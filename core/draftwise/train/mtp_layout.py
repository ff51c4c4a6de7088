"""A trained MTP head on disk in the layout the mtp plugin loads by ``"model"``.

Why DeepSeek's ``nextn`` layout and not Qwen3.5's ``mtp.*``: the plugin reads ``mtp.*``
into a gated hybrid layer (``HybridLayer``), which only a GDN-hybrid target has, and a
hybrid target cannot be recorded by ``train data``; for a llama-family target it builds
the head from ``model.layers.{L}.{eh_proj, enorm, hnorm, shared_head.norm}`` plus a
llama decoder block at the same prefix (``L`` = the target's ``num_hidden_layers``:
``draftwise_mtp.head.detect_layout`` looks there). No ``shared_head.head`` is written, so
the plugin uses the target's LM head, as training did; no embedding either (the target's).

``config.json`` carries what the plugin checks (``hidden_size``, ``vocab_size`` against the
target; ``num_hidden_layers`` = ``L`` for the prefix; ``num_nextn_predict_layers`` = 1, so k
defaults to 1 and any k is allowed) and the decoder's shape. Weights first, config last,
each renamed into place, as ``dflash_layout``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from draftwise.train.dflash_layout import CONFIG, WEIGHTS, write_json
from draftwise.train.mtp_net import MtpNet, MtpShape


def prefix(shape: MtpShape) -> str:
    """Where the plugin looks for the head's tensors."""
    return f"model.layers.{shape.num_target_layers}."


def config_dict(shape: MtpShape) -> dict[str, Any]:
    """The head's config.json (module doc)."""
    s = shape
    return {
        "architectures": ["DraftwiseMtpHead"],
        "model_type": "llama",
        "hidden_size": s.hidden_size,
        "vocab_size": s.vocab_size,
        "num_hidden_layers": s.num_target_layers,
        "num_nextn_predict_layers": 1,
        "num_attention_heads": s.num_heads,
        "num_key_value_heads": s.num_kv_heads,
        "head_dim": s.head_dim,
        "intermediate_size": s.intermediate_size,
        "hidden_act": "silu",
        "rms_norm_eps": s.rms_norm_eps,
        "rope_theta": s.rope_theta,
        "rope_scaling": s.rope_scaling,
        "max_position_embeddings": s.max_position_embeddings,
        "attention_bias": s.attention_bias,
        "draftwise_mtp": {
            "layout": "deepseek_nextn",
            "reads": f"the target's layer {s.num_target_layers - 1} output, before its "
                     "final norm",
        },
        "torch_dtype": "float32",
    }


def save_head(net: MtpNet, out: Path) -> None:
    """The weights under the plugin's prefix, then the config (module doc)."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    p = prefix(net.shape)
    tensors = {p + k: v.detach().float().contiguous() for k, v in net.state_dict().items()}
    tmp = out / f"{WEIGHTS}.tmp"
    save_file(tensors, str(tmp), metadata={"format": "pt"})
    os.replace(tmp, out / WEIGHTS)
    write_json(out / CONFIG, config_dict(net.shape))


__all__ = ["config_dict", "prefix", "save_head"]
