"""The draft stage's loader for method ``dspark``: identify, check, load.

``detect`` reads only the draft's own files (cheapest refusal first):

1. the container, through the DFlash plugin's reader (a safetensors directory; EXL3
   refused by name there) or a llama.cpp DSpark GGUF (:mod:`draftwise_dspark.gguf_drafter`,
   whose config is the DeepSpec one it stands for). An NVFP4 directory (ModelOpt or
   compressed-tensors, ``draftwise.formats.nvfp4``) runs: its declaration covers the
   body's Linears and the heads' (``lm_head``, ``markov_w2``, ``gate_proj``,
   ``joint_proj``, ``confidence_head.proj``: :func:`is_linear`), checked against the
   tensors both ways by dflash's rule (:func:`draftwise_dflash.loader.strip_nvfp4`);
   ``embed_tokens`` and ``markov_w1`` are embeddings and stay dense. Packed modules are
   dequantized once at load, as dflash does;
2. the lane from ``architectures`` and the config (:mod:`draftwise_dspark.config`);
3. every tensor name, shape and stored dtype (headers only): the DFlash body
   (:func:`draftwise_dflash.loader.expected_shapes`) plus DeepSpec's ``embed_tokens``,
   ``lm_head``, ``markov_head.*`` (for ``markov_rank > 0``) and ``confidence_head.proj``
   (with ``enable_confidence_head``); the speculators and SpecForge layouts save no
   ``embed_tokens`` and (full vocabulary) no ``lm_head``. A speculators drafter with a
   reduced draft vocabulary (``draft_vocab_size`` below ``vocab_size``) stores
   ``lm_head``/``markov_w2`` with ``draft_vocab_size`` rows and ``d2t``/``t2d``
   (:mod:`draftwise_dspark.draft_vocab`: their dtypes here, their contents at load).

``check_target`` (from the target's header, before it loads) and ``load`` run the DFlash
pair checks on the target-layer taps (``-1``, the embedding output, is always present)
and check the vocabulary is the target's (the draft's own head indexes the target's
tokens, or through ``d2t`` a subset of them) (:func:`check_sizes`); ``load`` then reads the weights
and checks ``d2t``/``t2d`` against each other and the sizes. The embedding and LM head are the
draft's own (DeepSpec ships copies of the target's) or, where the layout saves none, the
target's (:func:`borrow_target_tables`): a quantized target embedding is read through the
target's own ``embed`` (the rows it dequantizes are the target's embedding, exactly), a
quantized target head is refused (a reduced-vocabulary drafter stores its own).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch
from draftwise.kit import DraftCheckpoint, KVLayout, LoadedDraft, TargetHeader, Weight, pack_weights
from draftwise_dflash.loader import (
    DFlashError,
    check_pair,
    expected_shapes,
    read_container,
    strip_nvfp4,
)
from draftwise_dflash.loader import check_sizes as dflash_check_sizes
from draftwise_dflash.loader import is_linear as dflash_is_linear
from draftwise_dflash.model import DFlashModel
from pydantic import BaseModel

from draftwise_dspark import draft_vocab
from draftwise_dspark.confidence import ConfidenceHead
from draftwise_dspark.config import RUNS, SPECFORGE, SPECULATORS, DSparkConfig, parse_config
from draftwise_dspark.draft_vocab import DraftVocab
from draftwise_dspark.markov import MarkovHead, MarkovWeights


class DSparkError(DFlashError):
    """A DSpark drafter this engine cannot use with this target; says why and what works."""


def extra_shapes(cfg: DSparkConfig) -> dict[str, tuple[int, ...]]:
    """DeepSpec's tensors beyond the DFlash body (module doc, rule 3); ``d2t``/``t2d``
    for a reduced draft vocabulary."""
    h, v, r = cfg.backbone.decoder.hidden_size, cfg.vocab_size, cfg.markov_rank
    dv = cfg.draft_vocab_size
    shapes: dict[str, tuple[int, ...]] = {"embed_tokens.weight": (v, h), "lm_head.weight": (dv, h)}
    if dv != v:
        shapes.update(d2t=(dv,), t2d=(v,))
    if r:
        shapes["markov_head.markov_w1.weight"] = (v, r)
        shapes["markov_head.markov_w2.weight"] = (dv, r)
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
        from draftwise.kit import SafetensorsCheckpoint

        gguf_path = _gguf_file(path)
        if gguf_path is not None:
            return self._detect_gguf(gguf_path)
        raw, decl = read_container(path, RUNS)
        cfg = parse_config(raw, os.path.join(path, "config.json"))
        ckpt = SafetensorsCheckpoint(path)
        want = {**expected_shapes(cfg.backbone), **extra_shapes(cfg)}
        if cfg.lane in (SPECULATORS, SPECFORGE):  # the target's embedding and head
            for name, _ in BORROWED:
                if name != "lm_head.weight" or cfg.draft_vocab_size == cfg.vocab_size:
                    del want[name]  # a reduced head is the draft's own (speculators)
        stored = ckpt.tensors
        early = [n for n in stored if n.startswith("logit_head.")]
        if early:
            raise DSparkError(path, f"tensors {early[:2]} are an early SpecForge export (heads "
                                    "under logit_head.), not implemented here. Instead: "
                                    "re-export it with a current SpecForge (specforge export "
                                    "--to hf names them markov_head.* / confidence_head.*)",
                              key=early[0])
        stored, want, packed = strip_nvfp4(decl, stored, want, path, is_linear)
        if decl is not None:
            _refuse_packed_embeddings(decl, stored, path)
        missing = [n for n in want if n not in stored]
        lost = [n for n in draft_vocab.TENSORS if n in missing]
        if lost:
            raise DSparkError(path, f"draft_vocab_size={cfg.draft_vocab_size} is below "
                                    f"vocab_size={cfg.vocab_size}, a reduced draft vocabulary,"
                                    f" but the checkpoint has no {lost[0]!r}: speculators "
                                    "saves d2t and t2d with it, and they say which target "
                                    "token each draft token is", key=lost[0])
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
        ckpt.check_dtypes([n for n in want if n not in draft_vocab.TENSORS])
        for name in draft_vocab.TENSORS:
            if name in want and stored[name].dtype not in draft_vocab.DTYPES[name]:
                raise DSparkError(path, f"tensor {name!r} is stored as {stored[name].dtype}; "
                                        f"speculators writes {draft_vocab.DTYPES[name][0]}",
                                  key=name)
        fmt = "safetensors" if decl is None else f"safetensors (NVFP4, {decl.convention})"
        return DraftCheckpoint(path, fmt, cfg.lane, {
            "block_size": cfg.block_size,
            "target_layer_ids": list(cfg.backbone.target_layer_ids),
            "hidden_size": cfg.backbone.decoder.hidden_size,
            "num_hidden_layers": cfg.backbone.decoder.num_hidden_layers,
            "dspark": cfg,
            "nvfp4": None if decl is None else (decl, packed),
        })

    def _detect_gguf(self, path: str) -> DraftCheckpoint:
        """A llama.cpp DSpark GGUF (:mod:`draftwise_dspark.gguf_drafter`): the DeepSpec
        config it stands for, the body's tensors through the dflash reader, the heads'
        shapes here."""
        from draftwise.kit import GGUFCheckpoint
        from draftwise_dflash.gguf_drafter import check_tensors

        from draftwise_dspark.gguf_drafter import NATIVE_NAMES, BodyView, native_config

        ckpt = GGUFCheckpoint(path)
        cfg = parse_config(native_config(ckpt, RUNS), path)
        check_tensors(BodyView(ckpt), expected_shapes(cfg.backbone))
        stored = set(ckpt.tensor_names)
        for g, native in NATIVE_NAMES.items():
            if g not in stored:
                continue
            got, want = tuple(ckpt.info(g).shape), extra_shapes(cfg)[native]
            if got != want and not (g == "conf_proj.bias" and got == ()):
                raise DSparkError(path, f"tensor {g!r} has shape {list(got)}, expected "
                                        f"{list(want)} from its metadata", key=g)
        return DraftCheckpoint(path, "gguf", cfg.lane, {
            "block_size": cfg.block_size,
            "target_layer_ids": list(cfg.backbone.target_layer_ids),
            "hidden_size": cfg.backbone.decoder.hidden_size,
            "num_hidden_layers": cfg.backbone.decoder.num_hidden_layers,
            "dspark": cfg,
        })

    def check_target(
        self, checkpoint: DraftCheckpoint, options: BaseModel, target: TargetHeader
    ) -> None:
        """The pair checks the target's header decides, before the target loads."""
        check_sizes(checkpoint.path, checkpoint.config["dspark"], target.hidden_size,
                    target.num_hidden_layers, target.vocab_size)

    def load(self, checkpoint: DraftCheckpoint, options: BaseModel, target: Any) -> LoadedDraft:
        """The drafter with its own embedding and head (pair checks first)."""
        from draftwise.kit import SafetensorsCheckpoint

        cfg: DSparkConfig = checkpoint.config["dspark"]
        tc = target.config
        check_sizes(checkpoint.path, cfg, int(tc.hidden_size), int(tc.num_hidden_layers),
                    int(tc.vocab_size))
        taps = tuple(i for i in cfg.backbone.target_layer_ids if i >= 0)
        mask = check_pair(checkpoint.path, replace(cfg.backbone, target_layer_ids=taps), target)
        model = target.model
        notes = ""
        dvocab: DraftVocab | None = None  # a reduced draft vocabulary (speculators)
        if checkpoint.format == "gguf":
            body, extra = _read_gguf(checkpoint.path, cfg, target)
        else:
            nv = checkpoint.config.get("nvfp4")
            ckpt = SafetensorsCheckpoint(checkpoint.path)
            body, extra = _read_safetensors(ckpt, cfg, nv, model.dtype, model.device)
            if cfg.draft_vocab_size != cfg.vocab_size:
                dvocab = _read_draft_vocab(ckpt, cfg)
            if nv is not None:
                notes = (f"; {len(nv[1])} NVFP4 modules dequantized to "
                         f"{str(model.dtype).removeprefix('torch.')} (as dflash)")
        borrow_target_tables(extra, target, checkpoint.path)
        dc = cfg.backbone.decoder
        return LoadedDraft(
            weights=LoadedDSpark(
                cfg, DFlashModel(cfg.backbone, body, model.dtype, model.device, model.backend),
                mask, extra, checkpoint.path, dvocab,
                None if "embed_tokens.weight" in extra else model.embed),
            kv_layout=KVLayout(dc.num_hidden_layers, dc.num_key_value_heads, dc.head_dim,
                               model.dtype),
            hidden_layers=taps,
            max_model_len=dc.max_position_embeddings,
            summary=(f"DSpark ({cfg.lane}), block {cfg.block_size}, {dc.num_hidden_layers} "
                     f"layers, taps {list(cfg.backbone.target_layer_ids)}, markov "
                     f"{cfg.markov_head_type if cfg.markov_rank else 'off'} rank "
                     f"{cfg.markov_rank}, mask {mask}"
                     + ("" if dvocab is None else f", draft vocabulary {dvocab.size} of {int(tc.vocab_size)}")
                     + notes),
        )


