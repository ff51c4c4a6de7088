"""What vLLM 0.32's ``SpeculativeConfig`` declares, and what draftwise does with each.

This is data about vLLM, not about draftwise's methods: the 37 fields (in vLLM's
declaration order, with vLLM's line in ``vllm/config/speculative.py``), the method
names vLLM knows, the MTP model types it rewrites to ``mtp``, and keys vLLM removed.
The core reads it to tell a real-but-unimplemented vLLM field from a typo.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any


class FieldKind(enum.Enum):
    """What draftwise does with a vLLM field."""

    CORE = "honoured by the core"
    OPTION = "honoured by a method's options"
    UNIMPLEMENTED = "refused: not implemented"
    INTERNAL = "refused: engine-injected internal"
    TRAP = "refused: invalid in vLLM too"


@dataclass(frozen=True, slots=True)
class VllmField:
    """One vLLM field and draftwise's answer to it."""

    name: str
    line: int
    vllm_type: str
    default: Any
    kind: FieldKind
    reason: str = ""
    instead: str = ""
    #: OPTION: the first-party methods whose options honour it
    methods: tuple[str, ...] = ()
    #: other values vLLM treats exactly like its default ("auto" for attention_backend)
    default_aliases: tuple[Any, ...] = ()

    def is_default(self, value: Any) -> bool:
        """Whether ``value`` asks for vLLM's default (so it asks for nothing)."""
        candidates = (self.default, *self.default_aliases)
        return any(type(value) is type(c) and value == c for c in candidates)


_LOCAL = "draftwise reads local checkpoints only"
_SYNTH = (
    "it only feeds rejection_sample_method 'synthetic', a benchmarking mode that is not "
    "lossless, which draftwise refuses",
    "drop it; use rejection_sample_method 'standard' or 'block'",
)
_INTERNAL = "vLLM's engine fills it in itself; it is not a user setting"

_U, _O, _C = FieldKind.UNIMPLEMENTED, FieldKind.OPTION, FieldKind.CORE
_I = FieldKind.INTERNAL

#: all 37 fields of vLLM 0.32 ``SpeculativeConfig``, in declaration order
VLLM_FIELDS: tuple[VllmField, ...] = (
    VllmField("enforce_eager", 390, "bool | None", None, _C),
    VllmField("num_speculative_tokens", 393, "int (> 0)", None, _C),
    VllmField("model", 396, "str | None", None, _C),
    VllmField("method", 399, "SpeculativeMethod | None", None, _C),
    VllmField("draft_tensor_parallel_size", 407, "int | None (>= 1)", None, _C),
    VllmField(
        "tensor_parallel_size", 410, "int | None", None, FieldKind.TRAP,
        "'tensor_parallel_size' is not a valid argument in the speculative_config "
        "(vLLM refuses it too)",
        "pass 'draft_tensor_parallel_size' (1, or the target's tensor_parallel_size)",
    ),
    VllmField("quantization", 415, "QuantizationMethods | str | None", None, _C),
    VllmField(
        "moe_backend", 419, "MoEBackend | None", None, _U,
        "draftwise has a single MoE path, inherited from the target",
        "drop it",
    ),
    VllmField(
        "attention_backend", 424, "AttentionBackendEnum | None", None, _U,
        "draftwise has a single attention path (torch SDPA over paged KV)",
        "drop it (or set \"auto\")", default_aliases=("auto", "AUTO"),
    ),
    VllmField(
        "kv_cache_dtype", 428, "CacheDType | None", None, _U,
        "the draft's KV cache always uses the target's cache dtype",
        "drop it",
    ),
    VllmField("max_model_len", 431, "int | None (>= 1)", None, _C),
    VllmField(
        "revision", 434, "str | None", None, _U, _LOCAL,
        "check out that revision yourself and pass its local path as 'model'",
    ),
    VllmField(
        "code_revision", 438, "str | None", None, _U,
        f"{_LOCAL} and never runs code shipped with a checkpoint",
        "drop it",
    ),
    VllmField(
        "index_share_for_mtp_iteration", 442, "bool | None", None, _U,
        "it shares a sparse-attention indexer across MTP steps; draftwise's targets have "
        "no indexer",
        "drop it",
    ),
    VllmField(
        "disable_padded_drafter_batch", 447, "bool", False, _U,
        "draftwise's drafter batch is always ragged (per-row draft counts), so there is "
        "no padded layout to disable",
        "drop it",
    ),
    VllmField(
        "disable_eagle_block_drop", 452, "bool", False, _U,
        "it tunes EAGLE prefix caching; draftwise has no EAGLE drafters",
        "drop it",
    ),
    VllmField(
        "use_local_argmax_reduction", 457, "bool", False, _U,
        "it is a tensor-parallel vocab reduction; draftwise runs on one device",
        "drop it",
    ),
    VllmField("use_heterogeneous_vocab", 463, "bool", False, _O, methods=("draft_model",)),
    VllmField("prompt_lookup_max", 470, "int | None (>= 1)", None, _O, methods=("ngram",)),
    VllmField("prompt_lookup_min", 473, "int | None (>= 1)", None, _O, methods=("ngram",)),
    VllmField("parallel_drafting", 478, "bool", False, _O, methods=("dflash", "dspark")),
    VllmField("target_model_config", 485, "ModelConfig", None, _I, _INTERNAL,
              "drop it; draftwise takes the target from its own --model"),
    VllmField("target_parallel_config", 487, "ParallelConfig", None, _I, _INTERNAL,
              "drop it; draftwise runs on one device"),
    VllmField(
        "num_speculative_tokens_per_batch_size", 491, "list[tuple[int, int, int]] | None",
        None, _C,
    ),
    VllmField("draft_model_config", 499, "ModelConfig", None, _I, _INTERNAL,
              "drop it; draftwise reads the draft's own config.json from 'model'"),
    VllmField("draft_parallel_config", 501, "ParallelConfig", None, _I, _INTERNAL,
              "drop it; draftwise runs on one device"),
    VllmField("suffix_decoding_max_tree_depth", 505, "int", 24, _O, methods=("suffix",)),
    VllmField("suffix_decoding_max_cached_requests", 509, "int", 10000, _O, methods=("suffix",)),
    VllmField("suffix_decoding_max_spec_factor", 515, "float", 1.0, _O, methods=("suffix",)),
    VllmField("suffix_decoding_min_token_prob", 520, "float", 0.1, _O, methods=("suffix",)),
    VllmField("draft_load_config", 525, "LoadConfig | None", None, _I,
              "vLLM's engine builds it from its load options; draftwise's loaders detect the "
              "draft's format themselves",
              "drop it"),
    VllmField("rejection_sample_method", 529, 'Literal["standard", "synthetic", "block"]',
              "standard", _C),
    VllmField("synthetic_acceptance_rates", 537, "list[float] | None", None, _U, *_SYNTH),
    VllmField("synthetic_acceptance_length", 545, "float | None", None, _U, *_SYNTH),
    VllmField("enable_adaptive_verification", 551, "bool", False, _O, methods=("dspark",)),
    VllmField("draft_sample_method", 600, 'Literal["greedy", "probabilistic"]', "greedy", _C),
    VllmField("dspark_draft_topk", 608, "int | None (>= 1)", None, _O, methods=("dspark",)),
)

