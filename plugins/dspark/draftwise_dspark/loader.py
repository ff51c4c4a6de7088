"""The draft stage's loader for method ``dspark``: identify, check, load.

``detect`` reads only the draft's own files (cheapest refusal first):

1. the container, through the DFlash plugin's reader (a safetensors directory; EXL3
   refused by name there); an NVFP4 or GGUF DSpark drafter is refused by name here
   (not implemented for dspark yet);
2. the lane from ``architectures`` and the config (:mod:`draftwise_dspark.config`);
3. every tensor name, shape and stored dtype (headers only): the DFlash body
   (:func:`draftwise_dflash.loader.expected_shapes`) plus DeepSpec's ``embed_tokens``,
   ``lm_head``, ``markov_head.*`` (for ``markov_rank > 0``) and ``confidence_head.proj``
   (with ``enable_confidence_head``).

``load`` runs the DFlash pair checks on the target-layer taps (``-1``, the embedding
output, is always present), checks the vocabulary is the target's (the draft's own head
indexes the target's tokens), then reads the weights. The embedding and LM head are the
draft's own (DeepSpec ships copies of the target's).
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

import torch
from draftwise.models.linear import pack_weights
from draftwise.speculator import DraftCheckpoint, KVLayout, LoadedDraft
from draftwise_dflash.loader import DFlashError, check_pair, expected_shapes, read_container
from draftwise_dflash.model import DFlashModel
from pydantic import BaseModel

from draftwise_dspark.config import RUNS, DSparkConfig, parse_config
from draftwise_dspark.markov import MarkovHead, MarkovWeights


class DSparkError(DFlashError):
    """A DSpark drafter this engine cannot use with this target; says why and what works."""


def extra_shapes(cfg: DSparkConfig) -> dict[str, tuple[int, ...]]:
    """DeepSpec's tensors beyond the DFlash body (module doc, rule 3)."""
    h, v, r = cfg.backbone.decoder.hidden_size, cfg.vocab_size, cfg.markov_rank
    shapes: dict[str, tuple[int, ...]] = {"embed_tokens.weight": (v, h), "lm_head.weight": (v, h)}
    if r:
        shapes["markov_head.markov_w1.weight"] = (v, r)
        shapes["markov_head.markov_w2.weight"] = (v, r)
        if cfg.markov_head_type == "gated":
            shapes["markov_head.gate_proj.weight"] = (r, h + r)
            shapes["markov_head.gate_proj.bias"] = (r,)
        elif cfg.markov_head_type == "rnn":
            shapes["markov_head.joint_proj.weight"] = (3 * r, 2 * r + h)
            shapes["markov_head.joint_proj.bias"] = (3 * r,)
    if cfg.enable_confidence_head:
        width = h + (r if cfg.confidence_head_with_markov and r else 0)
        shapes["confidence_head.proj.weight"] = (1, width)
        shapes["confidence_head.proj.bias"] = (1,)
    return shapes