#: DeepSpec's Linear modules beyond the body's (``markov_w1`` and ``embed_tokens`` are
#: embeddings, which NVFP4 exporters leave dense)
HEAD_LINEARS = frozenset({"lm_head.weight", "markov_head.markov_w2.weight",
                          "confidence_head.proj.weight"})


def check_sizes(path: str, cfg: DSparkConfig, hidden_size: int, num_layers: int,
                vocab: int) -> None:
    """DFlash's header pair checks on the target-layer taps (``-1``, the embedding output,
    is always present), then the vocabulary: the draft's own head indexes the target's
    tokens. Run by ``check_target`` before the target loads and again by ``load``."""
    taps = tuple(i for i in cfg.backbone.target_layer_ids if i >= 0)
    dflash_check_sizes(path, replace(cfg.backbone, target_layer_ids=taps), hidden_size,
                       num_layers, vocab)
    if cfg.vocab_size != vocab:
        raise DSparkError(
            path,
            f"the drafter's vocab_size is {cfg.vocab_size} and the target's {vocab}: its "
            "lm_head and Markov head index the target's tokens. Instead: the DSpark "
            "drafter trained for this target.", key="vocab_size")
    if not taps:
        raise DSparkError(path, "target_layer_ids taps only the embedding "
                          "output (-1); at least one target layer is needed",
                          key="target_layer_ids")


