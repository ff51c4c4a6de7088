"""Which replica a request goes to: pure policies, no Ray, testable on plain lists.

The prefix policy keeps, per replica, the chained block hashes of the prompts it sent
there (its own assignment history, in LRU order and bounded by the replica's cache size):
what a replica was sent is what its prefix cache holds, less what it evicted since, and
the LRU bound drops the oldest first, a prompt's tail before its head, as the replica's
pool does. A router that consumes
the replicas' ``/kv_events`` would know evictions exactly; the history needs no
connection per replica and errs only towards a miss, never a wrong answer (the replica
checks its own cache).

Rules, in order:

1. With an isolation key (suffix decoding's ``--draft-index-scope``) a request goes where
   its key went before while that replica is up: the global index lives there.
2. Among the replicas whose load is within ``max_imbalance`` of the least loaded, the one
   holding the longest prefix of the prompt wins; ties go to the lower load.
3. No hit anywhere: the least loaded (ties: the fewest blocks held, so caches fill evenly).
4. A request with no full block and no key (a GET such as ``/metrics``, a tiny prompt):
   the least loaded, equals in turn (rule 3's tie-break sent every such request to the
   same idle replica, so a scraper of ``/metrics`` through the endpoint saw one replica).

Rule 2's bound keeps a hot prefix from piling every request onto one replica: once it is
``max_imbalance`` requests ahead, the prefix is recomputed elsewhere and both hold it.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from draftwise.cache.blocks import hash_block_tokens

#: a replica's name as the router knows it (Ray's replica id, or a URL)
ReplicaKey = Hashable


def block_hashes(token_ids: Sequence[int], block_size: int) -> list[int]:
    """The prefix cache's chained hash of each full block (``cache.blocks``'s function)."""
    hashes: list[int] = []
    parent: int | None = None
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = hash_block_tokens(parent, tuple(int(t) for t in token_ids[start:start + block_size]))
        hashes.append(parent)
    return hashes


@dataclass(frozen=True, slots=True)
class RouteKey:
    """What routing reads of a request: its prompt's block hashes and isolation key."""

    hashes: tuple[int, ...] = ()
    isolation_key: str | None = None


class Policy(Protocol):
    """Ranks live replicas for one request; the router tries them in that order."""

    def rank(self, replicas: Sequence[ReplicaKey], load: Mapping[ReplicaKey, int],
             key: RouteKey) -> list[ReplicaKey]: ...
    def routed(self, replica: ReplicaKey, key: RouteKey) -> None: ...
    def removed(self, replica: ReplicaKey) -> None: ...


@dataclass(slots=True)
class _View:
    """The blocks one replica is believed to hold, least recently sent first."""

    capacity: int
    blocks: OrderedDict[int, None] = field(default_factory=OrderedDict)

    def matched(self, hashes: Sequence[int]) -> int:
        """Leading blocks of ``hashes`` held (the chain makes a prefix match enough)."""
        n = 0
        for h in hashes:
            if h not in self.blocks:
                break
            n += 1
        return n

    def add(self, hashes: Sequence[int]) -> None:
        """Record a prompt sent here; the oldest blocks fall out past the capacity.

        Last block first, so a prompt's first block is its most recent: the engine frees
        a request's blocks tail first (``KVCacheManager.free``), so its pool evicts a
        prefix from the tail and keeps the head; a view that dropped the head first would
        call the whole chain gone while the replica still holds most of it."""
        for h in reversed(hashes):
            self.blocks[h] = None
            self.blocks.move_to_end(h)
        while len(self.blocks) > self.capacity:
            self.blocks.popitem(last=False)


