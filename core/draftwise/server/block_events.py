"""The prefix blocks one server holds, as a numbered event stream for external routers.

A router in front of bare ``draftwise serve`` processes (SGLang's Model Gateway, llm-d's
Endpoint Picker, a home-made one) routes well only if it knows which replica holds a
prompt's prefix. The engine's block pool tells this log of every cached block as it is
stored and evicted (``BlockPool.listener``, on the engine thread); the log numbers the
events and fans them out to subscribers on the event loop.

The contract (``GET /kv_events``, text/event-stream, docs/scaling.md):

1. The first event is ``snapshot``: ``{"seq": S, "block_size": B, "blocks": [...]}`` with
   every block held at sequence number S. Every later event has ``seq`` > S, one more
   than the event before it: a gap means events were lost, and the client reconnects.
2. ``stored``: ``{"seq", "block_hash", "parent_hash", "token_ids"}``; ``evicted``:
   ``{"seq", "block_hash"}``. ``block_hash`` chains over ``parent_hash`` (None for a
   prompt's first block), so the blocks of one prefix form a chain a router can walk.
3. Hashes are this process's ids for blocks (Python's ``hash``, which is not stable across
   processes): a router that needs its own hash recomputes it from ``token_ids`` and the
   chain, as llm-d's KV-cache indexer does with vLLM's events.
4. A subscriber that falls more than ``max_backlog`` events behind gets ``overflow`` and
   the stream ends; it reconnects for a fresh snapshot (the log keeps no history).
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator
from typing import Any

#: events a slow subscriber may have queued before it is cut off (it reconnects)
MAX_BACKLOG = 10_000


class _Subscriber:
    """One open stream: its queue on the event loop, fed from the engine thread."""

    def __init__(self, aio: asyncio.AbstractEventLoop, max_backlog: int) -> None:
        self.aio = aio
        self.queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.max_backlog = max_backlog
        self.overflowed = False

    def push(self, event: dict[str, Any]) -> None:
        """On the event loop: queue the event, or cut off a subscriber too far behind."""
        if self.overflowed:
            return
        if self.queue.qsize() >= self.max_backlog:
            self.overflowed = True
            event = {"seq": event["seq"], "type": "overflow"}
        self.queue.put_nowait(event)


class BlockEventLog:
    """A ``BlockListener``: numbers stored/evicted events and fans them out."""

    def __init__(self, block_size: int, max_backlog: int = MAX_BACKLOG) -> None:
        self.block_size = block_size
        self.max_backlog = max_backlog
        self._lock = threading.Lock()
        self._seq = 0
        #: block hash -> (parent hash, token ids) of every block held now
        self._held: dict[int, tuple[int | None, tuple[int, ...]]] = {}
        self._subscribers: set[_Subscriber] = set()

    @property
    def seq(self) -> int:
        """The number of the last event."""
        return self._seq

    def stored(self, block_hash: int, parent_hash: int | None,
               token_ids: tuple[int, ...]) -> None:
        """The pool cached a full block."""
        with self._lock:
            self._held[block_hash] = (parent_hash, token_ids)
            self._emit({"type": "stored", "block_hash": block_hash,
                        "parent_hash": parent_hash, "token_ids": list(token_ids)})

    def evicted(self, block_hash: int) -> None:
        """The pool reused a cached block for other tokens."""
        with self._lock:
            self._held.pop(block_hash, None)
            self._emit({"type": "evicted", "block_hash": block_hash})

    def _emit(self, event: dict[str, Any]) -> None:
        """Number the event and hand it to every subscriber's loop (lock held)."""
        self._seq += 1
        event["seq"] = self._seq
        for sub in self._subscribers:
            sub.aio.call_soon_threadsafe(sub.push, event)

    def snapshot(self) -> dict[str, Any]:
        """Every block held now, at the current sequence number."""
        with self._lock:
            return self._snapshot_locked()

    def _snapshot_locked(self) -> dict[str, Any]:
        blocks = [{"block_hash": h, "parent_hash": p, "token_ids": list(t)}
                  for h, (p, t) in self._held.items()]
        return {"type": "snapshot", "seq": self._seq, "block_size": self.block_size,
                "blocks": blocks}

    async def events(self) -> AsyncIterator[dict[str, Any]]:
        """The snapshot, then every event after it, until overflow or the caller stops."""
        sub = _Subscriber(asyncio.get_running_loop(), self.max_backlog)
        with self._lock:  # snapshot and subscribe at one sequence number: no gap, no dup
            first = self._snapshot_locked()
            self._subscribers.add(sub)
        try:
            yield first
            while True:
                event = await sub.queue.get()
                yield event
                if event["type"] == "overflow":
                    return
        finally:
            with self._lock:
                self._subscribers.discard(sub)


async def sse_stream(log: BlockEventLog) -> AsyncIterator[str]:
    """``event: <type>`` / ``data: <json>`` frames for ``GET /kv_events``."""
    async for event in log.events():
        yield f"event: {event['type']}\ndata: {json.dumps(event, separators=(',', ':'))}\n\n"


def attach(engine: Any) -> BlockEventLog | None:
    """A log listening to ``engine``'s block pool; None when it has no prefix cache.

    Call it before the engine thread starts: the pool's current blocks are read here."""
    pool = getattr(getattr(engine, "kv", None), "pool", None)
    if pool is None or not getattr(pool, "enable_prefix_caching", False):
        return None
    log = BlockEventLog(int(pool.block_size))
    for block_hash, parent_hash, token_ids in pool.cached_blocks():
        log.stored(block_hash, parent_hash, token_ids)
    pool.listener = log
    return log