def is_linear(name: str) -> bool:
    """What an NVFP4 declaration covers here: the DFlash body's Linears (``fc``,
    ``*_proj``, which takes in ``gate_proj`` and ``joint_proj``) and the heads'."""
    return name in HEAD_LINEARS or dflash_is_linear(name)


def _refuse_packed_embeddings(decl: Any, stored: dict[str, Any], path: str) -> None:
    """``embed_tokens`` and ``markov_w1`` are embeddings (row gathers): NVFP4 exporters
    quantize Linear modules only and list no embedding among their exclusions, so these
    are read dense; a packed one is named rather than reported as stray tensors."""
    from draftwise.kit import nvfp4 as nvfp4_format

    for emb in ("embed_tokens", "markov_head.markov_w1"):
        found = [f"{emb}.{sfx}" for sfx in nvfp4_format.SUFFIXES[decl.convention][1:]
                 if f"{emb}.{sfx}" in stored]
        if found or f"{emb}.weight_packed" in stored:
            raise DSparkError(path, f"{emb} is stored NVFP4-packed ({(found or [emb])[0]}): it "
                                    "is an embedding, and NVFP4 is read here for Linear "
                                    "modules only (ModelOpt and compressed-tensors quantize "
                                    f"no embedding). Instead: re-export with {emb} in "
                                    "bf16/fp16.", key=emb)


