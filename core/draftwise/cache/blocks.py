"""The physical KV block pool: free lists, reference counts and the chained prefix cache.

Block ids index the first dimension of every layer's ``KVCache`` tensor. Block 0 is
reserved as the null block: the engine pads block tables with 0, so padding may read
(or a padded row may write) block 0 without touching anyone's data. The pool therefore
hands out at most ``num_blocks - 1`` blocks (``capacity``).

Prefix caching follows nano-vllm: a full block of *verified* tokens is registered under
``hash_fn(parent_hash, tokens)``, chained over the previous block's hash. A hash is only
a bucket address: a hit must also match the stored tokens and the exact parent entry
(``entry_id`` is never reused), so a collision, in the block or anywhere in its prefix,
can never hand out wrong K/V. A freed block keeps its entry until the block is reused.

Free blocks sit in two queues, both O(1) per operation: never-cached blocks first, then
cached blocks in LRU order (the block freed longest ago is evicted first). Handing out
uncached blocks before evicting cached ones keeps the cache as long as possible.

An optional ``listener`` hears each entry stored and evicted, so a server can publish
what its cache holds to a router (``draftwise.server.block_events``).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar, Protocol

import numpy as np

from draftwise.cache.errors import CacheArgumentError, CacheInvariantError, OutOfBlocksError

#: ``hash_fn(parent_hash, block_tokens)``; ``parent_hash`` is None for the first block
HashFn = Callable[[int | None, tuple[int, ...]], int]
#: a request's tokens: a list, or the int array ``Request.all_token_ids`` returns
TokenIds = Sequence[int] | np.ndarray


def block_tokens(token_ids: TokenIds, start: int, end: int) -> tuple[int, ...]:
    """Plain-int tuple of ``token_ids[start:end]``: hashable, compact, fast to compare."""
    chunk = token_ids[start:end]
    if isinstance(chunk, np.ndarray):
        return tuple(chunk.tolist())
    return tuple(chunk)


def hash_block_tokens(parent_hash: int | None, token_ids: tuple[int, ...]) -> int:
    """Chain over the parent so one block under two different prefixes hashes apart."""
    return hash((parent_hash, token_ids))


@dataclass(frozen=True, slots=True, eq=False)
class PrefixEntry:
    """One full block in the prefix cache; ``entry_id`` pins its exact prefix chain."""

    block_id: int
    block_hash: int
    #: unique over the pool's lifetime, so a child can name its parent unambiguously
    entry_id: int
    #: ``entry_id`` of the previous block's entry; None for a sequence's first block
    parent_id: int | None
    token_ids: tuple[int, ...]


@dataclass(slots=True)
class Block:
    """Bookkeeping for one physical block."""

    block_id: int
    ref_count: int = 0
    entry: PrefixEntry | None = None
    #: every own-KV drafter's KV of this block is written (its frontier passed it); a
    #: block handed out afresh starts without (``KVCacheManager.mark_drafts_ready``)
    drafts_ready: bool = False


class BlockListener(Protocol):
    """Told, on the thread that owns the pool, of each cached entry as it comes and goes."""

    def stored(self, block_hash: int, parent_hash: int | None,
               token_ids: tuple[int, ...]) -> None: ...
    def evicted(self, block_hash: int) -> None: ...


class BlockPool:
    """Hands out KV blocks, counts their users and remembers full blocks for reuse."""

    #: reserved padding block, never handed out
    NULL_BLOCK_ID: ClassVar[int] = 0

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_prefix_caching: bool = True,
        hash_fn: HashFn = hash_block_tokens,
    ) -> None:
        if num_blocks < 2:
            raise CacheArgumentError(
                f"num_blocks must be at least 2 (block 0 is the reserved null block), "
                f"got {num_blocks}"
            )
        if block_size < 1:
            raise CacheArgumentError(f"block_size must be positive, got {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.hash_fn = hash_fn
        self._blocks = [Block(i) for i in range(num_blocks)]
        self._free_uncached: deque[int] = deque(range(1, num_blocks))
        self._free_cached: OrderedDict[int, None] = OrderedDict()
        self._table: dict[int, list[PrefixEntry]] = {}
        self._num_entries = 0
        self._next_entry_id = 0
        #: told of every entry stored and evicted (the server's prefix-block event log, so
        #: an external router knows what this pool holds); None: nobody listens
        self.listener: BlockListener | None = None

    # -- sizes ----------------------------------------------------------------------------

    @property
    def capacity(self) -> int:
        """Blocks that can be handed out (the null block excluded)."""
        return self.num_blocks - 1

    @property
    def num_free_blocks(self) -> int:
        """Blocks with no user, cached or not; all of them can be allocated."""
        return len(self._free_uncached) + len(self._free_cached)

    @property
    def num_used_blocks(self) -> int:
        """Blocks with at least one user."""
        return self.capacity - self.num_free_blocks

    @property
    def num_cached_blocks(self) -> int:
        """Blocks registered in the prefix cache, in use or free."""
        return self._num_entries

    def ref_count(self, block_id: int) -> int:
        """Users of a block (requests whose table holds it)."""
        return self._blocks[block_id].ref_count

    def entry(self, block_id: int) -> PrefixEntry | None:
        """The block's prefix-cache entry, if it holds one."""
        return self._blocks[block_id].entry

    # -- allocation and reference counts --------------------------------------------------

    def allocate(self, n: int) -> list[int]:
        """Take ``n`` blocks with one reference each, all or none; evicts LRU cached blocks."""
        if n < 0:
            raise CacheArgumentError(f"cannot allocate {n} blocks")
        if n > self.num_free_blocks:
            raise OutOfBlocksError(n, self.num_free_blocks)
        out: list[int] = []
        for _ in range(n):
            if self._free_uncached:
                block_id = self._free_uncached.popleft()
            else:
                block_id, _ = self._free_cached.popitem(last=False)
                self._evict(block_id)
            block = self._blocks[block_id]
            block.ref_count, block.drafts_ready = 1, False
            out.append(block_id)
        return out

    def drafts_ready(self, block_id: int) -> bool:
        """Whether the drafters' KV of the block is written (see ``Block.drafts_ready``)."""
        return self._blocks[block_id].drafts_ready

    def mark_drafts_ready(self, block_id: int) -> None:
        """The drafters' KV of this block is written (it stays so until reallocated)."""
        self._block(block_id).drafts_ready = True

    def incref(self, block_ids: Iterable[int]) -> None:
        """Add a user to blocks found in the prefix cache (reviving free cached ones)."""
        for block_id in block_ids:
            block = self._block(block_id)
            if block.ref_count == 0:
                if block_id not in self._free_cached:
                    raise CacheInvariantError(
                        f"block {block_id} is free and uncached; nothing may reference it"
                    )
                del self._free_cached[block_id]
            block.ref_count += 1

    def decref(self, block_ids: Iterable[int]) -> None:
        """Drop a user from each block; give them in eviction order (first = evicted first)."""
        for block_id in block_ids:
            block = self._block(block_id)
            if block.ref_count <= 0:
                raise CacheInvariantError(f"block {block_id} freed more often than taken")
            block.ref_count -= 1
            if block.ref_count == 0:
                if block.entry is not None:
                    self._free_cached[block_id] = None
                else:
                    self._free_uncached.append(block_id)

    def _block(self, block_id: int) -> Block:
        """Bounds-checked access that refuses the null block."""
        if not 0 < block_id < self.num_blocks:
            raise CacheArgumentError(f"block id {block_id} is not a usable block")
        return self._blocks[block_id]

    # -- prefix cache ---------------------------------------------------------------------

    def find_cached_prefix(self, token_ids: TokenIds, max_blocks: int) -> list[PrefixEntry]:
        """The longest verified chain of cached full blocks that starts ``token_ids``."""
        if not self.enable_prefix_caching:
            return []
        size = self.block_size
        found: list[PrefixEntry] = []
        parent: PrefixEntry | None = None
        for i in range(min(max_blocks, len(token_ids) // size)):
            tokens = block_tokens(token_ids, i * size, (i + 1) * size)
            entry = self._lookup(self._hash(parent, tokens), parent, tokens)
            if entry is None:
                break
            found.append(entry)
            parent = entry
        return found

    def register(
        self, block_id: int, parent: PrefixEntry | None, token_ids: tuple[int, ...]
    ) -> PrefixEntry:
        """Cache a full block of verified tokens; an identical existing entry is returned instead.

        Returning the existing entry (the block stays unregistered) keeps one entry per
        prefix, so the caller's chain continues under it.
        """
        if not self.enable_prefix_caching:
            raise CacheArgumentError("prefix caching is disabled in this pool")
        if len(token_ids) != self.block_size:
            raise CacheArgumentError(
                f"only full blocks are cached: got {len(token_ids)} tokens, "
                f"block_size is {self.block_size}"
            )
        block_hash = self._hash(parent, token_ids)
        existing = self._lookup(block_hash, parent, token_ids)
        if existing is not None:
            return existing
        block = self._block(block_id)
        if block.ref_count == 0:
            raise CacheArgumentError(f"block {block_id} is free; only held blocks are cached")
        if block.entry is not None:
            raise CacheInvariantError(f"block {block_id} is already cached with other contents")
        entry = PrefixEntry(
            block_id=block_id,
            block_hash=block_hash,
            entry_id=self._next_entry_id,
            parent_id=None if parent is None else parent.entry_id,
            token_ids=token_ids,
        )
        self._next_entry_id += 1
        self._table.setdefault(block_hash, []).append(entry)
        self._num_entries += 1
        block.entry = entry
        if self.listener is not None:
            self.listener.stored(block_hash, None if parent is None else parent.block_hash,
                                 token_ids)
        return entry

    def cached_blocks(self) -> list[tuple[int, int | None, tuple[int, ...]]]:
        """(hash, parent hash, tokens) of every reachable cached entry, parents first; an
        entry whose parent was evicted is unreachable (``find_cached_prefix`` stops there)
        and left out."""
        entries = sorted((e for bucket in self._table.values() for e in bucket),
                         key=lambda e: e.entry_id)
        hashes: dict[int, int] = {}
        out: list[tuple[int, int | None, tuple[int, ...]]] = []
        for e in entries:  # a parent's entry id is always smaller than its child's
            if e.parent_id is not None and e.parent_id not in hashes:
                continue
            hashes[e.entry_id] = e.block_hash
            out.append((e.block_hash, None if e.parent_id is None else hashes[e.parent_id],
                        e.token_ids))
        return out

    def reset_prefix_cache(self) -> int:
        """Forget every free cached block (benchmarks want a cold cache); returns how many."""
        evicted = 0
        while self._free_cached:
            block_id, _ = self._free_cached.popitem(last=False)
            self._evict(block_id)
            self._free_uncached.append(block_id)
            evicted += 1
        return evicted

    def _hash(self, parent: PrefixEntry | None, token_ids: tuple[int, ...]) -> int:
        """Chained block hash."""
        return self.hash_fn(None if parent is None else parent.block_hash, token_ids)

    def _lookup(
        self, block_hash: int, parent: PrefixEntry | None, token_ids: tuple[int, ...]
    ) -> PrefixEntry | None:
        """The entry under this hash whose parent and tokens match exactly, if any."""
        parent_id = None if parent is None else parent.entry_id
        for entry in self._table.get(block_hash, ()):
            if entry.parent_id == parent_id and entry.token_ids == token_ids:
                return entry
        return None

    def _evict(self, block_id: int) -> None:
        """Drop a block's entry as the block is reused."""
        block = self._blocks[block_id]
        entry = block.entry
        if entry is None:
            return
        bucket = self._table[entry.block_hash]
        bucket.remove(entry)
        if not bucket:
            del self._table[entry.block_hash]
        self._num_entries -= 1
        block.entry = None
        if self.listener is not None:
            self.listener.evicted(entry.block_hash)

    # -- checking -------------------------------------------------------------------------

    def check_invariants(self, expected_refs: Mapping[int, int]) -> None:
        """O(num_blocks) audit for tests: ``expected_refs[b]`` = tables holding block ``b``."""
        null = self._blocks[self.NULL_BLOCK_ID]
        if null.ref_count or null.entry is not None or self.NULL_BLOCK_ID in expected_refs:
            raise CacheInvariantError("the null block was handed out or cached")
        uncached = set(self._free_uncached)
        if len(uncached) != len(self._free_uncached):
            raise CacheInvariantError("a block sits twice in the uncached free list")
        cached = set(self._free_cached)
        if uncached & cached or self.NULL_BLOCK_ID in uncached | cached:
            raise CacheInvariantError("free lists overlap or hold the null block")
        for block in self._blocks[1:]:
            want = expected_refs.get(block.block_id, 0)
            if block.ref_count != want:
                raise CacheInvariantError(
                    f"block {block.block_id}: ref_count {block.ref_count}, held by {want} tables"
                )
            in_uncached = block.block_id in uncached
            in_cached = block.block_id in cached
            if block.ref_count > 0 and (in_uncached or in_cached):
                raise CacheInvariantError(f"block {block.block_id} is both used and free")
            if block.ref_count == 0 and in_cached != (block.entry is not None):
                raise CacheInvariantError(f"free block {block.block_id} is in the wrong list")
            if block.ref_count == 0 and not (in_uncached or in_cached):
                raise CacheInvariantError(f"block {block.block_id} leaked: no user, not free")
        entries = [e for bucket in self._table.values() for e in bucket]
        if len(entries) != self._num_entries:
            raise CacheInvariantError("cached-entry count drifted")
        for block_hash, bucket in self._table.items():
            for entry in bucket:
                if (
                    entry.block_hash != block_hash
                    or self._blocks[entry.block_id].entry is not entry
                ):
                    raise CacheInvariantError(f"stale table entry for block {entry.block_id}")
        if sum(1 for b in self._blocks if b.entry is not None) != self._num_entries:
            raise CacheInvariantError("a block holds an entry missing from the table")
