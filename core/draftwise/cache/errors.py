"""Typed errors of the cache package, so callers branch on a class, never on a message.

``OutOfCapacityError`` is the one the scheduler handles (preempt someone and retry):
both running out of KV blocks and running out of recurrent-state slots derive from it.
Everything else is a caller bug (wrong request id, impossible length) or an allocator
bug (``CacheInvariantError``).
"""

from __future__ import annotations


class CacheError(Exception):
    """Base class of every error raised by ``draftwise.cache``."""


class UnknownRequestError(CacheError, LookupError):
    """The request id holds nothing in this cache (never admitted, or already freed)."""

    def __init__(self, req_id: str, where: str) -> None:
        super().__init__(f"request {req_id!r} is not known to the {where}")
        self.req_id = req_id


class DuplicateRequestError(CacheError):
    """The request already holds a slot; allocating a second one would leak the first."""

    def __init__(self, req_id: str, where: str) -> None:
        super().__init__(f"request {req_id!r} already holds state in the {where}")
        self.req_id = req_id


class OutOfCapacityError(CacheError):
    """Not enough free room right now; the scheduler preempts a request and retries."""


class OutOfBlocksError(OutOfCapacityError):
    """The block pool cannot hand out as many blocks as asked."""

    def __init__(self, wanted: int, free: int) -> None:
        super().__init__(f"asked for {wanted} KV blocks, only {free} are free")
        self.wanted = wanted
        self.free = free


class OutOfSlotsError(OutOfCapacityError):
    """Every recurrent-state slot is taken."""

    def __init__(self, num_slots: int) -> None:
        super().__init__(f"all {num_slots} recurrent-state slots are in use")
        self.num_slots = num_slots


class CacheArgumentError(CacheError, ValueError):
    """An argument is out of range (negative length, truncation into cached blocks, ...)."""


class CacheInvariantError(CacheError):
    """The allocator's bookkeeping is inconsistent: a leak, a double free, a bad hash entry."""
