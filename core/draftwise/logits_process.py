"""Per-position logits processing: allowed tokens, bad words, min_tokens, logit bias, penalties.

The semantics and the order are vLLM's (v1 ``Sampler.apply_logits_processors``): the
allowed-token mask, bad words, min_tokens (EOS and stop ids excluded while fewer than
``min_tokens`` were generated), logit bias, then the repetition / frequency / presence
penalties. Temperature and the min-p / top-k / top-p truncations follow in
``draftwise.sampling``; greedy requests take the argmax of the processed logits.

- presence / frequency penalties count OUTPUT tokens only (``logit -= f * count`` and
  ``logit -= p * (count > 0)``);
- the repetition penalty looks at prompt and output tokens: a seen token's logit is
  divided by it when positive, multiplied when not (CTRL, arXiv 1909.05858);
- a bad word of one token is always excluded; a longer one excludes its last token
  where the output ends with the rest of it.

Speculation: position ``j`` of a request conditions on its committed tokens PLUS the
drafts before ``j`` in the same step (the state changes inside the verified block). Every
position is processed with its own history, so the distribution verify accepts against
is the one plain decoding samples from, and speculation changes no token.

This is the one pipeline step verify calls (:func:`apply_logits_processors`, once, on
the step's ``[positions, vocab]`` logits). :func:`apply_logits_processors_reference` is
the one-position-at-a-time version the vectorised one must equal. Another per-position
mask (a grammar's) belongs next to these, called at the same place.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

import numpy as np
import torch

from draftwise.errors import RequestError
from draftwise.sampling_params import SamplingParams

NEG_INF = float("-inf")


@dataclass(frozen=True, slots=True)
class TokenHistory:
    """What one request's verified positions condition on, for one step."""

    params: SamplingParams
    prompt_token_ids: np.ndarray  # [L_prompt] int64
    output_token_ids: np.ndarray  # [L_out] int64, committed before this step
    draft_token_ids: np.ndarray  # [n] this step's drafts: position j follows drafts[:j]
    #: ``params.bad_words`` as token sequences (``bad_words_token_ids``)
    bad_words_token_ids: tuple[tuple[int, ...], ...] = ()
    #: what min_tokens excludes: the stop token ids, and EOS unless ``ignore_eos``
    min_tokens_stop_ids: frozenset[int] = field(default_factory=frozenset)

    @property
    def num_positions(self) -> int:
        """Verified positions: one per draft plus the bonus position."""
        return len(self.draft_token_ids) + 1

    def after(self, drafts: Sequence[int]) -> TokenHistory:
        """The history of the position after ``drafts`` (a drafter's next token)."""
        if not len(drafts) and not len(self.draft_token_ids):
            return self
        out = np.concatenate([self.output_before(len(self.draft_token_ids)),
                              np.asarray(drafts, dtype=np.int64)])
        return replace(self, output_token_ids=out, draft_token_ids=np.zeros(0, dtype=np.int64))

    def output_before(self, j: int) -> np.ndarray:  # [L_out + j]
        """The output tokens position ``j`` conditions on."""
        return np.concatenate([self.output_token_ids, self.draft_token_ids[:j]])


class AllTokensExcludedError(RequestError):
    """A position where the request's own settings leave no token to generate."""

    def __init__(self) -> None:
        super().__init__(
            "allowed_token_ids",
            "every token is excluded at this position (allowed_token_ids, bad_words and "
            "min_tokens together leave none); allow more tokens or ban fewer",
        )


class CommittedTokens(Protocol):
    """What :func:`token_history` reads of a request (``draftwise.request.Request`` is
    one): a structural type, so this module needs nothing from the request record's."""

    params: SamplingParams
    eos_token_ids: Collection[int]
    token_buf: np.ndarray
    num_prompt_tokens: int
    bad_words_token_ids: tuple[tuple[int, ...], ...]

    @property
    def num_tokens(self) -> int: ...


def token_history(req: CommittedTokens, drafts: np.ndarray) -> TokenHistory:
    """A request's history for this step: committed prompt and output, then its drafts."""
    params = req.params
    stops = params.stop_token_ids_set
    if not params.ignore_eos:
        stops = stops | req.eos_token_ids
    return TokenHistory(
        params=params,
        prompt_token_ids=req.token_buf[: req.num_prompt_tokens],
        output_token_ids=req.token_buf[req.num_prompt_tokens : req.num_tokens],
        draft_token_ids=np.asarray(drafts, dtype=np.int64),
        bad_words_token_ids=req.bad_words_token_ids,
        min_tokens_stop_ids=stops if params.min_tokens else frozenset(),
    )


