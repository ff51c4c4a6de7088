"""The speculative config: vLLM's JSON object, checked key by key before any weights.

Entry point: :func:`parse_speculative_config`. Errors: :class:`ConfigError` and its
subclasses. The vLLM field table: :data:`VLLM_FIELDS`.
"""

from __future__ import annotations

from draftwise.config.core import CORE_REFUSALS, MAX_NUM_SPECULATIVE_TOKENS, SpeculativeConfig
from draftwise.config.errors import (
    ConfigError,
    InternalFieldError,
    InvalidJSONError,
    InvalidValueError,
    MissingKeyError,
    NotForMethodError,
    RefusedValueError,
    UnimplementedFieldError,
    UnknownKeyError,
    UnknownMethodError,
)
from draftwise.config.keys import CORE_KEYS, NAMESPACE, NAMESPACE_KEYS
from draftwise.config.speculative import (
    ChecksCheckpoint,
    ResolvedSpeculativeConfig,
    parse_speculative_config,
)
from draftwise.config.vllm_fields import (
    FIELDS_BY_NAME,
    FIRST_PARTY,
    MTP_MODEL_TYPES,
    VLLM_FIELDS,
    VLLM_ONLY_METHODS,
    FieldKind,
    VllmField,
)

__all__ = [
    "CORE_KEYS",
    "CORE_REFUSALS",
    "FIELDS_BY_NAME",
    "FIRST_PARTY",
    "MAX_NUM_SPECULATIVE_TOKENS",
    "MTP_MODEL_TYPES",
    "NAMESPACE",
    "NAMESPACE_KEYS",
    "VLLM_FIELDS",
    "VLLM_ONLY_METHODS",
    "ChecksCheckpoint",
    "ConfigError",
    "FieldKind",
    "InternalFieldError",
    "InvalidJSONError",
    "InvalidValueError",
    "MissingKeyError",
    "NotForMethodError",
    "RefusedValueError",
    "ResolvedSpeculativeConfig",
    "SpeculativeConfig",
    "UnimplementedFieldError",
    "UnknownKeyError",
    "UnknownMethodError",
    "VllmField",
    "parse_speculative_config",
]
