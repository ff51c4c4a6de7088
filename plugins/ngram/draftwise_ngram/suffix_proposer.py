"""SuffixProposer: suffix decoding (vLLM's ``suffix``) behind the core's Proposer protocol.

Per request it keeps an index of the request's own tokens (prompt and output so far);
across requests, a :class:`~draftwise_ngram.suffix_index.GlobalIndex` of outputs, one per
isolation key (``DraftRow.isolation_key``: the server sets it per ``user``, for the whole
server, or not at all). A row without a key drafts from its own tokens only and records
nothing globally. Each step, both indexes propose for the row's last
``suffix_decoding_max_tree_depth`` tokens and the higher score wins (the request's own
on a tie), as in vLLM with Arctic Inference. Drafts are one linear chain (no tree).

Tokens reach the indexes when a row is proposed for: each ``propose`` brings the row's
index up to its committed tokens and appends its new output tokens to its key's global
index (so a request that never drafts, speculation off for it, records nothing, and the
last step's tokens of a finished request are not recorded). Isolation holds by
construction: a row reads only its own index and its own key's streams.

Drafts carry no probabilities (verification treats q as one-hot); each row's
``evidence`` is the length of the match its draft followed, as ngram's (adaptive depth
keeps acceptance per value).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from draftwise.kit import DraftInput, DraftRow, Drafts, ProposerContext, VerifyOutcome

from draftwise_ngram.suffix_index import (
    DEFAULT_BUDGET_BYTES,
    Draft,
    GlobalIndex,
    TokenStreams,
    speculate,
)


class SuffixSettings(Protocol):
    """What the proposer reads of its options (``suffix_options.SuffixOptions`` is one;
    the options module builds the proposer, so the proposer names only what it reads)."""

    suffix_decoding_max_tree_depth: int
    suffix_decoding_max_spec_factor: float
    suffix_decoding_min_token_prob: float
    suffix_decoding_max_cached_requests: int

#: the largest evidence value given (the core takes 0..65535; a match is rarely this long)
_MAX_EVIDENCE = 1024


@dataclass(slots=True)
class _Request:
    """One running request's own index and how far it has been recorded."""

    local: TokenStreams
    #: tokens of the row indexed so far, and its first one (the sync guard)
    num_tokens: int
    first: int
    key: str | None
    num_prompt: int
    #: output tokens appended to the key's global index
    recorded: int = 0
    #: where the last draft came from ("request" or "global"; None: no draft)
    last_source: str | None = None


