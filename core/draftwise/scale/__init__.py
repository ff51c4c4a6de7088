"""Replicas of the engine on Ray Serve behind one OpenAI endpoint, routed by prefix.

One idea: scale CPU serving out by replicas (one engine each), not by splitting a model
across machines. ``build_app`` is the Ray Serve application (ingress + replicas) for
users composing their own; ``draftwise serve --replicas N`` runs it on a local cluster
bound to loopback. Routing policies (``routing``) are pure and need no Ray; Ray itself is
imported only when an application is built or run, so the plain server never needs it.
"""

from __future__ import annotations

from draftwise.scale.app import Scaling, build_app
from draftwise.scale.replica import ReplicaSpec, ReplicaStartError

__all__ = ["ReplicaSpec", "ReplicaStartError", "Scaling", "build_app"]