class PrefixPolicy:
    """Longest held prefix within a load bound; isolation keys stick (module docstring)."""

    def __init__(self, capacity_blocks: int = 4096, max_imbalance: int = 4) -> None:
        if capacity_blocks < 1 or max_imbalance < 0:
            raise ValueError("capacity_blocks must be >= 1 and max_imbalance >= 0")
        self.capacity_blocks = capacity_blocks
        self.max_imbalance = max_imbalance
        self._views: dict[ReplicaKey, _View] = {}
        self._sticky: dict[str, ReplicaKey] = {}
        self._turn = 0

    def _view(self, replica: ReplicaKey) -> _View:
        view = self._views.get(replica)
        if view is None:
            view = self._views[replica] = _View(self.capacity_blocks)
        return view

    def rank(self, replicas: Sequence[ReplicaKey], load: Mapping[ReplicaKey, int],
             key: RouteKey) -> list[ReplicaKey]:
        """Best first: the sticky replica, then prefix within the bound, then by load."""
        if not replicas:
            return []
        if not key.hashes and key.isolation_key is None:
            # nothing to place (a GET such as /metrics, a prompt under one block): the
            # least loaded, equals in turn, so such requests reach every replica
            self._turn += 1
            ordered = sorted(replicas, key=str)
            turn = {r: (i - self._turn) % len(ordered) for i, r in enumerate(ordered)}
            return sorted(replicas, key=lambda r: (load.get(r, 0), turn[r]))
        by_load = sorted(replicas, key=lambda r: (load.get(r, 0), self._held(r)))
        if key.isolation_key is not None:
            home = self._sticky.get(key.isolation_key)
            if home in replicas:
                return [home, *(r for r in by_load if r != home)]
        floor = load.get(by_load[0], 0)
        eligible = [r for r in by_load if load.get(r, 0) <= floor + self.max_imbalance]
        matched = {r: self._view(r).matched(key.hashes) for r in eligible}
        best = max(eligible, key=lambda r: (matched[r], -load.get(r, 0)))
        if matched[best] == 0:
            return by_load
        return [best, *(r for r in by_load if r != best)]

    def _held(self, replica: ReplicaKey) -> int:
        view = self._views.get(replica)
        return len(view.blocks) if view is not None else 0

    def matched(self, replica: ReplicaKey, key: RouteKey) -> int:
        """Leading blocks of ``key`` the replica is believed to hold (for metrics, tests)."""
        return self._view(replica).matched(key.hashes)

    def routed(self, replica: ReplicaKey, key: RouteKey) -> None:
        """The request went to ``replica``: its blocks are there now, and so is its key."""
        self._view(replica).add(key.hashes)
        if key.isolation_key is not None:
            self._sticky[key.isolation_key] = replica

    def removed(self, replica: ReplicaKey) -> None:
        """The replica died or scaled away: its cache and its keys' indexes are gone."""
        self._views.pop(replica, None)
        for k in [k for k, r in self._sticky.items() if r == replica]:
            del self._sticky[k]


class RoundRobinPolicy:
    """Each replica in turn, blind to prefixes and load (the comparison baseline)."""

    def __init__(self) -> None:
        self._next = 0

    def rank(self, replicas: Sequence[ReplicaKey], load: Mapping[ReplicaKey, int],
             key: RouteKey) -> list[ReplicaKey]:
        """The next replica in a fixed order, then the rest."""
        if not replicas:
            return []
        ordered = sorted(replicas, key=str)
        i = self._next % len(ordered)
        self._next += 1
        return ordered[i:] + ordered[:i]

    def routed(self, replica: ReplicaKey, key: RouteKey) -> None:
        """Round-robin keeps no state about where requests went."""

    def removed(self, replica: ReplicaKey) -> None:
        """Nothing to forget."""


class PowerOfTwoPolicy:
    """Two random replicas, the less loaded first (Ray Serve's default, blind to prefixes)."""

    def __init__(self, seed: int | None = None) -> None:
        self._rng = random.Random(seed)

    def rank(self, replicas: Sequence[ReplicaKey], load: Mapping[ReplicaKey, int],
             key: RouteKey) -> list[ReplicaKey]:
        """The lighter of two random picks, then the other, then the rest."""
        if len(replicas) <= 1:
            return list(replicas)
        pair = self._rng.sample(list(replicas), 2)
        pair.sort(key=lambda r: load.get(r, 0))
        return pair + [r for r in replicas if r not in pair]

    def routed(self, replica: ReplicaKey, key: RouteKey) -> None:
        """Power-of-two keeps no state about where requests went."""

    def removed(self, replica: ReplicaKey) -> None:
        """Nothing to forget."""


POLICIES = {"prefix": PrefixPolicy, "round-robin": RoundRobinPolicy,
            "power-of-two": PowerOfTwoPolicy}


def make_policy(name: str, capacity_blocks: int = 4096, max_imbalance: int = 4) -> Policy:
    """A policy by its ``--routing`` name; an unknown name is refused with the known ones."""
    if name == "prefix":
        return PrefixPolicy(capacity_blocks, max_imbalance)
    if name in POLICIES:
        return POLICIES[name]()  # type: ignore[no-any-return]
    raise ValueError(f"routing policy {name!r}: give one of {', '.join(POLICIES)}")
