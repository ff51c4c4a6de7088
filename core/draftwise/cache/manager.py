"""Per-request block tables over the block pool: the interface the scheduler calls each step.

A request's life, as the scheduler drives it::

    cached = kv.get_computed_blocks(rid, prompt)      # (re)admission: attach cached prefix
    kv.allocate_slots(rid, computed + new + k)        # every step; False -> preempt someone
    ... forward, verify ...
    kv.truncate(rid, computed_after)                  # drop the rejected drafts' blocks
    kv.cache_blocks(rid, verified_tokens, computed_after)
    kv.free(rid)                                      # finish, abort, preemption

Semantics worth knowing:

- Block 0 is never in a table (see ``blocks.py``); tables are padded with it.
- ``get_computed_blocks`` takes references at once, so the matched blocks cannot be
  evicted before ``allocate_slots``. When that ``allocate_slots`` fails, the scheduler
  should ``free`` the request and forget the cached count (look up again next time):
  waiting requests that keep looked-up blocks across steps can deadlock a tight pool,
  each holding part of it with nothing running.
- A table only grows at its end (``allocate_slots``) or shrinks from its end
  (``truncate``, ``free``); entries are never swapped, so a block id the engine saw for a
  position stays valid until that position is truncated.
- Blocks a request registered in the prefix cache are immutable: ``truncate`` may drop
  them only whole (at a block boundary), never keep one partially to be overwritten.
- Drafters that keep their own KV in the pool (a draft model) write a block's entries
  when their frontier passes it, which may be long after the target did (a row left at
  k = 0 never shows its positions to the draft). So a block is registered once the
  target's K/V is verified, and ``mark_drafts_ready`` records, per physical block, when
  the drafters' KV is written too; a hit reports how many of its leading blocks are
  (``num_drafts_ready_tokens``), where a draft model starts catching up from tokens. A
  drafter conditioned on the target's hidden states cannot catch up over a hit (those
  positions are not recomputed): with ``hit_needs_drafts_ready`` a hit stops at the first
  block not ready.
- When two requests compute the same prefix concurrently, the first to register it wins;
  the second keeps its own private copy and chains later blocks under the winner's entry.
  If the winner's block is later evicted, those later blocks become unreachable (a lost
  hit, never a wrong one) until they are evicted in turn.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from draftwise.cache.blocks import (
    BlockPool,
    HashFn,
    PrefixEntry,
    TokenIds,
    block_tokens,
    hash_block_tokens,
)
from draftwise.cache.errors import (
    CacheArgumentError,
    CacheInvariantError,
    DuplicateRequestError,
    UnknownRequestError,
)


@dataclass(slots=True)
class PrefixCacheStats:
    """Cumulative prefix-cache counters, in tokens, as vLLM reports them."""

    #: admissions that looked the cache up
    requests: int = 0
    #: prompt tokens looked up
    queries: int = 0
    #: of those, tokens served from the cache
    hits: int = 0

    @property
    def hit_rate(self) -> float:
        """Fraction of queried tokens that were hits."""
        return self.hits / self.queries if self.queries else 0.0


@dataclass(slots=True)
class _RequestBlocks:
    """One request's block table and the prefix-cache chain of its leading full blocks."""

    block_ids: list[int] = field(default_factory=list)
    #: entry for each leading full verified block (its own block's, or an identical one's)
    entries: list[PrefixEntry] = field(default_factory=list)
    #: leading blocks of ``block_ids`` whose drafters' KV is written (``Block.drafts_ready``)
    drafts_ready: int = 0


