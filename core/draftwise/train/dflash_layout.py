"""A trained DFlash drafter on disk in z-lab's layout: ``config.json`` + ``model.safetensors``.

Why z-lab's layout and nothing of our own: the dflash plugin, z-lab's ``dflash`` package,
vLLM and SGLang all load it, so ``--speculative-config '{"method": "dflash", "model":
DIR}'`` runs the trained drafter with no conversion (``shared/reference/drafter-formats.md``
§1.1-1.2). The config is a Qwen3 decoder config (the drafter's own shape, at the target's
width) with ``architectures: ["DFlashDraftModel"]``, ``num_target_layers`` at the top
level and ``dflash_config: {block_size, mask_token_id, target_layer_ids}``;
``block_size`` is written at the top level too, equal, for readers of the older schema.
``target_layer_ids`` is always written: a reader's fallback rule guesses other taps. The
weights have no embedding and no LM head: they are the target's.

Both files are written beside their final names and renamed into place, config last, so a
reader never sees weights of one step under the config of another shape.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from draftwise.train.dflash_net import DFlashNet, DFlashShape

CONFIG = "config.json"
WEIGHTS = "model.safetensors"


def config_dict(shape: DFlashShape) -> dict[str, Any]:
    """The drafter's config.json (module doc)."""
    s = shape
    return {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_size": s.hidden_size,
        "num_hidden_layers": s.num_layers,
        "num_attention_heads": s.num_heads,
        "num_key_value_heads": s.num_kv_heads,
        "head_dim": s.head_dim,
        "intermediate_size": s.intermediate_size,
        "hidden_act": "silu",
        "vocab_size": s.vocab_size,
        "max_position_embeddings": s.max_position_embeddings,
        "rms_norm_eps": s.rms_norm_eps,
        "rope_theta": s.rope_theta,
        "rope_scaling": s.rope_scaling,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": False,
        "layer_types": ["full_attention"] * s.num_layers,
        "num_target_layers": s.num_target_layers,
        "block_size": s.block_size,
        "dflash_config": {
            "block_size": s.block_size,
            "mask_token_id": s.mask_token_id,
            "target_layer_ids": list(s.target_layer_ids),
        },
        "torch_dtype": "float32",
    }


def shape_of(config: dict[str, Any]) -> DFlashShape:
    """The shape a saved ``config.json`` describes (the inverse of :func:`config_dict`)."""
    d = config.get("dflash_config") or {}
    return DFlashShape(
        hidden_size=config["hidden_size"], num_layers=config["num_hidden_layers"],
        num_heads=config["num_attention_heads"], num_kv_heads=config["num_key_value_heads"],
        head_dim=config["head_dim"], intermediate_size=config["intermediate_size"],
        vocab_size=config["vocab_size"],
        block_size=int(d.get("block_size") or config["block_size"]),
        target_layer_ids=tuple(d["target_layer_ids"]),
        num_target_layers=config["num_target_layers"], mask_token_id=d["mask_token_id"],
        rms_norm_eps=config["rms_norm_eps"], rope_theta=config["rope_theta"],
        rope_scaling=config.get("rope_scaling"),
        max_position_embeddings=config["max_position_embeddings"])


def save_drafter(net: DFlashNet, out: Path) -> None:
    """The weights, then the config, each renamed into place (module doc)."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().float().contiguous() for k, v in net.state_dict().items()}
    tmp = out / f"{WEIGHTS}.tmp"
    save_file(tensors, str(tmp), metadata={"format": "pt"})
    os.replace(tmp, out / WEIGHTS)
    write_json(out / CONFIG, config_dict(net.shape))


def load_weights(net: DFlashNet, out: Path) -> None:
    """The saved weights back into ``net`` (names and shapes must match exactly)."""
    from safetensors.torch import load_file

    net.load_state_dict(load_file(str(out / WEIGHTS)), strict=True)


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Atomic JSON write (a reader sees the old file or the new one)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)


__all__ = ["CONFIG", "WEIGHTS", "config_dict", "load_weights", "save_drafter", "shape_of",
           "write_json"]
