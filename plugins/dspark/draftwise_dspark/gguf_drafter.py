"""DSpark drafters stored as GGUF, in llama.cpp mainline's layout.

llama.cpp has no DSpark architecture of its own: a DSpark GGUF is a ``dflash`` GGUF
(``draftwise_dflash.gguf_drafter``: metadata, ``blk.N.*``, ``fc``, norms) plus the
heads of ``src/llama-arch.cpp`` ``LLM_TENSOR_DSPARK_*`` (``conversion/qwen.py``
``DSparkModel`` writes them; ``common/speculative.cpp`` tells it from DFlash by
``markov_w1.weight`` alone):

- ``markov_w1.weight`` ``[V, r]`` and ``markov_w2.weight`` ``[V_draft, r]``: the vanilla
  Markov head (the converter refuses gated and rnn, which have no GGUF names);
- optional ``conf_proj.weight`` ``[1, H + r]`` and ``conf_proj.bias``: the confidence
  head, always reading ``W1[prev]`` (llama.cpp's graph concatenates it);
- optional ``token_embd.weight`` (the draft's own embedding; DeepSpec ships a copy of
  the target's) and ``output.weight`` (the converter drops a full-vocabulary
  ``lm_head``: the target's head is used);
- keys ``dflash.sample_from_anchor`` (true: DeepSpec's next-token block, all B slots
  draft) and ``dflash.has_confidence_head``; ``d2t`` (absolute target ids) for a reduced
  draft vocabulary.

Refused by name: ``sample_from_anchor`` false (the bonus-anchor block of EAGLE-style
exports), ``d2t`` (a reduced draft vocabulary), ``markov_w2.scale``, a GGUF without
``markov_w1`` (a DFlash drafter: method ``dflash``). :func:`native_config` gives the
DeepSpec ``config.json`` this file stands for, so one config reader serves both.
"""

from __future__ import annotations

from typing import Any

import torch
from draftwise.kit import ModelFormatError
from draftwise_dflash.gguf_drafter import config_dict

from draftwise_dspark.config import NATIVE

#: the DSpark heads and own embedding/head on top of the dflash GGUF tensors
HEAD_TENSORS = ("markov_w1.weight", "markov_w2.weight", "conf_proj.weight", "conf_proj.bias",
                "token_embd.weight", "output.weight")
#: GGUF name -> DeepSpec safetensors name
NATIVE_NAMES = {"markov_w1.weight": "markov_head.markov_w1.weight",
                "markov_w2.weight": "markov_head.markov_w2.weight",
                "conf_proj.weight": "confidence_head.proj.weight",
                "conf_proj.bias": "confidence_head.proj.bias",
                "token_embd.weight": "embed_tokens.weight", "output.weight": "lm_head.weight"}


class DSparkGGUFError(ModelFormatError):
    """A GGUF this loader cannot run as a DSpark drafter; says why and what works."""


class BodyView:
    """The GGUF without the DSpark tensors: what the dflash reader checks and reads."""

    def __init__(self, ckpt: Any) -> None:
        self._ckpt = ckpt
        self.path, self.metadata = ckpt.path, ckpt.metadata
        self.architecture = ckpt.architecture
        self.tensor_names = [n for n in ckpt.tensor_names if n not in HEAD_TENSORS]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ckpt, name)


def native_config(ckpt: Any, runs: str) -> dict[str, Any]:
    """The DeepSpec ``config.json`` this GGUF stands for (module doc), or a refusal."""
    path, meta, names = ckpt.path, ckpt.metadata, set(ckpt.tensor_names)
    if "markov_w1.weight" not in names:
        raise DSparkGGUFError(path, "this GGUF has no markov_w1.weight, so llama.cpp reads it "
                              "as a DFlash drafter, not DSpark. Instead: method 'dflash'.")
    for name, why in (("d2t", "a reduced draft vocabulary (d2t) is not implemented"),
                      ("markov_w2.scale", "a scaled markov_w2 (markov_w2.scale) is not "
                       "implemented")):
        if name in names:
            raise DSparkGGUFError(path, f"{why}. Instead: {runs}.", key=name)
    if not bool(meta.get("dflash.sample_from_anchor", True)):
        raise DSparkGGUFError(
            path, "dflash.sample_from_anchor is false: the bonus-anchor block (slot 0 the "
                  "target's token, B-1 drafts) of EAGLE-style exports is not implemented; "
                  f"DeepSpec's next-token block is. Instead: {runs}.",
            key="dflash.sample_from_anchor")
    d = config_dict(BodyView(ckpt), runs)
    d.update(d.pop("dflash_config"))
    vocab, rank = ckpt.info("markov_w1.weight").shape
    conf = "conf_proj.weight" in names
    if conf != bool(meta.get("dflash.has_confidence_head", conf)):
        raise DSparkGGUFError(path, "dflash.has_confidence_head disagrees with the conf_proj "
                              "tensors stored. Instead: re-convert the drafter.",
                              key="dflash.has_confidence_head")
    d.update(architectures=[NATIVE], vocab_size=int(vocab), markov_rank=int(rank),
             markov_head_type="vanilla", enable_confidence_head=conf,
             confidence_head_with_markov=conf, tie_word_embeddings=False)
    return d


def head_tensors(ckpt: Any, dtype: torch.dtype, device: torch.device
                 ) -> dict[str, torch.Tensor]:
    """The heads (and ``token_embd``/``output`` where stored) under their DeepSpec names;
    the loader takes the target's embedding and head for the ones missing."""
    names = set(ckpt.tensor_names)
    out = {}
    for g, native in NATIVE_NAMES.items():
        if g in names:
            x = torch.from_numpy(ckpt.dequantize(g).copy())
            if g == "conf_proj.weight":
                x = x.reshape(1, -1)
            elif g == "conf_proj.bias":
                x = x.reshape(-1)
            out[native] = x.to(dtype=dtype, device=device)
    return out


__all__ = ["HEAD_TENSORS", "BodyView", "DSparkGGUFError", "head_tensors", "native_config"]
