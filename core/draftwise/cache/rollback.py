"""Speculative rollback after verification: the one call that undoes rejected drafts.

A verify row fed ``[x_last, d_1..d_n]``; ``j`` drafts were accepted. Two kinds of state
moved past the accepted prefix and must come back:

- K/V (full attention): rolled back by position (gpt-fast's idea). The table is truncated
  logically to the tokens whose K/V is now valid, whole blocks past the end are freed,
  and the stale slots left in the last kept block are overwritten by later steps.
- Recurrent state (GDN, short conv): it cannot be truncated, so the state after verify
  token ``j`` is taken from the per-position spec states the model wrote
  (``RecurrentStatePool.commit``; a full accept needs no copy).

Models without recurrent layers pass ``recurrent=None``; the call then only truncates.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from draftwise.cache.errors import CacheArgumentError, UnknownRequestError

if TYPE_CHECKING:
    from draftwise.cache.manager import KVCacheManager
    from draftwise.cache.recurrent import RecurrentStatePool


def rollback(
    kv: KVCacheManager,
    req_ids: Sequence[str],
    num_computed_tokens: Sequence[int],
    num_drafts: Sequence[int],
    num_accepted: Sequence[int],
    recurrent: RecurrentStatePool | None = None,
) -> int:
    """Roll each verify row back to its accepted prefix; returns the KV blocks freed.

    :param kv: the KV cache manager holding the rows' block tables.
    :param req_ids: the verify rows' requests (rows with no drafts may be included).
    :param num_computed_tokens: per row, tokens whose K/V is valid after this step:
        everything before the step, the row's non-draft tokens and the ``num_accepted``
        accepted drafts (the recovered/bonus token has no K/V yet).
    :param num_drafts: per row, draft tokens that were verified (``n``).
    :param num_accepted: per row, how many of them were accepted (``0 <= j <= n``).
    :param recurrent: the model's recurrent-state pool, or None for pure attention.
    :returns: how many KV blocks were freed, over all rows.
    """
    rows = len(req_ids)
    if not len(num_computed_tokens) == len(num_drafts) == len(num_accepted) == rows:
        raise CacheArgumentError(
            "req_ids, num_computed_tokens, num_drafts and num_accepted differ in length"
        )
    # check every row before changing anything, so a bad row leaves the batch untouched
    for req_id, drafts, accepted in zip(req_ids, num_drafts, num_accepted, strict=True):
        if not 0 <= accepted <= drafts:
            raise CacheArgumentError(
                f"request {req_id!r}: accepted {accepted} of {drafts} drafts is impossible"
            )
        if req_id not in kv:
            raise UnknownRequestError(req_id, "KV cache manager")
        if recurrent is not None:
            if req_id not in recurrent:
                raise UnknownRequestError(req_id, "recurrent-state pool")
            if drafts > recurrent.max_spec_positions:
                raise CacheArgumentError(
                    f"request {req_id!r}: {drafts} drafts exceed the recurrent pool's "
                    f"max_spec_positions {recurrent.max_spec_positions}"
                )
    if len(set(req_ids)) != rows:
        raise CacheArgumentError("a request appears twice in one rollback")

    freed = 0
    for req_id, num_tokens in zip(req_ids, num_computed_tokens, strict=True):
        freed += kv.truncate(req_id, num_tokens)
    if recurrent is not None:
        recurrent.commit(req_ids, num_accepted, num_drafts)
    return freed
