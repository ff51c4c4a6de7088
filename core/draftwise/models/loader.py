"""``load_model``: a path (or nothing, for the default model) to a ready target.

Order of work: detect the format, check the architecture from the checkpoint's own
config, check every tensor name, shape and stored type against that config, build the
tokenizer and chat template (:func:`plan_gguf`, :func:`plan_hf_dir`: a broken file is a
named error here), then allocate the model once in the target dtype and stream weights
into it (fused slices, float-to-float cast on copy). A GGUF's quantized weights are
not copied into dense parameters at all: the ones the native kernels run stay in their
stored type (``models.gguf_weights`` decides which and packs them), and only the rest
is dequantized. Nothing large is read before the checks pass, except that a GGUF's
tokenizer is built beside the weight packing (:func:`_load_gguf`): its errors are the
same, they arrive a second or two later.
"""

from __future__ import annotations

import itertools
import logging
import os
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from draftwise.formats.chat import ChatTemplate, chat_template_from_dir
from draftwise.formats.default_model import resolve_model_path
from draftwise.formats.errors import (
    ConfigError,
    MissingTensorError,
    ModelFormatError,
    TensorShapeError,
    UnexpectedTensorError,
    UnsupportedDtypeError,
)
from draftwise.formats.gguf import GGUFCheckpoint
from draftwise.formats.jsonfile import read_json
from draftwise.formats.safetensors_dir import SafetensorsCheckpoint
from draftwise.formats.tokenizer import Tokenizer, find_tokenizer_file, read_tokenizer_config
from draftwise.formats.values import ConfigValues
from draftwise.models.backend import decide_backend, refuse_on_device
from draftwise.models.config import ModelConfig
from draftwise.models.early_pack import EarlyPack
from draftwise.models.gguf_weights import load_device_quantized, load_quantized, plan_quantized
from draftwise.models.llama import LlamaForCausalLM, expected_shapes
from draftwise.models.nvfp4_weights import (
    NvFp4Plan,
    dequantized,
    group_nvfp4,
    load_packed,
    plan_nvfp4,
)
from draftwise.models.registry import (
    HYBRID_ARCHITECTURES,
    check_gguf_metadata,
    check_hf_config,
    model_class,
)

if TYPE_CHECKING:
    from draftwise.models.prefault import Ahead

#: called after each tensor: (tensors done, tensors total, HF name of the last one)
ProgressFn = Callable[[int, int, str], None]

logger = logging.getLogger("draftwise")

_DTYPES = {
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float32": torch.float32,
    "fp32": torch.float32,
    "float": torch.float32,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
}

#: tensors some checkpoints carry that the model recomputes or does not need
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