class DSparkLoader:
    """``Loader`` for DeepSpec native DSpark drafters."""

    def detect(self, path: str) -> DraftCheckpoint:
        """Container, lane/config and tensor headers (module doc, rules 1-3)."""
        from draftwise.formats.safetensors_dir import SafetensorsCheckpoint

        if os.path.isfile(path) or (os.path.isdir(path) and not os.path.isfile(
                os.path.join(path, "config.json"))
                and any(f.endswith(".gguf") for f in os.listdir(path))):
            raise DSparkError(path, f"a GGUF DSpark drafter is not implemented yet. "
                                    f"Instead: {RUNS}.")
        raw, decl = read_container(path, RUNS)
        cfg = parse_config(raw, os.path.join(path, "config.json"))
        if decl is not None:
            raise DSparkError(path, f"an NVFP4 DSpark drafter is not implemented yet. "
                                    f"Instead: {RUNS}.", key="quantization_config")
        ckpt = SafetensorsCheckpoint(path)
        want = {**expected_shapes(cfg.backbone), **extra_shapes(cfg)}
        stored = ckpt.tensors
        missing = [n for n in want if n not in stored]
        if missing:
            raise DSparkError(path, f"missing tensors {missing[:4]} (config.json: markov_rank="
                                    f"{cfg.markov_rank}, markov_head_type="
                                    f"{cfg.markov_head_type!r})", key=missing[0])
        extra = [n for n in stored if n not in want]
        if extra:
            raise DSparkError(path, f"unexpected tensors {extra[:4]} for config.json's "
                                    f"markov_head_type={cfg.markov_head_type!r}, markov_rank="
                                    f"{cfg.markov_rank}", key=extra[0])
        for name, shape in want.items():
            got = tuple(stored[name].shape)
            if got != shape:
                raise DSparkError(path, f"tensor {name!r} has shape {list(got)}, expected "
                                        f"{list(shape)} from config.json", key=name)
        ckpt.check_dtypes(list(want))
        return DraftCheckpoint(path, "safetensors", cfg.lane, {
            "block_size": cfg.block_size,
            "target_layer_ids": list(cfg.backbone.target_layer_ids),
            "hidden_size": cfg.backbone.decoder.hidden_size,
            "num_hidden_layers": cfg.backbone.decoder.num_hidden_layers,
            "dspark": cfg,
        })

    def load(self, checkpoint: DraftCheckpoint, options: BaseModel, target: Any) -> LoadedDraft:
        """The drafter with its own embedding and head (pair checks first)."""
        from draftwise.formats.safetensors_dir import SafetensorsCheckpoint
        from draftwise_dflash.loader import read_weights

        cfg: DSparkConfig = checkpoint.config["dspark"]
        taps = tuple(i for i in cfg.backbone.target_layer_ids if i >= 0)
        mask = check_pair(checkpoint.path, replace(cfg.backbone, target_layer_ids=taps), target)
        vocab = int(target.config.vocab_size)
        if cfg.vocab_size != vocab:
            raise DSparkError(
                checkpoint.path,
                f"the drafter's vocab_size is {cfg.vocab_size} and the target's {vocab}: its "
                "lm_head and Markov head index the target's tokens. Instead: the DSpark "
                "drafter trained for this target.", key="vocab_size")
        if not taps:
            raise DSparkError(checkpoint.path, "target_layer_ids taps only the embedding "
                              "output (-1); at least one target layer is needed",
                              key="target_layer_ids")
        model = target.model
        ckpt = SafetensorsCheckpoint(checkpoint.path)
        body = read_weights(_Only(ckpt, expected_shapes(cfg.backbone)), cfg.backbone,
                            model.dtype, model.device)
        extra = {n: x.to(dtype=model.dtype, device=model.device)
                 for n, x in ckpt.iter_tensors(list(extra_shapes(cfg)))}
        dc = cfg.backbone.decoder
        return LoadedDraft(
            weights=LoadedDSpark(
                cfg, DFlashModel(cfg.backbone, body, model.dtype, model.device, model.backend),
                mask, extra),
            kv_layout=KVLayout(dc.num_hidden_layers, dc.num_key_value_heads, dc.head_dim,
                               model.dtype),
            hidden_layers=taps,
            max_model_len=dc.max_position_embeddings,
            summary=(f"DSpark ({cfg.lane}), block {cfg.block_size}, {dc.num_hidden_layers} "
                     f"layers, taps {list(cfg.backbone.target_layer_ids)}, markov "
                     f"{cfg.markov_head_type if cfg.markov_rank else 'off'} rank "
                     f"{cfg.markov_rank}, mask {mask}"),
        )


class _Only:
    """A checkpoint view holding only ``names`` (the DFlash reader reads every tensor)."""

    def __init__(self, ckpt: Any, names: dict[str, Any]) -> None:
        self._ckpt = ckpt
        self.path = ckpt.path
        self.tensors = {n: t for n, t in ckpt.tensors.items() if n in names}

    def iter_tensors(self, names: list[str]) -> Any:
        return self._ckpt.iter_tensors(names)


class LoadedDSpark:
    """What the proposer gets: backbone, mask id, own embedding/head, Markov head."""

    def __init__(self, cfg: DSparkConfig, model: DFlashModel, mask_token_id: int,
                 t: dict[str, torch.Tensor]) -> None:
        self.cfg, self.model, self.mask_token_id = cfg, model, mask_token_id
        self.embed = t["embed_tokens.weight"]
        heads = ["lm_head.weight"]
        if cfg.markov_rank:
            heads.append("markov_head.markov_w2.weight")
        packed = pack_weights([t[n] for n in heads])
        self.lm_head = packed[0]
        self.markov: MarkovHead | None = None
        if cfg.markov_rank:
            def pair(name: str) -> tuple[torch.Tensor, torch.Tensor] | None:
                w = t.get(f"markov_head.{name}.weight")
                return None if w is None else (w, t[f"markov_head.{name}.bias"])

            self.markov = MarkovHead(MarkovWeights(
                cfg.markov_head_type, t["markov_head.markov_w1.weight"], packed[1],
                gate=pair("gate_proj"), joint=pair("joint_proj")))


__all__ = ["DSparkError", "DSparkLoader", "LoadedDSpark", "extra_shapes"]