def bad_words_token_ids(bad_words: Sequence[str], encode: object) -> tuple[tuple[int, ...], ...]:
    """vLLM's tokenization of bad words: each word alone and after a space (mid-text)."""
    out: list[tuple[int, ...]] = []
    for word in bad_words:
        plain = tuple(encode(word.lstrip()))  # type: ignore[operator]
        if plain:
            out.append(plain)
        spaced = tuple(encode(" " + word.lstrip()))  # type: ignore[operator]
        # vLLM keeps the spaced form only where the space makes another first token
        if spaced and (not plain or (spaced[0] != plain[0] and len(spaced) == len(plain))):
            out.append(spaced)
    return tuple(out)


def apply_logits_processors(
    logits: torch.Tensor,  # [T, V] float32, request after request
    cu_positions: np.ndarray,  # [B + 1] first logits row of each request
    histories: Sequence[TokenHistory | None],  # [B]; None: nothing to apply
) -> torch.Tensor:  # [T, V] float32 (the input itself when no row needs processing)
    """Every processed request's positions at once; rows without settings are untouched."""
    todo = [i for i, h in enumerate(histories) if h is not None and h.params.needs_history]
    if not todo:
        return logits
    for i in todo:
        n = int(cu_positions[i + 1] - cu_positions[i])
        if histories[i].num_positions != n:  # type: ignore[union-attr]
            raise ValueError(f"request {i} has {n} logits rows but its history says "
                             f"{histories[i].num_positions}")  # type: ignore[union-attr]
    hs: list[TokenHistory] = [histories[i] for i in todo]  # type: ignore[misc]
    counts = np.array([h.num_positions for h in hs], dtype=np.int64)
    starts = cu_positions[np.asarray(todo)]
    pos = np.concatenate([np.arange(s, s + n) for s, n in zip(starts.tolist(), counts.tolist())])
    pos_t = torch.from_numpy(pos)
    sub = logits[pos_t].float()  # [P, V] a copy: the input is never edited
    vocab = sub.shape[1]
    row_of = np.repeat(np.arange(len(hs)), counts)  # [P] which request each position is
    local = np.arange(len(pos)) - np.repeat(np.cumsum(counts) - counts, counts)  # [P] j
    sub = _apply_masks(sub, hs, row_of, local, vocab)
    sub = _apply_bias(sub, hs, counts)
    sub = _apply_penalties(sub, hs, row_of, local, vocab)
    masked = any(h.params.allowed_token_ids is not None or h.bad_words_token_ids
                 or h.params.min_tokens for h in hs)
    if masked and bool(torch.isneginf(sub.amax(-1)).any()):
        raise AllTokensExcludedError()
    out = logits.clone() if len(pos) != logits.shape[0] else sub
    if out is not sub:
        out[pos_t] = sub
    return out


def _apply_masks(
    sub: torch.Tensor, hs: list[TokenHistory], row_of: np.ndarray, local: np.ndarray, vocab: int
) -> torch.Tensor:  # [P, V]
    """allowed_token_ids, bad words and min_tokens: -inf at excluded (position, token)."""
    banned_p: list[int] = []
    banned_t: list[int] = []
    allowed_rows = [r for r, h in enumerate(hs) if h.params.allowed_token_ids is not None]
    keep = None
    if allowed_rows:
        keep = torch.ones(len(hs), vocab, dtype=torch.bool)  # rows without a list keep all
        for r in allowed_rows:
            keep[r] = False
            keep[r, torch.tensor(hs[r].params.allowed_token_ids, dtype=torch.int64)] = True
    for p, (r, j) in enumerate(zip(row_of.tolist(), local.tolist())):
        h = hs[r]
        if h.bad_words_token_ids:
            prefix = h.output_before(j)
            for word in h.bad_words_token_ids:
                lead = len(word) - 1
                if lead == 0 or (len(prefix) >= lead and prefix[-lead:].tolist() == list(word[:-1])):
                    banned_p.append(p)
                    banned_t.append(word[-1])
        if len(h.output_token_ids) + j < h.params.min_tokens:
            for tok in h.min_tokens_stop_ids:
                banned_p.append(p)
                banned_t.append(tok)
    if keep is not None:
        sub = sub.masked_fill(~keep[torch.from_numpy(row_of)], NEG_INF)
    if banned_p:
        sub[torch.tensor(banned_p), torch.tensor(banned_t)] = NEG_INF
    return sub


def _apply_bias(sub: torch.Tensor, hs: list[TokenHistory], counts: np.ndarray) -> torch.Tensor:
    """Add each request's logit bias at every one of its positions (only the biased ids)."""
    pos: list[int] = []
    tok: list[int] = []
    val: list[float] = []
    start = 0
    for h, n in zip(hs, counts.tolist()):
        for t, b in (h.params.logit_bias or {}).items():
            pos.extend(range(start, start + n))
            tok.extend([t] * n)
            val.extend([b] * n)
        start += n
    if pos:
        p, t = torch.tensor(pos), torch.tensor(tok)
        sub[p, t] = sub[p, t] + torch.tensor(val, dtype=torch.float32)
    return sub


