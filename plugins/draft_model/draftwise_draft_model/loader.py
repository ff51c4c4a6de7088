"""The draft stage's loader for method ``draft_model``: the core's own model loader.

``detect`` runs the same checks a target gets (``draftwise.models.inspect``: format,
architecture, mixture-of-experts, config) on the DRAFT's files, reading no weights.
``check_target`` compares the vocabulary sizes from the two headers (vLLM requires them
equal unless ``use_heterogeneous_vocab``) before the target loads; ``load`` checks them
again with the tokenizers the flag needs, then loads the draft through
``draftwise.models.loader.load_model`` (GGUF or safetensors, the target's dtype and
device, whatever weight layout the target loader uses), and builds the vocabulary map
when the tokenizers differ. The draft's KV is laid out in the core's pool: one entry per
draft layer per position, the draft's own heads.
"""

from __future__ import annotations

import os
from typing import Any

from draftwise.kit import (
    DraftCheckpoint,
    KVLayout,
    LoadedDraft,
    ModelFormatError,
    RefusedValueError,
    TargetHeader,
)
from pydantic import BaseModel

from draftwise_draft_model.options import DraftModelOptions


class DraftModelError(ModelFormatError):
    """A draft checkpoint this method cannot use; the message says why and what works."""


class DraftModelLoader:
    """``Loader`` for any llama-family checkpoint the engine loads as a target."""

    def detect(self, path: str) -> DraftCheckpoint:
        """Format, architecture and the config values the load checks (vocab, context)."""
        from draftwise.kit import inspect_model

        info = inspect_model(path)
        if info.config is None:  # the GDN hybrid
            raise DraftModelError(
                info.path,
                f"{info.architecture} has linear-attention layers with recurrent state, which "
                "a draft cannot keep yet. Instead: use a llama-family draft (Llama, Mistral, "
                "Qwen2, Qwen3), or method 'mtp' for this checkpoint's own head.",
            )
        cfg = info.config
        return DraftCheckpoint(
            info.path,
            info.format,
            info.architecture,
            {
                "vocab_size": cfg.vocab_size,
                "max_position_embeddings": cfg.max_position_embeddings,
                "num_hidden_layers": cfg.num_hidden_layers,
            },
        )

    def check_target(
        self, checkpoint: DraftCheckpoint, options: BaseModel, target: TargetHeader
    ) -> None:
        """The vocabulary sizes, from the two headers, before the target loads."""
        if not isinstance(options, DraftModelOptions):
            raise TypeError(f"draft_model needs DraftModelOptions, got {type(options).__name__}")
        check_vocab_sizes(checkpoint, target.vocab_size, options.use_heterogeneous_vocab)

    def load(self, checkpoint: DraftCheckpoint, options: BaseModel, target: Any) -> LoadedDraft:
        """The draft model for ``target``; a vocabulary mismatch is refused before weights."""
        from draftwise.kit import load_model

        from draftwise_draft_model.proposer import DraftModel

        if not isinstance(options, DraftModelOptions):
            raise TypeError(f"draft_model needs DraftModelOptions, got {type(options).__name__}")
        hetero = options.use_heterogeneous_vocab
        check_vocabularies(checkpoint, target, hetero)
        model = target.model
        draft = load_model(checkpoint.path, dtype=model.dtype, device=model.device)
        mapping = None
        if hetero:
            mapping = vocab_map(target, draft)
        head = None
        if options.lm_head_tokens is not None:
            from draftwise_draft_model.head import build_subset_head

            head = build_subset_head(draft, options.lm_head_tokens)
        dm = draft.model
        summary = (
            f"{checkpoint.architecture}, {dm.num_layers} layers, vocab {draft.config.vocab_size}"
            + (f", {mapping.num_shared} tokens shared with the target" if mapping else "")
            + (f", LM head over {head.num_tokens} tokens" if head else "")
            + (f", lm_head_tokens={options.lm_head_tokens} keeps every token: the full LM "
               "head runs" if options.lm_head_tokens is not None and head is None else "")
        )
        return LoadedDraft(
            weights=DraftModel(draft, mapping, head),
            kv_layout=KVLayout(dm.num_layers, dm.num_kv_heads, dm.head_dim, dm.dtype),
            max_model_len=int(draft.config.max_position_embeddings),
            summary=summary,
        )


def check_vocabularies(checkpoint: DraftCheckpoint, target: Any, heterogeneous: bool) -> None:
    """vLLM: equal vocab sizes, or ``use_heterogeneous_vocab`` with two tokenizers."""
    check_vocab_sizes(checkpoint, int(target.config.vocab_size), heterogeneous)
    if heterogeneous:
        if target.tokenizer is None:
            raise DraftModelError(
                str(target.path),
                "use_heterogeneous_vocab maps tokens by their strings, but the target has no "
                "tokenizer. Instead: give the target a tokenizer.json, or drop the flag.",
            )
        if os.path.isdir(checkpoint.path) and not os.path.isfile(
            os.path.join(checkpoint.path, "tokenizer.json")
        ):
            raise DraftModelError(
                checkpoint.path,
                "use_heterogeneous_vocab maps tokens by their strings, but the draft has no "
                "tokenizer.json. Instead: add the draft's tokenizer.json, or drop the flag.",
            )


def check_vocab_sizes(checkpoint: DraftCheckpoint, target_vocab: int, heterogeneous: bool) -> None:
    """The half of :func:`check_vocabularies` two headers decide: equal sizes, unless
    ``use_heterogeneous_vocab`` (then the tokenizers, known only once loaded, decide)."""
    draft_vocab = int(checkpoint.config["vocab_size"])
    if not heterogeneous and draft_vocab != target_vocab:
        raise RefusedValueError(
            f"model={checkpoint.path!r} is refused: the draft's vocabulary has {draft_vocab} "
            f"tokens and the target's {target_vocab}, and draft_model drafts target token ids "
            "(vLLM requires equal vocabularies). Instead: set \"use_heterogeneous_vocab\": "
            "true (greedy drafting over the tokens both vocabularies share), or use a draft "
            "of the target's family.",
            key="model", value=checkpoint.path, reason="vocabulary sizes differ",
            instead='set "use_heterogeneous_vocab": true',
        )


def vocab_map(target: Any, draft: Any) -> Any:
    """The token-level intersection of the two loaded tokenizers (``vocab.py``)."""
    from draftwise_draft_model.vocab import build_vocab_map, first_token_fallback

    t_tok, d_tok = target.tokenizer, draft.tokenizer
    if d_tok is None:
        raise DraftModelError(str(draft.path), "the draft has no tokenizer to map tokens with")

    def decode_batch(ids: list[int]) -> list[str]:
        return list(t_tok.backend.decode_batch([[i] for i in ids], skip_special_tokens=False))

    def encode_batch(texts: list[str]) -> list[list[int]]:
        return [e.ids for e in d_tok.backend.encode_batch(texts, add_special_tokens=False)]

    mapping = build_vocab_map(
        t_tok.backend.get_vocab(with_added_tokens=True),
        d_tok.backend.get_vocab(with_added_tokens=True),
        int(target.config.vocab_size),
        int(draft.config.vocab_size),
        fallback=first_token_fallback(decode_batch, encode_batch),
    )
    if mapping.num_shared == 0:
        raise DraftModelError(
            str(draft.path),
            "the draft's and the target's vocabularies share no token string, so nothing can "
            "be drafted. Instead: use a draft whose tokenizer overlaps the target's.",
        )
    return mapping


__all__ = [
    "DraftModelError", "DraftModelLoader", "check_vocab_sizes", "check_vocabularies", "vocab_map",
]