def _read_safetensors(ckpt: Any, cfg: DSparkConfig, nv: Any, dtype: torch.dtype,
                      device: torch.device) -> tuple[Any, dict[str, torch.Tensor]]:
    """The body through the dflash reader and the heads by name; ``nv``: detect's
    (declaration, packed modules), each packed module dequantized by dflash's reader
    (the body's inside :func:`read_weights`, the heads' here)."""
    from draftwise_dflash.loader import dequantized, read_weights

    body_names = expected_shapes(cfg.backbone)
    packed: dict[str, str] = {} if nv is None else nv[1]
    body_packed = {m: k for m, k in packed.items() if f"{m}.weight" in body_names}
    head_packed = {m: k for m, k in packed.items() if m not in body_packed}
    keep = set(body_names)
    if nv is not None:
        from draftwise.kit import nvfp4 as nvfp4_format

        keep |= nvfp4_format.side_tensors(nv[0], body_packed)
    body = read_weights(_Only(ckpt, keep), cfg.backbone, dtype, device,
                        None if nv is None else (nv[0], body_packed))
    plain = [n for n in extra_shapes(cfg) if n in ckpt.tensors and n not in draft_vocab.TENSORS
             and n.removesuffix(".weight") not in head_packed]
    extra = {n: x.to(dtype=dtype, device=device) for n, x in ckpt.iter_tensors(plain)}
    if head_packed:
        extra.update(dequantized(ckpt, nv[0], head_packed, dtype, device))
    return body, extra


def _read_draft_vocab(ckpt: Any, cfg: DSparkConfig) -> DraftVocab:
    """``d2t``/``t2d`` as stored (integers and bools: never cast), checked
    (:func:`draftwise_dspark.draft_vocab.from_speculators`)."""
    t = dict(ckpt.iter_raw(list(draft_vocab.TENSORS)))
    try:
        return draft_vocab.from_speculators(t["d2t"], t["t2d"], cfg.draft_vocab_size,
                                            cfg.vocab_size)
    except draft_vocab.DraftVocabError as e:
        raise DSparkError(ckpt.path, f"{e}. Instead: the d2t/t2d speculators saved with this "
                                     "drafter.", key=e.key) from None


def _gguf_file(path: str) -> str | None:
    """A ``.gguf`` file, or the one in a directory without ``config.json``."""
    if os.path.isfile(path):
        return path
    if os.path.isdir(path) and not os.path.isfile(os.path.join(path, "config.json")):
        found = sorted(f for f in os.listdir(path) if f.endswith(".gguf"))
        if len(found) > 1:
            raise DSparkError(path, f"holds {len(found)} .gguf files; name the one to use")
        if found:
            return os.path.join(path, found[0])
    return None


def _read_gguf(path: str, cfg: DSparkConfig, target: Any) -> tuple[Any, dict[str, torch.Tensor]]:
    """The body through the dflash GGUF reader, the heads (and the target's embedding and
    head where the GGUF has none) under their DeepSpec names."""
    from draftwise.kit import GGUFCheckpoint
    from draftwise_dflash.gguf_drafter import check_tensors, read_gguf_weights

    from draftwise_dspark.gguf_drafter import BodyView, head_tensors

    ckpt = GGUFCheckpoint(path)
    view = BodyView(ckpt)
    model = target.model
    found = check_tensors(view, expected_shapes(cfg.backbone))
    body, _notes = read_gguf_weights(view, cfg.backbone, found, model.dtype, model.device)
    return body, head_tensors(ckpt, model.dtype, model.device)


#: the draft tables a layout may leave to the target: DeepSpec name, target attribute
BORROWED = (("embed_tokens.weight", "embed_weight"), ("lm_head.weight", "lm_head_weight"))


