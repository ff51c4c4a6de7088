"""The routing policies as a Ray Serve ``RequestRouter`` (in the ingress, per handle).

Ray Serve lets a deployment name the class that picks a replica for each call
(``RequestRouterConfig.request_router_class``); Ray then probes the replicas of the
first rank we return and falls back to the next rank when they are full (or miss the
queue-length probe's deadline, 0.1 s at first). This class
ranks by a :mod:`draftwise.scale.routing` policy over the ``route`` keyword the ingress
passes with each call, and counts each replica's in-flight calls itself (the load the
policy reads). A replica Ray reports dead, or one that leaves the replica set, is
forgotten by the policy at once, so nothing is routed to its (now empty) cache.

No ``FIFOMixin``: with it, Ray hands the first replica found to the oldest pending
request, whichever request it was ranked for. Several routing tasks run at once and
each may await a queue-length probe, so a request whose replica answered its probe
first took the replica ranked for another request, and the two swapped homes
(``tests/core/scale/test_ray_router.py``). Without it Ray fulfils exactly the request
the ranking was for, as Ray's own ``PrefixCacheAffinityRouter`` does.

Imported by Ray inside the ingress's process, by its import path; never by the plain
server.
"""

from __future__ import annotations

import logging
import warnings
from collections import Counter
from typing import Any

with warnings.catch_warnings():
    # Ray 2.60's own config models use pydantic's deprecated ``Field(update_type=...)``:
    # not ours to fix, and it must not fail ``python -W error`` (tests/core/test_imports.py)
    warnings.filterwarnings("ignore", message="Using extra keyword arguments on `Field`")
    from ray.serve.request_router import (
        PendingRequest,
        ReplicaID,
        RequestRouter,
        RunningReplica,
    )

from draftwise.scale.routing import Policy, PrefixPolicy, RouteKey, make_policy

#: one DEBUG line a routed request: where it went, what each replica held of its prompt and
#: each one's load when it was placed (why a prefix left its replica: docs/scaling.md)
logger = logging.getLogger("draftwise.scale.routing")


class DraftwiseRouter(RequestRouter):  # type: ignore[misc]
    """Ranks replicas by the configured policy (``prefix``, ``round-robin``, ``power-of-two``)."""

    def initialize_state(self, policy: str = "prefix", capacity_blocks: int = 4096,
                         max_imbalance: int = 4, **_: Any) -> None:
        """Called by Ray with ``request_router_kwargs``."""
        self.policy: Policy = make_policy(policy, capacity_blocks, max_imbalance)
        self.in_flight: Counter[ReplicaID] = Counter()
        self._routes: dict[str, RouteKey] = {}

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None,
                              ) -> list[list[RunningReplica]]:
        """One replica per rank, best first."""
        key = _route_of(pending_request)
        by_id = {r.replica_id: r for r in candidate_replicas}
        ranked = self.policy.rank(list(by_id), self.in_flight, key)
        return [[by_id[rid]] for rid in ranked]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID,
                          result: Any) -> None:
        """Record the assignment (the prefix view) and count it in flight."""
        key = _route_of(pending_request)
        if logger.isEnabledFor(logging.DEBUG) and isinstance(self.policy, PrefixPolicy):
            logger.debug("routed %s to %s: %d blocks; held %s; in flight %s",
                         pending_request.metadata.request_id, replica_id.unique_id,
                         len(key.hashes),
                         {r.unique_id: self.policy.matched(r, key) for r in self.curr_replicas},
                         {r.unique_id: self.in_flight[r] for r in self.curr_replicas})
        self.policy.routed(replica_id, key)
        self.in_flight[replica_id] += 1

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        """One fewer in flight."""
        if self.in_flight[replica_id] > 0:
            self.in_flight[replica_id] -= 1

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        """Out of routing at once, its cache view and sticky keys dropped."""
        super().on_replica_actor_died(replica_id)
        self._forget(replica_id)

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        """Replicas that left the set (scaled down, replaced) are forgotten too."""
        gone = set(self.curr_replicas) - {r.replica_id for r in replicas}
        super().update_replicas(replicas)
        for replica_id in gone:
            self._forget(replica_id)

    def _forget(self, replica_id: ReplicaID) -> None:
        self.policy.removed(replica_id)
        self.in_flight.pop(replica_id, None)


def _route_of(pending_request: PendingRequest | None) -> RouteKey:
    """The ``route`` keyword the ingress passed (no key: routed by load alone)."""
    if pending_request is None:
        return RouteKey()
    route = pending_request.kwargs.get("route")
    return route if isinstance(route, RouteKey) else RouteKey()