@dataclass(slots=True)
class LoadedModel:
    """A target ready to run, with what the engine needs around it."""

    model: LlamaForCausalLM
    config: ModelConfig
    #: None only for an HF directory without ``tokenizer.json`` (e.g. test checkpoints)
    tokenizer: Tokenizer | None
    chat_template: ChatTemplate | None
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None
    path: str
    format: str  # "gguf" or "safetensors"
    #: one line each for what the load could not keep as stored (logged when loading)
    notices: tuple[str, ...] = ()

    @property
    def dtype(self) -> torch.dtype:
        """Weight and KV-cache dtype."""
        return self.model.dtype

    def encode_chat(
        self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> list[int]:
        """Prompt ids for a conversation, through the model's own chat template."""
        if self.chat_template is None or self.tokenizer is None:
            raise ModelFormatError(self.path, "this model has no chat template or tokenizer")
        return self.chat_template.encode(self.tokenizer, messages, add_generation_prompt,
                                         tools=tools)


def resolve_dtype(dtype: str | torch.dtype, device: str | torch.device = "cpu") -> torch.dtype:
    """``auto`` is bfloat16 on the CPU (fast on AVX-512-BF16 CPUs and bitwise
    batch-invariant there) and float16 on CUDA (the Triton kernels are checked in fp16 and
    fp32, not bf16: ``models.backend``)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return torch.float16 if torch.device(device).type == "cuda" else torch.bfloat16
    if dtype not in _DTYPES:
        raise UnsupportedDtypeError(f"unknown dtype {dtype!r}; use auto, {', '.join(_DTYPES)}")
    return _DTYPES[dtype]


def load_model(
    path: str | None = None,
    dtype: str | torch.dtype = "auto",
    device: str | torch.device = "cpu",
    progress: ProgressFn | None = None,
    reserved: Ahead | None = None,
) -> LoadedModel:
    """Load a ``.gguf`` file or an HF safetensors directory; ``None`` is the default model.

    :param path: a ``.gguf`` file, an HF directory (``config.json`` + ``*.safetensors``),
        or a directory holding exactly one ``.gguf``; None loads the default model.
    :param dtype: ``auto`` (bfloat16), ``bfloat16``, ``float32`` or ``float16``.
    :param device: where weights live.
    :param progress: called after each tensor is loaded.
    :param reserved: what the CLI's start-up began for a GGUF's quantized weights before
        its imports (``models.prefault``): memory faulting in (``models.arena``), used
        where it fits, its unused pages handed back either way; or, on a first start with
        the packed-weights cache on, the cache file being packed (``models.early_pack``),
        taken where it was packed under this load's cache key.
    :returns: the model with its config, tokenizer, chat template and stop ids.
    """
    try:
        path = resolve_model_path(path)
        target = resolve_dtype(dtype, device)
        if os.path.isdir(path):
            return _load_hf_dir(path, target, device, progress)
        return _load_gguf(path, target, device, progress, reserved)
    finally:
        if reserved is not None:
            reserved.finish()


@dataclass(slots=True)
class GGUFPlan:
    """What :func:`load_model` knows about a GGUF before it reads a weight."""

    ckpt: GGUFCheckpoint
    config: ModelConfig
    #: HF name -> (GGUF name, shape), every name checked against the config
    available: dict[str, tuple[str, tuple[int, ...]]]
    names: list[str]
    tokenizer: Tokenizer
    chat_template: ChatTemplate | None


def plan_gguf(path: str) -> GGUFPlan:
    """Every check ``load_model`` makes on a GGUF before reading weights, in refusal order.

    Header, metadata and tensor infos (:mod:`draftwise.formats.gguf_header`), the
    architecture, the config values, every tensor's name and shape, the tokenizer and the
    chat template: a corrupt or unsupported file fails here, in well under a second,
    with a :class:`~draftwise.formats.errors.ModelFormatError` (or ChatTemplateError).
    """
    ckpt, config, available, names = _plan_gguf_weights(path)
    tokenizer, chat = _gguf_text(ckpt, config, path)
    return GGUFPlan(ckpt, config, available, names, tokenizer, chat)


def _plan_gguf_weights(
    path: str, opened: GGUFCheckpoint | None = None,
) -> tuple[GGUFCheckpoint, ModelConfig, dict[str, tuple[str, tuple[int, ...]]], list[str]]:
    """:func:`plan_gguf`'s checks up to the tensors (everything but the tokenizer);
    ``opened``: the file's header as an early packing read it (``models.early_pack``)."""
    ckpt = opened if opened is not None else GGUFCheckpoint(path)
    check_gguf_metadata(ckpt.metadata, path)
    config = ModelConfig.from_gguf_metadata(
        ckpt.metadata, ckpt.tensor_names, path, rope_freq_factors=ckpt.rope_freq_factors()
    )
    model_class(config, path)
    available = ckpt.hf_shapes()
    return ckpt, config, available, _check_tensors(path, config, available)


def _gguf_text(
    ckpt: GGUFCheckpoint, config: ModelConfig, path: str
) -> tuple[Tokenizer, ChatTemplate | None]:
    """The tokenizer and chat template a GGUF's metadata describes."""
    tokenizer = Tokenizer.from_gguf_metadata(ckpt.metadata, path)
    tokens = ckpt.metadata.get("tokenizer.ggml.tokens") or []
    template = ConfigValues(ckpt.metadata, path).text("tokenizer.chat_template", None)
    specials = _special_strings(tokens, config.bos_token_id, tokenizer.eos_token_ids)
    return tokenizer, ChatTemplate(template, specials) if template else None


#: GIL switch interval while the tokenizer builds beside the weight packing (see _load_gguf)
_OVERLAP_SWITCH_S = 1e-4


def _load_gguf(
    path: str, dtype: torch.dtype, device: str | torch.device, progress: ProgressFn | None,
    reserved: Ahead | None = None,
) -> LoadedModel:
    """Everything :func:`plan_gguf` checks, then the weights.

    The tokenizer (~0.7 s of Python for a 150k vocabulary) is built on a second thread
    while this one packs the weights (C, with the GIL released), so start-up pays for the
    longer of the two, not their sum. Its errors are the same named errors, raised once
    the packing is done. While both run the GIL's switch interval is cut to 0.1 ms: at
    the default 5 ms the packing thread, which needs the GIL for a moment between
    tensors, would wait up to 5 ms each time the tokenizer thread holds it.
    """
    opened = reserved.checkpoint() if isinstance(reserved, EarlyPack) else None
    ckpt, config, available, names = _plan_gguf_weights(path, opened)
    backend = decide_backend(dtype, device, config.head_dim)
    quant = plan_quantized(ckpt, config, available, dtype, device, backend)
    for line in quant.notices:
        logger.warning("draftwise: %s", line)
    # an early packing (models.early_pack) cut the interval already; this is what it found
    switch = reserved.switch_before if isinstance(reserved, EarlyPack) else sys.getswitchinterval()
    sys.setswitchinterval(min(switch, _OVERLAP_SWITCH_S))
    try:
        with ThreadPoolExecutor(1, thread_name_prefix="draftwise-tokenizer") as pool:
            text = pool.submit(_gguf_text, ckpt, config, path)
            model = LlamaForCausalLM(config, dtype, device, external=frozenset(quant.groups),
                                     backend=backend)
            quantized = quant.hf_names
            dense = [n for n in names if n not in quantized]
            tick = _ticker(len(names), progress)
            if backend.kernels == "triton":
                load_device_quantized(ckpt, config, quant, available, model.set_quantized,
                                      device, tick)
            else:
                load_quantized(ckpt, config, quant, available, model.set_quantized, tick,
                               reserved)
            heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
            tensors = ((name, ckpt.load_hf(available[name][0], heads, kv_heads)) for name in dense)
            _copy_weights(model, tensors, tick)
            tokenizer, chat = text.result()
    finally:
        sys.setswitchinterval(switch)
    return LoadedModel(
        model=model,
        config=config,
        tokenizer=tokenizer,
        chat_template=chat,
        eos_token_ids=tuple(
            dict.fromkeys((*config.eos_token_ids, *tokenizer.eos_token_ids))
        ),
        bos_token_id=config.bos_token_id,
        path=path,
        format="gguf",
        notices=quant.notices,
    )


@dataclass(slots=True)
class HFPlan:
    """What :func:`load_model` knows about an HF directory before it reads a weight."""

    config: ModelConfig
    #: None for the GDN hybrid, which :func:`~draftwise.models.qwen3_next.load_hybrid` reads
    ckpt: SafetensorsCheckpoint | None
    names: list[str]
    tokenizer: Tokenizer | None
    chat_template: ChatTemplate | None
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None
    #: the checked NVFP4 declaration (``models.nvfp4_weights``); None: not quantized
    nvfp4: NvFp4Plan | None = None


def plan_hf_dir(path: str) -> HFPlan:
    """Every check ``load_model`` makes on an HF directory before reading weights.

    ``config.json`` (architecture first, before any shard is opened), every shard header,
    tensor names, shapes and dtypes, ``generation_config.json``, ``tokenizer_config.json``,
    ``tokenizer.json`` and the chat template.
    """
    config_path = os.path.join(path, "config.json")
    raw = read_json(config_path)
    arch = check_hf_config(raw, config_path)  # before any shard is opened
    ckpt: SafetensorsCheckpoint | None = None
    names: list[str] = []
    nv: NvFp4Plan | None = None
    if arch in HYBRID_ARCHITECTURES:  # the GDN hybrid: models/qwen3_next.py
        from draftwise.formats.nvfp4 import NvFp4Error, declaration
        from draftwise.models.hybrid_config import HybridConfig

        if declaration(path, raw, "a bf16 export", what="GDN hybrid checkpoints") is not None:
            raise NvFp4Error(path, f"an NVFP4 {arch} checkpoint: the GDN hybrid loads bf16/"
                             "fp16/fp32 weights only (NVFP4 runs for the llama family). "
                             "Instead: a bf16 export.", key="quantization_config")
        config = HybridConfig.from_hf_dict(raw, config_path).base
    else:
        config = ModelConfig.from_hf_dict(raw, config_path)
        model_class(config, config_path)
        ckpt = SafetensorsCheckpoint(path)
        nv = plan_nvfp4(ckpt, config, raw, expected_shapes(config))
        names = _check_tensors(path, config, ckpt.hf_shapes() if nv is None else nv.available(ckpt))
        packed = frozenset() if nv is None else nv.weight_names()
        ckpt.check_dtypes([n for n in names if n not in packed])

    eos = list(config.eos_token_ids)
    gen_path = os.path.join(path, "generation_config.json")
    if os.path.isfile(gen_path):
        gen = ConfigValues(read_json(gen_path), gen_path)
        eos += gen.ids("eos_token_id", below=config.vocab_size)
    tok_cfg_path = os.path.join(path, "tokenizer_config.json")
    tok_cfg = read_tokenizer_config(tok_cfg_path) if os.path.isfile(tok_cfg_path) else {}
    tok_file = find_tokenizer_file(path)
    tokenizer = Tokenizer.from_file(tok_file, tok_cfg, eos) if tok_file else None
    eos_ids = tuple(dict.fromkeys((*eos, *(tokenizer.eos_token_ids if tokenizer else ()))))
    template = chat_template_from_dir(path)
    specials = {
        key: str(v.get("content") if isinstance(v, dict) else v)
        for key in ("bos_token", "eos_token", "unk_token", "pad_token")
        if (v := tok_cfg.get(key)) is not None
    }
    bos = (
        config.bos_token_id
        if config.bos_token_id is not None
        else (tokenizer.bos_token_id if tokenizer else None)
    )
    chat = ChatTemplate(template, specials) if template else None
    return HFPlan(config, ckpt, names, tokenizer, chat, eos_ids, bos, nv)


def _load_hf_dir(
    path: str, dtype: torch.dtype, device: str | torch.device, progress: ProgressFn | None
) -> LoadedModel:
    plan = plan_hf_dir(path)
    model: LlamaForCausalLM
    config: ModelConfig
    notices: tuple[str, ...] = ()
    backend = decide_backend(dtype, device, plan.config.head_dim)
    if plan.ckpt is None:
        refuse_on_device(backend, device, "a GDN hybrid (recurrent layers)",
                         "use --device cpu for it")
    elif plan.nvfp4 is not None:
        refuse_on_device(backend, device, "an NVFP4 checkpoint (its kernel is a CPU kernel)",
                         "use --device cpu for it, or a GGUF (Q4_K/Q6_K/Q8_0) of the model")
    if plan.ckpt is None:
        from draftwise.models.qwen3_next import load_hybrid

        hybrid, _ = load_hybrid(path, dtype, device)
        model, config = hybrid, hybrid.config  # type: ignore[assignment]
    elif plan.nvfp4 is None:
        config = plan.config
        model = LlamaForCausalLM(config, dtype, device, backend=backend)
        _copy_weights(model, plan.ckpt.iter_tensors(plan.names), _ticker(len(plan.names), progress))
    else:
        config = plan.config
        model, notices = _load_nvfp4(plan, plan.ckpt, plan.nvfp4, dtype, device, progress)
    return LoadedModel(
        model=model,
        config=config,
        tokenizer=plan.tokenizer,
        chat_template=plan.chat_template,
        eos_token_ids=plan.eos_token_ids,
        bos_token_id=plan.bos_token_id,
        path=path,
        format="safetensors",
        notices=notices,
    )


def _load_nvfp4(plan: HFPlan, ckpt: SafetensorsCheckpoint, nv: NvFp4Plan, dtype: torch.dtype,
                device: str | torch.device, progress: ProgressFn | None,
                ) -> tuple[LlamaForCausalLM, tuple[str, ...]]:
    """An NVFP4 target: packed groups installed as they are, the rest copied densely
    (``models.nvfp4_weights`` decides which)."""
    config = plan.config
    backend = decide_backend(dtype, device, config.head_dim)
    grouping = group_nvfp4(ckpt, config, nv, dtype, backend)
    for line in grouping.notices:
        logger.warning("draftwise: %s", line)
    model = LlamaForCausalLM(config, dtype, device, external=frozenset(grouping.groups),
                             backend=backend)
    covered = {n for hf in grouping.groups.values() for n in hf}
    tick = _ticker(len(plan.names), progress)
    load_packed(ckpt, nv, grouping, model.set_quantized, tick)
    plain = [n for n in plan.names if n not in covered and n not in grouping.dequantized]
    tensors = itertools.chain(ckpt.iter_tensors(plain),
                              dequantized(ckpt, nv, grouping.dequantized))
    _copy_weights(model, tensors, tick)
    return model, grouping.notices


def _check_tensors(
    path: str, config: ModelConfig, available: Mapping[str, tuple[str, tuple[int, ...]]]
) -> list[str]:
    """Names to load, after checking none is missing, mis-shaped or unexpected."""
    layers = {
        int(parts[2])
        for name in available
        if (parts := name.split("."))[:2] == ["model", "layers"] and parts[2].isdigit()
    }
    if config.num_hidden_layers > len(layers):  # before building n x ~10 expected names
        raise ConfigError(
            path,
            f"the config declares {config.num_hidden_layers:,} layers but the checkpoint "
            f"has tensors for {len(layers):,}",
            key="num_hidden_layers",
        )
    expected = expected_shapes(config)
    for name, shape in expected.items():
        if name not in available:
            raise MissingTensorError(path, name, shape)
        source, got = available[name]
        if tuple(got) != shape:
            raise TensorShapeError(path, source, shape, tuple(got))
    extra = [
        n
        for n in available
        if n not in expected
        and not n.endswith(_IGNORED_SUFFIXES)
        and not (n == "lm_head.weight" and config.tie_word_embeddings)
    ]
    if extra:
        raise UnexpectedTensorError(path, extra)
    return list(expected)


def _ticker(total: int, progress: ProgressFn | None) -> Callable[[str], None]:
    """A per-tensor callback that counts and forwards to ``progress``."""
    done = 0

    def tick(name: str) -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(done, total, name)

    return tick


def _copy_weights(
    model: LlamaForCausalLM,
    tensors: Iterable[tuple[str, torch.Tensor]],
    tick: Callable[[str], None],
) -> None:
    """Copy each tensor into its (fused) slot, casting to the model dtype, then pack."""
    slots = model.weight_slots()
    with torch.no_grad():
        for name, tensor in tensors:
            slots[name].copy_(tensor)
            tick(name)
    model.pack_weights()  # native or oneDNN layout for decode speed; weight_slots() is done with


def _special_strings(tokens: Sequence[str], bos: int | None, eos: Sequence[int]) -> dict[str, str]:
    """``bos_token``/``eos_token`` strings templates may reference."""
    out: dict[str, str] = {}
    if bos is not None and bos < len(tokens):
        out["bos_token"] = tokens[bos]
    if eos and eos[0] < len(tokens):
        out["eos_token"] = tokens[eos[0]]
    return out