def borrow_target_tables(t: dict[str, torch.Tensor], target: Any, path: str) -> None:
    """The target's embedding and LM head for those ``t`` lacks (the speculators layout
    never saves the embedding and drops a full-vocabulary head; llama.cpp's converter
    drops the head). A quantized target embedding is not put in ``t``: the draft then
    embeds its block through the target's own ``embed`` (which dequantizes the rows it
    reads: the very vectors the target embeds, so nothing is widened or approximated;
    :class:`LoadedDSpark`). A quantized target head is refused: a DSpark draft runs its
    head as a dense packed matrix and does not widen a quantized one."""
    model = target.model
    for name, attr in BORROWED:
        if name in t:
            continue
        w = getattr(model, attr, None)
        if isinstance(w, torch.Tensor) and w.dtype in (torch.bfloat16, torch.float16,
                                                       torch.float32):
            t[name] = w.detach().to(dtype=model.dtype, device=model.device)
            continue
        if name != "embed_tokens.weight":  # the embedding: LoadedDSpark uses model.embed
            raise DSparkError(
                path, f"the drafter stores no {name}, so the target's is needed, and the "
                      "target's is quantized: a DSpark draft reads a dense table and does not "
                      "widen a quantized one. Instead: a bf16/fp16 target, a drafter with its "
                      f"own reduced-vocabulary lm_head (d2t/t2d), or {RUNS}.",
                key=name)


class _Only:
    """A checkpoint view holding only ``names`` (the DFlash reader reads every tensor)."""

    def __init__(self, ckpt: Any, names: Any) -> None:
        self._ckpt = ckpt
        self.path = ckpt.path
        self.tensors = {n: t for n, t in ckpt.tensors.items() if n in names}

    def iter_tensors(self, names: list[str]) -> Any:
        return self._ckpt.iter_tensors(names)


class LoadedDSpark:
    """What the proposer gets: backbone, mask id, own embedding/head, Markov and
    confidence heads."""

    def __init__(self, cfg: DSparkConfig, model: DFlashModel, mask_token_id: int,
                 t: dict[str, torch.Tensor], path: str = "",
                 vocab: DraftVocab | None = None,
                 target_embed: Callable[[torch.Tensor], torch.Tensor] | None = None) -> None:
        self.cfg, self.model, self.mask_token_id = cfg, model, mask_token_id
        self.path = path
        #: a reduced draft vocabulary (lm_head and W2 rows are draft indices), or None
        self.vocab = vocab
        #: the draft's embedding table, or None: the target's own ``embed`` (a quantized
        #: target table the layout borrows, :func:`borrow_target_tables`)
        self.embed: torch.Tensor | None = t.get("embed_tokens.weight")
        self.target_embed = target_embed
        if self.embed is None and target_embed is None:
            raise DSparkError(path, "no embed_tokens and no target embedding to borrow",
                              key="embed_tokens.weight")
        # the heads' matrices in the native kernel's layout (the gate and the rnn's joint
        # projection too: one row-invariant GEMM per Markov step instead of torch's bf16)
        heads = ["lm_head.weight"]
        if cfg.markov_rank:
            heads += [n for n in ("markov_head.markov_w2.weight", "markov_head.gate_proj.weight",
                                  "markov_head.joint_proj.weight") if n in t]
        packed = dict(zip(heads, pack_weights([t[n] for n in heads])))
        self.lm_head = packed["lm_head.weight"]
        self.markov: MarkovHead | None = None
        if cfg.markov_rank:
            def pair(name: str) -> tuple[Weight, torch.Tensor] | None:
                w = packed.get(f"markov_head.{name}.weight")
                return None if w is None else (w, t[f"markov_head.{name}.bias"])

            self.markov = MarkovHead(MarkovWeights(
                cfg.markov_head_type, t["markov_head.markov_w1.weight"],
                packed["markov_head.markov_w2.weight"],
                gate=pair("gate_proj"), joint=pair("joint_proj"), vocab=vocab))
        self.confidence: ConfidenceHead | None = None
        if cfg.enable_confidence_head:
            with_w1 = cfg.confidence_head_with_markov and cfg.markov_rank
            self.confidence = ConfidenceHead(
                t["confidence_head.proj.weight"], t["confidence_head.proj.bias"],
                t["markov_head.markov_w1.weight"] if with_w1 else None)

    def embed_ids(self, ids: torch.Tensor) -> torch.Tensor:  # [N] -> [N, H]
        """The block's input embeddings: the draft's table, or the target's ``embed``."""
        if self.embed is not None:
            return torch.nn.functional.embedding(ids, self.embed)
        embed = self.target_embed
        if embed is None:
            raise RuntimeError("LoadedDSpark without an embedding")
        return embed(ids)


__all__ = ["DSparkError", "DSparkLoader", "LoadedDSpark", "extra_shapes"]