@dataclass(slots=True)
class SourceCounts:
    """Drafts by where they came from, and what verification accepted of them."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0

    def as_dict(self) -> dict[str, int]:
        """JSON-able."""
        return {"num_drafts": self.num_drafts, "num_draft_tokens": self.num_draft_tokens,
                "num_accepted_tokens": self.num_accepted_tokens}


class SuffixProposer:
    """vLLM's ``suffix`` method: the best-scoring continuation from the request's own
    tokens or from earlier outputs under the same isolation key."""

    def __init__(self, options: SuffixSettings, ctx: ProposerContext,
                 budget_bytes: int = DEFAULT_BUDGET_BYTES) -> None:
        self.k = ctx.num_speculative_tokens
        self.max_model_len = ctx.max_model_len
        self.depth = options.suffix_decoding_max_tree_depth
        self.factor = options.suffix_decoding_max_spec_factor
        self.min_prob = options.suffix_decoding_min_token_prob
        self.global_index = GlobalIndex(options.suffix_decoding_max_cached_requests,
                                        budget_bytes)
        self._requests: dict[str, _Request] = {}
        #: drafts by where they came from: "request" (its own tokens) or "global"
        self._by_source = {"request": SourceCounts(), "global": SourceCounts()}
        #: where this step's drafts of requests released before ``on_verified`` came from
        #: (the core releases a request that finished in the step first); emptied by the
        #: next ``on_verified`` or ``propose``
        self._released_sources: dict[str, str] = {}

    def propose(self, batch: DraftInput) -> Drafts:
        """Up to min(k, row.max_draft, max_model_len - len) tokens per row."""
        flat: list[int] = []
        counts: list[int] = []
        evidence: list[int] = []
        self._released_sources.clear()
        for row in batch.rows:
            state = self._sync(row)
            k = min(self.k, row.max_draft, self.max_model_len - row.token_ids.shape[0])
            draft, source = (Draft(), None) if k <= 0 else self._lookup(row, state, k)
            state.last_source = source if draft.token_ids else None
            if draft.token_ids:
                c = self._by_source[source or "request"]
                c.num_drafts += 1
                c.num_draft_tokens += len(draft.token_ids)
            flat += draft.token_ids
            counts.append(len(draft.token_ids))
            evidence.append(min(draft.match_len, _MAX_EVIDENCE))
        return Drafts(np.array(flat, dtype=np.int64), counts, evidence=evidence)

    def _lookup(self, row: DraftRow, state: _Request, k: int) -> tuple[Draft, str]:
        """The request's own draft, or its key's global one when that scores higher."""
        context = row.token_ids[-self.depth :].tolist()
        own = speculate(state.local, context, k, self.factor, self.min_prob, self.depth)
        if state.key is None:
            return own, "request"
        other = self.global_index.speculate(state.key, context, k, self.factor,
                                            self.min_prob, self.depth)
        return (other, "global") if other.score > own.score else (own, "request")

    def _sync(self, row: DraftRow) -> _Request:
        """The row's state brought up to its tokens: its own index, its recorded output."""
        tokens = row.token_ids
        n = int(tokens.shape[0])
        state = self._requests.get(row.req_id)
        if state is not None and (n < state.num_tokens or int(tokens[0]) != state.first
                                  or state.key != row.isolation_key):
            state = None  # (not the request indexed under this id: start again)
        if state is None:
            num_prompt = row.num_prompt_tokens if row.num_prompt_tokens is not None else n
            state = _Request(TokenStreams(), 0, int(tokens[0]), row.isolation_key, num_prompt)
            self._requests[row.req_id] = state
            if state.key is not None:
                self.global_index.start(row.req_id, state.key)
        if n > state.num_tokens:
            state.local.extend(0, tokens[state.num_tokens :].tolist())
            state.num_tokens = n
        if state.key is not None and self.global_index.is_recording(row.req_id):
            done = state.num_prompt + state.recorded
            if n > done:
                self.global_index.extend(row.req_id, tokens[done:].tolist())
                state.recorded = n - state.num_prompt
        return state

    def on_verified(self, outcome: VerifyOutcome) -> None:
        """Count accepted tokens by where their draft came from."""
        for req_id, acc in zip(outcome.req_ids, outcome.num_accepted):
            state = self._requests.get(req_id)
            source = (self._released_sources.get(req_id) if state is None
                      else state.last_source)
            if source is not None:
                self._by_source[source].num_accepted_tokens += acc
        self._released_sources.clear()

    def release(self, req_id: str) -> None:
        """The request's own index goes; its output stays in its key's global index."""
        state = self._requests.pop(req_id, None)
        if state is not None:
            self.global_index.stop(req_id)
            if state.last_source is not None:
                self._released_sources[req_id] = state.last_source

    @property
    def num_indexed_requests(self) -> int:
        """Requests with their own index (0 once every request was released)."""
        return len(self._requests)

    def stats(self) -> dict[str, Any]:
        """Drafts by source (the request's own tokens, the global index) and the global
        index's size."""
        g = self.global_index
        return {
            "drafts_from_request": self._by_source["request"].as_dict(),
            "drafts_from_global": self._by_source["global"].as_dict(),
            "global_cached_requests": len(g.cached),
            "global_tokens": g.num_tokens,
            "global_bytes": g.estimated_bytes(),
            "global_evicted": g.num_evicted,
            "global_keys": len(g.streams),
        }
