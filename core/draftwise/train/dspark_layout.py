"""A trained DSpark drafter on disk in speculators' ``DSparkSpeculator`` layout.

Why speculators' layout: it is the one DSpark layout with a reduced draft vocabulary
(``d2t``/``t2d``), and the dspark plugin, vLLM and speculators load it, so
``--speculative-config '{"method": "dspark", "model": DIR}'`` runs the trained drafter
with no conversion (``shared/reference/drafter-formats.md`` §2.3, §5.1). What is written:

- ``config.json``: ``speculators_model_type: "dspark"``, ``architectures:
  ["DSparkSpeculator"]``, the draft decoder as ``transformer_layer_config`` (a Qwen3
  config at the target's width, its own depth, the TARGET's ``vocab_size``),
  ``draft_vocab_size``, ``block_size``, ``mask_token_id``, ``aux_hidden_state_layer_ids``
  = the data's taps + 1 (speculators index HF's ``hidden_states``, 0 the embedding
  output; written explicitly, never left to a reader's fallback), ``sample_from_anchor:
  true`` (next-token blocks), the Markov and confidence keys, and
  ``speculators_config.verifier`` (``name_or_path``: the target as the run was given it;
  ``architectures``: its config's, empty for a GGUF target). speculators' config schema
  requires ``verifier`` (its ``SpeculatorsConfig`` refuses a config without it) and its
  loader reads the embedding, which the layout does not save, from that path;
- ``model.safetensors`` (bf16, as the engine runs a drafter): the body, ``lm_head`` =
  the target's head rows at the draft ids (``[Vd, H]``), ``markov_head.*``,
  ``confidence_head.proj.*``, ``d2t`` (int64 offsets: draft index ``i`` is target id
  ``i + d2t[i]``) and ``t2d`` (bool over the target's vocabulary). No ``embed_tokens``:
  speculators never saves it, the engine borrows the target's. A draft vocabulary of the
  target's whole size saves no ``lm_head``, ``d2t`` or ``t2d`` (speculators' rule: the
  engine borrows the target's head, which it refuses when that head is quantized).

Weights are written and renamed into place before the config, as ``dflash_layout.py``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from draftwise.train.dflash_layout import CONFIG, WEIGHTS, write_json
from draftwise.train.dspark_net import DSparkNet


def verifier_dict(target: str) -> dict[str, Any]:
    """``speculators_config.verifier`` (module doc): the target's path and architectures."""
    cfg = Path(target) / CONFIG
    arch = list(json.loads(cfg.read_text()).get("architectures") or []) if cfg.is_file() else []
    return {"name_or_path": target, "architectures": arch}


def config_dict(net: DSparkNet, target: str) -> dict[str, Any]:
    """The drafter's config.json (module doc); ``target``: the target's path."""
    s = net.shape
    layer = {
        "model_type": "qwen3", "hidden_size": s.hidden_size,
        "num_hidden_layers": s.num_layers, "num_attention_heads": s.num_heads,
        "num_key_value_heads": s.num_kv_heads, "head_dim": s.head_dim,
        "intermediate_size": s.intermediate_size, "hidden_act": "silu",
        "vocab_size": s.vocab_size, "max_position_embeddings": s.max_position_embeddings,
        "rms_norm_eps": s.rms_norm_eps, "rope_theta": s.rope_theta,
        "rope_scaling": s.rope_scaling, "attention_bias": False, "attention_dropout": 0.0,
        "tie_word_embeddings": False, "layer_types": ["full_attention"] * s.num_layers,
    }
    return {
        "speculators_model_type": "dspark",
        "architectures": ["DSparkSpeculator"],
        "transformer_layer_config": layer,
        "draft_vocab_size": net.draft_vocab,
        "block_size": s.block_size,
        "target_hidden_size": s.hidden_size,
        "aux_hidden_state_layer_ids": [t + 1 for t in s.target_layer_ids],
        "mask_token_id": s.mask_token_id,
        "sliding_window_non_causal": False,
        "sample_from_anchor": True,
        "markov_rank": net.markov_rank,
        "markov_head_type": "vanilla",
        "enable_confidence_head": True,
        "confidence_head_with_markov": True,
        "speculators_config": {
            "algorithm": "dspark", "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy",
                                  "speculative_tokens": s.block_size}],
            "verifier": verifier_dict(target),
        },
        "torch_dtype": "bfloat16",
    }


def drafter_tensors(net: DSparkNet, head: torch.Tensor,  # [V, H] the target's head
                    draft_ids: torch.Tensor,  # [Vd] ascending target ids
                    ) -> dict[str, torch.Tensor]:
    """Everything ``model.safetensors`` holds (module doc)."""
    out = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in net.state_dict().items()}
    vd, v = draft_ids.shape[0], head.shape[0]
    if vd == v:  # the whole vocabulary: speculators saves no head and no map
        return out
    out["lm_head.weight"] = head.index_select(0, draft_ids).to(torch.bfloat16).contiguous()
    out["d2t"] = (draft_ids - torch.arange(vd)).to(torch.int64).contiguous()
    t2d = torch.zeros(v, dtype=torch.bool)
    t2d[draft_ids] = True
    out["t2d"] = t2d
    return out


def save_drafter(net: DSparkNet, head: torch.Tensor, draft_ids: torch.Tensor,
                 out: Path, target: str) -> None:
    """The weights, then the config, each renamed into place (module doc)."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f"{WEIGHTS}.tmp"
    save_file(drafter_tensors(net, head, draft_ids), str(tmp), metadata={"format": "pt"})
    os.replace(tmp, out / WEIGHTS)
    write_json(out / CONFIG, config_dict(net, target))


def read_config(out: Path) -> dict[str, Any]:
    """A saved drafter's config.json."""
    return dict(json.loads((out / CONFIG).read_text()))


__all__ = ["config_dict", "drafter_tensors", "read_config", "save_drafter", "verifier_dict"]
