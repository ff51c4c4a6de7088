"""Token-level intersection (TLI) of two vocabularies: vLLM's ``use_heterogeneous_vocab``.

Timor et al., "Accelerating LLM Inference with Lossless Speculative Decoding Algorithms
for Heterogeneous Vocabularies" (ICML 2025): a draft with another tokenizer drafts only
tokens whose stored strings exist in both vocabularies; each drafted id is mapped to the
target's id of the same string, and verification (greedy, as vLLM requires) keeps the
output exactly the target's.

Rules, in order:

1. a token is shared when its stored spelling (``get_vocab`` keys, added tokens
   included) is in both vocabularies;
2. draft logits of tokens that are not shared are masked to -inf before the argmax, so
   every draft maps to a target id;
3. the target's context is fed to the draft position for position (so draft KV and
   target KV stay aligned): a shared token maps to its draft twin; a target token the
   draft lacks maps to the first draft token of the same text (``fallback``), or to draft
   id 0 when that text encodes to nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True, slots=True)
class VocabMap:
    """Ids of the shared tokens, both ways, over the two models' vocabulary sizes."""

    #: ``[target_vocab]`` the draft id fed for each target id (rule 3)
    target_to_draft: np.ndarray
    #: ``[draft_vocab]`` the target id of each shared draft id (unshared entries are unused)
    draft_to_target: torch.Tensor
    #: ``[draft_vocab]`` which draft ids are shared (rule 2)
    shared: torch.Tensor
    num_shared: int

    def mask_(self, logits: torch.Tensor) -> torch.Tensor:  # [R, draft_vocab], in place
        """Draft logits with every unshared token at -inf (rule 2)."""
        return logits.masked_fill_(~self.shared, float("-inf"))

    def to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:  # [R] -> [R]
        """Target ids of shared draft ids."""
        return self.draft_to_target[draft_ids]

    def to_draft(self, target_ids: np.ndarray) -> np.ndarray:  # [n] -> [n]
        """Draft ids to feed for a target context (rule 3)."""
        return self.target_to_draft[target_ids]


def build_vocab_map(
    target_vocab: Mapping[str, int],
    draft_vocab: Mapping[str, int],
    target_size: int,
    draft_size: int,
    fallback: Callable[[Sequence[int]], Sequence[int | None]] | None = None,
) -> VocabMap:
    """The map between two vocabularies (``get_vocab`` dicts), sized by the models' vocabs.

    ``fallback(target_ids)`` gives, for target ids with no shared twin, the draft id to
    feed (or None); without it they map to draft id 0.
    """
    t2d = np.zeros(target_size, dtype=np.int64)
    d2t = torch.zeros(draft_size, dtype=torch.int64)
    shared = torch.zeros(draft_size, dtype=torch.bool)
    known = np.zeros(target_size, dtype=bool)
    for token, tid in target_vocab.items():
        did = draft_vocab.get(token)
        if did is None or not (0 <= tid < target_size and 0 <= did < draft_size):
            continue
        t2d[tid], known[tid] = did, True
        d2t[did], shared[did] = tid, True
    missing = np.flatnonzero(~known)
    if fallback is not None and missing.size:
        for tid, did in zip(missing.tolist(), fallback(missing.tolist())):
            if did is not None and 0 <= did < draft_size:
                t2d[tid] = did
    return VocabMap(t2d, d2t, shared, int(shared.sum()))


def first_token_fallback(
    decode_batch: Callable[[list[int]], list[str]],
    encode_batch: Callable[[list[str]], list[list[int]]],
) -> Callable[[Sequence[int]], list[int | None]]:
    """Rule 3's fallback: each target token's text re-encoded by the draft, first id kept."""

    def fallback(target_ids: Sequence[int]) -> list[int | None]:
        texts = decode_batch(list(target_ids))
        return [ids[0] if ids else None for ids in encode_batch(texts)]

    return fallback


__all__ = ["VocabMap", "build_vocab_map", "first_token_fallback"]