def _apply_penalties(
    sub: torch.Tensor, hs: list[TokenHistory], row_of: np.ndarray, local: np.ndarray, vocab: int
) -> torch.Tensor:  # [P, V]
    """Repetition, then frequency and presence penalties, each position with its own counts.

    Only the tokens a position has seen change, so the work is gathered at those
    (position, token) pairs (a few hundred) instead of all ``P x V`` logits.
    """
    pos_l: list[np.ndarray] = []
    tok_l: list[np.ndarray] = []
    cnt_l: list[np.ndarray] = []
    hit_l: list[np.ndarray] = []  # the repetition penalty applies (prompt or output)
    par_l: list[int] = []  # the request of each gathered pair's position
    for p, (r, j) in enumerate(zip(row_of.tolist(), local.tolist())):
        h = hs[r]
        params = h.params
        rep = params.repetition_penalty != 1.0
        if not (rep or params.frequency_penalty or params.presence_penalty):
            continue
        seen, count = np.unique(h.output_before(j), return_counts=True)
        if rep and len(h.prompt_token_ids):
            toks = np.union1d(seen, h.prompt_token_ids)
        else:
            toks = seen
        cnt = np.zeros(len(toks))
        cnt[np.searchsorted(toks, seen)] = count
        pos_l.append(np.full(len(toks), p))
        tok_l.append(toks)
        cnt_l.append(cnt)
        hit_l.append(np.ones(len(toks), dtype=bool) if rep else cnt > 0)
        par_l.extend([r] * len(toks))
    if not pos_l:
        return sub
    pos = torch.from_numpy(np.concatenate(pos_l).astype(np.int64))
    tok = torch.from_numpy(np.concatenate(tok_l).astype(np.int64))
    cnt = torch.from_numpy(np.concatenate(cnt_l)).float()
    owner = torch.from_numpy(np.asarray(par_l, dtype=np.int64))
    per_row = torch.tensor([[h.params.repetition_penalty, h.params.frequency_penalty,
                             h.params.presence_penalty] for h in hs], dtype=torch.float32)
    rep_t, freq, pres = per_row[owner].unbind(1)
    vals = sub[pos, tok]
    factor = torch.where(torch.from_numpy(np.concatenate(hit_l)), rep_t, torch.ones(()))
    vals = torch.where(vals > 0, vals / factor, vals * factor)
    vals = vals - freq * cnt
    vals = vals - pres * (cnt > 0).float()
    sub[pos, tok] = vals
    return sub


def apply_logits_processors_reference(
    logits: torch.Tensor,  # [T, V]
    cu_positions: np.ndarray,  # [B + 1]
    histories: Sequence[TokenHistory | None],  # [B]
) -> torch.Tensor:  # [T, V]
    """One position at a time, written to be read; the vectorised version must equal it."""
    out = logits.float().clone()
    for i, h in enumerate(histories):
        if h is None or not h.params.needs_history:
            continue
        for j in range(h.num_positions):
            row = out[int(cu_positions[i]) + j]
            prefix = h.output_before(j).tolist()
            params = h.params
            if params.allowed_token_ids is not None:
                allowed = set(params.allowed_token_ids)
                for t in range(len(row)):
                    if t not in allowed:
                        row[t] = NEG_INF
            for word in h.bad_words_token_ids:
                if not word[:-1] or prefix[-(len(word) - 1):] == list(word[:-1]):
                    row[word[-1]] = NEG_INF
            if len(prefix) < params.min_tokens:
                for t in h.min_tokens_stop_ids:
                    row[t] = NEG_INF
            for t, b in (params.logit_bias or {}).items():
                row[t] += torch.tensor(b, dtype=torch.float32)
            seen = set(prefix) | set(h.prompt_token_ids.tolist())
            rp = torch.tensor(params.repetition_penalty, dtype=torch.float32)
            for t in seen if params.repetition_penalty != 1.0 else ():
                row[t] = row[t] / rp if row[t] > 0 else row[t] * rp
            for t in set(prefix):
                freq = torch.tensor(params.frequency_penalty, dtype=torch.float32)
                pres = torch.tensor(params.presence_penalty, dtype=torch.float32)
                row[t] = row[t] - freq * prefix.count(t)
                row[t] = row[t] - pres
            if bool(torch.isneginf(row).all()):
                raise AllTokensExcludedError()
    return out


__all__ = [
    "AllTokensExcludedError",
    "TokenHistory",
    "apply_logits_processors",
    "apply_logits_processors_reference",
    "bad_words_token_ids",
    "token_history",
]