def _cdiv(a: int, b: int) -> int:
    """Ceiling division."""
    return -(-a // b)


class KVCacheManager:
    """Block tables per request over one :class:`BlockPool`; every call is O(blocks touched)."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_prefix_caching: bool = True,
        hash_fn: HashFn = hash_block_tokens,
        drop_last_cached_block: bool = False,
        hit_needs_drafts_ready: bool = False,
    ) -> None:
        self.pool = BlockPool(num_blocks, block_size, enable_prefix_caching, hash_fn)
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        #: a hit gives up its last matched block: a drafter's KV at a block's last position
        #: also depends on the next token, which the block's hash does not cover (MTP pairs
        #: h_p with x_{p+1}); vLLM drops the block for EAGLE-like drafters the same way
        self.drop_last_cached_block = drop_last_cached_block
        #: a hit ends at the first block whose drafters' KV is not written (a drafter that
        #: reads the target's hidden states cannot catch up over cached positions)
        self.hit_needs_drafts_ready = hit_needs_drafts_ready
        self._requests: dict[str, _RequestBlocks] = {}
        self._stats = PrefixCacheStats()

    # -- sizes and metrics ------------------------------------------------------------------

    @property
    def capacity(self) -> int:
        """Blocks requests can hold (``num_blocks - 1``: block 0 is reserved)."""
        return self.pool.capacity

    @property
    def num_free_blocks(self) -> int:
        """Blocks allocatable now (free cached blocks count: they are evicted on demand)."""
        return self.pool.num_free_blocks

    @property
    def num_used_blocks(self) -> int:
        """Blocks held by at least one request."""
        return self.pool.num_used_blocks

    @property
    def usage(self) -> float:
        """Fraction of the capacity in use, for metrics and the log line."""
        return self.pool.num_used_blocks / self.pool.capacity

    @property
    def num_requests(self) -> int:
        """Requests holding a table (possibly empty)."""
        return len(self._requests)

    @property
    def prefix_cache_stats(self) -> PrefixCacheStats:
        """A copy of the cumulative counters."""
        s = self._stats
        return PrefixCacheStats(s.requests, s.queries, s.hits)

    def __contains__(self, req_id: object) -> bool:
        return req_id in self._requests

    def block_table(self, req_id: str) -> list[int]:
        """A copy of the request's block ids, position order; the engine pads with 0."""
        return list(self._get(req_id).block_ids)

    def num_cached_tokens(self, req_id: str) -> int:
        """Leading tokens of the request held in the prefix cache (immutable blocks)."""
        return len(self._get(req_id).entries) * self.block_size

    # -- the per-step calls -------------------------------------------------------------------

    def get_computed_blocks(self, req_id: str, token_ids: TokenIds) -> int:
        """On (re)admission, attach the longest cached prefix; returns its length in tokens.

        Only full blocks match, and never the whole prompt: at least one token is left to
        compute so the step has logits (with ``drop_last_cached_block``, one block less).
        Callable again while the request holds no blocks.
        """
        req = self._requests.get(req_id)
        if req is not None and req.block_ids:
            raise DuplicateRequestError(req_id, "KV cache manager (it already holds blocks)")
        if req is None:
            req = self._requests[req_id] = _RequestBlocks()
        if not self.enable_prefix_caching:
            return 0
        max_blocks = max(0, (len(token_ids) - 1) // self.block_size)
        entries = self.pool.find_cached_prefix(token_ids, max_blocks)
        if self.drop_last_cached_block:
            entries = entries[:-1]
        ready = 0
        while ready < len(entries) and self.pool.drafts_ready(entries[ready].block_id):
            ready += 1
        if self.hit_needs_drafts_ready:
            entries = entries[:ready]
        block_ids = [e.block_id for e in entries]
        self.pool.incref(block_ids)
        req.block_ids = block_ids
        req.entries = list(entries)
        req.drafts_ready = ready
        num_cached = len(entries) * self.block_size
        self._stats.requests += 1
        self._stats.queries += len(token_ids)
        self._stats.hits += num_cached
        return num_cached

    def num_drafts_ready_tokens(self, req_id: str) -> int:
        """Leading tokens of the request whose drafters' KV is written: on admission, the
        part of its prefix hit that is (see the module docstring)."""
        return self._get(req_id).drafts_ready * self.block_size

    def mark_drafts_ready(self, req_id: str, num_tokens: int) -> None:
        """Every own-KV drafter has written the request's first ``num_tokens`` positions:
        its full blocks up to there are ready for drafts (a later hit starts a draft's
        frontier there). Only the request's own table's blocks are marked."""
        req = self._get(req_id)
        full = min(num_tokens // self.block_size, len(req.block_ids))
        for i in range(req.drafts_ready, full):
            self.pool.mark_drafts_ready(req.block_ids[i])
        req.drafts_ready = max(req.drafts_ready, full)

    def num_new_blocks(self, req_id: str, num_total_tokens: int) -> int:
        """Blocks ``allocate_slots`` would take for this size (for preemption planning)."""
        req = self._requests.get(req_id)
        have = len(req.block_ids) if req is not None else 0
        return max(0, _cdiv(num_total_tokens, self.block_size) - have)

    def allocate_slots(self, req_id: str, num_total_tokens: int) -> bool:
        """Grow the table to cover ``num_total_tokens`` slots, all or nothing.

        ``num_total_tokens`` counts computed tokens, this step's new tokens and the k
        lookahead draft slots. Returns False, changing nothing, when too few blocks are
        free; the scheduler then preempts someone. A smaller size never shrinks the table.
        """
        if num_total_tokens < 0:
            raise CacheArgumentError(f"num_total_tokens must be >= 0, got {num_total_tokens}")
        need = self.num_new_blocks(req_id, num_total_tokens)
        if need > self.pool.num_free_blocks:
            return False
        req = self._requests.get(req_id)
        if req is None:
            req = self._requests[req_id] = _RequestBlocks()
        if need:
            req.block_ids.extend(self.pool.allocate(need))
        return True

    def cache_blocks(self, req_id: str, token_ids: TokenIds, num_computed_tokens: int) -> None:
        """Register blocks that became full of verified tokens (never drafts) for reuse.

        ``token_ids`` are the request's verified tokens (prompt + accepted output; a
        trailing bonus token is fine) and ``num_computed_tokens`` how many of them have
        their K/V written. Only blocks not registered before are hashed.
        """
        req = self._get(req_id)
        if not self.enable_prefix_caching:
            return
        if not 0 <= num_computed_tokens <= len(token_ids):
            raise CacheArgumentError(
                f"num_computed_tokens {num_computed_tokens} is outside the "
                f"{len(token_ids)} verified tokens given"
            )
        size = self.block_size
        full = num_computed_tokens // size
        if full > len(req.block_ids):
            raise CacheArgumentError(
                f"{num_computed_tokens} computed tokens need {full} blocks; "
                f"request {req_id!r} holds {len(req.block_ids)}"
            )
        entries = req.entries
        for i in range(len(entries), full):
            parent = entries[-1] if entries else None
            tokens = block_tokens(token_ids, i * size, (i + 1) * size)
            entries.append(self.pool.register(req.block_ids[i], parent, tokens))

    def truncate(self, req_id: str, num_tokens: int) -> int:
        """Speculative rollback: keep the first ``num_tokens`` slots; returns blocks freed.

        Whole blocks past ``ceil(num_tokens / block_size)`` lose this request's reference
        (a block shared through the prefix cache stays alive for its other users). The
        kept slots past ``num_tokens`` are simply overwritten later.
        """
        req = self._get(req_id)
        if num_tokens < 0:
            raise CacheArgumentError(f"num_tokens must be >= 0, got {num_tokens}")
        size = self.block_size
        if num_tokens % size and num_tokens // size < len(req.entries):
            raise CacheArgumentError(
                f"truncating request {req_id!r} to {num_tokens} tokens would leave cached "
                f"block {num_tokens // size} partly kept and then overwritten; cut at a "
                f"block boundary or at/after its {len(req.entries) * size} cached tokens"
            )
        keep = _cdiv(num_tokens, size)
        if keep >= len(req.block_ids):
            return 0
        dropped = req.block_ids[keep:]
        del req.block_ids[keep:]
        del req.entries[keep:]
        req.drafts_ready = min(req.drafts_ready, keep)
        self.pool.decref(reversed(dropped))
        return len(dropped)

    def free(self, req_id: str) -> int:
        """Return all of a request's blocks (finish, abort, preemption); returns how many.

        Unknown ids are a no-op, so aborting a request that never got blocks is safe.
        Blocks are released tail first, so a prefix's deeper blocks are evicted before
        its earlier ones.
        """
        req = self._requests.pop(req_id, None)
        if req is None:
            return 0
        self.pool.decref(reversed(req.block_ids))
        return len(req.block_ids)

    def reset_prefix_cache(self) -> int:
        """Forget all free cached blocks (a cold cache for benchmarks); returns how many."""
        return self.pool.reset_prefix_cache()

    # -- checking ---------------------------------------------------------------------------

    def check_invariants(self) -> None:
        """O(num_blocks) audit for tests: refcounts match tables, free and used are disjoint."""
        refs: Counter[int] = Counter()
        for req_id, req in self._requests.items():
            if len(set(req.block_ids)) != len(req.block_ids):
                raise CacheInvariantError(f"request {req_id!r} holds a block twice")
            if len(req.entries) > len(req.block_ids):
                raise CacheInvariantError(f"request {req_id!r} has more cached blocks than blocks")
            parent_id: int | None = None
            for entry in req.entries:
                if entry.parent_id != parent_id:
                    raise CacheInvariantError(f"request {req_id!r} has a broken prefix chain")
                parent_id = entry.entry_id
            refs.update(req.block_ids)
        total_refs = sum(self.pool.ref_count(b) for b in range(1, self.pool.num_blocks))
        total_len = sum(len(r.block_ids) for r in self._requests.values())
        if total_refs != total_len:
            raise CacheInvariantError(
                f"sum of ref counts {total_refs} != sum of table lengths {total_len}"
            )
        self.pool.check_invariants(refs)

    def _get(self, req_id: str) -> _RequestBlocks:
        """The request's state, or a typed error naming it."""
        req = self._requests.get(req_id)
        if req is None:
            raise UnknownRequestError(req_id, "KV cache manager")
        return req