FIELDS_BY_NAME: dict[str, VllmField] = {f.name: f for f in VLLM_FIELDS}

#: vLLM's ``MTPModelTypes``; every entry but "mtp" is rewritten to "mtp" with a warning
MTP_MODEL_TYPES: tuple[str, ...] = (
    "deepseek_mtp", "dots3_note_mtp", "mimo_mtp", "mimo_v2_mtp", "glm4_moe_mtp",
    "glm4_moe_lite_mtp", "glm_ocr_mtp", "ernie_mtp", "nemotron_h_mtp", "exaone_moe_mtp",
    "exaone4_5_mtp", "qwen3_next_mtp", "qwen4_exp_mtp", "qwen3_5_mtp", "longcat_flash_mtp",
    "bailing_hybrid_v3_mtp", "minimax_m3_mtp", "bailing_hybrid_mtp", "mtp", "kimi_k3_mtp",
    "pangu_ultra_moe_mtp", "step3p5_mtp", "hy_v3_mtp", "hy_v4_mtp", "gemma4_mtp",
    "inkling_mtp", "glm5_next_mtp",
)

#: the distribution that provides each first-party method (for "pip install ..." hints)
FIRST_PARTY: dict[str, str] = {
    "mtp": "draftwise-mtp",
    "dflash": "draftwise-dflash",
    "dspark": "draftwise-dspark",
    "ngram": "draftwise-ngram",
    "suffix": "draftwise-ngram",
    "draft_model": "draftwise-draft-model",
}

#: vLLM methods draftwise does not have at all: name -> (why, what instead)
VLLM_ONLY_METHODS: dict[str, tuple[str, str]] = {
    "eagle": ("EAGLE drafters are not implemented", "use 'mtp', 'dflash' or 'draft_model'"),
    "eagle3": ("EAGLE-3 drafters are not implemented", "use 'dflash' or 'draft_model'"),
    "medusa": ("Medusa heads are not implemented", "use 'mtp' or 'draft_model'"),
    "mlp_speculator": ("MLP speculators are not implemented", "use 'draft_model'"),
    "ngram_gpu": ("it is vLLM's GPU variant of ngram", "use 'ngram' (the same lookup)"),
    "extract_hidden_states": ("it extracts hidden states and drafts nothing", "drop it"),
    "custom_class": (
        "vLLM imports a proposer class from a dotted path in 'model'; draftwise loads "
        "proposers from installed plugins instead",
        "package the proposer as a plugin: see docs/writing-a-plugin.md",
    ),
}

#: keys older vLLM versions accepted and 0.32 no longer declares: key -> hint
REMOVED_KEYS: dict[str, str] = {
    "disable_by_batch_size": (
        "vLLM removed it (PR #35060; unused since V0); its successor is "
        "num_speculative_tokens_per_batch_size, e.g. [[1, 4, 4], [5, 256, 0]]"
    ),
    "speculative_token_tree": "vLLM 0.32 no longer has it (EAGLE tree attention)",
    "speculative_disable_mqa_scorer": "a vLLM V0 key, gone since V1",
    "spec_decoding_acceptance_method": (
        "a vLLM V0 key, gone since V1; see rejection_sample_method"
    ),
    "typical_acceptance_sampler_posterior_threshold": "a vLLM V0 key, gone since V1",
    "typical_acceptance_sampler_posterior_alpha": "a vLLM V0 key, gone since V1",
    "disable_logprobs_during_spec_decoding": "a vLLM V0 key, gone since V1",
}

__all__ = [
    "FIELDS_BY_NAME",
    "FIRST_PARTY",
    "MTP_MODEL_TYPES",
    "REMOVED_KEYS",
    "VLLM_FIELDS",
    "VLLM_ONLY_METHODS",
    "FieldKind",
    "VllmField",
]
