"""Committing a step's tokens one by one, stopping exactly where a stop condition fires.

A speculative step commits up to k + 1 tokens at once. Every stop condition is checked
after EACH token, in the order plain decoding would meet them, and the tokens after the
stopping one are dropped before anything counts them: the request's token ids, its text,
usage, metrics and the streamed delta all end at the stop (vLLM and SGLang have shipped
bugs where tokens past a stop inside an accepted block leaked into usage or text).

- EOS (unless ``ignore_eos``) and ``stop_token_ids`` stop on the token itself;
- ``max_tokens`` stops on the token that reaches it;
- a stop string stops on the token whose text completes it (the text is cut at the
  string, or after it with ``include_stop_str_in_output``);
- before ``min_tokens`` tokens none of these but ``max_tokens`` applies (vLLM: EOS and
  stop ids are also excluded by the logits processing, so they are not generated).
"""

from __future__ import annotations

from draftwise.request import Request, RequestStatus


def append_tokens(req: Request, toks: list[int]) -> int:
    """Append ``toks`` up to the first stop; sets ``new_token_ids``/``new_text``; returns
    how many were kept."""
    params = req.params
    new: list[int] = []
    old_len = len(req.text)
    for tok in toks:
        req.append(tok)
        new.append(tok)
        past_min = req.num_output_tokens > params.min_tokens
        if past_min and not params.ignore_eos and tok in req.eos_token_ids:
            req.status, req.stop_reason = RequestStatus.FINISHED_STOPPED, None
        elif past_min and tok in params.stop_token_ids_set:
            req.status, req.stop_reason = RequestStatus.FINISHED_STOPPED, tok
        elif req.num_output_tokens >= params.max_tokens:
            req.status = RequestStatus.FINISHED_LENGTH
        if req.detok_state is not None:
            before = len(req.text)
            req.text += req.detok_state.step([tok])
            if req.status.finished:
                req.text += req.detok_state.flush()
            elif params.stop_strings and past_min:
                _check_stop_strings(req, before)
        if req.status.finished:
            break
    req.new_token_ids = new
    req.new_text = req.text[old_len:]
    return len(new)


def _check_stop_strings(req: Request, old_len: int) -> None:
    """Cut the text at the first stop string the last token's text completes."""
    params = req.params
    for stop in params.stop_strings:
        begin = max(0, old_len - len(stop) + 1)
        idx = req.text.find(stop, begin)
        if idx != -1:
            end = idx + len(stop) if params.include_stop_str_in_output else idx
            req.text = req.text[:end]
            req.status, req.stop_reason = RequestStatus.FINISHED_STOPPED, stop
            return


__all__ = ["append_tokens"]
