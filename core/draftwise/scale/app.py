"""The Ray Serve application (``build_app``) and the local cluster ``draftwise serve`` runs.

``build_app`` is the Python entry point for users composing their own Ray Serve
application: it returns a bound ``Application`` (ingress + replicas) to ``serve.run``
or to nest under their own ingress. ``run`` is what ``draftwise serve --replicas N``
does: start a Ray cluster on loopback (or join ``--ray-address``) with Ray's dashboard
off, serve the application on ``host:port`` and stop it all on SIGTERM/SIGINT.
"""

from __future__ import annotations

import logging
import signal
import threading
from dataclasses import dataclass
from typing import Any

from draftwise.scale.ingress import REPLICA_DEPLOYMENT, Ingress, IngressConfig
from draftwise.scale.replica import START_ERROR_MARK, EngineReplica, ReplicaSpec

logger = logging.getLogger("draftwise.scale")

#: the Ray Serve application's name
APP_NAME = "draftwise"
#: the request router's import path (Ray imports it in the ingress; importing it here
#: would import Ray)
ROUTER_PATH = "draftwise.scale.ray_router.DraftwiseRouter"


@dataclass(frozen=True, slots=True)
class Scaling:
    """How many replicas, each with how many threads, routed how."""

    replicas: int = 2
    #: autoscaling bounds; both None: a fixed ``replicas``
    min_replicas: int | None = None
    max_replicas: int | None = None
    #: compute threads per replica (and the CPUs Ray reserves for it)
    threads: int = 1
    routing: str = "prefix"
    #: requests a prefix hit may put one replica ahead of the least loaded
    max_imbalance: int = 4
    #: calls Ray lets one replica hold at once (the engine queues what its batch cannot)
    max_ongoing_requests: int = 64

    def __post_init__(self) -> None:
        if self.replicas < 1 or self.threads < 1:
            raise ValueError("replicas and threads must be at least 1")
        lo, hi = self.min_replicas, self.max_replicas
        if (lo is None) != (hi is None):
            raise ValueError("give both --min-replicas and --max-replicas, or neither")
        if lo is not None and hi is not None and not 0 < lo <= self.replicas <= hi:
            raise ValueError(f"autoscaling bounds need 1 <= min ({lo}) <= --replicas "
                             f"({self.replicas}) <= max ({hi})")


def build_app(spec: ReplicaSpec, scaling: Scaling) -> Any:
    """Ingress and replicas as one Ray Serve application (``serve.run(build_app(...))``)."""
    from ray import serve
    from ray.serve.config import RequestRouterConfig

    # the router's view of a replica is bounded by the blocks its pool hands out (block 0
    # is the null block); a pool the engine sizes itself is not known here: 4096
    blocks = spec.engine_kwargs.get("num_kv_blocks")
    capacity = blocks - 1 if blocks else 4096
    size: dict[str, Any] = {"num_replicas": scaling.replicas}
    if scaling.min_replicas is not None:
        size = {"autoscaling_config": {
            "min_replicas": scaling.min_replicas, "max_replicas": scaling.max_replicas,
            "initial_replicas": scaling.replicas,
            "target_ongoing_requests": max(1, spec.engine_kwargs.get("max_num_seqs", 32) // 2),
        }}
    replica = serve.deployment(
        EngineReplica, name=REPLICA_DEPLOYMENT,
        ray_actor_options={"num_cpus": scaling.threads},
        max_ongoing_requests=scaling.max_ongoing_requests,
        health_check_period_s=1.0, health_check_timeout_s=30.0,
        max_constructor_retry_count=1,
        request_router_config=RequestRouterConfig(
            request_router_class=ROUTER_PATH,
            request_router_kwargs={"policy": scaling.routing, "capacity_blocks": capacity,
                                   "max_imbalance": scaling.max_imbalance},
        ),
        **size,
    )
    ingress = serve.deployment(Ingress, name="Ingress", ray_actor_options={"num_cpus": 0},
                               max_ongoing_requests=10_000)
    config = IngressConfig(api_key=spec.config.api_key,
                           draft_index_scope=spec.config.draft_index_scope,
                           min_replicas=scaling.min_replicas or scaling.replicas)
    return ingress.bind(replica.bind(spec), config)


def start_ray(address: str | None, num_cpus: int) -> None:
    """Join ``address``, or start a local cluster bound to 127.0.0.1 with no dashboard."""
    import ray

    if address:
        ray.init(address=address, include_dashboard=False, logging_level=logging.WARNING)
    else:
        ray.init(address="local", num_cpus=num_cpus, include_dashboard=False,
                 _node_ip_address="127.0.0.1", logging_level=logging.WARNING)


def deploy(spec: ReplicaSpec, scaling: Scaling, host: str, port: int,
           name: str = APP_NAME, route_prefix: str = "/") -> None:
    """Serve the application on ``host:port``; a replica that cannot start raises
    :class:`ReplicaStartError` with the engine's error."""
    from ray import serve

    from draftwise.scale.replica import ReplicaStartError

    serve.start(http_options={"host": host, "port": port})
    try:
        serve.run(build_app(spec, scaling), name=name, route_prefix=route_prefix)
    except RuntimeError as exc:
        # the app's message names the failed deployment; the replica's error is in the
        # deployment's own status message
        app = serve.status().applications.get(name)
        texts = [str(exc), *(d.message for d in (app.deployments.values() if app else ()))]
        named = next((e for e in map(start_error, texts) if e is not None), None)
        if named is None:
            raise
        raise ReplicaStartError(named) from None


def start_error(message: str) -> str | None:
    """The replica's own start-up error out of Ray's DEPLOY_FAILED text, if it is one."""
    for line in message.splitlines():
        at = line.find(START_ERROR_MARK)
        if at >= 0:
            return line[at + len(START_ERROR_MARK):].strip()
    return None


def run(spec: ReplicaSpec, scaling: Scaling, host: str, port: int,
        ray_address: str | None, on_ready: Any = None) -> None:
    """``draftwise serve --replicas N``: serve until SIGTERM/SIGINT, then stop everything."""
    import ray
    from ray import serve

    start_ray(ray_address, num_cpus=scaling.threads * (scaling.max_replicas or scaling.replicas))
    try:
        deploy(spec, scaling, host, port)
        if on_ready is not None:
            on_ready(f"http://{host}:{port}")
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        stop.wait()
    finally:
        try:
            serve.shutdown()
        finally:
            ray.shutdown()
