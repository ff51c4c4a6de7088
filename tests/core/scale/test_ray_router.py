"""The Ray Serve ``RequestRouter`` (draftwise.scale.ray_router) inside Ray's own routing
loop, with Ray's in-memory fake replicas: no cluster, no processes."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("ray")

from draftwise.scale.ray_router import DraftwiseRouter
from draftwise.scale.routing import RouteKey, block_hashes
from ray.serve._private.common import DeploymentHandleSource, DeploymentID, RequestMetadata
from ray.serve._private.request_router.common import PendingRequest
from ray.serve._private.test_utils import FakeRunningReplica


def _key(first: int) -> RouteKey:
    return RouteKey(tuple(block_hashes(list(range(first, first + 16)), 4)))


def _pending(key: RouteKey, rid: str) -> PendingRequest:
    return PendingRequest(args=[], kwargs={"route": key},
                          metadata=RequestMetadata(request_id=rid, internal_request_id=rid))


async def _route_two_at_once() -> list[str]:
    router = DraftwiseRouter(deployment_id=DeploymentID(name="EngineReplica"),
                             handle_source=DeploymentHandleSource.UNKNOWN)
    router.initialize_state(policy="prefix")
    fast = FakeRunningReplica("fast")
    slow = FakeRunningReplica("slow", sleep_time_s=0.05)  # its probe lags (deadline 0.1 s)
    for replica in (fast, slow):
        replica.set_queue_len_response(0)
    router.update_replicas([fast, slow])
    on_fast, on_slow = _key(100), _key(500)
    router.policy.routed(fast.replica_id, on_fast)
    router.policy.routed(slow.replica_id, on_slow)
    # the request for the slow replica's prefix queues first: while its probe is out, the
    # other request's probe answers
    got = await asyncio.gather(
        router._choose_replica_for_request(_pending(on_slow, "1")),
        router._choose_replica_for_request(_pending(on_fast, "2")))
    return [r.replica_id.unique_id for r in got]


def test_each_request_gets_the_replica_ranked_for_it() -> None:
    """Two requests routed at once, each to the replica holding its prefix. With Ray's
    ``FIFOMixin`` the first replica found went to the oldest pending request, whichever
    it was ranked for: here ``["fast", "slow"]``, both on the wrong replica."""
    assert asyncio.run(_route_two_at_once()) == ["slow", "fast"]


def test_a_routed_request_is_logged_with_what_each_replica_held(caplog) -> None:
    """The DEBUG line that explains a prefix leaving its replica: held blocks and load."""

    async def routed() -> None:
        router = DraftwiseRouter(deployment_id=DeploymentID(name="EngineReplica"),
                                 handle_source=DeploymentHandleSource.UNKNOWN)
        router.initialize_state(policy="prefix")
        a, b = FakeRunningReplica("a"), FakeRunningReplica("b")
        router.update_replicas([a, b])
        key = _key(100)
        router.policy.routed(a.replica_id, key)
        router.in_flight[a.replica_id] = 6
        router.on_request_routed(_pending(key, "r1"), b.replica_id, None)

    with caplog.at_level("DEBUG", logger="draftwise.scale.routing"):
        asyncio.run(routed())
    assert "routed r1 to b: 4 blocks; held {'a': 4, 'b': 0}; in flight {'a': 6, 'b': 0}" \
        in caplog.text
