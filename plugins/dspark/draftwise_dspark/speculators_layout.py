"""The speculators DSpark layout (``DSparkSpeculator``), read as the DeepSpec config it
stands for.

vllm-project/speculators 0.9.0 ``models/dspark`` (``shared/reference/drafter-formats.md``
§2.3): ``DSparkSpeculatorConfig(DFlashSpeculatorConfig)`` writes
``speculators_model_type: "dspark"``, ``architectures: ["DSparkSpeculator"]``, the draft
decoder as ``transformer_layer_config`` (a Qwen3 config whose ``num_hidden_layers`` is
the draft's), ``draft_vocab_size``, ``block_size``, ``target_hidden_size``,
``aux_hidden_state_layer_ids`` (indices into the verifier's hidden states, 0 = the
embedding output: DeepSpec's ``target_layer_ids`` + 1, as llama.cpp's converter maps
them), ``mask_token_id``, ``sliding_window_non_causal``, ``sample_from_anchor`` (default
True: DeepSpec's next-token block), ``markov_rank`` (256), ``markov_head_type``,
``enable_confidence_head`` and ``confidence_head_with_markov`` (both default True).
The state dict is DeepSpec's module names without ``embed_tokens`` (never saved: the
verifier's) and, for a full vocabulary, without ``lm_head`` (the verifier's head).

A ``draft_vocab_size`` below the verifier's ``vocab_size`` is a reduced draft vocabulary:
``lm_head`` ``[draft_vocab, H]`` and ``markov_w2`` ``[draft_vocab, r]`` are stored with
``d2t``/``t2d`` (:mod:`draftwise_dspark.draft_vocab`, checked at load); ``markov_w1``
keeps the verifier's rows. ``draft_vocab_size`` is passed through to
:func:`~draftwise_dspark.config.parse_config`, which checks its range.

Refused by name: ``sample_from_anchor: false`` (the bonus-anchor block), a
``target_hidden_size`` other than the draft's width, sliding-window draft layers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from draftwise_dspark.names import NATIVE, DSparkConfigError

#: speculators 0.9.0's defaults where the config leaves a field out
DEFAULTS = {"sample_from_anchor": True, "markov_rank": 256, "markov_head_type": "vanilla",
            "enable_confidence_head": True, "confidence_head_with_markov": True}


def native_config(d: Mapping[str, Any], path: str) -> dict[str, Any]:
    """The DeepSpec top-level config this speculators config stands for (module doc)."""
    if d.get("speculators_model_type", "dspark") != "dspark":
        raise DSparkConfigError(path, f"speculators_model_type="
                                      f"{d.get('speculators_model_type')!r} is not 'dspark'")
    tl = d.get("transformer_layer_config")
    if not isinstance(tl, Mapping):
        raise DSparkConfigError(path, "transformer_layer_config is missing: the speculators "
                                      "layout keeps the draft decoder's config there")
    v = {**DEFAULTS, **d}
    if not v["sample_from_anchor"]:
        raise DSparkConfigError(
            path, "sample_from_anchor is false: the bonus-anchor block (slot 0 the target's "
                  "token, block_size - 1 drafts) is not implemented; DeepSpec's next-token "
                  "block (sample_from_anchor true, speculators' DSpark default) is")
    vocab = tl.get("vocab_size")
    hidden = tl.get("hidden_size")
    if d.get("target_hidden_size") not in (None, hidden):
        raise DSparkConfigError(
            path, f"target_hidden_size={d['target_hidden_size']} differs from the draft's "
                  f"hidden_size={hidden}: a verifier of another width is not implemented",
            key="target_hidden_size")
    layers = tl.get("layer_types") or []
    if any(t != "full_attention" for t in layers):
        raise DSparkConfigError(path, f"transformer_layer_config.layer_types={layers!r}: "
                                      "sliding-window draft layers are not implemented here")
    aux = d.get("aux_hidden_state_layer_ids")
    if not isinstance(aux, list) or not all(isinstance(a, int) for a in aux):
        raise DSparkConfigError(path, f"aux_hidden_state_layer_ids={aux!r} must be a list of "
                                      "ints (the verifier hidden states the draft reads)")
    out = {k: val for k, val in tl.items() if k not in ("architectures", "auto_map")}
    out.update(
        architectures=[NATIVE], block_size=d.get("block_size"),
        mask_token_id=d.get("mask_token_id"), target_layer_ids=[a - 1 for a in aux],
        vocab_size=vocab, draft_vocab_size=d.get("draft_vocab_size", vocab),
        tie_word_embeddings=False,
        **{k: v[k] for k in ("markov_rank", "markov_head_type", "enable_confidence_head",
                             "confidence_head_with_markov")},
    )
    return out


__all__ = ["DEFAULTS", "native_config"]
