"""Load one rank's shard of an HF safetensors llama target: each tensor read, sliced, copied.

Every rank runs the loader's own checks (``plan_hf_dir``), builds its model with the
rank's local config, and streams the checkpoint through :func:`shard_of`, which keeps the
rank's slice of each tensor (rows for column-parallel weights, columns for row-parallel
ones, rows of the vocabulary, the whole of norms and of the row-parallel biases). The
checkpoint is read whole by every rank (safetensors maps it; only the slice is copied), a
simplification stated in ``docs/scaling.md``: a 70B load would read only its slices.
"""

from __future__ import annotations

import torch

from draftwise.models.backend import decide_backend
from draftwise.models.loader import HFPlan, LoadedModel, ProgressFn
from draftwise.models.tp.group import TPGroup
from draftwise.models.tp.model import TPLlamaForCausalLM
from draftwise.models.tp.plan import Split, plan_split, refuse_format

#: projections split by output rows (column-parallel), by their HF name's ending
_COLUMN = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj",
           "mlp.up_proj")
#: projections split by input columns (row-parallel); their biases stay whole
_ROW = ("self_attn.o_proj.weight", "mlp.down_proj.weight")
_VOCAB = ("model.embed_tokens.weight", "lm_head.weight")


def shard_of(name: str, tensor: torch.Tensor, split: Split, rank: int) -> torch.Tensor:
    """Rank ``rank``'s part of the checkpoint tensor ``name`` (a view, not a copy)."""
    n = split.size
    if name in _VOCAB:
        per = split.vocab_per_rank
        return tensor[rank * per : (rank + 1) * per]  # the last rank's may be short
    if name.endswith(_ROW):
        per = tensor.shape[1] // n
        return tensor[:, rank * per : (rank + 1) * per]
    if any(f".{part}." in name for part in _COLUMN):
        per = tensor.shape[0] // n
        return tensor[rank * per : (rank + 1) * per]
    return tensor  # norms (q/k norms are per head-dim), row-parallel biases


def check_target(plan: HFPlan, size: int) -> Split:
    """The split of an HF target, or the refusal of one tensor parallel does not load."""
    if plan.ckpt is None:
        raise refuse_format(size, "a GDN hybrid checkpoint (its recurrent layers are not split)")
    if plan.nvfp4 is not None:
        raise refuse_format(size, "an NVFP4 checkpoint (quantized tensor parallel is not built)")
    return plan_split(plan.config, size)


def load_shard(plan: HFPlan, split: Split, group: TPGroup, dtype: torch.dtype,
               progress: ProgressFn | None = None) -> LoadedModel:
    """This rank's model over ``group``, weights copied and packed for this machine."""
    if plan.ckpt is None:
        raise refuse_format(split.size, "a GDN hybrid checkpoint")
    device = "cpu"
    backend = decide_backend(dtype, device, split.full.head_dim)
    model = TPLlamaForCausalLM(split, group.rank, group, dtype, device, backend)
    slots = model.weight_slots()
    with torch.no_grad():
        for done, (name, tensor) in enumerate(plan.ckpt.iter_tensors(plan.names), 1):
            part = shard_of(name, tensor, split, group.rank)
            slot = slots[name]
            if name in _VOCAB:
                slot[: part.shape[0]].copy_(part)
                slot[part.shape[0] :].zero_()  # the vocabulary's padding
            else:
                slot.copy_(part)
            if progress is not None:
                progress(done, len(plan.names), name)
    model.pack_weights()
    return LoadedModel(model=model, config=plan.config, tokenizer=plan.tokenizer,
                       chat_template=plan.chat_template, eos_token_ids=plan.eos_token_ids,
                       bos_token_id=plan.bos_token_id, path=plan.ckpt.path,
                       format="safetensors")
