"""Paged KV blocks, prefix caching, recurrent-state slots and speculative rollback.

``KVCacheManager`` is what the scheduler calls; ``BlockPool`` is its physical layer;
``RecurrentStatePool`` holds linear-attention state; ``rollback`` undoes rejected drafts
in both. Block 0 is reserved as the null (padding) block.
"""

from __future__ import annotations

from draftwise.cache.blocks import BlockPool, PrefixEntry, hash_block_tokens
from draftwise.cache.errors import (
    CacheArgumentError,
    CacheError,
    CacheInvariantError,
    DuplicateRequestError,
    OutOfBlocksError,
    OutOfCapacityError,
    OutOfSlotsError,
    UnknownRequestError,
)
from draftwise.cache.manager import KVCacheManager, PrefixCacheStats
from draftwise.cache.recurrent import RecurrentSnapshot, RecurrentStatePool
from draftwise.cache.rollback import rollback

__all__ = [
    "BlockPool",
    "CacheArgumentError",
    "CacheError",
    "CacheInvariantError",
    "DuplicateRequestError",
    "KVCacheManager",
    "OutOfBlocksError",
    "OutOfCapacityError",
    "OutOfSlotsError",
    "PrefixCacheStats",
    "PrefixEntry",
    "RecurrentSnapshot",
    "RecurrentStatePool",
    "UnknownRequestError",
    "hash_block_tokens",
    "rollback",
]
