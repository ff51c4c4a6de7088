"""The plugin kit: everything a method plugin may use from draftwise, in one place.

Why: plugins used to import from 27 core modules (``models.linear``, ``models.llama``,
``formats.gguf``, ...), so every internal move could break a third party, and an author
had to read ``models/llama.py`` to find the target's LM head. A plugin imports from here
only (``tests/plugins/test_kit.py`` fails on any other ``draftwise`` import in
``plugins/``); what is here is the supported surface, documented in
``docs/writing-a-plugin.md`` and ``docs/architecture.md``.

Names resolve lazily (PEP 562), as ``draftwise``'s own do: importing the kit, or a
plugin's options module that uses it, loads no torch and no weights; ``from
draftwise.kit import DecoderLayer`` imports only what that name needs.

Groups:
- **The plugin contract (hooks, registration, proposing)**: ``hookimpl``,
  ``RegisterSpeculator``, ``Capabilities``, ``DraftCheckpoint``, ``DraftInput``,
  ``DraftRow``, ``Drafts``, ``KVLayout``, ``LazyLoader``, ``LoadedDraft``, ``Proposer``,
  ``ProposerContext``, ``Refusal``, ``Speculator``, ``VerifyOutcome``, ``Loader``,
  ``ChecksCheckpoint``, ``ChecksTarget``, ``TargetHeader``, ``TapsHidden``,
  ``ReportsStats``, ``ProposerNotBuiltError``, ``ConfigError`` (the base of a plugin's
  own config errors), ``InvalidValueError``, ``MissingKeyError``, ``RefusedValueError``,
  ``SpeculativeConfig`` (the core keys an options validator sees as
  ``info.context["core"]``), ``MTP_MODEL_TYPES``.
- **Drafting and sampling helpers**: ``pick_draft_tokens``, ``argmax_rows``,
  ``categorical``, ``draw_uniforms``.
- **The target surface**: ``HybridTargetModel``, ``LoadedTarget``, ``TargetModel``,
  ``ModelConfig``, ``Backend``, ``decide_backend``, ``load_model``, ``inspect_model``.
- **Building blocks for model-based drafters**: ``DecoderLayer``, ``HybridLayer``,
  ``set_packed``, ``ForwardBatch``, ``KVCache``, ``build_forward_batch``,
  ``AttentionMetadata``, ``paged_attention``, ``write_kv``, ``add_rms_norm``,
  ``apply_rope_``, ``rms_norm``, ``silu_mul``, ``zc_rms_norm``, ``apply_rope``,
  ``inv_frequencies``, ``rope_tables``, ``BLOCK_N``, ``BlockedWeight``, ``Weight``,
  ``linear``, ``pack_weight``, ``pack_weights``, ``QuantPart``,
  ``QuantWeight``, ``dequant_rows``, ``linear_quant``, ``pack_quant``, ``keep_quantized``.
- **Method primitives in C**: DSpark's Markov pass (``core/csrc/markov.c``, on the core's
  packed GEMM): ``MarkovKernelHead``, ``markov_kernel_head``, ``markov_pass``,
  ``markov_pass_built``.
- **Weight-file readers**: ``ModelFormatError``, ``GGUFCheckpoint``,
  ``SafetensorsCheckpoint``, ``read_json``, ``nvfp4`` (the NVFP4 declaration module:
  ``declaration``, ``plan``, ``side_tensors``, ``SUFFIXES``, ``dequantize``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from draftwise import hookimpl
    from draftwise.config import (
        MTP_MODEL_TYPES,
        ConfigError,
        InvalidValueError,
        MissingKeyError,
        RefusedValueError,
        SpeculativeConfig,
    )
    from draftwise.spec.drafting import pick_draft_tokens
    from draftwise.formats import nvfp4
    from draftwise.formats.errors import ModelFormatError
    from draftwise.formats.gguf import GGUFCheckpoint
    from draftwise.formats.jsonfile import read_json
    from draftwise.formats.safetensors_dir import SafetensorsCheckpoint
    from draftwise.models.attention import AttentionMetadata, paged_attention
    from draftwise.models.backend import Backend, decide_backend, keep_quantized
    from draftwise.models.batch import ForwardBatch, KVCache, build_forward_batch
    from draftwise.models.config import ModelConfig
    from draftwise.models.fused import add_rms_norm, apply_rope_, rms_norm, silu_mul
    from draftwise.models.hybrid_ops import zc_rms_norm
    from draftwise.models.inspect import inspect_model
    from draftwise.models.kv_slots import write_kv
    from draftwise.models.linear import (
        BLOCK_N,
        BlockedWeight,
        Weight,
        linear,
        pack_weight,
        pack_weights,
    )
    from draftwise.models.llama import DecoderLayer
    from draftwise.models.loader import load_model
    from draftwise.models.markov_kernel import (
        MarkovKernelHead,
        markov_kernel_head,
        markov_pass,
        markov_pass_built,
    )
    from draftwise.models.pack_plan import QuantPart
    from draftwise.models.quant import (
        QuantWeight,
        dequant_rows,
        linear_quant,
        pack_quant,
    )
    from draftwise.models.qwen3_next import HybridLayer, set_packed
    from draftwise.models.rope import apply_rope, inv_frequencies, rope_tables
    from draftwise.plugins.errors import ProposerNotBuiltError
    from draftwise.plugins.hookspecs import RegisterSpeculator
    from draftwise.sampling import argmax_rows, categorical, draw_uniforms
    from draftwise.speculator import (
        Capabilities,
        ChecksCheckpoint,
        ChecksTarget,
        DraftCheckpoint,
        DraftInput,
        DraftRow,
        Drafts,
        KVLayout,
        LazyLoader,
        LoadedDraft,
        Loader,
        Proposer,
        ProposerContext,
        Refusal,
        ReportsStats,
        Speculator,
        TapsHidden,
        TargetHeader,
        VerifyOutcome,
    )
    from draftwise.target import HybridTargetModel, LoadedTarget, TargetModel

#: name -> the module it lives in
_HOME: dict[str, str] = {
    # the plugin contract (hooks, registration, proposing)
    "hookimpl": "draftwise",
    "RegisterSpeculator": "draftwise.plugins.hookspecs",
    "Capabilities": "draftwise.speculator",
    "DraftCheckpoint": "draftwise.speculator",
    "DraftInput": "draftwise.speculator",
    "DraftRow": "draftwise.speculator",
    "Drafts": "draftwise.speculator",
    "KVLayout": "draftwise.speculator",
    "LazyLoader": "draftwise.speculator",
    "LoadedDraft": "draftwise.speculator",
    "Proposer": "draftwise.speculator",
    "ProposerContext": "draftwise.speculator",
    "Refusal": "draftwise.speculator",
    "Speculator": "draftwise.speculator",
    "VerifyOutcome": "draftwise.speculator",
    "Loader": "draftwise.speculator",
    "ChecksCheckpoint": "draftwise.speculator",
    "ChecksTarget": "draftwise.speculator",
    "TargetHeader": "draftwise.speculator",
    "TapsHidden": "draftwise.speculator",
    "ReportsStats": "draftwise.speculator",
    "ProposerNotBuiltError": "draftwise.plugins.errors",
    "ConfigError": "draftwise.config",
    "InvalidValueError": "draftwise.config",
    "MissingKeyError": "draftwise.config",
    "RefusedValueError": "draftwise.config",
    "SpeculativeConfig": "draftwise.config",
    "MTP_MODEL_TYPES": "draftwise.config",
    # drafting and sampling helpers
    "pick_draft_tokens": "draftwise.spec.drafting",
    "argmax_rows": "draftwise.sampling",
    "categorical": "draftwise.sampling",
    "draw_uniforms": "draftwise.sampling",
    # the target surface
    "HybridTargetModel": "draftwise.target",
    "LoadedTarget": "draftwise.target",
    "TargetModel": "draftwise.target",
    "ModelConfig": "draftwise.models.config",
    "Backend": "draftwise.models.backend",
    "decide_backend": "draftwise.models.backend",
    "load_model": "draftwise.models.loader",
    "inspect_model": "draftwise.models.inspect",
    # building blocks for model-based drafters
    "DecoderLayer": "draftwise.models.llama",
    "HybridLayer": "draftwise.models.qwen3_next",
    "set_packed": "draftwise.models.qwen3_next",
    "ForwardBatch": "draftwise.models.batch",
    "KVCache": "draftwise.models.batch",
    "build_forward_batch": "draftwise.models.batch",
    "AttentionMetadata": "draftwise.models.attention",
    "paged_attention": "draftwise.models.attention",
    "write_kv": "draftwise.models.kv_slots",
    "add_rms_norm": "draftwise.models.fused",
    "apply_rope_": "draftwise.models.fused",
    "rms_norm": "draftwise.models.fused",
    "silu_mul": "draftwise.models.fused",
    "zc_rms_norm": "draftwise.models.hybrid_ops",
    "apply_rope": "draftwise.models.rope",
    "inv_frequencies": "draftwise.models.rope",
    "rope_tables": "draftwise.models.rope",
    "BLOCK_N": "draftwise.models.linear",
    "BlockedWeight": "draftwise.models.linear",
    "Weight": "draftwise.models.linear",
    "linear": "draftwise.models.linear",
    "pack_weight": "draftwise.models.linear",
    "pack_weights": "draftwise.models.linear",
    "QuantPart": "draftwise.models.quant",
    "QuantWeight": "draftwise.models.quant",
    "dequant_rows": "draftwise.models.quant",
    "linear_quant": "draftwise.models.quant",
    "pack_quant": "draftwise.models.quant",
    "keep_quantized": "draftwise.models.backend",
    # method primitives in C
    "MarkovKernelHead": "draftwise.models.markov_kernel",
    "markov_kernel_head": "draftwise.models.markov_kernel",
    "markov_pass": "draftwise.models.markov_kernel",
    "markov_pass_built": "draftwise.models.markov_kernel",
    # weight-file readers
    "ModelFormatError": "draftwise.formats.errors",
    "GGUFCheckpoint": "draftwise.formats.gguf",
    "SafetensorsCheckpoint": "draftwise.formats.safetensors_dir",
    "read_json": "draftwise.formats.jsonfile",
    "nvfp4": "draftwise.formats",
}

__all__ = [
    "AttentionMetadata",
    "BLOCK_N",
    "Backend",
    "BlockedWeight",
    "Capabilities",
    "ChecksCheckpoint",
    "ChecksTarget",
    "ConfigError",
    "DecoderLayer",
    "DraftCheckpoint",
    "DraftInput",
    "DraftRow",
    "Drafts",
    "ForwardBatch",
    "GGUFCheckpoint",
    "HybridLayer",
    "HybridTargetModel",
    "InvalidValueError",
    "KVCache",
    "KVLayout",
    "LazyLoader",
    "LoadedDraft",
    "LoadedTarget",
    "Loader",
    "MarkovKernelHead",
    "MTP_MODEL_TYPES",
    "MissingKeyError",
    "ModelConfig",
    "ModelFormatError",
    "Proposer",
    "ProposerContext",
    "ProposerNotBuiltError",
    "QuantPart",
    "QuantWeight",
    "Refusal",
    "RefusedValueError",
    "RegisterSpeculator",
    "ReportsStats",
    "SafetensorsCheckpoint",
    "SpeculativeConfig",
    "Speculator",
    "TapsHidden",
    "TargetHeader",
    "TargetModel",
    "VerifyOutcome",
    "Weight",
    "add_rms_norm",
    "apply_rope",
    "apply_rope_",
    "argmax_rows",
    "build_forward_batch",
    "categorical",
    "decide_backend",
    "dequant_rows",
    "draw_uniforms",
    "hookimpl",
    "inspect_model",
    "inv_frequencies",
    "keep_quantized",
    "linear",
    "linear_quant",
    "load_model",
    "markov_kernel_head",
    "markov_pass",
    "markov_pass_built",
    "nvfp4",
    "pack_quant",
    "pack_weight",
    "pack_weights",
    "paged_attention",
    "pick_draft_tokens",
    "read_json",
    "rms_norm",
    "rope_tables",
    "set_packed",
    "silu_mul",
    "write_kv",
    "zc_rms_norm",
]


def __getattr__(name: str) -> Any:
    """Import a kit name's home module on first use (see the module doc)."""
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'draftwise.kit' has no attribute {name!r}; the plugin "
                             f"kit holds: {', '.join(__all__)}")
    module = importlib.import_module(home)
    value = getattr(module, name) if hasattr(module, name) else importlib.import_module(
        f"{home}.{name}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return list(__all__)
