"""The engine's per-token log-probabilities in OpenAI's two response shapes.

Chat: ``{"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}], "refusal": None}``.
Completions (legacy): ``{"tokens", "token_logprobs", "top_logprobs", "text_offset"}``.
Completions' ``prompt_logprobs`` (vLLM's shape): per prompt token ``None`` (the first)
or ``{token_id: {"logprob", "rank", "decoded_token"}}``.
Which distribution they come from is the engine's ``logprobs_mode`` (``draftwise.logprobs``).
A streamed chunk carries the entries of the tokens that step added.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from draftwise.logprobs import Logprob, PositionLogprobs


def _token(lp: Logprob, tok: int) -> str:
    """The token's text; its id in vLLM's ``token_id:N`` form when there is no text."""
    return lp.decoded_token if lp.decoded_token is not None else f"token_id:{tok}"


def _top(pos: PositionLogprobs, num: int) -> list[tuple[int, Logprob]]:
    """The ``num`` most likely entries, best first (the chosen one is always first in
    ``pos``, and stays in only if it is among the top)."""
    return sorted(pos.items(), key=lambda kv: kv[1].rank)[:num]


def chat_logprobs(
    positions: Sequence[PositionLogprobs], tokens: Sequence[int], num: int
) -> dict[str, Any]:
    """Chat's ``choices[i].logprobs`` for these tokens."""
    content = []
    for pos, tok in zip(positions, tokens):
        lp = pos[tok]
        text = _token(lp, tok)
        content.append({
            "token": text,
            "logprob": lp.logprob,
            "bytes": list(text.encode("utf-8")),
            "top_logprobs": [
                {"token": _token(v, t), "logprob": v.logprob,
                 "bytes": list(_token(v, t).encode("utf-8"))}
                for t, v in _top(pos, num)
            ],
        })
    return {"content": content, "refusal": None}


def completion_logprobs(
    positions: Sequence[PositionLogprobs], tokens: Sequence[int], num: int, offset: int
) -> dict[str, Any]:
    """The completions endpoint's ``choices[i].logprobs``; ``offset`` is where the first
    token's text starts in the choice's text."""
    out: dict[str, Any] = {"tokens": [], "token_logprobs": [], "top_logprobs": [],
                           "text_offset": []}
    for pos, tok in zip(positions, tokens):
        lp = pos[tok]
        text = _token(lp, tok)
        out["tokens"].append(text)
        out["token_logprobs"].append(lp.logprob)
        out["top_logprobs"].append({_token(v, t): v.logprob for t, v in _top(pos, num)})
        out["text_offset"].append(offset)
        offset += len(text)
    return out




def prompt_logprobs_json(positions: Sequence[PositionLogprobs | None]) -> list[Any]:
    """vLLM's ``prompt_logprobs``: the actual token first, then the top-n, by token id."""
    return [None if pos is None else {
        str(t): {"logprob": lp.logprob, "rank": lp.rank, "decoded_token": lp.decoded_token}
        for t, lp in pos.items()} for pos in positions]


__all__ = ["chat_logprobs", "completion_logprobs", "prompt_logprobs_json"]
