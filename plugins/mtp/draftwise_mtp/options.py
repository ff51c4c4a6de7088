"""Method mtp's declaration: options, aliases, refusals, capabilities.

Multi-token-prediction heads (DeepSeek, Qwen3-Next, Qwen3.5/3.6, MiMo, GLM ...) draft
from the target's last hidden state. The heads usually ship inside the target
checkpoint, so ``model`` may be omitted (the target's path is read). k defaults to the
head depth (vLLM's n_predict rule), with or without ``model``. Every vLLM
``MTPModelTypes`` entry other than ``mtp`` is an alias.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from draftwise.kit import MTP_MODEL_TYPES, Capabilities, MissingKeyError, Refusal, RefusedValueError
from pydantic import BaseModel, ConfigDict

DESCRIPTION = (
    "Multi-token-prediction heads (in the target checkpoint or a separate one) draft "
    "from the target's last hidden state."
)
#: vLLM rewrites each of these to "mtp" (with a deprecation warning)
ALIASES: tuple[str, ...] = tuple(t for t in MTP_MODEL_TYPES if t != "mtp")
CAPABILITIES = Capabilities(
    needs_checkpoint=True,
    checkpoint_in_target=True,
    needs_target_hidden=True,
    own_kv_cache=True,
    kv_uses_next_token=True,
    draft_probs=True,
)
REFUSALS: tuple[Refusal, ...] = ()
#: where MTP configs declare how many heads (vLLM's n_predict after hf_config_override)
HEAD_COUNT_KEYS = ("num_nextn_predict_layers", "mtp_num_hidden_layers", "n_predict")


def head_count(config: Mapping[str, Any]) -> int | None:
    """How many MTP layers a config.json declares (top level or under text_config)."""
    for scope in (config, config.get("text_config") or {}):
        for key in HEAD_COUNT_KEYS:
            value = scope.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return None


class MtpOptions(BaseModel):
    """mtp has no options of its own; vLLM's index_share_for_mtp_iteration is refused."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    def check_checkpoint(
        self, num_speculative_tokens: int | None, checkpoint_config: Mapping[str, Any]
    ) -> int:
        """vLLM: k defaults to n_predict; a k above it must be a multiple of it."""
        n = head_count(checkpoint_config)
        k = num_speculative_tokens
        if n is None:
            if k is None:
                raise MissingKeyError(
                    "method 'mtp' needs 'num_speculative_tokens': the checkpoint's config "
                    f"declares none of {', '.join(HEAD_COUNT_KEYS)}.",
                    key="num_speculative_tokens", reason="k is required",
                )
            return k
        if k is None:
            return n
        if k > n and k % n:
            raise RefusedValueError(
                f"num_speculative_tokens={k} is refused: it must be divisible by the "
                f"checkpoint's n_predict={n} (vLLM's rule). Instead: use a multiple of {n}.",
                key="num_speculative_tokens", value=k, reason=f"not divisible by n_predict={n}",
                instead=f"use a multiple of {n}",
            )
        return k
